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
