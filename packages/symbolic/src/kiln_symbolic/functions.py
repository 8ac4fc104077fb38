"""Integer functions of symbolic sizes that sympy lacks, with Python's semantics.

Python's `a // b` rounds toward minus infinity and `a % b` takes the sign of `b`. sympy's `Mod`
already agrees with Python on integers; `FloorDiv` is ours. Its `eval` folds the cases that make
size arithmetic readable: integer operands, a divisor of 1, and an exact quotient (`(2*s0)//2`,
`(s0*s1)//s1`), which sympy proves from the symbols' `integer=True` assumption. Everything else
stays a `FloorDiv` node that the printers render as `//`.

`IntTrueDiv(a, b)` is `a / b` on ints (a float): kept as a node so that it is never confused
with an exact rational.
"""

from __future__ import annotations

from typing import Any

import sympy


class FloorDiv(sympy.Function):
    """`base // divisor` with Python semantics."""

    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, base: Any, divisor: Any) -> Any:
        if divisor == 0:
            raise ZeroDivisionError("integer division by zero in a symbolic size")
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        exact = sympy.cancel(base / divisor)
        if exact.is_integer:
            return exact
        if isinstance(base, FloorDiv) and divisor.is_positive and base.args[1].is_positive:
            return FloorDiv(base.args[0], base.args[1] * divisor)
        return None


class IntTrueDiv(sympy.Function):
    """`a / b` on two ints: a float."""

    nargs = (2,)

    @classmethod
    def eval(cls, a: Any, b: Any) -> Any:
        if a.is_Integer and b.is_Integer and b != 0:
            return sympy.Float(int(a) / int(b))
        return None


def sym_eq(a: Any, b: Any) -> Any:
    return sympy.Eq(sympy.sympify(a), sympy.sympify(b))
