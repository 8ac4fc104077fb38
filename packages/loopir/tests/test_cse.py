"""Common subexpressions of the aten graph (Note [Common subexpressions of the graph] in
passes/cse.py): what is merged, what never is, and that results stay eager's."""

from __future__ import annotations

from typing import Any

import torch
from helpers import check, make

from kiln_loopir import compile_graph
from kiln_loopir.passes import run_passes
from kiln_loopir.testing import with_vals

aten = torch.ops.aten


def _cse_record(compiled: Any) -> list[str]:
    return [text for name, text in compiled.passes.record if name == "cse"]


def two_layers_one_mask() -> torch.fx.GraphModule:
    """Each "layer" converts the same boolean mask to a float one, as torch's SDPA does per call,
    and hands it to an extern call (which reads it from memory): built node by node, as aotgrad
    records it (``scalar_tensor`` calls, not constants)."""
    g = torch.fx.Graph()
    mask, a, b = g.placeholder("mask"), g.placeholder("a"), g.placeholder("b")

    def additive() -> torch.fx.Node:
        zero = g.call_function(aten.scalar_tensor.default, (0.0,), {"dtype": torch.float32})
        low = g.call_function(aten.scalar_tensor.default, (-1.0,), {"dtype": torch.float32})
        return g.call_function(aten.where.self, (mask, zero, low))

    h = g.call_function(aten.mm.default, (additive(), a))
    out = g.call_function(aten.add.Tensor, (h, g.call_function(aten.mm.default, (additive(), b))))
    g.output(out)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def mask_inputs() -> tuple[torch.Tensor, ...]:
    mask = torch.tril(torch.ones(16, 16, dtype=torch.bool))
    return mask, make((16, 16)), make((16, 16))


def test_a_repeated_mask_is_computed_once_and_results_are_eager() -> None:
    inputs = mask_inputs()
    on = check(with_vals(two_layers_one_mask(), *inputs), *inputs)
    off = check(with_vals(two_layers_one_mask(), *inputs), *inputs, options={"cse": False})
    (line,) = _cse_record(on)
    assert "merged 3 nodes" in line and "where.self x1" in line and "scalar_tensor.default x2" in line
    assert _cse_record(off) == ["off (option cse=False)"]
    # one float mask in memory for both extern calls, where there were two
    assert on.stats.buffers == off.stats.buffers - 1
    assert on.stats.bytes_moved < off.stats.bytes_moved


def test_merging_follows_replaced_arguments() -> None:
    # the second chain is equal only once its first node is replaced by the first chain's
    def fn(x: Any) -> Any:
        a = aten.exp.default(aten.neg.default(x))
        b = aten.exp.default(aten.neg.default(x))
        return aten.add.Tensor(a, b)

    x = make((8, 8))
    gm = with_vals(fn, x)
    rewritten, ctx = run_passes(gm, [x], torch.device("cpu"))
    targets = [n.target for n in rewritten.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.exp.default) == 1 and targets.count(aten.neg.default) == 1
    assert any("merged 2 nodes" in t for n, t in ctx.record if n == "cse")
    check(fn, x)


def test_outputs_that_eager_returns_apart_never_share_memory() -> None:
    def fn(x: Any) -> Any:
        a = aten.clone.default(x)
        b = aten.clone.default(x)
        return aten.view.default(a, [-1]), aten.view.default(b, [-1]), aten.clone.default(x)

    x = make((4, 4))
    compiled = check(fn, x)
    outs = compiled(x.clone())
    ptrs = {o.untyped_storage().data_ptr() for o in outs}
    assert len(ptrs) == 3, "two outputs alias each other where eager's do not"
    outs[0].add_(1)  # an in-place update of one output leaves the others as eager leaves them
    torch.testing.assert_close(outs[1], x.reshape(-1))
    torch.testing.assert_close(outs[2], x)


def test_random_ops_are_two_draws() -> None:
    def fn(x: Any) -> Any:
        return aten.rand_like.default(x), aten.rand_like.default(x)

    x = make((64,))
    gm = with_vals(fn, x)
    rewritten, _ = run_passes(gm, [x], torch.device("cpu"))
    assert [n.target for n in rewritten.graph.nodes].count(aten.rand_like.default) == 2
    compiled = compile_graph(gm, [x])
    a, b = compiled(x)
    assert not torch.equal(a, b)


def test_scalars_are_compared_with_their_type_and_sign() -> None:
    def fn(x: Any) -> Any:
        # 0.0 == -0.0 and 1 == 1.0 == True in Python; none of these pairs is the same computation
        return (
            aten.mul.Tensor(x, 0.0),
            aten.mul.Tensor(x, -0.0),
            aten.add.Tensor(x, 1),
            aten.add.Tensor(x, 1.0),
        )

    x = make((8,), dtype=torch.int32)
    gm = with_vals(fn, x)
    _, ctx = run_passes(gm, [x], torch.device("cpu"))
    assert not any(n == "cse" and "merged" in t for n, t in ctx.record)
    xf = torch.tensor([1.0, -2.0, 3.0])
    compiled = check(fn, xf)
    pos, neg, _, _ = compiled(xf)
    assert torch.equal(torch.signbit(pos), torch.signbit(xf * 0.0))
    assert torch.equal(torch.signbit(neg), torch.signbit(xf * -0.0))


def test_a_graph_that_mutates_an_intermediate_is_left_alone() -> None:
    def fn(x: Any) -> Any:
        a = aten.clone.default(x)
        aten.add_.Tensor(a, 1)
        b = aten.clone.default(x)
        return aten.add.Tensor(a, b)

    x = make((4,))
    gm = with_vals(fn, x)
    rewritten, ctx = run_passes(gm, [x], torch.device("cpu"))
    assert rewritten is gm
    assert any(n == "cse" and "skipped" in t for n, t in ctx.record)
