"""Shared helpers: every test starts and ends with no callback and empty caches."""

from __future__ import annotations

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
    """A callback that records the frames it sees and answers from a table keyed by code."""

    answers: dict[CodeType, Any] = field(default_factory=dict)
    seen: list[hook.Frame] = field(default_factory=list)

    def __call__(self, frame: hook.Frame) -> Any:
        self.seen.append(frame)
        return self.answers.get(frame.code)

    def names(self) -> list[str]:
        return [f.code.co_name for f in self.seen]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def always(*values: Any) -> bool:
    return True


def replace_with(fn: Callable[..., Any], guard: Callable[..., Any] = always) -> hook.GuardedCode:
    return hook.GuardedCode(guard, fn.__code__)
