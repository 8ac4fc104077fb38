"""Note [Floats of sizes in C++]: a float computed from sizes is printed as double arithmetic,
one operation per Python operation in Python's order, and equals Python's value."""

from __future__ import annotations

import math

import sympy
from kiln_symbolic import (
    FloatAdd,
    FloatMul,
    FloatPow,
    FloatSqrt,
    FloatTrueDiv,
    FloorOfFloat,
    ToFloat,
    TruncOfFloat,
)

from kiln_codegen_cpp.cpp_ops import index_to_cpp


def test_a_float_of_sizes_is_double_arithmetic_in_python_order() -> None:
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    s1 = sympy.Symbol("s1", integer=True)
    # (s1 / 3 + 1) + 2 and float(s0) * 0.1 * 3: sympy's Add/Mul would merge the constants
    expr = FloatAdd(FloatAdd(FloatTrueDiv(s1 - s0, 3), 1), 2)
    first = index_to_cpp(expr).replace("static_cast<double>", "static_cast_double")
    for v0 in range(1, 9):
        for v1 in range(-5, 30):
            names = {"static_cast_double": float, "INT64_C": int, "s0": v0, "s1": v1}
            assert eval(first, names) == ((v1 - v0) / 3 + 1) + 2
    prod = FloatMul(FloatMul(ToFloat(s0), 0.1), 3)
    text = index_to_cpp(prod)
    assert text == "((static_cast<double>(s0) * (0.1)) * static_cast<double>(INT64_C(3)))"
    for v0 in range(1, 40):
        # the printed text evaluated as Python doubles (static_cast<double> is float()) is Python's
        names = {"static_cast_double": float, "INT64_C": int, "s0": v0}
        got = eval(text.replace("static_cast<double>", "static_cast_double"), names)
        assert got == float(v0) * 0.1 * 3
        assert float(prod.subs(s0, v0)) == float(v0) * 0.1 * 3  # the interpreter's value too


def test_powers_and_square_roots_of_sizes_are_c_pow_and_sqrt() -> None:
    """`n ** -0.5` and `math.sqrt(n)` are C's `pow` / `sqrt` of doubles: the functions Python's
    float `**` and `math.sqrt` call, so the same double for every size."""
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    expr = FloatTrueDiv(1, FloatSqrt(s0 * 3))
    power = FloatPow(s0, sympy.Float(-0.5, 53))
    assert index_to_cpp(power) == "std::pow(static_cast<double>(s0), (-0.5))"
    text = index_to_cpp(expr)
    assert "std::sqrt(" in text
    for v in (1, 3, 64, 1000, 12345):
        # the printed text evaluated as Python doubles (std::sqrt is math.sqrt, std::pow is **)
        names = {"static_cast_double": float, "INT64_C": int, "s0": v, "std_sqrt": math.sqrt}
        got = eval(
            text.replace("static_cast<double>", "static_cast_double").replace("std::sqrt", "std_sqrt"), names
        )
        assert got == float(expr.subs(s0, v)) == 1 / math.sqrt(3 * v)
        assert float(power.subs(s0, v)) == v**-0.5


def test_an_int_of_a_float_of_sizes_is_the_integer_part_of_the_double() -> None:
    """kiln_symbolic's Note [Integers of floats of sizes]: `floor(float(s0) * (1/3))` is
    `std::floor` of the double product, converted to int64 (3 * (1/3) rounds up to 1.0)."""
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    third = sympy.Float(1 / 3, 53)
    floor = FloorOfFloat(FloatMul(ToFloat(s0), third))
    text = index_to_cpp(floor + TruncOfFloat(FloatMul(s0, sympy.Float(1.5, 53))))
    assert text.count("static_cast<int64_t>(std::floor(") == 1 and "std::trunc(" in text
    py = (
        text.replace("static_cast<double>", "static_cast_double")
        .replace("static_cast<int64_t>", "int")
        .replace("std::floor", "math.floor")
        .replace("std::trunc", "math.trunc")
    )
    for v in (2, 3, 6, 7, 299):
        names = {"static_cast_double": float, "INT64_C": int, "s0": v, "math": math}
        assert eval(py, names) == math.floor(float(v) * (1 / 3)) + int(v * 1.5)
