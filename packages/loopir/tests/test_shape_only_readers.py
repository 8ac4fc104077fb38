"""Readers that take only a value's shape do not count as readers in the realize heuristic (Note
[Why a value is realized] (c) in graph.py): ``_safe_softmax``'s decomposition reads its softmax
once for data and once for ``full_like``'s shape, and the softmax inlines into the ``where``.
Against eager through the reference interpreter, with the option on and off (off by default)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kiln_loopir import compile_graph
from kiln_loopir.graph import SHAPE_ONLY_READERS
from kiln_loopir.ir import ComputedBuffer, Pointwise
from kiln_loopir.testing import assert_same, safe_softmax, safe_softmax_inputs, trace

aten = torch.ops.aten


def realized_pointwise(compiled: Any) -> list[str]:
    return [
        name
        for name, b in compiled.graph.name_to_buffer.items()
        if isinstance(b, ComputedBuffer)
        and isinstance(b.data, Pointwise)
        and name not in compiled.schedule.output_names
    ]


@pytest.mark.parametrize("on", [True, False])
def test_softmax_read_for_its_shape_inlines(on: bool) -> None:
    args = safe_softmax_inputs()
    compiled = compile_graph(trace(safe_softmax), args, options={"shape_only_readers": on})
    got, want = compiled(*args), safe_softmax(*args)
    assert_same(got, want, "safe softmax")
    assert not torch.isnan(got).any() and torch.equal(got[1, :, 2], torch.zeros(2, 4))
    # on: the softmax is computed inside the where; off: stored and read back
    assert len(realized_pointwise(compiled)) == (0 if on else 1), realized_pointwise(compiled)
    assert ("shape_only_readers" in str(compiled.passes.record)) is on


@pytest.mark.parametrize("data_readers", [1, 2])
def test_only_readers_that_load_count(data_readers: int) -> None:
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, e: torch.Tensor) -> Any:
        v = aten.add.Tensor(aten.add.Tensor(aten.add.Tensor(aten.add.Tensor(a, b), c), d), e)  # 5 loads
        if data_readers == 1:
            return aten.add.Tensor(v, 1.0), aten.zeros_like.default(v)
        return aten.add.Tensor(v, 1.0), aten.mul.Tensor(v, 2.0), aten.zeros_like.default(v)

    args = [torch.randn(8, 8) for _ in range(5)]
    compiled = compile_graph(trace(f), args, options={"shape_only_readers": True})
    for got, want in zip(compiled(*args), f(*args), strict=True):
        assert_same(got, want, "output")
    # more than MAX_REUSE_LOADS loads: stored once when two readers load it, inlined into one
    assert len(realized_pointwise(compiled)) == data_readers - 1


def test_off_by_default() -> None:
    args = safe_softmax_inputs()
    assert len(realized_pointwise(compile_graph(trace(safe_softmax), args))) == 1


def test_the_table() -> None:
    assert aten.full_like.default in SHAPE_ONLY_READERS and aten.add.Tensor not in SHAPE_ONLY_READERS
