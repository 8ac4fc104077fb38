"""Which small convolutions of a CPU training graph run PyTorch's native kernel instead of oneDNN.

Note [Small convolutions outside oneDNN]: on the CPU, eager's ``convolution`` and
``convolution_backward`` go through oneDNN, whose calls carry a fixed cost a convolution of a few
thousand outputs never earns back: at one thread here (AMD EPYC, AVX2) about 50 us a forward and
110-120 us a backward, whatever the size below ~0.2M multiply-adds, where PyTorch's own
im2col-and-GEMM kernel (``_slow_conv2d_forward`` / ``_slow_conv2d_backward``, the path eager
takes with oneDNN off) takes 10-15 us and 17-25 us. PVT v2's eleven convolutions at 32 px
(patch embeddings and spatial-reduction convolutions of 37k-150k multiply-adds, and depthwise
ones) were 1.8 ms of its 5 ms training step; torch.compile calls the same oneDNN kernels. Single
convolutions, forward + backward, native / oneDNN time (kiln_codegen_cpp's ``bench/small_conv.py``):
3->8 7x7/4 at 32 px 0.43, 8->16 3x3/2 at 8 px 0.20, 16->32 3x3/2 at 4 px 0.22, 8->8 8x8/8 at 8 px
0.23, 16->16 4x4/4 at 4 px 0.19; larger ones turn the other way (16->16 3x3 at 32 px, 4.7M
multiply-adds: 1.48; 64->64 3x3 at 16 px, 19M: 1.32). Depthwise convolutions are much slower
natively (10x) and grouped ones are not offered to the native kernel. In bfloat16 the native
kernel is no win (0.5x on the smallest, 1.0-1.15x on PVT's others, 3-6x slower at 16-32 px): float32 only.

So a CPU training graph's 2-D convolution (forward, and its backward) runs natively when it is
float32, not grouped, transposed or dilated, of static sizes, with a contiguous weight, at most
:data:`NATIVE_CONV_MAX_MACS` multiply-adds, and not chosen for channels-last (Note [Channels-last
for convolutions]; a training graph of such convolutions keeps eager's layouts: Note [Small
convolutions keep eager's layouts in CPU training] in channels_last.py). The lowering hands the
native kernel its input (and the backward its gradient) NCHW, computed so where the value is
still lazy, else copied (a few thousand elements: the native backward refuses a channels-last
input); a gradient format chosen for oneDNN (Note [A convolution backward's gradient in oneDNN's
format]) is dropped for it. The same arithmetic (an im2col GEMM instead of oneDNN's direct
kernel), so results agree to rounding: eager's own float32 step with oneDNN off. Where a model's
gradients are rounding noise to begin with (LeViT's first weight at 32 px: eager's float32 error
against float64 20x the gradient through oneDNN, 900x through the native kernel), kiln's follow
the native kernel's. Training steps at one thread, native / oneDNN (``bench/train1.py --clock
cpu``, 40 interleaved steps, both orders): PVT v2 0.81-0.82, ResNet (breadth) 0.55-0.56,
PoolFormer 0.67-0.70, ConvNeXt 0.87-0.88, ConvNeXt V2 0.87-0.88, LeViT 0.82-0.86 and MobileViT
0.92-0.95 (with the next Note's layouts), the others of the breadth and public CNNs within noise
(results ``2026-12-07-cpu-s32-*``). Inference graphs keep oneDNN (the conv_fusion pass prepacks and fuses
there; not measured). ``native_small_conv=False`` keeps every convolution on oneDNN;
``KILN_LOG=passes`` prints each one moved.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from . import PassContext
from .channels_last import conv2d_nodes, conv_backward_nodes

aten = torch.ops.aten

# multiply-adds of one call (output elements x input channels x kernel positions) up to which the
# native kernel is used: below the crossover measured in the Note, with a margin
NATIVE_CONV_MAX_MACS = 1 << 20


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _static(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and all(isinstance(s, int) for s in (*t.shape, *t.stride()))


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _candidate(node: torch.fx.Node) -> tuple[int, str] | None:
    """(multiply-adds, shape text) of a convolution or convolution backward the native kernel can
    run; None otherwise."""
    backward = node.target is aten.convolution_backward.default
    args = list(node.args)
    if backward:  # grad, input, weight, bias_sizes, stride, padding, dilation, transposed, ..., groups
        if len(args) < 11:
            return None
        out, x, w = _val(args[0]), _val(args[1]), _val(args[2])
        dilation, transposed, groups = args[6], args[7], args[9]
    else:  # input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
        if len(args) < 9:
            return None
        out, x, w = _val(node), _val(args[0]), _val(args[1])
        dilation, transposed, groups = args[5], args[6], args[8]
    if not all(_static(t) and t.dtype == torch.float32 and t.dim() == 4 for t in (out, x, w)):
        return None
    if transposed is not False or groups != 1 or _ints(dilation) != [1, 1]:
        return None
    if not w.is_contiguous():
        return None
    _, cin, kh, kw = w.shape
    macs = out.numel() * cin * kh * kw
    return macs, f"{list(x.shape)} by {list(w.shape)}"


def small_enough(node: torch.fx.Node) -> bool:
    """Whether the native kernel can run convolution (or backward) ``node`` and it is small
    enough to gain by it (Note [Small convolutions outside oneDNN])."""
    found = _candidate(node)
    return found is not None and found[0] <= NATIVE_CONV_MAX_MACS


def native_conv_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Record in ``ctx.native_convs`` the convolutions (and backwards) that run the native kernel
    (Note [Small convolutions outside oneDNN]); the graph is unchanged. Runs after the layout
    pass, whose choices it leaves alone."""
    if ctx.device.type != "cpu" or ctx.inference:
        return gm
    for node in [*conv2d_nodes(gm), *conv_backward_nodes(gm)]:
        if node in ctx.channels_last or node in ctx.nchw_conv_backwards:
            continue
        found = _candidate(node)
        if found is None:
            continue
        macs, shapes = found
        if macs > NATIVE_CONV_MAX_MACS:
            continue
        ctx.native_convs.add(node)
        ctx.conv_grad_formats.pop(node, None)  # the native kernel takes its gradient NCHW
        ctx.note("native_small_conv", "%s: %s, %d multiply-adds: native kernel", node.name, shapes, macs)
    return gm
