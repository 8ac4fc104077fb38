"""Common subexpressions of the aten graph: a node that computes what an earlier node computes is
replaced by it.

Note [Common subexpressions of the graph]: the traced graph repeats work that the user's Python
wrote once. A transformers decoder builds one boolean attention mask and hands it to every layer;
each layer's ``scaled_dot_product_attention`` then converts it to an additive float mask (torch's
SDPA does ``where(mask, 0, -inf)`` per call), so the graph holds one ``where`` (and its two
``scalar_tensor`` operands) per layer. Lowered as they stand, these are separate buffers: on the
H200, LLaMA's six masks were written by one fused kernel of 24 MB a call where 4 MB say the same
(thirteenth session's profile, ``triton_poi_fused_add_arange_bitwise_and_eq_full_index_3``), and
every attention read its own copy. torch.compile runs the same elimination on the graphs AOTAutograd
traces (functorch's ``cse`` option, on by default); kiln runs it here, before the other passes,
for both code generators and for forward and backward graphs alike.

Two nodes are the same computation when they call the same aten operator overload (or
``operator.getitem``) on the same arguments — nodes after replacement, and Python scalars compared
with their type (``1``, ``1.0`` and ``True`` differ; floats by ``repr``, so ``-0.0`` is not ``0.0``)
— with results of the same shape, strides and dtype. What is never merged:

* operators that mutate an argument, that return nothing (run-time assertions: Note [Extern
  calls kept for their effect] in scheduler.py), or that draw random numbers (the
  ``nondeterministic_seeded`` tag: two ``rand`` calls are two draws), and ``empty``-style factories
  (their values are not a function of their arguments);
* a node whose memory can leave the graph (a graph output, or an input of a view or ``getitem``
  chain that ends in one): merging two such nodes would return two outputs that share memory where
  eager returns two, and an in-place update of one would show in the other. A view is an operator
  whose schema says its result aliases an argument, and the few that alias without saying so
  (``_unsafe_view``, ``unsafe_split``, ...: Note [Views that do not say so]);
* a node and an earlier one with a mutation of a graph input between them (Note [Reads around an
  input's mutation]);
* any node of a graph that mutates a value other than an input (not functional: the pass leaves it
  alone and says so).

Switch: ``options={"cse": False}``; ``KILN_LOG=passes`` prints how many nodes were merged, by
operator.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from typing import Any

import torch
import torch.fx

from . import PassContext, copy_graph

aten = torch.ops.aten

_UNMERGED_FACTORIES = frozenset(
    {
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.empty_like.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
        aten.empty_permuted.default,
    }
)

# Note [Views that do not say so]: these return a view of their argument (eager's result shares its
# memory, and loopir lowers them as views) but their schemas carry no alias annotation. Read as
# copies, ``_unsafe_view(add(x, 1))`` returned next to ``_unsafe_view(add(x, 1))`` had its ``add``
# merged with the other's, and the two outputs came back sharing memory (fifteenth session).
_UNANNOTATED_VIEWS = frozenset(
    {
        aten._unsafe_view.default,
        aten.unsafe_split.Tensor,
        aten.unsafe_split_with_sizes.default,
        aten.unsafe_chunk.default,
    }
)


def _pure(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    if schema.is_mutable or not schema.returns or target in _UNMERGED_FACTORIES:
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags


def _aliases_input(node: torch.fx.Node) -> bool:
    """Whether ``node``'s result may share memory with one of its tensor arguments."""
    if node.target is operator.getitem or node.target in _UNANNOTATED_VIEWS:
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _escaping(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes whose memory can leave the graph: outputs, and what outputs view."""
    out: set[torch.fx.Node] = set()
    stack = [n for n in graph.nodes if n.op == "output"]
    roots: list[torch.fx.Node] = []
    for o in stack:
        torch.fx.map_arg(o.args, roots.append)
    stack = roots
    while stack:
        node = stack.pop()
        if node in out:
            continue
        out.add(node)
        if node.op == "call_function" and _aliases_input(node):
            torch.fx.map_arg((node.args, node.kwargs), stack.append)
    return out


def _mutates_an_intermediate(graph: torch.fx.Graph) -> torch.fx.Node | None:
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None or not schema.is_mutable:
            continue
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            values = value if isinstance(value, list | tuple) else [value]
            if any(isinstance(v, torch.fx.Node) and v.op != "placeholder" for v in values):
                return node
    return None


def _mutates(node: torch.fx.Node) -> bool:
    """Whether ``node`` may write to memory (an in-place operator, or one the pass cannot read)."""
    if node.op != "call_function":
        return False
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.is_mutable
    return isinstance(node.target, torch._ops.HigherOrderOperator)


def _key(value: Any) -> Any:
    """A hashable key of an argument that tells apart what Python's == confuses."""
    if isinstance(value, torch.fx.Node):
        return ("node", value)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else repr(value))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _key(v)) for k, v in value.items())))
    if value is None or isinstance(
        value, str | torch.dtype | torch.device | torch.layout | torch.memory_format
    ):
        return (type(value).__name__, value)
    raise TypeError(f"no key for {type(value).__name__}")  # SymInt, tensors: never merged


def _meta_key(val: Any) -> Any:
    """The result's metadata (shape, strides, dtype, offset), for results of several tensors too.

    Sizes are compared as text: a backed size symbol (``s0``) is the same in both results, but an
    unbacked one (``u0`` of one ``nonzero``, ``u1`` of another) names another value, and a node that
    defines one must stay (later nodes' sizes refer to it)."""
    if isinstance(val, torch.Tensor):
        return (
            tuple(map(str, val.shape)),
            tuple(map(str, val.stride())),
            val.dtype,
            str(val.storage_offset()),
        )
    if isinstance(val, list | tuple):
        return tuple(_meta_key(v) for v in val)
    if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
        return (type(val).__name__, str(val))
    return type(val).__name__


def cse_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Note [Common subexpressions of the graph]."""
    blocker = _mutates_an_intermediate(gm.graph)
    if blocker is not None:
        ctx.note("cse", "skipped: %s mutates a value that is not an input", blocker.name)
        return gm
    escaping = _escaping(gm.graph)
    seen: dict[Any, torch.fx.Node] = {}
    twins: dict[torch.fx.Node, torch.fx.Node] = {}
    # Note [Reads around an input's mutation]: a graph may update an input in place (the copy_
    # of a mutated input, a BatchNorm's running statistics) and read it again afterwards; a read
    # after the update is not the read before it (``mul(x, 2); add_(x, 1); mul(x, 2)``: the second
    # ``mul`` merged into the first returned the old values, fifteenth session). Each mutation
    # starts a new epoch, and only nodes of one epoch are merged. Functionalized graphs mutate
    # inputs at their end, so this costs them nothing.
    epoch = 0
    for node in gm.graph.nodes:
        if _mutates(node):
            epoch += 1
            continue
        if not _pure(node) or node in escaping:
            continue
        try:
            key = (
                epoch,
                node.target,
                _key(torch.fx.map_arg(node.args, lambda n: twins.get(n, n))),
                _key(torch.fx.map_arg(node.kwargs, lambda n: twins.get(n, n))),
                _meta_key(node.meta.get("val")),
            )
            hash(key)
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            twins[node] = first
    if not twins:
        return gm
    # merge in a copy (a pass never edits the caller's graph)
    copied, env = copy_graph(gm)
    for node, first in twins.items():
        env[node].replace_all_uses_with(env[first])
    merged = {env[n] for n in twins}
    for node in reversed(list(copied.graph.nodes)):
        if node in merged and not node.users:
            copied.graph.erase_node(node)
    copied.recompile()
    by_op = Counter(str(getattr(n.target, "__name__", n.target)) for n in twins)
    ctx.note(
        "cse",
        "merged %d nodes into earlier equal ones (%s)",
        len(twins),
        ", ".join(f"{op} x{k}" for op, k in by_op.most_common(8)),
    )
    return copied


__all__ = ["cse_pass"]
