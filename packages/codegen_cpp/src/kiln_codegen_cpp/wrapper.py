"""The Python wrapper: straight-line code that runs one schedule.

The wrapper is generated as Python source (written beside the kernels and logged under
``KILN_LOG=output_code``) and ``exec``'d once. Its ``call(*inputs)`` does, in schedule order:

* allocate each computed buffer as a flat 1-D tensor of its layout's storage size (or take over
  the memory of a freed one, per loopir's reuse plan) and remember its data pointer;
* call each kernel through the translation unit's extension module with those pointers and the thread count
  (``torch.get_num_threads()`` once per call); a non-zero return names the check that failed
  (Note [Kernel errors] in kernel.py): an out-of-range indirect index, raised as ``IndexError``,
  or an integer division by zero, raised as :class:`KernelZeroDivisionError`;
* call extern aten ops on strided views of the buffers, and bring their results into the layout
  the IR expects;
* ``del`` buffers after their last reader, and return the outputs as strided views.

Note [Scratch buffers that persist]: a buffer that lives and dies inside one call (no output
reads its memory, directly, through a reuse, or through an extern op that may return a view of
its argument) is allocated once per compiled graph and kept between calls. A fresh
``torch.empty`` of a megabyte is a fresh ``mmap`` whenever glibc has given the memory back, and
touching it page by page cost more than the kernel writing it (a ReLU over 1 MB: 0.43 ms with
the page faults, 0.1 ms without). A call that finds the buffers held by another thread (or by
a call that raised) allocates fresh ones, so sharing never changes a result. At most
``PERSIST_LIMIT`` bytes persist per graph.

Note [Extern results that may be None]: an extern op may return None (an undefined tensor) where
its meta kernel promised a tensor: ``mkldnn_rnn_layer``'s workspace on the CPU (an LSTM in
training; the meta value is an empty tensor), CUDA flash attention's ``cum_seq_q``. ``_flat`` and
``_dense`` pass None through (kiln_loopir.wrapper_support), and every view the wrapper takes of
such a buffer, as an extern argument or a graph output, is ``None`` for ``None``: the graph then
returns None where eager's does (an LSTM's workspace is saved for its backward, which takes None
as eager's does). A kernel that reads such a buffer still fails loudly at its ``data_ptr()``.

Note [Saved inputs returned as themselves]: a training forward returns, after the user's outputs,
the values it saves for the backward (Note [Outputs only the backward reads] in kiln_loopir's
graph.py), and many of those are a parameter seen through a view that changes nothing (the
weight of ``x @ w.t()`` kept for the backward's ``grad @ w``: ``permute(permute(w))``). Such a
saved value is returned as the input tensor itself, not as an ``as_strided`` view of it (~1-2 us
each, 34 a step in Swin's forward): only the backward reads it, so no caller can tell the two
apart. A user's output keeps its own view object, as in eager.

Note [Inputs the frame guard checks in the C++ wrapper]: the kernels index an input with the
sizes, strides, storage offset and dtype it had at compile time, so the wrapper checks each input
on entry and copies one that differs into that layout (``_conform``). When the caller's guards
have just checked each input's sizes, strides and dtype (the kiln umbrella says so with
``CppBackend(guarded_layouts=True)`` for a static forward graph, whose inputs are the frame's
tensors: the same rule as the Triton wrapper's, Note [Inputs the frame guard checks] in
kiln_codegen_triton's wrapper.py), only the storage offset, which no guard checks, is: a call of
DistilBERT's 107-input graph read ``stride()``, ``shape`` and ``dtype`` of every input, ~0.4 µs
each (`packages/kiln/bench/call_overhead.py`, issue 14). Backward graphs and every other caller
keep the full check.

Note [Saved values the forward laid out, checked by offset]: a backward graph's inputs are
mostly the activations its forward saved, returned by the compiled forward in the very shape,
strides and dtype the backward was compiled for; kiln_aotgrad lists them in the graph's ``meta``
(Note [Backward inputs laid out by their forward] in kiln_loopir's graph.py). Their check is the
storage offset alone, as behind the frame guard (one read, ~0.1 us, against four, ~0.7 us): PVT
v2's backward (breadth suite) has 158 inputs, 122 of them such saved values, each checked in full
on every step before. The parameters and the incoming gradients among the inputs keep the full check
(a user may restride a parameter between the two graphs). ``CppOptions.laid_out_inputs=False``,
or ``KILN_LAID_OUT_INPUTS=0``, checks every input in full.

An input's strides are compared only on its dims of more than one element (Note [Strides of
size-one dims of inputs] in kiln_loopir's wrapper_support.py, the check both wrappers emit).

Note [Buffers allocated as their readers view them]: the kernels reach a buffer through its data
pointer only, so the tensor a buffer is allocated as may have any dense shape over its storage.
Extern ops and graph outputs see it through a view of their own (a [2, 16, 128] layer-norm
gradient read by ``mm`` as [32, 128], an activation saved for the backward in a permuted
layout); a view that is not the tensor's own shape is an ``as_strided`` call, ~1.5-2 us (Swin's
training step: 105 in the forward wrapper, 93 in the backward). A computed buffer of static
layout is allocated in the dense (size, stride) that its extern readers and the graph outputs
view it with most often (``_viewed_as``), so those views pass the tensor itself (Note [Buffers
in their own shape]); other views stay ``as_strided`` from the same storage. A buffer that
takes over another's memory keeps that one's shape. ``CppOptions.buffers_as_viewed`` (default
on) turns it off.

Note [Kernel ranges cost nothing unprofiled]: under ``KILN_PROFILE=1`` each kernel call is a
``with _range('kiln:<name>')`` block, so torch.profiler's tables name the kernels. A
``torch.profiler.record_function`` costs ~10 us of CPU on entry and exit even when no profiler
is recording (it builds a RecordFunction handle through the dispatcher), more than most of Swin's
kernels at CPU size: with 143 kernels a training step, Swin's step took 16.5 ms against 12.7 ms
without the ranges (``bench/train1.py``, which set ``KILN_PROFILE=1`` for every run, measured
kiln with that cost and torch.compile without it). ``_range`` asks the profiler first (~0.1 us)
and returns a no-op context when none is recording.

Nothing loops over kernels or arguments at run time: each call is one line of generated code.
Kernels the C++ generator cannot express run through loopir's reference interpreter instead
(``run_computed``), so an unsupported case is slow, never wrong.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Set
from typing import Any

import sympy
import torch

from kiln_loopir.graph import GraphLowering, free_layout_outputs, laid_out_inputs
from kiln_loopir.indexing import contiguous_strides
from kiln_loopir.interpret import members_runner
from kiln_loopir.ir import (
    Buffer,
    ComputedBuffer,
    ConstantBuffer,
    ExternKernel,
    InputBuffer,
    ReinterpretView,
    Scatter,
)
from kiln_loopir.scheduler import (
    BaseSchedulerNode,
    ExternKernelSchedulerNode,
    Scheduler,
)
from kiln_loopir.wrapper_support import (
    WrapperSteps,
    aliases_nothing,
    dense_shape,
    extern_callable,
    grad_mode_below_autograd,
    is_static_layout,
    opaque_inputs,
    opaque_results,
    py_size,
    py_tuple,
    symbol_bindings,
    unbacked_bindings,
    viewed_as,
    wrapper_namespace,
)
from kiln_loopir.wrapper_support import layout_args as _layout_args

from .build import Built, PendingBuild, write_beside
from .build import log as cache_log
from .kernel import ErrorSite, Kernel
from .options import CppOptions

log = logging.getLogger("kiln.codegen_cpp.output_code")

INDEXING_HINTS = ("index", "gather", "embedding", "scatter", "take")
DIVISION_OPS = (
    "aten.div.Tensor_mode",
    "aten.div.Scalar_mode",
    "aten.floor_divide",
    "aten.remainder",
    "aten.fmod",
)


PERSIST_LIMIT = 256 << 20

# extern ops whose out= overload writes straight into a given tensor (no allocation inside)
_aten = torch.ops.aten
OUT_VARIANTS: dict[Any, Any] = {
    _aten.mm.default: _aten.mm.out,
    _aten.addmm.default: _aten.addmm.out,
    _aten.bmm.default: _aten.bmm.out,
    _aten.baddbmm.default: _aten.baddbmm.out,
}


class BufferPool:
    """The persistent scratch buffers of one wrapper (Note [Scratch buffers that persist])."""

    def __init__(self, specs: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]) -> None:
        self.specs = specs
        self.buffers: tuple[torch.Tensor, ...] | None = None
        self.lock = threading.Lock()

    def fresh(self) -> tuple[torch.Tensor, ...]:
        return tuple(torch.empty_strided(size, stride, dtype=dtype) for size, stride, dtype in self.specs)

    def take(self) -> tuple[torch.Tensor, ...]:
        if not self.lock.acquire(blocking=False):
            return self.fresh()
        if self.buffers is None:
            self.buffers = self.fresh()
        return self.buffers

    def give(self, buffers: tuple[torch.Tensor, ...]) -> None:
        if buffers is self.buffers:
            self.lock.release()


class SizedBufferPool:
    """Note [Scratch buffers of symbolic size]: the persistent scratch buffers of a wrapper with
    symbolic sizes (Note [Scratch buffers that persist] for why they persist). Their sizes are
    expressions in the size symbols, so the buffers are kept for the symbol values of the last
    call (`key`) and made again when a call brings other values; `shapes(*key)` (the wrapper's
    generated `_pool_shapes`, read from its namespace) gives each buffer's size and stride. A
    key whose buffers would exceed ``PERSIST_LIMIT`` bytes gets fresh buffers that are not kept.
    A server alternating between sizes allocates as the wrapper did before; a loop at one size
    (a batch of prompts of one length, the sweep's steady state) reuses them as a static graph
    does. Before, every scratch buffer of a symbolic graph was a fresh ``torch.empty``: ViT at
    batch 8 ran 1.4x slower than its static graph, the page faults of its fresh megabytes."""

    def __init__(self, namespace: dict[str, Any], dtypes: list[torch.dtype]) -> None:
        self.namespace = namespace
        self.dtypes = dtypes
        self.key: tuple[int, ...] | None = None
        self.buffers: tuple[torch.Tensor, ...] | None = None
        self.lock = threading.Lock()

    def fresh(self, key: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        shapes = self.namespace["_pool_shapes"](*key)
        return tuple(
            torch.empty_strided(size, stride, dtype=dtype)
            for (size, stride), dtype in zip(shapes, self.dtypes, strict=True)
        )

    def take(self, *key: int) -> tuple[torch.Tensor, ...]:
        if not self.lock.acquire(blocking=False):
            return self.fresh(key)
        if key != self.key:
            self.key, self.buffers = None, None  # the old buffers go before the new ones come
            buffers = self.fresh(key)
            if sum(b.untyped_storage().nbytes() for b in buffers) > PERSIST_LIMIT:
                self.lock.release()
                return buffers
            self.key, self.buffers = key, buffers
        assert self.buffers is not None
        return self.buffers

    def give(self, buffers: tuple[torch.Tensor, ...]) -> None:
        if buffers is self.buffers:
            self.lock.release()


_NO_RANGE = contextlib.nullcontext()


def _kernel_range(name: str) -> contextlib.AbstractContextManager[Any]:
    """A ``record_function`` range named ``name`` while a profiler records, else a no-op
    (Note [Kernel ranges cost nothing unprofiled])."""
    if torch._C._autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return _NO_RANGE


def _symbols_of(layout: Any) -> set[sympy.Symbol]:
    return set().union(
        *(sympy.sympify(e).free_symbols for e in (*layout.size, *layout.stride, layout.offset))
    )


def _symbols_of_spec(spec: tuple[tuple[Any, ...], tuple[Any, ...], torch.dtype]) -> set[sympy.Symbol]:
    return set().union(*(sympy.sympify(e).free_symbols for e in (*spec[0], *spec[1])))


def _static_spec(spec: tuple[tuple[Any, ...], tuple[Any, ...], torch.dtype]) -> bool:
    return not _symbols_of_spec(spec)


def _int_spec(
    spec: tuple[tuple[Any, ...], tuple[Any, ...], torch.dtype],
) -> tuple[tuple[int, ...], tuple[int, ...], torch.dtype]:
    return tuple(int(e) for e in spec[0]), tuple(int(e) for e in spec[1]), spec[2]


class KernelZeroDivisionError(ZeroDivisionError, RuntimeError):
    """An integer division or modulo by zero in a kernel.

    Eager raises ``RuntimeError("ZeroDivisionError")``; this is both, so code that catches
    either keeps working.
    """


class WrapperCodegen(WrapperSteps):
    """Builds the wrapper source and its namespace for one schedule."""

    def __init__(
        self,
        schedule: Scheduler,
        graph: GraphLowering,
        kernels: dict[str, Kernel | None],
        built: Built | PendingBuild | None,
        guarded_layouts: bool = False,
        symbolic_pool: bool = True,
    ) -> None:
        self.schedule = schedule
        self.symbolic_pool = symbolic_pool  # Note [Scratch buffers of symbolic size]
        self.guarded_layouts = guarded_layouts  # Note [Inputs the frame guard checks in the C++ wrapper]
        # Note [Strides of size-one dims of inputs]: read when generated
        self.lean = os.environ.get("KILN_LEAN_WRAPPER", "1") != "0"
        self.graph = graph
        self.kernels = kernels
        self.built = built
        self.saved_inputs_as_is = True  # Note [Saved inputs returned as themselves]
        self.buffers_as_viewed = True  # Note [Buffers allocated as their readers view them]
        self.laid_out_inputs = True  # Note [Saved values the forward laid out, checked by offset]
        self.viewed_as: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = wrapper_namespace() | {"_range": _kernel_range}
        # KILN_PROFILE=1: every kernel call is a named range in torch.profiler's tables
        self.profile = os.environ.get("KILN_PROFILE", "") not in ("", "0")
        self.inputs: dict[str, InputBuffer] = {}
        self.pointers: set[str] = set()
        for k in kernels.values():
            if k is not None:
                self.pointers |= set(k.params)
        self.consts = 0
        self.persist = self._persistent()
        # (size, stride, dtype) of each persistent buffer: ints, or expressions of the size
        # symbols (Note [Scratch buffers of symbolic size])
        self.pool_specs: list[tuple[tuple[Any, ...], tuple[Any, ...], torch.dtype]] = []
        self.bound_at = 0  # where the body's symbol bindings end
        # Note [Buffers in their own shape]: the (size, stride) a buffer variable's tensor has,
        # where it was allocated or taken in the layout its readers view it with; `view` then
        # passes the variable itself instead of an as_strided view (~2 us each, hundreds a step)
        self.shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.returning, self.returned = False, set[str]()
        # Note [Extern results that may be None]: buffers bound to an extern op's result
        self.extern_results: set[str] = set()
        # Note [Opaque extern results]: bound and returned as the tensor the op returned
        self.opaque: set[str] = set()
        ops = [
            str(n.target)
            for n in graph.gm.graph.nodes
            if n.op == "call_function" and any(h in str(n.target) for h in INDEXING_HINTS)
        ]
        self.index_ops = ", ".join(sorted(set(ops))) or "an indexing op"
        divisions = [
            str(n.target)
            for n in graph.gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith(DIVISION_OPS)
        ]
        self.division_ops = ", ".join(sorted(set(divisions))) or "an integer division"

    # ------------------------------------------------------------------------------- pieces

    def var(self, name: str) -> str:
        return name

    def view(self, value: Any) -> str:
        """Python expression for an extern argument or a graph output."""
        if isinstance(value, ReinterpretView):
            return self._strided(value.buffer.name, value.layout)
        if isinstance(value, InputBuffer | ConstantBuffer):
            return self.var(value.name)
        if isinstance(value, Buffer):
            return self._strided(value.name, value.layout)
        if isinstance(value, list):
            return "[" + ", ".join(self.view(v) for v in value) + "]"
        if isinstance(value, tuple):
            inner = ", ".join(self.view(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, sympy.Expr) and not value.is_number:
            return py_size(value)  # Note [Symbolic sizes in the wrapper]
        return self.const(value)

    def _outputs(self, outputs: Any) -> str:
        """The return value; Note [Saved inputs returned as themselves]."""
        free = free_layout_outputs(self.graph.gm) if self.saved_inputs_as_is else frozenset()
        if not free or not isinstance(outputs, list | tuple):
            return self.view(outputs)
        parts = [
            self.var(v.buffer.name) if i in free and self._input_as_laid_out(v) else self.view(v)
            for i, v in enumerate(outputs)
        ]
        if isinstance(outputs, list):
            return "[" + ", ".join(parts) + "]"
        return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"

    def _input_as_laid_out(self, value: Any) -> bool:
        """Whether ``value`` is a view of a graph input with the input's own (static) layout."""
        if not (isinstance(value, ReinterpretView) and isinstance(value.buffer, InputBuffer)):
            return False
        mine, its = value.layout, value.buffer.layout
        return (
            is_static_layout(mine)
            and is_static_layout(its)
            and mine.dtype == its.dtype
            and tuple(mine.size) == tuple(its.size)
            and tuple(mine.stride) == tuple(its.stride)
            and mine.offset == its.offset
        )

    def _strided(self, name: str, layout: Any) -> str:
        if name in self.opaque:  # Note [Opaque extern results]
            return self.var(name)
        dense = dense_shape(layout)
        if dense is not None and self.shapes.get(name) == dense and name not in self.returned:
            if self.returning:  # each output a tensor of its own, even when two share a buffer
                self.returned.add(name)
            return self.var(name)
        view = f"{self.var(name)}.as_strided({_layout_args(layout)})"
        if name in self.extern_results:  # Note [Extern results that may be None]
            return f"(None if {self.var(name)} is None else {view})"
        return view

    def emit(self, line: str, depth: int = 1) -> None:
        self.lines.append("    " * depth + line)

    def pointer(self, name: str, expr: str) -> None:
        if name in self.pointers:
            self.emit(f"p_{name} = {expr}")

    def allocate(self, buffer: Buffer) -> None:
        if not is_static_layout(buffer.layout):  # Note [Symbolic sizes in the wrapper]
            n_expr = buffer.layout.storage_size()
            shape = dense_shape(buffer.layout) or ((n_expr,), (sympy.Integer(1),))
            self.shapes[buffer.name] = shape
            if buffer.name in self.persist:  # Note [Scratch buffers of symbolic size]
                self.emit(f"{buffer.name} = _P[{len(self.pool_specs)}]")
                self.pool_specs.append((*shape, buffer.layout.dtype))
            else:
                dtype = self.const(buffer.layout.dtype)
                self.emit(
                    f"{buffer.name} = _empty_strided({py_tuple(shape[0])}, {py_tuple(shape[1])}, dtype={dtype})"
                )
            self.pointer(buffer.name, f"{buffer.name}.data_ptr()")
            return
        n = int(buffer.layout.storage_size())
        # Note [Buffers allocated as their readers view them]
        shape = self.viewed_as.get(buffer.name) or dense_shape(buffer.layout) or ((n,), (1,))
        self.shapes[buffer.name] = shape
        if buffer.name in self.persist:
            self.emit(f"{buffer.name} = _P[{len(self.pool_specs)}]")
            self.pool_specs.append((*shape, buffer.layout.dtype))
        else:
            dtype = self.const(buffer.layout.dtype)
            if shape[0] == (n,) and shape[1] == (1,):
                self.emit(f"{buffer.name} = _empty({n}, dtype={dtype})")
            else:
                self.emit(f"{buffer.name} = _empty_strided({shape[0]!r}, {shape[1]!r}, dtype={dtype})")
        self.pointer(buffer.name, f"{buffer.name}.data_ptr()")

    def _viewed_as(self) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
        """Note [Buffers allocated as their readers view them]: for each computed buffer of static
        layout, the dense (size, stride) over its whole storage that extern arguments and graph
        outputs view it with most often."""
        return viewed_as(self.schedule, self.graph.outputs)

    def _persistent(self) -> set[str]:
        """Buffers that may persist between calls (Note [Scratch buffers that persist])."""
        plan, schedule = self.schedule.plan, self.schedule
        banned = set(schedule.output_names)
        candidates: dict[str, Any] = {}  # name -> layout
        for node in schedule.nodes:
            if isinstance(node, ExternKernelSchedulerNode):
                extern = node.node
                if not aliases_nothing(extern.op):
                    banned |= _buffer_names((extern.args, extern.kwargs))
                if extern.op in OUT_VARIANTS and len(extern.outputs) == 1:
                    out = extern.outputs[0]
                    if dense_shape(out.layout) == _contiguous_shape(out.layout):
                        candidates[out.name] = out.layout  # a GEMM can write into a kept buffer
                continue
            for m in node.get_nodes():
                buffer = getattr(m, "node", None)
                if isinstance(buffer, Scatter):
                    banned.add(buffer.mutates)
                elif isinstance(buffer, ComputedBuffer):
                    candidates[buffer.name] = buffer.layout

        def root(name: str) -> str:
            seen = set()
            while (source := plan.allocate.get(name)) is not None and name not in seen:
                seen.add(name)
                name = source
            return name

        banned_roots = {root(n) for n in banned}
        chosen, total = set(), 0
        for name, layout in sorted(candidates.items()):
            if root(name) in banned_roots or plan.allocate.get(name) is not None:
                continue
            if not is_static_layout(layout):
                # Note [Scratch buffers of symbolic size]: kept per symbol values when every
                # symbol comes from the inputs (not from an extern's data-dependent result);
                # the limit is checked here at the hints and by the pool at run time
                if not self.symbolic_pool or not _symbols_of(layout) <= self.graph.sizevars.sources.keys():
                    continue
                size = self.graph.sizevars.hint(layout.storage_size()) * layout.dtype.itemsize
            else:
                size = int(layout.storage_size()) * layout.dtype.itemsize
            if total + size <= PERSIST_LIMIT:
                chosen.add(name)
                total += size
        return chosen

    # --------------------------------------------------------------------------------- body

    def generate(self) -> tuple[str, dict[str, Any]]:
        graph = self.graph
        params = []
        for i, spec in enumerate(graph.graph_inputs):
            params.append(spec.name if spec is not None else f"_unused{i}")
        header = [
            "# kiln codegen_cpp wrapper" + (f" for {self.built.source_path}" if self.built else ""),
            f"def call({', '.join(params)}):",
        ]
        self.emit("nt = _get_threads()")
        self.bind_symbols(params)
        self.bound_at = len(self.lines)
        opaque = opaque_inputs(graph.gm)
        # Note [Saved values the forward laid out, checked by offset]
        laid_out = laid_out_inputs(graph.gm) if self.laid_out_inputs else frozenset()
        for position, spec in enumerate(graph.graph_inputs):
            if spec is not None and spec.name in opaque:
                self.emit(f"# {spec.name}: an opaque extern result, taken as it is")
                continue
            if spec is not None and not is_static_layout(spec.layout):
                self.symbolic_input(spec)
            elif spec is not None:
                # the kernels index memory with the strides seen at compile time; Note [Inputs
                # the frame guard checks in the C++ wrapper]
                guarded = self.guarded_layouts or position in laid_out
                self.emit(self.static_input_check(spec.name, spec.layout, guarded))
                off = int(spec.layout.offset) * spec.layout.dtype.itemsize
                self.pointer(spec.name, f"{spec.name}.data_ptr()" + (f" - {off}" if off else ""))
        for name, value in graph.constants.items():
            layout = graph.name_to_buffer[name].layout
            self.namespace[name] = value
            if name in self.pointers:
                self.namespace[f"p_{name}"] = value.data_ptr() - int(layout.offset) * layout.dtype.itemsize
        if self.buffers_as_viewed:
            self.viewed_as = self._viewed_as()
        self.emit_steps()  # Note [A wrapper's walk over the schedule] (kiln_loopir.wrapper_support)
        self.returning = True
        self.emit(f"return {self._outputs(graph.outputs)}")
        body = self.lines
        if self.pool_specs and all(_static_spec(spec) for spec in self.pool_specs):
            pool = BufferPool([_int_spec(spec) for spec in self.pool_specs])
            self.namespace["_take"], self.namespace["_give"] = pool.take, pool.give
            body = ["    _P = _take()", "    try:", *("    " + line for line in body)]
            body += ["    finally:", "        _give(_P)"]
        elif self.pool_specs:  # Note [Scratch buffers of symbolic size]
            key = sorted(set().union(*(_symbols_of_spec(spec) for spec in self.pool_specs)), key=str)
            names = ", ".join(str(k) for k in key)
            shapes = ", ".join(
                f"({py_tuple(size)}, {py_tuple(stride)})" for size, stride, _ in self.pool_specs
            )
            header = [
                f"def _pool_shapes({names}):  # Note [Scratch buffers of symbolic size]",
                f"    return ({shapes},)",
                "",
                *header,
            ]
            sized = SizedBufferPool(self.namespace, [dtype for _, _, dtype in self.pool_specs])
            self.namespace["_take"], self.namespace["_give"] = sized.take, sized.give
            head, rest = body[: self.bound_at], body[self.bound_at :]
            body = [*head, f"    _P = _take({names})", "    try:", *("    " + line for line in rest)]
            body += ["    finally:", "        _give(_P)"]
        source = "\n".join([*header, *body]) + "\n"
        self.namespace["_get_threads"] = torch.get_num_threads
        return source, self.namespace

    def bind_symbols(self, params: list[str]) -> None:
        """Note [Symbolic sizes in the wrapper]: each size symbol becomes a local variable of
        ``call``, named as the symbol, read once per call from the input that holds it (a size,
        a stride or an int argument); every derived size (allocations, views, kernel arguments)
        is an expression over those variables."""
        for line in symbol_bindings(self.graph.sizevars, params):
            self.emit(line)

    def symbolic_input(self, spec: InputBuffer) -> None:
        """A graph input with symbolic sizes: its strides as compiled (as expressions of the
        symbols just read) or else a copy into that layout; guards checked the sizes."""
        layout, n = spec.layout, spec.name
        dtype = self.const(layout.dtype)
        self.emit(
            f"if {n}.stride() != {py_tuple(layout.stride)} or {n}.storage_offset() != {py_size(layout.offset)} "
            f"or {n}.dtype is not {dtype}: "
            f"{n} = _conform({n}, {_layout_args(layout)}, dtype={dtype}, name={n!r})"
        )
        off = layout.offset * layout.dtype.itemsize
        self.pointer(n, f"{n}.data_ptr()" + (f" - ({py_size(off)})" if off != 0 else ""))

    def extern(self, kernel: ExternKernel) -> None:
        op = f"_op_{kernel.name}"
        self.namespace[op] = extern_callable(kernel.op)  # Note [Extern calls through torch's Python bindings]
        args = [self.view(a) for a in kernel.args]
        kwargs = {k: v for k, v in kernel.kwargs.items()}
        if "device" in kwargs:
            kwargs["device"] = self.graph.device
        args += [f"{k}={self.view(v)}" for k, v in kwargs.items()]
        self.emit(f"# extern {kernel.op}")
        out_variant = OUT_VARIANTS.get(kernel.op)
        if out_variant is not None and kernel.outputs[0].name in self.persist:
            # a GEMM into a buffer kept between calls (Note [Scratch buffers that persist])
            out = kernel.outputs[0]
            shape = dense_shape(out.layout)
            assert shape is not None
            self.namespace[op] = extern_callable(out_variant)
            self.emit(f"{out.name} = _P[{len(self.pool_specs)}]")
            self.pool_specs.append((*shape, out.layout.dtype))
            self.shapes[out.name] = shape
            self.emit(f"{op}({', '.join([*args, f'out={out.name}'])})")
            self.pointer(out.name, f"{out.name}.data_ptr()")
            return
        opaque, grad = opaque_results(kernel, lambda name: name in self._read_by_extern_or_output())
        call = f"_r = {op}({', '.join(args)})"
        if grad:
            self.namespace["_grad_below_autograd"] = grad_mode_below_autograd
            self.emit("with _grad_below_autograd():  # Note [Opaque extern results]")
            self.emit(call, 2)
        else:
            self.emit(call)
        for line in unbacked_bindings(self.graph.sizevars, kernel.name, "_r"):
            self.emit(line)  # Note [Unbacked sizes in loopir]
        for out in kernel.outputs:
            self.extern_results.add(out.name)
            value = "_r" + "".join(f"[{i}]" for i in out.path)
            if out in opaque:
                self.opaque.add(out.name)
                self.emit(f"{out.name} = {value}")
                continue
            n = py_size(out.layout.storage_size())
            dense = dense_shape(out.layout)
            name = self.const(str(kernel.op))  # named in the error of a result of another shape
            if dense is not None:
                self.shapes[out.name] = dense
                self.emit(f"{out.name} = _dense({value}, {_layout_args(out.layout)}, {name})")
            else:
                self.emit(f"{out.name} = _flat({value}, {n}, {_layout_args(out.layout)}, {name})")
            self.pointer(out.name, f"{out.name}.data_ptr()")
        self.emit("del _r")

    def _read_by_extern_or_output(self) -> set[str]:
        """Buffers a graph output or another extern op's argument reads (Note [Opaque extern
        results]: a backward that recomputes the forward's op in the same graph reads its
        workspace through an extern)."""
        read = set(self.schedule.output_names)
        for node in self.schedule.nodes:
            if isinstance(node, ExternKernelSchedulerNode):
                read.update(node.node.input_names())
        return read

    def alias_scatter(self, buffer: Scatter) -> None:
        """A scatter's name is the buffer it writes into (Scatter's docstring).

        Note [Scatters with no elements]: a scatter of no elements (an ``index_add_`` into a
        zero-size view, or of zero-size values) runs nothing, and the scheduler makes it a no-op
        node; its name must still be bound to the buffer it mutates, because later kernels read
        the scattered result by the scatter's name (their loads of it may be of no elements
        too, but the kernel takes its pointer all the same)."""
        self.emit(f"{buffer.name} = {buffer.mutates}")
        if buffer.mutates in self.shapes:
            self.shapes[buffer.name] = self.shapes[buffer.mutates]
        self.pointer(buffer.name, f"{buffer.mutates}.data_ptr()")

    def kernel_scratch(self, node: BaseSchedulerNode) -> Set[str] | None:
        compiled = self.kernels.get(node.name)
        return set(compiled.scratch) if compiled is not None else None

    def place_member(self, buffer: Buffer, scratch: Set[str]) -> list[str]:
        plan = self.schedule.plan
        if buffer.name in plan.allocate:
            reuse = plan.allocate[buffer.name]
            if reuse is None:
                self.allocate(buffer)
                return []
            self.emit(f"{buffer.name} = {reuse}  # reuses {reuse}")
            if reuse in self.shapes:
                self.shapes[buffer.name] = self.shapes[reuse]
            self.pointer(buffer.name, f"p_{reuse}" if reuse in self.pointers else f"{reuse}.data_ptr()")
            # after the call: an input taken over in place (Note [A kernel's output in place of
            # an input that dies in it]) is still an argument of the kernel
            return [reuse]
        if buffer.name in scratch:
            self.allocate(buffer)
            return [buffer.name]
        return []

    def call_kernel(self, node: BaseSchedulerNode, step: int) -> list[str]:
        compiled = self.kernels[node.name]
        assert compiled is not None
        fn = f"k_{compiled.name}"
        args = ", ".join([*(f"p_{p}" for p in compiled.params), *compiled.size_params, "nt"])
        if self.profile:
            self.emit(f"with _range('kiln:{compiled.name}'):")
            self.emit(f"if _e := {fn}({args}): _kernel_error({compiled.name!r}, _e)", 2)
        else:
            self.emit(f"if _e := {fn}({args}): _kernel_error({compiled.name!r}, _e)")
        return []

    def fallback(self, node: BaseSchedulerNode, members: list[ComputedBuffer]) -> None:
        """Run a kernel the C++ generator declined with loopir's interpreter (never wrong)."""
        # the backend refused a graph of symbolic sizes with a declined kernel (Note [Declined
        # kernels] in kiln_loopir's backend.py)
        assert not self.graph.sizevars.symbolic, node.name
        entries = []
        for name, buffer in self.touched_buffers(node).items():
            n = int(buffer.layout.storage_size())
            flat = self.shapes.get(name, ((n,), (1,))) == ((n,), (1,))
            if isinstance(buffer, InputBuffer | ConstantBuffer) or not flat:
                entries.append(f"{name!r}: {name}.as_strided(({n},), (1,), 0)")
            else:
                entries.append(f"{name!r}: {name}")
        fn = f"_interpret_{node.name}"
        self.namespace[fn] = members_runner(members)
        self.emit(f"{fn}({{{', '.join(entries)}}})  # not expressible in C++: reference interpreter")

    def bind(self, built: Built | PendingBuild | None, errors: dict[str, list[ErrorSite]]) -> None:
        """Put the kernel functions and the error reporter into the namespace; for a build still
        compiling, stand-ins that wait for it and then bind the real ones (Note [Builds that
        overlap] in build.py)."""
        if built is None:
            return
        if isinstance(built, PendingBuild):
            if not built.done():
                self._bind_when_built(built, errors)
                return
            built = built.result()
        lib = built.library
        for k in self.kernels.values():
            if k is not None:
                self.namespace[f"k_{k.name}"] = getattr(lib, k.name)
        err_value = lib.err_value
        index_ops, division_ops = self.index_ops, self.division_ops

        def kernel_error(kernel: str, code: int) -> None:
            sites = errors.get(kernel, [])
            site = sites[code - 1] if 0 < code <= len(sites) else None
            if site is not None and site.kind == "zero_division":
                raise KernelZeroDivisionError(
                    f"ZeroDivisionError: integer division by zero (ops.{site.op} in {division_ops}; "
                    f"kernel {kernel})"
                )
            index_sites = [s for s in sites if s.kind == "index"]
            size = site.size if site is not None else "/".join(str(s.size) for s in index_sites)
            raise IndexError(
                f"index {err_value()} is out of bounds for dimension with size {size} "
                f"(in {index_ops}; kernel {kernel})"
            )

        self.namespace["_kernel_error"] = kernel_error

    def _bind_when_built(self, pending: PendingBuild, errors: dict[str, list[ErrorSite]]) -> None:
        lock = threading.Lock()
        namespace = self.namespace
        bound = [False]

        def finish() -> None:
            with lock:
                if bound[0]:
                    return  # another thread bound them
                built = pending.result()  # raises the compiler's error (CppCompileError)
                if pending.waited > 0.001:
                    cache_log.debug(
                        "waited %.2f s for %s at its graph's first call", pending.waited, built.directory
                    )
                self.bind(built, errors)
                bound[0] = True

        def stand_in(name: str) -> Callable[..., Any]:
            def waiting(*args: Any) -> Any:
                finish()
                return namespace[name](*args)

            return waiting

        for k in self.kernels.values():
            if k is not None:
                namespace[f"k_{k.name}"] = stand_in(f"k_{k.name}")


def _contiguous_shape(layout: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    if not is_static_layout(layout):
        return tuple(layout.size), tuple(contiguous_strides(layout.size))
    size = tuple(layout.int_size())
    return size, tuple(int(s) for s in contiguous_strides(size))


def _buffer_names(value: Any) -> set[str]:
    if isinstance(value, ReinterpretView):
        return {value.buffer.name}
    if isinstance(value, Buffer):
        return {value.name}
    if isinstance(value, list | tuple):
        return set().union(*(_buffer_names(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return _buffer_names(list(value.values()))
    return set()


def make_wrapper(
    schedule: Scheduler,
    graph: GraphLowering,
    kernels: dict[str, Kernel | None],
    built: Built | PendingBuild | None,
    options: CppOptions | None = None,
    *,
    guarded_layouts: bool = False,
) -> tuple[Callable[..., Any], str, str]:
    """(the ``call`` function, its source, where the source was written)."""
    options = options or CppOptions()
    gen = WrapperCodegen(schedule, graph, kernels, built, guarded_layouts, options.symbolic_scratch)
    gen.saved_inputs_as_is = options.saved_inputs_as_is
    gen.buffers_as_viewed = options.buffers_as_viewed
    gen.laid_out_inputs = options.laid_out_inputs
    source, namespace = gen.generate()
    errors = {k.name: k.errors for k in kernels.values() if k is not None}
    gen.bind(built, errors)
    path = "<memory>"
    if built is not None:
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        path = str(write_beside(built, f"wrapper_{digest}.py", source))
    code = compile(source, path, "exec")
    exec(code, namespace)
    return namespace["call"], source, path
