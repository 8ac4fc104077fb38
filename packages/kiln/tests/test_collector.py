"""Note [The collector scans only the compile's objects] (kiln/collector.py)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch

import kiln
import kiln.backends
from kiln.collector import only_new_objects


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_compile_window_freezes_what_existed_and_collects_what_it_made() -> None:
    assert gc.get_freeze_count() == 0
    before = _Cycle()
    seen_before = weakref.ref(before)
    del before  # garbage made before the window: frozen, left for after
    with only_new_objects():
        assert gc.get_freeze_count() > 0
        with only_new_objects():  # nested (the backward's compile inside a first call)
            made = _Cycle()
            seen_made = weakref.ref(made)
            del made
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert seen_made() is None  # the window's own cycles are still collected
        assert seen_before() is not None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert seen_before() is None


def test_the_processs_own_freeze_and_a_disabled_collector_are_left_alone() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with only_new_objects():
            pass
        assert gc.get_freeze_count() == frozen  # theirs, not unfrozen
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with only_new_objects():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_a_training_compile_runs_in_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    windows: list[bool] = []

    def spy() -> Any:
        windows.append(True)
        return only_new_objects()

    monkeypatch.setattr(kiln.backends, "only_new_objects", spy)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    compiled = kiln.compile(model)
    try:
        x = torch.randn(4, 8, requires_grad=True)
        compiled(x).sum().backward()
        torch.testing.assert_close(compiled(x), model(x))
    finally:
        kiln.reset()
    assert len(windows) == 2  # the first call (aotgrad and the forward) and the backward's compile
    assert gc.get_freeze_count() == 0
