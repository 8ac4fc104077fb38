"""``CppBackend``: loopir's backend interface, implemented with C++ kernels and a Python wrapper.

loopir asks for one kernel per scheduler node (``codegen_kernel``) and then for the wrapper
(``codegen_wrapper``). The C++ of a kernel depends on the buffer plan (a kernel-internal buffer
that is never read from memory is never stored), which only the whole schedule knows, so
``codegen_kernel`` just remembers the node and all kernels are generated in ``codegen_wrapper``,
into one shared object that is compiled (or found in the cache) once per graph, from one
translation unit or from several compiled at once (Note [Parallel C++ builds] in units.py;
``last_source`` is the one-unit text either way).

Kernels are named for what they fuse, ``cpp_fused_<aten ops>_<step>`` (``kiln_loopir.kernel_name``),
and each opens with a comment naming its fx nodes and the user's lines they came from
(``kiln_loopir.source_comment``); ``KILN_PROFILE=1`` makes every kernel call a
``kiln:<name>`` range in torch.profiler's tables.

A kernel the generator cannot express (a dtype it has no C++ type for, an op without a
spelling, a symbolic size) is not an error: the wrapper runs that kernel through loopir's
reference interpreter, and ``CppBackend.last_declined`` records why.

``CppBackend(options=...)`` switches the generator's own optimizations (``options.CppOptions``;
the ``KILN_CPP_OPTIONS`` environment variable sets them for the backend ``kiln.compile`` builds).
``guarded_layouts=True`` says the caller's guards check every input's sizes, strides and dtype
before each call, so the wrapper checks only the storage offsets (Note [Inputs the frame guard
checks in the C++ wrapper] in wrapper.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kiln_loopir import Backend, BuildReport
from kiln_loopir.graph import GraphLowering
from kiln_loopir.origins import kernel_name
from kiln_loopir.scheduler import BaseSchedulerNode, RowColumnHook, RowColumnSchedulerNode, Scheduler

from .build import Built, PendingBuild, start_build, target_has_avx512
from .cpp_ops import UnsupportedDtype
from .fusion import FusionPolicy
from .kernel import CodegenUnsupported, Kernel, KernelBuilder
from .logs import configure
from .options import CppOptions
from .prelude import extension_module
from .units import UnitKernel, split, translation_units
from .wrapper import make_wrapper

log = logging.getLogger("kiln.codegen_cpp.output_code")


class CppBackend(Backend):
    """The ``"cpp"`` loopir backend; see the module docstring."""

    name = "cpp"
    # Note [Symbolic sizes in C++ kernels]: sizes as int64_t kernel arguments, bound by the wrapper
    symbolic_sizes = True
    # Note [Overlapping max pooling backward on the CPU] (kiln_loopir): GCC leaves a gather's masked
    # loads at computed indices scalar
    scalar_gathers = True
    # Note [A kernel's output in place of an input that dies in it] (kiln_loopir): the pair of
    # pointers of one memory is declared without ``__restrict__``
    inplace_buffers = True
    # Note [Dead index writes keep their bounds check] (kiln_loopir): every indirect index is
    # checked (Note [Kernel errors] in kernel.py)
    checks_indices = True

    def __init__(
        self, options: Mapping[str, Any] | CppOptions | None = None, *, guarded_layouts: bool = False
    ) -> None:
        self.options = CppOptions.from_mapping(options)
        self.guarded_layouts = guarded_layouts
        # Note [Pointwise producers in a column reduction's order] (kiln_loopir's scheduler.py)
        self.reorder_for_column_reductions = self.options.column_sum_fusion
        self.fusion = FusionPolicy()
        self.last_declined: list[tuple[str, str]] = []
        self.last_source: str = ""
        self.last_wrapper: str = ""
        self._last_build: PendingBuild | None = None
        self.codegen_seconds = 0.0
        self.compile_seconds = 0.0

    def can_fuse(self, node1: BaseSchedulerNode, node2: BaseSchedulerNode) -> bool:
        """Note [Row and column reductions are not fused] (fusion.py)."""
        if self.options.fuse_mixed_reductions:
            return True
        return not self.fusion.mixed_reductions(node1, node2)

    def row_column_hook(self) -> RowColumnHook | None:
        """Note [Column sums in a row kernel] (kiln_loopir's scheduler.py; fusion.py): asked only
        with ``CppOptions.row_column_sums`` on, so the scheduler's pair search costs nothing off."""
        return self.fusion.row_column if self.options.row_column_sums else None

    def codegen_kernel(self, node: BaseSchedulerNode, graph: GraphLowering) -> Any:
        return node

    def codegen_wrapper(
        self, schedule: Scheduler, graph: GraphLowering, kernels: dict[str, Any]
    ) -> Callable[..., Any]:
        configure()
        self.fusion = FusionPolicy()  # node names are per schedule
        t0 = time.perf_counter()
        dtypes = {name: buf.layout.dtype for name, buf in graph.name_to_buffer.items()}
        generated: dict[str, Kernel | None] = {}
        self.last_declined = []
        for step, node in enumerate(schedule.nodes):
            if node.name not in kernels:
                continue
            generated[node.name] = self._kernel(node, step, schedule, dtypes)
        # Note [Declined kernels] (kiln_loopir): refused under symbolic sizes, before the build
        self.refuse_declined_symbolic(graph, CodegenUnsupported, "C++")
        compiled = [k for k in generated.values() if k is not None]
        module = extension_module([(k.name, k.param_types, k.release_gil) for k in compiled])
        # Note [Parallel C++ builds] (units.py): the kernels in one or several translation units
        unit_kernels = [UnitKernel(k.name, k.source, tuple(k.param_types)) for k in compiled]
        twins = self.options.share_twins
        units = translation_units(unit_kernels, module, split(unit_kernels, self.options.build_parts), twins)
        source = units[0] if len(units) == 1 else translation_units(unit_kernels, module, [], twins)[0]
        t1 = time.perf_counter()
        flags = self.options.compiler_flags()
        built = start_build(units, flags, headers=self.options.precompiled_headers) if compiled else None
        if built is not None and not self.options.overlap_builds:
            built.result()  # Note [Builds that overlap]: off, the wrapper is made once it is built
        t2 = time.perf_counter()
        fn, wrapper_source, path = make_wrapper(
            schedule,
            graph,
            generated,
            built,
            options=self.options,
            guarded_layouts=self.guarded_layouts,
        )
        self.codegen_seconds = (t1 - t0) + (time.perf_counter() - t2)
        self.compile_seconds = t2 - t1
        self.last_source, self.last_wrapper, self._last_build = source, wrapper_source, built
        if log.isEnabledFor(logging.DEBUG):
            where = ", ".join(map(str, built.paths)) if built is not None else "(no C++ kernels)"
            log.debug("options: %s", self.options)
            # Note [512-bit vectors on AVX-512 targets]
            width = self.options.preferred_width()
            log.debug(
                "vector width: %s (%s)",
                width or "the compiler's tuning",
                "CppOptions.vector_width"
                if self.options.vector_width
                else f"build target {'has' if target_has_avx512() else 'lacks'} AVX-512F, "
                f"wide_vectors={int(self.options.wide_vectors)}",
            )
            log.debug("compiler flags: %s", " ".join(self.options.compiler_flags()) or "(none)")
            log.debug("kernels: %s", where)
            log.debug("wrapper: %s\n%s", path, wrapper_source)
        return fn

    @property
    def last_built(self) -> Built | None:
        """The last graph's library, waited for if it is still compiling (Note [Builds that
        overlap] in build.py)."""
        return self._last_build.result() if self._last_build is not None else None

    def last_build(self) -> BuildReport:
        return BuildReport(
            self.codegen_seconds,
            self.compile_seconds,
            self._last_build.cache if self._last_build else "",
            tuple(self.last_declined),
        )

    def _kernel(
        self, node: BaseSchedulerNode, step: int, schedule: Scheduler, dtypes: dict[str, Any]
    ) -> Kernel | None:
        members, reads = node.members(), node.member_reads()
        internal = set(schedule.plan.internal.get(step, ()))
        # Note [A kernel's output in place of an input that dies in it] (kiln_loopir): the two
        # names of one memory lose ``__restrict__``
        aliased = set()
        for m in members:
            if (source := schedule.plan.inplace.get(m.name)) is not None:
                aliased |= {m.name, source}
        name = kernel_name("cpp", members, step)
        # Note [Column sums in a row kernel]: the members that sum the row kernel's columns
        columns = node.columns if isinstance(node, RowColumnSchedulerNode) else frozenset()
        try:
            return KernelBuilder(
                name, members, reads, dtypes, internal, self.options, aliased=aliased, columns=columns
            ).build()
        except (CodegenUnsupported, UnsupportedDtype, NotImplementedError) as exc:
            self.decline(node.name, exc, log)  # Note [Declined kernels] (kiln_loopir)
            return None
