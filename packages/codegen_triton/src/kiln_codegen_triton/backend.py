"""``TritonBackend``: loopir's backend interface, implemented with Triton kernels and a Python wrapper.

loopir asks for one kernel per scheduler node (``codegen_kernel``) and then for the wrapper
(``codegen_wrapper``). A kernel's source depends on the buffer plan (a kernel-internal buffer
that is never read back from memory is never stored), which only the whole schedule knows, so
``codegen_kernel`` just remembers the node and every kernel is generated in ``codegen_wrapper``,
into one module per graph.

How the backend is configured (Note [Backend options]): ``compile_graph(gm, inputs,
backend="triton")`` builds ``TritonBackend()`` with the defaults; any other setting is passed by
building the backend and handing the instance over, which loopir accepts in place of a name::

    compile_graph(gm, inputs, backend=TritonBackend(mode="max-autotune"))

``mode`` follows ``torch.compile``: ``"default"``; ``"max-autotune"`` (time a small config set per
kernel on first call, cached on disk); ``"reduce-overhead"`` (replay CUDA graphs);
``"max-autotune-no-cudagraphs"`` is ``"max-autotune"``, and ``"max-autotune"`` also uses CUDA
graphs, as in ``torch.compile``. ``guarded_inputs=True`` says the caller guards every input's
shape, strides and dtype (kiln's frame guards do), so a CUDA-graph replay checks only addresses;
``guarded_layouts=True`` says so for the default-mode wrapper too (the graph's inputs are the
frame's tensors: a forward graph), which then checks only storage offsets and alignment.
``debug=True`` (or ``KILN_TRITON_DEBUG=1``) adds device-side bounds asserts on indirect indices.
``symbolic_sizes=False`` (or ``KILN_TRITON_SYMBOLIC=0``) refuses graphs of symbolic sizes (Note
[Symbolic sizes in Triton kernels]; the caller then compiles them static per size).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from kiln_loopir import Backend, BuildReport
from kiln_loopir.graph import GraphLowering
from kiln_loopir.ir import ComputedBuffer
from kiln_loopir.origins import KIND, kernel_name
from kiln_loopir.scheduler import BaseSchedulerNode, ExternKernelSchedulerNode, Scheduler
from kiln_loopir.wrapper_support import symbol_values

from .cudagraphs import CudaGraphRunner, CudaGraphsPerSize, cudagraph_blocker
from .heuristics import configs
from .interp import interpreting
from .kernel import CodegenUnsupported, KernelGroup, KernelSpec, build_kernel
from .logs import configure
from .runtime import Launcher, load_module, module_source, precompile
from .split import plan_split
from .triton_ops import UnsupportedDtype
from .wrapper import make_wrapper

log = logging.getLogger("kiln.codegen_triton.output_code")

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class TritonBackend(Backend):
    """The ``"triton"`` loopir backend; see the module docstring."""

    name = "triton"

    def __init__(
        self,
        mode: str | None = None,
        *,
        debug: bool | None = None,
        max_persistent_rblock: int = 4096,
        allow_tiling: bool = True,
        split_min_rnumel: int = 1024,
        split_target_programs: int = 256,
        guarded_inputs: bool = False,
        guarded_layouts: bool = False,
        symbolic_sizes: bool | None = None,
    ) -> None:
        mode = mode or "default"
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        self.mode = mode
        self.debug = debug if debug is not None else os.environ.get("KILN_TRITON_DEBUG", "0") not in ("", "0")
        self.max_persistent_rblock = max_persistent_rblock
        self.allow_tiling = allow_tiling
        self.split_min_rnumel = split_min_rnumel
        self.split_target_programs = split_target_programs
        # the caller guards every input's shape, strides and dtype (Note [Static inputs of a CUDA graph])
        self.guarded_inputs = guarded_inputs
        # ... before every call, so the wrapper checks only storage offsets (Note [Inputs the frame
        # guard checks] in wrapper.py)
        self.guarded_layouts = guarded_layouts
        # Note [Symbolic sizes in Triton kernels]: graphs of symbolic sizes compiled as they are
        # (sizes as kernel arguments, bound by the wrapper; CUDA graphs recorded per size); off,
        # loopir refuses them and the caller compiles static per size
        self.symbolic_sizes = (
            symbolic_sizes
            if symbolic_sizes is not None
            else os.environ.get("KILN_TRITON_SYMBOLIC", "1") not in ("", "0")
        )
        self.last_declined: list[tuple[str, str]] = []
        self.last_specs: list[KernelSpec] = []
        self.last_source = ""
        self.last_wrapper = ""
        self.last_module_path = ""
        self.last_launchers: dict[str, Launcher] = {}
        self.last_cudagraphs: CudaGraphRunner | CudaGraphsPerSize | None = None
        self.cudagraph_blocked: str | None = None  # why the last graph is not recorded
        self.codegen_seconds = 0.0
        self.compile_seconds = 0.0

    @property
    def autotune(self) -> bool:
        return self.mode.startswith("max-autotune")

    @property
    def cudagraphs(self) -> bool:
        return self.mode in ("reduce-overhead", "max-autotune")

    def codegen_kernel(self, node: BaseSchedulerNode, graph: GraphLowering) -> Any:
        return node

    def codegen_wrapper(
        self, schedule: Scheduler, graph: GraphLowering, kernels: dict[str, Any]
    ) -> Callable[..., Any]:
        configure()
        t0 = time.perf_counter()
        dtypes = {name: buf.layout.dtype for name, buf in graph.name_to_buffer.items()}
        index_dtype = _index_dtype(graph)
        groups: dict[str, KernelGroup | None] = {}
        self.last_declined = []
        for step, node in enumerate(schedule.nodes):
            if node.name in kernels:
                groups[node.name] = self._kernel(node, step, schedule, dtypes, index_dtype)
        if graph.sizevars.symbolic and self.last_declined:
            # Note [Symbolic sizes in the Triton wrapper]: the interpreter would be far slower
            # than the static compile the caller falls back to
            declined, why = self.last_declined[0]
            raise CodegenUnsupported(
                f"kernel {declined}: the Triton generator declined it with symbolic sizes ({why})"
            )
        generated = [s for g in groups.values() if g is not None for s in g.specs]
        launchers: dict[str, Launcher] = {}
        source = ""
        if generated:
            source = module_source(generated)
            module, path = load_module(source)
            self.last_module_path = str(path)
            for spec in generated:
                candidates = configs(
                    spec, autotune=self.autotune, rblock_cap=min(2048, self.max_persistent_rblock)
                )
                launchers[spec.name] = Launcher(
                    getattr(module, spec.name), spec, candidates, autotune=self.autotune
                )
        self.compile_seconds = 0.0
        if launchers and graph.device.type == "cuda" and not interpreting():
            # Note [The launch path]: every kernel compiled before the first call, in parallel
            self.compile_seconds = precompile(list(launchers.values()), graph.device)
        fn, wrapper_source = make_wrapper(
            schedule, graph, groups, launchers, guarded_layouts=self.guarded_layouts
        )
        self.last_specs = generated
        self.last_source, self.last_wrapper, self.last_launchers = source, wrapper_source, launchers
        self.last_cudagraphs = None
        self.cudagraph_blocked = None
        if self.cudagraphs and graph.device.type == "cuda":
            blocker = cudagraph_blocker(schedule)
            if blocker is None and graph.sizevars.symbolic:  # Note [CUDA graphs per size]
                fn = self.last_cudagraphs = CudaGraphsPerSize(
                    fn, symbol_values(graph.sizevars), guarded_inputs=self.guarded_inputs
                )
            elif blocker is None:
                fn = self.last_cudagraphs = CudaGraphRunner(fn, guarded_inputs=self.guarded_inputs)
            else:
                log.info("no CUDA graphs for this graph: %s", blocker)
                self.cudagraph_blocked = blocker
        self.codegen_seconds = time.perf_counter() - t0 - self.compile_seconds
        if log.isEnabledFor(logging.DEBUG):
            log.debug("kernels: %s\n%s", self.last_module_path or "(none)", source)
            log.debug("wrapper:\n%s", wrapper_source)
        return fn

    def last_build(self) -> BuildReport:
        return BuildReport(
            codegen_seconds=self.codegen_seconds,
            compile_seconds=self.compile_seconds,
            cache="compiled" if self.compile_seconds else "",
            declined=tuple(self.last_declined),
        )

    def _kernel(
        self,
        node: BaseSchedulerNode,
        step: int,
        schedule: Scheduler,
        dtypes: dict[str, Any],
        index_dtype: str,
    ) -> KernelGroup | None:
        parts = node.get_nodes()
        members = [b for m in parts if isinstance(b := getattr(m, "node", None), ComputedBuffer)]
        reads = [m.read_names() for m in parts if isinstance(getattr(m, "node", None), ComputedBuffer)]
        internal = set(schedule.plan.internal.get(step, ()))
        name = kernel_name(f"triton_{KIND}", members, step)
        options: dict[str, Any] = {
            "index_dtype": index_dtype,
            "debug": self.debug,
            "max_persistent_rblock": self.max_persistent_rblock,
            "allow_tiling": self.allow_tiling,
        }
        try:
            spec = build_kernel(name, members, reads, dtypes, internal, **options)
            plan = None
            if spec.kind in ("persistent", "looped") and not spec.symbolic:
                plan = plan_split(
                    members,
                    reads,
                    outer=spec.outer,
                    min_rnumel=self.split_min_rnumel,
                    target_programs=self.split_target_programs,
                )
            if spec.symbolic:  # Note [Symbolic sizes in Triton kernels]: what the sizes decided
                log.debug(
                    "%s: size arguments %s, %s kernel, numels %s at hints %s",
                    spec.name,
                    ", ".join(spec.size_params),
                    spec.kind,
                    (spec.xnumel, spec.ynumel, spec.rnumel),
                    spec.hints(),
                )
            if plan is None:
                return KernelGroup((spec,))
            dtypes = {**dtypes, **{p.name: p.layout.dtype for p in plan.partials}}
            first = build_kernel(f"{name}_partial", plan.partials, plan.first_reads, dtypes, set(), **options)
            second = build_kernel(name, plan.second, plan.second_reads, dtypes, internal, **options)
            return KernelGroup((first, second), tuple(plan.partials))
        except (CodegenUnsupported, UnsupportedDtype, NotImplementedError) as exc:
            self.last_declined.append((node.name, f"{type(exc).__name__}: {exc}"))
            log.debug("kernel %s runs in the interpreter: %s", node.name, exc)
            return None


def _index_dtype(graph: GraphLowering) -> str:
    """Note [int32 indexing]: index arithmetic is int32 (cheaper, and what Triton's vectorizer
    reasons about best) unless some buffer of the graph has 2**31 elements or more of storage;
    then every kernel of the graph indexes in int64 from the program id on."""
    limit = 2**31 - 1
    for buffer in graph.name_to_buffer.values():
        try:
            n = int(buffer.layout.storage_size())
        except TypeError:
            return "tl.int64"
        if n >= limit:
            return "tl.int64"
    return "tl.int32"


def extern_ops(schedule: Scheduler) -> list[str]:
    """The aten ops a schedule calls as extern kernels (for reports)."""
    return [str(n.node.op) for n in schedule.nodes if isinstance(n, ExternKernelSchedulerNode)]
