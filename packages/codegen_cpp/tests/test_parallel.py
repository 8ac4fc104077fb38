"""Note [Parallel plan]: which loops run in parallel, on how many threads, read at run time.

Kernels are compared with eager at 1, 2 and 3 threads (3 oversubscribes a 2-core machine, which
is legal and must not change results), reductions bitwise equal across thread counts; the plan
chosen for typical shapes is checked in the generated C++; and the thread count a kernel reads
is torch's, through the one OpenMP runtime torch and kiln share.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from cpp_check import aten, check, make

from kiln_codegen_cpp import CppBackend, CppOptions
from kiln_codegen_cpp.parallel import (
    CALL_STATEMENTS,
    FEW_OUTPUTS,
    MIN_SPLIT_WORK,
    MIN_WORK_PER_THREAD,
    PARALLEL_GRAIN,
    TARGET_UNITS,
    call_statements,
    outer_plan,
    pointwise_plan,
    split_chunks,
    weighted_work,
)
from kiln_loopir import compile_graph


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
    assert "#pragma omp parallel for" in source
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
    # what this test is about is equality across thread counts; against eager, a float32 sum of
    # 4000 values in [-2, 2] may differ by more than float32's default tolerance where the column
    # cancels to near 0 (2.3e-5 seen once, for unseeded data), so that comparison gets 10x slack
    compiled = check(fn, x, y, scale=10.0)
    one, *others = _across_threads(compiled, x, y)
    for other in others:
        for a, b in zip(one, other, strict=True):
            assert torch.equal(a, b)


def test_split_chunks_for_few_outputs() -> None:
    # Note [Reductions with few outputs]: about TARGET_UNITS units, each worth a thread
    chunk, chunks = split_chunks(3, 3 * 50000, 50000, 8) or (0, 0)
    assert chunk % 8 == 0 and chunks * chunk >= 50000 > (chunks - 1) * chunk
    assert 3 * chunks <= TARGET_UNITS + 3 and 50000 * 3 // (3 * chunks) >= MIN_SPLIT_WORK
    assert split_chunks(FEW_OUTPUTS, 10**7, 10**5, 8) is None  # enough outputs already
    assert split_chunks(4, PARALLEL_GRAIN, 8192, 8) is None  # too small to split
    assert split_chunks(4, 256 * 256, 256, 1) is None  # a [256, 256] bias gradient: 16K a block
    assert split_chunks(2, 10**6, 1, 1) is None  # the outermost reduced loop has one iteration
    bias_grad = split_chunks(4, 2048 * 256, 2048, 1)  # 4 column blocks of a [2048, 256] activation
    assert bias_grad == (256, 8)


def _few_outputs(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> Any:
    rows = aten.sum.dim_IntList(aten.exp.default(x), [1])  # 3 rows of 50000: split rows
    rows_epilogue = aten.add.Tensor(aten.mul.Tensor(aten.amax.default(x, [1]), 2.0), 1.0)
    row_stats = aten.var_mean.correction(x, [1], correction=1)
    row_index = aten.argmin.default(x, 1)
    two_dims = aten.mean.dim(z, [1, 2])  # two reduced loops, chunks of the outer one
    cols = aten.sum.dim_IntList(y, [0])  # one block of 40 columns: split columns
    col_stats = aten.var_mean.correction(y, [0], correction=0)
    col_index = aten.argmax.default(y, 0)
    col_max = aten.relu.default(aten.amax.default(y, [0]))
    var, mean = row_stats[0], row_stats[1]
    cvar, cmean = col_stats[0], col_stats[1]
    return rows, rows_epilogue, var, mean, row_index, two_dims, cols, cvar, cmean, col_index, col_max


def test_reductions_with_few_outputs_split(threads: None) -> None:
    """Note [Reductions with few outputs]: row and column reductions with a handful of outputs
    cut the reduced loop into chunks; they match eager, are bitwise equal at 1, 2 and 3 threads,
    and with ``split_reductions`` off the kernels are the unsplit ones."""
    x, y, z = make((3, 50000)), make((4000, 40)), make((5, 300, 257))
    compiled = check(_few_outputs, x, y, z)
    source = compiled.backend.last_source  # type: ignore[attr-defined]
    assert source.count("#pragma omp parallel for collapse(2)") >= 2
    assert "_part[" in source and "xblk" in source
    one, *others = _across_threads(compiled, x, y, z)
    for other in others:
        for a, b in zip(one, other, strict=True):
            assert torch.equal(a, b)
    backend = CppBackend(CppOptions(split_reductions=False))
    gm = torch.fx.symbolic_trace(_few_outputs)
    unsplit = compile_graph(gm, [x, y, z], backend=backend)
    assert "_part[" not in backend.last_source
    for a, b in zip(unsplit(x, y, z), one, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_split_reductions_at_ties_nans_and_low_precision(dtype: torch.dtype) -> None:
    """The combine keeps eager's answers where chunk order matters: the first of tied extrema,
    the first NaN, a NaN in one chunk only; and float32's blocked sums in split columns.

    The data is seeded: unseeded, it came from whatever the earlier tests had left in torch's
    generator, and a column whose 6000 values cancel to near 0 then failed float32's absolute
    1e-5 against eager after some test orders and not alone. That 1e-5 is below eager's own
    rounding here (its float32 column sums are up to 3.6e-5 off float64 over seeds 0-11, kiln's
    up to 1.4e-5: Note [float32 accumulation]), so float32 compares with eager at 4x the
    tolerance and the column sums against float64, where kiln must be no worse than eager."""
    torch.manual_seed(0)
    x = torch.zeros(3, 50000, dtype=dtype)
    x[0, 30000] = float("nan")
    x[2, 49999] = 5.0
    y = make((6000, 40), dtype)
    y[4321, 7] = float("nan")

    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        return (
            aten.argmax.default(x, 1),
            aten.argmin.default(x, 1),
            aten.amax.default(x, [1]),
            aten.sum.dim_IntList(x, [1]),
            aten.argmax.default(y, 0),
            aten.sum.dim_IntList(y, [0]),
            aten.amin.default(y, [0]),
        )

    compiled = check(fn, x, y, scale=4.0 if dtype == torch.float32 else 1.0)
    assert compiled.backend.last_source.count("_part[") >= 2  # type: ignore[attr-defined]
    if dtype == torch.float32:
        exact = y.double().sum(0)
        finite = ~exact.isnan()
        kiln_err = (compiled(x, y)[5].double() - exact)[finite].abs().max()
        eager_err = (fn(x, y)[5].double() - exact)[finite].abs().max()
        assert kiln_err <= eager_err, (kiln_err, eager_err)


def test_cpp_options_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CPP_OPTIONS", "split_reductions=0")
    assert CppBackend().options.split_reductions is False
    assert CppBackend({"split_reductions": True}).options.split_reductions is True
    monkeypatch.setenv("KILN_CPP_OPTIONS", "nonsense=1")
    with pytest.raises(ValueError, match="nonsense"):
        CppBackend()


def test_the_grain_and_the_work_per_thread_are_options(threads: None) -> None:
    """CppOptions.parallel_grain / min_work_per_thread move the plans' thresholds (to measure
    them at 16 threads): a kernel above the default grain runs serial under a higher one, and a
    larger share per thread caps the team lower; results stay eager's at every thread count."""

    def fn(x: torch.Tensor) -> Any:
        return aten.mul.Tensor(aten.relu.default(x), 3.0)

    x = make((64, 2048))  # 131072 elements: parallel by default
    assert outer_plan([64], x.numel()) is not None
    capped = outer_plan([64], x.numel(), min_work=x.numel() // 2)
    assert capped is not None and capped.cap == 2
    assert pointwise_plan([64], 2048, x.numel(), grain=x.numel() + 1) is None
    default = check(fn, x)
    assert "omp parallel" in default.backend.last_source  # type: ignore[attr-defined]
    serial_backend = CppBackend({"parallel_grain": x.numel() + 1})
    serial = compile_graph(torch.fx.symbolic_trace(fn), [x], backend=serial_backend)
    assert "omp parallel" not in serial_backend.last_source
    for out in _across_threads(serial, x):
        torch.testing.assert_close(out, fn(x))
    with pytest.raises(ValueError, match="min_work_per_thread"):
        CppOptions(min_work_per_thread=0)


def test_tiny_kernel_has_no_parallel_region() -> None:
    def fn(x: torch.Tensor) -> Any:
        return aten.mul.Tensor(aten.sum.dim_IntList(x, [1], True), x)

    compiled = check(fn, make((16, 64)))
    assert "omp parallel" not in compiled.backend.last_source  # type: ignore[attr-defined]


def test_work_is_weighted_by_the_body() -> None:
    """Note [Work of a kernel]: iterations count for their statements, never for less than one."""
    assert weighted_work(1000, 0, 16, 0) == 1000  # a plain pointwise element: itself
    assert weighted_work(1000, 0, 4, 0) == 1000  # a tiny body: still its iterations
    assert weighted_work(1000, 0, 160, 0) == 10_000
    assert weighted_work(10, 500, 32, 64) == (10 * 32 + 10 * 500 * 64) // 16


def _max_pool(x: torch.Tensor) -> Any:
    return aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])[0]


def test_heavy_body_below_the_grain_runs_in_parallel(threads: None) -> None:
    """ResNet's 3x3/2 max-pool: 16384 outputs (below PARALLEL_GRAIN), 9 masked loads each, gets
    a team once its body is weighed, and none with ``weighted_work`` off; equal to eager and
    bitwise equal at 1, 2 and 3 threads."""
    x = make((2, 32, 32, 32))
    assert _max_pool(x).numel() < PARALLEL_GRAIN
    compiled = check(_max_pool, x)
    assert "#pragma omp parallel for" in compiled.backend.last_source  # type: ignore[attr-defined]
    one, *others = _across_threads(compiled, x)
    for other in others:
        assert torch.equal(one, other)
    torch.testing.assert_close(one, _max_pool(x), rtol=0, atol=0)
    backend = CppBackend(CppOptions(weighted_work=False))
    plain = compile_graph(torch.fx.symbolic_trace(_max_pool), [x], backend=backend)
    assert "omp parallel" not in backend.last_source
    assert torch.equal(plain(x), one)


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


def _small_then_large(a: torch.Tensor, b: torch.Tensor) -> Any:
    # a medium kernel whose plan caps its team (32768 elements: 8 threads), then a large one
    return aten.mul.Tensor(aten.sigmoid.default(a), 2.0), aten.add.Tensor(aten.tanh.default(b), 1.0)


def _threads_created(fn: Callable[[], Any], calls: int) -> int:
    """How many threads the process gained (by id) over ``calls`` calls of ``fn``."""
    seen = set(os.listdir("/proc/self/task"))
    created = 0
    for _ in range(calls):
        fn()
        now = set(os.listdir("/proc/self/task"))
        created += len(now - seen)
        seen |= now
    return created


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_teams_keep_the_pools_threads(threads: None) -> None:
    """Note [Teams keep the pool's size]: at 16 threads a kernel capped at 8 then one that takes
    all 16, call after call. With teams of ``ntk`` threads libgomp ended the 8 pool threads the
    capped team left out, and the next full team (the large kernel, or any torch op) created
    them again: 8 new threads each call (ConvNeXt at 16 threads, 8 a call). Full teams of ``nt``
    threads, the work on ``ntk`` of them, create none once the pool is up; the results are the
    same (eager's, at 16 and at 3 threads)."""
    a, b = make((64, 512)), make((64, 4096))
    cap = pointwise_plan([64], 512, 64 * 512)
    assert cap is not None and 1 < cap.cap < 16
    torch.set_num_threads(16)
    compiled = check(_small_then_large, a, b)
    source = compiled.backend.last_source  # type: ignore[attr-defined]
    assert "num_threads(nt) schedule(static, kch0)" in source
    assert "num_threads(ntk)" not in source
    for _ in range(2):  # the pool's threads, once
        compiled(a, b)
    assert _threads_created(lambda: compiled(a, b), 5) == 0
    backend = CppBackend(CppOptions(full_teams=False))
    partial = compile_graph(torch.fx.symbolic_trace(_small_then_large), [a, b], backend=backend)
    assert "num_threads(ntk)" in backend.last_source
    expected = _small_then_large(a, b)
    for n in (16, 3):
        torch.set_num_threads(n)
        for got in (compiled(a, b), partial(a, b)):
            for g, want in zip(got, expected, strict=True):
                torch.testing.assert_close(g, want)


def _row_and_column(g: torch.Tensor, x: torch.Tensor) -> Any:
    # layer norm's backward over rows, and the bias gradient over columns, of one gradient
    row = aten.sum.dim_IntList(aten.mul.Tensor(g, x), [1])
    col = aten.sum.dim_IntList(g, [0])
    scaled = aten.mul.Tensor(aten.add.Tensor(g, x), 0.5)  # a pointwise member that walks rows
    return row, col, scaled


def test_row_and_column_reductions_are_not_fused() -> None:
    """Note [Row and column reductions are not fused]: a square gradient's row sums and column
    sums share their reads and their sizes, but not one loop nest, nor do the column sums and a
    pointwise kernel over the same rows: two kernels, the column one alone in column blocks; with
    ``fuse_mixed_reductions`` they are one kernel, as before."""
    g, x = make((256, 256)), make((256, 256))
    compiled = check(_row_and_column, g, x)
    source = compiled.backend.last_source  # type: ignore[attr-defined]
    assert compiled.stats.kernels == 2 and "xblk" in source
    # as before: without the column-sum reorder too, which would put the pointwise member in the
    # column sums' order (Note [Pointwise producers in a column reduction's order])
    backend = CppBackend(CppOptions(fuse_mixed_reductions=True, column_sum_fusion=False))
    fused = compile_graph(torch.fx.symbolic_trace(_row_and_column), [g, x], backend=backend)
    assert fused.stats.kernels == 1 and "xblk" not in backend.last_source
    for a, b in zip(fused(g, x), compiled(g, x), strict=True):
        torch.testing.assert_close(a, b)


def _layer_norm_backward(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor) -> Any:
    xhat = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
    row = aten.sum.dim_IntList(aten.mul.Tensor(g, xhat), [2], True)  # the input gradient's sums
    return row, aten.sum.dim_IntList(aten.mul.Tensor(g, xhat), [0, 1])  # the weight gradient


def test_layer_norm_weight_gradient_is_a_column_reduction_of_its_own() -> None:
    """Per-token statistics (the same for every output) do not make the weight gradient a row
    reduction, so it is not fused with the row sums of the same gradient (256 tokens, hidden 256)."""
    inputs = make((2, 128, 256)), make((2, 128, 256)), make((2, 128, 1)), make((2, 128, 1))
    compiled = check(_layer_norm_backward, *inputs)
    assert compiled.stats.kernels == 2 and "xblk" in compiled.backend.last_source  # type: ignore[attr-defined]


def _relu(x: torch.Tensor) -> Any:
    return aten.relu.default(x)


def test_the_audit_reads_every_plan_line() -> None:
    """bench/parallel_audit.py parses the KILN_LOG=parallel lines this generator writes: a
    reduction with few outputs, a tiny pointwise kernel and a large one, each found with its
    plan (a line it could not parse would hide a finding)."""
    import importlib.util
    import logging
    import sys
    from pathlib import Path

    path = Path(__file__).parents[1] / "bench" / "parallel_audit.py"
    spec = importlib.util.spec_from_file_location("parallel_audit", path)
    assert spec is not None and spec.loader is not None
    audit = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = audit  # its dataclass looks its module up
    spec.loader.exec_module(audit)
    capture = audit._Capture()
    logger = logging.getLogger("kiln.codegen_cpp.parallel")
    level = logger.level
    logger.setLevel(logging.DEBUG)  # setLevel, not the attribute: it clears the isEnabledFor cache
    logger.addHandler(capture)
    try:
        check(lambda x: aten.sum.dim_IntList(x, [1]), make((4, 65536)))  # 4 outputs: split
        check(_relu, make((8, 8)))  # tiny: serial
        check(lambda x: aten.mul.Tensor(x, x), make((64, 4096)))  # large: parallel
    finally:
        logger.removeHandler(capture)
        logger.setLevel(level)
    plans = capture.plans
    assert len(plans) == 3, plans
    split, tiny, large = plans
    assert (split.kind, split.outputs, split.work) == ("split", 4, 4 * 65536)
    assert (tiny.kind, tiny.outputs, tiny.cap) == ("serial", None, 1)
    assert large.kind in ("outer", "chunked") and large.cap > 1 and large.outputs is None
    assert audit.findings(plans) == ([], [])
    unsplit = audit.Plan("k", "outer", 4, 4, 1 << 20, 1 << 20, 4)
    assert audit.findings([unsplit]) == ([], [unsplit])
    # a [256, 256] bias gradient: 4 column blocks of 16384 element-iterations, too small to split
    bias = audit.Plan("k", "column", 4, 4, 65536, 65536, 256)
    assert audit.findings([bias]) == ([], [])


def test_calls_and_rows_weigh_more_than_a_statement() -> None:
    """Note [Statements that cost more than one]: a math call adds its table's statements, a
    reduction's per-row statements count ``row_weight`` each."""
    assert call_statements("const float tmp6 = std::erf(tmp5);") == CALL_STATEMENTS["std::erf"] - 1
    assert call_statements("const float t = std::exp(a) + std::exp(b);") == 2 * (
        CALL_STATEMENTS["std::exp"] - 1
    )
    assert call_statements("const float t = std::expm1(a);") == CALL_STATEMENTS["std::expm1"] - 1
    assert call_statements("const float t = (a + b);") == 0
    assert weighted_work(10, 500, 32, 64, row_weight=16) == (10 * 32 * 16 + 10 * 500 * 64) // 16
    assert weighted_work(1000, 0, 32, 0, row_weight=16) == 1000 * 32 // 16  # pointwise: no rows


def _bn_statistics(x: torch.Tensor) -> Any:
    return aten.var_mean.correction(x, [0, 2, 3], correction=0)


def _layer_norm_gelu(x: torch.Tensor, b: torch.Tensor, w: torch.Tensor, c: torch.Tensor) -> Any:
    h = aten.gelu.default(aten.add.Tensor(x, b))
    var, mean = aten.var_mean.correction(h, [1], correction=0, keepdim=True)
    rstd = aten.rsqrt.default(aten.add.Tensor(var, 1e-5))
    return aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(h, mean), rstd), w), c)


def _log_buckets(positions: torch.Tensor) -> Any:
    # T5's relative-position buckets (transformers' _relative_position_bucket, decoder): the log
    # of the distances of 128 x 128 positions (zero on half), capped, exact below 16
    r = aten.sub.Tensor(aten.unsqueeze.default(positions, 0), aten.unsqueeze.default(positions, 1))
    rel = aten.neg.default(aten.minimum.default(r, aten.zeros_like.default(r)))
    log = aten.log.default(aten.div.Tensor(aten._to_copy.default(rel, dtype=torch.float32), 16.0))
    scaled = aten.mul.Tensor(aten.div.Tensor(log, 2.0794), 16.0)
    large = aten.add.Tensor(aten._to_copy.default(scaled, dtype=torch.int64), 16)
    large = aten.minimum.default(large, aten.full_like.default(large, 31))
    return aten.where.self(aten.lt.Scalar(rel, 16), rel, large)


def _tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def _transposed(x: torch.Tensor, b: torch.Tensor) -> Any:
    # ConvNeXt's channels-first rows written channels-last: read with a stride along the vector loop
    scaled = aten.add.Tensor(aten.mul.Tensor(aten.permute.default(x, [0, 2, 3, 1]), 2.0), b)
    return aten.clone.default(scaled, memory_format=torch.contiguous_format)


_HEAVY_KINDS = {
    # ResNet's BatchNorm statistics over rows of 8 (256 channels): ~11 us a call at one thread
    "bn_statistics": (_bn_statistics, lambda: [make((2, 256, 2, 2))]),
    # the MLP's layer norm after GELU (erf), rows of 256
    "layer_norm_gelu": (
        _layer_norm_gelu,
        lambda: [make((64, 256)), make((256,)), make((256,)), make((256,))],
    ),
    # a body GCC leaves scalar (a strided load along the vector loop): 16384 elements
    "transposed": (_transposed, lambda: [make((2, 32, 16, 16)), make((32,))]),
    # T5's bucket computation: 16384 int64 results through log
    "log_buckets": (
        _log_buckets,
        lambda: [torch.arange(128)],
    ),
}


@pytest.mark.parametrize("kind", sorted(_HEAVY_KINDS))
def test_heavy_statements_get_a_team(kind: str, threads: None) -> None:
    """Note [Statements that cost more than one]: kernels of issue 20 that ran serial at 16 threads
    (below PARALLEL_GRAIN by element-iterations and by their statements counted alike) get a
    team once per-row statements, lane loops, folds, math calls and strided bodies are weighed, and none with
    ``weigh_statements`` off; equal to eager, and bitwise equal at 1, 2 and 3 threads."""
    fn, inputs = _HEAVY_KINDS[kind]
    args = inputs()
    compiled = check(fn, *args)
    source = compiled.backend.last_source  # type: ignore[attr-defined]
    assert "#pragma omp parallel for" in source
    one, *others = _across_threads(compiled, *args)
    for other in others:
        for a, b in zip(_tuple(one), _tuple(other), strict=True):
            assert torch.equal(a, b)
    backend = CppBackend(CppOptions(weigh_statements=False))
    compile_graph(torch.fx.symbolic_trace(fn), args, backend=backend)
    assert "omp parallel" not in backend.last_source
