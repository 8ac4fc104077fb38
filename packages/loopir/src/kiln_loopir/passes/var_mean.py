"""A variance and a mean of the same rows become one ``var_mean``: one Welford, two outputs.

Note [One Welford for a variance and its mean]: decompositions state layer, group and batch norm
with ``var_mean``, and aotgrad's table splits ``var_mean`` into ``var.correction`` and ``mean.dim``
over the same input (two core reductions; Note in kiln_aotgrad's decompositions). Lowered as they
stand, the variance is a Welford whose running mean is thrown away, and the mean is a second,
plain sum of the same elements: on CPU both accumulate in the same pass, but the mean the
normalization subtracts is the float sum's (3x eager's error on rows of 1000 + randn(768), cpu17's
measurement) and the row is reduced twice. This pass puts them back together where they say the
same rows: the same input node, the same reduced dimensions (normalized), the same ``keepdim``, a
mean without a ``dtype`` (or with the input's), and a static count of reduced elements. The ``var_mean`` lowering gives both statistics
of one Welford reduction, so both code generators see one reduction with two outputs; what the
Welford is made of on each device is the generator's (Note [Shifted Welford blocks] in
kiln_codegen_cpp).

(b) The mean stays ``mean.dim``'s at the edges where a sum and Welford differ: a row whose
elements' sum overflows has the sum's mean, +-inf (eager's ``mean.dim`` sums in float; Welford's
running mean stays finite): the merged mean is ``where(isinf(m * n), m * n, m)``, a scalar per row
fused into the reduction's kernel. A mean of finite values and an infinity is that infinity
(``welford_merge`` in kiln_codegen_cpp takes it as a sum does).

(c) CPU graphs only, for now: Triton's Welford combine was not checked at rows holding an
infinity (it would give NaN where ``mean.dim`` gives inf), nor timed on a GPU.

Switch: ``options={"var_mean": False}``; ``KILN_LOG=passes`` prints each pair merged.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx

from . import PassContext, copy_graph

aten = torch.ops.aten


def _dims(node: torch.fx.Node, dims: Any) -> tuple[int, ...] | None:
    """``dims`` of ``node``'s value sorted and made nonnegative; None where that is not known
    (no meta value: only nonnegative dims are taken as they are)."""
    val = node.meta.get("val")
    rank = val.dim() if isinstance(val, torch.Tensor) else None
    if rank == 0:  # a scalar: dim 0 / -1 name the scalar itself, nothing to reduce (its count 1)
        return ()
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return None if rank is None else tuple(range(rank))
    items = [dims] if isinstance(dims, int) else list(dims)
    if not all(isinstance(d, int) for d in items):
        return None
    if rank is None:
        return tuple(sorted(items)) if all(d >= 0 for d in items) else None
    return tuple(sorted(d % rank for d in items))


def _var_key(node: torch.fx.Node) -> tuple[torch.fx.Node, tuple[int, ...], bool] | None:
    if node.target is not aten.var.correction or not isinstance(node.args[0], torch.fx.Node):
        return None
    x = node.args[0]
    dims = _dims(x, node.args[1] if len(node.args) > 1 else node.kwargs.get("dim"))
    if dims is None:
        return None
    return x, dims, bool(node.kwargs.get("keepdim", False))


def _mean_key(node: torch.fx.Node) -> tuple[torch.fx.Node, tuple[int, ...], bool] | None:
    if node.target is not aten.mean.dim or not isinstance(node.args[0], torch.fx.Node):
        return None
    x = node.args[0]
    dtype = node.args[3] if len(node.args) > 3 else node.kwargs.get("dtype")
    val = x.meta.get("val")
    if dtype is not None and not (isinstance(val, torch.Tensor) and dtype == val.dtype):
        return None
    dims = _dims(x, node.args[1])
    if dims is None:
        return None
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    return x, dims, bool(keepdim)


def _count(x: torch.fx.Node, dims: tuple[int, ...]) -> int | None:
    val = x.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    sizes = [val.shape[d] for d in dims]
    return math.prod(sizes) if all(isinstance(n, int) for n in sizes) else None


def var_mean_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Merge each ``var.correction`` with a ``mean.dim`` of the same rows into one ``var_mean``."""
    if ctx.device.type != "cpu":  # (c) of the Note
        ctx.note("var_mean", "not on %s", ctx.device.type)
        return gm
    variances: dict[tuple[torch.fx.Node, tuple[int, ...], bool], torch.fx.Node] = {}
    means: dict[tuple[torch.fx.Node, tuple[int, ...], bool], torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if (key := _var_key(node)) is not None:
            variances.setdefault(key, node)
        elif (key := _mean_key(node)) is not None:
            means.setdefault(key, node)
    pairs = [(variances[k], means[k], k) for k in variances if k in means and _count(k[0], k[1]) is not None]
    if not pairs:
        return gm
    gm, env = copy_graph(gm)
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    for old_var, old_mean, (old_x, dims, keepdim) in pairs:
        var, mean, x = env[old_var], env[old_mean], env[old_x]
        first = var if order[var] < order[mean] else mean
        correction = var.kwargs.get("correction")
        count = _count(x, dims)
        with graph.inserting_before(first):
            both = graph.call_function(
                aten.var_mean.correction, (x, list(dims)), {"correction": correction, "keepdim": keepdim}
            )
            new_var = graph.call_function(operator.getitem, (both, 0))
            welford_mean = graph.call_function(operator.getitem, (both, 1))
            # Note [One Welford for a variance and its mean] (b): where eager's sum overflows
            total = graph.call_function(aten.mul.Tensor, (welford_mean, count))
            overflow = graph.call_function(aten.isinf.default, (total,))
            new_mean = graph.call_function(aten.where.self, (overflow, total, welford_mean))
        both.meta.update(var.meta)
        if "val" in var.meta and "val" in mean.meta:
            both.meta["val"] = (var.meta["val"], mean.meta["val"])
            overflow.meta["val"] = torch.empty_like(mean.meta["val"], dtype=torch.bool)
        for made in (welford_mean, total, new_mean):
            made.meta.update(mean.meta)
        new_var.meta.update(var.meta)
        var.replace_all_uses_with(new_var)
        mean.replace_all_uses_with(new_mean)
        graph.erase_node(var)
        graph.erase_node(mean)
        ctx.note("var_mean", "%s and %s of %s over dims %s: one var_mean", var.name, mean.name, x, list(dims))
    graph.lint()
    gm.recompile()
    return gm
