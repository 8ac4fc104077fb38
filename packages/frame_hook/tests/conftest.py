"""Shared helpers: every test starts and ends with no callback and empty caches."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import pytest

import kiln_frame_hook as hook


@pytest.fixture(autouse=True)
def clean_hook() -> Iterator[None]:
    hook.set_callback(None)
    hook.set_thread_callback(None)
    hook.reset()
    limit = hook.get_cache_limit()
    yield
    hook.set_callback(None)
    hook.set_thread_callback(None)
    hook.reset()
    hook.set_cache_limit(limit)
    assert not hook.is_installed()


@dataclass
class Recorder:
    """A callback that records the frames it sees and answers from a table keyed by code.

    Installed interpreter-wide (`hook.callback`), a callback also sees the frames of threads the
    test did not start: pytest-xdist's worker runs its I/O thread in Python beside the test, and
    on 3.12 that thread ran 80 frames through a recorder between two calls of the test's own
    function. So by default a recorder looks only at frames of the thread that made it; a test
    about other threads asks for `any_thread=True`."""

    answers: dict[CodeType, Any] = field(default_factory=dict)
    seen: list[hook.Frame] = field(default_factory=list)
    any_thread: bool = False
    thread: int = field(default_factory=threading.get_ident)

    def __call__(self, frame: hook.Frame) -> Any:
        if not self.any_thread and threading.get_ident() != self.thread:
            return None
        self.seen.append(frame)
        return self.answers.get(frame.code)

    def names(self) -> list[str]:
        return [f.code.co_name for f in self.seen]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def this_thread(cb: Callable[[hook.Frame], Any]) -> Callable[[hook.Frame], Any]:
    """`cb` for frames of the calling thread; other threads' frames run as they are (see Recorder)."""
    me = threading.get_ident()

    def on_this_thread(frame: hook.Frame) -> Any:
        return cb(frame) if threading.get_ident() == me else None

    return on_this_thread


def always(*values: Any) -> bool:
    return True


def replace_with(fn: Callable[..., Any], guard: Callable[..., Any] = always) -> hook.GuardedCode:
    return hook.GuardedCode(guard, fn.__code__)
