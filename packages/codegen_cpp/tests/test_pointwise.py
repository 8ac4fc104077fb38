"""Pointwise lowerings x dtypes through C++ against eager, many ops per translation unit.

Each test builds one graph holding every op that eager supports for a dtype (so one compile per
dtype), and names the outputs so a failure says which op and dtype differed.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from cpp_check import In, assert_same, aten, check, eager_supports, graph_of, make

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import SWEEP_BINARY, SWEEP_DTYPES, SWEEP_UNARY, aten_op

# the sweeps' ops and dtypes, the same for every code generator (kiln_loopir.testing)
DTYPES, UNARY, BINARY, _op = SWEEP_DTYPES, SWEEP_UNARY, SWEEP_BINARY, aten_op


def _sweep(ops: list[str], inputs: list[torch.Tensor], dtype: torch.dtype) -> None:
    picked = [name for name in ops if eager_supports(_op(name), *inputs)]
    assert picked, f"no op runs eagerly on {dtype}"
    args = tuple(In(i) for i in range(len(inputs)))
    gm = graph_of([(_op(name), args, {}) for name in picked], len(inputs))
    check(gm, *inputs, names=[f"{name}/{dtype}" for name in picked])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unary_ops(dtype: torch.dtype) -> None:
    x = make((7, 37), dtype, low=-3, high=3)
    if dtype.is_floating_point:
        x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5])
    _sweep(UNARY, [x], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_binary_ops_broadcast(dtype: torch.dtype) -> None:
    a = make((5, 33), dtype, low=-9, high=9)
    b = make((33,), dtype, low=1 if not dtype.is_floating_point else -9, high=5, exclude_zero=True)
    if dtype in (torch.int8, torch.int32, torch.int64):
        b = b.abs().clamp(0, 3)
        b[b == 0] = 1
    _sweep(BINARY, [a, b], dtype)


def test_scalar_and_mixed_dtype_arithmetic() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
        x = aten.add.Tensor(a, b)  # float32 + int64 -> float32
        y = aten.mul.Tensor(c, 2.5)  # int32 * float scalar -> float32
        z = aten.div.Tensor_mode(c, 3, rounding_mode="floor")
        w = aten.clamp.default(a, -0.5, 0.5)
        v = aten.where.self(aten.gt.Scalar(a, 0), a, b)
        u = aten._to_copy.default(a, dtype=torch.bfloat16)
        t = aten.add.Tensor(u, 1)
        return x, y, z, w, v, u, t, aten.rsub.Scalar(a, 1.0), aten.addcmul.default(a, a, a, value=0.5)

    a = make((6, 10))
    b = make((6, 10), torch.int64, low=-5, high=5)
    c = make((6, 10), torch.int32, low=-50, high=50)
    check(fn, a, b, c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_non_contiguous_and_broadcast_inputs(dtype: torch.dtype) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
        return aten.add.Tensor(aten.mul.Tensor(a, b), c), aten.neg.default(a)

    a = make((40, 30), dtype).t()  # transposed
    b = make((30, 80), dtype)[:, ::2]  # strided slice
    c = make((1, 40), dtype).expand(30, 40)  # broadcast (stride 0)
    check(fn, a, b, c)


def test_offset_input_and_views() -> None:
    def fn(a: torch.Tensor) -> Any:
        v = aten.reshape.default(aten.permute.default(a, [1, 0, 2]), [6, 20])
        s = aten.slice.Tensor(a, 2, 1, 4)
        return aten.exp.default(v), aten.add.Tensor(s, 1), aten.select.int(a, 0, 1)

    base = make((200,))
    a = base[7:127].view(2, 6, 10)  # storage offset 7
    check(fn, a)


def test_inputs_with_other_strides_than_compiled_are_conformed() -> None:
    def fn(a: torch.Tensor) -> Any:
        return aten.mul.Tensor(a, 2)

    a = make((8, 9))
    compiled = check(fn, a)
    other = make((9, 8)).t()
    torch.testing.assert_close(compiled(other), other * 2)


def test_inputs_of_another_shape_or_dtype_are_refused() -> None:
    def fn(a: torch.Tensor) -> Any:
        return aten.mul.Tensor(a, 3)

    compiled = check(fn, make((8, 9)))
    with pytest.raises(ValueError, match=r"compiled for \[8, 9\] torch.float32, got \[9, 9\]"):
        compiled(make((9, 9)))
    with pytest.raises(ValueError, match=r"got \[8, 9\] torch.float64"):
        compiled(make((8, 9), torch.float64))


INT_DIVISIONS: list[Any] = [
    (aten.floor_divide.default, (In(0), In(1)), {}),
    (aten.div.Tensor_mode, (In(0), In(1)), {"rounding_mode": "floor"}),
    (aten.div.Tensor_mode, (In(0), In(1)), {"rounding_mode": "trunc"}),
    (aten.remainder.Tensor, (In(0), In(1)), {}),
    (aten.fmod.Tensor, (In(0), In(1)), {}),
]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64], ids=str)
def test_integer_division_by_zero_raises_like_eager(dtype: torch.dtype) -> None:
    a = make((4, 9), dtype, low=1, high=20)
    good = make((4, 9), dtype, low=1, high=5)
    bad = good.clone()
    bad[3, 7] = 0
    for op, _args, kwargs in INT_DIVISIONS:
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            op(a, bad, **kwargs)  # eager
    compiled = check(graph_of(INT_DIVISIONS, 2), a, good)
    # eager raises RuntimeError("ZeroDivisionError"); ours is that and a ZeroDivisionError
    with pytest.raises(RuntimeError, match=r"ZeroDivisionError: integer division by zero \(ops\.\w+ in "):
        compiled(a, bad)
    with pytest.raises(ZeroDivisionError):
        compiled(a, bad)
    assert_same(compiled(a, good), graph_of(INT_DIVISIONS, 2)(a, good))  # still usable


def test_zero_division_error_names_the_op() -> None:
    a = make((4, 9), torch.int64, low=1, high=20)
    gm = graph_of([(aten.remainder.Scalar, (In(0), 0), {})], 1)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        gm(a)
    compiled = compile_graph(gm, [a], backend=CppBackend())
    with pytest.raises(ZeroDivisionError, match=r"ops\.remainder in aten\.remainder\.Scalar; kernel"):
        compiled(a)


def _special_values(dtype: torch.dtype) -> torch.Tensor:
    """±inf, NaN, ±0, the largest and smallest (normal and subnormal) magnitudes, values where
    exp/tanh/erf saturate or overflow, and ordinary values; the pattern is laid out twice so it
    lands both in the vectorized main loop and in the scalar tail."""
    info = torch.finfo(dtype)
    base = [
        math.inf, -math.inf, math.nan, 0.0, -0.0, info.max, -info.max, info.tiny, -info.tiny,
        info.smallest_normal / 4, -info.smallest_normal / 4, 1e30, -1e30, 1e-30, -1e-30, 1.0,
        -1.0, 0.5, -0.5, 2.0, 10.0, -10.0, 20.0, 88.5, -88.5, 100.0, -100.0, 1e5, -1e5, 3.0,
        0.99, -0.99,
    ]  # fmt: skip
    # not ±710: float64 sinh/cosh there are 1.117e308, finite (glibc, so ours), but eager's
    # vectorized kernel overflows to inf a little early
    x = torch.tensor(base, dtype=torch.float64).to(dtype)  # out-of-range values become ±inf
    return torch.cat([x, make((5,), dtype), x])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_unary_ops_at_special_values(dtype: torch.dtype) -> None:
    """Every unary lowering at ±inf, NaN, ±0, huge and tiny values against eager (ATen's kernels,
    Note [oneDNN is not the reference]); kernels are correct by construction there: no
    fast-math flags (build.py), and libmvec's vector variants keep IEEE special values."""
    x = _special_values(dtype)
    picked = [name for name in UNARY if eager_supports(_op(name), x)]
    calls = [(_op(name), (In(0),), {}) for name in picked]
    names = [f"{name}/{dtype}" for name in picked]
    calls.append((aten.gelu.default, (In(0),), {"approximate": "tanh"}))
    names.append(f"gelu_tanh/{dtype}")
    check(graph_of(calls, 1), x, names=names)


@pytest.mark.parametrize("guarded", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_logs_and_exps_stay_off_the_slow_path(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, guarded: bool
) -> None:
    """Notes [Logarithms off libmvec's slow path], [Exponentials off libmvec's slow path]: the
    guarded calls (the library's with the switches off) equal to eager at special values, at
    the guards' bounds and on T5's triangle of zeros, on one thread and two; a kernel that
    computes from its indices alone (T5's buckets) is compiled without GCC's PRE."""
    monkeypatch.setenv("KILN_CPP_OPTIONS", f"guarded_log={int(guarded)},guarded_exp={int(guarded)}")
    n = 192
    i = torch.arange(n)
    tri = (i[None, :] - i[:, None]).clamp(min=0).to(dtype)  # zeros on and below the diagonal
    bounds = [
        -746.0,
        -745.5,
        -709.0,
        -105.0,
        -104.0,
        -103.9,
        -87.5,
        -87.0,
        88.5,
        88.8,
        89.0,
        89.5,
        709.5,
        710.5,
    ]
    x = torch.cat(
        [tri.flatten(), _special_values(dtype), torch.tensor(bounds, dtype=torch.float64).to(dtype)]
    )
    x[5] = torch.finfo(dtype).smallest_normal / 8  # a subnormal, in the vector loop

    def calls(v: torch.Tensor) -> Any:
        scaled = aten.div.Tensor(v, 16.0)
        logs = aten.log.default(scaled), aten.log2.default(scaled), aten.log10.default(scaled)
        return (*logs, aten.exp.default(v), aten.exp.default(aten.neg.default(v)))

    # T5's buckets, the log of a triangle of zeros computed from the loop indices alone (a graph
    # built by hand: tracing would compute what reads no input once, as a constant)
    g = torch.fx.Graph()
    table = g.placeholder("table")

    def op(fn: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return g.call_function(fn, args, kwargs)

    pos = op(aten.arange.default, n, dtype=torch.int64)
    rel = op(aten.sub.Tensor, op(aten.unsqueeze.default, pos, 0), op(aten.unsqueeze.default, pos, 1))
    big = op(aten.neg.default, op(aten.clamp_max.default, rel, 0))
    large = op(aten.log.default, op(aten.div.Tensor, op(aten._to_copy.default, big, dtype=dtype), 8.0))
    bucket = op(
        aten._to_copy.default, op(aten.add.Tensor, op(aten.mul.Tensor, large, 4.0), 8.0), dtype=torch.int64
    )
    # where the log's lanes are dropped (its zeros among them)
    bucket = op(aten.where.self, op(aten.lt.Scalar, big, 8), big, op(aten.clamp.default, bucket, 0, 15))
    g.output((bucket, op(aten.embedding.default, table, bucket)))
    buckets = torch.fx.GraphModule(torch.nn.Module(), g)

    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            source = check(calls, x).backend.last_source  # type: ignore[attr-defined]
            indexed = check(buckets, make((16, 4), dtype)).backend.last_source  # type: ignore[attr-defined]
    finally:
        torch.set_num_threads(before)
    kernel = source[source.index("// cpp_fused") :]  # the kernels, not the prelude
    assert all(f"kiln::{f}(" in kernel for f in ("log", "log2", "log10", "exp"))
    # off: the prelude's plain spelling of the calls
    flags = CppBackend().options.compiler_flags()
    assert ("-DKILN_PLAIN_LOG" in flags) == ("-DKILN_PLAIN_EXP" in flags) == (not guarded)
    # GCC's PRE moved the guarded call out of the serial loop of T5's kernel, which then stayed
    # scalar; a kernel that reads its operands keeps the pass
    pragma = '\n#pragma GCC optimize("no-tree-pre")\n'
    assert (pragma in indexed) == guarded
    assert pragma not in source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_binary_ops_at_special_values(dtype: torch.dtype) -> None:
    """Every binary lowering on all pairs of special values (±inf, NaN, ±0, huge, tiny, ...).

    fmod and remainder are compared where ``a / b`` is finite: beyond, eager's vectorized kernel
    (``a - trunc(a / b) * b``) gives NaN, where the exact result (ours, std::fmod) is finite.
    """
    x = _special_values(dtype)[:34]
    a = x.repeat_interleave(len(x))
    b = x.repeat(len(x))
    exact = ("fmod.Tensor", "remainder.Tensor")
    _sweep([name for name in BINARY if name not in exact], [a, b], dtype)
    keep = torch.isfinite(a.double() / b.double()).to(dtype) * torch.isfinite(a / b)
    _sweep(list(exact), [a[keep.bool()], b[keep.bool()]], dtype)
    # nextafter steps in the type's own precision (float's step would round back for halves)
    p, q = torch.ones(3, dtype=dtype), torch.tensor([2.0, 0.0, 1.0], dtype=dtype)
    compiled = check(graph_of([(aten.nextafter.default, (In(0), In(1)), {})], 2), p, q)
    assert torch.equal(compiled(p, q)[0], torch.nextafter(p, q))  # exactly: one step is within rtol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_explicit_downcast_rounds_as_eager(dtype: torch.dtype) -> None:
    """Issue 19: `.to(half type)` fused into a float32 kernel rounds to nearest even, bit for bit
    as eager (NaN, infinities, subnormals, ties), and a stored half value is eager's too."""
    import torch.fx

    def f(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        down = aten._to_copy.default(a, dtype=dtype)
        return aten._to_copy.default(down, dtype=torch.float32) * 1.0, aten.mul.Tensor(down, 1.0)

    torch.manual_seed(0)
    special = [
        float("nan"),
        float("inf"),
        -float("inf"),
        3.3895e38,
        1e-40,
        -1e-40,
        -0.0,
        1.00390625,
        1.01171875,
    ]
    x = torch.cat([torch.randn(500) * 10, torch.tensor(special)])
    got = compile_graph(torch.fx.symbolic_trace(f), [x], backend=CppBackend())(x)
    for g, w in zip(got, f(x), strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def test_downcast_then_sum_in_float32_matches_eager() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = aten._to_copy.default(a, dtype=torch.bfloat16)
        y = aten._to_copy.default(b, dtype=torch.bfloat16)
        return aten.sum.dim_IntList(aten._to_copy.default(aten.mul.Tensor(x, y), dtype=torch.float32), [0])

    torch.manual_seed(0)
    check(f, torch.randn(256, 8), torch.randn(256, 8))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64], ids=str)
def test_integer_arithmetic_wraps_as_eager(dtype: torch.dtype) -> None:
    """Note [Integer arithmetic wraps]: at the dtype's extremes add, sub, mul, neg, abs, pow and
    left shifts wrap around as eager's do; GCC had folded the comparisons below through the
    undefined signed overflow (`(x + 1) > x` true, `-x < 0` as `x > 0`, `abs(x) < 0` false)."""
    info = torch.iinfo(dtype)

    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            aten.gt.Tensor(aten.add.Tensor(x, 1), x),
            aten.lt.Tensor(aten.sub.Tensor(x, 1), x),
            aten.lt.Scalar(aten.neg.default(x), 0),
            aten.lt.Scalar(aten.abs.default(x), 0),
            aten.gt.Scalar(aten.mul.Tensor(x, x), -1),
            aten.lt.Scalar(aten.pow.Tensor_Scalar(x, 3), 0),
            aten.bitwise_left_shift.Tensor_Scalar(x, info.bits - 1),
            aten.mul.Tensor(x, 3),
        )

    values = [info.min, info.max, info.min + 1, info.max - 1, -1, 0, 1, 2, info.max // 2 + 1]
    check(f, torch.tensor(values * 5, dtype=dtype))
