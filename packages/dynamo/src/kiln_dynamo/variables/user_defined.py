"""User classes and their instances.

`UserClassVariable` is a class read from outside the frame. Calling it inside the frame creates
a `NewObjectVariable` whose attributes are trackers (its `__init__` is inlined with the new object
as `self`); a dataclass gets the same treatment through its generated `__init__`, a namedtuple
becomes a `NamedTupleVariable`, a transformers `ModelOutput` a `ModelOutputVariable`
(model_output.py). A new object that escapes the frame is rebuilt by the runner
with `cls.__new__(cls)` and `object.__setattr__` per attribute.

`UserObjectVariable` is an existing instance read from outside: attributes come from the real
object (instance dict first, then the class: methods bind, properties run), each with a source
that guards it. Assignments go to `SideEffects` and are replayed after the graph.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import dis
import enum
import inspect
import types
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import AttrSource, GetItemSource, InstanceDictSource, Source
from kiln_dynamo.variables.autograd_function import AutogradFunctionApplyVariable, is_autograd_function
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker
from kiln_dynamo.variables.dicts import PLAIN_DICTS, DictVariable
from kiln_dynamo.variables.exceptions import (
    ExceptionVariable,
    ObservedException,
    is_plain_exception_class,
    missing_attribute,
    observed,
)
from kiln_dynamo.variables.lists import NamedTupleVariable
from kiln_dynamo.variables.model_output import construct_model_output, model_output_base
from kiln_dynamo.variables.nn_module import (
    ModuleDefaultCallVariable,
    NNModuleVariable,
    class_attribute,
    construct_module,
    guard_class_attr,
    guard_no_class_attr,
    pending_class_attr,
)

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker
_GETSET = type(type.__dict__["__dict__"])  # the instance-dict descriptor of a Python class


def is_namedtuple_class(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields") and hasattr(cls, "_make")


# Note [Parameters made in the frame]: `nn.Parameter(t)` makes a new leaf tensor that requires
# grad and shares `t`'s storage (lazily built weights, a bias made per call). A graph cannot make
# a leaf: aotgrad traces the tensors that require grad as its inputs, and the gradient of a leaf
# made mid-graph would have to land in that new object's `.grad`. torch.compile makes the
# parameter before its graph, as one more input, and copies the data in; kiln does not yet make
# objects for its graphs, so the constructor is one clean break: the graph before it, the
# parameter made in Python (eager's own object, type and `.grad`), the rest resumed.
_NEW_PARAMETER = "nn.Parameter(...) made inside the compiled frame (a new leaf tensor that requires grad)"
_NEW_PARAMETER_ADVICE = "create the parameter in the module's __init__, or outside the compiled function"


class UserClassVariable(VariableTracker):
    def __init__(self, cls: type, source: Source | None) -> None:
        self.cls = cls
        self.source = source

    def describe(self) -> str:
        return f"class {self.cls.__qualname__}"

    def python_type(self) -> type:
        return type(self.cls)

    def identity(self) -> object:
        return self.cls

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.source) if self.source is not None else cg.const(self.cls)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.cls

    def getattr(self, tx: Tx, name: str) -> VT:
        pending = pending_class_attr(tx, self.cls, name)
        if pending is not None:
            return pending
        if name == "__dict__" and _stored_on(tx, self.cls):
            raise Unsupported(f"{self.describe()}.__dict__ after the frame set a class attribute")
        if name == "apply" and is_autograd_function(self.cls):
            return AutogradFunctionApplyVariable(self.cls)  # Note [autograd.Function in the graph]
        try:
            static = inspect.getattr_static(self.cls, name)
        except AttributeError:
            raise AttributeError(f"type object {self.cls.__name__!r} has no attribute {name!r}") from None
        if isinstance(static, (staticmethod, classmethod)):
            guard_class_attr(tx, self.cls, name, static)
        if isinstance(static, staticmethod):
            return tx.wrap(static.__func__, None)
        if isinstance(static, classmethod):
            from kiln_dynamo.variables.functions import BoundMethodVariable

            return BoundMethodVariable(tx.wrap(static.__func__, None), self)
        if isinstance(self.cls, enum.EnumMeta) and isinstance(getattr(self.cls, name), self.cls):
            return ConstantVariable(getattr(self.cls, name))
        return tx.wrap(
            getattr(self.cls, name), AttrSource(self.source, name) if self.source is not None else None
        )

    def setattr(self, tx: Tx, name: str, value: VT) -> None:
        """Note [Setting a class attribute]: `Cls.flag = value` on a class from outside the frame
        (a global, a closure, a module attribute: a tracker with a source) is a side effect replayed
        after the graph, as a store on an existing object is; reads later in the frame see the
        stored value through every lookup that consults the class (`Cls.flag`, `obj.flag` on an
        instance, old or made in the frame, `super()`, `hasattr`), since they look for a pending
        store along the MRO before the real class. Only plain values (numbers, strings, None, a
        tensor) are stored, so that no lookup has a descriptor to run; not a dunder (the
        interpreter reads those without kiln), not on a metaclass other than `type`/`ABCMeta` nor
        on a built-in or immutable type (the store raises TypeError there, at once), and
        not on a class with a module or autograd.Function below it (their lookups are kiln's own).
        The guards on what the frame read before the store see the new value on the next call (a
        counter bumped on every call recompiles every call, as in torch.compile). A class made in
        the frame (Note [Class definitions in the frame]) takes the same plain values, kept for
        the frame's later reads and never replayed: nothing outside sees that class, eager makes
        a fresh one per call and the runner never writes to the one made while tracing, so each
        call starts from its class body's values, as eager's does. Anything else stays a break
        with its reason."""
        cls: Any = self.cls
        what = f"setting attribute {name!r} on {self.describe()}"
        if name.startswith("__") and name.endswith("__"):
            raise Unsupported(f"{what}: a dunder, which Python reads without kiln")
        if cls in _LOCAL_CLASSES:
            if not _plain_value(value):
                raise Unsupported(f"{what}: the value is a {value.describe()}, not a plain value")
            tx.output.side_effects.store_unseen(cls, name, value)
            return
        if type(cls) not in (type, abc.ABCMeta):
            raise Unsupported(f"{what}: its metaclass is {type(cls).__name__}")
        if not cls.__flags__ & _HEAPTYPE or cls.__flags__ & _IMMUTABLETYPE:
            raise Unsupported(f"{what}: a built-in or immutable type, which refuses the store")
        if any(issubclass(c, (nn.Module, torch.autograd.Function)) for c in _with_subclasses(cls)):
            raise Unsupported(f"{what}: a module or autograd.Function class, or a base of one")
        if self.source is None:
            raise Unsupported(f"{what}: kiln has no source to replay the store through")
        if not _plain_value(value):
            raise Unsupported(f"{what}: the value is a {value.describe()}, not a plain value")
        tx.output.side_effects.store_attr(self, cls, name, value)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        cls: Any = self.cls
        if is_namedtuple_class(cls):
            from kiln_dynamo.variables.functions import bind_args

            init = cls.__new__
            defaults = [tx.wrap_constant(d) for d in (init.__defaults__ or ())]
            bound = bind_args(init.__code__, [self, *args], kwargs, defaults, {})
            return NamedTupleVariable([bound[f] for f in cls._fields], cls)
        if issubclass(cls, enum.Enum) and len(args) == 1 and args[0].is_constant():
            return ConstantVariable(cls(args[0].as_constant()))
        base = model_output_base(cls)
        if base is not None:
            return construct_model_output(tx, cls, base, args, kwargs)
        if issubclass(cls, dict):
            raise Unsupported(
                f"constructing {cls.__qualname__}, a dict subclass that is not a modelled ModelOutput"
            )
        if issubclass(cls, nn.Module):
            return construct_module(tx, cls, args, kwargs)
        if cls is torch.inference_mode:  # Note [inference_mode in the frame] (opaque.py)
            from kiln_dynamo.variables.opaque import InferenceModeVariable

            im_args = inspect.signature(torch.inference_mode.__init__).bind(None, *args, **kwargs)
            mode = im_args.arguments.get("mode", ConstantVariable(True))
            if not mode.is_constant():
                raise Unsupported("torch.inference_mode with a mode that is not a constant")
            return InferenceModeVariable(bool(mode.as_constant()))
        if is_plain_exception_class(cls):
            if kwargs:
                raise Unsupported(f"{cls.__qualname__}() with keyword arguments")
            return ExceptionVariable(cls, args)  # Note [Exceptions the frame raises and catches]
        if issubclass(cls, nn.Parameter):
            raise Unsupported(_NEW_PARAMETER, advice=_NEW_PARAMETER_ADVICE)
        if cls.__new__ is not object.__new__:
            raise Unsupported(f"constructing {cls.__qualname__}, which defines __new__ or has a C base")
        if type(cls) is abc.ABCMeta and getattr(cls, "__abstractmethods__", None):
            raise Unsupported(f"constructing {cls.__qualname__}, which has abstract methods")
        if type(cls) not in (type, abc.ABCMeta):  # ABCMeta creates instances as type does
            raise Unsupported(f"constructing {cls.__qualname__}, whose metaclass is {type(cls).__name__}")
        obj = NewObjectVariable(cls)
        init = inspect.getattr_static(cls, "__init__")
        if init is not object.__init__:
            if not inspect.isfunction(init):
                raise Unsupported(f"{cls.__qualname__}.__init__ is not a Python function")
            tx.wrap(init, None).call(tx, [obj, *args], kwargs)
        elif args or kwargs:
            raise Unsupported(f"{cls.__qualname__}() takes no arguments")
        return obj


_IMMUTABLETYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: setting an attribute raises TypeError
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def _with_subclasses(cls: type) -> list[type]:
    out: list[type] = [cls]
    todo: list[type] = [cls]
    while todo:
        sub: type
        for sub in type.__subclasses__(todo.pop()):
            if sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


def _plain_value(value: VT) -> bool:
    from kiln_dynamo.variables.tensor import TensorVariable

    if isinstance(value, TensorVariable):
        return True
    return isinstance(value, ConstantVariable) and type(value.value) in (int, float, bool, str, type(None))


def _stored_on(tx: Tx, cls: type) -> bool:
    """Whether the frame has stored an attribute on `cls` (Note [Setting a class attribute])."""
    effects = tx.output.side_effects
    return id(cls) in effects.unseen_stores or any(
        target.identity() is cls for target, _, _ in effects.attr_stores
    )


# Note [Stores through data descriptors]: `obj.name = value` on an object made in the frame goes
# through a data descriptor its class defines for `name`, as CPython's generic store does: a
# property's setter is inlined with the object and the value (a setter that changes the value or
# stores it elsewhere is eager's too); any other data descriptor (`__slots__` members, a
# descriptor class with `__set__`, a property without a setter, where eager raises) is a break.
# A class that defines `__setattr__` is a break for every store (kiln does not run the hook);
# `object.__setattr__(obj, ...)` skips the hook but not the descriptor, as in CPython. Before,
# such a store went into the instance's attributes, and a read found it there first: a setter's
# work was lost.
# Note [vars of an object made in the frame]: `vars(obj)` (and `obj.__dict__`) of an instance
# made in the frame is its instance dict, live in both directions: `vars(c)["k"] = v` is seen by
# `c.k`, and a later `c.k = v` by the dict. The tracker of that dict keeps its entries in the
# object's own attribute table, so there is one copy of the truth. The object itself never
# leaves the frame (it has no way to be rebuilt), so a dict that does is rebuilt as a plain dict
# with the same entries, which is all the caller can observe of eager's. A class that defines
# `__slots__` without `__dict__` is a break. A class with its own `__getattribute__` runs it to
# reach `__dict__` (Note [Attribute hooks of objects made in the frame]); a write through the
# dict skips its `__setattr__`, as in eager.
def instance_dict_of(tx: Tx, obj: NewObjectVariable) -> VT:
    from kiln_dynamo.variables.dicts import DictVariable

    cls = obj.cls
    if not isinstance(inspect.getattr_static(cls, "__dict__", None), _GETSET):
        raise Unsupported(f"the instance dict of {obj.describe()}: its class has slots")
    if obj.instance_dict is None:

        class _InstanceDict(DictVariable):
            def __init__(self) -> None:  # no entries of its own: they are obj.attrs
                self.user_cls = dict
                self.source = None

            @property
            def _items(self) -> dict[Any, Any]:
                return obj.attrs

            @_items.setter
            def _items(self, value: dict[Any, Any]) -> None:
                if not all(isinstance(k, str) for k in value):
                    raise Unsupported(f"a key that is not a string in the instance dict of {obj.describe()}")
                if value is not obj.attrs:
                    obj.attrs.clear()
                    obj.attrs.update(value)

        obj.instance_dict = _InstanceDict()
    return obj.instance_dict


# Note [The __getattr__ fallback]: CPython's attribute read on an instance of a class that defines
# `__getattr__` runs `type(obj).__getattribute__(obj, name)` (object's generic lookup or the
# class's own hook) and, only when that raises AttributeError (no instance attribute, no class
# attribute, an empty slot, a property getter or `__getattribute__` that raised it), calls
# `type(obj).__getattr__(obj, name)`; whatever that returns or raises is the read's result. kiln
# does the same for an object made in the frame and for one from outside: the lookup as before,
# and on its AttributeError (kiln's own for a missing name, or the program's, observed) the
# class's Python `__getattr__` inlined with the object and the name, its method read guarded as
# every class attribute read is; what it raises is the program's (getattr's default, hasattr
# and `except AttributeError` take it). A normal hit never calls the hook, and a `__getattr__`
# written in C is a break. Before, an object made in the frame skipped the hook (getattr's
# default and hasattr answered as if the class had none: a wrong answer), and one from outside
# was a break on every miss.
def getattr_fallback(tx: Tx, obj: VT, cls: type, name: str, e: AttributeError | ObservedException) -> VT:
    """After the normal lookup of `obj.name` raised `e`: `cls.__getattr__(obj, name)` when the class
    defines one, else `e` again."""
    if not missing_attribute(e):
        raise e
    static = inspect.getattr_static(cls, "__getattr__", None)  # a dunder: never a pending store
    if static is None:
        raise e
    if not inspect.isfunction(static):
        raise Unsupported(f"{cls.__qualname__} defines __getattr__ in C") from None
    guard_class_attr(tx, cls, "__getattr__", static)
    return tx.wrap(static, None).call(tx, [obj, ConstantVariable(name)], {})


class NewObjectVariable(VariableTracker):
    """An instance of a user class created inside the frame."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.attrs: dict[str, VT] = {}
        self.instance_dict: VT | None = None  # Note [vars of an object made in the frame]

    def describe(self) -> str:
        return f"new {self.cls.__qualname__} object"

    def python_type(self) -> type:
        return self.cls

    def getattr(self, tx: Tx, name: str) -> VT:
        hook = self._attribute_hook(tx, "__getattribute__")
        try:
            if hook is not None:  # Note [Attribute hooks of objects made in the frame]
                return hook.call(tx, [self, ConstantVariable(name)], {})
            return self.generic_getattr(tx, name)
        except (AttributeError, ObservedException) as e:
            return getattr_fallback(tx, self, self.cls, name, e)  # Note [The __getattr__ fallback]

    # Note [Attribute hooks of objects made in the frame]: a class that defines `__getattribute__`,
    # `__setattr__` or `__delattr__` in Python (transformers' configs remap names through
    # `attribute_map`; huggingface_hub's strict dataclasses validate every store) runs that hook
    # for every read, store or delete on an object made in the frame, inlined as eager runs it;
    # its `super().__getattribute__` / `__setattr__` / `__delattr__` (object's own) come back to
    # the generic lookup, store and delete below. A hook written in C is a break. Before, reads
    # skipped the hook (a remapped name read the wrong entry) and every store was a break.
    def _attribute_hook(self, tx: Tx, name: str) -> VT | None:
        default = getattr(object, name)
        hook = inspect.getattr_static(self.cls, name, default)
        if hook is default:
            return None
        if not inspect.isfunction(hook):
            raise Unsupported(f"{self.describe()}: its class defines {name} in C")
        guard_class_attr(tx, self.cls, name, hook)
        return tx.wrap(hook, None)

    def generic_getattr(self, tx: Tx, name: str) -> VT:
        """object.__getattribute__: the instance's attributes, then the class."""
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return tx.wrap(self.cls, None)
        if name == "__dict__":
            if self.cls.__dictoffset__ == 0:
                raise Unsupported(f"__dict__ of {self.describe()}, whose class has only slots")
            return instance_dict_of(tx, self)
        pending = pending_class_attr(tx, self.cls, name)
        if pending is not None:
            return pending
        try:
            static = inspect.getattr_static(self.cls, name)
        except AttributeError:
            guard_no_class_attr(tx, self.cls, name)  # Note [Class attributes found missing]
            raise AttributeError(f"{self.cls.__name__!r} object has no attribute {name!r}") from None
        from kiln_dynamo.variables.functions import BoundMethodVariable, UserFunctionVariable

        if _is_slot(self.cls, name, static):  # an empty slot: Note [Slots of objects made in the frame]
            raise AttributeError(f"{self.cls.__name__!r} object has no attribute {name!r}")
        guard_class_attr(tx, self.cls, name, static)  # Note [Class attributes read through an instance]
        if inspect.isfunction(static):
            return BoundMethodVariable(UserFunctionVariable(static, None), self)
        if isinstance(static, property) and static.fget is not None:
            return tx.wrap(static.fget, None).call(tx, [self], {})
        if isinstance(static, staticmethod):
            return tx.wrap(static.__func__, None)
        if isinstance(static, classmethod):
            return BoundMethodVariable(tx.wrap(static.__func__, None), tx.wrap(self.cls, None))
        return tx.wrap(static, None)

    def setattr(self, tx: Tx, name: str, value: VT) -> None:
        if (
            dataclasses.is_dataclass(self.cls)
            and vars(self.cls).get("__dataclass_params__", _NOT_FROZEN).frozen
            and name in self.attrs
        ):
            raise Unsupported("assignment to a field of a frozen dataclass")
        hook = self._attribute_hook(tx, "__setattr__")
        if hook is not None:  # Note [Attribute hooks of objects made in the frame]
            hook.call(tx, [self, ConstantVariable(name), value], {})
            return
        self.store(tx, name, value)

    def delete(self, tx: Tx, name: str) -> None:
        """`del obj.name` / `delattr(obj, name)`."""
        hook = self._attribute_hook(tx, "__delattr__")
        if hook is not None:  # Note [Attribute hooks of objects made in the frame]
            hook.call(tx, [self, ConstantVariable(name)], {})
            return
        self.generic_delete(tx, name)

    def generic_delete(self, tx: Tx, name: str) -> None:
        """object.__delattr__: only an instance attribute (a descriptor's `__delete__` is a break)."""
        static = inspect.getattr_static(self.cls, name, None)
        if hasattr(type(static), "__set__") or hasattr(type(static), "__delete__"):
            raise Unsupported(f"deleting attribute {name!r} of {self.describe()} through a descriptor")
        if name not in self.attrs:
            raise Unsupported(
                f"deleting attribute {name!r} that {self.describe()} does not have (AttributeError)"
            )
        del self.attrs[name]

    def store(self, tx: Tx, name: str, value: VT) -> None:
        """`object.__setattr__(obj, name, value)`: Note [Stores through data descriptors]."""
        try:
            static = inspect.getattr_static(self.cls, name)
        except AttributeError:
            static = None
        if _is_slot(self.cls, name, static):  # Note [Slots of objects made in the frame]
            self.attrs[name] = value
            return
        if self.cls.__dictoffset__ == 0 and static is None:
            raise Unsupported(f"setting attribute {name!r} on {self.describe()}, which has no __dict__")
        if pending_class_attr(tx, self.cls, name) is None and hasattr(type(static), "__set__"):
            guard_class_attr(tx, self.cls, name, static)
            if isinstance(static, property) and inspect.isfunction(static.fset):
                tx.wrap(static.fset, None).call(tx, [self, value], {})
                return
            raise Unsupported(
                f"setting attribute {name!r} on {self.describe()} through a {type(static).__name__}"
            )
        self.attrs[name] = value

    # Note [Protocols of objects made in the frame]: subscripts, `in`, `len`, truth, iteration
    # and calls on an object made in the frame run the Python dunder its class defines (inlined,
    # with the class attribute guarded as every method read is); a class that does not define it
    # in Python is a break, except truth, which is True when neither `__bool__` nor `__len__`
    # is defined anywhere (object's default). Binary operators and comparisons go through
    # InstructionTranslator.user_binary / rich_compare.
    def _dunder(self, tx: Tx, name: str, what: str) -> VT:
        if not inspect.isfunction(inspect.getattr_static(self.cls, name, None)):
            raise Unsupported(f"{what} {self.describe()}")
        return self.getattr(tx, name)

    def getitem(self, tx: Tx, key: VT) -> VT:
        return self._dunder(tx, "__getitem__", "subscript of").call(tx, [key], {})

    def setitem(self, tx: Tx, key: VT, value: VT) -> None:
        self._dunder(tx, "__setitem__", "item assignment on").call(tx, [key, value], {})

    def delitem(self, tx: Tx, key: VT) -> None:
        self._dunder(tx, "__delitem__", "item deletion on").call(tx, [key], {})

    def contains(self, tx: Tx, item: VT) -> bool:
        return self._dunder(tx, "__contains__", "`in` on").call(tx, [item], {}).truth(tx)

    def length(self, tx: Tx) -> int:
        n = self._dunder(tx, "__len__", "len() of").call(tx, [], {})
        if not (n.is_constant() and type(n.as_constant()) is int and n.as_constant() >= 0):
            raise Unsupported(f"len() of {self.describe()}: __len__ gave {n.describe()}")
        return int(n.as_constant())

    def truth(self, tx: Tx) -> bool:
        if inspect.getattr_static(self.cls, "__bool__", None) is not None:
            b = self._dunder(tx, "__bool__", "truth value of").call(tx, [], {})
            if not (b.is_constant() and type(b.as_constant()) is bool):
                raise Unsupported(f"truth value of {self.describe()}: __bool__ gave {b.describe()}")
            return bool(b.as_constant())
        if inspect.getattr_static(self.cls, "__len__", None) is not None:
            return self.length(tx) != 0
        return True

    def iterate(self, tx: Tx) -> list[VT]:
        return self._dunder(tx, "__iter__", "iterating over").call(tx, [], {}).iterate(tx)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self._dunder(tx, "__call__", "calling").call(tx, args, kwargs)

    def reconstruct(self, cg: Reconstructor) -> str:
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        if self.cls in _LOCAL_CLASSES:
            raise Unsupported(
                f"an instance of {self.cls.__qualname__}, defined in the frame, cannot leave it"
            )
        cls = cg.const(self.cls)
        items = ", ".join(f"({k!r}, {v.reconstruct(cg)})" for k, v in self.attrs.items())
        return f"{cg.const(_rebuild_object)}({cls}, ({items}{',' if len(self.attrs) == 1 else ''}))"


_NOT_FROZEN: Any = type("_NotFrozen", (), {"frozen": False})()


# Note [Slots of objects made in the frame]: a class with `__slots__` (inspect's BoundArguments,
# which `inspect.signature(f).bind(...)` in a decorator makes) stores its attributes through
# member descriptors, not an instance dict. For an object made in the frame such a store is kept
# with its other attributes, and a read of a slot not yet set raises AttributeError as in eager;
# the runner's rebuild sets slots with object.__setattr__ as it sets dict attributes. A class
# whose instances have no `__dict__` refuses other names (eager raises) and has no `vars()`.
def _is_slot(cls: type, name: str, static: Any) -> bool:
    if not isinstance(static, types.MemberDescriptorType):
        return False
    owner = getattr(static, "__objclass__", None)
    slots = vars(owner).get("__slots__", ()) if isinstance(owner, type) else ()
    slots = (slots,) if isinstance(slots, str) else tuple(slots)
    return owner in cls.__mro__ and name in slots and owner.__module__ != "builtins"


def _rebuild_object(cls: type, attrs: tuple[tuple[str, Any], ...]) -> Any:
    obj: Any = object.__new__(cls)
    for k, v in attrs:
        object.__setattr__(obj, k, v)
    return obj


class SuperVariable(VariableTracker):
    """`super(cls, obj)`: attribute lookup starts after `cls` in the MRO of obj's type."""

    def __init__(self, cls: VT, obj: VT) -> None:
        self.cls = cls
        self.obj = obj

    def describe(self) -> str:
        return "super()"

    def getattr(self, tx: Tx, name: str) -> VT:
        from kiln_dynamo.variables.functions import BoundMethodVariable, UserFunctionVariable

        cls = self.cls.as_constant()
        mro = self.obj.python_type().__mro__
        if cls not in mro:
            raise Unsupported("super(): class not in the MRO of the object")
        for klass in mro[mro.index(cls) + 1 :]:
            if tx.output.side_effects.pending_attr(klass, name) is not None:
                raise Unsupported(f"super().{name} after the frame set it on {klass.__qualname__}")
            if name in vars(klass):
                attr = vars(klass)[name]
                guard_class_attr(tx, klass, name, attr)
                if klass is nn.Module and name == "__call__" and isinstance(self.obj, NNModuleVariable):
                    return ModuleDefaultCallVariable(self.obj)
                if klass is object and name == "__init__":
                    return _NoOpVariable()
                if (
                    klass is object
                    and name == "__getattribute__"
                    and isinstance(self.obj, (UserObjectVariable, NewObjectVariable))
                ):
                    return _GenericGetattrVariable(self.obj)
                if klass is object and name in _GENERIC_STORES and isinstance(self.obj, NewObjectVariable):
                    return _GenericStoreVariable(self.obj, name)
                if inspect.isfunction(attr):
                    return BoundMethodVariable(UserFunctionVariable(attr, None), self.obj)
                if klass in PLAIN_DICTS and isinstance(self.obj, DictVariable) and callable(attr):
                    return _DictMethodVariable(self.obj, name)  # Note [Dict subclasses]
                if isinstance(attr, property) and attr.fget is not None:
                    return tx.wrap(attr.fget, None).call(tx, [self.obj], {})
                if isinstance(attr, staticmethod):
                    return tx.wrap(attr.__func__, None)
                if isinstance(attr, classmethod):
                    return BoundMethodVariable(
                        tx.wrap(attr.__func__, None), tx.wrap(self.obj.python_type(), None)
                    )
                raise Unsupported(f"super().{name} is a {type(attr).__name__}")
        raise Unsupported(f"super() has no attribute {name!r}")


class _GenericGetattrVariable(VariableTracker):
    """`super().__getattribute__` bound to an object: the default attribute lookup."""

    def __init__(self, obj: UserObjectVariable | NewObjectVariable) -> None:
        self.obj = obj

    def describe(self) -> str:
        return "object.__getattribute__"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        # Note [Missing attributes seen by the program]: the AttributeError of the default lookup
        # is the program's own exception here (its __getattribute__ asked for it), so it is
        # observed: it leaves the inlined __getattribute__ like any exception the program raises,
        # for getattr's default, hasattr or an `except AttributeError` of a traced caller to
        # take (Note [Exceptions the frame raises and catches]); one that leaves the captured
        # frame is Note [A frame that only raises] in convert_frame.py, or a break.
        try:
            return self.obj.generic_getattr(tx, args[0].as_constant())
        except AttributeError as e:
            raise observed(AttributeError, str(e)) from None


_GENERIC_STORES = ("__setattr__", "__delattr__")


class _GenericStoreVariable(VariableTracker):
    """`super().__setattr__` / `super().__delattr__` reaching object's own, bound to an object made
    in the frame (Note [Attribute hooks of objects made in the frame])."""

    def __init__(self, obj: NewObjectVariable, name: str) -> None:
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"object.{self.name}"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if kwargs or len(args) != (2 if self.name == "__setattr__" else 1) or not args[0].is_constant():
            raise Unsupported(f"object.{self.name} with these arguments")
        if self.name == "__setattr__":
            self.obj.store(tx, args[0].as_constant(), args[1])
        else:
            self.obj.generic_delete(tx, args[0].as_constant())
        return ConstantVariable(None)


class _DictMethodVariable(VariableTracker):
    """`super().name` from a dict subclass: dict's own method, modelled by DictVariable."""

    def __init__(self, obj: DictVariable, name: str) -> None:
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"dict.{self.name}"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.obj.call_builtin(tx, self.name, args, kwargs)


class _NoOpVariable(VariableTracker):
    def describe(self) -> str:
        return "object.__init__"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return ConstantVariable(None)


class UserObjectVariable(VariableTracker):
    """An existing instance of a user class, read from outside the frame."""

    def __init__(self, obj: object, source: Source | None) -> None:
        self.obj = obj
        self.source = source
        self.dict_exposed = False  # Note [Two views of an instance dict]

    def describe(self) -> str:
        return f"{type(self.obj).__qualname__} object"

    def python_type(self) -> type:
        return type(self.obj)

    def identity(self) -> object:
        return self.obj

    def getattr(self, tx: Tx, name: str) -> VT:
        pending = tx.output.side_effects.pending_attr(self.obj, name)
        if pending is not None:
            return pending
        cls: Any = type(self.obj)
        custom = cls.__getattribute__
        if custom is not object.__getattribute__ and not inspect.isfunction(custom):
            raise Unsupported(f"{self.describe()} customises attribute lookup in C")
        try:
            if custom is not object.__getattribute__:
                # A Python __getattribute__ (e.g. transformers' configs): inline it; its
                # super().__getattribute__ comes back to generic_getattr below.
                return tx.wrap(custom, None).call(tx, [self, ConstantVariable(name)], {})
            return self.generic_getattr(tx, name)
        except (AttributeError, ObservedException) as e:
            return getattr_fallback(tx, self, cls, name, e)  # Note [The __getattr__ fallback]

    # Note [Two views of an instance dict]: an attribute store on an object from outside the frame
    # is a pending store (replayed after the graph) that attribute reads consult, while its
    # `__dict__` (`vars(o)`, `o.__dict__`) is a dict tracker whose writes are replayed as a
    # mutated container; neither sees the other. So once the frame mixes them, the later one
    # breaks: reading `__dict__` after an attribute store, storing an attribute after `__dict__`
    # was read, or reading an attribute after a write through `__dict__` (each gave the value from
    # before the write).
    def _dict_tracker(self, tx: Tx) -> VT | None:
        d = getattr(self.obj, "__dict__", None)
        return tx.output.builder.cache.get(id(d)) if isinstance(d, dict) else None

    def generic_getattr(self, tx: Tx, name: str) -> VT:
        """object.__getattribute__: the instance dict, then the class."""
        side = tx.output.side_effects
        if name == "__dict__" and side.has_pending_attrs(self.obj):
            raise Unsupported(
                f"__dict__ of {self.describe()} after an attribute store in the frame (Note [Two views of an instance dict])"
            )
        if name == "__dict__":
            self.dict_exposed = True  # the frame holds the dict itself from here on
        dict_vt = self._dict_tracker(tx) if name != "__dict__" else None
        if dict_vt is not None and side.is_mutated(dict_vt):
            raise Unsupported(
                f"attribute {name!r} of {self.describe()} after a write through its __dict__ "
                "(Note [Two views of an instance dict])"
            )
        pending = side.pending_attr(self.obj, name)
        if pending is not None:
            return pending
        d = getattr(self.obj, "__dict__", {})
        if self.source is not None and type(self.obj).__getattribute__ is not object.__getattribute__:
            # Read as this lookup did, not through the class's own __getattribute__ again.
            if name in d:
                return tx.wrap(d[name], GetItemSource(InstanceDictSource(self.source), name))
            if name == "__dict__" and isinstance(inspect.getattr_static(type(self.obj), name, None), _GETSET):
                return tx.wrap(d, InstanceDictSource(self.source))
        if name in d:
            return tx.wrap(d[name], AttrSource(self.source, name) if self.source is not None else None)
        if self.source is not None and isinstance(getattr(self.obj, "__dict__", None), dict):
            # Not an instance attribute now: what the class gives (or the AttributeError that
            # getattr/hasattr catch) holds only while that stays so.
            if type(self.obj).__getattribute__ is not object.__getattribute__:
                tx.wrap(d, InstanceDictSource(self.source))  # its key list, shared by every read
            else:
                tx.output.guards.no_instance_attr(self.source, name)
        try:
            return class_attribute(tx, self, self.obj, name, self.source)
        except AttributeError:
            raise AttributeError(f"{type(self.obj).__name__!r} object has no attribute {name!r}") from None

    def setattr(self, tx: Tx, name: str, value: VT) -> None:
        if self.source is None:
            raise Unsupported(f"setting an attribute on {self.describe()} without a source")
        if type(self.obj).__setattr__ is not object.__setattr__:
            raise Unsupported(f"{self.describe()} customises __setattr__")
        if self.dict_exposed:
            raise Unsupported(
                f"setting attribute {name!r} on {self.describe()} after its __dict__ was read "
                "(Note [Two views of an instance dict])"
            )
        tx.output.side_effects.store_attr(self, self.obj, name, value)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.getattr(tx, "__call__").call(tx, args, kwargs)

    # Note [Mapping protocol of user objects]: `in`, subscripts, `len()` and truth on an instance
    # whose class defines `__contains__`/`__getitem__`/`__len__`/`__bool__` in Python (transformers'
    # AttentionInterface, a MutableMapping over a class-level dict; its per-layer config view, a
    # Sequence) inline that method, as any method call does: what it reads is guarded through its
    # sources. A method written in C stays a break; `__len__` must give a constant int >= 0.
    def _python_dunder(self, tx: Tx, name: str, what: str) -> VT:
        if not inspect.isfunction(inspect.getattr_static(type(self.obj), name, None)):
            raise Unsupported(f"{what} {self.describe()}")
        return self.getattr(tx, name)

    def contains(self, tx: Tx, item: VT) -> bool:
        result = self._python_dunder(tx, "__contains__", "`in` on").call(tx, [item], {})
        return result.truth(tx)

    def getitem(self, tx: Tx, key: VT) -> VT:
        return self._python_dunder(tx, "__getitem__", "subscript of").call(tx, [key], {})

    def length(self, tx: Tx) -> int:
        n = self._python_dunder(tx, "__len__", "len() of").call(tx, [], {})
        if not (n.is_constant() and type(n.as_constant()) is int and n.as_constant() >= 0):
            raise Unsupported(f"len() of {self.describe()}: __len__ gave {n.describe()}")
        return int(n.as_constant())

    def truth(self, tx: Tx) -> bool:
        """`if obj:` (`if cache and ...` in whisper's attention): `__bool__`, else `__len__() != 0`,
        each inlined from Python; True when the class defines neither (object's default)."""
        cls = type(self.obj)
        if inspect.getattr_static(cls, "__bool__", None) is not None:
            b = self._python_dunder(tx, "__bool__", "truth value of").call(tx, [], {})
            if not (b.is_constant() and type(b.as_constant()) is bool):
                raise Unsupported(f"truth value of {self.describe()}: __bool__ gave {b.describe()}")
            return bool(b.as_constant())
        if inspect.getattr_static(cls, "__len__", None) is not None:
            return self.length(tx) != 0
        return True


# Note [Class definitions in the frame]: `class C(Base): ...` inside a traced function (torch.masked
# defines an autograd.Function per call) is LOAD_BUILD_CLASS, then `__build_class__(body, name,
# *bases)`. A class body that only binds names (constants, functions, staticmethod/classmethod/
# property of them, a property's `.setter`/`.getter`/`.deleter`, `__classcell__`) has no effect
# outside the class, so kiln runs it for real while tracing: the body function gets real cells
# for the frame's cells it closes over, each registered as that symbolic cell
# (OutputGraph.real_cell), so the class's methods, when the frame calls them, read and write the
# frame's own cells. The class and its instances may not leave the frame (eager makes a new
# class on each call, and a method's cells hold trace-time stand-ins), and a class body that
# calls or reads anything else is a break. The frame may set plain class attributes on it (Note
# [Setting a class attribute]): kept for its own reads, never written to the real class.
_CLASS_BODY_OPS = frozenset(
    {"RESUME", "NOP", "CACHE", "COPY_FREE_VARS", "MAKE_CELL", "LOAD_NAME", "STORE_NAME", "LOAD_CONST",
     "LOAD_CLOSURE", "BUILD_TUPLE", "MAKE_FUNCTION", "PUSH_NULL", "PRECALL", "CALL", "COPY",
     "RETURN_VALUE", "RETURN_CONST", "POP_TOP", "SETUP_ANNOTATIONS", "STORE_SUBSCR", "BUILD_LIST"}
)  # fmt: skip
_CLASS_BODY_CALLABLES = frozenset({"staticmethod", "classmethod", "property"})
# attributes the body may load: the body's names hold only constants, its functions and
# staticmethod/classmethod/property objects, and on those only a property has these (a
# constant without them raises AttributeError while the class is built, a break)
_PROPERTY_DECORATORS = frozenset({"setter", "getter", "deleter"})
_LOCAL_CLASSES: weakref.WeakSet[type] = weakref.WeakSet()


def is_local_class(cls: type) -> bool:
    """Whether `cls` was defined in a traced frame (Note [Class definitions in the frame])."""
    return cls in _LOCAL_CLASSES


def _class_body_problem(code: types.CodeType) -> str | None:
    stored: set[str] = set()
    for inst in dis.get_instructions(code):
        if inst.opname in ("LOAD_ATTR", "LOAD_METHOD") and inst.argval in _PROPERTY_DECORATORS:
            continue  # `@v.setter`: a method of the property the body made (or of `property`)
        if inst.opname not in _CLASS_BODY_OPS:
            return f"{inst.opname} in the class body"
        if inst.opname == "STORE_NAME":
            stored.add(inst.argval)
        if inst.opname == "LOAD_NAME" and inst.argval not in stored | _CLASS_BODY_CALLABLES | {"__name__"}:
            return f"the class body reads {inst.argval!r}"
    return None


class BuildClassVariable(VariableTracker):
    """`builtins.__build_class__`, as LOAD_BUILD_CLASS pushes it."""

    def describe(self) -> str:
        return "class definition"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln_dynamo.variables.base import CellVariable
        from kiln_dynamo.variables.functions import NestedFunctionVariable

        body, name, *bases = args
        if kwargs or not isinstance(body, NestedFunctionVariable) or not name.is_constant():
            raise Unsupported("a class definition with a metaclass or keywords")
        if not all(b.is_constant() and isinstance(b.as_constant(), type) for b in bases):
            raise Unsupported(f"class {name.as_constant()}: a base that is not a known class")
        problem = _class_body_problem(body.code)
        if problem is not None:
            raise Unsupported(f"class {name.as_constant()} defined in the frame: {problem}")
        real_cells = []
        for cell in body.closure:
            assert isinstance(cell, CellVariable)
            contents = cell.contents
            real = (
                types.CellType(contents.as_constant())
                if contents is not None and contents.is_constant()
                else types.CellType()
            )
            tx.output._real_cells[id(real)] = cell  # Note [Class definitions in the frame]
            tx.output.builder.keepalive.append(real)
            real_cells.append(real)
        fn = types.FunctionType(body.code, body.f_globals, name.as_constant(), None, tuple(real_cells))
        try:
            cls = builtins.__build_class__(fn, name.as_constant(), *[b.as_constant() for b in bases])
        except Exception as e:
            raise Unsupported(f"class {name.as_constant()}: {type(e).__name__} while building it: {e}") from e
        _LOCAL_CLASSES.add(cls)
        return LocalClassVariable(cls, None)


class LocalClassVariable(UserClassVariable):
    """A class defined in the frame (Note [Class definitions in the frame])."""

    def reconstruct(self, cg: Reconstructor) -> str:
        raise Unsupported(f"class {self.cls.__qualname__}, defined in the frame, cannot leave it")
