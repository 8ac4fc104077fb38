"""`register_hook` on a tensor the frame received is replayed after the graph (Note [Hooks on
input tensors] in variables/tensor.py): no break, the hook fires in backward as in eager."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import CountingBackend

import kiln_dynamo

SEEN: list[torch.Tensor] = []


def record(g: torch.Tensor) -> None:
    SEEN.append(g.clone())


def doubles(g: torch.Tensor) -> torch.Tensor:
    return g * 2  # a hook that changes the gradient


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kiln_dynamo.reset()
    SEEN.clear()
    yield
    kiln_dynamo.reset()


def hook_on_input(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.register_hook(record)
    y = (x * w).sin()
    w.register_hook(doubles)
    return y.sum()


def hook_on_intermediate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x * w
    y.register_hook(record)  # its grad is computed inside the compiled backward: a break
    return y.sin().sum()


def handle_kept(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, Any]:
    h = x.register_hook(record)
    return (x * w).sum(), h


def lambda_hook(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.register_hook(lambda g: g * 3)  # made in the frame: the runner cannot name it
    return (x * w).sum()


def grads(fn: Callable[..., Any], compiled: bool) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Two calls on fresh leaves, backward after each: what the hooks saw and the grads."""
    torch.manual_seed(0)
    x, w = torch.rand(4, requires_grad=True), torch.rand(4, requires_grad=True)
    f = kiln_dynamo.compile(fn, backend=CountingBackend()) if compiled else fn
    SEEN.clear()
    for _ in range(2):
        out = f(x, w)
        (out[0] if isinstance(out, tuple) else out).backward()
    return list(SEEN), x.grad, w.grad  # type: ignore[return-value]


@pytest.mark.parametrize("fn", [hook_on_input, hook_on_intermediate, handle_kept, lambda_hook])
def test_hooks_fire_as_in_eager(fn: Callable[..., Any]) -> None:
    want_seen, want_x, want_w = grads(fn, compiled=False)
    seen, gx, gw = grads(fn, compiled=True)
    assert len(seen) == len(want_seen)
    for a, b in zip(seen, want_seen, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gx, want_x)
    torch.testing.assert_close(gw, want_w)  # doubled by the hook on w, twice


def test_a_hook_on_an_input_is_no_break() -> None:
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(hook_on_input, backend=backend)
    x, w = torch.rand(4, requires_grad=True), torch.rand(4, requires_grad=True)
    compiled(x, w)
    assert backend.graphs == 1 and kiln_dynamo.counters.graph_breaks == 0
    assert kiln_dynamo.counters.fallbacks == []
    assert list(x._backward_hooks.values()) == [record]  # type: ignore[union-attr]
    assert list(w._backward_hooks.values()) == [doubles]  # type: ignore[union-attr]


@pytest.mark.parametrize("fn", [hook_on_intermediate, lambda_hook])
def test_where_the_replay_cannot_do_it_the_frame_breaks(fn: Callable[..., Any]) -> None:
    kiln_dynamo.compile(fn, backend=CountingBackend())(torch.rand(4, requires_grad=True), torch.rand(4))
    assert kiln_dynamo.counters.break_reasons[0].reason == "tensor hooks"


def test_a_kept_handle_is_the_real_one() -> None:
    x = torch.rand(4, requires_grad=True)
    _, handle = kiln_dynamo.compile(handle_kept, backend=CountingBackend())(x, torch.rand(4))
    assert isinstance(handle, torch.utils.hooks.RemovableHandle)
    handle.remove()
    assert not x._backward_hooks


def test_a_hook_on_a_tensor_without_grad_raises_as_in_eager() -> None:
    x, w = torch.rand(4), torch.rand(4)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        hook_on_input(x, w)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        kiln_dynamo.compile(hook_on_input, backend=CountingBackend())(x, w)
