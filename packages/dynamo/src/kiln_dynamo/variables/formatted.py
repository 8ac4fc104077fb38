"""Strings formatted from tensor data or symbolic sizes, built after the graph: `f"tokens: {n}"` of
a 0-d tensor `n`, `f"n={x.shape[0]}"` and `str(x.shape)` under symbolic sizes.

The value of such a string is tensor data, which capture does not have; but programs often build
one only to hand it to a check that never fails, or to a message that is never shown. So the
string stays a tracker whose parts are constants and formatted snapshots of tensors; nothing is
formatted while tracing. If the frame lets the string out (returns it, stores it, keeps it live
across a graph break), the runner formats it from the graph's outputs; anything that needs its
characters during capture (`len`, `==`, a method, a C call) is a graph break at that point.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.logs import decisions_log
from kiln_dynamo.variables.base import VariableTracker
from kiln_dynamo.variables.lists import BaseListVariable, SizeVariable
from kiln_dynamo.variables.symbolic import SymNodeVariable
from kiln_dynamo.variables.tensor import TensorVariable

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx


# Note [Strings formatted from tensors]
# `format(t, "")` of a 0-d tensor of class `torch.Tensor` is `format(t.item(), "")`
# (`Tensor.__format__`): it reads the value only, not the tensor's autograd history, so the runner
# formatting the graph's output gives the string eager makes, whether the tensor requires grad or
# not and whichever backend computed it. Other cases keep the graph break at the format: a tensor
# of more than 0 dims formats as `str(t)`, which shows `grad_fn=` (a compiled graph's differs
# from eager's), as do the `!s`/`!r`/`!a` conversions; a subclass (a Parameter) formats its own
# way. The string must show the value at the moment of formatting, and the frame may change the
# tensor in place afterwards: so the format snapshots it in the graph, `t.detach().clone()`, two
# nodes of one element that a backend drops when the string is never used. The snapshot is made
# under the frame's grad mode; `detach` keeps it out of autograd either way. `KILN_DEFER_FORMAT=0`
# turns this off (the break at the format, as before).
_enabled = os.environ.get("KILN_DEFER_FORMAT", "1") != "0"


def can_defer(value: VariableTracker, conversion: int, spec: str = "") -> bool:
    """Whether `FORMAT_VALUE` of `value` may be built after the graph (Note [Strings formatted
    from tensors], Note [Strings formatted from symbolic sizes])."""
    if _symbolic_number(value):
        # `!s`/`!r`/`!a` of an int or a float is `format(v, "")`; with a spec they differ
        return _enabled and (conversion == 0 or spec == "")
    return (
        _enabled
        and isinstance(value, TensorVariable)
        and conversion == 0
        and value.cls is torch.Tensor
        and value.fake.dim() == 0
        and not value.fake.is_meta
    )


# Note [Strings formatted from symbolic sizes]: `f"n={x.shape[0]}"` of a symbolic size is the
# size's decimal digits, which differ per size: made during capture, the string would be a
# constant that the resumed code (or the frame's guards) must check per size, one graph per size
# (torch specializes the size). Instead it is built like a string of tensor data: a part of the
# string is the symbolic number, which the runner computes in Python as it computes any number of
# sizes leaving the frame (Note [Symbolic numbers stay out of the graph until a tensor needs
# them]), and `format(n, spec)` of that int or float is eager's string. `str()`/`repr()` of a
# `torch.Size`, tuple or list of ints and symbolic ints is built the same way, from its brackets,
# commas and items. No guard is recorded. Where the characters are needed during capture (`==`,
# `len`, a method) a string made only of constants and symbolic numbers is specialized then: each
# number's value is guarded, as before; one with tensor data stays a break.
def _symbolic_number(value: VariableTracker) -> bool:
    return isinstance(value, SymNodeVariable) and value.python_type() in (int, float)


def sequence_text(value: VariableTracker) -> FormattedStringVariable | None:
    """`str(value)` of a Size, tuple or list of ints among which a symbolic size, built after the
    graph (Note [Strings formatted from symbolic sizes]); None for anything else."""
    if not _enabled or not isinstance(value, BaseListVariable):
        return None
    kind = value.python_type()
    if kind not in (torch.Size, tuple, list) or (not isinstance(value, SizeVariable) and kind is torch.Size):
        return None
    items = list(value.items)
    if not any(_symbolic_number(i) for i in items) or not all(
        (_symbolic_number(i) and i.python_type() is int) or (i.is_constant() and type(i.as_constant()) is int)
        for i in items
    ):
        return None
    opening, closing = {torch.Size: ("torch.Size([", "])"), tuple: ("(", ")"), list: ("[", "]")}[kind]
    parts: list[str | tuple[VariableTracker, str]] = [opening]
    for k, item in enumerate(items):
        if k:
            parts.append(", ")
        parts.append((item, "") if _symbolic_number(item) else repr(item.as_constant()))
    parts.append("," + closing if kind is tuple and len(items) == 1 else closing)
    return FormattedStringVariable(parts)


class FormattedStringVariable(VariableTracker):
    """A `str` made of constant parts and tensors formatted with a spec, built by the runner."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[str | tuple[VariableTracker, str]]) -> None:
        self.parts = parts  # constants, and (snapshot tensor or symbolic number, format spec)

    @staticmethod
    def of_tensor(tx: Tx, value: TensorVariable, spec: str) -> FormattedStringVariable:
        detached = tx.output.create_call(tx, "call_method", "detach", [value], {})
        snapshot = tx.output.create_call(tx, "call_method", "clone", [detached], {})
        assert isinstance(snapshot, TensorVariable)
        decisions_log.info("%s: %s formatted after the graph", tx.where(), value.describe())
        return FormattedStringVariable([(snapshot, spec)])

    @staticmethod
    def of_number(tx: Tx, value: VariableTracker, spec: str) -> FormattedStringVariable:
        """Note [Strings formatted from symbolic sizes]."""
        decisions_log.info("%s: %s formatted after the graph", tx.where(), value.describe())
        return FormattedStringVariable([(value, spec)])

    @staticmethod
    def join(parts: list[VariableTracker]) -> FormattedStringVariable:
        out: list[str | tuple[VariableTracker, str]] = []
        for p in parts:
            if isinstance(p, FormattedStringVariable):
                out.extend(p.parts)
            else:
                out.append(p.as_constant())
        return FormattedStringVariable(out)

    def describe(self) -> str:
        shown = "".join(p if isinstance(p, str) else "{" + _shown(p[0]) + "}" for p in self.parts)
        if all(isinstance(p, str) or _symbolic_number(p[0]) for p in self.parts):
            return f"string {shown!r} formatted from symbolic sizes"
        return f"string {shown!r} formatted from tensor data"

    def python_type(self) -> type:
        return str

    def as_constant(self) -> Any:
        if all(isinstance(p, str) or _symbolic_number(p[0]) for p in self.parts):
            # Note [Strings formatted from symbolic sizes]: specialized now, each number guarded
            return "".join(p if isinstance(p, str) else format(_value(p[0]), p[1]) for p in self.parts)
        raise Unsupported(
            f"the characters of the {self.describe()} are needed during capture",
            advice="format the tensor outside the compiled function, or keep the value as a tensor",
        )

    def _characters(self, tx: Tx) -> VariableTracker:
        """The string as a constant, its sizes specialized (Note [Strings formatted from symbolic
        sizes]), or the break."""
        return tx.wrap_constant(self.as_constant())

    def call_method(
        self, tx: Tx, name: str, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> VariableTracker:
        return self._characters(tx).call_method(tx, name, args, kwargs)

    def getitem(self, tx: Tx, key: VariableTracker) -> VariableTracker:
        return self._characters(tx).getitem(tx, key)

    def iterate(self, tx: Tx) -> list[VariableTracker]:
        return self._characters(tx).iterate(tx)

    def truth(self, tx: Tx) -> bool:
        return bool(self.as_constant())

    def length(self, tx: Tx) -> int:
        return len(self.as_constant())

    def reconstruct(self, cg: Reconstructor) -> str:
        pieces = [
            repr(p) if isinstance(p, str) else f"{cg.const(format)}({p[0].reconstruct(cg)}, {p[1]!r})"
            for p in self.parts
        ]
        return "(" + " + ".join(pieces or ["''"]) + ")"


def _shown(value: VariableTracker) -> str:
    if isinstance(value, TensorVariable):
        return value.node.name
    assert isinstance(value, SymNodeVariable)
    return str(value.value.node.expr)


def _value(value: VariableTracker) -> Any:
    """A symbolic number's value in this run, guarded (Note [Strings formatted from symbolic sizes])."""
    assert isinstance(value, SymNodeVariable)
    return value.value.__int__() if value.python_type() is int else value.value.__float__()
