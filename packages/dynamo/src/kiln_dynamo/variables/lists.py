"""Sequences and iterators: tuples, lists, torch.Size, namedtuples, and list-backed iterators.

A sequence tracker holds a Python list of trackers. Tuples are immutable; a list created in the
frame is mutated freely. A list that came from outside the frame (it has a source) may be
mutated too: the tracker is marked in `SideEffects` and the runner writes the final contents
back into the real list after the graph (`L['xs'][:] = [...]`), so the mutation is visible to
the caller as in eager.

Iterators (`iter`, `zip`, `enumerate`, `reversed`, `map`, `filter`, dict views) are modelled as
a list of trackers and a position: everything a model iterates over is finite and known.

Note [Ordering by constant keys]: `sorted`, `list.sort`, `min` and `max` order items that are
not Python constants (tensors, modules, `(name, tensor)` pairs of `dict.items()`) when what
Python would compare is constant: the key function's result for every item (the key is traced,
called once per item in order, as Python calls it), or, without a key, the first element of
tuples and lists no two of which are equal (Python's lexicographic comparison then never reaches
a second element). The items themselves are returned in that order, never copies; the order is
Python's (a stable sort of the keys; `min`/`max` the first item with the extreme key). Items that
are symbolic sizes (ints, floats of sizes) mixed with numbers are ordered by their values in this
run: each comparison Python's sort makes asks the ShapeEnv, which records its answer as a guard
(`s1 < s0`), so the order holds for every size the graph is reused for (torch guards the order the
same way). Anything else (a key that is a tensor, equal heads, a data-dependent size) is a break,
as before. A constant key that is a type
(`key=str`) is applied too: before, `list.sort` ignored it.
"""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker
from kiln_dynamo.variables.exceptions import observed
from kiln_dynamo.variables.symbolic import SymNodeVariable, set_where

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.source import Source
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker


def _index(key: VT) -> Any:
    from kiln_dynamo.variables.base import SliceVariable

    if isinstance(key, SliceVariable):
        return key.as_constant()
    if key.is_constant():
        k = key.as_constant()
        if isinstance(k, (int, slice)):
            return operator.index(k) if not isinstance(k, slice) else k
    raise Unsupported(f"sequence index {key.describe()} is not a constant int or slice")


class BaseListVariable(VariableTracker):
    def __init__(self, items: list[VT], source: Any = None) -> None:
        self.items = list(items)
        self.source = source

    def new(self, items: list[VT]) -> BaseListVariable:
        return type(self)(items)

    def describe(self) -> str:
        return f"{self.python_type().__name__} of {len(self.items)}"

    def is_constant(self) -> bool:
        return all(i.is_constant() for i in self.items)

    def as_constant(self) -> Any:
        vals = [i.as_constant() for i in self.items]
        return self.python_type()(vals)

    def truth(self, tx: Tx) -> bool:
        return bool(self.items)

    def length(self, tx: Tx) -> int:
        return len(self.items)

    def iterate(self, tx: Tx) -> list[VT]:
        return list(self.items)

    def getitem(self, tx: Tx, key: VT) -> VT:
        idx = _index(key)
        if isinstance(idx, slice):
            return self.new(self.items[idx])
        try:
            return self.items[idx]
        except IndexError as e:
            raise Unsupported(f"index {idx} out of range for {self.describe()}") from e

    def contains(self, tx: Tx, value: VT) -> bool:
        return any(tx.values_equal(i, value) for i in self.items)

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name == "index" and len(args) == 1:
            for i, item in enumerate(self.items):
                if tx.values_equal(item, args[0]):
                    return ConstantVariable(i)
            raise Unsupported("list.index: value not found")
        if name == "count" and len(args) == 1:
            return ConstantVariable(sum(tx.values_equal(i, args[0]) for i in self.items))
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(self.contains(tx, args[0]))
        raise Unsupported(f"method {name} of {self.describe()}")

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.source is not None:
            return cg.source(self.source)  # a mutated input list is rewritten in place (codegen)
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        inner = ", ".join(i.reconstruct(cg) for i in self.items)
        return self.rebuild(cg, inner)

    def rebuild(self, cg: Reconstructor, inner: str) -> str:
        raise NotImplementedError


class TupleVariable(BaseListVariable):
    def python_type(self) -> type:
        return tuple

    def rebuild(self, cg: Reconstructor, inner: str) -> str:
        return f"({inner},)" if len(self.items) == 1 else f"({inner})"

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.source is not None:
            return cg.source(self.source)
        return self.rebuild(cg, ", ".join(i.reconstruct(cg) for i in self.items))


class SizeVariable(TupleVariable):
    def python_type(self) -> type:
        return torch.Size

    def rebuild(self, cg: Reconstructor, inner: str) -> str:
        return f"{cg.const(torch.Size)}([{inner}])"

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name == "numel":
            return ConstantVariable(torch.Size(self.as_constant()).numel())
        return super().call_method(tx, name, args, kwargs)


class NamedTupleVariable(TupleVariable):
    """A namedtuple (or torch.return_types structseq) whose fields are trackers."""

    def __init__(self, items: list[VT], cls: type, source: Any = None) -> None:
        super().__init__(items, source)
        self.cls = cls

    def new(self, items: list[VT]) -> BaseListVariable:
        return TupleVariable(items)

    def python_type(self) -> type:
        return self.cls

    def fields(self) -> tuple[str, ...]:
        f = getattr(self.cls, "_fields", None)
        if f is None:  # a structseq (torch.return_types): fields are member descriptors, in order
            f = tuple(k for k, v in vars(self.cls).items() if type(v).__name__ == "member_descriptor")
        return tuple(f)

    def as_constant(self) -> Any:
        vals = [i.as_constant() for i in self.items]
        return self.cls(*vals) if hasattr(self.cls, "_fields") else self.cls(vals)

    def getattr(self, tx: Tx, name: str) -> VT:
        fields = self.fields()
        if name in fields:
            return self.items[fields.index(name)]
        if name == "_fields":
            return tx.wrap_constant(fields)
        if callable(getattr(self.cls, name, None)):
            from kiln_dynamo.variables.base import MethodVariable

            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of namedtuple {self.cls.__name__}")

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name == "_replace" and not args:
            fields = self.fields()
            items = list(self.items)
            for k, v in kwargs.items():
                items[fields.index(k)] = v
            return NamedTupleVariable(items, self.cls)
        if name == "_asdict":
            from kiln_dynamo.variables.dicts import DictVariable

            return DictVariable({k: v for k, v in zip(self.fields(), self.items, strict=True)})
        return super().call_method(tx, name, args, kwargs)

    def rebuild(self, cg: Reconstructor, inner: str) -> str:
        if hasattr(self.cls, "_fields"):
            return f"{cg.const(self.cls)}({inner})"
        return f"{cg.const(self.cls)}([{inner}])"


class ListVariable(BaseListVariable):
    def __init__(
        self, items: list[VT], source: Any = None, realize: Callable[[], list[VT]] | None = None
    ) -> None:
        self._realize = realize  # an outside list not read yet (Note [Lists read only when needed])
        self.appended: list[VT] = []  # what the frame appended to it before reading it
        super().__init__(items, source)

    @property
    def items(self) -> list[VT]:
        if self._realize is not None:
            realize, self._realize = self._realize, None
            self._items = realize() + self.appended
        return self._items

    @items.setter
    def items(self, items: list[VT]) -> None:
        self._items = items

    @property
    def unread(self) -> bool:
        """Only appended to since the frame entered: the runner replays `extend(appended)`."""
        return self._realize is not None

    def describe(self) -> str:
        return "list" if self.unread else super().describe()

    def python_type(self) -> type:
        return list

    def rebuild(self, cg: Reconstructor, inner: str) -> str:
        return f"[{inner}]"

    def _mutate(self, tx: Tx) -> None:
        tx.output.side_effects.mutated(self)

    def setitem(self, tx: Tx, key: VT, value: VT) -> None:
        idx = _index(key)
        self._mutate(tx)
        if isinstance(idx, slice):
            self.items[idx] = value.iterate(tx)
        else:
            self.items[idx] = value

    def delitem(self, tx: Tx, key: VT) -> None:
        self._mutate(tx)
        del self.items[_index(key)]

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        none = ConstantVariable(None)
        if name == "append" and len(args) == 1:
            self._mutate(tx)
            (self.appended if self.unread else self.items).append(args[0])
            return none
        if name == "extend" and len(args) == 1:
            self._mutate(tx)
            (self.appended if self.unread else self.items).extend(args[0].iterate(tx))
            return none
        if name == "insert" and len(args) == 2:
            self._mutate(tx)
            self.items.insert(args[0].as_constant(), args[1])
            return none
        if name == "pop":
            self._mutate(tx)
            return self.items.pop(args[0].as_constant() if args else -1)
        if name == "clear":
            self._mutate(tx)
            self.items.clear()
            return none
        if name == "reverse":
            self._mutate(tx)
            self.items.reverse()
            return none
        if name == "remove" and len(args) == 1:
            for i, item in enumerate(self.items):
                if tx.values_equal(item, args[0]):
                    self._mutate(tx)
                    del self.items[i]
                    return none
            raise Unsupported("list.remove: value not found")
        if name == "copy":
            return ListVariable(list(self.items))
        if name == "sort" and not args:
            order = sort_order(tx, self.items, kwargs, "list.sort")
            self._mutate(tx)
            self.items = [self.items[k] for k in order]
            return none
        return super().call_method(tx, name, args, kwargs)


class DequeVariable(ListVariable):
    """A `collections.deque` made in the frame: a list of trackers with deque's methods and its
    bound (`maxlen`: appending to a full deque drops an item from the other end, as deque does).
    Indexing takes an int only (a deque has no slices). A deque from outside the frame is not
    modelled (it breaks where it is read)."""

    def __init__(self, items: list[VT], maxlen: int | None) -> None:
        super().__init__(items)
        self.maxlen = maxlen

    def describe(self) -> str:
        return f"deque of {len(self.items)}"

    def python_type(self) -> type:
        return collections.deque

    def as_constant(self) -> Any:
        return collections.deque([i.as_constant() for i in self.items], self.maxlen)

    def new(self, items: list[VT]) -> BaseListVariable:
        return DequeVariable(items, self.maxlen)

    def getattr(self, tx: Tx, name: str) -> VT:
        if name == "maxlen":
            return ConstantVariable(self.maxlen)
        return super().getattr(tx, name)

    def getitem(self, tx: Tx, key: VT) -> VT:
        if isinstance(_index(key), slice):
            raise Unsupported("slicing a deque (CPython raises TypeError)")
        return super().getitem(tx, key)

    def setitem(self, tx: Tx, key: VT, value: VT) -> None:
        if isinstance(_index(key), slice):
            raise Unsupported("slicing a deque (CPython raises TypeError)")
        super().setitem(tx, key, value)

    def delitem(self, tx: Tx, key: VT) -> None:
        if isinstance(_index(key), slice):
            raise Unsupported("slicing a deque (CPython raises TypeError)")
        super().delitem(tx, key)

    def _add(self, items: list[VT], left: bool) -> None:
        for item in items:
            if self.maxlen == 0:
                return
            if left:
                self.items.insert(0, item)
                if self.maxlen is not None and len(self.items) > self.maxlen:
                    self.items.pop()
            else:
                self.items.append(item)
                if self.maxlen is not None and len(self.items) > self.maxlen:
                    self.items.pop(0)

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        none = ConstantVariable(None)
        if kwargs:
            raise Unsupported(f"deque.{name} with keyword arguments")
        if name in ("append", "appendleft") and len(args) == 1:
            self._add([args[0]], name == "appendleft")
            return none
        if name in ("extend", "extendleft") and len(args) == 1:
            items = args[0].iterate(tx) if args[0] is not self else list(self.items)
            self._add(items, name == "extendleft")
            return none
        if name in ("pop", "popleft") and not args:
            if not self.items:
                raise observed(IndexError, f"{name} from an empty deque")
            return self.items.pop(-1 if name == "pop" else 0)
        if name == "rotate" and len(args) <= 1:
            n = args[0].as_constant() if args else 1
            if not isinstance(n, int) or not (args[0].is_constant() if args else True):
                raise Unsupported("deque.rotate by a count that is not a constant int")
            if self.items:
                n %= len(self.items)
                self.items = self.items[-n:] + self.items[:-n] if n else self.items
            return none
        if name == "copy" and not args:
            return DequeVariable(list(self.items), self.maxlen)
        if name in ("clear", "reverse", "remove", "count", "index", "__len__", "__getitem__", "__contains__"):
            return super().call_method(tx, name, args, kwargs)
        raise Unsupported(f"method {name} of a deque")

    def rebuild(self, cg: Reconstructor, inner: str) -> str:
        return f"{cg.const(collections.deque)}([{inner}], {self.maxlen!r})"


def sort_keys(tx: Tx, items: list[VariableTracker], key: VariableTracker | None, what: str) -> list[Any]:
    """The Python values that order `items`, as `sorted`/`min`/`max`/`list.sort` compare them
    (Note [Ordering by constant keys])."""
    if key is not None and not (key.is_constant() and key.as_constant() is None):
        keys = [key.call(tx, [item], {}) for item in items]
        if not all(k.is_constant() for k in keys):
            raise Unsupported(f"{what} with a key that is not a Python constant for every item")
        return [k.as_constant() for k in keys]
    if all(i.is_constant() for i in items):
        return [i.as_constant() for i in items]
    if all(_orderable_number(i) for i in items):
        return [_GuardedKey(tx, i, what) for i in items]  # Note [Ordering by constant keys]
    if all(isinstance(i, BaseListVariable) and i.items and i.items[0].is_constant() for i in items):
        heads = [i.items[0].as_constant() for i in items]  # type: ignore[attr-defined]
        if not any(a is b or a == b for k, a in enumerate(heads) for b in heads[k + 1 :]):
            return [(h,) for h in heads]  # heads no two of which are equal decide every comparison
    raise Unsupported(f"{what} of values that are not Python constants")


def _orderable_number(item: VariableTracker) -> bool:
    if isinstance(item, SymNodeVariable):
        return item.python_type() in (int, float)
    return item.is_constant() and type(item.as_constant()) in (int, float)


class _GuardedKey:
    """A number or symbolic size as a sort key: each comparison is answered by the ShapeEnv,
    which guards it (Note [Ordering by constant keys])."""

    __slots__ = ("tx", "value", "what")

    def __init__(self, tx: Tx, item: VariableTracker, what: str) -> None:
        self.tx, self.what = tx, what
        self.value = item.value if isinstance(item, SymNodeVariable) else item.as_constant()

    def _compare(self, op: Callable[[Any, Any], Any], other: _GuardedKey) -> bool:
        from kiln_symbolic import GuardOnDataDependent

        set_where(self.tx)
        try:
            return bool(op(self.value, other.value))
        except GuardOnDataDependent as e:
            raise Unsupported(f"{self.what} of sizes computed from tensor data") from e

    def __lt__(self, other: _GuardedKey) -> bool:
        return self._compare(operator.lt, other)

    def __gt__(self, other: _GuardedKey) -> bool:
        return self._compare(operator.gt, other)


def sort_order(
    tx: Tx, items: list[VariableTracker], kwargs: dict[str, VariableTracker], what: str
) -> list[int]:
    """Positions of `items` in sorted order (stable, as Python's sort)."""
    if set(kwargs) - {"key", "reverse"} or not all(v.is_constant() for k, v in kwargs.items() if k != "key"):
        raise Unsupported(f"{what} with arguments {sorted(kwargs)}")
    keys = sort_keys(tx, items, kwargs.get("key"), what)
    reverse = bool(kwargs["reverse"].as_constant()) if "reverse" in kwargs else False
    return sorted(range(len(items)), key=keys.__getitem__, reverse=reverse)


def _identity(x: Any) -> Any:
    return x


def _always(x: Any) -> bool:
    return True


def _generator(items: tuple[Any, ...]) -> Any:
    yield from items


# the type eager's iterator of each kind has (`isinstance(params, torch.Tensor)` on a
# `module.parameters()` generator must answer as eager does)
_ITERATOR_TYPES: dict[str, type] = {
    "tuple": type(iter(())),
    "list": type(iter([])),
    "zip": zip,
    "enumerate": enumerate,
    "map": map,
    "filter": filter,
    "reversed": type(reversed([])),
    "chain": itertools.chain,
    "islice": itertools.islice,
    "generator": type(_generator(())),
    "deque": type(iter(collections.deque())),
    "deque_reversed": type(reversed(collections.deque())),
}


class ListIteratorVariable(VariableTracker):
    """An iterator over items known at trace time. ``kind`` says what eager would have made
    (Note [Iterators keep their type]): ``iter`` of a tuple (the default), ``list``, ``zip``,
    ``enumerate``, ``map``, ``filter``, ``reversed`` (of a list), ``chain``, ``islice``,
    ``generator``, ``deque``, ``deque_reversed``."""

    def __init__(self, items: list[VT], kind: str = "tuple", over: ListVariable | None = None) -> None:
        self._items = items
        self.over = over  # a list made or read by the frame: read live (Note [Lazy iterators])
        self.ended = False
        self.index = 0
        self.kind = kind

    @property
    def items(self) -> list[VT]:
        return self.over.items if self.over is not None else self._items

    @items.setter
    def items(self, items: list[VT]) -> None:
        self._items = items
        self.over = None

    def describe(self) -> str:
        return "iterator"

    def python_type(self) -> type:
        return _ITERATOR_TYPES.get(self.kind, type(iter(())))

    def next(self, tx: Tx) -> VT | None:
        if self.ended or self.index >= len(self.items):
            self.ended = True  # an exhausted list iterator stays so, as CPython's
            return None
        item = self.items[self.index]
        self.index += 1
        return item

    def iterate(self, tx: Tx) -> list[VT]:
        if self.ended:
            return []
        rest = self.items[self.index :]
        self.index = len(self.items)
        self.ended = True
        return rest

    def rebuild_parts(self) -> list[VT]:
        """What its rebuild reconstructs (for Note [One object, one rebuild]): the live list it
        reads, or the items it has left."""
        if self.over is not None and self.kind == "list" and not self.ended:
            return [self.over]
        return self.items[self.index :]

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name == "__next__":
            item = self.next(tx)
            if item is None:
                raise observed(StopIteration)
            return item
        if name == "__iter__":
            return self
        raise Unsupported(f"method {name} of an iterator")

    def reconstruct(self, cg: Reconstructor) -> str:
        """An iterator that crosses a split (the iterable of a loop the frame splits before:
        `enumerate(self.layers)`) leaves as an iterator over the items it has left, which a
        `for` loop, `next` and `list` consume as they would the original."""
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        if self.over is not None and self.kind == "list" and not self.ended:
            # Note [Iterators that leave the frame over a live list]
            return f"{cg.const(list_iterator_at)}({self.over.reconstruct(cg)}, {self.index})"
        items = self.items[self.index :]

        def tup(values: list[str]) -> str:
            return f"({', '.join(values)}{',' if len(values) == 1 else ''})"

        # Note [Iterators keep their type]: an iterator that leaves the frame (returned, stored)
        # is rebuilt as the type eager made, over the items it has left; a kind without an exact
        # rebuild (itertools.product, pairwise, accumulate) stays a tuple iterator
        kind = self.kind
        if kind == "zip" and all(isinstance(i, TupleVariable) for i in items):
            widths = {len(i.items) for i in items}  # type: ignore[attr-defined]
            if len(widths) <= 1:
                width = widths.pop() if widths else 0
                cols = [tup([i.items[c].reconstruct(cg) for i in items]) for c in range(width)]  # type: ignore[attr-defined]
                return f"{cg.const(zip)}({', '.join(cols)})"
        if kind == "enumerate" and all(
            isinstance(i, TupleVariable) and len(i.items) == 2 and i.items[0].is_constant() for i in items
        ):
            start = items[0].items[0].as_constant() if items else 0  # type: ignore[attr-defined]
            values = tup([i.items[1].reconstruct(cg) for i in items])  # type: ignore[attr-defined]
            return f"{cg.const(enumerate)}({values}, {start!r})"
        rest = [i.reconstruct(cg) for i in items]
        if kind == "list":
            return f"{cg.const(iter)}([{', '.join(rest)}])"
        if kind == "reversed":  # of a list: a list_reverseiterator over the rest, in order
            return f"{cg.const(reversed)}([{', '.join(reversed(rest))}])"
        if kind == "map":
            return f"{cg.const(map)}({cg.const(_identity)}, {tup(rest)})"
        if kind == "filter":
            return f"{cg.const(filter)}({cg.const(_always)}, {tup(rest)})"
        if kind == "chain":
            return f"{cg.const(itertools.chain)}({tup(rest)})"
        if kind == "islice":
            return f"{cg.const(itertools.islice)}({tup(rest)}, None)"
        if kind == "deque":
            return f"{cg.const(iter)}({cg.const(collections.deque)}({tup(rest)}))"
        if kind == "deque_reversed":
            return f"{cg.const(reversed)}({cg.const(collections.deque)}({tup(list(reversed(rest)))}))"
        if kind == "generator":
            return f"{cg.const(_generator)}({tup(rest)})"
        return f"{cg.const(iter)}({tup(rest)})"


# Note [Lazy iterators]: CPython's iterators compute each item when it is asked for: `iter(l)`
# of a list reads `l[i]` at each step (an append made before the end is seen), `map(f, xs)` calls
# `f` at each step, `zip`, `enumerate`, `filter`, `reversed(l)`, `itertools.chain`, `islice`,
# `accumulate` and `pairwise` pull from their arguments' iterators at each step. Computed where
# they were made, they read a list mutated, a variable rebound or a tensor changed in place
# between creation and consumption with its old value (a wrong answer with no break). So:
# an iterator over a list the frame holds (`ListVariable`) keeps the list (`over`) and reads
# it at each step, and the others are `LazyIteratorVariable`s whose `pull` computes the next
# item from their sub-iterators when a consumer asks (a FOR_ITER, `next`, `sum`, `list`). An
# iterator that leaves the frame unfinished (a split, a return) is rebuilt over the items it has
# left, computed then, when computing them runs nothing of the user's (`pure`: no function is
# called, no outside iterator is advanced); otherwise that is a break ("evaluated lazily").
# Tuples, ranges, strings and torch's module containers are read when the iterator is made:
# the frame cannot change them.
# Note [Iterators that leave the frame over a live list]: an iterator the frame made over a list
# reads that list at each step in eager, after the frame too: one stored in a global and consumed
# by the next call sees what was appended in between. Rebuilt over the items it had left at the
# frame's exit, it missed that (a stale answer, found by the eighteenth session's staleness
# sweep). So a list iterator (`iter(l)`, a for-loop's) that leaves unfinished is rebuilt over the
# list itself at its position (`list_iterator_at`, CPython's own `__setstate__`), the list being
# the outside one or the frame's one rebuild of it (Note [One object, one rebuild]); `reversed(l)`
# likewise; `zip` and `enumerate` over such iterators are rebuilt over their parts' rebuilds.
# Another lazy kind (`chain`, `islice`, `pairwise`, ...) reading a live list that leaves unfinished
# is a break ("evaluated lazily"), as one that calls the user's code is.
# A dict iterator likewise: Note [Dict iterators that leave the frame].
def list_iterator_at(seq: list[Any], index: int) -> Any:
    """`iter(seq)` advanced to `index`, without reading its items."""
    it: Any = iter(seq)
    it.__setstate__(index)
    return it


def list_reverseiterator_at(seq: list[Any], index: int) -> Any:
    """`reversed(seq)` whose next item is `seq[index]` (ended when the index is out of range)."""
    if not 0 <= index < len(seq):
        return reversed([])
    it: Any = reversed(seq)
    it.__setstate__(index)
    return it


def is_live(it: VT) -> bool:
    """Whether `it` reads a list at each step and has not ended (Note [Iterators that leave the
    frame over a live list])."""
    if isinstance(it, LazyIteratorVariable):
        return it.live and not it.ended
    return isinstance(it, ListIteratorVariable) and it.over is not None and not it.ended


def _drain(it: ListIteratorVariable, tx: Tx) -> list[VT]:
    """Every item `it.next` has left, pulled one by one (each pull may run traced code)."""
    out = []
    while (item := it.next(tx)) is not None:
        out.append(item)
    return out


class LazyIteratorVariable(ListIteratorVariable):
    """An iterator computed item by item as its consumer asks (Note [Lazy iterators]). `parts`
    are the iterators it pulls from; `rebuild` renders it exactly over their rebuilds, where
    that is needed and possible (Note [Iterators that leave the frame over a live list])."""

    def __init__(
        self,
        kind: str,
        pull: Callable[[Tx], VT | None],
        pure: bool,
        parts: Sequence[VT] = (),
        rebuild: Callable[[Reconstructor], str] | None = None,
        live: bool = False,
    ) -> None:
        super().__init__([], kind)
        self.pull = pull
        self.pure = pure
        self.parts = list(parts)
        self.rebuild = rebuild
        self.live = live or any(is_live(p) for p in parts)

    def _exact(self) -> bool:
        return self.live and not self.ended and not self._items and self.rebuild is not None

    def rebuild_parts(self) -> list[VT]:
        return self.parts if self._exact() else super().rebuild_parts()

    def reconstruct(self, cg: Reconstructor) -> str:
        bound = cg.bound(self)
        if bound is not None:
            return bound
        if self._exact():
            assert self.rebuild is not None
            return self.rebuild(cg)
        return super().reconstruct(cg)

    def describe(self) -> str:
        return f"{self.kind} iterator"

    def next(self, tx: Tx) -> VT | None:
        if self.index < len(self._items):  # items computed for a rebuild (`items`)
            self.index += 1
            return self._items[self.index - 1]
        if self.ended:
            return None
        item = self.pull(tx)
        if item is None:
            self.ended = True
        return item

    def iterate(self, tx: Tx) -> list[VT]:
        return _drain(self, tx)

    @property
    def items(self) -> list[VT]:
        """The items it has left, computed now (for its rebuild when it leaves the frame)."""
        if not self.ended:
            if not self.pure or (self.live and self.rebuild is None):
                raise Unsupported(
                    f"a {self.kind} iterator made in the frame, evaluated lazily, leaves it unfinished"
                    + (" (it reads a list at each step)" if self.pure else "")
                )
            rest = self._items[self.index :]
            while (item := self.pull(None)) is not None:  # type: ignore[arg-type]
                rest.append(item)
            self._items, self.index, self.ended = rest, 0, True
        return self._items

    @items.setter
    def items(self, items: list[VT]) -> None:
        self._items = items


def is_pure_iterator(it: VT) -> bool:
    """Whether computing `it`'s items runs nothing of the user's (Note [Lazy iterators])."""
    if isinstance(it, LazyIteratorVariable):
        return it.pure
    return type(it) is ListIteratorVariable


def iterator_of(tx: Tx, v: VT) -> ListIteratorVariable:
    """`iter(v)` as CPython makes it: a list read live, an iterator itself, anything else read now."""
    if isinstance(v, ListIteratorVariable):
        return v
    if isinstance(v, ListVariable) and v.python_type() is list:
        return ListIteratorVariable([], "list", over=v)
    from kiln_dynamo.variables.dicts import DictVariable, DictViewVariable

    d = v.d if isinstance(v, DictViewVariable) else v
    if isinstance(d, DictVariable) and type(d) is DictVariable:
        # a dict's iterator: its keys in order, each value read at its step; eager raises
        # RuntimeError at the step after the dict changed size (a break here)
        view = v.kind if isinstance(v, DictViewVariable) else "keys"
        d.iterate(tx)  # a dict class's own __iter__ is a break there
        return DictIteratorVariable(d, view)
    kind = "deque" if isinstance(v, DequeVariable) else "tuple"
    return ListIteratorVariable(v.iterate(tx), kind)


# Note [Dict iterators that leave the frame]: a dict iterator the frame made (`iter(d.values())`,
# `iter(d.items())`, `iter(d)`, a for-loop's) reads each value at its step in eager, after the frame
# too, and raises RuntimeError at the next step once the dict's size has changed. Rebuilt over a
# copy of the items it had left at the frame's exit, the next call read a value set in between
# with its old value, and a key added in between raised nothing (a stale answer; the eighteenth
# session's staleness sweep). CPython's dict iterators have no `__setstate__`, so one that leaves
# unfinished is rebuilt over the dict itself (the outside one, or the frame's one rebuild of it,
# Note [One object, one rebuild]) and advanced by the steps it took (`dict_iterator_at`): its
# next item, the values it reads and its size check are then eager's. That is exact when the dict
# holds, at the exit, the keys the iterator started over, in that order (checked while tracing;
# an outside dict's keys are guarded): anything else (a key added, removed or moved by the frame
# after the iterator was made, on which eager raises or skips) is a break. An exhausted one
# leaves as an empty iterator of its type. Not modelled: eager's iterator keeps a position in
# the dict's entry table, which a resize (an insertion between calls that keeps the size, after
# a deletion) moves under it; the rebuild's position is the same logical one, not the same slot.
class DictIteratorVariable(LazyIteratorVariable):
    """`iter` of a dict or of its keys/values/items view, made in the frame: each value read at
    its step (Note [Lazy iterators]), rebuilt over the live dict when it leaves unfinished
    (Note [Dict iterators that leave the frame])."""

    def __init__(self, d: Any, view: str) -> None:
        self.d = d
        self.view = view
        self.order = list(d._items)
        self.pos = 0
        super().__init__("tuple", self._pull, True, [d], self._rebuild, live=True)

    def _base(self) -> type:
        """The class whose view method eager's iterator came from (a dict subclass that does not
        override it iterates as dict does)."""
        return collections.OrderedDict if issubclass(self.d.user_cls, collections.OrderedDict) else dict

    def python_type(self) -> type:
        return type(iter(getattr(self._base()(), self.view)()))

    def describe(self) -> str:
        return f"dict {self.view} iterator"

    def _pull(self, tx: Tx) -> VT | None:
        from kiln_dynamo.variables.dicts import key_vt

        if len(self.d._items) != len(self.order):
            raise Unsupported("a dict changed size during iteration (RuntimeError in eager)")
        if self.pos >= len(self.order):
            return None
        k = self.order[self.pos]
        if k not in self.d._items:
            raise Unsupported("a dict's keys changed during iteration")
        self.pos += 1
        if self.view == "keys":
            return key_vt(k)
        value = self.d.entry(k)
        return value if self.view == "values" else TupleVariable([key_vt(k), value])

    def _rebuild(self, cg: Reconstructor) -> str:
        if list(self.d._items) != self.order:
            raise Unsupported(
                "a dict iterator made in the frame leaves it unfinished over a dict whose keys changed"
                " after it was made"
            )
        view = f"{cg.const(self._base())}.{self.view}"
        return f"{cg.const(dict_iterator_at)}({view}, {self.d.reconstruct(cg)}, {self.pos})"

    def reconstruct(self, cg: Reconstructor) -> str:
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        if self._exact():
            return self._rebuild(cg)
        if self.ended and self.index >= len(self._items):  # exhausted: an empty one of its type
            return f"{cg.const(iter)}({cg.const(self._base())}().{self.view}())"
        raise Unsupported("a dict iterator made in the frame leaves it unfinished after its rest was read")


def dict_iterator_at(view: Callable[[Any], Any], d: Any, steps: int) -> Any:
    """`iter(view(d))` advanced by `steps` (Note [Dict iterators that leave the frame])."""
    it = iter(view(d))
    for _ in range(steps):
        next(it)
    return it


# Note [Iterators over a dict from outside]: a frame can receive a live iterator over a dict or
# an OrderedDict (`iter(d.items())`, `keys()`, `values()`, or the dict itself): a comprehension's
# `.0` when the frame that made it runs as plain Python (transformers' `{k: v for k, v in
# output.items() if ...}` over a ModelOutput, an OrderedDict), or an iterator a caller hands on.
# The items it has left are read without advancing it through its `__reduce__`, which CPython
# defines for these types as `(iter, (list of the rest,))`: that list is wrapped as an outside
# list (its length and items guarded at each call, through `IteratorRestSource`), and the frame
# iterates over it. The real iterator is not touched by tracing; what the frame consumed is
# replayed on it after the graph (`advance_iterator`: `n` steps, or to its end when the frame
# saw the end), and it leaves the frame (a split, a return) as itself, so the frame's caller
# and the continuation see it as eager leaves it. Not modelled: a frame that resizes the dict
# while iterating (eager raises RuntimeError at the next step; the trace iterates the snapshot).
# A list or tuple iterator is read the same way (its `__reduce__` is `(iter, (sequence,),
# position)`): a 3.11 comprehension called by a frame that runs as Python (transformers'
# `{f: framework_to_test[f] for f in frameworks}` in `is_tensor`, under a ModelOutput made by the
# runner) was a frame left to Python ("for-loop over list_iterator object"). A list iterator reads
# its list at each step, so a frame that changes that list (reached another way: the builder
# wraps the list itself, one variable per object) cannot use the snapshot: `next` is then a
# break, never a stale item.
class OutsideIteratorVariable(ListIteratorVariable):
    """A dict, OrderedDict, list or tuple iterator from outside the frame (Note [Iterators over
    a dict from outside]): its rest read at entry, its consumption replayed on it after the
    graph; `backing` is the list a list iterator runs over."""

    def __init__(self, items: list[VT], cls: type, source: Source, backing: VT | None = None) -> None:
        super().__init__(items)
        self.cls = cls
        self.source: Source = source
        self.exhausted = False
        self.backing = backing

    def _check_backing(self, tx: Tx) -> None:
        if self.backing is not None and tx.output.side_effects.is_mutated(self.backing):
            raise Unsupported(
                "a list iterator from outside the frame runs over a list the frame changed",
                advice="iterate over a copy of the list",
            )

    def describe(self) -> str:
        return f"{self.cls.__name__} from outside"

    def python_type(self) -> type:
        return self.cls

    def next(self, tx: Tx) -> VT | None:
        self._check_backing(tx)
        tx.output.side_effects.mutated(self)
        item = super().next(tx)
        self.exhausted = item is None
        return item

    def iterate(self, tx: Tx) -> list[VT]:
        self._check_backing(tx)
        tx.output.side_effects.mutated(self)
        self.exhausted = True
        return super().iterate(tx)

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.source)  # itself, advanced after the graph as the frame advanced it


def advance_iterator(it: Any, steps: int, to_end: bool) -> None:
    """Replay on a real iterator what the frame consumed (Note [Iterators over a dict from outside])."""
    for _ in range(steps):
        next(it)
    if to_end:
        for _ in it:  # (none left: the guards saw the rest the frame consumed) marks it exhausted
            pass


class CountIteratorVariable(ListIteratorVariable):
    """`itertools.count(start, step)` made in the frame, with constant numbers: `next`, a `for`
    loop (that breaks out), `islice(count(), n)` and `zip` with a finite iterable take its values
    one by one; iterating all of it (`list(count())`, which never ends in eager) is a break. It
    leaves the frame as `itertools.count(<next value>, step)`."""

    def __init__(self, start: Any, step: Any) -> None:
        super().__init__([], "count")
        self.start = start
        self.step = step

    def describe(self) -> str:
        return "itertools.count"

    def python_type(self) -> type:
        return itertools.count

    def current(self) -> Any:
        return self.start + self.index * self.step

    def next(self, tx: Tx) -> VT | None:
        value = self.current()
        self.index += 1
        return ConstantVariable(value)

    def take(self, n: int) -> list[VT]:
        out: list[VT] = []
        for _ in range(n):
            out.append(ConstantVariable(self.current()))
            self.index += 1
        return out

    def iterate(self, tx: Tx) -> list[VT]:
        raise Unsupported("iterating the whole of an itertools.count (it never ends)")

    def reconstruct(self, cg: Reconstructor) -> str:
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        return f"{cg.const(itertools.count)}({self.current()!r}, {self.step!r})"


class IsliceCountVariable(ListIteratorVariable):
    """`itertools.islice(count, start, stop, step)` of an `itertools.count` made in the frame: it
    takes from the count only as it is consumed, skipping and stopping as islice does, so the
    count's later values are eager's."""

    def __init__(self, count: CountIteratorVariable, start: int, stop: int, step: int) -> None:
        super().__init__([], "islice")
        self.count = count
        self.taken = 0  # islice's `cnt`: values taken from the count
        self.next_at = start  # islice's `next`: the position of the next value it yields
        self.stop = stop
        self.step = step

    def next(self, tx: Tx) -> VT | None:
        while self.taken < self.next_at:
            self.count.take(1)
            self.taken += 1
        if self.taken >= self.stop:
            return None
        (item,) = self.count.take(1)
        self.taken += 1
        self.next_at = min(self.next_at + self.step, self.stop)
        return item

    def iterate(self, tx: Tx) -> list[VT]:
        return _drain(self, tx)

    def reconstruct(self, cg: Reconstructor) -> str:
        bound = cg.bound(self)  # Note [One object, one rebuild] in codegen.py
        if bound is not None:
            return bound
        skip, stop = self.next_at - self.taken, self.stop - self.taken
        return f"{cg.const(itertools.islice)}({self.count.reconstruct(cg)}, {skip}, {stop}, {self.step})"
