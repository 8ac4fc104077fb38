"""`logging` and `warnings` inside a compiled frame (variables/diagnostics.py).

Note [Log calls at a disabled level]: a disabled level is a guarded no-op, an enabled one a break;
Note [Warnings replayed after the graph]: `warnings.warn` is replayed after the graph with eager's
file, line, module and registry.
"""

from __future__ import annotations

import logging
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
