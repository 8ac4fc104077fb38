"""A transformed code object runs exactly right in place of the original: every argument kind,
defaults, closures (cell and free variables), extra locals, methods, recursion."""

from __future__ import annotations

import contextlib
import sys

from conftest import Recorder, replace_with

import kiln_frame_hook as hook


def run_replaced(original, replacement, *args, **kwargs):
    """Call original(*args, **kwargs) twice under a callback that swaps in `replacement`: once
    through the callback (a new entry) and once through a guard hit. Both must agree."""
    hook.clear_cache(original.__code__)
    rec = Recorder({original.__code__: replace_with(replacement)})
    with hook.callback(rec):
        first = original(*args, **kwargs)
        second = original(*args, **kwargs)
    assert [f.code for f in rec.seen if f.code is original.__code__] == [original.__code__]
    assert first == second
    return first


def every_kind(a, b, /, c, d=4, *args, e, f=6, **kwargs):
    return a + b + c + d + e + f


def every_kind_t(a, b, /, c, d=4, *args, e, f=6, **kwargs):
    return ("t", a, b, c, d, args, e, f, kwargs)


def test_every_argument_kind() -> None:
    assert run_replaced(every_kind, every_kind_t, 1, 2, 3, e=5) == ("t", 1, 2, 3, 4, (), 5, 6, {})
    assert run_replaced(every_kind, every_kind_t, 1, 2, c=3, d=9, e=5, f=7, g=8) == (
        "t",
        1,
        2,
        3,
        9,
        (),
        5,
        7,
        {"g": 8},
    )
    assert run_replaced(every_kind, every_kind_t, 1, 2, 3, 4, 10, 11, e=5) == (
        "t",
        1,
        2,
        3,
        4,
        (10, 11),
        5,
        6,
        {},
    )


def only_varargs(*args, **kwargs):
    return args, kwargs


def only_varargs_t(*args, **kwargs):
    return ("t", args, kwargs)


def test_only_varargs_and_no_args() -> None:
    assert run_replaced(only_varargs, only_varargs_t, 1, 2, x=3) == ("t", (1, 2), {"x": 3})
    assert run_replaced(only_varargs, only_varargs_t) == ("t", (), {})

    def nothing():
        return 0

    def nothing_t():
        return 1

    assert run_replaced(nothing, nothing_t) == 1


def more_locals(x, y):
    return x + y


def more_locals_t(x, y):
    # many more locals and a deeper stack than the original
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = range(10)
    total = sum([x, y, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9])
    nested = [[[[x, y]]]]
    return ("t", total, nested, len(str(total)))


def test_transformed_code_with_more_locals() -> None:
    assert more_locals_t.__code__.co_nlocals > more_locals.__code__.co_nlocals
    assert run_replaced(more_locals, more_locals_t, 1, 2) == ("t", 48, [[[[1, 2]]]], 2)


def make_closure(base):
    offset = 10

    def inner(x, scale):
        return x * scale + base + offset

    return inner


def make_closure_t(base):
    offset = 10

    def inner(x, scale):
        extra = "t"
        return (extra, x * scale + base + offset, base, offset)

    return inner


def test_closure_free_variables() -> None:
    original, replacement = make_closure(100), make_closure_t(0)
    assert original.__code__.co_freevars == replacement.__code__.co_freevars == ("base", "offset")
    # the replacement runs with the *original* function's closure
    assert run_replaced(original, replacement, 2, 3) == ("t", 116, 100, 10)
    # another closure of the same code: same entry, its own cells
    other = make_closure(1000)
    with hook.callback(Recorder()):
        assert other(2, 3) == ("t", 1016, 1000, 10)


def cell_args(x, y):
    def uses_x():
        return x * 2

    return uses_x() + y


def cell_args_t(x, y):
    def uses_x():
        return ("t", x * 3)

    return uses_x(), y


def test_arguments_that_are_cells() -> None:
    assert cell_args.__code__.co_cellvars == ("x",)
    assert run_replaced(cell_args, cell_args_t, 5, 1) == (("t", 15), 1)


def test_guard_sees_closure_contents_and_unbound_cells() -> None:
    seen = []

    def outer():
        def inner(a):
            return a + later

        seen.append(hook.entry_names(inner.__code__))
        rec = Recorder({inner.__code__: hook.GuardedCode(lambda *v: seen.append(v) or True, inner.__code__)})
        with hook.callback(rec):
            with contextlib.suppress(NameError):
                inner(1)
            assert rec.seen[0].locals["later"] is hook.UNBOUND
        later = 5
        with hook.callback(rec):
            assert inner(1) == 6
        return later

    outer()
    assert seen[0] == ("a", "later")
    assert seen[1] == (1, 5)


class Model:
    def __init__(self, w):
        self.w = w

    def forward(self, x, *, bias=0):
        return self.w * x + bias

    def forward_t(self, x, *, bias=0):
        return ("t", self.w * x + bias)


def test_methods_and_keyword_only_defaults() -> None:
    m = Model(3)
    rec = Recorder({Model.forward.__code__: replace_with(Model.forward_t)})
    with hook.callback(rec):
        assert m.forward(2) == ("t", 6)
        assert m.forward(2, bias=1) == ("t", 7)
        assert Model(4).forward(1) == ("t", 4)


def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)


def fact_t(n):
    return 1 if n <= 1 else n * fact(n - 1)  # recursion re-enters the hook, which hits the entry


def test_recursion_through_cached_entries() -> None:
    hits = []

    def guard(n):
        hits.append(n)
        return True

    depth = 600  # deep enough to cross the thread's data-stack chunks
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5 * depth))
    try:
        with hook.callback(Recorder({fact.__code__: replace_with(fact_t, guard)})):
            result = fact(depth)
            again = fact(depth)
    finally:
        sys.setrecursionlimit(limit)
    expected = 1
    for i in range(2, depth + 1):
        expected *= i
    assert result == again == expected
    assert len(hits) == 2 * depth - 1  # every frame but the very first went through the guard


def test_tracing_still_sees_correct_results() -> None:
    events = []

    def tracer(frame, event, arg):
        events.append((frame.f_code.co_name, event))

    rec = Recorder({more_locals.__code__: replace_with(more_locals_t)})
    sys.settrace(tracer)
    try:
        with hook.callback(rec):
            result = more_locals(1, 2)
    finally:
        sys.settrace(None)
    assert result == ("t", 48, [[[[1, 2]]]], 2)
    assert ("more_locals_t", "call") in events


def _counts_during(fn, *args):
    before = hook.run_counts()
    fn(*args)
    after = hook.run_counts()
    return {k: after[k] - before[k] for k in after}


def test_both_ways_of_running_an_entry_are_taken() -> None:
    """A transformed frame that fits runs in the original's frame; a larger one through a function
    (reused for a module-level function, new per call for a closure). Results are the same."""
    counts = _counts_during(run_replaced, more_locals, more_locals_t, 1, 2)
    assert counts == {"in_place": 0, "reused_function": 2, "new_function": 0}

    def small(x, y):
        return x + y

    def small_t(x, y):
        return x - y

    counts = _counts_during(run_replaced, small, small_t, 5, 2)
    assert counts["in_place"] == 2 and counts["new_function"] == counts["reused_function"] == 0

    def big_closure(base):
        def inner(x):
            return x + base

        return inner

    def big_closure_t(base):
        def inner(x):
            a, b, c, d, e, f, g, h = 1, 2, 3, 4, 5, 6, 7, 8
            return [[[[x, base, a + b + c + d + e + f + g + h]]]]

        return inner

    counts = _counts_during(run_replaced, big_closure(10), big_closure_t(0), 1)
    assert counts == {"in_place": 0, "reused_function": 0, "new_function": 2}
