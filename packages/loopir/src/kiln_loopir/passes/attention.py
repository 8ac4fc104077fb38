"""The attention pass: an explicit softmax(Q @ K^T * scale + mask) @ V becomes one call of
``aten.scaled_dot_product_attention`` (flash, memory-efficient or cuDNN attention on CUDA).

Note [Attention rewrite]: a hand-written attention layer reaches loopir, after aotgrad's
decompositions, as two batched matmuls around a softmax, each operand brought to 3-D through
expand / clone / view:

    S = view(bmm(view(expand(Q)), view(expand(K^T))), [B, H, L, S])
    P = _softmax(add(mul(S, c), mask), -1, False)        # mul or div by c, mask optional
    O = view(bmm(view(expand(P)), view(expand(V))), [B, H, L, Ev])

It is replaced by ``scaled_dot_product_attention(Q, K, V, mask, 0.0, False, scale=c)`` only where
the math is provably SDPA's (:func:`match` refuses anything else):
  - Q, K, V are 4-D of one floating dtype, every expand is the identity (no head broadcast), and
    K^T is K with its last two dims swapped;
  - the scale is a Python number applied to the product (``mul`` by c, ``div`` by c) before the
    mask is added; no scale means scale 1.0, passed explicitly;
  - the mask is added (``add.Tensor`` without ``alpha``), has the scores' dtype and broadcasts to
    [B, H, L, S] without growing them; or it excludes positions: ``where(cond, -inf, scores)`` or
    ``masked_fill(scores, cond, -inf)`` with a boolean ``cond`` that broadcasts the same way (the
    ``masked_fill(mask == 0, float("-inf"))`` of minGPT-style layers), which is SDPA's boolean
    mask ``~cond``; any other fill value is left alone;
  - the softmax is over the last dim without dtype change, and nothing else reads any intermediate
    value (a training forward graph saves the probabilities for the backward, so it never matches;
    neither does a graph with dropout between softmax and the second matmul).
One difference remains: a row whose mask is -inf everywhere (excluded everywhere) is NaN in eager
(softmax of all -inf) and 0 in SDPA; the rewrite keeps eager's answer by setting those rows to NaN
(``where(amax(mask, -1) == -inf, nan, out)``, or ``all(cond, -1)`` for an excluding mask: a small
reduction over the mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from . import PassContext, copy_graph

aten = torch.ops.aten

# ops that bring a bmm operand from 4-D to 3-D without changing values
_BATCH_VIEWS = frozenset(
    {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default}
)


@dataclass(frozen=True, slots=True)
class Attention:
    """A matched attention: the nodes to read and the one to replace."""

    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    mask: torch.fx.Node | None
    scale: float
    output: torch.fx.Node
    excludes: bool = False  # the mask is a boolean "excluded here" condition, not an additive one


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _shape(node: Any) -> list[int] | None:
    val = _val(node)
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return [int(s) for s in val.shape]


def _single_user(node: torch.fx.Node) -> bool:
    return len(node.users) == 1


def _source_4d(node: Any) -> torch.fx.Node | None:
    """The 4-D value a bmm operand was brought to 3-D from: through views and contiguous clones
    to an identity expand (no head broadcast), each read only on this path."""
    current = node
    while isinstance(current, torch.fx.Node) and _single_user(current):
        target = current.target
        if target is aten.expand.default:
            src = current.args[0]
            shape = _shape(src)
            return (
                src
                if isinstance(src, torch.fx.Node)
                and shape is not None
                and shape == _shape(current)
                and len(shape) == 4
                else None
            )
        if target is aten.clone.default:
            if current.kwargs.get("memory_format", torch.contiguous_format) != torch.contiguous_format:
                return None
        elif target not in _BATCH_VIEWS:
            shape = _shape(current)
            return current if shape is not None and len(shape) == 4 else None
        current = current.args[0]
    return None


def _bmm_4d(node: Any) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node] | None:
    """(view, a, b) for ``view(bmm(a3, b3), [B, H, ., .])`` with a3, b3 from 4-D a, b."""
    if not isinstance(node, torch.fx.Node) or node.target not in (
        aten.view.default,
        aten._unsafe_view.default,
    ):
        return None
    bmm = node.args[0]
    if not (isinstance(bmm, torch.fx.Node) and bmm.target is aten.bmm.default and _single_user(bmm)):
        return None
    shape = _shape(node)
    if shape is None or len(shape) != 4:
        return None
    a, b = _source_4d(bmm.args[0]), _source_4d(bmm.args[1])
    if a is None or b is None:
        return None
    sa, sb = _shape(a), _shape(b)
    if sa is None or sb is None or sa[:2] != shape[:2] or sb[:2] != shape[:2]:
        return None
    return node, a, b


def _untransposed(node: torch.fx.Node) -> torch.fx.Node | None:
    """K for K^T given as a swap of the last two dims of a 4-D K."""
    args: Any = node.args
    if node.target is aten.permute.default:
        swapped = [int(d) % 4 for d in args[1]] == [0, 1, 3, 2]
    elif node.target is aten.transpose.int:
        swapped = sorted(int(d) % 4 for d in args[1:3]) == [2, 3]
    else:
        return None
    if not swapped:
        return None
    src = args[0]
    return src if isinstance(src, torch.fx.Node) and _shape(src) is not None else None


def _broadcasts_to(shape: list[int], target: list[int]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False))


def _scaled_product(node: Any) -> tuple[float, torch.fx.Node] | None:
    """(c, Q @ K^T) for ``mul(QK, c)``, ``div(QK, 1/c)`` or a bare ``QK`` (c = 1.0), where QK is
    a 4-D batched product read only here."""
    if not isinstance(node, torch.fx.Node):
        return None
    scale, product = 1.0, node
    if node.target in (aten.mul.Tensor, aten.div.Tensor):
        if not _single_user(node):
            return None
        a, c = node.args
        if node.target is aten.mul.Tensor and isinstance(a, int | float):
            a, c = c, a
        if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c == 0:
            return None
        if not isinstance(a, torch.fx.Node):
            return None
        scale = float(c) if node.target is aten.mul.Tensor else 1.0 / float(c)
        product = a
    return (scale, product) if _bmm_4d(product) is not None else None


def match(softmax: torch.fx.Node) -> Attention | None:
    """The attention around ``softmax``, or None when it is not provably SDPA (see the Note)."""
    if softmax.target is not aten._softmax.default or not _single_user(softmax):
        return None
    softmax_args: Any = softmax.args
    x, dim, half_to_float = softmax_args
    if half_to_float or not isinstance(x, torch.fx.Node) or int(dim) % 4 != 3 or _shape(x) is None:
        return None
    scores_shape = _shape(x)
    if scores_shape is None or len(scores_shape) != 4:
        return None
    mask: torch.fx.Node | None = None
    parsed = _scaled_product(x)
    if parsed is None and x.target is aten.add.Tensor and not x.kwargs and _single_user(x):
        for s, m in ((x.args[0], x.args[1]), (x.args[1], x.args[0])):
            parsed = _scaled_product(s)
            if parsed is not None and isinstance(m, torch.fx.Node):
                mask = m
                break
            parsed = None
        if mask is None:
            return None
        mval, sval, mshape = _val(mask), _val(x), _shape(mask)
        if not (isinstance(mval, torch.Tensor) and isinstance(sval, torch.Tensor)) or mshape is None:
            return None
        if (
            mval.dtype != sval.dtype
            or not mval.dtype.is_floating_point
            or not _broadcasts_to(mshape, scores_shape)
        ):
            return None
    excludes = False
    if parsed is None and mask is None:
        cond, other = _excluding(x)
        if cond is not None:
            parsed, mask, excludes = _scaled_product(other), cond, True
            cshape = _shape(cond)
            cval = _val(cond)
            if cshape is None or cval.dtype != torch.bool or not _broadcasts_to(cshape, scores_shape):
                return None
    if parsed is None:
        return None
    scale, product = parsed
    first = _bmm_4d(product)
    if first is None or not _single_user(first[0]):
        return None
    _, q, kt = first
    k = _untransposed(kt)
    if k is None or not _single_user(kt):
        return None
    # the second product: view(bmm(view(expand(P)), view(expand(V))))
    user = next(iter(softmax.users))
    out: torch.fx.Node | None = None
    for candidate in _readers_down(user):
        second = _bmm_4d(candidate)
        if second is not None and second[1] is softmax:
            out, v = candidate, second[2]
            break
    if out is None:
        return None
    vals = [_val(n) for n in (q, k, v)]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in vals):
        return None
    if len({t.dtype for t in vals}) != 1 or not vals[0].dtype.is_floating_point:
        return None
    if len({t.device for t in vals}) != 1:
        return None
    sq, sk, sv = (_shape(n) for n in (q, k, v))
    assert sq is not None and sk is not None and sv is not None
    if sq[:2] != sk[:2] or sk[:3] != sv[:3] or sq[3] != sk[3]:
        return None
    return Attention(q, k, v, mask, scale, out, excludes)


def _excluding(x: torch.fx.Node) -> tuple[torch.fx.Node | None, Any]:
    """(cond, scores) for ``where(cond, -inf, scores)`` / ``masked_fill(scores, cond, -inf)``."""
    if not _single_user(x):
        return None, None
    args: Any = x.args
    if x.target is aten.masked_fill.Scalar and _is_neg_inf(args[2]) and isinstance(args[1], torch.fx.Node):
        return args[1], args[0]
    where = x.target in (aten.where.self, aten.where.ScalarSelf)
    if where and _is_neg_inf(args[1]) and isinstance(args[0], torch.fx.Node):
        return args[0], args[2]
    return None, None


def _is_neg_inf(value: Any) -> bool:
    """-inf as a Python number or as a 0-d tensor made of it (``scalar_tensor(-inf)``)."""
    if isinstance(value, torch.fx.Node):
        if value.target is not aten.scalar_tensor.default or _shape(value) != []:
            return False
        value = value.args[0]
    return isinstance(value, float) and value == float("-inf")


def _readers_down(node: torch.fx.Node, depth: int = 0) -> list[torch.fx.Node]:
    """``node`` and the single-reader chain of batch views and bmm below it (to find the second
    product's output view)."""
    found = [node]
    current = node
    while depth < 6 and _single_user(current):
        current = next(iter(current.users))
        if current.target not in (*_BATCH_VIEWS, aten.clone.default, aten.bmm.default):
            break
        found.append(current)
        depth += 1
    return found


def _meta(node: torch.fx.Node) -> torch.fx.Node:
    def meta(v: Any) -> Any:
        val = _val(v) if isinstance(v, torch.fx.Node) else v
        if isinstance(val, torch.Tensor):
            return torch.empty_strided(
                [int(s) for s in val.shape], [int(s) for s in val.stride()], dtype=val.dtype, device="meta"
            )
        return val

    args, kwargs = torch.fx.node.map_aggregate((node.args, node.kwargs), meta)
    assert callable(node.target)
    node.meta["val"] = node.target(*args, **kwargs)
    return node


def _rewrite(gm: torch.fx.GraphModule, m: Attention) -> None:
    graph = gm.graph
    with graph.inserting_before(m.output):
        mask: Any = m.mask
        if m.excludes:  # SDPA's boolean mask says where to attend
            mask = _meta(graph.call_function(aten.logical_not.default, (m.mask,)))
        out = _meta(
            graph.call_function(
                aten.scaled_dot_product_attention.default,
                (m.q, m.k, m.v, mask, 0.0, False),
                {"scale": m.scale},
            )
        )
        if m.mask is not None:  # rows masked everywhere stay NaN, as eager's softmax gives them
            if m.excludes:
                empty = _meta(graph.call_function(aten.all.dim, (m.mask, -1, True)))
            else:
                peak = _meta(graph.call_function(aten.amax.default, (m.mask, [-1], True)))
                empty = _meta(graph.call_function(aten.eq.Scalar, (peak, float("-inf"))))
            out = _meta(graph.call_function(aten.where.ScalarSelf, (empty, float("nan"), out)))
    out.meta["val"] = _meta(out).meta["val"]
    m.output.replace_all_uses_with(out)
    graph.eliminate_dead_code()


def attention_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Rewrite every provable explicit attention into SDPA (Note [Attention rewrite])."""
    found = [m for n in gm.graph.nodes if (m := match(n)) is not None]
    if not found:
        return gm
    copied, env = copy_graph(gm)
    for m in found:
        mapped = Attention(
            env[m.q],
            env[m.k],
            env[m.v],
            env[m.mask] if m.mask is not None else None,
            m.scale,
            env[m.output],
            m.excludes,
        )
        _rewrite(copied, mapped)
        ctx.note(
            "attention",
            "rewrite %s: softmax(%s @ %s^T * %g%s) @ %s -> scaled_dot_product_attention",
            m.output.name,
            m.q.name,
            m.k.name,
            m.scale,
            "" if m.mask is None else f" excluding {m.mask.name}" if m.excludes else f" + {m.mask.name}",
            m.v.name,
        )
    copied.graph.lint()
    copied.recompile()
    return copied


__all__ = ["Attention", "attention_pass", "match"]
