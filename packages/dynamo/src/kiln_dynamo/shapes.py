"""Sizes and strides, in one place: which dims are symbolic, and the guards that keep that sound.

Every tracker that needs a size asks this module. A capture owns one `ShapeContext`: the
`kiln_symbolic.ShapeEnv` of that capture, the compile's `dynamic` mode, and the `FrameState` of
the code object being captured. `fake_layout(t, source)` decides per dim whether the fake tensor
of an input gets a static size or a `torch.SymInt` (the precedence below), and expresses strides
through the sizes (a contiguous `[s0, 3]` has strides `(3, 1)`, a `[4, s1]` has `(s1, 1)`).
`tensor_shape_guards` pins only what stayed static; `shape_guard_texts` renders the ShapeEnv's
guards (duck sizes, recorded branches, ranges) over the input sources once the backend is done.

Per-dim precedence (torch.compile's, DYNAMIC.md §1): `mark_static` → static; `mark_dynamic`
(with its min/max) → a symbol of its own, whatever the mode; `dynamic=False` → static; a Parameter or a module
buffer → static; a dim whose size changed between captures of this frame (automatic dynamic,
`dynamic=None` or `True`) → a symbol of its own; `maybe_mark_dynamic` → a symbol of its own;
`dynamic=True` → a duck-sized symbol; otherwise static. Sizes 0 and 1 always stay static
(Note [0/1 specialization] in kiln_symbolic.shape_env).

Note [Automatic dynamic]: each code object has a `FrameState` mapping each input's source name
to the sizes seen so far (`None` where they differed). Every capture merges what it sees before
deciding, so the capture that a size change triggers already makes that dim symbolic; the
`recompiles` log says which dim went dynamic and why. A frame whose dynamic graph the backend
refused (`DynamicShapesUnsupported`) is marked `static_only` and recompiles per size, as with
`dynamic=False`.

Note [Automatic dynamic under dynamic=True]: the frame state is merged under `dynamic=True` too
(torch keeps `automatic_dynamic_shapes` on there), and a dim that changed gets a symbol of its
own rather than a duck-sized one. Duck sizing only shares a symbol among dims that were equal on
the capture that allocated them; once a recompile has shown that a dim varies, tying it to
whichever other dim has the same value at that moment guesses again. Batch 3 of 3-channel images
after a batch-0 call was duck-sized with the channel dim, the convolution's weight pinned the
channel to 3, and the batch became the constant 3: a third compile at batch 5 that torch does
not make.

The marker attributes are torch's own (`_dynamo_dynamic_indices`, `_dynamo_weak_dynamic_indices`,
`_dynamo_static_indices`, `_dynamo_dynamic_range`), so code written for torch.compile's
`mark_dynamic` works unchanged.

Note [Int inputs]: an int argument of the frame follows torch's `specialize_int=False`: a
guarded constant at first; once a capture sees another value it becomes a `Sym` graph input
(`ShapeContext.int_symbol`) over a symbol of any sign. Ints reached through globals, module
attributes or closures stay constants. A builtin that needs a plain int (`range(n)`) specializes
it with a guard (`n == 3`).
"""

from __future__ import annotations

import logging
import os
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from kiln_symbolic import ConstraintViolation, DimDynamic, ShapeEnv, expr_of, make_symint

from kiln_dynamo.logs import recompiles_log
from kiln_dynamo.source import DictEntrySource, Source

log = logging.getLogger("kiln.dynamo.dynamic")

DynamicMode = bool | None  # torch.compile's `dynamic=`: None automatic, True all, False never


# --- marking (torch's attribute names) --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _DimRange:
    dim: int
    min: int | None
    max: int | None


def _dims(t: torch.Tensor, index: int | list[int] | tuple[int, ...]) -> list[int]:
    idx = [index] if isinstance(index, int) else list(index)
    return [i % t.dim() if t.dim() else i for i in idx]


def mark_dynamic(
    t: torch.Tensor,
    index: int | list[int] | tuple[int, ...],
    *,
    min: int | None = None,
    max: int | None = None,
) -> None:
    """Make these dims of `t` symbolic from the first capture (with an optional range)."""
    for d in _dims(t, index):
        if not hasattr(t, "_dynamo_dynamic_indices"):
            t._dynamo_dynamic_indices = set()  # type: ignore[attr-defined]
        t._dynamo_dynamic_indices.add(d)  # type: ignore[attr-defined]
        if min is not None or max is not None:
            if not hasattr(t, "_dynamo_dynamic_range"):
                t._dynamo_dynamic_range = set()  # type: ignore[attr-defined]
            t._dynamo_dynamic_range.add(_DimRange(d, min, max))  # type: ignore[attr-defined]


def maybe_mark_dynamic(t: torch.Tensor, index: int | list[int] | tuple[int, ...]) -> None:
    """Like `mark_dynamic`, but the program may specialize the dim without complaint."""
    for d in _dims(t, index):
        if not hasattr(t, "_dynamo_weak_dynamic_indices"):
            t._dynamo_weak_dynamic_indices = set()  # type: ignore[attr-defined]
        t._dynamo_weak_dynamic_indices.add(d)  # type: ignore[attr-defined]


def _module_buffer(source: Source) -> bool:
    """Whether `source` reads a module's buffer: `m.inv_freq` resolves through `m._buffers`
    (DictEntrySource, whose name reads as the attribute). The name test alone missed those, so
    under `dynamic=True` LLaMA's rotary `inv_freq` (size head_dim / 2) was duck-sized with a
    sequence length that happened to equal it, and the guard the rotary's `cat` put on the buffer
    pinned the length: a dynamic graph compiled static (twelfth session, tiny LLaMA at length 8)."""
    if isinstance(source, DictEntrySource) and source.dict_attr == "_buffers":
        return True
    return "._buffers[" in source.name()


def mark_static(t: torch.Tensor, index: int | list[int] | tuple[int, ...] | None = None) -> None:
    """Keep these dims (all dims when `index` is None) static whatever the mode."""
    dims = list(range(t.dim())) if index is None else _dims(t, index)
    if not hasattr(t, "_dynamo_static_indices"):
        t._dynamo_static_indices = set()  # type: ignore[attr-defined]
    t._dynamo_static_indices.update(dims)  # type: ignore[attr-defined]


def _marked(t: torch.Tensor, attr: str) -> set[int]:
    return set(getattr(t, attr, ()) or ())


def _marked_range(t: torch.Tensor, dim: int) -> tuple[int | None, int | None]:
    for r in getattr(t, "_dynamo_dynamic_range", ()) or ():
        if getattr(r, "dim", None) == dim:
            return getattr(r, "min", None), getattr(r, "max", None)
    return None, None


# --- automatic dynamic --------------------------------------------------------------------------
@dataclass(slots=True)
class FrameState:
    """Sizes seen per input source name across the captures of one code (Note [Automatic dynamic])."""

    sizes: dict[str, tuple[int | None, ...] | None] = field(default_factory=dict)
    static_only: str | None = None  # why this frame compiles static from now on
    # int arguments symbolic from the first capture under dynamic=None: a loop piece's loop
    # counter, which takes a new value every call (Note [Loop body pieces] in loop_pieces.py)
    dynamic_ints: frozenset[str] = frozenset()

    def merge(self, name: str, sizes: tuple[int, ...], scalar: bool = False) -> set[int]:
        """Record `sizes` for `name`; the dims whose size has differed at some capture. `scalar`:
        `name` is an int argument, recorded as a one-element tuple and logged by its own name."""
        old = self.sizes.get(name, ())
        if name not in self.sizes:
            self.sizes[name] = sizes
            return set()
        if old is None or len(old) != len(sizes):
            self.sizes[name] = None
            return set(range(len(sizes)))
        merged = tuple(a if a == b else None for a, b in zip(old, sizes, strict=True))
        for d, (a, b) in enumerate(zip(old, sizes, strict=True)):
            if a is not None and a != b:
                # KILN_LOG=recompiles tells why the new entry is dynamic; =dynamic too
                what = name if scalar else f"{name}.size({d})"
                for logger in (recompiles_log, log):
                    logger.info("automatic dynamic: marking %s dynamic: %s != %s", what, a, b)
        self.sizes[name] = merged
        return {d for d, v in enumerate(merged) if v is None}


_FRAME_STATES: weakref.WeakKeyDictionary[types.CodeType, FrameState] = weakref.WeakKeyDictionary()


def frame_state(code: types.CodeType) -> FrameState:
    state = _FRAME_STATES.get(code)
    if state is None:
        state = _FRAME_STATES[code] = FrameState()
    return state


def reset_frame_states() -> None:
    _FRAME_STATES.clear()


# --- one capture ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SizeKey:
    """The ShapeEnv's name for an input size: `source.size(dim)`."""

    source: Source
    dim: int

    def __str__(self) -> str:
        return f"{self.source.name()}.size({self.dim})"


@dataclass(frozen=True, slots=True)
class ScalarKey:
    """The ShapeEnv's name for an int argument of the frame."""

    source: Source

    def __str__(self) -> str:
        return self.source.name()


@dataclass(slots=True)
class ShapeContext:
    mode: DynamicMode
    state: FrameState | None
    allowed: bool = True  # False: the backend takes no symbolic sizes (everything static)
    env: ShapeEnv = field(default_factory=ShapeEnv)
    marked: list[tuple[SizeKey, Any]] = field(default_factory=list)  # mark_dynamic dims, symbols
    dynamic_inputs: list[tuple[Source, torch.Tensor]] = field(default_factory=list)  # (source, fake)

    @property
    def static(self) -> bool:
        """Nothing may be symbolic, not even a marked dim."""
        return not self.allowed or (self.state is not None and self.state.static_only is not None)

    def has_symbols(self) -> bool:
        return bool(self.env.var_to_val) or bool(self.env.unbacked)

    @property
    def unbacked_env(self) -> ShapeEnv | None:
        """The env that data-dependent operators take unbacked symbols from, or None when they
        break the graph (Note [Unbacked sizes in capture]): a static-only capture, or
        `KILN_UNBACKED=0`."""
        if self.static or os.environ.get("KILN_UNBACKED", "1") == "0":
            return None
        return self.env

    def _policy(self, t: torch.Tensor, source: Source, auto: set[int], d: int) -> DimDynamic:
        if d in _marked(t, "_dynamo_static_indices"):
            return DimDynamic.STATIC
        if d in _marked(t, "_dynamo_dynamic_indices") and not self.static:
            return DimDynamic.DYNAMIC
        if self.static or self.mode is False:
            return DimDynamic.STATIC
        if isinstance(t, torch.nn.Parameter) or _module_buffer(source):
            return DimDynamic.STATIC
        if d in auto or d in _marked(t, "_dynamo_weak_dynamic_indices"):
            return DimDynamic.DYNAMIC
        if self.mode is True:
            return DimDynamic.DUCK
        return DimDynamic.STATIC

    def fake_layout(self, t: torch.Tensor, source: Source) -> tuple[list[Any], list[Any]] | None:
        """Symbolic sizes and strides for the fake of input `t`, or None when all stay static."""
        sizes = tuple(int(s) for s in t.size())
        auto: set[int] = set()
        if self.state is not None and self.mode is not False and not self.static:  # Note [Automatic dynamic]
            auto = self.state.merge(source.name(), sizes)
        exprs: list[Any] = []
        for d, n in enumerate(sizes):
            how = self._policy(t, source, auto, d)
            lo, hi = _marked_range(t, d) if how is DimDynamic.DYNAMIC else (None, None)
            try:
                exprs.append(self.env.create_symbol(n, SizeKey(source, d), how, min=lo, max=hi))
                if d in _marked(t, "_dynamo_dynamic_indices") and not exprs[-1].is_Integer:
                    self.marked.append((SizeKey(source, d), exprs[-1]))
            except ConstraintViolation as e:
                log.info("%s stays static: %s", SizeKey(source, d), e)
                exprs.append(sympy.Integer(n))
        if all(e.is_Integer for e in exprs):
            return None
        strides = _infer_strides(exprs, sizes, tuple(int(s) for s in t.stride()))
        sym_sizes = [make_symint(self.env, e, n) for e, n in zip(exprs, sizes, strict=True)]
        sym_strides = [make_symint(self.env, e, s) for e, s in zip(strides, t.stride(), strict=True)]
        return sym_sizes, sym_strides

    def int_symbol(self, value: int, source: Source) -> Any:
        """A SymInt for an int argument of the frame, or None when it stays a constant: static
        until its value changes between captures (automatic dynamic), symbolic at once under
        `dynamic=True`; any int, with no 0/1 specialization (Note [Int inputs])."""
        if self.static or self.mode is False:
            return None
        changed = False
        if self.state is not None and self.mode is None:
            changed = (
                bool(self.state.merge(source.name(), (value,), scalar=True))
                or source.name() in self.state.dynamic_ints
            )
        if self.mode is not True and not changed:
            return None
        sym = self.env.create_int_symbol(value, ScalarKey(source))
        return make_symint(self.env, sym, value)

    def specialized_marks(self) -> list[str]:
        """For each `mark_dynamic` dim that the program specialized to a constant, what happened
        and where (torch raises a constraint violation for these; 0 and 1 never get a symbol)."""
        out = []
        for key, sym in self.marked:
            value = self.env.replace(sym)
            if not value.is_Integer:
                continue
            where = next((g.where for g in self.env.guards if sym in g.expr.free_symbols), "?")
            out.append(
                f"you marked {key} as dynamic but the code specialized it to the constant {value} "
                f"(at {where}); remove the mark or use maybe_mark_dynamic"
            )
        return out

    def guard_texts(self, render: Callable[[SizeKey], str]) -> list[tuple[str, str]]:
        """(Python text, where) of every shape guard, sizes rendered by `render`."""
        return [(g.text, g.where) for g in self.env.produce_guards(render)]  # type: ignore[arg-type]


def _infer_strides(exprs: list[Any], sizes: tuple[int, ...], strides: tuple[int, ...]) -> list[Any]:
    """Strides as expressions of the sizes where the real strides are products of inner sizes
    (visiting dims by increasing stride, ties rightmost first); literal otherwise."""
    candidates: dict[int, Any] = {1: sympy.Integer(1)}
    out: list[Any] = [None] * len(sizes)
    for d in sorted(range(len(sizes)), key=lambda i: (strides[i], -i)):
        st = strides[d]
        out[d] = candidates.get(st, sympy.Integer(st))
        candidates.setdefault(st * sizes[d], out[d] * exprs[d])
    return out


def is_symbolic_tensor(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in t.size()) or any(
        isinstance(s, torch.SymInt) for s in t.stride()
    )


def sizes_of(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.size())


def strides_of(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.stride())


def tensor_shape_guards(
    expr: str, t: torch.Tensor, fake: torch.Tensor | None = None
) -> list[tuple[str, str]]:
    """(code, readable) guard parts pinning the rank and every static size and stride of the
    tensor at `expr`; symbolic ones are left to the ShapeEnv's guards (`shape_guard_texts`)."""
    sizes = tuple(int(s) for s in t.size())
    strides = tuple(int(s) for s in t.stride())
    parts = [(f"{expr}.dim() == {len(sizes)}", f"{expr}.dim() == {len(sizes)}")]
    if fake is None or not is_symbolic_tensor(fake):
        parts.append(
            (
                f"{expr}.shape == {sizes!r}",
                " and ".join(f"{expr}.size({i}) == {s}" for i, s in enumerate(sizes)) or f"{expr}.dim() == 0",
            )
        )
        parts.append((f"{expr}.stride() == {strides!r}", f"{expr}.stride() == {strides!r}"))
        return parts
    for i, s in enumerate(fake.size()):
        if not isinstance(s, torch.SymInt):
            parts.append((f"{expr}.size({i}) == {s}", f"{expr}.size({i}) == {s}"))
    for i, s in enumerate(fake.stride()):
        if not isinstance(s, torch.SymInt):
            parts.append((f"{expr}.stride({i}) == {s}", f"{expr}.stride({i}) == {s}"))
    return parts


def symbolic_stride_guards(fake: torch.Tensor) -> list[tuple[int, Any]]:
    """(dim, expression) of each symbolic stride (to be checked against the sizes)."""
    return [(i, expr_of(s)) for i, s in enumerate(fake.stride()) if isinstance(s, torch.SymInt)]
