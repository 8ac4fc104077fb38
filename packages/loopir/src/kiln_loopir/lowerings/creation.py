"""Creation lowerings: full / zeros / ones / empty / arange / iota and their ``_like`` forms.

They are Pointwise bodies without loads: a constant, or ``ops.index_expr`` of the loop variable
for ``arange``. Dtype and shape come from the node's meta value (the graph computes it), which
settles the defaulting rules (an int fill gives int64, a float fill the default dtype) the way
eager does without restating them here.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from ..ir import Index, Pointwise, TensorBox
from ..layout import symbolic
from ..lowering import Unsupported, check_scalar, register_lowering
from ..virtualized import current_graph, ops

aten = torch.ops.aten


def _meta() -> torch.Tensor:
    meta = current_graph().current_meta
    if not isinstance(meta, torch.Tensor):
        raise Unsupported("creation op without a tensor meta value")
    return meta


def _device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    """Where a created tensor lives: its ``device`` argument, else the tensor it is made like
    (``*_like``, ``new_*``), else the graph's device (a graph without tensor inputs that creates
    a CUDA tensor must not make it on the CPU)."""
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    for a in args:
        if isinstance(a, TensorBox):
            return a.get_device()
    return current_graph().device


def _filled(value: Any, device: torch.device) -> TensorBox:
    meta = _meta()
    dtype = meta.dtype
    if isinstance(value, TensorBox):
        load = value.make_loader()

        def from_tensor(index: Index) -> Any:
            return ops.to_dtype(load([]), dtype)

        return TensorBox.create(Pointwise(device, dtype, from_tensor, symbolic(meta.shape)))

    # Note [Python numbers that do not fit the dtype]; for a half type eager's own check depends
    # on the element count (one element: inf, two or more: it raises), so a number beyond the
    # half type's range is left to eager's kernel, which decides, whatever the count
    check_scalar(value, dtype)

    def inner(index: Index) -> Any:
        if isinstance(value, sympy.Expr) and not value.is_number:
            # a size, or a float of sizes (Note [A float of sizes keeps its Python operations]
            # in kiln_aotgrad): computed from the size symbols, then converted as eager does
            return ops.index_expr(value, dtype)
        return ops.constant(value, dtype)

    return TensorBox.create(Pointwise(device, dtype, inner, symbolic(meta.shape)))


@register_lowering(aten.full.default, aten.new_full.default)
def full(*args: Any, **kwargs: Any) -> TensorBox:
    return _filled(args[-1], _device(args, kwargs))


@register_lowering(aten.full_like.default)
def full_like(x: TensorBox, value: Any, **kwargs: Any) -> TensorBox:
    return _filled(value, _device((x,), kwargs))


@register_lowering(
    aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default,
    aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
    aten.empty_strided.default,
)  # fmt: skip
def zeros(*args: Any, **kwargs: Any) -> TensorBox:
    return _filled(0, _device(args, kwargs))


@register_lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(*args: Any, **kwargs: Any) -> TensorBox:
    return _filled(1, _device(args, kwargs))


@register_lowering(aten.scalar_tensor.default)
def scalar_tensor(value: Any, **kwargs: Any) -> TensorBox:
    return _filled(value, _device((), kwargs))


# Note [The bounds of arange]: arange's start and step are read by position (``(end)``,
# ``(start, end)``, ``(start, end, step)``), never picked out by type. They were once the
# arguments that were Python numbers, so a symbolic end dropped out and the start took its place:
# ``arange(-2, s + 2)`` (reflection padding's index under dynamic shapes) counted from 0, a wrong
# answer found in the eleventh session. A symbolic start or step is a size expression, read with
# ``index_expr``.
@register_lowering(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(*args: Any, **kwargs: Any) -> TensorBox:
    if len(args) >= 2:
        start: Any = args[0]
        step: Any = args[2] if len(args) > 2 else kwargs.get("step", 1)
    else:
        start, step = kwargs.get("start", 0), kwargs.get("step", 1)
    meta = _meta()
    dtype = meta.dtype
    # eager computes start + i * step in double for floats, in int64 for integers
    compute = torch.float64 if dtype.is_floating_point else torch.int64

    def scalar(value: Any) -> Any:
        if isinstance(value, sympy.Expr) and not value.is_number:
            return ops.to_dtype(ops.index_expr(value, torch.int64), compute)
        if isinstance(value, sympy.Expr):
            value = int(value) if value.is_integer else float(value)
        return ops.constant(value, compute)

    def inner(index: Index) -> Any:
        i = ops.index_expr(index[0], compute)
        value = ops.add(scalar(start), ops.mul(i, scalar(step)))
        return ops.to_dtype(value, dtype)

    return TensorBox.create(Pointwise(_device((), kwargs), dtype, inner, symbolic(meta.shape)))


@register_lowering(torch.ops.prims.iota.default)
def iota(length: int, *, start: int, step: int, dtype: torch.dtype, **kwargs: Any) -> TensorBox:
    def inner(index: Index) -> Any:
        return ops.index_expr(index[0] * step + start, dtype)

    return TensorBox.create(Pointwise(_device((), kwargs), dtype, inner, (sympy.Integer(length),)))
