"""Rendering symbolic expressions as Python source over the frame's inputs.

A shape guard is a sympy relation over size symbols (`Eq(s1, s0)`, `s0 < 10`); the guard
function needs it as Python over the values it can read (`L['y'].size(1) == L['x'].size(1)`).
`PythonPrinter(names)` prints each symbol as the text `names` gives for it, `FloorDiv` as `//`,
`Mod` as `%`, relations with Python's operators and `And`/`Or`/`Not` with `and`/`or`/`not`, every
compound operand in parentheses so that precedence never changes the meaning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sympy
from sympy.printing.str import StrPrinter

from kiln_symbolic.functions import (
    FloatAdd,
    FloatMul,
    FloatNeg,
    FloatPow,
    FloatSqrt,
    FloatSub,
    FloatTrueDiv,
    FloorDiv,
    IntOfFloat,
    IntTrueDiv,
    ToFloat,
)

_REL_OPS = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class PythonPrinter(StrPrinter):
    def __init__(self, names: Mapping[sympy.Symbol, str] | None = None) -> None:
        super().__init__()
        self.names = dict(names or {})

    def _p(self, e: Any) -> str:
        text = self._print(e)
        if isinstance(e, (sympy.Symbol, sympy.Integer)) and not (e.is_Integer and e < 0):
            return text
        return f"({text})"

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return self.names.get(expr, expr.name)

    def _print_Integer(self, expr: sympy.Integer) -> str:
        return str(int(expr))

    def _print_Infinity(self, expr: Any) -> str:
        return "math.inf"

    def _print_NegativeInfinity(self, expr: Any) -> str:
        return "-math.inf"

    def _print_Rational(self, expr: sympy.Rational) -> str:
        return f"{int(expr.p)} / {int(expr.q)}"

    def _print_Add(self, expr: sympy.Add, order: Any = None) -> str:
        terms = list(expr.as_ordered_terms())
        out = self._print(terms[0])
        for t in terms[1:]:
            coeff, _ = t.as_coeff_Mul()
            if coeff < 0:
                out += f" - {self._p(-t)}"
            else:
                out += f" + {self._p(t)}"
        return out

    def _print_Mul(self, expr: sympy.Mul) -> str:
        coeff, rest = expr.as_coeff_Mul()
        if coeff == -1:
            return f"-{self._p(rest)}"
        num, den = sympy.fraction(expr)
        if den != 1:
            return f"{self._p(num)} / {self._p(den)}"
        return " * ".join(self._p(a) for a in expr.as_ordered_factors())

    def _print_Pow(self, expr: sympy.Pow, rational: bool = False) -> str:
        return f"{self._p(expr.base)} ** {self._p(expr.exp)}"

    def _print_FloorDiv(self, expr: FloorDiv) -> str:
        return f"{self._p(expr.args[0])} // {self._p(expr.args[1])}"

    def _print_IntTrueDiv(self, expr: IntTrueDiv) -> str:
        return f"{self._p(expr.args[0])} / {self._p(expr.args[1])}"

    # Note [Python float arithmetic on sizes, in its order]: each float function is the Python
    # operation it stands for, on the same operands (ints stay ints: `s1 / 3` is Python's
    # correctly rounded int true division), so the printed text computes eager's double exactly;
    # a float literal is printed with `repr`, which reads back as the same double.
    def _float_operand(self, e: Any) -> str:
        if isinstance(e, sympy.Float):  # finite: sympy makes an infinite Float `oo`
            return f"({float(e)!r})"
        return self._p(e)

    def _print_FloatTrueDiv(self, expr: FloatTrueDiv) -> str:
        return f"{self._float_operand(expr.args[0])} / {self._float_operand(expr.args[1])}"

    def _print_FloatMul(self, expr: FloatMul) -> str:
        return f"{self._float_operand(expr.args[0])} * {self._float_operand(expr.args[1])}"

    def _print_FloatAdd(self, expr: FloatAdd) -> str:
        return f"{self._float_operand(expr.args[0])} + {self._float_operand(expr.args[1])}"

    def _print_FloatSub(self, expr: FloatSub) -> str:
        return f"{self._float_operand(expr.args[0])} - {self._float_operand(expr.args[1])}"

    def _print_FloatNeg(self, expr: FloatNeg) -> str:
        return f"-{self._float_operand(expr.args[0])}"

    def _print_FloatPow(self, expr: FloatPow) -> str:
        return f"float({self._float_operand(expr.args[0])}) ** float({self._float_operand(expr.args[1])})"

    def _print_FloatSqrt(self, expr: FloatSqrt) -> str:
        return f"math.sqrt({self._print(expr.args[0])})"

    # Note [Integers of floats of sizes]: `math.floor` / `math.ceil` / `math.trunc` (sympy picks
    # a printing method by the class's own name, never a Function subclass's base)
    def _print_IntOfFloat(self, expr: IntOfFloat) -> str:
        return f"math.{type(expr).python.__name__}({self._print(expr.args[0])})"

    _print_FloorOfFloat = _print_CeilOfFloat = _print_TruncOfFloat = _print_IntOfFloat

    def _print_ToFloat(self, expr: ToFloat) -> str:
        return f"float({self._print(expr.args[0])})"

    def _print_Mod(self, expr: sympy.Mod) -> str:
        return f"{self._p(expr.args[0])} % {self._p(expr.args[1])}"

    def _print_Max(self, expr: sympy.Max) -> str:
        return "max(" + ", ".join(self._print(a) for a in expr.args) + ")"

    def _print_Min(self, expr: sympy.Min) -> str:
        return "min(" + ", ".join(self._print(a) for a in expr.args) + ")"

    def _print_Relational(self, expr: Any) -> str:
        return f"{self._p(expr.lhs)} {_REL_OPS[expr.rel_op]} {self._p(expr.rhs)}"

    def _print_And(self, expr: sympy.And) -> str:
        return " and ".join(self._p(a) for a in expr.args)

    def _print_Or(self, expr: sympy.Or) -> str:
        return " or ".join(self._p(a) for a in expr.args)

    def _print_Not(self, expr: sympy.Not) -> str:
        return f"not {self._p(expr.args[0])}"

    def _print_BooleanTrue(self, expr: Any) -> str:
        return "True"

    def _print_BooleanFalse(self, expr: Any) -> str:
        return "False"

    def _print_floor(self, expr: Any) -> str:
        return f"math.floor({self._print(expr.args[0])})"

    def _print_ceiling(self, expr: Any) -> str:
        return f"math.ceil({self._print(expr.args[0])})"


def pexpr(expr: Any, names: Mapping[sympy.Symbol, str] | None = None) -> str:
    """`expr` as Python source, symbols printed as `names` says (their own names otherwise)."""
    return PythonPrinter(names).doprint(sympy.sympify(expr))
