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

Note [Max pooling values without their indices]: the take condition above makes the *values*
depend on the index chain (``arg == -1`` reads the previous position's index), so a values
kernel computes the whole chain even when the indices are dead: with static sizes GCC proves
the clause true only at the first position and drops the chain, with symbolic sizes it cannot
(the ResNet stem's fused kernel ran 1.35-1.8x its static time), and on the GPU the chain's int64
selects outnumber the loads. Where no reader of the node takes its indices (an inference graph:
only ``getitem(node, 0)`` among its users), the values are a plain maximum that propagates NaN,
the padding masked to -inf: the same value as the take chain (its ``arg == -1`` clause only ever
took a first position, where ``best`` is the initial -inf; its ``inside`` clause refused only
positions whose masked -inf changes nothing), the first of equal values kept as eager does
(strict ``>``, so of -0.0 and 0.0 the first). The first position starts the chain. Each step is
spelled ``bigger = value > best ? value : best; best = isnan(value) ? value : bigger``, two
selects in that order, not ``ops.maximum``: GCC turns ``value > best || isnan(value)`` (one
unordered compare) into a branch on the data in the scalar loop, which mispredicts on every new
maximum and keeps the loop from vectorizing (the static stem kernel ran 7% slower than with the
take chain, the previous attempt's finding), while the plain ``>`` select is a ``maxss`` and the
NaN select a blend: the loop vectorizes (ResNet-stem pool at batch 2, one thread: 6.0 -> 2.2 ms
static, 9.9 -> 2.9 ms with symbolic sizes). On the GPU the two selects need no rounding to
bfloat16 after each step (``ops.maximum`` of a half type is rounded as every half op is; a
select is exact). Option ``pool_values_max`` (PassOptions); the decision is logged under
``passes``.

Note [Max pooling backward as a gather]: ``max_pool2d_with_indices_backward`` is a Pointwise over
the *input*: each input element sums the gradients of the output windows that chose it (their saved
index equals its flat ``h * W + w``). The windows that can cover row ``h`` are ``oh`` with
``oh * s <= h + p <= oh * s + (k - 1) * d``, at most ``(k - 1) * d // s + 1`` of them, the last being
``(h + p) // s``; the body visits exactly that many candidates per dimension (``top - a``), masked
where a candidate falls outside the output, and the index comparison does the rest (a dilated
window that skips ``h`` never chose it). No scatter, no atomics: it fuses with the ReLU/BatchNorm
backward that reads it and with the gradient it reads, in either layout, and each element's sum
runs in the same window order as eager's CUDA kernel, accumulated in float32 for 16-bit types.
Candidate sets over ``_MAX_GATHER`` stay extern calls. With 2x2 windows of stride 2 there is one
candidate and no mask: a pure pointwise read of the gradient.

Note [Overlapping max pooling backward on the CPU]: where windows overlap (several candidates per
element, :func:`candidate_windows`), a graph for a code generator that says its gathers stay scalar
(``Backend.scalar_gathers``: the C++ one) runs eager's scatter as an extern call instead of the gather (option ``pool_backward``: ``"force"`` keeps the gather, ``False`` sends every max-pool
backward to eager). The gather visits every *input* element and each of its candidates, a masked
load of the saved index and of the gradient at an index that is a floor division of the loop
variable: gcc does not vectorize those masked loads (``-fopt-info-vec``: "data ref analysis
failed"), so the kernel runs scalar, and the gradient's producer (ReLU/BatchNorm backward) inlined
into it is evaluated once per candidate. Eager's scatter visits each *output* element once.
Measured on ResNet's stem pool (3x3, stride 2, pad 1, [2, 32, 32, 32], one thread, fastest of 15
steps): the fused gather 0.58 ms, 0.54 ms with its gradient realized first (0.24 ms called alone
with the inputs in cache), eager's kernel 0.02 ms. On the GPU the gather stays (coalesced, no
atomics; Note [Max pooling backward as a gather]); on the CPU one candidate (2x2 stride 2) is a
plain pointwise read that vectorizes, and stays a kernel. The rule goes by the generator, not the
device: Triton graphs of CPU tensors (its interpreter, the OpInfo sweep) keep the gather the GPU runs.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx

from ..indexing import FloorDiv
from ..ir import Index, Pointwise, TensorBox
from ..lowering import Unsupported, register_lowering
from ..virtualized import ops

aten = torch.ops.aten
log = logging.getLogger("kiln.loopir.passes")

_MAX_WINDOW = 64
_MAX_GATHER = 25  # candidate output windows per input element (Note [Max pooling backward as a gather])
_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


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

    def plain_max(index: Index) -> Any:
        *outer, i, j = index
        best: Any = None
        for a in range(kh):
            for b in range(kw):
                row = i * sh - ph + a * dh
                col = j * sw - pw + b * dw
                if may_leave:
                    inside = ops.logical_and(_in_range(row, height), _in_range(col, width))
                    value = ops.masked(inside, lambda r=row, c=col: load([*outer, r, c]), float("-inf"))
                else:
                    value = load([*outer, row, col])
                if best is None:
                    best = value
                else:  # Note [Max pooling values without their indices]: max first, NaN after
                    bigger = ops.where(ops.gt(value, best), value, best)
                    best = ops.where(ops.isnan(value), value, bigger)
        return best

    device = x.get_device()
    if _indices_dead():
        log.info("max_pool2d %sx%s: indices unread, values as a plain maximum", kh, kw)
        values = Pointwise(device, dtype, plain_max, out_size)
    else:
        values = Pointwise(device, dtype, lambda index: window(index)[0], out_size)
    indices = Pointwise(device, torch.int64, lambda index: window(index)[1], out_size)
    return TensorBox.create(values), TensorBox.create(indices)


def candidate_windows(
    kernel_size: Sequence[int], stride: Sequence[int], dilation: int | Sequence[int]
) -> tuple[int, int]:
    """How many output windows can cover one input row and one input column (Note [Max pooling
    backward as a gather])."""
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, default=(kh, kw))
    dh, dw = _pair(dilation)
    return (kh - 1) * dh // sh + 1, (kw - 1) * dw // sw + 1


def overlapping_pool_backwards(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The ``max_pool2d_with_indices_backward`` nodes of ``gm`` whose input elements each have more
    than one candidate window (Note [Overlapping max pooling backward on the CPU])."""
    found = []
    for node in gm.graph.nodes:
        if node.target is aten.max_pool2d_with_indices_backward.default:
            kernel_size, stride = node.args[2], node.args[3]
            dilation = node.args[5] if len(node.args) > 5 else 1
            wh, ww = candidate_windows(kernel_size, stride, dilation)
            if wh * ww > 1:
                found.append(node)
    return found


@register_lowering(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(
    grad: TensorBox,
    x: TensorBox,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: int | Sequence[int],
    dilation: int | Sequence[int],
    ceil_mode: bool,
    indices: TensorBox,
) -> TensorBox:
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, default=(kh, kw))
    ph, pw = _pair(padding)
    wh, ww = candidate_windows(kernel_size, stride, dilation)
    if wh * ww > _MAX_GATHER:
        raise Unsupported(
            f"max_pool2d backward: {wh}x{ww} candidate windows per element is too many to unroll"
        )
    dtype = grad.get_dtype()
    if not dtype.is_floating_point:
        raise Unsupported("max_pool2d backward of integer tensors stays an extern call")
    size = list(x.get_size())
    height, width = size[-2], size[-1]
    out_h, out_w = grad.get_size()[-2], grad.get_size()[-1]
    # the last candidate (h + p) // s can pass the output's end only where the input reaches past it
    top_may_leave = not _static_below(height, ph, sh, out_h)
    left_may_leave = not _static_below(width, pw, sw, out_w)
    load_grad, load_index = grad.make_loader(), indices.make_loader()
    acc = _WIDE.get(dtype, dtype)

    def body(index: Index) -> Any:
        *outer, h, w = index
        flat = ops.index_expr(h * width + w, torch.int64)
        total: Any = None
        top, left = FloorDiv(h + ph, sh), FloorDiv(w + pw, sw)
        for a in range(wh):
            for b in range(ww):
                oh, ow = top - a, left - b
                conds = [
                    *([_at_least_zero(oh)] if a else []),
                    *([_below(oh, out_h)] if top_may_leave else []),
                    *([_at_least_zero(ow)] if b else []),
                    *([_below(ow, out_w)] if left_may_leave else []),
                ]

                def pick(oh: Any = oh, ow: Any = ow) -> Any:
                    chosen = ops.eq(load_index([*outer, oh, ow]), flat)
                    value = ops.to_dtype(load_grad([*outer, oh, ow]), acc)
                    return ops.where(chosen, value, ops.constant(0.0, acc))

                if conds:
                    mask = conds[0]
                    for c in conds[1:]:
                        mask = ops.logical_and(mask, c)
                    term = ops.masked(mask, pick, 0.0)
                else:
                    term = pick()
                total = term if total is None else ops.add(total, term)
        return ops.to_dtype(total, dtype)

    return TensorBox.create(Pointwise(x.get_device(), dtype, body, tuple(size)))


def _indices_dead() -> bool:
    """Whether the node being lowered is a max-pool whose indices nothing reads, and the option
    allows the plain maximum (Note [Max pooling values without their indices])."""
    from ..virtualized import current_graph

    graph = current_graph()
    node = getattr(graph, "current_node", None)
    if not getattr(graph, "pool_values_max", False) or node is None:
        return False
    if node.target is not aten.max_pool2d_with_indices.default:
        return False
    return all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)


def _static_below(size: Any, pad: int, stride: int, out: Any) -> bool:
    """Whether ``(h + pad) // stride < out`` for every ``h < size``, known from integer sizes."""
    size, out = sympy.sympify(size), sympy.sympify(out)
    return bool(size.is_Integer and out.is_Integer and (int(size) - 1 + pad) // stride < int(out))


def _at_least_zero(expr: Any) -> Any:
    return ops.ge(ops.index_expr(expr, torch.int64), ops.constant(0, torch.int64))


def _below(expr: Any, hi: Any) -> Any:
    upper = (
        ops.constant(int(hi), torch.int64)
        if sympy.sympify(hi).is_Integer
        else ops.index_expr(hi, torch.int64)
    )
    return ops.lt(ops.index_expr(expr, torch.int64), upper)


def _in_range(expr: Any, hi: Any) -> Any:
    return ops.logical_and(_at_least_zero(expr), _below(expr, hi))


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
