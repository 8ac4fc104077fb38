"""Guard staleness sweep: programs that read Python state (globals, closures, containers, module
attributes, function defaults and code, grad/autocast modes, input metadata), each mutated between
calls; the compiled function must give eager's answer after every change (a recompile, or a guard
proving the change irrelevant), never a stale graph's. Eager and compiled run on two copies of the
state, built by the same builder under the same seed, and every change is applied to both.

A case is ``(name, builder, takes_inputs)``: ``builder()`` returns ``(fn, changes)``; with
``takes_inputs`` each change returns the call's arguments (input metadata changes), else the input
is a fixed (4, 4) tensor (or ``DEFAULT_ARGS[name]``). Found here, eighth session: a set read in the
frame was guarded against the live set itself (`3 in s` stayed False after `s.add(3)`).

Fourteenth session: the brief's full list (module attributes of every Python type, `training`,
parameters replaced or re-strided, globals, closure cells, torch settings, input dims/views/
layouts, `resize_`/`set_` of buffers, hooks added and removed, ModuleList lengths), and every
case without input changes again under automatic dynamic (Note [Staleness after automatic
dynamic]). Found: a requires-grad input or parameter whose `.data` is a strided slice or
expanded was read at contiguous offsets (Note [A clone with its input's strides] in
kiln_aotgrad.joint); `torch.backends` flags and `torch.are_deterministic_algorithms_enabled()`
were unguarded constants (Notes [Flags in torch's namespace], [Settings read through torch
functions] in kiln_dynamo.variables.torch); a global module forward hook fired twice through a
compiled module (Note [Global module hooks and the wrapper] in kiln_dynamo.eval_frame).

Eighteenth session (fuzz18): the session's new ways of tracing (lazy iterators and generator
expressions, module walks over the frame's pending changes, strings formatted after the graph,
symbolic builtins and comparisons of sizes, chain splits through cells and try blocks,
functools.wraps), the state each reads changed between calls. Found: a value popped from a
container and returned raised KeyError in the runner (Note [Sources are read before the
effects] in kiln_dynamo.codegen); an iterator over a list kept by the frame for the next call
was rebuilt over a snapshot of the list (Note [Iterators that leave the frame over a live list]
in kiln_dynamo.variables.lists).

Thirty-second session (fix32): a tensor subclass input, `@property` over state, mutable default
arguments mutated, class attributes through a base class and shadowed by the instance, hooks of
every kind added to a submodule, a parametrization, an instance's `forward` and `__class__`
replaced, submodules swapped, inference mode entered and left, a global tensor's requires_grad,
`__slots__`, a parameter replaced by another dtype, a plain tensor or none; each also under
automatic dynamic and dynamic=True. Found: with inference mode on (or a function whose body is
one `torch.inference_mode()` block), a symbolic graph served every size with the artifacts of
one (Note [A symbolic graph called in another grad mode] in kiln_aotgrad.api).
"""

# ruff: noqa: E741, E742, B007, B905, F841, PLW0108, RUF015
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


# The cases below are the fourteenth session's (ops14): the brief's list of things a compiled
# function reads, each changed between calls, where the cases above do not yet cover it.


class Knobs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.k = 2
        self.mode = "relu"
        self.shift = None
        self.flag = True
        self.cfg = {"scale": 1.0}

    def forward(self, x):
        y = self.lin(x)[:, : self.k]
        y = torch.relu(y) if self.mode == "relu" else torch.tanh(y)
        if self.shift is not None:
            y = y + self.shift
        if self.flag:
            y = y * 2
        return y * self.cfg["scale"]


def module_knobs():
    m = Knobs()
    return m, [
        lambda: setattr(m, "k", 3),
        lambda: setattr(m, "mode", "tanh"),
        lambda: setattr(m, "shift", 1.5),
        lambda: setattr(m, "shift", torch.full((1,), 2.0)),
        lambda: setattr(m, "shift", None),
        lambda: setattr(m, "flag", False),
        lambda: m.cfg.__setitem__("scale", 3.0),
        lambda: setattr(m, "cfg", {"scale": -1.0}),
    ]


CASES.append(("module int/str/None/bool/dict attrs", module_knobs, False))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4))

    def forward(self, x):
        y = self.inner(x)
        return y * 2 if self.training else y - 1


def module_training():
    m = Branchy()
    return m, [lambda: m.eval(), lambda: m.train(), lambda: setattr(m, "training", False)]


CASES.append(("module.training read", module_training, False))


def submodule_training():
    m = nn.Sequential(nn.Linear(4, 4), Branchy())
    return m, [lambda: m[1].eval(), lambda: setattr(m[1], "training", True)]


CASES.append(("submodule.training read", submodule_training, False))


class WithParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w


def parameter_replaced():
    m = WithParam()
    return m, [
        lambda: setattr(m, "w", nn.Parameter(torch.randn(4, 4))),
        lambda: setattr(m, "w", nn.Parameter(torch.randn(4, 2))),
        lambda: setattr(m, "w", nn.Parameter(torch.randn(4, 4).t())),  # new strides
        lambda: m.w.requires_grad_(False),
        lambda: m.w.requires_grad_(True),
    ]


CASES.append(("parameter replaced", parameter_replaced, False))


def parameter_data_strides():
    lin = nn.Linear(4, 4)

    def f(x):
        return lin(x)

    def transposed():
        lin.weight.data = torch.randn(4, 4).t()

    def strided():
        lin.weight.data = torch.randn(8, 4)[::2]

    def offset():
        lin.bias.data = torch.randn(6)[2:]

    def set_storage():
        with torch.no_grad():
            lin.weight.set_(torch.randn(4, 4).t().contiguous().t())

    return f, [transposed, strided, offset, set_storage]


CASES.append(("parameter .data/set_ strides", parameter_data_strides, False))

GT = torch.ones(4)
GN = 2


def global_tensor_and_int():
    def f(x):
        return x * GN + GT

    def new_tensor():
        global GT
        GT = torch.arange(4.0)

    def broadcast():
        global GT
        GT = torch.full((1,), 5.0)

    def new_dtype():
        global GT
        GT = torch.ones(4, dtype=torch.float64)

    def new_int():
        global GN
        GN = 7

    def restore():
        global GT, GN
        GT, GN = torch.ones(4), 2

    return f, [new_tensor, broadcast, new_dtype, new_int, restore]


CASES.append(("global tensor and int", global_tensor_and_int, False))


def closure_tensor_rebound():
    t = torch.ones(4)

    def f(x):
        return x + t

    def rebind(v):
        def mut():
            nonlocal t
            t = v

        return mut

    return f, [
        rebind(torch.zeros(4)),
        rebind(torch.ones(1)),
        rebind(torch.ones(4, 4).t()),
        rebind(torch.ones(4, dtype=torch.float64)),
    ]


CASES.append(("closure tensor rebound", closure_tensor_rebound, False))


def grad_enabled_read():
    def f(x):
        return x * 2 if torch.is_grad_enabled() else x * 3

    return f, [lambda: torch.set_grad_enabled(False), lambda: torch.set_grad_enabled(True)]


CASES.append(("is_grad_enabled read", grad_enabled_read, False))


def default_dtype_read():
    def f(x):
        return x.to(torch.get_default_dtype()) + torch.arange(4) * 0.5 + torch.tensor(1.0)

    return f, [lambda: torch.set_default_dtype(torch.float64), lambda: torch.set_default_dtype(torch.float32)]


CASES.append(("default dtype read", default_dtype_read, False))


def backends_flags():
    def f(x):
        y = x * 2 if torch.backends.mkldnn.enabled else x * 3
        y = y + 1 if torch.backends.cudnn.enabled else y - 1
        return y * 5 if torch.are_deterministic_algorithms_enabled() else y

    return f, [
        # torch's setters, not the modules' properties: torch's test utilities (imported by the
        # OpInfo sweep in the same session) freeze the properties (`disable_global_flags`)
        lambda: torch._C._set_mkldnn_enabled(False),
        lambda: torch._C._set_cudnn_enabled(False),
        lambda: torch.use_deterministic_algorithms(True),
        lambda: torch.use_deterministic_algorithms(False),
    ]


CASES.append(("torch.backends flags", backends_flags, False))


def input_dims():
    def f(x):
        return x * 2 + x.sum(-1, keepdim=True) + x.dim()

    variants = iter([torch.randn(4, 4, 1), torch.randn(4), torch.randn(2, 2, 2, 2), torch.tensor(3.0)])
    return f, [lambda: (next(variants),) for _ in range(4)]


CASES.append(("input dims", input_dims, True))


def input_requires_grad_read():
    def f(x):
        y = x * 2 if x.requires_grad else x - 2
        return y.detach()

    variants = iter([torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)])
    return f, [lambda: (next(variants),) for _ in range(2)]


CASES.append(("input requires_grad read", input_requires_grad_read, True))


def requires_grad_input_layouts():
    def f(x):
        return x * 2 + 1  # Note [A clone with its input's strides] (kiln_aotgrad.joint)

    variants = iter(
        [
            torch.randn(8, 4)[::2].detach().requires_grad_(),
            torch.randn(4, 1).requires_grad_().expand(4, 4),
            torch.randn(4, 4).t().detach().requires_grad_(),
            torch.randn(5, 4)[1:].detach().requires_grad_(),
        ]
    )
    return f, [lambda: (next(variants),) for _ in range(4)]


CASES.append(("requires-grad input layouts", requires_grad_input_layouts, True))


def input_views():
    def f(x):
        return x.view(-1)[:6] + x.stride(0) + x.storage_offset()

    base = torch.randn(8, 8)
    variants = iter(
        [base[:4, :4], base[2:6, 1:5], base.t()[:4, :4], torch.randn(4, 4).t(), torch.randn(4, 4)]
    )

    def call():
        x = next(variants)
        try:
            x.view(-1)
        except RuntimeError:
            x = x.contiguous()
        return (x,)

    return f, [call for _ in range(5)]


CASES.append(("input became a view", input_views, True))


def input_view_mutated():
    def f(x):
        x.mul_(2)
        return x.sum()

    variants = iter([torch.randn(8, 8)[2:6, 1:5], torch.randn(4, 4).t(), torch.randn(4, 4)])
    return f, [lambda: (next(variants),) for _ in range(3)]


CASES.append(("mutated input became a view", input_view_mutated, True))


def list_input_len():
    def f(x, ws):
        for w in ws:
            x = x * w
        return x + len(ws)

    variants = iter([[2.0, 3.0, 4.0], [2.0], [], [5.0, 3.0]])
    return f, [lambda: (torch.randn(4, 4), next(variants)) for _ in range(4)]


CASES.append(("list input length", list_input_len, True))


def buffer_resize_set():
    m = nn.Module()
    m.register_buffer("b", torch.arange(4.0))

    def f(x):
        return torch.cat([x.flatten(), m.b]) * 2

    def shrink():
        m.b.resize_(2)

    def grow():
        m.b.resize_(6)
        m.b.fill_(3.0)  # what resize_ adds is uninitialized

    def set_new():
        m.b.set_(torch.arange(5.0))

    def set_strided():
        src = torch.arange(10.0)
        m.b.set_(src.untyped_storage(), 1, (3,), (2,))

    def set_2d():
        m.b.set_(torch.ones(2, 2))

    return f, [shrink, grow, set_new, set_strided]


CASES.append(("buffer resize_/set_", buffer_resize_set, False))


def buffer_resize_in_module():
    class B(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.arange(4.0))

        def forward(self, x):
            return x[:, : self.b.shape[0]] + self.b

    m = B()

    def shrink():
        m.b.resize_(2)

    def set_offset():
        m.b.set_(torch.arange(8.0).untyped_storage(), 4, (4,), (1,))

    return m, [shrink, set_offset]


CASES.append(("module buffer resize_/set_", buffer_resize_in_module, False))


def hooks_added_removed():
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    handles = {}

    def add_fwd():
        handles["f"] = m[0].register_forward_hook(lambda mod, i, o: o * 2)

    def add_pre():
        handles["p"] = m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))

    return m, [
        add_fwd,
        add_pre,
        lambda: handles.pop("f").remove(),
        lambda: handles.pop("p").remove(),
    ]


CASES.append(("hooks added and removed", hooks_added_removed, False))


_GLOBAL_HOOKS: dict[str, Any] = {}  # process-wide state: both sides' changes register it once


def global_module_hook():
    m = nn.Linear(4, 4)

    def add():
        if "g" not in _GLOBAL_HOOKS:
            _GLOBAL_HOOKS["g"] = nn.modules.module.register_module_forward_hook(lambda mod, i, o: o + 10)

    def remove():
        if "g" in _GLOBAL_HOOKS:
            _GLOBAL_HOOKS.pop("g").remove()

    return m, [add, remove]


CASES.append(("global module hook", global_module_hook, False))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x * len(self.layers)


def modulelist_len():
    m = Stack()
    return m, [
        lambda: m.layers.append(nn.Linear(4, 4)),
        lambda: m.layers.append(nn.Tanh()),
        lambda: m.layers.__delitem__(0),
    ]


CASES.append(("len(ModuleList) read", modulelist_len, False))


def module_dtype():
    m = nn.Linear(4, 4)

    def to64():
        m.double()
        return (torch.randn(4, 4, dtype=torch.float64),)

    def to32():
        m.float()
        return (torch.randn(4, 4),)

    return m, [to64, to32]


CASES.append(("module dtype", module_dtype, True))


# The cases below are the eighteenth session's (fuzz18): state read by the ways of tracing this
# session added (lazy iterators and generator expressions, module walks over the frame's pending
# changes, strings formatted after the graph, symbolic builtins and comparisons of sizes, chain
# splits through cells and try blocks, functools.wraps), each changed between calls. They run
# under dynamic=True too (`test_no_stale_answer_under_dynamic_true`) where they read sizes; each
# of them passed under dynamic=True when written (for CI's time only those stay there).
NEW18: list[str] = []


def _case18(name: str, builder: Callable[[], Any], sizes: bool = False) -> None:
    CASES.append((name, builder, False))
    if sizes:
        NEW18.append(name)


GW = [1.0, 2.0]


def genexpr_global_list():
    GW[:] = [1.0, 2.0]  # both sides read this one list; each change is applied twice

    def f(x):
        g = (x * w for w in GW)  # made, then consumed later: reads GW at each step
        first = next(g)
        return first + sum(g)

    return f, [
        lambda: GW.append(3.0),
        lambda: GW.__setitem__(0, -1.0),
        lambda: GW.__setitem__(slice(None), [6.0]),
        lambda: GW.extend([4.0, 5.0]),
    ]


_case18("genexpr over a global list", genexpr_global_list)


def genexpr_cell_and_consumed_at_once():
    ws = [1.0, 2.0]
    k = 2.0

    def f(x):
        a = sum(x * w * k for w in ws)  # consumed where it is made
        b = torch.stack([x + w for w in ws if w > k]) if any(w > k for w in ws) else x
        return a + b.sum(0)

    def rebind(v):
        def mut():
            nonlocal k
            k = v

        return mut

    return f, [rebind(1.5), lambda: ws.append(4.0), rebind(0.5), lambda: ws.__delitem__(slice(None))]


_case18("genexpr reads a cell", genexpr_cell_and_consumed_at_once)


def lazy_builtins():
    st = {"ws": [1.0, 2.0, 3.0], "bs": [0.5, 0.25], "th": 1.5, "start": 0}

    def f(x):
        ys = list(map(lambda w: x * w, st["ws"]))
        kept = [w for w in filter(lambda w: w > st["th"], st["ws"])]
        acc = x * 0
        for i, (w, b) in enumerate(zip(st["ws"], st["bs"]), st["start"]):
            acc = acc + (w * i + b) * x
        for w in reversed(st["ws"]):
            acc = acc * 0.5 + w
        return sum(ys) + acc + len(kept)

    return f, [
        lambda: st["ws"].append(4.0),
        lambda: st.__setitem__("th", 0.0),
        lambda: st["bs"].extend([1.0, 2.0, 3.0]),
        lambda: st.__setitem__("start", 3),
        lambda: st["ws"].__setitem__(0, -2.0),
        lambda: st.__setitem__("ws", []),
    ]


_case18("map/filter/zip/enumerate/reversed", lazy_builtins)


def lazy_itertools():
    import itertools

    st = {"a": [1.0, 2.0], "b": [3.0], "n": 2}

    def f(x):
        out = x * 0
        for w in itertools.chain(st["a"], st["b"]):
            out = out + w * x
        for w in itertools.islice(st["a"] + st["b"], st["n"]):
            out = out - w
        for p, q in itertools.pairwise(st["a"]):
            out = out + p * q
        return out + sum(itertools.accumulate(st["b"]))

    return f, [
        lambda: st["b"].append(5.0),
        lambda: st.__setitem__("n", 0),
        lambda: st["a"].extend([7.0, 1.0]),
        lambda: st["a"].clear(),
    ]


_case18("itertools chain/islice/pairwise/accumulate", lazy_itertools)


def iterator_mutated_in_frame():
    ws = [1.0, 2.0]
    st = {"extra": 3.0}

    def f(x):
        it = iter(ws)
        first = next(it)
        ws.append(st["extra"])  # the iterator sees it
        out = x * first
        for w in it:
            out = out + w
        ws.pop()
        return out

    return f, [
        lambda: st.__setitem__("extra", -1.0),
        lambda: ws.insert(0, 5.0),
        lambda: ws.__setitem__(slice(None), [9.0]),
    ]


_case18("list iterator sees appends in the frame", iterator_mutated_in_frame)


def dict_iterator_values():
    d = {"a": 1.0, "b": 2.0}

    def f(x):
        out = x
        for k, v in d.items():
            out = out * v + len(k)
        return out + sum(d.values())

    return f, [
        lambda: d.__setitem__("a", 5.0),
        lambda: d.__setitem__("cc", 0.5),
        lambda: d.pop("a"),
        lambda: d.__setitem__("a", 2.0),  # same keys as before, new order
    ]


_case18("dict iterator values and order", dict_iterator_values)


def outside_iterator():
    holder = {"it": iter({"a": 1.0, "b": 2.0}.items())}

    def f(x):
        out = x
        for k, v in holder["it"]:  # a live iterator handed to the frame; advanced for real
            out = out * v + len(k)
        return out

    def partly_consumed():
        it = iter({"a": 3.0, "b": 4.0, "c": 5.0}.items())
        next(it)
        holder["it"] = it

    return f, [
        lambda: None,  # exhausted by the call before: eager iterates nothing
        lambda: holder.__setitem__("it", iter({"x": 2.0}.items())),
        partly_consumed,
        lambda: holder.__setitem__("it", iter(collections.OrderedDict(q=3.0, r=1.0).items())),
    ]


_case18("dict iterator from outside", outside_iterator)


def outside_iterator_next():
    holder = {"it": iter({"a": 1.0, "b": 2.0, "c": 3.0}.values())}

    def f(x):
        return x * next(holder["it"], 10.0)

    return f, [
        lambda: None,
        lambda: None,
        lambda: None,
        lambda: holder.__setitem__("it", iter({"z": 7.0}.values())),
    ]


_case18("next() of an outside iterator", outside_iterator_next)


class Walks(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("buf", torch.ones(4))
        self.drop_bias = False

    def forward(self, x):
        if self.drop_bias:
            self.lin.bias = None  # a pending change the walks below must see
        n = sum(p.numel() for p in self.parameters())
        names = [k for k, _ in self.named_buffers()]
        y = self.lin(x)
        for b in self.buffers():
            y = y + b
        return y * n + len(names)


def module_walks():
    m = Walks()

    def buf_none():
        m.buf = None

    def new_buffer():
        m.register_buffer("extra", torch.full((4,), 2.0))

    def bias_none():
        m.lin.bias = None  # the key stays in _parameters, its value None

    def bias_back():
        m.lin.bias = nn.Parameter(torch.randn(4))  # None to a parameter under the same key

    return m, [
        lambda: setattr(m, "drop_bias", True),
        buf_none,
        new_buffer,
        lambda: m.lin.register_parameter("bias", nn.Parameter(torch.zeros(4))),
        lambda: setattr(m, "drop_bias", False),
        bias_none,
        bias_back,
    ]


_case18("module walks after parameters set to None", module_walks)


class Registers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.mode = "buffer"

    def forward(self, x):
        if self.mode == "buffer":
            self.register_buffer("scale", x.sum(0).detach())  # a registry write in the frame
        elif self.mode == "none":
            self.scale = None
        else:
            self.scale = 2.0  # a plain attribute: guarded that no registry holds the name
        total = x * 0
        for name, b in self.named_buffers():
            total = total + b + len(name)
        return self.lin(x) + total + len(list(self.children()))


def module_registry_writes():
    m = Registers()

    def to_attr():
        if "scale" in m._buffers:
            del m._buffers["scale"]
        m.mode = "attr"

    def back_to_buffer():
        m.__dict__.pop("scale", None)
        m.mode = "buffer"

    return m, [
        lambda: None,
        lambda: setattr(m, "mode", "none"),
        to_attr,
        back_to_buffer,
        lambda: m.add_module("act", nn.ReLU()),
    ]


_case18("module registry writes in the frame", module_registry_writes)


class SetsAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.last = x.sum(0).detach()  # guards.not_registered: 'last' in no registry (else a buffer)
        return self.lin(x) + sum(self.buffers(), x * 0) + len(list(self.named_buffers()))


def module_name_registered_between_calls():
    m = SetsAttr()

    def register():
        m.__dict__.pop("last", None)
        m.register_buffer("last", None)  # the frame's store now goes into _buffers

    def unregister():
        del m._buffers["last"]

    return m, [lambda: None, register, lambda: None, unregister]


_case18("a stored name registered between calls", module_name_registered_between_calls)

GFMT = "x"


def formatted_tensor_strings():
    global GFMT
    GFMT = "x"
    st = {"spec": ".2f", "w": 6}

    def f(x):
        s = x.round().sum()  # exact in any order of summation: the digits compared are eager's
        return f"{GFMT}={s:{st['spec']}}|{x.max():>{st['w']}.1f}", s

    def g():
        global GFMT
        GFMT = "total"

    return f, [
        lambda: st.__setitem__("spec", ".5e"),
        g,
        lambda: st.__setitem__("w", 12),
        lambda: st.__setitem__("spec", ""),
    ]


_case18("format spec and global in an f-string", formatted_tensor_strings)


def formatted_captured_tensor():
    t = torch.tensor(1.5)
    holder = {"t": torch.tensor(2)}

    def f(x):
        return f"{t} {holder['t']:>4}", x + t

    return f, [
        lambda: t.add_(1),
        lambda: holder.__setitem__("t", torch.tensor(3.25)),
        lambda: holder.__setitem__("t", torch.tensor(True)),
        lambda: holder.__setitem__("t", torch.tensor(7, dtype=torch.int8)),
    ]


_case18("captured 0-d tensors formatted", formatted_captured_tensor)


def formatted_sizes():
    st = {"k": 2, "spec": "d"}

    def f(x):
        n = x.shape[0]
        return f"rows={n} k={n * st['k']:{st['spec']}} half={n // 2}", x * n

    return f, [
        lambda: st.__setitem__("k", 3),
        lambda: st.__setitem__("spec", ">5"),
        lambda: st.__setitem__("spec", "x"),
    ]


_case18("sizes formatted into strings", formatted_sizes, sizes=True)


def size_builtins():
    st = {"lo": 5, "cap": 9}

    def f(x):
        n = x.shape[0]
        m = max(n, st["lo"])
        k = min(n * 2, st["cap"])
        q, r = divmod(n, 3)
        return x[: min(n, st["lo"])] * m, k, q + r, round(n / 4), math.ceil(n / st["lo"]), abs(n - st["lo"])

    return f, [
        lambda: st.__setitem__("lo", 2),
        lambda: st.__setitem__("cap", 100),
        lambda: st.__setitem__("lo", 8),
    ]


_case18("builtins on sizes", size_builtins, sizes=True)


def size_comparisons():
    st = {"sizes": (5, 7), "ref": [4, 4]}

    def f(x):
        n = x.shape[0]
        hit = n in st["sizes"]
        same = list(x.shape) == st["ref"]
        y = x * 2 if n in st["sizes"] else x - 1  # a branch on the comparison
        return y, hit, same, n != st["ref"][0], (n, 4) == tuple(st["ref"])

    return f, [
        lambda: st.__setitem__("sizes", (4, 6, 9)),
        lambda: st.__setitem__("ref", [5, 4]),
        lambda: st.__setitem__("sizes", ()),
        lambda: st.__setitem__("ref", [7, 4]),
    ]


_case18("comparisons of sizes", size_comparisons, sizes=True)


def sorted_sizes():
    st = {"k": 5, "rev": False}

    def f(x):
        n = x.shape[0]
        order = sorted([n, st["k"], 4], reverse=st["rev"])
        lo, hi = min(n, st["k"], 6), max([n, st["k"]])
        return x[: order[0]] * hi, order, lo

    return f, [
        lambda: st.__setitem__("k", 1),
        lambda: st.__setitem__("rev", True),
        lambda: st.__setitem__("k", 8),
    ]


_case18("sorted/min/max of sizes", sorted_sizes, sizes=True)


def _chain_leaf(y):
    v = y.sum().item()  # the break
    return y + v * 0


def chain_cells():
    st = {"k": 2.0, "ks": (1, 2)}

    def inner(x):
        k = st["k"]
        by = [x * j for j in st["ks"]]  # a comprehension: x is a cell
        scale = lambda: k * 2  # noqa: E731  (k a cell, the closure does not live on)
        s = scale()
        y = _chain_leaf(by[-1] + s)
        return y * k + sum(x * j for j in st["ks"])

    def f(x):
        return inner(x.cos()) - 1

    return f, [
        lambda: st.__setitem__("k", 5.0),
        lambda: st.__setitem__("ks", (3,)),
        lambda: st.__setitem__("ks", (1, 1, 4)),
    ]


_case18("chain split through cells", chain_cells, sizes=True)


def chain_try():
    st = {"key": "a", "k": 2.0}

    def inner(x, d):
        y = x * st["k"]
        try:
            y = _chain_leaf(y) + d[st["key"]]  # the break inside a try block
        except KeyError:
            y = y - 100
        finally:
            y = y * 2
        return y

    def f(x):
        return inner(x.sin(), {"a": 1.0}) + 1

    return f, [
        lambda: st.__setitem__("key", "b"),
        lambda: st.__setitem__("k", 3.0),
        lambda: st.__setitem__("key", "a"),
    ]


_case18("chain split through a try block", chain_try)


def iterators_kept_between_calls():
    ws = [1.0, 2.0, 4.0]
    bs = [5.0, 6.0, 7.0]
    st = {}

    def f(x):
        out = x
        if "its" in st:  # the iterators the call before made: they read ws and bs now
            a, b, c = st.pop("its")
            out = out + sum(a) + sum(w for w in b) + sum(i * w for i, (w, _) in c)
        a, b, c = iter(ws), reversed(ws), enumerate(zip(ws, bs))
        next(a), next(b), next(c)
        st["its"] = (a, b, c)
        return out

    return f, [
        lambda: ws.append(3.0),
        lambda: ws.insert(0, 9.0),
        lambda: bs.__setitem__(slice(None), [1.0]),
        lambda: ws.pop(0),
    ]


_case18("list iterators kept between calls", iterators_kept_between_calls)


def popped_and_returned():
    class Obj:
        pass

    st = {"o": Obj(), "n": 2}

    def f(x):
        o = st.pop("o", None)
        n = st.pop("n", 1)
        return x * n, o is None, n

    return f, [lambda: None, lambda: st.update(o=Obj(), n=3), lambda: st.__setitem__("n", 5)]


_case18("values popped from a dict", popped_and_returned)


def wraps_decorated():
    ns = {"act": torch.relu}

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(x):
            return fn(x) * 2

        return wrapper

    def f(x):
        w = deco(ns["act"])
        return w(x), w.__name__

    return f, [lambda: ns.__setitem__("act", torch.tanh), lambda: ns.__setitem__("act", torch.sigmoid)]


_case18("functools.wraps in the frame", wraps_decorated)


# The cases below are the thirty-second session's (fix32): state a real program changes between
# calls that the cases above reach only partly: a tensor subclass input, a `@property` over
# state, a mutable default argument mutated, a class attribute reached through a base class or
# shadowed by (and then uncovered from) an instance attribute, hooks of every kind added to a
# submodule after the first call, a parametrization registered, an instance's `forward` or
# `__class__` replaced, a submodule swapped, inference mode, a global tensor's requires_grad.
NEW32: list[str] = []


def _case32(name: str, builder: Callable[[], Any], takes_inputs: bool = False) -> None:
    CASES.append((name, builder, takes_inputs))
    NEW32.append(name)


class Sub32(torch.Tensor):
    pass


def tensor_subclass_input():
    def f(x):
        return x * 2 + 1

    return f, [
        lambda: (torch.randn(4, 4).as_subclass(Sub32),),
        lambda: (torch.randn(4, 4),),
        lambda: (nn.Parameter(torch.randn(4, 4)),),
    ]


_case32("tensor subclass input", tensor_subclass_input, takes_inputs=True)


def property_over_state():
    class Prop32:  # one class a side: the change below replaces its property
        def __init__(self):
            self._k = 1.0
            self.on = True

        @property
        def scale(self):
            return self._k * 2 if self.on else -self._k

    o = Prop32()

    def f(x):
        return x * o.scale

    def new_prop():
        Prop32.scale = property(lambda s: s._k + 100)

    return f, [lambda: setattr(o, "_k", 3.0), lambda: setattr(o, "on", False), new_prop]


_case32("@property over state", property_over_state)


class PropModule32(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("gain", torch.ones(4))
        self.mode = "a"

    @property
    def factor(self):
        return 2.0 if self.mode == "a" else 0.5

    @property
    def effective_gain(self):
        return self.gain * self.factor

    def forward(self, x):
        return self.lin(x) * self.effective_gain


def module_property():
    m = PropModule32()

    def fill():
        with torch.no_grad():
            m.gain.fill_(3.0)

    return m, [lambda: setattr(m, "mode", "b"), fill, lambda: setattr(m, "gain", torch.zeros(4))]


_case32("module @property over state", module_property)


def mutable_default_mutated():
    def f(x, cfg={"k": 1.0, "ops": ["relu"]}):  # noqa: B006 (the point of the case)
        for op in cfg["ops"]:
            x = getattr(torch, op)(x)
        return x * cfg["k"]

    d = f.__defaults__[0]
    return f, [
        lambda: d.__setitem__("k", 3.0),
        lambda: d["ops"].append("tanh"),
        lambda: d["ops"].__setitem__(0, "sigmoid"),
    ]


_case32("mutable default argument mutated", mutable_default_mutated)


def list_default_appended():
    def f(x, acc=[]):  # noqa: B006
        return x + len(acc), sum(acc)

    d = f.__defaults__[0]
    return f, [lambda: d.append(2), lambda: d.append(5), lambda: d.clear()]


_case32("list default argument appended", list_default_appended)


def base_class_attr():
    class Base32:  # one pair of classes a side: the changes write and delete their attributes
        scale = 1.0

    class Child32(Base32):
        pass

    o = Child32()

    def f(x):
        return x * o.scale

    return f, [
        lambda: setattr(Base32, "scale", 2.0),
        lambda: setattr(Child32, "scale", 5.0),
        lambda: delattr(Child32, "scale"),
        lambda: setattr(o, "scale", 7.0),
        lambda: delattr(o, "scale"),
    ]


_case32("class attribute through a base class", base_class_attr)


def module_class_attr_mro():
    class BaseMod32(nn.Module):
        alpha = 1.0

        def forward(self, x):
            return x * self.alpha

    class ChildMod32(BaseMod32):
        pass

    m = ChildMod32()
    return m, [
        lambda: setattr(BaseMod32, "alpha", 3.0),
        lambda: setattr(m, "alpha", 4.0),
        lambda: delattr(m, "alpha"),
        lambda: setattr(ChildMod32, "alpha", -1.0),
    ]


_case32("module class attribute through a base class", module_class_attr_mro)


def submodule_hooks_after_first_call():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    handles = {}

    def pre_kwargs():
        handles["pk"] = m[2].register_forward_pre_hook(
            lambda mod, args, kw: ((args[0] * 3,), kw), with_kwargs=True
        )

    def fwd_prepend():
        handles["fp"] = m[1].register_forward_hook(lambda mod, i, o: o - 1, prepend=True)

    def fwd_always():
        handles["fa"] = m[0].register_forward_hook(lambda mod, i, o: o * 0.5, always_call=True)

    return m, [
        pre_kwargs,
        fwd_prepend,
        fwd_always,
        lambda: handles.pop("pk").remove(),
        lambda: handles.pop("fa").remove(),
    ]


_case32("submodule hooks of every kind added", submodule_hooks_after_first_call)


class Twice32(nn.Module):
    def forward(self, w):
        return w * 2


def parametrization_registered():
    m = nn.Linear(4, 4)

    def add():
        torch.nn.utils.parametrize.register_parametrization(m, "weight", Twice32())

    def remove():
        torch.nn.utils.parametrize.remove_parametrizations(m, "weight", leave_parametrized=False)

    return m, [add, remove]


_case32("parametrization registered and removed", parametrization_registered)


def instance_forward_replaced():
    m = nn.Linear(4, 4)
    orig = m.forward

    return m, [
        lambda: setattr(m, "forward", lambda x: orig(x) * 10),
        lambda: delattr(m, "forward"),
    ]


_case32("instance forward replaced", instance_forward_replaced)


class A32:
    def k(self):
        return 2.0


class B32:
    def k(self):
        return 3.0


def instance_class_changed():
    o = A32()

    def f(x):
        return x * o.k()

    return f, [lambda: setattr(o, "__class__", B32), lambda: setattr(o, "__class__", A32)]


_case32("instance __class__ changed", instance_class_changed)


def instance_method_shadowed():
    o = A32()

    def f(x):
        return x * o.k()

    return f, [lambda: setattr(o, "k", lambda: 9.0), lambda: delattr(o, "k")]


_case32("method shadowed by an instance attribute", instance_method_shadowed)


class Act32(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x))


def submodule_swapped():
    m = Act32()
    return m, [
        lambda: setattr(m, "act", nn.Tanh()),
        lambda: setattr(m, "act", nn.Identity()),
        lambda: setattr(m.act, "forward", lambda x: x * 4),
        lambda: setattr(m, "act", nn.LeakyReLU(0.5)),
        lambda: setattr(m.act, "negative_slope", 0.01),
    ]


_case32("submodule swapped", submodule_swapped)


_INFERENCE: dict[str, Any] = {}


def inference_mode_toggled():
    w = torch.randn(4, 4, requires_grad=True)

    def f(x):
        y = x @ w
        return y, y.requires_grad, torch.is_inference_mode_enabled()

    def enter():  # process-wide state: both sides' changes enter it once (and leave it once)
        if "cm" not in _INFERENCE:
            _INFERENCE["cm"] = torch.inference_mode()
            _INFERENCE["cm"].__enter__()

    def leave():
        if "cm" in _INFERENCE:
            _INFERENCE.pop("cm").__exit__(None, None, None)

    return f, [enter, leave]


_case32("inference mode toggled", inference_mode_toggled)


def inference_block_body():
    k = [2.0]

    def f(x):
        with torch.inference_mode():
            return x * k[0] + 1

    # each entry serves several sizes (one before kiln_aotgrad's Note [A symbolic graph called
    # in another grad mode] answered them all with its first call's size)
    same = lambda: None  # noqa: E731
    return f, [same, lambda: k.__setitem__(0, 3.0), same, lambda: torch.set_grad_enabled(False), same]


_case32("body in an inference_mode block", inference_block_body)


def no_grad_toggled_reads_grad():
    w = torch.randn(4, 4, requires_grad=True)

    def f(x):
        y = (x @ w).relu()
        return y.sum(), y.requires_grad, torch.is_grad_enabled()

    return f, [lambda: torch.set_grad_enabled(False), lambda: torch.set_grad_enabled(True)]


_case32("no_grad toggled, grad state returned", no_grad_toggled_reads_grad)


GT32 = torch.randn(4)


def global_tensor_requires_grad():
    GT32.requires_grad_(False)

    def f(x):
        y = x * GT32
        return y, y.requires_grad

    def on():
        GT32.requires_grad_(True)

    def off():
        GT32.requires_grad_(False)

    return f, [on, off]


_case32("global tensor requires_grad toggled", global_tensor_requires_grad)


class Bag32:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def vars_updated():
    o = Bag32(a=1.0, b=2.0)

    def f(x):
        return x * o.a + o.b

    return f, [lambda: vars(o).update(a=5.0), lambda: o.__dict__.pop("b") and setattr(o, "b", -1.0)]


_case32("vars(obj) updated", vars_updated)


class Slots32:
    __slots__ = ("k", "t")

    def __init__(self):
        self.k = 1.0
        self.t = torch.ones(4)


def slots_attrs():
    o = Slots32()

    def f(x):
        return x * o.k + o.t

    return f, [
        lambda: setattr(o, "k", 2.0),
        lambda: setattr(o, "t", torch.full((4,), 3.0)),
        lambda: o.t.mul_(2),
    ]


_case32("__slots__ attributes", slots_attrs)


def helper_closure_changed():
    k = [2.0]

    def helper(x):
        return x * k[0]

    ns = {"h": helper}

    def f(x):
        return ns["h"](x) + 1

    def other():
        j = 7.0

        def helper2(x):
            return x * j

        ns["h"] = helper2

    return f, [lambda: k.__setitem__(0, 3.0), other]


_case32("helper's closure changed", helper_closure_changed)


def nested_container_attr():
    o = Bag32(cfg={"layers": [1.0, 2.0], "bias": {"on": True}})

    def f(x):
        for s in o.cfg["layers"]:
            x = x * s
        if o.cfg["bias"]["on"]:
            x = x + 1
        return x

    return f, [
        lambda: o.cfg["layers"].append(3.0),
        lambda: o.cfg["bias"].__setitem__("on", False),
        lambda: o.cfg.__setitem__("layers", (0.5,)),
    ]


_case32("nested containers on an attribute mutated", nested_container_attr)


def module_buffer_dtype():
    class W(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.ones(4))

        def forward(self, x):
            return x + self.b

    w = W()

    def to_double():
        w.b = w.b.double()

    def to_half():
        w.b = w.b.half()

    return w, [to_double, to_half, lambda: setattr(w, "b", torch.ones(4, 4))]


_case32("module buffer dtype and shape replaced", module_buffer_dtype)


def staticmethod_replaced():
    class K:
        @staticmethod
        def g(x):
            return x + 1

        @classmethod
        def c(cls):
            return cls.__name__

    def f(x):
        return K.g(x), K.c()

    def swap():
        K.g = staticmethod(lambda x: x - 1)

    def swap_c():
        K.c = classmethod(lambda cls: "other")

    return f, [swap, swap_c]


_case32("staticmethod and classmethod replaced", staticmethod_replaced)


def tensor_attr_of_tensor():
    t = torch.ones(4)
    t.scale = 2.0

    def f(x):
        return x * t.scale + t

    return f, [lambda: setattr(t, "scale", 5.0)]


_case32("attribute on a tensor changed", tensor_attr_of_tensor)


def param_replaced_other_shape():
    m = nn.Linear(4, 4)

    def replace():
        m.weight = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
        m.bias = nn.Parameter(torch.randn(4, dtype=torch.float64))
        return (torch.randn(4, 4, dtype=torch.float64),)

    def plain_tensor():
        del m.weight
        m.weight = torch.randn(4, 4, dtype=torch.float64)
        return (torch.randn(4, 4, dtype=torch.float64),)

    def no_bias():
        m.weight = nn.Parameter(torch.randn(2, 4))
        m.bias = None
        return (torch.randn(4, 4),)

    return m, [replace, plain_tensor, no_bias]


_case32("parameter replaced by another dtype, a plain tensor, no bias", param_replaced_other_shape, True)


def grad_attribute_read():
    w = torch.randn(4, requires_grad=True)

    def f(x):
        if w.grad is None:
            return x * w
        return x * w.grad

    def backward():
        (w * 3).sum().backward()

    def zero():
        w.grad = None

    return f, [backward, lambda: w.grad.mul_(2), zero]


_case32("a parameter's .grad read", grad_attribute_read)


def getattr_default_registered():
    class Opt(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            extra = getattr(self, "extra", None)
            y = self.lin(x)
            return y if extra is None else y + extra

    m = Opt()

    def add_param():
        m.register_parameter("extra", nn.Parameter(torch.ones(4)))

    def add_buffer():
        del m.extra
        m.register_buffer("extra", torch.full((4,), 2.0))

    return m, [add_param, add_buffer, lambda: delattr(m, "extra")]


_case32("getattr(self, name, None) registered later", getattr_default_registered)


def global_int_as_shape():
    st = {"g": 2}

    def f(x):
        return x.reshape(st["g"], -1).sum(0)

    return f, [lambda: st.__setitem__("g", 4), lambda: st.__setitem__("g", 1)]


_case32("an int read as a shape", global_int_as_shape)


def bound_method_held():
    class Scaler:
        def __init__(self):
            self.k = 2.0

        def apply(self, x):
            return x * self.k

    s = Scaler()
    ns = {"fn": s.apply}

    def f(x):
        return ns["fn"](x) + 1

    def other():
        s2 = Scaler()
        s2.k = -1.0
        ns["fn"] = s2.apply

    return f, [lambda: setattr(s, "k", 5.0), other]


_case32("a bound method held in a dict", bound_method_held)


def training_property_module():
    class P(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        @property
        def scale(self):
            return 1.0 if self.training else 0.5

        def forward(self, x):
            return self.lin(x) * self.scale

    m = P()
    return m, [lambda: m.eval(), lambda: m.train(), lambda: m.lin.eval()]


_case32("@property over self.training", training_property_module)


def call_overridden():
    class C(nn.Module):
        def forward(self, x):
            return x + 1

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = C()

        def forward(self, x):
            return self.c(x) * 2

    m = Outer()

    def patch_forward():
        C.forward = lambda self, x: x - 1

    return m, [patch_forward]


_case32("a submodule class's forward patched", call_overridden)


def version_read():
    t = torch.ones(4)

    def f(x):
        return x + t, t._version

    return f, [lambda: t.add_(1), lambda: t.mul_(2)]


_case32("a tensor's _version read", version_read)


def dropout_p_changed():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0))
    return m, [lambda: setattr(m[1], "p", 1.0), lambda: setattr(m[1], "inplace", True), lambda: m.eval()]


_case32("dropout p changed", dropout_p_changed)


def lazy_module_materialized():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def add_norm():
        m.append(nn.LayerNorm(4))

    def norm_eps():
        m[2].eps = 10.0

    def norm_affine():
        with torch.no_grad():
            m[2].weight.fill_(3.0)

    return m, [add_norm, norm_eps, norm_affine]


_case32("a LayerNorm appended then changed", lazy_module_materialized)


DEFAULT_ARGS = {
    "conv input layout": lambda: (torch.randn(2, 3, 8, 8),),
    "scalar input types": lambda: (torch.randn(4), 1),
    "int returns": lambda: (torch.randn(4), 2),
    "list input length": lambda: (torch.randn(4, 4), [2.0, 3.0]),
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
    flags = (torch.backends.mkldnn.enabled, torch.backends.cudnn.enabled)
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(True)
    torch._C._set_mkldnn_enabled(flags[0])  # not the properties: torch's test utilities freeze them
    torch._C._set_cudnn_enabled(flags[1])
    torch.use_deterministic_algorithms(deterministic)
    if "cm" in _INFERENCE:  # a case that failed inside the mode
        _INFERENCE.pop("cm").__exit__(None, None, None)
    for handle in _GLOBAL_HOOKS.values():
        handle.remove()
    _GLOBAL_HOOKS.clear()
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


# Note [Staleness after automatic dynamic]: under `dynamic=None` the first compile is static and
# a call with another size compiles the frame again with that dim symbolic; from then on the
# symbolic graph serves every size, so its guards (not the static graph's) are the ones a change
# must fail. Each case without input changes runs again here: two warm-up calls at batch sizes
# 4 and 6 (the second one recompiles symbolic), then every change, each called at a size the
# frame has not seen. Where eager raises at a size (a reshape to a fixed shape), kiln must too.
_DYNAMIC_SIZES = (4, 6, 5, 7, 3, 9, 10, 11, 12, 13, 14, 15)
_STATIC_ONLY = {c[0] for c in CASES if c[2]}


def _call(fn: Any, args: tuple[Any, ...]) -> tuple[Any, type[BaseException] | None]:
    try:
        return fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]), None
    except Exception as exc:  # eager rejecting a size is an answer kiln must give too
        return None, type(exc)


@pytest.mark.parametrize(
    ("name", "builder"), [c[:2] for c in CASES if c[0] not in _STATIC_ONLY],
    ids=[c[0] for c in CASES if c[0] not in _STATIC_ONLY],
)  # fmt: skip
def test_no_stale_answer_after_automatic_dynamic(name: str, builder: Callable[[], Any]) -> None:
    _changes_at_new_sizes(builder, dynamic=None)


@pytest.mark.parametrize("name", [*NEW18, *(n for n in NEW32 if n not in _STATIC_ONLY)])
def test_no_stale_answer_under_dynamic_true(name: str) -> None:
    # the eighteenth and thirty-second sessions' cases with every size symbolic from the first
    # compile
    _changes_at_new_sizes(next(c[1] for c in CASES if c[0] == name), dynamic=True)


def _changes_at_new_sizes(builder: Callable[[], Any], dynamic: bool | None) -> None:
    torch.manual_seed(0)
    fn, changes = builder()
    torch.manual_seed(0)
    fn2, changes2 = builder()
    compiled = kiln.compile(fn2, dynamic=dynamic)
    steps = [(lambda: None, lambda: None)] * 2 + list(zip(changes, changes2, strict=True))
    for step, ((change, change2), n) in enumerate(zip(steps, _DYNAMIC_SIZES, strict=False)):
        torch.manual_seed(step)
        change()
        torch.manual_seed(step)
        change2()
        args = (torch.randn(n, 4),)
        expected, e_exc = _call(fn, args)
        got, c_exc = _call(compiled, args)
        assert (e_exc is None) == (c_exc is None), f"step {step} (batch {n}): eager {e_exc}, kiln {c_exc}"
        assert _difference(expected, got) is None, f"step {step} (batch {n}): {_difference(expected, got)}"


def test_a_change_recompiles_once_and_the_old_entry_serves_again() -> None:
    torch.manual_seed(0)
    m = Knobs()
    compiled = kiln.compile(m)
    x = torch.randn(4, 4)
    graphs = []
    for change in [None, None, ("k", 3), None, ("mode", "tanh"), ("k", 2), ("mode", "relu")]:
        if change is not None:
            setattr(m, *change)
        assert _difference(m(x), compiled(x)) is None, change
        graphs.append(kiln.capture_stats().graphs)
    # a new state compiles once; the original state (k=2, relu) finds its first entry again
    assert graphs == [1, 1, 2, 2, 3, 4, 4], graphs


def test_functions_of_one_code_with_other_globals() -> None:
    """Note [An entry serves its frame's globals] (kiln_frame_hook): the guard of a frame reads
    the globals it was compiled under, so a function sharing its code with other globals ran the
    first one's graph (`x * 3.0` for a global of 5.0)."""
    import types

    def g(x):
        return x * GK  # noqa: F821 (each function has its own globals)

    fns = [types.FunctionType(g.__code__, {"GK": k}) for k in (3.0, 5.0)]
    compiled = [kiln.compile(f) for f in fns]
    x = torch.randn(4)
    for f, c in [*zip(fns, compiled), *zip(fns, compiled)]:
        assert _difference(f(x), c(x)) is None
