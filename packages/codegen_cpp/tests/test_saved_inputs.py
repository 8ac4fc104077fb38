"""Saved values that are an input seen through a view that changes nothing are returned as the
input itself (Note [Saved inputs returned as themselves] in wrapper.py); a user's output, and a
view that does change the layout, stay views. Checked against eager at one and two threads, with
the option on and off."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from cpp_check import assert_same, aten, eager, make, trace

from kiln_loopir import compile_graph
from kiln_loopir.graph import FREE_LAYOUT_OUTPUTS


def _forward(x: torch.Tensor, w: torch.Tensor) -> Any:
    wt = aten.t.default(w)
    y = aten.mm.default(x, wt)
    same = aten.t.default(wt)  # w's own layout: saved for the backward's grad @ w
    user_view = aten.permute.default(wt, [1, 0])  # the same layout, but a user's output
    return y, user_view, same, wt, x


def _compiled(saved: tuple[int, ...], threads: int, monkeypatch: pytest.MonkeyPatch, on: bool) -> Any:
    monkeypatch.setenv("KILN_CPP_OPTIONS", f"saved_inputs_as_is={int(on)}")
    gm = trace(_forward)
    gm.meta[FREE_LAYOUT_OUTPUTS] = saved
    x, w = make((8, 16)), make((12, 16))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = compile_graph(gm, [x, w], backend="cpp")(x, w)
    finally:
        torch.set_num_threads(before)
    return x, w, got


@pytest.mark.parametrize("threads", [1, 2])
def test_saved_identity_view_is_the_input(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, got = _compiled((2, 3, 4), threads, monkeypatch, on=True)
    assert_same(got, eager(_forward, x, w))
    assert got[2] is w  # saved, w's own layout: w itself
    assert got[3] is not w and got[3].stride() == (1, 16)  # saved, transposed: a view
    assert got[1] is not w and got[1].data_ptr() == w.data_ptr()  # a user's output: its own view
    assert got[4] is x


@pytest.mark.parametrize("threads", [1, 2])
def test_off_or_not_saved_keeps_views(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for saved, on in (((2, 3, 4), False), ((), True)):
        x, w, got = _compiled(saved, threads, monkeypatch, on)
        assert_same(got, eager(_forward, x, w))
        assert got[2] is not w and got[2].stride() == w.stride() and got[2].data_ptr() == w.data_ptr()
