"""The backends kiln_bench measures, by name: how to compile a model and how to empty caches.

  eager     the model itself (the baseline every speedup is relative to);
  inductor  torch.compile with its default backend, the competitor;
  kiln      kiln.compile with its default backend.

A compiler takes a torch.compile mode after a colon: ``kiln:reduce-overhead`` (CUDA graphs),
``inductor:max-autotune``; the name alone is the default mode. kiln takes options after a second
colon, ``+``-separated, each value a Python literal: ``kiln::layout=False`` (default mode, the
layout pass off), ``kiln:reduce-overhead:pad_mm=False+attention=False``; ``triton.NAME=`` and
``cpp.NAME=`` set the code generators' own switches (``kiln::triton.autotune_min_bytes=0``). Such a
*variant* is how one pass's effect is measured (``--ablation``: Note [The ablation]).

Note [The ablation]: the paper's ablation table turns each optimization off in turn and reports
the suite's geomean. :data:`ABLATION` lists kiln's switches that matter on each device, each with
the value that turns it off; ``python -m kiln_bench --ablation`` adds one variant per switch
next to the backends asked for, and the report divides each variant's time per model by plain
kiln's (a ratio above 1: that pass was saving time). CUDA graphs are a mode, not a switch:
compare ``kiln`` with ``kiln:reduce-overhead``. On a GPU run it with ``--profile``: the table then
compares GPU busy time, which a pass changes, instead of wall time, which on the H200 the host's
noise sets in the default mode (seventh session: a ResNet variant that switches off a pass ResNet
never uses measured 0.69x to 1.25x of plain kiln's wall time).

Compile time is measured from empty caches: `reset` drops the in-process caches, and the harness
points on-disk caches (KILN_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) at a fresh
folder per model before the first compiled call.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from typing import Any

import torch

BACKENDS = ("eager", "inductor", "kiln")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


# Note [The ablation]: (device, option, the value that turns it off) — loopir's graph passes by
# their kiln.compile option name, the code generators' switches as triton./cpp. names
ABLATION: tuple[tuple[str, str, Any], ...] = (
    ("cuda", "layout", False),
    ("cuda", "pad_mm", False),
    ("cuda", "attention", False),
    ("cuda", "attention_mask", False),
    ("cuda", "conv_bias", False),
    ("cuda", "conv_bias_grad", False),
    ("cuda", "nhwc_weights", False),
    ("cuda", "patch_conv", False),
    ("cuda", "cse", False),
    ("cuda", "view_scatter", False),
    ("cuda", "pool_values_max", False),
    ("cuda", "layout_training", False),
    ("cuda", "pool_backward", False),
    ("cuda", "triton.autotune_min_bytes", 0),
    ("cuda", "triton.allow_tiling", False),
    ("cuda", "triton.split_min_rnumel", 1 << 40),
    ("cuda", "triton.reorder_reductions", False),
    ("cuda", "triton.memory_order_pointwise", False),
    ("cuda", "triton.outer_by_tiles", False),
    ("cuda", "triton.welford_tiles", False),
    ("cuda", "triton.welford_chunks", False),
    ("cuda", "triton.native_launch", False),
    ("cuda", "materialized_saves", False),
    ("cuda", "recompute_sources", False),
    ("cuda", "tiny_fusion", False),
    ("cpu", "layout", False),
    ("cpu", "attention", False),
    ("cpu", "cse", False),
    ("cpu", "view_scatter", False),
    ("cpu", "pool_backward", False),
    ("cpu", "pool_values_max", False),
    ("cpu", "conv_fusion", False),
    ("cpu", "cpp.split_reductions", False),
    ("cpu", "cpp.weighted_work", False),
    ("cpu", "var_mean", False),
    ("cpu", "cpp.shifted_welford", False),
    ("cpu", "materialized_saves", False),
    ("cpu", "recompute_sources", False),
    ("cpu", "tiny_fusion", False),
    ("cpu", "cpp.overlap_builds", False),
    ("cpu", "cpp.precompiled_headers", False),
    ("cpu", "cpp.share_twins", False),
)


def parse(backend: str) -> tuple[str, str | None]:
    """``"kiln:reduce-overhead"`` -> ``("kiln", "reduce-overhead")``; ``"kiln"`` -> ``("kiln", None)``
    (a variant's options are checked here too: :func:`variant_options`)."""
    name, _, rest = backend.partition(":")
    mode, _, opts = rest.partition(":")
    if name not in BACKENDS:
        raise KeyError(f"unknown backend {backend!r}; expected one of {BACKENDS}, with an optional :mode")
    if mode and (name == "eager" or mode not in COMPILE_MODES):
        raise KeyError(f"unknown mode in {backend!r}; a compiler takes one of {COMPILE_MODES}")
    if opts:
        if name != "kiln":
            raise KeyError(f"options in {backend!r}: only kiln takes options after a second colon")
        variant_options(backend)
    return name, mode or None


def variant_options(backend: str) -> dict[str, Any]:
    """The kiln.compile options of a variant: ``"kiln::layout=False+triton.allow_tiling=False"`` ->
    ``{"layout": False, "triton_options": {"allow_tiling": False}}`` (KeyError when malformed)."""
    opts = backend.split(":", 2)[2] if backend.count(":") >= 2 else ""
    options: dict[str, Any] = {}
    for item in (o for o in opts.split("+") if o):
        key, eq, text = item.partition("=")
        if not eq or not key:
            raise KeyError(f"option {item!r} in {backend!r} is not NAME=VALUE")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise KeyError(f"option {item!r} in {backend!r}: {text!r} is not a Python literal") from None
        group, dot, sub = key.partition(".")
        if dot:
            if group not in ("triton", "cpp"):
                raise KeyError(f"option {item!r} in {backend!r}: only triton. and cpp. take a dotted name")
            options.setdefault(f"{group}_options", {})[sub] = value
        else:
            options[key] = value
    return options


def ablation_variants(backend: str, device: str) -> list[str]:
    """One variant of ``backend`` (a kiln backend, with its mode) per switch of :data:`ABLATION`
    that applies on ``device``."""
    name, mode = parse(backend)
    if name != "kiln":
        raise KeyError(f"the ablation varies kiln, not {backend!r}")
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return [f"kiln:{mode or ''}:{option}={value!r}" for dev, option, value in ABLATION if dev == kind]


def compile_model(backend: str, model: torch.nn.Module) -> Callable[..., Any]:
    name, mode = parse(backend)
    if name == "eager":
        return model
    if name == "inductor":
        return torch.compile(model, mode=mode)
    import kiln

    if not hasattr(kiln, "compile"):
        raise NotImplementedError("kiln.compile is not built yet (the umbrella package has no compile)")
    options = variant_options(backend)
    compiled: Callable[..., Any] = kiln.compile(model, mode=mode, options=options or None)
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
        # why, in the table's reason column: a silent fallback (a backward graph run unfused)
        # looked like a slow kernel in the twenty-third session's float32 training run
        "fell_back": [f"{record.graph}: {record.fell_back}" for record in log if record.fell_back],
        "phases_s": {phase: round(seconds, 4) for phase, seconds in phases.items()},
    }


def kernel_bytes(backend: str) -> dict[str, int]:
    """The bytes each kernel kiln generated in the compile that just ran takes (kiln only, and
    only the generators that say: the Triton one), by kernel name; a name two kernels of other
    sizes share is left out. What the profile's bandwidth per kernel divides by time (Note
    [Bandwidth of generated kernels] in profile.py)."""
    if backend.partition(":")[0] != "kiln":
        return {}
    import kiln

    out: dict[str, int] = {}
    ambiguous: set[str] = set()
    for record in kiln.compile_log():
        for name, nbytes in record.kernel_bytes.items():
            if nbytes is None or out.get(name, nbytes) != nbytes:
                ambiguous.add(name)
            else:
                out[name] = nbytes
    return {name: nbytes for name, nbytes in out.items() if name not in ambiguous}


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
            # the kernels too: a variant whose switch changes no kernel of a model would
            # otherwise reuse the kernels the previous variant loaded, and time no build
            kiln.reset(kernels=True)
