"""Dataclass mappings: transformers' `ModelOutput` and the classes built on it.

A `ModelOutput` is a `@dataclass` that subclasses `OrderedDict`. Every field is an attribute;
the fields that are not None are also its keys, in the order they were first set (the dataclass
`__init__` sets them in field order). `[int]`, slices and `to_tuple()` index the values of the
keys, so `out[0]` is the first field that is not None; `[str]`, `in`, `get`, `keys()` and
iteration read the keys.

`ModelOutputVariable` models that behaviour directly rather than inlining ModelOutput's own
methods (which go through `dataclasses.fields`, `self.__dict__` and pytree registration):
`fields` holds every attribute, `items` (as in a `DictVariable`) the keys. What a subclass adds in
Python (properties, an overriding `to_tuple`) is inlined with the tracker as `self`. A class is
modelled only when its base is in `MODEL_OUTPUT_BASES`, whose behaviour this module replicates,
and nothing between the two overrides that behaviour; anything else stays a graph break.

A new one that escapes the frame is rebuilt by calling its class with the fields as keyword
arguments (Note [Rebuilding a ModelOutput]). One from outside the frame is read through its
attributes under guards on its type and keys (`wrap_model_output`); a store into one is replayed
after the graph (Note [Stores into a ModelOutput from outside]).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import os
from typing import TYPE_CHECKING, Any

import torch

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import AttrSource
from kiln_dynamo.variables.base import ConstantVariable, MethodVariable, VariableTracker
from kiln_dynamo.variables.dicts import DictVariable, key_of
from kiln_dynamo.variables.lists import BaseListVariable, TupleVariable
from kiln_dynamo.variables.tensor import TensorVariable

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.source import Source
    from kiln_dynamo.variables.base import Tx
    from kiln_dynamo.variables.builder import VariableBuilder

VT = VariableTracker

# Bases whose behaviour `ModelOutputVariable` replicates, by (module, qualname) so that
# transformers is never imported here, with the old field names each accepts for a new one
# (transformers 5 renamed `past_key_values`/`cache_params` to `cache`: `__init__`, `[k]`, `in`,
# `get` and attribute stores map the old names when the class has no field of that name).
MODEL_OUTPUT_BASES: dict[tuple[str, str], dict[str, str]] = {
    ("transformers.utils.generic", "ModelOutput"): {"past_key_values": "cache", "cache_params": "cache"},
}

# What the base defines and this module replicates; a subclass that redefines one of these is
# not modelled.
_REPLICATED = ("__getitem__", "__setitem__", "__delitem__", "__setattr__", "__getattr__",
               "__getattribute__", "__contains__", "__iter__", "__len__", "__bool__", "__post_init__",
               "__new__", "keys", "values", "items", "get")  # fmt: skip

# Methods of the base (and of OrderedDict/dict under it) that `ModelOutputVariable` implements.
_NATIVE = frozenset({"to_tuple", "keys", "values", "items", "get", "__getitem__", "__contains__",
                     "__setitem__", "__setattr__"})  # fmt: skip


def model_output_base(cls: type) -> type | None:
    """The base in MODEL_OUTPUT_BASES that `cls` (a dataclass) is modelled through, or None."""
    if not (isinstance(cls, type) and issubclass(cls, dict) and dataclasses.is_dataclass(cls)):
        return None
    mro = cls.__mro__
    for i, klass in enumerate(mro):
        if (klass.__module__, klass.__qualname__) in MODEL_OUTPUT_BASES:
            below = mro[:i]
            break
    else:
        return None
    for sub in below:
        if any(name in vars(sub) for name in _REPLICATED):
            return None
        init = vars(sub).get("__init__")
        if init is not None and not _dataclass_init(init):
            return None
    if len(dataclasses.fields(cls)) != len(getattr(cls, "__dataclass_fields__", ())):
        return None  # InitVar / ClassVar pseudo-fields
    return klass


# Note [ModelOutput's own frames]: where a ModelOutput is still built or read in plain Python (a
# frame left to plain Python, the runner rebuilding one), the frame hook would offer each of the
# base's methods to the callback, and each would be recorded as a frame left to plain Python
# (they read `self.__dict__` mid-construction). Their behaviour is what this module models, so
# once a base is in use its methods' codes are skipped by the hook.
_quieted: set[type] = set()


def _quiet(cls: type, base: type) -> None:
    """Note [ModelOutput's own frames]: skip the codes of the base's methods and of the class's
    (wrapped) dataclass `__init__`, nested code objects included."""
    if cls in _quieted:
        return
    _quieted.add(cls)
    try:
        import kiln_frame_hook as hook
    except ImportError:
        return
    funcs = [] if base in _quieted else [getattr(v, "fget", v) for v in vars(base).values()]
    _quieted.add(base)
    init = vars(cls).get("__init__")
    while init is not None:
        funcs.append(init)
        init = getattr(init, "__wrapped__", None)
    stack = [f.__code__ for f in funcs if inspect.isfunction(f)]
    while stack:
        code = stack.pop()
        hook.skip_code(code)
        stack += [c for c in code.co_consts if isinstance(c, type(code))]


def _dataclass_init(fn: Any) -> bool:
    """Is `fn` the `__init__` @dataclass generated (possibly wrapped by the base's metaclass, as
    transformers 5 does to rename old keyword arguments, which `MODEL_OUTPUT_BASES` replicates)?"""
    inner = inspect.unwrap(fn)
    return inspect.isfunction(inner) and inner.__code__.co_filename == "<string>"


def _is_none(vt: VT) -> bool:
    return isinstance(vt, ConstantVariable) and vt.value is None


def _renamed(cls: type, base: type, name: Any) -> Any:
    renames = MODEL_OUTPUT_BASES[(base.__module__, base.__qualname__)]
    fields = cls.__dataclass_fields__  # type: ignore[attr-defined]
    if isinstance(name, str) and name not in fields and renames.get(name) in fields:
        return renames[name]
    return name


def construct_model_output(
    tx: Tx, cls: type, base: type, args: list[VT], kwargs: dict[str, VT]
) -> ModelOutputVariable:
    """`cls(*args, **kwargs)`: the dataclass `__init__` binding, then ModelOutput's
    `__post_init__` rule for which fields become keys."""
    _quiet(cls, base)
    fields = dataclasses.fields(cls)
    name = cls.__qualname__
    if not fields or any(f.default is not None for f in fields[1:]):
        raise Unsupported(f"constructing {name}: ModelOutput raises ValueError for its fields")
    if len(args) > len(fields):
        raise Unsupported(f"{name}() given {len(args)} positional arguments")
    values: dict[str, VT] = {f.name: a for f, a in zip(fields, args, strict=False)}
    for k, v in kwargs.items():
        field = _renamed(cls, base, k)
        if field not in cls.__dataclass_fields__ or field in values:  # type: ignore[attr-defined]
            raise Unsupported(f"{name}() got an unexpected or repeated argument {k!r}")
        values[field] = v
    for f in fields:
        if f.name in values:
            continue
        if f.default is dataclasses.MISSING:
            raise Unsupported(f"{name}() missing argument {f.name!r}")
        values[f.name] = ConstantVariable(f.default)
    ordered = {f.name: values[f.name] for f in fields}
    first, *rest = ordered.values()
    if all(_is_none(v) for v in rest) and not isinstance(first, TensorVariable) and not _is_none(first):
        # __post_init__ then reads the first field as an iterator of (key, value) pairs.
        if not _first_field_kept(first):
            raise Unsupported(f"{name} built from a non-tensor first field alone")
        if not first.items:  # type: ignore[attr-defined]
            ordered[fields[0].name] = ConstantVariable(None)
    items = {k: v for k, v in ordered.items() if not _is_none(v)}
    return ModelOutputVariable(cls, base, ordered, items)


# Note [A ModelOutput built from its first field alone]: when every field but the first is None
# and the first is not a tensor, ModelOutput's `__post_init__` iterates the first field: if its
# first element is a 2-item list or tuple headed by a string, the elements are (key, value) pairs
# that set fields by name; otherwise the field is kept as it is (and an empty iterable leaves the
# field None and no key). A tuple or list of tensors (DETR's backbone returns
# `BackboneOutput(feature_maps=(t,))`) is the common case, and its element types are known while
# tracing, so it is modelled; a head that may be a pair, a dict or any other iterable breaks.


def _first_field_kept(first: VT) -> bool:
    """Note [A ModelOutput built from its first field alone]: is `first` a list or tuple that
    `__post_init__` keeps as the field (its head is certainly not a (str, value) pair)?"""
    if not isinstance(first, BaseListVariable) or not issubclass(first.python_type(), (list, tuple)):
        return False
    if not first.items:
        return True
    head = first.items[0]
    if isinstance(head, TensorVariable):
        return True
    if isinstance(head, ConstantVariable):
        v = head.value
        return not (isinstance(v, (list, tuple)) and len(v) == 2 and isinstance(v[0], str))
    if isinstance(head, BaseListVariable) and issubclass(head.python_type(), (list, tuple)):
        if len(head.items) != 2:
            return True
        key = head.items[0]
        return isinstance(key, TensorVariable) or (
            isinstance(key, ConstantVariable) and not isinstance(key.value, str)
        )
    return False


def wrap_model_output(builder: VariableBuilder, value: Any, base: type, source: Source | None) -> VT:
    """A ModelOutput from outside the frame. Guards pin its type and its keys in order; each field
    is read as an attribute (a key's attribute is its item: ModelOutput's `__setattr__` and
    `__setitem__` keep the two together), and the fields that are not keys are guarded None."""
    cls = type(value)
    _quiet(cls, base)
    if source is None:
        raise Unsupported(f"{cls.__qualname__} without a source")
    attrs = getattr(value, "__dict__", {})
    names = [f.name for f in dataclasses.fields(cls)]
    for k in value:
        if k not in names or attrs.get(k, None) is not dict.__getitem__(value, k):
            raise Unsupported(f"{cls.__qualname__} whose item {k!r} is not its field of that name")
    if any(n not in attrs for n in names):
        raise Unsupported(f"{cls.__qualname__} under construction (a field is not set yet)")
    if any(n not in value and attrs[n] is not None for n in names):
        raise Unsupported(f"{cls.__qualname__} with a field that is not None and not a key")
    builder.output.guards.type_match(source, value)
    builder.output.guards.dict_keys(source, value)
    fields = {n: builder.wrap(attrs[n], AttrSource(source, n)) for n in names}
    out = ModelOutputVariable(cls, base, fields, {k: fields[k] for k in value}, source)
    out.value = value
    return out


class ModelOutputVariable(DictVariable):
    """A ModelOutput: `fields` are its attributes (all dataclass fields, None included), `items`
    its keys (the fields that are not None)."""

    def __init__(
        self, cls: type, base: type, fields: dict[str, VT], items: dict[Any, VT], source: Source | None = None
    ) -> None:
        super().__init__(items, cls, source)
        self.base = base
        self.fields = dict(fields)
        self.value: Any = None  # the object itself, for one from outside the frame

    def describe(self) -> str:
        return f"{self.user_cls.__qualname__} with keys {list(self.items)!r}"

    def is_constant(self) -> bool:
        return False

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in self.fields:
            return self.fields[name]
        if name == "__class__":
            return tx.wrap(self.user_cls, None)
        from kiln_dynamo.variables.functions import BoundMethodVariable

        for klass in self.user_cls.__mro__:
            if name not in vars(klass):
                continue
            attr = vars(klass)[name]
            if isinstance(attr, property) and attr.fget is not None:
                return tx.wrap(attr.fget, None).call(tx, [self], {})
            if klass in (self.base, collections.OrderedDict, dict):
                if name in _NATIVE:
                    return MethodVariable(self, name)
                raise Unsupported(f"{klass.__qualname__}.{name} of {self.describe()}")
            if klass is object:
                break
            if inspect.isfunction(attr):
                return BoundMethodVariable(tx.wrap(attr, None), self)
            if isinstance(attr, staticmethod):
                return tx.wrap(attr.__func__, None)
            if isinstance(attr, classmethod):
                return BoundMethodVariable(tx.wrap(attr.__func__, None), tx.wrap(self.user_cls, None))
            raise Unsupported(f"class attribute {name!r} of {self.describe()}")
        if hasattr(self.user_cls, name):
            raise Unsupported(f"attribute {name!r} of {self.describe()}")
        raise AttributeError(f"{self.user_cls.__name__!r} object has no attribute {name!r}")

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        attr = self.getattr(tx, name)
        if not (isinstance(attr, MethodVariable) and attr.obj is self):
            return attr.call(tx, args, kwargs)
        if kwargs:
            raise Unsupported(f"keyword arguments to {name} of {self.describe()}")
        if name == "to_tuple" and not args:
            return TupleVariable(list(self.items.values()))
        if name == "keys" and not args:
            return TupleVariable([ConstantVariable(k) for k in self.items])
        if name == "values" and not args:
            return TupleVariable(list(self.items.values()))
        if name == "items" and not args:
            return TupleVariable([TupleVariable([ConstantVariable(k), v]) for k, v in self.items.items()])
        if name == "get" and 1 <= len(args) <= 2:
            k = self._key(args[0])
            return self.items[k] if k in self.items else args[1] if len(args) == 2 else ConstantVariable(None)
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(self.contains(tx, args[0]))
        if name == "__setitem__" and len(args) == 2:
            self.setitem(tx, args[0], args[1])
            return ConstantVariable(None)
        if name == "__setattr__" and len(args) == 2 and args[0].is_constant():
            self.setattr(tx, args[0].as_constant(), args[1])
            return ConstantVariable(None)
        raise Unsupported(f"method {name} of {self.describe()}")

    def _key(self, key: VT) -> Any:
        return _renamed(self.user_cls, self.base, key_of(key))

    # --- the mapping protocol (ModelOutput's, replicated) --------------------------------------
    def truth(self, tx: Tx) -> bool:
        return bool(self.items)

    def length(self, tx: Tx) -> int:
        return len(self.items)

    def iterate(self, tx: Tx) -> list[VT]:
        return [ConstantVariable(k) for k in self.items]

    def contains(self, tx: Tx, key: VT) -> bool:
        return self._key(key) in self.items

    def getitem(self, tx: Tx, key: VT) -> VT:
        if key.is_constant() and isinstance(key.as_constant(), str):
            k = self._key(key)
            if k not in self.items:
                raise Unsupported(f"KeyError {k!r} raised inside a compiled frame")
            return self.items[k]
        # Anything else indexes to_tuple() (which a subclass may override).
        return self.call_method(tx, "to_tuple", [], {}).getitem(tx, key)

    # --- mutation -------------------------------------------------------------------------------
    # Note [Stores into a ModelOutput from outside]: `out.pooler_output = x` or `out["x"] = v` on
    # a ModelOutput the frame received (llava's get_image_features sets a field of its vision
    # tower's output) changes the tracker as it does a new one's, so reads later in the frame see
    # the new field, and records an attribute store (SideEffects.store_attr) that the runner
    # replays after the graph with `set_field`: ModelOutput's `__setattr__` and `__setitem__` give
    # the same state for a value that is not None (the attribute, and the item, appended to the
    # keys when the field was not one), and a None into a field that is not a key sets only the
    # attribute, as here. `set_field` runs the class's `__setattr__` with no frame callback, as
    # `_construct` runs its `__init__`. The keys the frame entered with stay guarded.
    def _store(self, tx: Tx, name: Any, value: VT, what: str) -> None:
        cls = self.user_cls.__qualname__
        if self.source is not None and self.value is None:
            raise Unsupported(f"{what} on a {cls} from outside the frame without its object")
        name = _renamed(self.user_cls, self.base, name)
        if name not in self.fields:
            raise Unsupported(f"{what} {name!r}, which is not a field of {cls}")
        if _is_none(value):
            if what != "setting attribute" or name in self.items:
                # ModelOutput would keep the key with its old value (or None as an item).
                raise Unsupported(f"{what} {name!r} of a {cls} to None")
        else:
            self.items[name] = value
        self.fields[name] = value
        if self.source is not None:
            tx.output.side_effects.store_attr(self, self.value, name, value)

    def setattr(self, tx: Tx, name: str, value: VT) -> None:
        self._store(tx, name, value, "setting attribute")

    def setitem(self, tx: Tx, key: VT, value: VT) -> None:
        self._store(tx, key_of(key), value, "setting item")

    def replay_store(self) -> Any:
        """What the runner calls for a store recorded on this tracker (codegen.py)."""
        return set_field

    def delitem(self, tx: Tx, key: VT) -> None:
        raise Unsupported(f"del on a {self.user_cls.__qualname__} (ModelOutput raises)")

    def call_builtin(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        """`super().name` reaching dict from a subclass method: only what reading needs."""
        if name in ("keys", "values", "items", "get", "__getitem__", "__contains__"):
            if name == "__getitem__":
                return self.items[self._key(args[0])]
            return self.call_method(tx, name, args, kwargs)
        raise Unsupported(f"dict.{name} on a {self.user_cls.__qualname__}")

    # Note [Rebuilding a ModelOutput]: a new ModelOutput that escapes is rebuilt by
    # `_rebuild(cls, {field: value, ...}, keys)`: the class is called with the fields that are not
    # None (and any whose default is not None), so its own __init__ and __post_init__ make the keys
    # in field order. A field first set later (`out.hidden_states = h`) went to the end of the keys
    # in the frame; then `keys` is that order, restored with OrderedDict.move_to_end (ModelOutput
    # does not override it). The class's methods run with no frame callback on this thread: they
    # are what this module replicates, and offered to the callback, each would only be recorded
    # as a frame left to plain Python.
    def reconstruct(self, cg: Reconstructor) -> str:
        if self.source is not None:
            return cg.source(self.source)
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        cls = self.user_cls
        first, *rest = self.fields.values()
        alone = (
            all(_is_none(v) for v in rest) and not isinstance(first, TensorVariable) and not _is_none(first)
        )
        # Note [A ModelOutput built from its first field alone]: the class keeps a non-empty list or
        # tuple whose head is not a pair (that head is what the runner passes too)
        if alone and not (_first_field_kept(first) and first.items):  # type: ignore[attr-defined]
            raise Unsupported(f"rebuilding a {cls.__qualname__} whose only field is not a tensor")
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        args = ", ".join(
            f"{k!r}: {v.reconstruct(cg)}"
            for k, v in self.fields.items()
            if not _is_none(v) or defaults[k] is not None
        )
        keys = tuple(self.items)
        in_field_order = list(keys) == [k for k, v in self.fields.items() if not _is_none(v)]
        return f"{cg.const(_rebuild)}({cg.const(cls)}, {{{args}}}, {None if in_field_order else keys!r})"


def set_field(obj: Any, name: str, value: Any) -> None:
    """A store into a ModelOutput replayed after the graph (Note [Stores into a ModelOutput from
    outside]), through the class's own `__setattr__`, with no frame callback on this thread."""
    try:
        import kiln_frame_hook as hook
    except ImportError:
        setattr(obj, name, value)
        return
    previous = hook.set_thread_callback(None)
    try:
        setattr(obj, name, value)
    finally:
        hook.set_thread_callback(previous)


def _rebuild(cls: type, fields: dict[str, Any], keys: tuple[str, ...] | None) -> Any:
    plan = _plans.get(cls) if FAST_REBUILD else _SLOW
    if plan is None:  # Note [A ModelOutput rebuilt without its methods]
        obj = _construct(cls, fields, keys)
        _plans[cls] = _plan_for(cls, obj, fields, keys)
        return obj
    if plan is _SLOW or not _plain_fields(plan, fields):
        return _construct(cls, fields, keys)
    return _assemble(cls, plan, fields, keys)


def _construct(cls: type, fields: dict[str, Any], keys: tuple[str, ...] | None) -> Any:
    try:
        import kiln_frame_hook as hook
    except ImportError:
        obj = cls(**fields)
    else:
        previous = hook.set_thread_callback(None)
        try:
            obj = cls(**fields)
        finally:
            hook.set_thread_callback(previous)
    for k in keys or ():
        obj.move_to_end(k)
    return obj


# Note [A ModelOutput rebuilt without its methods]: a runner rebuilds the frame's ModelOutput on
# every call (Note [Rebuilding a ModelOutput]), and the class's own construction (the dataclass
# `__init__`, ModelOutput's `__setattr__` per field through `dataclasses.fields`, `__post_init__`,
# pytree registration) was the largest single cost of a warm call of a small transformers model
# after the kernels (issue 14: `packages/kiln/bench/call_overhead.py`). The outcome is what this
# module models: every field an attribute, in field order; the fields that are not None also
# items, in field order (or `keys`). So after the first rebuild of a class, which runs the class
# itself, later ones build that state directly: `cls.__new__`, the attributes into `__dict__`,
# the items with `OrderedDict.__setitem__`. Only where it is provably the same object:
#   - the class is one this module models (`model_output_base`: nothing below the base overrides
#     its behaviour, the `__init__` is the one @dataclass generated), and every field not passed
#     has a plain default;
#   - the first rebuild is compared with what the direct build gives for the same fields (type,
#     attributes and items, in order, by identity); any difference keeps the class on the slow
#     path for good (a transformers version that constructs differently);
#   - a call whose first field is not a tensor while the others are None takes the slow path:
#     `__post_init__` then reads the first field as (key, value) pairs.
# What the direct build skips is idempotent (the pytree registration of the class, done by the
# first rebuild) or a check the capture made (`construct_model_output`). `KILN_FAST_MODEL_OUTPUT=0`
# (or `FAST_REBUILD = False`, as packages/kiln/bench/call_overhead.py's A/B does) turns it off.
FAST_REBUILD = os.environ.get("KILN_FAST_MODEL_OUTPUT", "1") != "0"
# a plan: (field, default) in field order; _SLOW (compared by identity): the class builds it
Plan = tuple[tuple[str, Any], ...]
_SLOW: Plan = (("slow", None),)
_plans: dict[type, Plan] = {}


def _plan_for(cls: type, built: Any, fields: dict[str, Any], keys: tuple[str, ...] | None) -> Plan:
    """((field, default) in field order), or _SLOW when the direct build is not provably `cls`'s."""
    if model_output_base(cls) is None:
        return _SLOW
    plan = []
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.name not in fields:
            return _SLOW  # a default_factory, or a field the call did not pass
        plan.append((f.name, None if f.default is dataclasses.MISSING else f.default))
    if not _plain_fields(tuple(plan), fields):
        return _SLOW
    try:
        direct = _assemble(cls, tuple(plan), fields, keys)
    except Exception:
        return _SLOW
    od_items = collections.OrderedDict.items
    if not (
        type(direct) is type(built)
        and _same(list(vars(direct).items()), list(vars(built).items()))
        and _same(list(od_items(direct)), list(od_items(built)))
    ):
        return _SLOW
    return tuple(plan)


def _same(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> bool:
    """Same keys in the same order, each value the same object."""
    return len(a) == len(b) and all(ka == kb and va is vb for (ka, va), (kb, vb) in zip(a, b, strict=True))


def _plain_fields(plan: Plan, fields: dict[str, Any]) -> bool:
    """Not the case where `__post_init__` reads the first field as (key, value) pairs."""
    (first, default), *rest = plan
    if isinstance(fields.get(first, default), torch.Tensor):
        return True
    return any(fields.get(name, d) is not None for name, d in rest)


def _assemble(cls: type, plan: Plan, fields: dict[str, Any], keys: tuple[str, ...] | None) -> Any:
    obj = cls.__new__(cls)  # type: ignore[call-overload]
    attrs = obj.__dict__
    for name, default in plan:
        value = fields.get(name, default)
        attrs[name] = value
        if value is not None:
            collections.OrderedDict.__setitem__(obj, name, value)
    for k in keys or ():
        collections.OrderedDict.move_to_end(obj, k)
    return obj
