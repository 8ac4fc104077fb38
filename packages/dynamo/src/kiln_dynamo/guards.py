"""Guards: one Python function per compiled entry, checking what the capture relied on.

While tracing, each fact the graph depends on is recorded as a `GuardPart`: a Python expression
over the frame's entry values (code), the same check spelled readably (`L['x'].size(0) == 8`),
and the user line that made the capture rely on it. `build_guard` joins the parts of one capture
into the source of one function `def ___guard(L0, L1, ...)` (entry values positionally, in the
frame hook's order), compiles it once, and keeps the parts so that a failure can be explained:
`failure_reason` re-checks the parts one by one (only on the slow path, after the fast function
said no) and returns the first one that fails.

Note [Guard references]: guards must not keep the compiled function alive (the cache sits in
the code object's co_extra, which gc cannot traverse). Identity checks on objects that support
weak references go through a weakref (`___c[k]() is X`); the constant table may hold types,
dtypes, devices and module globals dicts, which outlive the function anyway.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kiln_dynamo import shapes
from kiln_dynamo.source import CodeContext, Source


@dataclass(frozen=True, slots=True)
class GuardPart:
    code: str
    readable: str
    where: str


class GuardBuilder:
    """Collects guard parts, deduplicated, in the order they were first needed."""

    def __init__(self, ctx: CodeContext) -> None:
        self.ctx = ctx
        self.parts: dict[str, GuardPart] = {}
        self.where = "?"
        self.needs_globals = False
        self.global_state_recorded = False

    def add(self, code: str, readable: str | None = None) -> None:
        if code not in self.parts:
            self.parts[code] = GuardPart(code, readable or code, self.where)

    def _src(self, source: Source) -> tuple[str, str]:
        if source.needs_globals():
            self.needs_globals = True
        return source.code(self.ctx), source.name()

    def type_match(self, source: Source, value: object) -> None:
        code, name = self._src(source)
        t = type(value)
        self.add(f"type({code}) is {self.ctx.const(t)}", f"type({name}) is {t.__qualname__}")

    def constant(self, source: Source, value: object) -> None:
        code, name = self._src(source)
        if value is None or isinstance(value, bool):
            self.add(f"{code} is {value!r}", f"{name} is {value!r}")
            return
        self.type_match(source, value)
        if isinstance(value, (int, str)) or (isinstance(value, float) and not math.isnan(value)):
            self.add(f"{code} == {value!r}", f"{name} == {value!r}")
        else:
            self.add(f"{code} == {self.ctx.const(value)}", f"{name} == {value!r}")

    def identity(self, source: Source, value: object) -> None:
        code, name = self._src(source)
        label = (
            getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or type(value).__name__
        )
        try:
            ref: Any = weakref.ref(value)
            self.add(f"{code} is {self.ctx.const(ref)}()", f"{name} is {label}")
        except TypeError:
            self.add(f"id({code}) == {id(value)}", f"{name} is {label}")

    def same_object(self, a: Source, b: Source) -> None:
        ca, na = self._src(a)
        cb, nb = self._src(b)
        self.add(f"{ca} is {cb}", f"{na} is {nb}")

    def length(self, source: Source, value: Any) -> None:
        code, name = self._src(source)
        self.add(f"len({code}) == {len(value)}", f"len({name}) == {len(value)}")

    def dict_keys(self, source: Source, value: dict[Any, Any]) -> None:
        code, name = self._src(source)
        keys = list(value.keys())
        self.add(f"list({code}.keys()) == {self.ctx.const(keys)}", f"list({name}.keys()) == {keys!r}")

    def no_hooks(self, source: Source) -> None:
        code, name = self._src(source)
        self.add(
            f"not ({code}._forward_hooks or {code}._forward_pre_hooks)",
            f"{name} has no forward hooks",
        )

    def tensor(self, source: Source, t: torch.Tensor) -> None:
        code, name = self._src(source)
        self.type_match(source, t)
        self.add(f"{code}.dtype == {self.ctx.const(t.dtype)}", f"{name}.dtype == {t.dtype}")
        self.add(f"{code}.device == {self.ctx.const(t.device)}", f"{name}.device == {str(t.device)!r}")
        self.add(f"{code}.requires_grad is {t.requires_grad}", f"{name}.requires_grad == {t.requires_grad}")
        for c, r in shapes.tensor_shape_guards(code, t):
            self.add(c, r.replace(code, name))

    def global_state(self) -> None:
        """Grad mode and default dtype as they were when the frame started (recorded once)."""
        if self.global_state_recorded:
            return
        self.global_state_recorded = True
        grad = torch.is_grad_enabled()
        self.add(f"{self.ctx.const(torch.is_grad_enabled)}() is {grad}", f"torch.is_grad_enabled() == {grad}")
        dt = torch.get_default_dtype()
        self.add(
            f"{self.ctx.const(torch.get_default_dtype)}() == {self.ctx.const(dt)}",
            f"torch.get_default_dtype() == {dt}",
        )


@dataclass(slots=True)
class Guard:
    """The compiled check of one cache entry, with what is needed to explain a failure."""

    fn: Callable[..., bool]
    parts: list[GuardPart]
    source: str
    consts: list[object]
    globals_dict: dict[str, Any] | None

    def __call__(self, *entry_values: Any) -> bool:
        return self.fn(*entry_values)

    def __repr__(self) -> str:
        return f"<kiln guard of {len(self.parts)} checks>"

    def failure_reason(self, entry_values: tuple[Any, ...]) -> str | None:
        """The first part that fails on these entry values (readable, with the user's line)."""
        n = len(entry_values)
        params = ", ".join(f"L{i}" for i in range(n))
        for part in self.parts:
            src = f"def ___part({params}):\n    return {part.code}\n"
            scope: dict[str, Any] = {"___c": self.consts, "G": self.globals_dict}
            exec(compile(src, "<kiln guard part>", "exec"), scope)
            try:
                ok = scope["___part"](*entry_values)
            except Exception as e:
                return f"{part.readable} (raised {type(e).__name__}) [from {part.where}]"
            if not ok:
                return f"{part.readable} [from {part.where}]"
        return None


def build_guard(builder: GuardBuilder, n_entries: int, globals_dict: dict[str, Any]) -> Guard:
    parts = list(builder.parts.values())
    params = ", ".join(f"L{i}" for i in range(n_entries))
    body = "\n        and ".join(f"({p.code})" for p in parts) or "True"
    src = (
        "def ___make(___c, G):\n"
        f"    def ___guard({params}):\n"
        "        try:\n"
        f"            return bool({body})\n"
        "        except Exception:\n"
        "            return False\n"
        "    return ___guard\n"
    )
    scope: dict[str, Any] = {}
    exec(compile(src, "<kiln guard>", "exec"), scope)
    g = globals_dict if builder.needs_globals else None
    fn = scope["___make"](builder.ctx.consts, g)
    return Guard(fn, parts, src, builder.ctx.consts, g)


def readable_guards(guard: Guard) -> str:
    return "\n".join(f"  {p.readable}    # {p.where}" for p in guard.parts)
