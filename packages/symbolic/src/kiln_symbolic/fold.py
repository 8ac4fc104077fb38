"""Expressions rebuilt as calls: the sympy tree of a size, folded bottom-up.

A consumer that must *compute* a symbolic size at run time (an FX graph that reads `s0` from an
input and multiplies, a wrapper that binds symbols once per call) walks the expression with
`fold_expr`: `leaf(symbol)` gives the value of a symbol, `call(op, args)` combines values, with
`op` one of Python's `operator` functions (or `torch.sym_max`/`sym_min`, which take plain ints too), so the consumer never needs sympy itself. Operands of
sums and products are visited in a stable order (symbols before numbers), so the same expression
always folds to the same calls.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

import sympy
import torch

from kiln_symbolic.functions import FLOAT_OF_CALL, INT_OF_FLOAT_CALL, FloorDiv

T = TypeVar("T")

# Note [The Python calls of the float functions] (functions.py): each ordered float function and
# integer part of a float as the Python call it stands for
_CALLS: dict[type, Callable[..., Any]] = {
    function: call for call, function in (FLOAT_OF_CALL | INT_OF_FLOAT_CALL).items()
}


class UnfoldableExpr(ValueError):
    """An expression with a function `fold_expr` cannot express as a Python operator."""


def _number(expr: Any) -> int | float:
    return int(expr) if expr.is_integer else float(expr)


def fold_expr(
    expr: Any,
    leaf: Callable[[sympy.Symbol], T],
    call: Callable[[Callable[..., Any], tuple[Any, ...]], T],
    cache: dict[Any, Any] | None = None,
) -> T | int | float:
    """`expr` computed by `leaf` and `call`; numbers stay Python numbers. `cache` (expression ->
    value) is read and filled, so shared subexpressions are computed once."""
    memo: dict[Any, Any] = {} if cache is None else cache

    def go(e: Any) -> Any:
        if e.is_number:
            return _number(e)
        if e in memo:
            return memo[e]
        if isinstance(e, sympy.Symbol):
            out = leaf(e)
        elif isinstance(e, (sympy.Add, sympy.Mul)):
            fn = operator.add if isinstance(e, sympy.Add) else operator.mul
            terms = sorted(e.args, key=lambda a: (bool(a.is_number), sympy.default_sort_key(a)))
            out = go(terms[0])
            for t in terms[1:]:
                out = call(fn, (out, go(t)))
        elif isinstance(e, FloorDiv):
            out = call(operator.floordiv, (go(e.args[0]), go(e.args[1])))
        elif isinstance(e, sympy.Mod):
            out = call(operator.mod, (go(e.args[0]), go(e.args[1])))
        elif isinstance(e, (sympy.Max, sympy.Min)):
            # `max(n, 4)` on sizes (Note [Builtins on symbolic numbers] in kiln_dynamo)
            fn = torch.sym_max if isinstance(e, sympy.Max) else torch.sym_min
            terms = sorted(e.args, key=lambda a: (bool(a.is_number), sympy.default_sort_key(a)))
            out = go(terms[0])
            for t in terms[1:]:
                out = call(fn, (out, go(t)))
        elif type(e) in _CALLS:
            out = call(_CALLS[type(e)], tuple(go(a) for a in e.args))
        elif isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            out = call(operator.pow, (go(e.base), int(e.exp)))
        else:
            raise UnfoldableExpr(f"cannot compute {e} with Python operators")
        memo[e] = out
        return out

    return go(sympy.sympify(expr))
