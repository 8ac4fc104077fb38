"""`requires_grad` set in the frame (Note [requires_grad set in the frame]) and `is_leaf` of an
input (Note [is_leaf of an input])."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same

import kiln_dynamo


def test_requires_grad_set_to_its_value_on_a_leaf_is_traced() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x.requires_grad = False
        w.requires_grad = True
        return x * w

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    report = kiln_dynamo.explain(f)(x, w)
    assert (report.graph_count, report.break_reasons) == (1, [])
    assert_same(f(x, w), report.result)


def test_requires_grad_that_makes_a_new_leaf_is_one_break() -> None:
    # the wav2vec2 feature encoder's `hidden_states.requires_grad = True` in training
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x[:, None]
        h.requires_grad = True
        return (h * w).relu().sum(-1)

    x, w = torch.randn(2, 4), torch.randn(4, requires_grad=True)
    report = kiln_dynamo.explain(f)(x, w)
    assert report.graph_count == 2 and len(report.break_reasons) == 1, report
    assert "new leaf tensor in the middle of the graph" in report.break_reasons[0].reason
    want = f(x, w)
    assert_same(want, report.result)
    (gw_want,) = torch.autograd.grad(want.sum(), w)
    (gw_got,) = torch.autograd.grad(report.result.sum(), w)
    assert_same(gw_want, gw_got)


def test_requires_grad_of_a_non_leaf_raises_as_eager() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x * w
        y.requires_grad = False
        return y

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf variables"):
        kiln_dynamo.compile(f)(x, w)


def test_is_leaf_of_an_input_computed_by_autograd() -> None:
    # a fake of an input is always a leaf: `x.is_leaf` answered True for `a.exp()`
    def f(x: torch.Tensor) -> tuple[torch.Tensor, bool, bool]:
        return x * 2, x.is_leaf, (x * 2).is_leaf

    a = torch.randn(3, requires_grad=True)
    compiled = kiln_dynamo.compile(f)
    for arg in (a.exp(), a, torch.randn(3), a.exp()):
        assert_same(f(arg), compiled(arg))


def test_in_place_write_into_an_input_autograd_computed_is_traced() -> None:
    # Note [In-place writes into inputs autograd computed]: the fake of `h` is a leaf, so
    # autograd's leaf check broke the graph at `h.add_(x)` where eager runs it
    def f(h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
        h.add_(x)
        h += x.sin()
        return h * 2, h.is_leaf

    w, x = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    report = kiln_dynamo.explain(f)(w * 1.5, x)
    assert (report.graph_count, report.break_reasons) == (1, [])
    compiled = kiln_dynamo.compile(f)
    for _ in range(2):
        w2, x2 = w.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        h, h2 = w * 1.5, w2 * 1.5
        want, got = f(h, x), compiled(h2, x2)
        assert_same(want, got)
        assert_same(h, h2)
        want[0].sum().backward()
        got[0].sum().backward()
        assert_same((w.grad, x.grad), (w2.grad, x2.grad))
        w.grad = x.grad = None
    # a leaf that requires grad (guarded: `is_leaf` of the input): eager's error, compiled too
    leaf = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        f(leaf, x)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        compiled(leaf, x)
