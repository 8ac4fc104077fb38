"""The layout pass: which convolutions, and which values around them, are computed channels-last.

Note [Channels-last for convolutions]: a graph either keeps eager's layouts or runs its 2-D
convolutions in NHWC; the choice is made once per graph by the rule of the graph's device
(:data:`POLICIES`; ``options={"layout_policy": "cuda"}`` forces a device's rule, e.g. to test the
CUDA rule on CPU tensors). When NHWC is chosen, each convolution takes its input channels-last
(copied once if it arrives otherwise) and gives channels-last, and so does every 4-D value that
leads into a convolution through layout-preserving ops (:func:`preserves_layout`: pointwise ops,
norms, pooling, resampling, concatenation, keep-dim reductions). BatchNorm, ReLU, pooling and
residual adds between two convolutions are therefore computed in NHWC, and no conversion kernel is
left between two convolutions. The spread stops at ops that reinterpret dimensions (a permute to
[N, H, W, C] for ConvNeXt's LayerNorm, a view, a matmul): NHWC strides on such a value would mean
another dimension order, not channels-last. Graph outputs are copied back to the strides eager
gives them (``GraphLowering._eager_strides``). Weights: oneDNN reorders a contiguous weight itself
when the input is NHWC; on CUDA the graph converts them (next Note).

Note [Convolution weights in NHWC]: given an NHWC input and an NCHW weight, PyTorch's CUDA
``convolution`` and ``convolution_backward`` copy the weight to NHWC inside every call, with its
generic strided copy: on the H100, ResNet-50's bf16 training step ran 33 such copies (one per
convolution of kernel larger than 1x1 in the forward, again in the backward) for 148 us, 4.5 us
each, where torch.compile, which converts weights in its graph, spent 1.8 us a copy kernel. Under
the CUDA rule each channels-last convolution therefore takes its weight through the same
conversion as its input (a generated copy kernel; a 1x1 weight is both layouts and is not copied),
and a ``convolution_backward`` whose ``grad_input`` is wanted likewise (one computing only the
weight's gradient reads the weight for its shape alone). Transposed convolutions keep their
weights as they come. The CPU rule leaves weights alone: oneDNN reorders any weight to its own
blocked format, so an NHWC copy first would be one more pass over it. ``nhwc_weights=False``
turns the conversion off.

The CPU rule (:func:`cpu_policy`): inference graphs, oneDNN present and enabled, and either the
convolutions run through oneDNN with prepacked weights (the conv_fusion pass, Note
[Convolutions through oneDNN], with conv_prepack) or one of them is depthwise (Note [Depthwise
convolutions on the CPU]) or the convolutions' inputs hold at least as many elements as their
weights (a contiguous weight is reordered on every call: on ResNet at 64 px, 0.1 as many, NHWC lost
10%; on the plain CNN, 3.4 as many, it gained 50%). Under a symbolic batch the rule is applied per
call (Note [Both layouts under a symbolic batch]), or, with ``layout_per_batch=False``, at the
batch's smallest value (Note [The CPU rule under a symbolic batch]).

Note [Depthwise convolutions on the CPU]: a graph with a depthwise convolution (one input channel
per group) runs NHWC whatever its sizes: oneDNN's NHWC depthwise kernels beat its NCHW ones by more
than the weight reorders cost, even where the inputs weigh less than the weights. Measured as
below, NHWC / eager layouts at batch 2 / 8 / 32: MobileNetV2 (breadth suite) 0.89 / 0.70 / 0.64,
EfficientNet (breadth) 0.99 / 0.84 / 0.82, ConvNeXt (kiln_bench cpu size) 0.95 / 0.99 / 0.98; the
element-count rule kept all three in eager layouts at batch 2 (MobileNetV2 at batch 8 too).

Note [The CPU rule under a symbolic batch]: the rule's cost, the weight reorder, is paid once per
call and its gain grows with the batch, so with a symbolic batch the inputs are counted at the
smallest batch the graph accepts (the lower end of the batch symbol's range: 2 under
``dynamic=True``, ``kiln.mark_dynamic``'s ``min``), the other dims at their size hints; NHWC is
chosen only when it pays at every batch of the range. Counting at the size hint, i.e. the first
call's batch, made one program's layouts depend on the order of its calls (issue 17: ConvNeXt
compiled at batch 2 kept eager's layouts, at batch 8 chose NHWC). Measured at one thread on
static compiles, NHWC / eager layouts forced by patching ``POLICIES["cpu"]``, batch 2 / 8 / 32
(kiln_bench's cpu-size models, interleaved, medians of 21 calls, a script of the
fifteenth session): ResNet 1.23 / 1.17 / 1.06, CNN 1.00 / 0.88-1.01 / 0.99-1.18 (noisy): without
a depthwise convolution the loss of eager layouts at a large batch is small, NHWC's at a small
batch is not. A symbolic spatial size is counted at its hint (images seldom change size).
This is now the fallback (``layout_per_batch=False``, or batches that are not whole multiples of
one symbol): at a large batch it kept the CNN in eager's layouts, 2x slower (next Note).

Note [Both layouts under a symbolic batch]: the element-count rule is linear in the batch: the
convolutions' inputs hold ``fixed + per_sample * b`` elements, so it picks NHWC from the batch
``ceil((weights - fixed) / per_sample)`` on. When that batch lies inside the symbol's range the
graph is lowered and generated twice, in eager's layouts and channels-last, and the wrapper
(``_PerBatch`` in compile.py) reads the call's batch from an input's size (``BatchSplit``) and
runs the compile the rule picks for it: no guard, one graph, and each batch gets the layouts a
static compile at that batch gets, so neither the order of calls nor the range's ends decide.
Chosen over deciding at one representative batch (the first call's, or a large one) because the
rule's choice does flip inside common ranges, and a single choice loses at one end: measured at
one thread, dynamic=True compiles forced to each layout (min of two blocks of 11 calls, ms,
NHWC / eager layouts): kiln_bench's CNN batch 2 0.87 / 1.02, 8 2.26 / 2.87, 32 8.20 / 16.10;
ResNet 2 3.03 / 2.64, 8 6.20 / 5.83, 32 20.58 / 18.65 (so NHWC at a large batch is not free
either: a representative-batch rule would move ResNet's whole range to NHWC). The cost is a
second code generation and native compile for graphs whose crossover is in range (only CPU
inference graphs with convolutions outside oneDNN fusion and without a depthwise one), and
twice the generated code in memory; the batch split adds one size read per call. With no input
holding the batch symbol itself (only expressions of it) the graph keeps eager's layouts.

The CUDA rule (:func:`cuda_policy`), after the anchor's ``decide_layout_opt``: cuDNN is fastest in
NHWC, and on NCHW tensors it either converts each activation around every convolution (ResNet-50 on
the H200: 0.37 + 0.21 ms of nchw<->nhwc kernels a call) or, for depthwise convolutions, falls back to
PyTorch's native NCHW kernel (ConvNeXt: 1.46 ms against cuDNN's 0.70 ms in NHWC). The rule:
  - off without a 2-D convolution, or when convolutions are a small part of the graph (at least
    300 nodes per convolution: a transformer with a convolutional stem);
  - off when a convolution's sizes are symbolic (not known to be worth it, and strides would be
    symbolic);
  - inference: a vote weighted by each convolution's FLOPs and by how much faster its class runs
    in NHWC (:data:`NHWC_TIME_RATIO`, time NHWC / time NCHW); on when the weighted sum is at most
    the plain sum, i.e. the FLOP-weighted average ratio is <= 1;
  - training (forward and backward graphs, whose convolutions are ``convolution_backward``): on
    (``layout_training``, default True; False keeps eager's layouts) unless a grouped convolution
    has more than one input channel per group (the anchor's rule: cuDNN's NHWC grouped kernels can
    be many times slower) or the graph has a float32 depthwise convolution (16-bit ones go NHWC:
    Note [Depthwise convolutions in half-precision training]). The depthwise exception is
    kiln's, from the H200 (ninth session, ConvNeXt fp32 training): cuDNN's NHWC weight gradient of
    the 7x7 depthwise convolution (``wgrad2d_grouped_direct_kernel``) took 7.4 ms a step against
    3.9 ms for PyTorch's NCHW kernel, and the step was 48.5 ms channels-last against 43.8 ms (the
    anchor turns such graphs on: torch.compile 46.6 ms), although the same convolution's forward
    is twice as fast in NHWC (inference keeps the FLOP vote).
    History: the seventh session measured CNN fp32 training at 76.9 ms a step channels-last
    against 9.8 ms, because BatchNorm's Welford statistics were an unsplit column reduction in
    NHWC (one program per 64 channels over 32*224*224 rows); they now split (Note [Split
    reductions] in kiln_codegen_triton's split.py, Note [The second kernel reduces rows], Note
    [Short chunks of column reductions]). The ninth session's H200 profile (before the fixes below; bf16 training,
    NCHW / NHWC ms per step: CNN 5.93 / 6.64, ResNet-50 9.26 / 8.06) put the rest of NHWC's cost
    in max pooling: eager's NHWC max-pool backward (0.94 ms on the CNN), the int64 indices
    stored NCHW beside NHWC values (an uncoalesced store; the fused forward kernels that store
    them took 1.5 ms) and, by our reading, copied to NHWC by that backward (1.0 ms of aten
    elementwise copies, no other 4-D copy in the step's aten calls). Now the indices are NHWC
    (``_NHWC_INTEGER_RESULTS`` in graph.py), the backward is a generated gather kernel fused into
    the BatchNorm/ReLU backward (Note [Max pooling backward as a gather]), and every
    ``convolution_backward`` gets its gradient and input NHWC (the image too: an NCHW input made
    cuDNN convert the whole gradient of the first convolution). NCHW keeps cuDNN's own
    conversions around every convolution (CNN bf16 1.0 ms, ResNet-50 1.8 ms a step), which the
    generated kernels' extra NHWC cost does not reach (``scripts/triton_kernel_audit.py``, bf16
    training: CNN 1.20 vs 1.17 ms, ResNet-50 2.80 vs 2.43 ms of generated kernels, estimates).
    To be confirmed on the H200 (``scripts/gpu_next.sh call1``).
The CPU rule takes training graphs NHWC where the convolutions' inputs are as large as their
weights (Note [Channels-last in CPU training]; ``KILN_CHANNELS_LAST=0`` turns NHWC off
everywhere). On either device a training forward leaves the activations it saves for the backward in the
layout it computed them in, and the backward graph is compiled for those strides (Note [Outputs
only the backward reads] in graph.py, Note [Saved activations in the forward's layout] in
kiln_aotgrad): no conversion between the two graphs. In the backward graph NHWC spreads from
each ``convolution_backward`` to the gradients that lead into it, through the backward ops of
pooling and normalization (:data:`LAYOUT_PRESERVING`) and pointwise ops.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from kiln_symbolic import bound, hint_of

from . import BatchSplit, PassContext

aten = torch.ops.aten

# time in NHWC / time in NCHW per convolution class on CUDA (below 1: NHWC is faster). depthwise:
# ConvNeXt's 7x7 depthwise convolution on the H200 in bf16 (issue 15: 0.70 / 1.46 ms); the others
# are the anchor's published cuDNN measurements (GPU.md section 3.1), to be re-measured on the H200.
NHWC_TIME_RATIO: dict[str, float] = {
    "depthwise": 0.48,
    "grouped": 1.358,
    "small": 0.783,
    "in_out": 0.725,
    "default": 0.823,
}
MAX_NODES_PER_CONV = 300
# conv classes that keep a training graph in eager's layouts (Note [Channels-last for convolutions])
TRAINING_VETO: dict[str, str] = {
    "grouped": "slower in NHWC",
    # float32 only: Note [Depthwise convolutions in half-precision training]
    "depthwise": "NHWC weight gradient measured 1.9x slower in float32",
}


# Note [Depthwise convolutions in half-precision training]: the depthwise veto above was measured
# in float32 (ninth session). In bfloat16 it is the other way round: PyTorch's NCHW depthwise
# kernels (`conv_depthwise2d_grad_weight_kernel<BFloat16>` and its forward and input-gradient
# siblings) are slow where cuDNN's NHWC ones are not. ConvNeXt's bf16 training step on an H100
# (twenty-second session, `2026-12-05-h100-s22-train-bf16-saves.json`): kiln in eager layouts
# 18.9 ms (convolutions 8.64 ms of 17.2 ms of kernels, slower than eager's 16.4 ms), torch.compile
# channels-last 14.7 ms (convolutions 2.88 ms). So the veto holds for float32 depthwise
# convolutions only; a graph whose depthwise convolutions are float16/bfloat16 goes NHWC.
def _vetoes(kind: str, node: torch.fx.Node) -> bool:
    """Whether convolution ``node`` of class ``kind`` keeps its training graph in eager's layouts."""
    if kind != "depthwise":
        return True
    weight = _val(node.args[1])
    return not (isinstance(weight, torch.Tensor) and weight.dtype in (torch.float16, torch.bfloat16))


# non-pointwise ops whose 4-D output has the same (N, C, H, W) meaning as their 4-D input
LAYOUT_PRESERVING = frozenset(
    {
        aten.convolution.default,
        aten._native_batch_norm_legit_no_training.default,
        aten._native_batch_norm_legit.default,
        aten._native_batch_norm_legit.no_stats,
        aten.native_batch_norm.default,
        aten.native_group_norm.default,
        aten.max_pool2d_with_indices.default,
        aten.avg_pool2d.default,
        aten._adaptive_avg_pool2d.default,
        aten.adaptive_max_pool2d.default,
        aten.upsample_nearest2d.default,
        aten.upsample_nearest2d.vec,
        aten.upsample_bilinear2d.default,
        aten.upsample_bilinear2d.vec,
        aten.cat.default,
        aten.constant_pad_nd.default,
        aten.convolution_backward.default,
        aten.max_pool2d_with_indices_backward.default,
        aten.avg_pool2d_backward.default,
        aten._adaptive_avg_pool2d_backward.default,
        aten.native_batch_norm_backward.default,
        aten.native_group_norm_backward.default,
        aten.upsample_nearest2d_backward.default,
        aten.upsample_bilinear2d_backward.default,
        aten.clone.default,
        aten._to_copy.default,
        aten.mean.dim,
        aten.sum.dim_IntList,
        aten.amax.default,
        aten.var_mean.correction,
        operator.getitem,
    }
)


@dataclass(frozen=True, slots=True)
class LayoutDecision:
    channels_last: bool
    reason: str
    # Note [Both layouts under a symbolic batch]: (batch symbol, b): NHWC only for batches >= b
    from_batch: tuple[sympy.Symbol, int] | None = None


Policy = Callable[[torch.fx.GraphModule, PassContext], LayoutDecision]


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _first_tensor(val: Any) -> torch.Tensor | None:
    if isinstance(val, list | tuple):
        val = val[0] if val else None
    return val if isinstance(val, torch.Tensor) else None


def conv2d_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The 2-D convolutions of ``gm`` (4-D weight and shape metadata known)."""
    found = []
    for n in gm.graph.nodes:
        if n.target is aten.convolution.default:
            w = _val(n.args[1])
            if isinstance(w, torch.Tensor) and w.dim() == 4 and isinstance(_val(n), torch.Tensor):
                found.append(n)
    return found


def conv_backward_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The backward nodes of 2-D convolutions in ``gm`` (4-D weight and input metadata known)."""
    found = []
    for n in gm.graph.nodes:
        if n.target is aten.convolution_backward.default:
            w, x = _val(n.args[2]), _val(n.args[1])
            if isinstance(w, torch.Tensor) and w.dim() == 4 and isinstance(x, torch.Tensor):
                found.append(n)
    return found


def _weight_and_groups(node: torch.fx.Node) -> tuple[torch.Tensor, int]:
    """A convolution's (or its backward's) weight metadata and group count."""
    if node.target is aten.convolution_backward.default:
        groups_arg: Any = node.args[9] if len(node.args) > 9 else 1
        return _val(node.args[2]), _at_hint(groups_arg)
    groups_arg = node.args[8] if len(node.args) > 8 else 1
    return _val(node.args[1]), _at_hint(groups_arg)


def _at_hint(size: Any) -> int:
    """A size as an int, a symbolic one at its hint: the layout rules are heuristics, and an
    `int()` of a SymInt would guard on its value and specialize the graph (a symbolic channel
    count under ``dynamic=True``)."""
    return int(hint_of(size)) if isinstance(size, torch.SymInt) else int(size)


def conv_class(node: torch.fx.Node) -> str:
    """The convolution's class for :data:`NHWC_TIME_RATIO`."""
    weight, groups = _weight_and_groups(node)
    out_ch, in_per_group, kh, kw = (_at_hint(s) for s in weight.shape)
    in_ch = in_per_group * groups
    if groups > 1 and in_per_group == 1:
        return "depthwise"
    if groups > 1:
        return "grouped"
    if out_ch <= 64 and in_ch <= 64:
        return "small"
    if 2 * out_ch <= in_ch and kh * kw > 1:
        return "in_out"
    return "default"


def conv_flops(node: torch.fx.Node) -> int:
    out, weight = _val(node), _val(node.args[1])
    _, in_per_group, kh, kw = (_at_hint(s) for s in weight.shape)
    return 2 * _at_hint(out.numel()) * in_per_group * kh * kw


def _static(node: torch.fx.Node) -> bool:
    for v in (_first_tensor(_val(node)), _val(node.args[0]), _val(node.args[1])):
        if isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.shape):
            return False
    return True


def cpu_policy(gm: torch.fx.GraphModule, ctx: PassContext) -> LayoutDecision:
    if not ctx.inference and not ctx.options.cpu_layout_training:
        return LayoutDecision(False, "training graph: layouts stay eager's (cpu_layout_training=False)")
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return LayoutDecision(False, "oneDNN unavailable or disabled")
    if not ctx.inference:
        return _cpu_training_policy(
            gm, forced=ctx.options.cpu_layout_training == "force", native=ctx.options.native_small_conv
        )
    convs = conv2d_nodes(gm)
    if not convs:
        return LayoutDecision(False, "no 2-D convolution")
    from .conv_fusion import enabled_on, takes_dtype

    if enabled_on(ctx) is None and all(takes_dtype(n, ctx) for n in convs):
        # Note [Convolutions through oneDNN]: prepacked weights are not reordered per call. Only
        # where the pass takes the convolutions' dtype: a bfloat16 graph it left to aten went NHWC
        # with plain weights, copied to NHWC and reordered in every call (Note [bfloat16 through
        # oneDNN] in prepack.py)
        return LayoutDecision(True, f"{len(convs)} convs through oneDNN (conv_fusion)")
    depthwise = [n for n in convs if conv_class(n) == "depthwise"]
    if depthwise:  # Note [Depthwise convolutions on the CPU]
        return LayoutDecision(True, f"{len(convs)} convs, {len(depthwise)} depthwise")
    weights = sum(_numel(n.args[1]) for n in convs)
    if ctx.options.layout_per_batch:  # Note [Both layouts under a symbolic batch]
        per_batch = _per_batch_decision(convs, weights)
        if per_batch is not None:
            return per_batch
    # Note [The CPU rule under a symbolic batch]
    activations = sum(_numel_at_smallest_batch(n.args[0]) for n in convs)
    symbolic_batch = any(isinstance(getattr(_val(n.args[0]), "shape", (0,))[0], torch.SymInt) for n in convs)
    at = " at the smallest batch" if symbolic_batch else ""
    if activations < weights:
        return LayoutDecision(
            False, f"conv inputs ({activations} elements{at}) weigh less than weights ({weights})"
        )
    return LayoutDecision(True, f"{len(convs)} convs, inputs {activations}{at} >= weights {weights} elements")


# Note [Small convolutions keep eager's layouts in CPU training]: where every convolution of a
# training graph is small enough for PyTorch's native kernel (Note [Small convolutions outside
# oneDNN] in passes/native_conv.py), or depthwise (which that kernel does not take) with at least
# three in four small, the graph keeps eager's layouts whatever the element count says: the
# native kernel computes NCHW (its backward refuses a channels-last input), and those
# convolutions' cost is oneDNN's per-call setup, not their layout. Measured at one thread
# (train1.py --clock cpu, 40-60 interleaved steps, the count's NHWC against eager's layouts with
# the native kernel): LeViT (four 3x3 stem convolutions at 32 px) 1.36x -> 1.52x over eager,
# MobileViT (28 small of 35, the others depthwise) 1.30x -> 1.36x, Swin's one patch embedding
# even; FocalNet (4 small, 4 depthwise 3x3 on 8-16 px maps, whose NHWC kernels are the faster)
# 1.5-5% slower in two runs, hence the three in four. ``native_small_conv=False`` turns this off
# with the native kernel.
# Note [Channels-last in CPU training]: a training graph on the CPU runs NHWC when its
# convolutions' inputs hold at least as many elements as their weights, counted over the graph's
# convolutions (the forward's, or the backward's ``convolution_backward`` nodes, whose input and
# weight are the same tensors): oneDNN reorders a contiguous weight on every call, and in training
# its weight gradient back, so small activations beside large weights lose. Without that the graph
# keeps eager's layouts. Measured at one thread, training steps with NHWC forced for every graph /
# eager's layouts (train1.py and breadth_speed.py, interleaved, CPU clock): MobileNetV2 at 64 px
# 25.9 -> 22.5 ms (inputs 1.12x its weights), the CNN of the public suite 13.9 -> 13.5 (3.4x),
# RegNet (breadth) +3%, MobileViT and Swin's patch embedding even; ResNet 12.7 -> 15.5 ms (inputs
# 0.1x its weights), EfficientNet 12.3 -> 14.5 ms (0.75x). Inference's depthwise exception (Note
# [Depthwise convolutions on the CPU]) is not taken: oneDNN's NHWC depthwise backward is 1.5-6x
# faster than the NCHW one on maps of 16-32 positions a side but up to 2x slower on maps of 2-4
# (2-8 for a 5x5 kernel), where deep stages of small images end; EfficientNet's three slowest
# depthwise backwards (2x2 to 7x7 maps) took 1.3/1.1/0.9 ms NHWC against 0.6/0.7/0.5 ms NCHW
# (extern_audit.py). ConvNeXt V2 (depthwise 7x7 down to 2x2 maps, inputs 0.43x its weights) was
# 12.7 -> 11.7 ms NHWC and keeps eager's layouts by the count. Those slow backwards now run NCHW in
# either layout (Note [Depthwise convolution backwards on small maps]): ConvNeXt V2's depthwise
# inputs were NHWC in eager's layouts too, and it gained 1.18x -> 1.37x over eager without a layout
# change; EfficientNet NHWC forced / this rule's choice became even (breadth, 9.69 / 9.77 ms), so
# the count stands (twenty-ninth session). torch.compile runs every CPU graph with a
# convolution NHWC (ResNet 14.3 ms, EfficientNet at 32 px 2x eager's time). Symbolic sizes keep
# eager's layouts: the per-batch dispatch of inference (Note [Both layouts under a symbolic
# batch]) would hand the backward, which is compiled once for the forward's saved strides (Note
# [Outputs only the backward reads]), activations of either layout. ``cpu_layout_training=False``
# keeps every CPU training graph in eager's layouts; ``"force"`` takes every static one NHWC (to
# measure the rule's other side).
def _cpu_training_policy(
    gm: torch.fx.GraphModule, forced: bool = False, native: bool = False
) -> LayoutDecision:
    """The CPU rule for a training forward or backward graph (Note [Channels-last in CPU training])."""
    convs = conv2d_nodes(gm) + conv_backward_nodes(gm)
    if not convs:
        return LayoutDecision(False, "no 2-D convolution")
    if not all(_static(n) for n in convs):
        return LayoutDecision(False, "training graph with symbolic convolution sizes")
    if forced:
        return LayoutDecision(True, f"training graph, {len(convs)} convs (cpu_layout_training='force')")
    if native:  # Note [Small convolutions keep eager's layouts in CPU training]
        from .native_conv import small_enough

        small = [n for n in convs if small_enough(n)]
        others_depthwise = all(n in small or conv_class(n) == "depthwise" for n in convs)
        if small and others_depthwise and 4 * len(small) >= 3 * len(convs):
            return LayoutDecision(
                False,
                f"training graph: {len(small)} of {len(convs)} convs small enough for the native kernel"
                + (", the others depthwise" if len(small) < len(convs) else ""),
            )
    inputs = sum(_numel(_conv_input(n)) for n in convs)
    weights = sum(_numel(_conv_weight(n)) for n in convs)
    if inputs < weights:
        return LayoutDecision(
            False, f"training graph: conv inputs ({inputs} elements) weigh less than weights ({weights})"
        )
    return LayoutDecision(
        True, f"training graph, {len(convs)} convs, inputs {inputs} >= weights {weights} elements"
    )


def _conv_input(node: torch.fx.Node) -> Any:
    """A convolution's (or its backward's) input argument."""
    return node.args[1] if node.target is aten.convolution_backward.default else node.args[0]


def _conv_weight(node: torch.fx.Node) -> Any:
    """A convolution's (or its backward's) weight argument."""
    return node.args[2] if node.target is aten.convolution_backward.default else node.args[1]


def _per_batch_decision(convs: list[torch.fx.Node], weights: int) -> LayoutDecision | None:
    """The CPU element-count rule as a function of a symbolic batch (Note [Both layouts under a
    symbolic batch]): None when no convolution's batch is symbolic, or the batches are not all
    whole multiples of one symbol (then the rule counts at the smallest batch)."""
    symbol: sympy.Symbol | None = None
    size: Any = None  # a batch size that is a multiple of ``symbol`` (its shape env bounds it)
    fixed = per_batch = 0  # the convolutions' input elements: fixed + per_batch * symbol
    for n in convs:
        val = _val(n.args[0])
        if not isinstance(val, torch.Tensor) or val.dim() == 0 or not isinstance(val.shape[0], torch.SymInt):
            fixed += _numel(n.args[0])
            continue
        expr = val.shape[0].node.expr
        free = expr.free_symbols
        if len(free) != 1:
            return None
        (s,) = free
        if symbol is not None and s != symbol:
            return None
        factor = sympy.simplify(expr / s)
        if not (factor.is_Integer and factor > 0):
            return None
        symbol, size = s, val.shape[0]
        per_batch += int(factor) * _per_sample(val)
    if symbol is None or per_batch == 0:
        return None
    # the rule chooses NHWC where fixed + per_batch * b >= weights
    start = max(-(-(weights - fixed) // per_batch), 1)
    lowest, highest = _bounds(size, symbol) or (1, None)
    counts = f"inputs {fixed} + {per_batch} x {symbol} elements, weights {weights}"
    if start <= lowest:
        return LayoutDecision(True, f"{len(convs)} convs, {counts}: NHWC at every batch from {lowest}")
    if highest is not None and start > highest:
        return LayoutDecision(False, f"{counts}: eager layouts at every batch up to {highest}")
    return LayoutDecision(
        True, f"{len(convs)} convs, {counts}: NHWC from batch {start}, eager layouts below", (symbol, start)
    )


def cuda_policy(gm: torch.fx.GraphModule, ctx: PassContext) -> LayoutDecision:
    convs = conv2d_nodes(gm) + ([] if ctx.inference else conv_backward_nodes(gm))
    if not convs:
        return LayoutDecision(False, "no 2-D convolution")
    nodes = len(gm.graph.nodes)
    if nodes >= MAX_NODES_PER_CONV * len(convs):
        return LayoutDecision(False, f"{nodes} nodes for {len(convs)} convs: convolutions are a small part")
    if not all(_static(n) for n in convs):
        return LayoutDecision(False, "a convolution has symbolic sizes")
    if not ctx.inference:
        if not ctx.options.layout_training:
            return LayoutDecision(False, "training graph: layouts stay eager's (layout_training=False)")
        for kind, why in TRAINING_VETO.items():
            vetoed = [n for n in convs if conv_class(n) == kind and _vetoes(kind, n)]
            if vetoed:
                return LayoutDecision(False, f"training graph with {len(vetoed)} {kind} convs ({why})")
        half = sum(conv_class(n) == "depthwise" for n in convs)
        if half:  # Note [Depthwise convolutions in half-precision training]
            return LayoutDecision(
                True, f"training graph, {len(convs)} convs, {half} depthwise in 16-bit floats"
            )
        return LayoutDecision(True, f"training graph, {len(convs)} convs, none grouped or depthwise")
    plain = weighted = 0.0
    by_class: dict[str, int] = {}
    for n in convs:
        kind = conv_class(n)
        flops = conv_flops(n)
        by_class[kind] = by_class.get(kind, 0) + 1
        plain += flops
        weighted += flops * NHWC_TIME_RATIO[kind]
    ratio = weighted / plain if plain else 1.0
    classes = ", ".join(f"{k} x{v}" for k, v in sorted(by_class.items()))
    if ratio <= 1.0:
        return LayoutDecision(True, f"FLOP-weighted NHWC/NCHW time {ratio:.3f} <= 1 ({classes})")
    return LayoutDecision(False, f"FLOP-weighted NHWC/NCHW time {ratio:.3f} > 1 ({classes})")


POLICIES: dict[str, Policy] = {"cpu": cpu_policy, "cuda": cuda_policy}


def _numel(node: Any) -> int:
    """Elements of a node's value; at the size hint when symbolic (a heuristic: an `int()` of a
    symbolic numel would guard on it, and loopir refuses a graph that specialized a size)."""
    val = _val(node)
    if not isinstance(val, torch.Tensor):
        return 0
    numel = val.numel()
    return int(hint_of(numel)) if isinstance(numel, torch.SymInt) else int(numel)


def _bounds(size: torch.SymInt, expr: Any) -> tuple[int, int | None] | None:
    """The smallest and largest value ``expr`` (a size's expression, or a symbol of it) may take
    under the ranges of ``size``'s shape env (largest None: unbounded), the smallest at least 1;
    None when the size carries no ranges."""
    env = getattr(size.node, "shape_env", None)
    ranges = getattr(env, "var_to_range", None)
    if ranges is None:
        return None
    r = bound(expr, ranges)
    lowest = max(int(r.lower), 1) if r.lower.is_number and r.lower.is_finite else 1
    return lowest, (int(r.upper) if r.upper.is_number and r.upper.is_finite else None)


def _smallest(size: Any) -> int:
    """The smallest value a (symbolic) size may take: the lower end of its symbols' ranges
    (``kiln.mark_dynamic``'s ``min``; 2 for a dynamic batch, 0 and 1 being specialized), at least 1;
    its hint without ranges; an int as it is."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    bounds = _bounds(size, size.node.expr)
    return bounds[0] if bounds is not None else int(hint_of(size))


def _per_sample(val: torch.Tensor) -> int:
    """Elements of one batch entry of ``val``, every dim but the first at its size hint."""
    per_sample = 1
    for s in val.shape[1:]:
        per_sample *= int(hint_of(s)) if isinstance(s, torch.SymInt) else int(s)
    return per_sample


def _numel_at_smallest_batch(node: Any) -> int:
    """Elements of a 4-D (or any) value with its batch (dim 0) at its smallest value and every
    other dim at its size hint (Note [The CPU rule under a symbolic batch])."""
    val = _val(node)
    if not isinstance(val, torch.Tensor) or val.dim() == 0 or not isinstance(val.shape[0], torch.SymInt):
        return _numel(node)
    return _per_sample(val) * _smallest(val.shape[0])


def _batch_split(inputs: Sequence[Any], symbol: sympy.Symbol, start: int) -> BatchSplit | None:
    """The first input that is the batch symbol, or has it as a size."""
    for i, x in enumerate(inputs):
        if isinstance(x, torch.SymInt) and x.node.expr == symbol:
            return BatchSplit(symbol, i, None, start)
        if isinstance(x, torch.Tensor):
            for d, size in enumerate(x.shape):
                if isinstance(size, torch.SymInt) and size.node.expr == symbol:
                    return BatchSplit(symbol, i, d, start)
    return None


def preserves_layout(node: torch.fx.Node) -> bool:
    """Whether ``node``'s 4-D result has its 4-D input's (N, C, H, W) meaning."""
    target = node.target
    if target in LAYOUT_PRESERVING:
        return True
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags


def _four_d_float(val: Any) -> bool:
    t = _first_tensor(val)
    return t is not None and t.dim() == 4 and t.is_floating_point()


def _nhwc_permute(node: torch.fx.Node) -> bool:
    """A permute of a 4-D value to (N, H, W, C): channels-last storage makes it contiguous."""
    dims = node.args[1] if node.target is aten.permute.default else None
    return isinstance(dims, (list, tuple)) and list(dims) in ([0, 2, 3, 1], [0, -2, -1, -3])


def spread(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The convolutions (and their backwards) and every 4-D value that leads into one, or into a
    permute to (N, H, W, C), through layout-preserving ops.

    Note [Values read through a channels-last permute]: ConvNeXt's blocks read a depthwise
    convolution's output as ``permute(0, 2, 3, 1)`` for a layer norm over the channels. The
    convolution's own result is NHWC, and the permute of it a contiguous (N, H, W, C) tensor;
    but once the convolution-bias pass (Note [Convolution bias after the convolution]) put an
    add between the two, the add led into no convolution and was realized in eager's NCHW
    strides: the layer norm's kernel stored it (a training forward saves it) column by column
    and the backward's norm kernels read it so, 2 chunks of one column sum each (bf16 ConvNeXt
    training on the H100: the norm weight gradients' partial kernels at 17% of copy bandwidth).
    A value that a permute to (N, H, W, C) reads is computed channels-last too, and so is what
    leads into it through layout-preserving ops."""
    chosen: set[torch.fx.Node] = set()
    convs = set(conv2d_nodes(gm)) | set(conv_backward_nodes(gm))
    for node in reversed(list(gm.graph.nodes)):
        if node.op != "call_function" or not (node in convs or _four_d_float(_val(node))):
            continue  # a convolution_backward counts even where it computes no grad_input
        if node in convs or (
            preserves_layout(node) and any(u in chosen or _nhwc_permute(u) for u in node.users)
        ):
            chosen.add(node)
    return chosen


def policy_name(ctx: PassContext) -> str | None:
    wanted = ctx.options.layout_policy
    return ctx.device.type if wanted == "auto" else wanted


def channels_last_nodes(gm: torch.fx.GraphModule, ctx: PassContext) -> set[torch.fx.Node]:
    """The nodes to compute channels-last (empty when the graph keeps eager's layouts)."""
    if os.environ.get("KILN_CHANNELS_LAST", "1") == "0":
        if conv2d_nodes(gm):
            ctx.note("layout", "off (KILN_CHANNELS_LAST=0)")
        return set()
    name = policy_name(ctx)
    policy = POLICIES.get(name or "")
    if policy is None:
        return set()
    decision = policy(gm, ctx)
    if not decision.channels_last:
        if conv2d_nodes(gm) or conv_backward_nodes(gm):  # a backward graph's verdict too
            ctx.note("layout", "%s rule keeps eager layouts: %s", name, decision.reason)
        return set()
    chosen = spread(gm)
    if decision.from_batch is not None:
        symbol, start = decision.from_batch
        ctx.channels_last_from = _batch_split(ctx.example_inputs, symbol, start)
        if ctx.channels_last_from is None:  # cannot dispatch: the rule at the smallest batch
            ctx.note("layout", "%s rule keeps eager layouts: no input holds the batch %s", name, symbol)
            return set()
    convs = sum(
        1 for n in chosen if n.target in (aten.convolution.default, aten.convolution_backward.default)
    )
    ctx.note(
        "layout",
        "%s rule chooses channels-last: %s; %d convs and %d values between them in NHWC",
        name,
        decision.reason,
        convs,
        len(chosen) - convs,
    )
    return chosen


def _format_of(t: torch.Tensor) -> torch.memory_format | None:
    """channels_last or contiguous_format for a dense 4-D value of static sizes that is one of the
    two and not both (a value with size-1 dims can be both), else None."""
    if t.dim() != 4 or not all(isinstance(s, int) for s in (*t.shape, *t.stride())):
        return None
    nhwc, nchw = t.is_contiguous(memory_format=torch.channels_last), t.is_contiguous()
    if nhwc == nchw:
        return None
    return torch.channels_last if nhwc else torch.contiguous_format


def onednn_format(x: torch.Tensor, weight: torch.Tensor, depthwise: bool) -> torch.memory_format | None:
    """The memory format eager's oneDNN convolution backward computes in: channels-last when the
    input is, or the weight is and the convolution is not depthwise (a depthwise weight's format
    measured without effect), else contiguous; None when the input's format is unknown."""
    fx = _format_of(x)
    if fx is None:
        return None
    if fx == torch.channels_last or (not depthwise and _format_of(weight) == torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def conv_grad_formats(
    gm: torch.fx.GraphModule, ctx: PassContext, chosen: set[torch.fx.Node]
) -> dict[torch.fx.Node, torch.memory_format]:
    """Note [A convolution backward's gradient in oneDNN's format]: on the CPU, eager's oneDNN
    convolution backward converts its gradient, input and weight to one memory format, chosen
    from the input and the weight (channels-last when either is; for a depthwise convolution the
    input alone). A gradient that eager holds in the other format is copied inside the call on
    every step; ConvNeXt's downsampling convolutions get an NCHW gradient (the sum of the
    residual branches' gradients, one of them NCHW) beside an NHWC input, in eager and
    torch.compile alike. Here each such backward (outside the channels-last set, whose operands
    are NHWC already) records the format its gradient should be computed in; the lowering gives
    it that layout where the gradient is still a lazy value (its producing kernel writes it so,
    at no cost), and leaves a realized one as it is (oneDNN converting it, as before). Inputs
    and weights keep their layouts: they are saved activations and parameters, whose layouts
    other readers and the graph's outputs rely on. ``conv_grad_format=False`` off."""
    if not ctx.options.conv_grad_format or ctx.device.type != "cpu":
        return {}
    out: dict[torch.fx.Node, torch.memory_format] = {}
    for n in conv_backward_nodes(gm):
        grad = _val(n.args[0])
        if n in chosen or not isinstance(grad, torch.Tensor):
            continue
        source = n.args[0]
        if isinstance(source, torch.fx.Node) and any(u.op == "output" for u in source.users):
            continue  # a graph output keeps eager's strides
        weight, x = _val(n.args[2]), _val(n.args[1])
        want = onednn_format(x, weight, conv_class(n) == "depthwise")
        have = _format_of(grad)
        if want is not None and have is not None and have != want:
            out[n] = want
            ctx.note(
                "layout",
                "%s: gradient %s -> %s (oneDNN's format from input %s, weight %s)",
                n.name,
                "NCHW" if have == torch.contiguous_format else "NHWC",
                "NCHW" if want == torch.contiguous_format else "NHWC",
                list(x.shape),
                list(weight.shape),
            )
    return out


# Note [Depthwise convolution backwards on small maps]: for a depthwise convolution PyTorch's
# oneDNN backward takes its format from the input alone, and its NHWC weight gradient is several
# times slower than its NCHW one where oneDNN's depthwise weight-gradient kernel declines the
# convolution: ``ONEDNN_VERBOSE=1`` shows ``jit_dw`` for 3x3 kernels without padding (either
# format), but for 5x5 and 7x7 kernels, and 3x3 ones padded on a 2x2 map, NHWC runs the generic
# grouped kernel (``jit:avx512_core``, weights blocked 16x16: one channel a group) and NCHW a
# GEMM (``x64:gemm:jit``). On large maps the generic kernel still wins; where the kernel covers
# the whole output map it loses. ConvNeXt's depthwise inputs are NHWC in eager (its blocks read
# the convolution through a permute to (N, H, W, C)), so its 7x7 backwards ran NHWC at every
# stage in kiln whichever layout the rule chose, while torch.compile's got an input of neither
# format and ran NCHW. ConvNeXt V2 at 64 px, one thread, each ``convolution_backward`` (fastest
# of 3 steps, kiln NHWC / torch.compile NCHW): 2x2 map 2222-2495 / 696 us, 4x4 1189-1234 / 594
# us, 8x8 629-748 / 698 us, 16x16 596-654 / 1051 us. Single convolutions, forward + backward,
# NHWC / NCHW (twenty-ninth session): 5x5 on 2x2 1.51x, 5x5 stride 2 to 4x4 1.23x and to 1x1
# 1.95x, 7x7 on 4x4 1.10-1.55x and on 2x2 1.24-1.40x; 3x3 unpadded to 2x2 0.58-0.79x
# (MobileNetV2's explicitly padded blocks: ``jit_dw`` both ways, NHWC the faster). So on the
# CPU a float32 (or bfloat16) depthwise backward whose kernel is at least as large as its output map in both
# dimensions, and is larger than 3x3 or pads, gets its gradient and input NCHW (the gradient
# computed so where its layout is still free, else a copy: a few thousand elements on such
# maps), and its input gradient comes back NCHW (copied into the layout the graph planned where
# that differs), whatever layout the graph runs in. The forward convolution keeps its layout
# (within 25% either way on such maps). Bfloat16 alike, more so (the same single convolutions,
# NHWC / NCHW: 7x7 on 2x2 1.88x, on 4x4 2.13x, 5x5 on 2x2 2.12x, 3x3 padded on 2x2 1.92x, 3x3
# unpadded 0.83x); float16 was not measured and keeps the graph's layout.
# ``depthwise_backward_nchw=False`` turns it off.
_NCHW_BACKWARD_DTYPES = (torch.float32, torch.bfloat16)  # the measured ones


def nchw_conv_backwards(gm: torch.fx.GraphModule, ctx: PassContext) -> set[torch.fx.Node]:
    """The ``convolution_backward`` nodes that run NCHW (Note [Depthwise convolution backwards on
    small maps])."""
    if not ctx.options.depthwise_backward_nchw or ctx.device.type != "cpu":
        return set()
    out: set[torch.fx.Node] = set()
    for n in conv_backward_nodes(gm):
        grad, weight = _val(n.args[0]), _val(n.args[2])
        if not isinstance(grad, torch.Tensor) or grad.dim() != 4 or grad.dtype not in _NCHW_BACKWARD_DTYPES:
            continue
        if not all(isinstance(s, int) for s in (*grad.shape, *weight.shape)):
            continue
        if conv_class(n) != "depthwise" or _val(n.args[1]).dim() != 4 or n.args[7]:  # transposed
            continue
        (ho, wo), (kh, kw) = grad.shape[2:], weight.shape[2:]
        padding = n.args[5]
        assert isinstance(padding, (list, tuple))
        pads = any(_at_hint(p) != 0 for p in padding)
        if kh >= ho and kw >= wo and (max(kh, kw) > 3 or pads):
            out.add(n)
            ctx.note(
                "layout", "%s: depthwise backward NCHW (%dx%d kernel, %dx%d map)", n.name, kh, kw, ho, wo
            )
    return out


def nhwc_weights(ctx: PassContext, chosen: set[torch.fx.Node]) -> bool:
    """Note [Convolution weights in NHWC]: whether the channels-last convolutions take their
    weights NHWC (the CUDA rule, some convolution chosen, the option on)."""
    return bool(chosen) and policy_name(ctx) == "cuda" and ctx.options.nhwc_weights


def layout_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Record the layout decision in ``ctx.channels_last`` (and the convolution gradients' formats
    in ``ctx.conv_grad_formats``, the backwards that run NCHW in ``ctx.nchw_conv_backwards``,
    whether weights go NHWC in ``ctx.nhwc_weights``); the graph is unchanged."""
    ctx.channels_last = channels_last_nodes(gm, ctx)
    ctx.nchw_conv_backwards = nchw_conv_backwards(gm, ctx)
    formats = conv_grad_formats(gm, ctx, ctx.channels_last)
    ctx.conv_grad_formats = {n: f for n, f in formats.items() if n not in ctx.nchw_conv_backwards}
    ctx.nhwc_weights = nhwc_weights(ctx, ctx.channels_last)
    if ctx.nhwc_weights:
        ctx.note("layout", "convolution weights NHWC (copied in the graph)")
    return gm


__all__ = [
    "NHWC_TIME_RATIO",
    "POLICIES",
    "LayoutDecision",
    "channels_last_nodes",
    "conv_class",
    "conv_grad_formats",
    "cpu_policy",
    "cuda_policy",
    "layout_pass",
    "nchw_conv_backwards",
    "nhwc_weights",
    "onednn_format",
    "spread",
]
