"""The scheduler: dependencies, greedy fusion, order, dead code, buffer reuse.

Each operation the lowering registered becomes a scheduler node. Its read and write sets come
from running its loop body under a recording ``ops`` handler: every ``load``/``store`` is a
:class:`MemoryDep` (buffer, symbolic index, loop sizes), or a :class:`StarDep` when the index is
indirect (``ops.indirect_indexing``) or the node is an extern kernel. Node B depends on node A
when B reads a buffer A writes.

Fusion is the paper's greedy loop: collect pairs of nodes that share a buffer, score each pair
(:func:`score_fusion`: same reduction-ness first, then estimated bytes of memory traffic saved,
then proximity in the original order), and fuse the best legal pair first, skipping pairs whose
nodes were already absorbed; repeat until a round fuses nothing. :meth:`Scheduler.can_fuse` is
the legality test: both are kernels, their iteration spaces are compatible (see
:func:`groups_compatible`), every value the consumer reads from the producer is read at the
position the same loop iteration wrote it (or, from a reduction, after the reduction completed),
fusing creates no cycle through a third node, and the backend does not veto. Before fusion, a
backend may ask for pointwise producers of column reductions to be re-expressed in the
reduction's loop order so that the two align (Note [Pointwise producers in a column reduction's
order]).

After fusion the nodes are put in topological order, and a buffer plan follows: buffers written
and read only inside one fused kernel are kernel-internal (never allocated), every other
computed buffer is allocated before its first writer and freed after its last reader, and a new
buffer takes over the memory of a freed one of the same dtype and size (the reuse plan).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from .indexing import (
    Expr,
    FloorDiv,
    ModularIndexing,
    contiguous_strides,
    loop_vars,
    merge_loop_ranges,
    merge_loops,
    simplify_index,
    simplify_reordered,
)
from .ir import (
    Buffer,
    ComputedBuffer,
    ExternKernel,
    Index,
    Operation,
    Pointwise,
    ReinterpretView,
    ReorderedPointwise,
    Scatter,
)
from .sizevars import current as current_sizevars
from .virtualized import DefaultHandler, set_ops_handler

log = logging.getLogger("kiln.loopir.schedule")

MAX_FUSION_SIZE = 64
MAX_HORIZONTAL_DISTANCE = 64
# Note [Tiny kernels fuse without a shared buffer]: a pointwise kernel of at most this many elements
TINY_ELEMENTS = 64
MAX_ROUNDS = 10


# --------------------------------------------------------------------------------------------
# dependencies


@dataclass(frozen=True, slots=True)
class MemoryDep:
    """An access of ``name`` at ``index``, a function of ``variables`` ranging over ``sizes``."""

    name: str
    index: Expr
    variables: tuple[sympy.Symbol, ...]
    sizes: tuple[Expr, ...]

    def canonical(self) -> tuple[tuple[Expr, ...], Expr]:
        """The access with loops merged: equal for accesses that visit offsets alike."""
        return _canonical(self.sizes, self.index, self.variables)


@functools.lru_cache(maxsize=65536)
def _canonical(
    sizes: tuple[Expr, ...], index: Expr, variables: tuple[sympy.Symbol, ...]
) -> tuple[tuple[Expr, ...], Expr]:
    return merge_loops(sizes, index, variables)


@dataclass(frozen=True, slots=True)
class StarDep:
    """An access of the whole of ``name`` at positions not known statically."""

    name: str


Dep = MemoryDep | StarDep


class _Recorder(DefaultHandler):
    def __init__(self, variables: Sequence[sympy.Symbol], sizes: Sequence[Expr], nx: int) -> None:
        self.variables, self.sizes, self.nx = tuple(variables), tuple(sizes), nx
        self.ranges = dict(zip(variables, sizes, strict=True))
        self.reads: list[Dep] = []
        self.writes: list[Dep] = []
        self._indirect = 0
        self.checked = False  # whether an indirect index is bounds-checked

    def generic(self, name: str, *args: Any) -> None:
        return None

    def _dep(self, name: str, index: Expr, xonly: bool = False) -> Dep:
        index = sympy.sympify(index)
        if any(s.name.startswith("indirect") for s in index.free_symbols):
            return StarDep(name)
        variables, sizes = (
            (self.variables[: self.nx], self.sizes[: self.nx]) if xonly else (self.variables, self.sizes)
        )
        return MemoryDep(name, simplify_index(index, self.ranges), variables, sizes)

    def load(self, name: str, index: Expr) -> None:
        self.reads.append(self._dep(name, index))

    def store(self, name: str, index: Expr, value: Any, mode: str | None = None) -> None:
        self.writes.append(StarDep(name) if mode else self._dep(name, index))

    def store_reduction(self, name: str, index: Expr, value: Any) -> None:
        self.writes.append(self._dep(name, index, xonly=True))

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> None:
        body()

    def indirect_indexing(self, value: Any, size: Any, check: bool = True) -> sympy.Symbol:
        self._indirect += 1
        self.checked = self.checked or check
        return sympy.Symbol(f"indirect{self._indirect}", integer=True)


def _record(buffer: ComputedBuffer) -> _Recorder:
    ranges, rranges = buffer.iteration()
    xs, rs = loop_vars("x", len(ranges)), loop_vars("r", len(rranges))
    recorder = _Recorder([*xs, *rs], [*ranges, *rranges], len(xs))
    with set_ops_handler(recorder):
        buffer.body()(xs, rs)
    return recorder


def extract_read_writes(buffer: ComputedBuffer) -> tuple[list[Dep], list[Dep]]:
    """Run the buffer's body under a recording handler: (reads, writes)."""
    recorder = _record(buffer)
    reads = recorder.reads
    if isinstance(buffer, Scatter):
        reads = [*reads, StarDep(buffer.mutates)]
    return reads, recorder.writes


# --------------------------------------------------------------------------------------------
# nodes


@dataclass(eq=False)
class BaseSchedulerNode:
    """A unit of the schedule: one kernel, one extern call, or a fused group."""

    order: int
    reads: list[Dep]
    writes: list[Dep]
    ancestors: set[str] = field(default_factory=set)
    # caches: the scheduler asks these questions many times per pair of nodes
    _names: frozenset[str] | None = field(default=None, repr=False)
    _reads: frozenset[str] | None = field(default=None, repr=False)
    _writes: frozenset[str] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        raise NotImplementedError

    def get_nodes(self) -> list[BaseSchedulerNode]:
        return [self]

    def names(self) -> frozenset[str]:
        if self._names is None:
            self._names = frozenset(n.name for n in self.get_nodes())
        return self._names

    def read_names(self) -> frozenset[str]:
        if self._reads is None:
            self._reads = frozenset(d.name for d in self.reads)
        return self._reads

    def write_names(self) -> frozenset[str]:
        if self._writes is None:
            self._writes = frozenset(d.name for d in self.writes)
        return self._writes

    def members(self) -> list[ComputedBuffer]:
        """The buffers this node's kernel computes, in the order it runs them (an extern call's
        node has none): what every code generator builds a kernel from."""
        return [b for m in self.get_nodes() if isinstance(b := getattr(m, "node", None), ComputedBuffer)]

    def member_reads(self) -> list[frozenset[str]]:
        """What each of :meth:`members` reads, in the same order."""
        return [
            m.read_names() for m in self.get_nodes() if isinstance(getattr(m, "node", None), ComputedBuffer)
        ]

    def is_kernel(self) -> bool:
        return False

    def is_reduction(self) -> bool:
        return False

    def group(self) -> tuple[Expr, Expr]:
        return (sympy.Integer(0), sympy.Integer(0))


@dataclass(eq=False)
class SchedulerNode(BaseSchedulerNode):
    """A ComputedBuffer's loop nest: a kernel of its own until fused."""

    node: ComputedBuffer = field(default=None)  # type: ignore[assignment]
    _group: tuple[Expr, Expr] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.node.name

    def is_kernel(self) -> bool:
        return not isinstance(self.node, Scatter)

    def loop_ranges(self) -> tuple[tuple[Expr, ...], tuple[Expr, ...], dict[sympy.Symbol, Expr]]:
        """The loop nest a code generator should emit: (ranges, reduction ranges, substitution).

        Adjacent dims that every access walks contiguously are merged
        (:func:`~kiln_loopir.indexing.merge_loop_ranges`); the substitution maps the body's
        ``x*``/``r*`` variables to expressions of the merged loop variables ``z*``. A body with
        indirect accesses keeps its loops as they are.
        """
        ranges, rranges = self.node.iteration()
        xs, rs = loop_vars("x", len(ranges)), loop_vars("r", len(rranges))
        variables = [*xs, *rs]
        if any(isinstance(d, StarDep) for d in (*self.reads, *self.writes)):
            return ranges, rranges, {v: v for v in variables}
        indices = [d.index for d in (*self.reads, *self.writes) if isinstance(d, MemoryDep)]
        sizes, mapping, _ = merge_loop_ranges([*ranges, *rranges], indices, variables, boundary=len(ranges))
        # the boundary keeps x and r dims apart: the merged x loops are the z's the x's map to
        nx = len(set().union(*(mapping[v].free_symbols for v in xs)))
        return sizes[:nx], sizes[nx:], mapping

    def is_reduction(self) -> bool:
        return self.node.is_reduction()

    def group(self) -> tuple[Expr, Expr]:
        if self._group is None:
            ranges, rranges = self.node.iteration()
            self._group = (_as_int(sympy.Mul(*ranges)), _as_int(sympy.Mul(*rranges)))
        return self._group


@dataclass(eq=False)
class ExternKernelSchedulerNode(BaseSchedulerNode):
    """A call of an aten op: never fused."""

    node: ExternKernel = field(default=None)  # type: ignore[assignment]

    @property
    def name(self) -> str:
        return self.node.name


@dataclass(eq=False)
class NopKernelSchedulerNode(BaseSchedulerNode):
    """A buffer with no elements: nothing to run."""

    node: ComputedBuffer = field(default=None)  # type: ignore[assignment]

    @property
    def name(self) -> str:
        return self.node.name


@dataclass(eq=False)
class FusedSchedulerNode(BaseSchedulerNode):
    """Several kernel nodes run as one kernel, in ``snodes`` order."""

    snodes: list[BaseSchedulerNode] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "_".join(n.name for n in self.snodes)

    def get_nodes(self) -> list[BaseSchedulerNode]:
        return list(self.snodes)

    def is_kernel(self) -> bool:
        return True

    def is_reduction(self) -> bool:
        return any(n.is_reduction() for n in self.snodes)

    def group(self) -> tuple[Expr, Expr]:
        for n in self.snodes:
            if n.is_reduction():
                return n.group()
        return self.snodes[0].group()

    @staticmethod
    def fuse(a: BaseSchedulerNode, b: BaseSchedulerNode) -> FusedSchedulerNode:
        snodes = sorted([*a.get_nodes(), *b.get_nodes()], key=lambda n: n.order)
        names = {n.name for n in snodes}
        return FusedSchedulerNode(
            order=min(a.order, b.order),
            reads=[*a.reads, *b.reads],
            writes=[*a.writes, *b.writes],
            ancestors=(a.ancestors | b.ancestors) - names,
            snodes=snodes,
        )


@dataclass(eq=False)
class TemplateSchedulerNode(FusedSchedulerNode):
    """An extern GEMM and the one kernel that reads its result, run as one unit: the backend
    decides how (Note [Matmul templates] in kiln_codegen_triton's templates.py). ``snodes`` are
    the extern node, then the kernel's members, so the buffer plan sees the kernel's internal
    buffers as a fused kernel's and keeps the GEMM's inputs alive until the unit runs."""

    extern: ExternKernelSchedulerNode = field(default=None)  # type: ignore[assignment]
    epilogue: BaseSchedulerNode = field(default=None)  # type: ignore[assignment]


TemplateHook = Callable[[ExternKernelSchedulerNode, BaseSchedulerNode], bool]


@dataclass(eq=False)
class RowColumnSchedulerNode(FusedSchedulerNode):
    """A row kernel and column reductions over the same ``[rows, cols]`` operands, run as one
    kernel (Note [Column sums in a row kernel]): ``snodes`` are the row kernel's members, then
    the column reductions'; ``columns`` names the latter. ``group()`` is the row kernel's."""

    columns: frozenset[str] = frozenset()


# (row kernel, column reductions) -> may they run as one RowColumnSchedulerNode?
RowColumnHook = Callable[[BaseSchedulerNode, BaseSchedulerNode], bool]


def _as_int(expr: Expr) -> Expr:
    """Plain ints compare far faster than sympy Integers; symbolic sizes stay sympy."""
    return int(expr) if expr.is_Integer else expr


def groups_compatible(g1: tuple[Expr, Expr], g2: tuple[Expr, Expr]) -> bool:
    """Can two iteration spaces share one kernel?

    Pointwise (n, 1) with pointwise (n, 1); reduction (n, r) with the same reduction; a pointwise
    of n*r elements runs inside the reduction loop, one of n elements after it (an epilogue).
    """
    (n1, r1), (n2, r2) = g1, g2
    if r1 == 1 and r2 == 1:
        return bool(n1 == n2)
    if r1 != 1 and r2 != 1:
        return bool(n1 == n2 and r1 == r2)
    (n, r), m = ((n1, r1), n2) if r1 != 1 else ((n2, r2), n1)
    return bool(m == n * r or m == n)


# --------------------------------------------------------------------------------------------
# the scheduler


FusionVeto = Callable[[BaseSchedulerNode, BaseSchedulerNode], bool]


@dataclass
class BufferPlan:
    """Which buffers exist, which are kernel-internal, and which reuse freed memory."""

    allocate: dict[str, str | None] = field(default_factory=dict)  # name -> reused buffer or None
    internal: dict[int, list[str]] = field(default_factory=dict)  # step -> names
    free_after: dict[int, list[str]] = field(default_factory=dict)  # step -> names
    # name -> the input it takes over in place, in the kernel that reads that input last
    # (Note [A kernel's output in place of an input that dies in it]); also in ``allocate``
    inplace: dict[str, str] = field(default_factory=dict)

    @property
    def reused(self) -> int:
        return sum(1 for v in self.allocate.values() if v is not None)


class Scheduler:
    """Builds nodes for ``operations``, fuses them and plans buffers; see the module docstring."""

    def __init__(
        self,
        operations: Sequence[Operation],
        name_to_buffer: dict[str, Buffer],
        output_names: Iterable[str],
        *,
        fusion: bool = True,
        can_fuse_hook: FusionVeto | None = None,
        reorder_pointwise: bool = False,
        memory_order: bool = False,
        template_hook: TemplateHook | None = None,
        far_output_fusion: bool = True,
        tiny_fusion: bool = True,
        late_placement: bool = True,
        inplace: bool = False,
        row_column_hook: RowColumnHook | None = None,
        keep_index_checks: bool = False,
    ) -> None:
        self.name_to_buffer = name_to_buffer
        self.keep_index_checks = keep_index_checks  # Note [Dead index writes keep their bounds check]
        self.inplace = inplace  # Note [A kernel's output in place of an input that dies in it]
        self.late_placement = late_placement  # Note [Kernels placed where they are first needed]
        self.far_output_fusion = far_output_fusion
        self.tiny_fusion = tiny_fusion  # Note [Tiny kernels fuse without a shared buffer]
        self.output_names = set(output_names)
        self.can_fuse_hook = can_fuse_hook
        self.nodes: list[BaseSchedulerNode] = [self._create(i, op) for i, op in enumerate(operations)]
        # Note [Pointwise nodes walk their memory order]
        self.memory_ordered: list[str] = []
        if memory_order:
            self.nodes = [self._in_memory_order(n) for n in self.nodes]
        self.writer: dict[str, BaseSchedulerNode] = {}
        self.aliases: dict[str, str] = {}
        for n in self.nodes:
            for w in n.write_names():
                self.writer[w] = n
            if isinstance(n, SchedulerNode) and isinstance(n.node, Scatter):
                self.aliases[n.node.name] = n.node.mutates
        self.dead_code_elimination()
        self.deps = self.compute_deps()
        self.compute_ancestors()
        # buffer name -> the names of the nodes that read it (Note [Outputs fused across the graph])
        self._read_by: dict[str, set[str]] = {}
        for n in self.nodes:
            for r in n.read_names():
                self._read_by.setdefault(r, set()).add(n.name)
        self._groups: list[BaseSchedulerNode] = list(self.nodes)
        self._owner: dict[str, BaseSchedulerNode] = {n.name: n for n in self.nodes}
        self._reader_cache: dict[str, set[int]] | None = None
        self.reordered: list[tuple[str, str]] = []  # (pointwise, column reduction): Note below
        # a reordered producer's name -> (its column reduction, the node it replaced)
        self._reorder_partner: dict[str, tuple[str, SchedulerNode]] = {}
        if fusion and reorder_pointwise:
            self.reorder_for_column_reductions()
        if fusion:
            self.fuse_nodes()
            if self._reorder_partner and self.restore_unpaired_producers():
                self.fuse_nodes()
            if row_column_hook is not None:
                self.fuse_rows_with_columns(row_column_hook)
        if fusion and template_hook is not None:
            self.form_templates(template_hook)
        self.nodes = self.topological_sort(self.nodes)
        self.plan = self.plan_buffers()

    @staticmethod
    def _create(order: int, op: Operation) -> BaseSchedulerNode:
        if isinstance(op, ExternKernel):
            reads: list[Dep] = [StarDep(n) for n in op.input_names()]
            writes: list[Dep] = [StarDep(o.name) for o in op.outputs]
            if _is_mutating(op):  # Note [Mutation]: it may write any tensor it is given
                writes += [StarDep(n) for n in op.input_names()]
            return ExternKernelSchedulerNode(order, reads, writes, node=op)
        reads, writes = extract_read_writes(op)
        if op.numel() == 0:
            return NopKernelSchedulerNode(order, reads, writes, node=op)
        return SchedulerNode(order, reads, writes, node=op)

    # Note [Pointwise nodes walk their memory order]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A pointwise node's loop nest is its logical (N, C, H, W) order, and fusion lines nodes up
    # by their flat position in that nest. A node stored in another dimension order (a
    # channels-last activation) that fuses with a kernel walking memory order then reads and
    # writes across it: ConvNeXt's depthwise-convolution bias add, stored NHWC for the layer
    # norm that reads it through ``permute(0, 2, 3, 1)`` (Note [Values read through a
    # channels-last permute]), joined that norm's kernel horizontally (both read the convolution's
    # output) with its loads and stores 32-192 elements apart, lane after lane. Where the backend
    # asks (``Backend.memory_order_pointwise``: the Triton generator, whose pointwise kernels
    # walk memory order on their own, Note [Pointwise kernels walk memory order] in its
    # kernel.py), a pointwise node whose layout is dense in another order than row-major is
    # re-expressed as a :class:`ReorderedPointwise` whose loops are its dimensions in memory
    # order (outermost first): the same elements, computed and stored in memory order, so its
    # flat position is its memory position and it fuses aligned with readers and partners that
    # walk memory (the permuted norm, the kernels of other NHWC values). Static sizes only; a
    # scatter or a reduction keeps its nest. ``Scheduler.memory_ordered`` lists the nodes,
    # KILN_LOG=schedule prints them.

    def _in_memory_order(self, node: BaseSchedulerNode) -> BaseSchedulerNode:
        if not isinstance(node, SchedulerNode) or type(node.node) is not ComputedBuffer:
            return node
        buffer = node.node
        if not isinstance(buffer.data, Pointwise):
            return node
        layout, ranges = buffer.layout, buffer.data.ranges
        values = (*ranges, *layout.stride, layout.offset)
        if tuple(layout.size) != tuple(ranges) or any(not sympy.sympify(v).is_Integer for v in values):
            return node
        sizes = [int(r) for r in ranges]
        strides = [int(st) for st in layout.stride]
        real = [i for i, n in enumerate(sizes) if n != 1]
        order = sorted(real, key=lambda i: -strides[i])
        if order == real:
            return node  # row-major already (size-1 dims aside)
        expected = 1
        for i in reversed(order):  # dense: each dim steps over the ones inside it
            if strides[i] != expected:
                return node
            expected *= sizes[i]
        perm = [i for i, n in enumerate(sizes) if n == 1] + order
        base = int(layout.offset)

        def position(loop_index: Index) -> Index:
            logical: list[Expr] = [sympy.Integer(0)] * len(sizes)
            for k, dim in enumerate(perm):
                logical[dim] = loop_index[k]
            return logical

        def offset(loop_index: Index) -> Expr:
            return sympy.Integer(base) + sum(
                (v * strides[dim] for v, dim in zip(loop_index, perm, strict=True)), sympy.Integer(0)
            )

        made = ReorderedPointwise(
            buffer.name,
            buffer.layout,
            data=buffer.data,
            loop_sizes=tuple(sympy.Integer(sizes[d]) for d in perm),
            position=position,
            offset=offset,
        )
        reads, writes = extract_read_writes(made)
        self.memory_ordered.append(buffer.name)
        log.debug("%s walks its memory order %s", buffer.name, perm)
        return SchedulerNode(node.order, reads, writes, node=made)

    # dependencies ---------------------------------------------------------------------------

    def producers(self, node: BaseSchedulerNode) -> set[str]:
        """Names of the nodes ``node`` must run after (outside itself)."""
        own = node.names()
        out: set[str] = set()
        for m in node.get_nodes():
            out |= self.deps.get(m.name, set())
        return out - own

    def compute_deps(self) -> dict[str, set[str]]:
        """Ordering constraints, in creation order: read-after-write and, for buffers that a
        mutating extern kernel writes in place, write-after-read and write-after-write too
        (Note [Mutation]: a reader lowered before the mutation sees the old value)."""
        last_writer: dict[str, str] = {}
        readers: dict[str, list[str]] = {}
        deps: dict[str, set[str]] = {}
        # Note [Unbacked sizes in loopir]: a node lowered after the extern kernel that computes a
        # data-dependent size runs after it: its loops, layout or body (`x.sum() + rows.numel()`)
        # may name the size, and nothing lowered before that kernel can
        defining = set(current_sizevars().defined_by().values())
        barriers: list[str] = []
        for node in self.nodes:
            d: set[str] = set(barriers)
            if node.name in defining:
                barriers.append(node.name)
            for r in node.read_names():
                if r in last_writer:
                    d.add(last_writer[r])
                readers.setdefault(r, []).append(node.name)
            for w in node.write_names():
                if w in last_writer:
                    d.add(last_writer[w])
                d |= set(readers.get(w, ()))
                last_writer[w] = node.name
                readers[w] = []
            d.discard(node.name)
            deps[node.name] = d
        return deps

    def dead_code_elimination(self) -> None:
        """Drop nodes whose buffers nobody reads and that are not outputs (and do not mutate)."""
        needed = set(self.output_names)
        needed |= {self.aliases.get(n, n) for n in self.output_names}
        kept: list[BaseSchedulerNode] = []
        defines = set(current_sizevars().defined_by().values())  # Note [Unbacked sizes in loopir]
        for node in reversed(self.nodes):
            mutates = isinstance(node, ExternKernelSchedulerNode) and (
                _is_mutating(node.node) or node.name in defines
            )
            if mutates or node.write_names() & needed or (self.keep_index_checks and _checks_indices(node)):
                kept.append(node)
                needed |= node.read_names()
            else:
                log.debug("DCE removed %s", node.name)
        self.nodes = list(reversed(kept))
        self.writer = {w: n for n in self.nodes for w in n.write_names()}

    def compute_ancestors(self) -> None:
        by_name = {n.name: n for n in self.nodes}
        for node in self.nodes:  # creation order is topological
            anc: set[str] = set()
            for p in self.producers(node):
                anc.add(p)
                anc |= by_name[p].ancestors
            node.ancestors = anc

    # Note [Pointwise producers in a column reduction's order]
    # A bias gradient is a column sum, ``g.sum(0)`` of a [tokens, channels] gradient ``g`` that a
    # pointwise kernel produces (a GELU's backward, a view of a matmul's result scaled...). The
    # reduction's loop nest is (channels, tokens): its flat iteration ``x * tokens + r`` reads
    # ``g[r, x]``, while the producer's flat iteration writes ``g`` in memory order, so the two
    # are not aligned and ran as two kernels, ``g`` written by one and read back by the other.
    # torch.compile computes such a sum inside its producer. Here the producer is re-expressed in
    # the reduction's loop order before fusion: a :class:`~kiln_loopir.ir.ReorderedPointwise`
    # whose loop nest is the reduction's (output and reduced loops, as one pointwise nest) and
    # whose iteration ``(x, r)`` computes and stores the element the reduction reads there. It
    # then aligns with the reduction, which fuses it as a member of ``n * r`` elements: one
    # kernel writes ``g`` for its other readers and sums its columns. Only done when
    # - the backend asks for it (``Backend.reorder_for_column_reductions``: the C++ generator's
    #   column reductions vectorize over the outputs, so the reordered producer's loads are
    #   contiguous along the lanes; the Triton generator does not ask), static sizes only;
    # - the producer is one pointwise node (not a scatter) with a row-major layout and exactly
    #   as many elements as the reduction's iteration space, not already aligned with it, that
    #   calls no transcendental function: Swin's GELU backwards (erf, exp) computed in a column
    #   kernel took 3-4x their own kernel's time (kernel_time.py: 335 us against 79 us), more
    #   than the separate sum saved;
    # - the reduction's reads of it are all at one index, and that index visits every element
    #   exactly once (checked by evaluating it over the whole iteration space, up to
    #   REORDER_CHECK_LIMIT elements): the producer must still write all of its buffer;
    # - every read of the reordered producer is, along the column kernel's lanes (the innermost
    #   output loop), one vector load or one broadcast value (``_lanes_contiguous``): a
    #   transpose's read ``256*(x // 16) + x % 16`` gathers lane by lane (Swin's attention
    #   gradients: 8 us in the column kernel against 2 us for the transpose alone, whose
    #   separate sum is a contiguous column kernel of a few us; a graph of one such transpose,
    #   its sum and a matmul: 22.8 -> 29.5 us reordered);
    # - the scheduler (and the backend's veto) would then fuse the pair.
    # After reordering, a reordered producer fuses only into a kernel that holds its column
    # reduction (``_keeps_reorder_partners`` in ``can_fuse``): the greedy loop fuses the best
    # pair first, and Swin's recomputed layer norm, reordered for its weight gradient's sum,
    # first joined a row reduction reading the same inputs, whose loops then walked it with
    # strided loads and stores (57 us against 10 us). A reordered producer that fusion still
    # leaves alone (its reduction fused elsewhere first) is put back in its own order and
    # fusion runs again (``restore_unpaired_producers``), so none runs alone in the other order.
    # Its digits split the column kernel's flat position ``x0 + 32*r0``; ``drop_low_terms``
    # (indexing.py) takes ``((x0 + 32*r0) // 512) % 16`` to ``(r0 // 16) % 16`` (x0 < 32), here
    # and in the C++ kernel (else each lane divides 64-bit integers: Swin's reordered view-scatter
    # gradient ran 45 us, 15 us with the terms dropped).
    # ``Scheduler.reordered`` lists the pairs; KILN_LOG=schedule prints each.
    # Measured on Swin's training step at one thread (codegen_cpp's bench/kernel_time.py, fastest
    # call of each kernel summed) before those three rules: 143 -> 128 kernel calls, but 1.30 ->
    # 1.46 ms of kernel time; after them 143 -> 140 calls and 1.20 -> 1.18 ms, neutral within
    # the noise, so the C++ generator still leaves it off (``CppOptions.column_sum_fusion``).

    def reorder_for_column_reductions(self) -> None:
        readers: dict[str, list[SchedulerNode]] = {}
        for n in self.nodes:
            if isinstance(n, SchedulerNode):
                for name in n.read_names():
                    readers.setdefault(name, []).append(n)
        done: set[str] = set()
        for node in list(self.nodes):
            if not (isinstance(node, SchedulerNode) and node.is_reduction()):
                continue
            nx, nr = node.group()
            if not isinstance(nx, int) or not isinstance(nr, int) or nr == 1:
                continue
            for name in sorted(node.read_names()):
                # the producer of what it reads, then pointwise nodes reading the same buffer
                candidates = [self.writer.get(name), *readers.get(name, ())]
                for cand in candidates:
                    if not isinstance(cand, SchedulerNode) or cand is node or cand.name in done:
                        continue
                    made = self._reordered(cand, node, name, nx * nr)
                    if made is None:
                        continue
                    # the cycle test first: the backend's veto may cache what it saw of ``made``
                    if self.will_fusion_create_cycle(made, node) or not self.can_fuse(made, node):
                        log.debug("not reordering %s for %s: the pair would not fuse", cand.name, node.name)
                        continue
                    done.add(cand.name)
                    self.nodes = [made if n is cand else n for n in self.nodes]
                    self.writer = {w: made if n is cand else n for w, n in self.writer.items()}
                    for group in readers.values():
                        group[:] = [n for n in group if n is not cand]
                    self._groups = list(self.nodes)
                    self._owner = {n.name: n for n in self.nodes}
                    self.reordered.append((cand.name, node.name))
                    self._reorder_partner[cand.name] = (node.name, cand)
                    log.debug(
                        "reordered %s in the loop order of the column reduction %s", cand.name, node.name
                    )
                    break

    def _reordered(
        self, producer: SchedulerNode, reduction: SchedulerNode, through: str, numel: int
    ) -> SchedulerNode | None:
        """``producer`` as a :class:`ReorderedPointwise` in ``reduction``'s loop order, where
        ``reduction`` reads buffer ``through`` that ``producer`` writes, or reads at the position
        it writes its own element; None when the Note's conditions do not hold."""
        buffer = producer.node
        if (
            type(buffer) is not ComputedBuffer
            or buffer.is_reduction()
            or not isinstance(buffer.data, Pointwise)
        ):
            return None
        ranges = buffer.data.ranges
        layout = buffer.layout
        from .graph import TRANSCENDENTAL
        from .virtualized import op_names

        if op_names(buffer.data.inner_fn, [sympy.Integer(0)] * len(ranges)) & TRANSCENDENTAL:
            return None  # measured slower in a column kernel (the Note)
        if any(not sympy.sympify(s).is_Integer for s in (*ranges, *layout.stride, layout.offset)):
            return None
        if tuple(layout.size) != tuple(ranges) or int(sympy.Mul(*ranges)) != numel:
            return None
        strides = contiguous_strides(ranges)
        if any(n != 1 and st != c for n, st, c in zip(ranges, layout.stride, strides, strict=True)):
            return None
        if layout.offset != 0 or len(producer.writes) != 1 or not isinstance(producer.writes[0], MemoryDep):
            return None
        wdep = producer.writes[0]
        if through != buffer.name:
            # a horizontal partner: it must read ``through`` where it writes, in every read
            own = [d for d in producer.reads if d.name == through]
            if not own or not all(
                isinstance(d, MemoryDep) and d.canonical() == wdep.canonical() for d in own
            ):
                return None
            anchor: MemoryDep = wdep
        else:
            anchor = wdep
        reads = [d for d in reduction.reads if d.name == through]
        if not reads or not all(isinstance(d, MemoryDep) for d in reads):
            return None
        rdeps = [d for d in reads if isinstance(d, MemoryDep)]
        if len({(d.index, d.variables, d.sizes) for d in rdeps}) != 1:
            return None
        rdep = rdeps[0]
        if _aligned(anchor, producer, rdep) or not _visits_each_once(rdep, numel):
            return None
        variables, sizes, index = rdep.variables, rdep.sizes, sympy.sympify(rdep.index)
        # each digit of the element at loop position ``variables``, simplified knowing the loops
        known = dict(zip(variables, sizes, strict=True))
        digits = [
            sympy.Integer(0) if n == 1 else simplify_reordered(ModularIndexing(index, st, n), known)
            for n, st in zip(ranges, strides, strict=True)
        ]

        def offset(loop_index: Index) -> Expr:
            return index.xreplace(dict(zip(variables, loop_index, strict=True)))

        def position(loop_index: Index) -> Index:
            at = dict(zip(variables, loop_index, strict=True))
            return [d.xreplace(at) for d in digits]

        made = ReorderedPointwise(
            buffer.name,
            buffer.layout,
            data=buffer.data,
            loop_sizes=tuple(sizes),
            position=position,
            offset=offset,
        )
        reads_, writes_ = extract_read_writes(made)
        nx = len(reduction.node.iteration()[0])
        gathers = [d for d in reads_ if not _lanes_contiguous(d, nx)]
        if gathers:  # it would gather along the column kernel's lanes (the Note)
            log.debug(
                "not reordering %s for %s: it would gather %s", producer.name, reduction.name, gathers[0]
            )
            return None
        return SchedulerNode(producer.order, reads_, writes_, ancestors=set(producer.ancestors), node=made)

    # fusion ---------------------------------------------------------------------------------

    def fuse_nodes(self) -> None:
        for _ in range(MAX_ROUNDS):
            before = len(self.nodes)
            self.fuse_nodes_once()
            if len(self.nodes) == before:
                break

    def fuse_nodes_once(self) -> None:
        """One round of the greedy loop: best-scoring legal pair first."""
        owner: dict[str, BaseSchedulerNode] = {}
        for n in self.nodes:
            for m in n.get_nodes():
                owner[m.name] = n
        self._owner = owner
        self._groups = list(self.nodes)
        candidates = self.possible_fusions()
        scores = {id(pair): self.score_fusion(*pair) for pair in candidates}
        candidates.sort(key=lambda pair: scores[id(pair)], reverse=True)
        for a0, b0 in candidates:
            a, b = owner[a0.get_nodes()[0].name], owner[b0.get_nodes()[0].name]
            if a is b:
                continue
            if b.names() & a.ancestors:
                a, b = b, a
            unchanged = (a is a0 and b is b0) or (a is b0 and b is a0)
            if not unchanged and not self.can_fuse(a, b):  # possible_fusions checked the originals
                continue
            if self.will_fusion_create_cycle(a, b):
                continue
            fused = FusedSchedulerNode.fuse(a, b)
            log.debug("fuse %s + %s (score %s)", a.name, b.name, self.score_fusion(a, b))
            for m in fused.get_nodes():
                owner[m.name] = fused
            self._groups = [n for n in self._groups if n is not a and n is not b] + [fused]
            # nodes that had a or b as ancestors now have the fused node
            for n in self._groups:
                if n.ancestors & fused.names():
                    n.ancestors = (n.ancestors | fused.ancestors) - n.names()
        # each group once, in the order of its first member (a scan of the list kept so far
        # made this quadratic in the graph's nodes)
        self.nodes = list({id(n): n for n in owner.values()}.values())

    def possible_fusions(self) -> list[tuple[BaseSchedulerNode, BaseSchedulerNode]]:
        """Pairs of kernel nodes that touch a common buffer."""
        by_buffer: dict[str, list[BaseSchedulerNode]] = {}
        for n in self.nodes:
            if not n.is_kernel():
                continue
            for name in sorted(n.read_names() | n.write_names()):  # Note [Deterministic schedules]
                by_buffer.setdefault(name, []).append(n)
        pairs: dict[tuple[int, int], tuple[BaseSchedulerNode, BaseSchedulerNode]] = {}
        groups = list(by_buffer.values())
        if self.tiny_fusion:  # Note [Tiny kernels fuse without a shared buffer]
            tiny: dict[Any, list[BaseSchedulerNode]] = {}
            for n in self.nodes:
                if self._tiny(n):
                    tiny.setdefault(n.group(), []).append(n)
            groups += list(tiny.values())
        for touching in groups:
            ordered = sorted(touching, key=lambda n: n.order)
            for i, a in enumerate(ordered):
                for b in ordered[i + 1 : i + 1 + MAX_FUSION_SIZE]:
                    if a is not b and self.can_fuse(a, b):
                        pairs[(id(a), id(b))] = (a, b)
        return list(pairs.values())

    def can_fuse(self, a: BaseSchedulerNode, b: BaseSchedulerNode) -> bool:
        """Is it legal to run ``a`` then ``b`` as one kernel? (``b`` is not an ancestor of ``a``.)"""
        if a is b or not a.is_kernel() or not b.is_kernel():
            return False
        if b.names() & a.ancestors:
            return False
        if len(a.get_nodes()) + len(b.get_nodes()) > MAX_FUSION_SIZE:
            return False
        if not groups_compatible(a.group(), b.group()):
            return False
        if self._reorder_partner and not self._keeps_reorder_partners(a, b):
            return False
        vertical = bool(a.names() & b.ancestors)
        if vertical:
            if not self.can_fuse_vertical(a, b):
                return False
        elif not (self.tiny_fusion and self._tiny(a) and self._tiny(b)) and (
            not (a.read_names() & b.read_names())
            or (abs(a.order - b.order) > MAX_HORIZONTAL_DISTANCE and not self._far_output(a, b))
        ):
            return False
        return self.can_fuse_hook is None or self.can_fuse_hook(a, b)

    # Note [Tiny kernels fuse without a shared buffer]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # Horizontal fusion pairs kernels that read a common buffer, because what it saves is that
    # buffer's second read. A kernel of a handful of elements saves nothing by being read once; it
    # costs its launch: a training step of a network with BatchNorm ends its forward with one
    # ``num_batches_tracked + 1`` per BatchNorm, each a one-element kernel over its own counter
    # (ResNet-50 on the H100: 53 kernels of ~1.3 us of GPU time and ~4-5 us of host time each,
    # 53 compiled kernels too; torch.compile launches its one such kernel 53 times). Pointwise
    # kernels of at most TINY_ELEMENTS elements with the same iteration space therefore fuse
    # with each other whatever they read and however far apart they are in the graph (legality,
    # cycles and the backend's veto unchanged): one kernel, one launch. Their values are
    # unchanged (each member computes its own elements). ``PassOptions.tiny_fusion=False`` keeps
    # them apart.

    def _tiny(self, node: BaseSchedulerNode) -> bool:
        if not node.is_kernel() or node.is_reduction():
            return False
        if any(isinstance(m, SchedulerNode) and isinstance(m.node, Scatter) for m in node.get_nodes()):
            return False
        nx, nr = node.group()
        return isinstance(nx, (int, sympy.Integer)) and int(nx) <= TINY_ELEMENTS and nr == 1

    # Note [Outputs fused across the graph]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # Two kernels that only share inputs fuse horizontally when they are close in the graph's
    # order (MAX_HORIZONTAL_DISTANCE): fusing distant ones would hoist the later one's work, and
    # with it the life of what it writes, far ahead. A training forward's values that only the
    # backward reads break that pattern: a residual sum ``x + (h @ W + b)`` is inlined into the
    # layer norm that reads it, and the same sum is realized again at the graph's end, where the
    # forward returns its saved values, as a kernel of its own that re-reads ``x``, ``h @ W`` and
    # ``b`` (BART's training forward at one thread: 6 such kernels of 23, each another pass over
    # the activations its layer norm had just read). When the later kernel of the pair writes
    # only buffers that no other node reads (graph outputs: nothing waits for them), running it
    # early with the kernel that reads the same inputs lengthens no buffer's life the graph did
    # not already hold to its end, so the distance limit does not apply. Legality is unchanged
    # (cycles, the backend's veto). ``PassOptions.far_output_fusion=False`` keeps the limit.
    def _far_output(self, a: BaseSchedulerNode, b: BaseSchedulerNode) -> bool:
        """May the distant pair fuse because its later node writes graph outputs only?"""
        if not self.far_output_fusion:
            return False
        late = a if a.order > b.order else b
        names = {m.name for m in late.get_nodes()}
        if any(isinstance(m, SchedulerNode) and isinstance(m.node, Scatter) for m in late.get_nodes()):
            return False
        only = all(self._read_by.get(w, set()) <= names for w in late.write_names())
        if only:
            log.debug("far output fusion: %s (order %s) with %s (order %s)", b.name, b.order, a.name, a.order)
        return only

    def _keeps_reorder_partners(self, a: BaseSchedulerNode, b: BaseSchedulerNode) -> bool:
        """Does every reordered producer of the fused pair share it with its column reduction?
        (Note [Pointwise producers in a column reduction's order]: a reordered producer fused
        with anything else walks memory in another kernel's order.)"""
        names = a.names() | b.names()
        partner = self._reorder_partner
        return all(partner[n][0] in names for n in names if n in partner)

    def restore_unpaired_producers(self) -> bool:
        """Put back, in its own order, every reordered producer that fusion left in a kernel
        of its own (its column reduction fused elsewhere first); whether any was."""
        alone = [n for n in self.nodes if isinstance(n, SchedulerNode) and n.name in self._reorder_partner]
        if not alone:
            return False
        restored = {n.name: self._reorder_partner[n.name][1] for n in alone}
        for made in alone:
            restored[made.name].ancestors = set(made.ancestors)  # as fusion updated them
        for name in restored:
            log.debug("restored %s in its own order: its column reduction fused elsewhere", name)
            del self._reorder_partner[name]
        self.reordered = [pair for pair in self.reordered if pair[0] not in restored]
        self.nodes = [restored.get(n.name, n) if isinstance(n, SchedulerNode) else n for n in self.nodes]
        self.writer = {
            w: restored.get(n.name, n) if isinstance(n, SchedulerNode) else n for w, n in self.writer.items()
        }
        return True

    # Note [Column sums in a row kernel]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A norm's backward over ``[rows, cols]`` is a row kernel (its sums over each row, then dx)
    # and column reductions over the same operands (the weight and bias gradients, sums over the
    # rows). Their iteration spaces are ``(rows, cols)`` and ``(cols, rows)``: not compatible
    # (groups_compatible), so they run as two kernels and the operands are read twice. A backend
    # that can keep the column sums as per-column partials updated inside the row loop (C++:
    # one partial per fixed chunk of rows, combined in chunk order after the loop) may take the
    # pair as one node: after greedy fusion, a kernel node whose members are all reductions of
    # ``(c, r)`` and a reduction kernel node of ``(r, c)`` that share a read, with no dependency
    # either way (directly or through a third node), become a RowColumnSchedulerNode when the
    # backend's hook agrees (``Backend.row_column_hook``; None by default, so the Triton
    # generator's schedule is unchanged). Pairs that save the most bytes go first.
    def fuse_rows_with_columns(self, hook: RowColumnHook) -> None:
        """Note [Column sums in a row kernel]."""
        while True:
            owner = {m.name: n for n in self.nodes for m in n.get_nodes()}
            self._owner = owner
            best: tuple[int, BaseSchedulerNode, BaseSchedulerNode] | None = None
            for column in self.nodes:
                if not self._column_node(column):
                    continue
                cols, rows = column.group()
                for row in self.nodes:
                    if row is column or isinstance(row, RowColumnSchedulerNode) or not row.is_kernel():
                        continue
                    if not row.is_reduction() or row.group() != (rows, cols):
                        continue
                    if not (row.read_names() & column.read_names()):
                        continue
                    if row.names() & column.ancestors or column.names() & row.ancestors:
                        continue
                    if len(row.get_nodes()) + len(column.get_nodes()) > MAX_FUSION_SIZE:
                        continue
                    if self.will_fusion_create_cycle(row, column) or self.will_fusion_create_cycle(
                        column, row
                    ):
                        continue
                    saved = self.bytes_saved(row, column)
                    if (best is None or saved > best[0]) and hook(row, column):
                        best = (saved, row, column)
            if best is None:
                return
            _, row, column = best
            names = row.names() | column.names()
            fused = RowColumnSchedulerNode(
                order=min(row.order, column.order),
                reads=[*row.reads, *column.reads],
                writes=[*row.writes, *column.writes],
                ancestors=(row.ancestors | column.ancestors) - names,
                snodes=[*row.get_nodes(), *column.get_nodes()],
                columns=column.names(),
            )
            log.debug("row kernel %s takes the column sums %s", row.name, column.name)
            self.nodes = [n for n in self.nodes if n is not row and n is not column] + [fused]
            for n in self.nodes:
                if n.ancestors & names:
                    n.ancestors = (n.ancestors | fused.ancestors) - n.names()

    @staticmethod
    def _column_node(node: BaseSchedulerNode) -> bool:
        """Is ``node`` a kernel of reductions of one group only (a column-sum candidate)?"""
        if not node.is_kernel() or isinstance(node, (RowColumnSchedulerNode, TemplateSchedulerNode)):
            return False
        members = node.get_nodes()
        group = node.group()
        if group[1] == 1 or group[0] == 1:
            return False
        return all(isinstance(m, SchedulerNode) and m.is_reduction() and m.group() == group for m in members)

    def can_fuse_vertical(self, a: BaseSchedulerNode, b: BaseSchedulerNode) -> bool:
        """Every read by ``b`` of a buffer ``a`` writes sees a value already computed."""
        writes = {d.name: (d, m) for m in a.get_nodes() for d in m.writes}
        for reader in b.get_nodes():
            for dep in reader.reads:
                if dep.name not in writes:
                    continue
                wdep, writer = writes[dep.name]
                if isinstance(dep, StarDep) or isinstance(wdep, StarDep):
                    return False
                if not _aligned(wdep, writer, dep):
                    return False
        return True

    def will_fusion_create_cycle(self, a: BaseSchedulerNode, b: BaseSchedulerNode) -> bool:
        """True when some third (possibly fused) node depends on ``a`` and ``b`` depends on it."""
        a_names = a.names()
        seen: set[int] = set()
        for name in b.ancestors - a_names:
            node = self._owner.get(name)
            if node is None or node is a or node is b or id(node) in seen:
                continue
            seen.add(id(node))
            if node.ancestors & a_names:
                return True
        return False

    def score_fusion(self, a: BaseSchedulerNode, b: BaseSchedulerNode) -> tuple[int, int, int]:
        """(same reduction-ness, bytes of traffic saved, -distance in the original order)."""
        return (int(a.is_reduction() == b.is_reduction()), self.bytes_saved(a, b), -abs(a.order - b.order))

    def bytes_saved(self, a: BaseSchedulerNode, b: BaseSchedulerNode) -> int:
        shared = (a.write_names() & b.read_names()) | (a.read_names() & b.read_names())
        total = 0
        for name in shared:
            nbytes = self.nbytes(name)
            total += 2 * nbytes if name in a.write_names() else nbytes
        return total

    def nbytes(self, name: str) -> int:
        buffer = self.name_to_buffer.get(name)
        return buffer.layout.nbytes() if buffer is not None else 0

    # templates ------------------------------------------------------------------------------

    def form_templates(self, accept: TemplateHook) -> None:
        """Pair an extern node with the one kernel that reads its only result into a
        :class:`TemplateSchedulerNode` wherever ``accept(extern, kernel)`` (the backend's
        ``template_epilogue``) says so. Only when the result is no graph output, nothing else
        reads it, and no third node runs between the two (it would have to run before and
        after the pair)."""
        readers: dict[str, list[BaseSchedulerNode]] = {}
        for n in self.nodes:
            for r in n.read_names():
                readers.setdefault(r, []).append(n)
        owner = {m.name: n for n in self.nodes for m in n.get_nodes()}
        replaced: dict[int, BaseSchedulerNode] = {}
        for e in self.nodes:
            if not isinstance(e, ExternKernelSchedulerNode) or len(e.write_names()) != 1:
                continue
            (out,) = e.write_names()
            users = readers.get(out, [])
            if out in self.output_names or len(users) != 1 or not users[0].is_kernel():
                continue
            k = users[0]
            if id(k) in replaced or isinstance(k, TemplateSchedulerNode):
                continue
            between = {id(owner[a]) for a in k.ancestors if a in owner} - {id(e), id(k)}
            if any(e.name in owner_node.ancestors for owner_node in self.nodes if id(owner_node) in between):
                continue
            if not accept(e, k):
                continue
            names = {e.name, *k.names()}
            node = TemplateSchedulerNode(
                order=e.order,
                reads=[*e.reads, *k.reads],
                writes=[*e.writes, *k.writes],
                ancestors=(e.ancestors | k.ancestors) - names,
                snodes=[e, *k.get_nodes()],
                extern=e,
                epilogue=k,
            )
            log.debug("template: %s with epilogue %s", e.name, k.name)
            replaced[id(e)] = replaced[id(k)] = node
        if replaced:
            nodes: list[BaseSchedulerNode] = []
            for n in self.nodes:
                new = replaced.get(id(n), n)
                if all(new is not m for m in nodes):
                    nodes.append(new)
            self.nodes = nodes

    # order and buffers ----------------------------------------------------------------------

    # Note [Deterministic schedules]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # The generated code of a graph must not depend on the process that compiled it: Python
    # salts the hash of every string per process (PYTHONHASHSEED), so a set of buffer or node
    # names iterates in another order in every process, and so does a set of objects hashed by
    # address. Where such an order decides anything, it is a tie-break, and ties are common:
    # T5's training backward, compiled for the GPU, came out in another kernel order in each
    # process (``scripts/compile_time_probe.py --model t5 --dump`` under PYTHONHASHSEED 0..2:
    # three different wrappers): no disk cache hit across processes, no comparing two runs'
    # code, and a failure that depends on the order comes and goes. Two places
    # met such ties: the topological sort visits a node's producers by position, and late
    # placement (Note [Kernels placed where they are first needed]) gives every producer that
    # only one node waits for that node's position, so the producers of a fused kernel tied and
    # ran in their set's order; now they run in graph order (their earliest member's), then by
    # name. ``possible_fusions`` collected candidate pairs per buffer in the order of each
    # node's set of buffer names, and the greedy loop's stable sort keeps that order among
    # pairs of one score (of equal bytes and distance, a pointwise kernel between two
    # reductions it could join); the names are now walked sorted. Sets elsewhere in the
    # scheduler answer membership, or are sorted before they are walked.
    # ``test_deterministic_schedule.py`` compiles graphs with such ties in processes of
    # several hash seeds.

    def topological_sort(self, nodes: list[BaseSchedulerNode]) -> list[BaseSchedulerNode]:
        owner = {m.name: n for n in nodes for m in n.get_nodes()}
        done: set[int] = set()
        result: list[BaseSchedulerNode] = []
        position = {id(n): n.order for n in nodes}

        def producer_key(name: str) -> tuple[int, int, str]:
            # Note [Deterministic schedules]: producers at one position in their graph order
            node = owner.get(name)
            return (position[id(node)], node.order, name) if node is not None else (0, -1, name)

        def visit(n: BaseSchedulerNode) -> None:
            if id(n) in done:
                return
            done.add(id(n))
            for p in sorted(self.producers(n), key=producer_key):
                if p in owner:
                    visit(owner[p])
            result.append(n)

        for n in sorted(nodes, key=lambda n: n.order):
            visit(n)
        if not self.late_placement:
            return result
        # Note [Kernels placed where they are first needed]
        late = self._late_positions(result, owner)
        if late == position:
            return result
        position = late
        done.clear()
        ordered, result = result, []
        for n in sorted(ordered, key=lambda n: (position[id(n)], n.order)):
            visit(n)
        moved = sum(a is not b for a, b in zip(ordered, result, strict=True))
        log.debug("late placement: %d of %d nodes run at another step", moved, len(result))
        return result

    # Note [Kernels placed where they are first needed]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # Nodes are created in the graph's order, and a fused kernel takes its earliest member's
    # place (``order``). Sorting by that place ran work far from where its results are read:
    # (a) a backward graph recomputes forward values (the partitioner's rematerialization) at
    # the forward's place of the values, i.e. at the backward's very start, and their readers
    # may come at its end (ConvNeXt's first stage: a GELU recomputed at step 0, read by a
    # weight-gradient GEMM 60 steps later, evicted from the caches by then); (b) a fused kernel
    # with an early member pulled its late members' producers ahead of everything between
    # (a bias gradient's sum fused with a layer norm's weight gradients pulled a depthwise
    # convolution backward ahead of a weight-gradient GEMM, which then read its operands from
    # memory: ``bench/extern_audit.py``, the same GEMM 40 us in eager, 95 us in kiln).
    # Instead each node gets a position, computed from the last node back: the smallest
    # position of the nodes that must run after it (its readers, and the writers ordered
    # after it by Note [Mutation]); a node that writes a graph output, that nothing waits
    # for, or that is an extern call also keeps its own place in the graph (the latest of its
    # members'), so extern calls and gradients stay in the order eager's autograd engine ran
    # them. Nodes are then visited by position, producers first, as before: a value is
    # computed just before its first reader. ``PassOptions.late_placement=False``: the order
    # of the earliest members. KILN_LOG=schedule prints how many nodes moved.
    def _late_positions(
        self, nodes: list[BaseSchedulerNode], owner: dict[str, BaseSchedulerNode]
    ) -> dict[int, int]:
        waiting: dict[int, list[BaseSchedulerNode]] = {id(n): [] for n in nodes}
        for n in nodes:
            for p in self.producers(n):
                if p in owner:
                    waiting[id(owner[p])].append(n)
        position: dict[int, int] = {}
        for n in reversed(nodes):  # topological: every node waiting for n comes after it
            own = max(m.order for m in n.get_nodes())
            anchored = (
                isinstance(n, ExternKernelSchedulerNode)
                or not waiting[id(n)]
                or bool(n.write_names() & self.output_names)
            )
            after = [position[id(w)] for w in waiting[id(n)]]
            position[id(n)] = min([*after, *([own] if anchored else [])])
        return position

    def plan_buffers(self) -> BufferPlan:
        plan = BufferPlan()
        readers = self._readers()
        last_read: dict[str, int] = {}
        for step, node in enumerate(self.nodes):
            for r in node.read_names():
                last_read[self.aliases.get(r, r)] = step
        pool: dict[tuple[Any, int], list[str]] = {}
        keep = set(self.output_names) | {self.aliases.get(n, n) for n in self.output_names}
        # an extern op that returns a view (diagonal, unfold, ...) keeps its input's memory alive
        # for as long as the view lives: never hand such memory to another buffer.
        # ``made``: extern results a kernel may take over in place (Note [A kernel's output in
        # place of an input that dies in it]), with the kernels' allocated buffers; ``barred``:
        # never taken over; ``taken``: those already taken over
        made: set[str] = set()
        for node in self.nodes:
            if isinstance(node, ExternKernelSchedulerNode) and _returns_alias(node.node):
                keep |= {self.aliases.get(n, n) for n in node.read_names()}
            elif isinstance(node, ExternKernelSchedulerNode) and not _is_mutating(node.node):
                made |= {o.name for o in node.node.outputs}
        barred = keep | set(self.aliases) | set(self.aliases.values())
        taken: set[str] = set()
        for step, node in enumerate(self.nodes):
            written = node.write_names()
            for m in node.get_nodes():
                if not isinstance(m, SchedulerNode | NopKernelSchedulerNode) or isinstance(m.node, Scatter):
                    continue
                name = m.node.name
                if (
                    isinstance(node, FusedSchedulerNode)
                    and readers.get(name, set()) <= {id(node)}
                    and name not in keep
                ):
                    plan.internal.setdefault(step, []).append(name)
                    continue
                key = (m.node.layout.dtype, _as_int(m.node.layout.storage_size()))
                source = (
                    self._inplace_source(node, m, step, last_read, barred, (made, plan.allocate), taken)
                    if self.inplace
                    else None
                )
                if source is not None:
                    taken.add(source)
                    plan.allocate[name] = plan.inplace[name] = source
                    log.debug("in place: %s takes over %s, which dies in its kernel", name, source)
                    continue
                free = pool.get(key)
                plan.allocate[name] = free.pop() if free else None
            # a Scatter's name and the buffer it writes are one memory, freed once (a dead
            # Scatter, Note [Dead index writes keep their bounds check], is its buffer's last
            # reader: freed twice, two later buffers took over the same memory)
            for name in sorted({self.aliases.get(t, t) for t in set(node.read_names()) | written}):
                buffer = self.name_to_buffer.get(name)
                if (
                    isinstance(buffer, ComputedBuffer)
                    and name in plan.allocate
                    and name not in keep
                    and name not in taken
                    and last_read.get(name, step) <= step
                ):
                    plan.free_after.setdefault(step, []).append(name)
                    key = (buffer.layout.dtype, _as_int(buffer.layout.storage_size()))
                    pool.setdefault(key, []).append(name)
        return plan

    # Note [A kernel's output in place of an input that dies in it]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # The pool above hands a new buffer the memory of one freed *before* its kernel. A kernel
    # may also write its output over an input it reads for the last time, as eager's in-place
    # ops do: T5's ReLU after the FFN's first GEMM wrote a second 1 MB buffer (4 x 92 us at one
    # thread) where torch.compile writes over the GEMM's result (4 x 24 us): the new buffer's
    # pages and cache lines are what cost (eager's own ``clamp_min`` into a new buffer 58.7 us,
    # in place 25.1 us). The output takes over the input when:
    # * the input is a buffer this graph made: a kernel's (allocated, not kernel-internal) or an
    #   extern call's that neither mutates nor returns a view; never a graph input or constant,
    #   a graph output, a buffer a view-returning extern reads, or one a Scatter mutates;
    # * this kernel is its last reader, and nothing took it over already;
    # * the same dtype and storage size (then the write's offsets are the reads' offsets);
    # * the kernel is pointwise (no reduction, no Scatter), every member that reads the input
    #   reads it at the write's index (canonical MemoryDeps equal: no shifted, transposed or
    #   broadcast read), and none comes after the writing member: each element is read only in
    #   the iteration that overwrites it, before the store (the code generators emit members in
    #   order, loads before the store).
    # Only backends that say they can take two names for one memory (``Backend.inplace_buffers``:
    # the C++ generator drops ``__restrict__`` from the pair) get such plans;
    # ``PassOptions.inplace_reuse=False`` turns it off. KILN_LOG=schedule prints each one.
    def _inplace_source(
        self,
        node: BaseSchedulerNode,
        member: BaseSchedulerNode,
        step: int,
        last_read: dict[str, int],
        barred: set[str],
        made: tuple[Set[str], Mapping[str, str | None]],
        taken: set[str],
    ) -> str | None:
        """The input ``member``'s buffer may take over in place (the Note above), or None."""
        if isinstance(node, TemplateSchedulerNode) or not isinstance(member, SchedulerNode):
            return None
        parts = node.get_nodes()
        if any(
            not isinstance(p, SchedulerNode) or p.is_reduction() or isinstance(p.node, Scatter) for p in parts
        ):
            return None
        name = member.node.name
        wdeps = [d for d in member.writes if d.name == name]
        if len(wdeps) != 1 or not isinstance(wdeps[0], MemoryDep):
            return None
        wdep, layout = wdeps[0], member.node.layout
        position = parts.index(member)
        written = node.write_names()
        for source in sorted(member.read_names()):
            buffer = self.name_to_buffer.get(source)
            if (
                buffer is None
                or not (source in made[0] or source in made[1])
                or source in barred
                or source in taken
                or source in written
                or last_read.get(source) != step
                or buffer.layout.dtype != layout.dtype
                or _as_int(buffer.layout.storage_size()) != _as_int(layout.storage_size())
            ):
                continue
            ok = True
            for i, p in enumerate(parts):
                deps = [d for d in p.reads if d.name == source]
                if not deps:
                    continue
                if i > position or any(
                    not isinstance(d, MemoryDep) or d.canonical() != wdep.canonical() for d in deps
                ):
                    ok = False
                    break
            if ok:
                return source
        return None

    def _readers(self) -> dict[str, set[int]]:
        readers: dict[str, set[int]] = {}
        for node in self.nodes:
            for r in node.read_names():
                readers.setdefault(r, set()).add(id(node))
        return readers

    # reporting ------------------------------------------------------------------------------

    def kernels(self) -> list[BaseSchedulerNode]:
        return [n for n in self.nodes if isinstance(n, SchedulerNode | FusedSchedulerNode)]

    def kernel_bytes(self, node: BaseSchedulerNode) -> int:
        """Estimated bytes a kernel reads and writes in memory (internal buffers excluded)."""
        internal = node.write_names() if isinstance(node, FusedSchedulerNode) else set()
        if self._reader_cache is None:
            self._reader_cache = self._readers()
        readers = self._reader_cache
        internal = {n for n in internal if readers.get(n, set()) <= {id(node)} and n not in self.output_names}
        reads = node.read_names() - node.write_names()
        writes = node.write_names() - internal
        return sum(self.nbytes(n) for n in reads | writes)

    def extern_bytes(self, node: ExternKernelSchedulerNode) -> int:
        return sum(self.nbytes(n) for n in node.read_names() | node.write_names())

    def describe(self) -> str:
        lines = []
        for step, n in enumerate(self.nodes):
            kind = type(n).__name__.replace("SchedulerNode", "")
            members = ", ".join(m.name for m in n.get_nodes())
            lines.append(f"{step:3d} {kind or 'Kernel'}: {members}")
        return "\n".join(lines)


REORDER_CHECK_LIMIT = 1 << 24


def _lanes_contiguous(dep: Dep, nx: int) -> bool:
    """Is a reordered producer's read, in a column kernel whose lanes run along the innermost of
    the first ``nx`` (output) loops, one vector load or one broadcast value: ``c*v + rest`` with
    ``c`` 0 or 1 in that loop variable ``v`` and ``rest`` free of it? (Note [Pointwise producers
    in a column reduction's order]: anything else, a transpose's ``256*(v // 16) + v % 16``,
    is a gather per lane, which ran Swin's reordered transposes slower than the transpose and
    its separate sum.)"""
    if not isinstance(dep, MemoryDep):
        return False
    lane = next(
        (v for v, n in zip(reversed(dep.variables[:nx]), reversed(dep.sizes[:nx]), strict=True) if n != 1),
        None,
    )
    if lane is None:
        return True
    index = simplify_reordered(sympy.sympify(dep.index), dict(zip(dep.variables, dep.sizes, strict=True)))
    if lane not in index.free_symbols:
        return True
    index = sympy.expand(index)
    coeff = index.coeff(lane)
    return coeff == 1 and lane not in (index - coeff * lane).free_symbols


def _visits_each_once(dep: MemoryDep, numel: int) -> bool:
    """Does ``dep.index`` over its loops take each value of ``[0, numel)`` exactly once?
    Evaluated over the whole iteration space (Note [Pointwise producers in a column reduction's
    order]); False when it cannot be evaluated or the space is too large to check."""
    if not dep.sizes or numel > REORDER_CHECK_LIMIT or int(sympy.Mul(*dep.sizes)) != numel:
        return False
    shape = [int(s) for s in dep.sizes]
    env = {}
    for i, v in enumerate(dep.variables):
        view = [1] * len(shape)
        view[i] = shape[i]
        env[v] = torch.arange(shape[i], dtype=torch.int64).view(view)

    def value(e: Any) -> Any:
        if e.is_Integer:
            return int(e)
        if isinstance(e, sympy.Symbol):
            return env[e]
        if isinstance(e, sympy.Add):
            return functools.reduce(lambda a, b: a + b, [value(a) for a in e.args])
        if isinstance(e, sympy.Mul):
            return functools.reduce(lambda a, b: a * b, [value(a) for a in e.args])
        if isinstance(e, FloorDiv):
            return value(e.args[0]) // value(e.args[1])
        if isinstance(e, ModularIndexing):
            return (value(e.args[0]) // value(e.args[1])) % value(e.args[2])
        raise ValueError(e)

    try:
        flat = torch.as_tensor(value(sympy.sympify(dep.index)), dtype=torch.int64).expand(shape).reshape(-1)
    except (ValueError, KeyError, TypeError, RuntimeError):
        return False
    if int(flat.min()) < 0:
        return False
    counts = torch.bincount(flat, minlength=numel)
    return len(counts) == numel and bool((counts == 1).all())


def _aligned(wdep: MemoryDep, writer: BaseSchedulerNode, rdep: Dep) -> bool:
    """Does the reader's iteration read exactly what the writer's same iteration wrote?

    Equal iteration sizes: the merged accesses must be equal. A reader with more iterations (a
    loop over reduced positions) may read a completed value only through its outer positions:
    its leading loops must multiply to the writer's size, and the rest may not move the index.
    """
    assert isinstance(rdep, MemoryDep)
    n_out, n_in = sympy.Mul(*wdep.sizes), sympy.Mul(*rdep.sizes)
    if n_in == n_out:
        return wdep.canonical() == rdep.canonical()
    if n_in.is_Integer and n_out.is_Integer:
        if int(n_in) <= int(n_out):
            return False
    elif sympy.expand(n_in - n_out) == 0:
        # symbolic (Note [Symbolic sizes in loopir]): the same size spelled differently; else the
        # reader's leading loops must multiply to the writer's size, checked below as for ints
        return False
    prefix, running = 0, sympy.Integer(1)
    while prefix < len(rdep.sizes) and running != n_out:
        running *= rdep.sizes[prefix]
        prefix += 1
    if running != n_out:
        return False
    if rdep.index.free_symbols & set(rdep.variables[prefix:]):
        return False
    prefix_dep = MemoryDep(rdep.name, rdep.index, rdep.variables[:prefix], rdep.sizes[:prefix])
    return wdep.canonical() == prefix_dep.canonical()


# Note [Dead index writes keep their bounds check]: an index write whose result nothing reads
# (`x.index_put_(i, v)` then `x.zero_()`, test_alias_fuzz.py seed 30289) raises IndexError in
# eager for an index out of range, and a compiled program that dropped it returned a value
# instead (torch.compile does too). Silently accepting an out-of-range index is worse than
# raising, and dead index writes are rare in real programs (a graph without one pays nothing),
# so dead-code elimination keeps a scatter that checks its indices, with what it reads, at the
# cost of running it, where the code generator checks indirect indices
# (`Backend.checks_indices`: C++ and the reference interpreter always, Triton under its
# interpreter or in debug mode; on a GPU otherwise a kept scatter would store out of range
# unchecked, so it is dropped as before). A gather is a pointwise node inlined into its readers or, read by none,
# never realized; kiln_aotgrad leaves a check of its own for a gather nobody reads (its Note
# [Dead gathers keep their bounds check]).
def _checks_indices(node: BaseSchedulerNode) -> bool:
    """Whether ``node`` is a scatter whose indirect index is bounds-checked (Note [Dead index
    writes keep their bounds check])."""
    if not (isinstance(node, SchedulerNode) and isinstance(node.node, Scatter)):
        return False
    return _record(node.node).checked


def _returns_alias(kernel: ExternKernel) -> bool:
    schema = getattr(kernel.op, "_schema", None)
    if schema is None:
        return True  # unknown callable: assume the worst
    return any(r.alias_info is not None for r in schema.returns)


def _is_mutating(kernel: ExternKernel) -> bool:
    """Whether dead-code elimination must keep ``kernel`` although nothing reads its result: it
    mutates an input, or its effect is the program's (Note [Extern calls kept for their effect])."""
    if kernel.op in _EFFECTFUL:
        return True
    schema = getattr(kernel.op, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


# Note [Extern calls kept for their effect]: a run-time assertion returns nothing, and what it does
# (raise when its condition is false) is the program's behaviour: ``torch._assert_async`` dropped as
# dead code turned a program that raises in eager into one that returns (a wrong answer, found by
# the thirteenth session's breadth work on llava's image-token check). aotgrad keeps such nodes in
# its graph; the scheduler keeps their extern calls.
_EFFECTFUL = frozenset(
    op
    for name, overload in (
        ("_assert_async", "default"),
        ("_assert_async", "msg"),
        ("_assert_scalar", "default"),
        ("_assert_tensor_metadata", "default"),
        ("_print", "default"),
    )
    if (op := getattr(getattr(torch.ops.aten, name, None), overload, None)) is not None
)


def output_buffer_names(outputs: Any) -> list[str]:
    """Names of the buffers a graph's outputs live in."""
    names: list[str] = []

    def visit(v: Any) -> None:
        if isinstance(v, ReinterpretView):
            names.append(v.buffer.name)
        elif isinstance(v, Buffer):
            names.append(v.name)
        elif isinstance(v, list | tuple):
            for x in v:
                visit(x)

    visit(outputs)
    return names
