"""The backends kiln_bench measures, by name: how to compile a model and how to empty caches.

  eager     the model itself (the baseline every speedup is relative to);
  inductor  torch.compile with its default backend, the competitor;
  kiln      kiln.compile with its default backend.

Compile time is measured from empty caches: `reset` drops the in-process caches, and the harness
points on-disk caches (KILN_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) at a fresh
folder per model before the first compiled call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

BACKENDS = ("eager", "inductor", "kiln")


def compile_model(backend: str, model: torch.nn.Module) -> Callable[..., Any]:
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model)
    if backend == "kiln":
        import kiln

        if not hasattr(kiln, "compile"):
            raise NotImplementedError("kiln.compile is not built yet (the umbrella package has no compile)")
        compiled: Callable[..., Any] = kiln.compile(model)
        return compiled
    raise KeyError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def compile_details(backend: str) -> dict[str, Any]:
    """What the backend says about the compile that just ran: graph count, graph breaks, graphs
    that fell back to eager, and compile seconds by phase (kiln only; torch.compile exposes none
    of this publicly)."""
    if backend != "kiln":
        return {}
    import kiln

    log = kiln.compile_log()
    phases: dict[str, float] = {}
    for record in log:
        for phase, seconds in record.phases.items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    stats = kiln.capture_stats()
    return {
        "graphs": len(log),
        "graph_breaks": stats.graph_breaks,
        "frames_not_captured": len(stats.frames_not_captured),
        "graphs_fell_back": sum(1 for record in log if record.fell_back),
        "phases_s": {phase: round(seconds, 4) for phase, seconds in phases.items()},
    }


def reset(backend: str) -> None:
    """Drop in-process compile caches so the next compile starts from nothing."""
    torch.compiler.reset()
    if backend == "kiln":
        import kiln

        if hasattr(kiln, "reset"):
            kiln.reset()
