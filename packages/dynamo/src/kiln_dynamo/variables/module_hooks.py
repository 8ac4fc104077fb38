"""`m.register_forward_hook(hook)` and `m.register_forward_pre_hook(hook)` inside the frame.

Note [Module hooks registered in the frame]: transformers' output-capturing decorators register
forward hooks on submodules at the start of a model's first call, and the same call's layers run
them (they append hidden states and attentions to the collector). So a registration is traced as
two things:
- a pending entry of the module's hook dict, in the order torch gives it (appended, or first
  with `prepend=True`), with its `with_kwargs` flag: the module-call inliner reads the real dict
  and then the pending entries (Note [Forward hooks]), so a call of the module later in the same
  frame runs the new hook, traced;
- a side effect: the runner calls torch's own `register_*_hook` on the real module after the
  graph, in program order, and binds what it returns. That is the `RemovableHandle` eager makes,
  with the id eager gives it: ids come from the class counter `RemovableHandle.next_id`, which
  tracing never advances, and the replays run in the frame's order with nothing between them
  that makes a handle (a frame that also registers tensor hooks, which make handles too, is
  refused rather than ordered). The handle the frame holds is that object when it leaves the
  frame (returned, stored, kept across a split); using it inside the frame (`.remove()`, `.id`)
  is a break, as it has no real object yet.
The hook itself must be something the runner can name: a function from outside (a source) or one
made in the frame (Note [Functions made in the frame that leave it]).
The next call sees the real dicts: each module called in the frame had its hook dicts guarded
on their keys (Note [Forward hooks]) or on being empty, so the new entry recompiles, and that
capture runs the hook as an ordinary one. Reading the hook dicts in the frame after a pending
registration, or registering after the frame changed them directly, is a break (the two views
would disagree). Backward hooks and the other registrations stay one clean break at their call.
A registration inside a `with lock:` block is an effect of the block, replayed under the real lock
(Note [Effects under a lock replayed under it] in variables/locks.py).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.logs import decisions_log
from kiln_dynamo.variables.base import VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx
    from kiln_dynamo.variables.nn_module import NNModuleVariable

VT = VariableTracker

# registration method -> the hook dict it writes
TRACED_REGISTRATIONS = {
    "register_forward_hook": "_forward_hooks",
    "register_forward_pre_hook": "_forward_pre_hooks",
}
# dicts a pending registration changes: reading them in the frame after one is a break
HOOK_DICTS = frozenset(
    {
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
    }
)


class ModuleHookHandleVariable(VariableTracker):
    """The `RemovableHandle` of a registration the runner replays (see the module docstring)."""

    def describe(self) -> str:
        return "the handle of a module hook registered in the frame"

    def reconstruct(self, cg: Reconstructor) -> str:
        bound = cg.bound(self)
        if bound is None:  # registrations are replayed before anything else is rebuilt
            raise Unsupported(f"{self.describe()} before its registration is replayed")
        return bound


@dataclass(slots=True, eq=False)
class ModuleHookRegistration:
    module: NNModuleVariable
    dict_attr: str  # "_forward_hooks" or "_forward_pre_hooks"
    hook: VT
    prepend: bool
    with_kwargs: bool
    always_call: bool
    handle: ModuleHookHandleVariable

    def replay(self, cg: Reconstructor) -> str:
        """The runner's statement: torch's own registration on the real module."""
        assert self.module.source is not None
        name = next(k for k, v in TRACED_REGISTRATIONS.items() if v == self.dict_attr)
        extra = f", always_call={self.always_call}" if self.dict_attr == "_forward_hooks" else ""
        return (
            f"{cg.const(getattr(nn.Module, name))}({cg.source(self.module.source)}, {self.hook.reconstruct(cg)}, "
            f"prepend={self.prepend}, with_kwargs={self.with_kwargs}{extra})"
        )


def register(tx: Tx, module: NNModuleVariable, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """`module.<name>(hook, ...)` for a registration in TRACED_REGISTRATIONS."""
    side = tx.output.side_effects
    what = f"Module.{name}() inside the compiled frame"
    if module.source is None:
        raise Unsupported(f"{what} on {module.describe()}, which has no source to replay it on")
    if side.tensor_hooks:
        raise Unsupported(f"{what} after a tensor hook registration (their handles' ids would be reordered)")
    try:
        bound = inspect.signature(getattr(nn.Module, name)).bind(module.module, *args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"{what}: {e}") from e
    bound.apply_defaults()
    opts = {k: v for k, v in bound.arguments.items() if k not in ("self", "hook")}
    flags = {}
    for k, v in opts.items():
        value = v.as_constant() if isinstance(v, VariableTracker) and v.is_constant() else v
        if not isinstance(value, bool):
            raise Unsupported(f"{what} with {k}= not a constant bool")
        flags[k] = value
    dict_attr = TRACED_REGISTRATIONS[name]
    for attr in HOOK_DICTS:
        if attr.startswith(dict_attr):
            dvt = tx.output.builder.cache.get(id(getattr(module.module, attr)))
            if dvt is not None and side.is_mutated(dvt):
                raise Unsupported(f"{what} after the frame changed {attr} directly")
    reg = ModuleHookRegistration(
        module,
        dict_attr,
        bound.arguments["hook"],
        flags["prepend"],
        flags["with_kwargs"],
        flags.get("always_call", False),
        ModuleHookHandleVariable(),
    )
    side.module_hooks.append(reg)
    decisions_log.info(
        "%s on %s at %s: traced as a pending hook, registered on the real module after the graph",
        what,
        module.describe(),
        tx.where(),
    )
    return reg.handle


def pending(tx: Tx, m: nn.Module, dict_attr: str) -> list[ModuleHookRegistration]:
    """The registrations the frame made on `m` into `dict_attr`, in order."""
    return [
        r for r in tx.output.side_effects.module_hooks if r.module.module is m and r.dict_attr == dict_attr
    ]


def has_pending(tx: Tx, m: nn.Module) -> bool:
    return any(r.module.module is m for r in tx.output.side_effects.module_hooks)


def merged(
    tx: Tx, m: nn.Module, dict_attr: str, real: list[tuple[object, VT]], with_kwargs: set[object]
) -> tuple[list[tuple[object, VT]], set[object]]:
    """The hook list eager's dict will hold when the module is called: the real entries, then
    the pending ones, each appended or prepended as torch's registration does."""
    hooks = list(real)
    kw = set(with_kwargs)
    for reg in pending(tx, m, dict_attr):
        key = reg.handle  # stands for the id the handle will get
        if reg.prepend:
            hooks.insert(0, (key, reg.hook))
        else:
            hooks.append((key, reg.hook))
        if reg.with_kwargs:
            kw.add(key)
    return hooks, kw
