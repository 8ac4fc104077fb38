"""Symbolic sizes in loopir: one table of the graph's size symbols and what each is worth.

Note [Symbolic sizes in loopir]: a graph captured with dynamic shapes carries sizes that are
expressions in the capture's size symbols (`s0`, `s1`; kiln_symbolic makes them). Layouts,
ranges and indices hold those expressions as they are, so the same IR serves every size. Three
kinds of question are asked of a size, and they are answered differently:

- *correctness* (is this dimension 1, are these two sizes equal): only what is provable for every
  value of the symbols counts (`statically_known_*`); anything else takes the general path;
- *heuristics* (fusion scores, bytes moved, thread counts, unroll and tile choices): the size's
  *hint*, its value in the example the graph was captured with (`hint`);
- *run time*: every symbol is bound once per call from the inputs (`sources`: which input's
  size or stride, or which int argument, holds it), and derived sizes are computed from those.

Note [Unbacked sizes in loopir]: a data-dependent size (`u0`, Note [Unbacked sizes] in
kiln_symbolic) is held by no input: the extern kernel that computes it (`nonzero`,
`masked_select`, `.item()`) is its source (`unbacked`: kernel, path into its result, a size of
it or the int itself). The wrapper binds the symbol right after that call; the scheduler never
drops the kernel and runs every node lowered after it after it (a node's loops, layout or body
may name the symbol; nothing lowered before the kernel can). Its hint is the ShapeEnv's
`optimization_hint` (a fallback clamped into the symbol's range), for heuristics; a look-ahead
at a later node's size (`hint`) takes `UNBACKED_HINT` for a `u` symbol not lowered yet.

Nothing here adds a guard: a lowering that would need one declines, and the caller compiles the
graph with static sizes instead. `current()` is the table of the graph being lowered (a graph
with static sizes has an empty one, and `hint` is `int`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from kiln_symbolic import UNBACKED_HINT, expr_of, hint_of, symbol_of
from kiln_symbolic import FloorDiv as ShapeFloorDiv

from .indexing import FloorDiv


@dataclass(frozen=True, slots=True)
class SymbolSource:
    """Where a symbol's value is read at run time: `input` is the graph input's position; `kind`
    is "size" or "stride" (of dimension `dim`), or "int" (the input is the int itself)."""

    input: int
    kind: str
    dim: int = 0


@dataclass(frozen=True, slots=True)
class UnbackedSource:
    """Where a data-dependent size is read at run time (Note [Unbacked sizes in loopir]): from
    the result of extern kernel `kernel`, at `path` inside it; `kind` is "size" (of dimension
    `dim` of that tensor) or "value" (the result is the int itself, an `.item()`)."""

    kernel: str
    path: tuple[int, ...]
    kind: str
    dim: int = 0


@dataclass(slots=True)
class SizeVars:
    """The size symbols of one graph; see the module docstring."""

    hints: dict[sympy.Symbol, int] = field(default_factory=dict)
    sources: dict[sympy.Symbol, SymbolSource] = field(default_factory=dict)
    unbacked: dict[sympy.Symbol, UnbackedSource] = field(default_factory=dict)
    # the ShapeEnv of the data-dependent symbols (its deferred asserts: Note [Checks of
    # data-dependent sizes at run time] in wrapper_support.py)
    shape_env: Any = None

    @property
    def symbolic(self) -> bool:
        return bool(self.hints)

    def add(self, value: Any, source: SymbolSource) -> sympy.Expr:
        """`value` (an int or SymInt) as a loopir expression; a new plain symbol is recorded
        with its hint and, the first time, its source."""
        expr = to_loopir(expr_of(value))
        if isinstance(expr, sympy.Symbol) and expr not in self.sources:
            self.sources[expr] = source
        for sym in expr.free_symbols:
            if sym not in self.hints:
                self.hints[sym] = _symbol_hint(value, sym)
        return expr

    def hint(self, expr: Any) -> int:
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        for sym in expr.free_symbols - self.hints.keys():
            # a data-dependent size not lowered yet (a look-ahead at a later node's size)
            if str(sym).startswith("u"):
                self.hints[sym] = UNBACKED_HINT
        return int(expr.xreplace(dict(self.hints)))

    def statically_known_equals(self, a: Any, b: Any) -> bool:
        return bool(sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0)

    def unbound(self) -> list[sympy.Symbol]:
        """Symbols no input provides as a plain size, stride or int, nor an extern's result."""
        return sorted((s for s in self.hints if s not in self.sources and s not in self.unbacked), key=str)

    def define_unbacked(self, value: Any, source: UnbackedSource) -> sympy.Expr:
        """Note [Unbacked sizes in loopir]: `value` (a SymInt) as a loopir expression; a new
        data-dependent symbol in it is bound to `source`, the extern result that holds it, and
        gets the ShapeEnv's optimization hint (heuristics only)."""
        expr = to_loopir(expr_of(value))
        env = getattr(getattr(value, "node", None), "shape_env", None)
        # the symbol as made, too: `torch._check(m == k)` makes `m` read as `k`, and the check
        # of that fact needs `m`'s own value (Note [Checks of data-dependent sizes at run time])
        for sym in {expr, symbol_of(value)}:
            fresh = isinstance(sym, sympy.Symbol) and sym not in self.sources and sym not in self.unbacked
            if fresh and env is not None and env.is_unbacked(sym):
                self.unbacked[sym] = source
                self.shape_env = env
        for sym in expr.free_symbols:
            if sym not in self.hints:
                self.hints[sym] = _symbol_hint(value, sym)
        return expr

    def defined_by(self) -> dict[sympy.Symbol, str]:
        """The extern kernel that computes each data-dependent symbol."""
        return {s: src.kernel for s, src in self.unbacked.items()}


def _symbol_hint(value: Any, sym: sympy.Symbol) -> int:
    node = getattr(value, "node", None)
    env = getattr(node, "shape_env", None)
    hint = env.hint_of(sym) if env is not None else None
    if hint is None and env is not None and env.is_unbacked(sym):
        hint = env.optimization_hint(sym)  # Note [Unbacked sizes in loopir]
    if hint is None:
        hint = hint_of(value) if isinstance(expr_of(value), sympy.Symbol) else None
    if hint is None:
        raise ValueError(f"size symbol {sym} has no hint (an unbacked size)")
    return int(hint)


def to_loopir(expr: Any) -> sympy.Expr:
    """A capture-side size expression in loopir's index functions (`//` as loopir's FloorDiv)."""
    expr = sympy.sympify(expr)
    if not expr.has(ShapeFloorDiv):
        return expr
    return expr.replace(lambda e: isinstance(e, ShapeFloorDiv), lambda e: FloorDiv(*e.args))


_CURRENT: contextvars.ContextVar[SizeVars | None] = contextvars.ContextVar(
    "kiln_loopir_sizevars", default=None
)
_EMPTY = SizeVars()


def current() -> SizeVars:
    return _CURRENT.get() or _EMPTY


@contextlib.contextmanager
def using(sizevars: SizeVars) -> Iterator[SizeVars]:
    token = _CURRENT.set(sizevars)
    try:
        yield sizevars
    finally:
        _CURRENT.reset(token)


def hint(expr: Any) -> int:
    """`expr`'s value at the graph's size hints (for heuristics only, never for correctness)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    return current().hint(expr)


def is_static(expr: Any) -> bool:
    return bool(sympy.sympify(expr).is_Integer)


def hints_of(exprs: Mapping[Any, Any]) -> dict[Any, int]:
    return {k: hint(v) for k, v in exprs.items()}


def has_symbols(t: torch.Tensor) -> bool:
    """Whether a (fake or meta) tensor's sizes, strides or storage offset hold a size symbol."""
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride(), t.storage_offset()))
