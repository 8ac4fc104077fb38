"""SymNode: the object behind a `torch.SymInt` / `SymFloat` / `SymBool` made by kiln.

`torch.SymInt(node)` accepts any Python object as its node: the C++ side wraps it and calls its
methods by name (`add`, `ge`, `guard_bool`, `is_contiguous`, ...; the list is in the torch
headers `python_symnode.h` and in the magic methods torch installs on SymInt), so sizes of kiln's
fake tensors can be symbolic without torch's own symbolic-shapes module. A node holds a sympy
expression over the ShapeEnv's symbols, its Python type, and its hint (its value in this run).

Arithmetic builds a new node from the operands' expressions (and hints, computed the Python
way). Concretization (`guard_bool`, `guard_int`, `bool_`, `int_`) asks the ShapeEnv, which
answers with the hint and records a guard unless the answer is known statically. A method kiln
cannot do raises `SymbolicUnsupported` naming it, never AttributeError.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import sympy
import torch

from kiln_symbolic.functions import (
    FLOAT_OF_CALL,
    INT_OF_FLOAT_CALL,
    FloorDiv,
    IntOfFloat,
    IntTrueDiv,
    TruncOfFloat,
)

if TYPE_CHECKING:
    from kiln_symbolic.shape_env import ShapeEnv


class SymbolicUnsupported(NotImplementedError, AttributeError):
    """A SymNode method kiln does not implement yet (an AttributeError too, so that `hasattr`
    probes answer False)."""


def _pytype_of(value: Any) -> type:
    if isinstance(value, bool):
        return bool
    return int if isinstance(value, int) else float


def _floordiv_expr(a: Any, b: Any) -> Any:
    return FloorDiv(a, b)


def _truediv_expr(a: Any, b: Any) -> Any:
    return a / b


def _int_truediv_expr(a: Any, b: Any) -> Any:
    return IntTrueDiv(a, b)


def _safe(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*xs: Any) -> Any:
        if any(x is None for x in xs):
            return None
        try:
            return fn(*xs)
        except (ZeroDivisionError, OverflowError, ValueError):
            return None

    return call


# name -> (sympy builder, python function on hints, result type: None = promote the operands)
_BINARY: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any], type | None]] = {
    "add": (operator.add, operator.add, None),
    "sub": (operator.sub, operator.sub, None),
    "mul": (operator.mul, operator.mul, None),
    "mod": (sympy.Mod, operator.mod, None),
    "floordiv": (_floordiv_expr, operator.floordiv, None),
    "int_floordiv": (_floordiv_expr, operator.floordiv, int),
    "truediv": (_truediv_expr, operator.truediv, float),
    "float_truediv": (_truediv_expr, operator.truediv, float),
    "int_truediv": (_int_truediv_expr, operator.truediv, float),
    "pow": (sympy.Pow, operator.pow, None),
    "float_pow": (sympy.Pow, operator.pow, float),
    "pow_by_natural": (sympy.Pow, operator.pow, int),
    "sym_min": (sympy.Min, min, None),
    "sym_max": (sympy.Max, max, None),
    "lshift": (lambda a, b: a * 2**b, operator.lshift, int),
    "rshift": (lambda a, b: FloorDiv(a, 2**b), operator.rshift, int),
    "eq": (sympy.Eq, operator.eq, bool),
    "ne": (sympy.Ne, operator.ne, bool),
    "lt": (sympy.Lt, operator.lt, bool),
    "le": (sympy.Le, operator.le, bool),
    "gt": (sympy.Gt, operator.gt, bool),
    "ge": (sympy.Ge, operator.ge, bool),
    "sym_and": (sympy.And, lambda a, b: a and b, bool),
    "and_": (sympy.And, lambda a, b: a and b, bool),
    "sym_or": (sympy.Or, lambda a, b: a or b, bool),
    "or_": (sympy.Or, lambda a, b: a or b, bool),
}


# Note [Floats of sizes remember their operation]: a float computed from sizes inside a
# decomposition or a C++ derivative (align_corners' `(n - 1) / (m - 1)`, var's backward
# `2.0 / (n - 1)`, SDPA's `1 / sqrt(E)`) never passes through the captured graph, so the trace
# cannot replay its Python operations (Note [A float of sizes keeps its Python operations] in
# kiln_aotgrad) from there, and its sympy expression reorders float arithmetic. Each SymNode
# made by one of these operations keeps it: `recipe` = (the Python function, its operand
# nodes), from which a consumer rebuilds the value in the same order, one double operation
# each; `**` with a float result (`n ** -0.5`) and `sqrt` (`math.sqrt(n)`, SDPA's default scale)
# are one C `pow` / correctly rounded `sqrt` each, the same double in C++ as in Python. Other
# float operations (`log2`, ...) keep none.
_FLOAT_RECIPES: dict[str, Callable[..., Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "float_truediv": operator.truediv,
    "int_truediv": operator.truediv,
    "neg": operator.neg,
    "sym_float": torch.sym_float,
    "pow": operator.pow,
    "float_pow": operator.pow,
    "sym_sqrt": torch.sym_sqrt,
}


# Note [Integers of floats of sizes] (functions.py): a recipe's operation as its ordered float
# function (Note [The Python calls of the float functions]), and the int-making operations as the
# integer part of that double (`sym_int` truncates, as `int()` does)
_INT_OF_FLOAT: dict[str, type[IntOfFloat]] = {call.__name__: f for call, f in INT_OF_FLOAT_CALL.items()}
_INT_OF_FLOAT["sym_int"] = TruncOfFloat


def ordered_float(node: SymNode) -> Any:
    """The float `node` as its ordered float functions (Note [Python float arithmetic on sizes,
    in its order]) over size expressions, or None when an operand has no recipe."""
    if node.constant is not None:
        c = node.constant
        return sympy.Integer(c) if isinstance(c, int) else sympy.Float(float(c), 53)
    if node.pytype is int:
        return node.expr
    if node.recipe is None:
        return None
    fn, operands = node.recipe
    args = [ordered_float(o) for o in operands]
    if any(a is None for a in args):
        return None
    return FLOAT_OF_CALL[fn](*args)


def _round(x: Any) -> Any:
    return sympy.Function("round")(x)


# name -> (sympy builder, python function, result type: None = the operand's)
_UNARY: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any], type | None]] = {
    "neg": (operator.neg, operator.neg, None),
    "pos": (lambda a: a, operator.pos, None),
    "abs": (sympy.Abs, abs, None),
    "floor": (sympy.floor, math.floor, int),
    "ceil": (sympy.ceiling, math.ceil, int),
    "trunc": (lambda a: sympy.sign(a) * sympy.floor(sympy.Abs(a)), math.trunc, int),
    "sym_float": (lambda a: a, float, float),
    "sym_int": (lambda a: sympy.sign(a) * sympy.floor(sympy.Abs(a)), int, int),
    "sym_not": (sympy.Not, operator.not_, bool),
    "sym_sqrt": (sympy.sqrt, math.sqrt, float),
    "sym_log2": (lambda a: sympy.log(a, 2), math.log2, float),
}


class SymNode:
    """A symbolic int, float or bool over a kiln ShapeEnv (see the module docstring)."""

    __slots__ = ("_expr", "_hint", "constant", "pytype", "recipe", "shape_env")

    def __init__(
        self,
        expr: Any,
        shape_env: ShapeEnv,
        pytype: type,
        hint: Any,
        constant: Any = None,
        recipe: tuple[Callable[..., Any], tuple[SymNode, ...]] | None = None,
    ) -> None:
        self._expr = sympy.sympify(expr)
        self.shape_env = shape_env
        self.pytype = pytype
        self._hint = hint
        self.constant = constant
        # Note [Floats of sizes remember their operation]
        self.recipe = recipe

    # --- what torch reads ---------------------------------------------------------------------
    @property
    def expr(self) -> Any:
        return self.shape_env.replace(self._expr)

    @property
    def hint(self) -> Any:
        return self._hint

    def require_hint(self) -> Any:
        if self._hint is None:
            raise SymbolicUnsupported(f"{self.expr} has no hint (it depends on tensor data)")
        return self._hint

    def optimization_hint(self) -> int:
        """The hint, or for a data-dependent size the ShapeEnv's guess (Note [Unbacked sizes]):
        for layout heuristics that decide nothing about correctness."""
        return self._hint if self._hint is not None else self.shape_env.optimization_hint(self.expr)

    def is_int(self) -> bool:
        return self.pytype is int

    def is_float(self) -> bool:
        return self.pytype is float

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_nested_int(self) -> bool:
        return False

    def is_symbolic(self) -> bool:
        return True

    def is_constant(self) -> bool:
        return False

    def has_hint(self) -> bool:
        return self._hint is not None

    def maybe_as_int(self) -> int | None:
        e = self.expr
        return int(e) if isinstance(e, sympy.Integer) else None

    def maybe_as_bool(self) -> bool | None:
        e = self.expr
        if e is sympy.true:
            return True
        return False if e is sympy.false else None

    def maybe_as_float(self) -> float | None:
        e = self.expr
        return float(e) if isinstance(e, sympy.Number) else None

    def nested_int(self) -> None:
        return None

    def _graph_repr(self) -> str:
        return str(self.expr)

    def __str__(self) -> str:
        return str(self.expr)

    def __repr__(self) -> str:
        return f"SymNode({self.expr}, hint={self._hint})"

    def clone(self) -> SymNode:
        return self

    # --- construction -------------------------------------------------------------------------
    def wrap_int(self, num: int) -> SymNode:
        return SymNode(sympy.Integer(num), self.shape_env, int, num, constant=num)

    def wrap_float(self, num: float) -> SymNode:
        return SymNode(sympy.Float(num), self.shape_env, float, num, constant=num)

    def wrap_bool(self, b: bool) -> SymNode:
        return SymNode(sympy.true if b else sympy.false, self.shape_env, bool, b, constant=b)

    def _binary(self, name: str, other: SymNode) -> SymNode:
        build, py, out_type = _BINARY[name]
        if out_type is None:
            out_type = float if float in (self.pytype, other.pytype) else self.pytype
        if out_type is bool and self.pytype is bool and other.pytype is bool and name in ("eq", "ne"):
            build = sympy.Equivalent if name == "eq" else sympy.Xor
        if name in ("sym_max", "sym_min"):  # Note [Max and Min settled by ranges]
            expr = self.shape_env.min_max(name == "sym_max", self.expr, other.expr)
        else:
            expr = build(self.expr, other.expr)
        hint = _safe(py)(self._hint, other._hint)
        if hint is not None and out_type is not bool:
            hint = out_type(hint)
        recipe = (
            (_FLOAT_RECIPES[name], (self, other)) if out_type is float and name in _FLOAT_RECIPES else None
        )
        return SymNode(expr, self.shape_env, out_type, hint, recipe=recipe)

    def _unary(self, name: str) -> SymNode:
        build, py, out_type = _UNARY[name]
        out_type = out_type or self.pytype
        if name in ("floor", "ceil", "trunc", "sym_int") and self.pytype is int:
            return self
        if name in _INT_OF_FLOAT and self.pytype is float:  # Note [Integers of floats of sizes]
            exact = ordered_float(self)
            if exact is not None:
                expr = _INT_OF_FLOAT[name](exact)
                return SymNode(expr, self.shape_env, int, _safe(py)(self._hint))
        recipe = (_FLOAT_RECIPES[name], (self,)) if out_type is float and name in _FLOAT_RECIPES else None
        return SymNode(build(self.expr), self.shape_env, out_type, _safe(py)(self._hint), recipe=recipe)

    def sym_ite(self, then: SymNode, other: SymNode) -> SymNode:
        expr = sympy.Piecewise((then.expr, self.expr), (other.expr, True))
        hint = None if self._hint is None else (then._hint if self._hint else other._hint)
        return SymNode(expr, self.shape_env, then.pytype, hint)

    def is_integer(self) -> SymNode:
        e = self.expr
        return SymNode(
            sympy.Eq(e, sympy.floor(e)),
            self.shape_env,
            bool,
            _safe(lambda v: float(v).is_integer())(self._hint),
        )

    def round(self, ndigits: int | None = None) -> SymNode:
        if ndigits is not None:
            raise SymbolicUnsupported("SymNode.round with ndigits")
        return SymNode(_round(self.expr), self.shape_env, int, _safe(round)(self._hint))

    def sym_sum(self, args: Sequence[SymNode]) -> SymNode:
        expr = sympy.Add(*[a.expr for a in args])
        hints = [a._hint for a in args]
        hint = None if any(h is None for h in hints) else sum(hints)
        pytype = float if any(a.pytype is float for a in args) else int
        return SymNode(expr, self.shape_env, pytype, hint)

    # --- concretization (each records a guard unless the answer is static) --------------------
    def _evaluate(self, fallback: bool | None = None) -> Any:
        return self.shape_env.evaluate_expr(self.expr, self._hint, fallback=fallback)

    def guard_int(self, file: str = "", line: int = 0) -> int:
        return int(self._evaluate())

    def guard_float(self, file: str = "", line: int = 0) -> float:
        return float(self._evaluate())

    def guard_bool(self, file: str = "", line: int = 0) -> bool:
        return bool(self._evaluate())

    def int_(self) -> int:
        return self.guard_int()

    def bool_(self) -> bool:
        return self.guard_bool()

    def float_(self) -> float:
        return self.guard_float()

    def guard_size_oblivious(self, file: str = "", line: int = 0) -> bool:
        return self.guard_bool(file, line)

    def guard_or_false(self, file: str = "", line: int = 0) -> bool:
        return bool(self._evaluate(fallback=False))

    def guard_or_true(self, file: str = "", line: int = 0) -> bool:
        return bool(self._evaluate(fallback=True))

    def statically_known_true(self, file: str = "", line: int = 0) -> bool:
        return self.shape_env.statically_known_true(self.expr)

    def expect_true(self, file: str = "", line: int = 0) -> bool:
        return self.shape_env.expect_true(self.expr)

    def expect_size(self, file: str = "", line: int = 0) -> bool:
        return self.shape_env.expect_true(sympy.Ge(self.expr, 0))

    # --- layout predicates: (sizes, strides) as lists of nodes, a SymBool node back -----------
    def _contiguity(
        self, sizes: Sequence[SymNode], strides: Sequence[SymNode], order: Sequence[int]
    ) -> SymNode:
        expected: Any = sympy.Integer(1)
        conds = []
        for d in order:
            size, stride = sizes[d].expr, strides[d].expr
            conds.append(sympy.Or(sympy.Eq(size, 1), sympy.Eq(stride, expected)))
            expected = expected * size
        empty = sympy.Or(*[sympy.Eq(s.expr, 0) for s in sizes]) if sizes else sympy.false
        expr = sympy.Or(sympy.And(*conds), empty)
        return SymNode(expr, self.shape_env, bool, self.shape_env.hint_of(expr))

    def is_contiguous(self, sizes: Sequence[SymNode], strides: Sequence[SymNode]) -> SymNode:
        return self._contiguity(sizes, strides, list(range(len(sizes)))[::-1])

    def is_channels_last_contiguous_2d(self, sizes: Sequence[SymNode], strides: Sequence[SymNode]) -> SymNode:
        if len(sizes) != 4:
            return self.wrap_bool(False)
        return self._contiguity(sizes, strides, [1, 3, 2, 0])

    def is_channels_last_contiguous_3d(self, sizes: Sequence[SymNode], strides: Sequence[SymNode]) -> SymNode:
        if len(sizes) != 5:
            return self.wrap_bool(False)
        return self._contiguity(sizes, strides, [1, 4, 3, 2, 0])

    def _strides_like(
        self, sizes: Sequence[SymNode], strides: Sequence[SymNode], order: Sequence[int]
    ) -> SymNode:
        """torch's is_channels_last_strides heuristic, decided on the hints (a memory-format
        suggestion, not a correctness fact): strides decrease along `order`'s reverse."""
        hs = [s.optimization_hint() for s in sizes]
        st = [s.optimization_hint() for s in strides]
        minimum = 0
        for d in order:
            if hs[d] == 0:
                return self.wrap_bool(False)
            if st[d] < minimum:
                return self.wrap_bool(False)
            if d == 0 and minimum == st[1]:
                return self.wrap_bool(False)
            minimum = st[d]
            if hs[d] > 1:
                minimum *= hs[d]
        return self.wrap_bool(True)

    def is_channels_last_strides_2d(self, sizes: Sequence[SymNode], strides: Sequence[SymNode]) -> SymNode:
        if len(sizes) != 4:
            return self.wrap_bool(False)
        return self._strides_like(sizes, strides, [1, 3, 2, 0])

    def is_channels_last_strides_3d(self, sizes: Sequence[SymNode], strides: Sequence[SymNode]) -> SymNode:
        if len(sizes) != 5:
            return self.wrap_bool(False)
        return self._strides_like(sizes, strides, [1, 4, 3, 2, 0])

    def is_non_overlapping_and_dense(self, sizes: Sequence[SymNode], strides: Sequence[SymNode]) -> SymNode:
        """Dense in some order: the order of the strides' hints (ties: the later dim inner)."""
        n = len(sizes)
        order = sorted(range(n), key=lambda d: (strides[d].optimization_hint(), -d))
        return self._contiguity(sizes, strides, order)

    def is_non_overlapping_and_dense_indicator(
        self, sizes: Sequence[SymNode], strides: Sequence[SymNode]
    ) -> SymNode:
        b = self.is_non_overlapping_and_dense(sizes, strides)
        return SymNode(sympy.Piecewise((1, b.expr), (0, True)), self.shape_env, int, int(bool(b._hint)))

    def __getattr__(self, name: str) -> Any:
        raise SymbolicUnsupported(f"kiln's SymNode does not implement {name!r}")


def _str(self: SymNode) -> str:
    return str(self.expr)


def _install() -> None:
    # `str` is a method name of the protocol; defined here so the class body keeps the builtin
    SymNode.str = _str  # type: ignore[attr-defined]
    for name in _BINARY:
        setattr(SymNode, name, lambda self, other, _n=name: self._binary(_n, other))
    for name in _UNARY:
        setattr(SymNode, name, lambda self, _n=name: self._unary(_n))


_install()


def wrap(node: SymNode) -> Any:
    """The torch value for a node: a plain Python value when its expression is a number."""
    e = node.expr
    if node.pytype is bool:
        if e is sympy.true or e is sympy.false:
            return bool(e)
        return torch.SymBool(node)
    if isinstance(e, sympy.Number):
        return int(e) if node.pytype is int else float(e)
    return torch.SymInt(node) if node.pytype is int else torch.SymFloat(node)


def make_symint(shape_env: ShapeEnv, expr: Any, hint: int | None) -> Any:
    """An int, or a torch.SymInt over `expr` with `hint`."""
    return wrap(SymNode(expr, shape_env, int, hint))


def make_symfloat(shape_env: ShapeEnv, expr: Any, hint: float) -> Any:
    return wrap(SymNode(expr, shape_env, float, hint))


def expr_of(value: Any) -> Any:
    """The sympy expression of an int / SymInt / SymFloat / SymBool (numbers as sympy numbers)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value.node.expr
    if isinstance(value, bool):
        return sympy.true if value else sympy.false
    return sympy.sympify(value)


def symbol_of(value: Any) -> Any:
    """The symbol a SymInt was made as, before any replacement (None for other values or
    compound expressions): `m` of `torch._check(m == k)` still names its own symbol."""
    if isinstance(value, torch.SymInt) and isinstance(value.node, SymNode):
        raw = value.node._expr
        return raw if isinstance(raw, sympy.Symbol) else None
    return None


def hint_of(value: Any) -> Any:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value.node._hint
    return value


def is_symbolic(value: Any) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) and isinstance(
        value.node, SymNode
    )
