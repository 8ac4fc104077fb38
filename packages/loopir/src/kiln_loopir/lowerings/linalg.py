"""Matrix-product and convolution lowerings: ``addmm`` as a GEMM whose bias joins the pointwise
code after it; ``convolution`` and ``convolution_backward`` with their inputs in the layout the graph
chose for them.

Note [Bias after the GEMM]: eager's ``addmm(bias, a, b)`` first copies the broadcast bias into the
output and then accumulates ``a @ b`` onto it (beta=1): one extra pass over the output for the
copy, and the GEMM reads what it writes. When every reader of the result is pointwise (GELU,
the residual add before a layer norm), kiln calls ``mm`` instead and leaves ``+ bias`` as a lazy
Pointwise, which the scheduler fuses into those readers: the copy is gone and the bias costs a
load in a kernel that runs anyway. When the result feeds another extern (attention, a second
GEMM) or leaves the graph, nothing would absorb the add, so ``addmm`` stays whole. Float only,
with beta = alpha = 1; the sum is rounded once more than in eager for bfloat16/float16 (as
inductor does it), which is within those dtypes' tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from .. import sizevars
from ..indexing import contiguous_strides
from ..ir import ReinterpretView, StorageBox, TensorBox, realize_strided
from ..layout import FixedLayout
from ..lowering import VIEW_OPS, copy_with_strides, fallback, find_lowering, register_lowering
from ..virtualized import current_graph

aten = torch.ops.aten


def _readers_are_pointwise(node: torch.fx.Node, depth: int = 0) -> bool:
    if not node.users or depth > 4:
        return False
    for user in node.users:
        target = user.target
        if target in VIEW_OPS:  # a pointwise reader behind a view still absorbs the add
            if not _readers_are_pointwise(user, depth + 1):
                return False
        elif not (isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags):
            return False
    return True


@register_lowering(aten.addmm.default)
def addmm(bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    graph = current_graph()
    node, meta = graph.current_node, graph.current_meta
    split = (
        beta == 1
        and alpha == 1
        and isinstance(bias, TensorBox)
        and meta.dtype.is_floating_point
        and node is not None
        and _readers_are_pointwise(node)
    )
    if not split:
        return fallback(aten.addmm.default, (bias, a, b), {"beta": beta, "alpha": alpha}, meta)
    product = fallback(aten.mm.default, (a, b), {}, meta)
    add = find_lowering(aten.add.Tensor)
    assert add is not None
    return add(product, bias)


def _channels_last_strides(size: list[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    _, c, h, w = size
    return (h * w * c, sympy.Integer(1), w * c, c)


def _as_channels_last(x: TensorBox) -> TensorBox:
    """``x`` in NHWC memory: itself when it already is, else a copy (one kernel).

    Sizes and strides may be expressions in size symbols (a batch of images of any size):
    a stride counts as NHWC's only when it provably equals it (Note [Symbolic sizes in loopir]);
    a size symbol is never 1 (Note [0/1 specialization] in kiln_symbolic)."""
    return _with_strides(x, _channels_last_strides)


def _with_strides(x: TensorBox, strides_of: Callable[[list[Any]], Sequence[Any]]) -> TensorBox:
    """``x`` when its realized strides provably are ``strides_of(size)`` (size-1 dims aside),
    else a copy in them."""
    size = [sympy.sympify(s) for s in x.get_size()]
    stride = realize_strided(x).layout.stride
    wanted = strides_of(size)
    known = sizevars.current()
    if all(
        known.statically_known_equals(st, w) for st, w, n in zip(stride, wanted, size, strict=True) if n != 1
    ):
        return x
    return copy_with_strides(x, wanted)


def _pair(value: Any) -> Any:
    """A 2-D convolution's stride or padding as the two numbers the native kernels take:
    ``aten.convolution`` also accepts one number for both dims (``padding="valid"`` reaches it as
    ``[0]``), ``_slow_conv2d_*`` refuses it ("2D padding expected")."""
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return [value[0], value[0]]
    return value


@register_lowering(aten.convolution.default)
def convolution(x: Any, weight: Any, bias: Any, *rest: Any) -> Any:
    # Note [Channels-last for convolutions] (graph.py): the input goes in NHWC when the graph
    # chose that layout for this convolution; otherwise this is the plain extern call
    graph = current_graph()
    node, meta = graph.current_node, graph.current_meta
    if node in graph.native_convs:  # Note [Small convolutions outside oneDNN]
        stride, padding = _pair(rest[0]), _pair(rest[1])
        kernel = [int(k) for k in weight.get_size()[2:]]
        x = _native_input(x, node.args[0]) if isinstance(x, TensorBox) else x
        return fallback(
            aten._slow_conv2d_forward.default, (x, weight, kernel, bias, stride, padding), {}, meta
        )
    if node in graph.channels_last and isinstance(x, TensorBox) and len(x.get_size()) == 4:
        x = _as_channels_last(x)
        transposed = rest[3] if len(rest) > 3 else False
        if graph.nhwc_weights and not transposed:  # Note [Convolution weights in NHWC]
            weight = _nhwc_weight(weight)
    return fallback(aten.convolution.default, (x, weight, bias, *rest), {}, meta)


def _nhwc_weight(weight: Any) -> Any:
    if isinstance(weight, TensorBox) and len(weight.get_size()) == 4:
        return _as_channels_last(weight)
    return weight


@register_lowering(aten.convolution_backward.default)
def convolution_backward(grad: Any, x: Any, weight: Any, *rest: Any, **kwargs: Any) -> Any:
    # Note [Channels-last for convolutions]: cuDNN picks the backward's layout from the input and
    # the weight; an NCHW input (the graph's own image, saved as it came) beside an NHWC gradient
    # made it convert the whole gradient to NCHW and its results back. Both go in NHWC (a copy of
    # the input where it is not, the smaller of the two) when the graph chose NHWC for this node.
    graph = current_graph()
    node, meta = graph.current_node, graph.current_meta
    if node in graph.native_convs:  # Note [Small convolutions outside oneDNN]
        # (bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask)
        stride, padding, mask = _pair(rest[1]), _pair(rest[2]), rest[7]
        kernel = [int(k) for k in weight.get_size()[2:]]
        grad, x = (
            _native_input(t, source) if isinstance(t, TensorBox) else t
            for t, source in ((grad, node.args[0]), (x, node.args[1]))
        )
        return fallback(
            aten._slow_conv2d_backward.output_mask, (grad, x, weight, kernel, stride, padding, mask), {}, meta
        )
    if node in graph.nchw_conv_backwards:  # Note [Depthwise convolution backwards on small maps]
        grad, x = (
            _as_contiguous(t, source) if isinstance(t, TensorBox) else t
            for t, source in ((grad, node.args[0]), (x, node.args[1]))
        )
    elif node in graph.channels_last:
        grad, x = (
            _as_channels_last(t) if isinstance(t, TensorBox) and len(t.get_size()) == 4 else t
            for t in (grad, x)
        )
        # Note [Convolution weights in NHWC]: (bias_sizes, stride, padding, dilation, transposed,
        # output_padding, groups, output_mask); the weight's values are read for grad_input only
        transposed = rest[4] if len(rest) > 4 else kwargs.get("transposed", False)
        mask = rest[7] if len(rest) > 7 else kwargs.get("output_mask", (True, True, True))
        if graph.nhwc_weights and not transposed and mask[0]:
            weight = _nhwc_weight(weight)
    elif node in graph.conv_grad_formats and isinstance(grad, TensorBox):
        _free_layout(grad, graph.conv_grad_formats[node], node.args[0])
    return fallback(aten.convolution_backward.default, (grad, x, weight, *rest), kwargs, meta)


def _as_contiguous(x: TensorBox, source: Any) -> TensorBox:
    """``x`` (the value of fx node ``source``) in NCHW memory: a lazy value computed so where
    its layout is the lowering's to choose (Note [A layout only lowerings read]), a realized one
    kept when it already is, else copied (one kernel)."""
    _free_layout(x, torch.contiguous_format, source)
    return _with_strides(x, contiguous_strides)


# Note [Size-1 dims and the native kernels' layouts]: a value over a 1x1 map is NCHW and NHWC at
# once, and loopir's layout checks ignore the strides of size-1 dims. torch's native convolution
# kernels do not: they pick their memory format by ``suggest_memory_format``, which reads those
# strides too, and the backward's channels-last path refuses its own weight gradient ("slow_conv2d:
# grad_weight must be contiguous"). The saved input of a convolution over a 1x1 map came with
# eager's channels-last strides (6, 1, 6, 6), the same memory as (6, 1, 1, 1), and the backward
# failed at run time (CPU convolution fuzzer seed 1043). The native kernels get their inputs
# through a view with exactly NCHW's strides: the same memory, no copy.
def _native_input(x: TensorBox, source: Any) -> TensorBox:
    """``x`` (the value of fx node ``source``) as torch's native convolution kernels must get it:
    NCHW, with NCHW's strides on size-1 dims too (Note [Size-1 dims and the native kernels'
    layouts])."""
    x = _as_contiguous(x, source)
    base = realize_strided(x)
    size = [sympy.sympify(n) for n in base.get_size()]
    wanted = tuple(contiguous_strides(size))
    known = sizevars.current()
    if all(known.statically_known_equals(st, w) for st, w in zip(base.layout.stride, wanted, strict=True)):
        return x
    buffer = base.buffer if isinstance(base, ReinterpretView) else base
    layout = FixedLayout(base.get_device(), base.get_dtype(), tuple(size), wanted, base.layout.offset)
    return TensorBox(ReinterpretView(buffer, layout))


# Note [A layout only lowerings read]: a lowering that wants its input in one memory format (the
# native convolution kernels NCHW, Note [Small convolutions outside oneDNN]; a convolution
# backward's gradient in oneDNN's format) has a value still lazy computed in that format, rather
# than computed in eager's strides (``hint_eager_strides``) and copied. That is the lowering's
# choice only while nothing else sees the value's memory: not when the value, or a view of its
# storage, is one of the user's outputs (eager's strides are part of the result), nor when
# ``as_strided`` reads it through its storage with eager's strides. A graph that runs no node
# channels-last does not check its outputs' strides (``GraphLowering._eager_strides``): with a
# channels-last input, ``t = x * 2`` returned and read by a small convolution came back NCHW
# (layout fuzzer seed 1404, CPU defaults too), and ``t.as_strided(...)`` after the convolution
# read its elements in the wrong order, a wrong answer. Such a value keeps eager's layout
# (``GraphLowering.keeps_eager_layout``) and the convolution reads a copy (one kernel over a
# small map, what the output would have needed anyway).
def _free_layout(x: TensorBox, memory_format: torch.memory_format, source: Any) -> None:
    """Note [A convolution backward's gradient in oneDNN's format]: a lazy 4-D value (not yet a
    buffer, not a view) is given ``memory_format``'s strides for when it is realized; anything
    else keeps its layout, as does the value of an fx node ``source`` whose layout is eager's to
    keep (Note [A layout only lowerings read])."""
    storage = x.data
    if not isinstance(storage, StorageBox) or storage.is_realized() or len(x.get_size()) != 4:
        return
    if current_graph().keeps_eager_layout(source):
        return
    size = [sympy.sympify(s) for s in x.get_size()]
    if memory_format == torch.channels_last:
        storage.stride_hint = _channels_last_strides(size)
    else:
        storage.stride_hint = tuple(contiguous_strides(size))
