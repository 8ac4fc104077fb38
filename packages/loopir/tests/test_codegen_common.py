"""The parts both code generators share (kiln_loopir.codegen_common): a third backend fills in
spellings and printer hooks only, and gets promotion, lookup order and floor-correct index math."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import sympy
import torch

from kiln_loopir.codegen_common import (
    HALF,
    IndexPrinter,
    OpsHandlerBase,
    OpSpellings,
    constant_value,
    marked_store,
    math_dtypes,
    result_dtype,
    same_size,
    scalar_dtype,
    size_of,
    unflatten,
    unmark_stores,
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


def test_size_helpers() -> None:
    s = sympy.Symbol("s0", integer=True, positive=True)
    x = sympy.Symbol("x", integer=True, nonnegative=True)
    four = size_of(sympy.Integer(4))
    assert four == 4 and isinstance(four, int)
    assert size_of(2 * s) == 2 * s
    assert same_size(2 * (s + 1), 2 * s + 2) and not same_size(s, s + 1)
    assert same_size(3, 3) and not same_size(3, 4)
    assert unflatten(x, [2, 1, 3]) == [FloorDiv(x, 3), 0, ModularIndexing(x, 1, 3)]


@dataclass
class ToyValue:
    expr: str
    dtype: torch.dtype
    const: bool = False
    py: Any = None


class ToyHandler(OpsHandlerBase):
    """A third backend's ops handler: only constants, conversions and math are its own."""

    value_type = ToyValue
    unsupported = LookupError

    def __init__(self) -> None:
        super().__init__("k", [], [], {}, set())
        self.scopes = [([], {}, {})]

    def constant(self, value: Any, dtype: torch.dtype) -> ToyValue:
        return ToyValue(repr(constant_value(value, dtype)), dtype, True, value)

    def _as(self, v: ToyValue, dtype: torch.dtype) -> ToyValue:
        if v.dtype == dtype:
            return v
        return ToyValue(f"{str(dtype)[6:]}({v.expr})", dtype, v.const, v.py)

    def _math(self, name: str, *args: Any) -> ToyValue:
        values, out, _ = self._math_operands(name, args)
        return ToyValue(f"{name}({', '.join(v.expr for v in values)})", out)


def test_ops_handler_skeleton() -> None:
    h = ToyHandler()
    x = ToyValue("x", torch.int32)
    assert h.add(x, 2.5) == ToyValue("add(float32(x), 2.5)", torch.float32)
    assert h.lt(x, 2.5) == ToyValue("lt(float32(x), 2.5)", torch.bool)  # compared as float
    assert h.mul(x, 3) == ToyValue("mul(x, int32(3))", torch.int32)  # a Python int does not upcast
    with pytest.raises(LookupError):
        h.no_such_op(x)
    assert h.to_dtype(3, torch.float64) == ToyValue("float64(3)", torch.float64, True, 3)
    y = ToyValue("y", torch.float16)
    va, vb, dtype = h._where_operands(1, y)
    assert dtype == torch.float16 and va == ToyValue("1.0", torch.float16, True, 1) and vb is y
    assert h._reduce_one(torch.int64, "argmax", y) == ToyValue("0", torch.int64, True, 0)
    mean, m2, weight = h._reduce_one(torch.float32, "welford_reduce", y)
    # one element's m2 is (y - y)^2: NaN for an infinity or NaN, as eager's; its mean 0 + y
    d = "sub(float32(y), float32(y))"
    assert (mean.expr, m2.expr, weight.expr) == ("add(float32(y), 0.0)", f"mul({d}, {d})", "1.0")
    assert (h._new(), h._new("ind"), h._param("buf0"), h._param("buf0")) == (
        "tmp1",
        "ind2",
        "p_buf0",
        "p_buf0",
    )
    assert h.param_order == ["buf0"] and h.lines == []
    h.scopes.append(([], {}, {}))
    h.scopes[0][1]["a + b"] = x
    h.scopes[0][2][("buf0", "x0")] = y
    assert h._computed("a + b", torch.int32) is x and h._computed("a + b", torch.int64) is None
    assert h._forwarded(("buf0", "x0")) is y and h._forwarded(("buf1", "x0")) is None


def test_stores_of_internal_buffers() -> None:
    """Note [Stores of kernel-internal buffers]: an internal buffer the kernel never loads back is
    not stored; one it loads is scratch; any other buffer is stored."""
    h = ToyHandler()
    h.internal = {"buf1", "buf2"}
    h.stored = {"buf0", "buf1", "buf2"}
    h.loaded = {"buf2", "in0"}
    elided, scratch = h._internal_stores()
    assert elided == {"buf1"} and scratch == ["buf2"]
    lines = [
        marked_store("buf0", "p_buf0[x0] = tmp1;"),
        "tmp2 = tmp1 * 2;",
        marked_store("buf1", "p_buf1[x0] = tmp2;"),
        marked_store("buf2", "p_buf2[x0] = tmp2;"),
    ]
    assert unmark_stores(lines, elided) == ["p_buf0[x0] = tmp1;", "tmp2 = tmp1 * 2;", "p_buf2[x0] = tmp2;"]


class FloatPrinter(PyPrinter):
    """The toy backend with doubles: Note [Floats of sizes in a printer]."""

    float_spellings: Mapping[str, str] = {
        "FloatTrueDiv": "({a} / {b})",
        "FloatAdd": "({a} + {b})",
        "ToFloat": "{a}",
    }
    int_of_float_spellings: Mapping[str, str] = {"FloorOfFloat": "floor({a})"}

    def float_literal(self, value: float) -> str:
        return repr(value)

    def int_as_double(self, text: str) -> str:
        return f"double({text})"


def test_floats_of_sizes_print_from_the_backends_tables() -> None:
    from kiln_symbolic import FloatAdd, FloatSqrt, FloatTrueDiv, FloorOfFloat, ToFloat

    n = sympy.Symbol("s0", integer=True, positive=True)
    half = FloatAdd(FloatTrueDiv(n, 3), sympy.Float(0.5, 53))
    assert FloatPrinter().print(half) == "((double(s0) / double(3)) + 0.5)"
    assert FloatPrinter().print(FloorOfFloat(ToFloat(n + 1))) == "floor(double((1 + s0)))"
    with pytest.raises(NotImplementedError, match="float of sizes"):
        FloatPrinter().print(FloatSqrt(n))  # not in the table: declined
    with pytest.raises(NotImplementedError, match="float of sizes"):
        PyPrinter().print(half)  # no tables at all
    with pytest.raises(NotImplementedError, match="non-integer operand"):
        FloatPrinter().print(FloatAdd(n, sympy.Rational(1, 3)))
