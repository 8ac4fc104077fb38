"""``compile_graph``: lower, schedule, generate, and count what happened.

The pipeline is GraphLowering (fx nodes to IR), Scheduler (fusion, order, buffer plan) and a
backend (kernels and the wrapper that runs them). The returned callable takes the graph's inputs
positionally and returns what ``gm(*inputs)`` returns; ``.stats`` says how many kernels were
generated after fusion, how many extern calls run, how many buffers are allocated and reused,
and the estimated bytes moved (read + written by the kernels, kernel-internal buffers
excluded), so fused and unfused schedules can be compared. It also says where compile time went:
lowering, scheduling, and what the backend reports for source generation and the native compile
(with whether that compile came from a cache).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import sympy
import torch
from kiln_symbolic import symbol_of

from .backend import Backend, BuildReport, get_backend
from .graph import GraphLowering, graph_device
from .ir import ComputedBuffer, Pointwise, Reduction, Scatter
from .logs import configure
from .origins import of_members
from .passes import BatchSplit, PassContext, PassOptions, run_passes
from .scheduler import ExternKernelSchedulerNode, Scheduler, output_buffer_names
from .sizevars import has_symbols, using
from .virtualized import format_body

ir_log = logging.getLogger("kiln.loopir.ir")
schedule_log = logging.getLogger("kiln.loopir.schedule")


class SymbolicSizesUnsupported(NotImplementedError):
    """A graph whose sizes are symbolic, which this lowering cannot take (the caller compiles it
    with static sizes instead)."""


def _is_symbolic(x: Any) -> bool:
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    return isinstance(x, torch.Tensor) and has_symbols(x)


def _shape_env(values: Sequence[Any]) -> Any:
    for x in values:
        for s in (x,) if isinstance(x, torch.SymInt) else (*x.shape, *x.stride()):
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def _check_symbolic(graph: GraphLowering, env: Any, guards_before: int, phase: str) -> None:
    """Note [Symbolic sizes in loopir]: lowering and code generation must not have specialized
    a symbol (a guard recorded while they ran), and the wrapper must be able to read every
    symbol from the inputs. `phase`: what just ran ("lowering", "code generation"); the
    reason names the fx node that added the guard where lowering knows it."""
    if env is not None and len(env.guards) != guards_before:
        added = ", ".join(str(g.expr) for g in env.guards[guards_before:])
        node = graph.specialized_by
        by = f" at {_describe_node(node)}" if node is not None else ""
        raise SymbolicSizesUnsupported(f"{phase} specialized a symbolic size ({added}){by}")
    unbound = graph.sizevars.unbound()
    if unbound:
        raise SymbolicSizesUnsupported(f"no input holds size symbols {unbound}")


def _describe_node(node: torch.fx.Node) -> str:
    """`node`'s op, its name, and its symbolic inputs (their sizes, or values for numbers)."""
    symbolic = []
    for arg in node.all_input_nodes:
        value = arg.meta.get("val")
        if isinstance(value, torch.Tensor) and has_symbols(value):
            # each size as made, the symbol it was before a guard of this lowering replaced it
            sizes = ", ".join(str(symbol_of(d) or d) for d in value.shape)
            symbolic.append(f"{arg.name} of size [{sizes}]")
        elif isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            symbolic.append(f"{arg.name} = {value}")
    what = "; symbolic: " + ", ".join(symbolic[:4]) if symbolic else ""
    if len(symbolic) > 4:
        what += f" (+{len(symbolic) - 4} more)"
    return f"{node.target} at node {node.name}{what}"


def _refusal(exc: Exception, where: str) -> SymbolicSizesUnsupported:
    """Note [Symbolic refusals name the op]: an exception that escapes the graph passes,
    lowering or code generation of a graph with symbolic sizes is a refusal (kiln compiles the
    graph static instead, KILN_LOG=dynamic), so its reason is all a user sees of it. A bare
    library error ("Cannot convert symbols to int", sympy asked for an int of a symbol) names
    neither the op nor the size: the reason says where it happened (the fx node and its aten op
    with its symbolic inputs, or the kernel and the ops it computes), then the error. A guard
    added meanwhile is reported the same way (`_check_symbolic`, `GraphLowering.specialized_by`).
    Exceptions kiln raises with its own reason (a code generator's decline) are kept as they
    are (`_worded`). Static graphs are untouched: their errors reach kiln's backend fallback."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return SymbolicSizesUnsupported(f"{where}: {type(exc).__name__}: {first}")


def _worded(exc: Exception) -> bool:
    """Whether kiln raised `exc` with its own reason (a code generator's decline, a refusal):
    kept as it is (Note [Symbolic refusals name the op])."""
    return type(exc).__module__.split(".")[0].startswith("kiln_")


def _kernel_ops(node: Any) -> str:
    """The aten ops a scheduled kernel computes (its members' origins), in graph order."""
    members = [getattr(m, "node", None) for m in node.get_nodes()]
    found = sorted(of_members(members), key=lambda o: o.order)
    return ", ".join(f"{o.op} at node {o.node}" for o in found) or "no fx node recorded"


@dataclass(frozen=True, slots=True)
class CompileStats:
    """What ``compile_graph`` produced; see the module docstring."""

    kernels: int
    extern_calls: int
    buffers: int
    reused: int
    bytes_moved: int
    extern_bytes: int
    fallbacks: tuple[tuple[str, str], ...] = ()
    lower_seconds: float = 0.0
    schedule_seconds: float = 0.0
    codegen_seconds: float = 0.0
    compile_seconds: float = 0.0
    compile_cache: str = ""
    extern_ops: tuple[str, ...] = field(default=())
    declined: tuple[tuple[str, str], ...] = ()  # kernels run by the reference interpreter, and why
    kernel_bytes: tuple[tuple[str, int], ...] = ()  # BuildReport.kernel_bytes: generated kernels' bytes


class CompiledGraph:
    """The callable ``compile_graph`` returns."""

    def __init__(
        self,
        fn: Callable[..., Any],
        stats: CompileStats,
        graph: GraphLowering,
        schedule: Scheduler,
        passes: PassContext | None = None,
    ) -> None:
        self._fn = fn
        self.stats = stats
        self.graph = graph
        self.schedule = schedule
        self.passes = passes

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    @property
    def output_strides(self) -> list[tuple[int, ...] | None]:
        """The strides each output of a flat output list leaves with (None: not a tensor, or
        symbolic): Note [Outputs only the backward reads] in graph.py."""
        outputs = self.graph.outputs
        return [_static_strides(o) for o in (outputs if isinstance(outputs, list | tuple) else [outputs])]


class _PerBatch(CompiledGraph):
    """Note [Both layouts under a symbolic batch]: two compiles of one graph, eager layouts and
    channels-last; each call runs the one its batch picks. ``graph``, ``schedule`` and ``stats``
    are the channels-last compile's (its compile times include the other's)."""

    def __init__(self, small: CompiledGraph, large: CompiledGraph, split: BatchSplit) -> None:
        stats = replace(
            large.stats,
            lower_seconds=small.stats.lower_seconds + large.stats.lower_seconds,
            schedule_seconds=small.stats.schedule_seconds + large.stats.schedule_seconds,
            codegen_seconds=small.stats.codegen_seconds + large.stats.codegen_seconds,
            compile_seconds=small.stats.compile_seconds + large.stats.compile_seconds,
        )
        super().__init__(large._fn, stats, large.graph, large.schedule, large.passes)
        self.small, self.large, self.split = small, large, split
        read, start = split.batch_of, split.start
        small_fn, large_fn = small._fn, large._fn

        def run(*args: Any) -> Any:
            return (large_fn if read(args) >= start else small_fn)(*args)

        self._fn = run


def _static_strides(value: Any) -> tuple[int, ...] | None:
    layout = getattr(value, "layout", None)
    stride = getattr(layout, "stride", None)
    if stride is None or not all(isinstance(s, int | sympy.Integer) for s in stride):
        return None
    return tuple(int(s) for s in stride)


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    backend: str | Backend = "interpret",
    fusion: bool = True,
    options: Mapping[str, Any] | PassOptions | None = None,
) -> CompiledGraph:
    """Compile an aten-level FX graph with a loopir backend (``"interpret"`` by default).

    ``options`` switch the graph passes run before lowering (``kiln_loopir.passes.PassOptions``:
    ``layout``, ``layout_policy``, ``pad_mm``); ``.passes`` of the result says what they did."""
    configure()
    chosen = get_backend(backend)
    symbolic = [x for x in example_inputs if _is_symbolic(x)]
    if symbolic and not getattr(chosen, "symbolic_sizes", False):
        raise SymbolicSizesUnsupported(f"the {type(chosen).__name__} code generator takes static sizes only")
    env = _shape_env(symbolic)
    guards_before = len(env.guards) if env is not None else 0
    t0 = time.perf_counter()
    device = graph_device(gm, example_inputs)
    try:
        gm, passes = run_passes(gm, example_inputs, device, options, scalar_gathers=chosen.scalar_gathers)
    except Exception as exc:  # Note [Symbolic refusals name the op]
        if not symbolic or _worded(exc):
            raise
        raise _refusal(exc, "the graph passes") from exc
    if env is not None and len(env.guards) != guards_before:
        added = ", ".join(str(g.expr) for g in env.guards[guards_before:])
        raise SymbolicSizesUnsupported(f"a graph pass specialized a symbolic size ({added})")
    split = passes.channels_last_from

    def generate(channels_last: set[torch.fx.Node], symbolic_sizes: bool, start: float) -> CompiledGraph:
        return _generate(
            gm,
            example_inputs,
            chosen,
            fusion,
            passes,
            channels_last,
            symbolic_sizes,
            env,
            guards_before,
            start,
        )

    if split is None:
        return generate(passes.channels_last, bool(symbolic), t0)
    # Note [Both layouts under a symbolic batch]
    small = generate(set(), True, t0)
    large = generate(passes.channels_last, True, time.perf_counter())
    return _PerBatch(small, large, split)


def _generate(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    chosen: Backend,
    fusion: bool,
    passes: PassContext,
    channels_last: set[torch.fx.Node],
    symbolic: bool,
    env: Any,
    guards_before: int,
    t0: float,
) -> CompiledGraph:
    """Lower, schedule and generate ``gm`` (its passes run) with ``channels_last`` in NHWC."""
    graph = GraphLowering(
        gm,
        example_inputs,
        fusion=fusion,
        channels_last=channels_last,
        extern_ops=passes.extern_ops,
        shape_only_readers=passes.options.shape_only_readers,
        outputs_read_back=passes.options.outputs_read_back,
        pool_values_max=passes.options.pool_values_max,
        conv_grad_formats=passes.conv_grad_formats,
        nchw_conv_backwards=passes.nchw_conv_backwards,
        native_convs=passes.native_convs,
        nhwc_weights=passes.nhwc_weights,
    )
    if symbolic:
        graph.shape_env = env
        try:
            graph.run()
        except Exception as exc:  # Note [Symbolic refusals name the op]
            if _worded(exc):
                raise
            node = graph.current_node
            where = f"lowering {_describe_node(node)}" if node is not None else "lowering"
            raise _refusal(exc, where) from exc
        _check_symbolic(graph, env, guards_before, "lowering")
    else:
        graph.run()
    t1 = time.perf_counter()
    with using(graph.sizevars):  # Note [Symbolic sizes in loopir]: hints for heuristics
        schedule = Scheduler(
            graph.operations,
            graph.name_to_buffer,
            output_buffer_names(graph.outputs),
            fusion=fusion,
            can_fuse_hook=chosen.can_fuse,
            reorder_pointwise=bool(getattr(chosen, "reorder_for_column_reductions", False)),
            memory_order=bool(getattr(chosen, "memory_order_pointwise", False)),
            template_hook=_template_hook(chosen),
            far_output_fusion=passes.options.far_output_fusion,
            tiny_fusion=passes.options.tiny_fusion,
            late_placement=passes.options.late_placement,
            inplace=passes.options.inplace_reuse and bool(getattr(chosen, "inplace_buffers", False)),
            row_column_hook=chosen.row_column_hook(),
            keep_index_checks=bool(getattr(chosen, "checks_indices", False)),
        )
        t2 = time.perf_counter()
        _log(graph, schedule)
        kernels = {}
        for n in schedule.kernels():
            try:
                kernels[n.name] = chosen.codegen_kernel(n, graph)
            except Exception as exc:  # Note [Symbolic refusals name the op]
                if not symbolic or _worded(exc):
                    raise
                raise _refusal(exc, f"generating kernel {n.name} ({_kernel_ops(n)})") from exc
        try:
            fn = chosen.codegen_wrapper(schedule, graph, kernels)
        except Exception as exc:  # Note [Symbolic refusals name the op]
            if not symbolic or _worded(exc):
                raise
            raise _refusal(exc, "generating the wrapper") from exc
        if symbolic:
            _check_symbolic(graph, env, guards_before, "code generation")
        t3 = time.perf_counter()
        build = chosen.last_build()
        if build == BuildReport():  # the backend reports nothing: all of it was code generation
            build = BuildReport(codegen_seconds=t3 - t2)
        externs = [n for n in schedule.nodes if isinstance(n, ExternKernelSchedulerNode)]
        stats = CompileStats(
            kernels=len(kernels),
            extern_calls=len(externs),
            buffers=len(schedule.plan.allocate),
            reused=schedule.plan.reused,
            bytes_moved=sum(schedule.kernel_bytes(n) for n in schedule.kernels()),
            extern_bytes=sum(schedule.extern_bytes(n) for n in externs),
            fallbacks=tuple(graph.fallbacks),
            lower_seconds=t1 - t0,
            schedule_seconds=t2 - t1,
            codegen_seconds=build.codegen_seconds,
            compile_seconds=build.compile_seconds,
            compile_cache=build.cache,
            extern_ops=tuple(str(getattr(n.node.op, "__name__", n.node.op)) for n in externs),
            declined=build.declined,
            kernel_bytes=build.kernel_bytes,
        )
    schedule_log.debug("stats: %s", stats)
    return CompiledGraph(fn, stats, graph, schedule, passes)


def _template_hook(backend: Backend) -> Any:
    """The backend's ``template_epilogue`` when it asks for template nodes (Note [Matmul
    templates] in kiln_codegen_triton's templates.py), else None: the scheduler forms none."""
    wants = getattr(backend, "wants_templates", None)
    return backend.template_epilogue if wants is not None and wants() else None


def _log(graph: GraphLowering, schedule: Scheduler) -> None:
    if ir_log.isEnabledFor(logging.DEBUG):
        for op in graph.operations:
            if isinstance(op, ComputedBuffer):
                ranges, rranges = op.iteration()
                kind = "Scatter" if isinstance(op, Scatter) else type(op.data).__name__
                ir_log.debug(
                    "%s = %s(ranges=%s, reduction_ranges=%s)", op.name, kind, list(ranges), list(rranges)
                )
                from .indexing import loop_vars

                xs, rs = loop_vars("x", len(ranges)), loop_vars("r", len(rranges))
                for line in format_body(op.body(), xs, rs):
                    ir_log.debug("    %s", line)
            else:
                ir_log.debug("%s = extern %s -> %s", op.name, op.op, [o.name for o in op.outputs])
    if schedule_log.isEnabledFor(logging.DEBUG):
        schedule_log.debug("schedule:\n%s", schedule.describe())
        plan = schedule.plan
        reuse = {k: v for k, v in plan.allocate.items() if v}
        schedule_log.debug("buffers: allocate=%s reuse=%s", sorted(plan.allocate), reuse)


__all__ = [
    "CompileStats",
    "CompiledGraph",
    "Pointwise",
    "Reduction",
    "SymbolicSizesUnsupported",
    "compile_graph",
]
