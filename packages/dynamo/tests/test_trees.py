"""Note [Operator arguments as plain trees]: kiln_dynamo.trees answers as torch's pytree does,
on the plain trees it walks itself and on every other tree it hands to pytree."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
import torch.fx
from torch.utils import _pytree

from kiln_dynamo.trees import tree_leaves, tree_map

Pair = collections.namedtuple("Pair", "a b")
T = torch.ones(2)

TREES: list[Any] = [
    (T, [T, 2], {"dim": 1, "keepdim": True}),
    ((T, 1.5, None), {"b": T, "a": torch.float16, "device": torch.device("cpu")}),
    [[], (), {}, [T, [T, (T,)]]],
    (T, torch.Size([2, 3])),  # pytree flattens a Size into its ints
    (Pair(T, 2), [T]),  # a named tuple: a node of pytree's own
    (torch.fx.immutable_collections.immutable_list([T, 3]),),
    collections.OrderedDict(x=T, y=(T, 4)),
    (torch.channels_last, torch.strided, "mean", 3 + 1j),
    T,
    7,
]


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
def test_trees_answer_as_pytree(tree: Any) -> None:
    assert [id(x) for x in tree_leaves(tree)] == [id(x) for x in _pytree.tree_flatten(tree)[0]]

    def tag(x: Any) -> Any:
        return ("leaf", type(x).__name__)

    ours, theirs = tree_map(tag, tree), _pytree.tree_map(tag, tree)
    assert ours == theirs
    assert _pytree.tree_structure(ours) == _pytree.tree_structure(theirs)

    seen_ours: list[int] = []
    seen_theirs: list[int] = []
    tree_map(lambda x: seen_ours.append(id(x)), tree)
    _pytree.tree_map(lambda x: seen_theirs.append(id(x)), tree)
    assert seen_ours == seen_theirs  # each leaf once, in pytree's order
