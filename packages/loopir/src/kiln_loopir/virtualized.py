"""The virtualized ``ops.*`` namespace: how loop bodies are written and read.

The IR is *define-by-run*. A loop body is not a data structure but a plain Python function of
the loop's index (a list of sympy expressions) that calls ``ops.load``, ``ops.add``,
``ops.store`` and friends. What those calls *mean* depends on which handler is installed when the
function runs:

* the reference interpreter installs a handler whose values are torch tensors covering the whole
  index grid, so running the body computes the kernel;
* the dependency analysis installs a handler that records every ``load``/``store`` with its
  symbolic index, which gives the read/write sets the scheduler fuses on;
* the IR printer installs a handler that returns names and records one line per call, so
  ``KILN_LOG=ir`` can show a body as readable pseudo code;
* a code generator installs a handler that returns strings of C++ or Triton.

The handler is thread-local and dynamically scoped (:func:`set_ops_handler` is a context
manager), so nested compilations on other threads do not see each other's handlers.

Note [ops values are opaque]: lowerings never look inside the values that ``ops.*`` returns;
they only pass them to other ``ops.*`` calls. That is what lets the same body serve every handler.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import sympy

# The math set every handler understands, by arity. Handlers that compute (the interpreter) or
# spell (code generators) implement each of these; analysis handlers treat them generically.
UNARY_OPS: tuple[str, ...] = (
    "abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "sigmoid", "erf", "erfc", "floor", "ceil", "round", "trunc", "sign", "isnan", "isinf", "relu",
    "reciprocal", "logical_not", "bitwise_not", "square", "lgamma", "signbit", "frac", "erfinv",
)  # fmt: skip
BINARY_OPS: tuple[str, ...] = (
    "add", "sub", "mul", "truediv", "floordiv", "truncdiv", "mod", "fmod", "remainder", "pow",
    "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
    "bitwise_right_shift", "atan2", "copysign", "hypot", "nextafter", "fmax", "fmin",
)  # fmt: skip
# Memory, indexing and control operations (signatures documented on OpsNamespace).
SPECIAL_OPS: tuple[str, ...] = (
    "load", "store", "reduction", "store_reduction", "index_expr", "indirect_indexing",
    "masked", "where", "constant", "to_dtype", "getitem",
)  # fmt: skip
REDUCTION_TYPES: tuple[str, ...] = (
    "sum", "prod", "min", "max", "argmin", "argmax", "any", "welford_reduce", "welford_combine",
)  # fmt: skip

_state = threading.local()


def current_handler() -> Any:
    """The handler installed on this thread (raises if there is none)."""
    handler = getattr(_state, "handler", None)
    if handler is None:
        raise RuntimeError("no ops handler is installed: run loop bodies under set_ops_handler()")
    return handler


@contextlib.contextmanager
def set_ops_handler(handler: object) -> Iterator[object]:
    """Install ``handler`` for ``ops.*`` on this thread for the duration of the block."""
    previous = getattr(_state, "handler", None)
    _state.handler = handler
    try:
        yield handler
    finally:
        _state.handler = previous


class OpsNamespace:
    """``ops``: forwards every attribute to the current thread's handler.

    The special operations have these signatures (every handler follows them):

    * ``load(name, index) -> value``: read buffer ``name`` at the sympy offset ``index``.
    * ``store(name, index, value, mode=None)``: write; ``mode="atomic_add"`` accumulates.
    * ``reduction(dtype, src_dtype, reduction_type, value) -> value``: reduce ``value`` over the
      reduction variables; ``welford_reduce`` returns a (mean, m2, weight) triple;
      ``welford_combine`` takes such triples (partial statistics of disjoint parts, ``value`` a
      tuple of three) and returns the triple of their union (Chan's formula).
    * ``store_reduction(name, index, value)``: write a reduced value.
    * ``index_expr(expr, dtype) -> value``: a sympy expression of the loop variables as a value.
    * ``indirect_indexing(value, size, check=True) -> sympy.Symbol``: turn a loaded value into an
      index variable that may appear in later ``load``/``store`` index expressions.
    * ``masked(mask, body, other) -> value``: ``body()`` where ``mask`` holds, ``other`` elsewhere.
    * ``where(cond, a, b)``, ``constant(value, dtype)``, ``to_dtype(value, dtype)``,
      ``getitem(value, i)`` (for multi-valued reductions).
    """

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return getattr(current_handler(), name)


ops = OpsNamespace()


class DefaultHandler:
    """A handler that treats every math op alike; subclasses override ``generic``.

    Analysis handlers (dependency recording, op counting, printing) do not care what ``sin``
    means, only that an op was applied to some values.
    """

    def generic(self, name: str, *args: Any) -> Any:
        raise NotImplementedError(name)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)

        def apply(*args: Any, **kwargs: Any) -> Any:
            return self.generic(name, *args, *kwargs.values())

        return apply


class PrintHandler(DefaultHandler):
    """Renders a body as one ``tmpN = op(args)`` line per call (for ``KILN_LOG=ir``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._indirect = 0

    def _emit(self, text: str) -> str:
        name = f"tmp{len(self.lines)}"
        self.lines.append(f"{name} = {text}")
        return name

    def generic(self, name: str, *args: Any) -> str:
        return self._emit(f"{name}({', '.join(map(str, args))})")

    def load(self, name: str, index: sympy.Expr) -> str:
        return self._emit(f"load({name}, {index})")

    def store(self, name: str, index: sympy.Expr, value: Any, mode: str | None = None) -> str:
        suffix = f", mode={mode}" if mode else ""
        self.lines.append(f"store({name}, {index}, {value}{suffix})")
        return ""

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> str:
        self.lines.append(f"store_reduction({name}, {index}, {value})")
        return ""

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> str:
        inner = body()
        return self._emit(f"masked({mask}, {inner}, {other})")

    def indirect_indexing(self, value: Any, size: Any, check: bool = True) -> sympy.Symbol:
        symbol = sympy.Symbol(f"indirect{self._indirect}", integer=True)
        self._indirect += 1
        self.lines.append(f"{symbol} = indirect_indexing({value}, {size})")
        return symbol

    def getitem(self, value: Any, index: int) -> str:
        return f"{value}[{index}]"


class OpCountHandler(DefaultHandler):
    """Counts ops in a body (the realize heuristic's "large inner function" test)."""

    def __init__(self) -> None:
        self.count = 0
        self.loads = 0
        self.names: set[str] = set()
        self._indirect = 0

    def generic(self, name: str, *args: Any) -> None:
        self.count += 1
        self.names.add(name)

    def load(self, name: str, index: sympy.Expr) -> None:
        self.count += 1
        self.loads += 1

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> None:
        self.count += 1
        body()

    def indirect_indexing(self, value: Any, size: Any, check: bool = True) -> sympy.Symbol:
        self._indirect += 1
        self.names.add("indirect_indexing")
        return sympy.Symbol(f"indirect{self._indirect}", integer=True)


def count_ops(body: Callable[..., Any], *args: Any) -> tuple[int, int]:
    """(``ops.*`` calls, loads) that ``body(*args)`` makes."""
    counter = OpCountHandler()
    with set_ops_handler(counter):
        body(*args)
    return counter.count, counter.loads


def op_names(body: Callable[..., Any], *args: Any) -> set[str]:
    """The names of the ``ops.*`` calls ``body(*args)`` makes (loads and stores not included;
    ``indirect_indexing`` is)."""
    counter = OpCountHandler()
    with set_ops_handler(counter):
        body(*args)
    return counter.names


def format_body(body: Callable[..., Any], *args: Any) -> list[str]:
    """``body(*args)`` rendered as lines of pseudo code."""
    printer = PrintHandler()
    with set_ops_handler(printer):
        body(*args)
    return printer.lines


def current_graph() -> Any:
    """The graph being lowered on this thread (the owner of buffer names)."""
    graph = getattr(_state, "graph", None)
    if graph is None:
        raise RuntimeError("no graph is being lowered on this thread")
    return graph


@contextlib.contextmanager
def set_graph(graph: object) -> Iterator[object]:
    """Make ``graph`` the one that realized buffers register with, for the block."""
    previous = getattr(_state, "graph", None)
    _state.graph = graph
    try:
        yield graph
    finally:
        _state.graph = previous
