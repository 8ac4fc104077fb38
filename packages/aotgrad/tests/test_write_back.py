"""Note [Write-backs in one call]: mutated inputs are written back through one `_foreach_copy_`
where no autograd records the copy and no target is a view; otherwise copy by copy, in order."""

from __future__ import annotations

import copy
import operator
from typing import Any

import pytest
import torch
from aot_helpers import check

import kiln_aotgrad
from kiln_aotgrad import runtime


def _count_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = torch._foreach_copy_

    def spy(dst: Any, src: Any, *a: Any, **k: Any) -> Any:
        # CUDA's multi-tensor kernels take only lists of one dtype (else a copy per tensor)
        assert len({t.dtype for t in dst}) == 1 and len({t.dtype for t in src}) == 1, (dst, src)
        calls.append(len(dst))
        return real(dst, src, *a, **k)

    monkeypatch.setattr(torch, "_foreach_copy_", spy)
    return calls


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.bn2 = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(torch.relu(self.bn1(self.conv(x)))).sum(dim=(2, 3))


@pytest.mark.parametrize("grad", [True, False], ids=["training", "no_grad"])
def test_batchnorm_buffers_are_written_back_in_one_call(monkeypatch: pytest.MonkeyPatch, grad: bool) -> None:
    calls = _count_batches(monkeypatch)
    net = Net().train()
    eager, mine = copy.deepcopy(net), copy.deepcopy(net)
    compiled = kiln_aotgrad.aot_module(mine, lambda gm, ex: gm)
    x = torch.randn(2, 3, 8, 8)
    versions = {n: b._version for n, b in mine.named_buffers()}
    for _ in range(2):
        with torch.set_grad_enabled(grad):
            torch.testing.assert_close(compiled(x), eager(x))
    for (name, b), (_, e) in zip(mine.named_buffers(), eager.named_buffers(), strict=True):
        torch.testing.assert_close(b, e)
        assert b._version > versions[name], name  # autograd and optimizers see the write
    # two BatchNorms x (mean, var: float32; batches tracked: int64), one call per dtype, each call
    assert calls == [4, 2, 4, 2]


def test_mutated_views_are_written_back_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_batches(monkeypatch)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.add_(1)
        b.mul_(2)
        return a.sum() + b.sum()

    x, y = torch.randn(6), torch.randn(6)
    check(lambda x, y: f(x[:4], y[2:]), x, y, no_grad=True)  # the graph's inputs: x and y
    assert calls == [2]
    calls.clear()
    compiled = kiln_aotgrad.aot_function(f, lambda gm, ex: gm)
    x2, y2 = x.clone(), y.clone()
    torch.testing.assert_close(compiled(x2[:4], y2[2:]), f(x[:4], y[2:]))
    torch.testing.assert_close((x2, y2), (x, y))
    assert calls == []  # its inputs are views


@pytest.mark.parametrize("order", ["shared first", "separate first"])
def test_mutated_inputs_sharing_memory_run_eagerly(order: str) -> None:
    # Note [Mutated inputs that share memory]: the graph traces its inputs as separate tensors,
    # so a call whose written input overlaps another one runs the program eagerly
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.add_(1)
        b.mul_(2)
        return a.sum()

    compiled = kiln_aotgrad.aot_function(f, lambda gm, ex: gm)
    plans = (
        ["shared", "separate", "shared", "same"]
        if order == "shared first"
        else ["separate", "shared", "same"]
    )
    for plan in plans:
        got, want = torch.arange(6.0), torch.arange(6.0)
        if plan == "shared":
            args_c, args_e = (got[:4], got[2:]), (want[:4], want[2:])
        elif plan == "same":  # one tensor passed twice
            args_c, args_e = (got[:4], got[:4]), (want[:4], want[:4])
        else:
            args_c, args_e = (got[:4], got[2:].clone()), (want[:4], want[2:].clone())
        torch.testing.assert_close(compiled(*args_c), f(*args_e), msg=plan)
        torch.testing.assert_close(got, want, msg=plan)
        torch.testing.assert_close(args_c[1], args_e[1], msg=plan)


@pytest.mark.parametrize("how", ["detach", "data"])
def test_mutated_input_sharing_memory_without_a_view(how: str) -> None:
    # Note [Mutated inputs that share memory]: `x.detach()` and `x.data` share x's storage and are
    # no views; the check must see it (test_alias_fuzz.py seed 563)
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.fill_(-2.0)
        return b + 0

    compiled = kiln_aotgrad.aot_function(f, lambda gm, ex: gm)
    for _ in range(2):
        got, want = torch.arange(5.0), torch.arange(5.0)
        other_c = got.detach() if how == "detach" else got.data
        other_e = want.detach() if how == "detach" else want.data
        torch.testing.assert_close(compiled(got, other_c), f(want, other_e))
        torch.testing.assert_close(got, want)
    alone, want = torch.arange(5.0), torch.arange(5.0)
    torch.testing.assert_close(compiled(alone, torch.ones(5)), f(want, torch.ones(5)))
    torch.testing.assert_close(alone, want)


@pytest.mark.parametrize("piece", ["split", "split_with_sizes", "chunk", "unbind", "narrow"])
def test_writes_through_pieces_of_an_input_at_an_offset(piece: str) -> None:
    # Note [Pieces written back as slices] (test_alias_fuzz.py seed 686): the write-back of a
    # piece used an offset relative to the input, which aten's as_strided_scatter reads as absolute
    def f(x: torch.Tensor) -> torch.Tensor:
        if piece == "split":
            p = x.split(3, 1)[1]
        elif piece == "split_with_sizes":
            p = x.split_with_sizes([1, 2], 0)[1]
        elif piece == "chunk":
            p = x.chunk(2, -1)[1]
        elif piece == "unbind":
            p = x.unbind(1)[3]
        else:
            p = x.narrow(1, 2, 3)
        p.add_(1.5)
        return p * 2

    compiled = kiln_aotgrad.aot_function(f, lambda gm, ex: gm)
    base = torch.randn(4, 5)
    got, want = base.clone()[1:], base.clone()[1:]
    assert got.storage_offset() == 5
    torch.testing.assert_close(compiled(got), f(want))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("offset", [0, 6])
@pytest.mark.parametrize("view", ["unfold", "view_dtype"])
def test_writes_through_other_views_of_an_input_at_an_offset(view: str, offset: int) -> None:
    # Note [Pieces written back as slices]: the general write-back (as_strided_scatter) scatters
    # into a fresh copy of the parent; a view of another dtype goes back by its bits
    def f(x: torch.Tensor) -> torch.Tensor:
        if view == "unfold":
            x.unfold(1, 2, 2).mul_(2)
        else:
            x.view(torch.int32).bitwise_xor_(1)
        return x * 1

    compiled = kiln_aotgrad.aot_function(f, lambda gm, ex: gm)
    base = torch.randn(4, 6)
    got, want = base.clone()[offset // 6 :], base.clone()[offset // 6 :]
    torch.testing.assert_close(compiled(got), f(want))
    assert torch.equal(got, want)


@pytest.mark.parametrize("root", ["intermediate", "input", "input_at_offset"])
@pytest.mark.parametrize("through", ["as_strided", "view_then_as_strided"])
def test_writes_through_as_strided_go_into_the_root(root: str, through: str) -> None:
    # Note [Writes through as_strided go into the root] (tracer.py, test_alias_fuzz.py seed
    # 3476): as_strided's offset is absolute in the storage; written back into the one-element
    # view it was taken from, the write was lost
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.reshape(-1) * 1 if root == "intermediate" else x.view(-1)
        base = t.select(0, 11).unsqueeze(0) if through == "view_then_as_strided" else t
        start = t.storage_offset()
        with torch.no_grad():
            w = base.as_strided((2, 2), (3, 1), start + 5)
        w[1:] = 7.0
        w.mul_(2)
        return t * 1, w

    compiled = kiln_aotgrad.aot_function(f, lambda gm, ex: gm)
    base = torch.randn(4, 6)
    got = base.clone()[1:] if root == "input_at_offset" else base.clone()
    want = got.clone() if root != "input_at_offset" else base.clone()[1:]
    torch.testing.assert_close(compiled(got), f(want))
    assert torch.equal(got, want)


def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_batches(monkeypatch)
    monkeypatch.setattr(runtime, "BATCHED_WRITE_BACK", False)
    check(Net().train(), torch.randn(2, 3, 8, 8))
    assert calls == []


def test_a_recorded_copy_keeps_the_order_of_the_others() -> None:
    # a non-leaf that requires grad, mutated with grad on: autograd records its copy, so every
    # write-back of that call runs copy by copy (and gradients flow through the mutation)
    def f(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(s)
        s.add_(1)
        return y

    x = torch.randn(3, requires_grad=True)
    check(lambda x, s: f(x.clone(), s), x, torch.zeros(3))


def _compact_outputs(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A compiler that returns each graph output as a compact copy of its elements, as a code
    generator may for an output that is a view of an intermediate."""

    def run(*args: Any) -> Any:
        return tuple(o.contiguous() if isinstance(o, torch.Tensor) else o for o in gm(*args))

    return run


@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
def test_views_sharing_an_intermediate_that_is_no_output(dynamic: bool | None) -> None:
    # Note [Views sharing an intermediate that is no output] (test_alias_fuzz.py seed 190): the
    # second view was laid over the first, a compact copy: out of its bounds
    import kiln_dynamo

    def f(x: torch.Tensor) -> Any:
        t1 = x.clone()
        x.mul_(-1.0)
        t2 = t1.select(1, 3)
        t2.zero_()
        return t2.view_as(t2), t2

    backend = kiln_aotgrad.aot_backend(_compact_outputs)
    backend.__kiln_dynamic_shapes__ = True  # type: ignore[attr-defined]
    compiled = kiln_dynamo.compile(f, backend=backend, dynamic=dynamic)
    try:
        x = torch.randn(4, 5)
        y = x.clone()
        got, want = compiled(x), f(y)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, y)
        assert [g.stride() for g in got] == [w.stride() for w in want]
        assert got[0].untyped_storage().data_ptr() == got[1].untyped_storage().data_ptr()
    finally:
        kiln_dynamo.reset()


def test_a_failure_after_the_write_back_says_the_inputs_were_written(monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Failures after the write-back]: the caller must not run such a call again
    def f(x: torch.Tensor) -> Any:
        x.mul_(2)
        return x.t()

    def broken(meta: Any, inputs: Any, outs: Any) -> Any:
        raise RuntimeError("assembling the outputs failed")

    compiled = kiln_aotgrad.aot_function(f, kiln_aotgrad.nop_compiler)
    x = torch.randn(2, 3)
    compiled(x.clone())  # compiles
    monkeypatch.setattr(runtime, "_assemble", broken)
    before = x.clone()
    with pytest.raises(kiln_aotgrad.InputsWrittenError) as info:
        compiled(x)
    assert kiln_aotgrad.inputs_written(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    torch.testing.assert_close(x, before * 2)  # written once


def test_a_failure_inside_the_graph_leaves_the_inputs_unwritten() -> None:
    def f(x: torch.Tensor) -> Any:
        x.mul_(2)
        return x + 1

    calls = []

    def failing(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        def run(*args: Any) -> Any:
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("kernel failed")
            return gm(*args)

        return run

    compiled = kiln_aotgrad.aot_function(f, failing)
    x = torch.randn(3)
    compiled(x.clone())
    before = x.clone()
    with pytest.raises(RuntimeError, match="kernel failed") as info:
        compiled(x)
    assert not kiln_aotgrad.inputs_written(info.value)
    torch.testing.assert_close(x, before)


def test_a_value_that_requires_grad_written_into_an_input_that_does_not() -> None:
    # Note [Writing a value that requires grad into an input that does not] (seed 158)
    def f(x: torch.Tensor, w: torch.Tensor) -> Any:
        x.mul_(w)
        y = x * 2
        x.zero_()
        return y, x

    compiled = kiln_aotgrad.aot_function(f, kiln_aotgrad.nop_compiler)
    w = torch.randn(2, requires_grad=True)
    x = torch.randn(4)[::2]
    ref = torch.zeros(4)[::2].copy_(x)
    got, want = compiled(x, w), f(ref, w)
    for g_, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w_)
        assert g_.requires_grad == w_.requires_grad
    assert x.requires_grad and ref.requires_grad
    assert got[1] is x
    (gw,) = torch.autograd.grad(got[0].sum() + got[1].sum(), w)
    (ew,) = torch.autograd.grad(want[0].sum() + want[1].sum(), w)
    torch.testing.assert_close(gw, ew)


def test_a_leaf_that_requires_grad_updated_under_no_grad_is_written_without_autograd() -> None:
    # the new value is a graph output that requires grad as a whole; the copy into the leaf is
    # not recorded (eager: "a leaf Variable that requires grad is being used in an in-place
    # operation"), which the write-back of Note [Writing a value that requires grad into an
    # input that does not] must not change (test_alias_fuzz.py seed 30)
    def f(w: torch.Tensor, x: torch.Tensor) -> Any:
        x.add_(2.0)
        y = w * 0.5
        with torch.no_grad():
            w.index_add_(0, torch.tensor([0, 2]), torch.ones(2), alpha=2)
        return w, y

    compiled = kiln_aotgrad.aot_function(f, kiln_aotgrad.nop_compiler)
    w = torch.randn(10)[::2].detach().requires_grad_()
    x = torch.randn(4, 6).t()
    w2, x2 = w.detach().clone().requires_grad_(), x.clone()
    got, want = compiled(w, x), f(w2, x2)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x, x2)
    assert got[0] is w and w.is_leaf and w.requires_grad


def test_schema_answers_are_kept_per_operator_and_handed_out_fresh() -> None:
    # Note [Schema questions are asked once per operator]
    from kiln_aotgrad.functionalize import is_view_op, mutated_arg_names

    aten = torch.ops.aten
    for _ in range(2):
        assert is_view_op(aten.view.default) and not is_view_op(aten.add_.Tensor)
        assert not is_view_op(aten.mul.Tensor) and not is_view_op(operator.getitem)
        assert mutated_arg_names(aten.add_.Tensor) == ["self"]
        assert mutated_arg_names(aten.add.out) == ["out"] and mutated_arg_names(aten.add.Tensor) == []
    mutated_arg_names(aten.add_.Tensor).append("other")
    assert mutated_arg_names(aten.add_.Tensor) == ["self"]
