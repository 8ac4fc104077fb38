"""Which frames the callback sees, what its answers do, and how callbacks nest."""

from __future__ import annotations

import json
import threading
import time

from conftest import Recorder, replace_with, this_thread

import kiln_frame_hook as hook


def add(a, b):
    return a + b


def add_transformed(a, b):
    return ("transformed", a + b)


def calls_add(x):
    return add(x, 1)


def test_no_callback_means_no_hook() -> None:
    assert not hook.is_installed()
    with hook.callback(this_thread(lambda frame: None)):
        assert hook.is_installed()
    assert not hook.is_installed()


def test_callback_sees_user_frames_with_their_locals(recorder: Recorder) -> None:
    with hook.callback(recorder):
        assert calls_add(2) == 3
    assert recorder.names() == ["calls_add", "add"]
    assert dict(recorder.seen[0].locals) == {"x": 2}
    assert dict(recorder.seen[1].locals) == {"a": 2, "b": 1}
    first = recorder.seen[0]
    assert first.function is calls_add
    assert first.globals is globals()
    assert first.builtins["len"] is len
    assert first.entries == ()
    assert first.limit_reached is False


def test_callback_does_not_see_stdlib_generators_or_module_code(recorder: Recorder) -> None:
    def gen(n):
        yield from range(n)

    async def coro():
        return 1

    with hook.callback(recorder):
        json.dumps({"a": [1, 2]})  # stdlib: skipped
        assert list(gen(3)) == [0, 1, 2]  # generator: skipped
        c = coro()
        try:
            c.send(None)
        except StopIteration as stop:
            assert stop.value == 1
        exec("y = 1 + 1", {})  # module-level code: skipped
    assert recorder.names() == []


def test_replaced_code_runs_and_its_result_is_returned(recorder: Recorder) -> None:
    recorder.answers[add.__code__] = replace_with(add_transformed)
    with hook.callback(recorder):
        assert add(1, 2) == ("transformed", 3)
        assert add(3, 4) == ("transformed", 7)  # a guard hit: the callback is not called again
    assert recorder.names() == ["add"]
    assert add(1, 2) == 3  # no callback: the original runs
    with hook.callback(recorder):
        assert add(1, 2) == ("transformed", 3)
    assert recorder.names() == ["add"]


def test_run_answer_asks_again_next_time(recorder: Recorder) -> None:
    recorder.answers[add.__code__] = hook.RUN
    with hook.callback(recorder):
        assert add(1, 2) == 3
        assert add(1, 2) == 3
    assert recorder.names() == ["add", "add"]


def test_skip_answer_is_remembered(recorder: Recorder) -> None:
    recorder.answers[add.__code__] = hook.SKIP
    with hook.callback(recorder):
        assert add(1, 2) == 3
        assert add(1, 2) == 3
    assert recorder.names() == ["add"]
    hook.reset()
    with hook.callback(recorder):
        add(1, 2)
    assert recorder.names() == ["add", "add"]


def test_run_only_answer_keeps_entries_but_stops_the_callback(recorder: Recorder) -> None:
    recorder.answers[add.__code__] = replace_with(add_transformed, guard=lambda a, b: a == 1)
    with hook.callback(recorder):
        assert add(1, 2) == ("transformed", 3)
        recorder.answers[add.__code__] = hook.RUN_ONLY
        assert add(5, 2) == 7  # miss: callback says RUN_ONLY
        assert add(6, 2) == 8  # not asked again
        assert add(1, 5) == ("transformed", 6)  # the entry still runs
    assert recorder.names() == ["add", "add"]


def test_frames_started_inside_the_callback_are_not_intercepted() -> None:
    seen = []

    def cb(frame):
        seen.append(frame.code.co_name)
        add(0, 0)  # would recurse forever if intercepted

    with hook.callback(this_thread(cb)):
        calls_add(1)
    assert seen == ["calls_add", "add"]


def test_frames_started_inside_a_guard_are_not_intercepted(recorder: Recorder) -> None:
    def guard(a, b):
        return add(a, b) > 0  # a hooked function called from a guard runs as is

    recorder.answers[add.__code__] = replace_with(add_transformed, guard)
    with hook.callback(recorder):
        assert add(1, 1) == ("transformed", 2)
        assert add(2, 2) == ("transformed", 4)
        assert add(-5, 1) == ("transformed", -4)  # guard fails: the callback adds a second entry
    # the callback ran twice (first call, and the miss); the guard's own add() calls never reached it
    assert recorder.names() == ["add", "add"]
    assert len(hook.cache_entries(add.__code__)) == 2


def test_callbacks_nest_and_restore() -> None:
    outer, inner = Recorder(), Recorder()
    assert hook.set_callback(outer) is None
    with hook.callback(inner):
        add(1, 1)
    add(2, 2)
    assert hook.set_callback(None) is outer
    assert inner.names() == ["add"] and outer.names() == ["add"]


def test_thread_callback_overrides_the_interpreter_wide_one_on_its_thread_only() -> None:
    everywhere, mine = Recorder(any_thread=True), Recorder()
    other_thread_saw: list[str] = []

    def in_other_thread() -> None:
        add(5, 5)
        other_thread_saw.extend(everywhere.names())

    with hook.callback(everywhere), hook.thread_callback(mine):
        add(1, 1)
        t = threading.Thread(target=in_other_thread)
        t.start()
        t.join()
    assert mine.names() == ["add"]
    assert "add" in other_thread_saw and len(everywhere.seen) >= 1
    assert all(f.locals["a"] == 5 for f in everywhere.seen if f.code is add.__code__)


def test_callback_must_be_callable() -> None:
    try:
        hook.set_callback(42)  # type: ignore[arg-type]
    except TypeError as e:
        assert "callable" in str(e)
    else:
        raise AssertionError("expected TypeError")
    assert not hook.is_installed()


def test_an_interpreter_wide_callback_sees_a_busy_thread_the_recorder_filters_it() -> None:
    """Why the tests' helpers filter by thread: another thread running Python while the test's
    interpreter-wide callback is set (pytest-xdist's I/O thread) goes through the callback too."""
    stop = threading.Event()
    started = threading.Event()

    def busy() -> None:
        started.set()
        while not stop.is_set():
            add(2, 2)

    everywhere, mine = Recorder(any_thread=True), Recorder()

    def both(frame: hook.Frame) -> None:
        everywhere(frame)
        mine(frame)

    t = threading.Thread(target=busy)
    t.start()
    started.wait()
    try:
        with hook.callback(both):
            for _ in range(200):
                add(1, 1)
                time.sleep(0.0005)
    finally:
        stop.set()
        t.join()
    assert len(mine.seen) == 200 and all(f.locals["a"] == 1 for f in mine.seen)
    assert any(f.locals.get("a") == 2 for f in everywhere.seen)
