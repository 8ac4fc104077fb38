"""Pointwise lowerings against eager: dtypes, broadcasting, scalars, non-contiguous inputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import aten, binary, check, make, unary

from kiln_loopir import compile_graph

FLOATS = [torch.float32, torch.float64, torch.bfloat16]
ALL = [*FLOATS, torch.int64, torch.bool]

# op -> dtypes it is tested in (eager's own domain for that op)
UNARY: dict[str, list[torch.dtype]] = {
    "abs": [*FLOATS, torch.int64], "neg": [*FLOATS, torch.int64], "exp": ALL, "exp2": FLOATS,
    "expm1": FLOATS, "log": FLOATS, "log1p": FLOATS, "log2": FLOATS, "sqrt": ALL, "rsqrt": FLOATS,
    "sin": ALL, "cos": FLOATS, "tan": FLOATS, "tanh": FLOATS, "sigmoid": ALL, "erf": FLOATS,
    "floor": [*FLOATS, torch.int64], "ceil": FLOATS, "trunc": FLOATS, "sign": [*FLOATS, torch.int64],
    "reciprocal": FLOATS, "isnan": ALL, "isinf": FLOATS, "logical_not": ALL, "relu": [*FLOATS, torch.int64],
    "bitwise_not": [torch.int64, torch.bool], "atan": FLOATS, "sinh": FLOATS, "asinh": FLOATS,
    "erfc": FLOATS, "frac": FLOATS, "signbit": FLOATS, "round": FLOATS,
}  # fmt: skip

BINARY: dict[str, list[torch.dtype]] = {
    "add.Tensor": ALL, "sub.Tensor": [*FLOATS, torch.int64], "mul.Tensor": ALL, "div.Tensor": ALL,
    "maximum.default": ALL, "minimum.default": ALL, "eq.Tensor": ALL, "ne.Tensor": ALL,
    "lt.Tensor": [*FLOATS, torch.int64], "ge.Tensor": [*FLOATS, torch.int64],
    "logical_and.default": ALL, "logical_or.default": ALL, "bitwise_and.Tensor": [torch.int64, torch.bool],
    "pow.Tensor_Tensor": FLOATS, "atan2.default": FLOATS, "fmod.Tensor": [*FLOATS, torch.int64],
    "remainder.Tensor": [*FLOATS, torch.int64], "floor_divide.default": [torch.float32, torch.int64],
}  # fmt: skip


def _layouts(shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    contiguous = make(shape, dtype)
    transposed = make(shape[::-1], dtype).t()
    sliced = make((shape[0], shape[1] * 2), dtype)[:, ::2]
    return [contiguous, transposed, sliced]


def _safe(x: torch.Tensor, op: str) -> torch.Tensor:
    if op in ("log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal") and x.dtype.is_floating_point:
        return x.abs() + 0.5
    return x


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op: str) -> None:
    fn_op = getattr(aten, op).default
    for dtype in UNARY[op]:
        for x in _layouts((3, 5), dtype):
            check(unary(fn_op), _safe(x, op))


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_with_broadcast(op: str) -> None:
    name, overload = op.split(".")
    fn_op = getattr(getattr(aten, name), overload)
    for dtype in BINARY[op]:
        nonzero = dtype != torch.bool and name in ("fmod", "remainder", "floor_divide")
        low = 1 if nonzero else -2
        a, b = make((4, 6), dtype), make((6,), dtype, low=low)
        check(binary(fn_op), a, b)
        check(binary(fn_op), make((6, 4), dtype).t(), make((4, 1), dtype, low=low))


@pytest.mark.parametrize(
    ("dtype", "scalar"),
    [(torch.float32, 2), (torch.int64, 2.5), (torch.bool, 3), (torch.bfloat16, 0.1), (torch.int64, 3)],
)
def test_scalar_promotion(dtype: torch.dtype, scalar: Any) -> None:
    x = make((3, 4), dtype)
    check(lambda a: aten.add.Tensor(a, scalar), x)
    check(lambda a: aten.mul.Tensor(a, scalar), x)
    check(lambda a: aten.div.Tensor(a, scalar), x)


def test_mixed_dtype_promotion_and_zero_dim() -> None:
    check(binary(aten.add.Tensor), make((3, 4), torch.int64), make((4,), torch.float32))
    check(binary(aten.mul.Tensor), make((3, 4), torch.bfloat16), make((), torch.float64))
    check(lambda a, b: aten.sub.Tensor(a, b, alpha=3), make((3, 4)), make((3, 4)))


@pytest.mark.parametrize(
    "fn",
    [
        unary(aten.gelu.default),
        lambda x: aten.gelu.default(x, approximate="tanh"),
        unary(aten.silu.default),
        lambda x: aten.hardtanh.default(x, -0.5, 0.5),
        lambda x: aten.leaky_relu.default(x, 0.2),
        unary(aten.elu.default),
        unary(aten.softplus.default),
        unary(aten.hardswish.default),
        lambda x: aten.clamp.default(x, -0.5, 0.7),
        lambda x: aten.clamp_min.default(x, 0.1),
        lambda x: aten.where.self(aten.gt.Scalar(x, 0), x, aten.neg.default(x)),
        lambda x: aten.where.ScalarOther(aten.gt.Scalar(x, 0), x, 0.0),
        lambda x: aten.masked_fill.Scalar(x, aten.lt.Scalar(x, 0), -1.0),
        lambda x: aten.div.Tensor_mode(x, 0.7, rounding_mode="floor"),
        lambda x: aten.div.Tensor_mode(x, 0.7, rounding_mode="trunc"),
        lambda x: aten.rsub.Scalar(x, 1.0),
        lambda x: aten.lerp.Scalar(x, aten.cos.default(x), 0.3),
        lambda x: aten.nan_to_num.default(aten.log.default(x)),
        lambda x: aten._to_copy.default(x, dtype=torch.float64),
        lambda x: aten._to_copy.default(x, dtype=torch.int64),
        unary(aten.clone.default),
        lambda x: aten.pow.Tensor_Scalar(x, 2),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_parameterised_pointwise(fn: Any, dtype: torch.dtype) -> None:
    check(fn, make((5, 7), dtype))
    check(fn, make((7, 5), dtype).t())


def test_integer_division_modes() -> None:
    a, b = make((4, 5), torch.int64, low=-9, high=9), make((4, 5), torch.int64, low=1, high=5)
    check(lambda x, y: aten.div.Tensor_mode(x, y, rounding_mode="trunc"), a, b)
    check(lambda x, y: aten.div.Tensor_mode(x, y, rounding_mode="floor"), a, b)


@pytest.mark.parametrize("exponent", [2, 3, -2, 0.5, -0.5, -1, 1, 2.0, 3.0, 1.0, 1.5, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_pow_by_constant_exponent(exponent: Any, dtype: torch.dtype) -> None:
    # Note [pow by a constant exponent]: these exponents are lowered to mul/sqrt/rsqrt/reciprocal;
    # special values (0, negatives, inf, nan) must come out as eager's pow gives them.
    x = make((6, 7), dtype)
    x[0, :6] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -3.0], dtype=dtype)
    check(lambda x: aten.pow.Tensor_Scalar(x, exponent), x)


@pytest.mark.parametrize("exponent", [2, 3, 4])
def test_integer_pow_by_constant_exponent(exponent: int) -> None:
    check(lambda x: aten.pow.Tensor_Scalar(x, exponent), make((5, 7), torch.int64, low=-4, high=4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_clamp_propagates_nan_bounds(dtype: torch.dtype) -> None:
    # Note [NaN bounds of clamp]: a NaN in a bound (tensor or scalar) gives NaN, as in eager
    nan = float("nan")
    x = make((6, 7), dtype)
    x[0, :3] = nan
    lo, hi = make((6, 7), dtype, low=-2, high=0), make((7,), dtype, low=0, high=2)
    lo[1::2, 1::3] = nan
    hi[::3] = nan
    check(lambda x, lo, hi: aten.clamp.Tensor(x, lo, max=hi), x, lo, hi)
    check(binary(aten.clamp.Tensor), x, lo)
    check(lambda x, hi: aten.clamp.Tensor(x, None, hi), x, hi)
    check(binary(aten.clamp_min.Tensor), x, lo)
    check(binary(aten.clamp_max.Tensor), x, hi)
    check(lambda x: aten.clamp.default(x, nan), x)
    check(lambda x: aten.clamp.default(x, None, nan), x)
    check(lambda x: aten.clamp_min.default(x, nan), x)
    # an integer input promoted by a floating bound
    check(binary(aten.clamp.Tensor), make((6, 7), torch.int64, low=-3, high=3), lo)


def _relu(x: torch.Tensor) -> torch.Tensor:
    return aten.relu.default(x)


def _argmax(x: torch.Tensor) -> torch.Tensor:
    return aten.argmax.default(x, 0)


def _argmin(x: torch.Tensor) -> torch.Tensor:
    return aten.argmin.default(x)


def _full_like_beyond_half(x: torch.Tensor) -> torch.Tensor:
    return aten.full_like.default(x, 1e6)


@pytest.mark.parametrize(
    ("fn", "x"),
    [
        (_relu, torch.tensor([True, False])),
        (_argmax, torch.tensor([True, False])),
        (_argmax, torch.zeros(3, 0, dtype=torch.bool)),
        (_argmin, torch.tensor([True, False])),
        (_full_like_beyond_half, torch.ones(2, dtype=torch.float16)),
        (_full_like_beyond_half, torch.ones(3, 2, dtype=torch.float16).t()),
    ],
    ids=["relu bool", "argmax bool", "argmax empty bool", "argmin bool", "fill float16", "fill float16 2-d"],
)
def test_what_eager_refuses_raises(fn: Any, x: torch.Tensor) -> None:
    """Notes [Dtypes eager's kernel does not take] (a RuntimeError where tensors of ones raise
    too: `relu` of bools), [Python numbers that do not fit the dtype] (a half-type fill of two
    elements or more) and argmax/argmin of bools: the lowerings computed values (`relu` of bools
    passed them through, argmax of bools gave an index, a float16 fill of 1e6 gave inf) where
    eager's kernel raises; now they are left to it."""
    with pytest.raises(RuntimeError) as eager_error:
        fn(x)
    gm = torch.fx.symbolic_trace(fn)
    for node in gm.graph.find_nodes(op="placeholder"):
        node.meta["val"] = x  # what the probes read (aotgrad's graphs carry fake values)
    compiled = compile_graph(gm, [x])
    assert compiled.stats.fallbacks, "lowered, not left to eager's kernel"
    with pytest.raises(RuntimeError) as got:
        compiled(x.clone())
    assert str(got.value) == str(eager_error.value)


def _index_select_0(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return aten.index_select.default(x, 0, i)


@pytest.mark.parametrize("n", [0, 2])
def test_index_select_of_a_scalar_with_several_indices_raises(n: int) -> None:
    """Eager's index_select refuses a 0-d tensor's index of n != 1 values, the meta kernel does
    not: the lowering returned the scalar; now eager's kernel runs and raises."""
    x, i = torch.tensor(5.0), torch.zeros(n, dtype=torch.int64)
    with pytest.raises(RuntimeError) as eager_error:
        _index_select_0(x, i)
    gm = torch.fx.symbolic_trace(_index_select_0)
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), (x, i), strict=True):
        node.meta["val"] = value
    compiled = compile_graph(gm, [x, i])
    assert compiled.stats.fallbacks, "lowered, not left to eager's kernel"
    with pytest.raises(RuntimeError) as got:
        compiled(x.clone(), i.clone())
    assert str(got.value) == str(eager_error.value)


def test_a_half_fill_of_one_element_is_inf_as_in_eager() -> None:
    x = torch.ones(1, dtype=torch.float16)
    compiled = check(_full_like_beyond_half, x, allow_fallback=True)
    assert compiled(x).isinf().all()
