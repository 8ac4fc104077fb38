"""Constructs that architectures added to the breadth suite in its thirteenth session reach
(`bench/breadth_models.py`): registries keyed by classes (torch's pytree, Note [Classes as dict
keys]), each compared with eager and counted (graphs, breaks, recompiles)."""

from __future__ import annotations

from typing import Any

import torch
from conftest import CountingBackend, assert_same, check

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(5 * sum(shape) + 2)
    return torch.randn(*shape, generator=g)


class Leaf:
    pass


class Other:
    pass


REGISTRY: dict[type, str] = {tuple: "tuple", list: "list", torch.Tensor: "tensor", Leaf: "leaf"}


def by_class(x: torch.Tensor, y: Any) -> Any:
    out = x
    for v in (x, [x], (x,), Leaf(), 3):
        if type(v) in REGISTRY:
            out = out + len(REGISTRY[type(v)])
    keys = list(REGISTRY)
    return out, REGISTRY.get(type(y), "none"), keys[0] is tuple, [k.__name__ for k in REGISTRY], keys[3]()


def test_dict_keyed_by_classes_is_one_graph() -> None:
    """Note [Classes as dict keys]: lookups by `type(v)`, `get`, iteration over the keys (a key
    called builds the class)."""
    check(by_class, t(3), [1])
    got = kiln_dynamo.explain(by_class)(t(3), (1,))
    assert got.graph_count == 1 and got.break_reasons == [], got
    assert got.result[1] == "tuple" and type(got.result[4]) is Leaf


def test_a_class_key_is_guarded() -> None:
    """The argument's type is guarded (a new type recompiles), and so are the registry's keys: a
    class registered after the capture is seen."""
    backend = CountingBackend()
    f = kiln_dynamo.compile(by_class, backend=backend)
    x = t(3)
    assert_same(f(x, [1]), by_class(x, [1]))
    assert_same(f(x, (1,)), by_class(x, (1,)))
    assert f(x, Other())[1] == "none"
    REGISTRY[Other] = "other"
    try:
        assert_same(f(x, Other()), by_class(x, Other()))
        assert f(x, Other())[1] == "other"
    finally:
        del REGISTRY[Other]
    assert f(x, Other())[1] == "none"
    assert backend.graphs >= 4


def pytree_of(x: torch.Tensor, y: torch.Tensor) -> Any:
    tree = ((x, [y]), {"a": x * 2, "b": (3, None)})
    leaves = torch.utils._pytree.tree_leaves(tree)
    return [leaf if leaf is None else leaf + 1 for leaf in leaves], torch.utils._pytree.tree_is_leaf(x)


def test_torch_pytree_leaves_is_one_graph() -> None:
    """torch.utils._pytree reads its node registry (a dict keyed by classes, and by the
    `namedtuple` function) for every node."""
    check(pytree_of, t(2), t(3))
