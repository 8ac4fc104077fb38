"""Reduction lowerings: sum/mean/amax/.../var, softmax and layer norm.

:func:`make_reduction` splits the input's dimensions into kept ones (``ranges``) and reduced
ones (``reduction_ranges``); the Reduction's ``inner_fn`` reads the input at the interleaved
index, so pointwise producers inline into the reduction's loop. A reduction is realized at once
(its result is a buffer), then viewed with size-1 dims for ``keepdim`` and converted to the
result dtype lazily. Variance uses Welford: a mean and an m2 Reduction over the same input, which
the scheduler fuses into one pass. Softmax is max, then sum of ``exp(x - max)``, then a lazy
pointwise that its consumer (or the output) realizes: at most two reduction loops over the rows.

Note [Element counts over symbolic dims]: mean, var/std and layer norm divide by how many elements
they combine. Over static dims that count is a constant in the kernel, as it always was; over a
symbolic dim (Note [Symbolic sizes in loopir]) it is a product of size symbols, computed in the
kernel by ``ops.index_expr`` (the code generators then take those symbols as size arguments), so
a layer norm over a varying sequence length is a kernel, not an extern call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from ..indexing import Expr, contiguous_strides, linear_index
from ..ir import Index, Pointwise, Reduction, TensorBox
from ..lowering import Unsupported, broadcast_loader, normalize_dim, opmath, register_lowering, to_dtype
from ..virtualized import ops
from .views import unsqueeze, view

aten = torch.ops.aten


def _dims(x: TensorBox, dims: Any) -> list[int]:
    rank = len(x.get_size())
    if rank == 0:  # a scalar: dim 0 / -1 name the scalar itself, nothing to reduce
        return []
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({normalize_dim(d, rank) for d in dims})


def make_reduction(
    x: TensorBox,
    dims: Sequence[int],
    reduction_type: str,
    acc_dtype: torch.dtype,
    *,
    transform: Callable[[Any], Any] | None = None,
    output_index: int = 0,
    out_dtype: torch.dtype | None = None,
) -> TensorBox:
    """Reduce ``x`` over ``dims`` (keepdim=False); the result is realized."""
    size = x.get_size()
    kept = [i for i in range(len(size)) if i not in dims]
    if any(size[k] == 0 for k in dims):  # Note [Reductions over no element]
        empty = _EMPTY_REDUCTIONS.get(reduction_type)
        if empty is None:
            raise Unsupported(f"{reduction_type} over no element: eager's kernel raises")
        value = empty[output_index] if isinstance(empty, tuple) else empty
        return _empty_reduction(x, [size[k] for k in kept], value, out_dtype or acc_dtype)
    load = x.make_loader()
    src_dtype = x.get_dtype()

    def inner(index: Index, rindex: Index) -> Any:
        full: list[Expr] = [sympy.Integer(0)] * len(size)
        for pos, k in enumerate(kept):
            full[k] = index[pos]
        for pos, k in enumerate(dims):
            full[k] = rindex[pos]
        value = load(full)
        if reduction_type not in ("argmax", "argmin", "any"):
            value = ops.to_dtype(value, acc_dtype)
        return transform(value) if transform else value

    red = Reduction(
        x.get_device(),
        out_dtype or acc_dtype,
        inner,
        tuple(size[k] for k in kept),
        tuple(size[k] for k in dims),
        reduction_type,
        src_dtype,
        output_index,
    )
    box = TensorBox.create(red)
    storage = box.storage()
    assert storage is not None
    storage.realize()
    return box


# Note [Reductions over no element]: a reduction over a dim of size 0 combines nothing; its
# result is the reduction's identity everywhere (a sum 0, a product 1, `any` false), and for
# Welford's (mean, m2, weight) eager's answers: the mean of nothing is NaN (`var_mean`), m2 and
# the weight 0 (var/std divide 0 by a count of 0, eager's NaN). It is
# lowered as that constant, not as a Reduction: a kernel with no row still ran its loads, and
# the Triton generator's load of an index that every (absent) element shares was unmasked, off
# an empty input's memory (a crash under the interpreter, after a fall back on the digit of a
# size-0 dim: `x.prod()` of a [3, 0] tensor). max/min/argmax/argmin over no element are errors
# in eager ("Expected reduction dim 0 to have non-zero size"), raised by the meta kernels of
# amax and argmax but not by those of `max.dim`, `min.dim` and `max()`: such a node is left to
# eager's kernel (`Unsupported`), which raises at run time (kiln returned -inf and index 0).
_EMPTY_REDUCTIONS: dict[str, Any] = {
    "sum": 0,
    "prod": 1,
    "any": False,
    "welford_reduce": (float("nan"), 0, 0),
}


def _empty_reduction(x: TensorBox, size: list[Expr], value: Any, dtype: torch.dtype) -> TensorBox:
    box = TensorBox.create(
        Pointwise(x.get_device(), dtype, lambda index: ops.constant(value, dtype), tuple(size))
    )
    storage = box.storage()
    assert storage is not None
    storage.realize()
    return box


def _keepdim(box: TensorBox, dims: Sequence[int], keepdim: bool) -> TensorBox:
    if keepdim:
        for d in dims:
            box = unsqueeze(box, d)
    return box


def _sum_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.int64 if not dtype.is_floating_point and not dtype.is_complex else dtype


@register_lowering(aten.sum.dim_IntList, aten.sum.default)
def sum_(
    x: TensorBox, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> TensorBox:
    dims = _dims(x, dim)
    result = dtype or _sum_dtype(x.get_dtype())
    out = make_reduction(x, dims, "sum", opmath(result))
    return to_dtype(_keepdim(out, dims, keepdim), result)


@register_lowering(aten.prod.dim_int, aten.prod.default)
def prod(
    x: TensorBox, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> TensorBox:
    dims = _dims(x, dim)
    result = dtype or _sum_dtype(x.get_dtype())
    out = make_reduction(x, dims, "prod", opmath(result))
    return to_dtype(_keepdim(out, dims, keepdim), result)


@register_lowering(aten.mean.dim, aten.mean.default)
def mean(
    x: TensorBox, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> TensorBox:
    dims = _dims(x, dim)
    result = dtype or x.get_dtype()
    acc = opmath(result)
    count = _count(x.get_size(), dims)
    total = make_reduction(x, dims, "sum", acc)
    out = _scale(total, lambda v: ops.truediv(v, _number(count, acc)), result)
    return _keepdim(out, dims, keepdim)


def _count(size: Sequence[Expr], dims: Sequence[int]) -> int | Expr:
    """How many elements a reduction over ``dims`` combines: an int for static sizes, else an
    expression in the size symbols (Note [Element counts over symbolic dims])."""
    count = sympy.Mul(*(sympy.sympify(size[d]) for d in dims))
    return int(count) if count.is_Integer else count


def _number(count: float | Expr, dtype: torch.dtype) -> Any:
    """An element count as a value of ``dtype``: a constant, or the count computed in the kernel
    from its size symbols."""
    if isinstance(count, (int, float)):  # static (var's divisor is a float with a float correction)
        return ops.constant(count, dtype)
    return ops.index_expr(count, dtype)


def _clamp_nonnegative(count: int | Expr, correction: Any) -> Any:
    """``max(count - correction, 0)``, eager's divisor for var/std. Size symbols are positive
    integers, so ``N - 1`` is known non-negative; a symbolic count with a correction that is not
    an integer, or that may exceed it, would need a run-time ``max``: the lowering declines."""
    if isinstance(count, int):
        return max(count - correction, 0)
    if float(correction).is_integer():
        denom = count - int(correction)
        if denom.is_nonnegative:
            return denom
    raise Unsupported(f"correction {correction} over the symbolic element count {count}")


def _scale(box: TensorBox, fn: Callable[[Any], Any], result: torch.dtype) -> TensorBox:
    load = box.make_loader()

    def inner(index: Index) -> Any:
        return ops.to_dtype(fn(load(index)), result)

    return TensorBox.create(Pointwise(box.get_device(), result, inner, box.get_size()))


def _minmax(kind: str) -> Callable[..., TensorBox]:
    def lower(x: TensorBox, dim: Any = None, keepdim: bool = False) -> TensorBox:
        dims = _dims(x, dim)
        out = make_reduction(x, dims, kind, x.get_dtype())
        return _keepdim(out, dims, keepdim)

    return lower


register_lowering(aten.amax)(_minmax("max"))
register_lowering(aten.amin)(_minmax("min"))
register_lowering(aten.max.default)(_minmax("max"))
register_lowering(aten.min.default)(_minmax("min"))


def _arg(kind: str) -> Callable[..., TensorBox]:
    def lower(x: TensorBox, dim: int | None = None, keepdim: bool = False) -> TensorBox:
        if dim is None:
            flat = view(x, [-1]) if len(x.get_size()) != 1 else x
            out = make_reduction(flat, [0], kind, torch.int64)
            if keepdim:
                return view(out, [1] * len(x.get_size()))
            return out
        dims = _dims(x, dim)
        out = make_reduction(x, dims, kind, torch.int64)
        return _keepdim(out, dims, keepdim)

    return lower


def _arg_of_non_bool(kind: str) -> Callable[..., TensorBox]:
    inner = _arg(kind)

    def lower(x: TensorBox, *args: Any, **kwargs: Any) -> TensorBox:
        if x.get_dtype() == torch.bool:
            # eager's argmax/argmin refuse bools whatever the shape ("does not support bool
            # input"), the meta kernel does not (`max.dim` of bools, which shares this
            # reduction, takes them): eager's kernel runs and raises
            raise Unsupported(f"{kind} of bools: eager's kernel raises")
        return inner(x, *args, **kwargs)

    return lower


register_lowering(aten.argmax)(_arg_of_non_bool("argmax"))
register_lowering(aten.argmin)(_arg_of_non_bool("argmin"))


def _minmax_dim(kind: str) -> Callable[..., tuple[TensorBox, TensorBox]]:
    def lower(x: TensorBox, dim: int, keepdim: bool = False) -> tuple[TensorBox, TensorBox]:
        return _minmax(kind)(x, dim, keepdim), _arg("arg" + kind)(x, dim, keepdim)

    return lower


register_lowering(aten.max.dim)(_minmax_dim("max"))
register_lowering(aten.min.dim)(_minmax_dim("min"))


@register_lowering(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x: TensorBox, dim: Any = None, keepdim: bool = False) -> TensorBox:
    dims = _dims(x, dim)
    out = make_reduction(to_dtype(x, torch.bool), dims, "any", torch.bool)
    return _keepdim(out, dims, keepdim)


def _not(value: Any) -> Any:
    return ops.logical_not(value)


def _sqrt(value: Any) -> Any:
    return ops.sqrt(value)


@register_lowering(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x: TensorBox, dim: Any = None, keepdim: bool = False) -> TensorBox:
    dims = _dims(x, dim)
    negated = make_reduction(to_dtype(x, torch.bool), dims, "any", torch.bool, transform=_not)
    out = _scale(negated, _not, torch.bool)
    return _keepdim(out, dims, keepdim)


def welford(x: TensorBox, dims: Sequence[int], acc: torch.dtype) -> tuple[TensorBox, TensorBox]:
    """(mean, m2) of ``x`` over ``dims``: two Reductions the scheduler fuses into one pass."""
    mean_ = make_reduction(x, dims, "welford_reduce", acc, output_index=0)
    m2 = make_reduction(x, dims, "welford_reduce", acc, output_index=1)
    return mean_, m2


def _var_parts(
    x: TensorBox, dim: Any, correction: Any
) -> tuple[TensorBox, TensorBox, list[int], torch.dtype]:
    dims = _dims(x, dim)
    result = x.get_dtype()
    acc = opmath(result)
    count = _count(x.get_size(), dims)
    corr = 1 if correction is None else correction
    denom = _clamp_nonnegative(count, corr)
    mean_, m2 = welford(x, dims, acc)
    var = _scale(m2, lambda v: ops.truediv(v, _number(denom, acc)), acc)
    return mean_, var, dims, result


@register_lowering(aten.var.correction, aten.var.dim)
def var(
    x: TensorBox, dim: Any = None, *args: Any, correction: Any = None, keepdim: bool = False
) -> TensorBox:
    if args:  # var.dim(self, dim, unbiased, keepdim)
        correction = int(args[0]) if args[0] is not None else 1
        keepdim = bool(args[1]) if len(args) > 1 else keepdim
    _, v, dims, result = _var_parts(x, dim, correction)
    return _keepdim(to_dtype(v, result), dims, keepdim)


@register_lowering(aten.std.correction, aten.std.dim)
def std(
    x: TensorBox, dim: Any = None, *args: Any, correction: Any = None, keepdim: bool = False
) -> TensorBox:
    if args:
        correction = int(args[0]) if args[0] is not None else 1
        keepdim = bool(args[1]) if len(args) > 1 else keepdim
    _, v, dims, result = _var_parts(x, dim, correction)
    return _keepdim(_scale(v, _sqrt, result), dims, keepdim)


@register_lowering(aten.var_mean.correction)
def var_mean(
    x: TensorBox, dim: Any = None, *, correction: Any = None, keepdim: bool = False
) -> tuple[TensorBox, TensorBox]:
    m, v, dims, result = _var_parts(x, dim, correction)
    return _keepdim(to_dtype(v, result), dims, keepdim), _keepdim(to_dtype(m, result), dims, keepdim)


# Note [Softmax of a scalar]: a 0-d tensor is one row of one element (dim 0 or -1 names it): its
# max is the element itself and the sum of exp(x - max) is exp(x - x), so softmax is exp(x - x) /
# exp(x - x), 1, and log_softmax 0, both NaN where x is infinite or NaN, as eager's kernel gives.
# The row's max was lowered as x * 0 (and the sum as x * 0 + 1), a row max of 0 that only x == 0
# has: softmax(tensor(1.5), 0) came back exp(1.5) = 4.48, log_softmax 1.5 (OpInfo samples past
# the third: `opinfo_sweep.py --samples 30`).
def _softmax_parts(x: TensorBox, dim: int, dtype: torch.dtype) -> tuple[TensorBox, TensorBox, TensorBox]:
    """(x as dtype, row max keepdim, sum of exp(x - max) keepdim)."""
    d = normalize_dim(dim, len(x.get_size()))
    xc = to_dtype(x, dtype)
    if not x.get_size():  # Note [Softmax of a scalar]
        return xc, xc, _scale(xc, lambda v: ops.exp(ops.sub(v, v)), dtype)
    amax = unsqueeze(make_reduction(xc, [d], "max", dtype), d)
    size = x.get_size()
    load_x, load_m = xc.make_loader(), broadcast_loader(amax, size)
    shifted = TensorBox.create(
        Pointwise(x.get_device(), dtype, lambda i: ops.exp(ops.sub(load_x(i), load_m(i))), size)
    )
    total = unsqueeze(make_reduction(shifted, [d], "sum", dtype), d)
    return xc, amax, total


@register_lowering(aten._softmax)
def softmax(x: TensorBox, dim: int, half_to_float: bool = False) -> TensorBox:
    result = torch.float32 if half_to_float else x.get_dtype()
    acc = opmath(x.get_dtype())
    xc, amax, total = _softmax_parts(x, dim, acc)
    size = x.get_size()
    lx, lm, ls = xc.make_loader(), broadcast_loader(amax, size), broadcast_loader(total, size)

    def inner(i: Index) -> Any:
        return ops.to_dtype(ops.truediv(ops.exp(ops.sub(lx(i), lm(i))), ls(i)), result)

    return TensorBox.create(Pointwise(x.get_device(), result, inner, size))


@register_lowering(aten._log_softmax)
def log_softmax(x: TensorBox, dim: int, half_to_float: bool = False) -> TensorBox:
    result = torch.float32 if half_to_float else x.get_dtype()
    acc = opmath(x.get_dtype())
    xc, amax, total = _softmax_parts(x, dim, acc)
    size = x.get_size()
    lx, lm, ls = xc.make_loader(), broadcast_loader(amax, size), broadcast_loader(total, size)

    def inner(i: Index) -> Any:
        return ops.to_dtype(ops.sub(ops.sub(lx(i), lm(i)), ops.log(ls(i))), result)

    return TensorBox.create(Pointwise(x.get_device(), result, inner, size))


@register_lowering(aten.logsumexp)
def logsumexp(x: TensorBox, dim: Any, keepdim: bool = False) -> TensorBox:
    dims = _dims(x, dim)
    result = x.get_dtype() if x.get_dtype().is_floating_point else torch.get_default_dtype()
    acc = opmath(result)
    xc = to_dtype(x, acc)
    amax = make_reduction(xc, dims, "max", acc)
    amax_k = _keepdim(amax, dims, True)
    size = x.get_size()
    lx, lm = xc.make_loader(), broadcast_loader(amax_k, size)

    def safe(i: Index) -> Any:
        m = lm(i)
        m = ops.where(ops.isinf(m), ops.constant(0.0, acc), m)
        return ops.exp(ops.sub(lx(i), m))

    total = make_reduction(TensorBox.create(Pointwise(x.get_device(), acc, safe, size)), dims, "sum", acc)
    lt, la = total.make_loader(), amax.make_loader()

    def inner(i: Index) -> Any:
        m = la(i)
        m = ops.where(ops.isinf(m), ops.constant(0.0, acc), m)
        return ops.to_dtype(ops.add(ops.log(lt(i)), m), result)

    out = TensorBox.create(Pointwise(x.get_device(), result, inner, total.get_size()))
    return _keepdim(out, dims, keepdim)


@register_lowering(aten.native_layer_norm.default)
def native_layer_norm(
    x: TensorBox,
    normalized_shape: Sequence[int],
    weight: TensorBox | None,
    bias: TensorBox | None,
    eps: float,
) -> tuple[TensorBox, TensorBox, TensorBox]:
    size = x.get_size()
    axis = len(size) - len(normalized_shape)
    dims = list(range(axis, len(size)))
    acc = opmath(x.get_dtype())
    mean_, m2 = welford(to_dtype(x, acc), dims, acc)
    count = _count(size, dims)
    rstd = _scale(
        m2,
        lambda v: ops.rsqrt(ops.add(ops.truediv(v, _number(count, acc)), ops.constant(eps, acc))),
        acc,
    )
    mean_k, rstd_k = _keepdim(mean_, dims, True), _keepdim(rstd, dims, True)
    lx, lm, lr = x.make_loader(), broadcast_loader(mean_k, size), broadcast_loader(rstd_k, size)
    lw = broadcast_loader(weight, size) if weight is not None else None
    lb = broadcast_loader(bias, size) if bias is not None else None
    dtype = x.get_dtype()

    def inner(i: Index) -> Any:
        v = ops.mul(ops.sub(ops.to_dtype(lx(i), acc), lm(i)), lr(i))
        if lw is not None:
            v = ops.mul(v, ops.to_dtype(lw(i), acc))
        if lb is not None:
            v = ops.add(v, ops.to_dtype(lb(i), acc))
        return ops.to_dtype(v, dtype)

    out = TensorBox.create(Pointwise(x.get_device(), dtype, inner, size))
    # the CPU kernel returns mean and rstd in the input dtype (the meta kernel says opmath;
    # graph.META_FIXES reconciles the two)
    stats_dtype = dtype if x.get_device().type == "cpu" else acc
    return out, to_dtype(mean_k, stats_dtype), to_dtype(rstd_k, stats_dtype)


__all__ = ["contiguous_strides", "linear_index", "make_reduction", "welford"]
