# ruff: noqa: RUF005, RUF015  (the cases are the concatenations and list() calls under test)
"""Every value that leaves a compiled frame has eager's exact type (issue 16's wrong behaviours).

Two cases once differed from eager: slicing an nn.Sequential gave a list (so `seq[1:](x)` raised
`TypeError: 'list' object is not callable`), and arithmetic on a torch.Size (`x.shape + (1,)`)
gave a plain tuple. The sweep below runs small capture cases eagerly and compiled and compares
everything that leaves the frame — the return value, and what the frame stored in an attribute,
a global, an input list or dict, or carried across a graph break into a continuation — with
`type(a) is type(b)` recursively through containers and modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import CountingBackend
from torch import nn

import kiln_dynamo

torch.manual_seed(0)
SEQ = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Linear(4, 4))
MLIST = nn.ModuleList([nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)])
X = torch.randn(2, 4)


class Box:
    pass


BOX = Box()
STORED: Any = None


def _exact(a: Any, b: Any, path: str = "out") -> None:
    """Same type at every level; tensors equal; modules with the same children under the same keys."""
    assert type(a) is type(b), f"{path}: eager {type(a).__qualname__}, compiled {type(b).__qualname__}"
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, msg=path)
    elif isinstance(a, nn.Module):
        assert list(a._modules) == list(b._modules), f"{path}: keys"
        for k in a._modules:
            assert a._modules[k] is b._modules[k], f"{path}[{k!r}] is another module"
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: len"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _exact(x, y, f"{path}[{i}]")
    elif isinstance(a, type({}.keys()) | type({}.values()) | type({}.items())):
        _exact(list(a), list(b), f"{path} (view)")  # views compare by identity: compare the elements
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys"
        for k in a:
            _exact(a[k], b[k], f"{path}[{k!r}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


# --- nn.Sequential / nn.ModuleList -------------------------------------------------------------
def s_index(x):
    return SEQ[0](x), SEQ[-1](x)


def s_slice_call(x):
    return SEQ[1:3](x)


def s_nested_slice_call(x):
    return SEQ[2][0:1](x)


def s_slice_of_slice(x):
    return SEQ[:3][1:](x), SEQ[1:][1](x)


def s_slice_out(x):
    return x + 1, SEQ[0:2], SEQ[::2], SEQ[2][1:]


def s_slice_called_and_out(x):
    head = SEQ[:2]
    return head(x), head


def s_iterate(x):
    for m in SEQ:
        x = m(x)
    return x


def s_iterate_slice(x):
    return [m(x) for m in SEQ[:2]]


def s_len(x):
    return x * len(SEQ), len(SEQ[1:]), len(SEQ[2]), len(MLIST[::2])


def s_reversed(x):
    out = []
    for m in reversed(MLIST):
        x = m(x)
        out.append(type(m))
    for m in reversed(SEQ[2:]):
        x = m(x)
        out.append(type(m))
    return x, out, [type(m) for m in reversed(SEQ)]


def s_types(x):
    return x + 1, type(SEQ[:1]), type(MLIST[:1]), isinstance(SEQ[1:], nn.Sequential), type(SEQ[2])


def s_modulelist_slice(x):
    for m in MLIST[::-1][0:2]:
        x = m(x)
    return x, MLIST[1:], MLIST[::2]


def s_list_of_sequential(x):
    return list(SEQ)[0](x), list(SEQ[2])


# --- torch.Size ---------------------------------------------------------------------------------
def z_returned(x):
    return x + 1, x.shape, x.size(), x.shape[1:], x.size()[::-1]


def z_arithmetic(x):
    s = x.shape
    return x + 1, s + (1,), (1,) + s, s + s, s * 2, 2 * s, (*s, 1), tuple(s), list(s)


def z_augmented(x):
    s = x.shape
    s += (3,)
    t = (5,)
    t += x.shape
    return x + 1, s, t


def z_compared(x):
    return x + 1, x.shape == (2, 4), x.shape == torch.Size([2, 4]), x.shape != (1,), x.shape[0] == 2


def z_built(x):
    return x.reshape(torch.Size([8])), torch.Size([1] + list(x.shape)), torch.Size(x.shape)


def z_in_containers(x):
    return {"s": x.shape, "t": x + 1, "l": [x.shape, (x.shape,)]}


def z_of_results(x):
    y = x.view(8)
    return y, y.shape, x.sum(0).shape, torch.max(x, 0)


def z_attr(x):
    BOX.s = x.shape
    BOX.t = x.size()[1:] + (1,)
    return x + 1


def z_global(x):
    global STORED
    STORED = (x.shape + (1,), x.shape * 2)
    return x + 1


def z_list_dict(x, lst, d):
    lst.append(x.shape)
    lst.append((1,) + x.shape)
    d["s"] = x.shape * 2
    return x + 1


def z_across_break(x):
    s = x.shape
    t = s + (1,)
    print(end="")  # a graph break: s and t cross into the continuation
    return x * 2, s, t, type(s) is torch.Size


def z_in_continuation(x):
    y = x + 1
    print(end="")
    return y.shape, y * 2, y.shape + (1,)


Case = tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]], Callable[..., Any] | None]


# --- dict views (Note [Dict views]) -------------------------------------------------------------
def v_views_of_an_input(x, d):
    keys = d.keys()
    d["c"] = x * 3  # a view sees the dict's later writes
    return x + len(keys), keys, d.values(), d.items(), "c" in keys


def v_views_of_a_fresh_dict(x):
    d = {"u": x, "v": x * 2}
    return d.values(), d, [k for k, _ in d.items()]


CASES: list[Case] = [
    ("seq_index", s_index, lambda: (X,), None),
    ("seq_slice_call", s_slice_call, lambda: (X,), None),
    ("seq_nested_slice_call", s_nested_slice_call, lambda: (X,), None),
    ("seq_slice_of_slice", s_slice_of_slice, lambda: (X,), None),
    ("seq_slice_out", s_slice_out, lambda: (X,), None),
    ("seq_slice_called_and_out", s_slice_called_and_out, lambda: (X,), None),
    ("seq_iterate", s_iterate, lambda: (X,), None),
    ("seq_iterate_slice", s_iterate_slice, lambda: (X,), None),
    ("seq_len", s_len, lambda: (X,), None),
    ("seq_reversed", s_reversed, lambda: (X,), None),
    ("seq_types", s_types, lambda: (X,), None),
    ("modulelist_slice", s_modulelist_slice, lambda: (X,), None),
    ("list_of_sequential", s_list_of_sequential, lambda: (X,), None),
    ("size_returned", z_returned, lambda: (X,), None),
    ("size_arithmetic", z_arithmetic, lambda: (X,), None),
    ("size_augmented", z_augmented, lambda: (X,), None),
    ("size_compared", z_compared, lambda: (X,), None),
    ("size_built", z_built, lambda: (X,), None),
    ("size_in_containers", z_in_containers, lambda: (X,), None),
    ("size_of_results", z_of_results, lambda: (X,), None),
    ("size_attr", z_attr, lambda: (X,), lambda *a: (BOX.s, BOX.t)),
    ("size_global", z_global, lambda: (X,), lambda *a: STORED),
    ("size_list_dict", z_list_dict, lambda: (X, [], {}), lambda x, lst, d: (lst, d)),
    ("size_across_break", z_across_break, lambda: (X,), None),
    ("size_in_continuation", z_in_continuation, lambda: (X,), None),
    ("dict_views_of_an_input", v_views_of_an_input, lambda: (X, {"a": X, "b": 2 * X}), lambda x, d: d),
    ("dict_views_of_a_fresh_dict", v_views_of_a_fresh_dict, lambda: (X,), None),
]


@pytest.mark.parametrize(("name", "fn", "make_args", "state"), CASES, ids=[c[0] for c in CASES])
def test_values_leaving_the_frame_keep_eager_types(
    name: str, fn: Callable[..., Any], make_args: Callable[[], tuple[Any, ...]], state: Any
) -> None:
    eager_args = make_args()
    expected = fn(*eager_args)
    expected_state = state(*eager_args) if state else None
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for _ in range(2):  # the capture, then the cached entry
        args = make_args()
        actual = compiled(*args)
        _exact(expected, actual)
        if state:
            _exact(expected_state, state(*args), "state")
    assert backend.graphs >= 1, "nothing was captured: the case tests nothing"
    assert kiln_dynamo.counters.fallbacks == [], kiln_dynamo.counters.fallbacks
    assert kiln_dynamo.counters.recompiles == 0


def test_sequential_slice_is_a_fresh_callable_sequential() -> None:
    """The regression of issue 16: `seq[1:3](x)` raised `'list' object is not callable`."""
    compiled = kiln_dynamo.compile(s_slice_called_and_out)
    y, head = compiled(X)
    assert type(head) is nn.Sequential and head is not compiled(X)[1]  # a new one per call, as eager
    torch.testing.assert_close(y, head(X))
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.fallbacks == []


def test_size_arithmetic_with_a_non_int_stays_eager() -> None:
    """`x.shape + (1.5,)` raises TypeError in eager; compiled, it must raise too (a break)."""

    def f(x):
        return x + 1, x.shape + (1.5,)

    with pytest.raises(TypeError):
        f(X)
    with pytest.raises(TypeError):
        kiln_dynamo.compile(f)(X)


def _advanced(it: Any) -> Any:
    next(it)
    return it


ITERATOR_CASES = {
    "zip": lambda x: zip([x, x + 1], [1, 2], strict=False),
    "zip advanced": lambda x: _advanced(zip([1, 2, 3], [x, x, x], strict=False)),
    "enumerate": lambda x: enumerate([x, x * 2], 3),
    "map": lambda x: map(lambda t: t + 1, [x, x]),
    "filter": lambda x: filter(lambda v: v > 0, [1, -1, 2]),
    "iter of a list": lambda x: iter([x, 1]),
    "iter of a tuple": lambda x: iter((x, 1)),
    "reversed list": lambda x: reversed([x, 2, 3]),
    "chain": lambda x: __import__("itertools").chain([1], [x]),
    "islice": lambda x: __import__("itertools").islice([1, 2, 3, x], 1, 3),
}


@pytest.mark.parametrize("name", list(ITERATOR_CASES))
def test_an_iterator_that_leaves_the_frame_has_eager_type(name: str) -> None:
    # Note [Iterators keep their type] (variables/lists.py): rebuilt as the type eager made, over
    # the items it has left
    fn = ITERATOR_CASES[name]
    kiln_dynamo.reset()
    compiled = kiln_dynamo.compile(fn, backend=CountingBackend())
    expected, actual = fn(X), compiled(X)
    assert type(actual) is type(expected), (type(expected), type(actual))
    _exact(list(expected), list(actual))
