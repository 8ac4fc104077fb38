"""The backends kiln_bench measures, by name: how to compile a model and how to empty caches.

  eager     the model itself (the baseline every speedup is relative to);
  inductor  torch.compile with its default backend, the competitor;
  kiln      kiln.compile with its default backend.

A compiler takes a torch.compile mode after a colon: ``kiln:reduce-overhead`` (CUDA graphs),
``inductor:max-autotune``; the name alone is the default mode.

Compile time is measured from empty caches: `reset` drops the in-process caches, and the harness
points on-disk caches (KILN_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) at a fresh
folder per model before the first compiled call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

BACKENDS = ("eager", "inductor", "kiln")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def parse(backend: str) -> tuple[str, str | None]:
    """``"kiln:reduce-overhead"`` -> ``("kiln", "reduce-overhead")``; ``"kiln"`` -> ``("kiln", None)``."""
    name, _, mode = backend.partition(":")
    if name not in BACKENDS:
        raise KeyError(f"unknown backend {backend!r}; expected one of {BACKENDS}, with an optional :mode")
    if mode and (name == "eager" or mode not in COMPILE_MODES):
        raise KeyError(f"unknown mode in {backend!r}; a compiler takes one of {COMPILE_MODES}")
    return name, mode or None


def compile_model(backend: str, model: torch.nn.Module) -> Callable[..., Any]:
    name, mode = parse(backend)
    if name == "eager":
        return model
    if name == "inductor":
        return torch.compile(model, mode=mode)
    import kiln

    if not hasattr(kiln, "compile"):
        raise NotImplementedError("kiln.compile is not built yet (the umbrella package has no compile)")
    compiled: Callable[..., Any] = kiln.compile(model, mode=mode)
    return compiled


def compile_details(backend: str) -> dict[str, Any]:
    """What the backend says about the compile that just ran: graph count, graph breaks, graphs
    that fell back to eager, and compile seconds by phase (kiln only; torch.compile exposes none
    of this publicly)."""
    if backend.partition(":")[0] != "kiln":  # any name a custom compile_fn measures passes
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


def prepare_kiln() -> None:
    """kiln's one-time setup (the guard checker, once per torch version) before any measurement:
    each model then compiles in fresh caches (harness.py) without rebuilding it, as a user's
    second program would. What it says is logged once."""
    import kiln

    global _PREPARED
    if not _PREPARED:
        _PREPARED = kiln.prepare()
        print(f"kiln guard checker: {_PREPARED}", file=sys.stderr)


_PREPARED = ""


def reset(backend: str) -> None:
    """Drop in-process compile caches so the next compile starts from nothing."""
    torch.compiler.reset()
    if backend.partition(":")[0] == "kiln":
        import kiln

        if hasattr(kiln, "reset"):
            kiln.reset()
