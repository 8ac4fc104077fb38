"""Common subexpressions of the aten graph (Note [Common subexpressions of the graph] in
passes/cse.py): what is merged, what never is, and that results stay eager's."""

from __future__ import annotations

from typing import Any

import pytest
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


def _merged(ctx_or_compiled: Any) -> list[str]:
    record = ctx_or_compiled.passes.record if hasattr(ctx_or_compiled, "passes") else ctx_or_compiled.record
    return [t for n, t in record if n == "cse" and "merged" in t]


UNANNOTATED_VIEWS = {
    "_unsafe_view": lambda t: aten._unsafe_view.default(t, [-1]),
    "unsafe_split": lambda t: aten.unsafe_split.Tensor(t, 2)[0],
    "unsafe_split_with_sizes": lambda t: aten.unsafe_split_with_sizes.default(t, [1, 3])[1],
    "unsafe_chunk": lambda t: aten.unsafe_chunk.default(t, 2)[1],
}


@pytest.mark.parametrize("backend", ["interpret"])  # loopir alone: the C++ generator is not its dependency
@pytest.mark.parametrize("name", sorted(UNANNOTATED_VIEWS))
def test_views_without_an_alias_annotation_still_keep_outputs_apart(name: str, backend: str) -> None:
    # Note [Views that do not say so]: `_unsafe_view` returns a view of its argument although its
    # schema has no alias annotation; the two adds it views must stay two buffers
    view = UNANNOTATED_VIEWS[name]

    def fn(x: Any) -> Any:
        return view(aten.add.Tensor(x, 1)), view(aten.add.Tensor(x, 1))

    x = make((4, 4))
    compiled = compile_graph(with_vals(fn, x), [x], backend=backend)
    a, b = compiled(x)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    a.add_(1)  # an in-place update of one output leaves the other as eager leaves it
    torch.testing.assert_close(b, view(x + 1))


def _mutate_add_(x: Any, y: Any) -> None:
    aten.add_.Tensor(x, y)


def _mutate_copy_(x: Any, y: Any) -> None:
    aten.copy_.default(x, y)


def _mutate_out(x: Any, y: Any) -> None:
    aten.mul.out(y, 3, out=x)


@pytest.mark.parametrize("backend", ["interpret"])  # loopir alone: the C++ generator is not its dependency
@pytest.mark.parametrize("mutate", [_mutate_add_, _mutate_copy_, _mutate_out], ids=["add_", "copy_", "out="])
def test_reads_of_an_input_around_its_mutation_are_not_merged(mutate: Any, backend: str) -> None:
    # Note [Reads around an input's mutation]: the second `mul` reads the updated input
    def fn(x: Any, y: Any) -> Any:
        before = aten.mul.Tensor(aten.view.default(x, [-1]), 2)
        mutate(x, y)
        after = aten.mul.Tensor(aten.view.default(x, [-1]), 2)
        return aten.sub.Tensor(after, before), aten.mul.Tensor(aten.view.default(x, [-1]), 2)

    x, y = make((8,)), make((8,))
    gm = with_vals(fn, x.clone(), y)
    e_x, c_x = x.clone(), x.clone()
    expected = gm(e_x, y)
    compiled = compile_graph(gm, [x.clone(), y], backend=backend)
    got = compiled(c_x, y)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(c_x, e_x)
    # the two views after the mutation are still one (and the one before stays apart)
    assert any("merged 1 nodes" in t and "view.default x1" in t for t in _merged(compiled))


def test_an_in_place_update_of_a_view_of_an_input_leaves_the_graph_alone() -> None:
    def fn(x: Any) -> Any:
        before = aten.mul.Tensor(x, 2)
        aten.add_.Tensor(aten.slice.Tensor(x, 0, 0, 4), 1)
        return aten.sub.Tensor(aten.mul.Tensor(x, 2), before)

    x = make((8,))
    gm = with_vals(fn, x.clone())
    rewritten, ctx = run_passes(gm, [x], torch.device("cpu"))
    assert rewritten is gm and any(n == "cse" and "skipped" in t for n, t in ctx.record)


@pytest.mark.parametrize(
    "factory",
    [
        aten.empty_like.default,
        lambda x: aten.empty_permuted.default([4, 4], [1, 0]),
        lambda x: aten.new_empty.default(x, [4, 4]),
    ],
    ids=["empty_like", "empty_permuted", "new_empty"],
)
def test_uninitialized_memory_is_never_merged(factory: Any) -> None:
    def fn(x: Any) -> Any:
        return aten.add.Tensor(factory(x), factory(x))

    x = make((4, 4))
    gm = with_vals(fn, x)
    _, ctx = run_passes(gm, [x], torch.device("cpu"))
    assert not _merged(ctx)


def test_random_ops_with_a_generator_are_two_draws() -> None:
    gen = torch.Generator().manual_seed(0)

    def fn(x: Any) -> Any:
        a = aten.rand_like.generator(x, generator=gen)
        b = aten.rand_like.generator(x, generator=gen)
        return aten.sub.Tensor(a, b)

    x = make((64,))
    gm = torch.fx.symbolic_trace(fn)
    rewritten, _ = run_passes(gm, [x], torch.device("cpu"))
    assert [n.target for n in rewritten.graph.nodes].count(aten.rand_like.generator) == 2


@pytest.mark.parametrize("accumulate", [False, True])
def test_equal_index_puts_merged_give_eager_results(accumulate: bool) -> None:
    # index_put with repeated indices and accumulate: merging two equal calls must not add twice
    def fn(x: Any, idx: Any, v: Any) -> Any:
        a = aten.index_put.default(aten.zeros_like.default(x), [idx], v, accumulate)
        b = aten.index_put.default(aten.zeros_like.default(x), [idx], v, accumulate)
        return aten.add.Tensor(aten.mul.Tensor(a, 2), b), aten.mul.Tensor(a, b)

    x, idx, v = make((8,)), torch.tensor([1, 3, 1, 1]), make((4,))
    if not accumulate:
        v = torch.full((4,), 1.5)  # the same value at a repeated index: eager's result is defined
    compiled = check(with_vals(fn, x, idx, v), x, idx, v)
    assert _merged(compiled)
