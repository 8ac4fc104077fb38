"""Symbolic Python numbers: a size (or arithmetic on sizes) that is a `torch.SymInt` at capture.

`SymNodeVariable` pairs the FX node that computes the value at run time (`x.size(0)`,
`x.size(0) // 2`) with the SymInt that stands for it while tracing. Arithmetic on it adds a node
and computes the new SymInt through kiln_symbolic; passing it to a tensor operation passes the
node. Branching on it (`if x.size(0) > 4:`) asks the ShapeEnv, which answers with this run's
value and records a guard with the user's line. A SymBool needs no node: it only ever decides a
branch. `sym_result` is the one door that turns a value computed on fakes into a tracker.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from kiln_symbolic import GuardOnDataDependent

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _static_value(v: Any) -> Any:
    """The plain value of a SymInt/SymFloat/SymBool whose expression is a number, else None."""
    node = v.node
    for probe in ("maybe_as_int", "maybe_as_bool", "maybe_as_float"):
        f = getattr(type(node), probe, None)
        if f is not None:
            got = f(node)
            if got is not None:
                return got
    return None


class SymNodeVariable(VariableTracker):
    __slots__ = ("node", "recipe", "value")

    def __init__(
        self, node: torch.fx.Node | None, value: Any, recipe: tuple[Any, list[VariableTracker]] | None = None
    ) -> None:
        self.node = node
        self.value = value
        # a SymBool's (function, operands): at a graph break on it, the resumed frame computes
        # it again in Python from the graph's outputs (a condition on a data-dependent size)
        self.recipe = recipe

    def describe(self) -> str:
        return f"symbolic {self.python_type().__name__} {self.value.node.expr}"

    def python_type(self) -> type:
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(self.value)]

    def truth(self, tx: Tx) -> bool:
        set_where(tx)
        try:
            return bool(self.value)  # the ShapeEnv guards the answer
        except GuardOnDataDependent as e:
            raise Unsupported(
                f"data-dependent branch on {self.value.node.expr} (a size or int computed from tensor data)",
                advice="use torch.where, or torch._check(...) the fact the branch needs, or move the branch "
                "outside the compiled function",
            ) from e

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.node is None and self.recipe is not None:
            fn, operands = self.recipe
            return f"{cg.const(fn)}({', '.join(a.reconstruct(cg) for a in operands)})"
        if self.node is None:
            raise Unsupported(f"{self.describe()} leaves the frame")
        return cg.graph_output(self.node)

    def call_method(
        self, tx: Tx, name: str, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> VariableTracker:
        if name in ("__int__", "__index__", "__float__", "__bool__") and not args:
            set_where(tx)
            try:
                return ConstantVariable(getattr(self.value, name)())
            except GuardOnDataDependent as e:
                raise Unsupported(f"{self.describe()} made a Python number: it depends on tensor data") from e
        raise Unsupported(f"method {name} of a {self.describe()}")


def set_where(tx: Tx) -> None:
    """Guards recorded from now on name this translator's current line."""
    tx.output.shapes.env.where = tx.where


def sym_result(tx: Tx, value: Any, make_node: Callable[[], torch.fx.Node | None]) -> VariableTracker:
    """The tracker for `value` (a number, SymInt, SymFloat or SymBool); `make_node` adds the node
    that computes it at run time, called only when the value is symbolic."""
    if not isinstance(value, SYM_TYPES):
        return ConstantVariable(value)
    static = _static_value(value)
    if static is not None:
        return ConstantVariable(static)
    if isinstance(value, torch.SymBool):
        return SymNodeVariable(None, value)
    node = make_node()
    if node is not None:
        node.meta["val"] = value
        node.meta["source_line"] = tx.where()
    return SymNodeVariable(node, value)


def is_symbolic_value(value: Any) -> bool:
    if isinstance(value, SYM_TYPES):
        return _static_value(value) is None
    if isinstance(value, (tuple, list, torch.Size)):
        return any(is_symbolic_value(v) for v in value)
    return False


def symbolic_op(tx: Tx, fn: Any, args: list[VariableTracker]) -> VariableTracker:
    """`fn(*args)` where some arg is symbolic and the others are Python numbers."""
    from kiln_dynamo.variables.tensor import fake_arg, graph_arg

    set_where(tx)
    values = [fake_arg(a) for a in args]
    try:
        out = fn(*values)
    except Unsupported:
        raise
    except Exception as e:
        raise Unsupported(
            f"{getattr(fn, '__name__', fn)} on symbolic sizes raised {type(e).__name__}: {e}"
        ) from e
    if fn in (operator.eq, operator.ne) and not isinstance(out, (bool, torch.SymBool)):
        return ConstantVariable(out)

    def make() -> torch.fx.Node:
        return tx.output.graph.create_node("call_function", fn, tuple(graph_arg(a) for a in args), {})

    result = sym_result(tx, out, make)
    if isinstance(result, SymNodeVariable) and result.node is None:
        result.recipe = (fn, list(args))
    return result
