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

import math
import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch


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


# Note [Python float arithmetic on sizes, in its order]: `n / 3 + 0.5` computed from sizes is
# Python float (double) arithmetic, whose rounding depends on the order of the operations; sympy's
# Add and Mul reorder and merge their terms (`(n / 3 + 1) + 2` becomes `n / 3 + 3`, which may
# round differently). A float a kernel computes from sizes (a fill value, a scalar operand) is
# therefore spelled with these functions, one per Python operation, which sympy never
# rearranges: each takes its operands as written and is one double operation (ints converted to
# double first, as Python does). On numbers they evaluate to that double at once (the loopir
# interpreter substitutes the sizes and reads the number).
class FloatOp(sympy.Function):
    """A Python float operation on sizes, kept in its order."""

    is_real = True
    is_integer = False
    python: Any = None

    @classmethod
    def eval(cls, *args: Any) -> Any:
        if all(a.is_number for a in args):
            values = [int(a) if a.is_Integer else float(a) for a in args]
            return sympy.Float(float(cls.python(*values)), 53)
        return None


class FloatTrueDiv(FloatOp):
    nargs = (2,)
    python = staticmethod(lambda a, b: a / b)


class FloatMul(FloatOp):
    nargs = (2,)
    python = staticmethod(lambda a, b: a * b)


class FloatAdd(FloatOp):
    nargs = (2,)
    python = staticmethod(lambda a, b: a + b)


class FloatSub(FloatOp):
    nargs = (2,)
    python = staticmethod(lambda a, b: a - b)


class FloatNeg(FloatOp):
    nargs = (1,)
    python = staticmethod(lambda a: -a)


class FloatPow(FloatOp):
    """Python's `a ** b` with a float result (a float operand, or an int raised to a negative
    int: both converted to double, as Python does): C's `pow` on the two doubles."""

    nargs = (2,)
    python = staticmethod(lambda a, b: float(a) ** float(b))


class FloatSqrt(FloatOp):
    """`math.sqrt(a)` (`torch.sym_sqrt`): IEEE's correctly rounded square root of the double."""

    nargs = (1,)
    python = staticmethod(math.sqrt)


class ToFloat(FloatOp):
    nargs = (1,)
    python = staticmethod(float)


# Note [Integers of floats of sizes]: an int made from a float of sizes (`int(n * 1.5)`, the
# output size `floor(float(n) * scale)` of `interpolate(scale_factor=1.5)`) is the integer part
# of that double, whose rounding sympy's `floor(1.5*s0)` does not keep (`float(n) * c` may round
# up to an integer the exact product stays below). So the int's expression is one of these
# functions over the float's ordered operations (Note [Python float arithmetic on sizes, in its
# order]): an integer sympy never rearranges, evaluated on numbers as Python's `math.floor` /
# `math.ceil` / `math.trunc` of the double, printed as those (C++: `std::floor` of the double).
class IntOfFloat(sympy.Function):
    """The integer part of a float of sizes, rounded as `python` rounds it."""

    nargs = (1,)
    is_integer = True
    python: Any = None

    @classmethod
    def eval(cls, a: Any) -> Any:
        if a.is_number:
            return sympy.Integer(cls.python(float(a)))
        return None


class FloorOfFloat(IntOfFloat):
    python = staticmethod(math.floor)


class CeilOfFloat(IntOfFloat):
    python = staticmethod(math.ceil)


class TruncOfFloat(IntOfFloat):
    python = staticmethod(math.trunc)


# Note [The Python calls of the float functions]: the Python call each ordered float function,
# and each integer part of a float, stands for in a traced graph (`operator.truediv` of a
# SymFloat, `torch.sym_float`, `math.floor`). The SymNode recipes that build these functions,
# loopir's lowering of a graph's size arithmetic and `fold_expr`, which turns them back into
# calls, all read these two tables, so the three cannot disagree on what a node means.
FLOAT_OF_CALL: dict[Callable[..., Any], type[FloatOp]] = {
    operator.add: FloatAdd,
    operator.sub: FloatSub,
    operator.mul: FloatMul,
    operator.truediv: FloatTrueDiv,
    operator.neg: FloatNeg,
    operator.pow: FloatPow,
    torch.sym_float: ToFloat,
    torch.sym_sqrt: FloatSqrt,
}
INT_OF_FLOAT_CALL: dict[Callable[..., Any], type[IntOfFloat]] = {
    math.floor: FloorOfFloat,
    math.ceil: CeilOfFloat,
    math.trunc: TruncOfFloat,
}


def sym_eq(a: Any, b: Any) -> Any:
    return sympy.Eq(sympy.sympify(a), sympy.sympify(b))
