"""kiln's backends by name, each a function with PyTorch's backend protocol:
`backend(gm, example_inputs) -> callable`.

  eager      capture only: dynamo's graph runs as it is;
  aot_eager  capture + kiln_aotgrad: aten graphs, forward and backward, run unfused;
  kiln       capture + aotgrad + loopir + the code generator for the graph's device (cpp on the
             CPU; triton on CUDA, when kiln_codegen_triton provides it). `cpu_backend="triton"`
             (torch.compile's `cpu_backend` setting) generates Triton for CPU graphs too; those
             kernels run through Triton's interpreter (`TRITON_INTERPRET=1`): slow, it is how
             the Triton code generator is tested end to end without a GPU.

`kiln_backend` is the default and is also exported as `kiln.backend`, so it plugs into
`torch.compile(model, backend=kiln.backend)` as well.

Note [Backend failure]: kiln_aotgrad compiles a graph on its first call (per input signature), so
failures surface at two points, both turned into a fallback with a warning naming the exception
and, where the failing node is known, the user's source line (`options={"strict": True}` raises
`BackendFailed` instead):
  - loopir or a code generator fails on an aten graph: that aten graph runs unfused instead;
  - aotgrad fails while tracing (the call added no compiled signature): the graph runs as dynamo
    captured it, eagerly, from then on.
  - the compiled code raises on the call that compiled it (Note [Run-time fallback]): if the
    captured graph runs eagerly on the same arguments, the graph runs eagerly from then on and the
    call returns eager's result; if eager raises too, eager's exception is raised (the user's own
    error keeps its type). Later calls of a compiled signature raise what the compiled code raises.
  - the compiled backward raises on its first call (Note [Backward fallback]): the forward has
    returned long before, so the captured graph cannot be re-run; the backward's own aten graph
    runs eagerly on the same saved tensors and gradients instead, the same way.
Re-running eagerly is safe: compiling touches no real tensor, and an error that is the user's own
is raised again by eager; a call that failed after writing its inputs back is not re-run but
raised (Note [Run-time fallback]). A wrong answer is never an option: a failure is a fallback or
an error.

Note [Compile time by phase]: each compiled graph gets a `GraphCompile` record (`kiln.compile_log()`)
with its compile time split into capture (kiln_dynamo's tracing, from the graph's `meta`), aotgrad
(tracing the joint graph, decomposing, partitioning: measured around aotgrad's first call, minus
what loopir spent inside it), lower and schedule (loopir), codegen (source generation) and compile
(the native compiler: the time a compile waited for it, plus the time a first call waited for a
C++ build that ran beside the rest, Note [Builds that overlap] in kiln_codegen_cpp), the last with
where its result came from: compiled, or reused from the disk or memory cache, and first run: the first call of what was compiled, which waits for kernels
still compiling (the Triton generator's worker pool) and tunes. A training graph's backward runs
first inside the first `loss.backward()`, long after the forward's record was printed: its first
call adds to the same phase and prints the record again (until then, a GPU training step's
backward kernel compile was counted nowhere: kiln_bench's compile seconds exceeded the phases'
sum by 2 to 5 s). `KILN_LOG=perf` prints the record when a graph is done.

Note [Generated code is not captured]: the code generators' wrappers are Python files in kiln's
cache folder (`kiln_loopir.diskcache.cache_root()`), and the frame hook skips only kiln's own
packages, the standard library and torch. A compiled backward that runs inside a compiled frame
(`loss.backward()` in the compiled function: a graph break, then the autograd engine calls the
backward's wrapper) was captured by kiln_dynamo as user code: graph breaks on its `data_ptr()`
calls and one more graph per size. Every compile therefore tells the hook to skip the code
generators' folders of the cache in use (`_skip_generated_code`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import kiln_aotgrad
import kiln_dynamo
from kiln.collector import only_new_objects
from kiln.logs import dynamic_log
from kiln.logs import perf_log as log
from kiln_loopir import PassOptions
from kiln_loopir.wrapper_support import DataDependentCheckFailed


class BackendFailed(RuntimeError):
    """A backend failed on a graph and `strict` was set."""


# The phases of one graph's compile, in pipeline order (Note [Compile time by phase]).
PHASES = ("capture", "aotgrad", "lower", "schedule", "codegen", "compile", "first run")

# torch.compile's modes. On CUDA they choose Triton's autotuning and CUDA graphs (Note [Modes]);
# on the CPU kiln has nothing to tune or replay, so every mode compiles as the default does.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(slots=True)
class GraphCompile:
    """What one compiled graph cost, by phase (seconds), and how it ended.

    `cache` says, for a phase that can be served from a cache, where its result came from:
    "compiled" (it ran), "disk" or "memory" (reused). A training graph has two aten graphs
    (forward and backward), so its lower/schedule/codegen/compile times are their sums and its
    cache entry reads e.g. "memory+compiled".
    """

    graph: str
    nodes: int
    frame: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    cache: dict[str, str] = field(default_factory=dict)
    fell_back: str | None = None
    # ops that ran eager's kernel inside the compiled graph: (aten op, why its lowering declined)
    op_fallbacks: list[tuple[str, str]] = field(default_factory=list)
    declined: list[tuple[str, str]] = field(default_factory=list)  # kernels loopir's interpreter ran
    # generated kernel -> the bytes its buffers span (loopir's BuildReport.kernel_bytes), for a
    # profile's bandwidth per kernel; forward and backward graphs' kernels together, None for a
    # name two kernels of other sizes share (a profiler could not tell them apart either)
    kernel_bytes: dict[str, int | None] = field(default_factory=dict)
    loopir_seconds: float = 0.0  # lower + schedule + codegen + compile, kept as a running sum
    compiled_at: float = 0.0  # perf_counter() when loopir last finished compiling an aten graph
    # the graph has symbolic sizes (dynamic shapes: a placeholder's size or stride, or an unbacked
    # size); a graph the backend refused them for is not logged, its static recompile is
    symbolic: bool = False

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds
        if phase in ("lower", "schedule", "codegen", "compile"):
            self.loopir_seconds += seconds

    def total(self) -> float:
        return sum(self.phases.values())

    def summary(self) -> str:
        """One line: nodes, each phase's milliseconds and cache source, the total."""
        parts = []
        for phase in PHASES:
            if phase in self.phases:
                hit = f" [{self.cache[phase]}]" if phase in self.cache else ""
                parts.append(f"{phase} {self.phases[phase] * 1e3:.1f} ms{hit}")
        where = f" from {self.frame}" if self.frame else ""
        return (
            f"{self.graph}{where}: {self.nodes} nodes; {', '.join(parts)}; total {self.total() * 1e3:.1f} ms"
        )


# kiln.compile options that switch loopir's graph passes: PassOptions' fields, passed through to
# compile_graph unchanged
PASS_OPTIONS = tuple(f.name for f in dataclasses.fields(PassOptions))

# Every graph compiled in this process, in order (kiln.compile_log()).
COMPILE_LOG: list[GraphCompile] = []


# Note [Inputs the frame guard checks in the C++ wrapper]: off with KILN_GUARDED_LAYOUTS=0
GUARDED_LAYOUTS = os.environ.get("KILN_GUARDED_LAYOUTS", "1") != "0"

# The code generators a CPU graph can get (option `cpu_backend`).
CPU_BACKENDS = ("cpp", "triton")


def _codegen_for(device: torch.device, cpu_backend: str = "cpp") -> str:
    if device.type == "cpu":
        if cpu_backend == "triton" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise BackendFailed(
                "cpu_backend='triton' runs Triton kernels on CPU tensors only under TRITON_INTERPRET=1"
            )
        return cpu_backend
    if device.type == "cuda":
        return "triton"
    raise BackendFailed(f"kiln has no code generator for device {device}")


def _origin(exc: BaseException) -> str:
    """The user's source line of the node an exception names, when it names one."""
    node = getattr(exc, "node", None)
    meta = getattr(node, "meta", None) or {}
    where = meta.get("stack_trace") or meta.get("source_line") or ""
    return f" (at {str(where).strip().splitlines()[-1]})" if where else ""


def _fallback(
    gm: torch.fx.GraphModule,
    record: GraphCompile,
    exc: BaseException,
    strict: bool,
    backend: str,
    what: str,
    when: str = "",
) -> Callable[..., Any]:
    at = f" {when}" if when else ""
    message = (
        f"kiln backend {backend!r} failed{at} on graph {record.graph}: "
        f"{type(exc).__name__}: {exc}{_origin(exc)}"
    )
    if strict:
        raise BackendFailed(message) from exc
    record.fell_back = message
    warnings.warn(f"{message}; running {what} eagerly instead", RuntimeWarning, stacklevel=2)
    return gm.forward


class _FirstCallFallback:
    """Runs aotgrad's callable; if a call fails while aotgrad compiles (no compiled signature was
    added), runs dynamo's graph eagerly from then on (Note [Backend failure])."""

    def __init__(
        self, gm: torch.fx.GraphModule, compiled: Any, record: GraphCompile, strict: bool, backend: str
    ) -> None:
        self.gm, self.compiled, self.record, self.strict, self.backend = gm, compiled, record, strict, backend
        self.fallback: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        # Note [Grad mode after an exception]: a captured graph holds the user's `with
        # torch.no_grad():` as `_set_grad_enabled` calls; run eagerly (a fallback, or aotgrad's
        # run of a program whose written input shares memory), an exception between them left
        # grad mode off for the rest of the process, where eager's `with` restores it. Found by
        # test_alias_fuzz.py: a later, unrelated program then computed without autograd.
        grad = torch.is_grad_enabled()
        try:
            return self._call(*args)
        except BaseException:
            torch._C._set_grad_enabled(grad)
            raise

    def _call(self, *args: Any) -> Any:
        if self.fallback is not None:
            return self.fallback(*args)
        signatures = getattr(self.compiled, "compiled", None)
        before = len(signatures) if signatures is not None else None
        inner_before = self.record.loopir_seconds
        waited = _build_wait()
        start = time.perf_counter()
        try:
            if before == 0:  # the first call compiles (Note [The collector scans only the compile's objects])
                with only_new_objects():
                    result = self.compiled(*args)
            else:  # no context on later calls: host time on every call (issue 14)
                result = self.compiled(*args)
            if before is not None and len(signatures or ()) != before:  # this call compiled
                # Note [Compile time by phase]: aotgrad compiles on the first call, calls loopir
                # for each aten graph inside it, then runs what it compiled; its own time is the rest.
                end = time.perf_counter()
                first_run = end - self.record.compiled_at if self.record.compiled_at > start else 0.0
                elapsed = end - start - (self.record.loopir_seconds - inner_before) - first_run
                self.record.add("aotgrad", elapsed)
                built = min(_build_wait() - waited, first_run)  # Note [Compile time by phase]
                self.record.add("compile", built)
                if first_run:
                    self.record.add("first run", first_run - built)
                log.info("%s", self.record.summary())
            return result
        except Exception as exc:
            if isinstance(exc, BackendFailed | DataDependentCheckFailed) or before is None:
                raise  # strict mode, a failed torch._check, or a callable that keeps no signatures
            if kiln_aotgrad.inputs_written(exc):
                # the inputs hold part of this call's writes: raised, not re-run; later calls
                # run eagerly (Note [Run-time fallback])
                if not self.strict:
                    self.fallback = _fallback(
                        self.gm,
                        self.record,
                        exc,
                        False,
                        self.backend,
                        "the captured graph",
                        when="at run time",
                    )
                raise
            if len(signatures or ()) != before:
                return self._first_run_failed(exc, args)
            # a later call: if eager fails on these arguments too, the error is the user's (a
            # run-time assertion, Note [Extern calls kept for their effect] in kiln_loopir):
            # eager's exception, and the compiled code stays in use for the next call. Eager's
            # run is this call's result: running the graph again would apply its in-place writes
            # to the inputs twice (Note [Run-time fallback])
            try:
                result = self.gm.forward(*args)
            except Exception as eager_exc:
                raise eager_exc from exc
            self.fallback = _fallback(
                self.gm, self.record, exc, self.strict, self.backend, "the captured graph"
            )
            return result

    def _first_run_failed(self, exc: Exception, args: tuple[Any, ...]) -> Any:
        """Note [Run-time fallback]: the compiled code failed on the call that compiled it.

        The captured graph then runs eagerly on the same arguments. If eager fails too, the
        error is the user's (an index out of range, an integer division by zero): eager's own
        exception is raised, of the type eager code would see. If eager succeeds, the compiled
        code is wrong to fail: with a warning naming the exception, the graph's frame and the
        node's user line when the exception names one, the graph runs eagerly from then on and
        this call returns eager's result (`strict` raises `BackendFailed` instead). Re-running
        is safe only where the failed call left the inputs as they were: a compiled graph is
        functional, and aotgrad writes mutated inputs back only after it returns. A failure
        from the write-back on (or in aotgrad's eager run of a program whose written input
        shares memory) says so (`kiln_aotgrad.inputs_written`, Note [Failures after the
        write-back] in kiln_aotgrad's runtime.py): that call raises instead of re-running, which
        would apply the program's in-place writes twice, and later calls run eagerly.
        """
        try:
            result = self.gm.forward(*args)
        except Exception as eager_exc:
            raise eager_exc from exc
        log.info("compiled %s failed on its first run; eager succeeds: falling back", self.record.graph)
        where = f" in {self.record.frame}" if self.record.frame and not _origin(exc) else ""
        self.fallback = _fallback(
            self.gm,
            self.record,
            exc,
            self.strict,
            self.backend,
            f"the captured graph{where}",
            when="at run time",
        )
        return result


class _BackwardFallback:
    """A compiled backward graph that runs its aten graph eagerly if its first call fails.

    Note [Backward fallback]: aotgrad calls a compiled backward from the autograd engine, inside
    `loss.backward()`, when the forward that saved its inputs returned long ago: the dynamo-level
    run-time fallback (Note [Run-time fallback]) only sees forward calls. So the backward is
    guarded on its own: on its first call a failure re-runs the backward's aten graph (what the
    compiler was given) eagerly on the same saved tensors and tangents. If eager fails too, the
    error is the user's and eager's exception is raised; otherwise, with a warning naming the
    exception, the failing op's user line when the exception names a node, and the graph's frame,
    this and every later call of that backward runs eagerly (`strict` raises `BackendFailed`).
    Re-running is safe: a backward graph is functional (it writes none of its inputs), and the
    forward's compiled results are what the aten graph expects as saved tensors. Later failures
    of a backward whose first call succeeded are raised as they are.
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        compiled: Callable[..., Any],
        record: GraphCompile,
        strict: bool,
        backend: str,
    ) -> None:
        self.gm, self.compiled, self.record, self.strict, self.backend = gm, compiled, record, strict, backend
        self.stats = getattr(compiled, "stats", None)
        self.first = True

    def __call__(self, *args: Any) -> Any:
        if not self.first:
            return self.compiled(*args)
        waited = _build_wait()
        start = time.perf_counter()
        try:
            result = self.compiled(*args)
        except Exception as exc:
            return self._failed(exc, args)
        self.first = False
        built = _build_wait() - waited  # Note [Compile time by phase]
        self.record.add("compile", built)
        self.record.add("first run", time.perf_counter() - start - built)
        log.info("%s", self.record.summary())
        return result

    def _failed(self, exc: Exception, args: tuple[Any, ...]) -> Any:
        if isinstance(exc, BackendFailed):
            raise exc
        try:
            result = self.gm(*args)
        except Exception as eager_exc:
            raise eager_exc from exc
        log.info(
            "compiled backward of %s failed on its first run; eager succeeds: falling back", self.record.graph
        )
        where = f" in {self.record.frame}" if self.record.frame and not _origin(exc) else ""
        self.compiled = _fallback(
            self.gm,
            self.record,
            exc,
            self.strict,
            self.backend,
            f"the backward graph{where}",
            when="in the backward at run time",
        )
        self.first = False
        return result


def _build_wait() -> float:
    """Seconds calls have waited for C++ builds still running (Note [Builds that overlap] in
    kiln_codegen_cpp): compile time the first run saw, counted as compile time."""
    cpp = sys.modules.get("kiln_codegen_cpp")
    return cpp.build_wait_seconds() if cpp is not None else 0.0


_SKIPPED_ROOTS: set[str] = set()


def _skip_generated_code() -> None:
    """Note [Generated code is not captured]."""
    import kiln_frame_hook
    from kiln_loopir.diskcache import cache_root

    for generator in ("cpp", "triton"):  # the generators' folders only: a cache folder set to
        # a project's own folder must not hide the project's code from capture
        root = os.path.join(str(cache_root()), generator, "")
        if root not in _SKIPPED_ROOTS:
            _SKIPPED_ROOTS.add(root)
            kiln_frame_hook.add_skip_prefix(root)


def _record(gm: torch.fx.GraphModule) -> GraphCompile:
    meta = getattr(gm, "meta", {})
    record = GraphCompile(
        graph=f"graph_{len(COMPILE_LOG)}", nodes=len(gm.graph.nodes), frame=meta.get("frame", "")
    )
    if "capture_seconds" in meta:  # set by kiln_dynamo; absent under torch.compile(backend=kiln.backend)
        record.add("capture", meta["capture_seconds"])
    COMPILE_LOG.append(record)
    return record


def eager_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    _record(gm)
    return gm.forward


eager_backend.__kiln_dynamic_shapes__ = True  # type: ignore[attr-defined]


def symbolic_inputs(gm: torch.fx.GraphModule) -> list[str]:
    """Placeholders whose size or stride is symbolic (kiln_dynamo's dynamic shapes)."""
    out = []
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if (
            isinstance(val, torch.Tensor)
            and any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride()))
        ) or isinstance(val, torch.SymInt):
            out.append(node.name)
    return out


def _add_loopir_phases(record: GraphCompile, stats: Any) -> None:
    """Note [Compile time by phase]: loopir's stats split its time into lowering, scheduling,
    code generation and the native compile, and say whether that compile came from a cache."""
    record.op_fallbacks.extend(stats.fallbacks)
    record.add("lower", stats.lower_seconds)
    record.add("schedule", stats.schedule_seconds)
    record.add("codegen", stats.codegen_seconds)
    record.add("compile", stats.compile_seconds)
    record.declined.extend(stats.declined)
    for name, nbytes in getattr(stats, "kernel_bytes", ()):
        seen = record.kernel_bytes.get(name, nbytes)
        record.kernel_bytes[name] = nbytes if seen == nbytes else None
    if stats.compile_cache:
        before = record.cache.get("compile")
        record.cache["compile"] = f"{before}+{stats.compile_cache}" if before else stats.compile_cache


# Note [Graphs no code generator can run]: the code generators compile for one device (Note [One
# device per graph] in kiln_loopir), chosen by the graph's first tensor input, and their kernels
# read every input's memory directly. Two kinds of graph break that: inputs on the `meta` device,
# which have no memory (a C++ kernel would read through null pointers: a segfault; eager computes
# only their metadata), and inputs on two devices (a CPU index tensor beside CUDA values, which
# eager's `index` takes: a kernel of either device would read the other's memory). Such a graph
# runs as captured, eagerly, which is what eager does with it, and says why (KILN_LOG=compile,
# `kiln.compile_log()`'s `fell_back`). A 0-dim CPU tensor is a scalar that every device's kernels
# read by value, as eager's do, so it counts for no device.


def _input_devices(example_inputs: list[Any]) -> str | None:
    """Why no code generator can run a graph with these inputs (Note [Graphs no code generator
    can run]), or None."""
    devices: set[str] = set()
    for t in example_inputs:
        if not isinstance(t, torch.Tensor):
            continue
        if t.device.type == "meta":
            return "an input is a meta tensor (no data to compute on): kiln runs the graph as captured"
        if t.device.type == "cpu" and t.dim() == 0:
            continue
        devices.add(str(t.device))
    if len(devices) > 1:
        return f"inputs on {', '.join(sorted(devices))}: kiln compiles for one device, so it runs the graph as captured"
    return None


def _codegen(
    device: torch.device,
    mode: str | None,
    cpu_backend: str = "cpp",
    guarded_layouts: bool = False,
    cpp_options: dict[str, Any] | None = None,
    triton_options: dict[str, Any] | None = None,
) -> Any:
    """The loopir backend for `device`: a name, or a Triton backend set up for `mode`.

    Note [Modes]: `mode` reaches the code generator only on CUDA: "max-autotune" times a few
    block-size configurations per kernel (cached on disk), "reduce-overhead" replays CUDA graphs,
    "max-autotune-no-cudagraphs" autotunes without them. `guarded_layouts`: the graph's inputs are
    the frame's tensors, which kiln's frame guards check (shape, strides, dtype, device) before
    every call (a static forward graph), so the Triton and C++ wrappers check only their storage
    offsets (Note [Inputs the frame guard checks] in kiln_codegen_triton's wrapper.py, Note
    [Inputs the frame guard checks in the C++ wrapper] in kiln_codegen_cpp's); a backward
    graph's inputs (saved values, incoming gradients of any strides) are checked in full.
    `KILN_GUARDED_LAYOUTS=0` makes the C++ wrapper check them in full too."""
    codegen = _codegen_for(device, cpu_backend)
    if codegen == "triton":
        from kiln_codegen_triton import TritonBackend
        from kiln_dynamo import tensor_check

        # kiln's frame guards check every input's shape, strides and dtype before the graph runs;
        # a CUDA-graph replay checks its static inputs' pointers with the torch-linked checker's
        # C loop where it is in use (Note [The runner's per-call path] in kiln_codegen_triton)
        return TritonBackend(
            mode=mode,
            guarded_inputs=True,
            guarded_layouts=guarded_layouts,
            pointer_check=tensor_check.data_ptrs_equal,
            **(triton_options or {}),
        )
    if codegen == "cpp" and (cpp_options or guarded_layouts):
        from kiln_codegen_cpp import CppBackend

        # Note [Inputs the frame guard checks in the C++ wrapper] (kiln_codegen_cpp's wrapper.py)
        return CppBackend(cpp_options, guarded_layouts=guarded_layouts and GUARDED_LAYOUTS)
    return codegen


def make_backend(
    name: str,
    *,
    strict: bool = False,
    mode: str | None = None,
    passes: dict[str, Any] | None = None,
    cpu_backend: str = "cpp",
    cpp_options: dict[str, Any] | None = None,
    triton_options: dict[str, Any] | None = None,
    fusion_aware_saves: bool = True,
    materialized_saves: bool = True,
    recompute_sources: bool = True,
) -> Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]:
    """The backend called `name` ("eager", "aot_eager" or "kiln"); `mode` as torch.compile's;
    `passes` switch loopir's graph passes (PASS_OPTIONS); `cpu_backend` is the code generator of
    CPU graphs (CPU_BACKENDS); `cpp_options` the C++ generator's switches (CppOptions),
    `triton_options` the Triton generator's (kiln_codegen_triton.TRITON_OPTIONS);
    `fusion_aware_saves`, `materialized_saves` and `recompute_sources` aotgrad's partitioner's
    (Notes [What saving a value costs], [Values the backward would write] and [Recomputing from
    many values] there)."""
    if name == "eager":
        return eager_backend
    if cpu_backend not in CPU_BACKENDS:
        raise ValueError(f"unknown cpu_backend {cpu_backend!r}; expected one of {CPU_BACKENDS}")

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        import kiln_aotgrad

        devices = _input_devices(example_inputs)
        if devices is not None:  # Note [Graphs no code generator can run]
            record = _record(gm)
            record.fell_back = devices
            log.info("%s: runs as captured: %s", record.frame or record.graph, devices)
            return gm.forward

        # Note [Dynamic shapes in the backend]: a graph with symbolic sizes is traced by
        # kiln_aotgrad now, from its fake placeholders (Note [Symbolic signatures]), and every
        # aten graph goes to loopir with the same symbols. Whatever cannot take them refuses
        # with `DynamicShapesUnsupported` and a logged reason (KILN_LOG=dynamic): dynamo then
        # compiles this frame with static sizes, as before. Never an eager fallback for that:
        # the static compile is faster, and always right.
        symbolic = bool(symbolic_inputs(gm)) or kiln_dynamo.graph_unbacked_env(gm) is not None
        record = _record(gm)
        record.symbolic = symbolic

        def inner(
            inner_gm: torch.fx.GraphModule, inputs: list[Any], forward: bool = True
        ) -> Callable[..., Any]:
            if name == "aot_eager":
                return inner_gm
            import kiln_loopir

            start = time.perf_counter()
            try:
                # the code generator of the device loopir compiles for (Note [One device per graph])
                # Note [Inputs the frame guard checks]: a forward graph's inputs are the frame's
                # tensors, whose guard checks every static size and stride exactly and, in a
                # symbolic graph, every symbolic stride against the sizes (dynamo's
                # `symbolic_stride_guards`) and every size relation (the ShapeEnv's guards):
                # only the storage offset is left to the wrapper, symbolic or not
                guarded = forward
                codegen = _codegen(
                    kiln_loopir.graph_device(inner_gm, inputs),
                    mode,
                    cpu_backend,
                    guarded,
                    cpp_options,
                    triton_options,
                )
                compiled = kiln_loopir.compile_graph(inner_gm, inputs, backend=codegen, options=passes)
            except Exception as exc:  # Note [Backend failure]
                record.add("lower", time.perf_counter() - start)  # where it failed is not known
                if symbolic:  # Note [Dynamic shapes in the backend]
                    dynamic_log.info(
                        "%s: kiln_loopir refused symbolic sizes: %s", record.frame or record.graph, exc
                    )
                    raise kiln_dynamo.DynamicShapesUnsupported(f"kiln_loopir: {exc}") from exc
                return _fallback(inner_gm, record, exc, strict, name, "its aten graph")
            _add_loopir_phases(record, compiled.stats)
            record.compiled_at = time.perf_counter()
            _skip_generated_code()
            return compiled

        def inner_backward(inner_gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
            with only_new_objects():  # Note [The collector scans only the compile's objects]
                compiled = inner(inner_gm, inputs, forward=False)
            if compiled is inner_gm or compiled == inner_gm.forward:  # runs eagerly already
                return compiled
            return _BackwardFallback(inner_gm, compiled, record, strict, name)  # Note [Backward fallback]

        traced = gm
        if name == "kiln":
            from kiln_loopir.passes import prepare_torch_graph

            if any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs):
                # the Triton compile workers start while aotgrad traces and loopir lowers
                from kiln_codegen_triton import warm_compile_pool

                warm_compile_pool()

            traced = prepare_torch_graph(gm, passes)
        try:
            start = time.perf_counter()
            inner_before = record.loopir_seconds
            compiled = kiln_aotgrad.aot_backend(
                inner,
                inner_backward,
                fusion_aware_saves=fusion_aware_saves,
                materialized_saves=materialized_saves,
                recompute_sources=recompute_sources,
            )(traced, example_inputs)
            if symbolic:  # compiled just now (Note [Symbolic signatures])
                record.add("aotgrad", time.perf_counter() - start - (record.loopir_seconds - inner_before))
                log.info("%s", record.summary())
        except kiln_dynamo.DynamicShapesUnsupported:
            COMPILE_LOG.remove(record)
            raise
        except Exception as exc:  # Note [Backend failure]
            return _fallback(gm, record, exc, strict, name, "the captured graph")
        return _FirstCallFallback(gm, compiled, record, strict, name)

    backend.__name__ = f"kiln_{name}_backend"
    backend.__kiln_dynamic_shapes__ = True  # type: ignore[attr-defined]
    # What makes two such backends interchangeable: kiln_dynamo checks it in every cache entry's
    # guard, so a compile with another mode or options recompiles (and an equal one reuses).
    passes_key = tuple(sorted((passes or {}).items()))
    backend.__kiln_cache_key__ = (  # type: ignore[attr-defined]
        name,
        mode or "default",
        ("strict", strict),
        ("passes", passes_key),
        ("cpu_backend", cpu_backend),
        ("cpp_options", tuple(sorted((cpp_options or {}).items()))),
        ("triton_options", tuple(sorted((triton_options or {}).items()))),
        ("fusion_aware_saves", fusion_aware_saves),
        ("materialized_saves", materialized_saves),
        ("recompute_sources", recompute_sources),
    )
    return backend


BACKENDS = ("eager", "aot_eager", "kiln")

kiln_backend = make_backend("kiln")
