"""Column sums fused with a pointwise producer (Note [Pointwise producers in a column
reduction's order] in kiln_loopir's scheduler.py): the producer is re-expressed in the sum's loop
order, so one kernel writes it and sums its columns. Checked against eager at one and two
threads, with the kernel counts with the option on and off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from cpp_check import aten, check, make, trace

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph


def _bias_grad(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> Any:
    g = aten.mul.Tensor(aten.relu.default(a), b)  # [tokens, channels]
    return aten.sum.dim_IntList(g, [0]), aten.mm.default(aten.t.default(g), w)  # bias and weight grads


def _bias_grad_3d(a: torch.Tensor, b: torch.Tensor) -> Any:
    g = aten.mul.Tensor(aten.relu.default(a), b)  # [batch, tokens, channels], summed over tokens
    v = aten.view.default(g, [32, 128])
    return aten.sum.dim_IntList(v, [0]), aten.mm.default(aten.t.default(v), v)


def _realized_producer(a: torch.Tensor, b: torch.Tensor) -> Any:
    # the gradient is read by the sum and by two more kernels, so it is a buffer of its own
    g = aten.mul.Tensor(aten.relu.default(a), b)
    s = aten.sum.dim_IntList(g, [0])
    return s, aten.mm.default(aten.t.default(g), g), aten.add.Tensor(g, 1.0), aten.exp.default(g)


def _not_bijective(a: torch.Tensor, b: torch.Tensor) -> Any:
    # the sum reads an expanded row: the producer's order cannot follow it
    g = aten.mul.Tensor(a, b)  # [1, 96]
    e = aten.expand.default(g, [64, 96])
    return aten.sum.dim_IntList(aten.mul.Tensor(e, e), [0]), aten.mm.default(aten.t.default(g), g)


CASES: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...], int, int]] = {
    # name: (graph, input shapes, kernels with the fusion, kernels without)
    "bias_grad": (_bias_grad, ((64, 96), (64, 96), (64, 8)), 1, 2),
    "bias_grad_3d": (_bias_grad_3d, ((2, 16, 128), (2, 16, 128)), 1, 2),
    "not_bijective": (_not_bijective, ((1, 96), (1, 96)), 1, 1),
}


@pytest.fixture(autouse=True)
def _on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CPP_OPTIONS", "column_sum_fusion=1")  # off by default (the Note)


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_CPP_OPTIONS")
    assert CppBackend().reorder_for_column_reductions is False


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_column_sum_fuses_with_its_producer(case: str, threads: int) -> None:
    fn, shapes, fused, unfused = CASES[case]
    inputs = [make(s) for s in shapes]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        compiled = check(fn, *inputs)
        assert compiled.stats.kernels == fused, compiled.schedule.describe()
        assert bool(compiled.schedule.reordered) == (fused < unfused)
        off = compile_graph(trace(fn), inputs, backend=CppBackend({"column_sum_fusion": False}))
        assert off.stats.kernels == unfused, off.schedule.describe()
        assert off.schedule.reordered == []
    finally:
        torch.set_num_threads(before)


def test_realized_producer_is_reordered_and_still_written_whole() -> None:
    """A producer that other kernels read is computed in the sum's order and still writes every
    element of its buffer (its other readers' answers prove it)."""
    a, b = make((48, 80)), make((48, 80))
    compiled = check(_realized_producer, a, b)
    assert compiled.schedule.reordered, compiled.schedule.describe()
