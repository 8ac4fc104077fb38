"""Frames kiln cannot capture run as plain Python with a recorded reason — never a crash, never a
wrong answer; fullgraph=True raises Unsupported naming the user's file:line."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
import torch
from torch import nn

import kiln_dynamo


def data_dependent_branch(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


def uses_item(x):
    return x * x.sum().item()


def prints(x):
    print("side effect")
    return x + 1


def raises(x):
    raise ValueError("boom")


def nonzero(x):
    return x.nonzero()


def try_except(x):
    try:
        return x + 1
    except RuntimeError:
        return x


def calls_unknown_c_function(x):
    return x + len(os.getcwd()) * 0


def inner_capturable(x):
    return x.cos() + 1


def outer_falls_back(x):
    print("break")
    return inner_capturable(x) * 2


class TransformerLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x)


FALLBACKS: list[tuple[Any, str]] = [
    (data_dependent_branch, "data"),
    (uses_item, "item"),
    (prints, "print"),
    (nonzero, "nonzero"),
    (try_except, "try/except"),
    (calls_unknown_c_function, "getcwd"),
]


@pytest.mark.parametrize(("fn", "why"), FALLBACKS, ids=[f.__name__ for f, _ in FALLBACKS])
def test_fallback_is_correct_and_recorded(fn: Any, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(4)
    compiled = kiln_dynamo.compile(fn)
    torch.testing.assert_close(compiled(x), fn(x))
    torch.testing.assert_close(compiled(x), fn(x))
    reasons = [r for name, r in kiln_dynamo.counters.fallbacks if name == fn.__name__]
    assert len(reasons) == 1, kiln_dynamo.counters.fallbacks
    assert why in reasons[0].lower(), reasons[0]
    assert "test_fallbacks.py:" in reasons[0]


@pytest.mark.parametrize(("fn", "why"), FALLBACKS, ids=[f.__name__ for f, _ in FALLBACKS])
def test_fullgraph_raises_with_location(fn: Any, why: str) -> None:
    with pytest.raises(kiln_dynamo.Unsupported) as info:
        kiln_dynamo.compile(fn, fullgraph=True)(torch.randn(4))
    assert info.value.where is not None and "test_fallbacks.py:" in info.value.where


def test_raise_in_frame_propagates_same_exception() -> None:
    with pytest.raises(ValueError, match="boom"):
        kiln_dynamo.compile(raises)(torch.randn(2))


def test_inner_frame_captured_after_outer_falls_back() -> None:
    x = torch.randn(3)
    out = kiln_dynamo.compile(outer_falls_back)(x)
    torch.testing.assert_close(out, outer_falls_back(x))
    assert kiln_dynamo.counters.graphs == 1  # inner_capturable, as its own frame
    assert [n for n, _ in kiln_dynamo.counters.fallbacks] == ["outer_falls_back"]


def test_unsupported_module_falls_back_correctly() -> None:
    torch.manual_seed(0)
    m = TransformerLayer().eval()
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(kiln_dynamo.compile(m)(x), m(x))
    assert kiln_dynamo.counters.fallbacks


def test_module_with_hooks_still_runs_hooks() -> None:
    m = nn.Linear(3, 3)
    calls: list[int] = []
    m.register_forward_hook(lambda mod, inp, out: calls.append(1))
    x = torch.randn(2, 3)
    torch.testing.assert_close(kiln_dynamo.compile(m)(x), m(x))
    assert len(calls) == 2


class WithCachedProperty:
    def __init__(self) -> None:
        self.calls = 0

    @functools.cached_property
    def factor(self) -> int:
        self.calls += 1
        return 3


def uses_cached_property(x, obj):
    return x * obj.factor


def test_user_descriptors_are_not_run_while_tracing() -> None:
    obj = WithCachedProperty()
    out = kiln_dynamo.compile(uses_cached_property)(torch.ones(2), obj)
    torch.testing.assert_close(out, torch.full((2,), 3.0))
    assert obj.calls == 1  # run once, by the plain-Python fallback, not by the tracer
    assert "descriptor" in kiln_dynamo.counters.fallbacks[0][1]


def inplace_identity(x):
    y = x.clone()
    z = y.mul_(2)
    return z is y, z


def test_inplace_result_is_same_object() -> None:
    x = torch.randn(3)
    flag, out = kiln_dynamo.compile(inplace_identity)(x)
    assert flag is True
    torch.testing.assert_close(out, x * 2)
    assert kiln_dynamo.counters.graphs == 1
