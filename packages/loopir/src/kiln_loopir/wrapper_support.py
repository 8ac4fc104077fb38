"""Runtime helpers every code generator's wrapper calls (one copy, shared by the cpp and triton
backends): they move tensors between the layouts loopir planned and the ones they arrive in.

``flat_storage`` takes an extern kernel's result as the flat storage of the layout loopir planned
for it (copied only when its strides differ); ``dense_storage`` keeps a result whose dense layout
already matches as the tensor it is; ``conform_input`` copies a graph input given with
other strides into the layout the kernels were compiled for, refusing a different shape or dtype;
``layout_args`` spells a layout as those functions' arguments in generated source. A result of
another shape than planned (a meta kernel that disagrees with the device's) raises
``ExternShapeMismatch`` naming ``op``, never a broadcasting copy. ``OPAQUE_RESULTS`` and
``OPAQUE_ARGS`` name the extern results no layout describes (Note [Opaque extern results]).
``extern_callable`` is what a wrapper binds for an extern op (Note [Extern calls through torch's
Python bindings]). ``WrapperConstants`` is the part of a wrapper generator that puts a
compile-time value into the generated source or, when it has no literal, into the namespace;
``WrapperSteps`` adds the walk over the schedule every wrapper's body is (Note [A wrapper's walk
over the schedule]), a kernel node's step in it included (Note [A kernel step in a wrapper]).
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
from collections import Counter
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy
import torch
import torch.fx
from kiln_symbolic import FloorDiv as ShapeFloorDiv
from kiln_symbolic import expr_of, hint_of, pexpr

from .indexing import FloorDiv, ModularIndexing
from .ir import Buffer, ComputedBuffer, ConstantBuffer, ExternKernel, InputBuffer, ReinterpretView, Scatter
from .layout import Layout
from .scheduler import (
    BaseSchedulerNode,
    ExternKernelSchedulerNode,
    NopKernelSchedulerNode,
    Scheduler,
    TemplateSchedulerNode,
)

if TYPE_CHECKING:
    from .graph import GraphLowering  # graph.py imports this module

# Note [Opaque extern results]: some aten ops return a buffer whose size only their kernel knows
# and that only another aten op reads: ``mkldnn_rnn_layer``'s workspace (oneDNN's, for
# ``mkldnn_rnn_layer_backward``: 28,672 bytes for a small LSTM layer) is ``(0,)`` uint8 in the meta
# kernel. And the kernel makes it only while grad mode is on (``train`` and
# ``GradMode::is_enabled()``): under autograd in eager, but a compiled training forward runs
# inside ``autograd.Function.forward``, with grad mode off, where it returned None and the
# backward failed (an LSTM in training fell back to eager at run time). A wrapper therefore
#   * calls such an op, when its ``train`` argument is true and an opaque result is read (a
#     graph output, or another extern op's argument), with grad mode on below autograd (``grad_mode_below_autograd``: the kernel sees
#     eager's grad mode, nothing is recorded for autograd), so it makes the workspace eager makes;
#   * binds an opaque result as the tensor returned (no layout check, no copy, no view) and
#     returns it as such;
#   * does not check the layout of a graph input that only opaque arguments read
#     (``opaque_inputs``): the backward graph's workspace input.
# Only the C++ wrapper does this so far; codegen_triton's wrapper does not yet.


@dataclass(frozen=True, slots=True)
class OpaqueResults:
    """An op with results of a size only its kernel knows (Note [Opaque extern results])."""

    results: frozenset[int]  # positions in the op's result
    train_arg: int  # position of the argument that asks for them (``train``)


_aten = torch.ops.aten
OPAQUE_RESULTS: dict[Any, OpaqueResults] = {
    _aten.mkldnn_rnn_layer.default: OpaqueResults(frozenset({3}), train_arg=15),
}
# op -> positions of arguments that take an opaque result
OPAQUE_ARGS: dict[Any, frozenset[int]] = {
    _aten.mkldnn_rnn_layer_backward.default: frozenset({22}),
}


def grad_mode_below_autograd() -> contextlib.ExitStack:
    """Grad mode on for the kernel, autograd's dispatch keys skipped (Note [Opaque extern results])."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.enable_grad())
    stack.enter_context(torch._C._AutoDispatchBelowAutograd())
    return stack


def opaque_inputs(gm: torch.fx.GraphModule) -> set[str]:
    """Placeholders read only as opaque arguments of extern ops (Note [Opaque extern results])."""
    out = set()
    for node in gm.graph.nodes:
        if node.op != "placeholder" or not node.users:
            continue
        if all(
            user.op == "call_function"
            and user.target in OPAQUE_ARGS
            and not any(v is node for v in user.kwargs.values())
            and all(i in OPAQUE_ARGS[user.target] for i, a in enumerate(user.args) if a is node)
            for user in node.users
        ):
            out.add(node.name)
    return out


def _extern_arg(kernel: Any, index: int) -> Any:
    """An extern op's argument by schema position (given positionally or by name)."""
    if index < len(kernel.args):
        return kernel.args[index]
    schema = getattr(kernel.op, "_schema", None)
    if schema is not None and index < len(schema.arguments):
        return kernel.kwargs.get(schema.arguments[index].name)
    return None


def opaque_results(kernel: Any, is_read: Callable[[str], bool]) -> tuple[list[Any], bool]:
    """For an extern kernel (Note [Opaque extern results]): its opaque outputs, and whether its
    call must run with grad mode on below autograd (its ``train`` argument is true and one of
    them is read: ``is_read(buffer name)``)."""
    results = OPAQUE_RESULTS.get(kernel.op)
    if results is None:
        return [], False
    opaque = [o for o in kernel.outputs if o.path[:1] and o.path[0] in results.results]
    grad = _extern_arg(kernel, results.train_arg) is True and any(is_read(o.name) for o in opaque)
    return opaque, grad


class ExternShapeMismatch(RuntimeError):
    """An extern op returned a tensor of another shape than the meta kernel it was planned with."""


def _check_shape(t: torch.Tensor, size: tuple[int, ...], op: str) -> None:
    # Never copy with broadcasting: a (1,) result copied into a planned (n,) buffer is a silent
    # wrong answer. A meta kernel that disagrees with the device kernel is an error here.
    if tuple(t.shape) != tuple(size):
        raise ExternShapeMismatch(
            f"{op or 'an extern op'} returned shape {list(t.shape)} where its meta kernel promised {list(size)}"
        )


def flat_storage(
    t: torch.Tensor | None, n: int, size: tuple[int, ...], stride: tuple[int, ...], offset: int, op: str = ""
) -> torch.Tensor | None:
    """``t`` as the flat storage of a tensor with this layout (copied if its strides differ).

    An extern op may return None where its meta kernel promised a tensor: CUDA flash attention's
    ``cum_seq_q``/``cum_seq_k`` are undefined tensors for dense inputs. Nothing reads those in a
    graph (they exist for nested inputs), so None passes through; a reader would fail loudly.
    """
    if t is None:
        return None
    _check_shape(t, size, op)
    if tuple(t.shape) == size and tuple(t.stride()) == stride and t.storage_offset() == offset:
        return t.as_strided((n,), (1,), 0)
    out = torch.empty(n, dtype=t.dtype, device=t.device)
    out.as_strided(size, stride, offset).copy_(t)
    return out


def dense_storage(
    t: torch.Tensor | None, size: tuple[int, ...], stride: tuple[int, ...], offset: int, op: str = ""
) -> torch.Tensor | None:
    """An extern result in the dense layout planned for it, kept as the tensor it is when it
    already has that layout (else copied): for wrappers that hold buffers in their own shape."""
    if t is None:
        return None
    _check_shape(t, size, op)
    if t.shape == size and t.stride() == stride and t.storage_offset() == offset:
        return t
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def conform_input(
    t: torch.Tensor,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    offset: int,
    *,
    dtype: torch.dtype,
    name: str,
) -> torch.Tensor:
    """An input given with other strides than at compile time, copied into the expected layout.

    A different shape or dtype is refused: the kernels would read out of place.
    """
    if tuple(t.shape) != size or t.dtype != dtype:
        raise ValueError(f"input {name} was compiled for {list(size)} {dtype}, got {list(t.shape)} {t.dtype}")
    n = offset + sum((s - 1) * st for s, st in zip(size, stride, strict=True)) + 1 if all(size) else 0
    out = torch.empty(n, dtype=t.dtype, device=t.device).as_strided(size, stride, offset)
    out.copy_(t)
    return out


def dense_shape(layout: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(size, stride) when a tensor of that shape owns exactly the layout's storage (dense, from
    offset 0, not empty): a buffer a wrapper may allocate in its own shape. Ints, or sympy
    expressions where the layout is symbolic (Note [Symbolic sizes in loopir]); print them with
    ``py_tuple``."""
    if not is_static_layout(layout):
        size, stride = tuple(layout.size), tuple(layout.stride)
        if layout.offset != 0 or any(n == 0 for n in size):
            return None
        if sympy.expand(layout.storage_size() - sympy.Mul(*size)) != 0:
            return None
        return size, stride
    size, stride = tuple(layout.int_size()), tuple(layout.int_stride())
    if int(layout.offset) != 0 or math.prod(size) == 0:
        return None
    if int(layout.storage_size()) != math.prod(size):
        return None
    return size, stride


def viewed_as(schedule: Scheduler, outputs: Any) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """For each computed buffer of static layout, the dense (size, stride) over its whole storage
    that extern arguments and graph outputs view it with most often: the shape a wrapper whose
    kernels reach buffers through their data pointer may allocate it in, so that those views
    pass the tensor itself (Note [Buffers allocated as their readers view them] in codegen_cpp's
    wrapper.py; the GPU form of codegen_triton's)."""
    counts: dict[str, Counter[tuple[tuple[int, ...], tuple[int, ...]]]] = {}

    def visit(value: Any) -> None:
        if isinstance(value, list | tuple):
            for v in value:
                visit(v)
            return
        layout: Any
        if isinstance(value, ReinterpretView):
            buffer, layout = value.buffer, value.layout
        elif isinstance(value, Buffer):
            buffer, layout = value, value.layout
        else:
            return
        if isinstance(buffer, InputBuffer | ConstantBuffer) or not isinstance(buffer, Buffer):
            return
        mine = buffer.layout
        if not (is_static_layout(layout) and is_static_layout(mine)) or layout.dtype != mine.dtype:
            return
        dense = dense_shape(layout)
        if dense is not None and int(layout.storage_size()) == int(mine.storage_size()):
            counts.setdefault(buffer.name, Counter())[dense] += 1

    for node in schedule.nodes:
        extern = node.extern.node if isinstance(node, TemplateSchedulerNode) else None
        if isinstance(node, ExternKernelSchedulerNode):
            extern = node.node
        if isinstance(extern, ExternKernel):
            visit(extern.args)
            visit(list(extern.kwargs.values()))
    visit(outputs)
    return {name: c.most_common(1)[0][0] for name, c in counts.items()}


def layout_args(layout: Layout) -> str:
    """``size, stride, offset`` of ``layout`` as Python source (for generated wrappers)."""
    if not is_static_layout(layout):
        return f"{py_tuple(layout.size)}, {py_tuple(layout.stride)}, {py_size(layout.offset)}"
    return f"{tuple(layout.int_size())!r}, {tuple(layout.int_stride())!r}, {int(layout.offset)}"


def is_static_layout(layout: Any) -> bool:
    return all(sympy.sympify(e).is_Integer for e in (*layout.size, *layout.stride, layout.offset))


def symbol_bindings(sizevars: Any, params: list[str]) -> list[str]:
    """Note [Symbolic sizes in the wrapper]: the lines of a generated ``call(*params)`` that bind
    each size symbol of ``sizevars`` (a :class:`~kiln_loopir.sizevars.SizeVars`) to a local
    variable named as the symbol, read once per call from the input that holds it (a size, a
    stride, a storage offset or an int argument); every derived size a wrapper prints is then an
    expression over those variables. Both code generators' wrappers start with these lines."""
    lines = []
    for sym, src in sorted(sizevars.sources.items(), key=lambda kv: str(kv[0])):
        arg = params[src.input]
        if src.kind == "int":
            lines.append(f"{sym} = {arg}")
        elif src.kind == "offset":
            lines.append(f"{sym} = {arg}.storage_offset()")
        else:
            lines.append(f"{sym} = {arg}.{src.kind}({src.dim})")
    return lines


def unbacked_bindings(sizevars: Any, kernel: str, result: str) -> list[str]:
    """Note [Unbacked sizes in loopir]: the lines of a generated wrapper that bind each
    data-dependent symbol extern kernel `kernel` computes, read from its result `result` right
    after the call (a size of an output tensor, or the int an `.item()` returns)."""
    lines = []
    for sym, src in sorted(sizevars.unbacked.items(), key=lambda kv: str(kv[0])):
        if src.kernel != kernel:
            continue
        value = result + "".join(f"[{i}]" for i in src.path)
        lines.append(f"{sym} = {value}.size({src.dim})" if src.kind == "size" else f"{sym} = int({value})")
    return lines + unbacked_asserts(sizevars, kernel)


# Note [Checks of data-dependent sizes at run time]: `torch._check(k <= x.size(0))` on a
# data-dependent `k` is a fact capture uses (a narrower range, a view instead of a clamping
# slice) and that eager checks on every call, raising RuntimeError when it fails. The ShapeEnv
# keeps each such fact as a deferred assert; the wrapper checks it right after the extern call
# that binds its data-dependent symbols, so a call whose data break the fact raises as eager
# does instead of running on a false assumption (``DataDependentCheckFailed``, a RuntimeError as
# eager's, which kiln's run-time fallback re-raises instead of running the graph eagerly: the
# captured graph holds no check). A fact over the symbols of several extern calls is checked
# after the last of them (kernels bind in lowering order, which is the order they run in). A
# fact may have become a replacement (`torch._check(m == k)` makes `m` read as `k`): aotgrad
# keeps the operator computing `m` even when nothing reads it, and loopir binds `m` to it under
# its own name (`SizeVars.define_unbacked`), so the check still sees both values.
_RELATIONS = {
    sympy.GreaterThan: ">=",
    sympy.StrictGreaterThan: ">",
    sympy.LessThan: "<=",
    sympy.StrictLessThan: "<",
    sympy.Equality: "==",
    sympy.Unequality: "!=",
}


def checkable_fact(expr: Any) -> bool:
    """Whether the wrapper checks the deferred assert ``expr`` at run time (a relation)."""
    return type(expr) in _RELATIONS


def unbacked_asserts(sizevars: Any, kernel: str) -> list[str]:
    """The wrapper lines that check the deferred asserts whose last data-dependent symbol extern
    kernel ``kernel`` binds (Note [Checks of data-dependent sizes at run time])."""
    env = getattr(sizevars, "shape_env", None)
    if env is None:
        return []
    # loopir's symbols and the ShapeEnv's are matched by name (to_loopir rebuilds them)
    order = list(dict.fromkeys(src.kernel for src in sizevars.unbacked.values()))
    if kernel not in order:
        return []
    bound_by = {str(s): src.kernel for s, src in sizevars.unbacked.items()}
    known = {str(s) for s in (*sizevars.sources, *sizevars.unbacked)}
    lines = []
    for guard in env.deferred_asserts:
        expr = guard.expr
        free = {str(s) for s in expr.free_symbols}
        unbacked = {str(s) for s in expr.free_symbols if env.is_unbacked(s)}
        if not unbacked or not unbacked <= bound_by.keys() or not free <= known:
            continue
        if max(order.index(bound_by[s]) for s in unbacked) != order.index(kernel):
            continue
        op = _RELATIONS.get(type(expr))
        if op is None:
            continue
        message = f"torch._check({expr}) failed at {guard.where}"
        lines.append(f"if not ({pexpr(expr.lhs)} {op} {pexpr(expr.rhs)}): raise _CheckFailed({message!r})")
    return lines


class DataDependentCheckFailed(RuntimeError):
    """A ``torch._check`` on a data-dependent size failed at run time (Note [Checks of
    data-dependent sizes at run time]): the user's error, raised as eager raises it (a
    RuntimeError), never taken for a compiler failure to fall back from."""


def symbol_values(sizevars: Any) -> Callable[..., tuple[int, ...]]:
    """A function of a call's arguments returning the value of every size symbol of
    ``sizevars``, in ``symbol_bindings``' order (a CUDA graph is recorded per distinct tuple)."""
    items = []
    for _, src in sorted(sizevars.sources.items(), key=lambda kv: str(kv[0])):
        arg = f"a[{src.input}]"
        if src.kind == "int":
            items.append(arg)
        elif src.kind == "offset":
            items.append(f"{arg}.storage_offset()")
        else:
            items.append(f"{arg}.{src.kind}({src.dim})")
    source = f"lambda *a: ({', '.join(items)}{',' if len(items) == 1 else ''})"
    fn: Callable[..., tuple[int, ...]] = eval(compile(source, "<kiln symbol values>", "eval"))
    return fn


def py_size(expr: Any) -> str:
    """A size expression as Python source over the wrapper's symbol variables (which are named
    as the symbols: ``s0``), with Python's ``//`` and ``%`` (sizes are never negative)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return str(int(expr))
    expr = expr.replace(
        lambda e: isinstance(e, ModularIndexing),
        lambda e: sympy.Mod(FloorDiv(e.args[0], e.args[1]), e.args[2]),
    )
    expr = expr.replace(lambda e: isinstance(e, FloorDiv), lambda e: ShapeFloorDiv(*e.args))
    return pexpr(expr)


def py_tuple(exprs: Any) -> str:
    """A tuple of sizes as Python source (``(2, 3)``, ``(s0,)``, ``()``)."""
    items = [py_size(e) for e in exprs]
    if len(items) == 1:
        return f"({items[0]},)"
    return "(" + ", ".join(items) + ")"


def dense_tensor(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: ``t``'s layout is a permutation of a contiguous one."""
    if any(isinstance(v, torch.SymInt) for v in (*t.stride(), *t.shape)):
        return _dense_symbolic(t)
    pairs = sorted((s, n) for s, n in zip(t.stride(), t.shape, strict=True) if n != 1)
    expected = 1
    for stride, size in pairs:
        if stride != expected:
            return False
        expected *= size
    return True


def _dense_symbolic(t: torch.Tensor) -> bool:
    """``dense_tensor`` over symbolic sizes and strides, decided on expressions ordered by their
    hints: comparing SymInts would guard on them, and a guard added while loopir lowers refuses
    the graph (Note [Symbolic sizes in loopir]). A symbolic size is never taken for 1 (0/1 are
    specialized); a stride must equal the product of the smaller dims' sizes as expressions."""
    dims = [
        (int(hint_of(s)), int(hint_of(n)), sympy.sympify(expr_of(s)), sympy.sympify(expr_of(n)))
        for s, n in zip(t.stride(), t.shape, strict=True)
        if isinstance(n, torch.SymInt) or n != 1
    ]
    pairs = [(stride, size) for _, _, stride, size in sorted(dims, key=lambda d: (d[0], d[1]))]
    expected: sympy.Expr = sympy.Integer(1)
    for stride, size in pairs:
        if sympy.expand(stride - expected) != 0:
            return False
        expected = expected * size
    return True


# Note [Extern calls through torch's Python bindings]: a wrapper calls an extern op on every call
# of the graph, and a transformer's graph calls dozens (T5 at GPU size: 127 per call, mostly
# GEMMs and attention). Called as an ``OpOverload`` (``torch.ops.aten.mm.default(a, b)``), each
# goes through ``OpOverload.__call__`` and the boxed operator's schema matching: 7.1 us for a 2x2
# ``mm`` on this project's CI machine, against 3.8 us through ``torch.mm``, the generated Python
# binding eager code and torch.compile's wrappers call (``addmm``: 10.5 against 6.2 us); the
# H200 host is slower still. Both paths reach the same dispatcher entry with the same arguments
# (the binding is generated from the same schema: names, defaults, keyword-only arguments), so a
# wrapper binds the binding for the ops of :data:`BOUND_OPS`, in their ``default`` and ``out``
# overloads only (where the binding's own overload resolution cannot pick another overload for
# the arguments a graph passes). Any other op is called as the ``OpOverload`` it is.
# The pooling ops a conv net calls have their bindings in ``torch._C._nn`` (:data:`NN_BOUND_OPS`;
# ``max_pool2d_with_indices`` about half the OpOverload's host time on this CPU); ops with only a
# ``default`` and an ``out`` overload, so the binding cannot resolve to another. The backward ops
# (``convolution_backward``, ``max_pool2d_with_indices_backward``) have no binding and stay
# OpOverloads, as torch.compile's wrapper calls them.
# ``KILN_EXTERN_BINDINGS=0`` (read when a wrapper is generated) calls every op as its OpOverload.
BOUND_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addmv",
        "mv",
        "dot",
        "convolution",
        "embedding",
        "native_layer_norm",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_adaptive_avg_pool2d",
        "_native_batch_norm_legit_no_training",
    }
)
NN_BOUND_OPS = frozenset(
    {"max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d", "adaptive_max_pool2d"}
)


def extern_callable(op: Any) -> Any:
    """What a wrapper calls for the extern op ``op`` (Note [Extern calls through torch's Python
    bindings]): torch's Python binding of the same operator where :data:`BOUND_OPS` names it."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return op
    if os.environ.get("KILN_EXTERN_BINDINGS", "1") == "0":
        return op
    if op._overloadname not in ("default", "out"):
        return op
    name = op._schema.name.partition("::")[2]
    if name in NN_BOUND_OPS:
        return getattr(torch._C._nn, name, op)
    if name not in BOUND_OPS:
        return op
    return getattr(torch._C._VariableFunctions, name, op)


def aliases_nothing(op: Any) -> bool:
    """Whether the extern op, an aten operator, writes none of its arguments and returns none of
    them (no alias annotation in its schema); anything else may alias, as far as a wrapper
    knows: a view passed to such an op is not seen after the call (Note [Allocations and views
    without torch's Python layer] in codegen_triton's wrapper.py), and its result is memory of
    its own (Note [Scratch buffers that persist] in codegen_cpp's wrapper.py)."""
    schema = getattr(op, "_schema", None)
    if not isinstance(op, torch._ops.OpOverload) or schema is None:
        return False
    return all(a.alias_info is None for a in (*schema.arguments, *schema.returns))


# Note [The names every wrapper uses]: both code generators' wrappers are Python source run
# in a namespace of their own. The names the two spell the same way (the helpers above, the
# error a failed check raises, torch's allocations) come from here, so a third backend's wrapper
# starts from them; each generator adds its own (the C++ kernels' profiler range, the Triton
# wrapper's device).
def wrapper_namespace() -> dict[str, Any]:
    """The names every generated wrapper's source may use (Note [The names every wrapper uses])."""
    return {
        "math": math,  # sizes from floats of sizes (Note [Integers of floats of sizes])
        "_torch": torch,
        "_flat": flat_storage,
        "_dense": dense_storage,
        "_conform": conform_input,
        "_CheckFailed": DataDependentCheckFailed,
        "_empty": torch.empty,
        "_empty_strided": torch.empty_strided,
    }


class WrapperConstants:
    """How a wrapper generator names a compile-time value in its source: a literal where Python
    has one (None, bools, ints, strings, finite floats, dtypes as ``_torch.<name>``), otherwise a
    fresh ``_c<N>`` bound in the wrapper's namespace. A subclass keeps ``consts`` (values bound
    so far) and ``namespace``."""

    consts: int
    namespace: dict[str, Any]

    def const(self, value: Any) -> str:
        if value is None or isinstance(value, bool | int | str):
            return repr(value)
        if isinstance(value, torch.dtype):
            return f"_torch.{str(value).removeprefix('torch.')}"
        if isinstance(value, float) and math.isfinite(value):
            return repr(value)
        name = f"_c{self.consts}"
        self.consts += 1
        self.namespace[name] = value
        return name


# Note [A wrapper's walk over the schedule]: every wrapper generator emits the schedule's nodes in
# order the same way, and what it must keep is the same in each: an extern node is a call, a
# template node is the generator's (only one that wants templates gets them, Backend's
# ``wants_templates``), a no-op node (no elements) still binds its buffer (a scatter's name to
# the buffer it writes into, Note [Scatters with no elements] in codegen_cpp's wrapper.py; an
# allocation another node reads), a kernel node is the generator's own; after each step the
# buffers the plan frees then are deleted, unless another buffer took their memory over (it
# lives on under the other name) or they are graph outputs. Both generators held this loop, and
# a fix to one (the scatter of no elements) had to be made in both; it is written once here, and
# a generator says only how it emits each kind of node.
class WrapperSteps(WrapperConstants):
    """The walk over the schedule a wrapper generator's ``call`` body is made of (Note [A
    wrapper's walk over the schedule]). A subclass keeps ``schedule`` and ``graph`` and
    implements ``emit`` (a line of the body), ``extern``, ``alias_scatter``, ``allocate``, and,
    if its backend wants templates, ``template``; for kernel nodes either ``kernel`` itself or
    the four parts of it (Note [A kernel step in a wrapper]): ``kernel_scratch``,
    ``place_member``, ``call_kernel`` and ``fallback``."""

    schedule: Scheduler
    graph: GraphLowering
    lean: bool  # Note [Strides of size-one dims of inputs]

    def emit(self, line: str) -> None:
        raise NotImplementedError

    def size(self, expr: Any) -> str:
        """A size as Python source (:func:`py_size`); a generator may name composite sizes."""
        return py_size(expr)

    def sizes(self, exprs: Any) -> str:
        """A tuple of sizes as Python source, each through :meth:`size` (``(s0,)``, ``()``)."""
        items = [self.size(e) for e in exprs]
        return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"

    # Note [Strides of size-one dims of inputs]: a wrapper compares a tensor's strides with the
    # ones its kernels were compiled for only on its dims of more than one element: a dim of size
    # one is never stepped over, so its stride moves no address, and a kernel or an
    # ``as_strided`` view of the tensor reads the same elements whatever it is. The full
    # comparison copied, on every backward call of a training step, each saved BatchNorm
    # statistic (``(1, C, 1, 1)``, returned by the forward with strides ``(1, 1, 1, 1)``,
    # compiled as ``(C, 1, 1, 1)``): a fresh buffer and a copy per statistic per call (87 a step
    # of the tiny ResNet on the CPU, ``scripts/host_ab.py --device cpu --size tiny --mode
    # train``; one per BatchNorm layer on a GPU, the first rule of the Triton wrapper's Note [A
    # lean wrapper]). A symbolic size is compared (it may be 1 at run time: then a needless
    # copy, never a missed one). ``lean`` off (``KILN_LEAN_WRAPPER=0``, read when a wrapper is
    # generated) compares every stride, in both generators.
    def stride_check(self, n: str, size: Any, stride: Any, differ: bool = True) -> str:
        """``<n's strides differ> or `` (``differ``; else ``<they are equal> and ``) as Python
        source, or nothing (Note [Strides of size-one dims of inputs]; ``n`` has ``size``)."""
        op, join = (" != ", " or ") if differ else (" == ", " and ")
        keep = [i for i, k in enumerate(size) if k != 1] if self.lean else list(range(len(size)))
        if len(keep) == len(size):
            return f"{n}.stride(){op}{self.sizes(stride)}{join}"
        if not keep:
            return ""
        if len(keep) == 1:
            return f"{n}.stride({keep[0]}){op}{self.size(stride[keep[0]])}{join}"
        getter = self.const(operator.itemgetter(*keep))
        return f"{getter}({n}.stride()){op}{self.sizes([stride[i] for i in keep])}{join}"

    def conform_line(self, n: str, layout: Layout) -> str:
        """The statement that makes input ``n`` a tensor of ``layout`` (a copy where it is not)."""
        return f"{n} = _conform({n}, {layout_args(layout)}, dtype={self.const(layout.dtype)}, name={n!r})"

    def static_input_check(self, n: str, layout: Layout, guarded: bool) -> str:
        """The line that checks input ``n`` against the static ``layout`` its kernels were
        compiled for (strides as Note [Strides of size-one dims of inputs] says, storage
        offset, shape, dtype) and conforms it where it differs; ``guarded``: only its storage
        offset, which the frame guard does not check (the rest it does)."""
        stride, offset = tuple(layout.int_stride()), int(layout.offset)
        size, dtype = tuple(layout.int_size()), self.const(layout.dtype)
        conform = self.conform_line(n, layout)
        if guarded:
            return f"if {n}.storage_offset() != {offset}: {conform}"
        return (
            f"if {self.stride_check(n, size, stride)}{n}.storage_offset() != {offset} "
            f"or {n}.shape != {size!r} or {n}.dtype is not {dtype}: {conform}"
        )

    def extern(self, kernel: ExternKernel) -> None:
        raise NotImplementedError

    def alias_scatter(self, buffer: Scatter) -> None:
        raise NotImplementedError

    def allocate(self, buffer: Buffer) -> None:
        raise NotImplementedError

    # Note [A kernel step in a wrapper]: a kernel node's step is the same in every wrapper: each
    # member is given its memory (a scatter's name is bound to the buffer it writes into, Note
    # [Scatters with no elements] in codegen_cpp's wrapper.py), then the compiled kernel is
    # called or, where the generator declined the node, loopir's reference interpreter runs its
    # members (never wrong, only slow), and the temporaries die after the call. A member is
    # scratch (a temporary) when the compiled kernel says so, and every member is when it was
    # declined (the interpreter writes what the kernel would have kept to itself). What differs
    # is how each generator places a buffer, calls its kernels and hands storage to the
    # interpreter: the four hooks below; ``touched_buffers`` is what the interpreter needs.
    def kernel(self, node: BaseSchedulerNode, step: int) -> None:
        """Emit one kernel node (Note [A kernel step in a wrapper])."""
        members = node.members()
        scratch = self.kernel_scratch(node)
        declined = scratch is None
        if scratch is None:
            scratch = {m.name for m in members}
        temporaries: list[str] = []
        for buffer in members:
            if isinstance(buffer, Scatter):
                self.alias_scatter(buffer)
                continue
            temporaries += self.place_member(buffer, scratch)
        if declined:
            self.fallback(node, members)
        else:
            temporaries += self.call_kernel(node, step)
        for name in temporaries:
            self.emit(f"del {name}")

    def kernel_scratch(self, node: BaseSchedulerNode) -> Set[str] | None:
        """The scratch buffers of ``node``'s compiled kernel; None where it was declined."""
        raise NotImplementedError

    def place_member(self, buffer: Buffer, scratch: Set[str]) -> list[str]:
        """Give a kernel member its memory; the variables to delete after the call."""
        raise NotImplementedError

    def call_kernel(self, node: BaseSchedulerNode, step: int) -> list[str]:
        """Emit the call(s) of ``node``'s compiled kernel; more variables to delete after it."""
        raise NotImplementedError

    def fallback(self, node: BaseSchedulerNode, members: list[ComputedBuffer]) -> None:
        """Emit a run of a declined node's ``members`` by loopir's reference interpreter."""
        raise NotImplementedError

    def touched_buffers(self, node: BaseSchedulerNode) -> dict[str, Buffer]:
        """The graph's buffers that ``node``'s members read or write, in the order of their
        names: the storage a declined kernel's interpreter run is given."""
        names: set[str] = set()
        for m in node.get_nodes():
            names |= m.read_names() | m.write_names()
        known = self.graph.name_to_buffer
        return {name: known[name] for name in sorted(names) if name in known}

    def template(self, node: TemplateSchedulerNode, step: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} makes no templates")

    def emit_steps(self) -> None:
        """Emit every node of the schedule, in order, each followed by the frees after it."""
        plan = self.schedule.plan
        reused_sources = {v for v in plan.allocate.values() if v is not None}
        for step, node in enumerate(self.schedule.nodes):
            if isinstance(node, ExternKernelSchedulerNode):
                self.extern(node.node)
            elif isinstance(node, TemplateSchedulerNode):  # Note [Matmul templates]
                self.template(node, step)
            elif isinstance(node, NopKernelSchedulerNode):
                self.emit(f"# {node.name}: no elements")
                if isinstance(node.node, Scatter):  # Note [Scatters with no elements]
                    self.alias_scatter(node.node)
                elif node.node.name in plan.allocate:
                    self.allocate(node.node)
            else:
                self.kernel(node, step)
            for name in plan.free_after.get(step, ()):
                if name not in reused_sources and name not in self.schedule.output_names:
                    self.emit(f"del {name}")
