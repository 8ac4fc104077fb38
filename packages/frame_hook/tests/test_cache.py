"""Guards, the per-code cache (most recently hit first), its limit, run-only mode, skip rules."""

from __future__ import annotations

import os

import pytest
from conftest import Recorder, replace_with, this_thread

import kiln_frame_hook as hook


def scale(x, factor):
    return x * factor


def version_a(x, factor):
    return ("a", x * factor)


def version_b(x, factor):
    return ("b", x * factor)


def version_c(x, factor):
    return ("c", x * factor)


def is_int(x, factor):
    return type(x) is int


def is_str(x, factor):
    return type(x) is str


def is_list(x, factor):
    return type(x) is list


def test_guard_receives_the_entry_values() -> None:
    received = []

    def guard(*values):
        received.append(values)
        return True

    rec = Recorder({scale.__code__: replace_with(version_a, guard)})
    with hook.callback(rec):
        scale(3, 4)
        scale(5, factor=6)
    assert hook.entry_names(scale.__code__) == ("x", "factor")
    assert received == [(5, 6)]


def test_guard_pass_miss_and_most_recently_hit_first() -> None:
    answers = iter(
        [replace_with(version_a, is_int), replace_with(version_b, is_str), replace_with(version_c, is_list)]
    )
    rec = Recorder()
    rec.answers = {}

    def cb(frame):
        if frame.code is not scale.__code__:
            return None
        rec.seen.append(frame)
        return next(answers)

    with hook.callback(this_thread(cb)):
        assert scale(2, 3) == ("a", 6)
        assert scale("x", 2) == ("b", "xx")
        assert scale([1], 2) == ("c", [1, 1])
        order = [e.code.co_name for e in hook.cache_entries(scale.__code__)]
        assert order == ["version_c", "version_b", "version_a"]
        assert scale(4, 1) == ("a", 4)  # hit on the last entry moves it to the front
        order = [e.code.co_name for e in hook.cache_entries(scale.__code__)]
        assert order == ["version_a", "version_c", "version_b"]
        assert scale("y", 3) == ("b", "yyy")
        order = [e.code.co_name for e in hook.cache_entries(scale.__code__)]
        assert order == ["version_b", "version_a", "version_c"]
    assert len(rec.seen) == 3  # only the three misses reached the callback
    assert [len(f.entries) for f in rec.seen] == [0, 1, 2]


def test_an_entry_serves_only_frames_of_its_globals() -> None:
    """Note [An entry serves its frame's globals]: two functions of one code object with other
    globals; a guard that passes for both let the second run the first one's entry (kiln_dynamo
    binds the compiling frame's globals into its guards: a stale global value)."""
    import types

    first = types.FunctionType(scale.__code__, {"__name__": "first"})
    second = types.FunctionType(scale.__code__, {"__name__": "second"})
    answers = iter([replace_with(version_a), replace_with(version_b)])
    seen = []

    def cb(frame):
        if frame.code is not scale.__code__:
            return None
        seen.append(frame.globals["__name__"])
        return next(answers)

    with hook.callback(this_thread(cb)):
        assert first(2, 3) == ("a", 6)
        assert second(2, 3) == ("b", 6)  # a miss: the entry was made under first's globals
        assert first(1, 1) == ("a", 1)
        assert second(1, 1) == ("b", 1)
    assert seen == ["first", "second"]


def test_guards_are_tried_in_order_and_stop_at_the_first_pass() -> None:
    tried = []

    def make_guard(name, result):
        def guard(x, factor):
            tried.append(name)
            return result

        return guard

    answers = iter(
        [replace_with(version_a, make_guard("a", True)), replace_with(version_b, make_guard("b", True))]
    )
    with hook.callback(this_thread(lambda frame: next(answers))):
        scale(1, 1)
        hook.clear_cache(scale.__code__)
        scale(1, 1)
    assert tried == []  # a new entry runs at once, without its guard
    answers = iter(
        [replace_with(version_a, make_guard("a", False)), replace_with(version_b, make_guard("b", True))]
    )
    hook.clear_cache(scale.__code__)
    with hook.callback(this_thread(lambda frame: next(answers))):
        scale(1, 1)  # adds a
        scale(1, 1)  # a fails, adds b in front
        tried.clear()
        assert scale(1, 1) == ("b", 1)
    assert tried == ["b"]


def test_cache_limit_tells_the_callback_and_evicts_the_least_recently_used() -> None:
    hook.set_cache_limit(2)
    seen_limit = []
    versions = iter([version_a, version_b, version_c])

    def cb(frame):
        if frame.code is not scale.__code__:
            return None
        seen_limit.append(frame.limit_reached)
        want = len(seen_limit)
        return replace_with(next(versions), lambda x, factor: x == want)

    with hook.callback(this_thread(cb)):
        assert scale(1, 1) == ("a", 1)
        assert scale(2, 1) == ("b", 2)
        assert scale(1, 1) == ("a", 1)  # hit: a is most recent, b least
        assert scale(3, 1) == ("c", 3)  # limit reached: b is evicted
        names = [e.code.co_name for e in hook.cache_entries(scale.__code__)]
    assert seen_limit == [False, False, True]
    assert names == ["version_c", "version_a"]
    assert hook.get_cache_limit() == 2


def test_cache_limit_callback_may_stop_compiling() -> None:
    hook.set_cache_limit(1)
    calls = []

    def cb(frame):
        if frame.code is not scale.__code__:
            return None
        calls.append(frame.limit_reached)
        if frame.limit_reached:
            return hook.RUN_ONLY
        return replace_with(version_a, is_int)

    with hook.callback(this_thread(cb)):
        assert scale(1, 2) == ("a", 2)
        assert scale("s", 2) == "ss"
        assert scale("t", 2) == "tt"
        assert scale(3, 2) == ("a", 6)
    assert calls == [False, True]


def test_cache_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        hook.set_cache_limit(0)


def test_run_only_mode_runs_entries_without_calling_the_callback() -> None:
    rec = Recorder({scale.__code__: replace_with(version_a, is_int)})
    with hook.callback(rec):
        assert scale(1, 2) == ("a", 2)
        with hook.run_only():
            assert scale(2, 2) == ("a", 4)  # hit
            assert scale("q", 2) == "qq"  # miss: runs as is, nobody asked
        assert scale("q", 2) == ("a", "qq")  # outside the block the callback is asked again
    assert len(rec.seen) == 2


def test_skip_code_and_skip_prefix() -> None:
    rec = Recorder()
    hook.skip_code(scale.__code__)
    with hook.callback(rec):
        scale(1, 1)
    assert rec.seen == []
    hook.reset()  # explicit skips survive reset
    with hook.callback(rec):
        scale(1, 1)
    assert rec.seen == []
    assert hook.is_skipped(scale.__code__)
    hook.clear_cache(scale.__code__)  # ... but not clear_cache
    assert not hook.is_skipped(scale.__code__)
    with hook.callback(rec):
        scale(1, 1)
    assert len(rec.seen) == 1
    rec.seen.clear()

    namespace: dict = {}
    fake_file = os.path.join(os.path.dirname(__file__), "_planted_dir", "mod.py")
    exec(compile("def f(x):\n    return x + 1\n", fake_file, "exec"), namespace)
    with hook.callback(rec):
        namespace["f"](1)
    assert [f.code.co_name for f in rec.seen] == ["f"]
    hook.add_skip_prefix(os.path.dirname(fake_file))
    hook.reset()
    with hook.callback(rec):
        namespace["f"](1)
    assert len(rec.seen) == 1


def test_kiln_own_code_is_skipped() -> None:
    assert hook.is_skipped(hook.cache_entries.__code__)
    assert hook.is_skipped(os.path.join.__code__)  # the standard library
    assert not hook.is_skipped(scale.__code__)
    assert not hook.is_skipped(pytest.raises.__code__)  # site-packages is not the standard library


def test_clear_cache_and_reset() -> None:
    rec = Recorder({scale.__code__: replace_with(version_a)})
    with hook.callback(rec):
        scale(1, 1)
        hook.clear_cache(scale.__code__)
        assert hook.cache_entries(scale.__code__) == []
        scale(1, 1)
        hook.reset()
        scale(1, 1)
    assert len(rec.seen) == 3


def test_cache_entry_is_read_only() -> None:
    with hook.callback(Recorder({scale.__code__: replace_with(version_a, is_int)})):
        scale(1, 1)
    (entry,) = hook.cache_entries(scale.__code__)
    assert entry.guard is is_int and entry.code is version_a.__code__
    assert entry.run_code.co_code == version_a.__code__.co_code
    assert "CacheEntry" in repr(entry)
    with pytest.raises(AttributeError):
        entry.guard = None  # type: ignore[misc]
