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
