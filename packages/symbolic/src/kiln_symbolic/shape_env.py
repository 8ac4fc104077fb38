"""The ShapeEnv: symbols for sizes, what is known about them, and the guards that capture made.

One ShapeEnv lives for one capture of a frame. It hands out a sympy symbol per dynamic input
size (`create_symbol`), with the value seen in this run as its *hint* and a value range (sizes
start at `[2, oo]`: Note [0/1 specialization]). Every branch that capture, a meta kernel or a
decomposition takes on a symbolic value reaches `evaluate_expr`: when the ranges and the known
replacements settle the question statically the answer costs nothing; otherwise the answer is the
hint's, and the condition that made it so is recorded as a `ShapeGuard` (with the user's line
that asked) so that a later call whose sizes would answer differently misses the cache entry.
Recorded equalities become replacements (`Eq(s1, s0)` makes `s1` read as `s0` everywhere),
inequalities with one symbol tighten its range.

`produce_guards(render)` turns all of it into Python conditions over the frame's inputs:
(1) each tracked input whose expression is not its own symbol's first source is pinned to the
expression (`L['y'].size(0) == L['x'].size(0)` for duck sizing and replacements), (2) the recorded
guards that are not yet implied, (3) the range of every remaining symbol (`2 <= L['x'].size(0)`).
After the backend compiled, dynamo calls it and `freeze()`s the env.

Note [0/1 specialization]: sizes 0 and 1 are never symbolic. Broadcasting and contiguity
branch on "is this dim 1?" everywhere; with size symbols known to be >= 2, those branches are
answered statically, and the range guard `2 <= size` sends a size-0 or size-1 input to its own
static entry. Python ints made symbolic (`create_int_symbol`) do not specialize and have no range.

Note [Unbacked sizes]: an unbacked symbol (`u0`) is a size or int that depends on tensor data:
the row count of `nonzero`, of a boolean-mask selection, an `.item()`. It has no hint. A
question about it that the ranges settle costs nothing (`u0 >= 0` for a size-like one, `u0 <=
12` for the nonzero of 12 elements); any other branch raises `GuardOnDataDependent` unless the
caller gave a fallback (`guard_or_false`), and capture turns that into a graph break naming the
line. `expect_true` (`torch._check`) records a runtime assertion instead of a guard
(`deferred_asserts`) and narrows the range, so `torch._check(n >= 0)` makes `n` size-like. No
guard ever mentions an unbacked symbol: the graph computes it, the inputs do not hold it.
Heuristics read `optimization_hint` (the fallback `UNBACKED_HINT` clamped into the range).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import sympy

from kiln_symbolic.functions import FloorDiv
from kiln_symbolic.printer import pexpr
from kiln_symbolic.ranges import ValueRange, bound, decide

log = logging.getLogger("kiln.symbolic.dynamic")
oo = sympy.oo
# Note [Unbacked sizes]: the value heuristics assume for a data-dependent size (torch's inductor
# uses the same number): large enough that a kernel over it is parallel, never read for correctness
UNBACKED_HINT = 8192


class DimDynamic(enum.Enum):
    STATIC = "static"  # the value itself
    DUCK = "duck"  # a symbol, shared by every dim of the same value
    DYNAMIC = "dynamic"  # a symbol of its own
    UNBACKED = "unbacked"  # a symbol without a hint


class GuardOnDataDependent(RuntimeError):
    """A branch on a size that depends on tensor data (an unbacked symbol)."""


class ConstraintViolation(RuntimeError):
    """A dim marked dynamic with a range that the value or the program contradicts."""


@dataclass(frozen=True, slots=True)
class ShapeGuard:
    expr: Any  # a sympy boolean
    where: str  # the user's line that asked


@dataclass(frozen=True, slots=True)
class RenderedGuard:
    text: str
    where: str


def _is_bool(expr: Any) -> bool:
    # not sympy's Boolean: a Symbol is one too
    return isinstance(
        expr,
        (
            sympy.core.relational.Relational,
            sympy.logic.boolalg.BooleanFunction,
            sympy.logic.boolalg.BooleanAtom,
        ),
    )


def to_python(value: Any) -> int | float | bool:
    if value is sympy.true or value is True:
        return True
    if value is sympy.false or value is False:
        return False
    if isinstance(value, (bool, int, float)):
        return value
    if value.is_Integer:
        return int(value)
    return float(value)


def _non_decreasing(expr: Any, sym: sympy.Symbol) -> bool:
    """Whether `expr` (over `sym` alone) never decreases as `sym` grows: constants, `sym`, sums of
    such, their multiples by non-negative numbers, and their floor divisions by positive
    integers (Note [Lower bounds through floor divisions])."""
    if expr.is_number:
        return True
    if expr == sym:
        return True
    if isinstance(expr, sympy.Add):
        return all(_non_decreasing(a, sym) for a in expr.args)
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        return bool(coeff.is_nonnegative) and not isinstance(rest, sympy.Mul) and _non_decreasing(rest, sym)
    if isinstance(expr, FloorDiv):
        divisor = expr.args[1]
        return bool(divisor.is_Integer and divisor > 0) and _non_decreasing(expr.args[0], sym)
    return False


class ShapeEnv:
    def __init__(self, specialize_zero_one: bool = True, duck_shape: bool = True) -> None:
        self.specialize_zero_one = specialize_zero_one
        self.duck_shape = duck_shape
        self.var_to_val: dict[sympy.Symbol, int] = {}
        self.var_to_range: dict[sympy.Symbol, ValueRange] = {}
        self.var_to_sources: dict[sympy.Symbol, list[Hashable]] = {}
        self.tracked: list[tuple[Hashable, Any]] = []  # (input source, expression at creation)
        self.val_to_var: dict[int, sympy.Symbol] = {}
        self.replacements: dict[sympy.Symbol, Any] = {}
        self.guards: list[ShapeGuard] = []
        self.deferred_asserts: list[ShapeGuard] = []
        self.unbacked: set[sympy.Symbol] = set()
        self.specialized: list[tuple[Hashable, int, str]] = []  # (source, value, why)
        self.frozen = False
        self._answers: dict[Any, Any] = {}  # Note [Answers already given]
        self._min_max: dict[tuple[Any, ...], Any] = {}  # min_max's answers
        self._replaced: dict[Any, Any] = {}  # replace's answers under the current replacements
        self.where: Callable[[], str] = lambda: "?"  # the user's line now (capture sets it)
        self._counter = 0

    # --- creating symbols ---------------------------------------------------------------------
    def _new_symbol(self, prefix: str, **assumptions: bool) -> sympy.Symbol:
        sym = sympy.Symbol(f"{prefix}{self._counter}", integer=True, **assumptions)
        self._counter += 1
        return sym

    def create_symbol(
        self,
        hint: int,
        source: Hashable,
        dynamic: DimDynamic = DimDynamic.DUCK,
        min: int | None = None,
        max: int | None = None,
        why: str = "",
    ) -> Any:
        """A size of `hint` at `source`: an integer when static or 0/1, else a size symbol."""
        if dynamic is DimDynamic.STATIC:
            return sympy.Integer(hint)
        if dynamic is DimDynamic.UNBACKED:
            raise ValueError("use create_unbacked_symbol for unbacked sizes")
        if self.specialize_zero_one and hint in (0, 1):
            self.specialized.append((source, hint, "0/1 specialization"))
            log.info("specialize %s = %d (sizes 0 and 1 are never symbolic)", source, hint)
            return sympy.Integer(hint)
        if (
            dynamic is DimDynamic.DUCK
            and self.duck_shape
            and hint in self.val_to_var
            and min is None
            and max is None
        ):
            sym = self.val_to_var[hint]
            self.var_to_sources[sym].append(source)
            self.tracked.append((source, sym))
            log.info("duck size %s = %s (same value %d)", source, sym, hint)
            return self.replace(sym)
        lower = 2 if self.specialize_zero_one else 0
        r = ValueRange(sympy.Integer(lower), oo)
        if min is not None or max is not None:
            r = r.intersect(
                ValueRange(
                    sympy.Integer(min) if min is not None else -oo,
                    sympy.Integer(max) if max is not None else oo,
                )
            )
            if not r.contains(hint):
                raise ConstraintViolation(f"{source} is {hint}, outside its marked range {r}")
        if r.is_singleton():
            return sympy.Integer(hint)
        sym = self._new_symbol("s", positive=self.specialize_zero_one, nonnegative=True)
        self.var_to_val[sym] = hint
        self.var_to_range[sym] = r
        self.var_to_sources[sym] = [source]
        self.tracked.append((source, sym))
        if dynamic is DimDynamic.DUCK and hint not in self.val_to_var:
            self.val_to_var[hint] = sym
        log.info("create_symbol %s = %d for %s %s%s", sym, hint, source, r, f" ({why})" if why else "")
        return sym

    def create_int_symbol(self, hint: int, source: Hashable) -> sympy.Symbol:
        """A Python int input made symbolic: any integer, no 0/1 specialization."""
        sym = self._new_symbol("s")
        self.var_to_val[sym] = hint
        self.var_to_range[sym] = ValueRange.unknown()
        self.var_to_sources[sym] = [source]
        self.tracked.append((source, sym))
        log.info("create_symbol %s = %d for int %s", sym, hint, source)
        return sym

    def create_unbacked_symbol(self, size_like: bool = True, max: Any = None, why: str = "") -> sympy.Symbol:
        """A size that depends on tensor data (Note [Unbacked sizes]): no hint, a range of
        `[0, max]` when `size_like` (`max` may be an expression of backed symbols), any integer
        otherwise (an `.item()` before `torch._check_is_size`)."""
        # no `nonnegative=False` assumption: sympy would read it as "negative"
        sym = self._new_symbol("u", nonnegative=True) if size_like else self._new_symbol("u")
        self.unbacked.add(sym)
        r = ValueRange(sympy.Integer(0), oo) if size_like else ValueRange.unknown()
        if max is not None:
            upper = bound(sympy.sympify(max), self.var_to_range).upper
            if upper.is_finite:
                r = r.intersect(ValueRange(-oo, upper))
        self.var_to_range[sym] = r
        log.info("create_unbacked_symbol %s %s%s at %s", sym, r, f" ({why})" if why else "", self.where())
        return sym

    def optimization_hint(self, expr: Any, fallback: int = UNBACKED_HINT) -> int:
        """A value of `expr` for heuristics only: the hints, with each unbacked symbol at
        `fallback` clamped into its range (Note [Unbacked sizes])."""
        expr = self.replace(expr)
        subs: dict[Any, Any] = {}
        for s in expr.free_symbols:
            if s in self.unbacked:
                r = self.var_to_range.get(s, ValueRange.unknown())
                v = fallback
                if r.upper.is_finite:
                    v = min(v, int(r.upper))
                if r.lower.is_finite:
                    v = max(v, int(r.lower))
                subs[s] = sympy.Integer(v)
            elif s in self.var_to_val:
                subs[s] = sympy.Integer(self.var_to_val[s])
        value = expr.xreplace(subs)
        return int(value) if value.is_number else fallback

    def constrain_range(self, sym: sympy.Symbol, min: int | None, max: int | None) -> None:
        r = ValueRange(
            sympy.Integer(min) if min is not None else -oo, sympy.Integer(max) if max is not None else oo
        )
        self._set_range(sym, self.var_to_range.get(sym, ValueRange.unknown()).intersect(r))

    # --- what is known ------------------------------------------------------------------------
    def replace(self, expr: Any) -> Any:
        expr = sympy.sympify(expr)
        if not self.replacements:
            return expr
        # every SymNode reads its expression through here, and sympy walks the whole tree each
        # time: a capture of ConvNeXt under `dynamic=True` spent 37 s in 175,000 calls. The
        # answers are kept until the replacements change (`_set_replacement` clears them).
        found = self._replaced.get(expr)
        if found is None:
            found = self._replaced[expr] = expr.xreplace(self.replacements) if expr.free_symbols else expr
        return found

    def simplify(self, expr: Any) -> Any:
        expr = self.replace(expr)
        if _is_bool(expr) or not isinstance(expr, sympy.Expr):
            return expr
        return sympy.expand(expr) if expr.is_Add or expr.is_Mul else expr

    def min_max(self, is_max: bool, a: Any, b: Any) -> Any:
        """`Max(a, b)` (or `Min`), settled by the ranges where they order the two (below). sympy's
        own `Max` constructor is slow (it compares its arguments itself): ConvNeXt's capture under
        `dynamic=True` built 1,850 of them for 30 s, so the answer is looked up first, per pair
        and per guard count (a new guard may narrow a range and settle an open pair)."""
        a, b = sympy.sympify(a), sympy.sympify(b)
        if a.is_number and b.is_number:
            return max(a, b) if is_max else min(a, b)
        key = (is_max, a, b, len(self.guards))
        found = self._min_max.get(key)
        if found is None:
            found = self.settle_min_max((sympy.Max if is_max else sympy.Min)(a, b, evaluate=False))
            if isinstance(found, (sympy.Max, sympy.Min)):
                found = found.func(*found.args)  # open: sympy's own form
            self._min_max[key] = found
        return found

    def settle_min_max(self, expr: Any) -> Any:
        """Note [Max and Min settled by ranges]: `Max(a, b)` is `a` when `a >= b` holds for every
        value the ranges allow, and likewise for `Min`; no guard either way. torch's contiguous
        strides are `max(1, size)` products (`Max(1, s2 // 2)` for a convolution's output over
        an `s2 x s2` image): left in, every kernel reading that buffer indexed through
        `std::max` in its inner loop, and the buffer's storage size was no product of its sizes,
        so the wrappers took the general (flat) path. Ranges only narrow during a capture, so
        an answer settled now holds for the whole graph."""
        if not isinstance(expr, (sympy.Max, sympy.Min)) or len(expr.args) != 2:
            return expr
        a, b = expr.args
        for x, y in ((a, b), (b, a)):
            if self._maybe_evaluate_static(sympy.Ge(x, y)) is sympy.true:  # x >= y everywhere
                return x if isinstance(expr, sympy.Max) else y
        return expr

    def hint_of(self, expr: Any) -> int | float | bool | None:
        """The value of `expr` in this run (None when an unbacked symbol is in it)."""
        expr = self.replace(expr)
        free = expr.free_symbols
        if free & self.unbacked:
            return None
        value = expr.xreplace({s: sympy.Integer(self.var_to_val[s]) for s in free if s in self.var_to_val})
        if _is_bool(value):
            value = sympy.simplify(value)
        return to_python(value)

    def is_unbacked(self, expr: Any) -> bool:
        return bool(sympy.sympify(expr).free_symbols & self.unbacked)

    def checked_unbacked(self) -> set[sympy.Symbol]:
        """The data-dependent symbols some `torch._check` fact mentions (Note [Checks of
        data-dependent sizes at run time] in kiln_loopir): the operators that compute them stay
        in the graph even when a replacement made their results unused (`torch._check(m == k)`
        makes `m` read as `k`; the check still needs `m`)."""
        return {s for g in self.deferred_asserts for s in g.expr.free_symbols if s in self.unbacked}

    def _maybe_evaluate_static(self, expr: Any) -> Any:
        """The value of `expr` when ranges and replacements settle it (a sympy value), else None."""
        expr = self.simplify(expr)
        if expr.is_number if isinstance(expr, sympy.Expr) else expr in (sympy.true, sympy.false):
            return expr
        if _is_bool(expr):
            expr = self._drop_mods(expr)
            answer = decide(expr, self.var_to_range)
            if answer is None:
                answer = self._decide_shifted(expr)
            return None if answer is None else sympy.true if answer else sympy.false
        r = bound(expr, self.var_to_range)
        return r.lower if r.is_singleton() else None

    def _provable(self, rel: Any) -> bool:
        return decide(rel, self.var_to_range) is True or self._decide_shifted(rel) is True

    def _drop_mods(self, rel: Any) -> Any:
        """`a % d` is `a` itself when `0 <= a < d` is provable (`s0 % (s0 + 1)`, `1 % s0`)."""
        mods = [m for m in rel.atoms(sympy.Mod) if not m.args[1].is_Integer]
        subs = {
            m: m.args[0]
            for m in mods
            if self._provable(sympy.Ge(m.args[0], 0)) and self._provable(sympy.Lt(m.args[0], m.args[1]))
        }
        return rel.xreplace(subs) if subs else rel

    def _decide_shifted(self, rel: Any) -> bool | None:
        """Note [Deciding relations over size ranges]: re-express each symbol with a finite lower
        bound L as L + t (t >= 0), so that sympy's sign reasoning sees e.g. `s0*s1 - s0 >= 0` as
        `t1 + t0*t1 + ... >= 0`, and `s0 - s0**2` (s0 >= 2) as `-2 - 3*t - t**2`, never 0.

        A remainder `a % d` by a divisor provably >= 1 lies in [0, d - 1]; it is relaxed to a
        fresh `v >= 0`, and separately to `d - 1 - u` with `u >= 0`. Each relaxation covers every
        value the remainder can take (and more), so an answer proved under either one is the
        answer for the remainder too: `s1 % s0 < s0` and `s1 % s0 >= 0` need no guard."""
        if not isinstance(rel, sympy.core.relational.Relational):
            return None
        diff = rel.lhs - rel.rhs
        mods = [m for m in diff.atoms(sympy.Mod) if bound(m.args[1], self.var_to_range).lower >= 1]
        if not mods:
            return self._decide_shifted_diff(rel, diff)
        for k, m in enumerate(mods):
            low = sympy.Symbol(f"_v{k}", integer=True, nonnegative=True)
            high = m.args[1] - 1 - sympy.Symbol(f"_u{k}", integer=True, nonnegative=True)
            for relaxed in (diff.xreplace({m: low}), diff.xreplace({m: high})):
                if relaxed.has(sympy.Mod):
                    continue
                answer = self._decide_shifted_diff(rel, relaxed)
                if answer is not None:
                    return answer
        return None

    def _decide_shifted_diff(self, rel: Any, diff: Any) -> bool | None:
        subs = {}
        for s in diff.free_symbols:
            if s.name.startswith(("_v", "_u")) and s.is_nonnegative:
                continue  # a relaxed remainder, already >= 0
            r = self.var_to_range.get(s)
            if r is None or not r.lower.is_finite:
                return None
            subs[s] = r.lower + sympy.Symbol(f"_t_{s.name}", integer=True, nonnegative=True)
        shifted = sympy.expand(diff.xreplace(subs))
        nonneg, pos, neg = shifted.is_nonnegative, shifted.is_positive, shifted.is_negative
        if isinstance(rel, (sympy.Eq, sympy.Ne)):
            if pos or neg:
                return isinstance(rel, sympy.Ne)
            if shifted.is_zero:
                return isinstance(rel, sympy.Eq)
            return None
        if isinstance(rel, sympy.Ge):
            return True if nonneg else (False if neg else None)
        if isinstance(rel, sympy.Gt):
            return True if pos else (False if shifted.is_nonpositive else None)
        if isinstance(rel, sympy.Le):
            return True if shifted.is_nonpositive else (False if pos else None)
        return True if neg else (False if nonneg else None)  # Lt

    def statically_known_true(self, expr: Any) -> bool:
        return self._maybe_evaluate_static(expr) is sympy.true

    # --- the heart: answering a question and guarding the answer ------------------------------
    def evaluate_expr(self, expr: Any, hint: Any = None, fallback: bool | None = None) -> Any:
        """The Python value of `expr` (a sympy expression or relation) in this run. Statically
        settled answers cost nothing; otherwise the hint answers and a guard is recorded."""
        expr = sympy.sympify(expr)
        # Note [Answers already given]: a question settled once (statically, or by a guard that
        # is already recorded) has the same answer for the rest of the capture: ranges only
        # narrow and a recorded guard holds on every call that reaches this graph. Without the
        # memo, each meta kernel on the way asked the same contiguity or broadcast question again
        # (a small CNN under `dynamic=True`: one guard recorded 19 times, ~180 guards in all).
        key = self.simplify(expr)
        if (known := self._answers.get(key)) is not None:
            return known
        static = self._maybe_evaluate_static(expr)
        if static is not None:
            self._answers[key] = to_python(static)
            return self._answers[key]
        expr = key
        if self.is_unbacked(expr):
            if fallback is not None:
                return fallback
            raise GuardOnDataDependent(
                f"could not guard on data-dependent expression {expr} (a size that depends on tensor "
                "data); use torch._check or guard_or_false/guard_or_true"
            )
        value = hint if hint is not None else self.hint_of(expr)
        assert value is not None
        guard = (expr if value else sympy.Not(expr)) if _is_bool(expr) else sympy.Eq(expr, value)
        self.add_guard(guard)
        value = to_python(value) if not isinstance(value, (bool, int, float)) else value
        if not self.frozen:  # a dropped guard must be asked again (and warned about again)
            self._answers[key] = value
        return value

    def add_guard(self, guard: Any, where: str | None = None) -> None:
        where = where if where is not None else self.where()
        if self.frozen:
            log.warning("ignored guard %s after the shape env was frozen (at %s)", guard, where)
            return
        self.guards.append(ShapeGuard(guard, where))
        log.info("eval %s [guard added] at %s", guard, where)
        self._refine(guard)

    def expect_true(self, expr: Any) -> bool:
        """`torch._check(cond)`: a guard when backed, a runtime assertion when data-dependent."""
        expr = self.simplify(sympy.sympify(expr))
        static = self._maybe_evaluate_static(expr)
        if static is not None:
            if static is sympy.false:
                raise ConstraintViolation(f"{expr} is statically false")
            return True
        if self.is_unbacked(expr):
            self.deferred_asserts.append(ShapeGuard(expr, self.where()))
            log.info("runtime assert %s at %s", expr, self.where())
            self._refine(expr)
            return True
        return bool(self.evaluate_expr(expr))

    def _set_range(self, sym: sympy.Symbol, r: ValueRange) -> None:
        old = self.var_to_range.get(sym)
        if old == r:
            return
        self.var_to_range[sym] = r
        log.info("update range %s = %s", sym, r)
        if r.is_singleton() and sym not in self.replacements:
            self._set_replacement(sym, r.lower, "range is a single value")

    def _set_replacement(self, sym: sympy.Symbol, expr: Any, why: str) -> None:
        self.replacements[sym] = expr
        self._replaced.clear()
        for k, v in list(self.replacements.items()):
            if k is not sym:
                self.replacements[k] = v.xreplace({sym: expr})
        if isinstance(expr, sympy.Symbol) and sym in self.var_to_range and expr in self.var_to_range:
            self.var_to_range[expr] = self.var_to_range[expr].intersect(self.var_to_range[sym])
        log.info("set_replacement %s = %s (%s)", sym, expr, why)

    def _refine(self, guard: Any) -> None:
        if isinstance(guard, sympy.And):
            for g in guard.args:
                self._refine(g)
            return
        if not isinstance(guard, sympy.core.relational.Relational):
            return
        diff = sympy.expand(guard.lhs - guard.rhs)
        free = sorted(
            diff.free_symbols, key=lambda s: (s in self.unbacked, int(s.name[1:] or 0)), reverse=True
        )
        if isinstance(guard, sympy.Eq):
            for sym in free:  # newest first: it is replaced by older ones
                coeff = diff.coeff(sym)
                rest = sympy.expand(diff - coeff * sym)
                if coeff in (1, -1) and sym not in rest.free_symbols:
                    solution = -rest / coeff
                    if any(s in self.unbacked for s in solution.free_symbols) and sym not in self.unbacked:
                        continue  # never express a backed size through a data-dependent one
                    if solution.is_Float and sym.is_integer and float(solution).is_integer():
                        # Note [An int symbol pinned by a float]: `round(float(k), 3)` specializes
                        # `float(k)` with the guard `Eq(s0, 3.0)`; the symbol of the int `k` is the
                        # integer 3, not the float (the frame returned `k` as 3.0: pyfuzz.py
                        # --dynamic true, seed 1132)
                        solution = sympy.Integer(int(solution))
                    if solution.is_Integer:
                        self._set_range(sym, ValueRange(solution, solution))
                    else:
                        self._set_replacement(sym, solution, f"solving {guard}")
                    return
                if coeff.is_Integer and rest.is_Integer and (-rest / coeff).is_Integer:
                    # `Eq(2*s2, 8)` (a broadcast against a static size): the symbol is a value
                    solution = -rest / coeff
                    self._set_range(sym, ValueRange(solution, solution))
                    return
            if len(free) == 1:
                self._pin_polynomial_root(free[0], diff)
            return
        if len(free) != 1:
            return
        sym = free[0]
        coeff = diff.coeff(sym)
        rest = sympy.expand(diff - coeff * sym)
        if coeff not in (1, -1) or rest.free_symbols:
            self._raise_lower_bound(sym, guard)
            return
        # guard is `coeff*sym + rest OP 0`, i.e. `sym OP' value`
        value = -rest * coeff
        op = type(guard)
        if coeff == -1:
            op = {sympy.Lt: sympy.Gt, sympy.Le: sympy.Ge, sympy.Gt: sympy.Lt, sympy.Ge: sympy.Le}.get(op, op)
        r = self.var_to_range.get(sym, ValueRange.unknown())
        new = {
            sympy.Lt: ValueRange(-oo, value - 1),
            sympy.Le: ValueRange(-oo, value),
            sympy.Gt: ValueRange(value + 1, oo),
            sympy.Ge: ValueRange(value, oo),
        }.get(op)
        if new is not None:
            self._set_range(sym, r.intersect(new))
        elif op is sympy.Ne and value == r.lower:
            self._set_range(sym, ValueRange(r.lower + 1, r.upper))
        elif op is sympy.Ne and value == r.upper:
            self._set_range(sym, ValueRange(r.lower, r.upper - 1))

    def _raise_lower_bound(self, sym: sympy.Symbol, guard: Any) -> None:
        """Note [Lower bounds through floor divisions]: a guard `f(s) > c` or `f(s) >= c` over
        one size symbol, with `f` non-decreasing in `s` (sums, positive multiples and floor
        divisions by positive integers of `s`), holds exactly for `s` from some value on: a
        pooling's output check `((s - 2)//2 - 1)//2 + 1 > 0` means `s >= 6`. The smallest such
        `s` between the symbol's lower bound and its hint (which satisfies the guard) becomes the
        new lower bound, found by bisection. Without it, torch's `max(1, size // 4)` strides
        of a pooled image stayed unsettled (Note [Max and Min settled by ranges]) and every
        kernel reading such a buffer indexed it through `std::max` and a flat view."""
        if sym in self.unbacked or sym not in self.var_to_val:
            return
        if isinstance(guard, (sympy.Gt, sympy.Ge)):
            f, strict = guard.lhs - guard.rhs, isinstance(guard, sympy.Gt)
        elif isinstance(guard, (sympy.Lt, sympy.Le)):
            f, strict = guard.rhs - guard.lhs, isinstance(guard, sympy.Lt)
        else:
            return
        if not _non_decreasing(f, sym):
            return
        r = self.var_to_range.get(sym, ValueRange.unknown())
        hint = self.var_to_val[sym]
        if not r.lower.is_finite or r.lower > hint:
            return

        def holds(v: int) -> bool:
            value = f.xreplace({sym: sympy.Integer(v)})
            return bool(value > 0) if strict else bool(value >= 0)

        if not holds(hint):
            return
        lo, hi = int(r.lower), hint  # holds(hi); find the smallest value that holds
        if holds(lo):
            return
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(mid) else (mid, hi)
        self._set_range(sym, r.intersect(ValueRange(sympy.Integer(hi), oo)))

    def _pin_polynomial_root(self, sym: sympy.Symbol, diff: Any) -> None:
        """Note [Equalities of one symbol of higher degree]: a guard `Eq(p(s), 0)` with `p` a
        polynomial of degree 2 or more in one backed symbol holds for finitely many values of
        `s` (`Eq(4*(s2 - 2)**2, 64)`: a flatten of a valid convolution over an `s2 x s2` image
        fed to `BatchNorm1d(64)`; only `s2 = 6` among sizes). Left as a guard, every later
        question about the same expression asks it again, and loopir, which proves equalities
        without guards, saw `4*(s2 - 2)**2` and `64` as different sizes and sent the broadcast to
        an extern call. The graph serves only those few values anyway: `s` becomes its hint (a
        root, since the guard held), and the tracked input's guard `size == 6` replaces the
        polynomial one (a stricter guard, never a looser one). Anything that is not a polynomial
        of `s` (`Mod`, `FloorDiv`: infinitely many solutions) stays a guard."""
        if sym in self.unbacked or sym not in self.var_to_val or sym in self.replacements:
            return
        if diff.has(sympy.Mod, FloorDiv, sympy.Max, sympy.Min):
            return
        try:
            poly = sympy.Poly(diff, sym)
        except sympy.PolynomialError:
            return
        if poly.degree() < 2 or not all(c.is_number for c in poly.all_coeffs()):
            return
        hint = sympy.Integer(self.var_to_val[sym])
        if poly.eval(hint) != 0:
            return
        log.info("pin %s = %s (Eq(%s, 0) has finitely many solutions)", sym, hint, diff)
        self._set_range(sym, ValueRange(hint, hint))

    # --- guards as Python ---------------------------------------------------------------------
    def produce_guards(self, render: Callable[[Hashable], str]) -> list[RenderedGuard]:
        """Every shape fact of this capture as a Python condition over the inputs; `render(source)`
        gives the text of an input size (e.g. `L['x'].size(0)`)."""
        names = {s: render(srcs[0]) for s, srcs in self.var_to_sources.items() if srcs}
        out: list[RenderedGuard] = []
        seen: set[str] = set()

        def emit(text: str, where: str) -> None:
            if text not in seen:
                seen.add(text)
                out.append(RenderedGuard(text, where))

        for source, expr in self.tracked:
            e = self.replace(expr)
            if isinstance(e, sympy.Symbol) and self.var_to_sources[e][0] == source:
                continue
            emit(f"{render(source)} == {pexpr(e, names)}", "input sizes")
        for g in self.guards:
            e = self.simplify(g.expr)
            if e is sympy.true:
                continue
            emit(pexpr(e, names), g.where)
        for sym, r in self.var_to_range.items():
            if sym in self.replacements or sym in self.unbacked or sym not in names:
                continue
            text = names[sym]
            if r.lower.is_finite and r.upper.is_finite:
                emit(f"{int(r.lower)} <= {text} <= {int(r.upper)}", f"range of {sym}")
            elif r.lower.is_finite:
                emit(f"{int(r.lower)} <= {text}", f"range of {sym}")
            elif r.upper.is_finite:
                emit(f"{text} <= {int(r.upper)}", f"range of {sym}")
        return out

    def freeze(self) -> None:
        self.frozen = True

    # --- torch's Python helpers call these ----------------------------------------------------
    def evaluate_sym_node(
        self, node: Any, size_oblivious: bool = False, fallback_value: bool | None = None
    ) -> Any:
        return self.evaluate_expr(node.expr, node._hint, fallback=fallback_value)

    def free_symbols(self) -> list[sympy.Symbol]:
        return [s for s in self.var_to_val if s not in self.replacements]

    def symbols_of(self, expr: Any) -> set[sympy.Symbol]:
        return set(self.replace(expr).free_symbols)

    def floordiv(self, a: Any, b: Any) -> Any:
        return FloorDiv(sympy.sympify(a), sympy.sympify(b))
