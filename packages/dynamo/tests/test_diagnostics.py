"""`logging` and `warnings` inside a compiled frame (variables/diagnostics.py).

Note [Log calls at a disabled level]: a disabled level is a guarded no-op, an enabled one a break;
Note [Warnings replayed after the graph]: `warnings.warn` is replayed after the graph with eager's
file, line, module and registry.
"""

from __future__ import annotations

import logging
import sys
import warnings

import pytest
import torch
from conftest import CountingBackend

import kiln_dynamo

_log = logging.getLogger("kiln_test_diagnostics")


def _records(fn, *args):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [(str(w.message), w.category, w.filename, w.lineno) for w in caught]


def _warn_here(x: torch.Tensor) -> torch.Tensor:
    y = x + 1
    warnings.warn("careful", DeprecationWarning, stacklevel=1)
    return y * 2


def _helper_that_warns_its_caller(y: torch.Tensor) -> torch.Tensor:
    warnings.warn("from the helper", stacklevel=2)
    return y - 1


def _warn_from_helper(x: torch.Tensor) -> torch.Tensor:
    return _helper_that_warns_its_caller(x * 3)


@pytest.mark.parametrize("fn", [_warn_here, _warn_from_helper], ids=["stacklevel-1", "stacklevel-2"])
def test_a_warning_is_replayed_with_eager_location_and_no_break(fn) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(3)
    expected, eager_warnings = _records(fn, x)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for _ in range(2):
        got, kiln_warnings = _records(compiled, x)
        torch.testing.assert_close(got, expected)
        assert kiln_warnings == eager_warnings and len(eager_warnings) == 1
    assert backend.graphs == 1 and kiln_dynamo.counters.break_reasons == []


def test_the_default_filter_warns_once_per_location_as_eager() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        warnings.warn("only once, kiln_test_diagnostics", stacklevel=1)
        return x + 1

    compiled = kiln_dynamo.compile(f, backend=CountingBackend())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            compiled(torch.ones(2))
    assert [str(w.message) for w in caught] == ["only once, kiln_test_diagnostics"]


def test_an_error_filter_raises_at_the_call_as_eager() -> None:
    effects: list[int] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        warnings.warn("now an error", stacklevel=1)
        effects.append(1)
        return x + 1

    compiled = kiln_dynamo.compile(f, backend=CountingBackend())
    compiled(torch.ones(2))  # compiled with no raising filter: replayed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="now an error"):
            compiled(torch.ones(2))  # the guard fails: recompiled, the call breaks and raises
    assert effects == [1]
    assert any("filter turns warnings into errors" in str(r) for r in kiln_dynamo.counters.break_reasons)


def test_a_log_call_at_a_disabled_level_is_a_guarded_no_op() -> None:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep()
    _log.addHandler(handler)
    _log.setLevel(logging.WARNING)
    try:

        def f(x: torch.Tensor) -> torch.Tensor:
            _log.debug("shape %s", tuple(x.shape))
            if _log.isEnabledFor(logging.INFO):
                x = x * 10
            return x + 1

        backend = CountingBackend()
        compiled = kiln_dynamo.compile(f, backend=backend)
        x = torch.ones(2)
        torch.testing.assert_close(compiled(x), f(x))
        assert backend.graphs == 1 and kiln_dynamo.counters.break_reasons == [] and records == []
        _log.setLevel(logging.DEBUG)  # the guard fails: recompiled, the debug call emits (a break)
        torch.testing.assert_close(compiled(x), f(x))
        assert records == ["shape (2,)", "shape (2,)"]
        assert kiln_dynamo.counters.recompiles >= 1
        assert any("enabled level" in str(r) for r in kiln_dynamo.counters.break_reasons)
    finally:
        _log.removeHandler(handler)
        _log.setLevel(logging.NOTSET)


def test_get_logger_in_the_frame_is_the_real_logger() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        logging.getLogger("kiln_test_diagnostics.quiet").debug("x %s", x.shape)
        return x + 1

    logging.getLogger("kiln_test_diagnostics.quiet").setLevel(logging.ERROR)
    backend = CountingBackend()
    torch.testing.assert_close(kiln_dynamo.compile(f, backend=backend)(torch.ones(2)), torch.ones(2) + 1)
    assert backend.graphs == 1 and kiln_dynamo.counters.break_reasons == []


class _WarnsItsCaller(torch.nn.Module):
    def forward(self, x: torch.Tensor, level: int = 2) -> torch.Tensor:
        y = x * 2
        warnings.warn("no mask given, kiln_test_diagnostics", FutureWarning, stacklevel=level)
        return y + 1


class _Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _WarnsItsCaller()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x, level=4) - 1  # past inner's forward and _call_impl, to outer's forward


def _call_module(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x)


@pytest.mark.parametrize(("make", "graphs"), [(_WarnsItsCaller, 1), (_Outer, 2)], ids=["caller", "two-up"])
def test_a_stacklevel_above_the_compiled_frame_warns_from_the_real_caller(make, graphs) -> None:  # type: ignore[no-untyped-def]
    """Note [Warnings from above the compiled frame]: `stacklevel=2` in a forward names the
    forward's caller, a frame kiln does not trace: replayed through the real frames, with no
    break, eager's message, category, file and line. Two levels up from a submodule's forward
    passes Module.__call__'s frames, which kiln does not trace: a break, and eager's location."""
    m = make()
    x = torch.randn(3)
    expected, eager_warnings = _records(_call_module, m, x)
    kiln_dynamo.reset()
    report = kiln_dynamo.explain(m)(x)
    assert report.graph_count == graphs, report
    if graphs == 1:
        assert report.break_reasons == [], report
    else:
        assert any("passes a call that eager makes through frames" in r.reason for r in report.break_reasons)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(m, backend=backend)
    for _ in range(2):
        got, kiln_warnings = _records(_call_module, compiled, x)
        torch.testing.assert_close(got, expected)
        assert kiln_warnings == eager_warnings and len(eager_warnings) == 1


class _Level2InSubmodule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _WarnsItsCaller()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x * 3) + 1


def test_a_stacklevel_through_a_submodule_call_names_eagers_frame() -> None:
    """`stacklevel=2` in a submodule's forward names Module._call_impl in eager. Before, kiln
    walked its own chain, which has no such frame, and named the outer forward's line (a wrong
    location); now it is a break and the location is eager's."""
    m = _Level2InSubmodule()
    x = torch.randn(3)
    expected, eager_warnings = _records(_call_module, m, x)
    kiln_dynamo.reset()
    got, kiln_warnings = _records(_call_module, kiln_dynamo.compile(m, backend=CountingBackend()), x)
    torch.testing.assert_close(got, expected)
    assert kiln_warnings == eager_warnings and eager_warnings[0][2].endswith("module.py")


_probe_log = logging.getLogger("kiln_test_diagnostics.frames")


def _logs_inside(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    _probe_log.warning("inside %s", "helper")
    return y + 1


def _calls_logging_helper(x: torch.Tensor) -> torch.Tensor:
    return _logs_inside(x) - 1


def _reads_its_frame(x: torch.Tensor) -> tuple[torch.Tensor, str]:
    y = x + 1
    return y, sys._getframe().f_code.co_name


def _calls_frame_reader(x: torch.Tensor) -> tuple[torch.Tensor, str]:
    y, name = _reads_its_frame(x * 2)
    return y, name


def test_a_break_that_reads_its_callers_frame_is_not_chained() -> None:
    """Note [A break that reads its caller's frame]: a log call at an enabled level, and
    `sys._getframe`, in an inlined helper ran in the outer frame's split code (a chain split):
    the record named the outer function and `_getframe()` returned the outer frame. Now the
    chain stops at the helper, which runs as a real call."""
    records: list[tuple[str, int]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append((record.funcName, record.lineno))

    handler = Keep()
    _probe_log.addHandler(handler)
    _probe_log.setLevel(logging.WARNING)
    _probe_log.propagate = False
    try:
        x = torch.randn(3)
        want = _calls_logging_helper(x)
        eager_records = list(records)
        records.clear()
        kiln_dynamo.reset()
        compiled = kiln_dynamo.compile(_calls_logging_helper, backend=CountingBackend())
        for _ in range(2):
            torch.testing.assert_close(compiled(x), want)
        assert eager_records[0][0] == "_logs_inside" and records == eager_records * 2
    finally:
        _probe_log.removeHandler(handler)
    kiln_dynamo.reset()
    got = kiln_dynamo.compile(_calls_frame_reader, backend=CountingBackend())(x)
    want2 = _calls_frame_reader(x)
    torch.testing.assert_close(got[0], want2[0])
    assert got[1] == want2[1] == "_reads_its_frame"


def _warn_after_break(x: torch.Tensor) -> torch.Tensor:
    y = x + 1
    print("", end="")  # a break
    warnings.warn("after the break, kiln_test_diagnostics", stacklevel=2)
    return y


def test_a_stacklevel_above_a_continuation_still_breaks() -> None:
    """A continuation's caller is kiln's split code, not the frame's: the call breaks and runs
    in Python, where the warning still reports what plain Python would."""
    x = torch.randn(3)
    expected, eager_warnings = _records(_call_module_fn, _warn_after_break, x)
    kiln_dynamo.reset()
    compiled = kiln_dynamo.compile(_warn_after_break, backend=CountingBackend())
    got, kiln_warnings = _records(_call_module_fn, compiled, x)
    torch.testing.assert_close(got, expected)
    assert [w[:2] for w in kiln_warnings] == [w[:2] for w in eager_warnings]
    assert any("above a continuation" in str(r) for r in kiln_dynamo.counters.break_reasons)


def _call_module_fn(f, x):  # type: ignore[no-untyped-def]
    return f(x)


def _names_its_caller() -> str:
    return sys._getframe(1).f_code.co_name


def _warns_its_caller() -> None:
    warnings.warn("x", stacklevel=2)


def _plain(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_which_python_functions_count_as_frame_readers() -> None:
    """Note [A break that reads its caller's frame]: a Python function called as a chain's break
    instruction stops the chain when its own code reads frames (`_getframe`, a `stacklevel`)."""
    from kiln_dynamo.breaks import _reads_frames

    assert _reads_frames(_names_its_caller.__code__)
    assert _reads_frames(_warns_its_caller.__code__)
    assert not _reads_frames(_plain.__code__)
