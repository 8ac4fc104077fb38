"""What runs instead of the frame: a generated Python runner behind a bytecode trampoline.

After tracing, the return value tracker and the recorded side effects are rendered as Python
source for one function, the runner:

    def ___run(L0, L1, ...):                 # the frame's entry values, in the hook's order
        G = ___frame_globals()               # only when a global is read or written
        ___o = ___compiled(L0, L1._parameters['weight'], ...)   # graph inputs via their sources
        L1.count = ___o[1]                   # side effects, in program order
        L2[:] = [___o[2], 3]                 # an input list that the frame mutated
        return (___o[0], L0)                 # the return value rebuilt

The transformed code object (`bytecode.build_trampoline`) has the original's signature and only
calls the runner with the entry values, so the frame hook's cache entry is (guard, trampoline).
`Reconstructor` is the small interface trackers use to render themselves (`source`, `const`,
`graph_output`). A frame split by a graph break has a runner too: it ends by returning the stack
slots and live locals the split code needs (resume.py), instead of the return value.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from kiln_dynamo import inference
from kiln_dynamo.exc import Unsupported
from kiln_dynamo.output import OutputGraph
from kiln_dynamo.source import CodeContext, Source
from kiln_dynamo.variables.base import VariableTracker
from kiln_dynamo.variables.dicts import DictVariable, SetVariable
from kiln_dynamo.variables.lists import ListVariable, OutsideIteratorVariable, advance_iterator
from kiln_dynamo.variables.opaque import restore_autocast, set_autocast_state


class Reconstructor:
    def __init__(self, output: OutputGraph) -> None:
        self.output = output
        self.ctx = CodeContext(output.entry_names, parent=output.ctx, cse=True)
        self.outputs: list[torch.fx.Node] = []
        self.memo: dict[int, str] = {}  # Note [One object, one rebuild]
        self._out_index: dict[torch.fx.Node, int] = {}
        self.needs_globals = False
        # the runner ends the frame (not a split): the frame's own cells hold their last values
        # (Note [Functions made in the frame that leave it])
        self.final = True

    def source(self, source: Source) -> str:
        if source.needs_globals():
            self.needs_globals = True
        return self.ctx.bind(source)

    def const(self, obj: object) -> str:
        return self.ctx.const(obj)

    def graph_output(self, node: torch.fx.Node) -> str:
        if node not in self._out_index:
            self._out_index[node] = len(self.outputs)
            self.outputs.append(node)
        return f"___o[{self._out_index[node]}]"

    def is_mutated(self, vt: VariableTracker) -> bool:
        return self.output.side_effects.is_mutated(vt)

    def bound(self, vt: VariableTracker) -> str | None:
        """The local a mutable object created in the frame was bound to (Note [One object, one
        rebuild]), or None."""
        return self.memo.get(id(vt))


# Note [One object, one rebuild]: a list, dict, set or object created inside the frame may be
# reachable several ways (a local and a stack slot, the object behind a bound method `s.add`, an
# item of another container, a stored attribute and the return value). Rebuilt once per way, it
# would become several objects, and a mutation through one would not show through the others.
# So the runner binds each such object to a local once, children first, and every later
# reconstruction of that tracker is the local.
def _mutables(roots: list[VariableTracker]) -> list[VariableTracker]:
    from kiln_dynamo.variables.base import MethodVariable
    from kiln_dynamo.variables.functions import BoundMethodVariable, NestedFunctionVariable
    from kiln_dynamo.variables.lists import BaseListVariable, IsliceCountVariable, ListIteratorVariable
    from kiln_dynamo.variables.nn_module import ModuleSliceVariable, NewModuleVariable
    from kiln_dynamo.variables.user_defined import NewObjectVariable

    out: list[VariableTracker] = []
    seen: set[int] = set()

    def visit(vt: VariableTracker) -> None:
        if id(vt) in seen:
            return
        seen.add(id(vt))
        children: list[VariableTracker] = []
        if isinstance(vt, ListVariable) and vt.unread:
            children = list(vt.appended)  # rebuilt from its source (Note [Lists read only when needed])
        elif isinstance(vt, BaseListVariable | ModuleSliceVariable):
            children = list(vt.items)
        elif isinstance(vt, IsliceCountVariable):
            children = [vt.count]
        elif isinstance(vt, ListIteratorVariable):
            children = vt.rebuild_parts()
        elif isinstance(vt, DictVariable):
            children = vt.wrapped_values()  # Note [Lazy dict entries]
        elif isinstance(vt, NewObjectVariable):
            children = list(vt.attrs.values())
        elif isinstance(vt, MethodVariable):
            children = [vt.obj]
        elif isinstance(vt, BoundMethodVariable):
            children = [vt.fn, vt.obj]
        elif isinstance(vt, NestedFunctionVariable):  # Note [Functions made in the frame that leave it]
            children = vt.escape_children()
        for child in children:
            visit(child)
        mutable = isinstance(
            vt,
            ListVariable
            | DictVariable
            | NewObjectVariable
            | NewModuleVariable
            | ModuleSliceVariable
            | ListIteratorVariable
            | NestedFunctionVariable,
        ) or (isinstance(vt, SetVariable) and not vt.frozen)
        if mutable and vt.source is None:
            out.append(vt)

    for root in roots:
        visit(root)
    return out


_RELEASE = "# the lock is released here"


@dataclass(slots=True)
class RunnerSpec:
    source: str
    outputs: list[torch.fx.Node]
    needs_graph: bool


def generate_runner(
    output: OutputGraph,
    result: VariableTracker | None,
    values: list[VariableTracker] | None = None,
    grad_mode: bool | None = None,
    autocast_reenter: list[tuple[Any, ...]] | None = None,
) -> tuple[RunnerSpec, Reconstructor]:
    """The runner's source. It returns `result` rebuilt, or, for a frame split by a graph break,
    the tuple of `values` (stack slots and live locals, resume.py) after setting `grad_mode`.
    Each tracker in `values` is rebuilt once, so two slots holding one list stay one list."""
    from kiln_dynamo.translator import _GlobalsTarget

    cg = Reconstructor(output)
    cg.final = values is None
    body: list[str] = []
    # Note [Sources are read before the effects]: every value the runner reaches through a source
    # is the object that path held at the frame's entry (a value the frame stored there is its
    # tracker, not the source); so each source is read right after the graph call, before the
    # first effect is replayed, wherever the line that needs it is. Read at that line, after an
    # effect replayed on the container above it, the path reached what the frame put there, or
    # nothing: `o = st.pop("o"); return o` raised KeyError in the runner, and a dict iterator
    # the frame popped, held on the stack across a split before its loop, was looked up again
    # in the emptied dict (found by the eighteenth session's staleness sweep).
    reads: list[str] = []
    effects: list[str] = []

    def emit(line: str) -> None:
        reads.extend(cg.ctx.drain())
        effects.append(line)

    args = ", ".join(cg.source(src) for _, src, _ in output.inputs)
    body.extend(cg.ctx.drain())
    graph_call_at = len(body)
    body.append(f"___o = ___compiled({args})")
    side = output.side_effects
    held = side.held_lock
    containers = list(side.mutated_containers.values())
    # Note [Effects under a lock replayed under it]: each effect log up to the block's exit is
    # replayed while the lock is held, the rest after it is released
    cuts = (
        [
            (0, 0, 0, 0, 0),
            (held.module_hooks, held.attr_stores, held.calls, held.containers, held.tensor_hooks),
        ]
        if held is not None
        else [(0, 0, 0, 0, 0)]
    )
    ends = (
        len(side.module_hooks),
        len(side.attr_stores),
        len(side.calls),
        len(containers),
        len(side.tensor_hooks),
    )

    def container_roots(vts: list[VariableTracker]) -> list[VariableTracker]:
        roots: list[VariableTracker] = []
        for vt in vts:
            if isinstance(vt, OutsideIteratorVariable):
                continue  # advanced in place below: nothing of it is rebuilt
            if isinstance(vt, ListVariable) and vt.unread:
                roots += vt.appended
            else:
                roots += (
                    list(vt.items.values())
                    if isinstance(vt, DictVariable)
                    else list(getattr(vt, "items", []))
                )
        return roots

    # Note [Module hooks registered in the frame]: the hooks, then their registrations, then the
    # rest, so that anything rebuilt after them holds the real handles
    def bind_mutables(vts: list[VariableTracker]) -> None:
        for vt in _mutables(vts):
            if id(vt) not in cg.memo:
                local = f"___m{len(cg.memo)}"
                emit(f"{local} = {vt.reconstruct(cg)}")
                cg.memo[id(vt)] = local

    bind_mutables([reg.hook for reg in side.module_hooks])
    for part, lo in enumerate(cuts):
        hi = cuts[part + 1] if part + 1 < len(cuts) else ends
        for k in range(lo[0], hi[0]):
            reg = side.module_hooks[k]
            emit(f"___h{k} = {reg.replay(cg)}")
            cg.memo[id(reg.handle)] = f"___h{k}"
        stores = side.attr_stores[lo[1] : hi[1]]
        changed = containers[lo[3] : hi[3]]
        bind_mutables([v for _, _, v in stores] + container_roots(changed))
        for target, name, value in stores:
            val = value.reconstruct(cg)
            if isinstance(target, _GlobalsTarget):
                if target.is_root:
                    cg.needs_globals = True
                    emit(f"G[{name!r}] = {val}")
                else:
                    emit(f"{cg.const(target.f_globals)}[{name!r}] = {val}")
            else:
                if target.source is None:
                    raise Unsupported("attribute store on an object without a source")
                emit(f"{cg.const(target.replay_store())}({cg.source(target.source)}, {name!r}, {val})")
        for fn, fn_args in side.calls[lo[2] : hi[2]]:
            emit(f"{cg.const(fn)}(*{cg.const(fn_args)})")
        for vt in changed:
            assert vt.source is not None
            where = cg.source(vt.source)
            if isinstance(vt, ListVariable) and vt.unread:  # Note [Lists read only when needed]
                emit(f"{where}.extend(({''.join(i.reconstruct(cg) + ', ' for i in vt.appended)}))")
            elif isinstance(vt, ListVariable):
                emit(f"{where}[:] = [{', '.join(i.reconstruct(cg) for i in vt.items)}]")
            elif isinstance(vt, DictVariable):
                inner = ", ".join(f"{k!r}: {v.reconstruct(cg)}" for k, v in vt.items.items())
                emit(f"{where}.clear(); {where}.update({{{inner}}})")
            elif isinstance(vt, SetVariable):
                emit(f"{where}.clear(); {where}.update({cg.const(tuple(vt.items))})")
            elif isinstance(vt, OutsideIteratorVariable):  # Note [Iterators over a dict from outside]
                emit(f"{cg.const(advance_iterator)}({where}, {vt.index}, {vt.exhausted})")
            else:
                raise Unsupported(f"mutation of {vt.describe()} visible outside the frame")
        for tensor, hook in side.tensor_hooks[lo[4] : hi[4]]:  # Note [Hooks on input tensors]
            emit(f"{tensor.reconstruct(cg)}.register_hook({hook.reconstruct(cg)})")
        if part + 1 < len(cuts):
            emit(_RELEASE)
    # Note [What leaves the frame is rebuilt after the effects]: the objects the frame made that
    # only its result or the continuation's values reach are bound after every effect is
    # replayed. A live iterator among them (Note [Iterators that leave the frame over a live
    # list], Note [Dict iterators that leave the frame]) is rebuilt over the outside container
    # as the frame left it: rebuilt before `d.clear(); d.update(...)` replayed a key the frame
    # added before making `iter(d.values())`, its next step raised "dictionary changed size
    # during iteration" (found by pyfuzz, seed 141). Sources are still read before the effects
    # (Note [Sources are read before the effects]); objects an effect stores are bound before it.
    bind_mutables(values if values is not None else [result] if result is not None else [])
    for node in output.graph.nodes:  # Note [Leaving a block entered before the frame]
        if node.op == "call_function" and node.target is set_autocast_state:
            emit(f"{cg.const(restore_autocast)}(*{cg.const(tuple(node.args))})")
    if values is None:
        assert result is not None
        out = result.reconstruct(cg)
        if grad_mode is not None:
            emit(f"___ret = {out}")
            emit(f"{cg.const(torch._C._set_grad_enabled)}({grad_mode})")
            out = "___ret"
        emit(f"return {out}")
    else:
        names: dict[int, str] = {}
        for vt in values:
            if id(vt) not in names:
                names[id(vt)] = f"___s{len(names)}"
                emit(f"{names[id(vt)]} = {vt.reconstruct(cg)}")
        if grad_mode is not None:
            emit(f"{cg.const(torch._C._set_grad_enabled)}({grad_mode})")
        for block in autocast_reenter or []:
            from torch.amp.autocast_mode import _enter_autocast

            emit(f"{cg.const(_enter_autocast)}(*{cg.const(block)})")
        emit(f"return ({''.join(names[id(vt)] + ', ' for vt in values)})")
    body += reads + effects
    needs_graph = bool(cg.outputs) or output.op_count() > 0
    made_inference = tuple(i for i, n in enumerate(cg.outputs) if inference.is_inference(n.meta.get("val")))
    if made_inference and needs_graph:  # Note [inference_mode traced] (inference.py)
        if inference.whole_graph_in_block(output.graph.nodes):
            call = body[graph_call_at]
            assert call.startswith("___o = ___compiled(")
            body[graph_call_at] = call.replace(
                "___compiled(", f"{cg.const(inference.call_in_mode)}(___compiled, ", 1
            )
        else:
            body.insert(
                graph_call_at + 1, f"___o = {cg.const(inference.to_inference)}(___o, {made_inference!r})"
            )
    if not needs_graph:
        del body[graph_call_at]
    elif any(n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in output.graph.nodes):
        # Note [Grad mode when a graph raises]: the graph enters and leaves the frame's grad-mode
        # blocks itself; an operator that raises inside one would leave its mode set, where
        # eager's `with` exit restores it. The mode at entry is pinned by the guard, and is the
        # mode outside every block the graph opens (a frame split inside a block: eager's exit
        # restores it on the way out). A continuation that began inside a block and leaves it
        # (`with torch.no_grad(): x.t_()`, a break at `t_`, then `x.index_add_(...)` raising after
        # the block) raises in the mode outside that block, as eager's exit restored it before
        # the raising operator: the entry mode left grad mode off for the rest of the process
        # (test_alias_fuzz.py --pad-mm seed 20980). Not modelled: a `torch.set_grad_enabled(b)`
        # called as a function in the graph (eager's mode at the raise depends on which side of
        # the call the raising operator is).
        restore = f"{cg.const(torch._C._set_grad_enabled)}({output.unwind_grad_mode})"
        call = body[graph_call_at]
        body[graph_call_at : graph_call_at + 1] = [
            "try:",
            f"    {call}",
            "except BaseException:",
            f"    {restore}",
            "    raise",
        ]
    if cg.needs_globals or any(s.needs_globals() for _, s, _ in output.inputs):
        body.insert(0, "G = ___frame_globals(1)")
    if held is not None:  # Note [Effects under a lock replayed under it]
        cut = body.index(_RELEASE)
        body = [
            "try:",
            *(f"    {line}" for line in body[:cut] or ["pass"]),
            "finally:",
            f"    {cg.const(held.lock)}.release()",
            *body[cut + 1 :],
        ]
    params = ", ".join(f"L{i}" for i in range(len(output.entry_names)))
    src = "def ___make(___c, ___compiled, ___frame_globals):\n"
    src += f"    def ___run({params}):\n"
    src += "".join(f"        {line}\n" for line in body)
    src += "    return ___run\n"
    return RunnerSpec(src, cg.outputs, needs_graph), cg


def _frame_globals(depth: int) -> dict[str, Any]:
    return sys._getframe(depth + 1).f_globals


def build_runner(
    spec: RunnerSpec, consts: list[object], compiled: Callable[..., Any] | None
) -> Callable[..., Any]:
    scope: dict[str, Any] = {}
    exec(compile(spec.source, "<kiln runner>", "exec"), scope)
    return scope["___make"](consts, compiled, _frame_globals)
