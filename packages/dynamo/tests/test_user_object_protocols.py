"""Python's protocols on instances of user classes (issue 16; Note [Comparing user objects], Note
[Protocols of objects made in the frame]): `==`/`!=`/`<` run the class's own methods with
Python's order and NotImplemented fallbacks (before, `==` answered identity: a wrong result),
binary operators run `__add__`/`__radd__`/`__iadd__`, and subscripts, `in`, `len`, truth,
iteration and calls run the class's dunders."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
from conftest import CountingBackend

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3 * sum(shape) + 4)
    return torch.randn(*shape, generator=g)


class Named:
    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> Any:
        if isinstance(other, str):
            return self.name == other
        if isinstance(other, Named):
            return self.name == other.name
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __lt__(self, other: Named) -> bool:
        return self.name < other.name


class Plain:
    pass


GLOBAL = Named("relu")


def _compare(x: torch.Tensor) -> Any:
    a, b = Named("relu"), Named("gelu")
    p = Plain()
    return (
        x * (a == "relu"),
        a == "relu",
        a != "relu",
        a == b,
        b < a,
        a > b,  # reflected: b.__lt__(a)
        GLOBAL == "relu",
        GLOBAL != "gelu",
        p == p,  # noqa: PLR0124
        p != Plain(),
        p == 1,
        a in ["x", "relu"],
        ["gelu"].count(b),
    )


def test_comparisons_run_the_classes_methods() -> None:
    x = t(3)
    report = kiln_dynamo.explain(_compare)(x)
    assert report.graph_count == 1 and report.break_reasons == []
    want = _compare(x)
    torch.testing.assert_close(report.result[0], want[0])
    assert report.result[1:] == want[1:]


def test_comparison_guards_the_global_it_read() -> None:
    global GLOBAL
    x = t(2)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_compare, backend=backend)
    assert compiled(x)[6] is True
    old = GLOBAL
    try:
        GLOBAL = Named("gelu")  # the attribute the compiled `__eq__` read changed: recompiled
        assert compiled(x)[6:8] == _compare(x)[6:8] == (False, False)
    finally:
        GLOBAL = old
    assert backend.graphs == 2


def test_ordering_nobody_implements_breaks_and_raises_as_eager() -> None:
    def f(x: torch.Tensor) -> Any:
        return x, Plain() < Plain()

    with pytest.raises(TypeError):
        f(t(2))
    with pytest.raises(TypeError):
        kiln_dynamo.compile(f, backend=CountingBackend())(t(2))


class Vec:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __add__(self, o: Any) -> Any:
        if isinstance(o, Vec):
            return Vec(self.t + o.t)
        return NotImplemented

    def __radd__(self, o: Any) -> Any:
        return Vec(self.t + o)

    def __iadd__(self, o: Vec) -> Vec:
        self.t = self.t * 0 + o.t
        return self

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.t * i

    def __setitem__(self, i: int, v: torch.Tensor) -> None:
        self.t = self.t + v * i

    def __contains__(self, i: int) -> bool:
        return i < 2

    def __iter__(self) -> Any:
        return iter([self.t, self.t + 1])

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        return y + self.t


class Empty:
    def __len__(self) -> int:
        return 0


def _protocols(x: torch.Tensor) -> Any:
    v = Vec(x) + Vec(x)
    w = 1 + Vec(x)  # int.__add__ gives NotImplemented: Vec.__radd__
    u = Vec(x)
    u += v
    v[3] = x
    return v[2], len(v), 1 in v, 5 in v, list(v)[1], v(x), bool(v), bool(Empty()), bool(Plain()), w.t, u.t


def test_operators_and_protocols_run_the_dunders() -> None:
    x = t(4)
    report = kiln_dynamo.explain(_protocols)(x)
    assert report.graph_count == 1 and report.break_reasons == []
    want = _protocols(x)
    for g, w in zip(report.result, want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w and type(g) is type(w)


def test_counter_of_user_objects_uses_their_equality() -> None:
    def f(x: torch.Tensor) -> Any:
        c = collections.Counter(["a", "b", "a"])
        return x * c["a"], Named("a") == "a"

    report = kiln_dynamo.explain(f)(t(2))
    assert report.graph_count == 1 and report.break_reasons == []
    assert report.result[1] is True


def _self_referring_class(x: torch.Tensor) -> Any:
    class V:
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

        def __add__(self, o: Any) -> Any:
            return V(self.t + o.t)  # the class's own name, a cell of the frame

    v = V(x) + V(x * 2)
    return v.t, len([v]), v == v  # noqa: PLR0124


def test_class_made_in_the_frame_refers_to_itself() -> None:
    x = t(3)
    report = kiln_dynamo.explain(_self_referring_class)(x)
    assert report.graph_count == 1 and report.break_reasons == []
    want = _self_referring_class(x)
    torch.testing.assert_close(report.result[0], want[0])
    assert report.result[1:] == want[1:]
