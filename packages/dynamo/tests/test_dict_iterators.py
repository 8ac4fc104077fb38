"""A live iterator over a dict or OrderedDict handed to the frame (issue 16, dpt: transformers'
`{k: v for k, v in output.items() if ...}` runs as its own frame when the frame that made it runs
as plain Python): Note [Iterators over a dict from outside]. The frame traces over the items the
iterator has left, and what it consumes is replayed on the real iterator."""

from __future__ import annotations

import collections
import types
from collections.abc import Iterator
from typing import Any

import torch
from conftest import one_graph

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(5 * sum(shape) + 1)
    return torch.randn(*shape, generator=g)


def _filtered(d: Any) -> dict[str, Any]:
    return {k: v * 2 for k, v in d.items() if k != "hidden_states"}


def _filtered_items(it: Iterator[tuple[str, Any]]) -> dict[str, Any]:
    return {k: v * 2 for k, v in it if k != "hidden_states"}


def _comprehension_frame() -> Any:
    """The comprehension's own code, called as a frame with its `.0` a live iterator, as CPython
    3.11 does. 3.12 inlines comprehensions into their function (PEP 709): there a function that
    takes the live iterator as its argument is the frame that receives it."""
    code = next((c for c in _filtered.__code__.co_consts if getattr(c, "co_name", "") == "<dictcomp>"), None)
    return _filtered_items if code is None else types.FunctionType(code, globals())


_DICTCOMP = _comprehension_frame()


def _ordered(x: torch.Tensor) -> collections.OrderedDict[str, torch.Tensor]:
    return collections.OrderedDict(last=x + 1, hidden_states=x, pooled=x * 3)


def test_a_comprehension_over_a_live_odict_iterator_is_one_graph() -> None:
    x = t(3)
    it = iter(_ordered(x).items())
    got = one_graph(_DICTCOMP, it)
    assert list(it) == []  # consumed to its end, as eager leaves it
    want = _DICTCOMP(iter(_ordered(x).items()))
    assert list(got) == list(want) == ["last", "pooled"]
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_the_rest_is_guarded() -> None:
    fn = kiln_dynamo.compile(_DICTCOMP, backend="eager")
    x = t(3)
    for d in (_ordered(x), _ordered(t(2, 2)), collections.OrderedDict(a=x), _ordered(x)):
        it = iter(d.items())
        if len(d) > 1:
            next(it)  # a partly consumed iterator: only the rest is iterated
        got = fn(it)
        want = _DICTCOMP(iter(list(d.items())[1 if len(d) > 1 else 0 :]))
        assert list(got) == list(want)
        for k in want:
            torch.testing.assert_close(got[k], want[k])
        assert list(it) == []


def _take_one(it: Iterator[Any], x: torch.Tensor) -> Any:
    k = next(it)
    v = next(it)
    return x * v, k


def test_what_the_frame_consumed_is_replayed_on_the_iterator() -> None:
    x = t(2)
    makers = (
        lambda: iter({"a": 2, "b": 3, "c": 4}.values()),  # dict's value iterator
        lambda: iter(collections.OrderedDict(a=2, b=3, c=4).values()),
    )
    for make in makers:
        it, want_it = make(), make()
        got = one_graph(_take_one, it, x)
        want = _take_one(want_it, x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] == 2
        assert list(it) == list(want_it) == [4]  # the real iterator advanced by two, not exhausted


def _hand_back(it: Iterator[Any], x: torch.Tensor) -> Any:
    first = next(it)
    return it, x + first


def test_the_iterator_leaves_the_frame_as_itself() -> None:
    x = t(2)
    fn = kiln_dynamo.compile(_hand_back, backend="eager")
    it = iter({1.0: "x", 2.0: "y"})  # dict's key iterator
    back, y = fn(it, x)
    assert back is it and list(it) == [2.0]
    torch.testing.assert_close(y, x + 1.0)


def _loop_with_break(it: Iterator[Any], x: torch.Tensor) -> torch.Tensor:
    for _, v in it:
        x = x + v
        if x.sum() > 100:  # data-dependent: a break inside the loop
            x = x - 1
    return x


def test_a_loop_over_it_that_breaks_stays_correct() -> None:
    x = t(3)
    d = collections.OrderedDict(a=t(3) * 60, b=t(3), c=t(3) * 80)
    it = iter(d.items())
    report = kiln_dynamo.explain(_loop_with_break)(it, x)
    assert report.break_reasons  # the loop splits (the iterator crosses the split as itself)
    torch.testing.assert_close(report.result, _loop_with_break(iter(d.items()), x))
    assert list(it) == []


# --- list and tuple iterators from outside (detr: `{f: framework_to_test[f] for f in frameworks}`) --


def _scaled(xs: list[torch.Tensor], k: dict[int, float]) -> dict[int, torch.Tensor]:
    return {i: x * k[i] for i, x in enumerate(xs)}


def _sum_rest(it: Iterator[Any], x: torch.Tensor) -> torch.Tensor:
    for v in it:
        x = x + v
    return x


def _times_next(it: Iterator[Any], x: torch.Tensor) -> torch.Tensor:
    return x * next(it)


SHARED: list[Any] = []


def _sum_and_grow(it: Iterator[Any], x: torch.Tensor) -> torch.Tensor:
    for v in it:
        if v == 1:
            SHARED.append(10)  # the list the iterator runs over: eager's loop sees the new item
        x = x + v
    return x


def test_list_and_tuple_iterators_from_outside() -> None:
    x = t(3)
    for make in (lambda: iter([1.0, 2.0, 3.0]), lambda: iter((4, 5)), lambda: iter([x, x * 2])):
        for skip in (0, 1):
            it, ref = make(), make()
            for _ in range(skip):
                next(it), next(ref)
            kiln_dynamo.reset()
            got = one_graph(_sum_rest, it, x)
            torch.testing.assert_close(got, _sum_rest(ref, x))
            assert list(it) == list(ref) == []
    it, ref = iter([2.0, 3.0]), iter([2.0, 3.0])
    kiln_dynamo.reset()
    torch.testing.assert_close(one_graph(_times_next, it, x), _times_next(ref, x))
    assert list(it) == list(ref) == [3.0]  # advanced by one step, as eager leaves it


def test_a_comprehension_over_a_live_list_iterator() -> None:
    code = next((c for c in _scaled.__code__.co_consts if getattr(c, "co_name", "") == "<dictcomp>"), None)
    if code is None:  # 3.12 inlines comprehensions (PEP 709)
        return
    k = {0: 2.0, 1: 3.0}
    comp = types.FunctionType(code, globals(), None, None, (types.CellType(k),))
    xs = [t(2), t(3)]
    got = one_graph(comp, iter(list(enumerate(xs))))
    want = _scaled(xs, k)
    assert list(got) == list(want)
    for i in want:
        torch.testing.assert_close(got[i], want[i])


def test_a_list_changed_while_its_iterator_runs_is_never_stale() -> None:
    x = t(3)
    SHARED[:] = [1, 2, 3]
    want = _sum_and_grow(iter(SHARED), x)
    assert SHARED == [1, 2, 3, 10]
    SHARED[:] = [1, 2, 3]
    kiln_dynamo.reset()
    got = kiln_dynamo.compile(_sum_and_grow)(iter(SHARED), x)
    torch.testing.assert_close(got, want)
    assert SHARED == [1, 2, 3, 10]
