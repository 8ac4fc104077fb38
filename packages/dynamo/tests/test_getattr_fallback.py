"""A class's `__getattr__`, called only when the normal lookup raises AttributeError (Note [The
__getattr__ fallback]), for objects made in the frame and objects from outside: the value it
returns (a default, a tensor computed from other attributes), the AttributeError it raises (for
getattr's default, hasattr, `except AttributeError`, or leaving the frame), and the guards that
see an attribute appear later."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import pytest
import torch
from conftest import assert_same, check, one_graph

import kiln_dynamo


class Defaults:
    """Options default to 2.0, `double` is computed, anything else is missing."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w = w

    def __getattr__(self, name: str) -> Any:
        if name.startswith("opt_"):
            return 2.0
        if name == "double":
            return self.w * 2
        raise AttributeError(f"{type(self).__name__} has no {name}")


class Scaled:
    scale = 3.0

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __getattr__(self, name: str) -> torch.Tensor:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.t * self.scale + len(name)


class Lazy:
    """A property that raises AttributeError falls back to __getattr__, as in CPython."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    @property
    def cached(self) -> torch.Tensor:
        raise AttributeError("not cached")

    def __getattr__(self, name: str) -> torch.Tensor:
        if name == "cached":
            return self.t + 100
        raise AttributeError(name)


class Remapped:
    """A Python __getattribute__ and a __getattr__: the hook runs first, the fallback on its miss."""

    attribute_map: ClassVar[dict[str, str]] = {"size": "hidden"}

    def __init__(self) -> None:
        self.hidden = 4

    def __getattribute__(self, key: str) -> Any:
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __getattr__(self, name: str) -> Any:
        if name == "fallback":
            return 7
        raise AttributeError(name)


def test_new_object_fallback_values() -> None:
    def f(x: torch.Tensor) -> Any:
        d = Defaults(x)
        s = Scaled(x)
        return x * d.opt_a, d.double + 1, d.w + 1, s.abc, s.scale * x

    check(f, torch.rand(3))


def test_new_object_fallback_under_getattr_and_hasattr() -> None:
    # before the fix: getattr's default and hasattr answered as if __getattr__ did not exist
    def f(x: torch.Tensor) -> torch.Tensor:
        d = Defaults(x)
        a = getattr(d, "opt_b", 10.0)
        b = getattr(d, "nope", 5.0)
        return x * a + b + hasattr(d, "opt_c") + 10 * hasattr(d, "nope") + 100 * hasattr(d, "w")

    check(f, torch.rand(3))


def test_new_object_fallback_raises_to_except() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        d = Defaults(x)
        try:
            d.nope  # noqa: B018
            r = 0
        except AttributeError as e:
            r = len(str(e))
        return x + r

    check(f, torch.rand(3))


def test_new_object_fallback_error_leaves_the_frame() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        d = Defaults(x)
        return x + d.nope

    with pytest.raises(AttributeError, match="Defaults has no nope"):
        f(torch.rand(3))
    with pytest.raises(AttributeError, match="Defaults has no nope"):
        kiln_dynamo.compile(f)(torch.rand(3))


def test_property_raising_attribute_error_falls_back() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return Lazy(x).cached

    check(f, torch.rand(3))


def test_getattribute_then_getattr() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        r = Remapped()
        return x * r.size + r.fallback + hasattr(r, "other")

    check(f, torch.rand(3))
    outside = Remapped()

    def g(x: torch.Tensor) -> torch.Tensor:
        return x * outside.size + outside.fallback + getattr(outside, "other", 0.5)

    x = torch.rand(3)
    assert_same(g(x), one_graph(g, x))


OUT = Defaults(torch.ones(3))


def test_object_from_outside_falls_back() -> None:
    def f(x: torch.Tensor, d: Defaults) -> Any:
        return (
            x * OUT.opt_a + OUT.double,
            getattr(OUT, "nope", 4.0),
            hasattr(OUT, "opt_c"),
            x * d.opt_z + d.double + getattr(d, "nope", 1.0),
        )

    x, d = torch.rand(3), Defaults(torch.rand(3))
    assert_same(f(x, d), one_graph(f, x, d))
    kiln_dynamo.reset()
    compiled = kiln_dynamo.compile(f)
    for _ in range(2):
        assert_same(f(x, d), compiled(x, d))
    assert (kiln_dynamo.counters.graph_breaks, kiln_dynamo.counters.recompiles) == (0, 0)


def test_attribute_set_later_wins_over_the_fallback() -> None:
    # the fallback holds only while normal lookup misses: an instance or class attribute set
    # after the first call is read on the next one
    def f(x: torch.Tensor, d: Defaults) -> torch.Tensor:
        return x * d.opt_a + getattr(d, "nope", 1.0)

    x, d = torch.rand(3), Defaults(torch.rand(3))
    compiled = kiln_dynamo.compile(f)
    assert_same(f(x, d), compiled(x, d))
    d.opt_a = 5.0
    assert_same(f(x, d), compiled(x, d))
    d.nope = torch.full((3,), 9.0)
    assert_same(f(x, d), compiled(x, d))
    del d.opt_a, d.nope
    assert_same(f(x, d), compiled(x, d))


def test_uncaught_fallback_error_of_outside_object() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + OUT.nope

    with pytest.raises(AttributeError, match="Defaults has no nope"):
        kiln_dynamo.compile(f)(torch.rand(3))


def test_getattr_in_c_is_a_break() -> None:
    def default(value: int, name: str) -> int:  # not a descriptor: called without the object
        return value

    class CGetattr:
        __getattr__ = functools.partial(default, 3)  # a callable written in C as the hook

    obj = CGetattr()

    def f(x: torch.Tensor) -> Any:
        return x + 1, getattr(obj, "a", 5), obj.b

    x = torch.rand(3)
    report = kiln_dynamo.explain(f)(x)
    assert any("__getattr__ in C" in str(r) for r in report.break_reasons), report
    assert_same(f(x), report.result)


def test_class_attribute_set_later_wins_over_a_miss() -> None:
    # Note [Class attributes found missing]: the miss is guarded on every class of the MRO
    class Base:
        def __getattr__(self, name: str) -> float:
            if name.startswith("opt_"):
                return 2.0
            raise AttributeError(name)

    class Child(Base):
        pass

    class Plain:
        pass

    def f(x: torch.Tensor, d: Base, p: Plain) -> torch.Tensor:
        return x * d.opt_a + Child().opt_b + getattr(p, "w", 3.0)

    x, d, p = torch.rand(3), Child(), Plain()
    compiled = kiln_dynamo.compile(f)
    assert_same(f(x, d, p), compiled(x, d, p))
    Base.opt_a = 7.0  # type: ignore[attr-defined]
    Child.opt_b = 5.0  # type: ignore[attr-defined]
    Plain.w = 9.0  # type: ignore[attr-defined]
    assert_same(f(x, d, p), compiled(x, d, p))
