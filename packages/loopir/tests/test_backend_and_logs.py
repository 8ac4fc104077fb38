"""The backend registry (in-process and entry points), KILN_LOG artifacts, and the layering rule."""

from __future__ import annotations

import logging
import pathlib
import sys
from typing import Any

import pytest
import torch
from helpers import aten, check, make, trace

from kiln_loopir import Backend, available_backends, compile_graph, get_backend, register_backend
from kiln_loopir.interpret import InterpretBackend


def _fn(x: Any) -> Any:
    return aten.relu.default(aten.add.Tensor(aten.sin.default(x), 1))


def test_interpret_is_the_default_backend() -> None:
    assert isinstance(get_backend("interpret"), InterpretBackend)
    assert "interpret" in available_backends()
    with pytest.raises(KeyError, match="no loopir backend"):
        get_backend("no-such-backend")


def test_registered_backend_sees_every_kernel() -> None:
    seen: list[str] = []

    class Recording(InterpretBackend):
        def codegen_kernel(self, node: Any, graph: Any) -> Any:
            seen.append(node.name)
            return super().codegen_kernel(node, graph)

    register_backend("recording-test", Recording)
    x = make((4, 4))
    compiled = compile_graph(trace(_fn), [x], backend="recording-test")
    torch.testing.assert_close(compiled(x), _fn(x))
    assert len(seen) == compiled.stats.kernels == 1


def test_backend_test_session_gives_a_private_cache_and_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [A code generator's test session]: a fresh cache directory in KILN_CACHE_DIR, and the
    backend registered in process only where no entry point advertises the name."""
    import os

    import kiln_loopir.backend as backend_module
    from kiln_loopir.diskcache import cache_root
    from kiln_loopir.testing import backend_test_session

    monkeypatch.setenv("KILN_CACHE_DIR", "/nowhere")
    monkeypatch.setattr(backend_module, "_REGISTRY", dict(backend_module._REGISTRY))
    made: list[str] = []

    def factory() -> Backend:
        made.append("session-test")
        return InterpretBackend()

    cache = backend_test_session("session-test", factory, "kiln-session-test-")
    assert os.path.isdir(cache) and os.listdir(cache) == []
    assert os.path.basename(cache).startswith("kiln-session-test-") and cache_root() == pathlib.Path(cache)
    assert isinstance(get_backend("session-test"), InterpretBackend) and made == ["session-test"]
    os.rmdir(cache)

    class Advertised:
        name = "session-advertised"

    monkeypatch.setattr(
        backend_module.importlib.metadata, "entry_points", lambda group: [Advertised()] if group else []
    )
    os.rmdir(backend_test_session("session-advertised", factory, "kiln-session-test-"))
    assert "session-advertised" not in backend_module._REGISTRY


def test_a_declined_kernel_is_recorded_in_one_form(caplog: pytest.LogCaptureFixture) -> None:
    """Note [Declined kernels]: (node, "<type>: <message>") and a debug line on the generator's
    logger, whatever the generator."""
    backend = InterpretBackend()
    backend.last_declined = []
    log = logging.getLogger("kiln.test_declined")
    with caplog.at_level(logging.DEBUG, logger="kiln.test_declined"):
        backend.decline("buf3", NotImplementedError("ops.frexp"), log)
    assert backend.last_declined == [("buf3", "NotImplementedError: ops.frexp")]
    assert [r.getMessage() for r in caplog.records] == ["kernel buf3 runs in the interpreter: ops.frexp"]


def test_a_declined_kernel_refuses_a_graph_of_symbolic_sizes() -> None:
    """Note [Declined kernels]: under symbolic sizes the first declined kernel refuses the graph,
    in the generator's exception; a static graph, or one with nothing declined, passes."""
    from types import SimpleNamespace

    class Refused(Exception):
        pass

    backend = InterpretBackend()
    backend.last_declined = [("buf2", "NotImplementedError: ops.frexp"), ("buf5", "UnsupportedDtype: x")]
    static, symbolic = (SimpleNamespace(sizevars=SimpleNamespace(symbolic=s)) for s in (False, True))
    backend.refuse_declined_symbolic(static, Refused, "Test")  # type: ignore[arg-type]
    with pytest.raises(
        Refused, match=r"^kernel buf2: the Test generator declined it with symbolic sizes \(Not"
    ):
        backend.refuse_declined_symbolic(symbolic, Refused, "Test")  # type: ignore[arg-type]
    backend.last_declined = []
    backend.refuse_declined_symbolic(symbolic, Refused, "Test")  # type: ignore[arg-type]


def test_backend_found_through_entry_point(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A code generator advertises itself in its metadata; loopir never imports it by name."""
    (tmp_path / "fake_codegen.py").write_text(
        "from kiln_loopir.interpret import InterpretBackend\n"
        "class FakeBackend(InterpretBackend):\n"
        "    name = 'fake'\n"
    )
    dist = tmp_path / "fake_codegen-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-codegen\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[kiln_loopir.backends]\nfake = fake_codegen:FakeBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "fake" in available_backends()
    backend = get_backend("fake")
    assert isinstance(backend, Backend) and backend.name == "fake"
    x = make((4, 4))
    torch.testing.assert_close(compile_graph(trace(_fn), [x], backend="fake")(x), _fn(x))
    monkeypatch.delitem(sys.modules, "fake_codegen", raising=False)


def _softmax(x: Any) -> Any:
    return aten._softmax.default(x, 1, False)


def test_kiln_log_prints_ir_and_schedule(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KILN_LOG", "ir,schedule")
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir"):
        check(_softmax, make((4, 8)))
    text = caplog.text
    assert "Reduction(ranges=[4], reduction_ranges=[8])" in text
    assert "load(x, r0 + 8*x0)" in text
    assert "store_reduction(buf0, x0, tmp2)" in text
    assert "fuse buf" in text
    assert "schedule:" in text and "Fused:" in text
    for name in ("kiln.loopir.ir", "kiln.loopir.schedule"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_inputs_other_than_compiled_for_are_refused() -> None:
    compiled = compile_graph(trace(_fn), [make((4, 4))])
    with pytest.raises(ValueError, match="compiled for"):
        compiled(make((8, 4)))
    with pytest.raises(ValueError, match="compiled for"):
        compiled(make((4, 4), torch.float64))


def test_non_tensor_inputs_are_constants_of_the_compiled_graph() -> None:
    def fn(x: Any, k: Any) -> Any:
        return aten.mul.Tensor(x, k)

    gm = torch.fx.symbolic_trace(fn, concrete_args={})
    x = make((3, 3))
    compiled = compile_graph(gm, [x, 3])
    torch.testing.assert_close(compiled(x, 3), x * 3)
    with pytest.raises(ValueError, match="constant 3"):
        compiled(x, 4)


def test_check_compiled_runs_compares_and_refuses_declines() -> None:
    """kiln_loopir.testing.check_compiled, the tail of every code generator's ``check``: each
    call's result against the expected one (after ``reconcile``), then no declined kernel."""
    from kiln_loopir.testing import check_compiled

    class Declining(InterpretBackend):
        def __init__(self, declined: list[tuple[str, str]]) -> None:
            self.last_declined = declined

    x = make((4, 4))
    gm = trace(_fn)
    seen: list[Any] = []

    def reconcile(expected: Any, actual: Any) -> Any:
        seen.append(actual)
        return expected

    compiled = check_compiled(gm, [x], _fn(x), Declining([]), calls=3, reconcile=reconcile)
    torch.testing.assert_close(compiled(x), _fn(x))
    assert len(seen) == 3
    with pytest.raises(AssertionError, match="output"):
        check_compiled(gm, [x], _fn(x) + 1, Declining([]))
    declined = [("buf0", "NotImplementedError: ops.sin")]
    with pytest.raises(AssertionError, match=r"ops\.sin"):
        check_compiled(gm, [x], _fn(x), Declining(declined))
    check_compiled(gm, [x], _fn(x), Declining(declined), allow_declined=True)
