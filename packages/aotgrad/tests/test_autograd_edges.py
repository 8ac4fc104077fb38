"""Note [Inputs whose gradient comes only through their new values] (runtime.py): the compiled
autograd Function links to an input's history only where one of its outputs' gradients reaches
the input; an input reached only through its new value is linked through the mutation node."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from aot_helpers import Recorder

import kiln_aotgrad


def _freed_history(w: torch.Tensor) -> torch.Tensor:
    """A tensor that requires grad whose history saved tensors a backward already freed."""
    b = w * w
    b.sum().backward()
    return b


def _writes_and_ignores(x: torch.Tensor, b: torch.Tensor) -> Any:
    b.add_(x.sum())  # `b`'s new value depends on its old one; the returned value does not
    return x.sin()


def test_an_output_that_does_not_read_a_mutated_input_does_not_reach_its_history() -> None:
    # test_alias_fuzz.py seed 3127: eager's backward from the output never meets `b`'s history
    compiled = kiln_aotgrad.aot_function(_writes_and_ignores, kiln_aotgrad.nop_compiler)
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3, requires_grad=True)
    b_e, b_c = _freed_history(w), _freed_history(w)
    want, got = _writes_and_ignores(x, b_e), compiled(x, b_c)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(b_c, b_e)
    ge = torch.autograd.grad(want.sum(), (x, w), allow_unused=True)
    # raised "Trying to backward through the graph a second time"
    gc = torch.autograd.grad(got.sum(), (x, w), allow_unused=True)
    torch.testing.assert_close(gc, ge)


@pytest.mark.parametrize("op", ["add", "mul"])
def test_the_new_value_still_carries_the_gradient_into_the_old_history(op: str) -> None:
    def f(x: torch.Tensor, b: torch.Tensor) -> Any:
        getattr(b, f"{op}_")(x * 2)
        return x.cos()

    compiled = kiln_aotgrad.aot_function(f, kiln_aotgrad.nop_compiler)
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3, requires_grad=True)
    b_e, b_c = w * 3, w * 3
    want, got = f(x, b_e), compiled(x, b_c)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(b_c, b_e)
    ge = torch.autograd.grad(want.sum() + (b_e * b_e).sum(), (x, w))
    gc = torch.autograd.grad(got.sum() + (b_c * b_c).sum(), (x, w))
    torch.testing.assert_close(gc, ge)
    # the new value alone: no gradient of the output flows
    b_e, b_c = w * 3, w * 3
    f(x, b_e), compiled(x, b_c)
    torch.testing.assert_close(torch.autograd.grad(b_c.sum(), (x, w)), torch.autograd.grad(b_e.sum(), (x, w)))


def test_an_output_that_reads_the_old_value_reaches_the_history_as_in_eager() -> None:
    # eager backpropagates through `b`'s old history and raises there: so does the compiled one
    def f(x: torch.Tensor, b: torch.Tensor) -> Any:
        y = x + b
        b.add_(x.sum())
        return y

    compiled = kiln_aotgrad.aot_function(f, kiln_aotgrad.nop_compiler)
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3, requires_grad=True)
    want, got = f(x, _freed_history(w)), compiled(x, _freed_history(w))
    torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(want.sum(), (x, w))
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(got.sum(), (x, w))


def test_an_input_without_gradient_is_passed_detached() -> None:
    # `b` requires grad but the graph reads only its shape: no gradient, no edge to its history
    def f(x: torch.Tensor, b: torch.Tensor) -> Any:
        return x * b.detach()

    compiled = kiln_aotgrad.aot_function(f, kiln_aotgrad.nop_compiler)
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3, requires_grad=True)
    want, got = f(x, _freed_history(w)), compiled(x, _freed_history(w))
    torch.testing.assert_close(got, want)
    ge = torch.autograd.grad(want.sum(), (x, w), allow_unused=True)
    gc = torch.autograd.grad(got.sum(), (x, w), allow_unused=True)
    torch.testing.assert_close(gc, ge)


# Note [Views of intermediates leave the Function as views of its outputs] (joint.py)
def _view_of_intermediate(x: torch.Tensor) -> Any:
    return (x * 2).t()[3]


def _select_of_flat_copy(x: torch.Tensor) -> Any:
    # test_alias_fuzz.py seed 3212: the autograd base is the flatten's `_unsafe_view` of a clone,
    # which a code generator may return as a view (Note [Outputs the code generator returns as
    # views] in runtime.py; test_views.py covers a compiler that does)
    return x.t().flatten()[8]


def _root_and_view(x: torch.Tensor) -> Any:
    t = (x * 2).flatten()
    return t[8:12], t


def _view_and_root(x: torch.Tensor) -> Any:
    t = (x * 2).flatten()
    return t, t[8:12]


def _pieces(x: torch.Tensor) -> Any:
    y = x * 2
    return y[:, :2], y[:, 2:4], y[:, 4:]  # q, k, v of one intermediate


def _written_reshape(x: torch.Tensor) -> Any:
    t4 = x.t().reshape(1, 24)  # an `_unsafe_view` of a clone: no autograd view (seed 3575)
    t4.fill_(1.0)
    t7 = t4.t()
    return t7, t7


@pytest.mark.parametrize(
    "fn",
    [_written_reshape, _view_of_intermediate, _select_of_flat_copy, _root_and_view, _view_and_root, _pieces],
    ids=lambda f: f.__name__,
)
def test_a_view_of_an_intermediate_can_be_written_in_place(fn: Any) -> None:
    def program(x: torch.Tensor) -> Any:
        return fn(x)

    compiled = kiln_aotgrad.aot_function(program, kiln_aotgrad.nop_compiler)
    x_e = torch.randn(4, 6, requires_grad=True)
    x_c = x_e.detach().clone().requires_grad_()
    results = []
    for outs in (program(x_e), compiled(x_c)):
        results.append(list(outs) if isinstance(outs, (tuple, list)) else [outs])
    want, got = results
    for k, w_ in enumerate(want):
        if w_._base is not None:  # eager's views: written in place in both
            for o in (w_, got[k]):
                o.mul_(3.0)  # raised: "is a view and is being modified inplace"
                o.add_(0.5)
    torch.testing.assert_close(got, want)
    loss_e = sum((o * (k + 1)).sum() for k, o in enumerate(want))
    loss_c = sum((o * (k + 1)).sum() for k, o in enumerate(got))
    torch.testing.assert_close(torch.autograd.grad(loss_c, x_c), torch.autograd.grad(loss_e, x_e))


def test_as_strided_after_a_view_of_an_intermediate_keeps_eager_gradient() -> None:
    # test_alias_fuzz.py seed 3218: laid over the intermediate, the as_strided view's gradient
    # reached an element eager's (through the select's geometry) does not
    def f(x: torch.Tensor) -> Any:
        t2 = (x * 0.5).permute(1, 0)
        t5 = t2.select(1, 3)
        t7 = t5.as_strided((1, 1), (2, 1), 22)
        return [t7, t2, t7]

    compiled = kiln_aotgrad.aot_function(f, kiln_aotgrad.nop_compiler)
    x_e = torch.randn(5, 5, requires_grad=True)
    x_c = x_e.detach().clone().requires_grad_()
    want, got = f(x_e), compiled(x_c)
    torch.testing.assert_close(got, want)
    loss_e = sum((o * (k + 1)).sum() for k, o in enumerate(want))
    loss_c = sum((o * (k + 1)).sum() for k, o in enumerate(got))
    torch.testing.assert_close(torch.autograd.grad(loss_c, x_c), torch.autograd.grad(loss_e, x_e))


def test_a_constant_gradient_keeps_its_edge() -> None:
    # the OpInfo sweep's `nextafter`: eager's gradient for `other` is zeros, which read no
    # tangent; the input went to the mutation node (no mutated input) and came back None
    def f(a: torch.Tensor, b: torch.Tensor) -> Any:
        return torch.nextafter(a, b)

    compiled = kiln_aotgrad.aot_function(f, kiln_aotgrad.nop_compiler)
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    ge = torch.autograd.grad(f(a, b).sum(), (a, b), allow_unused=True)
    gc = torch.autograd.grad(compiled(a, b).sum(), (a, b), allow_unused=True)
    assert gc[1] is not None
    torch.testing.assert_close(gc, ge)


def _sum_and_add(x: torch.Tensor) -> torch.Tensor:
    return x.sum() + 1.0


def test_a_backward_that_saved_nothing_runs_again() -> None:
    # Note [A backward that saved no tensors runs again] (runtime.py): eager's sum and add save
    # no tensors, so a second backward runs; the compiled call's empty `save_for_backward()`
    # raised "Trying to backward through the graph a second time" (test_alias_fuzz.py seed 22171)
    x = torch.randn(5, requires_grad=True)
    y = kiln_aotgrad.aot_function(_sum_and_add, Recorder())(x)
    y.backward()
    y.backward()
    torch.testing.assert_close(x.grad, torch.full((5,), 2.0))


def _saves_its_input(x: torch.Tensor) -> torch.Tensor:
    return (x * x).sum()


def test_a_second_backward_through_freed_tensors_raises_eagers_error() -> None:
    x = torch.randn(5, requires_grad=True)
    y = kiln_aotgrad.aot_function(_saves_its_input, Recorder())(x)
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def _adds_into_a_buffer(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    b.add_(x[1])  # eager's add saves nothing
    return torch.where(b > 0, b, x[0])  # eager's where saves its mask


def _multiplies_into_a_buffer(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    b.mul_(x[1])  # eager's mul saves its operands
    return torch.where(b > 0, b, x[0])


def _calls_twice(fn: Any, compiler: Any) -> list[Any]:
    """Two calls on one buffer `b`, a backward after each: the first call's write leaves `b`
    with history, which the second call's backward reaches again."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, generator=g).requires_grad_()
    b = torch.randn(4, generator=g)
    f = kiln_aotgrad.aot_function(fn, compiler) if compiler is not None else fn
    got: list[Any] = []
    for _ in range(2):
        out = f(x, b)
        try:
            got.append((out.detach().clone(), *torch.autograd.grad(out.sum(), [x])))
        except RuntimeError as e:
            got.append(str(e).split(" (")[0])
    return got


def test_a_written_input_whose_write_saved_nothing_runs_again() -> None:
    # Note [New values differentiated on their own] (joint.py): the second backward reaches the
    # first call's write through `b`; eager's add saved nothing and runs again. One Function for
    # the whole first call had saved the `where`'s mask for the user output, freed by the first
    # backward: "Trying to backward through the graph a second time" (test_alias_fuzz.py seed
    # 30344)
    want = _calls_twice(_adds_into_a_buffer, None)
    got = _calls_twice(_adds_into_a_buffer, Recorder())
    assert all(isinstance(w, tuple) for w in want)
    for w, c in zip(want, got, strict=True):
        assert isinstance(c, tuple), c
        torch.testing.assert_close(c, w)


def test_a_written_input_whose_write_saved_tensors_raises_eagers_error() -> None:
    want = _calls_twice(_multiplies_into_a_buffer, None)
    got = _calls_twice(_multiplies_into_a_buffer, Recorder())
    assert isinstance(want[0], tuple) and isinstance(got[0], tuple)
    torch.testing.assert_close(got[0], want[0])
    assert want[1] == got[1] and "backward through the graph a second time" in want[1]
