"""The runner reads every value it reaches through a source before it replays the frame's effects
(Note [Sources are read before the effects] in codegen.py): a value the frame took out of a
container, or read before it rebound a name, is the object eager's frame held."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kiln_dynamo


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln_dynamo.reset()
    yield
    kiln_dynamo.reset()


class _Obj:
    pass


def test_values_popped_from_containers_are_returned() -> None:
    o = _Obj()
    st: dict[str, Any] = {"o": o, "l": [1, 2]}
    items: list[Any] = [o, 5]

    def f(x: torch.Tensor) -> tuple[torch.Tensor, Any, Any, Any]:
        a = st.pop("o")
        b = st.pop("l")
        c = items.pop(0)
        return x + 1, a, b, c

    out = kiln_dynamo.compile(f)(torch.ones(2))  # raised KeyError in the runner
    assert out[1] is o and out[2] == [1, 2] and out[3] is o
    assert st == {} and items == [5]


_HELD: list[int] = [1]


def test_a_global_read_before_the_frame_rebinds_it() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        global _HELD
        old = _HELD
        _HELD = [2]
        return x * 2, old

    first = _HELD
    out = kiln_dynamo.compile(f)(torch.ones(2))
    assert out[1] is first and _HELD == [2]


def test_a_dict_taken_out_of_its_parent_then_changed() -> None:
    inner = {"k": 1}
    st: dict[str, Any] = {"inner": inner}

    def f(x: torch.Tensor) -> torch.Tensor:
        d = st["inner"]
        st["inner"] = {"k": 0}
        d["k"] = 5  # the entry dict, not the one the frame put in its place
        return x + d["k"]

    out = kiln_dynamo.compile(f)(torch.zeros(2))
    assert out.tolist() == [5.0, 5.0]
    assert inner == {"k": 5} and st["inner"] == {"k": 0}


def _pops_an_iterator() -> Any:
    ws = [1.0, 2.0, 4.0]
    st: dict[str, Any] = {}

    def f(x: torch.Tensor) -> torch.Tensor:
        out = x
        if "it" in st:
            for w in st.pop("it"):
                out = out + w
        it = reversed(ws)
        next(it)
        st["it"] = it
        return out

    return f


def test_an_iterator_popped_then_split_before_its_loop() -> None:
    # `reversed` of a list from outside is a break at the loop, so the frame splits before it
    # with the popped iterator on the stack: the split read it again from the emptied dict
    eager, compiled = _pops_an_iterator(), kiln_dynamo.compile(_pops_an_iterator())
    x = torch.zeros(2)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), eager(x))


def _run_calls(fn: Any, d: dict[str, int], items: list[int]) -> list[Any]:
    out: list[Any] = []
    for i in range(3):
        try:
            out.append(fn(torch.ones(2), items, d))
        except RuntimeError as e:
            out.append(repr(e))
        d[f"k{i}"] = i
    return out


def test_dict_iterator_made_after_a_key_is_added_is_rebuilt_after_the_effects() -> None:
    # Note [What leaves the frame is rebuilt after the effects]: pyfuzz seed 141, minimized. The
    # iterator crosses the split at `tolist`; rebuilt before `d.clear(); d.update(...)` replayed
    # 'zz', its next step in the continuation raised "dictionary changed size during iteration".
    def f(y: torch.Tensor, items: list[int], d: dict[str, int]) -> list[int]:
        d["zz"] = 1
        it = iter(d.values())
        items.insert(0, len(y.tolist()))  # a graph break
        return list(it)

    want = _run_calls(f, {"a": 1}, [])
    got = _run_calls(kiln_dynamo.compile(f), {"a": 1}, [])
    assert got == want == [[1, 1], [1, 1, 0], [1, 1, 0, 1]]


def test_reversed_iterator_over_a_grown_list_is_rebuilt_after_the_effects() -> None:
    # the same order for `reversed(l)` over an outside list the frame grew before making it:
    # rebuilt before the list's replay, its position was out of range of the old list
    def f(x: torch.Tensor, items: list[int], d: dict[str, int]) -> tuple[torch.Tensor, list[int]]:
        items.append(len(items))
        items.append(7)
        it = reversed(items)
        next(it)
        n = len(x.tolist())  # a graph break
        return x + n, list(it)

    def calls(fn: Any) -> list[Any]:
        items: list[int] = []
        return [fn(torch.ones(2), items, {}) for _ in range(3)]

    want, got = calls(f), calls(kiln_dynamo.compile(f))
    for (wx, wl), (gx, gl) in zip(want, got, strict=True):
        torch.testing.assert_close(gx, wx)
        assert gl == wl
