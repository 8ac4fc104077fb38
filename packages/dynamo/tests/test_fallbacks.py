"""Frames kiln cannot capture whole split at a graph break (or, when they cannot be split, run as
plain Python) with a recorded reason — never a crash, never a wrong answer; fullgraph=True raises
Unsupported naming the user's file:line. The full matrix of break kinds is in test_graph_breaks.py."""

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
    # nonzero itself stays in the graph (an unbacked size); a branch on its row count breaks
    if x.nonzero().size(0) > 2:
        return x + 1
    return x - 1


def try_except(x):
    try:
        return x + len(os.getcwd()) * 0
    except RuntimeError:
        return x


def calls_unknown_c_function(x):
    return x + len(os.getcwd()) * 0


def inner_capturable(x):
    return x.cos() + 1


def outer_falls_back(x):
    print("break")
    return inner_capturable(x) * 2


class _Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        print("noisy", x.shape)  # a break inside the submodule's forward
        return self.lin(x)


class TransformerLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.noisy = _Noisy()

    def forward(self, x):
        return self.noisy(self.layer(x))


# Frames that used to run whole as plain Python and now split at the unsupported line.
BREAKS: list[tuple[Any, str]] = [
    (data_dependent_branch, "data-dependent branch on a tensor value"),
    (uses_item, "Tensor.item()"),
    (prints, "print()"),
    (nonzero, "data-dependent branch on u0 > 2"),
    (calls_unknown_c_function, "C function os.getcwd"),
]
# Frames that still run as plain Python: a break inside a try block splits the frame before the
# block (Note [Tracing try blocks]), and here there is nothing before the block to compile.
FALLBACKS: list[tuple[Any, str]] = [(try_except, "C function os.getcwd")]


@pytest.mark.parametrize(("fn", "why"), BREAKS, ids=[f.__name__ for f, _ in BREAKS])
def test_break_is_correct_and_recorded(fn: Any, why: str) -> None:
    x = torch.randn(4)
    compiled = kiln_dynamo.compile(fn)
    torch.testing.assert_close(compiled(x), fn(x))
    torch.testing.assert_close(compiled(x), fn(x))
    assert kiln_dynamo.counters.fallbacks == []
    assert kiln_dynamo.counters.graph_breaks == 1
    (reason,) = kiln_dynamo.counters.break_reasons
    assert reason.split and why in reason.reason, reason
    assert reason.filename == __file__ and reason.code_name == fn.__name__


@pytest.mark.parametrize(("fn", "why"), FALLBACKS, ids=[f.__name__ for f, _ in FALLBACKS])
def test_fallback_is_correct_and_recorded(fn: Any, why: str) -> None:
    x = torch.randn(4)
    compiled = kiln_dynamo.compile(fn)
    torch.testing.assert_close(compiled(x), fn(x))
    torch.testing.assert_close(compiled(x), fn(x))
    reasons = [r for name, r in kiln_dynamo.counters.fallbacks if name == fn.__name__]
    assert len(reasons) == 1, kiln_dynamo.counters.fallbacks
    assert why.lower() in reasons[0].lower(), reasons[0]
    assert "test_fallbacks.py:" in reasons[0]


@pytest.mark.parametrize(("fn", "why"), BREAKS + FALLBACKS, ids=[f.__name__ for f, _ in BREAKS + FALLBACKS])
def test_fullgraph_raises_with_location(fn: Any, why: str) -> None:
    with pytest.raises(kiln_dynamo.Unsupported) as info:
        kiln_dynamo.compile(fn, fullgraph=True)(torch.randn(4))
    assert info.value.where is not None and "test_fallbacks.py:" in info.value.where
    assert why in str(info.value)


def test_raise_in_frame_propagates_same_exception() -> None:
    with pytest.raises(ValueError, match="boom"):
        kiln_dynamo.compile(raises)(torch.randn(2))


def test_outer_frame_splits_and_inner_call_is_inlined_after_the_break() -> None:
    x = torch.randn(3)
    out = kiln_dynamo.compile(outer_falls_back)(x)
    torch.testing.assert_close(out, outer_falls_back(x))
    assert kiln_dynamo.counters.graphs == 1  # the continuation after print, inner_capturable inlined
    assert kiln_dynamo.counters.graph_breaks == 1 and kiln_dynamo.counters.fallbacks == []


def test_unsupported_module_breaks_at_the_call_correctly() -> None:
    torch.manual_seed(0)
    m = TransformerLayer().eval()
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(kiln_dynamo.compile(m)(x), m(x))
    # the print in the submodule's forward splits both frames at once (Note [Resuming a chain of
    # frames])
    [reason] = kiln_dynamo.counters.break_reasons
    assert reason.split and [f.name for f in reason.frames][:2] == ["forward", "forward"]
    assert (
        "print()" in reason.reason and reason.note is not None and "2 frames resumed at once" in reason.note
    )


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
    assert obj.calls == 1  # run once, by CPython at the graph break, not by the tracer
    assert "descriptor" in kiln_dynamo.counters.break_reasons[0].reason


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


def test_library_and_stdlib_frames_are_never_captured_on_their_own() -> None:
    # Note [Frames kiln never captures]: a frame that runs as Python after a break calls
    # numpy/json helpers; they are not offered for capture (only user code and explicit targets)
    import json

    import numpy as np
    import typing_extensions

    import kiln_frame_hook
    from kiln_dynamo import counters
    from kiln_dynamo.convert_frame import is_user_code, skip_libraries

    skip_libraries()
    for module in (np, json, typing_extensions, kiln_dynamo):
        assert kiln_frame_hook.is_skipped(compile("1", module.__file__, "exec")), module.__name__
    here = compile("1", __file__, "exec")
    assert is_user_code(here) and not kiln_frame_hook.is_skipped(here)

    def f(x):
        y = x + 1
        print("a break")  # the rest of the frame runs as a continuation
        return y * float(np.mean(np.asarray([1.0, 2.0]))) + len(json.dumps({"a": 1}))

    kiln_dynamo.reset()
    compiled = kiln_dynamo.compile(f, backend=lambda gm, inputs: gm.forward)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
    seen = counters.frames_seen
    compiled(x)
    assert counters.frames_seen == seen  # nothing new offered on the second call
    # frames captured on their own are f and its continuation, never a numpy/json function
    assert all(r.code_name.startswith("f") for r in counters.break_reasons), counters.break_reasons
