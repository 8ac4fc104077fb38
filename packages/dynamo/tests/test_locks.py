"""`with lock:` in a captured frame (Note [Locks in the frame] in variables/locks.py): a block
that only reads and computes is traced without the lock; one with an effect outside the graph or
an in-place op is traced too, its effects replayed under the real lock (Note [Effects under a
lock replayed under it]), or, where it cannot be, one break before the block, which runs as
Python under the lock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import CountingBackend, assert_same

import kiln_dynamo
from kiln_dynamo import Unsupported, guards
from kiln_dynamo.variables import locks
from kiln_dynamo.variables.base import ConstantVariable

LOCK = threading.Lock()
RLOCK = threading.RLock()
STATE = {"scale": 2.0}
LOG: list[int] = []


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kiln_dynamo.reset()
    LOG.clear()
    yield
    kiln_dynamo.reset()


def reads_under_locks(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    with LOCK:
        y = y * STATE["scale"]
    with RLOCK as got:
        y = y + float(got)
    return y.sin()


class Cached(torch.nn.Module):
    """The pattern of a module that reads a config under its own lock."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self._lock = threading.RLock()
        self.scale = 3.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            scale = self.scale
        return self.lin(x) * scale


def appends_under_a_lock(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    with LOCK:
        LOG.append(1)
        y = y * 2
    return y.sin()


def in_place_under_a_lock(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    with LOCK:
        x.add_(1)
    return y.sin() + x


def run(fn: Callable[..., Any], x: torch.Tensor) -> CountingBackend:
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for _ in range(2):
        a, b = x.clone(), x.clone()
        assert_same(compiled(a), fn(b))
        assert_same(a, b)
    assert not LOCK.locked()
    return backend


@pytest.mark.parametrize("fn", [reads_under_locks, Cached()], ids=["global-locks", "module-rlock"])
def test_a_block_that_only_reads_is_traced(fn: Callable[..., Any]) -> None:
    backend = run(fn, torch.rand(3, 4))
    assert backend.graphs == 1 and kiln_dynamo.counters.graph_breaks == 0
    assert kiln_dynamo.counters.fallbacks == []


@pytest.mark.parametrize("fn", [appends_under_a_lock, in_place_under_a_lock], ids=["append", "in-place"])
def test_a_block_with_effects_is_replayed_under_the_lock(fn: Callable[..., Any]) -> None:
    """Note [Effects under a lock replayed under it]: one graph, the runner takes the lock."""
    backend = run(fn, torch.rand(3))
    c = kiln_dynamo.counters
    assert backend.graphs == 1 and c.graph_breaks == 0 and c.fallbacks == []
    if fn is appends_under_a_lock:
        assert LOG == [1, 1, 1, 1]  # eager's two calls and the compiled two


@pytest.mark.parametrize("fn", [appends_under_a_lock, in_place_under_a_lock], ids=["append", "in-place"])
def test_with_replay_off_a_block_with_effects_is_one_break_before_it(fn: Callable[..., Any]) -> None:
    prev = kiln_dynamo.set_replay_under_locks(False)
    try:
        backend = run(fn, torch.rand(3))
    finally:
        kiln_dynamo.set_replay_under_locks(prev)
    c = kiln_dynamo.counters
    assert backend.graphs == 1 and c.graph_breaks == 1  # x.cos() before the block
    first = c.break_reasons[0]
    assert "whose block has effects" in first.reason and first.note is not None
    assert "split before the with-block over the lock" in first.note
    if fn is appends_under_a_lock:
        assert LOG == [1, 1, 1, 1]


def two_blocks_with_effects(x: torch.Tensor) -> torch.Tensor:
    with LOCK:
        LOG.append(1)
    y = x.cos()
    with RLOCK:
        LOG.append(2)
    return y.sin()


def test_a_second_block_with_effects_is_a_break() -> None:
    backend = run(two_blocks_with_effects, torch.rand(3))
    assert kiln_dynamo.counters.graph_breaks == 1 and backend.graphs >= 1
    assert "a second with-block over a lock" in kiln_dynamo.counters.break_reasons[0].reason
    assert LOG == [1, 2] * 4


def test_the_guard_returns_holding_the_lock_only_when_it_passes_under_it() -> None:
    lock = threading.Lock()
    answers = iter([True, False])
    assert not guards.take_lock_if(lock, lambda: next(answers), ())
    assert not lock.locked()  # passed without the lock, failed under it: released
    assert not guards.take_lock_if(lock, lambda: False, ())
    assert not lock.locked()
    assert guards.take_lock_if(lock, lambda: True, ())
    assert lock.locked()
    lock.release()


def test_a_lock_held_elsewhere_while_tracing_is_a_break() -> None:
    held = threading.Lock()
    held.acquire()
    try:
        with pytest.raises(Unsupported, match="held by another thread"):
            locks.enter_lock(None, ConstantVariable(held), held, 0)  # type: ignore[arg-type]
    finally:
        held.release()


def breaks_under_a_lock(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    with LOCK:
        y = y * 2
        print("held:", LOCK.locked())  # a break inside the block
        y = y + 1
    return y.sin()


def test_a_break_inside_the_block_runs_the_block_as_python_under_the_lock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    backend = run(breaks_under_a_lock, torch.rand(3))
    assert capsys.readouterr().out == "held: True\n" * 4
    assert backend.graphs == 1 and kiln_dynamo.counters.graph_breaks == 1  # x.cos() before it
    first = kiln_dynamo.counters.break_reasons[0]
    assert "lock.locked" in first.reason and first.note is not None and "before the with-block" in first.note
