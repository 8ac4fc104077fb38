"""The patch-convolution pass: a convolution whose kernel tiles its input is a GEMM.

Note [Patch convolutions as GEMMs]: vision transformers cut the image into patches with a
convolution whose stride equals its kernel size and which has no padding (ViT, DeiT, BEiT, CLIP
and SigLIP's vision towers: 16x16 or 14x14 patches of 3 channels; Swin's and ConvNeXt's stems:
4x4). Each output pixel then reads its own patch and no other: the convolution is the product of
the patches, one row per output pixel and ``C*kh*kw`` columns, with the weight seen as ``(O,
C*kh*kw)``. cuDNN runs it badly: on the H200 (thirteenth session, ViT at gpu size, bf16) its kernel
took 0.23 ms for 7.4 GFLOP, with two NCHW->NHWC conversions beside it, 0.32 ms a call, 19% of
ViT's GPU time, where a GEMM of that size takes about 0.01 ms; and its NCHW result made the two
layer norms that read it across channels run at 15% and 31% of copy bandwidth. So on CUDA

    convolution(x, w, b, stride=(kh, kw), padding=0, dilation=1, groups=1)   # w: (O, C, kh, kw)

becomes

    patches = x.view(N, C, H', kh, W', kw).permute(0, 2, 4, 1, 3, 5)       # a view
              .clone(contiguous).view(N*H'*W', C*kh*kw)                      # one copy kernel
    addmm(b, patches, w.view(O, C*kh*kw).t()).view(N, H', W', O).permute(0, 3, 1, 2)

whose result is the convolution's (N, O, H', W') with channels-last strides: a reader that wants
(N, H'*W', O), as every vision transformer's does, reads it contiguously. Where the result is a
graph output, the output is a contiguous copy, with the strides the convolution gave it. Rows the convolution
drops (H or W not a multiple of the kernel) are sliced off first. Values are eager's up to the
order of the sum over a patch. Only static sizes, 4-D floating inputs, and a contiguous weight
(its view must not copy). The copy of the patches reads rows of ``kw`` input elements: where a row
is shorter than a 32-byte sector the reads waste most of each sector, so such a convolution is
rewritten only when its input has at most 4 channels (an image: a few MB, and cuDNN would convert
it too); ConvNeXt's 2x2 downsampling convolutions over 96-768 channels stay convolutions, which
the layout pass runs in NHWC. Not on the CPU by default (oneDNN runs such convolutions well and its
result layout is what the CPU layout rule plans for); ``patch_conv="force"`` rewrites on any device
(tests), ``False`` never.
"""

from __future__ import annotations

import torch
import torch.fx

from . import PassContext, copy_graph
from .pad_mm import _val, _with_val, reads_strides, views_of

aten = torch.ops.aten


def _ints(values: object, n: int) -> list[int] | None:
    if isinstance(values, int):
        return [values] * n
    if isinstance(values, list | tuple) and len(values) == n and all(type(v) is int for v in values):
        return list(values)
    return None


def is_patch_conv(node: torch.fx.Node) -> bool:
    """A 2-D convolution whose kernel tiles its input (Note [Patch convolutions as GEMMs])."""
    if node.op != "call_function" or node.target is not aten.convolution.default or len(node.args) < 9:
        return False
    x, w, _bias, stride, padding, dilation, transposed, _output_padding, groups = node.args[:9]
    xv, wv, out = _val(x), _val(w), _val(node)
    if not all(isinstance(v, torch.Tensor) for v in (xv, wv, out)):
        return False
    if xv.dim() != 4 or wv.dim() != 4 or not xv.dtype.is_floating_point or transposed or groups != 1:
        return False
    sizes = [*xv.shape, *wv.shape, *xv.stride(), *wv.stride()]
    if not all(type(s) is int for s in sizes):  # symbolic: not here
        return False
    kh, kw = int(wv.shape[2]), int(wv.shape[3])
    if _ints(stride, 2) != [kh, kw] or _ints(padding, 2) != [0, 0] or _ints(dilation, 2) != [1, 1]:
        return False
    # Note [Patch convolutions as GEMMs]: the patch copy reads rows of kw elements; shorter than a
    # 32-byte sector, only an image's few channels are worth it (ConvNeXt's 2x2 downsampling of
    # 96-768 channels stays a convolution, which the layout pass runs in NHWC)
    rows_long = kw * xv.element_size() >= 32
    return (
        bool(wv.is_contiguous())
        and xv.shape[2] >= kh
        and xv.shape[3] >= kw
        and (xv.shape[1] <= 4 or rows_long)
    )


def patch_conv_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Note [Patch convolutions as GEMMs]."""
    found = [n for n in gm.graph.nodes if is_patch_conv(n)]
    if not found:
        return gm
    if ctx.device.type != "cuda" and ctx.options.patch_conv != "force":
        ctx.note("patch_conv", "keep %d patch convolutions: not on CUDA (%s)", len(found), ctx.device.type)
        return gm
    copied, env = copy_graph(gm)
    graph = copied.graph
    for original in found:
        node = env[original]
        x, w, bias = node.args[:3]
        assert isinstance(x, torch.fx.Node) and isinstance(w, torch.fx.Node)
        n, c, h, wd = (int(s) for s in _val(x).shape)
        o, _, kh, kw = (int(s) for s in _val(w).shape)
        oh, ow = h // kh, wd // kw

        def call(op: object, *args: object, **kwargs: object) -> torch.fx.Node:
            return _with_val(graph.call_function(op, args, kwargs))  # type: ignore[arg-type]

        with graph.inserting_before(node):
            src = x
            if oh * kh != h:
                src = call(aten.slice.Tensor, src, 2, 0, oh * kh)
            if ow * kw != wd:
                src = call(aten.slice.Tensor, src, 3, 0, ow * kw)
            split = call(aten.view.default, src, [n, c, oh, kh, ow, kw])
            moved = call(aten.permute.default, split, [0, 2, 4, 1, 3, 5])
            dense = call(aten.clone.default, moved, memory_format=torch.contiguous_format)
            patches = call(aten.view.default, dense, [n * oh * ow, c * kh * kw])
            flat_w = call(aten.view.default, w, [o, c * kh * kw])
            w_t = call(aten.permute.default, flat_w, [1, 0])
            if isinstance(bias, torch.fx.Node):
                product = call(aten.addmm.default, bias, patches, w_t)
            else:
                product = call(aten.mm.default, patches, w_t)
            pixels = call(aten.view.default, product, [n, oh, ow, o])
            out = call(aten.permute.default, pixels, [0, 3, 1, 2])
        for made in (dense, product, out):
            made.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        outputs = [u for u in node.users if u.op == "output"]
        # Note [Readers of a GEMM's strides] (pad_mm.py), and an output that is a view of the
        # result (`conv(x).flatten(2).reshape(...)` returned): the view of the NHWC result has
        # other strides than the view of eager's NCHW one (layout fuzz seed 1130)
        strided = reads_strides(node) or _output_through_views(node)
        eager = _val(node)
        node.replace_all_uses_with(out)
        if (outputs or strided) and eager.is_contiguous() and not _val(out).is_contiguous():
            # a result the caller sees, or `as_strided` reads, keeps the convolution's strides
            with graph.inserting_after(out):
                shown = call(aten.clone.default, out, memory_format=torch.contiguous_format)
            for user in list(out.users) if strided else outputs:
                if user is not shown:
                    user.replace_input_with(out, shown)
        graph.erase_node(node)
    ctx.note("patch_conv", "%d patch convolutions computed as GEMMs", len(found))
    graph.lint()
    copied.recompile()
    return copied


def _output_through_views(node: torch.fx.Node) -> bool:
    """Whether a view of ``node``'s value (through view ops only) is a graph output."""
    return any(u.op == "output" for view in views_of(node)[1:] for u in view.users)


__all__ = ["is_patch_conv", "patch_conv_pass"]
