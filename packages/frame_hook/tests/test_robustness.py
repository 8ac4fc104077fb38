"""Errors propagate as ordinary exceptions and leave the hook usable; threads; no leaks."""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import weakref

import pytest
from conftest import Recorder, always, replace_with, this_thread

import kiln_frame_hook as hook


def double(x):
    return x * 2


def double_t(x):
    return ("t", x * 2)


def failing_t(x):
    raise KeyError(f"from transformed {x}")


def test_exception_in_callback_propagates_and_hook_stays_usable() -> None:
    def cb(frame):
        if frame.code is double.__code__:
            raise RuntimeError("callback broke")

    with hook.callback(cb), pytest.raises(RuntimeError, match="callback broke"):
        double(1)
    with hook.callback(Recorder({double.__code__: replace_with(double_t)})):
        assert double(2) == ("t", 4)


def test_exception_in_guard_propagates_and_hook_stays_usable() -> None:
    def bad_guard(x):
        if x == "boom":
            raise ValueError("guard broke")
        return True

    with hook.callback(Recorder({double.__code__: replace_with(double_t, bad_guard)})):
        assert double(1) == ("t", 2)
        with pytest.raises(ValueError, match="guard broke"):
            double("boom")
        assert double(3) == ("t", 6)


def test_exception_in_transformed_code_propagates_with_traceback() -> None:
    with hook.callback(Recorder({double.__code__: replace_with(failing_t)})):
        with pytest.raises(KeyError, match="from transformed 1") as info:
            double(1)
        with pytest.raises(KeyError, match="from transformed 2"):
            double(2)
    assert info.traceback[-1].name == "failing_t"


def test_bad_answers_are_clear_errors() -> None:
    with (
        hook.callback(this_thread(lambda frame: 42 if frame.code is double.__code__ else None)),
        pytest.raises(TypeError, match="returned 42"),
    ):
        double(1)

    def other_signature(x, y):
        return x

    with (
        hook.callback(Recorder({double.__code__: replace_with(other_signature)})),
        pytest.raises(ValueError, match=r"must keep the original's signature: co_argcount 2 != 1"),
    ):
        double(1)
    with (
        hook.callback(
            lambda frame: (
                hook.GuardedCode("not callable", double_t.__code__) if frame.code is double.__code__ else None
            )
        ),
        pytest.raises(TypeError, match="must be callable"),
    ):
        double(1)
    with hook.callback(Recorder({double.__code__: replace_with(double_t)})):
        assert double(5) == ("t", 10)


def test_no_reference_leaks_on_hits_misses_and_errors() -> None:
    payload, bomb = object(), object()

    def ident(x):
        return x

    def ident_t(x):
        return ("t", x)

    def guard(x):
        if x is bomb:
            raise ValueError("boom")
        return True

    with hook.callback(Recorder({ident.__code__: replace_with(ident_t, guard)})):
        ident(payload)  # new entry
        before = sys.getrefcount(payload)
        for _ in range(1000):
            ident(payload)  # hits
        assert sys.getrefcount(payload) == before
        before = sys.getrefcount(bomb)
        for _ in range(100):
            with contextlib.suppress(ValueError):
                ident(bomb)  # the guard raises: the frame is cleared on the error path too
        assert sys.getrefcount(bomb) == before
    with hook.callback(this_thread(lambda frame: None)):
        before = sys.getrefcount(payload)
        for _ in range(1000):
            ident(payload)  # misses that run the original
        assert sys.getrefcount(payload) == before


def test_four_threads_calling_hooked_functions() -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker(k: int) -> None:
        try:
            rec = Recorder({double.__code__: replace_with(double_t, lambda x: isinstance(x, int))})
            with hook.thread_callback(rec):
                barrier.wait()
                for i in range(2000):
                    assert double(i) == ("t", 2 * i)
                    assert double("s") == "ss" or double("s") == ("t", "ss")
        except BaseException as e:  # reported to the main thread
            errors.append(e)

    with hook.callback(Recorder({double.__code__: replace_with(double_t, always)})):
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_dropping_functions_frees_codes_guards_and_entries() -> None:
    count = 10_000
    code_refs, guard_refs, transformed_refs = [], [], []

    def cb(frame):
        guard = eval("lambda x: True")
        transformed = compile(f"def f(x):\n    return x + {frame.locals['x']} + 1\n", "<t>", "exec")
        code = next(c for c in transformed.co_consts if hasattr(c, "co_code"))
        guard_refs.append(weakref.ref(guard))
        transformed_refs.append(weakref.ref(code))
        return hook.GuardedCode(guard, code)

    functions = []
    with hook.callback(this_thread(cb)):
        for i in range(count):
            namespace: dict = {}
            exec(f"def f(x):\n    return x + {i}\n", namespace)
            fn = namespace["f"]
            assert fn(i) == 2 * i + 1  # transformed
            assert fn(i) == 2 * i + 1  # cached
            code_refs.append(weakref.ref(fn.__code__))
            functions.append(fn)
    assert len(hook.cache_entries(functions[0].__code__)) == 1
    del functions, fn, namespace
    gc.collect()
    assert sum(r() is not None for r in code_refs) == 0
    assert sum(r() is not None for r in guard_refs) == 0
    assert sum(r() is not None for r in transformed_refs) == 0


def test_many_values_beyond_the_stack_buffer() -> None:
    names = ", ".join(f"a{i}" for i in range(100))
    namespace: dict = {}
    exec(f"def wide({names}):\n    return a0 + a99\n", namespace)
    exec(f"def wide_t({names}):\n    return ('t', a0 + a99, a50)\n", namespace)
    wide, wide_t = namespace["wide"], namespace["wide_t"]
    seen = []

    def guard(*values):
        seen.append(len(values))
        return True

    with hook.callback(Recorder({wide.__code__: replace_with(wide_t, guard)})):
        assert wide(*range(100)) == ("t", 99, 50)
        assert wide(*range(100)) == ("t", 99, 50)
    assert seen == [100]
