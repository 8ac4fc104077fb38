"""Dicts and sets keyed by Python constants or by objects.

A `DictVariable` maps real hashable keys (constants: strings, ints, enum members, dtypes) to
trackers, in insertion order. A key that is an object compared by identity (an nn.Module, a
user object, a function or class: Note [Object keys]) is an `ObjectKey` around its tracker.
Tensor keys are not modelled and raise `Unsupported`. As with lists, a dict from outside the frame that is mutated is marked
in `SideEffects` and its final contents are written back by the runner.

Note [Lazy dict entries]: a dict from outside the frame is guarded on its type and its key list
when it is wrapped, but each value is wrapped (and so guarded) only when the traced code reads
it: `config.__dict__.get("_spec")` on an absent key costs no guard beyond the key list, and a
config's hundred unread entries cost none. Until then an entry is a `LazyEntry` holding the real
value and its source. Only a dict with a source holds lazy entries, and it realizes them all
before it is mutated, copied or merged, so a dict that codegen rebuilds or writes back never
has one: every value is wrapped (inputs added, guards recorded) while the graph is still open.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.variables.base import ConstantVariable, MethodVariable, VariableTracker
from kiln_dynamo.variables.exceptions import observed
from kiln_dynamo.variables.lists import ListVariable, TupleVariable

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker

PLAIN_DICTS = (dict, collections.OrderedDict, collections.defaultdict)
_NOT_DEFINED: Any = object()
_SCALARS = (int, float, str, bool, type(None))


# What guards and sources read from a dict (`list(d.keys())`, `d[k]`) and how attributes are
# found: a subclass must leave these to dict for a DictVariable to model it.
_READ_PROTOCOL = ("__getitem__", "__iter__", "keys", "items", "values", "__len__", "__contains__",
                  "__getattr__", "__getattribute__", "__missing__", "__init__", "__new__")  # fmt: skip


def modelled_dict_subclass(cls: type) -> bool:
    """A Python subclass of dict or OrderedDict (not a dataclass) that leaves reading to dict
    (Note [Dict subclasses]), or overrides only `__getitem__`, with a Python function (Note [A dict
    subclass's own subscript])."""
    return (
        cls.__mro__[1] in (dict, collections.OrderedDict)
        and cls.__module__ not in ("builtins", "collections")
        and not dataclasses.is_dataclass(cls)
        and all(python_override(cls, name) is None for name in _READ_PROTOCOL if name != "__getitem__")
        and (python_override(cls, "__getitem__") is None or own_subscript(cls) is not None)
    )


# Note [A dict subclass's own subscript]: transformers' `ACT2FN` is an OrderedDict subclass whose
# `__getitem__` builds the activation module registered under the key (`ACT2FN["silu"](x)` in
# mamba's, lfm2's and jamba's convolutions, deberta's and funnel's heads). A subclass that
# overrides only `__getitem__`, with a Python function, is modelled: `d[k]` inlines that function
# with the DictVariable as `self`, and its `super().__getitem__(k)` (dict's own) reads the entry.
# What does not go through `__getitem__` in CPython (`get`, `in`, `len`, iteration) is dict's
# behaviour as for any subclass; views and copies still break (Note [Dict subclasses]). The
# entries of such a dict from outside the frame are read and guarded through `dict.__getitem__`
# (RawItemSource), never through the override, which a guard must not run.
def own_subscript(cls: type) -> Any:
    """Note [A dict subclass's own subscript]: the Python `__getitem__` `cls` defines, or None."""
    attr = python_override(cls, "__getitem__")
    return attr if inspect.isfunction(attr) else None


def python_override(cls: type, name: str) -> Any:
    """Note [Dict subclasses]: what a Python subclass of dict (transformers' _CanRecordRegistry)
    defines for `name` above dict in its MRO, or None. Methods it defines in Python are inlined
    (`getattr`); everything it does not override is dict's own behaviour, modelled here; an
    overridden protocol method used implicitly (subscript, `in`, iteration) and any mutation or
    copy of such a dict stay unsupported, so the subclass's code is never bypassed."""
    for klass in cls.__mro__:
        if klass in PLAIN_DICTS:
            return None
        if name in vars(klass):
            value = vars(klass)[name]
            return _NOT_DEFINED if value is None else value
    return None


class LazyEntry:
    """A dict value not yet wrapped (Note [Lazy dict entries])."""

    __slots__ = ("source", "value", "vt", "wrap")

    def __init__(self, value: Any, source: Any, wrap: Callable[[Any, Any], VT]) -> None:
        self.value = value
        self.source = source
        self.wrap = wrap
        self.vt: VT | None = None

    def realize(self) -> VT:
        if self.vt is None:
            self.vt = self.wrap(self.value, self.source)
        return self.vt


class ObjectKey:
    """Note [Object keys]: a dict key or set item that is an object hashed by identity
    (`memo = set(); memo.add(module)` in `nn.Module.named_modules`, a dict keyed by submodules).
    Two keys are equal when they stand for the same object: the real one for a tracker of an
    existing object (`identity()`), the tracker itself for an object created in the frame. A
    class that defines its own `__eq__`/`__hash__` is not hashed by identity, so it is not
    modelled this way."""

    __slots__ = ("obj", "vt")

    def __init__(self, vt: VT) -> None:
        self.vt = vt
        self.obj = vt.identity()

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectKey) and other.obj is self.obj

    def __repr__(self) -> str:
        return self.vt.describe()


def _identity_hashed(vt: VT) -> bool:
    from kiln_dynamo.variables.tensor import TensorVariable

    if isinstance(vt, TensorVariable):
        return False
    try:
        cls = vt.python_type()
    except Unsupported:
        return False
    hash_fn: Any = cls.__hash__
    eq_fn: Any = cls.__eq__
    return hash_fn is object.__hash__ and eq_fn is object.__eq__


# Note [Classes as dict keys]: a registry keyed by classes (`torch.utils._pytree`'s
# SUPPORTED_NODES, `type(x) in HANDLERS`) is read like any dict. A class whose metaclass keeps
# object's `__hash__` and `__eq__` is hashed and compared by identity, so the class object itself
# is the key, whatever tracker stands for it (a user class, a builtin type, a torch class): one
# key for one class, as in eager. An outside dict's keys are guarded as a list (`dict_keys`,
# equality of classes and functions is identity), and an item's source indexes with the key held
# as a constant. A plain function key (pytree registers `namedtuple` itself) is an ObjectKey
# (Note [Object keys]). A metaclass with its own `__eq__`/`__hash__` stays unsupported.
def class_key(obj: object) -> type | None:
    """Note [Classes as dict keys]: `obj` when it is a class hashed and compared by identity."""
    if isinstance(obj, type) and type(obj).__hash__ is object.__hash__ and type(obj).__eq__ is object.__eq__:
        return obj
    return None


def key_vt(k: Any) -> VT:
    """The tracker of a dict key or set item (the inverse of `key_of`)."""
    if isinstance(k, ObjectKey):
        return k.vt
    if class_key(k) is not None:
        from kiln_dynamo.variables.builtins import BuiltinVariable
        from kiln_dynamo.variables.torch import _FOLD_ON_CONSTANTS, TorchFunctionVariable
        from kiln_dynamo.variables.user_defined import UserClassVariable

        if k in _FOLD_ON_CONSTANTS:  # as VariableBuilder wraps a class
            return TorchFunctionVariable(k, None)
        return BuiltinVariable(k) if k.__module__ == "builtins" else UserClassVariable(k, None)
    return ConstantVariable(k)


def key_of(vt: VT) -> Any:
    ident = vt.identity()
    if ident is not vt and class_key(ident) is not None:  # Note [Classes as dict keys]
        return ident
    if not vt.is_constant() and _identity_hashed(vt):
        return ObjectKey(vt)
    if vt.is_constant():
        k = vt.as_constant()
        try:
            hash(k)
        except TypeError as e:
            raise Unsupported(f"unhashable dict key {vt.describe()}") from e
        return k
    raise Unsupported(f"dict key {vt.describe()} is not a constant")


class DictVariable(VariableTracker):
    def __init__(
        self, items: Mapping[Any, VT | LazyEntry], user_cls: type = dict, source: Any = None
    ) -> None:
        self._items: dict[Any, VT | LazyEntry] = dict(items)
        self.user_cls = user_cls
        self.source = source

    @property
    def items(self) -> dict[Any, VT]:
        """Every entry, wrapped (Note [Lazy dict entries]); `entry(k)` wraps only one."""
        for k, v in self._items.items():
            if isinstance(v, LazyEntry):
                self._items[k] = v.realize()
        return cast("dict[Any, VT]", self._items)

    @items.setter
    def items(self, value: dict[Any, VT]) -> None:
        self._items = dict(value)

    def entry(self, k: Any) -> VT:
        v = self._items[k]
        if isinstance(v, LazyEntry):
            v = self._items[k] = v.realize()
        return v

    def wrapped_values(self) -> list[VT]:
        """The entries wrapped so far: what codegen may need to rebuild (the rest are untouched
        values of a dict it reaches through its source)."""
        return [v for v in self._items.values() if not isinstance(v, LazyEntry)]

    def describe(self) -> str:
        return f"{self.user_cls.__name__} with keys {list(self._items)!r}"

    def python_type(self) -> type:
        return self.user_cls

    def is_constant(self) -> bool:
        for k, v in self._items.items():
            if isinstance(v, LazyEntry) and type(v.value) in _SCALARS:
                continue  # it would be wrapped as a constant: no need to guard it yet
            if not self.entry(k).is_constant():
                return False
        return True

    def as_constant(self) -> Any:
        return self.user_cls({k: v.as_constant() for k, v in self.items.items()})

    def _builtin(self, *names: str) -> None:
        if self.user_cls in PLAIN_DICTS:
            return
        for name in names:
            if python_override(self.user_cls, name) is not None:
                raise Unsupported(f"{self.user_cls.__qualname__} overrides {name}")

    def getattr(self, tx: Tx, name: str) -> VT:
        if self.user_cls not in PLAIN_DICTS:
            attr = python_override(self.user_cls, name)
            if inspect.isfunction(attr):
                from kiln_dynamo.variables.functions import BoundMethodVariable

                return BoundMethodVariable(tx.wrap(attr, None), self)
            if attr is not None:
                raise Unsupported(f"attribute {name!r} of {self.describe()}")
        return super().getattr(tx, name)

    def truth(self, tx: Tx) -> bool:
        self._builtin("__bool__", "__len__")
        return bool(self._items)

    def length(self, tx: Tx) -> int:
        self._builtin("__len__")
        return len(self._items)

    def iterate(self, tx: Tx) -> list[VT]:
        self._builtin("__iter__")
        return [key_vt(k) for k in self._items]

    def contains(self, tx: Tx, key: VT) -> bool:
        self._builtin("__contains__")
        return key_of(key) in self._items

    def getitem(self, tx: Tx, key: VT) -> VT:
        if self.user_cls not in PLAIN_DICTS:
            own = own_subscript(self.user_cls)
            if own is not None:  # Note [A dict subclass's own subscript]
                return tx.wrap(own, None).call(tx, [self, key], {})
        self._builtin("__getitem__")
        return self._entry_or_key_error(key)

    def _entry_or_key_error(self, key: VT) -> VT:
        k = key_of(key)
        if k not in self._items:
            raise observed(KeyError, k)
        return self.entry(k)

    def _mutate(self, tx: Tx) -> None:
        if self.user_cls not in PLAIN_DICTS:
            raise Unsupported(f"mutating a {self.user_cls.__qualname__}, a dict subclass")
        self.items  # noqa: B018  (realized before it changes: Note [Lazy dict entries])
        tx.output.side_effects.mutated(self)

    def setitem(self, tx: Tx, key: VT, value: VT) -> None:
        self._mutate(tx)
        self.items[key_of(key)] = value

    def delitem(self, tx: Tx, key: VT) -> None:
        self._mutate(tx)
        self.items.pop(key_of(key))

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        self._builtin(name)
        return self.call_builtin(tx, name, args, kwargs)

    def call_builtin(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        """dict's own method `name` (also what `super().name` reaches from a subclass)."""
        if self.user_cls not in PLAIN_DICTS and name in ("copy", "keys", "values", "items"):
            self._builtin("__iter__", "__getitem__")
            if name == "copy":
                raise Unsupported(f"copy of a {self.user_cls.__qualname__}, a dict subclass")
        if name in ("keys", "values", "items") and not args and not kwargs:
            return DictViewVariable(self, name)
        if name == "get" and 1 <= len(args) <= 2:
            k = key_of(args[0])
            if k in self._items:
                return self.entry(k)
            return args[1] if len(args) == 2 else ConstantVariable(None)
        if name == "__getitem__" and len(args) == 1:
            # dict's own subscript (`super().__getitem__(k)` from a subclass's override too)
            return self._entry_or_key_error(args[0])
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(self.contains(tx, args[0]))
        if name == "__setitem__" and len(args) == 2:
            self.setitem(tx, args[0], args[1])
            return ConstantVariable(None)
        if name == "copy":
            return DictVariable(self.items, self.user_cls)
        if name == "pop" and 1 <= len(args) <= 2:
            k = key_of(args[0])
            if k in self.items:
                self._mutate(tx)
                return self.items.pop(k)
            if len(args) == 2:
                return args[1]
            raise observed(KeyError, k)
        if name == "setdefault" and 1 <= len(args) <= 2:
            k = key_of(args[0])
            if k not in self._items:
                self._mutate(tx)
                self.items[k] = args[1] if len(args) == 2 else ConstantVariable(None)
            return self.entry(k)
        if name == "update":
            self._mutate(tx)
            for a in args:
                self.update_from(tx, a)
            for k, v in kwargs.items():
                self.items[k] = v
            return ConstantVariable(None)
        if name == "clear":
            self._mutate(tx)
            self.items.clear()
            return ConstantVariable(None)
        ordered = issubclass(self.user_cls, collections.OrderedDict)
        if name == "popitem" and not args and (ordered or not kwargs) and _consts(kwargs, "last"):
            if not self._items:
                raise observed(KeyError, "popitem(): dictionary is empty")
            last = bool(kwargs["last"].as_constant()) if "last" in kwargs else True
            k = next(reversed(self.items)) if last else next(iter(self.items))
            self._mutate(tx)
            return TupleVariable([key_vt(k), self.items.pop(k)])
        if name == "move_to_end" and ordered and len(args) == 1 and _consts(kwargs, "last"):
            k = key_of(args[0])
            if k not in self._items:
                raise observed(KeyError, k)
            self._mutate(tx)
            value = self.items.pop(k)
            if "last" not in kwargs or kwargs["last"].as_constant():
                self.items[k] = value
            else:
                self.items = {k: value, **self.items}
            return ConstantVariable(None)
        raise Unsupported(f"method {name} of {self.describe()}")

    def update_from(self, tx: Tx, other: VT) -> None:
        if isinstance(other, DictVariable):
            self.items.update(other.items)
            return
        for pair in other.iterate(tx):
            k, v = pair.iterate(tx)
            self.items[key_of(k)] = v

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.source is not None:
            return cg.source(self.source)
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        inner = ", ".join(f"{key_vt(k).reconstruct(cg)}: {v.reconstruct(cg)}" for k, v in self.items.items())
        return self.rebuild(cg, inner)

    def rebuild(self, cg: Reconstructor, inner: str) -> str:
        """The expression that builds this dict from its entries' source `inner` (`k: v, ...`)."""
        if self.user_cls is dict:
            return "{" + inner + "}"
        return f"{cg.const(self.user_cls)}({{{inner}}})"


_VIEW_TYPES = {"keys": type({}.keys()), "values": type({}.values()), "items": type({}.items())}


def _consts(kwargs: dict[str, VT], *names: str) -> bool:
    """`kwargs` holds only `names`, each a Python constant."""
    return set(kwargs) <= set(names) and all(v.is_constant() for v in kwargs.values())


class DictViewVariable(TupleVariable):
    """``d.keys()`` / ``d.values()`` / ``d.items()``: a live view of a traced dict.

    Note [Dict views]: the elements are read from the dict each time (a view sees the dict's later
    writes, as Python's does), and a view that leaves the frame is rebuilt as ``<the dict>.keys()``,
    so the caller gets a ``dict_keys`` of the very dict it sees, not a tuple. Only what views
    support is handled (iteration, ``len``, ``in``, truth); the rest is a break."""

    def __init__(self, d: DictVariable, kind: str) -> None:
        self.d = d
        self.kind = kind
        self.source = None

    @property
    def items(self) -> list[VT]:
        d = self.d
        if self.kind == "keys":
            return [key_vt(k) for k in d._items]
        if self.kind == "values":
            return list(d.items.values())
        return [TupleVariable([key_vt(k), v]) for k, v in d.items.items()]

    @items.setter
    def items(self, value: list[VT]) -> None:  # BaseListVariable's __init__ is not run
        raise AttributeError("a dict view's elements are its dict's")

    def python_type(self) -> type:
        return _VIEW_TYPES[self.kind]

    def describe(self) -> str:
        return f"dict_{self.kind} of {len(self.d._items)}"

    def is_constant(self) -> bool:
        return self.d.is_constant()

    def as_constant(self) -> Any:
        return getattr(self.d.as_constant(), self.kind)()

    def contains(self, tx: Tx, value: VT) -> bool:
        if self.kind == "keys":
            return self.d.contains(tx, value)
        return super().contains(tx, value)

    def getitem(self, tx: Tx, key: VT) -> VT:
        raise Unsupported(f"'{self.python_type().__name__}' object is not subscriptable")

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name in ("__len__", "__contains__") and not kwargs:
            return super().call_method(tx, name, args, kwargs)
        raise Unsupported(f"method {name} of {self.describe()}")

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{self.d.reconstruct(cg)}.{self.kind}()"


class DefaultDictVariable(DictVariable):
    """A `collections.defaultdict`: a missing key read by subscript calls the factory (traced)
    and stores what it returns, as `__missing__` does; everything else is a dict's."""

    def __init__(self, items: Mapping[Any, VT | LazyEntry], factory: VT, source: Any = None) -> None:
        super().__init__(items, collections.defaultdict, source)
        self.factory = factory

    def describe(self) -> str:
        return f"defaultdict with keys {list(self._items)!r}"

    def getattr(self, tx: Tx, name: str) -> VT:
        if name == "default_factory":
            return self.factory
        return super().getattr(tx, name)

    def getitem(self, tx: Tx, key: VT) -> VT:
        k = key_of(key)
        if k not in self._items:
            if self.factory.is_constant() and self.factory.as_constant() is None:
                raise observed(KeyError, k)
            self.setitem(tx, key, self.factory.call(tx, [], {}))
        return self.entry(k)

    def call_builtin(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "copy":
            return DefaultDictVariable(self.items, self.factory)
        return super().call_builtin(tx, name, args, kwargs)

    def rebuild(self, cg: Reconstructor, inner: str) -> str:
        return f"{cg.const(collections.defaultdict)}({self.factory.reconstruct(cg)}, {{{inner}}})"


# Note [Counters made in the frame]: a `collections.Counter` built in the frame is a dict whose
# missing keys read as 0 (`__missing__`, without storing the key) and whose methods count: made
# from an iterable (each element +1) or a mapping (its values), `update`/`subtract` add or take
# away, `most_common` orders by count (Python's stable sort, ties in insertion order, as
# `sorted(..., reverse=True)` and `heapq.nlargest` both keep them), `total` sums, `elements`
# repeats each key by its count. Counts that are not Python constants are added with the traced
# `+`, and ordering them is a break. A Counter from outside the frame, and its other methods
# (arithmetic, comparison), stay breaks.
class CounterVariable(DictVariable):
    """A `collections.Counter` made in the frame (Note [Counters made in the frame])."""

    def __init__(self, items: Mapping[Any, VT]) -> None:
        super().__init__(items, collections.Counter)

    def describe(self) -> str:
        return f"Counter with keys {list(self._items)!r}"

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in _COUNTER_METHODS:
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a Counter")

    def getitem(self, tx: Tx, key: VT) -> VT:
        k = key_of(key)
        return self.entry(k) if k in self._items else ConstantVariable(0)

    def _mutate(self, tx: Tx) -> None:
        self.items  # noqa: B018  (made in the frame: no source, nothing to replay)

    def delitem(self, tx: Tx, key: VT) -> None:
        self.items.pop(key_of(key), None)  # Counter.__delitem__ ignores a missing key

    def count(self, tx: Tx, other: VT | None, kwargs: dict[str, VT], sign: int) -> None:
        """`update` (sign 1) or `subtract` (sign -1) of `other` then of `kwargs`, each count
        computed as Counter's own code computes it (`count + old`, `old - count`, `old + 1`)."""
        for source in (other, DictVariable(kwargs) if kwargs else None):
            if source is None:
                continue
            if isinstance(source, DictVariable):
                pairs = list(source.items.items())
                if sign > 0 and not self._items:
                    self.items.update(pairs)  # an empty Counter takes a mapping's values as they are
                    continue
                for k, v in pairs:
                    old = self.items.get(k, ConstantVariable(0))
                    self.items[k] = (
                        tx.binary_op(operator.add, v, old) if sign > 0 else tx.binary_op(operator.sub, old, v)
                    )
            else:
                one = ConstantVariable(1)
                for e in source.iterate(tx):
                    k = key_of(e)
                    old = self.items.get(k, ConstantVariable(0))
                    self.items[k] = tx.binary_op(operator.add if sign > 0 else operator.sub, old, one)

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln_dynamo.variables.lists import ListIteratorVariable, ListVariable

        if name in ("update", "subtract") and len(args) <= 1:
            self.count(tx, args[0] if args else None, kwargs, 1 if name == "update" else -1)
            return ConstantVariable(None)
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "copy" and not args and not kwargs:
            return CounterVariable(self.items)
        if name == "most_common" and len(args) <= 1 and not kwargs:
            n = args[0].as_constant() if args and args[0].is_constant() else None
            if args and not (args[0].is_constant() and (n is None or isinstance(n, int))):
                raise Unsupported("Counter.most_common(n) with n that is not a constant int")
            if not all(v.is_constant() for v in self.items.values()):
                raise Unsupported("Counter.most_common of counts that are not Python constants")
            keys = list(self.items)
            order = sorted(range(len(keys)), key=lambda i: self.entry(keys[i]).as_constant(), reverse=True)
            if n is not None:
                order = order[: max(n, 0)]
            return ListVariable([TupleVariable([key_vt(keys[i]), self.entry(keys[i])]) for i in order])
        if name == "total" and not args and not kwargs:
            acc: VT = ConstantVariable(0)
            for v in self.items.values():
                acc = tx.binary_op(operator.add, acc, v)
            return acc
        if name == "elements" and not args and not kwargs:
            out: list[VT] = []
            for k, v in self.items.items():
                if not v.is_constant() or not isinstance(v.as_constant(), int):
                    raise Unsupported("Counter.elements of counts that are not constant ints")
                out += [key_vt(k)] * max(v.as_constant(), 0)
            return ListIteratorVariable(out, "chain")
        if name in _COUNTER_METHODS:
            return DictVariable.call_builtin(self, tx, name, args, kwargs)
        raise Unsupported(f"method {name} of a Counter")


_COUNTER_METHODS = frozenset(
    {"update", "subtract", "copy", "most_common", "total", "elements", "get", "keys", "values",
     "items", "pop", "setdefault", "clear", "__getitem__", "__contains__", "__setitem__"}
)  # fmt: skip


class SetVariable(VariableTracker):
    """A set of constants (real hashable values) and objects (`ObjectKey`: Note [Object keys])."""

    def __init__(self, items: list[Any], frozen: bool = False, source: Any = None) -> None:
        self.items: dict[Any, None] = dict.fromkeys(items)
        self.frozen = frozen
        self.source = source

    def describe(self) -> str:
        return f"set {set(self.items)!r}"

    def python_type(self) -> type:
        return frozenset if self.frozen else set

    def is_constant(self) -> bool:
        return not any(isinstance(k, ObjectKey) for k in self.items)

    def as_constant(self) -> Any:
        if not self.is_constant():
            raise Unsupported(f"{self.describe()} holds objects, it is not a constant")
        return frozenset(self.items) if self.frozen else set(self.items)

    def truth(self, tx: Tx) -> bool:
        return bool(self.items)

    def length(self, tx: Tx) -> int:
        return len(self.items)

    def iterate(self, tx: Tx) -> list[VT]:
        return [key_vt(k) for k in self.items]

    def contains(self, tx: Tx, key: VT) -> bool:
        return key_of(key) in self.items

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name in ("add", "discard", "remove", "update", "clear") and not self.frozen:
            tx.output.side_effects.mutated(self)
            if name == "add":
                self.items[key_of(args[0])] = None
            elif name == "discard":
                self.items.pop(key_of(args[0]), None)
            elif name == "remove":
                del self.items[key_of(args[0])]
            elif name == "update":
                for a in args:
                    for v in a.iterate(tx):
                        self.items[key_of(v)] = None
            else:
                self.items.clear()
            return ConstantVariable(None)
        if name in ("union", "intersection", "difference", "issubset", "issuperset", "isdisjoint", "copy"):
            vals = [set(key_of(v) for v in a.iterate(tx)) for a in args]
            out = getattr(set(self.items), name)(*vals)  # ObjectKeys compare by identity
            return SetVariable(list(out)) if isinstance(out, (set, frozenset)) else ConstantVariable(out)
        raise Unsupported(f"method {name} of a set")

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.source is not None:
            return cg.source(self.source)
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        if not self.is_constant():
            items = ", ".join(key_vt(k).reconstruct(cg) for k in self.items)
            return f"{'frozenset' if self.frozen else 'set'}(({items}{',' if len(self.items) == 1 else ''}))"
        return cg.const(self.as_constant()) if self.frozen else f"set({cg.const(tuple(self.items))})"


ORDERED_DICT = collections.OrderedDict
LIST = ListVariable
