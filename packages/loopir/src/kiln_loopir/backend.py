"""The backend interface code generators implement, and the registry that finds them.

A backend turns a schedule into something callable. It is asked three things:

* ``can_fuse(node1, node2)``: a veto on a fusion the scheduler finds legal (a C++ generator
  might refuse a reduction, then a broadcast, then another reduction in one loop nest);
* ``codegen_kernel(node, graph)``: the kernel for one scheduler node (plain or fused);
* ``codegen_wrapper(schedule, graph, kernels)``: the callable that allocates buffers, calls the
  kernels and the extern ops in order, frees and reuses buffers, and returns the outputs.

and may say what its last ``codegen_wrapper`` cost (``last_build()``, a :class:`BuildReport`:
seconds generating source, seconds in the native compiler, and whether that compile was served
from a cache), which ``compile_graph`` copies into its stats so compile time can be shown by phase.

Backends are found by name: ``"interpret"`` (the reference interpreter in this package) is
built in; any other name is looked up in the entry-point group ``kiln_loopir.backends``, so a code
generator package registers itself in its own ``pyproject.toml`` and loopir never imports it::

    [project.entry-points."kiln_loopir.backends"]
    cpp = "kiln_codegen_cpp:CppBackend"

The entry point names a zero-argument callable (usually the class) returning a :class:`Backend`.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .graph import GraphLowering
    from .scheduler import BaseSchedulerNode, ExternKernelSchedulerNode, RowColumnHook, Scheduler

ENTRY_POINT_GROUP = "kiln_loopir.backends"


@dataclass(frozen=True, slots=True)
class BuildReport:
    """What a backend's last ``codegen_wrapper`` cost.

    ``cache`` is ``"compiled"`` (the native compiler ran), ``"disk"`` or ``"memory"`` (a cached
    build was reused) or ``""`` (nothing needed compiling, or the backend compiles nothing).
    ``declined`` names the kernels the generator could not express, with why: they run in the
    reference interpreter (right, but not compiled). ``kernel_bytes`` gives each generated
    kernel's name and the bytes of the buffers it takes at the size hints: what a memory-bound
    kernel moves at most, which a profile divides by the kernel's time for its bandwidth (Note
    [Bandwidth of generated kernels] in kiln_bench's profile.py); empty where a backend does not
    say.
    """

    codegen_seconds: float = 0.0
    compile_seconds: float = 0.0
    cache: str = ""
    declined: tuple[tuple[str, str], ...] = ()
    kernel_bytes: tuple[tuple[str, int], ...] = ()


class Backend:
    """What a code generator implements; see the module docstring."""

    name: str = "backend"
    # Note [Pointwise producers in a column reduction's order] (scheduler.py): whether the
    # scheduler may re-express a pointwise producer in a column reduction's loop order to fuse them
    reorder_for_column_reductions: bool = False
    # Note [Pointwise nodes walk their memory order] (scheduler.py): whether the scheduler gives
    # a pointwise node stored in another dimension order a loop nest in that order
    memory_order_pointwise: bool = False
    # Note [Overlapping max pooling backward on the CPU] (lowerings/pooling.py): whether a gather
    # kernel's masked loads at computed indices leave its loop scalar in this generator
    scalar_gathers: bool = False
    # Note [A kernel's output in place of an input that dies in it] (scheduler.py): whether this
    # generator's kernels stay correct when an output and an input are one memory
    inplace_buffers: bool = False
    # Note [Dead index writes keep their bounds check] (scheduler.py): whether this generator's
    # kernels check an indirect index (and raise IndexError), so that a dead scatter is worth
    # keeping for its check
    checks_indices: bool = False

    def can_fuse(self, node1: BaseSchedulerNode, node2: BaseSchedulerNode) -> bool:
        """Veto hook: return False to refuse a fusion the scheduler found legal."""
        return True

    def row_column_hook(self) -> RowColumnHook | None:
        """Whether the row kernel ``row`` may also compute the column reductions ``column`` (Note
        [Column sums in a row kernel] in scheduler.py), as a ``(row, column) -> bool`` the
        scheduler asks; None (the default): the scheduler does not look for such pairs at all."""
        return None

    def wants_templates(self) -> bool:
        """Whether the scheduler should offer :meth:`template_epilogue` its extern/kernel pairs
        (Note [Matmul templates] in kiln_codegen_triton's templates.py); no, by default."""
        return False

    def template_epilogue(self, extern: ExternKernelSchedulerNode, kernel: BaseSchedulerNode) -> bool:
        """Should ``extern`` and ``kernel``, the one kernel reading its result, run as one
        :class:`~kiln_loopir.scheduler.TemplateSchedulerNode`? The backend then generates it."""
        return False

    def codegen_kernel(self, node: BaseSchedulerNode, graph: GraphLowering) -> Any:
        """The kernel that runs one (possibly fused) scheduler node."""
        raise NotImplementedError

    def codegen_wrapper(
        self, schedule: Scheduler, graph: GraphLowering, kernels: dict[str, Any]
    ) -> Callable[..., Any]:
        """The callable that runs the whole schedule on the graph's inputs."""
        raise NotImplementedError

    def last_build(self) -> BuildReport:
        """What the last ``codegen_wrapper`` cost (nothing known, by default)."""
        return BuildReport()

    # Note [Declined kernels]: a kernel a code generator cannot express (an op or a dtype it has
    # no spelling of, a shape it does not handle) is declined, not an error: its wrapper runs the
    # node's members through the reference interpreter instead (Note [A kernel step in a wrapper]
    # in wrapper_support.py), right but slow. A generator that declines says so here, in one
    # form for every generator: ``last_declined`` lists (node, "<exception type>: <message>")
    # for this compile (``BuildReport.declined``; tests assert it is empty), and the
    # generator's ``output_code`` logger says which kernel runs in the interpreter and why.
    last_declined: list[tuple[str, str]]

    def decline(self, node: str, exc: BaseException, log: logging.Logger) -> None:
        """Record that the kernel of scheduler node ``node`` was declined for ``exc`` (Note
        [Declined kernels])."""
        self.last_declined.append((node, f"{type(exc).__name__}: {exc}"))
        log.debug("kernel %s runs in the interpreter: %s", node, exc)

    def refuse_declined_symbolic(
        self, graph: GraphLowering, unsupported: type[Exception], generator: str
    ) -> None:
        """Note [Declined kernels] under symbolic sizes: a graph of symbolic sizes with a declined
        kernel is refused (``unsupported``, naming the first one and why), since the interpreter
        would be far slower than the static compile the caller falls back to. Asked once every
        kernel was generated and before any is compiled, so a refused graph costs no native
        build."""
        if graph.sizevars.symbolic and self.last_declined:
            node, why = self.last_declined[0]
            raise unsupported(
                f"kernel {node}: the {generator} generator declined it with symbolic sizes ({why})"
            )


_REGISTRY: dict[str, Callable[[], Backend]] = {}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Make ``name`` resolve to ``factory()`` (in-process registration, e.g. for tests)."""
    _REGISTRY[name] = factory


def available_backends() -> list[str]:
    """Names registered in process plus those advertised through entry points."""
    names = set(_REGISTRY) | {"interpret"}
    names |= {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def get_backend(name: str | Backend) -> Backend:
    """The backend called ``name`` (a Backend instance passes through)."""
    if isinstance(name, Backend):
        return name
    if name in _REGISTRY:
        return _REGISTRY[name]()
    if name == "interpret":
        from .interpret import InterpretBackend

        return InterpretBackend()
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            factory = ep.load()
            backend = factory()
            if not isinstance(backend, Backend):
                raise TypeError(f"entry point {ep.value} did not give a kiln_loopir Backend")
            return backend
    raise KeyError(f"no loopir backend named {name!r}; available: {', '.join(available_backends())}")
