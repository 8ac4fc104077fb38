"""The Python wrapper: straight-line code that runs one schedule on the graph's device.

The wrapper is generated as Python source (logged under ``KILN_LOG=output_code``) and ``exec``'d
once. Its ``call(*inputs)`` does, in schedule order:

* bring each input into the layout the kernels were generated for (a copy only when the caller
  passes other strides), and take its flat storage (kernels index storage from offset 0);
* allocate each computed buffer as a flat 1-D tensor of its layout's storage size on the graph's
  device (the caching allocator, on the current stream), or take over the memory of a freed one
  per loopir's reuse plan;
* launch each kernel through its :class:`~kiln_codegen_triton.runtime.Launcher` with the flat
  tensors of its parameters;
* call extern aten ops (matmul, convolution: cuBLAS/cuDNN on a GPU) on strided views of the
  buffers, and bring their results into the layout the IR expects;
* ``del`` buffers after their last reader, and return the outputs as strided views.

A kernel the generator declined runs through loopir's reference interpreter on CPU copies of
the tensors it touches (slow, never wrong); ``TritonBackend.last_declined`` says which and why.

Note [Kernel arguments are pointers]: on a GPU the wrapper hands kernels integers, not tensors:
each buffer's storage address is read once (``buf3_p = buf3.data_ptr()``, an input's minus its
storage offset) and every launch passes those, so Triton's launcher neither calls ``data_ptr()``
nor asks the driver about the pointer per argument, and no flat view of an input is built per
call. The kernels were compiled for 16-byte aligned pointers (Note [The launch path] in
runtime.py): buffers and extern results come from the caching allocator, which aligns every
block to 512 bytes; inputs are checked at once (``(a_p | b_p | ...) & 15``), and one that is not
aligned is copied into a fresh buffer first. The stream is read once per call. Under Triton's
interpreter (CPU tensors) kernels take the flat tensors, as an interpreter must read them.

Note [Buffers in their own shape on a GPU]: since GPU kernels take pointers, a buffer need not be
a flat tensor there. One whose layout is dense from offset 0 is allocated in that layout
(``empty_strided``), and an extern result that already has its planned layout is kept as
returned, so an extern op that reads it, or the caller that gets it as an output, takes the
tensor itself instead of an ``as_strided`` view built on every call (ResNet-50: two per
convolution); the same rule as the CPU wrapper's Note [Buffers in their own shape], through
loopir's ``dense_shape``. ``self.shaped`` records which variables hold exactly which layout.

Note [Inputs the frame guard checks]: kernels index memory with the sizes, strides, storage
offset and dtype each input had at compile time, so the wrapper checks them on entry and copies
an input that differs into that layout. For a forward graph compiled through kiln's frame, the
inputs are the frame's tensors, and the frame's guard has just checked each one's type, dtype,
device, requires_grad, sizes and strides (the whole tuple) before the compiled code ran; only the
storage offset is not in that guard. So such a wrapper (``guarded_layouts=True``, which the kiln
umbrella sets for forward graphs only) checks the storage offset and the alignment: ResNet-50 has
269 inputs, and the skipped ``stride()``/``shape``/``dtype`` reads were about 0.3 µs each per
call. A backward graph's inputs (saved values, incoming gradients of any strides) are checked in
full, as is every graph of a caller that does not say it guards them.

Note [Symbolic sizes in the Triton wrapper]: a graph compiled with symbolic sizes (Note
[Symbolic sizes in loopir]) reads every size symbol once per call, from the input that holds it
(``s0 = x.size(0)``: loopir's ``symbol_bindings``, the same lines the C++ wrapper binds), and
computes every composite size it needs once, right after (``_ks0 = 3*s0``); allocations, views,
extern arguments and input checks name those variables, and kernels take the symbols as
arguments after their pointers (Note [Symbolic sizes in Triton kernels] in kernel.py), their
launchers computing the grid from them. An input's sizes, strides and offset are checked as
expressions of the symbols just read (a copy into that layout where they differ). A kernel the
generator declines is not interpreted in such a graph: the backend refuses the graph, and the
caller compiles it with static sizes. A static graph generates exactly the lines it did before.

Note [Data-dependent sizes in the Triton wrapper]: a data-dependent size (`u0`, Note [Unbacked
sizes in loopir]) is held by no input: the extern call that computes it (`nonzero`,
`masked_select`, `.item()`) runs, and the lines right after it read the symbol from its result
(``u0 = _r.size(0)``, ``u1 = int(_r)``) and check the `torch._check` facts whose last symbol it
binds (loopir's ``unbacked_bindings``, the lines the C++ wrapper emits too). Every later
allocation, view and kernel launch names the variable: kernels take it as a size argument like
any symbol, their launchers compute the grid from it (an empty result is a grid of 0, which
launches nothing). A composite size in such a symbol is printed where it is used instead of
once after the inputs' symbols (the symbol is not bound there yet). CUDA graphs are not recorded
for such a graph (a replay would keep the sizes of the recorded call).

Note [A lean wrapper]: what the GPU wrapper does per call beyond launches and extern ops, cut where
the layout is known when the wrapper is generated (measured without a GPU by
``scripts/triton_wrapper_overhead.py``; ``KILN_LEAN_WRAPPER=0``, read when a wrapper is generated,
turns all five off):

* an input's strides are checked only on its dims of more than one element (Note [Strides of
  size-one dims of inputs] in kiln_loopir's wrapper_support.py, the check both wrappers emit). A
  dim of size one is never stepped over, so its stride does not change a single address; but the
  full check copied every such input whose stride there differed. In training that was every saved BatchNorm
  statistic (``(1, C, 1, 1)``, returned by the forward with strides ``(1, 1, 1, 1)``, expected as
  ``(C, 1, 1, 1)``): a fresh buffer and a copy kernel per statistic per backward call (ResNet: one
  per BatchNorm layer).
* a buffer that takes over a freed one's memory (loopir's reuse plan) keeps its own shape: when
  the freed one held exactly the new layout the variable is taken as it is, else, where an extern
  op or the caller reads it in that layout (``read_in_shape``), it is re-viewed once, where the
  reuse happens (a dense layout from offset 0), instead of an ``as_strided`` view at every
  extern call that reads it (ResNet: the input of almost every convolution). A buffer read only
  through views of other shapes (ConvNeXt's GEMM inputs) stays flat, as before.
* an extern argument that views such a variable in exactly its layout takes the variable.
* an extern op's tensor results are checked inline (shape, strides, offset against the
  planned dense layout, ``_dense`` only when they differ), not through two Python calls; as for
  inputs, strides of size-one dims are not compared unless the result is a graph output (ResNet's
  ``(N, C, 1, 1)`` convolution results, and at batch one every attention output, were copied on
  every call for such a stride). One of several results (which the op may leave None) is bound to
  ``_t`` first.
* constant int lists among an extern op's arguments (a convolution's stride, padding, dilation)
  are tuple literals, constants of the code object, not lists built on every call.

Note [Buffers in the shape their readers view them on a GPU]: a buffer of the GPU wrapper is
allocated in the dense shape that extern ops and graph outputs view it with most often (loopir's
``viewed_as``; the C++ wrapper's Note [Buffers allocated as their readers view them]), not in its
own: kernels take its pointer, so its shape is the readers' choice. A transformer's GEMM reads
each activation ``(B, S, H)`` as ``(B*S, H)``: T5's Q, K and V projections viewed one buffer three
times on every call, a ``_reinterpret`` each (~0.5 us here). A buffer that takes over a freed one's
memory is re-viewed once in that shape where the freed one held another. ``KILN_VIEWED_BUFFERS=0``
(read when a wrapper is generated) allocates every buffer in its own shape, as before.

Note [Allocations and views without torch's Python layer]: ``torch.empty_strided(size, stride,
dtype=..., device=...)`` parses its keyword arguments and goes through the dispatcher;
``t.as_strided(...)`` builds an autograd view (a view record, a shared version counter). torch
ships the two calls inductor's wrappers make instead, in ``torch._C._dynamo.guards``:
``_empty_strided_<device type>(size, stride, dtype)`` (on the current device, which is the graph's:
the body runs under the graph's device where there are several) and ``_reinterpret_tensor(t, size,
stride, offset)``, a tensor over ``t``'s storage at ``t.storage_offset() + offset`` that is no
autograd view. On this project's CPU: 3.1 against 4.9 us an allocation, 1.6 against 3.2 us a view
(``scripts/triton_wrapper_overhead.py --switch KILN_DIRECT_CALLS``). Every allocation goes through
``_alloc``. ``_reinterpret`` builds only views nothing sees after the call that takes them: the
arguments of an aten extern op whose schema has no alias annotation (it writes none of them and
returns none of them), and a buffer's re-view of a freed one's memory (the freed one is dead).
The offset is relative, so only variables whose storage offset is known when the wrapper is
generated are viewed so: what the wrapper allocated, an extern result (checked or copied into a
layout from offset 0), a flat view, a static input (its check made its offset the compiled one).
A graph output stays an ``as_strided`` view: the caller, and autograd, may see that it shares
memory, and in-place writes to one must count against the other's version. Under Triton's
interpreter too (its tests run these lines). ``KILN_DIRECT_CALLS=0``, read when a wrapper is
generated, emits the torch calls.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Set
from typing import Any

import sympy
import torch

from kiln_loopir.graph import GraphLowering, laid_out_inputs
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
    Scheduler,
    TemplateSchedulerNode,
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
    symbol_bindings,
    unbacked_bindings,
    viewed_as,
    wrapper_namespace,
)
from kiln_loopir.wrapper_support import layout_args as _layout_args

from .interp import interpreting
from .kernel import KernelGroup
from .runtime import Launcher
from .templates import MatmulChoice

# Note [Inputs the forward laid out]: a backward graph's inputs that kiln_aotgrad lists under this
# key of the graph's ``meta`` are saved values the compiled forward returned in exactly the layout
# the backward was compiled for (Note [Backward inputs the forward laid out] in kiln_aotgrad's
# api.py): the GPU wrapper checks their storage offset (and alignment) only, as it does a forward
# graph's inputs behind the frame guard (Note [Inputs the frame guard checks]); the incoming
# gradients and the forward's inputs among the saved values are checked in full.
# ``KILN_LAID_OUT_INPUTS=0``, read when aotgrad compiles and when a wrapper is generated, checks
# them in full too. The list is read by kiln_loopir's ``laid_out_inputs``, as the C++ wrapper reads
# it (Note [Backward inputs laid out by their forward] in kiln_loopir's graph.py).


class WrapperCodegen(WrapperSteps):
    """Builds the wrapper source and its namespace for one schedule."""

    def __init__(
        self,
        schedule: Scheduler,
        graph: GraphLowering,
        groups: dict[str, KernelGroup | None],
        launchers: dict[str, Launcher],
        guarded_layouts: bool = False,
        templates: dict[str, MatmulChoice] | None = None,
    ) -> None:
        self.schedule = schedule
        self.templates = templates or {}  # Note [Matmul templates] in templates.py
        self.guarded_layouts = guarded_layouts  # Note [Inputs the frame guard checks]
        self.graph = graph
        self.groups = groups
        self.launchers = launchers
        self.lines: list[str] = []
        self.device = graph.device
        # `math`: floats of sizes (`math.sqrt(s1)`, Note [Floats of sizes in Triton])
        self.namespace: dict[str, Any] = wrapper_namespace() | {"_device": self.device}
        self.consts = 0
        self.lean = os.environ.get("KILN_LEAN_WRAPPER", "1") != "0"  # Note [A lean wrapper]
        # Note [A lean wrapper], for the results of a graph of symbolic sizes too (the symbolic
        # GPT-2 copied six attention outputs per call, (1, H, s0, D) with a batch stride of 1)
        self.lean_symbolic = os.environ.get("KILN_LEAN_SYMBOLIC_RESULTS", "1") != "0"
        # Note [Allocations and views without torch's Python layer]: read when generated
        self.direct = os.environ.get("KILN_DIRECT_CALLS", "1") != "0"
        # variables that hold a tensor of storage offset 0 (allocations, extern results, reuses)
        self.offset0: set[str] = set()
        self.opaque_inputs: set[str] = set()
        self.fast = False  # set by generate() (Note [Allocations and views without torch's Python layer])
        # Note [Kernel arguments are pointers]
        self.pointers = self.device.type == "cuda" and not interpreting()
        self.kernel_params = {
            p for g in groups.values() if g is not None for spec in g.specs for p in spec.params
        }
        for choice in self.templates.values():
            if choice.template is not None:  # a lone GEMM's product (the last) is not passed
                params = choice.template.params
                self.kernel_params |= set(params[:-1] if choice.template.lone else params)
        self.flat_inputs = self._inputs_needing_flat_views()
        self.referenced = self._referenced_buffers()
        self.read_in_shape = self._read_in_own_shape()  # Note [A lean wrapper]
        # Note [Buffers in the shape their readers view them on a GPU]: buffer -> (size, stride)
        self.viewed_as: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # set by generate()
        # Note [Buffers in their own shape on a GPU]: variable -> the layout it holds exactly
        self.shaped: dict[str, tuple[Any, ...]] = {}
        # extern results (an extern op may return None for one), and those bound as returned
        # (Note [Opaque extern results] in kiln_loopir's wrapper_support.py)
        self.extern_results: set[str] = set()
        self.opaque: set[str] = set()
        if self.pointers:
            self.namespace["_get_stream"] = torch._C._cuda_getCurrentRawStream
        # Note [Symbolic sizes in the Triton wrapper]: composite size -> its variable, computed once
        self.symbolic = graph.sizevars.symbolic
        self.derived: dict[str, str] = {}

    def _referenced_buffers(self) -> set[str]:
        """Names of the buffers some kernel, extern call or graph output reads."""
        names = set(self.schedule.output_names)  # the graph outputs' buffers
        for node in self.schedule.nodes:
            names |= node.read_names()
            for m in node.get_nodes():
                names |= m.read_names()
                if isinstance(b := getattr(m, "node", None), Scatter):
                    names.add(b.mutates)
        for alias, root in self.schedule.aliases.items():
            if alias in names or root in names:
                names |= {alias, root}
        return names

    def _read_in_own_shape(self) -> set[str]:
        """Buffers that an extern op or the caller takes in exactly their own layout."""
        out: set[str] = set()

        def walk(value: Any) -> None:
            if isinstance(value, list | tuple):
                for v in value:
                    walk(v)
            elif isinstance(value, ReinterpretView):
                buffer = self.graph.name_to_buffer.get(value.buffer.name)
                if buffer is not None and _layout_key(buffer.layout) == _layout_key(value.layout):
                    out.add(buffer.name)
            elif isinstance(value, Buffer):
                out.add(value.name)

        for node in self.schedule.nodes:
            extern = (
                node.extern.node if isinstance(node, TemplateSchedulerNode) else getattr(node, "node", None)
            )
            if isinstance(extern, ExternKernel):
                walk(list(extern.args))
                walk(list(extern.kwargs.values()))
        walk(self.graph.outputs)
        return out

    def _inputs_needing_flat_views(self) -> set[str]:
        """Inputs whose flat storage tensor the wrapper needs: all under the interpreter; on a
        GPU only those that a scatter writes or a declined kernel reads."""
        inputs = {s.name for s in self.graph.graph_inputs if s is not None}
        if not self.pointers:
            return inputs
        needed: set[str] = set()
        for node in self.schedule.nodes:
            if node.name in self.groups and self.groups[node.name] is None:
                for m in node.get_nodes():
                    needed |= m.read_names() | m.write_names()
            for m in node.get_nodes():
                if isinstance(b := getattr(m, "node", None), Scatter):
                    needed.add(b.mutates)
        return needed & inputs

    # ------------------------------------------------------------------------------- pieces

    def storage(self, name: str) -> str:
        """The variable holding buffer ``name``'s flat storage."""
        buffer = self.graph.name_to_buffer.get(name)
        if isinstance(buffer, ConstantBuffer) or (
            isinstance(buffer, InputBuffer) and name in self.flat_inputs
        ):
            return f"{name}_flat"
        return name

    def pointer(self, name: str) -> str:
        """A kernel argument: the pointer variable on a GPU, the flat storage under the interpreter."""
        return f"{name}_p" if self.pointers else self.storage(name)

    def direct_calls(self) -> bool:
        """Whether this wrapper allocates and views through Note [Allocations and views without
        torch's Python layer] (the switch on, the functions present): binds them."""
        functions = _direct_functions(self.device) if self.direct else None
        if functions is None:
            return False
        self.namespace["_alloc"], self.namespace["_reinterpret"] = functions
        return True

    def take_pointer(self, name: str) -> None:
        """After ``name`` is bound to its flat storage: read its address once, if a kernel needs it."""
        if self.pointers and name in self.kernel_params:
            self.emit(f"{name}_p = {name}.data_ptr()")

    def view(self, value: Any, transient: bool = False) -> str:
        """Python expression for an extern argument or a graph output; ``transient``: an argument
        of an op that neither writes nor returns it (Note [Allocations and views without torch's
        Python layer])."""
        if isinstance(value, sympy.Expr) and not value.is_number:
            return self.size(value)  # Note [Symbolic sizes in the Triton wrapper]
        if isinstance(value, ReinterpretView):
            name = value.buffer.name
            if self.lean and name in self.shaped and self.shaped[name] == _layout_key(value.layout):
                return name  # Note [A lean wrapper]: the variable holds exactly this view
            base = self.storage(name)
            direct = self.reinterpret(name, base, value.layout) if transient else None
            # an input's own tensor takes as_strided's offset from its storage's start too
            return direct or f"{base}.as_strided({self.layout_args(value.layout)})"
        if isinstance(value, InputBuffer | ConstantBuffer):
            return value.name
        if isinstance(value, Buffer):
            if value.name in self.opaque or self.shaped.get(value.name) == _layout_key(value.layout):
                return value.name  # Note [Opaque extern results] in kiln_loopir's wrapper_support.py
            direct = self.reinterpret(value.name, value.name, value.layout) if transient else None
            view = direct or f"{value.name}.as_strided({self.layout_args(value.layout)})"
            if value.name in self.extern_results:  # an extern op may return None for it
                return f"(None if {value.name} is None else {view})"
            return view
        if isinstance(value, list):
            return "[" + ", ".join(self.view(v, transient) for v in value) + "]"
        if isinstance(value, tuple):
            inner = ", ".join(self.view(v, transient) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        return self.const(value)

    def reinterpret(self, name: str, base: str, layout: Any) -> str | None:
        """``_reinterpret(base, size, stride, offset)``: a view of ``base`` (the variable holding
        buffer ``name``) in ``layout`` without torch's Python layer, where the variable's storage
        offset is known when the wrapper is generated (the offset is relative to it); else None
        (Note [Allocations and views without torch's Python layer])."""
        if not self.fast:
            return None
        buffer = self.graph.name_to_buffer.get(name)
        if base != name or name in self.offset0:  # a flat view, an allocation, an extern result
            start = 0
        elif isinstance(buffer, InputBuffer) and name not in self.opaque_inputs:
            if not is_static_layout(buffer.layout):
                return None
            start = int(buffer.layout.offset)  # the input check made it so
        else:
            return None
        if not is_static_layout(layout):
            return None if start else f"_reinterpret({base}, {self.layout_args(layout)})"
        size, stride = tuple(layout.int_size()), tuple(layout.int_stride())
        return f"_reinterpret({base}, {size!r}, {stride!r}, {int(layout.offset) - start})"

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def allocate(self, buffer: Buffer) -> None:
        layout = buffer.layout
        if not is_static_layout(layout):
            self.allocate_symbolic(buffer)
            return
        n = int(layout.storage_size())
        dtype = self.const(layout.dtype)
        shape = dense_shape(layout) if self.pointers else None
        if shape is not None:  # Note [Buffers in the shape their readers view them on a GPU]
            shape = self.viewed_as.get(buffer.name, shape)
        if shape is not None and self.fast:  # Note [Allocations and views without torch's Python layer]
            size, stride = shape
            self.emit(f"{buffer.name} = _alloc({size!r}, {stride!r}, {dtype})")
            self.shaped[buffer.name] = (size, stride, 0)
        elif shape is not None:  # Note [Buffers in their own shape on a GPU]
            size, stride = shape
            self.emit(f"{buffer.name} = _empty_strided({size!r}, {stride!r}, dtype={dtype}, device=_device)")
            self.shaped[buffer.name] = (size, stride, 0)
        elif self.fast:
            self.emit(f"{buffer.name} = _alloc(({n},), (1,), {dtype})")
            self.shaped.pop(buffer.name, None)
        else:
            self.emit(f"{buffer.name} = _empty({n}, dtype={dtype}, device=_device)")
            self.shaped.pop(buffer.name, None)
        self.offset0.add(buffer.name)
        self.take_pointer(buffer.name)

    # --------------------------------------------------------------------------------- body

    def generate(self) -> str:
        graph = self.graph
        params = [
            spec.name if spec is not None else f"_unused{i}" for i, spec in enumerate(graph.graph_inputs)
        ]
        aligned: list[tuple[str, str]] = []
        opaque = self.opaque_inputs = opaque_inputs(graph.gm)
        self.fast = self.direct_calls()
        if self.pointers and self.lean and os.environ.get("KILN_VIEWED_BUFFERS", "1") != "0":
            self.viewed_as = viewed_as(self.schedule, graph.outputs)
        if self.symbolic:  # Note [Symbolic sizes in the Triton wrapper]
            for line in symbol_bindings(graph.sizevars, params):
                self.emit(line)
        derived_at = len(self.lines)
        laid_out = laid_out_inputs(graph.gm)  # Note [Inputs the forward laid out]
        for position, spec in enumerate(graph.graph_inputs):
            if spec is None:
                continue
            if spec.name in opaque:  # Note [Opaque extern results]: taken as it is
                self.emit(f"# {spec.name}: an opaque extern result, taken as it is")
                continue
            guarded = self.guarded_layouts or position in laid_out
            if not is_static_layout(spec.layout):
                self.symbolic_input(spec, aligned, guarded)
                continue
            layout, n = spec.layout, spec.name
            offset = int(layout.offset)
            # the kernels index memory with the strides seen at compile time; Note [Inputs the
            # frame guard checks]
            self.emit(self.static_input_check(n, layout, guarded and self.pointers))
            conform = self.conform_line(n, layout)
            if n in self.flat_inputs:
                self.emit(f"{n}_flat = {n}.as_strided(({int(layout.storage_size())},), (1,), 0)")
            if self.pointers and n in self.kernel_params:
                shift = f" - {offset * layout.dtype.itemsize}" if offset else ""
                self.emit(f"{n}_p = {n}.data_ptr(){shift}")
                aligned.append((n, f"{conform}; {n}_p = {n}.data_ptr(){shift}"))
        if aligned:  # Note [Kernel arguments are pointers]
            self.emit(f"if ({' | '.join(f'{n}_p' for n, _ in aligned)}) & 15:")
            for n, fix in aligned:
                self.emit(f"    if {n}_p & 15: {fix}")
        if self.pointers and self.kernel_params:
            self.emit(f"_stream = _get_stream({self.device.index or 0})")
        for name, value in graph.constants.items():
            layout = graph.name_to_buffer[name].layout
            on_device = value.to(self.device)
            self.namespace[name] = on_device
            self.namespace[f"{name}_flat"] = on_device.as_strided((int(layout.storage_size()),), (1,), 0)
            if self.pointers:
                self.namespace[f"{name}_p"] = on_device.data_ptr()
        self.emit_steps()  # Note [A wrapper's walk over the schedule] (kiln_loopir.wrapper_support)
        self.emit(f"return {self.view(graph.outputs)}")
        self.lines[derived_at:derived_at] = [f"{var} = {text}" for text, var in self.derived.items()]
        body = self.lines
        if self.device.type == "cuda" and torch.cuda.device_count() > 1:
            # Triton launches on the current device: make it the graph's
            body = [f"with _torch.cuda.device({self.device.index or 0}):", *("    " + b for b in body)]
        header = ["# kiln codegen_triton wrapper", f"def call({', '.join(params)}):"]
        return "\n".join([*header, *("    " + b for b in body)]) + "\n"

    def extern(self, kernel: ExternKernel) -> None:
        choice = self.templates.get(kernel.name)
        if choice is not None and choice.template is not None and choice.template.lone:
            self.lone_template(kernel, choice)
            return
        op = f"_op_{kernel.name}"
        self.namespace[op] = extern_callable(kernel.op)  # Note [Extern calls through torch's Python bindings]
        aten = isinstance(kernel.op, torch._ops.OpOverload)
        transient = self.fast and aliases_nothing(kernel.op)
        args = [self.extern_arg(a, aten, transient) for a in kernel.args]
        kwargs = dict(kernel.kwargs)
        if "device" in kwargs:
            kwargs["device"] = self.device
        args += [f"{k}={self.extern_arg(v, aten, transient)}" for k, v in kwargs.items()]
        self.emit(f"# extern {kernel.op}")
        opaque, grad = opaque_results(kernel, self.referenced.__contains__)
        call = f"_r = {op}({', '.join(args)})"
        if grad:
            # Note [Opaque extern results]: the op makes its workspace only under grad mode
            self.namespace["_grad_below_autograd"] = grad_mode_below_autograd
            self.emit("with _grad_below_autograd():")
            self.emit(f"    {call}")
        else:
            self.emit(call)
        for line in unbacked_bindings(self.graph.sizevars, kernel.name, "_r"):
            self.emit(line)  # Note [Data-dependent sizes in the Triton wrapper]
        took = False  # whether a result was bound to `_t` (Note [A lean wrapper])
        for out in kernel.outputs:
            self.extern_results.add(out.name)
            if out in opaque:
                if out.name in self.referenced:
                    self.opaque.add(out.name)
                    self.emit(f"{out.name} = _r" + "".join(f"[{i}]" for i in out.path))
                continue
            if out.name not in self.referenced:
                # Note [Unread extern outputs]: an auxiliary result nothing reads (the logsumexp
                # and RNG state of a fused attention in inference) is not taken: the real kernel
                # may leave it undefined or give it another shape than its meta kernel promised
                continue
            value = "_r" + "".join(f"[{i}]" for i in out.path)
            static = is_static_layout(out.layout)
            shape = dense_shape(out.layout) if self.pointers else None
            if shape is not None and self.lean and (static or self.lean_symbolic):
                size, stride = shape  # Note [A lean wrapper]: checked inline
                size_text, stride_text = self.sizes(size), self.sizes(stride)
                t = "_r"
                if out.path or not _one_tensor(kernel.op):  # one of several results, maybe None
                    self.emit(f"_t = {value}")
                    t, took = "_t", True
                if out.name in self.schedule.output_names:  # the caller sees every stride
                    strides = f"{t}.stride() == {stride_text} and "
                else:
                    strides = self.stride_check(t, size, stride, differ=False)
                maybe_none = "" if t == "_r" else f"{t} is not None and "
                self.emit(
                    f"{out.name} = {t} if {maybe_none}{t}.shape == {size_text} and {strides}"
                    f"not {t}.storage_offset() else _dense({t}, {size_text}, {stride_text}, 0)"
                )
                self.shaped[out.name] = _layout_key(out.layout)
                self.offset0.add(out.name)
                self.take_pointer(out.name)
                continue
            if not static:
                self.extern_output_symbolic(out, value)
                continue
            n = int(out.layout.storage_size())
            if shape is not None:  # Note [Buffers in their own shape on a GPU]
                size, stride = shape
                self.emit(f"{out.name} = _dense({value}, {size!r}, {stride!r}, 0)")
                self.shaped[out.name] = _layout_key(out.layout)
            else:
                self.emit(f"{out.name} = _flat({value}, {n}, {_layout_args(out.layout)})")
                self.shaped.pop(out.name, None)
            self.offset0.add(out.name)  # checked or copied into a layout from offset 0
            self.take_pointer(out.name)
        self.emit("del _r" + (", _t" if took else ""))

    def extern_arg(self, value: Any, aten: bool, transient: bool = False) -> str:
        """An extern op's argument; for an aten op, a list of int constants as a tuple literal
        (Note [A lean wrapper]), which its binding takes for an ``int[]`` as it takes a list.
        ``transient``: the op neither writes nor returns its arguments (:meth:`view`)."""
        if (
            aten
            and self.lean
            and isinstance(value, list)
            and value
            and all(type(v) in (int, bool) for v in value)
        ):
            return self.view(tuple(value))
        return self.view(value, transient)

    def place(self, buffer: Buffer, scratch: Set[str]) -> bool:
        """Give a kernel's output buffer its memory: the buffer the plan reuses for it, a new
        allocation, or (a scratch buffer only this kernel uses) a temporary; True for the last,
        which the caller deletes after the launch."""
        plan = self.schedule.plan
        if buffer.name in plan.allocate:
            reuse = plan.allocate[buffer.name]
            if reuse is not None:
                key = _layout_key(buffer.layout)
                shape = dense_shape(buffer.layout) if self.pointers and self.lean else None
                viewed = self.viewed_as.get(buffer.name) if shape is not None else None
                if viewed is not None:  # Note [Buffers in the shape their readers view them on a GPU]
                    key = (*viewed, 0)
                if shape is not None and self.shaped.get(reuse) == key:  # Note [A lean wrapper]
                    self.emit(f"{buffer.name} = {reuse}  # reuses {reuse}, in its shape")
                    self.shaped[buffer.name] = key
                elif viewed is not None:
                    size, stride = viewed
                    view = (
                        f"_reinterpret({reuse}, {size!r}, {stride!r}, 0)"
                        if self.fast and reuse in self.offset0
                        else f"{reuse}.as_strided({size!r}, {stride!r}, 0)"
                    )
                    self.emit(f"{buffer.name} = {view}  # reuses {reuse}")
                    self.shaped[buffer.name] = key
                    self.offset0.add(buffer.name)
                elif shape is not None and buffer.name in self.read_in_shape:
                    # the freed buffer is dead: the view escapes only as this one's variable
                    view = self.reinterpret(reuse, reuse, buffer.layout) or (
                        f"{reuse}.as_strided({self.layout_args(buffer.layout)})"
                    )
                    self.emit(f"{buffer.name} = {view}  # reuses {reuse}")
                    self.shaped[buffer.name] = key
                    self.offset0.add(buffer.name)
                else:
                    self.emit(f"{buffer.name} = {reuse}  # reuses {reuse}")
                    self.shaped.pop(buffer.name, None)
                if reuse in self.offset0:
                    self.offset0.add(buffer.name)
                self.emit(f"del {reuse}")
                self.take_pointer(buffer.name)
            else:
                self.allocate(buffer)
            return False
        if buffer.name in scratch:
            self.allocate(buffer)
            return True
        return False

    def alias_scatter(self, buffer: Scatter) -> None:
        """A scatter's name is the buffer it writes into, also when it has no elements (Note
        [Scatters with no elements] in codegen_cpp's wrapper)."""
        storage = self.storage(buffer.mutates)
        self.emit(f"{buffer.name} = {storage}")
        if buffer.mutates in self.shaped:
            self.shaped[buffer.name] = self.shaped[buffer.mutates]
        if buffer.mutates in self.offset0 or storage != buffer.mutates:  # or a flat view
            self.offset0.add(buffer.name)
        self.take_pointer(buffer.name)

    def kernel_scratch(self, node: BaseSchedulerNode) -> Set[str] | None:
        group = self.groups.get(node.name)
        return set(group.scratch) if group is not None else None

    def place_member(self, buffer: Buffer, scratch: Set[str]) -> list[str]:
        return [buffer.name] if self.place(buffer, scratch) else []

    def call_kernel(self, node: BaseSchedulerNode, step: int) -> list[str]:
        group = self.groups[node.name]
        assert group is not None
        temporaries = []
        for buffer in group.temporaries:
            self.allocate(buffer)
            temporaries.append(buffer.name)
        for i, spec in enumerate(group.specs):
            fn = f"_k{step}" + (f"_{i}" if len(group.specs) > 1 else "")
            launcher = self.launchers[spec.name]
            if self.pointers:
                launcher.install(self.namespace, fn)
                args = ", ".join(["_stream", *(self.pointer(p) for p in spec.params), *self.size_args(spec)])
            else:
                self.namespace[fn] = launcher
                args = ", ".join([*(self.storage(p) for p in spec.params), *self.size_args(spec)])
            self.emit(f"{fn}({args})  # {spec.name}")
        return temporaries

    def lone_template(self, kernel: ExternKernel, choice: MatmulChoice) -> None:
        """Note [Matmul templates]: a GEMM with no epilogue, run by its choice (the extern op or
        the template), which returns the product as :meth:`extern` would bind it."""
        assert choice.template is not None
        (out,) = kernel.outputs
        fn = f"_t_{kernel.name}"
        self.namespace[fn] = choice
        views = _tuple([self.view(a) for a in kernel.args])
        targs = _tuple(
            [self.pointer(p) if self.pointers else self.storage(p) for p in choice.template.params[:-1]]
        )
        stream = "_stream" if self.pointers else "None"
        self.emit(f"# {choice.template.name}, or extern {kernel.op}")
        self.emit(f"{out.name} = {fn}({stream}, {views}, {targs})")
        self.extern_results.add(out.name)
        if self.pointers and dense_shape(out.layout) is not None:
            self.shaped[out.name] = _layout_key(out.layout)
        else:
            self.shaped.pop(out.name, None)
        self.take_pointer(out.name)

    def template(self, node: TemplateSchedulerNode, step: int) -> None:
        """Note [Matmul templates]: one call of the node's :class:`MatmulChoice`, which runs the
        extern op and the epilogue kernel or the template; without a template, those two lines."""
        choice = self.templates.get(node.name)
        group = self.groups.get(node.name)
        if choice is None or choice.template is None or group is None:
            self.extern(node.extern.node)
            self.kernel(node, step)
            return
        epilogue = group.specs[0]
        product = node.extern.node.outputs[0].name
        temporaries = []
        for m in node.epilogue.get_nodes():
            buffer = m.node  # type: ignore[attr-defined]
            if self.place(buffer, set(group.scratch)):
                temporaries.append(buffer.name)

        def arg(p: str) -> str:
            return self.pointer(p) if self.pointers else self.storage(p)

        fn = f"_t{step}"
        self.namespace[fn] = choice
        views = _tuple([self.view(a) for a in node.extern.node.args])
        targs = _tuple([arg(p) for p in choice.template.params])
        eargs = _tuple(["None" if p == product else arg(p) for p in epilogue.params])
        stream = "_stream" if self.pointers else "None"
        self.emit(f"# {choice.template.name}, or extern {node.extern.node.op} + {epilogue.name}")
        self.emit(f"{fn}({stream}, {views}, {targs}, {eargs})")
        for name in temporaries:
            self.emit(f"del {name}")

    # ------------------------------------------------- Note [Symbolic sizes in the Triton wrapper]

    def size(self, expr: Any, floating: bool = False) -> str:
        """A size as Python source: an int, a symbol's variable, or the variable of a composite
        size, computed once per call after the symbols are read. ``floating``: a float of sizes,
        kept as it is (Note [Python float arithmetic on sizes, in its order] in kiln_symbolic)."""
        expr = sympy.sympify(expr) if floating else sympy.expand(sympy.sympify(expr))
        if expr.is_Integer or isinstance(expr, sympy.Symbol):
            return py_size(expr)
        text = py_size(expr)
        if expr.free_symbols & self.graph.sizevars.unbacked.keys():
            return f"({text})"  # Note [Data-dependent sizes in the Triton wrapper]
        if text not in self.derived:
            self.derived[text] = f"_ks{len(self.derived)}"
        return self.derived[text]

    def size_args(self, spec: Any) -> list[str]:
        """A kernel's size arguments: the symbols' variables, then the variables of its floats of
        sizes (Note [Floats of sizes in Triton] in kernel.py), computed once per call as Python
        computes them, with the composite sizes."""
        # and the integers of floats of sizes (Note [Integers of floats of sizes in Triton])
        derived = {**dict(spec.float_params), **dict(spec.int_params)}
        return [self.size(derived[p], floating=True) if p in derived else p for p in spec.size_params]

    def layout_args(self, layout: Any) -> str:
        """``size, stride, offset`` of ``layout`` as Python source."""
        if is_static_layout(layout):
            return _layout_args(layout)
        return f"{self.sizes(layout.size)}, {self.sizes(layout.stride)}, {self.size(layout.offset)}"

    def symbolic_input(self, spec: InputBuffer, aligned: list[tuple[str, str]], guarded: bool) -> None:
        """An input of symbolic layout: checked against the layout as expressions of the symbols
        (``guarded``: its storage offset only, Note [Inputs the frame guard checks])."""
        layout, n = spec.layout, spec.name
        dtype = self.const(layout.dtype)
        offset = self.size(layout.offset)
        conform = f"{n} = _conform({n}, {self.layout_args(layout)}, dtype={dtype}, name={n!r})"
        if guarded and self.pointers:  # Note [Inputs the frame guard checks]
            self.emit(f"if {n}.storage_offset() != {offset}: {conform}")
        else:
            self.emit(
                f"if {n}.stride() != {self.sizes(layout.stride)} or {n}.storage_offset() != {offset} "
                f"or {n}.shape != {self.sizes(layout.size)} or {n}.dtype is not {dtype}: {conform}"
            )
        if n in self.flat_inputs:
            self.emit(f"{n}_flat = {n}.as_strided(({self.size(layout.storage_size())},), (1,), 0)")
        if self.pointers and n in self.kernel_params:
            shift = f" - {self.size(layout.offset * layout.dtype.itemsize)}" if layout.offset != 0 else ""
            self.emit(f"{n}_p = {n}.data_ptr(){shift}")
            aligned.append((n, f"{conform}; {n}_p = {n}.data_ptr(){shift}"))

    def allocate_symbolic(self, buffer: Buffer) -> None:
        layout = buffer.layout
        dtype = self.const(layout.dtype)
        shape = dense_shape(layout) if self.pointers else None
        if shape is not None and self.fast:  # Note [Allocations and views without torch's Python layer]
            size, stride = shape
            self.emit(f"{buffer.name} = _alloc({self.sizes(size)}, {self.sizes(stride)}, {dtype})")
            self.shaped[buffer.name] = _layout_key(layout)
        elif shape is not None:  # Note [Buffers in their own shape on a GPU]
            size, stride = shape
            self.emit(
                f"{buffer.name} = _empty_strided({self.sizes(size)}, {self.sizes(stride)}, dtype={dtype}, device=_device)"
            )
            self.shaped[buffer.name] = _layout_key(layout)
        elif self.fast:
            self.emit(f"{buffer.name} = _alloc(({self.size(layout.storage_size())},), (1,), {dtype})")
            self.shaped.pop(buffer.name, None)
        else:
            self.emit(
                f"{buffer.name} = _empty({self.size(layout.storage_size())}, dtype={dtype}, device=_device)"
            )
            self.shaped.pop(buffer.name, None)
        self.offset0.add(buffer.name)
        self.take_pointer(buffer.name)

    def extern_output_symbolic(self, out: Buffer, value: str) -> None:
        shape = dense_shape(out.layout) if self.pointers else None
        if shape is not None:  # Note [Buffers in their own shape on a GPU]
            size, stride = shape
            self.emit(f"{out.name} = _dense({value}, {self.sizes(size)}, {self.sizes(stride)}, 0)")
            self.shaped[out.name] = _layout_key(out.layout)
        else:
            n = self.size(out.layout.storage_size())
            self.emit(f"{out.name} = _flat({value}, {n}, {self.layout_args(out.layout)})")
            self.shaped.pop(out.name, None)
        self.offset0.add(out.name)  # checked or copied into a layout from offset 0
        self.take_pointer(out.name)

    def fallback(self, node: BaseSchedulerNode, members: list[ComputedBuffer]) -> None:
        """Run a kernel the Triton generator declined with loopir's interpreter (never wrong)."""
        entries = []
        for name, buffer in self.touched_buffers(node).items():
            storage = self.storage(name)
            # the interpreter indexes flat storage. On a GPU any variable may hold a tensor in a
            # shape: also one that took over a buffer allocated in its own (``place``, whose
            # variable ``shaped`` does not track: layout_fuzz.py seed 306 handed the interpreter a
            # 4-D tensor); a view per declined kernel's buffer costs nothing beside the interpreter
            if storage in self.shaped or self.pointers:
                n = int(buffer.layout.storage_size())
                storage = f"{storage}.as_strided(({n},), (1,), 0)"
            entries.append(f"{name!r}: {storage}")
        fn = f"_interpret_{node.name}"
        self.namespace[fn] = members_runner(members)
        self.emit(f"{fn}({{{', '.join(entries)}}})  # not expressible in Triton: reference interpreter")


def _direct_functions(device: torch.device) -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """(allocate, reinterpret) of Note [Allocations and views without torch's Python layer] for
    ``device``, where this torch has them."""
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    alloc = getattr(guards, f"_empty_strided_{device.type}", None)
    reinterpret = getattr(guards, "_reinterpret_tensor", None)
    if alloc is None or reinterpret is None:
        return None
    return alloc, reinterpret


def _tuple(items: list[str]) -> str:
    """Python source of a tuple of ``items``."""
    return "(" + "".join(f"{i}, " for i in items).rstrip(" ") + ")"


def _one_tensor(op: Any) -> bool:
    """Whether the aten op returns exactly one (never None) tensor."""
    schema = getattr(op, "_schema", None)
    if not isinstance(op, torch._ops.OpOverload) or schema is None or len(schema.returns) != 1:
        return False
    return str(schema.returns[0].type) == "Tensor"


def _layout_key(layout: Any) -> tuple[Any, ...]:
    if not is_static_layout(layout):  # sympy expressions compare by structure
        return (tuple(layout.size), tuple(layout.stride), layout.offset)
    return (tuple(layout.int_size()), tuple(layout.int_stride()), int(layout.offset))


def make_wrapper(
    schedule: Scheduler,
    graph: GraphLowering,
    groups: dict[str, KernelGroup | None],
    launchers: dict[str, Launcher],
    guarded_layouts: bool = False,
    templates: dict[str, MatmulChoice] | None = None,
) -> tuple[Callable[..., Any], str]:
    """(the ``call`` function, its source)."""
    gen = WrapperCodegen(schedule, graph, groups, launchers, guarded_layouts, templates)
    source = gen.generate()
    namespace = gen.namespace
    exec(compile(source, "<kiln-triton-wrapper>", "exec"), namespace)
    return namespace["call"], source
