"""Column sums fused with a pointwise producer (Note [Pointwise producers in a column
reduction's order] in kiln_loopir's scheduler.py): the producer is re-expressed in the sum's loop
order, so one kernel writes it and sums its columns. Checked against eager at one and two
threads, with the kernel counts with the option on and off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from cpp_check import assert_same, aten, check, eager, make, trace

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph
from kiln_loopir.ir import ReorderedPointwise


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


def _shared_with_a_row_reduction(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Any:
    # p is summed over its columns (the bias gradient) and read by a matmul; a row reduction
    # reads all of p's inputs, so the two could fuse horizontally
    p = aten.add.Tensor(aten.mul.Tensor(x, a), aten.mul.Tensor(y, b))
    q = aten.sub.Tensor(aten.mul.Tensor(x, a), aten.mul.Tensor(y, b))
    r = aten.sum.dim_IntList(aten.mul.Tensor(q, q), [1])
    return aten.sum.dim_IntList(p, [0]), r, aten.relu.default(p), aten.mm.default(aten.t.default(p), p)


def _kernel_of(compiled: Any, name: str) -> Any:
    return next(n for n in compiled.schedule.nodes if name in {m.name for m in n.get_nodes()})


def _member(compiled: Any, name: str) -> Any:
    return next(m for n in compiled.schedule.nodes for m in n.get_nodes() if m.name == name)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_reordered_producer_fuses_only_with_its_column_sum(threads: int) -> None:
    """Swin's layer norm recomputed in the backward was reordered for its weight gradient's
    column sum, then fused horizontally with a row reduction over the same inputs first: it ran
    in the row kernel's loop order with strided loads and stores (57 us against 10 us)."""
    inputs = [make((512, 32)) for _ in range(4)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        compiled = check(_shared_with_a_row_reduction, *inputs, scale=10.0)  # a 512-deep matmul
    finally:
        torch.set_num_threads(before)
    schedule = compiled.schedule
    assert schedule.reordered, schedule.describe()
    rows = [m for n in schedule.nodes for m in n.get_nodes() if m.is_reduction() and m.group() == (512, 32)]
    assert len(rows) == 1
    for producer, column in schedule.reordered:
        assert _kernel_of(compiled, producer) is _kernel_of(compiled, column), schedule.describe()
        # alone, the reordered producer may not join the row reduction (before: it could)
        assert not schedule.can_fuse(_member(compiled, producer), rows[0])
        assert schedule.can_fuse(_member(compiled, producer), _member(compiled, column))


class _PartnerRefused(CppBackend):
    """Accepts a reordered producer with its column sum when the scheduler asks before reordering,
    then refuses the pair: as when the sum fused elsewhere first and the pair became illegal."""

    def __init__(self) -> None:
        super().__init__({"column_sum_fusion": True})
        self.asked: set[str] = set()

    def can_fuse(self, node1: Any, node2: Any) -> bool:
        reordered = [
            m.name for n in (node1, node2) for m in n.get_nodes() if type(m.node) is ReorderedPointwise
        ]
        if reordered and any(m.is_reduction() for n in (node1, node2) for m in n.get_nodes()):
            first = reordered[0] not in self.asked
            self.asked.add(reordered[0])
            return first
        return super().can_fuse(node1, node2)


@pytest.mark.parametrize("threads", [1, 2])
def test_an_unpaired_producer_goes_back_to_its_own_order(threads: int) -> None:
    inputs = [make((512, 32)) for _ in range(4)]
    gm = trace(_shared_with_a_row_reduction)
    backend = _PartnerRefused()
    compiled = compile_graph(gm, inputs, backend=backend)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = compiled(*inputs)
    finally:
        torch.set_num_threads(before)
    assert backend.asked, "the scheduler never considered a reordered producer"
    assert compiled.schedule.reordered == []
    members = [m for n in compiled.schedule.nodes for m in n.get_nodes()]
    assert not [m for m in members if isinstance(getattr(m, "node", None), ReorderedPointwise)]
    for g, e in zip(got, eager(gm, *inputs), strict=True):
        assert_same(g, e, "output", 10.0)


def _transposed_producer(x: torch.Tensor) -> Any:
    # Swin's attention gradient: [32, 2, 16, 16] -> [32, 16, 2, 16] (a transpose), scaled, seen
    # as [512, 32] and summed over its rows; in the sum's order each lane would gather
    p = aten.mul.Tensor(
        aten.clone.default(aten.permute.default(x, [0, 2, 1, 3]), memory_format=torch.contiguous_format), 0.5
    )
    v = aten.view.default(p, [512, 32])
    mm = aten.mm.default(aten.t.default(v), v)  # first: p is a buffer when the sum reads it
    return aten.sum.dim_IntList(v, [0]), mm


def test_a_transposing_producer_is_not_reordered() -> None:
    compiled = check(_transposed_producer, make((32, 2, 16, 16)), scale=10.0)
    assert compiled.schedule.reordered == [], compiled.schedule.describe()
