"""C++ spellings of dtypes, constants, index expressions and the ``ops.*`` math set.

Every table here maps a name to a format string over the operands ``{a}``/``{b}`` and the
compute type ``{t}``; the kernel's ops handler (``kernel.CppOpsHandler``) fills them in. A value
of a half type (bfloat16, float16) is held as a ``float`` whose value is exactly representable in
that type: loads widen, stores narrow, and an op whose result has a half dtype rounds (as eager
rounds each op's result), so the C++ computes "in float" and matches eager's rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import sympy
import torch

from kiln_loopir.codegen_common import (
    HALF,
    IndexPrinter,
    OpSpellings,
    UnsupportedDtype,
    constant_value,
)

# dtype -> (type held in memory, type computed with)
CTYPES: dict[torch.dtype, tuple[str, str]] = {
    torch.float32: ("float", "float"),
    torch.float64: ("double", "double"),
    torch.bfloat16: ("uint16_t", "float"),
    torch.float16: ("uint16_t", "float"),
    torch.int8: ("int8_t", "int8_t"),
    torch.uint8: ("uint8_t", "uint8_t"),
    torch.int16: ("int16_t", "int16_t"),
    torch.int32: ("int32_t", "int32_t"),
    torch.int64: ("int64_t", "int64_t"),
    torch.bool: ("bool", "bool"),
}


def storage_type(dtype: torch.dtype) -> str:
    try:
        return CTYPES[dtype][0]
    except KeyError:
        raise UnsupportedDtype(str(dtype)) from None


def compute_type(dtype: torch.dtype) -> str:
    try:
        return CTYPES[dtype][1]
    except KeyError:
        raise UnsupportedDtype(str(dtype)) from None


def load_expr(dtype: torch.dtype, ref: str) -> str:
    """A memory element ``ref`` widened to the compute type."""
    if dtype == torch.bfloat16:
        return f"kiln::bf16_to_float({ref})"
    if dtype == torch.float16:
        return f"kiln::fp16_to_float({ref})"
    return ref


def store_expr(dtype: torch.dtype, value: str) -> str:
    """A compute value narrowed to the memory type."""
    if dtype == torch.bfloat16:
        return f"kiln::float_to_bf16({value})"
    if dtype == torch.float16:
        return f"kiln::float_to_fp16({value})"
    return f"static_cast<{storage_type(dtype)}>({value})"


def round_expr(dtype: torch.dtype, value: str) -> str:
    """A float value rounded to a half dtype (identity for other dtypes)."""
    if dtype == torch.bfloat16:
        return f"kiln::round_bf16({value})"
    if dtype == torch.float16:
        return f"kiln::round_fp16({value})"
    return value


def convert_expr(value: str, src: torch.dtype, dst: torch.dtype) -> str:
    """``value`` (compute type of ``src``) as the compute type of ``dst``."""
    if src == dst:
        return value
    if dst == torch.bool:
        return f"static_cast<bool>({value})"
    if dst in HALF:
        return round_expr(dst, f"static_cast<float>({value})")
    return f"static_cast<{compute_type(dst)}>({value})"


def constant_expr(value: object, dtype: torch.dtype) -> str:
    """A Python scalar as a C++ literal of ``dtype``'s compute type."""
    ctype = compute_type(dtype)
    if dtype == torch.bool:
        return "true" if bool(value) else "false"
    if dtype.is_floating_point:
        f = float(constant_value(value, dtype))
        if math.isnan(f):
            return f"std::numeric_limits<{ctype}>::quiet_NaN()"
        if math.isinf(f):
            sign = "-" if f < 0 else ""
            return f"{sign}std::numeric_limits<{ctype}>::infinity()"
        return f"static_cast<{ctype}>({f.hex()})"
    i = int(constant_value(value, dtype))  # wrapped like a tensor conversion
    if i == -(2**63):
        return "std::numeric_limits<int64_t>::min()"
    return f"static_cast<{ctype}>(INT64_C({i}))"


# -------------------------------------------------------------------------------------------
# math ops: float spelling, integer spelling (None: same as float), bool spelling (None: int)

FLOAT_UNARY: dict[str, str] = {
    "abs": "std::abs({a})", "neg": "(-{a})", "exp": "kiln::exp({a})", "exp2": "std::exp2({a})",
    "expm1": "std::expm1({a})", "log": "kiln::log({a})", "log1p": "std::log1p({a})",
    "log2": "kiln::log2({a})", "log10": "kiln::log10({a})", "sqrt": "std::sqrt({a})",
    "rsqrt": "kiln::rsqrt({a})", "sin": "std::sin({a})", "cos": "std::cos({a})",
    "tan": "std::tan({a})", "asin": "std::asin({a})", "acos": "std::acos({a})",
    "atan": "std::atan({a})", "sinh": "std::sinh({a})", "cosh": "std::cosh({a})",
    "tanh": "std::tanh({a})", "asinh": "std::asinh({a})", "acosh": "std::acosh({a})",
    "atanh": "std::atanh({a})", "sigmoid": "kiln::sigmoid({a})", "erf": "std::erf({a})",
    "erfc": "std::erfc({a})", "erfinv": "kiln::erfinv({a})", "floor": "std::floor({a})",
    "ceil": "std::ceil({a})", "round": "std::nearbyint({a})", "trunc": "std::trunc({a})",
    "sign": "kiln::sign({a})", "isnan": "std::isnan({a})", "isinf": "std::isinf({a})",
    "relu": "kiln::relu({a})", "reciprocal": "({t}(1) / {a})", "logical_not": "(!({a}))",
    "bitwise_not": "(~({a}))", "square": "({a} * {a})", "lgamma": "std::lgamma({a})",
    "signbit": "kiln::signbit({a})", "frac": "kiln::frac({a})",
}  # fmt: skip
INT_UNARY: dict[str, str] = {
    "abs": "kiln::iabs({a})", "floor": "({a})", "ceil": "({a})", "round": "({a})",
    "trunc": "({a})", "isnan": "false", "isinf": "false", "signbit": "({a} < 0)",
    "frac": "{t}(0)", "neg": "kiln::wrap_neg<{t}>({a})", "square": "kiln::wrap_mul<{t}>({a}, {a})",
}  # fmt: skip
BOOL_UNARY: dict[str, str] = {
    "bitwise_not": "(!({a}))", "abs": "({a})", "neg": "({a})", "sign": "({a})", "relu": "({a})",
    "signbit": "false",
}  # fmt: skip

FLOAT_BINARY: dict[str, str] = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "truediv": "({a} / {b})",
    "floordiv": "kiln::float_floordiv({a}, {b})", "truncdiv": "std::trunc({a} / {b})",
    "mod": "std::fmod({a}, {b})", "fmod": "std::fmod({a}, {b})",
    "remainder": "kiln::float_remainder({a}, {b})", "pow": "std::pow({a}, {b})",
    "maximum": "kiln::maximum({a}, {b})", "minimum": "kiln::minimum({a}, {b})",
    "fmax": "std::fmax({a}, {b})", "fmin": "std::fmin({a}, {b})",
    "eq": "({a} == {b})", "ne": "({a} != {b})", "lt": "({a} < {b})", "le": "({a} <= {b})",
    "gt": "({a} > {b})", "ge": "({a} >= {b})",
    "logical_and": "(({a} != 0) && ({b} != 0))", "logical_or": "(({a} != 0) || ({b} != 0))",
    "logical_xor": "(({a} != 0) != ({b} != 0))",
    "bitwise_and": "({a} & {b})", "bitwise_or": "({a} | {b})", "bitwise_xor": "({a} ^ {b})",
    "bitwise_left_shift": "kiln::shl({a}, {b})", "bitwise_right_shift": "kiln::shr({a}, {b})",
    "atan2": "std::atan2({a}, {b})", "copysign": "std::copysign({a}, {b})",
    "hypot": "std::hypot({a}, {b})", "nextafter": "std::nextafter({a}, {b})",
}  # fmt: skip
# Note [Integer arithmetic wraps] (prelude.py): add, sub, mul of integers in an unsigned type
INT_BINARY: dict[str, str] = {
    "add": "kiln::wrap_add<{t}>({a}, {b})", "sub": "kiln::wrap_sub<{t}>({a}, {b})",
    "mul": "kiln::wrap_mul<{t}>({a}, {b})",
    "truediv": "(static_cast<float>({a}) / static_cast<float>({b}))",
    "floordiv": "kiln::int_floordiv<{t}>({a}, {b})", "truncdiv": "kiln::int_truncdiv<{t}>({a}, {b})",
    "mod": "kiln::int_mod<{t}>({a}, {b})", "fmod": "kiln::int_mod<{t}>({a}, {b})",
    "remainder": "kiln::int_remainder<{t}>({a}, {b})", "pow": "kiln::int_pow<{t}>({a}, {b})",
    "maximum": "std::max<{t}>({a}, {b})", "minimum": "std::min<{t}>({a}, {b})",
    "fmax": "std::max<{t}>({a}, {b})", "fmin": "std::min<{t}>({a}, {b})",
}  # fmt: skip
BOOL_BINARY: dict[str, str] = {
    "add": "({a} || {b})", "mul": "({a} && {b})", "maximum": "({a} || {b})",
    "minimum": "({a} && {b})", "bitwise_and": "({a} && {b})", "bitwise_or": "({a} || {b})",
    "bitwise_xor": "({a} != {b})", "sub": "({a} != {b})",
}  # fmt: skip

# ops whose half-type spelling differs from float's (they depend on the type's own precision)
HALF_BINARY: dict[torch.dtype, dict[str, str]] = {
    torch.bfloat16: {"nextafter": "kiln::nextafter_bf16({a}, {b})"},
    torch.float16: {"nextafter": "kiln::nextafter_fp16({a}, {b})"},
}

SPELLINGS = OpSpellings(
    FLOAT_UNARY, FLOAT_BINARY, INT_UNARY, INT_BINARY, BOOL_UNARY, BOOL_BINARY, HALF_BINARY
)


def spell(name: str, dtype: torch.dtype, *operands: str) -> str:
    """The C++ expression of math op ``name`` on operands of compute dtype ``dtype``."""
    fmt = SPELLINGS.lookup(name, dtype, len(operands) == 1)
    if fmt is None:
        raise NotImplementedError(f"no C++ spelling of ops.{name}")
    a = operands[0]
    b = operands[1] if len(operands) > 1 else ""
    return fmt.format(a=a, b=b, t=compute_type(dtype))


# -------------------------------------------------------------------------------------------
# index expressions


# Note [Python's modulus in C++ index expressions]: a size used as a scalar under symbolic sizes
# brings sympy's Mod (Python's modulus: the result takes the divisor's sign) into index and value
# expressions, e.g. `(1 - n) % 3` is `Mod(1 - s0, 3)`. The C++ printer declined it, so a graph
# with one fell back to static shapes and compiled once per size (issue 17: 5 graphs for the
# dynamic probe `scalar_floor_division` where torch.compile makes 1 under dynamic=True). It is
# printed as the Triton printer prints it (kiln_loopir's IndexPrinter with `python_mod`): over a
# divisor known positive (sizes are), a dividend that sympy proves non-negative (loop variables,
# sizes, their sums and products) keeps C++'s plain `%`, where truncation and floor agree; any
# other is brought back into [0, b) as `((a % b) + b) % b` (Note [Floor division of values that
# may be negative] in kiln_loopir.indexing, which does the same for `FloorDiv`). A divisor not
# known positive is still declined (the kernel runs in the interpreter, a symbolic graph falls
# back to static sizes) rather than guessed.
class CppIndexPrinter(IndexPrinter):
    """Index expressions as int64 C++: ``INT64_C`` literals, ``std::min<int64_t>``; sympy's
    ``Mod`` too (Note [Python's modulus in C++ index expressions])."""

    python_mod = True

    def __init__(self, names: dict[sympy.Symbol, str] | None = None) -> None:
        self.names = names

    def integer(self, value: int) -> str:
        return f"INT64_C({value})"

    def symbol(self, symbol: sympy.Symbol) -> str:
        return self.names.get(symbol, symbol.name) if self.names else symbol.name

    def minmax(self, is_min: bool, a: str, b: str) -> str:
        return f"{'std::min' if is_min else 'std::max'}<int64_t>({a}, {b})"

    # Note [Floats of sizes in C++]: a float computed from sizes (`torch.full(shape, n / 3)`,
    # Note [Python float arithmetic on sizes, in its order] in kiln_symbolic) is one double
    # operation per Python operation, in Python's order (Note [Floats of sizes in a printer] in
    # kiln_loopir): int operands (sizes, their integer expressions) are converted to double
    # first, as Python converts an int meeting a float (exact below 2**53; an int / int true
    # division of such ints is the correctly rounded quotient, as Python's); float literals are
    # printed with Python's repr, which C++ reads back as the same double; C's pow and sqrt, as
    # Python's float ** and math.sqrt. `index_expr` then converts the double to the kernel's
    # type, as eager converts the Python scalar.
    float_spellings: Mapping[str, str] = {
        "FloatTrueDiv": "({a} / {b})", "FloatMul": "({a} * {b})", "FloatAdd": "({a} + {b})",
        "FloatSub": "({a} - {b})", "FloatNeg": "(-{a})", "FloatPow": "std::pow({a}, {b})",
        "FloatSqrt": "std::sqrt({a})", "ToFloat": "{a}",
    }  # fmt: skip
    # Note [Integers of floats of sizes] (kiln_symbolic): `math.floor` / `ceil` / `trunc` of the
    # double, converted to int64 (exact: the double is integral after rounding)
    int_of_float_spellings: Mapping[str, str] = {
        "FloorOfFloat": "static_cast<int64_t>(std::floor({a}))",
        "CeilOfFloat": "static_cast<int64_t>(std::ceil({a}))",
        "TruncOfFloat": "static_cast<int64_t>(std::trunc({a}))",
    }

    def float_literal(self, value: float) -> str:
        return f"({value!r})"

    def int_as_double(self, text: str) -> str:
        return f"static_cast<double>({text})"


_PRINTER = CppIndexPrinter()


def index_to_cpp(expr: sympy.Expr, names: dict[sympy.Symbol, str] | None = None) -> str:
    """A sympy index expression as int64 C++ (loop variables by name; Note [Floor division of
    values that may be negative] in kiln_loopir.indexing)."""
    return (CppIndexPrinter(names) if names else _PRINTER).print(expr)
