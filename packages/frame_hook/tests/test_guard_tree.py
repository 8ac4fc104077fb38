"""GuardTree: every op against the Python expression it stands for, errors, the residual guard,
the hook running trees as cache guards, no leaks, threads."""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import weakref
from collections import OrderedDict
from typing import Any

import pytest
from conftest import replace_with, this_thread

import kiln_frame_hook as hook
from kiln_frame_hook import GuardOp as O
from kiln_frame_hook import GuardTree, op


def tree(ops: list[Any], nvalues: int = 1, nslots: int = 8, residual: Any = None) -> GuardTree:
    return GuardTree(nvalues, nslots, ops, residual, None, "test tree")


class Plain:
    klass = "class attribute"

    def __init__(self) -> None:
        self.x = 5
        self.items = [1, "a", 2.5]
        self.table = {"a": 1, "b": 2}


class FloatSub(float):
    pass


class Slotted:
    __slots__ = ("x",)

    def __init__(self) -> None:
        self.x = 7


class WithGetattr:
    def __init__(self) -> None:
        self.x = 1

    def __getattr__(self, name: str) -> Any:
        if name == "virtual":
            return 42
        raise AttributeError(name)


class Raises:
    @property
    def boom(self) -> Any:
        raise ValueError("boom")

    @property
    def interrupt(self) -> Any:
        raise KeyboardInterrupt


def load_then(load: tuple[Any, ...], *checks: tuple[Any, ...]) -> GuardTree:
    return tree([load, *checks])


def eq(obj: Any) -> tuple[Any, ...]:
    return op(O.EQ, src=1, obj=obj)


# (description, tree, value, what Python says)
CASES: list[tuple[str, GuardTree, Any, bool]] = []


def case(desc: str, t: GuardTree, value: Any, expect: bool) -> None:
    CASES.append((desc, t, value, expect))


p = Plain()
case("attr from the instance dict", load_then(op(O.LOAD_ATTR, 1, 0, obj="x"), eq(5)), p, p.x == 5)
case("attr changed", load_then(op(O.LOAD_ATTR, 1, 0, obj="x"), eq(6)), p, p.x == 6)
case("class attr", load_then(op(O.LOAD_ATTR, 1, 0, obj="klass"), eq("class attribute")), p, True)
case("slot attr", load_then(op(O.LOAD_ATTR, 1, 0, obj="x"), eq(7)), Slotted(), True)
case("__getattr__", load_then(op(O.LOAD_ATTR, 1, 0, obj="virtual"), eq(42)), WithGetattr(), True)
case("missing attr fails", load_then(op(O.LOAD_ATTR, 1, 0, obj="nope"), eq(1)), p, False)
case("raising property fails", load_then(op(O.LOAD_ATTR, 1, 0, obj="boom"), eq(1)), Raises(), False)
case(
    "object's __getattribute__", load_then(op(O.LOAD_OBJATTR, 1, 0, obj="__dict__"), eq(p.__dict__)), p, True
)
case("list item", load_then(op(O.LOAD_ITEM, 1, 0, obj=-1), eq(3)), [1, 2, 3], True)
case("list item out of range", load_then(op(O.LOAD_ITEM, 1, 0, obj=5), eq(3)), [1, 2, 3], False)
case("tuple item", load_then(op(O.LOAD_ITEM, 1, 0, obj=0), eq(1)), (1, 2), True)
case("dict item", load_then(op(O.LOAD_ITEM, 1, 0, obj="a"), eq(1)), {"a": 1}, True)
case("missing dict item", load_then(op(O.LOAD_ITEM, 1, 0, obj="z"), eq(1)), {"a": 1}, False)
case("OrderedDict item", load_then(op(O.LOAD_ITEM, 1, 0, obj="a"), eq(1)), OrderedDict(a=1), True)
case("str item", load_then(op(O.LOAD_ITEM, 1, 0, obj=1), eq("b")), "abc", True)
case("type", load_then(op(O.LOAD_TYPE, 1, 0), op(O.IS, src=1, obj=Plain)), p, True)
case("const", load_then(op(O.LOAD_CONST, 1, obj=(1, 2)), eq((1, 2))), None, True)
case("call, no argument", load_then(op(O.LOAD_CALL, 1, obj=lambda: 3), eq(3)), None, True)
case("call, one argument", load_then(op(O.LOAD_CALL, 1, n=1, obj=abs, obj2=-4), eq(4)), None, True)
case("type is", tree([op(O.TYPE_IS, src=0, obj=int)]), 3, True)
case("type is not (bool is not int)", tree([op(O.TYPE_IS, src=0, obj=int)]), True, False)
case("is None", tree([op(O.IS, src=0, obj=None)]), None, True)
case("is not None", tree([op(O.IS, src=0, obj=None)]), 0, False)
case("is a weak referent", tree([op(O.IS_REF, src=0, obj=weakref.ref(Plain))]), Plain, True)
case("is not the referent", tree([op(O.IS_REF, src=0, obj=weakref.ref(Plain))]), Slotted, False)
case("id", tree([op(O.ID_EQ, src=0, n=id(len))]), len, True)
case("id differs", tree([op(O.ID_EQ, src=0, n=id(len))]), abs, False)
case("== float", tree([op(O.EQ, src=0, obj=2.5)]), 2.5, True)
case("== nan is false", tree([op(O.EQ, src=0, obj=float("nan"))]), float("nan"), False)
case("== list", tree([op(O.EQ, src=0, obj=[1, 2])]), [1, 2], True)
case("item types", tree([op(O.ITEM_TYPES, src=0, obj=(int, str))]), (1, "a"), True)
case("item types differ", tree([op(O.ITEM_TYPES, src=0, obj=(int, str))]), (True, "a"), False)
case("len", tree([op(O.LEN_EQ, src=0, n=3)]), [1, 2, 3], True)
case("len differs", tree([op(O.LEN_EQ, src=0, n=3)]), [1, 2], False)
case("len of no len fails", tree([op(O.LEN_EQ, src=0, n=3)]), 3, False)
case("keys", tree([op(O.KEYS_EQ, src=0, obj=["a", "b"])]), {"a": 1, "b": 2}, True)
case("keys reordered", tree([op(O.KEYS_EQ, src=0, obj=["a", "b"])]), {"b": 1, "a": 2}, False)
case("keys of OrderedDict", tree([op(O.KEYS_EQ, src=0, obj=["a"])]), OrderedDict(a=1), True)
case("keys longer", tree([op(O.KEYS_EQ, src=0, obj=["a"])]), {"a": 1, "b": 2}, False)
case("not in dict", tree([op(O.NOT_IN, src=0, obj="k")]), {"a": 1}, True)
case("in dict", tree([op(O.NOT_IN, src=0, obj="a")]), {"a": 1}, False)
case("not in list", tree([op(O.NOT_IN, src=0, obj=3)]), [1, 2], True)
case("falsy", tree([op(O.FALSY, src=0)]), OrderedDict(), True)
case("truthy", tree([op(O.FALSY, src=0)]), OrderedDict(a=1), False)
# Note [Same floats in C]: NaN is NaN (any payload), -0.0 is not 0.0, the type must match exactly
case("same float 0.0", tree([op(O.SAME_FLOAT, src=0, obj=0.0)]), 0.0, True)
case("same float not -0.0", tree([op(O.SAME_FLOAT, src=0, obj=0.0)]), -0.0, False)
case("same float -0.0", tree([op(O.SAME_FLOAT, src=0, obj=-0.0)]), -0.0, True)
case("same float nan", tree([op(O.SAME_FLOAT, src=0, obj=float("nan"))]), -float("nan"), True)
case("same float not nan", tree([op(O.SAME_FLOAT, src=0, obj=float("nan"))]), 1.0, False)
case("same float not the int 0", tree([op(O.SAME_FLOAT, src=0, obj=0.0)]), 0, False)
case("same float not a float subclass", tree([op(O.SAME_FLOAT, src=0, obj=0.0)]), FloatSub(0.0), False)
case(
    "same complex",
    tree([op(O.SAME_FLOAT, src=0, obj=complex(float("nan"), -0.0))]),
    complex(float("nan"), -0.0),
    True,
)
case(
    "same complex not +0j", tree([op(O.SAME_FLOAT, src=0, obj=complex(1.0, -0.0))]), complex(1.0, 0.0), False
)
case("same complex not a float", tree([op(O.SAME_FLOAT, src=0, obj=complex(0.0, 0.0))]), 0.0, False)
case(
    "same",
    tree([op(O.LOAD_ITEM, 1, 0, obj=0), op(O.LOAD_ITEM, 2, 0, obj=1), op(O.SAME, src=1, src2=2)]),
    [p, p],
    True,
)
case(
    "not same",
    tree([op(O.LOAD_ITEM, 1, 0, obj=0), op(O.LOAD_ITEM, 2, 0, obj=1), op(O.SAME, src=1, src2=2)]),
    [p, Plain()],
    False,
)


@pytest.mark.parametrize(("desc", "t", "value", "expect"), CASES, ids=[c[0] for c in CASES])
def test_each_op_gives_what_python_gives(desc: str, t: GuardTree, value: Any, expect: bool) -> None:
    assert t(value) is expect


def test_the_program_stops_at_the_first_failing_check() -> None:
    calls = []

    def fn() -> int:
        calls.append(1)
        return 1

    t = tree([op(O.IS, src=0, obj=None), op(O.LOAD_CALL, 1, obj=fn), op(O.EQ, src=1, obj=1)])
    assert t(None) is True and calls == [1]
    assert t(0) is False and calls == [1]


def test_exceptions_fail_the_guard_but_non_exceptions_propagate() -> None:
    t = load_then(op(O.LOAD_ATTR, 1, 0, obj="interrupt"), eq(1))
    with pytest.raises(KeyboardInterrupt):
        t(Raises())
    with pytest.raises(TypeError, match="expected 1 entry values, got 2"):
        t(1, 2)


def test_the_attribute_cache_sees_a_class_change() -> None:
    class C:
        pass

    c = C()
    c.x = 1
    t = load_then(op(O.LOAD_ATTR, 1, 0, obj="x"), eq(1))
    assert t(c) is True
    C.x = property(lambda self: 2)  # a data descriptor now wins over the instance dict
    assert t(c) is False and c.x == 2
    del C.x
    assert t(c) is True


def test_the_residual_runs_after_the_c_checks_pass() -> None:
    seen = []

    def residual(x: Any) -> bool:
        seen.append(x)
        return x == 1

    t = tree([op(O.TYPE_IS, src=0, obj=int)], residual=residual)
    assert t(1) is True and t(2) is False and t("s") is False
    assert seen == [1, 2]
    assert t.residual is residual


def test_bad_programs_are_refused() -> None:
    with pytest.raises(ValueError, match="reads a slot not written before"):
        tree([op(O.EQ, src=3, obj=1)])
    with pytest.raises(ValueError, match="must write a new slot"):
        tree([op(O.LOAD_CONST, 0, obj=1)])
    with pytest.raises(ValueError, match="unknown op"):
        tree([(99, -1, 0, -1, 0, None, None)])
    with pytest.raises(ValueError, match="an op is a tuple"):
        tree([[0, 1, 0, -1, 0, "x", None]])
    with pytest.raises(ValueError, match="IS_REF wants a weak reference"):
        tree([op(O.IS_REF, src=0, obj=1)])
    with pytest.raises(ValueError, match="a tensor row"):
        tree([op(O.TENSORS, obj=((0, int),))])
    with pytest.raises(ValueError, match="nvalues"):
        GuardTree(3, 1, [], None, None, "")


class FakeTensor:
    """Enough of a tensor for the TENSORS op (this package has no torch)."""

    def __init__(
        self, dtype: str, device: str, requires_grad: bool, shape: tuple[int, ...], stride: tuple[int, ...]
    ):
        self.dtype, self.device, self.requires_grad = dtype, device, requires_grad
        self.shape, self._stride = shape, stride
        self.is_cpu = device == "cpu"

    def stride(self) -> tuple[int, ...]:
        return self._stride


def test_tensor_rows_check_every_property() -> None:
    x = FakeTensor("f32", "cuda:0", False, (2, 3), (3, 1))
    rows = (
        (0, FakeTensor, "f32", "cuda:0", False, (2, 3), (3, 1)),
        (0, FakeTensor, "f32", "cuda:0", False, (2, 3), (3, 1)),
    )
    t = tree([op(O.TENSORS, obj=rows)])
    assert t(x) is True and t.ntensors == 2
    for attr, value in [
        ("dtype", "f16"),
        ("device", "cpu"),
        ("requires_grad", True),
        ("shape", (3, 2)),
        ("_stride", (1, 2)),
    ]:
        old = getattr(x, attr)
        setattr(x, attr, value)
        assert t(x) is False, attr
        setattr(x, attr, old)
        assert t(x) is True
    assert t(3) is False
    cpu = tree([op(O.TENSORS, obj=((0, FakeTensor, "f32", None, False, (2, 3), (3, 1)),))])
    assert cpu(x) is False  # None: the CPU, read through is_cpu
    x.is_cpu = True
    assert cpu(x) is True


def test_tensor_rows_with_dispatch_keys() -> None:
    x = FakeTensor("f32", "cpu", False, (2,), (1,))
    x.keys = 0x30  # type: ignore[attr-defined]
    row = (0, FakeTensor, "f32", None, False, (2,), (1,), 0x30, lambda t: t.keys, True)
    t = tree([op(O.TENSORS, obj=(row,))])
    assert t(x) is True
    x.keys = 0x31  # type: ignore[attr-defined]
    assert t(x) is False  # no checker handed over: the attribute path reads the keys too
    unchecked = tree([op(O.TENSORS, obj=((*row[:7], None, None, False),))])
    assert unchecked(x) is True
    with pytest.raises(ValueError, match="keys are an int"):
        tree([op(O.TENSORS, obj=((*row[:7], "keys", None, True),))])
    # an 11th item: what keys_fn gives for those keys, when it is not the int (torch's key set)
    x.keys = "set 0x30"  # type: ignore[attr-defined]
    as_object = tree([op(O.TENSORS, obj=((*row, "set 0x30"),))])
    assert as_object(x) is True
    x.keys = "set 0x31"  # type: ignore[attr-defined]
    assert as_object(x) is False


def test_a_tensor_checker_must_be_a_capsule_of_its_abi() -> None:
    with pytest.raises(ValueError, match="invalid PyCapsule"):
        hook.set_tensor_checker(object())
    previous = hook.set_tensor_checker(None)
    try:
        assert hook.set_tensor_checker(None) is None
    finally:
        hook.set_tensor_checker(previous)


def cached_double(x):
    return x * 2


def cached_double_t(x):
    return ("t", x * 2)


def int_tree() -> GuardTree:
    return tree([op(O.TYPE_IS, src=0, obj=int)])


def only_ints(frame: hook.Frame) -> Any:
    if frame.code is cached_double.__code__ and type(frame.locals["x"]) is int:
        return replace_with(cached_double_t, int_tree())
    return None


def test_the_hook_runs_a_tree_as_the_guard() -> None:
    seen = []

    def cb(frame: hook.Frame) -> Any:
        seen.append(frame.locals["x"])
        return only_ints(frame)

    with hook.callback(this_thread(cb)):
        assert cached_double(2) == ("t", 4)
        assert cached_double(3) == ("t", 6)  # hit: the tree passed
        assert cached_double("s") == "ss"  # the tree failed: the callback ran it as is
        assert cached_double(4) == ("t", 8)
    assert seen == [2, "s"]
    (entry,) = hook.cache_entries(cached_double.__code__)
    assert isinstance(entry.guard, GuardTree)


def test_no_reference_leaks_through_trees() -> None:
    payload = Plain()
    t = tree([op(O.TYPE_IS, src=0, obj=Plain), op(O.LOAD_ATTR, 1, 0, obj="x"), op(O.EQ, src=1, obj=5)])
    answer = replace_with(cached_double_t, t)
    with hook.callback(
        this_thread(lambda frame: answer if frame.locals.get("x") is payload and payload.x == 5 else None)
    ):
        with contextlib.suppress(TypeError):
            cached_double(payload)  # new entry (Plain * 2 raises in the transformed code)
        before = (sys.getrefcount(payload), sys.getrefcount(payload.x), sys.getrefcount(t))
        for _ in range(1000):
            with contextlib.suppress(TypeError):
                cached_double(payload)  # hits
        payload.x = 6
        for _ in range(1000):
            with contextlib.suppress(TypeError):
                cached_double(payload)  # misses
        payload.x = 5
        assert (sys.getrefcount(payload), sys.getrefcount(payload.x), sys.getrefcount(t)) == before


def test_dropping_functions_frees_10000_trees() -> None:
    count = 10_000
    tree_refs, const_refs = [], []

    def cb(frame):
        const = Plain()  # held by the tree only
        t = tree([op(O.LOAD_CONST, 1, obj=const), op(O.TYPE_IS, src=0, obj=int)])
        tree_refs.append(weakref.ref(t))
        const_refs.append(weakref.ref(const))
        transformed = compile(f"def f(x):\n    return x + {frame.locals['x']} + 1\n", "<t>", "exec")
        return hook.GuardedCode(t, next(c for c in transformed.co_consts if hasattr(c, "co_code")))

    functions = []
    with hook.callback(this_thread(cb)):
        for i in range(count):
            namespace: dict = {}
            exec(f"def f(x):\n    return x + {i}\n", namespace)
            fn = namespace["f"]
            assert fn(i) == 2 * i + 1  # transformed
            assert fn(i) == 2 * i + 1  # the tree passed
            functions.append(fn)
    assert sum(r() is not None for r in tree_refs) == count
    del functions, fn, namespace
    gc.collect()
    assert sum(r() is not None for r in tree_refs) == 0
    assert sum(r() is not None for r in const_refs) == 0


def test_four_threads_running_trees() -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)
    shared = int_tree()

    def worker(k: int) -> None:
        try:
            own = tree(
                [
                    op(O.TYPE_IS, src=0, obj=int),
                    op(O.LOAD_CALL, 1, n=1, obj=abs, obj2=-k),
                    op(O.EQ, src=1, obj=k),
                ]
            )
            answer = replace_with(cached_double_t, own if k % 2 else shared)

            def cb(frame: hook.Frame) -> Any:
                return answer if type(frame.locals["x"]) is int else None

            with hook.thread_callback(cb):
                barrier.wait()
                for i in range(2000):
                    assert cached_double(i) == ("t", 2 * i)
                    assert cached_double("s") == "ss"
        except BaseException as e:  # reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


class Holder:
    """A module-like entry value: an instance dict with a table (a witnessed dict) and a tensor."""

    def __init__(self, a: int, keys: str = "k") -> None:
        self.table = {"a": a}
        self.t = FakeTensor("f32", "cpu", False, (2,), (1,))
        self.t.keys = keys  # type: ignore[attr-defined]


def holder_tree(const: Any) -> GuardTree:
    """What kiln_dynamo compiles for `x.table['a'] == 1` and a tensor `x.t`: a memo tree (the
    table's load and check are skipped while its witnesses hold) whose tensor row runs always."""
    row = (3, FakeTensor, "f32", None, False, (2,), (1,), 0x30, lambda t: t.keys, False, "k")
    return tree(
        [
            op(O.LOAD_CONST, 4, obj=const),
            op(O.TYPE_IS, src=0, obj=Holder),
            op(O.LOAD_ATTR, 1, 0, obj="table"),
            op(O.LOAD_ITEM, 2, 1, obj="a"),
            op(O.EQ, src=2, obj=1),
            op(O.LOAD_ATTR, 3, 0, obj="t"),
            op(O.TENSORS, obj=(row,)),
        ]
    )


def holder_fn(x):
    return ("t", x.table["a"])


def test_memo_trees_with_tensor_rows_free_10000_entries_and_see_new_objects() -> None:
    """10,000 functions, each with a memo tree (witnesses recorded, skipping on warm calls) and a
    tensor row: dropping the functions frees every tree and what only they hold, the memos hold
    no reference to the values they witnessed, and new values at reused addresses are checked."""
    count = 10_000
    tree_refs, const_refs, holder_refs = [], [], []

    def cb(frame: hook.Frame) -> Any:
        x = frame.locals.get("x")
        if frame.code.co_filename != "<holder>" or x.table["a"] != 1 or x.t.keys != "k":
            return None  # what the tree would refuse: run as is
        const = Plain()  # held by the tree only
        t = holder_tree(const)
        tree_refs.append(weakref.ref(t))
        const_refs.append(weakref.ref(const))
        return hook.GuardedCode(t, holder_fn.__code__)

    functions, holders = [], []
    with hook.callback(this_thread(cb)):
        for _ in range(count):
            namespace: dict = {}
            exec(compile("def f(x):\n    return x.table['a']\n", "<holder>", "exec"), namespace)
            fn, h = namespace["f"], Holder(1)
            holder_refs.append(weakref.ref(h))
            assert fn(h) == ("t", 1)  # transformed
            assert fn(h) == ("t", 1) and fn(h) == ("t", 1)  # the tree passed: recorded, then a memo hit
            functions.append(fn)
            holders.append(h)
        (t0,) = [r() for r in tree_refs[:1]]
        assert t0 is not None and t0.memo["hits"] >= 1 and t0.memo["skipped_ops"] > 0
        del t0
        del holders, h
        gc.collect()
        assert sum(r() is not None for r in holder_refs) == 0  # the memos hold no values
        for fn in functions[:1000]:  # new objects, likely at the freed addresses
            assert fn(Holder(2)) == 2  # the table changed: the tree fails, the callback declines
            assert fn(Holder(1, keys="other")) == 1  # the tensor row fails (keys), not skipped
            assert fn(Holder(1)) == ("t", 1)
    assert sum(r() is not None for r in tree_refs) == count
    del functions, fn, namespace
    gc.collect()
    assert sum(r() is not None for r in tree_refs) == 0
    assert sum(r() is not None for r in const_refs) == 0


def test_four_threads_sharing_memo_trees_while_values_change() -> None:
    """Four threads run one memo tree (and one each) over their own holders while changing them
    (a table value, a tensor's keys, a class of their own): every answer is the Python one."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)
    shared = holder_tree(Plain())

    def worker(k: int) -> None:
        try:
            own = holder_tree(Plain())
            guard = own if k % 2 else shared
            h = Holder(1)

            def cb(frame: hook.Frame) -> Any:
                if frame.code.co_filename != "<holder>":
                    return None
                x = frame.locals["x"]
                ok = x.table["a"] == 1 and x.t.keys == "k"
                return hook.GuardedCode(guard, holder_fn.__code__) if ok else None

            namespace: dict = {}
            exec(compile("def f(x):\n    return x.table['a']\n", "<holder>", "exec"), namespace)
            fn = namespace["f"]
            with hook.thread_callback(cb):
                barrier.wait()
                for i in range(2000):
                    change = i % 4
                    if change == 1:
                        h.table["a"] = 2
                    elif change == 2:
                        h.table["a"], h.t.keys = 1, "other"  # type: ignore[attr-defined]
                    elif change == 3:
                        h.t.keys = "k"  # type: ignore[attr-defined]
                    want = ("t", 1) if h.table["a"] == 1 and h.t.keys == "k" else h.table["a"]  # type: ignore[attr-defined]
                    assert guard(h) is (want == ("t", 1))
                    assert fn(h) == want
        except BaseException as e:  # reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert shared.memo is not None and shared.memo["hits"] > 0


def test_more_slots_than_the_stack_buffer() -> None:
    n = 2000  # past the 512 slots kept on the C stack
    values = [Plain() for _ in range(n)]
    ops = [op(O.LOAD_ITEM, 1 + i, 0, obj=i) for i in range(n)]
    ops += [op(O.IS, src=1 + i, obj=v) for i, v in enumerate(values)]
    t = tree(ops, nslots=n + 1)
    assert t(values) is True
    assert t([*values[:-1], Plain()]) is False
    first = values[0]
    before = sys.getrefcount(first)
    for _ in range(100):
        t(values)
    after = sys.getrefcount(first)
    assert after == before
