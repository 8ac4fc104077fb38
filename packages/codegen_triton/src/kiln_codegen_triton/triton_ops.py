"""Triton spellings of dtypes, constants, index expressions and the ``ops.*`` math set.

Every table maps an op name to a format string over the operands ``{a}``/``{b}``; the kernel's
ops handler (``kernel.KernelBuilder``) casts the operands to the op's compute dtype first, so a
spelling never has to think about promotion. Values of a half type (bfloat16, float16) are held
in float32: loads widen, stores narrow, and ``to_dtype`` to a half type rounds (the lowerings put
one after every op, as eager rounds each op's result), so kernels compute in float32 and still
round where eager does.

Math that ``triton.language`` has no exact builtin for is spelled ``libdevice.<fn>``; the kernel
module binds ``libdevice`` to Triton's CUDA library, or, under ``TRITON_INTERPRET=1`` where
extern calls do not exist, to :mod:`kiln_codegen_triton.interp`'s numpy/torch emulation.
Helpers too long for one expression (NaN-propagating maximum, Python's remainder, ...) are
``@triton.jit`` functions in :data:`PRELUDE`, which every generated module starts with.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import sympy
import torch

from kiln_loopir.codegen_common import (
    FLOAT_ONLY,
    HALF,
    IndexPrinter,
    IntOfFloat,
    OpSpellings,
    UnsupportedDtype,
    constant_value,
)

from .interp import interpreting

TL_TYPES: dict[torch.dtype, str] = {
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.bfloat16: "tl.bfloat16",
    torch.float16: "tl.float16",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.bool: "tl.int1",
}


def tl_type(dtype: torch.dtype) -> str:
    """The Triton type a value of ``dtype`` is stored as."""
    try:
        return TL_TYPES[dtype]
    except KeyError:
        raise UnsupportedDtype(str(dtype)) from None


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value of ``dtype`` is held in inside a kernel (float32 for the half types)."""
    return torch.float32 if dtype in HALF else dtype


def compute_type(dtype: torch.dtype) -> str:
    return tl_type(compute_dtype(dtype))


def constant_expr(value: object, dtype: torch.dtype) -> str:
    """A Python scalar as a Triton expression of ``dtype``'s compute type."""
    ttype = compute_type(dtype)
    if dtype == torch.bool:
        return f"tl.full([], {bool(value)}, tl.int1)"
    if dtype.is_floating_point:
        f = float(constant_value(value, dtype))
        if math.isnan(f):
            text = 'float("nan")'
        elif math.isinf(f):
            text = 'float("-inf")' if f < 0 else 'float("inf")'
        elif f == 0.0 and math.copysign(1.0, f) < 0:
            # Note [Negative zero constants]: Triton builds every constant equal to 0 as its null
            # value, +0.0 (`x + -0.0` of a -0.0 element was +0.0, eager's -0.0). Its negation is
            # no way out: Triton 3.6 lowers `-t` of a float as `0.0 - t`, +0.0 again (found on an
            # H100: the negated spelling passed under the interpreter and on Triton 3.8 only).
            # The sign bit alone, reinterpreted as the float, is -0.0 in every version; the
            # compiler then folds `x + -0.0` to `x`, which is exact.
            bits = "tl.int64" if ttype == "tl.float64" else "tl.int32"
            sign = -(2**63) if ttype == "tl.float64" else -(2**31)
            return f"tl.full([], {sign}, {bits}).to({ttype}, bitcast=True)"
        else:
            text = repr(f)
        return f"tl.full([], {text}, {ttype})"
    i = int(constant_value(value, dtype))  # wrapped like a tensor conversion
    return f"tl.full([], {i}, {ttype})"


def convert_expr(value: str, src: torch.dtype, dst: torch.dtype) -> str:
    """``value`` (held as ``src``'s compute type) as ``dst``'s compute type."""
    if src == dst:
        return value
    if dst == torch.bool:
        return f"({value} != 0)"
    if dst in HALF:
        # round to the half type, keep holding it in float32 (float64 goes through float32:
        # Triton's interpreter and older GPUs have no direct float64 -> half conversion; so do
        # integers and bools, as eager's c10 conversions do, and the interpreter's bfloat16
        # rounding bit-casts a float32)
        via = "" if compute_dtype(src) == torch.float32 else ".to(tl.float32)"
        if dst == torch.bfloat16 and interpreting():  # Note [bfloat16 in the interpreter]
            return f"k_bf16_round({value}{via})"
        return f"{value}{via}.to({tl_type(dst)}).to(tl.float32)"
    if compute_dtype(src) == compute_dtype(dst):
        return value
    return f"{value}.to({tl_type(dst)})"


def load_expr(dtype: torch.dtype, text: str) -> str:
    """A loaded element widened to the compute type."""
    if dtype == torch.bfloat16 and interpreting():  # Note [bfloat16 in the interpreter]
        return f"k_bf16_widen({text})"
    if dtype in HALF:
        return f"{text}.to(tl.float32)"
    return text


def store_expr(dtype: torch.dtype, value: str) -> str:
    """A compute value narrowed to the memory type."""
    if dtype == torch.bfloat16 and interpreting():  # Note [bfloat16 in the interpreter]
        return f"k_bf16_narrow({value})"
    if dtype in HALF or dtype == torch.bool:
        return f"{value}.to({tl_type(dtype)})"
    return value


# -------------------------------------------------------------------------------------------
# math ops: float spelling, integer spelling (None: same as float), bool spelling (None: int)

FLOAT_UNARY: dict[str, str] = {
    "abs": "tl.abs({a})", "neg": "(-{a})", "exp": "tl.exp({a})", "exp2": "tl.exp2({a})",
    "expm1": "libdevice.expm1({a})", "log": "tl.log({a})", "log1p": "libdevice.log1p({a})",
    "log2": "tl.log2({a})", "log10": "libdevice.log10({a})", "sqrt": "libdevice.sqrt({a})",
    "rsqrt": "libdevice.rsqrt({a})", "sin": "libdevice.sin({a})", "cos": "libdevice.cos({a})",
    "tan": "libdevice.tan({a})", "asin": "libdevice.asin({a})", "acos": "libdevice.acos({a})",
    "atan": "libdevice.atan({a})", "sinh": "libdevice.sinh({a})", "cosh": "libdevice.cosh({a})",
    "tanh": "libdevice.tanh({a})", "asinh": "libdevice.asinh({a})", "acosh": "libdevice.acosh({a})",
    "atanh": "libdevice.atanh({a})", "sigmoid": "k_sigmoid({a})", "erf": "libdevice.erf({a})",
    "erfc": "libdevice.erfc({a})", "erfinv": "libdevice.erfinv({a})",
    "floor": "libdevice.floor({a})", "ceil": "libdevice.ceil({a})",
    "round": "libdevice.nearbyint({a})", "trunc": "libdevice.trunc({a})",
    "sign": "k_sign({a})", "isnan": "({a} != {a})", "isinf": "(tl.abs({a}) == float(\"inf\"))",
    "relu": "k_relu({a})", "reciprocal": "(1.0 / {a})", "logical_not": "({a} == 0)",
    "square": "({a} * {a})", "lgamma": "libdevice.lgamma({a})",
    "signbit": "(libdevice.signbit({a}) != 0)", "frac": "({a} - libdevice.trunc({a}))",
}  # fmt: skip
INT_UNARY: dict[str, str] = {
    "abs": "tl.abs({a})", "floor": "{a}", "ceil": "{a}", "round": "{a}", "trunc": "{a}",
    "isnan": "({a} != {a})", "isinf": "({a} != {a})", "signbit": "({a} < 0)",
    "frac": "({a} - {a})", "bitwise_not": "(~{a})", "sign": "k_sign({a})",
}  # fmt: skip
BOOL_UNARY: dict[str, str] = {
    "bitwise_not": "({a} == 0)", "abs": "{a}", "neg": "{a}", "sign": "{a}", "relu": "{a}",
    "signbit": "({a} != {a})",
}  # fmt: skip

FLOAT_BINARY: dict[str, str] = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "truediv": "({a} / {b})",
    "floordiv": "k_float_floordiv({a}, {b})", "truncdiv": "libdevice.trunc({a} / {b})",
    "mod": "libdevice.fmod({a}, {b})", "fmod": "libdevice.fmod({a}, {b})",
    "remainder": "k_float_remainder({a}, {b})", "pow": "libdevice.pow({a}, {b})",
    "maximum": "k_maximum({a}, {b})", "minimum": "k_minimum({a}, {b})",
    "fmax": "k_fmax({a}, {b})", "fmin": "k_fmin({a}, {b})",
    "eq": "({a} == {b})", "ne": "({a} != {b})", "lt": "({a} < {b})", "le": "({a} <= {b})",
    "gt": "({a} > {b})", "ge": "({a} >= {b})",
    "logical_and": "(({a} != 0) & ({b} != 0))", "logical_or": "(({a} != 0) | ({b} != 0))",
    "logical_xor": "(({a} != 0) != ({b} != 0))",
    "atan2": "libdevice.atan2({a}, {b})", "copysign": "libdevice.copysign({a}, {b})",
    "hypot": "libdevice.hypot({a}, {b})", "nextafter": "libdevice.nextafter({a}, {b})",
}  # fmt: skip
INT_BINARY: dict[str, str] = {
    "floordiv": "k_int_floordiv({a}, {b})", "truncdiv": "({a} // {b})",
    "mod": "({a} % {b})", "fmod": "({a} % {b})", "remainder": "k_int_remainder({a}, {b})",
    "pow": "k_int_pow({a}, {b}, {bits})",
    "maximum": "tl.maximum({a}, {b})", "minimum": "tl.minimum({a}, {b})",
    "fmax": "tl.maximum({a}, {b})", "fmin": "tl.minimum({a}, {b})",
    "bitwise_and": "({a} & {b})", "bitwise_or": "({a} | {b})", "bitwise_xor": "({a} ^ {b})",
    "bitwise_left_shift": "({a} << {b})", "bitwise_right_shift": "({a} >> {b})",
}  # fmt: skip
BOOL_BINARY: dict[str, str] = {
    "add": "({a} | {b})", "mul": "({a} & {b})", "maximum": "({a} | {b})",
    "minimum": "({a} & {b})", "bitwise_and": "({a} & {b})", "bitwise_or": "({a} | {b})",
    "bitwise_xor": "({a} ^ {b})", "sub": "({a} ^ {b})", "fmax": "({a} | {b})", "fmin": "({a} & {b})",
}  # fmt: skip

SPELLINGS = OpSpellings(FLOAT_UNARY, FLOAT_BINARY, INT_UNARY, INT_BINARY, BOOL_UNARY, BOOL_BINARY)


def spell(name: str, dtype: torch.dtype, *operands: str) -> str:
    """The Triton expression of math op ``name`` on operands of compute dtype ``dtype``."""
    if not dtype.is_floating_point and (name in FLOAT_ONLY or name in ("copysign", "hypot", "nextafter")):
        raise NotImplementedError(f"ops.{name} on {dtype}")
    fmt = SPELLINGS.lookup(name, dtype, len(operands) == 1)
    if name == "bitwise_not" and dtype == torch.uint8:
        # Triton's `~` xors with an all-ones constant that its interpreter builds as the Python
        # integer -1, which numpy refuses for uint8 (the kernel failed at run time and the graph
        # ran eagerly); all ones spelled as a uint8 255 is the same on a GPU
        fmt = "({a} ^ tl.full([], 255, tl.uint8))"
    if fmt is None:
        raise NotImplementedError(f"no Triton spelling of ops.{name}")
    b = operands[1] if len(operands) > 1 else ""
    return fmt.format(a=operands[0], b=b, bits=dtype.itemsize * 8 - 1)


# -------------------------------------------------------------------------------------------
# index expressions


class TritonIndexPrinter(IndexPrinter):
    """Index expressions as Triton integer arithmetic: ``//`` (truncating, made floor-correct
    where a value may be negative), ``tl.minimum``; sympy's ``Mod`` too (symbolic sizes bring it
    in), and a digit by 1 undivided."""

    div = "//"
    unit_digit = True
    python_mod = True

    # Note [Integers of floats of sizes in Triton]: the kernel being generated, while it prints,
    # names each integer of a float of sizes (kiln_symbolic's Note [Integers of floats of
    # sizes]) as an int argument (`ki0`) that the wrapper computes once per call in Python, as
    # a float of sizes is (Note [Floats of sizes in Triton] in kernel.py): Triton's float32
    # arithmetic would round `float(n) * 1.5` differently. Outside a kernel it declines.
    derived: dict[Any, str] | None = None

    def minmax(self, is_min: bool, a: str, b: str) -> str:
        return f"{'tl.minimum' if is_min else 'tl.maximum'}({a}, {b})"

    def int_of_float(self, expr: IntOfFloat) -> str:
        if self.derived is None:
            return super().int_of_float(expr)
        return self.derived.setdefault(expr, f"ki{len(self.derived)}")


_PRINTER = TritonIndexPrinter()


@contextlib.contextmanager
def deriving_ints(names: dict[Any, str]) -> Iterator[None]:
    """Note [Integers of floats of sizes in Triton]: while the block runs, integers of floats of
    sizes print as the argument names recorded in ``names``."""
    saved, _PRINTER.derived = _PRINTER.derived, names
    try:
        yield
    finally:
        _PRINTER.derived = saved


def index_to_triton(expr: sympy.Expr) -> str:
    """A sympy index expression as Triton integer arithmetic (variables by name).

    ``//`` and ``%`` truncate in Triton: an operand not known non-negative is divided by floor
    (Note [Floor division of values that may be negative], kiln_loopir.indexing).
    """
    return _PRINTER.print(expr)


# -------------------------------------------------------------------------------------------
# what every generated module starts with

# Note [bfloat16 in the interpreter]: Triton's interpreter converts float32 to bfloat16 by
# dropping the low 16 bits (round toward zero) whatever rounding mode is asked, and mishandles
# subnormals in both directions; a GPU rounds to nearest, ties to even, as eager does. So an
# explicit `.to(torch.bfloat16)` fused into a float32 kernel differed from eager by up to one
# bfloat16 ulp per element under TRITON_INTERPRET=1 (issue 19). Under the interpreter the three
# conversions are spelled with integer bit operations, which round exactly as eager does
# (NaN stays NaN); on a GPU the native conversions are kept.
PRELUDE = """
@triton.jit
def k_bf16_round(x):
    bits = x.to(tl.uint32, bitcast=True)
    up = bits + 0x7FFF + ((bits >> 16) & 1)
    return tl.where(x != x, x, ((up >> 16) << 16).to(tl.float32, bitcast=True))


@triton.jit
def k_bf16_narrow(x):
    r = k_bf16_round(x.to(tl.float32))
    return (r.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def k_bf16_widen(x):
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def k_bf16_atomic_add(ptr, value, mask, base):
    # Note [16-bit atomic adds]: a compare-and-swap loop on each 16-bit element; a lane that is
    # masked off or done swaps the value it read for itself (at `base` when masked: in bounds)
    p = tl.where(mask, ptr, base).to(tl.pointer_type(tl.int16), bitcast=True)
    todo = mask
    old = tl.load(p)
    add = k_bf16_widen(value)
    while tl.max(todo.to(tl.int32), axis=None) > 0:
        sum = k_bf16_narrow(k_bf16_widen(old.to(tl.bfloat16, bitcast=True)) + add)
        new = tl.where(todo, sum.to(tl.int16, bitcast=True), old)
        seen = tl.atomic_cas(p, old, new, sem="relaxed")
        todo = todo & (seen != old)
        old = seen

@triton.jit
def k_maximum(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def k_minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def k_fmax(a, b):
    return tl.where((a >= b) | (b != b), a, b)


@triton.jit
def k_fmin(a, b):
    return tl.where((a <= b) | (b != b), a, b)


@triton.jit
def k_sigmoid(a):
    return 1.0 / (1.0 + tl.exp(-a))


@triton.jit
def k_relu(a):
    return tl.where(a < 0, 0, a).to(a.dtype)


@triton.jit
def k_sign(a):
    return (a > 0).to(a.dtype) - (a < 0).to(a.dtype)


@triton.jit
def k_float_floordiv(a, b):
    # eager's algorithm (fmod-based, so inf // x is nan as in eager)
    q = a / b
    m = libdevice.fmod(a, b)
    d = (a - m) / b
    d = tl.where((m != 0) & ((b < 0) != (m < 0)), d - 1, d)
    f = libdevice.floor(d)
    f = tl.where(d - f > 0.5, f + 1, f)
    f = tl.where(d == 0, q * 0.0, f)
    return tl.where(b == 0, q, f)


@triton.jit
def k_float_remainder(a, b):
    r = libdevice.fmod(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def k_int_floordiv(a, b):
    q = a // b
    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def k_int_remainder(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def k_nextafter_half(a, b, HALF: tl.constexpr):
    # a and b hold half values in float32: step a's 16-bit pattern toward b
    bits = a.to(HALF).to(tl.int16, bitcast=True)
    away = (a < b) == (a > 0)
    stepped = tl.where(away, bits + 1, bits - 1).to(tl.int16)
    tiny = tl.where(b > 0, 1, -32767).to(tl.int16)
    out = tl.where(a == 0, tiny, stepped).to(HALF, bitcast=True).to(tl.float32)
    out = tl.where(a == b, b, out)
    return tl.where((a != a) | (b != b), a + b, out)


@triton.jit
def k_int_pow(a, b, BITS: tl.constexpr):
    # square-and-multiply over the exponent's bits (negative exponents are an error in eager)
    zero = a * 0 + b * 0
    result = zero + 1
    base = a + zero
    e = b + zero
    for _ in tl.static_range(BITS):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    # a negative exponent: 1 and -1 stay units, every other base truncates to 0
    unit = tl.where(a == 1, 1, tl.where(a == -1, tl.where((b & 1) != 0, -1, 1), 0)).to(result.dtype)
    return tl.where(b < 0, unit, result)


@triton.jit
def k_sum(a, b):
    return a + b


@triton.jit
def k_prod(a, b):
    return a * b


@triton.jit
def k_max(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def k_min(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def k_argmax(v1, i1, v2, i2):
    nan1 = v1 != v1
    nan2 = v2 != v2
    better = (v1 > v2) | (nan1 & (~nan2))
    same = (v1 == v2) | (nan1 & nan2)
    pick = better | (same & (i1 < i2))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)


@triton.jit
def k_argmin(v1, i1, v2, i2):
    nan1 = v1 != v1
    nan2 = v2 != v2
    better = (v1 < v2) | (nan1 & (~nan2))
    same = (v1 == v2) | (nan1 & nan2)
    pick = better | (same & (i1 < i2))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)


@triton.jit
def k_welford(mean1, m2_1, w1, mean2, m2_2, w2):
    w = w1 + w2
    delta = mean2 - mean1
    frac = tl.where(w == 0, 0.0, w2 / tl.where(w == 0, 1.0, w))
    return mean1 + delta * frac, m2_1 + m2_2 + delta * delta * w1 * frac, w
"""
