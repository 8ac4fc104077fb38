"""The linear_pack pass (CPU inference): large linear layers through oneDNN with a prepacked weight.

Note [Packed linear layers]: in an inference graph on the CPU, ``addmm(bias, x, W)`` and
``mm(x, W)`` whose ``W`` is a graph input (a parameter: ``nn.Linear``'s ``permute(w, [1, 0])`` or
``Conv1D``'s plain ``[in, out]`` weight), float32 (or bfloat16 with ``linear_pack_bf16``: Note
[bfloat16 through oneDNN] in prepack.py), become ``mkldnn._linear_pointwise`` with the weight
packed once per parameter version (Note [Prepacked weights] in prepack.py). Measured on this
project's 2-core AVX2 machine at one thread, float32, interleaved against ``addmm`` (two runs):
0.85-0.96x the time at 256x256x768, 256x256x1024 and 256x1024x256, even at 256x256x256, no gain
at 64x256x256 (a weight that small stays in cache), hence the threshold :data:`MIN_MACS` on
``M * K * N``; MKL's packed GEMM (``mkl._mkl_linear``) gained nothing over ``addmm`` there. In
bfloat16 (this machine has AMX, twenty-ninth session; one thread, CPU time, medians of 200 calls)
the packed call took 0.52-0.89x ``addmm``'s time from 8x128x128 (0.1 M MACs) to 512x768x3072,
0.95x at 8x32x32; the run-time op's own Python (the pack cache's key) costs ~1-2 us a call, and
end to end the MLP of the public suite (five 64x256x256-or-smaller products) gained nothing
measurable: hence :data:`MIN_MACS_BF16`, far lower, and still where the gain is 10 us or more. Epilogues
(bias excepted) stay loopir's: a pointwise kernel after the product, as without the pass.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from . import PassContext, copy_graph
from .prepack import PackCache, dtypes

aten = torch.ops.aten

# M * K * N below which addmm stays (see the module docstring)
MIN_MACS = 1 << 24
# the same in bfloat16 (see the module docstring)
MIN_MACS_BF16 = 1 << 20


def enabled_on(ctx: PassContext) -> str | None:
    """Why the pass does not run on this graph, or None when it does."""
    if not ctx.options.linear_pack:
        return "off (option linear_pack=False)"
    if ctx.device.type != "cpu":
        return f"not a CPU graph ({ctx.device.type})"
    if not ctx.inference:
        return "training graph"
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return "oneDNN unavailable or disabled"
    return None


class PackedLinear:
    """The run-time op ``op(x, weight, bias)``: ``weight`` as the graph input holds it, ``[out,
    in]`` (``transposed``, nn.Linear's) or ``[in, out]`` (Conv1D's)."""

    def __init__(self, transposed: bool, batch: int, name: str) -> None:
        self.transposed = transposed
        self.batch = batch
        self.name = name
        self.__name__ = self.__qualname__ = f"kiln_linear_pack_{name}"  # how torch.fx prints it
        self.cache = PackCache()

    def __repr__(self) -> str:
        return f"kiln_linear_pack[{self.name}]"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        w = weight if self.transposed else weight.t()
        if x.device.type == "meta":
            return torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device="meta")

        def pack() -> torch.Tensor:
            return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), self.batch)

        packed: torch.Tensor = self.cache.get((weight,), pack)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _weight(node: Any) -> tuple[torch.fx.Node, bool] | None:
    """(the graph input holding ``W``, whether it is stored transposed), or None."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.op == "placeholder":
        return node, False
    if node.target is aten.permute.default and list(node.args[1]) == [1, 0]:  # type: ignore[arg-type]
        src = node.args[0]
        if isinstance(src, torch.fx.Node) and src.op == "placeholder":
            return src, True
    if node.target is aten.t.default:
        src = node.args[0]
        if isinstance(src, torch.fx.Node) and src.op == "placeholder":
            return src, True
    return None


def _candidate(node: torch.fx.Node, taken: tuple[torch.dtype, ...]) -> tuple[Any, Any, Any, bool] | None:
    """(x, weight input, bias, transposed) of an addmm / mm this pass takes, else None."""
    if node.target is aten.addmm.default and len(node.args) == 3 and not node.kwargs:
        bias, x, mat2 = node.args
    elif node.target is aten.mm.default and len(node.args) == 2:
        (x, mat2), bias = node.args, None
    else:
        return None
    found = _weight(mat2)
    if found is None:
        return None
    weight, transposed = found
    xv, wv, out = _val(x), _val(weight), _val(node)
    if not all(isinstance(v, torch.Tensor) for v in (xv, wv, out)):
        return None
    if xv.dtype not in taken or wv.dtype != xv.dtype or xv.dim() != 2 or wv.dim() != 2:
        return None  # Note [bfloat16 through oneDNN]
    if not all(isinstance(s, int) for s in (*xv.shape, *wv.shape)):
        return None
    if bias is not None:
        bv = _val(bias)
        if not (isinstance(bv, torch.Tensor) and bv.dim() == 1 and bv.dtype == xv.dtype):
            return None  # a broadcast [M, N] bias is not a linear layer's
    m, k = (int(s) for s in xv.shape)
    if m * k * int(out.shape[1]) < (MIN_MACS if xv.dtype == torch.float32 else MIN_MACS_BF16):
        return None
    return x, weight, bias, transposed


def linear_pack_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Replace large linear layers by :class:`PackedLinear` calls."""
    reason = enabled_on(ctx)
    products = [n for n in gm.graph.nodes if n.target in (aten.addmm.default, aten.mm.default)]
    if reason is not None:
        if products:
            ctx.note("linear_pack", "%s", reason)
        return gm
    taken = dtypes(ctx.options, linear=True)
    found = [(n, c) for n in products if (c := _candidate(n, taken)) is not None]
    if not found:
        if products:
            ctx.note("linear_pack", "0 of %d products packed (small, or not a weight)", len(products))
        return gm
    gm, env = copy_graph(gm)
    graph = gm.graph
    for old, (x, weight, bias, transposed) in found:
        node = env[old]
        op = PackedLinear(transposed, int(_val(x).shape[0]), node.name)
        with graph.inserting_before(node):
            new = graph.call_function(op, (env[x], env[weight], None if bias is None else env[bias]))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        ctx.note("linear_pack", "%s %s -> %r", old.target, tuple(_val(old).shape), op)
    graph.eliminate_dead_code()
    gm.recompile()
    ctx.note("linear_pack", "%d of %d products packed", len(found), len(products))
    return gm


__all__ = ["MIN_MACS", "MIN_MACS_BF16", "PackedLinear", "enabled_on", "linear_pack_pass"]
