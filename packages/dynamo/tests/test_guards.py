"""Guards: each relied-on fact triggers exactly one recompile when it changes, with a readable
reason; an unchanged call never re-enters the callback."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
from conftest import CountingBackend
from torch import nn

import kiln_dynamo

GLOBAL_K = 2


def use_global(x):
    return x * GLOBAL_K


def plain(x):
    return torch.sin(x) + 1


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = 2.0
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x)) * self.scale


def _compiled(fn: Any) -> tuple[Any, CountingBackend]:
    backend = CountingBackend()
    return kiln_dynamo.compile(fn, backend=backend), backend


def test_unchanged_call_never_reenters_callback() -> None:
    f, backend = _compiled(plain)
    x = torch.randn(3)
    for _ in range(5):
        torch.testing.assert_close(f(x), plain(x))
    assert kiln_dynamo.counters.frames_seen == 1
    assert backend.graphs == 1
    assert kiln_dynamo.counters.recompiles == 0


@pytest.mark.parametrize(
    ("first", "second", "expect_in_reason"),
    [
        (torch.randn(3), torch.randn(3, dtype=torch.float64), "dtype"),
        (torch.randn(3), torch.randn(5), "size(0) == 3"),
        (torch.randn(3), torch.randn(3, requires_grad=True), "requires_grad"),
        (torch.randn(3, 4), torch.randn(4, 3).t(), "stride"),
        (torch.randn(3), torch.randn(3, 1), "dim() == 1"),
    ],
    ids=["dtype", "shape", "requires_grad", "stride", "rank"],
)
def test_tensor_guard_recompiles_once(
    first: torch.Tensor, second: torch.Tensor, expect_in_reason: str
) -> None:
    f, backend = _compiled(plain)
    f(first)
    f(first)
    out = f(second)
    torch.testing.assert_close(out, plain(second))
    f(second)
    f(first)
    assert backend.graphs == 2
    assert kiln_dynamo.counters.recompiles == 1
    reason = kiln_dynamo.counters.guard_failures[0]
    assert expect_in_reason in reason, reason
    assert "L['x']" in reason


def test_global_constant_guard() -> None:
    global GLOBAL_K
    f, backend = _compiled(use_global)
    x = torch.randn(3)
    f(x)
    GLOBAL_K = 5
    try:
        torch.testing.assert_close(f(x), x * 5)
        f(x)
    finally:
        GLOBAL_K = 2
    assert backend.graphs == 2
    assert kiln_dynamo.counters.recompiles == 1
    assert "G['GLOBAL_K'] == 2" in kiln_dynamo.counters.guard_failures[0]


def test_module_attribute_guard() -> None:
    m = Scaled().eval()
    cm = kiln_dynamo.compile(m, backend=(backend := CountingBackend()))
    x = torch.randn(2, 4)
    cm(x)
    m.scale = 3.0
    torch.testing.assert_close(cm(x), m(x))
    cm(x)
    assert backend.graphs == 2
    assert kiln_dynamo.counters.recompiles == 1
    assert "L['self'].scale == 2.0" in kiln_dynamo.counters.guard_failures[0]


def test_train_eval_guard() -> None:
    m = Scaled().eval()
    cm = kiln_dynamo.compile(m, backend=(backend := CountingBackend()))
    x = torch.randn(2, 4)
    cm(x)
    cm.train()
    torch.manual_seed(0)
    a = cm(x)
    torch.manual_seed(0)
    b = m(x)
    torch.testing.assert_close(a, b)
    assert backend.graphs == 2
    assert kiln_dynamo.counters.recompiles == 1
    assert "training" in kiln_dynamo.counters.guard_failures[0]


def test_grad_mode_guard() -> None:
    w = torch.randn(3, requires_grad=True)

    def f(x):
        return x * w

    g, backend = _compiled(f)
    x = torch.randn(3)
    assert g(x).requires_grad
    with torch.no_grad():
        out = g(x)
        g(x)
    assert not out.requires_grad
    assert backend.graphs == 2
    assert kiln_dynamo.counters.recompiles == 1
    assert "is_grad_enabled" in kiln_dynamo.counters.guard_failures[0]


def test_closure_value_guard() -> None:
    def make(k):
        def f(x):
            return x + k

        return f

    f1 = make(1)
    c1, backend = _compiled(f1)
    x = torch.zeros(2)
    torch.testing.assert_close(c1(x), x + 1)
    c2 = kiln_dynamo.compile(make(2), backend=backend)
    torch.testing.assert_close(c2(x), x + 2)  # same code, different cell contents
    assert kiln_dynamo.counters.recompiles == 1


def test_python_int_argument_guard() -> None:
    def f(x, n):
        return x * n

    g, backend = _compiled(f)
    x = torch.ones(2)
    torch.testing.assert_close(g(x, 2), x * 2)
    torch.testing.assert_close(g(x, 3), x * 3)
    torch.testing.assert_close(g(x, 2), x * 2)
    assert backend.graphs == 2


def test_cache_limit_falls_back_to_eager() -> None:
    def f(x, n):
        return x + n

    g, backend = _compiled(f)
    x = torch.ones(2)
    for n in range(12):
        torch.testing.assert_close(g(x, n), x + n)
    assert backend.graphs == 8
    assert any("cache limit" in r for _, r in kiln_dynamo.counters.fallbacks)


def test_recompiles_log(caplog: pytest.LogCaptureFixture) -> None:
    f, _ = _compiled(plain)
    with caplog.at_level(logging.INFO, logger="kiln.dynamo.recompiles"):
        f(torch.randn(3))
        f(torch.randn(4))
    text = caplog.text
    assert "L['x'].size(0) == 3" in text
    assert "test_guards.py" in text


def test_guards_hold_no_strong_reference_to_function() -> None:
    import gc
    import weakref

    def f(x):
        return x + 1

    g = kiln_dynamo.compile(f)
    g(torch.ones(1))
    ref = weakref.ref(f)
    del f, g
    gc.collect()
    assert ref() is None


def test_aliased_inputs_are_guarded() -> None:
    def f(a, b):
        return a * 2 + b

    g, backend = _compiled(f)
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(g(x, x), f(x, x))
    torch.testing.assert_close(g(x, y), f(x, y))
    assert backend.graphs == 2
    assert "L['b'] is L['a']" in kiln_dynamo.counters.guard_failures[0]


def test_failing_backend_falls_back_to_graph_with_warning() -> None:
    def broken(gm: Any, example_inputs: Any) -> Any:
        raise RuntimeError("backend exploded")

    x = torch.randn(3)
    with pytest.warns(RuntimeWarning, match="backend exploded"):
        out = kiln_dynamo.compile(plain, backend=broken)(x)
    torch.testing.assert_close(out, plain(x))


def test_python_dispatch_without_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Dispatch without the frame hook]: same capture, guards and recompiles."""
    from kiln_dynamo import eval_frame

    monkeypatch.setattr(eval_frame, "HAVE_HOOK", False)
    g, backend = _compiled(plain)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(g(x), plain(x))
    y = torch.randn(4)
    torch.testing.assert_close(g(y), plain(y))
    assert backend.graphs == 2
    assert kiln_dynamo.counters.frames_seen == 2
    assert kiln_dynamo.counters.recompiles == 1


def test_dispatch_mode_stack_is_seen_as_at_run_time() -> None:
    """kiln's FakeMode is on the dispatch stack while tracing; user code must not see it
    (torch 2.11's MultiheadAttention asks), and a user's own mode at run time is guarded."""
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    import kiln_dynamo

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    def f(x: torch.Tensor) -> torch.Tensor:
        if len(_get_current_dispatch_mode_stack()) == 0:
            return x.sin()
        return x.cos()

    compiled = kiln_dynamo.compile(f)
    x = torch.randn(4)
    kiln_dynamo.reset()
    before = kiln_dynamo.counters.frames_captured
    torch.testing.assert_close(compiled(x), x.sin())
    assert kiln_dynamo.counters.frames_captured == before + 1
    with Counting():
        torch.testing.assert_close(compiled(x), x.cos())  # guard fails; the frame falls back, correctly
    torch.testing.assert_close(compiled(x), x.sin())


class _Config:
    def __init__(self) -> None:
        self.scale = 2.0
        self.id2label = {i: f"LABEL_{i}" for i in range(50)}
        self.unused = "a"
        self.weights = {"w": torch.ones(3), "v": torch.ones(3)}


class _Configured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Config()

    def forward(self, x):
        d = self.config.__dict__
        if d.get("_spec") is not None:
            x = x + 100
        return x * d["scale"] + self.config.weights["w"]


def test_dict_values_are_guarded_only_when_read() -> None:
    """Note [Lazy dict entries]: unread values cost no guard and no recompile; a read one does."""
    from kiln_dynamo import convert_frame
    from kiln_dynamo.guards import readable_guards

    m = _Configured()
    captured: list[Any] = []
    listen = lambda name, c: captured.append(c)  # noqa: E731
    convert_frame.capture_listeners.append(listen)
    try:
        cm = kiln_dynamo.compile(m, backend=(backend := CountingBackend()))
        x = torch.randn(3)
        torch.testing.assert_close(cm(x), m(x))
    finally:
        convert_frame.capture_listeners.remove(listen)
    values = [line for line in readable_guards(captured[0].guard).splitlines() if ".keys())" not in line]
    assert not [line for line in values if "id2label" in line or "unused" in line or "['v']" in line]
    m.config.id2label[3] = "other"  # an unread value: no recompile
    m.config.unused = "b"
    m.config.weights["v"] = torch.ones(5)
    torch.testing.assert_close(cm(x), m(x))
    assert backend.graphs == 1 and kiln_dynamo.counters.recompiles == 0
    m.config.scale = 3.0  # a read value: one recompile
    torch.testing.assert_close(cm(x), m(x))
    assert backend.graphs == 2 and kiln_dynamo.counters.recompiles == 1
    assert "L['self'].config.__dict__['scale'] == 2.0" in kiln_dynamo.counters.guard_failures[0]
    m.config._spec = 1  # the absent key read by .get() appears: the key list changed
    torch.testing.assert_close(cm(x), m(x))
    assert backend.graphs == 3 and kiln_dynamo.counters.recompiles == 2
    m.config.weights["w"] = torch.ones(3, dtype=torch.float64)  # a read tensor value
    torch.testing.assert_close(cm(x), m(x))
    assert backend.graphs == 4


def test_mutated_input_dict_writes_back_unread_values() -> None:
    def f(d, x):
        d["n"] = d["a"] * 2
        return x + d["a"]

    d = {"a": 1.5, "b": torch.ones(2), "c": [1, 2]}
    backend = CountingBackend()
    cf = kiln_dynamo.compile(f, backend=backend)
    x = torch.randn(2)
    torch.testing.assert_close(cf(d, x), x + 1.5)
    assert d["n"] == 3.0 and d["b"] is not None and d["c"] == [1, 2] and list(d) == ["a", "b", "c", "n"]
    d2 = {"a": 1.5, "b": torch.ones(2), "c": [1, 2]}
    torch.testing.assert_close(cf(d2, x), x + 1.5)
    assert list(d2) == ["a", "b", "c", "n"] and backend.graphs == 1


def test_tuple_of_constants_is_one_check() -> None:
    """A tuple of plain constants costs one check, which still tells `2` from `2.0` and `True`."""
    from kiln_dynamo import convert_frame

    def f(x, t):
        return x * t[0] + t[1]

    captured: list[Any] = []
    listen = lambda name, c: captured.append(c)  # noqa: E731
    convert_frame.capture_listeners.append(listen)
    try:
        cf = kiln_dynamo.compile(f, backend=(backend := CountingBackend()))
        x = torch.randn(3)
        torch.testing.assert_close(cf(x, (2, 3)), f(x, (2, 3)))
        assert [p.readable for p in captured[0].guard.parts if "L['t']" in p.readable] == [
            "type(L['t']) is tuple and L['t'] == (2, 3) and item types of L['t'] are int, int"
        ]
        torch.testing.assert_close(cf(x, (2, 3)), f(x, (2, 3)))
        assert backend.graphs == 1
        for t in [(2.0, 3), (True, 3), [2, 3], (2, 4)]:
            torch.testing.assert_close(cf(x, t), f(x, t))
        assert backend.graphs == 5
        assert "item types of L['t'] are int, int" in kiln_dynamo.counters.guard_failures[0]
    finally:
        convert_frame.capture_listeners.remove(listen)


def _with_defaults(x, a=None, b=2.0, *, c=3.0, d=None):
    return x * b + c + (a if a is not None else 0)


def test_function_defaults_are_guarded_only_when_used() -> None:
    """A default is guarded only when its parameter is not passed, read from the end of
    __defaults__ so that a tuple of another length is still checked exactly."""

    def f(x):
        return _with_defaults(x, 1.0, c=4.0)  # uses b's default (and d's), not a's or c's

    cf = kiln_dynamo.compile(f, backend=(backend := CountingBackend()))
    x = torch.randn(3)
    saved = _with_defaults.__defaults__, _with_defaults.__kwdefaults__
    try:
        torch.testing.assert_close(cf(x), f(x))
        _with_defaults.__defaults__ = ("unused", 2.0)
        _with_defaults.__kwdefaults__ = {"c": "unused", "d": None}
        torch.testing.assert_close(cf(x), f(x))
        assert backend.graphs == 1 and kiln_dynamo.counters.recompiles == 0
        _with_defaults.__defaults__ = (5.0,)  # now b's default is 5.0 (a has none)
        torch.testing.assert_close(cf(x), f(x))
        assert backend.graphs == 2
        assert "__defaults__[-1] == 2.0" in kiln_dynamo.counters.guard_failures[0]
    finally:
        _with_defaults.__defaults__, _with_defaults.__kwdefaults__ = saved


class _PyGetattributeConfig:
    """A config whose class defines __getattribute__ in Python, as transformers' do."""

    def __init__(self) -> None:
        self.scale = 2.0
        self.other = "x"

    def __getattribute__(self, key: str) -> Any:
        return super().__getattribute__(key)


def test_guards_do_not_run_a_python_getattribute() -> None:
    import sys

    cfg = _PyGetattributeConfig()

    def f(x, c):
        return x * c.scale if c.__dict__.get("missing") is None else x

    cf = kiln_dynamo.compile(f, backend=(backend := CountingBackend()))
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, cfg), x * 2.0)
    names: list[str] = []
    sys.setprofile(lambda frame, event, arg: names.append(frame.f_code.co_name) if event == "call" else None)
    try:
        out = cf(x, cfg)
    finally:
        sys.setprofile(None)
    torch.testing.assert_close(out, x * 2.0)
    assert "__getattribute__" not in names and backend.graphs == 1
    cfg.other = "y"  # unread: no recompile
    torch.testing.assert_close(cf(x, cfg), x * 2.0)
    assert backend.graphs == 1
    cfg.scale = 3.0
    torch.testing.assert_close(cf(x, cfg), x * 3.0)
    assert backend.graphs == 2
    assert "L['c'].__dict__['scale'] == 2.0" in kiln_dynamo.counters.guard_failures[0]
    cfg.missing = 1  # the key list changed
    torch.testing.assert_close(cf(x, cfg), x)
    assert kiln_dynamo.counters.recompiles == 2


def test_missing_attribute_through_a_python_getattribute_is_traced() -> None:
    """`getattr(config, "use_cache", None)` and `hasattr` on a config whose __getattribute__ is
    Python: the AttributeError raised inside it is caught by getattr/hasattr, in the graph."""
    cfg = _PyGetattributeConfig()

    def f(x, c):
        u = getattr(c, "use_cache", None)
        return x * c.scale + (1.0 if u is None else 2.0) + hasattr(c, "nope") + hasattr(c, "other")

    report = kiln_dynamo.explain(f)(torch.randn(3), cfg)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    kiln_dynamo.reset()
    cf = kiln_dynamo.compile(f, backend=(backend := CountingBackend()))
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, cfg), f(x, cfg))
    cfg.use_cache = True  # the attribute appears: the key-list guard sees it
    torch.testing.assert_close(cf(x, cfg), f(x, cfg))
    assert backend.graphs == 2


class _Plain:
    def __init__(self) -> None:
        self.scale = 2.0

    def bonus(self) -> float:
        return 1.0


def test_absent_instance_attribute_is_guarded() -> None:
    """An attribute that getattr/hasattr found missing, or found on the class, stays so only
    while the instance does not gain one of that name: both are guarded."""
    obj = _Plain()

    def f(x, c):
        return x * c.scale + (1.0 if getattr(c, "use_cache", None) is None else 2.0) + c.bonus()

    cf = kiln_dynamo.compile(f, backend=(backend := CountingBackend()))
    x = torch.ones(2)
    torch.testing.assert_close(cf(x, obj), f(x, obj))
    obj.use_cache = True
    torch.testing.assert_close(cf(x, obj), f(x, obj))
    obj.bonus = lambda: 10.0  # type: ignore[method-assign]
    torch.testing.assert_close(cf(x, obj), f(x, obj))
    assert backend.graphs == 3


class _Flagged(nn.Module):
    def forward(self, x):
        return x + (2.0 if getattr(self, "gradient_checkpointing", False) else 1.0) + self.extra()

    def extra(self) -> float:
        return 0.0


def test_module_attribute_absent_or_on_the_class_is_guarded() -> None:
    m = _Flagged()
    cm = kiln_dynamo.compile(m, backend=(backend := CountingBackend()))
    x = torch.zeros(1)
    torch.testing.assert_close(cm(x), m(x))
    m.gradient_checkpointing = True
    torch.testing.assert_close(cm(x), m(x))
    m.extra = lambda: 5.0  # type: ignore[method-assign]
    torch.testing.assert_close(cm(x), m(x))
    m.forward = lambda x: x * 0  # type: ignore[method-assign]
    torch.testing.assert_close(cm(x), m(x))
    assert kiln_dynamo.counters.recompiles == 2 and backend.graphs == 4  # the lambda: a new frame


GLOBAL_F = math.nan


def use_global_float(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, GLOBAL_F, x) + 1 / (x.abs() * GLOBAL_F)


@pytest.mark.parametrize(
    "value", [math.nan, -0.0, 0.0, complex(math.nan, 1.0)], ids=["nan", "-0", "0", "cnan"]
)
def test_float_constant_guard_nan_and_signed_zero(value: float) -> None:
    # Note [Guards on NaN and signed zeros]: a NaN constant equals itself for the guard (it
    # recompiled on every call: `G['torch.nan'] == nan` never held); -0.0 and 0.0 do not.
    global GLOBAL_F
    f, backend = _compiled(lambda x: x * GLOBAL_F if isinstance(GLOBAL_F, complex) else use_global_float(x))
    x = torch.tensor([1.0, -2.0, 0.5])
    GLOBAL_F = value
    try:
        for _ in range(3):
            want = x * value if isinstance(value, complex) else use_global_float(x)
            torch.testing.assert_close(f(x), want, equal_nan=True)
        assert backend.graphs == 1
        if isinstance(value, float) and value == 0.0:
            GLOBAL_F = -value
            torch.testing.assert_close(f(x), use_global_float(x))
            assert torch.equal(f(x).signbit(), use_global_float(x).signbit())
            assert backend.graphs == 2
    finally:
        GLOBAL_F = math.nan


@pytest.mark.parametrize("c_op", [True, False], ids=["same_float_op", "eq"])
def test_a_zero_dropout_rate_is_checked_in_c(c_op: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Same floats in C]: a module's dropout rate of 0.0 (T5: 46 per call) is guarded by the
    # C tree's SAME_FLOAT op, with no Python call per check, and -0.0 still recompiles
    from kiln_dynamo import guard_tree, guards

    if not guard_tree.c_guards_enabled():
        pytest.skip("C guards off")
    monkeypatch.setattr(guards, "SAME_FLOAT_OP", c_op)
    calls = []
    same_eq = guards.SameFloat.__eq__

    def counting(self: Any, other: object) -> bool:
        calls.append(other)
        return same_eq(self, other)

    monkeypatch.setattr(guards.SameFloat, "__eq__", counting)
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)).eval()
    f, backend = _compiled(m)
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(f(x), m(x))
    warm = len(calls)
    for _ in range(3):
        f(x)
    assert (len(calls) == warm) is c_op and backend.graphs == 1
    m[1].p = -0.0
    torch.testing.assert_close(f(x), m(x))
    assert backend.graphs == 2


GLOBAL_FS = (1.0, 0.0)


def test_float_sequence_guard_signed_zero() -> None:
    # a tuple holding a zero float is guarded item by item (Note [Guards on NaN and signed zeros])
    global GLOBAL_FS
    f, backend = _compiled(lambda x: 1 / (x * GLOBAL_FS[1]))
    x = torch.tensor([1.0, -2.0])
    try:
        assert torch.equal(f(x), 1 / (x * 0.0))
        GLOBAL_FS = (1.0, -0.0)
        assert torch.equal(f(x), 1 / (x * -0.0))
        assert backend.graphs == 2
    finally:
        GLOBAL_FS = (1.0, 0.0)
