"""The convolution-bias pass: on CUDA a convolution's bias is added after it, in generated code.

Note [Convolution bias after the convolution]: cuDNN (and PyTorch's own depthwise kernels) add a
convolution's bias in a separate elementwise kernel after the convolution: one more launch and
one more read and write of the whole output per convolution. ConvNeXt-style blocks have a
depthwise convolution with a bias in every block (22 per ConvNeXt-T), each followed by a layer
norm. So on CUDA ``convolution(x, w, b, ...)`` becomes

    convolution(x, w, None, ...) + b.view(C, 1, ..., 1)

and the add is a lazy pointwise in loopir, which the scheduler fuses into whatever reads the
result (the layer norm's reductions, a BatchNorm/ReLU epilogue): the bias costs a load in a
kernel that runs anyway. torch.compile does the same on GPUs. Values are eager's up to rounding:
in bfloat16/float16 the convolution's result is rounded before the bias is added (once more than
cuDNN rounds), within those dtypes' tolerance; float32 and float64 add in their own precision.
Not on the CPU, where oneDNN applies the bias inside the convolution for free (and the CPU
convolution fusion pass folds it with BatchNorm). ``conv_bias=False`` keeps every bias in the
convolution; ``"force"`` peels it on any device (tests).

Note [Convolution bias gradients in generated code]: the backward's mirror image. A
``convolution_backward`` asked for the bias's gradient (``output_mask[2]``) computes it on CUDA
with PyTorch's generic reduction over every dimension but the channels: on the H100, ConvNeXt's
bf16 training step ran 22 of them (``at::native::reduce_kernel``) for 0.60 ms, 27 us each, a
separate pass over each gradient, where torch.compile's step had none. So on CUDA the pass asks the
convolution backward for the input's and the weight's gradients only and computes the bias's as
``sum(grad_output, [0, 2, ...])`` (the channel dimension kept), a generated column sum (split
as any, Note [Split reductions] in kiln_codegen_triton; not fused with the kernel that computes
``grad_output``, which the convolution backward needs in memory: that kernel's stores and the
sum's loads are not aligned, see ``Scheduler.can_fuse_vertical``). Same value up to the order of the sums (both accumulate in float32 and
round once to the gradient's dtype). Not on the CPU, where oneDNN's backward yields the bias
gradient from the pass it makes anyway. ``conv_bias_grad=False`` keeps it in the convolution
backward; ``"force"`` moves it on any device (tests).
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from . import PassContext, copy_graph
from .pad_mm import _val, _with_val

aten = torch.ops.aten


def candidates(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Convolutions with a bias whose result is a floating tensor of known rank."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.convolution.default:
            continue
        bias = node.args[2] if len(node.args) > 2 else None
        val, bias_val = _val(node), _val(bias)
        if (
            isinstance(bias, torch.fx.Node)
            and isinstance(val, torch.Tensor)
            and isinstance(bias_val, torch.Tensor)
            and val.dtype.is_floating_point
            and bias_val.dim() == 1
            and val.dim() >= 3
        ):
            found.append(node)
    return found


def conv_bias_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Add each convolution's bias after it, on CUDA (Note [Convolution bias after the
    convolution])."""
    found = candidates(gm)
    if not found:
        return gm
    if ctx.device.type != "cuda" and ctx.options.conv_bias != "force":
        ctx.note(
            "conv_bias", "keep %d biases in their convolutions: not on CUDA (%s)", len(found), ctx.device.type
        )
        return gm
    copied, env = copy_graph(gm)
    graph = copied.graph
    for original in found:
        node = env[original]
        x, w, bias, *rest = node.args
        assert isinstance(bias, torch.fx.Node)
        rank = _val(node).dim()
        with graph.inserting_before(node):
            # Note [A peeled convolution keeps its layout]: the convolution without its bias and
            # the sum both take the original's value, strides included, rather than one
            # recomputed on the meta device: a convolution's meta kernel picks its result's
            # memory format by the device (on "meta", always contiguous), so a channels-last
            # convolution came out contiguous, and a graph output it reached left in other
            # strides than eager's (a channels-last input's result returned NCHW).
            conv = graph.call_function(aten.convolution.default, (x, w, None, *rest))
            conv.meta["val"] = _val(node)
            shape = [int(_val(bias).shape[0])] + [1] * (rank - 2)
            view = _with_val(graph.call_function(aten.view.default, (bias, shape)))
            out = graph.call_function(aten.add.Tensor, (conv, view))
            out.meta["val"] = _val(node)
        out.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        conv.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        node.replace_all_uses_with(out)
        graph.erase_node(node)
    ctx.note("conv_bias", "%d convolution biases added after their convolutions", len(found))
    graph.lint()
    copied.recompile()
    return copied


def grad_candidates(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Convolution backwards asked for a bias gradient whose every reader takes one item of the
    result (``getitem``), with a floating gradient of known rank."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.convolution_backward.default:
            continue
        if len(node.args) < 11 or node.kwargs:
            continue
        mask, val = node.args[10], _val(node)
        if not (isinstance(mask, (list, tuple)) and len(mask) == 3 and mask[2]):
            continue
        if not (isinstance(val, (list, tuple)) and len(val) == 3 and isinstance(val[2], torch.Tensor)):
            continue
        grad = _val(node.args[0])
        if not (isinstance(grad, torch.Tensor) and grad.dtype.is_floating_point and grad.dim() >= 3):
            continue
        if all(u.target is operator.getitem for u in node.users):
            found.append(node)
    return found


def conv_bias_grad_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Compute each convolution backward's bias gradient as a generated sum, on CUDA (Note
    [Convolution bias gradients in generated code])."""
    found = grad_candidates(gm)
    if not found:
        return gm
    if ctx.device.type != "cuda" and ctx.options.conv_bias_grad != "force":
        ctx.note(
            "conv_bias_grad",
            "keep %d bias gradients in their convolution backwards: not on CUDA (%s)",
            len(found),
            ctx.device.type,
        )
        return gm
    copied, env = copy_graph(gm)
    graph = copied.graph
    for original in found:
        node = env[original]
        grad = node.args[0]
        mask = node.args[10]
        assert isinstance(mask, (list, tuple))
        rank = _val(grad).dim()
        gi, gw, gb = _val(node)
        node.args = (*node.args[:10], [mask[0], mask[1], False])
        node.meta["val"] = (gi, gw, None)
        readers = [u for u in node.users if u.args[1] == 2]
        if not readers:
            continue
        with graph.inserting_before(readers[0]):
            total = graph.call_function(aten.sum.dim_IntList, (grad, [0, *range(2, rank)]))
        total.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        total.meta["val"] = gb
        for reader in readers:
            reader.replace_all_uses_with(total)
            graph.erase_node(reader)
    ctx.note("conv_bias_grad", "%d convolution bias gradients computed as sums", len(found))
    graph.lint()
    copied.recompile()
    return copied


__all__ = ["candidates", "conv_bias_grad_pass", "conv_bias_pass", "grad_candidates"]
