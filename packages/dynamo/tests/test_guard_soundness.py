"""Soundness of guards (issue 18): what a capture inlined from outside the frame is guarded.

Each case captures, changes something the capture relied on, and calls again: the compiled
function must recompile (exactly once) and give eager's new answer, never the old one. Covered:
the compile itself (backend, fullgraph), class methods read through an instance (a plain
object, an nn.Module, a submodule's forward, a `super()` call, a new object), static and class
methods, properties, class constants, builtins shadowed by a global or replaced in `builtins`,
global functions and module attribute functions (`math.sqrt`).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import CountingBackend
from torch import nn

import kiln_dynamo
from kiln_dynamo import convert_frame

X = torch.randn(3)


class Obj:
    K = 2

    def method(self, x):
        return x + 1

    @property
    def prop(self):
        return 1

    @staticmethod
    def stat(x):
        return x + 4

    @classmethod
    def klass(cls, x):
        return x + cls.K


class Sub(nn.Module):
    def forward(self, x):
        return x + 1


class Base(nn.Module):
    def forward(self, x):
        return x * 2


class Net(Base):
    SCALE = 2.0

    def __init__(self) -> None:
        super().__init__()
        self.sub = Sub()

    def act(self, x):
        return x.relu()

    def forward(self, x):
        return super().forward(self.act(self.sub(x))) * self.SCALE


OBJ = Obj()
NET = Net()


def helper(x):
    return x + 1


def f_method(x, o):
    return o.method(x) * 2


def f_prop(x, o):
    return x * o.prop


def f_class_const(x, o):
    return x * o.K


def f_static_and_class(x):
    return Obj.stat(x) + Obj.klass(x)


def f_through_new_object(x):
    return Obj().method(x)


def f_len(x):
    return x * len([1, 2])


def f_abs(x):
    return x * abs(-2)


def f_sqrt(x):
    return x * math.sqrt(4.0)


def f_global_fn(x):
    return helper(x)


def f_net(x):
    return NET(x)


def _patched(target: Any, name: str, value: Any) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda mp: mp.setattr(target, name, value)


CASES: list[tuple[str, Callable[..., Any], tuple[Any, ...], Callable[[pytest.MonkeyPatch], None]]] = [
    ("method", f_method, (X, OBJ), _patched(Obj, "method", lambda self, x: x + 100)),
    ("property", f_prop, (X, OBJ), _patched(Obj, "prop", property(lambda self: 7))),
    ("class_constant", f_class_const, (X, OBJ), _patched(Obj, "K", 5)),
    ("staticmethod", f_static_and_class, (X,), _patched(Obj, "stat", staticmethod(lambda x: x * 0))),
    ("classmethod", f_static_and_class, (X,), _patched(Obj, "klass", classmethod(lambda cls, x: x * 0))),
    ("method_of_new_object", f_through_new_object, (X,), _patched(Obj, "method", lambda self, x: -x)),
    ("builtin_shadowed", f_len, (X,), lambda mp: mp.setitem(globals(), "len", lambda v: 10)),
    ("builtins_replaced", f_abs, (X,), _patched(builtins, "abs", lambda v: 7)),
    ("module_function", f_sqrt, (X,), _patched(math, "sqrt", lambda v: 10.0)),
    ("global_function", f_global_fn, (X,), lambda mp: mp.setitem(globals(), "helper", lambda v: v * 50)),
    ("module_method", f_net, (X,), _patched(Net, "act", lambda self, x: x * 9)),
    ("module_class_constant", f_net, (X,), _patched(Net, "SCALE", 3.0)),
    ("submodule_forward", f_net, (X,), _patched(Sub, "forward", lambda self, x: x - 5)),
    ("super_forward", f_net, (X,), _patched(Base, "forward", lambda self, x: x - 5)),
    # Through the instance dict, not `mp.setattr(NET, ...)`: pytest before 9 "restores" an
    # inherited attribute by storing the bound method on the instance, which shadows the class's
    # function from then on (a real change of state, so a correct second recompile).
    ("instance_method", f_net, (X,), lambda mp: mp.setitem(NET.__dict__, "act", lambda x: x * 9)),
]


@pytest.mark.parametrize(("name", "fn", "args", "change"), CASES, ids=[c[0] for c in CASES])
def test_change_after_capture_recompiles(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], change: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for _ in range(2):
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert backend.graphs == 1 and kiln_dynamo.counters.recompiles == 0
    change(monkeypatch)
    expected = fn(*args)
    torch.testing.assert_close(compiled(*args), expected)  # a stale entry would give the old result
    torch.testing.assert_close(compiled(*args), expected)
    assert kiln_dynamo.counters.recompiles == 1, kiln_dynamo.counters.guard_failures
    monkeypatch.undo()
    torch.testing.assert_close(compiled(*args), fn(*args))  # the first entry serves again
    assert kiln_dynamo.counters.recompiles == 1


def test_a_bound_method_shadowing_its_class_function_is_a_new_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """What pytest < 9's monkeypatch.undo leaves: the instance holds its own bound method. The
    first entry (no own attribute) no longer applies; the new one calls what the instance holds."""
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(f_net, backend=backend)
    torch.testing.assert_close(compiled(X), f_net(X))
    monkeypatch.setitem(NET.__dict__, "act", NET.act)
    torch.testing.assert_close(compiled(X), f_net(X))
    monkeypatch.setitem(NET.__dict__, "act", lambda x: x * 9)
    torch.testing.assert_close(compiled(X), f_net(X))
    assert kiln_dynamo.counters.recompiles == 2


def test_another_backend_recompiles_and_the_same_one_reuses() -> None:
    lin = nn.Linear(3, 3)
    first, second = CountingBackend(), CountingBackend()
    a = kiln_dynamo.compile(lin, backend=first)
    b = kiln_dynamo.compile(lin, backend=second)
    again = kiln_dynamo.compile(lin, backend=first)
    for m in (a, b, again, a, b):
        torch.testing.assert_close(m(X), lin(X))
    assert (first.graphs, second.graphs) == (1, 1)  # `again` and the repeated calls reuse
    assert kiln_dynamo.counters.recompiles == 1
    assert "the running compile() is" in kiln_dynamo.counters.guard_failures[0]


def _inner(x):
    y = x + 1
    print(end="")  # a break: _inner runs as its own frame (and continuation) under the caller's compile
    return y * 2


def _outer(x):
    return _inner(x) * 3


def test_a_frame_shared_by_two_compiles_is_compiled_for_each_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # _inner must run as its own frame under _outer's compile: not resumed as a chain with it
    monkeypatch.setattr(convert_frame, "_chain_splits", False)
    first, second = CountingBackend(), CountingBackend()
    torch.testing.assert_close(kiln_dynamo.compile(_inner, backend=first)(X), _inner(X))
    graphs_of_inner = first.graphs
    torch.testing.assert_close(kiln_dynamo.compile(_outer, backend=second)(X), _outer(X))
    assert first.graphs == graphs_of_inner == 2  # before and after the break
    # _inner's two graphs again (the first compile's entries are not reused), and _outer's `* 3`
    assert second.graphs == graphs_of_inner + 1


def test_fullgraph_is_part_of_the_entry() -> None:
    def breaks(x):
        y = x + 1
        print(end="")
        return y * 2

    torch.testing.assert_close(kiln_dynamo.compile(breaks)(X), breaks(X))
    with pytest.raises(kiln_dynamo.Unsupported):
        kiln_dynamo.compile(breaks, fullgraph=True)(X)  # not the split entry of the first compile


def test_declared_cache_key_is_compared_by_value() -> None:
    def make(mode: str) -> Any:
        backend = CountingBackend()
        backend.__kiln_cache_key__ = ("mine", mode)  # type: ignore[attr-defined]
        return backend

    a, b, c = make("fast"), make("fast"), make("slow")
    for backend in (a, b, c):
        torch.testing.assert_close(kiln_dynamo.compile(helper, backend=backend)(X), helper(X))
    assert (a.graphs, b.graphs, c.graphs) == (1, 0, 1)


def _other_helper(x):
    return x - 1


def test_a_function_given_other_code_recompiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """`helper.__code__ = ...` keeps the function object: its code is guarded too."""
    compiled = kiln_dynamo.compile(f_global_fn)
    torch.testing.assert_close(compiled(X), f_global_fn(X))
    monkeypatch.setattr(helper, "__code__", _other_helper.__code__)
    torch.testing.assert_close(compiled(X), X - 1)
    assert kiln_dynamo.counters.recompiles == 1


def test_a_staticmethod_over_a_builtin_is_pinned_by_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    class WithBuiltin:
        op = staticmethod(abs)

    def f(x):
        return x * WithBuiltin.op(-3)

    compiled = kiln_dynamo.compile(f)
    torch.testing.assert_close(compiled(X), f(X))
    monkeypatch.setattr(WithBuiltin, "op", staticmethod(lambda v: 5))
    torch.testing.assert_close(compiled(X), X * 5)


class Twice(nn.Module):
    def __call__(self, x):
        return super().__call__(x) * 2

    def forward(self, x):
        return x + 1


class UsesTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.twice = Twice()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(self.twice(x))


def test_a_module_class_with_its_own_call_runs_it() -> None:
    """A module whose class overrides __call__ used to have only its forward inlined."""
    m = UsesTwice()
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(m, backend=backend)
    for _ in range(2):
        torch.testing.assert_close(compiled(X), m(X))
    assert backend.graphs == 1 and kiln_dynamo.counters.fallbacks == []


def test_a_call_patched_on_the_class_recompiles(monkeypatch: pytest.MonkeyPatch) -> None:
    m = UsesTwice()
    compiled = kiln_dynamo.compile(m)
    torch.testing.assert_close(compiled(X), m(X))
    monkeypatch.setattr(Twice, "__call__", lambda self, x: x * 0)
    torch.testing.assert_close(compiled(X), m(X))
    assert kiln_dynamo.counters.recompiles == 1


def test_a_global_forward_hook_registered_after_capture_is_seen() -> None:
    m = UsesTwice()
    compiled = kiln_dynamo.compile(m)
    torch.testing.assert_close(compiled(X), m(X))
    handle = nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: out * 0 if isinstance(mod, nn.Linear) else None
    )
    try:
        torch.testing.assert_close(compiled(X), m(X))
        assert float(m(X).detach().abs().sum()) == 0.0
    finally:
        handle.remove()
    assert kiln_dynamo.counters.recompiles == 1


def test_a_global_forward_hook_on_the_compiled_module_fires_once() -> None:
    # Note [Global module hooks and the wrapper]: the wrapper's own call fired it a second time
    m = nn.Linear(3, 3)
    compiled = kiln_dynamo.compile(m)
    torch.testing.assert_close(compiled(X), m(X))
    handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: out + 10)
    try:
        torch.testing.assert_close(compiled(X), m(X))
    finally:
        handle.remove()
    torch.testing.assert_close(compiled(X), m(X))


def _flag_reader(x):
    y = x * 2 if torch.backends.mkldnn.enabled else x * 3
    y = y + 1 if torch.backends.cudnn.enabled else y - 1
    return y * 5 if torch.are_deterministic_algorithms_enabled() else y


@pytest.mark.parametrize(
    "change",
    [  # torch's setters: torch's test utilities may have frozen the properties
        lambda: torch._C._set_mkldnn_enabled(not torch.backends.mkldnn.enabled),
        lambda: torch._C._set_cudnn_enabled(not torch.backends.cudnn.enabled),
        lambda: torch.use_deterministic_algorithms(not torch.are_deterministic_algorithms_enabled()),
    ],
    ids=["mkldnn.enabled", "cudnn.enabled", "deterministic"],
)
def test_a_torch_setting_read_in_the_frame_is_guarded(change: Any) -> None:
    # Note [Flags in torch's namespace], Note [Settings read through torch functions]
    deterministic = torch.are_deterministic_algorithms_enabled()
    flags = (torch.backends.mkldnn.enabled, torch.backends.cudnn.enabled)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_flag_reader, backend=backend)
    torch.testing.assert_close(compiled(X), _flag_reader(X))
    try:
        change()
        torch.testing.assert_close(compiled(X), _flag_reader(X))
        torch.testing.assert_close(compiled(X), _flag_reader(X))
        assert kiln_dynamo.counters.recompiles == 1
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch._C._set_mkldnn_enabled(flags[0])
        torch._C._set_cudnn_enabled(flags[1])
    torch.testing.assert_close(compiled(X), _flag_reader(X))  # the first entry serves again
    assert kiln_dynamo.counters.recompiles == 1


def test_a_backward_hook_registered_after_capture_is_called() -> None:
    m = UsesTwice()
    compiled = kiln_dynamo.compile(m)
    x = X.clone().requires_grad_()
    compiled(x).sum().backward()
    seen: list[int] = []
    handle = m.lin.register_full_backward_hook(lambda mod, gin, gout: seen.append(1))
    try:
        compiled(x).sum().backward()
    finally:
        handle.remove()
    assert seen == [1]


def test_an_operator_raising_inside_no_grad_leaves_grad_mode_as_eager() -> None:
    """Found by the guard fuzz: a float64 @ float32 inside `with torch.no_grad()` raised at run
    time inside the graph, after the graph had disabled grad mode, and left it disabled."""

    def f(x, w):
        with torch.no_grad():
            y = x @ w
        return y, x @ w

    x, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, 2, requires_grad=True)
    compiled = kiln_dynamo.compile(f)
    compiled(x, w)
    with pytest.raises(RuntimeError):
        f(x.double(), w)
    assert torch.is_grad_enabled()
    with pytest.raises(RuntimeError):
        compiled(x.double(), w)
    assert torch.is_grad_enabled()


SEEN = {1, 2}


def f_global_set(x):
    return x * (3 in SEEN) + len(SEEN)


def _closure_over_a_set() -> tuple[Callable[..., Any], set[int]]:
    seen = {1, 2}

    def f(x):
        return x * (3 in seen) - len(seen)

    return f, seen


@pytest.mark.parametrize("where", ["global", "closure"])
def test_a_set_mutated_in_place_recompiles(where: str) -> None:
    """A set is guarded by its value; the guard holds a copy of the value as captured. It held the
    live set, which always equalled itself: after `s.add(3)` the stale graph still answered
    `3 in s` with False (found by a staleness sweep, eighth session)."""
    fn, seen = (f_global_set, SEEN) if where == "global" else _closure_over_a_set()
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    try:
        torch.testing.assert_close(compiled(X), fn(X))
        seen.add(3)
        torch.testing.assert_close(compiled(X), fn(X))
        seen.discard(1)
        torch.testing.assert_close(compiled(X), fn(X))
        assert kiln_dynamo.counters.recompiles == 2, kiln_dynamo.counters.guard_failures
        seen.add(1)
        seen.discard(3)  # back to {1, 2}: the first entry serves again
        torch.testing.assert_close(compiled(X), fn(X))
        assert kiln_dynamo.counters.recompiles == 2 and backend.graphs == 3
    finally:
        seen.clear()
        seen.update({1, 2})
