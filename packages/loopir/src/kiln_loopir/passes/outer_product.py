"""Matrix products with a reduction length of one become broadcast multiplications.

Note [Outer products are multiplications]: a ``bmm`` of a [B, M, 1] by a [B, 1, N] operand (or an
``mm`` of [M, 1] by [1, N]) reduces over one element: each output is one product. Called as a
GEMM it is an extern call (the library's setup, and the wrapper's views of both operands and of
its result) whose result the generated code cannot fuse; as ``mul(a, b)`` it is a pointwise kernel
that fuses with its producers and readers. The values are the same: a GEMM's single product,
accumulated into zero and rounded once to the result's dtype, is the multiplication's (bfloat16's
too: both compute in float32 and round once); only the sign of a zero may differ (0 + -0 is +0),
which compares equal. They come from attention over one key or one query (a spatial-reduction
attention whose keys are pooled to one position: PVT v2's deep stages at 32 px) and from the backward of a matrix-vector product,
whose input gradient is the outer product of the output gradient and the vector. torch.compile's
decompositions do the same for ``bmm`` (``torch/_inductor/decomposition.py``). Measured (cpu31,
``packages/bench/results/2026-12-07-cpu-s31-train1.md``): PVT v2's training step 24 -> 14 bmm calls,
121 -> 111 extern calls; PVT v2, LeViT and MobileViT training at one thread 1.3% faster in the
geomean of seven interleaved A/B pairs (each within this shared machine's noise), at two threads
4-6% faster; no graph of the public suite has such a product.

CPU graphs only, for now: the Triton code generator would take the same graph, but the rewrite
was not timed on a GPU. Switch: ``options={"outer_product": False}`` keeps the GEMMs;
``KILN_LOG=passes`` prints each product rewritten.
"""

from __future__ import annotations

import torch
import torch.fx

from . import PassContext, copy_graph

aten = torch.ops.aten


def _shape(node: object) -> tuple[int, ...] | None:
    """The static shape of a node's tensor value; None where unknown or symbolic."""
    if not isinstance(node, torch.fx.Node):
        return None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return tuple(val.shape)


def _is_outer(node: torch.fx.Node) -> bool:
    """``node`` is a bmm or mm whose reduction length is one, operands of one dtype, no out dtype."""
    if node.op != "call_function" or node.kwargs or len(node.args) != 2:
        return False
    a, b = node.args
    sa, sb = _shape(a), _shape(b)
    if sa is None or sb is None:
        return False
    if node.target is aten.bmm.default:
        ok = len(sa) == 3 and len(sb) == 3 and sa[2] == 1 and sb[1] == 1
    elif node.target is aten.mm.default:
        ok = len(sa) == 2 and len(sb) == 2 and sa[1] == 1 and sb[0] == 1
    else:
        return False
    va, vb, out = a.meta["val"], b.meta["val"], node.meta.get("val")  # type: ignore[union-attr]
    return ok and va.dtype == vb.dtype and isinstance(out, torch.Tensor) and out.dtype == va.dtype


def outer_product_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Rewrite each ``bmm``/``mm`` of reduction length one into ``mul`` (Note [Outer products are
    multiplications])."""
    if ctx.device.type != "cpu":
        return gm
    found = [n for n in gm.graph.nodes if _is_outer(n)]
    if not found:
        return gm
    gm, env = copy_graph(gm)
    graph = gm.graph
    for old in found:
        node = env[old]
        a, b = node.args
        with graph.inserting_before(node):
            mul = graph.call_function(aten.mul.Tensor, (a, b))
        mul.meta.update(node.meta)
        node.replace_all_uses_with(mul)
        graph.erase_node(node)
        name = getattr(old.target, "__name__", str(old.target))
        shapes = [list(_shape(x) or ()) for x in old.args]
        ctx.note(
            "outer_product",
            "%s: %s of %s by %s (reduction length 1) is a broadcast mul",
            old.name,
            name,
            *shapes,
        )
    graph.lint()
    gm.recompile()
    return gm
