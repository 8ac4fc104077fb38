"""Graph passes: rewrites and decisions over the aten FX graph, run once before lowering.

A pass is a named function ``run(gm, ctx) -> gm`` (:class:`GraphPass`). It may return the graph
it was given (it only looked, or only recorded a decision in ``ctx``) or a rewritten copy; it never
edits the caller's graph, because the caller (aotgrad, a fallback to eager) may still run it. Passes
run in the order of ``_passes()``: the rewrites first (attention, then outer products as multiplications
on the CPU, after attention so that its patterns still see their products, then patch convolutions as GEMMs on CUDA,
then matmul padding, which must not pad the products attention replaces and may pad the patch
GEMMs, then the convolution bias on CUDA), then common subexpressions (which also merges what the
rewrites made twice, such as two paddings of one tied weight), then a variance and a mean of the
same rows into one ``var_mean`` (after common subexpressions: one mean per rows), then the layout
decision, which must see the final nodes,
then the CPU convolution fusion, which keeps the layout decision for the nodes it makes, and the
CPU linear packing (after pad_mm: a padded product is not a plain linear layer any more).

Every pass can be turned off by its name in ``compile_graph(..., options={name: False})`` (the
umbrella's ``kiln.compile(options=...)`` passes the same keys through), so that each pass's effect
can be measured on its own; :class:`PassOptions` lists the keys. What each pass rewrote, padded or
re-laid, and why, goes to the ``passes`` KILN_LOG artifact (logger ``kiln.loopir.passes``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import sympy
import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule

log = logging.getLogger("kiln.loopir.passes")


@dataclass(frozen=True, slots=True)
class PassOptions:
    """The switches of the graph passes (``compile_graph``'s ``options``).

    ``layout``: the channels-last decision for convolutions (Note [Channels-last for
    convolutions]); ``layout_policy`` chooses whose rule decides: ``"auto"`` (the graph's device),
    ``"cpu"`` or ``"cuda"`` (forced, so tests on CPU tensors can exercise the CUDA rule).
    ``layout_per_batch``: under a symbolic batch whose range holds the CPU rule's crossover,
    both layouts are compiled and each call runs the one the rule picks for its batch (Note
    [Both layouts under a symbolic batch]); ``False``: one layout, decided at the smallest batch.
    ``layout_training``: the CUDA rule also runs training graphs channels-last (on by default,
    except graphs with grouped or depthwise convolutions; False keeps their layouts eager's: see
    the Note). ``cpu_layout_training``: the CPU rule runs training graphs channels-last where
    the convolutions' inputs hold at least as many elements as their weights (Note
    [Channels-last in CPU training] in passes/channels_last.py); ``False`` keeps every CPU
    training graph in eager's layouts, ``"force"`` runs every one with a 2-D convolution
    channels-last (measurements: the rule's other side).
    ``pad_mm``: padding of misaligned matmuls (Note [Matmul padding]); ``True`` pads on CUDA where a
    one-off timing says it is faster, ``"force"`` pads every misaligned one on any device (tests),
    ``False`` never; ``pad_mm_output_copy`` copies a padded result that leaves the graph to eager's
    contiguous strides: ``"user"`` (default) where the program sees it (not an output only the
    backward reads), ``True`` every output, ``False`` none (it leaves as a view with the padded row
    stride; Note [Padded results the program sees]). ``attention``: explicit softmax(Q @ K^T * c + mask) @ V rewritten to
    scaled_dot_product_attention where provably the same (Note [Attention rewrite]).
    ``attention_mask``: on CUDA, an SDPA mask that is constant along each row of scores (its last
    dimension of stride 0) is applied after an unmasked SDPA, so that a fused kernel runs (Note
    [Attention masks that are constant along a row]; a pass over the torch-level graph, run by
    the umbrella before aotgrad). ``attention_dense_mask``: on CUDA, an SDPA mask strided along
    its rows (T5's position bias) is made dense so that a fused kernel runs (Note [Attention masks
    read across their rows], the same pass); ``"force"`` on any device (tests, and the Triton
    kernel audit on CPU tensors).
    ``conv_bias``: on CUDA a convolution's bias is added after it in generated code, where the
    scheduler fuses it into the result's readers (Note [Convolution bias after the convolution]);
    ``"force"`` on any device (tests), ``False`` never.
    ``conv_bias_grad``: on CUDA a convolution backward's bias gradient is a generated sum over
    the gradient, fused with its producer (Note [Convolution bias gradients in generated code] in
    passes/conv_bias.py); ``"force"`` on any device (tests), ``False`` never.
    ``patch_conv``: on CUDA a convolution whose stride equals its kernel size, without padding (a
    vision transformer's patch embedding), is computed as a GEMM of the patches (Note [Patch
    convolutions as GEMMs]); ``"force"`` on any device (tests), ``False`` never.
    ``conv_fusion``: on CPU inference graphs, 2-D convolutions with their eval-mode BatchNorm
    folded in and ReLU / residual-add post-ops run as one oneDNN call (Note [Convolutions through
    oneDNN]), with its weights prepacked once per parameter version (``conv_prepack``: without
    prepacking the pass does not run, a per-call fold and reorder being slower than eager's
    convolution). ``linear_pack``: on CPU inference graphs, large linear layers through
    oneDNN with the weight prepacked per parameter version (Note [Packed linear layers]).
    ``onednn_bf16``: conv_fusion takes bfloat16 graphs too, where oneDNN has bfloat16 kernels
    for this CPU (Note [bfloat16 through oneDNN] in passes/prepack.py); ``False``: float32 only.
    ``linear_pack_bf16``: linear_pack takes bfloat16 products too (with ``onednn_bf16``); off by
    default, measured slower end to end (the same Note).
    ``conv_prepack`` and ``linear_pack`` are off by default, as torch.compile's freezing is: a
    parameter written through ``p.data`` (or by a fused optimizer) keeps its version, and a pack
    made before would be used with the old values where the write misses the bytes the pack's key
    samples (Notes [Prepacked weights], [Writes that do not move a version]); turn them on for
    models whose parameters are only changed in place by ordinary ops or optimizer steps, or not
    at all.
    ``view_scatter``: ``slice_scatter`` and ``select_scatter`` lower to pointwise kernels (Note
    [View scatters are pointwise] in lowerings/memory.py); ``False``: eager's kernels, as extern
    calls. Not a graph pass: a decision handed to lowering (``PassContext.extern_ops``).
    ``index_select``: ``index_select`` lowers to a gather kernel that fuses with its readers (Note
    [index_select is a gather] in lowerings/memory.py); ``False``: eager's kernel, as an extern
    call. A decision handed to lowering, as ``view_scatter``.
    ``pool_backward``: ``max_pool2d_with_indices_backward`` lowers to a gather kernel that fuses
    with its neighbours (Note [Max pooling backward as a gather] in lowerings/pooling.py), except
    on the CPU where windows overlap (Note [Overlapping max pooling backward on the CPU]);
    ``"force"``: the gather there too; ``False``: eager's kernel, as an extern call, everywhere.
    A decision handed to lowering, as ``view_scatter``.
    ``pool_values_max``: where nothing reads a ``max_pool2d_with_indices``' indices (inference),
    its values are a plain NaN-propagating maximum over the window, without the index chain (Note
    [Max pooling values without their indices] in lowerings/pooling.py); ``False``: the values
    keep the argmax's take condition. Also a decision handed to lowering.
    ``cse``: a node computing what an earlier node computes (the same pure operator on the same
    arguments) is replaced by it (Note [Common subexpressions of the graph] in passes/cse.py).
    ``shape_only_readers``: the realize heuristic does not count readers that take only a value's
    shape (``full_like``, ``zeros_like``, ...) as readers (Note [Why a value is realized] (c) in
    graph.py); off by default (measured slower on the one graph it changes, the Note says why
    not known); ``False``: every fx reader counts. Also a decision handed to lowering.
    ``outputs_read_back``: a graph output that other nodes read, whose body loads more than one
    buffer, is realized when it is computed and its readers load it (Note [Outputs read back] in
    graph.py: a training forward's saved residual sums, read by the next layer); ``False``: it is
    realized at the graph's end, and its readers recompute it. Also a decision handed to lowering.
    ``far_output_fusion``: the scheduler fuses a kernel that writes only graph outputs with a
    distant kernel that reads the same inputs (Note [Outputs fused across the graph] in
    scheduler.py: a training forward's saved residual sums); ``False``: horizontal fusion only
    within ``MAX_HORIZONTAL_DISTANCE``. A decision handed to the scheduler.
    ``tiny_fusion``: pointwise kernels of at most ``TINY_ELEMENTS`` elements fuse with each other
    though they share no buffer (Note [Tiny kernels fuse without a shared buffer] in
    scheduler.py: a training step's BatchNorm counters, one launch instead of one per counter);
    ``False``: they fuse only as other kernels do. A decision handed to the scheduler.
    ``late_placement``: the scheduler runs each kernel just before the first node that needs it
    (graph outputs and extern calls keep their place in the graph), not at its earliest fused
    member's place (Note [Kernels placed where they are first needed] in scheduler.py: a
    backward's recomputed forward values and the weight-gradient GEMMs that read them);
    ``False``: the earliest members' order. A decision handed to the scheduler.
    ``conv_grad_format``: on the CPU, a ``convolution_backward`` kept in eager's layouts whose
    gradient eager has in another memory format than the one oneDNN computes in (from the input
    and the weight) gets the gradient computed in that format where nothing has fixed its layout
    yet (Note [A convolution backward's gradient in oneDNN's format] in passes/channels_last.py);
    ``False``: the gradient in eager's strides, oneDNN converting it.
    ``depthwise_backward_nchw``: on the CPU, a float32 or bfloat16 depthwise ``convolution_backward`` whose
    kernel covers its whole output map gets its gradient and input NCHW, where oneDNN's kernel is
    several times faster than its NHWC one (Note [Depthwise convolution backwards on small maps]
    in passes/channels_last.py); ``False``: the operands in the graph's layout.
    ``var_mean``: a ``var.correction`` and a ``mean.dim`` of the same rows become one ``var_mean``,
    one Welford reduction with two outputs (Note [One Welford for a variance and its mean] in
    passes/var_mean.py); ``False``: the variance's Welford and a separate sum for the mean.
    ``nhwc_weights``: under the CUDA rule, a channels-last convolution takes its 4-D weight NHWC
    too, converted by a generated copy kernel in the graph, instead of by PyTorch's slower copy
    inside every ``convolution`` and ``convolution_backward`` call (Note [Convolution weights in
    NHWC] in passes/channels_last.py); ``False``: weights as they come. A decision handed to
    lowering.
    ``inplace_reuse``: a pointwise kernel writes its output over an input buffer it reads for the
    last time, at the same positions (Note [A kernel's output in place of an input that dies in
    it] in scheduler.py), where the backend says it can (``Backend.inplace_buffers``); ``False``:
    every output gets a buffer of its own or one freed before its kernel. A decision handed to
    the scheduler.
    ``outer_product``: on the CPU, a ``bmm``/``mm`` whose reduction length is one (an outer
    product) becomes a broadcast ``mul`` that fuses with its neighbours (Note [Outer products are
    multiplications] in passes/outer_product.py); ``False``: the GEMM as an extern call.
    ``native_small_conv``: in a CPU training graph, a small float32 convolution (and its backward)
    runs PyTorch's native im2col kernel instead of oneDNN (Note [Small convolutions outside
    oneDNN] in passes/native_conv.py); ``False``: oneDNN for every convolution. A decision handed
    to lowering.
    """

    layout: bool = True
    layout_policy: str = "auto"
    layout_per_batch: bool = True
    layout_training: bool = True
    cpu_layout_training: bool | str = True
    pad_mm: bool | str = True
    pad_mm_output_copy: bool | str = "user"
    attention: bool = True
    attention_mask: bool = True
    attention_dense_mask: bool | str = True
    conv_bias: bool | str = True
    conv_bias_grad: bool | str = True
    patch_conv: bool | str = True
    conv_fusion: bool = True
    conv_prepack: bool = False
    linear_pack: bool = False
    onednn_bf16: bool = True
    linear_pack_bf16: bool = False
    view_scatter: bool = True
    index_select: bool = True
    pool_backward: bool | str = True
    pool_values_max: bool = True
    shape_only_readers: bool = False
    outputs_read_back: bool = True
    cse: bool = True
    far_output_fusion: bool = True
    tiny_fusion: bool = True
    late_placement: bool = True
    var_mean: bool = True
    conv_grad_format: bool = True
    depthwise_backward_nchw: bool = True
    inplace_reuse: bool = True
    nhwc_weights: bool = True
    outer_product: bool = True
    native_small_conv: bool = True

    @staticmethod
    def from_mapping(options: Mapping[str, Any] | PassOptions | None) -> PassOptions:
        if isinstance(options, PassOptions):
            return options
        options = dict(options or {})
        known = {f.name for f in fields(PassOptions)}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown loopir pass options {sorted(unknown)}; supported: {sorted(known)}")
        made = PassOptions(**options)
        if made.layout_policy not in ("auto", "cpu", "cuda"):
            raise ValueError(f"layout_policy must be 'auto', 'cpu' or 'cuda', not {made.layout_policy!r}")
        switches = (
            made.layout,
            made.layout_per_batch,
            made.layout_training,
            made.attention,
            made.attention_mask,
            made.conv_fusion,
            made.conv_prepack,
            made.linear_pack,
            made.onednn_bf16,
            made.linear_pack_bf16,
            made.view_scatter,
            made.index_select,
            made.pool_values_max,
            made.shape_only_readers,
            made.outputs_read_back,
            made.cse,
            made.far_output_fusion,
            made.tiny_fusion,
            made.late_placement,
            made.var_mean,
            made.conv_grad_format,
            made.depthwise_backward_nchw,
            made.inplace_reuse,
            made.nhwc_weights,
            made.outer_product,
            made.native_small_conv,
        )
        if not all(isinstance(v, bool) for v in switches):
            raise ValueError(
                "layout, layout_per_batch, layout_training, attention, attention_mask, conv_fusion,"
                " conv_prepack, linear_pack, onednn_bf16, linear_pack_bf16, view_scatter, index_select,"
                " pool_values_max, shape_only_readers, outputs_read_back, cse, far_output_fusion, tiny_fusion, late_placement,"
                " var_mean, conv_grad_format, depthwise_backward_nchw, inplace_reuse,"
                " nhwc_weights, outer_product and native_small_conv"
                " are True or False"
            )
        if made.cpu_layout_training not in (True, False, "force"):
            raise ValueError(
                f"cpu_layout_training must be True, False or 'force', not {made.cpu_layout_training!r}"
            )
        if made.pad_mm_output_copy not in (True, False, "user"):
            raise ValueError(
                f"pad_mm_output_copy must be True, False or 'user', not {made.pad_mm_output_copy!r}"
            )
        if made.pool_backward not in (True, False, "force"):
            raise ValueError(f"pool_backward must be True, False or 'force', not {made.pool_backward!r}")
        if made.pad_mm not in (True, False, "force"):
            raise ValueError(f"pad_mm must be True, False or 'force', not {made.pad_mm!r}")
        if made.attention_dense_mask not in (True, False, "force"):
            raise ValueError(
                f"attention_dense_mask must be True, False or 'force', not {made.attention_dense_mask!r}"
            )
        if made.conv_bias not in (True, False, "force"):
            raise ValueError(f"conv_bias must be True, False or 'force', not {made.conv_bias!r}")
        if made.conv_bias_grad not in (True, False, "force"):
            raise ValueError(f"conv_bias_grad must be True, False or 'force', not {made.conv_bias_grad!r}")
        if made.patch_conv not in (True, False, "force"):
            raise ValueError(f"patch_conv must be True, False or 'force', not {made.patch_conv!r}")
        return made


OPTION_NAMES = tuple(f.name for f in fields(PassOptions))


@dataclass(frozen=True, slots=True)
class BatchSplit:
    """Where a call's batch is read (``example_inputs[input]``, itself when ``dim`` is None, else
    its size ``dim``) and the batch from which the channels-last layouts hold (Note [Both layouts
    under a symbolic batch])."""

    symbol: sympy.Symbol
    input: int
    dim: int | None
    start: int

    def batch_of(self, args: Sequence[Any]) -> int:
        value = args[self.input]
        return int(value if self.dim is None else value.shape[self.dim])


@dataclass(slots=True)
class PassContext:
    """What passes know about the compile, and the decisions they hand on to lowering."""

    device: torch.device
    options: PassOptions
    example_inputs: Sequence[Any]
    inference: bool
    # the code generator's Backend.scalar_gathers (Note [Overlapping max pooling backward on the CPU])
    scalar_gathers: bool = False
    # Note [Channels-last for convolutions]: the fx nodes computed in NHWC
    channels_last: set[torch.fx.Node] = field(default_factory=set)
    # Note [Both layouts under a symbolic batch]: set when ``channels_last`` holds only for calls
    # whose batch is at least ``start`` (smaller ones keep eager's layouts); None: for every call
    channels_last_from: BatchSplit | None = None
    # Note [A convolution backward's gradient in oneDNN's format]: convolution_backward nodes ->
    # the memory format their gradient is computed in where its layout is still free
    conv_grad_formats: dict[torch.fx.Node, torch.memory_format] = field(default_factory=dict)
    # Note [Depthwise convolution backwards on small maps]: convolution_backward nodes whose
    # gradient and input go in NCHW
    nchw_conv_backwards: set[torch.fx.Node] = field(default_factory=set)
    # Note [Convolution weights in NHWC]: the channels-last convolutions take their weights NHWC
    nhwc_weights: bool = False
    # Note [Small convolutions outside oneDNN]: convolution and convolution_backward nodes that
    # run PyTorch's native kernel
    native_convs: set[torch.fx.Node] = field(default_factory=set)
    # aten ops whose lowering an option turns off: they run as extern calls
    extern_ops: set[Any] = field(default_factory=set)
    # what each pass did, one line per decision (also logged): for tests and reports
    record: list[tuple[str, str]] = field(default_factory=list)

    def note(self, pass_name: str, message: str, *args: Any) -> None:
        text = message % args if args else message
        self.record.append((pass_name, text))
        log.debug("%s: %s", pass_name, text)


@dataclass(frozen=True, slots=True)
class GraphPass:
    """One pass: its name (the option that switches it) and what it does."""

    name: str
    run: Callable[[torch.fx.GraphModule, PassContext], torch.fx.GraphModule]
    enabled: Callable[[PassOptions], bool]


def copy_graph(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, dict[torch.fx.Node, torch.fx.Node]]:
    """A copy of ``gm`` to rewrite (node metas shallow-copied) and the map old node -> new node."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    # generated on demand, as aotgrad's graphs are (Note [Graph modules generated on demand] in
    # kiln_dynamo.fx_source): the passes rewrite the copy and recompile it, the lowering reads
    # only its graph
    copied = _LazyGraphModule(gm, graph)
    copied.meta.update(getattr(gm, "meta", {}))
    return copied, env


def _passes() -> tuple[GraphPass, ...]:
    from .attention import attention_pass
    from .channels_last import layout_pass
    from .conv_bias import conv_bias_grad_pass, conv_bias_pass
    from .conv_fusion import conv_fusion_pass
    from .cse import cse_pass
    from .linear_pack import linear_pack_pass
    from .native_conv import native_conv_pass
    from .outer_product import outer_product_pass
    from .pad_mm import pad_mm_pass
    from .patch_conv import patch_conv_pass
    from .var_mean import var_mean_pass

    return (
        GraphPass("attention", attention_pass, lambda o: o.attention),
        GraphPass("outer_product", outer_product_pass, lambda o: o.outer_product),
        GraphPass("patch_conv", patch_conv_pass, lambda o: o.patch_conv is not False),
        GraphPass("pad_mm", pad_mm_pass, lambda o: o.pad_mm is not False),
        GraphPass("conv_bias", conv_bias_pass, lambda o: o.conv_bias is not False),
        GraphPass("conv_bias_grad", conv_bias_grad_pass, lambda o: o.conv_bias_grad is not False),
        GraphPass("cse", cse_pass, lambda o: o.cse),
        GraphPass("var_mean", var_mean_pass, lambda o: o.var_mean),
        GraphPass("layout", layout_pass, lambda o: o.layout),
        GraphPass("native_small_conv", native_conv_pass, lambda o: o.native_small_conv),
        GraphPass("conv_fusion", conv_fusion_pass, lambda o: o.conv_fusion),
        GraphPass("linear_pack", linear_pack_pass, lambda o: o.linear_pack),
    )


def run_passes(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    device: torch.device,
    options: Mapping[str, Any] | PassOptions | None = None,
    *,
    inference: bool | None = None,
    scalar_gathers: bool = False,
) -> tuple[torch.fx.GraphModule, PassContext]:
    """Run every enabled pass over ``gm``; the graph to lower and the decisions made."""
    ctx = PassContext(
        device=device,
        options=PassOptions.from_mapping(options),
        example_inputs=example_inputs,
        inference=not torch.is_grad_enabled() if inference is None else inference,
        scalar_gathers=scalar_gathers,
    )
    for graph_pass in _passes():
        if not graph_pass.enabled(ctx.options):
            ctx.note(graph_pass.name, "off (option %s=False)", graph_pass.name)
            continue
        gm = graph_pass.run(gm, ctx)
    if not ctx.options.view_scatter:
        aten = torch.ops.aten
        ctx.extern_ops.update((aten.slice_scatter.default, aten.select_scatter.default))
        ctx.note(
            "view_scatter",
            "off (option view_scatter=False): slice_scatter/select_scatter run as extern calls",
        )
    selects = sum(1 for n in gm.graph.nodes if n.target is torch.ops.aten.index_select.default)
    if selects and not ctx.options.index_select:
        ctx.extern_ops.add(torch.ops.aten.index_select.default)
        ctx.note(
            "index_select", "off (option index_select=False): %d index_select run as extern calls", selects
        )
    elif selects:
        ctx.note(
            "index_select", "%d index_select lowered to gathers (index_select=False: extern calls)", selects
        )
    if not ctx.options.pool_backward:
        ctx.extern_ops.add(torch.ops.aten.max_pool2d_with_indices_backward.default)
        ctx.note(
            "pool_backward", "off (option pool_backward=False): max_pool2d backward runs as an extern call"
        )
    elif ctx.options.pool_backward is True and ctx.scalar_gathers:
        # Note [Overlapping max pooling backward on the CPU]
        from ..lowerings.pooling import overlapping_pool_backwards

        for node in overlapping_pool_backwards(gm):
            ctx.extern_ops.add(node)
            ctx.note(
                "pool_backward",
                "%s: overlapping windows run eager's scatter as an extern call (the gather would be scalar)"
                " (pool_backward='force': the gather kernel)",
                node.name,
            )
    if not ctx.options.pool_values_max:
        ctx.note(
            "pool_values_max",
            "off (option pool_values_max=False): max_pool2d values keep the argmax's take condition",
        )
    if ctx.options.shape_only_readers:
        ctx.note("shape_only_readers", "on: full_like and friends do not count as readers of a value")
    if not ctx.options.outputs_read_back:
        ctx.note(
            "outputs_read_back",
            "off: graph outputs are realized at the graph's end, their readers recompute them",
        )
    return gm, ctx


def prepare_torch_graph(
    gm: torch.fx.GraphModule,
    options: Mapping[str, Any] | PassOptions | None = None,
    record: list[str] | None = None,
) -> torch.fx.GraphModule:
    """The passes over a torch-level graph (before aotgrad traces it); ``gm`` itself when none
    applies, else a rewritten copy (the caller's graph is never edited)."""
    from .attention_mask import unmask_row_constant_attention

    opts = PassOptions.from_mapping(options)
    if not opts.attention_mask:
        log.debug("attention_mask: off (option attention_mask=False)")
    if not opts.attention_dense_mask:
        log.debug("attention_mask: dense masks off (option attention_dense_mask=False)")
    if not (opts.attention_mask or opts.attention_dense_mask):
        return gm
    return unmask_row_constant_attention(
        gm,
        record,
        row_constant=opts.attention_mask,
        dense=bool(opts.attention_dense_mask),
        dense_any_device=opts.attention_dense_mask == "force",
    )


__all__ = [
    "OPTION_NAMES",
    "GraphPass",
    "PassContext",
    "PassOptions",
    "copy_graph",
    "prepare_torch_graph",
    "run_passes",
]
