"""`explain(fn)(*args, **kwargs)`: run a function once under capture and report what happened.

The report lists every graph (with its op count and the user lines its nodes came from), every
graph break or frame left to plain Python (reason in user words, file, line, source, the inlined
calls that led there, advice) and the guards of each captured frame. Caches are dropped first
(`reset()`), so the report describes a cold call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from kiln_dynamo import convert_frame
from kiln_dynamo.counters import counters
from kiln_dynamo.exc import BreakReason
from kiln_dynamo.guards import readable_guards


@dataclass(slots=True)
class ExplainOutput:
    graphs: list[torch.fx.GraphModule] = field(default_factory=list)
    break_reasons: list[BreakReason] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)  # one readable block per captured frame
    frames: list[str] = field(default_factory=list)  # the captured frames, in capture order
    result: Any = None

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        return len(self.break_reasons)

    @property
    def op_count(self) -> list[int]:
        kinds = ("call_function", "call_method", "call_module")
        return [sum(1 for n in gm.graph.nodes if n.op in kinds) for gm in self.graphs]

    def __str__(self) -> str:
        lines = [
            f"{self.graph_count} graph(s), {self.graph_break_count} graph break(s), "
            f"ops per graph: {self.op_count}"
        ]
        for i, gm in enumerate(self.graphs):
            where = sorted(
                {str(n.meta.get("source_line")) for n in gm.graph.nodes if n.meta.get("source_line")}
            )
            lines.append(f"graph {i}: {self.op_count[i]} op(s) from {', '.join(where) or '-'}")
        for i, reason in enumerate(self.break_reasons):
            lines.append(f"break {i}: {reason}")
        for frame, guard in zip(self.frames, self.guards, strict=True):
            lines.append(f"guards of {frame}:\n{guard}")
        return "\n".join(lines)


def explain(fn: Any) -> Callable[..., ExplainOutput]:
    """`explain(fn)(*args, **kwargs)` runs `fn` once (captured with the eager backend) and returns
    an `ExplainOutput`."""
    from kiln_dynamo.eval_frame import compile, reset

    def run(*args: Any, **kwargs: Any) -> ExplainOutput:
        reset()
        out = ExplainOutput()

        def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            out.graphs.append(gm)
            return gm.forward

        backend.__kiln_dynamic_shapes__ = True  # type: ignore[attr-defined]  # as the eager backend

        def listen(code_name: str, captured: convert_frame.CapturedFrame) -> None:
            out.frames.append(code_name)
            out.guards.append(readable_guards(captured.guard))

        convert_frame.capture_listeners.append(listen)
        try:
            out.result = compile(fn, backend=backend)(*args, **kwargs)
        finally:
            convert_frame.capture_listeners.remove(listen)
        out.break_reasons = list(counters.break_reasons)
        return out

    return run
