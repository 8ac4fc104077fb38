"""Strings formatted from tensor data, built after the graph: `f"tokens: {n}"` of a 0-d tensor `n`.

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


def can_defer(value: VariableTracker, conversion: int) -> bool:
    """Whether `FORMAT_VALUE` of `value` may be built after the graph (Note [Strings formatted
    from tensors])."""
    return (
        _enabled
        and isinstance(value, TensorVariable)
        and conversion == 0
        and value.cls is torch.Tensor
        and value.fake.dim() == 0
        and not value.fake.is_meta
    )


class FormattedStringVariable(VariableTracker):
    """A `str` made of constant parts and tensors formatted with a spec, built by the runner."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[str | tuple[TensorVariable, str]]) -> None:
        self.parts = parts

    @staticmethod
    def of_tensor(tx: Tx, value: TensorVariable, spec: str) -> FormattedStringVariable:
        detached = tx.output.create_call(tx, "call_method", "detach", [value], {})
        snapshot = tx.output.create_call(tx, "call_method", "clone", [detached], {})
        assert isinstance(snapshot, TensorVariable)
        decisions_log.info("%s: %s formatted after the graph", tx.where(), value.describe())
        return FormattedStringVariable([(snapshot, spec)])

    @staticmethod
    def join(parts: list[VariableTracker]) -> FormattedStringVariable:
        out: list[str | tuple[TensorVariable, str]] = []
        for p in parts:
            if isinstance(p, FormattedStringVariable):
                out.extend(p.parts)
            else:
                out.append(p.as_constant())
        return FormattedStringVariable(out)

    def describe(self) -> str:
        shown = "".join(p if isinstance(p, str) else "{" + p[0].node.name + "}" for p in self.parts)
        return f"string {shown!r} formatted from tensor data"

    def python_type(self) -> type:
        return str

    def as_constant(self) -> Any:
        raise Unsupported(
            f"the characters of the {self.describe()} are needed during capture",
            advice="format the tensor outside the compiled function, or keep the value as a tensor",
        )

    def truth(self, tx: Tx) -> bool:
        return self.as_constant()

    def length(self, tx: Tx) -> int:
        return self.as_constant()

    def reconstruct(self, cg: Reconstructor) -> str:
        pieces = [
            repr(p) if isinstance(p, str) else f"{cg.const(format)}({p[0].reconstruct(cg)}, {p[1]!r})"
            for p in self.parts
        ]
        return "(" + " + ".join(pieces or ["''"]) + ")"
