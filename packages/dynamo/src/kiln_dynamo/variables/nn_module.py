"""nn.Module trackers: attributes read straight from the real module, forward inlined.

A module seen by the capture stays a real object: reading `self.weight` looks in `_parameters`,
`_buffers`, `_modules`, the instance dict and then the class, exactly as Module.__getattr__ does,
and wraps what it finds with a source that goes through the same dict (`L['self']._parameters
['weight']`), so the guard and the runner skip Module.__getattr__. Parameters and buffers become
graph inputs; plain attributes become guarded constants; `training` is guarded when read.
Calling a module inlines `type(m).forward` with its forward hooks and pre-hooks around it (Note
[Forward hooks]; the hook dicts are guarded, and hooks registered earlier in the same frame run
too: Note [Module hooks registered in the frame] in module_hooks.py). Containers: Sequential and ModuleList index, slice, iterate and len; ModuleDict keys,
values, items and subscripts.

Writes (`self.x = ...`) from the frame go to `SideEffects` and are replayed after the graph;
reads that walk the registries afterwards (traversals, a container's len and items) see them
through module_state.py's view of the module.
"""

from __future__ import annotations

import collections
import functools
import inspect
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import AttrSource, DictEntrySource, Source, TypeSource
from kiln_dynamo.variables import module_hooks, module_state
from kiln_dynamo.variables.base import ConstantVariable, MethodVariable, VariableTracker
from kiln_dynamo.variables.lists import TupleVariable

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker


_C_DESCRIPTORS = (
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MemberDescriptorType,
    types.GetSetDescriptorType,
    types.BuiltinMethodType,
    types.ClassMethodDescriptorType,
)


# Note [Class attributes read through an instance]: `self.method()`, `self.prop`, `self.K`
# and a module's `type(m).forward` are looked up on the class, which the program may change
# after the capture (`Cls.method = other`, a property replaced). The tracker inlines what it
# found, so the guard pins it on the class itself, held in the constant table:
# `Cls.method is <function>` (for a property, its getter; for a classmethod, its function).
# That is sound because the instance's type is pinned (`type(L['self']) is Cls`) wherever the
# instance came from outside, and cheap because it is one check per (class, name) however many
# instances share the class (25 layers of one Linear class: one `forward` check).
def guard_class_attr(tx: Tx, cls: type, name: str, static: object) -> None:
    """Guard that `cls.name` still gives what the capture inlined (see the Note above)."""
    attr = AttrSource(tx.output.const_source(cls, cls.__qualname__), name)
    guards = tx.output.guards
    if isinstance(static, classmethod):
        guards.function(AttrSource(attr, "__func__"), static.__func__)
    elif isinstance(static, staticmethod):
        guards.function(attr, static.__func__)
    elif isinstance(static, property):
        guards.type_match(attr, static)
        guards.function(AttrSource(attr, "fget"), static.fget)
    elif inspect.isfunction(static):
        guards.function(attr, static)


# Note [Class attributes found missing]: a read that misses on the class as well as the instance
# (getattr's default, hasattr, `except AttributeError`, a class's `__getattr__` fallback) holds
# only while no class of the MRO gets that name: `Cls.opt = 7` after the capture makes the next
# eager read find it. So each class of the MRO that Python lets a program change (a class made
# by a class statement, not an immutable or built-in type) gets a guard `name not in
# Cls.__dict__`, one per (class, name). Before, only the instance's own dict was guarded, and a
# class attribute set after the capture was never read.
def guard_no_class_attr(tx: Tx, cls: type, name: str) -> None:
    """Guard that no class of `cls.__mro__` has `name` (see the Note above)."""
    for klass in cls.__mro__:
        if klass.__flags__ & _HEAPTYPE and not klass.__flags__ & _IMMUTABLETYPE:
            tx.output.guards.no_instance_attr(tx.output.const_source(klass, klass.__qualname__), name)


_IMMUTABLETYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def pending_class_attr(tx: Tx, cls: type, name: str) -> VT | None:
    """What the frame has stored as `name` on `cls` or a class before it in the MRO, where that
    is what a lookup on `cls` finds (Note [Setting a class attribute] in user_defined.py)."""
    for klass in cls.__mro__:
        hit = tx.output.side_effects.pending_attr(klass, name)
        if hit is not None:
            return hit
        if name in vars(klass):
            return None
    return None


def class_attribute(tx: Tx, obj_vt: VT, obj: object, name: str, source: Source | None) -> VT:
    """An attribute found on the class of `obj`: methods bind, properties run, others wrap."""
    from kiln_dynamo.variables.functions import BoundMethodVariable, UserFunctionVariable

    pending = pending_class_attr(tx, type(obj), name)
    if pending is not None:
        return pending

    try:
        static = inspect.getattr_static(type(obj), name)
    except AttributeError:
        guard_no_class_attr(tx, type(obj), name)  # Note [Class attributes found missing]
        raise
    guard_class_attr(tx, type(obj), name, static)
    if isinstance(static, staticmethod):
        return tx.wrap(static.__func__, None)
    if isinstance(static, classmethod):
        return BoundMethodVariable(tx.wrap(static.__func__, None), tx.wrap(type(obj), None))
    if isinstance(static, property):
        if static.fget is None:
            raise Unsupported(f"property {name!r} has no getter")
        return tx.wrap(static.fget, None).call(tx, [obj_vt], {})
    if inspect.isfunction(static):
        return BoundMethodVariable(UserFunctionVariable(static, None), obj_vt)
    if isinstance(static, _C_DESCRIPTORS):
        # Descriptors implemented in C (slots, builtin methods): reading them runs no user code.
        value = getattr(obj, name)
        return tx.wrap(value, AttrSource(source, name) if source else None)
    if hasattr(static, "__get__") and not isinstance(static, (int, float, str, bool, type(None), type)):
        raise Unsupported(f"attribute {name!r} is a {type(static).__name__} descriptor (would run user code)")
    # On the class itself, like a method (Note [Class attributes read through an instance]).
    return tx.wrap(static, AttrSource(tx.output.const_source(type(obj), type(obj).__qualname__), name))


_BACKWARD_HOOKS_ADVICE = (
    "the module's call runs as Python (its forward is captured on its own) so that autograd runs "
    "its hooks with eager's gradients, as torch.compile does without compiled autograd; remove "
    "the hooks from the compiled model to get one graph"
)


class NNModuleVariable(VariableTracker):
    def __init__(self, module: nn.Module, source: Source | None) -> None:
        self.module = module
        self.source = source
        self.dict_exposed = False  # Note [Two views of an instance dict] (user_defined.py)

    def describe(self) -> str:
        return f"module {type(self.module).__name__}"

    def python_type(self) -> type:
        return type(self.module)

    def identity(self) -> object:
        return self.module

    def _entry(self, dict_attr: str, key: str) -> Source | None:
        return DictEntrySource(self.source, dict_attr, key) if self.source is not None else None

    def getattr(self, tx: Tx, name: str) -> VT:
        m = self.module
        side = tx.output.side_effects
        d = m.__dict__
        # Note [Two views of an instance dict] (user_defined.py)
        if name == "__dict__":
            if side.has_pending_attrs(m):
                raise Unsupported(
                    f"__dict__ of {self.describe()} after an attribute store in the frame "
                    "(Note [Two views of an instance dict])"
                )
            self.dict_exposed = True
        else:
            dict_vt = tx.output.builder.cache.get(id(d))
            if dict_vt is not None and side.is_mutated(dict_vt):
                raise Unsupported(
                    f"attribute {name!r} of {self.describe()} after a write through its __dict__ "
                    "(Note [Two views of an instance dict])"
                )
        pending = side.pending_attr(m, name)
        if pending is not None:
            return pending
        if name in _REGISTRY_ATTRS and side.has_pending_attrs(m):
            raise Unsupported(
                f"{name} of {self.describe()} after an attribute store in the frame "
                "(Note [The frame's view of a module's registries])"
            )
        if module_state.registry_written(tx, m):  # read the registries as the frame has them
            st = module_state.state(tx, self)
            for attr in module_state.REGISTRIES:
                if name in st.regs[attr]:
                    return st.get(tx, attr, name)
        else:
            for attr in module_state.REGISTRIES:
                if name in d.get(attr, {}):
                    return tx.wrap(d[attr][name], self._entry(attr, name))
        if name in module_hooks.HOOK_DICTS and module_hooks.has_pending(tx, m):
            raise Unsupported(
                f"{name} of {self.describe()} read after a hook registration in the frame "
                "(Note [Module hooks registered in the frame])"
            )
        if name in d:
            return tx.wrap(d[name], AttrSource(self.source, name) if self.source is not None else None)
        if name == "__class__":
            return tx.wrap(type(m), TypeSource(self.source) if self.source is not None else None)
        static = inspect.getattr_static(type(m), name, None)
        if name in module_hooks.TRACED_REGISTRATIONS and static is getattr(nn.Module, name):
            if self.source is not None:  # Note [Module hooks registered in the frame]
                tx.output.guards.no_instance_attr(self.source, name)
            guard_class_attr(tx, type(m), name, static)
            return MethodVariable(self, name)
        if name in _HOOK_REGISTRATIONS and static is getattr(nn.Module, name):
            raise Unsupported(_HOOK_REGISTRATION.format(name=name), advice=_HOOK_REGISTRATION_ADVICE)
        if name in _TRAVERSALS and inspect.getattr_static(type(m), name, None) is getattr(nn.Module, name):
            if self.source is not None:
                tx.output.guards.no_instance_attr(self.source, name)
            return MethodVariable(self, name)  # Note [Module traversal]
        try:
            found = class_attribute(tx, self, m, name, self.source)
        except AttributeError:
            if self.source is not None:  # getattr(m, name, default) holds while m gains no `name`
                tx.output.guards.no_module_attr(self.source, name)
            raise AttributeError(f"{type(m).__name__!r} object has no attribute {name!r}") from None
        if self.source is not None:  # an instance attribute would shadow the class's
            tx.output.guards.no_instance_attr(self.source, name)
        return found

    def setattr(self, tx: Tx, name: str, value: VT) -> None:
        if self.source is None:
            raise Unsupported("setting an attribute on a module without a source")
        if self.dict_exposed:
            raise Unsupported(
                f"setting attribute {name!r} on {self.describe()} after its __dict__ was read "
                "(Note [Two views of an instance dict])"
            )
        module_state.check_store(tx, self, name, value)
        tx.output.side_effects.store_attr(self, self.module, name, value)

    def _registry(self, tx: Tx, attr: str) -> list[tuple[str, Callable[[], VT]]]:
        """`_modules` or `_parameters` of a container as the frame has it, None entries included,
        each wrapped when read (Note [The frame's view of a module's registries]); its length (or
        the key lists the view starts from) guarded."""
        if module_state.has_changes(tx, self.module):
            st = module_state.state(tx, self)
        else:
            st = module_state.unchanged(self)
            if self.source is not None:
                tx.output.guards.length(AttrSource(self.source, attr), getattr(self.module, attr))
        return [(k, functools.partial(st.get, tx, attr, k)) for k in st.keys(attr)]

    def _entries(self, tx: Tx) -> list[tuple[str, VT]]:
        """Every entry of `_modules` as the frame has it, wrapped, None entries included.

        Note [None entries of containers]: `ModuleList.append(None)` and `ModuleDict[k] = None`
        register a None child; iterating the container (and a ModuleDict's keys, values and
        items) yields it, as `len()` counts it. Only `children()` and the other traversals skip
        None entries. Informer's encoder zips its layers with a ModuleList of conv layers that
        ends in None: a container iterated without its None entries gave a zip one layer short
        (the whole encoder stack skipped, a wrong answer)."""
        return [(k, get()) for k, get in self._registry(tx, "_modules")]

    def length(self, tx: Tx) -> int:
        if isinstance(self.module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            return len(self._registry(tx, "_modules"))
        if isinstance(self.module, nn.ParameterList):
            return len(self._registry(tx, "_parameters"))
        raise Unsupported(f"len() of {self.describe()}")

    def iterate(self, tx: Tx) -> list[VT]:
        m = self.module
        if isinstance(m, (nn.Sequential, nn.ModuleList)):
            return [v for _, v in self._entries(tx)]
        if isinstance(m, nn.ModuleDict):
            return [ConstantVariable(k) for k, _ in self._entries(tx)]
        if isinstance(m, nn.ParameterList):
            return [get() for _, get in self._registry(tx, "_parameters")]
        raise Unsupported(f"iterating over {self.describe()}")

    def truth(self, tx: Tx) -> bool:
        if isinstance(self.module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            return len(self._registry(tx, "_modules")) > 0
        return True

    def getitem(self, tx: Tx, key: VT) -> VT:
        m = self.module
        k = key.as_constant()
        if isinstance(m, (nn.ModuleDict, nn.ParameterDict)):
            if isinstance(m, nn.ParameterDict) and type(m).__getitem__ is not nn.ParameterDict.__getitem__:
                raise Unsupported(f"subscript of {self.describe()}, which overrides __getitem__")
            return self.getattr(tx, k)  # a ParameterDict keeps each entry as an attribute
        if isinstance(m, (nn.Sequential, nn.ModuleList)):
            entries = self._registry(tx, "_modules")
            if isinstance(k, slice):
                if type(m) not in (nn.Sequential, nn.ModuleList):
                    raise Unsupported(f"slicing a {type(m).__qualname__} (a container subclass)")
                keys = [n for n, _ in entries]
                return ModuleSliceVariable(type(m), keys, [get() for _, get in entries]).getitem(tx, key)
            return entries[k][1]()
        if isinstance(m, nn.ParameterList):
            return self._registry(tx, "_parameters")[k][1]()
        raise Unsupported(f"subscript of {self.describe()}")

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        m = self.module
        if isinstance(m, nn.ModuleDict) and name in ("keys", "values", "items"):
            kids = self._entries(tx)
            if name == "keys":
                return TupleVariable([ConstantVariable(k) for k, _ in kids])
            vals = [v for _, v in kids]
            if name == "values":
                return TupleVariable(vals)
            return TupleVariable(
                [TupleVariable([ConstantVariable(k), v]) for (k, _), v in zip(kids, vals, strict=True)]
            )
        if name in _TRAVERSALS:
            static = inspect.getattr_static(type(m), name)
            if static is not getattr(nn.Module, name):
                raise Unsupported(f"{type(m).__qualname__} overrides Module.{name}()")
            guard_class_attr(tx, type(m), name, static)
            return traverse(tx, self, name, args, kwargs)
        if name == "__call__":
            return self.call(tx, args, kwargs)
        if name in module_hooks.TRACED_REGISTRATIONS and isinstance(self.getattr(tx, name), MethodVariable):
            return module_hooks.register(tx, self, name, args, kwargs)
        return self.getattr(tx, name).call(tx, args, kwargs)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        """`m(*args)`: the class's own `__call__` when it overrides Module's (its
        `super().__call__` comes back to `call_default`), else `call_default`."""
        m = self.module
        call_impl = inspect.getattr_static(type(m), "__call__")
        guard_class_attr(tx, type(m), "__call__", call_impl)
        if call_impl is not _MODULE_CALL:
            if not inspect.isfunction(call_impl):
                raise Unsupported(f"{self.describe()} overrides __call__ with a {type(call_impl).__name__}")
            return tx.wrap(call_impl, None).call(tx, [self, *args], kwargs)
        return self.call_default(tx, args, kwargs)

    def call_default(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        """Module.__call__: forward pre-hooks, `forward` inlined, forward hooks (Note [Forward
        hooks]), with guards that the hooks stay as they were and that no backward hook appears."""
        m = self.module
        if runs_cudnn_rnn(m):  # Note [Recurrent modules on CUDA]
            raise Unsupported(_CUDNN_RNN.format(name=type(m).__name__), advice=_CUDNN_RNN_ADVICE)
        if m._backward_hooks or m._backward_pre_hooks:
            # one break, as torch.compile without compiled autograd: _call_impl runs as Python
            # and wraps inputs and outputs in the autograd nodes that call the hooks
            raise Unsupported(f"{self.describe()} has backward hooks", advice=_BACKWARD_HOOKS_ADVICE)
        g = nn.modules.module
        hook_dicts = (
            g._global_forward_hooks,
            g._global_forward_pre_hooks,
            g._global_backward_hooks,
            g._global_backward_pre_hooks,
        )
        if any(hook_dicts):
            raise Unsupported("global module hooks are registered", advice=_BACKWARD_HOOKS_ADVICE)
        tx.output.guards.empty_dicts(hook_dicts, "no global module hooks are registered")
        hooked = bool(m._forward_hooks or m._forward_pre_hooks or module_hooks.has_pending(tx, m))
        if hooked and self.source is None:
            raise Unsupported(f"{self.describe()} has forward hooks but no source to guard them by")
        if self.source is not None:
            if hooked:
                tx.output.guards.no_backward_hooks(self.source)
                if "forward" not in m.__dict__:
                    tx.output.guards.no_instance_attr(self.source, "forward")
            else:
                tx.output.guards.no_hooks(self.source, instance_forward="forward" in m.__dict__)
        if hooked:
            args, kwargs = self._run_pre_hooks(tx, args, kwargs)
        if "forward" in m.__dict__:
            result = self.getattr(tx, "forward").call(tx, args, kwargs)
        else:
            forward = type(m).forward
            if forward is nn.Module.forward:
                raise Unsupported(f"{self.describe()} has no forward()")
            guard_class_attr(tx, type(m), "forward", inspect.getattr_static(type(m), "forward"))
            result = tx.wrap(forward, None).call(tx, [self, *args], kwargs)
        return self._run_hooks(tx, args, kwargs, result) if hooked else result

    # Note [Forward hooks]: a module with forward hooks or pre-hooks runs them as
    # Module._call_impl does, inlined: each pre-hook gets (module, args) (or (module, args,
    # kwargs) when registered with_kwargs) and may replace the arguments; each forward hook gets
    # (module, args, result) (or with kwargs) and may replace the result. The hook dicts are read
    # through the module's source, so their keys (the handles) and each hook (a function,
    # pinned with its code) are guarded: adding or removing a hook recompiles. Hooks registered
    # earlier in the frame follow the real ones (Note [Module hooks registered in the frame]).
    # Backward hooks and torch's global hooks stay unsupported.
    def _hooks(self, tx: Tx, attr: str) -> tuple[list[tuple[object, VT]], set[object]]:
        assert self.source is not None
        d = getattr(self.module, attr)
        dvt = tx.wrap(d, AttrSource(self.source, attr))
        with_kwargs: set[object] = set(getattr(self.module, f"{attr}_with_kwargs"))
        tx.wrap(getattr(self.module, f"{attr}_with_kwargs"), AttrSource(self.source, f"{attr}_with_kwargs"))
        real: list[tuple[object, VT]] = [(k, dvt.getitem(tx, ConstantVariable(k))) for k in d]
        return module_hooks.merged(tx, self.module, attr, real, with_kwargs)

    def _run_pre_hooks(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> tuple[list[VT], dict[str, VT]]:
        from kiln_dynamo.variables.dicts import DictVariable

        hooks, with_kwargs = self._hooks(tx, "_forward_pre_hooks")
        for hook_id, hook in hooks:
            if hook_id in with_kwargs:
                out = hook.call(tx, [self, TupleVariable(list(args)), DictVariable(dict(kwargs))], {})
                if out.is_constant() and out.as_constant() is None:
                    continue
                pair = out.iterate(tx)
                if (
                    not isinstance(out, TupleVariable)
                    or len(pair) != 2
                    or not isinstance(pair[1], DictVariable)
                ):
                    raise Unsupported(
                        "a forward pre-hook with kwargs returned something other than (args, kwargs)"
                    )
                args, kwargs = pair[0].iterate(tx), {str(k): v for k, v in pair[1].items.items()}
            else:
                out = hook.call(tx, [self, TupleVariable(list(args))], {})
                if out.is_constant() and out.as_constant() is None:
                    continue
                args = out.iterate(tx) if isinstance(out, TupleVariable) else [out]
        return args, kwargs

    def _run_hooks(self, tx: Tx, args: list[VT], kwargs: dict[str, VT], result: VT) -> VT:
        from kiln_dynamo.variables.dicts import DictVariable

        hooks, with_kwargs = self._hooks(tx, "_forward_hooks")
        for hook_id, hook in hooks:
            if hook_id in with_kwargs:
                out = hook.call(tx, [self, TupleVariable(list(args)), DictVariable(dict(kwargs)), result], {})
            else:
                out = hook.call(tx, [self, TupleVariable(list(args)), result], {})
            if not (out.is_constant() and out.as_constant() is None):
                result = out
        return result


_MODULE_CALL = nn.Module.__dict__["__call__"]


# Note [Recurrent modules on CUDA]: on CUDA, `nn.LSTM` / `nn.GRU` / `nn.RNN` run cuDNN's fused RNN,
# whose weights are one flat buffer that the module's parameters are views into; tracing the
# call reaches `_cudnn_rnn` and storage writes (`aten::set_`) that a graph cannot hold, and the
# graph around it fell back to eager at run time, slower than eager itself (the H200 breadth
# suite: an LSTM language model 0.88x, a GRU 1.00x). The module call is one clean break instead,
# as torch.compile does for every RNN module (`allow_rnn` off): the code before and after it
# compiles, and the recurrent layer runs eager's cuDNN kernel. On the CPU the call is traced as
# before (its decomposition compiles).
_CUDNN_RNN = "nn.{name} on CUDA runs cuDNN's fused RNN eagerly (its flat weights cannot be traced)"
_CUDNN_RNN_ADVICE = "the layers before and after it are compiled; nothing to change"


def runs_cudnn_rnn(m: nn.Module) -> bool:
    """Whether a call of ``m`` runs cuDNN's fused RNN: a recurrent module whose weights are on CUDA."""
    if not isinstance(m, nn.RNNBase):
        return False
    return any(p.is_cuda for p in m._parameters.values() if p is not None)


# Note [Module hooks registered in the frame] (variables/module_hooks.py): forward hooks and
# pre-hooks registered in the frame are traced; the registrations below (backward hooks, state-dict
# hooks) stay one clean break at their call: the hook is registered by eager's code, and the calls
# after it, captured again, see and guard it.
# a module's registries, which the frame's attribute stores change only as Note [The frame's view
# of a module's registries] (module_state.py) follows
_REGISTRY_ATTRS = (*module_state.REGISTRIES, "_non_persistent_buffers_set")

_HOOK_REGISTRATIONS = frozenset(
    {
        "register_full_backward_hook",
        "register_full_backward_pre_hook",
        "register_backward_hook",
        "register_state_dict_pre_hook",
        "register_load_state_dict_post_hook",
    }
)
_HOOK_REGISTRATION = "Module.{name}() inside the compiled frame: the hook is registered in Python"
_HOOK_REGISTRATION_ADVICE = "register module hooks before calling the compiled model"


# Note [Module traversal]: `parameters()`, `named_modules()` and the rest are generators in
# eager (which the capture does not step through); the tracker walks the real module tree the
# way torch does (pre-order, each module, parameter and buffer once by identity, names joined
# with "."), and hands back an iterator over trackers that carry their sources. Every dict the
# walk reads (`_modules`, `_parameters`, `_buffers` of each module visited) is guarded on its
# key list, and every entry it yields on its type (a module) or its tensor properties, so a
# module added, removed or replaced later recompiles. It walks each module's registries as the
# frame has them, its attribute stores and registry writes applied (Note [The frame's view of a
# module's registries] in module_state.py), not the real module, which gets them only after
# the graph.
_TRAVERSALS = frozenset(
    {"parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
     "modules", "named_modules"}
)  # fmt: skip


def traverse(tx: Tx, root: NNModuleVariable, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.lists import ListIteratorVariable

    if not all(a.is_constant() for a in [*args, *kwargs.values()]):
        raise Unsupported(f"Module.{name}() with arguments that are not constants")
    try:
        bound = inspect.signature(getattr(nn.Module, name)).bind(
            root.module, *[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()}
        )
    except TypeError as e:
        raise Unsupported(f"Module.{name}(): {e}") from e
    bound.apply_defaults()
    opts = bound.arguments
    if opts.get("memo") is not None:
        raise Unsupported(f"Module.{name}() with a memo set")
    views: dict[int, module_state.ModuleState] = {}

    def view(vt: NNModuleVariable) -> module_state.ModuleState:
        # each module's registries as the frame has them, the real ones' key lists guarded
        st = views.get(id(vt.module))
        if st is None:
            st = views[id(vt.module)] = module_state.state(tx, vt)
        return st

    def named_modules(prefix: str, dedupe: bool) -> list[tuple[str, NNModuleVariable]]:
        out: list[tuple[str, NNModuleVariable]] = []
        seen: set[int] = set()

        def walk(vt: NNModuleVariable, pre: str) -> None:
            if id(vt.module) in seen:
                return
            if dedupe:
                seen.add(id(vt.module))
            out.append((pre, vt))
            st = view(vt)
            for k in st.keys("_modules"):
                sub = st.get(tx, "_modules", k)
                if isinstance(sub, NNModuleVariable):
                    walk(sub, pre + ("." if pre else "") + k)
                elif not (sub.is_constant() and sub.as_constant() is None):
                    raise Unsupported(f"Module.{name}(): _modules[{k!r}] is {sub.describe()}")

        walk(root, prefix)
        return out

    def members(attr: str) -> list[tuple[str, VT]]:
        prefix, dedupe = opts.get("prefix", ""), opts.get("remove_duplicate", True)
        mods = named_modules(prefix, dedupe) if opts.get("recurse", True) else [(prefix, root)]
        seen: set[int] = set()
        out: list[tuple[str, VT]] = []
        for pre, vt in mods:
            st = view(vt)
            for k in st.keys(attr):
                entry = st.get(tx, attr, k)  # guarded, None included
                if entry.is_constant() and entry.as_constant() is None:
                    continue
                if id(entry.identity()) in seen:
                    continue
                if dedupe:
                    seen.add(id(entry.identity()))
                out.append((pre + ("." if pre else "") + k, entry))
        return out

    pairs: list[tuple[str, VT]]
    if name in ("modules", "named_modules"):
        pairs = list(named_modules(opts.get("prefix", ""), opts.get("remove_duplicate", True)))
    elif name in ("children", "named_children"):
        seen: set[int] = set()
        pairs = []
        st = view(root)
        for k in st.keys("_modules"):
            sub = st.get(tx, "_modules", k)
            if isinstance(sub, NNModuleVariable) and id(sub.module) not in seen:
                seen.add(id(sub.module))
                pairs.append((k, sub))
    else:
        pairs = members("_parameters" if "parameters" in name else "_buffers")
    if name.startswith("named_"):
        return ListIteratorVariable([TupleVariable([ConstantVariable(k), v]) for k, v in pairs], "generator")
    return ListIteratorVariable([v for _, v in pairs], "generator")


class ModuleDefaultCallVariable(VariableTracker):
    """`super().__call__` reached from a module class's own `__call__`: Module's call."""

    def __init__(self, module: NNModuleVariable) -> None:
        self.module = module

    def describe(self) -> str:
        return f"Module.__call__ of {self.module.describe()}"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.module.call_default(tx, args, kwargs)


class ModuleSliceVariable(VariableTracker):
    """Note [Container slices]: `seq[1:3]` (and `layers[::2]`) builds a new container in eager:
    a Sequential of the same children under their keys, a ModuleList of them renumbered. The
    tracker holds those children's trackers (each with its source in the parent, so reading them
    is guarded as usual) and behaves as the new container: index, slice, iterate, len, and for a
    Sequential a call, which runs the children in order. Leaving the frame, it is rebuilt as a
    fresh container of the same type over the real children, as every eager call makes one."""

    def __init__(self, cls: type[nn.Module], keys: list[str], items: list[VT]) -> None:
        self.cls = cls
        self.keys = keys if cls in (nn.Sequential, nn.ModuleDict) else [str(i) for i in range(len(items))]
        self.items = items
        self.source = None

    def describe(self) -> str:
        return f"{self.cls.__name__} slice of {len(self.items)}"

    def python_type(self) -> type:
        return self.cls

    def length(self, tx: Tx) -> int:
        return len(self.items)

    def truth(self, tx: Tx) -> bool:
        return bool(self.items)

    def iterate(self, tx: Tx) -> list[VT]:
        if self.cls is nn.ModuleDict:
            return [ConstantVariable(k) for k in self.keys]
        return list(self.items)

    def getitem(self, tx: Tx, key: VT) -> VT:
        k = key.as_constant()
        if self.cls is nn.ModuleDict:
            if k not in self.keys:
                raise Unsupported(f"key {k!r} missing from a {self.describe()}")
            return self.items[self.keys.index(k)]
        if isinstance(k, slice):
            return ModuleSliceVariable(self.cls, self.keys[k], self.items[k])
        if not isinstance(k, int):
            raise Unsupported(f"index {k!r} of {self.describe()}")
        try:
            return self.items[k]
        except IndexError as e:
            raise Unsupported(f"index {k} out of range for {self.describe()}") from e

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if self.cls is not nn.Sequential or len(args) != 1 or kwargs:
            raise Unsupported(f"calling a {self.describe()} with {len(args)} arguments")
        x = args[0]
        for item in self.items:
            x = item.call(tx, [x], {})
        return x

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name in ("__call__", "forward"):
            return self.call(tx, args, kwargs)
        if name == "__len__" and not args:
            return ConstantVariable(len(self.items))
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if self.cls is nn.ModuleDict and not args and not kwargs and name in _DICT_VIEWS:
            keys: list[VT] = [ConstantVariable(k) for k in self.keys]
            views: dict[str, list[VT]] = {
                "keys": keys,
                "values": list(self.items),
                "items": [TupleVariable([k, v]) for k, v in zip(keys, self.items, strict=True)],
            }
            return TupleVariable(views[name])  # iterated or listed: a dict view leaves as a tuple (README)
        if self.cls is nn.ModuleDict and name == "__contains__" and len(args) == 1:
            return ConstantVariable(self.contains(tx, args[0]))
        if name in _TRAVERSALS and not args and not kwargs:  # Note [Module traversal]
            from kiln_dynamo.variables.lists import ListIteratorVariable

            pairs = self.named(tx, name.removeprefix("named_"), "")
            if name.startswith("named_"):
                named: list[VT] = [TupleVariable([ConstantVariable(k), v]) for k, v in pairs]
                return ListIteratorVariable(named, "generator")
            return ListIteratorVariable([v for _, v in pairs], "generator")
        raise Unsupported(f"method {name} of a {self.describe()}")

    def named(self, tx: Tx, what: str, prefix: str) -> list[tuple[str, VT]]:
        """`named_<what>(prefix)` of the container as torch walks it (each object once)."""
        out: list[tuple[str, VT]] = [(prefix, self)] if what == "modules" else []
        for key, item in zip(self.keys, self.items, strict=True):
            sub = f"{prefix}.{key}" if prefix else key
            if what == "children":
                out.append((key, item))
            elif isinstance(item, ModuleSliceVariable):
                out += item.named(tx, what, sub)
            else:
                assert isinstance(item, NNModuleVariable)
                walked = traverse(tx, item, f"named_{what}", [], {"prefix": ConstantVariable(sub)})
                for row in walked.items:  # type: ignore[attr-defined]
                    k, v = row.items
                    out.append((k.as_constant(), v))
        seen: set[int] = set()
        unique = []
        for k, v in out:
            ident = id(v.identity())
            if ident not in seen:
                seen.add(ident)
                unique.append((k, v))
        return unique

    def contains(self, tx: Tx, item: VT) -> bool:
        if self.cls is not nn.ModuleDict or not item.is_constant():
            raise Unsupported(f"`in` on a {self.describe()}")
        return item.as_constant() in self.keys

    def getattr(self, tx: Tx, name: str) -> VT:
        if self.cls is nn.ModuleDict and name in _DICT_VIEWS:
            from kiln_dynamo.variables.base import MethodVariable

            return MethodVariable(self, name)
        if name in ("forward", "__getitem__", "__len__") or callable(getattr(self.cls, name, None)):
            from kiln_dynamo.variables.base import MethodVariable

            # a method it does not model (`parameters`, `eval`) breaks at its call, where the frame
            # can split, not at the attribute load
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a {self.describe()}")

    def reconstruct(self, cg: Reconstructor) -> str:
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        items = [i.reconstruct(cg) for i in self.items]
        if self.cls is nn.ModuleDict:
            pairs = ", ".join(f"({k!r}, {v})" for k, v in zip(self.keys, items, strict=True))
            return f"{cg.const(self.cls)}([{pairs}])"
        if self.cls is nn.Sequential:
            pairs = ", ".join(f"({k!r}, {v})" for k, v in zip(self.keys, items, strict=True))
            return f"{cg.const(self.cls)}({cg.const(collections.OrderedDict)}([{pairs}]))"
        return f"{cg.const(self.cls)}([{', '.join(items)}])"


class NewModuleVariable(NNModuleVariable):
    """Note [Modules made in the frame]: `CrossEntropyLoss()` built in a forward. A torch.nn
    module that holds no parameters, buffers or submodules, built from constants, is built for
    real while tracing (its RNG use undone) and then read like any module, without guards: no
    one else can reach it. The frame may not change it; if it leaves the frame, the runner
    builds a fresh one with the same arguments, as every eager call does."""

    def __init__(self, module: nn.Module, args: list[VT], kwargs: dict[str, VT]) -> None:
        super().__init__(module, None)
        self.args = args
        self.kwargs = kwargs

    def setattr(self, tx: Tx, name: str, value: VT) -> None:
        raise Unsupported(f"setting attribute {name!r} on a {self.describe()} made in the frame")

    def reconstruct(self, cg: Reconstructor) -> str:
        bound = cg.bound(self)
        if bound is not None:
            return bound
        from kiln_dynamo.variables.user_defined import is_local_class

        if is_local_class(type(self.module)):  # Note [Class definitions in the frame]
            raise Unsupported(
                f"an instance of {type(self.module).__qualname__}, defined in the frame, cannot leave it"
            )
        args = [a.reconstruct(cg) for a in self.args]
        args += [f"{k}={v.reconstruct(cg)}" for k, v in self.kwargs.items()]
        return f"{cg.const(type(self.module))}({', '.join(args)})"


# Note [Modules made in the frame], which classes: built once while tracing, a module's
# constructor does not run on later calls, so only classes whose constructors just store their
# arguments are built: torch.nn's own modules, and transformers' activation modules (what its
# `ACT2FN[name]` registry builds on each subscript, Note [A dict subclass's own subscript]; their
# `__init__`s set attributes only, and the one that makes parameters, xIELU, is refused below).
# Any other class's constructor may change state outside the module (a counter, a registry, a
# log) that eager changes on every call: that stays a break.
BUILT_WHILE_TRACING = ("torch.nn.modules.", "transformers.activations")

# Note [User modules with torch's constructor]: a user's module class that adds only methods to
# a torch.nn class (`class Swish(nn.Module): def forward(...)`, defined at module level or in
# the frame) is constructed by that class's constructor alone, so it is built like the torch.nn
# class (Note [Modules made in the frame]). "Only methods": every name in the user classes'
# own dicts, up to the torch.nn base in the MRO, is class metadata (`__module__`, `__doc__`, ...)
# or a name the base does not have (so the constructor never reaches it), or `forward`/
# `extra_repr`; none is a data descriptor (a property would run user code when the constructor
# stores an attribute of that name). Mixins after the torch.nn base in the MRO are held to the
# same rule (their properties are found by the base's own stores). Any other dunder (`__init__`, `__new__`, `__setattr__`,
# `__getattr__`, ...) or a metaclass keeps the break: a user constructor may have effects. An
# instance of a class defined in the frame may not leave it (eager makes a new class per call).
_CLASS_METADATA = frozenset(
    {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__",
     "__firstlineno__", "__static_attributes__", "__classcell__", "__orig_bases__", "__parameters__"}
)  # fmt: skip


def _torch_constructed(cls: type) -> bool:
    """Whether building `cls` runs only a built-while-tracing class's constructor (Note [User
    modules with torch's constructor])."""
    mro = cls.__mro__
    i = next((i for i, c in enumerate(mro) if c.__module__.startswith(BUILT_WHILE_TRACING)), None)
    if i is None or i == 0:
        return i == 0
    base = mro[i]
    for c in mro:  # a mixin after the base too: a property there would catch the base's stores
        if c is object or c.__module__.startswith((*BUILT_WHILE_TRACING, "torch.")):
            continue
        if type(c) is not type:
            return False
        for name, value in vars(c).items():
            if name in _CLASS_METADATA:
                continue
            if name.startswith("__") and name.endswith("__"):
                return False
            if hasattr(base, name) and name not in ("forward", "extra_repr"):
                return False
            if hasattr(type(value), "__set__") or hasattr(type(value), "__delete__"):
                return False
    return True


_DICT_VIEWS = ("keys", "values", "items")


# Note [Containers made in the frame]: `nn.Sequential(a, b)`, `nn.ModuleList([a, b])` and
# `nn.ModuleDict({"a": a, "b": b})` built in the frame over modules the trace already holds
# (modules from outside the frame, read through their sources and guarded as usual; modules made
# in the frame; containers made so) are the same thing as a slice of a container (Note [Container
# slices]): a tracker over the children's trackers that indexes, iterates, calls (a Sequential)
# and lists its keys, values and items (a ModuleDict), and that leaves the frame as a fresh
# container over the real children, as eager makes one per call. What it does not model (its
# `parameters()`, `train()`, a store into it) is a break, as the construction was before.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _is_module_tracker(vt: VT) -> bool:
    return isinstance(vt, NNModuleVariable | ModuleSliceVariable)


def _container_of_trackers(cls: type[nn.Module], args: list[VT]) -> VT | None:
    from kiln_dynamo.variables.dicts import DictVariable
    from kiln_dynamo.variables.lists import BaseListVariable

    if cls is nn.Sequential and args and all(_is_module_tracker(a) for a in args):
        return ModuleSliceVariable(cls, [str(i) for i in range(len(args))], list(args))
    if cls is nn.ModuleList and len(args) == 1 and isinstance(args[0], BaseListVariable):
        items = list(args[0].items)
        if all(_is_module_tracker(i) for i in items):
            return ModuleSliceVariable(cls, [], items)
    if cls is nn.ModuleDict and len(args) == 1 and type(args[0]) is DictVariable:
        entries = list(args[0].items.items())
        if all(isinstance(k, str) and _is_module_tracker(v) for k, v in entries):
            return ModuleSliceVariable(cls, [k for k, _ in entries], [v for _, v in entries])
    return None


def construct_module(tx: Tx, cls: type[nn.Module], args: list[VT], kwargs: dict[str, VT]) -> VT:
    """`cls(*args, **kwargs)` for an nn.Module class inside the frame (Note [Modules made in the
    frame])."""
    what = f"constructing {cls.__qualname__} inside the frame"
    if cls in _CONTAINERS and not kwargs and not all(a.is_constant() for a in args):
        built = _container_of_trackers(cls, args)  # Note [Containers made in the frame]
        if built is not None:
            return built
    if not _torch_constructed(cls):
        raise Unsupported(
            f"{what} (only torch.nn's modules, transformers' activations and subclasses of them "
            "that add only methods are built)"
        )
    if not all(a.is_constant() for a in [*args, *kwargs.values()]):
        raise Unsupported(f"{what} from arguments that are not constants")
    with torch.random.fork_rng(devices=[]):
        try:
            m = cls(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
        except Exception as e:
            raise Unsupported(f"{what} raised {type(e).__name__}: {e}") from e
    if m._parameters or any(b is not None for b in m._buffers.values()) or m._modules:
        raise Unsupported(f"{what}: it holds parameters, buffers or submodules")
    return NewModuleVariable(m, args, kwargs)


def is_parameter(value: Any) -> bool:
    return isinstance(value, nn.Parameter)


TENSOR = torch.Tensor
