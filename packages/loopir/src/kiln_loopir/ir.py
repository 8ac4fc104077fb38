"""The loop-level IR: lazy loops, buffers, views and the boxes that tie them together.

A value produced by a lowering is a :class:`TensorBox`. Inside is either a view (an index
remapping over something else, never a copy) or a :class:`StorageBox`, and inside the storage box
either a lazy loop nest (:class:`Pointwise` or :class:`Reduction`: an ``inner_fn`` over the
virtualized ``ops``) or a :class:`Buffer` that will exist in memory.

Note [Inlining and realization]: a consumer reads a value through ``make_loader()``, which for a
lazy Pointwise is the producer's ``inner_fn`` itself, so chains of pointwise ops compose into one
function and never touch memory in between. ``StorageBox.realize()`` ends that: it wraps the loops
in a :class:`ComputedBuffer`, registers it with the graph under a name, and from then on readers
``ops.load`` it. The graph decides when (see ``graph.GraphLowering.mark_reuse``): graph outputs,
reductions, inputs of extern kernels, values with many readers or a large body.

Buffers are the scheduler's units: a :class:`ComputedBuffer` (loops to run), a :class:`Scatter`
(a computed buffer that writes into another one at computed positions), an
:class:`ExternKernel` (a call to an aten op at run time, with one or more :class:`ExternOutput`
buffers), or an :class:`InputBuffer` / :class:`ConstantBuffer` (exists before the graph runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from .indexing import Expr, as_strided_params, loop_vars, simplify_index
from .layout import FixedLayout, FlexibleLayout, Layout, flexible
from .origins import NO_ORIGINS, Origin
from .origins import current as current_origins
from .origins import current_own as current_own_origin
from .virtualized import current_graph, ops

Index = Sequence[Expr]
Loader = Callable[[Index], Any]
ReductionLoader = Callable[[Index, Index], Any]


class IRNode:
    """Anything a TensorBox can hold: answers size/dtype/device and gives a loader."""

    def get_size(self) -> tuple[Expr, ...]:
        raise NotImplementedError

    def get_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def get_device(self) -> torch.device:
        raise NotImplementedError

    def make_loader(self) -> Loader:
        raise NotImplementedError

    def numel(self) -> Expr:
        return sympy.Mul(*self.get_size())


# --------------------------------------------------------------------------------------------
# lazy loops


@dataclass(frozen=True, slots=True)
class Pointwise(IRNode):
    """``out[index] = inner_fn(index)`` over ``ranges``."""

    device: torch.device
    dtype: torch.dtype
    inner_fn: Loader
    ranges: tuple[Expr, ...]
    # Note [Origins]: the fx nodes this loop nest computes
    origins: frozenset[Origin] = field(default_factory=current_origins, compare=False, repr=False)

    def get_size(self) -> tuple[Expr, ...]:
        return self.ranges

    def get_dtype(self) -> torch.dtype:
        return self.dtype

    def get_device(self) -> torch.device:
        return self.device

    def make_loader(self) -> Loader:
        return self.inner_fn


# reductions whose value is a (mean, m2, weight) triple; ``output_index`` picks one
WELFORD = ("welford_reduce", "welford_combine")


@dataclass(frozen=True, slots=True)
class Reduction(IRNode):
    """``out[index] = reduce(inner_fn(index, rindex) for rindex in reduction_ranges)``.

    ``welford_reduce`` yields (mean, m2, weight); ``output_index`` picks one of them, so a
    mean and a variance are two Reductions that the scheduler fuses into one pass.
    ``welford_combine`` reduces such triples (its ``inner_fn`` returns three values) into one.
    """

    device: torch.device
    dtype: torch.dtype
    inner_fn: ReductionLoader
    ranges: tuple[Expr, ...]
    reduction_ranges: tuple[Expr, ...]
    reduction_type: str
    src_dtype: torch.dtype
    output_index: int = 0
    origins: frozenset[Origin] = field(default_factory=current_origins, compare=False, repr=False)

    def get_size(self) -> tuple[Expr, ...]:
        return self.ranges

    def get_dtype(self) -> torch.dtype:
        return self.dtype

    def get_device(self) -> torch.device:
        return self.device

    def make_loader(self) -> Loader:
        raise RuntimeError("a Reduction is read only after it is realized")


# --------------------------------------------------------------------------------------------
# buffers


@dataclass(frozen=True, slots=True)
class Buffer(IRNode):
    """A named region of memory with a layout."""

    name: str
    layout: Layout

    def get_size(self) -> tuple[Expr, ...]:
        return self.layout.size

    def get_dtype(self) -> torch.dtype:
        return self.layout.dtype

    def get_device(self) -> torch.device:
        return self.layout.device

    def make_loader(self) -> Loader:
        name, layout = self.name, self.layout

        def load(index: Index) -> Any:
            return ops.load(name, layout.indexer(index))

        return load


@dataclass(frozen=True, slots=True)
class InputBuffer(Buffer):
    """A graph input."""


@dataclass(frozen=True, slots=True)
class ConstantBuffer(Buffer):
    """A tensor attribute of the graph module (``get_attr``)."""

    value: torch.Tensor = field(repr=False, default_factory=lambda: torch.empty(0))


@dataclass(frozen=True, slots=True)
class ComputedBuffer(Buffer):
    """Loops whose results are stored in this buffer: one scheduler node."""

    data: Pointwise | Reduction = field(repr=False, default=None)  # type: ignore[assignment]

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def iteration(self) -> tuple[tuple[Expr, ...], tuple[Expr, ...]]:
        """(ranges, reduction ranges) of the loop nest."""
        if isinstance(self.data, Reduction):
            return self.data.ranges, self.data.reduction_ranges
        return self.data.ranges, ()

    def body(self) -> Callable[[Index, Index], None]:
        """The loop body: computes and stores one element (or one reduced element)."""
        name, layout, data = self.name, self.layout, self.data
        if isinstance(data, Reduction):
            red: Reduction = data

            def reduce_body(index: Index, rindex: Index) -> None:
                value = red.inner_fn(index, rindex)
                result = ops.reduction(red.dtype, red.src_dtype, red.reduction_type, value)
                if red.reduction_type in WELFORD:
                    result = ops.getitem(result, red.output_index)
                ops.store_reduction(name, layout.indexer(index), result)

            return reduce_body
        point: Pointwise = data

        def point_body(index: Index, rindex: Index) -> None:
            ops.store(name, layout.indexer(index), point.inner_fn(index))

        return point_body


@dataclass(frozen=True, slots=True)
class ReorderedPointwise(ComputedBuffer):
    """A pointwise buffer computed in another loop order: Note [Pointwise producers in a column
    reduction's order] (scheduler.py). The loop nest is ``loop_sizes``; at its ``index`` the
    element ``position(index)`` of ``data`` is computed and stored at memory offset
    ``offset(index)`` (the layout's offset of that element)."""

    loop_sizes: tuple[Expr, ...] = ()
    position: Callable[[Index], Index] = field(repr=False, default=lambda index: index)
    offset: Callable[[Index], Expr] = field(repr=False, default=lambda index: sympy.Integer(0))

    def iteration(self) -> tuple[tuple[Expr, ...], tuple[Expr, ...]]:
        return self.loop_sizes, ()

    def body(self) -> Callable[[Index, Index], None]:
        name, data, position, offset = self.name, self.data, self.position, self.offset
        assert isinstance(data, Pointwise)

        def reordered_body(index: Index, rindex: Index) -> None:
            ops.store(name, offset(index), data.inner_fn(position(index)))

        return reordered_body


@dataclass(frozen=True, slots=True)
class Scatter(ComputedBuffer):
    """Writes ``data`` into the storage of buffer ``mutates`` at ``output_indexer(index)``.

    The node's own name aliases ``mutates``' memory (a functional scatter is a copy of ``self``
    followed by this node). ``mode="atomic_add"`` accumulates instead of overwriting.
    """

    mutates: str = ""
    output_indexer: Callable[[Index], Index] = field(repr=False, default=lambda index: index)
    mode: str | None = None

    def body(self) -> Callable[[Index, Index], None]:
        name, layout, data, out = self.name, self.layout, self.data, self.output_indexer
        assert isinstance(data, Pointwise)
        mode = self.mode

        def scatter_body(index: Index, rindex: Index) -> None:
            value = data.inner_fn(index)
            ops.store(name, layout.indexer(out(index)), value, mode)

        return scatter_body


@dataclass(frozen=True, slots=True)
class ExternOutput(Buffer):
    """One tensor returned by an extern kernel; ``path`` indexes into its result."""

    kernel: str = ""
    path: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ExternKernel:
    """A call of an aten op (or any callable) at run time, on realized buffers.

    ``args``/``kwargs`` hold buffers (:class:`Buffer` or :class:`ReinterpretView`) where the op
    takes tensors; the runtime substitutes the tensors.
    """

    name: str
    op: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: tuple[ExternOutput, ...]

    def input_names(self) -> list[str]:
        names: list[str] = []

        def visit(value: Any) -> None:
            if isinstance(value, Buffer):
                names.append(value.name)
            elif isinstance(value, ReinterpretView):
                names.append(value.buffer.name)
            elif isinstance(value, list | tuple):
                for v in value:
                    visit(v)

        visit(self.args)
        visit(list(self.kwargs.values()))
        return names


Operation = ComputedBuffer | ExternKernel


# --------------------------------------------------------------------------------------------
# views: index remapping, no copies


@dataclass(frozen=True, slots=True)
class View(IRNode):
    """``self[index] = base[reindex(index)]``: every view op is one of these."""

    base: IRNode
    size: tuple[Expr, ...]
    reindex: Callable[[Index], Index]
    # the view's own node only: what it carries depends on its base now (Note [Origins])
    origins: frozenset[Origin] = field(default_factory=current_own_origin, compare=False, repr=False)

    def get_size(self) -> tuple[Expr, ...]:
        return self.size

    def get_dtype(self) -> torch.dtype:
        return self.base.get_dtype()

    def get_device(self) -> torch.device:
        return self.base.get_device()

    def make_loader(self) -> Loader:
        inner = self.base.make_loader()
        reindex = self.reindex

        def load(index: Index) -> Any:
            return inner(reindex(index))

        return load


@dataclass(frozen=True, slots=True)
class ReinterpretView(IRNode):
    """A realized buffer seen through another strided layout (what ``as_strided`` gives)."""

    buffer: Buffer
    layout: FixedLayout

    def get_size(self) -> tuple[Expr, ...]:
        return self.layout.size

    def get_dtype(self) -> torch.dtype:
        return self.layout.dtype

    def get_device(self) -> torch.device:
        return self.layout.device

    def make_loader(self) -> Loader:
        name, layout = self.buffer.name, self.layout

        def load(index: Index) -> Any:
            return ops.load(name, layout.indexer(index))

        return load


# --------------------------------------------------------------------------------------------
# boxes


class StorageBox(IRNode):
    """Holds lazy loops until they are realized into a buffer (then holds the buffer)."""

    __slots__ = ("data", "stride_hint")

    def __init__(self, data: IRNode) -> None:
        self.data = data
        # strides eager would give this value (set by the graph from the node's meta value):
        # when realized, the buffer takes them, so stride-sensitive readers (as_strided, extern
        # kernels, graph outputs) see what eager code would see.
        self.stride_hint: tuple[Expr, ...] | None = None

    def get_size(self) -> tuple[Expr, ...]:
        return self.data.get_size()

    def get_dtype(self) -> torch.dtype:
        return self.data.get_dtype()

    def get_device(self) -> torch.device:
        return self.data.get_device()

    def make_loader(self) -> Loader:
        return self.data.make_loader()

    def is_realized(self) -> bool:
        return isinstance(self.data, Buffer)

    def realize(self) -> Buffer:
        """Turn lazy loops into a named ComputedBuffer; see Note [Inlining and realization]."""
        if isinstance(self.data, Buffer):
            return self.data
        assert isinstance(self.data, Pointwise | Reduction), self.data
        graph = current_graph()
        name = graph.new_buffer_name()
        layout = flexible(self.data.device, self.data.dtype, self.data.ranges)
        if self.stride_hint is not None:
            layout = FlexibleLayout(layout.device, layout.dtype, layout.size, self.stride_hint)
        buffer = ComputedBuffer(name, layout, data=self.data)
        graph.register_operation(buffer)
        self.data = buffer
        return buffer

    def __repr__(self) -> str:
        return f"StorageBox({self.data!r})"


class TensorBox(IRNode):
    """What a lowering returns for a tensor value: a view or a StorageBox."""

    __slots__ = ("data",)

    def __init__(self, data: IRNode) -> None:
        self.data = data

    @staticmethod
    def create(data: IRNode) -> TensorBox:
        return TensorBox(StorageBox(data))

    def get_size(self) -> tuple[Expr, ...]:
        return self.data.get_size()

    def get_dtype(self) -> torch.dtype:
        return self.data.get_dtype()

    def get_device(self) -> torch.device:
        return self.data.get_device()

    def make_loader(self) -> Loader:
        return self.data.make_loader()

    def storage(self) -> StorageBox | None:
        """The StorageBox under any chain of views, if there is one."""
        node: IRNode = self.data
        while isinstance(node, View):
            node = node.base
        return node if isinstance(node, StorageBox) else None

    def __repr__(self) -> str:
        return f"TensorBox({self.data!r})"


def realize_strided(box: TensorBox) -> Buffer | ReinterpretView:
    """The value as memory with a strided layout (for extern kernels and graph outputs).

    Storage is realized; a view over realized storage becomes a ReinterpretView when its index
    is an affine function of the loop variables; any other view is copied into a new buffer.
    """
    node: IRNode = box.data
    if isinstance(node, StorageBox):
        return node.realize()
    if isinstance(node, ReinterpretView):
        return node
    storage = box.storage()
    if storage is not None and not isinstance(storage.data, Buffer):
        storage.realize()
    size = box.get_size()
    variables = loop_vars("v", len(size))
    index = _offset_through_views(node, variables)
    if index is not None:
        buffer, expr = index
        ranges = dict(zip(variables, size, strict=True))
        known = current_graph().sizevars  # Note [Views with symbolic strides] in indexing.py
        params = as_strided_params(
            simplify_index(expr, ranges), variables, known.hints.keys() - known.unbacked.keys()
        )
        if params is not None:
            strides, offset = params
            strides = [s if n != 1 else sympy.Integer(1) for s, n in zip(strides, size, strict=True)]
            layout = FixedLayout(box.get_device(), box.get_dtype(), tuple(size), tuple(strides), offset)
            return ReinterpretView(buffer, layout)
    copy = StorageBox(
        Pointwise(box.get_device(), box.get_dtype(), box.make_loader(), tuple(size), carried(box))
    )
    box.data = copy
    return copy.realize()


def carried(value: Any) -> frozenset[Origin]:
    """The origins a reader of ``value`` inlines (Note [Origins]): those of a view and of
    unrealized pointwise loops; a buffer, read by loads, carries none (nor does a reduction,
    realized before anything reads it)."""
    node = value
    while isinstance(node, TensorBox | StorageBox):
        node = node.data
    if isinstance(node, View):
        return node.origins | carried(node.base)
    if isinstance(node, Pointwise):
        return node.origins
    return NO_ORIGINS


def _offset_through_views(node: IRNode, index: Index) -> tuple[Buffer, Expr] | None:
    """Follow views down to a buffer; the memory offset of ``index`` in it."""
    while isinstance(node, View):
        index = node.reindex(index)
        node = node.base
    if isinstance(node, StorageBox):
        node = node.data
    if isinstance(node, ReinterpretView):
        return node.buffer, node.layout.indexer(index)
    if isinstance(node, Buffer):
        return node, node.layout.indexer(index)
    return None
