"""Python builtins and the `operator` module, evaluated on trackers.

Each supported builtin has one handler in `_HANDLERS`; a handler receives the translator and the
argument trackers and returns a tracker. Pure builtins called on constants are folded
(`_FOLDABLE`); operators on tensors become graph nodes through the translator's `binary_op`,
`compare_op` and `unary_op`, which all binary builtins share.
"""

from __future__ import annotations

import builtins
import collections
import copy
import functools
import itertools
import math
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.variables.base import ConstantVariable, SliceVariable, VariableTracker
from kiln_dynamo.variables.dicts import DictVariable, DictViewVariable, SetVariable, key_of
from kiln_dynamo.variables.exceptions import (
    ExceptionVariable,
    ObservedException,
    is_plain_exception_class,
    missing_attribute,
    observed,
)
from kiln_dynamo.variables.lists import (
    BaseListVariable,
    LazyIteratorVariable,
    ListIteratorVariable,
    ListVariable,
    TupleVariable,
    is_pure_iterator,
    iterator_of,
    list_reverseiterator_at,
    sort_keys,
    sort_order,
)
from kiln_dynamo.variables.symbolic import SymNodeVariable, set_where, symbolic_builtin

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker
Handler = Callable[["Tx", list[VT], dict[str, VT]], VT]

_FOLDABLE: frozenset[Any] = frozenset(
    {
        abs,
        bool,
        int,
        float,
        str,
        complex,
        bytes,
        round,
        divmod,
        pow,
        hash,
        repr,
        format,
        chr,
        ord,
        min,
        max,
        all,
        any,
        sum,
        len,
        sorted,
        callable,
        bin,
        hex,
        oct,
    }
    | {v for k, v in vars(math).items() if callable(v) and not k.startswith("_")}
)

BINARY_OPERATORS: dict[Any, str] = {
    operator.add: "+",
    operator.sub: "-",
    operator.mul: "*",
    operator.truediv: "/",
    operator.floordiv: "//",
    operator.mod: "%",
    operator.pow: "**",
    operator.matmul: "@",
    operator.and_: "&",
    operator.or_: "|",
    operator.xor: "^",
    operator.lshift: "<<",
    operator.rshift: ">>",
    operator.iadd: "+=",
    operator.isub: "-=",
    operator.imul: "*=",
    operator.itruediv: "/=",
    operator.ifloordiv: "//=",
    operator.imod: "%=",
    operator.ipow: "**=",
    operator.imatmul: "@=",
    operator.iand: "&=",
    operator.ior: "|=",
    operator.ixor: "^=",
    operator.ilshift: "<<=",
    operator.irshift: ">>=",
}
COMPARE_OPERATORS: dict[Any, str] = {
    operator.lt: "<",
    operator.le: "<=",
    operator.eq: "==",
    operator.ne: "!=",
    operator.gt: ">",
    operator.ge: ">=",
}
UNARY_OPERATORS: dict[Any, Any] = {
    operator.neg: operator.neg,
    operator.pos: operator.pos,
    operator.invert: operator.invert,
    operator.not_: operator.not_,
    abs: operator.abs,
    operator.abs: operator.abs,
}


def _consts(args: list[VT], kwargs: dict[str, VT]) -> bool:
    return all(a.is_constant() for a in [*args, *kwargs.values()])


def _isinstance(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    obj, cls = args
    classes = cls.as_constant()
    return ConstantVariable(issubclass(obj.python_type(), classes))


def _issubclass(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return ConstantVariable(issubclass(args[0].as_constant(), args[1].as_constant()))


def _getattr(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    name = args[1].as_constant()
    try:
        return tx.load_attr(args[0], name)
    except (AttributeError, ObservedException) as e:
        if not missing_attribute(e):
            raise
        if len(args) == 3:
            return args[2]
        if isinstance(e, ObservedException):
            raise
        raise Unsupported(f"AttributeError: {name!r} raised inside a compiled frame") from None


def _hasattr(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    try:
        tx.load_attr(args[0], args[1].as_constant())
    except (AttributeError, ObservedException) as e:
        if not missing_attribute(e):
            raise
        return ConstantVariable(False)
    return ConstantVariable(True)


def _vars(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """`vars(obj)`: Note [vars of an object made in the frame] in user_defined.py; `vars()` (the
    caller's locals) is a break."""
    if kwargs or len(args) != 1:
        raise Unsupported("vars() without an argument (the caller's locals) inside a compiled frame")
    try:  # an object made in the frame: Note [vars of an object made in the frame]
        return tx.load_attr(args[0], "__dict__")
    except AttributeError:
        raise Unsupported(f"vars() of {args[0].describe()} raised TypeError (no __dict__)") from None


def _setattr(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    args[0].setattr(tx, args[1].as_constant(), args[2])
    return ConstantVariable(None)


def _delattr(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.user_defined import NewObjectVariable

    if kwargs or len(args) != 2 or not isinstance(args[0], NewObjectVariable) or not args[1].is_constant():
        raise Unsupported("delattr() of an object not made in the frame")
    args[0].delete(tx, args[1].as_constant())
    return ConstantVariable(None)


def _len(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return ConstantVariable(args[0].length(tx))


def _range(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return ConstantVariable(range(*[a.as_constant() for a in args]))


def _is_list(v: VT) -> bool:
    try:
        return v.python_type() is list
    except Unsupported:
        return False


def _is_deque(v: VT) -> bool:
    try:
        return v.python_type() is collections.deque
    except Unsupported:
        return False


def _iter(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    if isinstance(args[0], ListIteratorVariable):
        return args[0]
    if (isinstance(args[0], ListVariable) and _is_list(args[0])) or type(args[0]) in (
        DictVariable,
        DictViewVariable,
    ):
        return iterator_of(tx, args[0])  # Note [Lazy iterators]: read live
    kind = "list" if _is_list(args[0]) else "deque" if _is_deque(args[0]) else "tuple"
    return ListIteratorVariable(args[0].iterate(tx), kind)


def _lazy(
    kind: str,
    pull: Callable[[Tx], VT | None],
    parts: Sequence[VT],
    calls: bool,
    rebuild: Callable[[Reconstructor], str] | None = None,
) -> VT:
    """Note [Lazy iterators]: an iterator whose items `pull` computes as they are asked for;
    `rebuild` renders it over its parts' rebuilds (Note [Iterators that leave the frame over a
    live list])."""
    pure = not calls and all(is_pure_iterator(p) for p in parts)
    return LazyIteratorVariable(kind, pull, pure, parts, rebuild)


def _next(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    it = args[0]
    if not isinstance(it, ListIteratorVariable):
        raise Unsupported(f"next() on {it.describe()}")
    item = it.next(tx)
    if item is None:
        if len(args) == 2:
            return args[1]
        raise observed(StopIteration)
    return item


def _zip(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """Note [Lazy iterators]: each step pulls one item from each argument's iterator, in order,
    and stops at the first that has ended (strict=True: then every other must have ended)."""
    if set(kwargs) - {"strict"}:
        raise Unsupported(f"zip() with arguments {sorted(kwargs)}")
    strict_vt = kwargs.get("strict")
    if strict_vt is not None and not strict_vt.is_constant():
        raise Unsupported("zip(strict=) that is not a constant")
    strict = bool(strict_vt.as_constant()) if strict_vt is not None else False
    its = [iterator_of(tx, a) for a in args]

    def pull(t: Tx) -> VT | None:
        if not its:
            return None
        row: list[VT] = []
        for k, it in enumerate(its):
            item = it.next(t)
            if item is None:
                if strict and (k > 0 or any(o.next(t) is not None for o in its[1:])):
                    raise Unsupported("zip(strict=True) raised ValueError")
                return None
            row.append(item)
        return TupleVariable(row)

    def rebuild(cg: Reconstructor) -> str:
        return f"{cg.const(zip)}({''.join(it.reconstruct(cg) + ', ' for it in its)}strict={strict})"

    return _lazy("zip", pull, its, strict, rebuild)


def _enumerate(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    start = (
        args[1].as_constant()
        if len(args) > 1
        else (kwargs["start"].as_constant() if "start" in kwargs else 0)
    )
    it = iterator_of(tx, args[0])
    count = [start]

    def pull(t: Tx) -> VT | None:
        item = it.next(t)
        if item is None:
            return None
        count[0] += 1
        return TupleVariable([ConstantVariable(count[0] - 1), item])

    def rebuild(cg: Reconstructor) -> str:
        return f"{cg.const(enumerate)}({it.reconstruct(cg)}, {count[0]!r})"

    return _lazy("enumerate", pull, [it], False, rebuild)


def _reversed(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    seq = args[0]
    if isinstance(seq, ListVariable) and _is_list(seq):
        # Note [Lazy iterators]: CPython's list_reverseiterator reads l[i] at each step, from
        # the last index at creation down, and ends early when the list has shrunk below i
        pos = [len(seq.items) - 1]

        def pull(t: Tx) -> VT | None:
            i = pos[0]
            if i < 0 or i >= len(seq.items):
                pos[0] = -1
                return None
            pos[0] -= 1
            return seq.items[i]

        def rebuild(cg: Reconstructor) -> str:  # Note [Iterators that leave the frame over a live list]
            return f"{cg.const(list_reverseiterator_at)}({seq.reconstruct(cg)}, {pos[0]})"

        return LazyIteratorVariable("reversed", pull, True, [seq], rebuild, live=True)
    kind = "reversed" if _is_list(seq) else "deque_reversed" if _is_deque(seq) else "tuple"
    return ListIteratorVariable(list(reversed(seq.iterate(tx))), kind)


def _map(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    fn, *seqs = args
    its = [iterator_of(tx, s) for s in seqs]

    def pull(t: Tx) -> VT | None:
        row: list[VT] = []
        for it in its:
            item = it.next(t)
            if item is None:
                return None
            row.append(item)
        return fn.call(t, row, {}) if its else None

    return _lazy("map", pull, its, True)


def _filter(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    fn, seq = args
    it = iterator_of(tx, seq)
    identity = fn.is_constant() and fn.as_constant() is None

    def pull(t: Tx) -> VT | None:
        while (item := it.next(t)) is not None:
            if (item if identity else fn.call(t, [item], {})).truth(t):
                return item
        return None

    return _lazy("filter", pull, [it], True)


def _tuple(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return TupleVariable(args[0].iterate(tx) if args else [])


def _list(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return ListVariable(args[0].iterate(tx) if args else [])


def _dict(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    d = DictVariable({})
    if args:
        d.update_from(tx, args[0])
    d.items.update(kwargs)
    return d


def _dict_fromkeys(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """`dict.fromkeys(keys, value=None)`: every key maps to the one `value` (transformers' caches
    build their per-layer state dicts this way)."""
    if kwargs or not 1 <= len(args) <= 2:
        raise Unsupported("dict.fromkeys with keyword arguments or no keys")
    value = args[1] if len(args) == 2 else ConstantVariable(None)
    return DictVariable({key_of(k): value for k in args[0].iterate(tx)})


def _set(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return SetVariable([key_of(v) for v in args[0].iterate(tx)] if args else [])


def _frozenset(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return SetVariable([key_of(v) for v in args[0].iterate(tx)] if args else [], frozen=True)


def _bool(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return ConstantVariable(args[0].truth(tx) if args else False)


def _sum(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    items = args[0].iterate(tx)
    acc = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
    for item in items:
        acc = tx.binary_op(operator.add, acc, item)
    return acc


def _prod(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    # `math.prod` of sizes (Hiera's `reshape(-1, math.prod(size), c)`): constants fold before
    # this; symbolic items multiply in Python's order, so the product stays symbolic (it broke
    # the graph under dynamic=True)
    if set(kwargs) - {"start"} or len(args) != 1:
        raise Unsupported(f"math.prod() with arguments {sorted(kwargs)}")
    acc = kwargs.get("start", ConstantVariable(1))
    for item in args[0].iterate(tx):
        acc = tx.binary_op(operator.mul, acc, item)
    return acc


def _minmax(pick: Callable[..., Any]) -> Handler:
    def handler(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        items = list(args[0].iterate(tx)) if len(args) == 1 else list(args)
        if set(kwargs) - {"key", "default"}:
            raise Unsupported(f"{pick.__name__}() with arguments {sorted(kwargs)}")
        if not items:
            if "default" in kwargs:
                return kwargs["default"]
            raise Unsupported(f"{pick.__name__}() of an empty sequence")  # eager raises ValueError
        if all(i.is_constant() for i in items) and ("key" not in kwargs or kwargs["key"].is_constant()):
            kw = {k: v.as_constant() for k, v in kwargs.items() if k == "key"}
            return tx.wrap_constant(pick([i.as_constant() for i in items], **kw))
        # Note [Ordering by constant keys]: the first item with the least/greatest key, as Python
        keys = sort_keys(tx, items, kwargs.get("key"), f"{pick.__name__}()")
        return items[pick(range(len(items)), key=keys.__getitem__)]

    return handler


def _all_any(pick: Callable[..., Any]) -> Handler:
    def handler(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if isinstance(args[0], ListIteratorVariable):  # stops at the first decisive item, as eager
            it = args[0]
            while (item := it.next(tx)) is not None:
                if item.truth(tx) is (pick is any):
                    return ConstantVariable(pick is any)
            return ConstantVariable(pick is all)
        return ConstantVariable(pick(i.truth(tx) for i in args[0].iterate(tx)))

    return handler


def _abs(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    if args[0].is_constant():
        return ConstantVariable(abs(args[0].as_constant()))
    return tx.unary_op(operator.abs, args[0])


def _type(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    if len(args) != 1:
        raise Unsupported("type() with three arguments")
    return tx.wrap(args[0].python_type(), None)


def _callable(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.functions import BaseFunctionVariable, BoundMethodVariable, PartialVariable

    v = args[0]
    if isinstance(v, (BaseFunctionVariable, BoundMethodVariable, PartialVariable)):
        return ConstantVariable(True)
    if v.is_constant():
        return ConstantVariable(callable(v.as_constant()))
    has_call = callable(v.python_type()) and "__call__" in dir(v.python_type())
    return ConstantVariable(has_call)


def _slice(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    items = list(args) + [ConstantVariable(None)] * (3 - len(args))
    if len(args) == 1:
        items = [ConstantVariable(None), args[0], ConstantVariable(None)]
    return SliceVariable(*items)


def _sorted(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    items = list(args[0].iterate(tx))
    if all(i.is_constant() for i in items) and _consts([], kwargs):
        kw = {k: v.as_constant() for k, v in kwargs.items()}
        return ListVariable([ConstantVariable(v) for v in sorted([i.as_constant() for i in items], **kw)])
    # Note [Ordering by constant keys]: the items themselves, in the order of their keys
    return ListVariable([items[k] for k in sort_order(tx, items, kwargs, "sorted()")])


def _binary(fn: Any) -> Handler:
    def handler(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return tx.binary_op(fn, args[0], args[1])

    return handler


def _compare(fn: Any) -> Handler:
    def handler(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return tx.compare_op(fn, args[0], args[1])

    return handler


def _unary(fn: Any) -> Handler:
    def handler(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return tx.unary_op(fn, args[0])

    return handler


def _getitem(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return tx.subscript(args[0], args[1])


def _contains(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return ConstantVariable(tx.contains(args[0], args[1]))


def _is(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return ConstantVariable(args[0].identity() is args[1].identity())


def _id(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """Note [id() in the frame]: `id(obj)` is a constant when `obj` is an object from outside the
    frame (a module, a user object, a function, a class: a tracker with a source whose identity is
    the real object; a tensor that is an input of the graph, still its placeholder), guarded to be
    that same object, as torch.compile does; a builtin's id is a constant too. An object made in
    the frame, a tensor computed in it, a container kiln models (its tracker is not the real
    object) has no id known at capture time: a break with that reason."""
    if len(args) != 1 or kwargs:
        raise Unsupported("id() takes exactly one argument")
    vt = args[0]
    obj = vt.identity()
    if isinstance(vt, BuiltinVariable) and getattr(builtins, getattr(obj, "__name__", ""), None) is obj:
        return ConstantVariable(id(obj))
    from kiln_dynamo.variables.tensor import TensorVariable

    if isinstance(vt, TensorVariable):  # an input of the graph is the caller's tensor itself
        for node, source, value in tx.output.inputs:
            if node is vt.node and isinstance(value, torch.Tensor):
                tx.output.guards.identity(source, value)
                return ConstantVariable(id(value))
    if obj is vt or vt.source is None:
        raise Unsupported(
            f"id() of {vt.describe()}: no object from outside the frame whose identity kiln can guard"
        )
    tx.output.guards.identity(vt.source, obj)
    return ConstantVariable(id(obj))


def _partial(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.functions import PartialVariable

    return PartialVariable(args[0], list(args[1:]), dict(kwargs))


def _ordered_dict(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    d = _dict(tx, args, kwargs)
    assert isinstance(d, DictVariable)
    d.user_cls = collections.OrderedDict
    return d


def _defaultdict(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.dicts import DefaultDictVariable

    d = DefaultDictVariable({}, args[0] if args else ConstantVariable(None))
    if len(args) > 1:
        d.update_from(tx, args[1])
    d.items.update(kwargs)
    return d


def _counter(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.dicts import CounterVariable

    if len(args) > 1:
        raise Unsupported("collections.Counter with more than one positional argument")
    c = CounterVariable({})
    c.count(tx, args[0] if args else None, kwargs, 1)
    return c


def _deque(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.lists import DequeVariable

    if len(args) > 2 or set(kwargs) - {"iterable", "maxlen"}:
        raise Unsupported("collections.deque with these arguments")
    iterable = args[0] if args else kwargs.get("iterable")
    maxlen = args[1] if len(args) == 2 else kwargs.get("maxlen", ConstantVariable(None))
    n = maxlen.as_constant() if maxlen.is_constant() else "?"
    if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        raise Unsupported("collections.deque with a maxlen that is not a constant int >= 0")
    d = DequeVariable([], n)
    if iterable is not None:
        d.call_method(tx, "extend", [iterable], {})
    return d


# Note [copy on traced values]: `copy.copy` of a list, tuple, plain dict/OrderedDict, set or
# constant made or read in the frame is the container's own copy (a new list/dict/set of the
# same items; a tuple or constant is itself), and `copy.deepcopy` of a value made only of Python
# constants is folded into a fresh value of the same type (every constant it reads is guarded,
# as any read is); either of an existing user object of constants is folded into a new object
# (Note [Copying an object of constants]); anything else inlines copy's own Python code, as before (where `id()` of a
# constant or a dispatch table keyed by types breaks).
def _copy(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.functions import UserFunctionVariable

    if len(args) == 1 and not kwargs:
        (x,) = args
        kind = type(x)
        if kind is ListVariable:
            return ListVariable(list(x.items))  # type: ignore[attr-defined]
        if kind is DictVariable and x.python_type() in (dict, collections.OrderedDict):
            return x.call_method(tx, "copy", [], {})
        if kind is SetVariable and not x.frozen:  # type: ignore[attr-defined]
            return SetVariable(list(x.items))  # type: ignore[attr-defined]
        if kind is TupleVariable or (isinstance(x, ConstantVariable) and type(x.value) in _ATOMIC):
            return x
        folded = _fold_object_copy(tx, x, deep=False)
        if folded is not None:
            return folded
    return UserFunctionVariable(copy.copy).call(tx, args, kwargs)  # type: ignore[arg-type]


def _deepcopy(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.functions import UserFunctionVariable

    if len(args) == 1 and not kwargs and _plain_constant(args[0]):
        return tx.wrap_constant(copy.deepcopy(args[0].as_constant()))
    if len(args) == 1 and not kwargs:
        folded = _fold_object_copy(tx, args[0], deep=True)
        if folded is not None:
            return folded
    return UserFunctionVariable(copy.deepcopy).call(tx, args, kwargs)  # type: ignore[arg-type]


_ATOMIC = (int, float, bool, complex, str, bytes, type(None))


def _fold_object_copy(tx: Tx, x: VT, deep: bool) -> VT | None:
    """Note [Copying an object of constants] (object_copy.py), for a user object."""
    from kiln_dynamo.variables.object_copy import fold_copy, fold_new_copy
    from kiln_dynamo.variables.user_defined import NewObjectVariable, UserObjectVariable

    if type(x) is NewObjectVariable:
        return fold_new_copy(tx, x, deep)
    return fold_copy(tx, x, deep) if type(x) is UserObjectVariable else None


def _plain_constant(x: VT) -> bool:
    """Made of Python constants in plain containers (list, tuple, dict, set) only."""
    if isinstance(x, ConstantVariable):
        return type(x.value) in _ATOMIC
    if type(x) in (ListVariable, TupleVariable):
        return all(_plain_constant(i) for i in x.items)  # type: ignore[attr-defined]
    if isinstance(x, DictVariable) and x.python_type() is dict:  # an instance dict too
        return all(_plain_constant(v) for v in x.items.values())
    return False


def _weakref_ref(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.stdlib import new_weakref

    return new_weakref(tx, args, kwargs)


def _torch_size(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.lists import SizeVariable

    return SizeVariable(args[0].iterate(tx) if args else [])


def _super(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    if not args:
        return tx.zero_arg_super()
    from kiln_dynamo.variables.user_defined import SuperVariable

    return SuperVariable(args[0], args[1])


def _object_setattr(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.user_defined import NewObjectVariable

    obj, name, value = args
    if isinstance(obj, NewObjectVariable):
        obj.store(tx, name.as_constant(), value)  # bypasses a frozen dataclass's __setattr__, as CPython does
    else:
        obj.setattr(tx, name.as_constant(), value)
    return ConstantVariable(None)


def _product(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    if kwargs:
        raise Unsupported("itertools.product with keyword arguments")
    pools = [a.iterate(tx) for a in args]
    return ListIteratorVariable([TupleVariable(list(p)) for p in itertools.product(*pools)])


def _chained(tx: Tx, outer: ListIteratorVariable, pure: bool) -> VT:
    """Note [Lazy iterators]: each iterable `outer` yields is made an iterator when the one
    before it has ended, as `itertools.chain` does."""
    current: list[ListIteratorVariable] = []

    def pull(t: Tx) -> VT | None:
        while True:
            if current:
                item = current[0].next(t)
                if item is not None:
                    return item
                current.clear()
            nxt = outer.next(t)
            if nxt is None:
                return None
            it = iterator_of(t, nxt)
            if t is None and not is_pure_iterator(it):
                raise Unsupported("a chain iterator over an impure iterator leaves the frame unfinished")
            current.append(it)

    return _lazy("chain", pull, [outer], not pure)


def _chain(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return _chained(tx, ListIteratorVariable(list(args)), all(_pure_iterable(a) for a in args))


def _pure_iterable(v: VT) -> bool:
    return is_pure_iterator(v) if isinstance(v, ListIteratorVariable) else isinstance(v, BaseListVariable)


def _chain_from_iterable(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    if kwargs or len(args) != 1:
        raise Unsupported("itertools.chain.from_iterable with these arguments")
    return _chained(tx, iterator_of(tx, args[0]), False)


def _pairwise(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    if kwargs or len(args) != 1:
        raise Unsupported("itertools.pairwise with these arguments")
    it = iterator_of(tx, args[0])
    last: list[VT] = []

    def pull(t: Tx) -> VT | None:
        if not last:
            first = it.next(t)
            if first is None:
                return None
            last.append(first)
        item = it.next(t)
        if item is None:
            return None
        pair = TupleVariable([last[0], item])
        last[0] = item
        return pair

    return _lazy("pairwise", pull, [it], False)


def _accumulate(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """itertools.accumulate(iterable[, func], *, initial=None): `func` (default +) traced in order."""
    if not 1 <= len(args) <= 2 or set(kwargs) - {"func", "initial"}:
        raise Unsupported("itertools.accumulate with these arguments")
    func = args[1] if len(args) == 2 else kwargs.get("func")
    it = iterator_of(tx, args[0])
    initial = kwargs.get("initial")
    total: list[VT] = []
    if initial is not None and not (initial.is_constant() and initial.as_constant() is None):
        total.append(initial)
        pending = [initial]  # yielded first, before anything is pulled
    else:
        pending = []

    def pull(t: Tx) -> VT | None:
        if pending:
            return pending.pop()
        item = it.next(t)
        if item is None:
            return None
        if not total:
            total.append(item)
        elif func is None or (func.is_constant() and func.as_constant() is None):
            total[0] = t.binary_op(operator.add, total[0], item)
        else:
            total[0] = func.call(t, [total[0], item], {})
        return total[0]

    return _lazy("accumulate", pull, [it], True)


def _count(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.lists import CountIteratorVariable

    if len(args) > 2 or set(kwargs) - {"start", "step"} or not _consts(args, kwargs):
        raise Unsupported("itertools.count with arguments that are not constants")
    values = [a.as_constant() for a in args]
    start = values[0] if values else kwargs["start"].as_constant() if "start" in kwargs else 0
    step = values[1] if len(values) > 1 else kwargs["step"].as_constant() if "step" in kwargs else 1
    if not all(isinstance(v, (int, float)) for v in (start, step)):
        raise Unsupported("itertools.count of values that are not numbers")
    return CountIteratorVariable(start, step)


def _islice(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from kiln_dynamo.variables.lists import CountIteratorVariable, IsliceCountVariable

    if kwargs or not 2 <= len(args) <= 4 or not _consts(args[1:], {}):
        raise Unsupported("itertools.islice with these arguments")
    if isinstance(args[0], CountIteratorVariable):
        sl = slice(*[a.as_constant() for a in args[1:]])
        start, stop, step = sl.start or 0, sl.stop, 1 if sl.step is None else sl.step
        if not all(isinstance(v, int) and v >= 0 for v in (start, stop)) or not (
            isinstance(step, int) and step > 0
        ):
            raise Unsupported("itertools.islice of an itertools.count without a stop, or with bad bounds")
        return IsliceCountVariable(args[0], start, stop, step)
    it = iterator_of(tx, args[0])
    sl = slice(*[a.as_constant() for a in args[1:]])
    stop = sl.stop
    step = 1 if sl.step is None else sl.step
    state = [0, sl.start or 0]  # CPython's islice: items pulled from `it`, index of the next yield
    if stop is not None and state[1] > stop:
        state[1] = stop

    def pull(t: Tx) -> VT | None:
        while state[0] < state[1]:  # skipped items are pulled (and dropped) as CPython does
            if it.next(t) is None:
                return None
            state[0] += 1
        if stop is not None and state[0] >= stop:
            return None
        item = it.next(t)
        if item is None:
            return None
        state[0] += 1
        state[1] += step
        if stop is not None and state[1] > stop:
            state[1] = stop
        return item

    return _lazy("islice", pull, [it], False)


def _print(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    raise Unsupported(
        "print() is a side effect that kiln runs as plain Python",
        advice="remove the print from the compiled function, or use logging outside it",
    )


def _reduce(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """functools.reduce(fn, iterable[, initial]): the calls of `fn` traced in order."""
    if kwargs or not 2 <= len(args) <= 3:
        raise Unsupported("functools.reduce with these arguments")
    fn, items = args[0], args[1].iterate(tx)
    if len(args) == 3:
        acc = args[2]
    elif items:
        acc, items = items[0], items[1:]
    else:
        raise Unsupported("functools.reduce of an empty sequence raised TypeError")
    for item in items:
        acc = fn.call(tx, [acc, item], {})
    return acc


_HANDLERS: dict[Any, Handler] = {
    isinstance: _isinstance,
    issubclass: _issubclass,
    getattr: _getattr,
    hasattr: _hasattr,
    setattr: _setattr,
    delattr: _delattr,
    vars: _vars,
    len: _len,
    range: _range,
    iter: _iter,
    next: _next,
    zip: _zip,
    enumerate: _enumerate,
    reversed: _reversed,
    map: _map,
    filter: _filter,
    tuple: _tuple,
    list: _list,
    dict: _dict,
    dict.fromkeys: _dict_fromkeys,
    set: _set,
    frozenset: _frozenset,
    bool: _bool,
    sum: _sum,
    math.prod: _prod,
    min: _minmax(min),
    max: _minmax(max),
    all: _all_any(all),
    any: _all_any(any),
    abs: _abs,
    type: _type,
    callable: _callable,
    slice: _slice,
    sorted: _sorted,
    print: _print,
    super: _super,
    object.__setattr__: _object_setattr,
    itertools.product: _product,
    itertools.chain: _chain,
    itertools.pairwise: _pairwise,
    itertools.accumulate: _accumulate,
    itertools.islice: _islice,
    itertools.count: _count,
    functools.partial: _partial,
    functools.reduce: _reduce,
    collections.OrderedDict: _ordered_dict,
    collections.defaultdict: _defaultdict,
    torch.Size: _torch_size,
    weakref.ref: _weakref_ref,
    copy.copy: _copy,
    copy.deepcopy: _deepcopy,
    collections.Counter: _counter,
    collections.deque: _deque,
    operator.getitem: _getitem,
    operator.contains: _contains,
    operator.is_: _is,
    id: _id,
}
_HANDLERS.update({fn: _binary(fn) for fn in BINARY_OPERATORS})
_HANDLERS.update({fn: _compare(fn) for fn in COMPARE_OPERATORS})
_HANDLERS.update(
    {fn: _unary(fn) for fn in (operator.neg, operator.pos, operator.invert, operator.not_, operator.abs)}
)


def is_builtin_handled(fn: Any) -> bool:
    try:
        return fn in _HANDLERS or fn in _FOLDABLE
    except TypeError:
        return False


def _symbolic_length(vt: VT) -> bool:
    from kiln_dynamo.variables.tensor import TensorVariable

    return isinstance(vt, TensorVariable) and vt.fake.dim() > 0 and isinstance(vt.fake.shape[0], torch.SymInt)


def _is_tensor(vt: VT) -> bool:
    from kiln_dynamo.variables.tensor import TensorVariable

    return isinstance(vt, TensorVariable)


def specialize(tx: Tx, vt: VT) -> VT:
    """A symbolic number as the constant it is in this run (the ShapeEnv records the guard)."""
    if not isinstance(vt, SymNodeVariable):
        return vt
    set_where(tx)
    value = vt.value
    return ConstantVariable(
        bool(value)
        if isinstance(value, torch.SymBool)
        else value.__int__()
        if isinstance(value, torch.SymInt)
        else float(value)
    )


class BuiltinVariable(VariableTracker):
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def describe(self) -> str:
        return f"builtin {getattr(self.fn, '__name__', self.fn)}"

    def python_type(self) -> type:
        return type(self.fn)

    def identity(self) -> object:
        return self.fn

    def is_constant(self) -> bool:
        return isinstance(self.fn, type)

    def as_constant(self) -> Any:
        if isinstance(self.fn, type):
            return self.fn
        return super().as_constant()

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        fn = self.fn
        if fn is len and len(args) == 1 and not kwargs and _symbolic_length(args[0]):
            from kiln_dynamo.variables.tensor import TensorVariable

            assert isinstance(args[0], TensorVariable)
            return args[0].dim_value(tx, "size", 0, args[0].fake.shape[0])  # stays symbolic
        if fn in (int, float, complex) and len(args) == 1 and not kwargs and _is_tensor(args[0]):
            # `int(t)` calls `t.__int__()`: folded when `t` is a constant of the trace (Note
            # [Tensors computed from constants]), a break with its reason otherwise
            return args[0].getattr(tx, f"__{fn.__name__}__").call(tx, [], {})
        if fn in (str, repr) and len(args) == 1 and not kwargs:
            from kiln_dynamo.variables.formatted import sequence_text

            text = sequence_text(args[0])  # Note [Strings formatted from symbolic sizes]
            if text is not None:
                return text
        if any(isinstance(a, SymNodeVariable) for a in args) and not kwargs:
            kept = symbolic_builtin(tx, fn, args)  # Note [Builtins on symbolic numbers]
            if kept is not None:
                return kept
        if any(isinstance(a, SymNodeVariable) for a in (*args, *kwargs.values())):
            # other builtins take plain numbers: a symbolic size is specialized here, with a guard
            args = [specialize(tx, a) for a in args]
            kwargs = {k: specialize(tx, v) for k, v in kwargs.items()}
        if fn in _FOLDABLE and fn not in (sum, bool, len) and _consts(args, kwargs):
            try:
                out = fn(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
            except Exception as e:
                raise Unsupported(f"{self.describe()} raised {type(e).__name__}: {e}") from e
            return tx.wrap_constant(out)
        if fn in (str, repr) and len(args) == 1 and isinstance(args[0], ExceptionVariable):
            return args[0].call_method(tx, f"__{fn.__name__}__", [], {})
        handler = _HANDLERS.get(fn)
        if handler is None and is_plain_exception_class(fn) and not kwargs:
            return ExceptionVariable(fn, args)  # Note [Exceptions the frame raises and catches]
        if handler is None:
            raise Unsupported(f"{self.describe()} with arguments {[a.describe() for a in args]}")
        try:
            return handler(tx, args, kwargs)
        except (TypeError, ValueError) as e:
            raise Unsupported(f"{self.describe()} raised {type(e).__name__}: {e}") from e

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.const(self.fn)

    def getattr(self, tx: Tx, name: str) -> VT:
        if name == "__name__":
            return ConstantVariable(self.fn.__name__)
        if self.fn is itertools.chain and name == "from_iterable":
            return _ChainFromIterable()
        if isinstance(self.fn, type) and self.fn in (dict, list, tuple, set, str, int, float, object):
            return tx.wrap(getattr(self.fn, name), None)
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def getitem(self, tx: Tx, key: VT) -> VT:
        # `list[Tensor]` in a `typing.cast` (torch's foreach optimizers): a type annotation,
        # built from the real classes and used only as a constant
        if self.fn in (list, dict, tuple, set, frozenset, type):
            parts = (
                key.iterate(tx) if isinstance(key.identity(), tuple) or key.python_type() is tuple else [key]
            )
            real = [p.identity() for p in parts]
            if all(isinstance(r, type) or r is None for r in real):
                return ConstantVariable(self.fn[tuple(real) if len(real) > 1 else real[0]])
        raise Unsupported(f"subscript of {self.describe()}")


BUILTINS = builtins


class _ChainFromIterable(VariableTracker):
    """`itertools.chain.from_iterable` (a classmethod: each access makes a new bound method)."""

    def describe(self) -> str:
        return "itertools.chain.from_iterable"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return _chain_from_iterable(tx, args, kwargs)

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{cg.const(itertools.chain)}.from_iterable"
