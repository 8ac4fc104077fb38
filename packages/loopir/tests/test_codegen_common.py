"""The parts both code generators share (kiln_loopir.codegen_common): a third backend fills in
spellings and printer hooks only, and gets promotion, lookup order and floor-correct index math."""

from __future__ import annotations

import pytest
import sympy
import torch

from kiln_loopir.codegen_common import (
    HALF,
    IndexPrinter,
    OpSpellings,
    constant_value,
    math_dtypes,
    result_dtype,
    scalar_dtype,
)
from kiln_loopir.indexing import FloorDiv, ModularIndexing


class PyPrinter(IndexPrinter):
    """A toy backend: Python's own integer arithmetic with a truncating division spelled ``tdiv``."""

    div = "tdiv"

    def minmax(self, is_min: bool, a: str, b: str) -> str:
        return f"{'min' if is_min else 'max'}({a}, {b})"


def test_index_printer_spells_the_tree_with_the_backends_hooks() -> None:
    x = sympy.Symbol("x0", integer=True, nonnegative=True)
    n = sympy.Symbol("s0", integer=True)
    p = PyPrinter()
    assert p.print(2 * x + 3) == "(3 + (2 * x0))"
    assert p.print(FloorDiv(x, 4)) == "(x0 tdiv 4)"
    assert p.print(ModularIndexing(x, 4, 8)) == "((x0 tdiv 4) % 8)"
    assert p.print(sympy.Min(x, 5)) == "min(5, x0)"
    assert p.print(x**3) == "(x0 * x0 * x0)"
    # a value that may be negative is divided by floor, not truncation (Note [Floor division of
    # values that may be negative])
    assert p.print(FloorDiv(n - 7, 3)) == "(((-7 + s0) - ((((-7 + s0) % 3) + 3) % 3)) tdiv 3)"
    with pytest.raises(NotImplementedError):
        p.print(sympy.Mod(n, 8))  # only a backend that says python_mod prints it
    with pytest.raises(NotImplementedError):
        p.print(sympy.Rational(1, 2))


def test_index_printer_flags() -> None:
    x = sympy.Symbol("x0", integer=True, nonnegative=True)
    n = sympy.Symbol("s0", integer=True)

    class Flagged(PyPrinter):
        unit_digit = True
        python_mod = True

    assert PyPrinter().print(ModularIndexing(x, 1, 8)) == "((x0 tdiv 1) % 8)"
    assert Flagged().print(ModularIndexing(x, 1, 8)) == "(x0 % 8)"
    assert Flagged().print(sympy.Mod(n, 8)) == "(((s0 % 8) + 8) % 8)"


def test_spelling_lookup_order() -> None:
    table = OpSpellings(
        float_unary={"neg": "f-{a}", "abs": "fabs({a})"},
        float_binary={"add": "f({a}+{b})", "nextafter": "fnext({a},{b})"},
        int_unary={"abs": "iabs({a})"},
        int_binary={},
        bool_unary={"neg": "{a}"},
        bool_binary={},
        half_binary={torch.float16: {"nextafter": "hnext({a},{b})"}},
    )
    assert table.lookup("abs", torch.float32, True) == "fabs({a})"
    assert table.lookup("abs", torch.int32, True) == "iabs({a})"
    assert table.lookup("abs", torch.bool, True) == "iabs({a})"  # bool falls back to int
    assert table.lookup("neg", torch.bool, True) == "{a}"
    assert table.lookup("neg", torch.int64, True) == "f-{a}"  # int falls back to float
    assert table.lookup("nextafter", torch.float16, False) == "hnext({a},{b})"
    assert table.lookup("nextafter", torch.float32, False) == "fnext({a},{b})"
    assert table.lookup("sin", torch.float32, True) is None


def test_promotion_matches_eager() -> None:
    f32, i64, i32, b = torch.float32, torch.int64, torch.int32, torch.bool
    assert result_dtype("add", ((i32, False), (i64, True))) == i32  # a scalar does not upcast
    assert result_dtype("add", ((i32, False), (f32, True))) == f32
    assert result_dtype("truediv", ((i64, False), (i64, False))) == torch.get_default_dtype()
    assert result_dtype("exp", ((i32, False),)) == torch.get_default_dtype()
    assert result_dtype("lt", ((f32, False), (i64, False))) == b
    assert math_dtypes("lt", ((i32, False), (f32, False))) == (b, f32)  # compared at the common type
    assert math_dtypes("isnan", ((torch.float16, False),)) == (b, torch.float16)
    assert math_dtypes("mul", ((i32, False), (i32, False))) == (i32, i32)
    x = torch.tensor([3], dtype=i32)
    assert (x + torch.tensor(2**40)).dtype == result_dtype("add", ((i32, False), (i64, True)))


def test_constants_as_a_tensor_holds_them() -> None:
    assert constant_value(300, torch.int8) == int(torch.tensor(300).to(torch.int8))
    assert constant_value(-129, torch.int8) == 127
    assert constant_value(0.1, torch.bfloat16) == float(torch.tensor(0.1, dtype=torch.bfloat16))
    assert constant_value(0.1, torch.float32) == 0.1  # held as float32 by the backend's literal
    assert constant_value(2, torch.bool) is True
    assert scalar_dtype(True) == torch.bool and scalar_dtype(3) == torch.int64
    assert scalar_dtype(0.5) == torch.get_default_dtype()
    assert set(HALF) == {torch.bfloat16, torch.float16}
