"""Generated modules on disk, kernel launchers and the autotuning cache.

A graph's kernels are one Python module: imports, the helper functions of
``triton_ops.PRELUDE`` and one ``@triton.jit`` function per kernel. Triton reads a kernel's source
with ``inspect``, so the module must be a real file: it is written under
``$KILN_CACHE_DIR/triton/<key[:2]>/<key>.py`` (default ``~/.cache/kiln``), where ``key`` hashes the
source, and imported from there. Triton keeps its own cache of compiled binaries.

A :class:`Launcher` calls one kernel with its launch config and grid. Under
``mode="max-autotune"`` the first call times each candidate config on the real arguments and
keeps the fastest; the choice is written to ``$KILN_CACHE_DIR/triton/autotune/<key>.json`` (keyed
by kernel source, sizes, device and Triton version), so later processes skip the timing.

Note [The launch path]: on a GPU no kernel is launched through ``JITFunction.run``, which binds,
specializes and hashes its arguments on every call (tens of µs). Every config a launcher may use
is compiled ahead of the graph's first call (:func:`precompile`: the kernels of a graph in a pool
of worker processes, Note [Compiling in worker processes] in compile_pool.py, then loaded here
from Triton's disk cache), through ``JITFunction.warmup`` with the parameters' dtypes: every pointer the wrapper passes is the start
of a storage from the caching allocator, so 16-byte aligned, which is what warmup's mock tensors
specialize on (the wrapper checks its inputs, Note [Kernel arguments are pointers] in
wrapper.py). From the compiled kernel :func:`_fast_launcher` generates a two-line function
``launch(stream, *pointers)`` that calls Triton's C launcher (``CompiledKernel.run``) with the
grid, the CUfunction, the packed metadata and the block sizes bound as constants: no dict, no
binder, no hashing per launch. The binary itself is cached by Triton on disk (keyed by source,
target and Triton version; ``TRITON_CACHE_DIR``), so a second process loads it without compiling.
Under ``TRITON_INTERPRET=1`` kernels run on CPU tensors through ``JITFunction.run`` as before.

Note [Calling the C launch directly]: ``CompiledKernel.run`` is Triton's ``CudaLauncher``, whose
Python ``__call__`` allocates per-grid scratch memory (two nested functions and two calls per
launch, even when the kernel needs none) and then calls the C launch function. Where the kernel
needs no scratch memory (its metadata says 0 bytes of global and profile scratch), the fast
launcher calls that C function itself with what ``__call__`` would pass: about 2 µs less per
launch on the H200 host. That argument list belongs to Triton and changed between versions, so
it is used only for the ``__call__`` signatures it was written against (Triton 3.6 and 3.8,
recognized by their parameter names); any other version, or a kernel with scratch memory, goes
through ``CompiledKernel.run`` unchanged. ``KILN_TRITON_DIRECT_LAUNCH=0`` turns it off.

Every file is written atomically (Note [Atomic cache writes] in kiln_loopir's diskcache.py).
What a crash, a full disk or a hand leaves behind is checked before use: a module file is reused only when its bytes are
exactly the source (its name is the source's hash), an autotune record only when it parses and
names a current candidate. Anything else is reported (a warning on ``kiln.codegen_triton.cache``,
``counters["corrupt"]``) and written again, never imported or trusted (the C++ side: Note
[Verified cache entries] in kiln_codegen_cpp's build.py).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kiln_loopir.diskcache import cache_root, write_atomic

from . import native_launch
from .heuristics import Config, grid, grid_source
from .interp import fix_comparisons, interpreting
from .kernel import KernelSpec
from .triton_ops import PRELUDE

log = logging.getLogger("kiln.codegen_triton.autotune")
cache_log = logging.getLogger("kiln.codegen_triton.cache")
compile_log = logging.getLogger("kiln.codegen_triton.compile")

counters: dict[str, int] = {
    "modules_written": 0,
    "modules_reused": 0,
    "autotuned": 0,
    "autotune_hits": 0,
    "corrupt": 0,
    # Note [Compiling in worker processes]: loads of the workers' binaries that were Triton
    # disk-cache hits, and those that compiled here instead
    "pool_hits": 0,
    "pool_misses": 0,
}


def cache_dir() -> Path:
    return cache_root() / "triton"


def module_source(kernels: Sequence[KernelSpec]) -> str:
    """The whole generated module for ``kernels``."""
    if interpreting():
        libdevice = "from kiln_codegen_triton.interp import device_assert as k_device_assert, libdevice"
    else:
        libdevice = "from triton.language.extra import libdevice"
    header = [
        "# kiln codegen_triton kernels",
        "import triton",
        "import triton.language as tl",
        libdevice,
    ]
    return "\n".join(header) + "\n\n" + PRELUDE + "\n\n" + "\n\n".join(k.source for k in kernels)


_MODULES: dict[str, ModuleType] = {}


def load_module(source: str) -> tuple[ModuleType, Path]:
    """Write ``source`` into the cache (if not there yet) and import it."""
    key = hashlib.sha256(source.encode()).hexdigest()
    path = cache_dir() / key[:2] / f"{key}.py"
    if key in _MODULES:
        return _MODULES[key], path
    try:
        on_disk: bytes | None = path.read_bytes()
    except FileNotFoundError:
        on_disk = None
    if on_disk == source.encode():
        counters["modules_reused"] += 1
    else:
        if on_disk is not None:  # the name is the hash of the text: any other content is damage
            counters["corrupt"] += 1
            cache_log.warning(
                "kiln: corrupt Triton module %s (%d bytes, not its source); writing it again",
                path,
                len(on_disk),
            )
        write_atomic(path, source)
        counters["modules_written"] += 1
    if interpreting():
        fix_comparisons()  # Note [Comparisons in the interpreter]
    name = f"kiln_triton_{key[:24]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _MODULES[key] = module
    return module, path


def _device_name(args: Sequence[Any]) -> str:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "cuda":
                return torch.cuda.get_device_name(a.device)
            return f"{a.device.type}-interpreter"
    return "none"


def _direct_call(run: Any) -> tuple[str, dict[str, Any]] | None:
    """The call of Triton's C launch function under ``run`` (a ``CudaLauncher``) with the
    arguments its ``__call__`` would pass, or None where that is not known to be the same
    (Note [Calling the C launch directly]): ``(template, scope)``, where the template takes
    ``{grid}`` (gx, gy, 1, stream), ``{meta}`` (function, metadata) and ``{args}``."""
    cls = type(run)
    code = getattr(cls.__dict__.get("__call__"), "__code__", None)
    launch = getattr(run, "launch", None)
    if code is None or launch is None or cls.__name__ != "CudaLauncher":
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None  # the launch needs scratch memory allocated per grid: keep Triton's path
    if getattr(run, "gsan_enabled", False):
        return None
    names = code.co_varnames[: code.co_argcount]
    flags = (run.launch_cooperative_grid, run.launch_pdl)
    scope = {"c_launch": launch, "coop": flags[0], "pdl": flags[1]}
    if names == ("self", "gridX", "gridY", "gridZ", "stream", "function"):
        # Triton 3.6: __call__(grid, stream, function, *args) -> launch(grid, stream, function,
        # coop, pdl, global_scratch, profile_scratch, *args)
        return "c_launch({grid}, function, coop, pdl, None, None, {meta}, None, None, None, {args})", scope
    tail = ("kernel_metadata", "launch_metadata", "launch_enter_hook", "launch_exit_hook")
    if names == ("self", "gridX", "gridY", "gridZ", "stream", "function", *tail) and hasattr(
        run, "kernel_signature"
    ):
        # Triton 3.8: launch(grid, stream, function, coop, pdl, metadata, launch_metadata, hooks,
        # global_scratch, profile_scratch, annotations, signature, args-tuple)
        scope |= {"annotations": run.arg_annotations, "signature": run.kernel_signature}
        return (
            "c_launch({grid}, function, coop, pdl, {meta}, None, None, None, None, None, annotations, signature, ({args},))",
            scope,
        )
    return None


# Note [Symbolic sizes in Triton kernels]: what a size argument is compiled for: a value that
# Triton's specialization reads as an int64 divisible by nothing (not 1, not a multiple of 16),
# so one binary serves every size
GENERIC_SIZE = 2**33 + 1


def warmup_args(spec: KernelSpec) -> list[Any]:
    """``JITFunction.warmup``'s arguments for ``spec``: the pointers' dtypes, then the sizes."""
    floats = {name for name, _ in spec.float_params}  # Note [Floats of sizes in Triton] in kernel.py
    return [*spec.param_dtypes, *(0.5 if p in floats else GENERIC_SIZE for p in spec.size_params)]


# the plan kind of a size argument (Note [Symbolic sizes in Triton kernels]) by its Triton type
_SIZE_KINDS = {"i64": "q", "i32": "i", "fp32": "f", "fp64": "d"}


def native_plan(
    compiled: Any, pointers: Sequence[str], sizes: Sequence[str] = ()
) -> list[tuple[str, int]] | None:
    """The kernel parameters of a compiled kernel as a :class:`Launch` plan (Note [Native
    launches] in native_launch.py): ``("p", i)`` for the pointer passed as the launch's argument
    ``i`` (``pointers`` names the parameters in argument order, then ``sizes`` the symbolic sizes
    and floats of sizes after them: ``("q", i)`` an int64, ``("f", i)`` a float32, ...),
    constexprs left out, then Triton's two scratch pointers (null, ``("c", 0)``); None for a
    parameter of another kind."""
    signature = compiled.src.signature
    plan: list[tuple[str, int]] = []
    for name in compiled.src.fn.arg_names:
        ty = signature.get(name)
        if ty is None or ty == "constexpr":
            continue
        if name in pointers:
            if not (isinstance(ty, str) and ty.startswith("*")):
                return None
            plan.append(("p", pointers.index(name)))
        elif name in sizes and ty in _SIZE_KINDS:
            plan.append((_SIZE_KINDS[ty], len(pointers) + list(sizes).index(name)))
        else:
            return None  # a runtime parameter the wrapper does not pass
    return [*plan, ("c", 0), ("c", 0)]


def _native_launcher(
    compiled: Any, spec: KernelSpec, pointers: Sequence[str], grid_xy: tuple[int, int] | None
) -> Callable[..., None] | None:
    """A :class:`Launch` for ``compiled`` where it applies (Note [Native launches]); else None.
    ``pointers``: the kernel's pointer parameters in the wrapper's order; ``grid_xy`` None:
    symbolic sizes, the grid passed at each call after the stream."""
    module = native_launch.for_launches()
    if module is None:
        return None
    run = compiled.run
    packed = compiled.packed_metadata
    if getattr(run, "launch_cooperative_grid", True) or getattr(run, "launch_pdl", True):
        return None
    if not (isinstance(packed, tuple) and len(packed) == 3 and all(isinstance(v, int) for v in packed)):
        return None
    num_warps, num_ctas, shared = packed
    plan = native_plan(compiled, pointers, spec.size_params)
    # Triton 3.8 launches more than 228 KiB of shared memory with an attribute cuLaunchKernel lacks
    if plan is None or num_ctas != 1 or shared > 228 * 1024:
        native_launch.counters["native_declined"] += 1
        return None
    try:
        launch: Callable[..., None] = module.Launch(
            spec.name,
            compiled.function,
            (1, 1, 1) if grid_xy is None else (grid_xy[0], grid_xy[1], 1),
            32 * num_warps,
            shared,
            plan,
            len(pointers) + len(spec.size_params),
            torch.cuda.current_device(),
            grid_args=grid_xy is None,
        )
    except (RuntimeError, ValueError) as exc:  # the binary's parameters are not the plan's
        native_launch.counters["native_declined"] += 1
        # the first such kernel of the process is a warning, the others debug lines
        level = logging.DEBUG if native_launch.counters["native_declined"] > 1 else logging.WARNING
        compile_log.log(level, "kiln: %s keeps Triton's launcher: %s", spec.name, exc)
        return None
    native_launch.counters["native_launchers"] += 1
    compile_log.debug(
        "%s: native launch, grid %s, %d warps, parameters %s", spec.name, grid_xy, num_warps, plan
    )
    return launch


def _fast_launcher(
    compiled: Any, spec: KernelSpec, config: Config, direct: bool = True, native: bool | None = None
) -> Callable[..., None]:
    """``launch(stream, *pointers)`` for one compiled kernel (Note [The launch path]).

    Triton's launcher takes the kernel's parameters in declaration order, constexprs included
    (it skips them); a parameter that the signature leaves out is not passed at all. ``direct``:
    call Triton's C launch function itself where its arguments are known (Note [Calling the C
    launch directly]); else ``CompiledKernel.run``. ``native`` (None: ``KILN_TRITON_NATIVE_LAUNCH``,
    default on): where that direct call applies, a C launch object instead (Note [Native launches] in native_launch.py): the launch itself
    for static sizes; for symbolic ones a two-line function that computes the grid from the sizes
    and calls it."""
    constants = config.kwargs(spec.kind)
    pointers = {name: f"p{i}" for i, name in enumerate(f"p_{n}" for n in spec.params)}
    sizes = spec.size_params  # Note [Symbolic sizes in Triton kernels]: after the pointers
    signature = compiled.src.signature
    args = []
    for name in compiled.src.fn.arg_names:
        if name in pointers:
            args.append(pointers[name])
        elif name in sizes:
            args.append(name)
        elif name in signature:
            args.append(repr(constants[name]))
    g: tuple[Any, ...] = grid_source(spec, config) if sizes else grid(spec, config)
    gx, gy = g[0], g[1] if len(g) > 1 else 1
    params = ", ".join(["stream", *pointers.values(), *sizes])
    scope: dict[str, Any] = {
        "run": compiled.run,
        "function": compiled.function,
        "metadata": compiled.packed_metadata,
    }
    direct = direct and os.environ.get("KILN_TRITON_DIRECT_LAUNCH", "1") != "0"
    found = _direct_call(compiled.run) if direct and args else None
    native = native_launch.enabled() if native is None else native
    if found is not None and native and (sizes or (gx and gy)):
        made = _native_launcher(compiled, spec, list(pointers), None if sizes else (gx, gy))
        if made is not None and not sizes:
            return made
        if made is not None:  # the grid from the sizes, per call, then the C launch
            scope["native"] = made
            call = ", ".join(["stream", str(gx), str(gy), *pointers.values(), *sizes])
            source = f"def launch({params}):\n    return native({call})\n"
            exec(compile(source, f"<kiln-launcher {spec.name}>", "exec"), scope)
            symbolic_launch: Callable[..., None] = scope["launch"]
            return symbolic_launch
    if found is not None:
        template, extra = found
        scope |= extra
        body = template.format(grid=f"{gx}, {gy}, 1, stream", meta="metadata", args=", ".join(args))
    else:
        body = f"run({gx}, {gy}, 1, stream, function, metadata, None, None, None, {', '.join(args)})"
    if gx == 0 or gy == 0:
        body = "pass  # no elements"
    source = f"def launch({params}):\n    {body}\n"
    exec(compile(source, f"<kiln-launcher {spec.name}>", "exec"), scope)
    launch: Callable[..., None] = scope["launch"]
    return launch


class Launcher:
    """Calls one kernel; see the module docstring and Note [The launch path].

    Two entry points: ``launcher(*tensors)`` (Triton's interpreter, CPU tensors: through
    ``JITFunction.run``) and, on a GPU, ``launcher.launch(stream, *pointers)``, which is replaced
    by the fast launcher of the chosen config once it is known (the wrapper binds the name
    :attr:`slot` in its namespace; under max-autotune the first call tunes, then rebinds it)."""

    def __init__(
        self,
        fn: Any,
        spec: KernelSpec,
        candidates: list[Config],
        *,
        autotune: bool,
        native: bool | None = None,
    ) -> None:
        self.fn = fn
        self.native = native  # Note [Native launches] in native_launch.py; None: the environment
        self.spec = spec
        self.candidates = candidates
        # running a kernel twice must give the same memory for timing to be harmless
        self.autotune = autotune and len(candidates) > 1 and not spec.atomic
        self.config: Config | None = None if self.autotune else candidates[0]
        self._launch: Callable[..., Any] | None = None if self.config is None else self._bind(self.config)
        self.compiled: dict[Config, Any] = {}
        self.fast: Callable[..., None] | None = None
        self.namespace: dict[str, Any] | None = None
        self.slot = ""
        self.pending: PendingCompile | None = None  # Note [Kernels compiled while the next graph is built]

    # --------------------------------------------------------------- Triton's interpreter

    def _bind(self, config: Config) -> Callable[..., Any]:
        if self.spec.symbolic:
            return self._bind_symbolic(config)
        runner = self.fn[grid(self.spec, config)]
        kwargs = config.kwargs(self.spec.kind)

        def launch(*args: Any) -> Any:
            return runner(*args, **kwargs)

        return launch

    def _bind_symbolic(self, config: Config) -> Callable[..., Any]:
        """Note [Symbolic sizes in Triton kernels]: the grid from the size arguments, per call."""
        sizes = self.spec.size_params
        source = f"lambda {', '.join(sizes)}: ({', '.join(grid_source(self.spec, config))},)"
        grid_of = eval(compile(source, f"<kiln-grid {self.spec.name}>", "eval"))
        kwargs = config.kwargs(self.spec.kind)
        fn, n = self.fn, len(sizes)

        def launch(*args: Any) -> Any:
            return fn[grid_of(*args[len(args) - n :])](*args, **kwargs)

        return launch

    def __call__(self, *args: Any) -> None:
        if self._launch is None:
            self.config = self._tune(args)
            self._launch = self._bind(self.config)
        self._launch(*args)

    # ----------------------------------------------------------------------- the GPU path

    def configs_to_compile(self) -> list[Config]:
        return list(self.candidates) if self.autotune else [self.candidates[0]]

    def precompile(self, device: torch.device) -> None:
        """Compile every config this launcher may use for ``device`` (no launch)."""
        dtypes = warmup_args(self.spec)
        with _on(device):
            for config in self.configs_to_compile():
                if config in self.compiled:
                    continue
                kwargs = config.kwargs(self.spec.kind)
                try:
                    self.compiled[config] = self.fn.warmup(*dtypes, grid=(1,), **kwargs)
                except Exception as exc:  # a config the compiler rejects (registers, shared memory)
                    if not self.autotune:
                        raise
                    log.debug("%s: %s does not compile: %s", self.spec.name, config, exc)
        if not self.autotune:
            assert self.config is not None
            self.fast = _fast_launcher(self.compiled[self.config], self.spec, self.config, native=self.native)

    def install(self, namespace: dict[str, Any], slot: str) -> None:
        """Bind ``slot`` in the wrapper's ``namespace`` to this kernel's launch function."""
        self.namespace, self.slot = namespace, slot
        namespace[slot] = self.fast if self.fast is not None else self.launch

    def launch(self, stream: int, *pointers: int) -> None:
        """First GPU launch of a kernel whose graph's compile is still pending (wait for it: Note
        [Kernels compiled while the next graph is built]), or of an autotuned kernel (tune on
        these arguments); then rebind."""
        if self.pending is not None:
            self.pending.wait()
        if self.fast is None:
            self.config = self._tune(pointers, stream=stream)
            self.fast = _fast_launcher(self.compiled[self.config], self.spec, self.config, native=self.native)
            if self.namespace is not None:
                self.namespace[self.slot] = self.fast
        self.fast(stream, *pointers)

    # ------------------------------------------------------------------------- autotuning

    def _key(self, device: str) -> str:
        import triton

        text = json.dumps([self.spec.source, device, triton.__version__, [repr(c) for c in self.candidates]])
        return hashlib.sha256(text.encode()).hexdigest()

    def _tune(self, args: Sequence[Any], stream: int | None = None) -> Config:
        on_gpu = stream is not None
        device = torch.cuda.get_device_name() if on_gpu else _device_name(args)
        candidates = [c for c in self.candidates if c in self.compiled] if on_gpu else self.candidates
        key = self._key(device)
        path = cache_dir() / "autotune" / f"{key}.json"
        if path.exists():
            try:
                chosen = Config(**json.loads(path.read_bytes())["config"])
            except (ValueError, KeyError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
                counters["corrupt"] += 1
                cache_log.warning(
                    "kiln: corrupt autotune record %s (%r); timing %s again", path, exc, self.spec.name
                )
            else:
                if chosen in candidates:
                    counters["autotune_hits"] += 1
                    return chosen
                log.debug("%s: recorded %s is no candidate now; timing again", self.spec.name, chosen)
        timings = []
        for i, c in enumerate(candidates):
            try:
                timings.append((self._time(c, args, stream), i))
            except Exception as exc:  # a config the compiler rejects (registers, shared memory)
                log.debug("%s: %s failed: %s", self.spec.name, c, exc)
                timings.append((float("inf"), i))
        best = candidates[min(timings)[1]]
        log.debug("%s: %s (%s)", self.spec.name, best, ", ".join(f"{t * 1e3:.3f}ms" for t, _ in timings))
        record = {
            "kernel": self.spec.name,
            "config": {
                f: getattr(best, f) for f in ("XBLOCK", "YBLOCK", "RBLOCK", "num_warps", "num_stages")
            },
            "timings_ms": [t * 1e3 for t, _ in timings],
        }
        write_atomic(path, json.dumps(record, indent=1))
        counters["autotuned"] += 1
        return best

    def _time(self, config: Config, args: Sequence[Any], stream: int | None) -> float:
        if stream is not None:
            import triton.testing

            fast = _fast_launcher(self.compiled[config], self.spec, config, native=self.native)
            return float(triton.testing.do_bench(lambda: fast(stream, *args), warmup=5, rep=25)) / 1e3
        launch = self._bind(config)
        start = time.perf_counter()
        launch(*args)
        return time.perf_counter() - start


def precompile(launchers: Sequence[Launcher], device: torch.device, *, workers: int | None = None) -> float:
    """Compile the kernels of one graph for ``device``; returns the wall seconds.

    Kernels are compiled in the process pool (Note [Compiling in worker processes] in
    compile_pool.py) and loaded here from Triton's disk cache as each is done; without a pool,
    or for what a worker could not compile, in ``workers`` threads of this process (default: one
    per CPU core, at most 16; ``KILN_COMPILE_THREADS`` overrides). The first kernel compiled here
    compiles alone, so that Triton's one-time initialization (driver, LLVM targets) never runs in
    two threads at once."""
    start = time.perf_counter()
    precompile_start(launchers, device, workers=workers).wait()
    return time.perf_counter() - start


# Note [Kernels compiled while the next graph is built]: a training graph is two compiles in a
# row, the forward's then the backward's (aotgrad builds the backward from the forward's output
# strides, which the schedule fixes, not the binaries), and each waited for its own kernels before
# returning: the workers sat idle while the parent lowered the backward, and the backward's
# kernels started only after the forward's last one was loaded. So a graph's compile only
# *submits* its kernels (:func:`precompile_start`), and the wait, loading each binary here, is
# done by the first launch of any of its kernels (:meth:`Launcher.launch`), which then rebinds
# every kernel's slot in the wrapper to its fast launcher: later calls never see the wait. The
# pool compiles the forward's kernels while the backward is lowered and scheduled, and both sets
# of kernels together. A kernel that fails to compile raises at that first call (the umbrella's
# first-call fallback takes it) instead of in the compile. The time waited counts in the first
# call (kiln's "first run" phase; ``PendingCompile.waited``) and is said under
# ``KILN_LOG=compile``; ``triton_options={"overlap_compile": False}`` waits in the compile as
# before, and so does a graph with matmul templates (their choice objects hold launchers).
class PendingCompile:
    """The kernels of one graph submitted for compiling; :meth:`wait` loads them (once)."""

    def __init__(
        self,
        launchers: Sequence[Launcher],
        device: torch.device,
        workers: int | None,
        pool_state: _PoolJobs | None,
        here: list[Launcher],
    ) -> None:
        self.launchers = list(launchers)
        self.device = device
        self.workers = workers
        self._pool_state = pool_state
        self._here = here
        self._lock = threading.Lock()
        self.done = False
        self.waited = 0.0  # seconds the wait took

    def wait(self) -> None:
        """Load every kernel (compiling here what the pool did not), then point each installed
        launcher's slot at its fast launcher."""
        with self._lock:
            if self.done:
                return
            start = time.perf_counter()
            here = self._here
            if self._pool_state is not None:
                here = here + self._pool_state.finish(self.device)
            _compile_here(here, self.device, self.workers)
            for launcher in self.launchers:
                launcher.pending = None
                if launcher.fast is not None and launcher.namespace is not None:
                    launcher.namespace[launcher.slot] = launcher.fast
            self.done = True
            self.waited = time.perf_counter() - start


def precompile_start(
    launchers: Sequence[Launcher], device: torch.device, *, workers: int | None = None
) -> PendingCompile:
    """Submit the kernels of one graph to the pool (Note [Kernels compiled while the next graph
    is built]); each launcher knows the returned handle, whose ``wait`` loads them."""
    pending = [launcher for launcher in launchers if launcher.fast is None or launcher.autotune]
    if device.type == "cuda" and any(launcher.native is not False for launcher in pending):
        native_launch.prepare()  # Note [Native launches]: built while the kernels compile
    if not pending:
        handle = PendingCompile([], device, workers, None, [])
        handle.done = True
        return handle
    state, here = _submit_to_pool(pending, device)
    handle = PendingCompile(pending, device, workers, state, here)
    for launcher in pending:
        launcher.pending = handle
    return handle


def _compile_here(launchers: Sequence[Launcher], device: torch.device, workers: int | None) -> None:
    if not launchers:
        return
    launchers[0].precompile(device)
    rest = launchers[1:]
    if workers is None:
        workers = int(os.environ.get("KILN_COMPILE_THREADS", "0")) or min(16, os.cpu_count() or 1)
    if workers <= 1 or len(rest) <= 1:
        for launcher in rest:
            launcher.precompile(device)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(workers, len(rest))) as pool:
            for future in [pool.submit(launcher.precompile, device) for launcher in rest]:
                future.result()


def _on(device: torch.device) -> Any:
    """The context that makes ``device`` Triton's current device (none for a non-CUDA device,
    which only a test without a GPU passes, with a stand-in driver)."""
    import contextlib

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class _PoolJobs:
    """The configs of one graph the pool's workers are compiling (Note [Compiling in worker
    processes]); :meth:`finish` loads each launcher as soon as its configs are done."""

    def __init__(self, pool: Any, start: float, recorded: float) -> None:
        self.pool = pool
        self.start, self.recorded = start, recorded
        self.waiting: dict[Any, Launcher] = {}  # future -> its launcher
        self.left: dict[int, int] = {}  # id(launcher) -> configs still compiling

    def finish(self, device: torch.device) -> list[Launcher]:
        """Wait for the workers and load their binaries; the launchers left to compile here."""
        from concurrent.futures import FIRST_COMPLETED, wait

        from . import compile_pool

        waited_from = time.perf_counter()
        jobs = len(self.waiting)
        failed: list[str] = []
        here: list[Launcher] = []
        found = missed = 0  # loads that were Triton disk-cache hits, and compiles here
        worker_seconds = 0.0
        load_seconds = 0.0
        with _on(device):
            while self.waiting:
                done, _ = wait(list(self.waiting), return_when=FIRST_COMPLETED)
                for future in done:
                    launcher = self.waiting.pop(future)
                    status, detail = future.result()
                    if status == "ok":
                        worker_seconds += detail
                    else:
                        failed.append(detail)
                    self.left[id(launcher)] -= 1
                    if self.left[id(launcher)] == 0:
                        loaded = time.perf_counter()
                        hits, compiles = compile_pool.count_hits(
                            functools.partial(_load, launcher, device, here)
                        )
                        found += hits
                        missed += compiles - hits
                        load_seconds += time.perf_counter() - loaded
        for detail in failed[:3]:
            compile_log.debug("a compile worker failed; compiling in this process:\n%s", detail)
        counters["pool_hits"] += found
        counters["pool_misses"] += missed
        if missed and missed >= found:  # Note [When the workers' binaries are not found]
            compile_pool.disable(
                f"{missed} of {found + missed} kernels they compiled were not found in the cache"
            )
        end = time.perf_counter()
        compile_log.info(
            "%d kernel configs in %d workers: recorded in %.2f s, done after %.2f s, %.2f s of it waited"
            " for (%.1f s of worker time, %.2f s loading here, %d failed there, %d of %d loads missed the cache)",
            jobs,
            self.pool.size,
            self.recorded - self.start,
            end - self.start,
            end - waited_from,
            worker_seconds,
            load_seconds,
            len(failed),
            missed,
            found + missed,
        )
        return here


def _compile_in_pool(launchers: Sequence[Launcher], device: torch.device) -> list[Launcher]:
    """Submit to the pool and load at once (:func:`_submit_to_pool` then
    :meth:`_PoolJobs.finish`): the launchers left to compile here."""
    jobs, here = _submit_to_pool(launchers, device)
    return here + (jobs.finish(device) if jobs is not None else [])


def _submit_to_pool(
    launchers: Sequence[Launcher], device: torch.device
) -> tuple[_PoolJobs | None, list[Launcher]]:
    """Note [Compiling in worker processes]: record every config still to compile and hand it to
    the pool's workers. Returns the jobs (None without a pool) and the launchers to compile here
    (all of them without a pool; never raises for a kernel: a real compile error surfaces when
    the caller compiles it here)."""
    from . import compile_pool

    todo = [
        launcher
        for launcher in launchers
        if any(config not in launcher.compiled for config in launcher.configs_to_compile())
    ]
    if sum(len(launcher.configs_to_compile()) for launcher in todo) < 2:
        return None, list(launchers)
    pool = compile_pool.warm()
    if pool is None:
        return None, list(launchers)
    start = time.perf_counter()
    here: list[Launcher] = []
    waiting: dict[Any, Launcher] = {}
    left: dict[int, int] = {}
    with _on(device):
        for launcher in todo:
            fn = launcher.fn
            module = sys.modules[fn.fn.__module__]
            for config in launcher.configs_to_compile():
                if config in launcher.compiled:
                    continue
                dtypes, kwargs = warmup_args(launcher.spec), config.kwargs(launcher.spec.kind)
                try:
                    data = compile_pool.record(functools.partial(fn.warmup, *dtypes, grid=(1,), **kwargs))
                except Exception as exc:  # e.g. a config Triton's binder rejects: compiled here
                    compile_log.debug("%s: %s not recorded: %s", launcher.spec.name, config, exc)
                    data = None
                if data is not None:
                    future = pool.compile(module.__name__, str(module.__file__), fn.fn.__name__, data)
                    waiting[future] = launcher
                    left[id(launcher)] = left.get(id(launcher), 0) + 1
            if id(launcher) not in left:
                here.append(launcher)
    here.extend(launcher for launcher in launchers if launcher not in todo)
    jobs = _PoolJobs(pool, start, time.perf_counter())
    jobs.waiting, jobs.left = waiting, left
    return jobs, here


def _load(launcher: Launcher, device: torch.device, here: list[Launcher]) -> None:
    """Load one launcher whose configs the workers compiled (Triton's disk-cache hits); one that
    fails to is left to the caller, which compiles it again and raises what Triton raises."""
    try:
        launcher.precompile(device)
    except Exception:
        here.append(launcher)
