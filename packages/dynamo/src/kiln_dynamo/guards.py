"""Guards: one Python function per compiled entry, checking what the capture relied on.

While tracing, each fact the graph depends on is recorded as a check: a fast Python expression
over the frame's entry values, one or more (expression, readable) pairs that explain it part by
part (`L['x'].size(0) == 8`), and the user line that made the capture rely on it. `build_guard`
turns the checks of one capture into the source of one function, compiled once:

    def ___guard(L0, L1):
        try:
            if not (___c[0]() is True): return False
            v0 = L0._modules['lin']                       # each source evaluated once
            if not (type(v0) is ___c[3]): return False
            v1 = v0._parameters['weight']
            if not ((type(v1), v1.dtype, v1.device, v1.requires_grad, v1.shape, v1.stride()) == ___c[5]):
                return False
            return True
        except Exception:
            return False

A tensor is checked with one tuple comparison; its explanation has one part per property. The
same body, generated a second time with the explanation parts, is compiled lazily and used only
after the fast function said no, to name the first failing part (`failure_reason`).

Note [Guard references]: guards must not keep the compiled function alive (the cache sits in
the code object's co_extra, which gc cannot traverse). Identity checks on objects that support
weak references go through a weakref (`___c[k]() is X`); the constant table may hold types,
dtypes, devices and module globals dicts, which outlive the function anyway.
"""

from __future__ import annotations

import logging
import math
import os
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kiln_dynamo import guard_tree, shapes
from kiln_dynamo.logs import guards_log
from kiln_dynamo.source import AttrSource, CodeContext, ConstSource, Source
from kiln_dynamo.tensor_check import dispatch_keys

# a constant guard compares with a copy of a mutable value (a set read in the frame): holding the
# object itself, the check compared it with itself after the program mutated it (a stale graph
# returned `3 in s` as False after `s.add(3)`)
_MUTABLE: dict[type, Callable[[Any], Any]] = {set: set, list: list, dict: dict, bytearray: bytearray}


# Note [Guards on NaN and signed zeros]: a constant guard is `value == captured`, which a NaN
# never passes (`nan == nan` is False, in Python and in the C tree's rich compare alike): a
# frame that read `torch.nan` or `float("nan")` from a global or an attribute recompiled on
# every call, each capture guarding on a NaN that failed again. And `-0.0 == 0.0` passes,
# although the graph baked in the sign (`1 / (x * z)` is -inf or inf). A float (or complex)
# constant that is a NaN or a zero is compared through `SameFloat`, whose `__eq__` says whether
# the value is the same float, bit for bit up to the NaN payload: the frame's float returns
# NotImplemented for a foreign right-hand side, so Python (and the C tree's PyObject_RichCompare)
# ask the reflected `SameFloat.__eq__`. Other floats keep the plain `==` (and its literal form).
def _same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


class SameFloat:
    """Equal to a float (complex) that is the same as `value`: NaN equals NaN, -0.0 not 0.0."""

    __slots__ = ("value",)

    def __init__(self, value: float | complex) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        v = self.value
        if type(other) is not type(v):
            return False
        if isinstance(v, complex):
            assert isinstance(other, complex)
            return _same_float(other.real, v.real) and _same_float(other.imag, v.imag)
        assert isinstance(other, float)
        return _same_float(other, v)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.value)


# Note [Same floats in C] (kiln_frame_hook's guard_tree.c): the C guard tree checks such a
# constant with its SAME_FLOAT op, which its memo can skip, instead of an EQ against the
# `SameFloat` (a call of `SameFloat.__eq__` on every call: T5 has 46, one per dropout rate of
# 0.0). `KILN_SAME_FLOAT_OP=0` (read when a guard is built) keeps the EQ.
SAME_FLOAT_OP = os.environ.get("KILN_SAME_FLOAT_OP", "1") != "0"


def _needs_same_float(value: object) -> bool:
    if type(value) is float:
        return math.isnan(value) or value == 0.0
    if type(value) is complex:
        return any(math.isnan(p) or p == 0.0 for p in (value.real, value.imag))
    return False


@dataclass(frozen=True, slots=True)
class CCheck:
    """One check in the form the C guard tree runs (guard_tree.py): `kind` over the value at
    `source` (None for checks on constants), with its arguments."""

    kind: str
    source: Source | None
    arg: object = None
    arg2: object = None


@dataclass(frozen=True, slots=True)
class GuardPart:
    code: str  # fast expression (in terms of the guard's locals)
    explain: tuple[tuple[str, str], ...]  # (expression, readable) per property
    where: str
    c: tuple[CCheck, ...] | None = None  # the same check for the C tree; None: a residual

    @property
    def readable(self) -> str:
        return " and ".join(r for _, r in self.explain)


class GuardBuilder:
    """Collects checks, deduplicated, in the order they were first needed."""

    def __init__(self, parent_ctx: CodeContext) -> None:
        self.ctx = CodeContext(parent_ctx.entry_names, parent=parent_ctx, cse=True)
        self.items: list[str | GuardPart] = []  # assignments and checks, in order
        self._seen: set[str] = set()
        self.where = "?"
        self.needs_globals = False
        self.global_state_recorded = False
        self.inference_mode_recorded = False
        self.dispatch_modes_recorded = False

    @property
    def parts(self) -> list[GuardPart]:
        return [i for i in self.items if isinstance(i, GuardPart)]

    def add(
        self,
        code: str,
        readable: str | None = None,
        explain: list[tuple[str, str]] | None = None,
        c: tuple[CCheck, ...] | None = None,
    ) -> None:
        self.items.extend(self.ctx.drain())
        if code in self._seen:
            return
        self._seen.add(code)
        self.items.append(GuardPart(code, tuple(explain or [(code, readable or code)]), self.where, c))

    def _src(self, source: Source) -> tuple[str, str]:
        if source.needs_globals():
            self.needs_globals = True
        return self.ctx.bind(source), source.name()

    def type_match(self, source: Source, value: object) -> None:
        code, name = self._src(source)
        t = type(value)
        c = (CCheck("type_is", source, t),)
        self.add(f"type({code}) is {self.ctx.const(t)}", f"type({name}) is {t.__qualname__}", c=c)

    def constant(self, source: Source, value: object) -> None:
        code, name = self._src(source)
        if value is None or isinstance(value, bool):
            self.add(f"{code} is {value!r}", f"{name} is {value!r}", c=(CCheck("is", source, value),))
            return
        t = type(value)
        if t in _MUTABLE:  # the value as captured: the live object compared with itself always matches
            value = _MUTABLE[t](value)
        same = None
        if _needs_same_float(value):  # Note [Guards on NaN and signed zeros]
            same = CCheck("same_float", source, value) if SAME_FLOAT_OP else None
            value = SameFloat(value)  # type: ignore[arg-type]
        c = (CCheck("type_is", source, t), same or CCheck("eq", source, value))
        type_part = (f"type({code}) is {self.ctx.const(t)}", f"type({name}) is {t.__qualname__}")
        if t in (int, str) or (t is float and not isinstance(value, SameFloat)):
            value_part = (f"{code} == {value!r}", f"{name} == {value!r}")
        else:
            value_part = (f"{code} == {self.ctx.const(value)}", f"{name} == {value!r}")
        self.add(f"{type_part[0]} and {value_part[0]}", explain=[type_part, value_part], c=c)

    def constant_sequence(self, source: Source, value: tuple[Any, ...] | list[Any]) -> None:
        """A tuple or list of plain constants (`is_plain_constants`) in one check: its type, its
        value and the type of each item (`(1, True) == (1, 1)`)."""
        code, name = self._src(source)
        t, types_ = type(value), tuple(type(v) for v in value)
        # a copy: the tree must compare with the value as captured, as the literal below does
        c = (
            CCheck("type_is", source, t),
            CCheck("eq", source, t(value)),
            CCheck("item_types", source, types_),
        )
        self.add(
            f"type({code}) is {self.ctx.const(t)} and {code} == {value!r} and "
            f"tuple(map(type, {code})) == {self.ctx.const(types_)}",
            explain=[
                (f"type({code}) is {self.ctx.const(t)}", f"type({name}) is {t.__qualname__}"),
                (f"{code} == {value!r}", f"{name} == {value!r}"),
                (
                    f"tuple(map(type, {code})) == {self.ctx.const(types_)}",
                    f"item types of {name} are {', '.join(x.__qualname__ for x in types_)}",
                ),
            ],
            c=c,
        )

    def identity(self, source: Source, value: object) -> None:
        code, name = self._src(source)
        label = (
            getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or type(value).__name__
        )
        if isinstance(value, type(torch)):
            label = value.__name__
        try:
            ref: Any = weakref.ref(value)
            c = (CCheck("is_ref", source, ref),)
            self.add(f"{code} is {self.ctx.const(ref)}()", f"{name} is {label}", c=c)
        except TypeError:
            self.add(
                f"id({code}) == {id(value)}", f"{name} is {label}", c=(CCheck("id_eq", source, id(value)),)
            )

    def function(self, source: Source, fn: Any) -> None:
        """A Python function the capture may inline: the same object, still running the same code
        (`f.__code__ = other.__code__` keeps the object and changes what it does). Anything
        else (a builtin behind a staticmethod) is pinned by identity only."""
        if not hasattr(fn, "__code__"):
            self.identity(source, fn)
            return
        code, name = self._src(source)
        label = getattr(fn, "__qualname__", "function")
        fn_ref, code_ref = weakref.ref(fn), weakref.ref(fn.__code__)
        same = (f"{code} is {self.ctx.const(fn_ref)}()", f"{name} is {label}")
        body = (f"{code}.__code__ is {self.ctx.const(code_ref)}()", f"{name}.__code__ is the code of {label}")
        c = (CCheck("is_ref", source, fn_ref), CCheck("is_ref", AttrSource(source, "__code__"), code_ref))
        self.add(f"{same[0]} and {body[0]}", explain=[same, body], c=c)

    def same_object(self, a: Source, b: Source) -> None:
        ca, na = self._src(a)
        cb, nb = self._src(b)
        self.add(f"{ca} is {cb}", f"{na} is {nb}", c=(CCheck("same", a, b),))

    def length(self, source: Source, value: Any) -> None:
        code, name = self._src(source)
        c = (CCheck("len", source, len(value)),)
        self.add(f"len({code}) == {len(value)}", f"len({name}) == {len(value)}", c=c)

    def dict_keys(self, source: Source, value: dict[Any, Any]) -> None:
        code, name = self._src(source)
        keys = list(value.keys())
        c = (CCheck("keys", source, keys),)
        self.add(f"list({code}.keys()) == {self.ctx.const(keys)}", f"list({name}.keys()) == {keys!r}", c=c)

    def no_instance_attr(self, source: Source, attr: str) -> None:
        code, name = self._src(source)
        c = (CCheck("not_in", AttrSource(source, "__dict__"), attr),)
        self.add(f"{attr!r} not in {code}.__dict__", f"{name} has no attribute {attr!r} of its own", c=c)

    def no_module_attr(self, source: Source, attr: str) -> None:
        code, name = self._src(source)
        dicts = ("__dict__", "_parameters", "_buffers", "_modules")
        where = " or ".join(f"{attr!r} in {code}.{d}" for d in dicts)
        c = tuple(CCheck("not_in", AttrSource(source, d), attr) for d in dicts)
        self.add(f"not ({where})", f"{name} has no attribute {attr!r}", c=c)

    def not_registered(self, source: Source, attr: str, dicts: tuple[str, ...]) -> None:
        """`attr` is a key of none of the module's registries `dicts` (`_parameters`, ...)."""
        code, name = self._src(source)
        where = " or ".join(f"{attr!r} in {code}.{d}" for d in dicts)
        c = tuple(CCheck("not_in", AttrSource(source, d), attr) for d in dicts)
        self.add(f"not ({where})", f"{name} has no {attr!r} in {', '.join(dicts)}", c=c)

    def no_hooks(self, source: Source, instance_forward: bool = False) -> None:
        """No forward or backward hooks, and a forward of the instance's own only if there was one."""
        code, name = self._src(source)
        names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
        hooks = " or ".join(f"{code}.{h}" for h in names)
        c = tuple(CCheck("falsy", AttrSource(source, h)) for h in names)
        if instance_forward:
            self.add(f"not ({hooks})", f"{name} has no forward or backward hooks", c=c)
            return
        self.add(
            f"not ({hooks} or 'forward' in {code}.__dict__)",
            f"{name} has no forward or backward hooks and no forward of its own",
            c=(*c, CCheck("not_in", AttrSource(source, "__dict__"), "forward")),
        )

    def no_backward_hooks(self, source: Source) -> None:
        """No backward hooks (a module whose forward hooks are traced: Note [Forward hooks])."""
        code, name = self._src(source)
        self.add(
            f"not ({code}._backward_hooks or {code}._backward_pre_hooks)", f"{name} has no backward hooks"
        )

    def tensor(self, source: Source, t: torch.Tensor, fake: torch.Tensor | None = None) -> None:
        """Type, dtype, device, requires_grad, and the sizes and strides that stay static (all
        of them unless `fake` has symbolic ones: those are the ShapeEnv's, `shape_guards`)."""
        code, name = self._src(source)
        if fake is not None and shapes.is_symbolic_tensor(fake):
            explain = self._tensor_meta(code, name, t)
            explain += [(c, r.replace(code, name)) for c, r in shapes.tensor_shape_guards(code, t, fake)]
            self.add(" and ".join(f"({c})" for c, _ in explain), explain=explain)
            return
        sizes, strides = shapes.sizes_of(t), shapes.strides_of(t)
        keys = dispatch_keys(t)
        spec = (type(t), t.dtype, t.device, t.requires_grad, sizes, strides, keys)
        k = self.ctx.const(dispatch_keys)
        fast = (
            f"(type({code}), {code}.dtype, {code}.device, {code}.requires_grad, {code}.shape, {code}.stride(), "
            f"{k}({code})) == "
        )
        explain = [
            (f"type({code}) is {self.ctx.const(type(t))}", f"type({name}) is {type(t).__qualname__}"),
            (f"{code}.dtype == {self.ctx.const(t.dtype)}", f"{name}.dtype == {t.dtype}"),
            (f"{code}.device == {self.ctx.const(t.device)}", f"{name}.device == {str(t.device)!r}"),
            (f"{code}.requires_grad is {t.requires_grad}", f"{name}.requires_grad == {t.requires_grad}"),
        ]
        explain += [(c, r.replace(code, name)) for c, r in shapes.tensor_shape_guards(code, t)]
        explain.append((f"{k}({code}) == {keys}", f"{name} dispatches as {torch._C._dispatch_keys(t)}"))
        # arg2: the key set as torch gives it, which the C tree compares without the int conversion
        check = CCheck("tensor", source, spec, torch._C._dispatch_keys(t))
        self.add(fast + self.ctx.const(spec), explain=explain, c=(check,))

    def _tensor_meta(self, code: str, name: str, t: torch.Tensor) -> list[tuple[str, str]]:
        return [
            (f"type({code}) is {self.ctx.const(type(t))}", f"type({name}) is {type(t).__qualname__}"),
            (f"{code}.dtype == {self.ctx.const(t.dtype)}", f"{name}.dtype == {t.dtype}"),
            (f"{code}.device == {self.ctx.const(t.device)}", f"{name}.device == {str(t.device)!r}"),
            (f"{code}.requires_grad is {t.requires_grad}", f"{name}.requires_grad == {t.requires_grad}"),
        ]

    def shape_guards(self, ctx: shapes.ShapeContext) -> None:
        """The ShapeEnv's guards of this capture (duck sizes, branches on sizes, ranges, symbolic
        strides), each a check of its own with the user's line that caused it."""
        from kiln_symbolic import pexpr

        def code_of(key: shapes.SizeKey | shapes.ScalarKey) -> str:
            if isinstance(key, shapes.ScalarKey):
                return self.ctx.bind(key.source)
            return f"{self.ctx.bind(key.source)}.size({key.dim})"

        def name_of(key: shapes.SizeKey | shapes.ScalarKey) -> str:
            if isinstance(key, shapes.ScalarKey):
                return key.source.name()
            return f"{key.source.name()}.size({key.dim})"

        env = ctx.env
        codes = ctx.guard_texts(code_of)
        names = ctx.guard_texts(name_of)
        keep = self.where
        for (code, where), (readable, _) in zip(codes, names, strict=True):
            self.where = where
            self.add(code, readable)
        code_names = {s: code_of(srcs[0]) for s, srcs in env.var_to_sources.items()}  # type: ignore[arg-type]
        read_names = {s: name_of(srcs[0]) for s, srcs in env.var_to_sources.items()}  # type: ignore[arg-type]
        for source, fake in ctx.dynamic_inputs:
            code, name = self._src(source)
            self.where = f"strides of {name}"
            for dim, expr in shapes.symbolic_stride_guards(fake):
                e = env.replace(expr)
                self.add(
                    f"{code}.stride({dim}) == {pexpr(e, code_names)}",
                    f"{name}.stride({dim}) == {pexpr(e, read_names)}",
                )
        self.where = keep

    def compile_key(self, active: object, key: object, label: str) -> None:
        """The compile running now is the one that made this entry (Note [The compile key in
        every guard] in backends.py); checked first, before anything else is read."""
        part = GuardPart(
            f"{self.ctx.const(active)}.key is {self.ctx.const(key)}",
            (
                (
                    f"{self.ctx.const(active)}.key is {self.ctx.const(key)}",
                    f"the running compile() is {label}",
                ),
            ),
            "the compile() that made this entry",
            (CCheck("is", AttrSource(ConstSource(active, "ACTIVE"), "key"), key),),
        )
        self.items.insert(0, part)

    def absent_from(self, mapping: dict[str, Any], label: str, name: str) -> None:
        """`name` is not a key of `mapping` (a builtin stays unshadowed by a global of its name)."""
        code = f"{name!r} not in {self.ctx.const(mapping)}"
        c = (CCheck("not_in", ConstSource(mapping, label), name),)
        self.add(code, f"{label} has no {name!r} (it would shadow the builtin)", c=c)

    def empty_dicts(self, dicts: tuple[dict[Any, Any], ...], readable: str) -> None:
        """Dicts that the program fills in place (torch's global module hook registries) are
        still empty: one truth test each."""
        c = tuple(CCheck("falsy", ConstSource(d, readable)) for d in dicts)
        self.add("not (" + " or ".join(self.ctx.const(d) for d in dicts) + ")", readable, c=c)

    def no_dispatch_modes(self) -> None:
        """No TorchDispatchMode is active when the frame starts (Note [kiln's own FakeMode])."""
        if self.dispatch_modes_recorded:
            return
        self.dispatch_modes_recorded = True
        length = torch._C._len_torch_dispatch_stack
        c = (CCheck("call_eq", None, (length, ()), 0),)
        self.add(f"{self.ctx.const(length)}() == 0", "no torch dispatch mode is active", c=c)

    def setting(self, reader: Any, value: object) -> None:
        """The frame read a torch setting through `reader()`, a function of no arguments, and
        folded its answer `value` (Note [Settings read through torch functions] in
        variables/torch.py): the next call must find the same answer."""
        label = getattr(reader, "__qualname__", None) or repr(reader)
        self.add(
            f"{self.ctx.const(reader)}() == {self.ctx.const(value)}",
            f"torch setting {label}() == {value!r}",
            c=(CCheck("call_eq", None, (reader, ()), value),),
        )

    def inference_mode(self) -> None:
        """The frame read `torch.is_inference_mode_enabled()` (grad mode alone does not tell
        inference mode from no_grad)."""
        if self.inference_mode_recorded:
            return
        self.inference_mode_recorded = True
        on = torch.is_inference_mode_enabled()
        self.add(
            f"{self.ctx.const(torch.is_inference_mode_enabled)}() is {on}",
            f"torch.is_inference_mode_enabled() == {on}",
            c=(CCheck("call_is", None, (torch.is_inference_mode_enabled, ()), on),),
        )

    def global_state(self) -> None:
        """Grad mode and default dtype as they were when the frame started (recorded once)."""
        if self.global_state_recorded:
            return
        self.global_state_recorded = True
        grad = torch.is_grad_enabled()
        self.add(
            f"{self.ctx.const(torch.is_grad_enabled)}() is {grad}",
            f"torch.is_grad_enabled() == {grad}",
            c=(CCheck("call_is", None, (torch.is_grad_enabled, ()), grad),),
        )
        dt = torch.get_default_dtype()
        self.add(
            f"{self.ctx.const(torch.get_default_dtype)}() == {self.ctx.const(dt)}",
            f"torch.get_default_dtype() == {dt}",
            c=(CCheck("call_eq", None, (torch.get_default_dtype, ()), dt),),
        )
        # autocast: one call when it is off (the common case), the state per device when it is on
        any_on = torch._C._is_any_autocast_enabled()
        self.add(
            f"{self.ctx.const(torch._C._is_any_autocast_enabled)}() is {any_on}",
            f"autocast {'enabled' if any_on else 'disabled'} on every device",
            c=(CCheck("call_is", None, (torch._C._is_any_autocast_enabled, ()), any_on),),
        )
        if any_on:
            for device in ("cpu", "cuda"):
                on, dtype = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
                self.add(
                    f"{self.ctx.const(torch.is_autocast_enabled)}({device!r}) is {on} and "
                    f"{self.ctx.const(torch.get_autocast_dtype)}({device!r}) == {self.ctx.const(dtype)}",
                    f"torch.is_autocast_enabled({device!r}) == {on} and autocast dtype == {dtype}",
                    c=(
                        CCheck("call_is", None, (torch.is_autocast_enabled, (device,)), on),
                        CCheck("call_eq", None, (torch.get_autocast_dtype, (device,)), dtype),
                    ),
                )


_PLAIN_CONSTANT_TYPES = (int, str, bool, type(None))


def is_plain_constants(value: tuple[Any, ...] | list[Any]) -> bool:
    """Items whose repr is their value and whose `==` is exact (no NaN, no zero float: Note
    [Guards on NaN and signed zeros]), at most 16 of them."""
    return len(value) <= 16 and all(
        type(v) in _PLAIN_CONSTANT_TYPES or (type(v) is float and not _needs_same_float(v)) for v in value
    )


@dataclass(slots=True)
class Guard:
    """The compiled check of one cache entry, with what is needed to explain a failure."""

    fn: Callable[..., bool]
    parts: list[GuardPart]
    source: str
    items: list[str | GuardPart]
    consts: list[object]
    globals_dict: dict[str, Any] | None
    n_entries: int
    _explain: Callable[..., Any] | None = None
    tree: Any = None  # the kiln_frame_hook.GuardTree compiled from the same checks, or None
    residual_parts: int = 0  # parts the tree leaves to a residual Python guard
    # a lock the entry's code releases: a passing guard returns holding it (Note [Effects under
    # a lock replayed under it] in variables/locks.py)
    lock: Any = None

    def __call__(self, *entry_values: Any) -> bool:
        check = self.tree if self.tree is not None else self.fn
        if self.lock is not None:
            return take_lock_if(self.lock, check, entry_values)
        return bool(check(*entry_values))

    def __repr__(self) -> str:
        return f"<kiln guard of {len(self.parts)} checks>"

    def for_hook(self) -> Any:
        """What the frame hook's cache entry holds: the C tree (whose `reference` is this guard),
        or this guard when C guards are off. The tree is handed over: this guard stops
        referring to it, so that the entry's tree -> guard reference makes no cycle (a cycle
        would keep an evicted entry's memory until the garbage collector runs)."""
        tree, self.tree = self.tree, None
        if tree is None:
            return self
        log = guard_tree.agreement()
        check = tree if log is None else guard_tree.Agreeing(tree, log)
        return check if self.lock is None else LockTakingGuard(check, self.lock)

    def failure_reason(self, entry_values: tuple[Any, ...]) -> str | None:
        """The first failing part on these entry values (readable, with the user's line)."""
        if self._explain is None:
            self._explain = _compile(self.items, self.n_entries, self.consts, self.globals_dict, explain=True)
        result = self._explain(*entry_values)
        if result is None:
            return None
        i, j, raised = result
        part = self.parts[i]
        text = part.explain[j][1] if j >= 0 else part.readable
        return f"{text}{' (raised ' + raised + ')' if raised else ''} [from {part.where}]"


def _compile(
    items: list[str | GuardPart], n: int, consts: list[object], g: dict[str, Any] | None, explain: bool
) -> Callable[..., Any]:
    params = ", ".join(f"L{i}" for i in range(n))
    body: list[str] = []
    k = 0
    for item in items:
        if isinstance(item, str):
            body.append(item)
            continue
        if explain:
            body.append(f"___i = {k}")
            for j, (code, _) in enumerate(item.explain):
                body.append(f"if not ({code}): return ({k}, {j}, '')")
            body.append(f"if not ({item.code}): return ({k}, -1, '')")
        else:
            body.append(f"if not ({item.code}): return False")
        k += 1
    ok = "None" if explain else "True"
    fail = "(___i, -1, type(e).__name__)" if explain else "False"
    lines = "".join(f"            {b}\n" for b in body)
    src = (
        "def ___make(___c, G):\n"
        f"    def ___guard({params}):\n"
        "        ___i = 0\n"
        "        try:\n"
        f"{lines}"
        f"            return {ok}\n"
        "        except Exception as e:\n"
        f"            return {fail}\n"
        "    return ___guard\n"
    )
    # shape guards print `math.inf` bounds and `math.floor(...)` of floats of sizes (kiln_symbolic's
    # Note [Integers of floats of sizes])
    scope: dict[str, Any] = {"math": math}
    exec(compile(src, "<kiln guard>", "exec"), scope)
    fn: Callable[..., Any] = scope["___make"](consts, g)
    fn.__kiln_source__ = src  # type: ignore[attr-defined]
    return fn


# Note [The residual guard's bindings]: the checks the C tree cannot run (a symbolic size's range,
# `2 <= v4.size(1)`; a tensor with symbolic sizes) go to a residual Python guard. It used to
# evaluate every binding of the frame's guard too (`v0 = L0[0]` ... one per source the guard
# reads: 460 for a tiny LLaMA), about 35-50 us a call under dynamic shapes, for three checks that
# read one of them. The tree already loads every bound source, so that a load that raises fails
# the tree as it fails the Python guard (guard_tree.compile_tree); the residual needs only the
# bindings its own checks read, transitively. When the tree could not load some binding (index
# -1), or a line is not a plain `vN = ...` binding, every line is kept, as before.
_BINDING = re.compile(r"^(v\d+) = (.*)$", re.DOTALL)
_NAME = re.compile(r"\bv\d+\b")


def _needed_bindings(items: list[str | GuardPart]) -> list[str | GuardPart]:
    """`items` with only the bindings the guard parts among them read (Note [The residual
    guard's bindings]); all of `items` when a line is not a plain binding."""
    defs: dict[str, str] = {}
    for item in items:
        if isinstance(item, str):
            m = _BINDING.match(item)
            if m is None:
                return items
            defs[m.group(1)] = m.group(2)
    todo = [n for item in items if not isinstance(item, str) for n in _NAME.findall(item.code)]
    need: set[str] = set()
    while todo:
        name = todo.pop()
        if name in need or name not in defs:
            continue
        need.add(name)
        todo.extend(_NAME.findall(defs[name]))
    return [
        item
        for item in items
        if not isinstance(item, str) or ((m := _BINDING.match(item)) is not None and m.group(1) in need)
    ]


def take_lock_if(lock: Any, check: Callable[..., Any], entry_values: tuple[Any, ...]) -> bool:
    """Note [Effects under a lock replayed under it]: True holding `lock` when `check` passes
    with it held; False, not holding it, otherwise. The first check, without the lock, keeps a
    frame that would not reach the block from waiting for it."""
    if not check(*entry_values):
        return False
    lock.acquire()
    try:
        ok = bool(check(*entry_values))
    except BaseException:
        lock.release()
        raise
    if not ok:
        lock.release()
    return ok


class LockTakingGuard:
    """The hook's guard of an entry whose code releases a lock: `reference` is the check."""

    __slots__ = ("lock", "reference")

    def __init__(self, reference: Callable[..., Any], lock: Any) -> None:
        self.reference = reference
        self.lock = lock

    def __call__(self, *entry_values: Any) -> bool:
        return take_lock_if(self.lock, self.reference, entry_values)


def build_guard(
    builder: GuardBuilder, n_entries: int, globals_dict: dict[str, Any], title: str = "?"
) -> Guard:
    """The Python guard of the recorded checks and, unless C guards are off, its C tree
    (guard_tree.py)."""
    builder.items.extend(builder.ctx.drain())
    g = globals_dict if builder.needs_globals else None
    items, consts = list(builder.items), builder.ctx.consts
    fn = _compile(items, n_entries, consts, g, explain=False)
    guard = Guard(fn, builder.parts, fn.__kiln_source__, items, consts, g, n_entries)  # type: ignore[attr-defined]
    if guard_tree.c_guards_enabled():

        def residual(indices: list[int]) -> Callable[..., Any]:
            # the residual parts and the bindings they read (Note [The residual guard's bindings])
            keep, k = set(indices), 0
            out: list[str | GuardPart] = []
            for item in items:
                if isinstance(item, str):
                    out.append(item)
                else:
                    if k in keep:
                        out.append(item)
                    k += 1
            if -1 not in keep:
                out = _needed_bindings(out)
            return _compile(out, n_entries, consts, globals_dict, explain=False)

        bound = list(builder.ctx.cse or ())
        full_text = guards_log.isEnabledFor(logging.INFO)
        guard.tree, guard.residual_parts = guard_tree.build_tree(
            guard.parts, bound, builder.ctx.entry_names, globals_dict, residual, guard, title, full_text
        )
    return guard


def readable_guards(guard: Guard) -> str:
    return "\n".join(f"  {p.readable}    # {p.where}" for p in guard.parts)


def guard_tree_text(guard: Guard) -> str | None:
    """The C tree of a guard as text (KILN_LOG=guards prints it), or None without one."""
    return None if guard.tree is None else str(guard.tree.text)
