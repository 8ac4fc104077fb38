"""Pooling lowerings: ``max_pool2d_with_indices`` as a Pointwise over the output, its window
unrolled.

Note [Max pooling as a window]: eager's CPU kernel computes the indices even when nothing reads
them (inference), and in channels-first layout walks memory with a stride; as two loop bodies,
the values and the indices are separate Pointwise nodes, and the scheduler drops the indices when
they are dead and fuses the values into their consumer (a ReLU before, a mean after). Each
output element visits its window in eager's order (rows, then columns, dilation steps apart),
skipping positions in the padding, and takes a value when it is greater than the maximum so far
or NaN, or when it is the first position in range: so the index of a tie is the first maximum,
a NaN wins, and a window of all -inf answers its first position, as eager's kernels do. Windows
over ``_MAX_WINDOW`` elements stay extern calls (the unrolled body would be too long). With
symbolic sizes the same body, sized as capture computed (Note [Max pooling over symbolic sizes]).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..ir import Index, Pointwise, TensorBox
from ..lowering import Unsupported, register_lowering
from ..virtualized import ops

aten = torch.ops.aten

_MAX_WINDOW = 64


def _pair(value: int | Sequence[int], default: Sequence[int] | None = None) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    seq = list(value) or list(default or ())
    return (seq[0], seq[0]) if len(seq) == 1 else (seq[0], seq[1])


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input
        out -= 1
    return out


@register_lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(
    x: TensorBox,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    ceil_mode: bool = False,
) -> tuple[TensorBox, TensorBox]:
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, default=(kh, kw))
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if kh * kw > _MAX_WINDOW:
        raise Unsupported(f"max_pool2d window of {kh}x{kw} is too large to unroll")
    if not x.get_dtype().is_floating_point:
        raise Unsupported("max_pool2d on integer tensors stays an extern call")
    if all(sympy.sympify(n).is_Integer for n in x.get_size()):
        size: list[Any] = [int(n) for n in x.get_size()]
        height, width = size[-2], size[-1]
        oh = _out_size(height, kh, sh, ph, dh, ceil_mode)
        ow = _out_size(width, kw, sw, pw, dw, ceil_mode)
        out_size = tuple(sympy.Integer(n) for n in [*size[:-2], oh, ow])
    else:
        out_size = _captured_out_size(len(x.get_size()))
        height, width = x.get_size()[-2], x.get_size()[-1]
    if kh > sh or kw > sw:
        # overlapping windows read each input ~(kh/sh)*(kw/sw) times: compute the producer once
        storage = x.storage()
        if storage is not None and isinstance(storage.data, Pointwise):
            storage.realize()
    load = x.make_loader()
    dtype = x.get_dtype()
    # Windows can leave the input only with padding or ceil_mode's extra last window.
    may_leave = ph > 0 or pw > 0 or ceil_mode

    def window(index: Index) -> tuple[Any, Any]:
        *outer, i, j = index
        best: Any = ops.constant(float("-inf"), dtype)
        arg: Any = ops.constant(-1, torch.int64)
        for a in range(kh):
            for b in range(kw):
                row = i * sh - ph + a * dh
                col = j * sw - pw + b * dw
                flat = ops.index_expr(row * width + col, torch.int64)
                if may_leave:
                    inside = ops.logical_and(_in_range(row, height), _in_range(col, width))
                    value = ops.masked(inside, lambda r=row, c=col: load([*outer, r, c]), float("-inf"))
                else:
                    inside = None
                    value = load([*outer, row, col])
                take = ops.logical_or(
                    ops.logical_or(ops.gt(value, best), ops.isnan(value)),
                    ops.eq(arg, ops.constant(-1, torch.int64)),
                )
                if inside is not None:
                    take = ops.logical_and(inside, take)
                best = ops.where(take, value, best)
                arg = ops.where(take, flat, arg)
        return best, arg

    device = x.get_device()
    values = Pointwise(device, dtype, lambda index: window(index)[0], out_size)
    indices = Pointwise(device, torch.int64, lambda index: window(index)[1], out_size)
    return TensorBox.create(values), TensorBox.create(indices)


def _in_range(expr: Any, hi: Any) -> Any:
    value = ops.index_expr(expr, torch.int64)
    upper = ops.constant(hi, torch.int64) if isinstance(hi, int) else ops.index_expr(hi, torch.int64)
    return ops.logical_and(ops.ge(value, ops.constant(0, torch.int64)), ops.lt(value, upper))


def _captured_out_size(rank: int) -> tuple[Any, ...]:
    """Note [Max pooling over symbolic sizes]: the output sizes as capture computed them (the
    node's value): torch's shape formula, `(H + 2p - d(k-1) - 1 [+ s-1]) // s + 1` with
    ceil_mode's last-window rule, was decided there, with guards the frame checks where the ranges
    did not settle it, so for every call that reaches this graph they are the output's sizes. The
    window body is the static one with the input's height and width as expressions (masks and
    flat indices). Declined (an extern call) when the node has no such value."""
    from .. import sizevars
    from ..virtualized import current_graph

    graph = current_graph()
    node = getattr(graph, "current_node", None)
    meta = getattr(graph, "current_meta", None) if node is not None else None
    if node is None or node.target is not aten.max_pool2d_with_indices.default:
        raise Unsupported("max_pool2d over symbolic sizes outside its own node")
    values = meta[0] if isinstance(meta, list | tuple) else None
    if not isinstance(values, torch.Tensor) or values.dim() != rank:
        raise Unsupported("max_pool2d over symbolic sizes without the captured output sizes")
    out = []
    for n in values.shape:
        env = getattr(getattr(n, "node", None), "shape_env", None)
        if env is not None and env.is_unbacked(sizevars.expr_of(n)):
            raise Unsupported("max_pool2d over data-dependent sizes")
        out.append(sizevars.to_loopir(sizevars.expr_of(n)))
    return tuple(out)
