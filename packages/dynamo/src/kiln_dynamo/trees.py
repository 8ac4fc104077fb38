"""``tree_map`` and ``tree_leaves`` of torch's pytree, fast for an operator's arguments.

Note [Operator arguments as plain trees]: every operator a trace runs on fake tensors maps its
arguments and results through torch's pytree (to meta tensors and back, to graph nodes, to their
leaves): ResNet's training compile made some 90,000 such calls, a third of its tracing time,
most of it pytree looking up each value's node type. An operator's arguments are nearly always
tuples, lists and dicts of tensors, numbers, dtypes and devices. For such a tree these functions
walk it directly, in pytree's order (depth first; a dict's values in insertion order) and with
its result types; any other tree (a ``torch.Size``, which pytree flattens into its ints, a named
tuple, an fx immutable list, anything registered) goes to torch's functions whole. The walk that
decides is done before ``fn`` runs on any leaf, so a function with side effects sees each leaf once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree

# the constants an operator's arguments hold (meta_memo.py keys its answers by them too)
CONSTANT_LEAVES = (
    int,
    float,
    bool,
    complex,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)
_LEAVES = frozenset({*CONSTANT_LEAVES, torch.SymInt, torch.SymFloat, torch.SymBool})


def _plain(tree: Any) -> bool:
    """Whether ``tree`` is tuples, lists and dicts (exactly those types) of leaves pytree
    treats as leaves."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return all(_plain(v) for v in tree)
    if kind is dict:
        return all(_plain(v) for v in tree.values())
    if kind in _LEAVES:
        return True
    return isinstance(tree, torch.Tensor) and kind not in _pytree.SUPPORTED_NODES


def _map(fn: Callable[[Any], Any], tree: Any) -> Any:
    kind = type(tree)
    if kind is tuple:
        return tuple([_map(fn, v) for v in tree])
    if kind is list:
        return [_map(fn, v) for v in tree]
    if kind is dict:
        return {k: _map(fn, v) for k, v in tree.items()}
    return fn(tree)


def _collect(tree: Any, out: list[Any]) -> None:
    kind = type(tree)
    if kind is tuple or kind is list:
        for v in tree:
            _collect(v, out)
    elif kind is dict:
        for v in tree.values():
            _collect(v, out)
    else:
        out.append(tree)


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """torch's ``tree_map(fn, tree)`` (Note [Operator arguments as plain trees])."""
    if not _plain(tree):
        return _pytree.tree_map(fn, tree)
    return _map(fn, tree)


def tree_leaves(tree: Any) -> list[Any]:
    """torch's ``tree_flatten(tree)[0]`` (Note [Operator arguments as plain trees])."""
    if not _plain(tree):
        return _pytree.tree_flatten(tree)[0]
    out: list[Any] = []
    _collect(tree, out)
    return out
