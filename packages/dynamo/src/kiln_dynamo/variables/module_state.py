"""The frame's view of a module's registries: `_parameters`, `_buffers`, `_modules` as the frame has them.

A store `m.name = value` in the frame is recorded (SideEffects.store_attr) and replayed after the
graph through the real `Module.__setattr__`, which decides where the value goes: a Parameter into
`_parameters`, a Module into `_modules`, a tensor into `_buffers` when the name is a buffer, None
into whichever registry holds the name, anything else into the instance dict. Writes into the
registries themselves (`m._buffers[k] = t`, and `register_buffer` / `register_parameter` /
`add_module`, which are traced as Python and do that) go to the registry's dict tracker, rewritten
in place after the graph. Reads in the frame that walk the registries (`parameters()`, `children()`
and the rest: Note [Module traversal]; a container's len, index and iteration) must see both, so
they read a `ModuleState` built here rather than the real module (Note [The frame's view of a
module's registries]).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import AttrSource
from kiln_dynamo.variables.base import VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.variables.base import Tx
    from kiln_dynamo.variables.nn_module import NNModuleVariable

VT = VariableTracker

REGISTRIES = ("_parameters", "_buffers", "_modules")

_MODULE_SETATTR = nn.Module.__setattr__
_g = nn.modules.module
_REGISTRATION_HOOKS = (
    _g._global_module_registration_hooks,
    _g._global_parameter_registration_hooks,
    _g._global_buffer_registration_hooks,
)


# Note [The frame's view of a module's registries]: the walk starts from the registries as the
# module held them at entry (their key lists guarded), or from the registry's dict tracker where
# the frame wrote into it, and then applies the frame's attribute stores on that module in program
# order, as `Module.__setattr__` would: a Parameter replaces the name in `_parameters` (a key
# already there keeps its place, a new one goes last) and leaves `_buffers` and `_modules`; a
# module does the same in `_modules`; None or a tensor to a name a registry holds stays in it
# (`m.bias = None` keeps the key, with None, which `parameters()` skips); anything else goes to the
# instance dict. What the view cannot reproduce exactly is a break with its reason: both kinds of
# change on one module (their replays would interleave wrongly: the stores are replayed before the
# dict rewrites), a class with its own `__setattr__`, torch's global registration hooks, a store
# that eager refuses (a tensor to a parameter's name is a TypeError there), a `nn.Buffer` value.
# Each store is checked when it is made (`check_store`), so a refused store breaks where eager
# raises, before anything after it is traced.
class _Real:
    """An entry as the module held it at entry: wrapped (and guarded) only when read."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


Entry = VT | _Real


@dataclass(slots=True)
class ModuleState:
    """The registries of one module as the frame has them (Note [The frame's view of a module's
    registries])."""

    vt: NNModuleVariable
    regs: dict[str, dict[str, Entry]] = field(default_factory=dict)
    changed: bool = False
    # the real registries read as they are, whose key lists are guarded when first walked
    unguarded: dict[str, Callable[[], None]] = field(default_factory=dict)

    def keys(self, attr: str) -> list[str]:
        guard = self.unguarded.pop(attr, None)
        if guard is not None:
            guard()
        return list(self.regs[attr])

    def get(self, tx: Tx, attr: str, key: str) -> VT:
        self.keys(attr)
        e = self.regs[attr][key]
        if isinstance(e, _Real):
            return tx.wrap(e.value, self.vt._entry(attr, key))
        return e

    def is_none(self, attr: str, key: str) -> bool:
        e = self.regs[attr][key]
        return e.value is None if isinstance(e, _Real) else _is_none(e)

    def items(self, tx: Tx, attr: str) -> list[tuple[str, VT]]:
        return [(k, self.get(tx, attr, k)) for k in self.keys(attr)]


def unchanged(vt: NNModuleVariable) -> ModuleState:
    """The registries as the module holds them, for a module the frame has not changed (no guard)."""
    m = vt.module
    return ModuleState(vt, {a: {k: _Real(v) for k, v in m.__dict__.get(a, {}).items()} for a in REGISTRIES})


def _tracked(tx: Tx, real: object) -> VT | None:
    """The frame's dict tracker over a real registry when the frame wrote into it."""
    vt = tx.output.builder.cache.get(id(real))
    return vt if vt is not None and tx.output.side_effects.is_mutated(vt) else None


def _stores(tx: Tx, m: nn.Module) -> list[tuple[str, VT]]:
    from kiln_dynamo.variables.nn_module import NNModuleVariable

    return [
        (name, value)
        for target, name, value in tx.output.side_effects.attr_stores
        if isinstance(target, NNModuleVariable) and target.module is m
    ]


def registry_written(tx: Tx, m: nn.Module) -> bool:
    """Whether the frame wrote into one of `m`'s registries (through their dict trackers)."""
    return any(_tracked(tx, m.__dict__[a]) is not None for a in REGISTRIES if a in m.__dict__)


def has_changes(tx: Tx, m: nn.Module) -> bool:
    """Whether the frame stored an attribute on `m` or wrote into one of its registries."""
    return bool(_stores(tx, m)) or registry_written(tx, m)


def registries_read(tx: Tx, m: nn.Module) -> bool:
    """Whether the frame holds a tracker over one of `m`'s registries (read as `m._parameters`)."""
    cache = tx.output.builder.cache
    return any(id(m.__dict__[a]) in cache for a in REGISTRIES if a in m.__dict__)


def state(tx: Tx, vt: NNModuleVariable, guard: bool = True) -> ModuleState:
    """The registries of `vt`'s module as the frame has them (Note [The frame's view of a module's
    registries]); the key lists of the real registries it starts from are guarded (`guard`)."""
    from kiln_dynamo.variables.dicts import DictVariable

    m = vt.module
    out = ModuleState(vt)
    for attr in REGISTRIES:
        real = m.__dict__.get(attr)
        if not isinstance(real, dict):
            raise Unsupported(f"{vt.describe()} has no {attr} (Module.__init__ not run)")
        tracked = _tracked(tx, real)
        if tracked is not None:
            if not isinstance(tracked, DictVariable) or not all(isinstance(k, str) for k in tracked._items):
                raise Unsupported(f"{attr} of {vt.describe()} changed in the frame into {tracked.describe()}")
            out.regs[attr] = {k: tracked.entry(k) for k in tracked._items}
            out.changed = True
        else:
            if guard and vt.source is not None:
                out.unguarded[attr] = functools.partial(
                    tx.output.guards.dict_keys, AttrSource(vt.source, attr), real
                )
            out.regs[attr] = {k: _Real(v) for k, v in real.items()}
    stores = _stores(tx, m)
    if stores and out.changed:
        raise Unsupported(
            f"{vt.describe()}: attribute stores and writes into its registries in one frame "
            "(Note [The frame's view of a module's registries])"
        )
    if stores:  # where each store lands depends on every registry's keys
        for attr in REGISTRIES:
            out.keys(attr)
    for name, value in stores:
        _apply(tx, out, name, value)
        out.changed = True
    return out


def _type_of(value: VT) -> type | None:
    try:
        return value.python_type()
    except Unsupported:
        return None


def _is_none(value: VT) -> bool:
    return value.is_constant() and value.as_constant() is None


def _apply(tx: Tx, st: ModuleState, name: str, value: VT) -> None:
    """`Module.__setattr__(m, name, value)` on the view, or a break where it cannot be exact."""
    from kiln_dynamo.variables.nn_module import NNModuleVariable

    m = st.vt.module
    what = f"{st.vt.describe()}.{name} = {value.describe()}"
    if type(m).__setattr__ is not _MODULE_SETATTR:
        raise Unsupported(f"{what}: {type(m).__qualname__} has its own __setattr__")
    params, buffers, modules = (st.regs[a] for a in REGISTRIES)
    cls = _type_of(value)
    if cls is not None and issubclass(cls, nn.Parameter):
        if name not in params and ("." in name or not name or hasattr(type(m), name)):
            raise Unsupported(f"{what}: eager refuses this parameter name")
        _registration_hooks(tx, what)
        buffers.pop(name, None)
        modules.pop(name, None)
        params[name] = value
    elif name in params:
        if not _is_none(value):
            raise Unsupported(f"{what}: eager raises TypeError (a Parameter or None expected)")
        params[name] = value
    elif cls is not None and issubclass(cls, nn.Module):
        if not isinstance(value, NNModuleVariable):
            raise Unsupported(f"{what}: a module made in the frame stored as a submodule")
        _registration_hooks(tx, what)
        params.pop(name, None)
        buffers.pop(name, None)
        modules[name] = value
    elif name in modules:
        if not _is_none(value):
            raise Unsupported(f"{what}: eager raises TypeError (a Module or None expected)")
        modules[name] = value
    elif cls is not None and hasattr(nn, "Buffer") and issubclass(cls, nn.Buffer):
        raise Unsupported(f"{what}: a nn.Buffer stored as an attribute")
    elif name in buffers:
        if not (_is_none(value) or (cls is not None and issubclass(cls, torch.Tensor))):
            raise Unsupported(f"{what}: eager raises TypeError (a tensor or None expected)")
        _registration_hooks(tx, what)
        buffers[name] = value
    # else: an instance attribute, which no registry walk sees


def _registration_hooks(tx: Tx, what: str) -> None:
    if any(_REGISTRATION_HOOKS):
        raise Unsupported(f"{what}: torch's global module registration hooks are registered")
    tx.output.guards.empty_dicts(_REGISTRATION_HOOKS, "no global module registration hooks are registered")


def check_store(tx: Tx, vt: NNModuleVariable, name: str, value: VT) -> None:
    """Before `m.name = value` is recorded: break where eager would raise, or where the frame's view
    of the registries could no longer follow (Note [The frame's view of a module's registries]).
    Guards what the check relied on: which registry of the module held `name` at entry."""
    m = vt.module
    if registries_read(tx, m):
        raise Unsupported(
            f"setting attribute {name!r} on {vt.describe()} after its registries were read in the frame "
            "(Note [The frame's view of a module's registries])"
        )
    if type(m).__setattr__ is not _MODULE_SETATTR:
        return  # the class's own __setattr__ is replayed; a walk of this module then breaks
    what = f"{vt.describe()}.{name} = {value.describe()}"
    cls = _type_of(value)
    if cls is not None and issubclass(cls, nn.Parameter):
        if "." in name or not name or hasattr(type(m), name):
            raise Unsupported(f"{what}: a parameter named like a class attribute or with a dot")
        _registration_hooks(tx, what)
        return
    if cls is not None and issubclass(cls, nn.Module):
        _registration_hooks(tx, what)
        return
    if _is_none(value):
        return  # valid wherever the name is
    if vt.source is None:
        raise Unsupported(f"setting attribute {name!r} on {vt.describe()} without a source")
    st = state(tx, vt, guard=False)
    real = {a: m.__dict__[a] for a in REGISTRIES}
    absent = tuple(a for a in REGISTRIES if name not in real[a])
    if absent:
        tx.output.guards.not_registered(vt.source, name, absent)
    for a in REGISTRIES:
        if a not in absent:
            tx.output.guards.dict_keys(AttrSource(vt.source, a), real[a])
    _apply(tx, st, name, value)
