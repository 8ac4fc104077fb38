"""The graph under construction for one frame, and the side effects to replay after it.

`OutputGraph` owns the torch.fx.Graph, its placeholders (one per distinct input tensor, in the
order first reached, each with the `Source` the runner uses to fetch it), the guard builder, the
variable builder and `SideEffects`. `create_call` is the single door through which tensor
operations enter the graph: it runs the operation on fake tensors first, then adds the node and
wraps the result.

`SideEffects` records mutations of things that outlive the frame: attribute stores on modules and
objects (replayed in program order), and lists, dicts and sets from outside the frame whose
contents changed (rewritten in place). Objects created inside the frame need no record: they are
trackers, and only reach the outside through the return value or through such a store.
"""

from __future__ import annotations

import linecache
import types
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten

from kiln_dynamo import inference
from kiln_dynamo.exc import Unsupported
from kiln_dynamo.fake import FakeMode, FakeTensor, dispatch_for, from_real
from kiln_dynamo.guards import GuardBuilder
from kiln_dynamo.shapes import ShapeContext
from kiln_dynamo.source import CodeContext, ConstSource, Source
from kiln_dynamo.unbacked import unbacked_sizes
from kiln_dynamo.variables.base import CellVariable, ConstantVariable, VariableTracker
from kiln_dynamo.variables.builder import VariableBuilder
from kiln_dynamo.variables.lists import NamedTupleVariable, SizeVariable, TupleVariable
from kiln_dynamo.variables.symbolic import SYM_TYPES, SymNodeVariable, is_symbolic_value
from kiln_dynamo.variables.tensor import TensorVariable, fake_arg, graph_arg

if TYPE_CHECKING:
    from kiln_dynamo.translator import InstructionTranslator
    from kiln_dynamo.variables.locks import HeldLock
    from kiln_dynamo.variables.module_hooks import ModuleHookRegistration

VT = VariableTracker


class SideEffects:
    def __init__(self) -> None:
        self.attr_stores: list[tuple[VT, str, VT]] = []
        self._pending: dict[tuple[int, str], VT] = {}
        self.unseen_stores: set[int] = set()  # ids of objects `store_unseen` wrote to
        self.mutated_containers: dict[int, VT] = {}
        self.mutations = 0
        # (input tensor, hook) in call order: `t.register_hook(hook)` replayed after the graph
        # (Note [Hooks on input tensors] in variables/tensor.py)
        self.tensor_hooks: list[tuple[VT, VT]] = []
        # module hook registrations replayed after the graph, in call order (Note [Module hooks
        # registered in the frame] in variables/module_hooks.py)
        self.module_hooks: list[ModuleHookRegistration] = []
        # (function, constant arguments) called after the graph, in order: a warning
        # (Note [Warnings replayed after the graph] in variables/diagnostics.py)
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        # the with-block over a lock whose effects are replayed under it (Note [Effects under a
        # lock replayed under it] in variables/locks.py)
        self.held_lock: HeldLock | None = None

    def pending_attr(self, obj: object, name: str) -> VT | None:
        return self._pending.get((id(obj), name))

    def has_pending_attrs(self, obj: object) -> bool:
        return any(k[0] == id(obj) for k in self._pending)

    def store_attr(self, target: VT, obj: object, name: str, value: VT) -> None:
        self._pending[(id(obj), name)] = value
        self.attr_stores.append((target, name, value))

    def store_unseen(self, obj: object, name: str, value: VT) -> None:
        """A store on an object nothing outside the frame can see (a class made in the frame):
        later reads in the frame see it, nothing is replayed."""
        self._pending[(id(obj), name)] = value
        self.unseen_stores.add(id(obj))

    def mutated(self, container: VT) -> None:
        if container.source is not None:
            self.mutated_containers[id(container)] = container
            self.mutations += 1  # counts a container mutated again too (variables/locks.py)

    def is_mutated(self, container: VT) -> bool:
        return id(container) in self.mutated_containers

    def any(self) -> bool:
        return bool(
            self.attr_stores
            or self.mutated_containers
            or self.tensor_hooks
            or self.module_hooks
            or self.calls
        )


class OutputGraph:
    def __init__(
        self,
        code: types.CodeType,
        entry_names: list[str],
        f_globals: dict[str, Any],
        shapes: ShapeContext | None = None,
    ) -> None:
        self.code = code
        self.shapes = shapes if shapes is not None else ShapeContext(False, None)
        self.entry_names = entry_names
        self.f_globals = f_globals
        self.graph = torch.fx.Graph()
        self.ctx = CodeContext(entry_names)
        self.guards = GuardBuilder(self.ctx)
        self.builder = VariableBuilder(self)
        self.side_effects = SideEffects()
        # where a chain split's second pass stops, per inlining depth (Note [Resuming a chain of
        # frames] in breaks.py); None for other passes
        self.break_path: tuple[int, ...] | None = None
        self.inputs: list[tuple[torch.fx.Node, Source, torch.Tensor]] = []
        self._input_by_id: dict[int, TensorVariable] = {}
        self._real_cells: dict[int, CellVariable] = {}
        self.fallback_reasons: list[str] = []
        self.open_contexts: list[Any] = []  # real autocast contexts entered while tracing
        self.initial_grad_mode = torch.is_grad_enabled()
        # the grad mode an exception leaving the graph leaves behind (Note [Grad mode when a
        # graph raises] in codegen.py): the entry mode, or the mode outside the grad-mode blocks a
        # continuation began inside, once the graph left them
        self.unwind_grad_mode = self.initial_grad_mode
        # torch.inference_mode() blocks open in the trace (Note [inference_mode traced])
        self.inference_depth = 0
        self._const_sources: dict[int, ConstSource] = {}
        # weakref.ref(obj) made in the frame, one per referent's source (Note [Weak references
        # made in the frame] in variables/stdlib.py)
        self.new_weakrefs: dict[Source, VariableTracker] = {}
        self.guards.where = f"{code.co_filename}:{code.co_firstlineno} (global state at entry)"
        self.guards.global_state()

    def const_source(self, obj: object, label: str) -> ConstSource:
        """One source per held object, so that reads through it share guards and locals."""
        src = self._const_sources.get(id(obj))
        if src is None:
            src = self._const_sources[id(obj)] = ConstSource(obj, label)
        return src

    # --- inputs -------------------------------------------------------------------------------
    def add_input(self, value: torch.Tensor, source: Source) -> TensorVariable:
        hit = self._input_by_id.get(id(value))
        if hit is not None:
            return hit
        if type(value) not in (
            torch.Tensor,
            torch.nn.Parameter,
            torch.nn.Buffer if hasattr(torch.nn, "Buffer") else torch.Tensor,
        ):
            raise Unsupported(f"tensor subclass {type(value).__qualname__} at {source.name()}")
        if value.is_sparse or value.layout != torch.strided:
            raise Unsupported(f"non-strided tensor at {source.name()}")
        layout = self.shapes.fake_layout(value, source)
        fake = from_real(value, layout)
        inference.mark_input(fake, value)
        if layout is not None:
            self.shapes.dynamic_inputs.append((source, fake))
        self.guards.tensor(source, value, fake)
        name = _node_name(source.name())
        node = self._placeholder(name)
        node.meta["val"] = fake
        node.meta["source"] = source.name()
        self.inputs.append((node, source, value))
        vt = TensorVariable(node, fake, type(value), source)
        self._input_by_id[id(value)] = vt
        return vt

    def _placeholder(self, name: str) -> torch.fx.Node:
        """A new graph input, after the inputs made so far (placeholders lead the graph)."""
        if self.inputs:
            ctx = self.graph.inserting_after(self.inputs[-1][0])
        elif len(self.graph.nodes) > 0:
            ctx = self.graph.inserting_before(next(iter(self.graph.nodes)))
        else:
            ctx = self.graph.inserting_after(None)
        with ctx:
            return self.graph.placeholder(name)

    def add_int_input(self, value: int, source: Source) -> VT | None:
        """An int argument of the frame as a `Sym` graph input when the shape policy makes it
        symbolic (shapes.ShapeContext.int_symbol); None when it stays a guarded constant."""
        sym = self.shapes.int_symbol(value, source)
        if sym is None:
            return None
        self.guards.type_match(source, value)
        node = self._placeholder(_node_name(source.name()))
        node.meta["val"] = sym
        node.meta["source"] = source.name()
        self.inputs.append((node, source, value))  # type: ignore[arg-type]
        return SymNodeVariable(node, sym)

    def known_cell(self, cell: types.CellType) -> CellVariable | None:
        """The tracker already standing for a real cell, if any."""
        return self._real_cells.get(id(cell))

    def real_cell(self, cell: types.CellType, make: Any) -> CellVariable:
        hit = self._real_cells.get(id(cell))
        if hit is None:
            hit = CellVariable(make())
            hit.source = None
            self._real_cells[id(cell)] = hit
            hit.real = True  # type: ignore[attr-defined]
        return hit

    # --- nodes --------------------------------------------------------------------------------
    def _run_fake(self, kind: str, target: Any, fargs: list[Any], fkwargs: dict[str, Any]) -> Any:
        # Note [Composite operators under symbolic sizes]
        with (
            FakeMode(),
            unbacked_sizes(self.shapes.unbacked_env),
            dispatch_for(tree_flatten((fargs, fkwargs))[0]),
        ):
            if kind == "call_method":
                return getattr(fargs[0], target)(*fargs[1:], **fkwargs)
            return target(*fargs, **fkwargs)

    # Note [In-place writes into inputs autograd computed]: a fake made from a real tensor is a
    # leaf whatever the real one is (Note [is_leaf of an input] in variables/tensor.py), so an
    # in-place op on an input that requires grad failed autograd's leaf check on the fakes ("a
    # leaf Variable that requires grad is being used in an in-place operation") although eager
    # runs it when the input is an autograd result: `h.add_(x)` on `h = w * 1.0`, and every
    # `x += y` of a continuation after a graph break in a training forward, whose inputs are the
    # activations before the break. Where the written tensor (the op's first argument) is such an
    # input and the real one is not a leaf (guarded, `L['h'].is_leaf is False`), the op runs on
    # the fakes with autograd's check off: the fakes' metadata is the same, and aotgrad traces the
    # real non-leaf input's write (its gradient through the new value, Note [Inputs whose
    # gradient comes only through their new values]). A real leaf still breaks, as eager raises.
    def _writes_non_leaf_input(self, tx: InstructionTranslator, e: RuntimeError, args: list[VT]) -> bool:
        if "a leaf Variable that requires grad is being used in an in-place operation" not in str(e):
            return False
        if not args or not isinstance(args[0], TensorVariable) or not torch.is_grad_enabled():
            return False
        fake = args[0].fake
        if not (fake.requires_grad and fake.is_leaf and getattr(fake, "from_real", False)):
            return False
        return args[0].input_is_leaf(tx) is False

    def create_call(
        self, tx: InstructionTranslator, kind: str, target: Any, args: list[VT], kwargs: dict[str, VT]
    ) -> VT:
        grad = kwargs.get("requires_grad")
        if grad is not None and not (grad.is_constant() and grad.as_constant() is False):
            # a new leaf that requires grad: a graph (and the backend's autograd) has no such
            # thing, so the call runs in Python and the leaf enters the rest as an input
            raise Unsupported(
                f"{getattr(target, '__name__', target)}(..., requires_grad=True) makes a new leaf tensor that "
                "requires grad inside the compiled frame",
                advice="create the tensor outside the compiled function (or as a module parameter)",
            )
        fargs = [fake_arg(a) for a in args]
        fkwargs = {k: fake_arg(v) for k, v in kwargs.items()}
        in_block = self.inference_depth > 0
        if not in_block and torch.is_inference_mode_enabled():
            in_block = True  # the frame runs under the mode: what it makes is inference too
            self.guards.inference_mode()
        if not in_block:
            refused = inference.check_use(kind, target, fargs, fkwargs)
            if refused is not None:  # Note [inference_mode traced]
                raise Unsupported(refused, advice="keep the inference tensor's uses inside the block")
        self.shapes.env.where = tx.where
        try:
            try:
                out = self._run_fake(kind, target, fargs, fkwargs)
            except RuntimeError as e:
                if not self._writes_non_leaf_input(tx, e, args):
                    raise
                # Note [In-place writes into inputs autograd computed]
                with torch.no_grad():
                    out = self._run_fake(kind, target, fargs, fkwargs)
        except Unsupported:
            raise
        except Exception as e:
            label = target if isinstance(target, str) else getattr(target, "__name__", str(target))
            first = str(e).splitlines()[0] if str(e) else ""
            raise Unsupported(f"{label} failed on fake tensors: {type(e).__name__}: {first}") from e
        gargs = tuple(graph_arg(a) for a in args)
        gkwargs = {k: graph_arg(v) for k, v in kwargs.items()}
        node = self.graph.create_node(kind, target, gargs, gkwargs)
        node.meta["source_line"] = tx.where()
        node.meta["stack_trace"] = tx.stack_trace()
        inference.mark_results(tree_flatten(out)[0], tree_flatten((fargs, fkwargs))[0], in_block)
        node.meta[inference.IN_BLOCK] = in_block
        return self.wrap_result(node, out)

    def wrap_result(self, node: torch.fx.Node, out: Any) -> VT:
        import operator

        if isinstance(out, FakeTensor):
            node.meta["val"] = out
            return TensorVariable(node, out)
        if isinstance(out, torch.Tensor):
            raise Unsupported(f"{node.target} produced a real tensor during tracing")
        if isinstance(out, SYM_TYPES) and is_symbolic_value(out):
            node.meta["val"] = out
            return SymNodeVariable(node if not isinstance(out, torch.SymBool) else None, out)
        if isinstance(out, torch.Size) and is_symbolic_value(out):
            node.meta["val"] = out
            parts: list[VT] = []
            for i, item in enumerate(out):
                sub = self.graph.create_node("call_function", operator.getitem, (node, i), {})
                parts.append(self.wrap_result(sub, item))
            return SizeVariable(parts)
        if isinstance(out, (tuple, list)):
            flat, _ = tree_flatten(out)
            if not any(isinstance(x, torch.Tensor) for x in flat):
                self.graph.erase_node(node)
                return self.builder.wrap(out, None)
            node.meta["val"] = out
            items: list[VT] = []
            for i, item in enumerate(out):
                sub = self.graph.create_node("call_function", operator.getitem, (node, i), {})
                sub.meta["source_line"] = node.meta.get("source_line")
                items.append(self.wrap_result(sub, item))
            if type(out).__module__ == "torch.return_types":
                return NamedTupleVariable(items, type(out))
            return TupleVariable(items)
        if out is None:
            return ConstantVariable(None)  # kept: a node returning None is run for its effect
        self.graph.erase_node(node)
        if isinstance(out, (bool, int, float, torch.dtype, torch.device, str)):
            return ConstantVariable(out)
        if isinstance(out, torch.Size):
            return SizeVariable([ConstantVariable(int(s)) for s in out])
        raise Unsupported(f"{node.target} returned {type(out).__name__}, which the graph cannot carry")

    def set_grad_mode(self, mode: bool) -> None:
        node = self.graph.create_node("call_function", torch._C._set_grad_enabled, (mode,), {})
        node.meta["source_line"] = "grad mode"
        torch._C._set_grad_enabled(mode)

    def op_count(self) -> int:
        return sum(
            1 for n in self.graph.nodes if n.op in ("call_function", "call_method", "call_module", "get_attr")
        )


def _node_name(source_name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in source_name)
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_") or "arg"


def source_line(filename: str, lineno: int | None) -> str:
    if lineno is None:
        return ""
    return linecache.getline(filename, lineno).strip()
