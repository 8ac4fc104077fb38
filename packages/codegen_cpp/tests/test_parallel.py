"""Note [Parallel plan]: which loops run in parallel, on how many threads, read at run time.

Kernels are compared with eager at 1, 2 and 3 threads (3 oversubscribes a 2-core machine, which
is legal and must not change results), reductions bitwise equal across thread counts; the plan
chosen for typical shapes is checked in the generated C++; and the thread count a kernel reads
is torch's, through the one OpenMP runtime torch and kiln share.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from cpp_check import aten, check, make

from kiln_codegen_cpp.parallel import (
    MIN_WORK_PER_THREAD,
    PARALLEL_GRAIN,
    TARGET_UNITS,
    outer_plan,
    pointwise_plan,
)


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _across_threads(compiled: Any, *inputs: torch.Tensor) -> list[Any]:
    outs = []
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        outs.append(compiled(*inputs))
    return outs


def test_plans_for_typical_shapes() -> None:
    assert pointwise_plan([8], 1000, 8000) is None  # below the grain: no team at all
    wide = pointwise_plan([4], 300_000, 1_200_000)
    assert wide is not None and wide.kind == "chunked" and wide.collapse == 2
    rows = pointwise_plan([512], 768, 512 * 768)
    assert rows is not None and rows.kind == "outer" and rows.units == 512
    assert rows.cap == min(512, 512 * 768 // MIN_WORK_PER_THREAD)
    # a medium kernel is capped below 16 threads: each thread gets MIN_WORK_PER_THREAD at least
    medium = pointwise_plan([TARGET_UNITS], PARALLEL_GRAIN // TARGET_UNITS, PARALLEL_GRAIN)
    assert medium is not None and medium.cap == PARALLEL_GRAIN // MIN_WORK_PER_THREAD
    few = outer_plan([4], 4 * 100_000)
    assert few is not None and few.units == 4 and few.cap == 4  # reductions: over outputs only
    assert outer_plan([1], 10**6) is None


def test_pointwise_shapes_across_threads(threads: None) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
        wide = aten.mul.Tensor(aten.sigmoid.default(a), 3.0)  # [4, 70001]: chunked inner loop
        flat = aten.add.Tensor(aten.view.default(a, [-1]), 1.0)  # one loop of 280004
        many = aten.relu.default(aten.sub.Tensor(b, 0.5))  # [300, 257]: outer loop
        small = aten.neg.default(c)  # below the grain: serial
        return wide, flat, many, small

    a, b, c = make((4, 70001)), make((300, 257)), make((10, 10))
    compiled = check(fn, a, b, c)
    source = compiled.backend.last_source  # type: ignore[attr-defined]
    assert "kiln::chunk_len" in source
    assert "num_threads(ntk)" in source
    expected = fn(a, b, c)
    for outs in _across_threads(compiled, a, b, c):
        for got, want in zip(outs, expected, strict=True):
            torch.testing.assert_close(got, want)


def test_reductions_bitwise_equal_across_threads(threads: None) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        few_rows = aten.sum.dim_IntList(aten.exp.default(x), [1])  # 3 outputs of 50000: 3 threads
        rows = aten.amax.default(y, [1])  # 4000 outputs
        cols = aten.sum.dim_IntList(y, [0])  # column reduction
        full = aten.sum.default(x)  # split reduction
        return few_rows, rows, cols, full

    x, y = make((3, 50000)), make((4000, 40))
    compiled = check(fn, x, y)
    one, *others = _across_threads(compiled, x, y)
    for other in others:
        for a, b in zip(one, other, strict=True):
            assert torch.equal(a, b)


def test_tiny_kernel_has_no_parallel_region() -> None:
    def fn(x: torch.Tensor) -> Any:
        return aten.mul.Tensor(aten.sum.dim_IntList(x, [1], True), x)

    compiled = check(fn, make((16, 64)))
    assert "omp parallel" not in compiled.backend.last_source  # type: ignore[attr-defined]


def test_kernels_share_torchs_openmp_runtime(threads: None) -> None:
    """One libgomp in the process after a kernel loads, so torch.set_num_threads is the team size
    OpenMP itself reports (omp_get_max_threads), the same number the wrapper passes as ``nt``."""
    check(lambda x: aten.add.Tensor(x, 1.0), make((300, 300)))
    with open("/proc/self/maps") as maps:
        gomp = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(gomp) == 1, gomp
    omp = ctypes.CDLL(gomp.pop())
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        assert omp.omp_get_max_threads() == n == torch.get_num_threads()
