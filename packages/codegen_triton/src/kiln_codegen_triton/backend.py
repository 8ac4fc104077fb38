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
``matmul_templates`` (default True: under max-autotune on a GPU; False: never) lets a GEMM and
the pointwise kernel after it become one template node, timed against the extern call at the
first call (Note [Matmul templates] in templates.py).

Note [Autotuning large kernels in the default mode]: a kernel that moves a lot of memory is where
a block-size miss costs most, and where timing a few configs once costs least relative to what it
saves. So in the default mode too, a kernel whose buffers add up to ``autotune_min_bytes`` or more
(default: 128 MiB on a GPU; never under Triton's interpreter unless set; ``0`` turns it off) gets
the heuristic choice and a few neighbours (``configs(autotune="small")``), compiled ahead with the
rest and timed on its first call as max-autotune's are, the choice cached on disk under the same
key. Kernels that write with atomics or into another buffer are never timed (running them twice
is not harmless). Why 128 MiB: each tuned kernel costs its extra compiles and ~0.1 s of timing at
the first call. At 16 MiB it fired on most kernels of the public suite at GPU size (BERT's
activations are 25 MB): in that run (H200, bf16 inference) kiln's first-calls time was 1.5-3x
the previous run's on most models, for 1-4% less GPU time (the two runs were on differently
loaded hosts, so the share of the tuning in it is an estimate). A kernel moving 128 MiB runs
≥ 30 µs, where a better config saves more than the tuning costs over a run. ``KILN_LOG=autotune``
says which kernels were timed and what was chosen; ``kiln.compile(options={"triton_options":
{"autotune_min_bytes": N}})`` moves the line.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from kiln_loopir import Backend, BuildReport
from kiln_loopir.graph import GraphLowering
from kiln_loopir.ir import ExternKernel, Scatter
from kiln_loopir.origins import KIND, kernel_name
from kiln_loopir.scheduler import (
    BaseSchedulerNode,
    ExternKernelSchedulerNode,
    Scheduler,
    TemplateSchedulerNode,
)
from kiln_loopir.wrapper_support import dense_shape, dense_storage, flat_storage, symbol_values

from . import native_launch as native_launch_module
from .cudagraphs import CudaGraphRunner, CudaGraphsPerSize, PointerCheck, cudagraph_blocker
from .heuristics import configs, outer_tile_rows
from .interp import interpreting
from .kernel import CodegenUnsupported, KernelGroup, KernelSpec, build_kernel
from .logs import configure
from .runtime import Launcher, PendingCompile, load_module, module_source, precompile, precompile_start
from .split import WELFORD_MIN_CHUNK, SplitPlan, peel_rows, plan_split
from .templates import (
    TEMPLATE_OPS,
    MatmulChoice,
    MatmulProblem,
    TemplateSpec,
    TemplateUnsupported,
    build_template,
    problem_of,
)
from .triton_ops import UnsupportedDtype
from .wrapper import make_wrapper

log = logging.getLogger("kiln.codegen_triton.output_code")
log_tune = logging.getLogger("kiln.codegen_triton.autotune")

DEFAULT_AUTOTUNE_MIN_BYTES = 128 * 2**20  # Note [Autotuning large kernels in the default mode]

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# the code generator's own switches a caller may set by name (kiln.compile's "triton_options"),
# each an int or a bool: what each one does is in TritonBackend's module docstring and Notes
TRITON_OPTIONS = {
    "autotune_min_bytes": int,  # Note [Autotuning large kernels in the default mode]; 0: off
    "split_min_rnumel": int,  # split.py
    "split_target_programs": int,
    "split_outer_target_programs": int,  # Note [Bytes per program] in heuristics.py
    "split_outer_min_chunk": int,  # Note [Short chunks of column reductions] in split.py
    "split_rows": bool,  # Note [The second kernel reduces rows] in split.py
    "split_peel": bool,  # Note [Split reductions] in split.py: r-level members peeled off to split
    "split_symbolic": bool,  # Note [Split reductions under symbolic sizes] in split.py
    "max_persistent_rblock": int,
    "allow_tiling": bool,
    "reorder_reductions": bool,  # Note [Reductions walk their reads' memory order] in kernel.py
    "memory_order_pointwise": bool,  # kiln_loopir's Note [Pointwise nodes walk their memory order]
    "reorder_gathers": bool,  # Note [Gathers along a row walk the rows] in kernel.py
    "outer_by_tiles": bool,  # Note [Row statistics do not decide a column reduction] in kernel.py
    "outer_partials": bool,  # Note [Partials of a column reduction stay column reductions] in split.py
    "welford_tiles": bool,  # Note [Welford tiles] in heuristics.py
    "welford_chunks": bool,  # Note [Welford chunks] in split.py
    "welford_shared": bool,  # Note [One triple per Welford] in split.py
    "symbolic_sizes": bool,  # Note [Symbolic sizes in Triton kernels]; False: static per size
    "matmul_templates": bool,  # Note [Matmul templates] in templates.py; False: matmuls stay extern
    "overlap_compile": bool,  # Note [Kernels compiled while the next graph is built] in runtime.py
    "cudagraph_plan": bool,  # Note [The runner's per-call path] in cudagraphs.py
    "native_launch": bool,  # Note [Native launches] in native_launch.py; False: Triton's C launch from Python
}


def check_triton_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` if every key is a known switch with a value of its type (else ValueError)."""
    for key, value in options.items():
        kind = TRITON_OPTIONS.get(key)
        if kind is None:
            raise ValueError(f"unknown triton option {key!r}; supported: {sorted(TRITON_OPTIONS)}")
        if type(value) is not kind:
            raise ValueError(f"triton option {key!r} must be {kind.__name__}, not {value!r}")
    return options


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
        reorder_reductions: bool = True,
        memory_order_pointwise: bool = True,
        reorder_gathers: bool = False,
        outer_by_tiles: bool = True,
        outer_partials: bool = False,  # measured no faster on an H100: Note in split.py
        welford_tiles: bool = True,  # Note [Welford tiles] in heuristics.py
        welford_chunks: bool = True,  # Note [Welford chunks] in split.py (not yet run on a GPU)
        welford_shared: bool = True,  # Note [One triple per Welford] in split.py
        split_min_rnumel: int = 1024,
        split_target_programs: int = 256,
        split_outer_target_programs: int = 2048,
        split_outer_min_chunk: int | None = None,
        split_rows: bool = True,
        split_peel: bool = True,
        split_symbolic: bool = True,
        autotune_min_bytes: int | None = None,
        guarded_inputs: bool = False,
        guarded_layouts: bool = False,
        symbolic_sizes: bool | None = None,
        matmul_templates: bool | str = True,
        overlap_compile: bool = True,
        cudagraph_plan: bool | None = None,
        native_launch: bool | None = None,
        pointer_check: Callable[[], PointerCheck | None] | None = None,
    ) -> None:
        mode = mode or "default"
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        self.mode = mode
        self.debug = debug if debug is not None else os.environ.get("KILN_TRITON_DEBUG", "0") not in ("", "0")
        # kiln_loopir's Note [Dead index writes keep their bounds check]: indirect indices are
        # checked in the interpreter or in debug mode only (Note [Index checks in the
        # interpreter]); elsewhere a dead scatter kept would store out of range unchecked
        self.checks_indices = self.debug or interpreting()
        self.max_persistent_rblock = max_persistent_rblock
        self.allow_tiling = allow_tiling
        self.reorder_reductions = reorder_reductions
        # kiln_loopir's Note [Pointwise nodes walk their memory order]: asked of the scheduler
        self.memory_order_pointwise = memory_order_pointwise
        self.reorder_gathers = reorder_gathers
        self.outer_by_tiles = outer_by_tiles
        self.outer_partials = outer_partials
        self.welford_tiles = welford_tiles
        self.welford_chunks = welford_chunks
        self.welford_shared = welford_shared
        self.split_min_rnumel = split_min_rnumel
        self.split_target_programs = split_target_programs
        self.split_outer_target_programs = split_outer_target_programs
        self.split_outer_min_chunk = split_outer_min_chunk
        self.split_rows = split_rows
        self.split_peel = split_peel
        self.split_symbolic = split_symbolic
        # Note [Autotuning large kernels in the default mode]: None = 128 MiB on a GPU, off elsewhere
        self.autotune_min_bytes = autotune_min_bytes
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
        # Note [Matmul templates]: True = under max-autotune on a GPU; False = never; "force" =
        # always, the template run without timing (tests, under the interpreter too); "extern" =
        # template nodes formed and generated, the extern path always run (tests)
        if matmul_templates not in (True, False, "force", "extern"):
            raise ValueError(
                f"matmul_templates must be True, False, 'force' or 'extern', not {matmul_templates!r}"
            )
        self.matmul_templates = matmul_templates
        # Note [Kernels compiled while the next graph is built] (runtime.py): kernels submitted by
        # the compile and loaded by the first launch
        self.overlap_compile = overlap_compile
        # Note [The runner's per-call path] (cudagraphs.py): None = KILN_CUDAGRAPH_PLAN (default on)
        self.cudagraph_plan = cudagraph_plan
        # Note [Native launches] (native_launch.py): None = KILN_TRITON_NATIVE_LAUNCH (default on)
        self.native_launch = native_launch if native_launch is not None else native_launch_module.enabled()
        self.pointer_check = pointer_check  # ... and its C check of the static inputs' pointers
        self.last_pending: PendingCompile | None = None
        self.last_templates: list[MatmulChoice] = []
        self.last_declined: list[tuple[str, str]] = []
        self.last_specs: list[KernelSpec] = []
        self.last_kernel_bytes: tuple[tuple[str, int], ...] = ()
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

    # ------------------------------------------------------------- Note [Matmul templates]

    def wants_templates(self) -> bool:
        if self.matmul_templates in ("force", "extern"):
            return True
        return bool(self.matmul_templates) and self.autotune and not interpreting()

    def template_epilogue(self, extern: ExternKernelSchedulerNode, kernel: BaseSchedulerNode) -> bool:
        kernel_op = extern.node
        if kernel_op.op not in TEMPLATE_OPS:
            return False
        try:
            problem = self._problem(kernel_op)
            members = kernel.members()
            if kernel.is_reduction() or len(members) != len(kernel.get_nodes()):
                raise TemplateUnsupported(f"{kernel.name} is not a pointwise kernel")
            if any(isinstance(m, Scatter) for m in members):
                raise TemplateUnsupported(f"{kernel.name} scatters")
        except TemplateUnsupported as exc:
            log_tune.debug("%s stays extern: %s", kernel_op.name, exc)
            return False
        log_tune.debug(
            "%s (%s %dx%dx%d, batch %d) and %s become one template node",
            kernel_op.name,
            problem.op,
            problem.m,
            problem.n,
            problem.k,
            problem.batch,
            kernel.name,
        )
        return True

    def _problem(self, kernel: ExternKernel) -> MatmulProblem:
        """The GEMM of ``kernel`` if a template may replace it here (else TemplateUnsupported)."""
        if self.matmul_templates not in ("force", "extern"):
            device = kernel.outputs[0].layout.device if kernel.outputs else None
            if device is None or device.type != "cuda":
                raise TemplateUnsupported("not a CUDA device")
        return problem_of(kernel)

    def _lone_template(
        self, node: ExternKernelSchedulerNode, step: int, dtypes: dict[str, Any], index_dtype: str
    ) -> TemplateSpec | None:
        """The template of a GEMM no epilogue joined (a plain extern node), or None."""
        if node.node.op not in TEMPLATE_OPS:
            return None
        try:
            problem = self._problem(node.node)
            return build_template(
                f"triton_tem_{problem.op}_{step}", problem, [], [], dtypes, set(), index_dtype=index_dtype
            )
        except (CodegenUnsupported, UnsupportedDtype, NotImplementedError) as exc:
            log_tune.debug("%s stays extern: %s", node.name, exc)
            return None

    def _template(
        self,
        node: TemplateSchedulerNode,
        step: int,
        group: KernelGroup | None,
        dtypes: dict[str, Any],
        index_dtype: str,
        internal: set[str],
    ) -> TemplateSpec | None:
        """The template kernel of one template node, or None (then it runs as extern + kernel)."""
        if group is None or len(group.specs) != 1:
            return None
        epilogue = group.specs[0]
        try:
            problem = problem_of(node.extern.node)
            # the epilogue's nodes are all kernel members (template_epilogue refused it otherwise)
            members, reads = node.epilogue.members(), node.epilogue.member_reads()
            name = epilogue.name.replace("triton_poi_", f"triton_tem_{problem.op}_", 1)
            return build_template(name, problem, members, reads, dtypes, internal, index_dtype=index_dtype)
        except (CodegenUnsupported, UnsupportedDtype, NotImplementedError) as exc:
            log_tune.debug("%s runs as extern + %s: %s", node.extern.name, epilogue.name, exc)
            return None

    def codegen_wrapper(
        self, schedule: Scheduler, graph: GraphLowering, kernels: dict[str, Any]
    ) -> Callable[..., Any]:
        configure()
        t0 = time.perf_counter()
        dtypes = {name: buf.layout.dtype for name, buf in graph.name_to_buffer.items()}
        index_dtype = _index_dtype(graph)
        groups: dict[str, KernelGroup | None] = {}
        templates: dict[str, TemplateSpec] = {}
        self.last_declined = []
        for step, node in enumerate(schedule.nodes):
            if isinstance(node, TemplateSchedulerNode):  # Note [Matmul templates]
                groups[node.name] = group = self._kernel(node.epilogue, step, schedule, dtypes, index_dtype)
                internal = set(schedule.plan.internal.get(step, ()))
                template = self._template(node, step, group, dtypes, index_dtype, internal)
                if template is not None:
                    templates[node.name] = template
            elif node.name in kernels:
                groups[node.name] = self._kernel(node, step, schedule, dtypes, index_dtype)
            elif isinstance(node, ExternKernelSchedulerNode) and self.wants_templates():
                lone = self._lone_template(node, step, dtypes, index_dtype)
                if lone is not None:
                    templates[node.name] = lone
        # Note [Declined kernels] (kiln_loopir): refused under symbolic sizes, before the build
        self.refuse_declined_symbolic(graph, CodegenUnsupported, "Triton")
        generated = [s for g in groups.values() if g is not None for s in g.specs]
        launchers: dict[str, Launcher] = {}
        source = ""
        if generated:
            source = module_source(generated)
            module, path = load_module(source)
            self.last_module_path = str(path)
            sizes = _buffer_bytes(graph, groups)
            threshold = self._autotune_threshold(graph.device)
            for spec in generated:
                tune: bool | str = self.autotune
                if not tune and threshold is not None and _moved_bytes(spec, sizes) >= threshold:
                    tune = "small"  # Note [Autotuning large kernels in the default mode]
                candidates = configs(
                    spec,
                    autotune=tune,
                    rblock_cap=min(2048, self.max_persistent_rblock),
                    welford_tiles=self.welford_tiles,
                    welford_chunks=self.welford_chunks,
                )
                launchers[spec.name] = Launcher(
                    getattr(module, spec.name),
                    spec,
                    candidates,
                    autotune=bool(tune),
                    native=self.native_launch,
                )
                if tune == "small" and launchers[spec.name].autotune:
                    log_tune.debug(
                        "%s moves %d bytes: timing %d configs",
                        spec.name,
                        _moved_bytes(spec, sizes),
                        len(candidates),
                    )
        self.compile_seconds = 0.0
        self.last_pending = None
        if launchers and graph.device.type == "cuda" and not interpreting():
            # Note [The launch path]: every kernel compiled before the first call, in parallel
            if self.overlap_compile and not templates:
                # Note [Kernels compiled while the next graph is built]: submitted now, loaded
                # by the first launch
                submitted = time.perf_counter()
                self.last_pending = precompile_start(list(launchers.values()), graph.device)
                self.compile_seconds = time.perf_counter() - submitted
            else:
                self.compile_seconds = precompile(list(launchers.values()), graph.device)
        choices = self._choices(schedule, graph, groups, launchers, templates)
        extra: dict[str, Any] = {"templates": choices} if choices else {}
        fn, wrapper_source = make_wrapper(
            schedule, graph, groups, launchers, guarded_layouts=self.guarded_layouts, **extra
        )
        self.last_specs = generated
        # BuildReport.kernel_bytes: what each kernel moves at most, for bandwidth reports
        at_hints = _buffer_bytes(graph, groups, hints=True) if generated else {}
        self.last_kernel_bytes = tuple((spec.name, _moved_bytes(spec, at_hints)) for spec in generated)
        self.last_source, self.last_wrapper, self.last_launchers = source, wrapper_source, launchers
        self.last_cudagraphs = None
        self.cudagraph_blocked = None
        if self.cudagraphs and graph.device.type == "cuda":
            blocker = cudagraph_blocker(schedule)
            # Note [Data-dependent sizes in the Triton wrapper]: no CUDA graphs
            if blocker is None and graph.sizevars.unbacked:
                names = ", ".join(sorted(str(s) for s in graph.sizevars.unbacked))
                blocker = f"data-dependent sizes ({names}): a replay would keep the recorded ones"
            if blocker is None and graph.sizevars.symbolic:  # Note [CUDA graphs per size]
                fn = self.last_cudagraphs = CudaGraphsPerSize(
                    fn,
                    symbol_values(graph.sizevars),
                    guarded_inputs=self.guarded_inputs,
                    planned=self.cudagraph_plan,
                    pointer_check=self.pointer_check,
                )
            elif blocker is None:
                fn = self.last_cudagraphs = CudaGraphRunner(
                    fn,
                    guarded_inputs=self.guarded_inputs,
                    planned=self.cudagraph_plan,
                    pointer_check=self.pointer_check,
                )
            else:
                log.info("no CUDA graphs for this graph: %s", blocker)
                self.cudagraph_blocked = blocker
        self.codegen_seconds = time.perf_counter() - t0 - self.compile_seconds
        if log.isEnabledFor(logging.DEBUG):
            log.debug("kernels: %s\n%s", self.last_module_path or "(none)", source)
            log.debug("wrapper:\n%s", wrapper_source)
        return fn

    def _choices(
        self,
        schedule: Scheduler,
        graph: GraphLowering,
        groups: dict[str, KernelGroup | None],
        launchers: dict[str, Launcher],
        templates: dict[str, TemplateSpec],
    ) -> dict[str, MatmulChoice]:
        """Note [Matmul templates]: the run-time choice object of every template node."""
        self.last_templates = []
        if not templates:
            return {}
        source = module_source([]) + "\n\n" + "\n\n".join(t.source for t in templates.values())
        module, _ = load_module(source)
        pointers = graph.device.type == "cuda" and not interpreting()
        force = self.matmul_templates if self.matmul_templates in ("force", "extern") else None
        out: dict[str, MatmulChoice] = {}
        for node in schedule.nodes:
            template = templates.get(node.name)
            if template is None:
                continue
            if isinstance(node, TemplateSchedulerNode):
                group = groups[node.name]
                assert group is not None
                extern, epilogue = node.extern.node, launchers[group.specs[0].name]
            else:
                assert isinstance(node, ExternKernelSchedulerNode)
                extern, epilogue = node.node, None
            product = extern.outputs[0]
            choice = MatmulChoice(
                extern,
                epilogue,
                template,
                getattr(module, template.name),
                force="template" if force == "force" else force,
                pointers=pointers,
                conform=_conform_product(product.layout, pointers),
                allocate=_allocate_product(product.layout, pointers, graph.device),
            )
            out[node.name] = choice
            self.last_templates.append(choice)
        return out

    def _autotune_threshold(self, device: torch.device) -> int | None:
        if self.autotune_min_bytes is not None:
            return self.autotune_min_bytes if self.autotune_min_bytes > 0 else None
        if device.type == "cuda" and not interpreting():
            return DEFAULT_AUTOTUNE_MIN_BYTES
        return None

    def _plan_split(self, members: Any, reads: Any, spec: KernelSpec) -> SplitPlan | None:
        # Note [Split reductions under symbolic sizes]: the row length's hint, for the heuristics
        rnumel_hint = spec.hints()[2] if spec.symbolic and self.split_symbolic else None
        return plan_split(
            members,
            reads,
            outer=spec.outer,
            rnumel_hint=rnumel_hint,
            min_rnumel=self.split_min_rnumel,
            target_programs=self.split_target_programs,
            outer_target_programs=self.split_outer_target_programs,
            rows=self.split_rows,
            outer_min_chunk=self._outer_min_chunk(spec),
            # Note [Partials of a column reduction stay column reductions] in split.py
            outer_step=outer_tile_rows(spec) if self.outer_partials else None,
            # Note [Welford chunks] in split.py: an explicit split_outer_min_chunk wins
            welford_min_chunk=(
                WELFORD_MIN_CHUNK if self.welford_chunks and self.split_outer_min_chunk is None else None
            ),
            shared_welford=self.welford_shared,
        )

    def _outer_min_chunk(self, spec: KernelSpec) -> int:
        """The shortest chunk of a split column reduction: as set, else one column tile's rows
        under ``outer_partials`` (Note [Partials of a column reduction stay column reductions] in
        split.py), else 64 (Note [Short chunks of column reductions])."""
        if self.split_outer_min_chunk is not None:
            return self.split_outer_min_chunk
        return outer_tile_rows(spec) if self.outer_partials else 64

    def last_build(self) -> BuildReport:
        return BuildReport(
            codegen_seconds=self.codegen_seconds,
            compile_seconds=self.compile_seconds,
            cache="compiled" if self.compile_seconds else "",
            declined=tuple(self.last_declined),
            kernel_bytes=self.last_kernel_bytes,
        )

    def _kernel(
        self,
        node: BaseSchedulerNode,
        step: int,
        schedule: Scheduler,
        dtypes: dict[str, Any],
        index_dtype: str,
    ) -> KernelGroup | None:
        members, reads = node.members(), node.member_reads()
        internal = set(schedule.plan.internal.get(step, ()))
        name = kernel_name(f"triton_{KIND}", members, step)
        options: dict[str, Any] = {
            "index_dtype": index_dtype,
            "debug": self.debug,
            "max_persistent_rblock": self.max_persistent_rblock,
            "allow_tiling": self.allow_tiling,
            "reorder_reductions": self.reorder_reductions,
            "reorder_gathers": self.reorder_gathers,
            "outer_by_tiles": self.outer_by_tiles,
        }
        try:
            spec = build_kernel(name, members, reads, dtypes, internal, **options)
            plan = None
            split_spec = spec  # the whole kernel the split is planned from
            head: tuple[KernelSpec, ...] = ()
            # a reordered reduction stays whole: split.py plans its chunks in logical order
            if spec.kind in ("persistent", "looped") and not spec.reordered:
                plan = self._plan_split(members, reads, spec)
                peel = peel_rows(members, reads, internal) if plan is None and self.split_peel else None
                if peel is not None:  # Note [Split reductions]: r-level members peeled off
                    rest_spec = build_kernel(name, peel.rest, peel.rest_reads, dtypes, internal, **options)
                    split_spec = rest_spec
                    plan = (
                        None
                        if rest_spec.reordered
                        else self._plan_split(peel.rest, peel.rest_reads, rest_spec)
                    )
                    if plan is not None:
                        rows_name = kernel_name(f"triton_{KIND}", peel.rows, step) + "_rows"
                        head = (
                            build_kernel(rows_name, peel.rows, peel.rows_reads, dtypes, set(), **options),
                        )
                        log.debug(
                            "%s: r-level members %s peeled off to split the reduction",
                            name,
                            ", ".join(m.name for m in peel.rows),
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
            if spec.symbolic:  # Note [Split reductions under symbolic sizes] in split.py
                log.debug(
                    "%s: split into %d chunks over the symbolic row %s (chosen at its hint %d)",
                    name,
                    plan.chunks,
                    spec.rnumel,
                    spec.hints()[2],
                )
            dtypes = {**dtypes, **{p.name: p.layout.dtype for p in plan.partials}}
            # Note [Partials of a column reduction stay column reductions] in split.py
            column = self.outer_partials and split_spec.outer
            first = build_kernel(
                f"{name}_partial", plan.partials, plan.first_reads, dtypes, set(), **options, column=column
            )
            second = build_kernel(name, plan.second, plan.second_reads, dtypes, internal, **options)
            if plan.shared:
                log.debug(  # Note [One triple per Welford] in split.py
                    "%s: %d Welford outputs share their partials", first.name, plan.shared
                )
            if plan.welford_chunks:
                log.debug(  # Note [Welford chunks] in split.py
                    "%s: Welford column reduction of %s rows split into %d chunks of %s rows",
                    first.name,
                    split_spec.rnumel,
                    plan.chunks,
                    split_spec.rnumel // plan.chunks,
                )
            return KernelGroup((*head, first, second), tuple(plan.partials))
        except (CodegenUnsupported, UnsupportedDtype, NotImplementedError) as exc:
            self.decline(node.name, exc, log)  # Note [Declined kernels] (kiln_loopir)
            return None


def _conform_product(layout: Any, pointers: bool) -> Callable[[torch.Tensor], Any]:
    """How the wrapper would hold an extern's result of ``layout`` (Note [Buffers in their own
    shape on a GPU]): in its own dense shape on a GPU, else as flat storage."""
    size, stride, offset = tuple(layout.int_size()), tuple(layout.int_stride()), int(layout.offset)
    shape = dense_shape(layout) if pointers else None
    if shape is not None:
        dsize, dstride = shape
        return lambda r: dense_storage(r, dsize, dstride, 0)
    n = int(layout.storage_size())
    return lambda r: flat_storage(r, n, size, stride, offset)


def _allocate_product(layout: Any, pointers: bool, device: torch.device) -> Callable[[], torch.Tensor]:
    """A new buffer for a lone GEMM's product, held as :func:`_conform_product` holds it."""
    dtype = layout.dtype
    shape = dense_shape(layout) if pointers else None
    if shape is not None:
        dsize, dstride = shape
        return lambda: torch.empty_strided(dsize, dstride, dtype=dtype, device=device)
    n = int(layout.storage_size())
    return lambda: torch.empty(n, dtype=dtype, device=device)


def _buffer_bytes(
    graph: GraphLowering, groups: dict[str, KernelGroup | None], *, hints: bool = False
) -> dict[str, int]:
    """Bytes of every buffer a kernel may name: the graph's and the split reductions' partials.
    A buffer of symbolic size is left out, or with ``hints`` counted at the graph's size hints."""
    out: dict[str, int] = {}
    buffers = list(graph.name_to_buffer.values())
    buffers += [p for g in groups.values() if g is not None for p in g.temporaries]
    for buffer in buffers:
        size = buffer.layout.storage_size()
        try:
            elements = graph.sizevars.hint(size) if hints else int(size)
        except (TypeError, KeyError):  # a symbolic size: unknown here
            continue
        out[buffer.name] = elements * buffer.layout.dtype.itemsize
    return out


def _moved_bytes(spec: KernelSpec, sizes: dict[str, int]) -> int:
    """What a kernel reads and writes at most: the storage of every buffer it takes."""
    return sum(sizes.get(p, 0) for p in spec.params)


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
