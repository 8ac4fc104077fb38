"""Symbolic Python numbers: a size (or arithmetic on sizes) that is a `torch.SymInt` at capture.

`SymNodeVariable` pairs the FX node that computes the value at run time (`x.size(0)`,
`x.size(0) // 2`) with the SymInt that stands for it while tracing. Arithmetic on it adds a node
and computes the new SymInt through kiln_symbolic; passing it to a tensor operation passes the
node. Branching on it (`if x.size(0) > 4:`) asks the ShapeEnv, which answers with this run's
value and records a guard with the user's line. A SymBool needs no node: it only ever decides a
branch. `sym_result` is the one door that turns a value computed on fakes into a tracker.

Note [Symbolic numbers stay out of the graph until a tensor needs them]: a number computed from
sizes in Python (`n // 2`, `n / 3`, `max(n, 4)`, `math.ceil(n / 2)`) gets no graph node when it is
made, only its recipe (function and operands). A value that only leaves the frame (returned,
stored, formatted) is computed again in Python from its operands there (`reconstruct`), like a
SymBool, so the graph never outputs a float of sizes or an expression (`Max`, `ceiling`) that
the backends cannot compute. Only a tensor operation that takes the number makes its node
(`graph_node`, recursively for its operands), and the backend then decides what it can compute
(kiln compiles a graph it cannot with static sizes).
"""

from __future__ import annotations

import math
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
    __slots__ = ("make", "node", "recipe", "value")

    def __init__(
        self, node: torch.fx.Node | None, value: Any, recipe: tuple[Any, list[VariableTracker]] | None = None
    ) -> None:
        self.node = node
        self.value = value
        # a SymBool's (function, operands): at a graph break on it, the resumed frame computes
        # it again in Python from the graph's outputs (a condition on a data-dependent size)
        self.recipe = recipe
        # a number's node, made when a tensor operation first needs it (Note [Symbolic numbers
        # stay out of the graph until a tensor needs them])
        self.make: Callable[[], torch.fx.Node] | None = None

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

    def graph_node(self) -> torch.fx.Node | None:
        """The node computing this number, made now if it was deferred."""
        if self.node is None and self.make is not None:
            self.node, self.make = self.make(), None
        return self.node

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


def sym_result(
    tx: Tx, value: Any, make_node: Callable[[], torch.fx.Node | None], lazy: bool = False
) -> VariableTracker:
    """The tracker for `value` (a number, SymInt, SymFloat or SymBool); `make_node` adds the node
    that computes it at run time, called only when the value is symbolic."""
    if not isinstance(value, SYM_TYPES):
        return ConstantVariable(value)
    static = _static_value(value)
    if static is not None:
        return ConstantVariable(static)
    if isinstance(value, torch.SymBool):
        return SymNodeVariable(None, value)
    if lazy:  # Note [Symbolic numbers stay out of the graph until a tensor needs them]
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

    result = sym_result(tx, out, make, lazy=True)
    if isinstance(result, SymNodeVariable) and result.node is None:
        result.recipe = (fn, list(args))
        if not isinstance(out, torch.SymBool):
            where = tx.where()

            def make_later() -> torch.fx.Node:
                node = make()
                node.meta["val"] = out
                node.meta["source_line"] = where
                return node

            result.make = make_later
    return result


def _bool(a: Any) -> Any:
    return a if isinstance(a, torch.SymBool) else a != 0


# Note [Builtins on symbolic numbers]: Python's builtins called on a size (`max(n, 4)`,
# `divmod(n, 3)`, `round(n / 3)`, `math.ceil(n / 2)`, `int(n * 0.5)`, `abs(n - 5)`) are computed
# on the SymInts, as torch's `sym_*` functions and the numbers' own `__ceil__`/`__round__`/...
# do, instead of specializing the size: the ShapeEnv then guards only what a branch decides.
# `max`/`min` are folded pairwise (torch.sym_max); what has no symbolic form here (a `key=`, a
# `round` to digits, `math.log`) still specializes, with a guard. `math.sqrt` is `torch.sym_sqrt`
# (`x / math.sqrt(x.shape[-1])`: Note [Floats of sizes remember their operation] in
# kiln_symbolic). Each entry: the function the graph calls, and how many positional arguments it
# takes.
SYMBOLIC_BUILTINS: dict[Any, tuple[Callable[..., Any], int]] = {
    abs: (operator.abs, 1),
    int: (torch.sym_int, 1),
    float: (torch.sym_float, 1),
    bool: (_bool, 1),
    round: (round, 1),
    pow: (operator.pow, 2),
    math.ceil: (math.ceil, 1),
    math.floor: (math.floor, 1),
    math.trunc: (math.trunc, 1),
    math.sqrt: (torch.sym_sqrt, 1),
}


def symbolic_builtin(tx: Tx, fn: Any, args: list[VariableTracker]) -> VariableTracker | None:
    """Note [Builtins on symbolic numbers]: `fn(*args)` kept symbolic, or None when `fn` with
    these arguments has no symbolic form here (the caller specializes)."""
    from kiln_dynamo.variables.lists import TupleVariable

    numbers = all(
        isinstance(a, SymNodeVariable) or (a.is_constant() and isinstance(a.as_constant(), (int, float)))
        for a in args
    )
    if not numbers:
        return None
    if fn in (max, min) and len(args) >= 2:
        pick = torch.sym_max if fn is max else torch.sym_min
        out = args[0]
        for a in args[1:]:
            out = symbolic_op(tx, pick, [out, a])
        return out
    if fn is divmod and len(args) == 2:
        return TupleVariable([symbolic_op(tx, operator.floordiv, args), symbolic_op(tx, operator.mod, args)])
    entry = SYMBOLIC_BUILTINS.get(fn)
    if entry is None or len(args) != entry[1]:
        return None
    return symbolic_op(tx, entry[0], args)
