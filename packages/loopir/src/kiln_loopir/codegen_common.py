"""What every code generator shares below its own spellings (issue 15, "one floor down").

A code generator turns loopir's ``ops.*`` calls into source text of one language. The parts that
do not depend on the language live here, so that a backend fills in tables and hooks only:

* type promotion of the ``ops.*`` math set (:func:`result_dtype`, :data:`ALWAYS_BOOL`,
  :data:`FLOAT_ONLY`) and the value a scalar constant has in a dtype (:func:`constant_value`);
* how a spelling is looked up for an op and a compute dtype (:class:`OpSpellings`: float,
  integer and bool tables, most specific first);
* the printer of sympy index expressions (:class:`IndexPrinter`: the recursion over
  ``FloorDiv`` / ``ModularIndexing`` / ``Min`` / ``Max`` / powers, with floor-correct division of
  values that may be negative, Note [Floor division of values that may be negative] in
  ``indexing.py``); a backend says how integers, symbols and ``min``/``max`` are written, and
  fills in the tables of how a float of sizes is spelled (Note [Floats of sizes in a printer]);
* the size helpers both kernel builders use (:func:`size_of`, :func:`same_size`,
  :func:`real_reduction`, :func:`unflatten`) and the parts of their ``ops`` handlers that print
  nothing of their own (:class:`OpsHandlerBase`: the state every builder sets up, constants as
  values, operand promotion, the trivial reduction, fresh variable names, parameters, the lookup
  of common subexpressions and forwarded stores through the scopes);
* which stores of kernel-internal buffers a kernel keeps (Note [Stores of kernel-internal
  buffers]: :func:`marked_store`, :func:`unmark_stores`, ``OpsHandlerBase._internal_stores``).

Note [Shared code generation parts]: what moves here is what the C++ and Triton generators held
twice with the same logic; the generators import it from here (``cpp_ops.HALF`` and
``UnsupportedDtype`` stay importable where they were), and the generated source is byte for byte
what it was.
What only looks alike stays with its generator (the value classes: a C++ value carries a
``const`` flag of its own, a Triton value its block axes and constness from its Python value;
the wrappers' symbolic input checks, extern calls, allocation, buffer placement and launch
code, which differ; the spelling tables and launch heuristics, which are each language's own;
the kernel builders' constructors, which restate the five arguments ``OpsHandlerBase`` keeps
before their own, as Python cannot inherit a signature). The wrappers share the names their
sources use (``wrapper_support.wrapper_namespace``), the walk over the schedule and a kernel
node's step in it (``wrapper_support.WrapperSteps``, Note [A kernel step in a wrapper]), a
static input's check (Note [Strides of size-one dims of inputs]) and what runs a declined
kernel (``interpret.members_runner``); the backends record and refuse declined kernels through
``Backend.decline`` and ``Backend.refuse_declined_symbolic`` (Note [Declined kernels]); their
tests set up their session and compare through ``kiln_loopir.testing`` (Note [A code
generator's test session], ``check_compiled``). A scheduler node's kernel members and what each
reads are ``BaseSchedulerNode.members()`` / ``member_reads()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import sympy
import torch

# re-exported for the code generators, which do not import kiln_symbolic (Note [Floats of sizes
# in a printer])
from kiln_symbolic import FloatOp, IntOfFloat

from .indexing import FloorDiv, ModularIndexing, contiguous_strides, floor_division_text, floor_modulo_text
from .ir import ComputedBuffer

HALF = (torch.bfloat16, torch.float16)


class UnsupportedDtype(Exception):
    """A dtype a code generator cannot hold (complex, float8, ...)."""


# -------------------------------------------------------------------------------------------
# type promotion

ALWAYS_BOOL = {
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
    "isnan", "isinf", "signbit",
}  # fmt: skip

FLOAT_ONLY = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sigmoid", "erf",
    "erfc", "erfinv", "reciprocal", "lgamma", "atan2",
}  # fmt: skip


@cache
def result_dtype(name: str, dtypes: tuple[tuple[torch.dtype, bool], ...]) -> torch.dtype:
    """The dtype of ``ops.name`` on operands (dtype, is_scalar_constant), as eager computes it.

    Scalar constants behave like 0-dim tensors in type promotion (they do not upcast a tensor of
    the same category), which is what the reference interpreter's ``ops.constant`` gives.
    """
    if name in ALWAYS_BOOL:
        return torch.bool
    args = [torch.zeros((), dtype=d) if const else torch.zeros((1,), dtype=d) for d, const in dtypes]
    promoted = torch.result_type(args[0], args[1]) if len(args) == 2 else args[0].dtype
    if (name == "truediv" or name in FLOAT_ONLY) and not promoted.is_floating_point:
        return torch.get_default_dtype()
    return promoted


def math_dtypes(name: str, key: tuple[tuple[torch.dtype, bool], ...]) -> tuple[torch.dtype, torch.dtype]:
    """(result dtype, operand dtype) of ``ops.name`` on operands ``key`` (as :func:`result_dtype`):
    the operands are cast to the operand dtype, the op computed there, and the result converted.
    A comparison's operands meet at their common type, its result is bool."""
    out = result_dtype(name, key)
    if name not in ALWAYS_BOOL:
        return out, out
    return out, key[0][0] if len(key) == 1 else result_dtype("add", key)


def scalar_dtype(value: Any) -> torch.dtype:
    """The dtype a bare Python scalar operand takes (bool, int64, or the default float dtype)."""
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    return torch.get_default_dtype()


def constant_value(value: Any, dtype: torch.dtype) -> bool | float | int:
    """The Python scalar ``value`` as a tensor of ``dtype`` holds it: a half type's float rounded
    to that type, an integer wrapped into the type's range (as a tensor conversion wraps)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        f = float(value)
        if dtype in HALF:
            f = float(torch.tensor(f, dtype=dtype).float())
        return f
    i = int(value)
    info = torch.iinfo(dtype)
    return (i - info.min) % (info.max - info.min + 1) + info.min


# -------------------------------------------------------------------------------------------
# op spellings


@dataclass(frozen=True)
class OpSpellings:
    """A language's spellings of the ``ops.*`` math set: format strings over ``{a}``/``{b}`` (and
    whatever fields the backend fills in), per operand category. An integer op without an
    integer spelling uses the float one; a bool op without a bool spelling the integer one, then
    the float one. ``half_binary`` holds binary ops whose half-type spelling differs."""

    float_unary: Mapping[str, str]
    float_binary: Mapping[str, str]
    int_unary: Mapping[str, str]
    int_binary: Mapping[str, str]
    bool_unary: Mapping[str, str]
    bool_binary: Mapping[str, str]
    half_binary: Mapping[torch.dtype, Mapping[str, str]] = field(default_factory=dict)

    def lookup(self, name: str, dtype: torch.dtype, unary: bool) -> str | None:
        """The format string of ``ops.name`` on operands of compute dtype ``dtype`` (None: none)."""
        tables: list[Mapping[str, str]] = []
        if dtype in self.half_binary and not unary:
            tables.append(self.half_binary[dtype])
        if dtype == torch.bool:
            tables.append(self.bool_unary if unary else self.bool_binary)
        if not dtype.is_floating_point:
            tables.append(self.int_unary if unary else self.int_binary)
        tables.append(self.float_unary if unary else self.float_binary)
        for table in tables:
            fmt = table.get(name)
            if fmt is not None:
                return fmt
        return None


# -------------------------------------------------------------------------------------------
# index expressions


class IndexPrinter:
    """Prints a sympy index expression as a language's integer arithmetic.

    A backend subclasses it and says how an integer literal, a symbol and ``min``/``max`` are
    written and which operator truncates an integer division (``div``); a division or modulus
    of a value that may be negative is made floor-correct here (Note [Floor division of values
    that may be negative] in ``indexing.py``). ``unit_digit``: a ``ModularIndexing`` by a divisor
    of 1 prints its base undivided; ``python_mod``: sympy's ``Mod`` (Python's, the divisor's
    sign) is printed for a divisor known positive (otherwise it is not an index expression)."""

    div = "/"
    unit_digit = False
    python_mod = False

    def integer(self, value: int) -> str:
        return str(value)

    def symbol(self, symbol: sympy.Symbol) -> str:
        return symbol.name

    def minmax(self, is_min: bool, a: str, b: str) -> str:
        raise NotImplementedError

    def floor_div(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return floor_division_text(a, b, self.print(a), self.print(b), self.div)

    def print(self, expr: Any) -> str:
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return self.integer(int(expr))
        if isinstance(expr, sympy.Symbol):
            return self.symbol(expr)
        if isinstance(expr, sympy.Add):
            return "(" + " + ".join(self.print(a) for a in expr.args) + ")"
        if isinstance(expr, sympy.Mul):
            return "(" + " * ".join(self.print(a) for a in expr.args) + ")"
        if isinstance(expr, FloorDiv):
            a, b = expr.args
            return self.floor_div(a, b)
        if isinstance(expr, ModularIndexing):
            a, d, m = expr.args
            inner = self.print(a) if self.unit_digit and d == 1 else self.floor_div(a, d)
            return floor_modulo_text(a, m, inner, self.print(m))
        if self.python_mod and isinstance(expr, sympy.Mod):
            # sympy's Mod is Python's (the sign of the divisor); sizes in symbolic graphs bring it
            # in (CUDA attention pads a mask to a multiple of 8: Mod(-s0, 8)). A truncating % is
            # brought back into [0, b) for a positive divisor.
            a, b = expr.args
            if not b.is_positive:
                raise NotImplementedError(f"index expression {expr} (Mod by a divisor not known positive)")
            return floor_modulo_text(a, b, self.print(a), self.print(b))
        if isinstance(expr, sympy.Min | sympy.Max):
            is_min = isinstance(expr, sympy.Min)
            out = self.print(expr.args[0])
            for a in expr.args[1:]:
                out = self.minmax(is_min, out, self.print(a))
            return out
        if isinstance(expr, sympy.Pow) and expr.args[1].is_Integer and int(expr.args[1]) > 0:
            base = self.print(expr.args[0])
            return "(" + " * ".join([base] * int(expr.args[1])) + ")"
        if isinstance(expr, FloatOp):
            return self.float_op(expr)
        if isinstance(expr, IntOfFloat):
            return self.int_of_float(expr)
        if isinstance(expr, sympy.Rational):
            raise NotImplementedError(f"non-integer index {expr}")
        raise NotImplementedError(f"index expression {expr} ({type(expr).__name__})")

    # Note [Floats of sizes in a printer]: a float of sizes (Note [Python float arithmetic on
    # sizes, in its order] in kiln_symbolic) prints as one double operation of the language per
    # Python operation, in Python's order; an integer part of one (Note [Integers of floats of
    # sizes]) as the language's rounding of that double. A backend fills in the two tables,
    # keyed by the function's name (``"FloatTrueDiv"``: ``"({a} / {b})"``), and says how a float
    # literal and an integer operand become doubles; with the tables empty it declines, and the
    # graph compiles with static sizes. A literal must read back as the same double, and an
    # integer converts exactly (sizes are below 2**53), as Python converts an int meeting a float.
    float_spellings: Mapping[str, str] = {}
    int_of_float_spellings: Mapping[str, str] = {}

    def float_op(self, expr: FloatOp) -> str:
        """A float of sizes as the language's double arithmetic (Note [Floats of sizes in a
        printer])."""
        fmt = self.float_spellings.get(type(expr).__name__)
        if fmt is None:
            raise NotImplementedError(f"a float of sizes ({expr}) in {type(self).__name__}")
        return fmt.format(**dict(zip("ab", (self._double(a) for a in expr.args), strict=False)))

    def int_of_float(self, expr: IntOfFloat) -> str:
        """The integer part of a float of sizes (Note [Floats of sizes in a printer])."""
        fmt = self.int_of_float_spellings.get(type(expr).__name__)
        if fmt is None:
            raise NotImplementedError(f"an integer of a float of sizes ({expr}) in {type(self).__name__}")
        return fmt.format(a=self._double(expr.args[0]))

    def float_literal(self, value: float) -> str:
        """A finite float literal that the language reads back as the same double."""
        raise NotImplementedError

    def int_as_double(self, text: str) -> str:
        """An integer expression's text converted to double."""
        raise NotImplementedError

    def _double(self, e: sympy.Expr) -> str:
        if isinstance(e, FloatOp):
            return self.float_op(e)
        if isinstance(e, sympy.Float):
            value = float(e)
            if not math.isfinite(value):
                raise NotImplementedError(f"a float of sizes with a non-finite literal ({e})")
            return self.float_literal(value)
        if not e.is_integer:
            raise NotImplementedError(f"a float of sizes with a non-integer operand ({e})")
        return self.int_as_double(self.print(e))


# -------------------------------------------------------------------------------------------
# sizes of a kernel's iteration space


def size_of(expr: Any) -> Any:
    """A size: an int, or (Note [Symbolic sizes in loopir]) its sympy expression."""
    expr = sympy.sympify(expr)
    return int(expr) if expr.is_Integer else expr


def same_size(a: Any, b: Any) -> bool:
    """Equal for every value of the size symbols (ints: plain equality)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(a == b or sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0)


def real_reduction(buffer: ComputedBuffer) -> bool:
    """A reduction over more than one element (one over a single element is just its value;
    a symbolic extent counts as more than one: the general path is right for one element too)."""
    return buffer.is_reduction() and math.prod(size_of(s) for s in buffer.iteration()[1]) != 1


def unflatten(flat: sympy.Expr, sizes: Sequence[Any]) -> list[sympy.Expr]:
    """The row-major digits of ``flat`` for dims ``sizes``."""
    strides = contiguous_strides([sympy.sympify(s) for s in sizes])
    out: list[sympy.Expr] = []
    for pos, (size, stride) in enumerate(zip(sizes, strides, strict=True)):
        if size == 1:
            out.append(sympy.Integer(0))
        elif pos == 0:
            out.append(FloorDiv(flat, stride))
        else:
            out.append(ModularIndexing(flat, stride, sympy.sympify(size)))
    return out


# -------------------------------------------------------------------------------------------
# stores of kernel-internal buffers

# Note [Stores of kernel-internal buffers]: a kernel stores every buffer its members compute, but a
# buffer internal to the kernel (the buffer plan says nothing after it reads it) needs memory only
# if the kernel loads it back from memory (a load the store forwards to reads the stored value
# instead and is not counted in ``loaded``). Which loads go to memory is known only once every
# member's body has run, so a kernel builder emits each store as a line marked with its buffer
# (:func:`marked_store`), and when it renders, :meth:`OpsHandlerBase._internal_stores` says which
# internal buffers' stores are dropped and which are scratch memory the wrapper allocates, and
# :func:`unmark_stores` drops or unmarks each store line.
STORE_MARK = "\x00store:"


def marked_store(name: str, line: str) -> str:
    """``line``, a store of buffer ``name``, marked for :func:`unmark_stores`."""
    return f"{STORE_MARK}{name}\x00{line}"


def unmark_stores(lines: Sequence[str], elided: Set[str]) -> list[str]:
    """``lines`` as they are rendered: a store of an ``elided`` buffer left out, every other marked
    store unmarked (:func:`marked_store`), any other line as it is."""
    out = []
    for line in lines:
        if not line.startswith(STORE_MARK):
            out.append(line)
            continue
        name, _, store = line[len(STORE_MARK) :].partition("\x00")
        if name not in elided:
            out.append(store)
    return out


# -------------------------------------------------------------------------------------------
# the ops handler's skeleton


class OpsHandlerBase:
    """What a kernel builder's ``ops`` handler does the same way in every language.

    The state every builder keeps is set by ``__init__``; a subclass keeps ``scopes`` (a stack of
    ``(lines, cse, forwarded stores)``, innermost last) and implements ``constant`` (a Python scalar as a value of
    its value class ``value_type``), ``_as`` (a value converted to a dtype) and ``_math``; it
    names its own ``unsupported`` exception. Values are the subclass's: this class only moves
    them around.
    """

    value_type: type = object
    unsupported: type[Exception] = NotImplementedError
    scopes: list[tuple[list[str], dict[Any, Any], dict[Any, Any]]]

    def __init__(
        self,
        name: str,
        members: Sequence[ComputedBuffer],
        reads: Sequence[Set[str]],
        dtypes: dict[str, torch.dtype],
        internal: set[str],
    ) -> None:
        """The state every kernel builder keeps: the kernel's name, its member buffers and what
        each reads, every buffer's dtype, the buffers internal to the kernel; the last fresh
        variable's number, the parameters in first-use order, the buffers loaded and stored, and
        whether the reduction being generated is trivial (a reduction over one element)."""
        self.name = name
        self.members = list(members)
        self.reads = list(reads)
        self.dtypes = dtypes
        self.internal = internal
        self.counter = 0
        self.param_order: list[str] = []
        self.loaded: set[str] = set()
        self.stored: set[str] = set()
        self.trivial = False

    def constant(self, value: Any, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def _as(self, v: Any, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def _math(self, name: str, *args: Any) -> Any:
        raise NotImplementedError

    def _new(self, prefix: str = "tmp") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    @property
    def lines(self) -> list[str]:
        return self.scopes[-1][0]

    def _computed(self, expr: str, dtype: torch.dtype) -> Any:
        """The value of ``expr`` at ``dtype`` that this scope or an enclosing one already holds
        (common subexpressions), or None."""
        for _, cse, _ in reversed(self.scopes):
            hit = cse.get(expr)
            if hit is not None and hit.dtype == dtype:
                return hit
        return None

    def _forwarded(self, key: tuple[str, str]) -> Any:
        """The value this scope or an enclosing one stored at ``key`` (buffer name, index text),
        which a later load reads instead of memory; or None."""
        for _, _, fwd in reversed(self.scopes):
            hit = fwd.get(key)
            if hit is not None:
                return hit
        return None

    def _internal_stores(self) -> tuple[set[str], list[str]]:
        """(the internal buffers whose stores are dropped, those stored as scratch memory): Note
        [Stores of kernel-internal buffers]."""
        elided = {n for n in self.stored if n in self.internal and n not in self.loaded}
        # sorted, not in the set's order (Note [Deterministic schedules] in scheduler.py)
        scratch = sorted(n for n in self.stored if n in self.internal and n in self.loaded)
        return elided, scratch

    def _param(self, name: str) -> str:
        if name not in self.param_order:
            self.param_order.append(name)
        return f"p_{name}"

    def _value(self, v: Any, dtype: torch.dtype | None = None) -> Any:
        """``v`` as a value: itself, or a Python scalar as a constant (of ``dtype`` if given)."""
        if isinstance(v, self.value_type):
            return v
        return self.constant(v, dtype or scalar_dtype(v))

    def _where_operands(self, a: Any, b: Any) -> tuple[Any, Any, torch.dtype]:
        """``where``'s two branches at their common dtype; a constant branch takes the other's
        dtype first (a Python scalar does not decide the result's type)."""
        va, vb = self._value(a), self._value(b)
        if va.const and not vb.const and va.py is not None:
            va = self._value(va.py, vb.dtype)
        if vb.const and not va.const and vb.py is not None:
            vb = self._value(vb.py, va.dtype)
        dtype = result_dtype("where", ((va.dtype, va.const), (vb.dtype, vb.const)))
        return self._as(va, dtype), self._as(vb, dtype), dtype

    def _math_operands(self, name: str, args: Sequence[Any]) -> tuple[list[Any], torch.dtype, torch.dtype]:
        """``ops.name``'s operands cast to the dtype it computes in, that dtype and the result's
        (:func:`math_dtypes`)."""
        values = [self._value(a) for a in args]
        out, operand = math_dtypes(name, tuple((v.dtype, v.const) for v in values))
        return [self._as(v, operand) for v in values], out, operand

    def to_dtype(self, value: Any, dtype: torch.dtype, *args: Any, **kwargs: Any) -> Any:
        return self._as(self._value(value), dtype)

    def getitem(self, value: Any, index: int) -> Any:
        return value[index]

    def _reduce_one(self, dtype: torch.dtype, reduction_type: str, v: Any) -> Any:
        """A reduction over a single element: the element itself (index 0 for argmax/argmin)."""
        if reduction_type in ("argmax", "argmin"):
            return self.constant(0, torch.int64)
        if reduction_type == "welford_reduce":
            # m2 of one element x is (x - x)^2, not 0: NaN where x is an infinity or NaN, as
            # eager's var/std of a one-element row (kiln gave 0 for `x[:, None].std(1, correction=0)`);
            # the mean is 0 + x, as eager's Welford step from 0 (-0.0 becomes 0.0)
            x = self._as(v, dtype)
            d = self._math("sub", x, x)
            mean = self._math("add", x, self.constant(0, dtype))
            return (mean, self._math("mul", d, d), self.constant(1, dtype))
        if reduction_type == "any":
            return self._as(v, torch.bool)
        return self._as(v, dtype)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)
        from .virtualized import BINARY_OPS, UNARY_OPS

        if name in UNARY_OPS or name in BINARY_OPS:
            return lambda *args: self._math(name, *args)
        raise self.unsupported(f"ops.{name}")
