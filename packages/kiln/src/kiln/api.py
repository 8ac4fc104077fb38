"""`kiln.compile`, with torch.compile's contract, and the rest of the user-facing surface."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kiln_dynamo
import kiln_loopir
from kiln.backends import BACKENDS, COMPILE_LOG, CPU_BACKENDS, MODES, PASS_OPTIONS, GraphCompile, make_backend

_OPTIONS = frozenset(
    {
        "strict",
        "cpu_backend",
        "cpp_options",
        "triton_options",
        "fusion_aware_saves",
        "materialized_saves",
        "recompute_sources",
        *PASS_OPTIONS,
    }
)


def compile(
    model_or_fn: Any = None,
    *,
    backend: str | Callable[..., Any] = "kiln",
    fullgraph: bool = False,
    dynamic: bool | None = None,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """Compile a function or nn.Module; the first call captures and compiles, later calls reuse.

    `backend` is "kiln" (default), "aot_eager", "eager", or any callable with PyTorch's backend
    protocol. `fullgraph=True` turns a graph break into an error. Options: `{"strict": True}`
    raises when a backend fails instead of falling back to eager with a warning; loopir's graph
    passes are switched by name (`{"layout": False}`, `{"pad_mm": False}`, `{"attention": False}`,
    `{"layout_policy": "cuda"}`: kiln_loopir.passes.PassOptions), so each one's effect can be measured.
    `{"cpu_backend": "triton"}` generates Triton instead of C++ for CPU graphs (run by Triton's
    interpreter under `TRITON_INTERPRET=1`; how the Triton code generator is tested without a GPU).
    `{"cpp_options": {"weighted_work": False}}` switches the C++ code generator's own
    optimizations (kiln_codegen_cpp.CppOptions; default: from `KILN_CPP_OPTIONS`), and
    `{"triton_options": {"autotune_min_bytes": 0}}` the Triton code generator's
    (kiln_codegen_triton.TRITON_OPTIONS: the default mode's autotuning of large kernels, split
    reductions, tiling).
    `{"fusion_aware_saves": False}` makes a training graph's partition weigh every saved value
    by its bytes alone (kiln_aotgrad's Note [What saving a value costs]: by default a value the
    forward would fuse away weighs twice its bytes, so LayerNorm saves x and its row statistics,
    not the normalized rows); `{"materialized_saves": False}` lets it recompute in the backward a
    value a convolution's or matmul's backward reads (kiln_aotgrad's Note [Values the backward
    would write]: by default such a value is saved); `{"recompute_sources": False}` lets the
    fusion-aware partition recompute a value from saved values of more bytes than its own
    (kiln_aotgrad's Note [Recomputing from many values]: by default a residual stream's sums are
    saved, not recomputed from every projection before them).
    Without a model, returns a decorator. `dynamic` as torch.compile's: None (default) compiles
    static first and makes the dims that changed symbolic on the next compile, True makes every
    size symbolic from the first call, False never does (a backend that cannot compile symbolic
    sizes gets the frame static again, with the reason in `KILN_LOG=recompiles`).
    """
    if dynamic not in (None, True, False):
        raise TypeError(f"dynamic must be None, True or False, not {dynamic!r}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown kiln.compile mode {mode!r}; expected one of {MODES}")
    unknown = set(options or {}) - _OPTIONS
    if unknown:
        raise ValueError(f"unknown kiln.compile options {sorted(unknown)}; supported: {sorted(_OPTIONS)}")
    strict = bool((options or {}).get("strict", False))
    if isinstance(backend, str):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS} or a callable")
        passes = {k: v for k, v in (options or {}).items() if k in PASS_OPTIONS}
        kiln_loopir.PassOptions.from_mapping(passes)  # a malformed value fails here, not per graph
        cpu_backend = (options or {}).get("cpu_backend", "cpp")
        if cpu_backend not in CPU_BACKENDS:
            raise ValueError(f"unknown cpu_backend {cpu_backend!r}; expected one of {CPU_BACKENDS}")
        cpp_options = dict((options or {}).get("cpp_options") or {})
        if cpp_options:
            from kiln_codegen_cpp import CppOptions

            CppOptions.from_mapping(cpp_options)  # a malformed value fails here, not per graph
        triton_options = dict((options or {}).get("triton_options") or {})
        if triton_options:
            from kiln_codegen_triton import check_triton_options

            check_triton_options(triton_options)  # a malformed value fails here, not per graph
        resolved: Callable[..., Any] = make_backend(
            backend,
            strict=strict,
            mode=mode,
            passes=passes,
            cpu_backend=cpu_backend,
            cpp_options=cpp_options,
            triton_options=triton_options,
            fusion_aware_saves=_bool_option(options, "fusion_aware_saves", True),
            materialized_saves=_bool_option(options, "materialized_saves", True),
            recompute_sources=_bool_option(options, "recompute_sources", True),
        )
    elif callable(backend):
        resolved = backend
    else:
        raise TypeError(f"backend must be a name or a callable, not {type(backend).__name__}")

    def wrap(target: Any) -> Any:
        return kiln_dynamo.compile(target, resolved, fullgraph=fullgraph, dynamic=dynamic)

    return wrap if model_or_fn is None else wrap(model_or_fn)


def _bool_option(options: dict[str, Any] | None, name: str, default: bool) -> bool:
    value = (options or {}).get(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"kiln.compile option {name!r} must be True or False, not {value!r}")
    return value


def reset(*, kernels: bool = False) -> None:
    """Forget every compiled graph and cache entry (in-process; the on-disk cache stays).
    Kernels already loaded are reused by a later compile of the same graph, unless ``kernels``:
    then that compile builds them again (from the disk cache, or the compiler if the disk cache
    is empty), as a new process would; benchmarks of cold compile times ask for it."""
    kiln_dynamo.reset()
    COMPILE_LOG.clear()
    if kernels:
        cpp = sys.modules.get("kiln_codegen_cpp")
        if cpp is not None:
            cpp.forget_loaded()


def compile_log() -> list[GraphCompile]:
    """Every graph compiled since the last reset, with its time per phase."""
    return list(COMPILE_LOG)


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """What capture did since the last reset: graphs handed to the backend, graph breaks (frames
    split with a continuation), the frames that ran as plain Python instead (code name, reason),
    and every break's reason as `kiln.explain` reports it."""

    graphs: int
    graph_breaks: int
    frames_not_captured: list[tuple[str, str]]
    break_reasons: list[kiln_dynamo.BreakReason]


def capture_stats() -> CaptureStats:
    """Counts from the capture layer since the last reset (see `CaptureStats`)."""
    counters = kiln_dynamo.counters
    return CaptureStats(
        graphs=counters.graphs,
        graph_breaks=counters.graph_breaks,
        frames_not_captured=list(counters.fallbacks),
        break_reasons=list(counters.break_reasons),
    )


def explain(model_or_fn: Any) -> Callable[..., kiln_dynamo.ExplainOutput]:
    """`kiln.explain(fn)(*args, **kwargs)` runs `fn` once under capture (from cold caches) and
    returns what happened: `graphs`, `graph_count`, `graph_break_count`, `break_reasons` (each in
    plain words, with the user's file, line and source, the inlined calls that led there and one
    line of advice), `op_count` per graph and the guards; `str()` of it is a readable report.
    Capture only: nothing is compiled, so it is quick."""
    return kiln_dynamo.explain(model_or_fn)


def prepare() -> str:
    """Do kiln's one-time setup now instead of in the background of the first compiles: build (or
    load) the torch-linked tensor checker that guards use, once per torch version (Note [The
    torch-linked tensor checker] in kiln_dynamo.tensor_check), and the C++ generator's precompiled
    system headers for the default options (Note [Precompiled headers] in kiln_codegen_cpp's
    pch.py). Returns the checker's status ("in use", or why not). Benchmarks call it first, so
    that a fresh compile cache per model measures each compile, not these builds; a user's program
    never needs to."""
    from kiln_codegen_cpp import CppOptions, prepare_headers
    from kiln_dynamo import tensor_check

    tensor_check.install(build=True)
    prepare_headers(CppOptions.from_mapping(None).compiler_flags())
    return tensor_check.status()
