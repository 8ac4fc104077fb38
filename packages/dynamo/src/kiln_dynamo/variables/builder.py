"""Wrapping real values into trackers, and the guards that wrapping installs.

`VariableBuilder.wrap(value, source)` is the one place that decides how a value from outside the
frame is modelled, by its type, in the order of the table in `wrap` (tensors first, then
constants, containers, modules, functions, classes, objects), and which guard makes that
decision safe (Note [What a guard pins]). Containers and objects are cached by identity for the
whole capture, so two reads of `self.cache` give the same tracker and mutations stay coherent.

Note [What a guard pins]: tensors pin type, dtype, device, requires_grad, sizes and strides;
constants pin type and value; containers pin type and length (dicts: keys in order, and a value
only once it is read: Note [Lazy dict entries] in dicts.py); functions,
Python modules and classes pin identity; nn.Modules and other objects pin only their type,
because everything the capture reads from them is read through a source and guarded itself, so
two instances of one class with the same relevant state share one compiled entry.
"""

from __future__ import annotations

import collections
import enum
import functools
import inspect
import os
import sys
import types
import typing
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch._library.custom_ops import CustomOpDef

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.guards import is_plain_constants
from kiln_dynamo.logs import get_artifact_logger
from kiln_dynamo.source import (
    AttrSource,
    ConstSource,
    GetItemSource,
    IteratorRestSource,
    IteratorSequenceSource,
    RawItemSource,
    Source,
    iterator_rest,
    iterator_sequence,
)
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker
from kiln_dynamo.variables.builtins import BuiltinVariable, is_builtin_handled
from kiln_dynamo.variables.diagnostics import wrap_diagnostics
from kiln_dynamo.variables.dicts import (
    PLAIN_DICTS,
    DefaultDictVariable,
    DictVariable,
    LazyEntry,
    ObjectKey,
    SetVariable,
    class_key,
    modelled_dict_subclass,
    own_subscript,
)
from kiln_dynamo.variables.functions import BoundMethodVariable, PartialVariable, UserFunctionVariable
from kiln_dynamo.variables.inspection import MappingProxyVariable
from kiln_dynamo.variables.lists import (
    ListVariable,
    NamedTupleVariable,
    OutsideIteratorVariable,
    SizeVariable,
    TupleVariable,
)
from kiln_dynamo.variables.model_output import model_output_base, wrap_model_output
from kiln_dynamo.variables.nn_module import NNModuleVariable
from kiln_dynamo.variables.opaque import (
    AutocastExit,
    GradModeExit,
    InferenceModeExitVariable,
    OpaqueCallableVariable,
    OpaqueVariable,
    is_inference_mode_method,
)
from kiln_dynamo.variables.optimizer import OptimizerVariable, is_traced_optimizer
from kiln_dynamo.variables.stdlib import (
    EnvironVariable,
    FrozenValueVariable,
    ListMutatorVariable,
    LruCacheVariable,
    NamedTupleFactoryVariable,
    NumpyFoldVariable,
    PureFunctionVariable,
    PythonRngCallVariable,
    WeakrefVariable,
    frozen_kind,
    is_list_mutator,
    is_numpy_callable,
    is_pure_function,
    is_python_rng_method,
)
from kiln_dynamo.variables.torch import (
    _FOLD_ON_CONSTANTS,
    GRAD_MODE_FACTORIES,
    AutocastFactoryVariable,
    GradModeFactoryVariable,
    PythonModuleVariable,
    TorchFunctionVariable,
    is_torch_callable,
)
from kiln_dynamo.variables.user_defined import UserClassVariable, UserObjectVariable, is_namedtuple_class

if TYPE_CHECKING:
    from kiln_dynamo.output import OutputGraph

VT = VariableTracker

CONSTANT_TYPES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    type(Ellipsis),
    type(NotImplemented),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    range,
    enum.Enum,
)


log = get_artifact_logger("decisions")
# iterators whose `__reduce__` hands back the items they have left (Note [Iterators over a dict
# from outside]): OrderedDict's one type for keys, values and items, and dict's three
_DICT_ITERATORS: frozenset[type] = frozenset(
    map(type, (iter(collections.OrderedDict().items()), iter({}), iter({}.values()), iter({}.items())))
)
_LIST_ITERATOR: type = type(iter([]))
_OUTSIDE_ITERATORS = _DICT_ITERATORS | {_LIST_ITERATOR, type(iter(()))}
_VERSION_INFO = type(sys.version_info)  # `sys.version_info >= (3, 12)`: a constant of the process


# Note [Type annotations as constants]: an annotation object (`int | None`, `Optional[int]`,
# `list[str]`, `Literal["a"]`, `typing.Union` itself) is immutable, hashed and compared by its
# structure, and what code reads from it (`__args__`, `__origin__`, `typing.get_args`) is a pure
# function of that structure. huggingface_hub's strict dataclasses (every transformers config)
# validate each attribute store against its field's annotation, dispatching through a dict keyed
# by `Union`/`Literal`/`list`: so annotations are constants, guarded on their type and `==` like
# any constant, and usable as dict keys. Before, a store on a config made in the frame broke on
# `tp.__args__` ("customises attribute lookup in C") and on that dict's keys.
TYPING_CONSTANT_TYPES: tuple[type, ...] = (
    types.UnionType,
    types.GenericAlias,
    typing._GenericAlias,  # type: ignore[attr-defined]  # Union[...], Optional[...], Literal[...]
    typing._SpecialForm,  # Union, Optional, Literal, ClassVar
)


def is_constant_value(value: Any) -> bool:
    if isinstance(value, CONSTANT_TYPES):
        return True
    if isinstance(value, TYPING_CONSTANT_TYPES):
        return True
    if isinstance(value, slice):
        return all(is_constant_value(v) for v in (value.start, value.stop, value.step))
    if isinstance(value, (frozenset,)):
        return all(is_constant_value(v) for v in value)
    return isinstance(value, (torch.finfo, torch.iinfo, _VERSION_INFO))


class VariableBuilder:
    def __init__(self, output: OutputGraph) -> None:
        self.output = output
        self.cache: dict[int, VT] = {}
        self.keepalive: list[object] = []

    def wrap(self, value: Any, source: Source | None) -> VT:
        cached = self.cache.get(id(value))
        if cached is not None:
            if (
                source is not None
                and cached.source is not None
                and source != cached.source
                and not isinstance(value, (types.ModuleType, types.FunctionType, type))  # identity-guarded
            ):
                # One object reached two ways: the graph and the replay assume it stays one object.
                self.output.guards.same_object(source, cached.source)
            return cached
        vt = self._wrap(value, source)
        if not is_constant_value(value) and not isinstance(value, (tuple, torch.Size)):
            self.cache[id(value)] = vt
            self.keepalive.append(value)
        return vt

    def _list_items(self, value: list[Any], source: Source) -> list[VT]:
        """The guarded items of an outside list, read for the first time (Note [Lists read only
        when needed]): the value as the frame entered, since tracing mutates nothing real."""
        if is_plain_constants(value):
            self.output.guards.constant_sequence(source, value)
            return [ConstantVariable(v) for v in value]
        self.output.guards.length(source, value)
        return [self.wrap(v, GetItemSource(source, i)) for i, v in enumerate(value)]

    def _wrap(self, value: Any, source: Source | None) -> VT:
        guards = self.output.guards
        if isinstance(value, torch.Tensor):
            if source is None:
                source = ConstSource(value, f"<tensor {tuple(value.shape)} held by the capture>")
            return self.output.add_input(value, source)
        if is_constant_value(value):
            if source is not None:
                guards.constant(source, value)
            return ConstantVariable(value)
        kind = frozen_kind(value)
        if kind is not None:  # Note [Frozen values] in stdlib.py
            if source is not None:
                guards.constant(source, value)
            return FrozenValueVariable(value, kind, source)
        if isinstance(value, torch.Size):
            if source is not None:
                guards.constant(source, value)
            return SizeVariable([ConstantVariable(int(s)) for s in value])
        if (
            type(value) in _OUTSIDE_ITERATORS and source is not None
        ):  # Note [Iterators over a dict from outside]
            rest = iterator_rest(value)
            if type(rest) is list:
                guards.type_match(source, value)
                rest_source = IteratorRestSource(source)
                guards.type_match(rest_source, rest)
                log.info("%s: a %s over the %d items it has left", source, type(value).__name__, len(rest))
                backing = None
                seq = iterator_sequence(value) if type(value) is _LIST_ITERATOR else None
                if type(seq) is list:  # the list itself, which the frame may reach another way too
                    backing = self.wrap(seq, IteratorSequenceSource(source))
                rest_items = self._list_items(rest, rest_source)
                return OutsideIteratorVariable(rest_items, type(value), source, backing)
        if type(value) is list and source is not None:
            # Note [Lists read only when needed]: an outside list is guarded on its type now and on
            # its length and items only when the frame reads them; appends to it before any read
            # are replayed as `extend`, so a frame that only appends to a log list keeps one entry.
            guards.type_match(source, value)
            return ListVariable([], source, realize=lambda: self._list_items(value, source))
        if isinstance(value, (tuple, list)):
            if source is not None and type(value) in (tuple, list) and is_plain_constants(value):
                guards.constant_sequence(source, value)  # one check for e.g. a conv's stride
                items: list[VT] = [ConstantVariable(v) for v in value]
            else:
                if source is not None:
                    guards.type_match(source, value)
                    guards.length(source, value)
                items = [
                    self.wrap(v, GetItemSource(source, i) if source is not None else None)
                    for i, v in enumerate(value)
                ]
            if isinstance(value, list):
                return ListVariable(items, source) if type(value) is list else self._unsupported(value)
            if is_namedtuple_class(type(value)) or type(value).__module__ == "torch.return_types":
                return NamedTupleVariable(items, type(value), source)
            return TupleVariable(items, source) if type(value) is tuple else self._unsupported(value)
        if isinstance(value, dict):
            base = model_output_base(type(value))
            if base is not None:
                return wrap_model_output(self, value, base, source)
            if type(value) not in PLAIN_DICTS and not modelled_dict_subclass(type(value)):
                return self._unsupported(value)
            if source is not None:
                guards.type_match(source, value)
                guards.dict_keys(source, value)
            keys = {k: self._dict_key(k) for k in value}
            # Note [A dict subclass's own subscript]: entries read without the override
            item = GetItemSource if own_subscript(type(value)) is None else RawItemSource
            if type(value) is collections.defaultdict:
                fsrc = AttrSource(source, "default_factory") if source is not None else None
                factory = self.wrap(value.default_factory, fsrc)
                if source is None:
                    return DefaultDictVariable(
                        {keys[k]: self.wrap(v, None) for k, v in value.items()}, factory
                    )
                lazy = {keys[k]: LazyEntry(v, item(source, k), self.wrap) for k, v in value.items()}
                return DefaultDictVariable(lazy, factory, source)
            if source is None:
                return DictVariable({keys[k]: self.wrap(v, None) for k, v in value.items()}, type(value))
            lazy = {keys[k]: LazyEntry(v, item(source, k), self.wrap) for k, v in value.items()}
            return DictVariable(lazy, type(value), source)  # Note [Lazy dict entries]
        if isinstance(value, types.MappingProxyType):
            if source is None:
                raise Unsupported("a mappingproxy without a source")
            guards.type_match(source, value)
            guards.dict_keys(source, value)  # type: ignore[arg-type]
            if not all(isinstance(k, (str, int, enum.Enum)) for k in value):
                raise Unsupported("mappingproxy with a key that is not a string, int or enum")
            lazy = {k: LazyEntry(v, GetItemSource(source, k), self.wrap) for k, v in value.items()}
            return MappingProxyVariable(lazy, source)
        if isinstance(value, (set, frozenset)):
            if not all(is_constant_value(v) for v in value):
                raise Unsupported("set of non-constant values")
            if source is not None:
                guards.constant(source, value)
            return SetVariable(list(value), isinstance(value, frozenset), source)
        if isinstance(value, nn.Module):
            if source is not None:
                guards.type_match(source, value)
            return NNModuleVariable(value, source)
        if type(value) is weakref.ref:
            if source is not None:
                guards.type_match(source, value)
            return WeakrefVariable(value, source)
        if isinstance(value, functools._lru_cache_wrapper) and inspect.isfunction(
            getattr(value, "__wrapped__", None)
        ):
            if source is not None:
                guards.identity(source, value)
            return LruCacheVariable(value, source)
        if is_numpy_callable(value):
            if source is not None:
                guards.identity(source, value)
            return NumpyFoldVariable(value, source)
        if value is os.environ:
            if source is not None:
                guards.identity(source, value)
            return EnvironVariable(value, source)
        diagnostic = wrap_diagnostics(value, source, self.output)
        if diagnostic is not None:
            return diagnostic
        if value is collections.namedtuple:  # Note [namedtuple made in the frame] in stdlib.py
            if source is not None:
                guards.identity(source, value)
            return NamedTupleFactoryVariable(value, source)
        if is_python_rng_method(value):  # Note [Python's random module] in stdlib.py
            if source is not None:
                guards.identity(source, value)
            return PythonRngCallVariable(value, source)
        if is_list_mutator(value):
            if source is not None:
                guards.identity(source, value)
            return ListMutatorVariable(value, source)
        if is_pure_function(value) or (
            isinstance(value, types.FunctionType) and getattr(value, "_dynamo_marked_constant", False) is True
        ):
            if source is not None:
                guards.identity(source, value)
            return PureFunctionVariable(value, source)
        if any(value is f for f in GRAD_MODE_FACTORIES):
            return GradModeFactoryVariable(value)
        if value is torch.autocast:
            return AutocastFactoryVariable()
        if is_builtin_handled(value):
            if source is not None:
                guards.identity(source, value)
            return BuiltinVariable(value)
        if is_torch_callable(value):
            if source is not None:
                guards.identity(source, value)
            return TorchFunctionVariable(value, source)
        if isinstance(value, CustomOpDef):
            # a `@torch.library.custom_op` function: its call is the registered operator (one graph
            # node, run through its fake kernel at trace time), not its Python wrapper to inline
            if source is not None:
                guards.identity(source, value)
            return TorchFunctionVariable(value._opoverload, source)
        if isinstance(value, torch.jit.ScriptFunction) and isinstance(
            getattr(value, "_torchdynamo_inline", None), types.FunctionType
        ):
            # Note [Scripted functions]: `@torch.jit.script` keeps the Python function it compiled
            # (`_torchdynamo_inline`, set for tracers such as this one); eager runs TorchScript's
            # compilation of the same code, so the Python function is inlined (DeBERTa's
            # `scaled_size_sqrt` broke every attention layer on CUDA before)
            # (the scripted function is guarded by identity, and it never changes the Python
            # function it holds: that one is inlined as a function made in the frame, sourceless)
            if source is not None:
                guards.identity(source, value)
            return UserFunctionVariable(value._torchdynamo_inline, None)  # type: ignore[attr-defined]
        if isinstance(value, types.FunctionType):
            if source is not None:
                guards.function(source, value)
            return UserFunctionVariable(value, source)
        if is_inference_mode_method(value):  # Note [inference_mode in the frame] in opaque.py
            if source is not None:
                guards.type_match(source, value)
            return InferenceModeExitVariable(value, source)
        if isinstance(value, types.MethodType):
            f_src = AttrSource(source, "__func__") if source is not None else None
            s_src = AttrSource(source, "__self__") if source is not None else None
            return BoundMethodVariable(self.wrap(value.__func__, f_src), self.wrap(value.__self__, s_src))
        if isinstance(value, functools.partial):
            if source is not None:
                guards.type_match(source, value)
            func = self.wrap(value.func, AttrSource(source, "func") if source is not None else None)
            args = [
                self.wrap(a, GetItemSource(AttrSource(source, "args"), i) if source else None)
                for i, a in enumerate(value.args)
            ]
            kwargs = {
                k: self.wrap(v, GetItemSource(AttrSource(source, "keywords"), k) if source else None)
                for k, v in value.keywords.items()
            }
            return PartialVariable(func, args, kwargs, source)
        if isinstance(value, types.ModuleType):
            if source is not None:
                guards.identity(source, value)
            return PythonModuleVariable(value, source)
        if isinstance(value, type) and value in _FOLD_ON_CONSTANTS:
            return TorchFunctionVariable(value, source)
        if isinstance(value, type):
            if source is not None:
                guards.identity(source, value)
            if value.__module__ == "builtins":
                return BuiltinVariable(value)
            return UserClassVariable(value, source)
        if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            if source is not None:
                guards.identity(source, value)
            return OpaqueCallableVariable(value, source)  # calling it breaks the graph
        if isinstance(value, GradModeExit):
            from kiln_dynamo.variables.torch import GradModeVariable, WithExitVariable

            if source is not None:
                guards.identity(source, value)
            block = GradModeVariable(torch.is_grad_enabled(), True, prev=value.prev)
            block.outside = True  # entered before the split: Note [Grad mode when a graph raises]
            return WithExitVariable(block)
        if isinstance(value, AutocastExit):
            from kiln_dynamo.variables.torch import AutocastVariable, WithExitVariable

            if source is not None:
                guards.identity(source, value)
            device, was_on, was_dtype, was_cached = value.args
            entered = (device, torch.get_autocast_dtype(device), True, torch.is_autocast_cache_enabled())
            return WithExitVariable(AutocastVariable(entered, prev=(was_on, was_dtype, was_cached)))
        if isinstance(value, types.GeneratorType):
            if source is None:
                raise Unsupported("a generator object without a source")
            guards.type_match(source, value)
            return OpaqueVariable(value, source, f"generator object {value.__qualname__}")
        if isinstance(value, (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)):
            from kiln_dynamo.variables.torch import GradModeVariable

            # An existing grad-mode object (e.g. the one behind @torch.no_grad()): __enter__ applies it.
            self.output.guards.global_state()
            if isinstance(value, torch.set_grad_enabled):
                # Applied when it was made (a frame split right after `torch.set_grad_enabled(b)`):
                # its __exit__ restores the mode it saved then.
                if source is not None:
                    guards.constant(AttrSource(source, "mode"), value.mode)
                    guards.constant(AttrSource(source, "prev"), value.prev)
                return GradModeVariable(bool(value.mode), True, cls=type(value), prev=bool(value.prev))
            target = isinstance(value, torch.enable_grad)
            return GradModeVariable(target, applied_on_create=False, cls=type(value))
        if type(value) is torch.inference_mode and source is not None and isinstance(value.mode, bool):
            # the object behind `@torch.inference_mode()` (Note [inference_mode traced] in inference.py)
            from kiln_dynamo.variables.opaque import InferenceModeVariable

            guards.type_match(source, value)
            guards.constant(AttrSource(source, "mode"), value.mode)
            return InferenceModeVariable(value.mode)
        if type(value) is torch.autocast and source is not None:
            # Note [An autocast object made outside the frame]: the object behind
            # `@torch.autocast(...)` (its wrapper runs `with autocast_instance:`) is traced as the
            # block its attributes describe; it ran as Python (its __enter__ a graph break, its
            # __exit__ five more: Note [Global setters run as Python] in torch.py)
            from kiln_dynamo.variables.torch import AutocastVariable

            self.output.guards.global_state()
            guards.identity(source, value)
            names = ("device", "fast_dtype", "_enabled", "_cache_enabled")
            for name in names:
                guards.constant(AttrSource(source, name), getattr(value, name))
            return AutocastVariable(tuple(getattr(value, name) for name in names))
        if is_traced_optimizer(value) and source is not None:
            guards.identity(source, value)  # its state is read by identity (Note [Tracing an optimizer step])
            return OptimizerVariable(value, source)
        if type(value).__module__.startswith("torch") and not isinstance(value, nn.Module):
            if source is None:
                raise Unsupported(f"torch object of type {type(value).__qualname__}")
            # passed along untouched (an optimizer a training step closes over): what the frame
            # does with it breaks there, not at the load, so the code before it still compiles
            guards.identity(source, value)
            return OpaqueVariable(value, source, f"torch object of type {type(value).__qualname__}")
        if source is not None:
            guards.type_match(source, value)
        return UserObjectVariable(value, source)

    def _dict_key(self, k: Any) -> Any:
        """The key of an outside dict's entry in its DictVariable: the key itself for a string, int,
        enum member or class, an ObjectKey for a function (Note [Classes as dict keys])."""
        if isinstance(k, (str, int, enum.Enum, TYPING_CONSTANT_TYPES)) or class_key(k) is not None:
            return k  # an annotation: Note [Type annotations as constants]
        if type(k) is types.FunctionType:
            return ObjectKey(self.wrap(k, None))
        raise Unsupported(f"dict with a key of type {type(k).__name__}")

    def _unsupported(self, value: Any) -> VT:
        raise Unsupported(f"container subclass {type(value).__qualname__}")
