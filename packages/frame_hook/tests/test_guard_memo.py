"""Guard memos (Note [Skipping what did not change] in guard_memo.c): a tree that skips what its
witnesses say did not change answers exactly as the same tree without a memo, and as the Python
expressions it stands for, through a seeded fuzz of mutations of a module-like object graph."""

from __future__ import annotations

import math
import random
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest

from kiln_frame_hook import GuardOp as O
from kiln_frame_hook import GuardTree, op


class Hooks(OrderedDict):  # type: ignore[type-arg]
    pass


class Mod:
    """Looks up attributes as nn.Module does: instance dict, then a __getattr__ over its dicts."""

    scale = 2

    def __init__(self, depth: int) -> None:
        modules: dict[str, Mod] = {}
        # through the dict: the fuzz may have put a property on the class
        self.__dict__.update(
            _modules=modules,
            _parameters={"w": object(), "b": None},
            _hooks=OrderedDict(),
            stride=(1, 2),
            eps=1e-5,
            name="m",
            items=[1, 2],
            training=True,
        )
        if depth:
            self._modules["a"] = Mod(depth - 1)
            self._modules["b"] = Mod(depth - 1)

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__.get("_modules", {}):
            return self.__dict__["_modules"][name]
        raise AttributeError(name)

    def forward(self) -> int:
        return 1


class OtherMod(Mod):
    pass


def step(value: Any, s: tuple[Any, ...]) -> Any:
    kind = s[0]
    if kind == "attr":
        return getattr(value, s[1])
    if kind == "objattr":
        return object.__getattribute__(value, s[1])
    if kind == "item":
        return value[s[1]]
    if kind == "type":
        return type(value)
    raise AssertionError(kind)


LOADS = {"attr": O.LOAD_ATTR, "objattr": O.LOAD_OBJATTR, "item": O.LOAD_ITEM, "type": O.LOAD_TYPE}


def check_py(value: Any, c: tuple[Any, ...]) -> bool:
    kind, arg = c
    return bool(
        {
            "type_is": lambda: type(value) is arg,
            "is": lambda: value is arg,
            "eq": lambda: value == arg,
            "len": lambda: len(value) == arg,
            "falsy": lambda: not value,
            "not_in": lambda: arg not in value,
            "keys": lambda: list(value.keys()) == arg,
            "item_types": lambda: tuple(map(type, value)) == arg,
        }[kind]()
    )


CHECKS = {
    "type_is": O.TYPE_IS,
    "is": O.IS,
    "eq": O.EQ,
    "len": O.LEN_EQ,
    "falsy": O.FALSY,
    "not_in": O.NOT_IN,
    "keys": O.KEYS_EQ,
    "item_types": O.ITEM_TYPES,
}


def paths(depth: int) -> list[tuple[tuple[Any, ...], ...]]:
    """Sources below the root, as steps; each module's attributes like kiln_dynamo guards them."""
    out: list[tuple[tuple[Any, ...], ...]] = []

    def module(prefix: tuple[tuple[Any, ...], ...], d: int) -> None:
        out.append(prefix)
        for attr in ("_hooks", "stride", "eps", "name", "items", "training", "__dict__", "_parameters"):
            out.append((*prefix, ("attr", attr)))
        out.append((*prefix, ("objattr", "__dict__")))
        out.append((*prefix, ("attr", "_parameters"), ("item", "w")))
        out.append((*prefix, ("attr", "_parameters"), ("item", "b")))
        out.append((*prefix, ("attr", "stride"), ("item", 0)))
        out.append((*prefix, ("attr", "items"), ("item", 0)))
        out.append((*prefix, ("type",)))
        out.append((*prefix, ("type",), ("attr", "forward")))
        out.append((*prefix, ("type",), ("attr", "scale")))
        if d:
            for child in ("a", "b"):
                module((*prefix, ("attr", "_modules"), ("item", child)), d - 1)

    module((), depth)
    return out


def checks_for(value: Any) -> list[tuple[str, Any]]:
    """The checks kiln_dynamo would make on a value like this one, as they hold now."""
    cs: list[tuple[str, Any]] = [("type_is", type(value))]
    if isinstance(value, (int, float, str, tuple)) or value is None:
        cs.append(("eq", value))
    if isinstance(value, tuple):
        cs += [("len", len(value)), ("item_types", tuple(map(type, value)))]
    if isinstance(value, list):
        cs.append(("len", len(value)))
    if isinstance(value, dict):
        cs += [("falsy", not value), ("not_in", "forward"), ("keys", list(value.keys()))]
        if not value:
            cs.append(("falsy", None))
    if isinstance(value, (types.FunctionType, type, object)) and not isinstance(value, (int, float, str)):
        cs.append(("is", value))
    return [c for c in cs if c not in (("falsy", False), ("falsy", True))]


def build(root: Any, depth: int, memo: bool) -> tuple[GuardTree, Callable[[Any], bool]]:
    """A tree over `root`'s sources and the Python guard it stands for."""
    ops: list[tuple[Any, ...]] = []
    slots: dict[tuple[Any, ...], int] = {(): 0}
    py: list[tuple[tuple[Any, ...], tuple[str, Any]]] = []
    for path in paths(depth):
        for k in range(1, len(path) + 1):
            if path[:k] not in slots:
                slots[path[:k]] = len(slots)
                s = path[k - 1]
                ops.append(
                    op(LOADS[s[0]], slots[path[:k]], slots[path[: k - 1]], obj=s[1] if len(s) > 1 else None)
                )
        value: Any = root
        for s in path:
            value = step(value, s)
        for c in checks_for(value):
            kind, arg = c
            if kind == "falsy":
                ops.append(op(O.FALSY, src=slots[path]))
            elif kind in ("len",):
                ops.append(op(O.LEN_EQ, src=slots[path], n=arg))
            else:
                ops.append(op(CHECKS[kind], src=slots[path], obj=arg))
            py.append((path, c))

    def reference(x: Any) -> bool:
        try:
            for path, c in py:
                value = x
                for s in path:
                    value = step(value, s)
                if not check_py(value, c):
                    return False
            return True
        except Exception:
            return False

    return GuardTree(1, len(slots), ops, None, None, "memo fuzz", memo=memo), reference


def module_at(root: Mod, rng: random.Random) -> Mod:
    m = root
    while m._modules and rng.random() < 0.6:
        m = m._modules[rng.choice(sorted(m._modules))]
    return m


def set_class_attr(cls: type, name: str, value: Any) -> Callable[[], None]:
    missing = object()
    old = cls.__dict__.get(name, missing)
    setattr(cls, name, value)
    return lambda: delattr(cls, name) if old is missing else setattr(cls, name, old)


def snapshot(d: dict[Any, Any]) -> Callable[[], None]:
    saved = list(d.items())
    return lambda: (d.clear(), d.update(saved))


def mutate(root: Mod, rng: random.Random) -> Callable[[], None]:
    """One change that could make a memo stale; returns its undo (undos run last-in first-out)."""
    m = module_at(root, rng)
    d = m.__dict__
    kind = rng.randrange(16)
    if kind in (0, 1, 10, 14):
        undo = snapshot(d)
        if kind == 0:  # an attribute set to an equal or a different value
            d["eps"] = rng.choice([d.get("eps"), 1e-3, 0.1])
        elif kind == 1:  # an attribute added
            d["extra"] = 1
        elif kind == 10:  # a tuple attribute replaced by an equal or a different tuple
            d["stride"] = rng.choice([(1, 2), (2, 2), (1.0, 2)])
        else:  # the training flag toggled
            d["training"] = not d.get("training")
        return undo
    if kind in (2, 12):
        params = d["_parameters"]
        undo = snapshot(params)
        if kind == 2:  # a parameter replaced
            params["w"] = object()
        else:  # a parameter deleted
            params.pop("b", None)
        return undo
    if kind == 3 and d["_modules"]:  # a module swapped
        mods = d["_modules"]
        undo = snapshot(mods)
        mods[sorted(mods)[0]] = Mod(0)
        return undo
    if kind in (4, 13):
        h = d["_hooks"]
        undo = snapshot(h)
        h[1] = print
        if kind == 13:  # the hooks reordered (an OrderedDict's order changes without a version)
            h[2] = len
            h.move_to_end(1)
        return undo
    if kind == 5:  # the class of one instance changed
        old_class = type(m)
        m.__class__ = OtherMod if old_class is Mod else Mod
        return lambda: setattr(m, "__class__", old_class)
    if kind == 6:  # a method monkey-patched on the class
        return set_class_attr(Mod, "forward", lambda self: 2)
    if kind == 7:  # a class attribute changed
        return set_class_attr(Mod, "scale", 3)
    if kind == 8:  # a data descriptor now shadows an instance attribute
        return set_class_attr(Mod, "eps", property(lambda self: 0.5))
    if kind == 9:  # the instance dict replaced by an equal copy, sometimes changed
        m.__dict__ = dict(d)
        if rng.random() < 0.5:
            m.__dict__["training"] = False
        return lambda: setattr(m, "__dict__", d)
    if kind == 11:  # a list mutated in place
        items = d["items"]
        saved = list(items)
        items.append(3)
        return lambda: items.__setitem__(slice(None), saved)
    return lambda: None


def test_memo_fuzz_agrees_with_python_and_the_plain_tree() -> None:
    rng = random.Random(1234)
    root = Mod(2)
    memo, reference = build(root, 2, memo=True)
    plain, _ = build(root, 2, memo=False)
    assert memo(root) is True and memo(root) is True
    stats = memo.memo
    assert stats is not None and stats["hits"] >= 1 and stats["skipped_ops"] > stats["run_ops"]
    assert plain.memo is None
    undo: list[Callable[[], None]] = []
    checked = stale = 0
    for i in range(3000):
        if undo and rng.random() < 0.45:
            undo.pop()()
        else:
            undo.append(mutate(root, rng))
        value: Any = root if rng.random() < 0.95 else Mod(2)  # sometimes another root
        want = reference(value)
        for _ in range(2):  # a call that records, then one that uses the record
            got, got_plain = memo(value), plain(value)
            checked += 1
            stale += got != want
            assert got_plain is want, (i, "plain tree")
            assert got is want, (i, memo.memo)
        if not undo and rng.random() < 0.1:
            assert memo(root) is True
    while undo:
        undo.pop()()
    assert memo(root) is True and memo(root) is True
    assert stale == 0 and checked >= 6000
    assert memo.memo["hits"] > 1000  # the memo did the work it is for


CHANGES: list[tuple[str, Callable[[Mod, Mod], Callable[[], None]]]] = [
    ("attribute", lambda root, child: snapshot_then(child.__dict__, "eps", 0.5)),
    ("parameter replaced", lambda root, child: snapshot_then(child._parameters, "w", object())),
    ("module swapped", lambda root, child: snapshot_then(root._modules, "a", Mod(0))),
    ("hook added", lambda root, child: snapshot_then(child._hooks, 1, print)),
    ("list grown", lambda root, child: snapshot_then(child.__dict__, "items", [1, 2, 3])),
    ("method patched", lambda root, child: set_class_attr(Mod, "forward", lambda self: 3)),
    ("class attribute", lambda root, child: set_class_attr(Mod, "scale", 5)),
]


def snapshot_then(d: dict[Any, Any], key: Any, value: Any) -> Callable[[], None]:
    undo = snapshot(d)
    d[key] = value
    return undo


@pytest.mark.parametrize(("what", "change"), CHANGES, ids=[w for w, _ in CHANGES])
def test_memo_sees_each_kind_of_change(what: str, change: Callable[[Mod, Mod], Callable[[], None]]) -> None:
    root = Mod(1)
    memo, reference = build(root, 1, memo=True)
    assert memo(root) is True and memo(root) is True and memo.memo["hits"] >= 1
    undo = change(root, root._modules["a"])
    try:
        assert reference(root) is False
        assert memo(root) is False and memo(root) is False
    finally:
        undo()
    assert memo(root) is True and memo(root) is True


def test_a_class_change_of_one_instance() -> None:
    root = Mod(1)
    memo, _ = build(root, 1, memo=True)
    assert memo(root) is True and memo(root) is True
    root._modules["a"].__class__ = OtherMod
    assert memo(root) is False
    root._modules["a"].__class__ = Mod
    assert memo(root) is True


def test_a_value_that_changes_every_call_stops_being_witnessed() -> None:
    root = Mod(1)
    t = GuardTree(
        1,
        3,
        [op(O.LOAD_ATTR, 1, 0, obj="_parameters"), op(O.LOAD_ITEM, 2, 1, obj="b"), op(O.IS, src=2, obj=None)],
        None,
        None,
        "t",
    )
    for _ in range(6):
        root._parameters["w"] = object()  # the dict changes every call
        assert t(root) is True
    stats = t.memo
    assert stats["misses"] <= 2 and stats["hits"] >= 3  # after two misses the dict is not witnessed
    root._parameters["b"] = 1
    assert t(root) is False


def test_a_same_float_check_is_skipped_while_its_dict_holds() -> None:
    # Note [Same floats in C]: a dropout rate of 0.0 read from a module's instance dict is skipped
    # by the memo (an EQ against kiln_dynamo's SameFloat ran its Python __eq__ on every call), and
    # a rate set to -0.0 or NaN is seen
    root = Mod(0)
    root.__dict__["p"] = 0.0
    t = GuardTree(
        1,
        2,
        [op(O.LOAD_ATTR, 1, 0, obj="p"), op(O.TYPE_IS, src=1, obj=float), op(O.SAME_FLOAT, src=1, obj=0.0)],
        None,
        None,
        "t",
    )
    for _ in range(3):
        assert t(root) is True
    stats = t.memo
    assert stats["hits"] >= 1 and stats["run_ops"] == 0, stats
    for value, want in ((-0.0, False), (0.0, True), (math.nan, False), (0.0, True)):
        root.p = value
        assert t(root) is want and t(root) is want


def test_a_class_attribute_read_through_a_constant_class() -> None:
    class Base:
        def forward(self) -> int:
            return 1

    class Sub(Base):
        pass

    forward = Sub.forward
    t = GuardTree(
        0,
        2,
        [op(O.LOAD_CONST, 0, obj=Sub), op(O.LOAD_ATTR, 1, 0, obj="forward"), op(O.IS, src=1, obj=forward)],
        None,
        None,
        "t",
    )
    assert t() is True and t() is True and t.memo["hits"] == 1 and t.memo["run_ops"] == 0
    Base.forward = lambda self: 2  # type: ignore[method-assign]  # a base changed: Sub's tag too
    assert t() is False
    Base.forward = forward  # type: ignore[method-assign]
    assert t() is True and t() is True
    Sub.forward = lambda self: 3  # type: ignore[method-assign]
    assert t() is False


def test_a_class_attribute_that_type_also_has() -> None:
    """`cls.__call__` (every nn.Module's): `type` has a `__call__` too, a slot wrapper, which is
    not a data descriptor, so the class's own wins (type_getattro) and the memo may skip the
    load; `cls.__name__` is a data descriptor of `type` and is never skipped."""

    class Base:
        def __call__(self) -> int:
            return 1

    class Sub(Base):
        pass

    call = Sub.__call__
    ops = [op(O.LOAD_CONST, 0, obj=Sub), op(O.LOAD_ATTR, 1, 0, obj="__call__"), op(O.IS, src=1, obj=call)]
    t = GuardTree(0, 2, ops, None, None, "t")
    assert t() is True and t() is True and t.memo["hits"] == 1 and t.memo["run_ops"] == 0
    Base.__call__ = lambda self: 2  # type: ignore[method-assign]  # a base changed: Sub's tag too
    assert t() is False
    Base.__call__ = call  # type: ignore[method-assign]
    assert t() is True and t() is True and t.memo["run_ops"] == 0
    Sub.__call__ = lambda self: 3  # type: ignore[method-assign]
    assert t() is False
    del Sub.__call__
    assert t() is True

    name = [op(O.LOAD_CONST, 0, obj=Sub), op(O.LOAD_ATTR, 1, 0, obj="__name__"), op(O.EQ, src=1, obj="Sub")]
    n = GuardTree(0, 2, name, None, None, "n")
    assert n() is True and n() is True and n.memo["run_ops"] == 2  # the load and its check
    Sub.__name__ = "Other"
    assert n() is False


def test_items_of_entry_values_built_for_each_call() -> None:
    """`*args` and `**kwargs` are new for every call; what they hold is not."""
    m = Mod(1)
    ops = [
        op(O.LOAD_ITEM, 2, 0, obj=0),  # args[0]
        op(O.LOAD_ITEM, 3, 1, obj="m"),  # kwargs['m']
        op(O.LOAD_ATTR, 4, 2, obj="eps"),
        op(O.EQ, src=4, obj=1e-5),
        op(O.LOAD_ATTR, 5, 3, obj="_hooks"),
        op(O.FALSY, src=5),
        op(O.TYPE_IS, src=2, obj=Mod),
    ]
    t = GuardTree(2, 6, ops, None, None, "t")
    for _ in range(3):
        assert t((m,), {"m": m}) is True
    assert t.memo["hits"] == 2 and t.memo["run_ops"] == 0
    other = Mod(1)
    assert t((other,), {"m": m}) is True  # another object: witnesses fail, the plain run passes
    m.__dict__["eps"] = 0.5
    assert t((m,), {"m": m}) is False
    assert t((other,), {"m": m}) is True
    m.__dict__["eps"] = 1e-5
    m._hooks[1] = print
    assert t((other,), {"m": m}) is False
    assert t((m, 1), {"m": other}) is True  # the hooks are read through kwargs['m']
    m._hooks.clear()
    assert t((m,), {"m": other}) is True and t(("x",), {"m": m}) is False and t((), {"m": m}) is False


def test_fields_of_functions_and_cells() -> None:
    def make() -> Callable[[], int]:
        k = 1

        def f() -> int:
            return k

        return f

    f, g = make(), make()
    code, cell = f.__code__, f.__closure__[0]  # type: ignore[index]
    ops = [
        op(O.LOAD_CONST, 0, obj=f),
        op(O.LOAD_ATTR, 1, 0, obj="__code__"),
        op(O.IS, src=1, obj=code),
        op(O.LOAD_ATTR, 2, 0, obj="__closure__"),
        op(O.LOAD_ITEM, 3, 2, obj=0),
        op(O.LOAD_ATTR, 4, 3, obj="cell_contents"),
        op(O.EQ, src=4, obj=1),
    ]
    t = GuardTree(0, 5, ops, None, None, "t")
    assert t() is True and t() is True and t.memo["run_ops"] == 0
    cell.cell_contents = 2
    assert t() is False
    cell.cell_contents = 1
    assert t() is True and t() is True
    f.__code__ = (lambda: g).__code__.replace(co_name="other")  # the same free variables, other code
    assert t() is False
    f.__code__ = code
    assert t() is True and t() is True
