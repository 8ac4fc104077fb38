"""Process-wide counters: what the capture machinery saw and decided.

`counters` is one object with plain integer fields plus `fallbacks`, a list of (code name,
reason) for frames that ran as plain Python. Tests read it to assert "exactly one graph" or
"exactly one recompile"; `reset()` zeroes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln_dynamo.exc import BreakReason


@dataclass(slots=True)
class Counters:
    frames_seen: int = 0  # callback invocations (cache misses)
    frames_captured: int = 0  # frames turned into a graph + guards
    graphs: int = 0  # graphs handed to a backend
    ops: int = 0  # call_function/call_method/get_attr nodes across all graphs
    recompiles: int = 0  # captures of a code that already had an entry
    frames_without_graph: int = 0  # captured, found no tensor work, left to run as plain Python
    graph_breaks: int = 0  # frames split at a graph break (each split counted once, at capture)
    after_loops: int = 0  # frames whose loop (holding a break) runs as Python, its exit continuing
    loop_pieces: int = 0  # pieces of such loops' bodies the frames call (Note [Loop body pieces])
    module_inits: int = 0  # nn.Module constructors run as Python (Note [Module constructors run as Python])
    break_reasons: list[BreakReason] = field(default_factory=list)  # splits and plain-Python frames
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    guard_failures: list[str] = field(default_factory=list)
    # (code name, reason) for each dynamic graph a backend refused (compiled static instead)
    dynamic_fallbacks: list[tuple[str, str]] = field(default_factory=list)

    def reset(self) -> None:
        self.frames_seen = 0
        self.frames_captured = 0
        self.graphs = 0
        self.ops = 0
        self.recompiles = 0
        self.frames_without_graph = 0
        self.graph_breaks = 0
        self.after_loops = 0
        self.loop_pieces = 0
        self.module_inits = 0
        self.break_reasons.clear()
        self.fallbacks.clear()
        self.guard_failures.clear()
        self.dynamic_fallbacks.clear()


counters = Counters()
