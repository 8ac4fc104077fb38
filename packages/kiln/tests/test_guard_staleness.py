"""Guard staleness sweep: programs that read Python state (globals, closures, containers, module
attributes, function defaults and code, grad/autocast modes, input metadata), each mutated between
calls; the compiled function must give eager's answer after every change (a recompile, or a guard
proving the change irrelevant), never a stale graph's. Eager and compiled run on two copies of the
state, built by the same builder under the same seed, and every change is applied to both.

A case is ``(name, builder, takes_inputs)``: ``builder()`` returns ``(fn, changes)``; with
``takes_inputs`` each change returns the call's arguments (input metadata changes), else the input
is a fixed (4, 4) tensor (or ``DEFAULT_ARGS[name]``). Found here, eighth session: a set read in the
frame was guarded against the live set itself (`3 in s` stayed False after `s.add(3)`).
"""

# ruff: noqa: E741, E742, B007, F841, PLW0108, RUF015
# mypy: ignore-errors
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import kiln

CASES: list[tuple[str, Callable[[], Any], bool]] = []

G = 1.0


def m_global():
    def f(x):
        return x * G

    def mut():
        global G
        G = 2.0

    return f, [mut]


CASES.append(("global float", m_global, False))

GL = [1, 2]


def m_global_list():
    def f(x):
        return x * len(GL) + GL[0]

    return f, [lambda: GL.append(3), lambda: GL.__setitem__(0, 7)]


CASES.append(("global list", m_global_list, False))

GD = {"a": 1}


def m_global_dict():
    def f(x):
        return x * GD["a"] + len(GD)

    return f, [lambda: GD.__setitem__("a", 5), lambda: GD.__setitem__("b", 1)]


CASES.append(("global dict", m_global_dict, False))


def m_closure():
    k = [1.0]

    def f(x):
        return x * k[0]

    return f, [lambda: k.__setitem__(0, 3.0)]


CASES.append(("closure list", m_closure, False))


def m_cell():
    k = 1.0

    def f(x):
        return x * k

    def mut():
        nonlocal k
        k = 5.0

    return f, [mut]


CASES.append(("closure cell", m_cell, False))


class Cfg:
    scale = 1.0


def m_classattr():
    c = Cfg()

    def f(x):
        return x * c.scale

    def mut():
        Cfg.scale = 4.0

    return f, [mut, lambda: setattr(c, "scale", 9.0)]


CASES.append(("class attr", m_classattr, False))


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = True
        self.p = 0.5

    def forward(self, x):
        y = self.lin(x)
        if self.act:
            y = torch.relu(y)
        return y * self.p


def m_module():
    m = M()

    def mut3():
        m.lin = nn.Linear(4, 4)

    def mut4():
        with torch.no_grad():
            m.lin.weight.mul_(2)

    def mut5():
        m.lin.weight = nn.Parameter(torch.randn(4, 4))

    return m, [
        lambda: setattr(m, "act", False),
        lambda: setattr(m, "p", 2.0),
        mut3,
        mut4,
        mut5,
        lambda: m.eval(),
        lambda: m.register_forward_hook(lambda mod, i, o: o + 1),
    ]


CASES.append(("module attrs", m_module, False))


def m_bn():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    return m, [lambda: m.eval(), lambda: m.train(), lambda: setattr(m[1], "momentum", 0.5)]


CASES.append(("bn train/eval", m_bn, False))


def m_requires_grad():
    w = torch.randn(4, 4)

    def f(x):
        return (x @ w).sum(0)

    return f, [lambda: w.requires_grad_(True)]


CASES.append(("requires_grad", m_requires_grad, False))


def m_tensor_global_replace():
    holder = {"t": torch.ones(4)}

    def f(x):
        return x + holder["t"]

    return f, [
        lambda: holder.__setitem__("t", torch.full((4,), 3.0)),
        lambda: holder.__setitem__("t", torch.ones(4, dtype=torch.float64)),
    ]


CASES.append(("tensor in dict replaced", m_tensor_global_replace, False))


def m_inplace_tensor():
    t = torch.ones(4)

    def f(x):
        return x + t

    return f, [lambda: t.add_(1), lambda: t.resize_(4, 1)]


CASES.append(("captured tensor mutated", m_inplace_tensor, False))


class E(enum.Enum):
    A = 1
    B = 2


def m_enum():
    st = {"m": E.A}

    def f(x):
        return x * (2 if st["m"] is E.A else 3)

    return f, [lambda: st.__setitem__("m", E.B)]


CASES.append(("enum", m_enum, False))


@dataclasses.dataclass
class DC:
    k: int = 1


def m_dc():
    d = DC()

    def f(x):
        return x * d.k

    return f, [lambda: setattr(d, "k", 3)]


CASES.append(("dataclass field", m_dc, False))


def m_grad_mode():
    w = torch.randn(4, 4, requires_grad=True)

    def f(x):
        return x @ w

    return f, [lambda: torch.set_grad_enabled(False), lambda: torch.set_grad_enabled(True)]


CASES.append(("grad mode", m_grad_mode, False))


def m_default_dtype():
    def f(x):
        return x + torch.ones(4)

    return f, [lambda: torch.set_default_dtype(torch.float64), lambda: torch.set_default_dtype(torch.float32)]


CASES.append(("default dtype", m_default_dtype, False))


def m_partial():
    p = {"f": functools.partial(torch.mul, other=2.0)}

    def f(x):
        return p["f"](x)

    return f, [lambda: p.__setitem__("f", functools.partial(torch.mul, other=5.0))]


CASES.append(("partial", m_partial, False))


def m_func_swap():
    ns = {"act": torch.relu}

    def f(x):
        return ns["act"](x)

    return f, [lambda: ns.__setitem__("act", torch.tanh)]


CASES.append(("function swap", m_func_swap, False))


def m_tuple_len():
    s = {"shape": (2, 8)}

    def f(x):
        return x.reshape(s["shape"])

    return f, [lambda: s.__setitem__("shape", (8, 2)), lambda: s.__setitem__("shape", (16,))]


CASES.append(("shape tuple", m_tuple_len, False))


def m_str():
    s = {"mode": "sum"}

    def f(x):
        return x.sum() if s["mode"] == "sum" else x.mean()

    return f, [lambda: s.__setitem__("mode", "mean")]


CASES.append(("string flag", m_str, False))


def m_set():
    s = {1, 2}

    def f(x):
        return x * (3 in s)

    return f, [lambda: s.add(3)]


CASES.append(("set membership", m_set, False))


def m_deque():
    d = collections.deque([1.0])

    def f(x):
        return x * d[-1]

    return f, [lambda: d.append(4.0)]


CASES.append(("deque", m_deque, False))


def m_nn_list():
    ml = nn.ModuleList([nn.Linear(4, 4)])

    def f(x):
        for l in ml:
            x = l(x)
        return x

    return f, [lambda: ml.append(nn.Linear(4, 4))]


CASES.append(("modulelist append", m_nn_list, False))


def m_param_data():
    lin = nn.Linear(4, 4)

    def f(x):
        return lin(x)

    def mut():
        lin.weight.data = torch.randn(4, 4)

    def mut2():
        lin.weight.data = torch.randn(4, 4, dtype=torch.float64)

    return f, [mut]


CASES.append(("param .data swap", m_param_data, False))


def m_buffer():
    m = nn.Module()
    m.register_buffer("b", torch.zeros(4))

    def f(x):
        return x + m.b

    def mut():
        m.b = torch.ones(4)

    def mut2():
        m.b = None

    return f, [mut]


CASES.append(("buffer reassigned", m_buffer, False))


def m_python_int_attr_tensor_shape():
    st = {"n": 2}

    def f(x):
        return x[: st["n"]]

    return f, [lambda: st.__setitem__("n", 3), lambda: st.__setitem__("n", -1)]


CASES.append(("slice bound", m_python_int_attr_tensor_shape, False))


def m_training_dropout():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0))
    return m, [lambda: setattr(m[1], "p", 0.0), lambda: m.eval()]


CASES.append(("dropout p", m_training_dropout, False))


def m_getattr_dyn():
    o = type("O", (), {})()
    o.a = 1.0

    def f(x):
        return x * getattr(o, "a", 0.0) + getattr(o, "b", 0.0)

    return f, [lambda: setattr(o, "b", 2.0), lambda: delattr(o, "a")]


CASES.append(("getattr default", m_getattr_dyn, False))


def m_hasattr():
    o = type("O", (), {})()

    def f(x):
        return x * 2 if hasattr(o, "flag") else x

    return f, [lambda: setattr(o, "flag", 1)]


CASES.append(("hasattr", m_hasattr, False))


def m_isinstance():
    s = {"v": 1}

    def f(x):
        return x * s["v"] if isinstance(s["v"], int) else x - 1

    return f, [lambda: s.__setitem__("v", 2.5), lambda: s.__setitem__("v", True)]


CASES.append(("isinstance value", m_isinstance, False))


def m_id_object():
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    s = {"m": a}

    def f(x):
        return s["m"](x)

    return f, [lambda: s.__setitem__("m", b)]


CASES.append(("module swap in dict", m_id_object, False))


def nested_dict():
    cfg = {"a": {"k": 1.0}}

    def f(x):
        return x * cfg["a"]["k"]

    return f, [lambda: cfg["a"].__setitem__("k", 3.0), lambda: cfg.__setitem__("a", {"k": 5.0})]


CASES.append(("nested dict", nested_dict, False))


def list_of_tensors():
    L = [torch.ones(4)]

    def f(x):
        return x + L[0]

    return f, [lambda: L.__setitem__(0, torch.zeros(4)), lambda: L.insert(0, torch.full((4,), 2.0))]


CASES.append(("list of tensors", list_of_tensors, False))


def moduledict():
    md = nn.ModuleDict({"a": nn.Linear(4, 4)})

    def f(x):
        for k in md:
            x = md[k](x)
        return x

    return f, [lambda: md.__setitem__("b", nn.Linear(4, 4)), lambda: md.pop("a")]


CASES.append(("moduledict", moduledict, False))


def sequential():
    s = nn.Sequential(nn.Linear(4, 4))
    return s, [lambda: s.append(nn.ReLU()), lambda: s.__delitem__(0)]


CASES.append(("sequential", sequential, False))


def delsub():
    class N(nn.Module):
        def __init__(s):
            super().__init__()
            s.a = nn.Linear(4, 4)
            s.b = nn.Linear(4, 4)

        def forward(s, x):
            x = s.a(x)
            if hasattr(s, "b"):
                x = s.b(x)
            return x

    n = N()
    return n, [lambda: delattr(n, "b")]


CASES.append(("del submodule", delsub, False))


def defaults():
    def g(x, k=1.0):
        return x * k

    def f(x):
        return g(x)

    def mut():
        g.__defaults__ = (4.0,)

    return f, [mut]


CASES.append(("__defaults__", defaults, False))


def kwdefaults():
    def g(x, *, k=1.0):
        return x * k

    def f(x):
        return g(x)

    def mut():
        g.__kwdefaults__ = {"k": 4.0}

    return f, [mut]


CASES.append(("__kwdefaults__", kwdefaults, False))


def code_swap():
    def g(x):
        return x + 1

    def h(x):
        return x - 1

    def f(x):
        return g(x)

    def mut():
        g.__code__ = h.__code__

    return f, [mut]


CASES.append(("__code__", code_swap, False))


def torch_fn_patched():
    import types

    ns = types.SimpleNamespace(act=torch.relu)

    def f(x):
        return ns.act(x)

    return f, [lambda: setattr(ns, "act", torch.sigmoid)]


CASES.append(("namespace fn", torch_fn_patched, False))


def input_meta():
    def f(x):
        return x * 2 + x.sum(0)

    variants = iter(
        [
            torch.randn(4, 4).t(),
            torch.randn(4, 4, dtype=torch.float64),
            torch.randn(5, 4)[1:],
            torch.randn(0, 4),
            torch.randn(4, 4, requires_grad=True),
            torch.randn(8, 4)[::2],
            torch.randn(4, 1).expand(4, 4),
        ]
    )
    return f, [lambda: (next(variants),) for _ in range(7)]


CASES.append(("input meta", input_meta, True))


def channels_last_input():
    conv = nn.Conv2d(3, 4, 3)

    def f(x):
        return conv(x) + 1

    variants = iter(
        [
            torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last),
            torch.randn(2, 3, 8, 8)[:, :, ::2, ::2],
        ]
    )

    def first():
        return (torch.randn(2, 3, 8, 8),)

    return f, [lambda: (next(variants),), lambda: (next(variants),)]


CASES.append(("conv input layout", channels_last_input, True))


def scalar_inputs():
    def f(x, k):
        return x * k

    vals = iter([2, 2.5, True, 3, -1, 0])
    return f, [lambda: (torch.randn(4), next(vals)) for _ in range(6)]


CASES.append(("scalar input types", scalar_inputs, True))


def int_returns():
    def f(x, n):
        return n * 2, x.shape[0] + n, [n, n + 1]

    vals = iter([3, 4, 5])
    return f, [lambda: (torch.randn(4), next(vals)) for _ in range(3)]


CASES.append(("int returns", int_returns, True))


def kwargs_presence():
    def g(x, scale=None):
        return x if scale is None else x * scale

    st = {"kw": {}}

    def f(x):
        return g(x, **st["kw"])

    return f, [
        lambda: st.__setitem__("kw", {"scale": 3.0}),
        lambda: st.__setitem__("kw", {"scale": torch.tensor(2.0)}),
    ]


CASES.append(("kwargs presence", kwargs_presence, False))


def autocast():
    lin = nn.Linear(4, 4)
    state = {"on": False}

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=state["on"]):
            return lin(x)

    return f, [lambda: state.__setitem__("on", True)]


CASES.append(("autocast flag", autocast, False))


def outer_autocast():
    lin = nn.Linear(4, 4)
    ctx = {"c": None}

    def f(x):
        return lin(x)

    return f, []


CASES.append(("outer autocast", outer_autocast, False))


def tensor_attr_flag():
    t = torch.ones(4)
    holder = {"t": t}

    def f(x):
        return x + holder["t"]

    def mut():
        holder["t"] = torch.ones(4).as_strided((4,), (0,))

    return f, [mut]


CASES.append(("tensor strides in dict", tensor_attr_flag, False))


def param_requires_grad():
    lin = nn.Linear(4, 4)

    def f(x):
        y = lin(x)
        return y.requires_grad, y

    return f, [lambda: lin.weight.requires_grad_(False), lambda: lin.bias.requires_grad_(False)]


CASES.append(("param requires_grad", param_requires_grad, False))


def no_grad_decorator():
    lin = nn.Linear(4, 4)
    st = {"g": True}

    def f(x):
        with torch.set_grad_enabled(st["g"]):
            y = lin(x)
        return y.requires_grad

    return f, [lambda: st.__setitem__("g", False)]


CASES.append(("set_grad_enabled arg", no_grad_decorator, False))


def counter_attr():
    class C(nn.Module):
        def __init__(s):
            super().__init__()
            s.steps = 0

        def forward(s, x):
            s.steps += 1
            return x * s.steps

    c = C()
    return c, [lambda: None, lambda: None]


CASES.append(("counter attr mutation", counter_attr, False))


def list_append_in_frame():
    log = []

    def f(x):
        log.append(1)
        return x * len(log)

    return f, [lambda: None, lambda: log.clear()]


CASES.append(("list append in frame", list_append_in_frame, False))


def global_counter():
    st = {"n": 0}

    def f(x):
        st["n"] += 1
        return x + st["n"]

    return f, [lambda: None, lambda: None]


CASES.append(("dict counter in frame", global_counter, False))


def buffer_inplace_in_frame():
    m = nn.Module()
    m.register_buffer("cnt", torch.zeros(1))

    def f(x):
        m.cnt += 1
        return x * m.cnt

    return f, [lambda: None, lambda: None]


CASES.append(("buffer in-place in frame", buffer_inplace_in_frame, False))


def math_consts():
    st = {"v": math.pi}

    def f(x):
        return x * math.cos(st["v"])

    return f, [lambda: st.__setitem__("v", 0.0), lambda: st.__setitem__("v", float("nan"))]


CASES.append(("float nan", math_consts, False))


def float_inf():
    st = {"v": 1.0}

    def f(x):
        return torch.clamp(x, max=st["v"])

    return f, [lambda: st.__setitem__("v", float("inf")), lambda: st.__setitem__("v", -0.0)]


CASES.append(("float inf/-0", float_inf, False))


def tuple_of_lists():
    st = ([1, 2],)

    def f(x):
        return x * len(st[0])

    return f, [lambda: st[0].append(3)]


CASES.append(("tuple of lists", tuple_of_lists, False))


def frozen_in_dict_values():
    d = {"s": {1}}

    def f(x):
        return x * (2 in d["s"])

    return f, [lambda: d["s"].add(2)]


CASES.append(("set in dict", frozen_in_dict_values, False))


def obj_list_attr():
    class O:
        pass

    o = O()
    o.items = [1.0, 2.0]

    def f(x):
        return x * sum(o.items)

    return f, [lambda: o.items.append(3.0), lambda: o.items.__setitem__(0, 10.0)]


CASES.append(("obj list attr", obj_list_attr, False))


def dict_items_iter():
    d = {"a": 1.0, "b": 2.0}

    def f(x):
        for k, v in d.items():
            x = x * v
        return x

    return f, [lambda: d.__setitem__("a", 5.0), lambda: d.pop("b"), lambda: d.update({"c": 3.0})]


CASES.append(("dict items", dict_items_iter, False))


def ordered_keys():
    d = {"a": 1.0, "b": 2.0}

    def f(x):
        return x * list(d)[0].__len__() + (x if list(d)[0] == "a" else -x)

    def mut():
        v = d.pop("a")
        d["a"] = v

    return f, [mut]


CASES.append(("dict order", ordered_keys, False))


def bytes_str():
    st = {"s": "abc"}

    def f(x):
        return x * len(st["s"])

    return f, [lambda: st.__setitem__("s", "abcd")]


CASES.append(("str len", bytes_str, False))


def class_attr_store():
    class K:
        n = 0
        mode = "a"

    class Obj(K):
        pass

    o = Obj()

    def f(x):
        K.n += 1  # a class attribute set in the frame (Note [Setting a class attribute])
        return x * K.n + o.n + (K.mode == "b")

    return f, [
        lambda: None,
        lambda: setattr(K, "n", 10),
        lambda: setattr(K, "mode", "b"),
        lambda: setattr(o, "n", 5),
    ]


CASES.append(("class attribute set in frame", class_attr_store, False))


def id_keyed():
    class Obj:
        pass

    holder = {"o": Obj()}
    first = {"id": id(holder["o"])}

    def f(x):
        return x * (1.0 if id(holder["o"]) == first["id"] else 2.0)  # Note [id() in the frame]

    return f, [lambda: holder.__setitem__("o", Obj()), lambda: first.__setitem__("id", id(holder["o"]))]


CASES.append(("id of an object", id_keyed, False))

_T_SHARED = torch.randn(4, 4)  # one object both sides compare with


def id_of_tensor_input():
    def f(x):
        return x * (1.0 if id(x) == id(_T_SHARED) else 2.0)

    return f, [lambda: (_T_SHARED,), lambda: (torch.randn(4, 4),), lambda: (_T_SHARED,)]


CASES.append(("id of a tensor input", id_of_tensor_input, True))


DEFAULT_ARGS = {
    "conv input layout": lambda: (torch.randn(2, 3, 8, 8),),
    "scalar input types": lambda: (torch.randn(4), 1),
    "int returns": lambda: (torch.randn(4), 2),
}


def _difference(e: Any, c: Any) -> str | None:
    """What differs between eager's result ``e`` and the compiled one ``c`` (None: the same)."""
    if type(e) is not type(c):
        return f"type {type(e).__name__} vs {type(c).__name__}"
    if isinstance(e, torch.Tensor):
        if (e.shape, e.dtype, e.requires_grad) != (c.shape, c.dtype, c.requires_grad):
            return f"{e.shape} {e.dtype} grad={e.requires_grad} vs {c.shape} {c.dtype} grad={c.requires_grad}"
        ok = torch.allclose(e.double(), c.double(), atol=1e-4, equal_nan=True)
        return None if ok else "values"
    if isinstance(e, (list, tuple)):
        if len(e) != len(c):
            return f"length {len(e)} vs {len(c)}"
        return next((d for d in map(_difference, e, c) if d), None)
    return None if e == c else f"{e!r} vs {c!r}"


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(True)
    kiln.reset()


@pytest.mark.parametrize(("name", "builder", "takes_inputs"), CASES, ids=[c[0] for c in CASES])
def test_no_stale_answer_after_a_change(name: str, builder: Callable[[], Any], takes_inputs: bool) -> None:
    torch.manual_seed(0)
    fn, changes = builder()
    torch.manual_seed(0)
    fn2, changes2 = builder()
    compiled = kiln.compile(fn2)
    steps = zip([lambda: None, *changes], [lambda: None, *changes2], strict=True)
    for step, (change, change2) in enumerate(steps):
        torch.manual_seed(step)  # a module a change builds gets the same weights on both sides
        args = change()
        torch.manual_seed(step)
        change2()
        if not takes_inputs or args is None:
            args = DEFAULT_ARGS.get(name, lambda: (torch.randn(4, 4),))()
        expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        got = compiled(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        assert _difference(expected, got) is None, f"after change {step}: {_difference(expected, got)}"
