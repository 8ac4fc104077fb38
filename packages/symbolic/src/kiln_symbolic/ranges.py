"""Integer value ranges, and bounding an expression over the ranges of its symbols.

A `ValueRange(lower, upper)` is a closed interval whose ends may be `-oo`/`oo` (sympy's
infinities, only ever used as bounds). `bound(expr, ranges)` computes an interval that contains
every value `expr` takes when each symbol stays in its range: interval arithmetic over `Add`,
`Mul`, integer powers, `FloorDiv` by a positive constant, `Mod` by a positive constant or size,
`Max`/`Min`. Unknown
functions give the whole line. `decide(relation, ranges)` uses it on `lhs - rhs` to answer a
comparison without a guard when the interval settles it (`s0 >= 2` with `s0` in `[2, oo]`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy

from kiln_symbolic.functions import FloorDiv

oo = sympy.oo


@dataclass(frozen=True, slots=True)
class ValueRange:
    lower: Any
    upper: Any

    def __post_init__(self) -> None:
        if self.lower > self.upper:
            raise ValueError(f"empty range [{self.lower}, {self.upper}]")

    @staticmethod
    def unknown() -> ValueRange:
        return ValueRange(-oo, oo)

    def is_singleton(self) -> bool:
        return bool(self.lower == self.upper)

    def intersect(self, other: ValueRange) -> ValueRange:
        return ValueRange(sympy.Max(self.lower, other.lower), sympy.Min(self.upper, other.upper))

    def contains(self, value: int) -> bool:
        return bool(self.lower <= value <= self.upper)

    def __str__(self) -> str:
        return f"[{self.lower}, {self.upper}]"


def _mul(a: Any, b: Any) -> Any:
    if a == 0 or b == 0:
        return sympy.Integer(0)
    return a * b


def bound(expr: Any, ranges: Mapping[sympy.Symbol, ValueRange]) -> ValueRange:
    expr = sympy.sympify(expr)
    if expr.is_Number:
        return ValueRange(expr, expr)
    if isinstance(expr, sympy.Symbol):
        return ranges.get(expr, ValueRange.unknown())
    if isinstance(expr, sympy.Add):
        lo, hi = sympy.Integer(0), sympy.Integer(0)
        for arg in expr.args:
            r = bound(arg, ranges)
            lo, hi = lo + r.lower, hi + r.upper
            if lo is sympy.nan or hi is sympy.nan:
                return ValueRange.unknown()
        return ValueRange(lo, hi)
    if isinstance(expr, sympy.Mul):
        acc = ValueRange(sympy.Integer(1), sympy.Integer(1))
        for arg in expr.args:
            r = bound(arg, ranges)
            products = [_mul(x, y) for x in (acc.lower, acc.upper) for y in (r.lower, r.upper)]
            if any(p is sympy.nan for p in products):
                return ValueRange.unknown()
            acc = ValueRange(sympy.Min(*products), sympy.Max(*products))
        return acc
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        r = bound(expr.base, ranges)
        n = int(expr.exp)
        if r.lower >= 0:
            return ValueRange(r.lower**n, r.upper**n)
        return ValueRange.unknown()
    if isinstance(expr, FloorDiv):
        d = expr.args[1]
        if d.is_Integer and int(d) > 0:
            r = bound(expr.args[0], ranges)
            lo = sympy.floor(r.lower / d) if r.lower.is_finite else r.lower
            hi = sympy.floor(r.upper / d) if r.upper.is_finite else r.upper
            return ValueRange(lo, hi)
        return ValueRange.unknown()
    if isinstance(expr, sympy.Mod):
        # a positive divisor (a constant or a size range) puts `a % d` in [0, d - 1]; a
        # non-negative `a` below every value of `d` is its own remainder (`1 % s0` is 1)
        rd = bound(expr.args[1], ranges)
        if rd.lower >= 1:
            r = bound(expr.args[0], ranges)
            if r.lower >= 0 and r.upper < rd.lower:
                return r
            hi = rd.upper - 1 if rd.upper.is_finite else rd.upper
            return ValueRange(sympy.Integer(0), sympy.Min(hi, r.upper) if r.lower >= 0 else hi)
        return ValueRange.unknown()
    if isinstance(expr, (sympy.Max, sympy.Min)):
        rs = [bound(a, ranges) for a in expr.args]
        f = sympy.Max if isinstance(expr, sympy.Max) else sympy.Min
        return ValueRange(f(*[r.lower for r in rs]), f(*[r.upper for r in rs]))
    return ValueRange.unknown()


_RELATIONS = (sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge)


def decide(rel: Any, ranges: Mapping[sympy.Symbol, ValueRange]) -> bool | None:
    """True/False when the ranges settle the comparison, None when they do not."""
    if rel is sympy.true or rel is sympy.false:
        return bool(rel)
    if isinstance(rel, sympy.Not):
        inner = decide(rel.args[0], ranges)
        return None if inner is None else not inner
    if isinstance(rel, (sympy.And, sympy.Or)):
        parts = [decide(a, ranges) for a in rel.args]
        if isinstance(rel, sympy.And):
            if any(p is False for p in parts):
                return False
            return True if all(p is True for p in parts) else None
        if any(p is True for p in parts):
            return True
        return False if all(p is False for p in parts) else None
    if not isinstance(rel, _RELATIONS):
        return None
    diff = sympy.expand(rel.lhs - rel.rhs)
    r = bound(diff, ranges)
    lo, hi = r.lower, r.upper
    if isinstance(rel, sympy.Eq):
        if lo == hi == 0:
            return True
        return False if (lo > 0 or hi < 0) else None
    if isinstance(rel, sympy.Ne):
        if lo == hi == 0:
            return False
        return True if (lo > 0 or hi < 0) else None
    if isinstance(rel, sympy.Lt):
        return True if hi < 0 else (False if lo >= 0 else None)
    if isinstance(rel, sympy.Le):
        return True if hi <= 0 else (False if lo > 0 else None)
    if isinstance(rel, sympy.Gt):
        return True if lo > 0 else (False if hi <= 0 else None)
    return True if lo >= 0 else (False if hi < 0 else None)  # Ge
