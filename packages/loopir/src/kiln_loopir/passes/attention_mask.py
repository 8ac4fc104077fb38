"""The attention-mask pass: a pass over the *torch-level* graph (what dynamo captured), run before
aotgrad traces it, because the choice it changes is made while tracing.

Note [Attention masks that are constant along a row]: ``scaled_dot_product_attention`` picks its
kernel (flash, memory-efficient, cuDNN, or the math decomposition) from its arguments' metadata,
and on CUDA every fused kernel refuses a mask whose last dimension has stride 0 ("GPU backends
require attn_mask's last dimension to have stride 1"). Such masks are common: transformers builds
its padding masks with ``expand`` (BERT, DistilBERT and ViT at the H200's sizes get an all-true
``[8, 1, 512, 512]`` boolean mask of strides ``(0, 512, 1, 0)`` under a compiler), and then the
whole attention runs as the math decomposition, which in bfloat16 upcasts to float32: two fp32
GEMMs and a softmax per layer where a fused kernel takes a fraction of the time.

A mask whose last dimension has stride 0 (or size 1) is constant along each row of scores: row
``i`` adds the same ``c`` to every score (a boolean mask: keeps all or none). Softmax is
invariant to adding a constant to a row, so for a finite ``c`` the row is SDPA's without a mask;
for ``c = -inf`` (a boolean False) every score is excluded, and eager's math path answers 0 there
(``_safe_softmax``); for a NaN or ``+inf`` it answers NaN. So the pass rewrites

    sdpa(q, k, v, mask)  ->  where(keep, sdpa(q, k, v), 0)          boolean mask, keep = mask[..., :1]
    sdpa(q, k, v, mask)  ->  where(isfinite(c), sdpa(q, k, v),        float mask, c = mask[..., :1]
                                   where(c == -inf, 0, nan))

and the unmasked attention runs a fused kernel (flash or cuDNN). Making the mask dense instead
would be wrong: in bfloat16 the fused kernels answer garbage (not 0) for a row excluded
everywhere, which is what eager returns 0 for.

It applies on CUDA only (the CPU kernels accept any mask stride), without dropout and without
``is_causal`` (SDPA refuses a mask with it anyway).

Note [Attention masks read across their rows]: the other layout the fused kernels refuse is a
mask whose last dimension is strided (neither 1 nor 0). T5's relative position bias is one: an
embedding lookup ``[L, S, H]`` permuted to ``[1, H, L, S]`` (last stride H), added to the padding
mask or not; eager then runs every encoder layer's attention as the upcast math decomposition
(the H200's T5 at batch 8, sequence 512: fp32 scores ``[8, 12, 512, 512]`` per layer), and so did
kiln, which traces eager's choice. kiln goes further than eager here: the mask is made dense
(``contiguous()``, one copy of the mask) before SDPA, which then picks a fused kernel. What must
stay eager's is the row excluded everywhere (all ``-inf``, or all False): the math path's
``_safe_softmax`` answers 0 there, the fused kernels garbage; so

    sdpa(q, k, v, mask)  ->  where(any(mask, -1), sdpa(q, k, v, dense(mask)), 0)          boolean
    sdpa(q, k, v, mask)  ->  where(all(mask == -inf, -1), 0, sdpa(q, k, v, dense(mask)))  float

(one reduction over the mask). The same conditions as above (CUDA, no dropout, not causal);
``attention_dense_mask=False`` switches it off.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from . import copy_graph, log

_SDPA = frozenset({F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention})
# SDPA's arguments after (query, key, value), in order
_PARAMS = ("attn_mask", "dropout_p", "is_causal")


def _value(node: Any) -> Any:
    if not isinstance(node, torch.fx.Node):
        return None
    return node.meta.get("val", node.meta.get("example_value"))


def _arguments(node: torch.fx.Node) -> dict[str, Any]:
    bound = dict(zip(_PARAMS, node.args[3:], strict=False))
    bound.update({k: v for k, v in node.kwargs.items() if k in _PARAMS})
    return bound


def _cuda_mask(node: torch.fx.Node, any_device: bool = False) -> tuple[torch.fx.Node, torch.Tensor] | None:
    """The mask of an SDPA call on CUDA (on any device under ``any_device``) that either rewrite may
    take, and its value: a boolean or floating mask, without dropout and without ``is_causal``."""
    if node.op != "call_function" or node.target not in _SDPA or len(node.args) < 3:
        return None
    bound = _arguments(node)
    mask = bound.get("attn_mask")
    v = _value(mask)
    if not isinstance(mask, torch.fx.Node) or not isinstance(v, torch.Tensor):
        return None
    if (v.device.type != "cuda" and not any_device) or v.dim() < 1:
        return None
    if bound.get("dropout_p", 0.0) != 0.0 or bound.get("is_causal", False) is not False:
        return None
    if not (v.dtype == torch.bool or v.is_floating_point()):
        return None
    return mask, v


def _row_constant_mask(node: torch.fx.Node) -> torch.fx.Node | None:
    """The mask of an SDPA call the pass rewrites (Note [Attention masks that are constant along a row])."""
    found = _cuda_mask(node)
    if found is None:
        return None
    mask, v = found
    return mask if (v.size(-1) == 1 or v.stride(-1) == 0) else None


def _strided_mask(node: torch.fx.Node, any_device: bool = False) -> torch.fx.Node | None:
    """The mask of an SDPA call made dense (Note [Attention masks read across their rows])."""
    found = _cuda_mask(node, any_device)
    if found is None:
        return None
    mask, v = found
    if not all(isinstance(n, int) for n in (*v.shape, *v.stride())):
        return None
    return mask if v.size(-1) > 1 and v.stride(-1) not in (0, 1) else None


def _densify(graph: torch.fx.Graph, node: torch.fx.Node, mask: torch.fx.Node) -> None:
    kwargs = {k: v for k, v in node.kwargs.items() if k != "attn_mask"}
    args = node.args[:3]
    rest = node.args[4:] if len(node.args) > 3 else ()
    target = node.target
    assert callable(target)
    with graph.inserting_before(node):
        dense = graph.call_method("contiguous", (mask,))
        fused = graph.call_function(target, (*args, dense, *rest), kwargs)
        if _value(mask).dtype == torch.bool:
            keep = graph.call_method("any", (mask, -1), {"keepdim": True})
            out = graph.call_function(torch.where, (keep, fused, 0.0))
        else:
            minus_inf = graph.call_function(operator.eq, (mask, float("-inf")))
            excluded = graph.call_method("all", (minus_inf, -1), {"keepdim": True})
            out = graph.call_function(torch.where, (excluded, 0.0, fused))
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, mask: torch.fx.Node) -> torch.fx.Node:
    kwargs = {k: v for k, v in node.kwargs.items() if k != "attn_mask"}
    args = node.args[:3]
    rest = node.args[4:] if len(node.args) > 3 else ()
    target = node.target
    assert callable(target)
    first: Any = (Ellipsis, slice(None, 1, None))  # mask[..., :1]: the value of each row
    with graph.inserting_before(node):  # each new node lands before `node`, in this order
        plain = graph.call_function(target, (*args, None, *rest), kwargs)
        row = graph.call_function(operator.getitem, (mask, first))
        if _value(mask).dtype == torch.bool:
            out = graph.call_function(torch.where, (row, plain, 0.0))
        else:
            finite = graph.call_function(torch.isfinite, (row,))
            excluded = graph.call_function(operator.eq, (row, float("-inf")))
            fill = graph.call_function(torch.where, (excluded, 0.0, float("nan")))
            out = graph.call_function(torch.where, (finite, plain, fill))
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    return out


def unmask_row_constant_attention(
    gm: torch.fx.GraphModule,
    record: list[str] | None = None,
    *,
    row_constant: bool = True,
    dense: bool = True,
    dense_any_device: bool = False,
) -> torch.fx.GraphModule:
    """``gm`` (a torch-level graph), or a rewritten copy whose row-constant attention masks are
    applied after an unmasked SDPA (``row_constant``) and whose masks strided along their rows
    are made dense (``dense``; on any device, not only CUDA, under ``dense_any_device``)."""
    targets: list[tuple[torch.fx.Node, torch.fx.Node, bool]] = []
    for n in gm.graph.nodes:
        if row_constant and (m := _row_constant_mask(n)) is not None:
            targets.append((n, m, False))
        elif dense and (m := _strided_mask(n, dense_any_device)) is not None:
            targets.append((n, m, True))
    if not targets:
        return gm
    copied, env = copy_graph(gm)
    for old, mask, densify in targets:
        v = _value(mask)
        if densify:
            _densify(copied.graph, env[old], env[mask])
            what = "is strided along its rows: made dense (a fused GPU kernel runs; rows it excludes are 0, as eager's)"
        else:
            _rewrite(copied.graph, env[old], env[mask])
            what = "is constant along each row (a fused GPU kernel runs; rows it excludes are 0, as eager's)"
        text = f"{'dense mask of' if densify else 'unmasked'} {old.name}: {mask.name} {list(v.shape)} {v.dtype} strides {list(v.stride())} {what}"
        log.debug("attention_mask: %s", text)
        if record is not None:
            record.append(text)
    copied.graph.lint()
    copied.recompile()
    return copied
