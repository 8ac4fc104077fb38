"""The conv_fusion pass (CPU inference): a convolution, its frozen BatchNorm and its post-ops, one oneDNN call.

Note [Convolutions through oneDNN]: on the CPU, in an inference graph, each 2-D float32 (or
bfloat16: Note [bfloat16 through oneDNN] in prepack.py) convolution becomes one call of oneDNN's fused convolution (``mkldnn._convolution_pointwise``),
which takes:

* the per-channel affine map that follows it, folded into its weight and bias: a chain of
  ``add`` / ``sub`` / ``mul`` by per-channel values computed from small graph inputs only (an
  eval-mode BatchNorm, as aotgrad decomposes it: ``(conv - mean) * rsqrt(var + eps) * gamma +
  beta``), so ``y = conv * S + T`` per channel, ``w' = w * S``, ``b' = b * S + T``;
* a ReLU after that (a *unary post-op*), and a residual ``add`` of a tensor of the same shape,
  optionally followed by ReLU (a *binary post-op*: ResNet's ``relu(bn(conv(x)) + shortcut)``);
* its weight *prepacked* into oneDNN's blocked layout for this input size, so the weight is not
  reordered on every call (the cost that made the layout rule keep small-image ResNets NCHW).

The per-channel values are computed by a small graph (the nodes between the BatchNorm's
parameters and the chain, moved out of the graph into the op) from the graph's own inputs, so
the folded and packed weight is always made from the current parameters, and is cached per
parameter version (Note [Prepacked weights] in prepack.py): the weight, the bias and the affine
map's inputs are its sources, the last by value (Note [Running statistics move without a
version]).

The statistics are frozen in such a graph by construction: BatchNorm is traced to the running
statistics' op only when the module is in eval mode (``train()`` changes the module state
dynamo guards on, so the graph is traced again, with batch statistics, which are activations and
never fold), and the pass runs only on inference graphs (no gradient needed;
``PassContext.inference``): a parameter that starts requiring grad under grad mode recompiles
into a training graph, which keeps every op as it is.

The result is channels-last, as oneDNN gives it; the layout rule computes the graph channels-last
when this pass will run (``cpu_policy``), so the pointwise kernels between convolutions read and
write NHWC and no conversion is left between them. The pass runs only where that rule decides
(``layout`` on, ``layout_policy`` ``"auto"`` or ``"cpu"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from . import PassContext, copy_graph
from .channels_last import conv2d_nodes
from .prepack import PackCache, dtypes

aten = torch.ops.aten

RELU = aten.relu.default
AFFINE = {aten.add.Tensor: "add", aten.sub.Tensor: "sub", aten.mul.Tensor: "mul"}
# ops the per-channel values may be computed with (from graph inputs of at most C elements)
PARAM_OPS = frozenset({
    aten._to_copy.default, aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.mul.Tensor,
    aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.neg.default, aten.sqrt.default,
    aten.rsqrt.default, aten.reciprocal.default, aten.unsqueeze.default, aten.view.default,
    aten.reshape.default, aten.squeeze.dim, aten.clone.default,
})  # fmt: skip


def enabled_on(ctx: PassContext) -> str | None:
    """Why the pass does not run on this graph, or None when it does."""
    if not ctx.options.conv_fusion:
        return "off (option conv_fusion=False)"
    if not ctx.options.conv_prepack:
        # measured at one thread: ResNet 7.3 ms folded and reordered on every call, 3.0 ms through
        # aten's convolution, 2.8 ms prepacked; so only prepacked weights pay (Note [Prepacked weights])
        return "weights not prepacked (conv_prepack=False, the default)"
    if ctx.device.type != "cpu":
        return f"not a CPU graph ({ctx.device.type})"
    if not ctx.options.layout or ctx.options.layout_policy not in ("auto", "cpu"):
        # its results are NHWC: it runs where the CPU layout rule decides the graph's layouts
        return "the CPU layout rule is off (options layout / layout_policy)"
    if not ctx.inference:
        return "training graph"
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return "oneDNN unavailable or disabled"
    return None


@dataclass(frozen=True, slots=True)
class ConvSpec:
    """The static part of one fused convolution."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    input_size: tuple[int, ...]
    # the folded affine chain: (op, conv_first) per step, op in "add" / "sub" / "mul"
    affine: tuple[tuple[str, bool], ...]
    unary: str  # "none" or "relu" (after the binary op when there is one)
    binary: bool  # a residual add


class FusedConv:
    """The run-time op of one fused convolution (Note [Convolutions through oneDNN]).

    Called as ``op(x, weight, bias, other, *leaves)``: ``other`` the residual (or None),
    ``leaves`` the inputs of ``values``, the graph that computes the affine chain's per-channel
    operands. On ``device="meta"`` tensors it returns the output's meta value."""

    def __init__(self, spec: ConvSpec, values: torch.fx.GraphModule | None, name: str) -> None:
        self.spec = spec
        self.values = values
        self.name = name
        # torch.fx prints a call_function target by name (generated code, KILN_LOG=graph)
        self.__name__ = self.__qualname__ = f"kiln_conv_fusion_{name}"
        self.cache = PackCache()

    def __repr__(self) -> str:
        spec = self.spec
        parts = ["affine" if spec.affine else "", "add" if spec.binary else "", spec.unary]
        return f"kiln_conv_fusion[{self.name}: {'+'.join(p for p in parts if p and p != 'none') or 'conv'}]"

    def _fold(
        self, weight: torch.Tensor, bias: torch.Tensor | None, leaves: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.spec.affine:
            return weight, bias
        assert self.values is not None
        channels = weight.shape[0]
        operands = self.values(*leaves)
        # in float32, rounded once to the weight's dtype (Note [bfloat16 through oneDNN])
        f32 = torch.float32
        scale = torch.ones(channels, dtype=f32)
        shift = torch.zeros(channels, dtype=f32) if bias is None else bias.to(f32)
        for (op, conv_first), operand in zip(self.spec.affine, operands, strict=True):
            v = operand.to(f32).reshape(-1).expand(channels)
            if op == "add":
                shift = shift + v
            elif op == "sub" and conv_first:
                shift = shift - v
            elif op == "sub":
                scale, shift = -scale, v - shift
            else:
                scale, shift = scale * v, shift * v
        folded = weight.to(f32) * scale.reshape(-1, *([1] * (weight.dim() - 1)))
        return folded.to(weight.dtype), shift.to(weight.dtype)

    def _packed(
        self, weight: torch.Tensor, bias: torch.Tensor | None, leaves: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        def pack() -> tuple[torch.Tensor, torch.Tensor | None]:
            folded_w, folded_b = self._fold(weight, bias, leaves)
            spec = self.spec
            packed = torch.ops.mkldnn._reorder_convolution_weight(
                folded_w.contiguous(),
                list(spec.padding),
                list(spec.stride),
                list(spec.dilation),
                spec.groups,
                list(spec.input_size),
            )
            return packed, None if folded_b is None else folded_b.contiguous()

        # the leaves by value: Note [Running statistics move without a version] in prepack.py
        packed: tuple[torch.Tensor, torch.Tensor | None] = self.cache.get((weight, bias), pack, small=leaves)
        return packed

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        other: torch.Tensor | None,
        *leaves: torch.Tensor,
    ) -> torch.Tensor:
        spec = self.spec
        pad, stride, dil = list(spec.padding), list(spec.stride), list(spec.dilation)
        if x.device.type == "meta":
            out = aten.convolution.default(x, weight, bias, stride, pad, dil, False, [0, 0], spec.groups)
            return out.contiguous(memory_format=torch.channels_last)
        w, b = self._packed(weight, bias, leaves)
        conv = torch.ops.mkldnn._convolution_pointwise
        if spec.binary:
            assert other is not None
            # no unary post-op after the add is None there: "none" fails at run time ("Unary
            # Fusion behavior undefined"; MobileNetV2's residual blocks end in a plain add)
            unary = None if spec.unary == "none" else spec.unary
            return conv.binary(x, other, w, b, pad, stride, dil, spec.groups, "add", None, unary, [], "")
        return conv.default(x, w, b, pad, stride, dil, spec.groups, spec.unary, [], "")


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _dense(v: torch.Tensor) -> bool:
    """Dense in NCHW or NHWC: what oneDNN takes without a copy (a slice of a ``cat`` is not)."""
    return v.is_contiguous() or (v.dim() == 4 and v.is_contiguous(memory_format=torch.channels_last))


def takes_dtype(conv: torch.fx.Node, ctx: PassContext) -> bool:
    """Whether the pass takes this convolution's dtype (Note [bfloat16 through oneDNN])."""
    x, w = _val(conv.args[0]), _val(conv.args[1])
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)):
        return False
    b = _val(conv.args[2]) if len(conv.args) > 2 else None
    return x.dtype in dtypes(ctx.options) and w.dtype == x.dtype and (b is None or b.dtype == x.dtype)


def _eligible(conv: torch.fx.Node, ctx: PassContext) -> str | None:
    """Why this convolution stays an aten call, or None."""
    x, w, out = _val(conv.args[0]), _val(conv.args[1]), _val(conv)
    if not all(isinstance(v, torch.Tensor) for v in (x, w, out)):
        return "no shape metadata"
    if not takes_dtype(conv, ctx):
        return f"dtype {x.dtype}" + ("" if ctx.options.onednn_bf16 else " (onednn_bf16=False)")
    if not _dense(x):
        return "input is a strided view"
    if not all(isinstance(s, int) for v in (x, w) for s in v.shape):
        return "symbolic sizes"
    transposed = conv.args[6] if len(conv.args) > 6 else False
    if transposed:
        return "transposed"
    bias = conv.args[2]
    if bias is not None and not isinstance(_val(bias), torch.Tensor):
        return "bias without metadata"
    return None


def _per_channel(v: Any, channels: int, out: torch.Tensor) -> bool:
    """Whether ``v`` broadcasts against the [N, C, H, W] ``out`` along C only (in ``out``'s dtype,
    or float32: Note [BatchNorm of a bfloat16 convolution folds in float32])."""
    if not isinstance(v, torch.Tensor) or v.dtype not in (out.dtype, torch.float32) or v.dim() > 4:
        return False
    shape = [1] * (4 - v.dim()) + [int(s) for s in v.shape]
    return shape[0] == 1 and shape[2] == 1 and shape[3] == 1 and shape[1] in (1, channels)


def _param_side(node: torch.fx.Node, channels: int) -> list[torch.fx.Node] | None:
    """The nodes computing ``node`` from graph inputs of at most ``channels`` elements through
    :data:`PARAM_OPS` (topological order, placeholders included), or None if it is not such."""
    seen: dict[torch.fx.Node, None] = {}

    def visit(n: torch.fx.Node) -> bool:
        if n in seen:
            return True
        if n.op == "placeholder":
            v = _val(n)
            ok = isinstance(v, torch.Tensor) and v.numel() <= channels
        elif n.op == "call_function" and n.target in PARAM_OPS:
            ok = all(visit(a) for a in n.all_input_nodes)
        else:
            ok = False
        if ok:
            seen[n] = None
        return ok

    return list(seen) if visit(node) else None


def _values_graph(operands: list[torch.fx.Node], nodes: list[torch.fx.Node]) -> tuple[
    torch.fx.GraphModule, list[torch.fx.Node]
]:  # fmt: skip
    """A graph of ``nodes`` returning ``operands``; and the placeholders it takes, in order."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    leaves = [n for n in nodes if n.op == "placeholder"]
    for leaf in leaves:
        env[leaf] = graph.placeholder(leaf.name)
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    for n in sorted((n for n in nodes if n.op != "placeholder"), key=order.__getitem__):
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(tuple(env[o] for o in operands))
    return torch.fx.GraphModule(torch.nn.Module(), graph), leaves


def _back_to(node: torch.fx.Node | None, dtype: torch.dtype) -> bool:
    """Whether ``node`` only converts its input to ``dtype`` (aotgrad's ``_to_copy(x, dtype=)``)."""
    return (
        node is not None
        and node.target is aten._to_copy.default
        and len(node.args) == 1
        and set(node.kwargs) == {"dtype"}
        and node.kwargs["dtype"] == dtype
    )


# Note [BatchNorm of a bfloat16 convolution folds in float32]: aotgrad decomposes an eval-mode
# BatchNorm of a bfloat16 tensor in float32, as eager computes it: its statistics converted up,
# ``(conv - mean)`` promoted to float32 by the float32 mean, the chain in float32, and a
# ``_to_copy(dtype=bfloat16)`` at its end. The chain folds when that conversion closes it: the
# fused op's bfloat16 result is then the chain's, rounded once (eager rounds the convolution's
# result too, before the chain). A chain whose float32 values leave otherwise (a float32 graph
# output) is cut where its values stop being the convolution's dtype, and the rest stays loopir's.
def _fusion(conv: torch.fx.Node) -> tuple[list[torch.fx.Node], list[tuple[str, bool]], list[torch.fx.Node],
                                          list[torch.fx.Node], torch.fx.Node | None, str, torch.fx.Node]:  # fmt: skip
    """What follows ``conv`` that folds into it: (chain nodes, affine steps, their operands, the
    nodes computing the operands, residual, unary op, the last node)."""
    out = _val(conv)
    channels = int(out.shape[1])
    last = conv
    chain: list[torch.fx.Node] = []
    steps: list[tuple[str, bool]] = []
    operands: list[torch.fx.Node] = []
    sides: list[list[torch.fx.Node]] = []
    while (
        (nxt := _only_user(last)) is not None
        and nxt.target in AFFINE
        and len(nxt.args) == 2
        and not nxt.kwargs
    ):
        a, b = nxt.args
        conv_first = a is last
        v = b if conv_first else a
        if v is last or not isinstance(v, torch.fx.Node) or not _per_channel(_val(v), channels, out):
            break
        if _val(nxt) is None or tuple(_val(nxt).shape) != tuple(out.shape):
            break
        nodes = _param_side(v, channels)
        if nodes is None:
            break
        sides.append(nodes)
        chain.append(nxt)
        steps.append((AFFINE[nxt.target], conv_first))
        operands.append(v)
        last = nxt
    if _val(last).dtype != out.dtype:  # Note [BatchNorm of a bfloat16 convolution folds in float32]
        user = _only_user(last)
        if user is not None and _back_to(user, out.dtype):
            last = user
            chain.append(last)
        else:
            keep = next(i for i, n in enumerate(chain) if _val(n).dtype != out.dtype)
            del chain[keep:], steps[keep:], operands[keep:], sides[keep:]
            last = chain[-1] if chain else conv
    side = {n: None for nodes in sides for n in nodes}
    other: torch.fx.Node | None = None
    nxt = _only_user(last)
    if nxt is not None and nxt.target is aten.add.Tensor and len(nxt.args) == 2 and not nxt.kwargs:
        a, b = nxt.args
        cand = b if a is last else a if b is last else None
        cv = _val(cand)
        if (
            isinstance(cand, torch.fx.Node)
            and cand is not last
            and isinstance(cv, torch.Tensor)
            and tuple(cv.shape) == tuple(out.shape)
            and cv.dtype == out.dtype
            and _dense(cv)
        ):
            other, last = cand, nxt
            chain.append(nxt)
    unary = "none"
    nxt = _only_user(last)
    if nxt is not None and nxt.target is RELU and not (other is not None and _unfused_add_relu(conv)):
        unary, last = "relu", nxt
        chain.append(nxt)
    return chain, steps, operands, list(side), other, unary, last


# Note [A grouped convolution's add and ReLU in bfloat16]: oneDNN's binary convolution
# (``mkldnn._convolution_pointwise.binary``) fuses only convolutions of one group; a grouped or
# depthwise one takes its unfused path, which computes ``add`` + ReLU with PyTorch's
# ``add_relu_``, a kernel with no bfloat16 or float16 version on the CPU ("Unsupported datatype for
# add_relu": the graph failed at run time and ran eagerly; CPU convolution fuzzer seed 1196, a
# depthwise 1x1 convolution with a residual add and ReLU). For such a convolution in those dtypes
# the ReLU is left out of the fused op (the add stays in it: the unfused path adds in place) and
# stays a pointwise kernel of loopir's.
def _unfused_add_relu(conv: torch.fx.Node) -> bool:
    """Would oneDNN's binary convolution compute ``conv``'s add + ReLU with a kernel its dtype
    lacks (Note [A grouped convolution's add and ReLU in bfloat16])?"""
    groups = conv.args[8] if len(conv.args) > 8 else 1
    return bool(groups != 1) and _val(conv).dtype in (torch.bfloat16, torch.float16)


def conv_fusion_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Replace eligible convolutions (and what they fuse) by :class:`FusedConv` calls."""
    reason = enabled_on(ctx)
    convs = conv2d_nodes(gm)
    if reason is not None:
        if convs:
            ctx.note("conv_fusion", "%s", reason)
        return gm
    if not convs:
        return gm
    gm, env = copy_graph(gm)
    channels_last = {env[n] for n in ctx.channels_last if n in env}
    graph = gm.graph
    fused = 0
    for old in convs:
        conv = env[old]
        why = _eligible(conv, ctx)
        if why is not None:
            ctx.note("conv_fusion", "%s stays aten: %s", conv.name, why)
            continue
        args: tuple[Any, ...] = tuple(conv.args)
        x, w, b, stride, padding, dilation = args[:6]
        groups = int(args[8]) if len(args) > 8 else 1
        chain, steps, operands, side, other, unary, last = _fusion(conv)
        values, leaves = _values_graph(operands, side) if operands else (None, [])
        spec = ConvSpec(
            tuple(int(s) for s in stride),
            tuple(int(p) for p in padding),
            tuple(int(d) for d in dilation),
            groups,
            tuple(int(s) for s in _val(x).shape),
            tuple(steps),
            unary,
            other is not None,
        )
        op = FusedConv(spec, values, conv.name)
        with graph.inserting_before(last):
            new = graph.call_function(op, (x, w, b, other, *leaves))
        # the value eager gives (a graph output keeps its strides); lowering computes it NHWC
        new.meta = dict(last.meta)
        last.replace_all_uses_with(new)
        for n in [*reversed(chain), conv]:
            channels_last.discard(n)
            graph.erase_node(n)
        # NHWC as oneDNN returns it; a graph output is copied back to eager's strides
        channels_last.add(new)
        fused += 1
        ctx.note(
            "conv_fusion",
            "%s -> %r (%d affine steps folded, weights prepacked)",
            conv.name,
            op,
            len(steps),
        )
    graph.eliminate_dead_code()
    gm.recompile()
    ctx.channels_last = {n for n in channels_last if n.graph is graph and n in graph.nodes}
    ctx.note("conv_fusion", "%d of %d convolutions through oneDNN", fused, len(convs))
    return gm


__all__ = ["ConvSpec", "FusedConv", "conv_fusion_pass", "enabled_on", "takes_dtype"]
