"""Pointwise lowerings: one lazy Pointwise per op, composed into consumers by inlining.

Most ops are one row of a table: the aten packet, the ``ops.*`` name it computes with, and the
type-promotion kind eager uses. Ops with extra arguments (alpha, clamp bounds, activation
parameters, rounding modes) are small functions that build their body from ``ops.*``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..ir import Index, Pointwise, TensorBox
from ..lowering import (
    Kind,
    Unsupported,
    broadcast_loader,
    broadcast_sizes,
    check_scalar,
    make_pointwise,
    meta_of,
    register_lowering,
    to_dtype,
)
from ..virtualized import ops

aten = torch.ops.aten

UNARY: dict[str, tuple[Any, Kind]] = {
    "abs": (aten.abs, Kind.DEFAULT),
    "neg": (aten.neg, Kind.DEFAULT),
    "floor": (aten.floor, Kind.DEFAULT),
    "ceil": (aten.ceil, Kind.DEFAULT),
    "trunc": (aten.trunc, Kind.DEFAULT),
    "sign": (aten.sign, Kind.DEFAULT),
    "frac": (aten.frac, Kind.DEFAULT),
    "bitwise_not": (aten.bitwise_not, Kind.DEFAULT),
    "exp": (aten.exp, Kind.INT_TO_FLOAT),
    "exp2": (aten.exp2, Kind.INT_TO_FLOAT),
    "expm1": (aten.expm1, Kind.INT_TO_FLOAT),
    "log": (aten.log, Kind.INT_TO_FLOAT),
    "log1p": (aten.log1p, Kind.INT_TO_FLOAT),
    "log2": (aten.log2, Kind.INT_TO_FLOAT),
    "log10": (aten.log10, Kind.INT_TO_FLOAT),
    "sqrt": (aten.sqrt, Kind.INT_TO_FLOAT),
    "rsqrt": (aten.rsqrt, Kind.INT_TO_FLOAT),
    "sin": (aten.sin, Kind.INT_TO_FLOAT),
    "cos": (aten.cos, Kind.INT_TO_FLOAT),
    "tan": (aten.tan, Kind.INT_TO_FLOAT),
    "asin": (aten.asin, Kind.INT_TO_FLOAT),
    "acos": (aten.acos, Kind.INT_TO_FLOAT),
    "atan": (aten.atan, Kind.INT_TO_FLOAT),
    "sinh": (aten.sinh, Kind.INT_TO_FLOAT),
    "cosh": (aten.cosh, Kind.INT_TO_FLOAT),
    "tanh": (aten.tanh, Kind.INT_TO_FLOAT),
    "asinh": (aten.asinh, Kind.INT_TO_FLOAT),
    "acosh": (aten.acosh, Kind.INT_TO_FLOAT),
    "atanh": (aten.atanh, Kind.INT_TO_FLOAT),
    "sigmoid": (aten.sigmoid, Kind.INT_TO_FLOAT),
    "erf": (aten.erf, Kind.INT_TO_FLOAT),
    "erfc": (aten.erfc, Kind.INT_TO_FLOAT),
    "erfinv": (aten.erfinv, Kind.INT_TO_FLOAT),
    "lgamma": (aten.lgamma, Kind.INT_TO_FLOAT),
    "reciprocal": (aten.reciprocal, Kind.INT_TO_FLOAT),
    "isnan": (aten.isnan, Kind.ALWAYS_BOOL),
    "isinf": (aten.isinf, Kind.ALWAYS_BOOL),
    "logical_not": (aten.logical_not, Kind.ALWAYS_BOOL),
    "signbit": (aten.signbit, Kind.ALWAYS_BOOL),
}

BINARY: dict[str, tuple[Any, Kind]] = {
    "mul": (aten.mul, Kind.DEFAULT),
    "maximum": (aten.maximum, Kind.DEFAULT),
    "minimum": (aten.minimum, Kind.DEFAULT),
    "fmax": (aten.fmax, Kind.DEFAULT),
    "fmin": (aten.fmin, Kind.DEFAULT),
    "fmod": (aten.fmod, Kind.DEFAULT),
    "remainder": (aten.remainder, Kind.DEFAULT),
    "bitwise_and": (aten.bitwise_and, Kind.DEFAULT),
    "bitwise_or": (aten.bitwise_or, Kind.DEFAULT),
    "bitwise_xor": (aten.bitwise_xor, Kind.DEFAULT),
    "bitwise_left_shift": (aten.bitwise_left_shift, Kind.DEFAULT),
    "bitwise_right_shift": (aten.bitwise_right_shift, Kind.DEFAULT),
    "atan2": (aten.atan2, Kind.INT_TO_FLOAT),
    "copysign": (aten.copysign, Kind.INT_TO_FLOAT),
    "hypot": (aten.hypot, Kind.DEFAULT),
    "nextafter": (aten.nextafter, Kind.NO_OPMATH),
    "truediv": (aten.div, Kind.INT_TO_FLOAT),
    "floordiv": (aten.floor_divide, Kind.DEFAULT),
    "eq": (aten.eq, Kind.ALWAYS_BOOL),
    "ne": (aten.ne, Kind.ALWAYS_BOOL),
    "lt": (aten.lt, Kind.ALWAYS_BOOL),
    "le": (aten.le, Kind.ALWAYS_BOOL),
    "gt": (aten.gt, Kind.ALWAYS_BOOL),
    "ge": (aten.ge, Kind.ALWAYS_BOOL),
    "logical_and": (aten.logical_and, Kind.ALWAYS_BOOL),
    "logical_or": (aten.logical_or, Kind.ALWAYS_BOOL),
    "logical_xor": (aten.logical_xor, Kind.ALWAYS_BOOL),
}


def _op(name: str) -> Callable[..., Any]:
    def apply(*values: Any) -> Any:
        return getattr(ops, name)(*values)

    return apply


for _name, (_packet, _kind) in {**UNARY, **BINARY}.items():
    register_lowering(_packet)(make_pointwise(_op(_name), _kind))

register_lowering(aten.__and__)(make_pointwise(_op("bitwise_and")))
register_lowering(aten.__or__)(make_pointwise(_op("bitwise_or")))
register_lowering(aten.__xor__)(make_pointwise(_op("bitwise_xor")))
register_lowering(aten.square)(make_pointwise(lambda a: ops.mul(a, a), Kind.BOOL_TO_LONG))
register_lowering(aten.relu)(make_pointwise(_op("relu")))
register_lowering(aten.round.default)(make_pointwise(_op("round")))

_plain_pow = make_pointwise(_op("pow"), Kind.BOOL_TO_LONG)

# Note [pow by a constant exponent]: eager's CPU kernel computes x ** 2, x ** 3 and x ** -2 by
# multiplication, x ** 0.5 and x ** -0.5 by sqrt and rsqrt and x ** -1 by reciprocal; a generic
# pow call costs tens of nanoseconds an element and keeps the loop from vectorizing (GPT-2's GELU
# cubes its input). Lowering these exponents the same way is faster and rounds the way eager does.
# x ** 1 is x itself (IEEE pow returns its base exactly for exponent 1, NaN, infinities and -0.0
# included): the backward of `x.pow(2)` is `2 * x.pow(1) * grad` after decomposition, so every
# RMSNorm's backward (LLaMA, Qwen2, T5) printed a pow an element in its row kernel. GCC folds
# `std::pow(x, 1.0f)` itself (no time measured either way on LLaMA's kernels), but the C++
# generator's parallel plan weighed the call as a math function (215 statements an element for
# the RMSNorm gradient instead of 23) and the Triton generator printed a libdevice call.
_POW_BY_CONSTANT: dict[float, Callable[[Any], Any]] = {
    1.0: lambda x: x,
    2.0: lambda x: ops.mul(x, x),
    3.0: lambda x: ops.mul(ops.mul(x, x), x),
    -2.0: lambda x: ops.reciprocal(ops.mul(x, x)),
    0.5: _op("sqrt"),
    -0.5: _op("rsqrt"),
    -1.0: _op("reciprocal"),
}


# Note [Errors eager raises from its arguments]: some ops refuse arguments whatever the values of
# the tensors: an integer tensor to a negative Python integer power ("Integers to negative
# integer powers are not allowed"; a negative exponent *tensor* is not checked: its elements
# give 0, 1 or -1), subtraction with a bool operand ("Subtraction, the `-` operator, with a bool
# tensor is not supported"). The lowering leaves such a node to eager's kernel (`Unsupported`:
# an extern call), which raises at run time as eager does; a kernel computed a value (`x ** -1`
# of ints was 0 or 1, `mask - True` an xor).
def _negative_int_power(a: Any, b: Any) -> bool:
    return (
        isinstance(a, TensorBox)
        and not a.get_dtype().is_floating_point
        and not a.get_dtype().is_complex
        and isinstance(b, int)
        and not isinstance(b, bool)
        and b < 0
    )


def _bool_operand(value: Any) -> bool:
    if isinstance(value, TensorBox):
        return value.get_dtype() == torch.bool
    return isinstance(value, bool)


@register_lowering(aten.pow)
def pow_(a: Any, b: Any) -> TensorBox:
    if _negative_int_power(a, b):  # Note [Errors eager raises from its arguments]
        raise Unsupported("an integer tensor to a negative integer power: eager's kernel raises")
    if isinstance(a, TensorBox) and isinstance(b, (int, float)) and not isinstance(b, bool):
        _, result = torch._prims_common.elementwise_dtypes(
            meta_of(a), meta_of(b), type_promotion_kind=Kind.BOOL_TO_LONG
        )
        if result not in (torch.float32, torch.float64):
            # Note [Python numbers that do not fit the dtype]: eager converts the exponent to an
            # integer or half-type result's dtype with its check (float16 ** 1e30 raises), and
            # keeps it wide for float32 and float64
            check_scalar(b, result)
    if (
        isinstance(a, TensorBox)
        and a.get_dtype().is_floating_point
        and isinstance(b, (int, float))
        and not isinstance(b, bool)
        and float(b) in _POW_BY_CONSTANT
    ):
        return make_pointwise(_POW_BY_CONSTANT[float(b)])(a)
    return _plain_pow(a, b)


def _with_alpha(name: str) -> Callable[..., TensorBox]:
    plain = make_pointwise(_op(name))

    def lower(a: Any, b: Any, alpha: Any = 1) -> TensorBox:
        if name == "sub" and (_bool_operand(a) or _bool_operand(b)):
            # Note [Errors eager raises from its arguments]
            raise Unsupported("subtraction with a bool operand: eager's kernel raises")
        if alpha == 1:
            return plain(a, b)
        if name == "sub" and isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
            # eager subtracts as `a + (-alpha) * b`: the same rounding as `a - alpha * b`, but
            # not the same zero (alpha 0: -0.0 - 0 * -0.0 is 0.0, -0.0 + 0 * -0.0 is -0.0)
            return make_pointwise(lambda x, y, k: ops.add(x, ops.mul(y, k)))(a, b, -alpha)
        return make_pointwise(lambda x, y, k: getattr(ops, name)(x, ops.mul(y, k)))(a, b, alpha)

    return lower


register_lowering(aten.add)(_with_alpha("add"))
register_lowering(aten.sub)(_with_alpha("sub"))


@register_lowering(aten.rsub)
def rsub(a: Any, b: Any, alpha: Any = 1) -> TensorBox:
    return _with_alpha("sub")(b, a, alpha)


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a: Any, b: Any, *, rounding_mode: str | None = None) -> TensorBox:
    if rounding_mode is None:
        return make_pointwise(_op("truediv"), Kind.INT_TO_FLOAT)(a, b)
    _, result = torch._prims_common.elementwise_dtypes(
        meta_of(a), meta_of(b), type_promotion_kind=Kind.DEFAULT
    )
    if rounding_mode == "floor":
        return make_pointwise(_op("floordiv"))(a, b)
    if result.is_floating_point:
        return make_pointwise(lambda x, y: ops.trunc(ops.truediv(x, y)))(a, b)
    return make_pointwise(_op("truncdiv"))(a, b)


# Note [NaN bounds of clamp]: eager's clamp propagates a NaN from either side, the bound's as well
# as the input's: `x.clamp(min=lo)` is NaN wherever `lo` is NaN (a tensor bound with NaNs, or a
# NaN scalar). The selects `v < lo ? lo : v` alone keep `v` there, since every comparison with a
# NaN is false; so a bound that may be NaN also selects itself where it is NaN. A Python number
# that is not NaN, and any bound of an integer computation, cannot be NaN and keeps the plain
# select.
def _may_be_nan(bound: Any) -> bool:
    if isinstance(bound, TensorBox):
        return bound.get_dtype().is_floating_point
    return isinstance(bound, float) and math.isnan(bound)


@register_lowering(aten.clamp.default, aten.clamp.Tensor)
def clamp(x: TensorBox, min: Any = None, max: Any = None) -> TensorBox:
    args: list[Any] = [x]
    if min is not None:
        args.append(min)
    if max is not None:
        args.append(max)
    has_min, has_max = min is not None, max is not None
    compute, result = torch._prims_common.elementwise_dtypes(
        *[meta_of(a) for a in args], type_promotion_kind=Kind.DEFAULT
    )
    for bound in (min, max):
        if not isinstance(bound, TensorBox):
            check_scalar(bound, result)  # Note [Python numbers that do not fit the dtype]
    nan_min, nan_max = (compute.is_floating_point and _may_be_nan(b) for b in (min, max))

    def body(v: Any, *bounds: Any) -> Any:
        rest = list(bounds)
        if has_min:
            lo = rest.pop(0)
            below = ops.lt(v, lo)
            if nan_min:
                below = ops.logical_or(below, ops.isnan(lo))
            v = ops.where(below, lo, v)
        if has_max:
            hi = rest.pop(0)
            above = ops.gt(v, hi)
            if nan_max:
                above = ops.logical_or(above, ops.isnan(hi))
            v = ops.where(above, hi, v)
        return v

    return make_pointwise(body)(*args)


@register_lowering(aten.hardtanh)
def hardtanh(x: TensorBox, lo: float = -1.0, hi: float = 1.0) -> TensorBox:
    if x.get_dtype().is_floating_point:
        return clamp(x, lo, hi)
    # integer inputs keep their dtype; the bounds are truncated to it
    return clamp(x, int(lo), int(hi))


@register_lowering(aten.clamp_min)
def clamp_min(x: TensorBox, bound: Any) -> TensorBox:
    return clamp(x, bound, None)


@register_lowering(aten.clamp_max)
def clamp_max(x: TensorBox, bound: Any) -> TensorBox:
    return clamp(x, None, bound)


@register_lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(cond: TensorBox, a: Any, b: Any) -> TensorBox:
    boxes = [t for t in (cond, a, b) if isinstance(t, TensorBox)]
    size = broadcast_sizes(*[t.get_size() for t in boxes])
    _, dtype = torch._prims_common.elementwise_dtypes(
        meta_of(a), meta_of(b), type_promotion_kind=Kind.NO_OPMATH
    )
    load_c = broadcast_loader(cond, size)

    def operand(value: Any) -> Callable[[Index], Any]:
        if isinstance(value, TensorBox):
            load = broadcast_loader(value, size)
            return lambda i: ops.to_dtype(load(i), dtype)
        return lambda i: ops.constant(value, dtype)

    for value in (a, b):
        if not isinstance(value, TensorBox):
            check_scalar(value, dtype)  # Note [Python numbers that do not fit the dtype]
    la, lb = operand(a), operand(b)

    def inner(index: Index) -> Any:
        return ops.where(ops.to_dtype(load_c(index), torch.bool), la(index), lb(index))

    return TensorBox.create(Pointwise(cond.get_device(), dtype, inner, size))


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x: TensorBox, mask: TensorBox, value: Any) -> TensorBox:
    dtype = x.get_dtype()
    size = broadcast_sizes(x.get_size(), mask.get_size())
    if size != x.get_size():
        raise Unsupported("masked_fill whose mask broadcasts self")
    load_x, load_m = broadcast_loader(x, size), broadcast_loader(mask, size)
    load_v = broadcast_loader(value, size) if isinstance(value, TensorBox) else None
    if load_v is None:
        check_scalar(value, dtype)  # Note [Python numbers that do not fit the dtype]

    def inner(index: Index) -> Any:
        fill = ops.to_dtype(load_v(index), dtype) if load_v else ops.constant(value, dtype)
        return ops.where(load_m(index), fill, load_x(index))

    return TensorBox.create(Pointwise(x.get_device(), dtype, inner, size))


def _activation(fn: Callable[..., Any]) -> Callable[..., TensorBox]:
    """A float activation with scalar parameters, computed in opmath and rounded once."""

    def lower(x: TensorBox, *params: Any, **kw: Any) -> TensorBox:
        return make_pointwise(lambda v: fn(v, *params, **kw), Kind.INT_TO_FLOAT)(x)

    return lower


def _c(value: float) -> Any:
    # float64 so that a float64 computation keeps full precision; a 0-dim constant does not
    # upcast float32 or opmath values (same category).
    return ops.constant(value, torch.float64)


def _gelu(v: Any, approximate: str = "none") -> Any:
    if approximate == "tanh":
        inner = ops.mul(
            _c(math.sqrt(2 / math.pi)), ops.add(v, ops.mul(_c(0.044715), ops.mul(v, ops.mul(v, v))))
        )
        return ops.mul(ops.mul(_c(0.5), v), ops.add(_c(1.0), ops.tanh(inner)))
    return ops.mul(ops.mul(_c(0.5), v), ops.add(_c(1.0), ops.erf(ops.mul(v, _c(math.sqrt(0.5))))))


def _silu(v: Any) -> Any:
    return ops.mul(v, ops.sigmoid(v))


def _leaky_relu(v: Any, slope: float = 0.01) -> Any:
    return ops.where(ops.gt(v, _c(0.0)), v, ops.mul(v, _c(slope)))


def _elu(v: Any, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Any:
    neg = ops.mul(_c(alpha), ops.expm1(ops.mul(v, _c(input_scale))))
    return ops.mul(_c(scale), ops.where(ops.gt(v, _c(0.0)), v, neg))


def _softplus(v: Any, beta: float = 1.0, threshold: float = 20.0) -> Any:
    scaled = ops.mul(v, _c(beta))
    soft = ops.truediv(ops.log1p(ops.exp(scaled)), _c(beta))
    return ops.where(ops.gt(scaled, _c(threshold)), v, soft)


def _relu6_shifted(v: Any) -> Any:
    return ops.minimum(ops.maximum(ops.add(v, _c(3.0)), _c(0.0)), _c(6.0))


def _hardsigmoid(v: Any) -> Any:
    return ops.truediv(_relu6_shifted(v), _c(6.0))


def _hardswish(v: Any) -> Any:
    # multiply before dividing, in eager's order: the same rounding, and the same overflow at
    # the largest finite values (x * 6 is inf there)
    return ops.truediv(ops.mul(v, _relu6_shifted(v)), _c(6.0))


def _mish(v: Any) -> Any:
    return ops.mul(v, ops.tanh(_softplus(v)))


def _logit(v: Any, eps: float | None = None) -> Any:
    if eps is not None:
        v = ops.minimum(ops.maximum(v, _c(eps)), _c(1.0 - eps))
    return ops.log(ops.truediv(v, ops.sub(_c(1.0), v)))


register_lowering(aten.gelu)(_activation(_gelu))
register_lowering(aten.silu)(_activation(_silu))
register_lowering(aten.leaky_relu)(_activation(_leaky_relu))
register_lowering(aten.elu)(_activation(_elu))
register_lowering(aten.softplus)(_activation(_softplus))
register_lowering(aten.hardsigmoid)(_activation(_hardsigmoid))
register_lowering(aten.hardswish)(_activation(_hardswish))
register_lowering(aten.mish)(_activation(_mish))
register_lowering(aten.logit)(_activation(_logit))


@register_lowering(aten.threshold_backward)
def threshold_backward(grad: TensorBox, x: TensorBox, threshold: float) -> TensorBox:
    return make_pointwise(lambda g, v, t: ops.where(ops.le(v, t), ops.constant(0, grad.get_dtype()), g))(
        grad, x, threshold
    )


@register_lowering(aten.sigmoid_backward)
def sigmoid_backward(grad: TensorBox, y: TensorBox) -> TensorBox:
    return make_pointwise(lambda g, s: ops.mul(g, ops.mul(s, ops.sub(_c(1.0), s))))(grad, y)


@register_lowering(aten.tanh_backward)
def tanh_backward(grad: TensorBox, y: TensorBox) -> TensorBox:
    return make_pointwise(lambda g, t: ops.mul(g, ops.sub(_c(1.0), ops.mul(t, t))))(grad, y)


@register_lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(a: TensorBox, b: Any, weight: Any) -> TensorBox:
    return make_pointwise(lambda x, y, w: ops.add(x, ops.mul(w, ops.sub(y, x))))(a, b, weight)


@register_lowering(aten.addcmul)
def addcmul(x: TensorBox, a: TensorBox, b: TensorBox, *, value: Any = 1) -> TensorBox:
    return make_pointwise(lambda s, p, q, k: ops.add(s, ops.mul(k, ops.mul(p, q))))(x, a, b, value)


@register_lowering(aten.addcdiv)
def addcdiv(x: TensorBox, a: TensorBox, b: TensorBox, *, value: Any = 1) -> TensorBox:
    return make_pointwise(lambda s, p, q, k: ops.add(s, ops.mul(k, ops.truediv(p, q))), Kind.INT_TO_FLOAT)(
        x, a, b, value
    )


@register_lowering(aten.nan_to_num)
def nan_to_num(
    x: TensorBox, nan: float | None = 0.0, posinf: float | None = None, neginf: float | None = None
) -> TensorBox:
    dtype = x.get_dtype()
    if not dtype.is_floating_point:
        return make_pointwise(lambda v: v)(x)
    info = torch.finfo(dtype)
    hi = info.max if posinf is None else posinf
    lo = info.min if neginf is None else neginf
    fill = 0.0 if nan is None else nan

    def body(v: Any) -> Any:
        v = ops.where(ops.isnan(v), ops.constant(fill, dtype), v)
        v = ops.where(ops.eq(v, ops.constant(math.inf, dtype)), ops.constant(hi, dtype), v)
        return ops.where(ops.eq(v, ops.constant(-math.inf, dtype)), ops.constant(lo, dtype), v)

    return make_pointwise(body, Kind.NO_OPMATH, compute_dtype=dtype)(x)


@register_lowering(aten.clone, aten.alias_copy, aten.lift_fresh_copy, aten.detach_copy)
def clone(x: TensorBox, **_: Any) -> TensorBox:
    load = x.make_loader()
    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), load, x.get_size()))


@register_lowering(aten._to_copy)
def to_copy(x: TensorBox, *, dtype: torch.dtype | None = None, device: Any = None, **_: Any) -> TensorBox:
    if device is not None and torch.device(device) != x.get_device():
        raise Unsupported("device transfer")
    return clone(to_dtype(x, dtype or x.get_dtype()))


@register_lowering(aten.copy.default)
def copy(dst: TensorBox, src: TensorBox, non_blocking: bool = False) -> TensorBox:
    size = dst.get_size()
    load = broadcast_loader(src, size)
    dtype = dst.get_dtype()

    def inner(index: Index) -> Any:
        return ops.to_dtype(load(index), dtype)

    return TensorBox.create(Pointwise(dst.get_device(), dtype, inner, size))
