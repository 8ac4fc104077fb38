"""Stores on objects and classes made in the frame (issue 16): a property's setter runs (Note
[Stores through data descriptors]), a class with `__setattr__` or `__slots__` breaks, a class
made in the frame takes class-attribute stores for its own reads and starts fresh on every
call, as eager's new class does (Note [Setting a class attribute])."""

from __future__ import annotations

from typing import Any

import torch
from conftest import CountingBackend

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(5 * sum(shape) + 2)
    return torch.randn(*shape, generator=g)


class Doubling:
    def __init__(self) -> None:
        self._v = 1

    @property
    def v(self) -> Any:
        return self._v

    @v.setter
    def v(self, val: Any) -> None:
        self._v = val * 2


def _setter(x: torch.Tensor) -> Any:
    p = Doubling()
    p.v = 3
    q = Doubling()
    object.__setattr__(q, "v", x)  # skips __setattr__, not the property
    return x * p.v, p._v, q._v, p


def test_property_setter_runs_on_an_object_made_in_the_frame() -> None:
    x = t(3)
    report = kiln_dynamo.explain(_setter)(x)
    assert report.graph_count == 1 and report.break_reasons == []
    want = _setter(x)
    torch.testing.assert_close(report.result[0], want[0])
    assert report.result[1] == want[1] == 6
    torch.testing.assert_close(report.result[2], want[2])
    assert type(report.result[3]) is Doubling and vars(report.result[3]) == vars(want[3]) == {"_v": 6}


class Hooked:
    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value + 1)


class Slotted:
    __slots__ = ("a",)


class ReadOnly:
    @property
    def v(self) -> int:
        return 1


def _hooked(x: torch.Tensor) -> Any:
    h = Hooked()
    h.a = 1
    return x * h.a


def _slotted(x: torch.Tensor) -> Any:
    s = Slotted()
    s.a = 2
    return x * s.a


def _read_only(x: torch.Tensor) -> Any:
    r = ReadOnly()
    try:
        r.v = 2
    except AttributeError:
        return x - 1
    return x + 1


def test_stores_kiln_does_not_run_are_breaks_with_eager_results() -> None:
    x = t(2)
    report = kiln_dynamo.explain(_read_only)(x)
    assert any("property" in str(b) for b in report.break_reasons), report.break_reasons
    torch.testing.assert_close(report.result, _read_only(x))
    # a slot is stored since breadth13 (Note [Slots of objects made in the frame]), and a Python
    # __setattr__ runs inlined since capture16b (Note [Attribute hooks of objects made in the frame])
    for fn in (_slotted, _hooked):
        report = kiln_dynamo.explain(fn)(x)
        assert report.graph_count == 1 and not report.break_reasons, report
        torch.testing.assert_close(report.result, fn(x))


def _local_class(x: torch.Tensor) -> Any:
    class K:
        n = 0

        @property
        def twice(self) -> int:
            return self.n * 2

        @twice.setter
        def twice(self, v: int) -> None:
            type(self).n = v // 2

    K.n += 1
    k = K()
    k.twice = 8
    return x * K.n + k.twice, K.n


def test_class_made_in_the_frame_takes_stores_and_starts_fresh_each_call() -> None:
    x = t(4)
    report = kiln_dynamo.explain(_local_class)(x)
    assert report.graph_count == 1 and report.break_reasons == []
    kiln_dynamo.reset()
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_local_class, backend=backend)
    for _ in range(3):  # each call's class starts from its body (n = 0), as eager's new class
        got, want = compiled(x), _local_class(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] == 4
    assert backend.graphs == 1 and kiln_dynamo.counters.recompiles == 0


def test_class_made_in_the_frame_does_not_take_a_function() -> None:
    def f(x: torch.Tensor) -> Any:
        class K:
            pass

        K.g = lambda self: 1  # a method added later binds on instances: not a plain value
        return x * K().g()

    report = kiln_dynamo.explain(f)(t(2))
    assert any("not a plain value" in str(b) for b in report.break_reasons)
    torch.testing.assert_close(report.result, f(t(2)))
