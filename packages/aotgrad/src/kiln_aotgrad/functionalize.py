"""Functionalization while tracing: mutations and aliases become pure dataflow.

The model. Every tensor the traced program sees belongs to a *root* (a graph input, a constant,
or the output of a non-view operator) and reaches it through a *view chain*: the view operators
(`slice`, `transpose`, `view`, ...) that produced it, each remembered as a `ViewStep`. A root has
a current value (an FX node) and a version.

- A view operator records its node as usual and extends its input's chain by one step.
- A mutating operator (`add_`, `copy_`, `bernoulli_`, an `out=` overload) is recorded as its
  functional sibling (`add`, `copy`, `bernoulli.p`, the overload without `out`), whose result is
  the new value of the mutated tensor. That value is written back into the root by walking the
  chain upwards with each step's *inverse* (`slice` -> `slice_scatter`, `select` ->
  `select_scatter`, `transpose` -> `transpose`, `view` -> `view` back, anything else ->
  `as_strided_scatter`), and the root's version goes up.
- Reading a tensor whose root moved on since its node was made regenerates it: the chain is
  replayed from the root's current value. Aliases therefore see every mutation, as in eager,
  while the graph itself never mutates anything.

At the end of a trace, a graph input whose version moved is an *input mutation*: its current
value becomes an extra graph output that the runtime copies back into the real input
(runtime.py). A returned tensor whose root is an input (or another output) is an *alias*, which
the runtime regenerates as a view of the real tensor instead of returning a copy.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

aten = torch.ops.aten

SELF = object()  # placeholder for the viewed tensor in a ViewStep's arguments


@dataclass(slots=True)
class ViewStep:
    """One view operator between a root and a tensor: `func(parent, *args)[index]`."""

    func: Any
    args: tuple[Any, ...]  # SELF stands for the parent
    kwargs: dict[str, Any]
    index: int | None  # which output of a multi-output view (split, unbind)
    # `as_strided` with an explicit offset: the root's storage offset when it was recorded
    # (Note [Writes through as_strided go into the root] in tracer.py)
    root_offset: Any = None


@dataclass(slots=True)
class Alias:
    """Where a traced tensor's contents live: its root, the view chain, the version it saw."""

    root: int  # id() of the root tensor
    chain: tuple[ViewStep, ...]
    version: int


@dataclass(slots=True)
class Root:
    node: torch.fx.Node
    version: int = 0
    mutated: bool = False
    users: list[int] = field(default_factory=list)
    born: int = 0  # creation order (Note [One op kept when its decomposition fails])


# Note [Schema questions are asked once per operator]: the tracer asks every operator it
# dispatches whether it is a view and what it writes, several times each (tens of microseconds a
# question: torch builds the schema's argument objects anew on each read). An operator's schema
# never changes, so each answer is kept per operator.
_VIEW_OPS: dict[Any, bool] = {}
_WRITES: dict[Any, tuple[str, ...]] = {}


def is_view_op(func: Any) -> bool:
    known = _VIEW_OPS.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        info = schema.returns[0].alias_info if schema is not None and schema.returns else None
        known = _VIEW_OPS[func] = info is not None and not info.is_write
    return known


def mutated_arg_names(func: Any) -> list[str]:
    """Names of the arguments `func` writes to (empty for functional operators)."""
    known = _WRITES.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        known = _WRITES[func] = (
            ()
            if schema is None
            else tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
        )
    return list(known)


_NO_FUNCTIONAL_FORM = frozenset({"aten::set_", "aten::resize_", "aten::resize_as_", "aten::as_strided_"})


def functional_variant(func: Any) -> Any | None:
    """The non-mutating overload with the same arguments (minus `out`), or None."""
    name = str(func._schema.name)
    if name in _NO_FUNCTIONAL_FORM:
        return None
    ns, base = name.split("::")
    writes = set(mutated_arg_names(func))
    inplace = base.endswith("_") and not base.endswith("__")
    want = [
        (a.name, _type_key(a.type)) for a in func._schema.arguments if not (a.name in writes and not inplace)
    ]
    packet_name = base[:-1] if inplace else base
    if base == "normal_":
        packet_name = "normal_functional"
    packet = getattr(getattr(torch.ops, ns), packet_name, None)
    if packet is None:
        return None
    by_names = None
    for ov_name in packet.overloads():
        ov = getattr(packet, ov_name)
        if mutated_arg_names(ov):
            continue
        have = [(a.name, _type_key(a.type)) for a in ov._schema.arguments]
        if have == want:
            return ov  # same names and types
        if [n for n, _ in have] == [n for n, _ in want] and by_names is None:
            by_names = ov
    return by_names


def _type_key(t: Any) -> str:
    # `Tensor(a!)` and `Tensor` are the same type for this purpose.
    return str(t).replace("?", "")


Emit = Callable[[Any, tuple[Any, ...], dict[str, Any]], torch.fx.Node]


def replay_step(emit: Emit, step: ViewStep, parent: torch.fx.Node) -> torch.fx.Node:
    args = tuple(parent if a is SELF else a for a in step.args)
    node = emit(step.func, args, step.kwargs)
    if step.index is not None:
        node = emit(operator.getitem, (node, step.index), {})
    return node


def _val(node: torch.fx.Node) -> torch.Tensor:
    v = node.meta["val"]
    assert isinstance(v, torch.Tensor)
    return v


def _view_back(emit: Emit, new: torch.fx.Node, parent: torch.fx.Node) -> torch.fx.Node:
    if not _val(new).is_contiguous():
        new = emit(aten.clone.default, (new,), {"memory_format": torch.contiguous_format})
    return emit(aten.view.default, (new, list(_val(parent).shape)), {})


def inverse_step(emit: Emit, step: ViewStep, parent: torch.fx.Node, new: torch.fx.Node) -> torch.fx.Node:
    """The parent's new value after its view `step` received the value `new`."""
    f = step.func
    rest = step.args[1:]
    name = str(f._schema.name)
    if f is aten.view.dtype:  # back to the parent's dtype (the bits, not the values)
        return emit(aten.view.dtype, (new, _val(parent).dtype), {})
    if name in (
        "aten::view",
        "aten::_unsafe_view",
        "aten::_reshape_alias",
        "aten::squeeze",
        "aten::unflatten",
    ):
        return _view_back(emit, new, parent)
    if name == "aten::unsqueeze":
        return emit(aten.squeeze.dim, (new, rest[0]), {})
    if name in ("aten::alias", "aten::detach"):
        return new
    if name in ("aten::_conj", "aten::_neg_view"):  # each its own inverse (recorded as computed:
        return emit(f, (new,), {})  # Note [Conjugate and negative views are traced as computations])
    if name == "aten::t":
        return emit(aten.t.default, (new,), {})
    if name == "aten::transpose":
        return emit(aten.transpose.int, (new, rest[0], rest[1]), {})
    if name == "aten::permute":
        dims = [d % len(rest[0]) for d in rest[0]]
        inv = [0] * len(dims)
        for i, d in enumerate(dims):
            inv[d] = i
        return emit(aten.permute.default, (new, inv), {})
    if name == "aten::slice":
        return emit(aten.slice_scatter.default, (parent, new, *rest), step.kwargs)
    if name == "aten::select":
        return emit(aten.select_scatter.default, (parent, new, *rest), step.kwargs)
    if name == "aten::diagonal":
        return emit(aten.diagonal_scatter.default, (parent, new, *rest), step.kwargs)
    if name == "aten::as_strided":
        return emit(aten.as_strided_scatter.default, (parent, new, *rest), step.kwargs)
    if name == "aten::expand":
        raise NotImplementedError("writing into an expanded tensor (eager rejects it too)")
    piece = _piece_scatter(emit, step, name, parent, new)  # Note [Pieces written back as slices]
    if piece is not None:
        return piece
    # Anything else: scatter through the view's own strides, relative to a dense parent.
    pv = _val(parent)
    nv = _val(new)
    child = _child_meta(step, pv)
    if not pv.is_contiguous():
        raise NotImplementedError(f"mutation through view {name} of a non-contiguous tensor")
    offset = child.storage_offset() - pv.storage_offset()
    del nv
    # Note [Pieces written back as slices]: aten's as_strided_scatter reads the offset in its
    # input's storage; a fresh copy of the parent starts at 0 wherever the parent's value lives
    # (a graph input at an offset, a view the compiled code keeps as one), so the relative offset
    # is right on it (`x.unfold(1, 2, 2).mul_(2)`, `x.view(torch.int32).bitwise_xor_(1)` on
    # `x = base[1:]` wrote before x)
    fresh = emit(aten.clone.default, (parent,), {"memory_format": torch.contiguous_format})
    return emit(
        aten.as_strided_scatter.default, (fresh, new, list(child.shape), list(child.stride()), offset), {}
    )


# Note [Pieces written back as slices]: a piece of `split`, `split_with_sizes`, `chunk`,
# `unbind` or `narrow` is a slice (a select for `unbind`) of its parent along one dimension, so
# its new value goes back through `slice_scatter` (`select_scatter`), as a `slice` view's does.
# They used to take the general path below, `as_strided_scatter` with the piece's offset
# relative to its parent, which is wrong wherever the parent is an input at a storage offset:
# aten's `as_strided_scatter` reads its offset in the storage of its input, absolute, not from
# the input's first element (test_alias_fuzz.py seed 686: `x.split(3, 1)[1].add_(1.5)` on
# `x = base[1:]` wrote two elements before `x` and left its second row as it was; seeds 1051 and
# 1198, the same through `split`/`chunk` of inputs with symbolic sizes). A slice has no offset,
# and its bounds are sizes, symbolic where the parent's are.
def _piece_scatter(emit: Emit, step: ViewStep, name: str, parent: torch.fx.Node, new: torch.fx.Node) -> Any:
    if name not in ("aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::narrow"):
        return None
    bound = step.func._schema.arguments
    vals: dict[str, Any] = {a.name: a.default_value for a in bound if a.has_default_value()}
    vals.update({a.name: v for a, v in zip(bound[1:], step.args[1:], strict=False)})
    vals.update(step.kwargs)
    pv = _val(parent)
    dim = int(vals.get("dim", 0)) % pv.dim()
    i = step.index
    if name == "aten::narrow":
        start = vals["start"]
        return emit(aten.slice_scatter.default, (parent, new, dim, start, start + vals["length"], 1), {})
    assert i is not None
    if name == "aten::unbind":
        return emit(aten.select_scatter.default, (parent, new, dim, i), {})
    if name == "aten::split":
        start = i * vals["split_size"]
    elif name == "aten::split_with_sizes":
        start = sum(vals["split_sizes"][:i])
    else:  # chunk: pieces of ceil(size / chunks)
        chunks = vals["chunks"]
        start = i * ((pv.shape[dim] + chunks - 1) // chunks)
    end = start + _val(new).shape[dim]
    return emit(aten.slice_scatter.default, (parent, new, dim, start, end, 1), {})


def _child_meta(step: ViewStep, parent_val: torch.Tensor) -> torch.Tensor:
    meta = getattr(parent_val, "meta", parent_val)
    args = tuple(meta if a is SELF else a for a in step.args)
    out = step.func(*args, **step.kwargs)
    return out[step.index] if step.index is not None else out
