"""A break two inlined calls down (Note [Resuming a chain of frames] in kiln_dynamo's breaks.py)
through the whole kiln pipeline, in training: the graph before the break and the one after it
(the outer continuation calling the inner ones) are compiled by kiln's backend, and the loss and
every gradient equal eager's on each call."""

from __future__ import annotations

import pytest
import torch

import kiln
import kiln_dynamo


def _leaf(y: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    z = y * 2
    print("leaf", tuple(z.shape))  # the break, two calls below `_top`
    return (z + k).tanh(), k


def _mid(x: torch.Tensor) -> torch.Tensor:
    a = x.sin() + 1
    b, k = _leaf(a, 3)
    return b * a - k


def _top(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    t = x @ w
    u = _mid(t)
    return (u - t).sum()


def test_a_chain_split_trains_as_eager(capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    w_eager = torch.randn(4, 4, requires_grad=True)
    w = w_eager.detach().clone().requires_grad_()
    expected = _top(x, w_eager)
    expected.backward()
    eager_out = capsys.readouterr().out
    kiln_dynamo.reset()
    compiled = kiln.compile(_top)
    for _ in range(2):
        w.grad = None
        loss = compiled(x, w)
        loss.backward()
        assert capsys.readouterr().out == eager_out
        torch.testing.assert_close(loss, expected)
        assert w.grad is not None and w_eager.grad is not None
        torch.testing.assert_close(w.grad, w_eager.grad)
    report = kiln.explain(_top)(x, w)
    assert (report.graph_count, report.graph_break_count) == (2, 1)
