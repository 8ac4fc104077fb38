"""kiln.compile end to end: every backend matches eager; options, fallback and strict mode."""

from __future__ import annotations

import copy
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
import kiln_dynamo


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x)))) + x[:, :8].sigmoid()


def _fresh(batch: int = 4) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Block(), torch.randn(batch, 16)


@pytest.fixture(autouse=True)
def _reset() -> None:
    kiln.reset()


@pytest.mark.parametrize("backend", kiln.BACKENDS)
def test_inference_matches_eager(backend: str) -> None:
    model, x = _fresh()
    compiled = kiln.compile(model, backend=backend, options={"strict": True})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x * 2), model(x * 2))
    assert len(kiln.compile_log()) == 1  # one graph, reused by the second call


@pytest.mark.parametrize("backend", kiln.BACKENDS)
def test_training_gradients_match_eager(backend: str) -> None:
    model, x = _fresh()
    model(x).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = kiln.compile(model, backend=backend, options={"strict": True})
    compiled(x).square().mean().backward()
    for p, g in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, g)


def _matmul_under_no_grad(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        y = x @ w
    return y.relu() * 2, y


def _matmul_under_no_grad_with_a_loss(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        y = x @ w
    return (x.t() @ y).sum(), y


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
@pytest.mark.parametrize("f", [_matmul_under_no_grad, _matmul_under_no_grad_with_a_loss])
def test_a_no_grad_block_on_inputs_that_require_grad(cpu_backend: str, f: Any) -> None:
    """Note [Inference graphs of inputs that require grad] (kiln_aotgrad): the C++ generator's
    mm(out=...) raised in grad mode (a run-time fallback) and an output required grad where
    eager's did not."""
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 3)
    compiled = kiln.compile(f, options={"strict": True, "cpu_backend": cpu_backend})
    got, want = compiled(x, w), f(x, w)
    torch.testing.assert_close(got, want)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want]
    if want[0].requires_grad:
        (gx,) = torch.autograd.grad(got[0], x)
        torch.testing.assert_close(gx, torch.autograd.grad(want[0], x)[0])


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_conjugate_views_compile_to_eagers_values(cpu_backend: str) -> None:
    """Note [Conjugate and negative views are traced as computations] (kiln_aotgrad): a resolved
    conjugate came back as the input itself, and hfft's backward fell back."""
    opts = {"strict": True, "cpu_backend": cpu_backend}

    def resolved(z: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(z.conj().resolve_conj()) * 2

    z = torch.randn(3, 4, dtype=torch.complex64)
    torch.testing.assert_close(kiln.compile(resolved, options=opts)(z), resolved(z))

    def hfft(x: torch.Tensor) -> torch.Tensor:
        return torch.fft.hfft(x, norm="ortho")

    x = torch.randn(3, 5, requires_grad=True)
    got, want = kiln.compile(hfft, options=opts)(x), hfft(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])


def test_torch_compile_accepts_kiln_backend() -> None:
    model, x = _fresh()
    compiled = torch.compile(model, backend=kiln.backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    torch.compiler.reset()


def test_decorator_form() -> None:
    @kiln.compile(backend="kiln")
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.sin() + b).relu() * 2

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(f(a, b), (a.sin() + b).relu() * 2)


def test_unsupported_options_are_clear_errors() -> None:
    model, _ = _fresh()
    with pytest.raises(TypeError, match="dynamic must be None, True or False"):
        kiln.compile(model, dynamic="yes")
    with pytest.raises(ValueError, match=r"unknown kiln\.compile mode 'fastest'"):
        kiln.compile(model, mode="fastest")
    with pytest.raises(ValueError, match=r"unknown kiln\.compile options"):
        kiln.compile(model, options={"fast": True})
    with pytest.raises(ValueError, match="unknown backend"):
        kiln.compile(model, backend="nope")


def test_cpp_options_reach_the_cpp_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """`options={"cpp_options": ...}` builds the C++ backend with them (here: the compiler flag of
    `vector_width`), and is part of the cache key: another value compiles again."""
    import kiln_codegen_cpp.backend as cpp_backend
    from kiln_codegen_cpp import CppOptions

    seen: list[tuple[str, ...]] = []
    real = cpp_backend.start_build

    def spy(source: str, extra_flags: tuple[str, ...] = (), **kwargs: Any) -> Any:
        seen.append(extra_flags)
        return real(source, extra_flags, **kwargs)

    monkeypatch.setattr(cpp_backend, "start_build", spy)
    model, x = _fresh()
    with torch.no_grad():
        expected = model(x)
        wide = kiln.compile(model, options={"cpp_options": {"vector_width": 256}})
        torch.testing.assert_close(wide(x), expected)
        assert seen == [("-mprefer-vector-width=256",)]
        plain = kiln.compile(model)
        torch.testing.assert_close(plain(x), expected)
        # the default's own flags: 512-bit vectors on an AVX-512 build target, none elsewhere
        # (Note [512-bit vectors on AVX-512 targets] in kiln_codegen_cpp's options.py)
        assert seen[1:] == [CppOptions().compiler_flags()]
    with pytest.raises(ValueError, match="vector_width"):
        kiln.compile(model, options={"cpp_options": {"vector_width": 3}})
    with pytest.raises(ValueError, match="unknown C\\+\\+ codegen options"):
        kiln.compile(model, options={"cpp_options": {"fastest": True}})


def test_triton_options_reach_the_triton_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """`options={"triton_options": ...}` builds the Triton backend with them (here: the default
    mode's autotuning of kernels above a size, set to one byte so that every kernel that may be
    timed is), and a malformed one fails at kiln.compile."""
    from kiln_codegen_triton import counters

    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 2).sum(1)

    x = torch.randn(16, 40)
    before = counters["autotuned"]
    tuned = kiln.compile(fn, options={"cpu_backend": "triton", "triton_options": {"autotune_min_bytes": 1}})
    torch.testing.assert_close(tuned(x), fn(x))
    assert counters["autotuned"] > before
    with pytest.raises(ValueError, match="unknown triton option"):
        kiln.compile(fn, options={"triton_options": {"fastest": True}})
    with pytest.raises(ValueError, match="must be int"):
        kiln.compile(fn, options={"triton_options": {"autotune_min_bytes": "16M"}})


def _break_loopir(monkeypatch: pytest.MonkeyPatch) -> None:
    import kiln_loopir

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("lowering exploded")

    monkeypatch.setattr(kiln_loopir, "compile_graph", broken)


def test_backend_failure_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    _break_loopir(monkeypatch)
    model, x = _fresh()
    compiled = kiln.compile(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
    messages = [str(w.message) for w in caught if "kiln backend" in str(w.message)]
    assert messages and "lowering exploded" in messages[0] and "eagerly" in messages[0]
    assert kiln.compile_log()[0].fell_back is not None


def test_strict_mode_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _break_loopir(monkeypatch)
    model, x = _fresh()
    compiled = kiln.compile(model, options={"strict": True})
    with pytest.raises(Exception, match="lowering exploded"), torch.no_grad():
        compiled(x)


class _FailsAtRunTime:
    """A compiled graph that compiled fine and raises when run (counts its calls)."""

    def __init__(self, real: Any) -> None:
        self.real, self.stats, self.calls = real, real.stats, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        raise RuntimeError("kernel exploded")


def _fail_at_run_time(monkeypatch: pytest.MonkeyPatch) -> list[_FailsAtRunTime]:
    import kiln_loopir

    real_compile, made = kiln_loopir.compile_graph, []

    def compile_graph(*args: Any, **kwargs: Any) -> _FailsAtRunTime:
        made.append(_FailsAtRunTime(real_compile(*args, **kwargs)))
        return made[-1]

    monkeypatch.setattr(kiln_loopir, "compile_graph", compile_graph)
    return made


@pytest.mark.parametrize("train", [False, True])
def test_run_time_failure_falls_back_to_eager_for_good(monkeypatch: pytest.MonkeyPatch, train: bool) -> None:
    """Note [Run-time fallback]: the first call returns eager's result with a warning; the graph
    then runs eagerly, without calling the compiled code again."""
    made = _fail_at_run_time(monkeypatch)
    model, x = _fresh()
    compiled = kiln.compile(model)
    with warnings.catch_warnings(record=True) as caught, torch.set_grad_enabled(train):
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    messages = [str(w.message) for w in caught if "kiln backend" in str(w.message)]
    assert len(messages) == 1, messages
    assert "at run time" in messages[0] and "kernel exploded" in messages[0] and "eagerly" in messages[0]
    assert "test_kiln_api.py" in messages[0]  # the user's frame
    assert sum(m.calls for m in made) == 1  # only the first call ran compiled code (train: fw and bw)
    assert kiln.compile_log()[0].fell_back is not None


def test_run_time_failure_in_strict_mode_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_at_run_time(monkeypatch)
    model, x = _fresh()
    compiled = kiln.compile(model, options={"strict": True})
    with pytest.raises(kiln.BackendFailed, match="kernel exploded"), torch.no_grad():
        compiled(x)


def _fail_backward_at_run_time(monkeypatch: pytest.MonkeyPatch) -> list[_FailsAtRunTime]:
    """Only backward graphs (those taking tangents) compile into code that raises when run."""
    import kiln_loopir

    real_compile, made = kiln_loopir.compile_graph, []

    def compile_graph(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        compiled = real_compile(gm, *args, **kwargs)
        if not any(n.op == "placeholder" and n.name.startswith("tangents") for n in gm.graph.nodes):
            return compiled
        made.append(_FailsAtRunTime(compiled))
        return made[-1]

    monkeypatch.setattr(kiln_loopir, "compile_graph", compile_graph)
    return made


def test_backward_failure_falls_back_to_eager_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Backward fallback]: a compiled backward that raises on its first call runs its aten
    graph eagerly, with a warning naming the exception and the user's frame; gradients are
    eager's, and later backwards never call the compiled code again."""
    made = _fail_backward_at_run_time(monkeypatch)
    model, x = _fresh()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            for m in (model, reference):
                m.zero_grad()
            y = compiled(x * (step + 1))
            torch.testing.assert_close(y, reference(x * (step + 1)))
            y.square().mean().backward()
            reference(x * (step + 1)).square().mean().backward()
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad)
    messages = [str(w.message) for w in caught if "kiln backend" in str(w.message)]
    assert len(messages) == 1, messages
    assert "in the backward at run time" in messages[0] and "kernel exploded" in messages[0]
    assert "backward graph" in messages[0] and "eagerly" in messages[0]
    assert "test_kiln_api.py" in messages[0]  # the user's frame
    assert len(made) == 1 and made[0].calls == 1  # one backward graph, its compiled code run once
    assert kiln.compile_log()[0].fell_back is not None


def test_backward_failure_in_strict_mode_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_backward_at_run_time(monkeypatch)
    model, x = _fresh()
    y = kiln.compile(model, options={"strict": True})(x)
    with pytest.raises(kiln.BackendFailed, match="kernel exploded"):
        y.sum().backward()


def test_a_backward_eager_cannot_run_either_raises_eagers_error() -> None:
    """Note [Backward fallback]: only a backward that eager runs falls back; otherwise eager's
    exception (its type) is raised, and nothing is switched or warned about."""
    from kiln.backends import GraphCompile, _BackwardFallback

    def grads(saved: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.index_select.default(saved, 0, index)

    gm = torch.fx.symbolic_trace(grads)

    def compiled(*args: Any) -> Any:
        raise RuntimeError("kernel exploded")

    record = GraphCompile(graph="graph_0", nodes=3)
    guarded = _BackwardFallback(gm, compiled, record, strict=False, backend="kiln")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(IndexError):
            guarded(torch.randn(3), torch.tensor([5]))
    assert not caught and record.fell_back is None
    with pytest.warns(RuntimeWarning, match="in the backward at run time.*kernel exploded"):
        assert torch.equal(guarded(torch.arange(3.0), torch.tensor([2])), torch.tensor([2.0]))
    assert record.fell_back is not None and "kernel exploded" in record.fell_back


@torch.library.custom_op("kiln_test_api::half_rows", mutates_args=())
def _half_rows(x: torch.Tensor) -> torch.Tensor:
    return x[: x.shape[0] // 2].clone()


@_half_rows.register_fake
def _half_rows_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)  # wrong, as the meta kernel of _embedding_bag was on the CPU


def _lied_about(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.kiln_test_api.half_rows.default(x) + 1


def test_a_meta_kernel_that_lies_falls_back_at_run_time() -> None:
    """A real case of Note [Run-time fallback]: the compiled graph fails on its first call (an
    extern result of another shape than its meta kernel said); eager's answer, the op named."""
    x = torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(kiln.compile(_lied_about)(x), _lied_about(x))
    messages = [str(w.message) for w in caught if "kiln backend" in str(w.message)]
    assert messages and "kiln_test_api.half_rows.default returned shape [2, 3]" in messages[0]
    assert "_lied_about" in messages[0]
    kiln.reset()
    with pytest.raises(kiln.BackendFailed, match="half_rows"):
        kiln.compile(_lied_about, options={"strict": True})(x)


def _index(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x[i] * 2


def _int_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a // b + 1


@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (_index, (torch.randn(4), torch.tensor([1, 7]))),
        (_int_div, (torch.tensor([3, 4]), torch.tensor([1, 0]))),
    ],
    ids=["index-out-of-range", "integer-division-by-zero"],
)
def test_users_own_errors_still_raise_as_in_eager(
    monkeypatch: pytest.MonkeyPatch, fn: Any, args: tuple[torch.Tensor, ...], forced: bool
) -> None:
    """Only a graph that eager runs falls back: the user's errors raise eager's exception type,
    whether the compiled code found them (forced=False) or failed otherwise (forced=True)."""
    if forced:
        _fail_at_run_time(monkeypatch)
    with pytest.raises(Exception) as eager_error:
        fn(*args)
    compiled = kiln.compile(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(eager_error.type) as compiled_error:
            compiled(*args)
    assert compiled_error.type is eager_error.type
    assert not [w for w in caught if "kiln backend" in str(w.message)]


def test_the_test_session_compiles_into_a_private_cache() -> None:
    """conftest.py: kiln's tests never read or write the user's ~/.cache/kiln."""
    import tempfile

    from kiln_loopir.diskcache import cache_root

    root = cache_root()
    assert root.parent == Path(tempfile.gettempdir()) and root.name.startswith("kiln-tests-")
    model, x = _fresh(batch=3)
    with torch.no_grad():
        kiln.compile(model)(x)
    assert any((root / "cpp").rglob("*.so"))  # the build went there


def test_compile_log_has_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    model, x = _fresh(batch=5)  # a shape no other test compiles: its kernels are not loaded yet
    with torch.no_grad():
        kiln.compile(model)(x)
    (record,) = kiln.compile_log()
    assert record.nodes > 0 and record.frame.startswith("forward (")
    assert set(record.phases) == {
        "capture",
        "aotgrad",
        "lower",
        "schedule",
        "codegen",
        "compile",
        "first run",
    }
    assert all(v > 0 for v in record.phases.values()), record.phases
    assert record.cache == {"compile": "compiled"}
    # The same graph compiled again in this process reuses the loaded kernels.
    kiln.reset()
    model2, _ = _fresh(batch=5)
    with torch.no_grad():
        kiln.compile(model2)(x)
    (again,) = kiln.compile_log()
    assert again.cache == {"compile": "memory"}
    assert again.phases["compile"] < record.phases["compile"]
    # reset(kernels=True): as a new process, the kernels come from the disk cache
    kiln.reset(kernels=True)
    with torch.no_grad():
        kiln.compile(_fresh(batch=5)[0])(x)
    (third,) = kiln.compile_log()
    assert third.cache == {"compile": "disk"}


def test_training_graph_sums_forward_and_backward_phases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    model, x = _fresh(batch=6)
    out = kiln.compile(model)(x)
    (record,) = kiln.compile_log()
    forward_first_run = record.phases["first run"]
    out.sum().backward()
    # The backward's first call (inside backward()) is part of the compile's first run too.
    assert record.phases["first run"] > forward_first_run
    # Forward and backward are two aten graphs, each compiled (the cache entry names both).
    assert record.cache["compile"].split("+") == ["compiled", "compiled"]


def test_compile_log_gives_generated_kernels_their_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Note [Bandwidth of generated kernels] (kiln_bench's profile.py): the Triton generator says
    # what each kernel's buffers span, forward and backward kernels together; C++ says nothing
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    model, x = _fresh(batch=7)
    kiln.compile(model, options={"cpu_backend": "triton"})(x).sum().backward()
    (record,) = kiln.compile_log()
    assert record.kernel_bytes and all(n.startswith("triton_") for n in record.kernel_bytes), record
    known = [b for b in record.kernel_bytes.values() if b is not None]
    assert known and min(known) > 0 and max(known) >= x.numel() * x.element_size(), record.kernel_bytes
    kiln.reset()
    model, x = _fresh(batch=7)
    kiln.compile(model)(x).sum().backward()
    (record,) = kiln.compile_log()
    assert record.kernel_bytes == {}


@pytest.fixture
def _kiln_log_levels() -> Any:
    """configure() turns an artifact off by removing its handler, not its level: left at INFO,
    kiln.perf would send a record per compile to pytest's handlers for the rest of the session,
    each kept by the test then running (test_cache_leak.py's tracemalloc counted them)."""
    loggers = [logging.getLogger(name) for name in ("kiln.perf", "kiln.dynamic")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


@pytest.mark.usefixtures("_kiln_log_levels")
def test_perf_log_reports_phases(caplog: pytest.LogCaptureFixture) -> None:
    from kiln import logs

    assert logs.configure("graph,perf") and not logs.configure("graph")
    model, x = _fresh()
    with caplog.at_level("INFO", logger="kiln.perf"), torch.no_grad():
        kiln.compile(model)(x)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "kiln.perf"]
    for phase in ("capture", "aotgrad", "lower", "schedule", "codegen", "compile"):
        assert f"{phase} " in line, line
    assert "nodes" in line and "total" in line


def test_capture_stats_counts_graphs() -> None:
    model, x = _fresh()
    with torch.no_grad():
        kiln.compile(model)(x)
    stats = kiln.capture_stats()
    assert stats.graphs == 1 and stats.frames_not_captured == []


_INTERPRETER_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="Triton runs compiled here (Note [Triton's interpreter is process-wide])",
)


@_INTERPRETER_ONLY
def test_cpu_backend_triton_generates_triton_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """`options={"cpu_backend": "triton"}`: CPU graphs get Triton kernels, run by Triton's
    interpreter, forward and backward, and match eager; it is part of the cache key."""
    import kiln_codegen_triton
    import kiln_loopir

    real_compile, backends = kiln_loopir.compile_graph, []

    def compile_graph(*args: Any, **kwargs: Any) -> Any:
        backends.append(kwargs["backend"])
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(kiln_loopir, "compile_graph", compile_graph)
    model, x = _fresh()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"cpu_backend": "triton", "strict": True})
    torch.testing.assert_close(compiled(x), reference(x))
    compiled(x).square().mean().backward()
    reference(x).square().mean().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    # one training graph: forward and backward
    assert len(backends) == 2 and all(isinstance(b, kiln_codegen_triton.TritonBackend) for b in backends)
    assert all(b.last_specs for b in backends)  # kernels were generated, none declined
    assert all(r.declined == [] for r in kiln.compile_log())
    with torch.no_grad():
        kiln.compile(model)(x)  # the C++ backend: another cache entry, not the Triton one
    # a static forward graph gets a CppBackend with guarded layouts (Note [Inputs the frame guard
    # checks in the C++ wrapper]), others the name
    assert getattr(backends[-1], "name", backends[-1]) == "cpp"


def test_cpu_backend_triton_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model, x = _fresh()
    with pytest.raises(kiln.BackendFailed, match="TRITON_INTERPRET=1"), torch.no_grad():
        kiln.compile(model, options={"cpu_backend": "triton", "strict": True})(x)
    kiln.reset()
    with pytest.warns(RuntimeWarning, match="TRITON_INTERPRET=1"), torch.no_grad():
        torch.testing.assert_close(kiln.compile(model, options={"cpu_backend": "triton"})(x), model(x))
    with pytest.raises(ValueError, match="unknown cpu_backend 'halide'"):
        kiln.compile(model, options={"cpu_backend": "halide"})


@_INTERPRETER_ONLY
def test_kernels_loopir_interprets_are_reported() -> None:
    """A kernel the code generator declines runs in loopir's reference interpreter: right, but
    not compiled; the compile log names it (the OpInfo sweeps count it as a fallback)."""

    def fn(x: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return x.index_put((i,), v, accumulate=True)  # int8 atomic adds are not generated

    args = (
        torch.zeros(6, dtype=torch.int8),
        torch.tensor([1, 1, 4]),
        torch.ones(3, dtype=torch.int8),
    )
    got = kiln.compile(fn, options={"cpu_backend": "triton", "strict": True})(*args)
    torch.testing.assert_close(got, fn(*args))
    (record,) = kiln.compile_log()
    assert record.declined and "atomic add" in record.declined[0][1]


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_every_torch_compile_mode_compiles_on_the_cpu(mode: str) -> None:
    # Note [Modes]: on the CPU a mode changes nothing kiln generates; the result is still right.
    model, x = _fresh()
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model, mode=mode)(x), model(x))


def test_another_mode_or_options_recompiles_and_the_same_reuses() -> None:
    """Issue 18: the backend, its mode and its options are part of every cache entry."""
    model, x = _fresh()
    with torch.no_grad():
        expected = model(x)
        for mode, options in [
            (None, None),
            (None, None),  # an equal compile reuses the entry
            ("default", None),  # the same as no mode
            ("reduce-overhead", None),
            (None, {"strict": True}),
            ("reduce-overhead", None),  # reuses the reduce-overhead entry
        ]:
            compiled = kiln.compile(model, backend="aot_eager", mode=mode, options=options)
            torch.testing.assert_close(compiled(x), expected)
        torch.testing.assert_close(kiln.compile(model, backend="eager")(x), expected)
    assert kiln.capture_stats().graphs == 4  # default, reduce-overhead, strict, eager
    failures = kiln_dynamo.counters.guard_failures
    assert len(failures) == 3 and all("the running compile() is" in f for f in failures), failures


def test_cuda_graphs_get_a_triton_backend_with_the_mode() -> None:
    from kiln.backends import _codegen
    from kiln_codegen_triton import TritonBackend

    chosen = _codegen(torch.device("cuda"), "max-autotune")
    assert isinstance(chosen, TritonBackend) and chosen.mode == "max-autotune"
    assert _codegen(torch.device("cpu"), "max-autotune") == "cpp"


class Chatty(nn.Module):
    """A model with a graph break: a data-dependent Python branch on a tensor value."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x).relu()
        if y.sum() > 0:  # the break: Python needs the value
            y = y * 2
        return y.sigmoid()


def test_explain_reports_the_break_in_the_users_words() -> None:
    torch.manual_seed(0)
    model, x = Chatty(), torch.randn(4, 8)
    report = kiln.explain(model)(x)
    assert report.graph_count == 2 and report.graph_break_count == 1
    (reason,) = report.break_reasons
    assert "data-dependent branch" in reason.reason
    assert reason.filename == __file__ and "if y.sum() > 0" in reason.source
    text = str(report)
    assert "2 graph(s), 1 graph break(s)" in text and "if y.sum() > 0" in text
    torch.testing.assert_close(report.result, model(x))


def test_a_model_with_a_break_compiles_both_sides_and_counts_it() -> None:
    torch.manual_seed(0)
    model, x = Chatty(), torch.randn(4, 8)
    with torch.no_grad():
        compiled = kiln.compile(model)
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(-x), model(-x))  # the other branch
    stats = kiln.capture_stats()
    assert stats.graph_breaks >= 1 and stats.frames_not_captured == []
    assert all(record.fell_back is None for record in kiln.compile_log())
    with pytest.raises(kiln_dynamo.Unsupported, match="data-dependent branch"):
        kiln.compile(Chatty(), fullgraph=True)(x)


def test_pass_options_reach_loopir(caplog: pytest.LogCaptureFixture) -> None:
    # loopir's graph passes are switched through kiln.compile's options (kiln_loopir.PassOptions)
    kiln.reset()
    model = torch.nn.Sequential(torch.nn.Linear(10, 37), torch.nn.ReLU())  # N = 37, K = 10: misaligned
    x = torch.randn(6, 10)
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"), torch.no_grad():
        torch.testing.assert_close(
            kiln.compile(model, options={"pad_mm": "force", "strict": True})(x), model(x)
        )
    assert "pad_mm: pad" in caplog.text
    caplog.clear()
    kiln.reset()
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"), torch.no_grad():
        torch.testing.assert_close(kiln.compile(model, options={"pad_mm": False})(x), model(x))
    assert "pad_mm: off" in caplog.text and "pad_mm: pad" not in caplog.text
    with pytest.raises(ValueError, match="pad_mm"):
        kiln.compile(model, options={"pad_mm": "sometimes"})


class TiedHead(nn.Module):
    """A language model's tied LM head with a bias (BERT's), vocabulary misaligned for padding."""

    def __init__(self, vocab: int = 30, hidden: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.bias = nn.Parameter(torch.randn(vocab))

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(self.norm(self.emb(ids)), self.emb.weight, self.bias)
        return logits, logits[:, -1]


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
@pytest.mark.parametrize("train", [False, True])
def test_outputs_viewing_a_padded_gemm_match_eager(cpu_backend: str, train: bool) -> None:
    """Note [Bases returned in another layout] (kiln_aotgrad joint.py): the padded LM head's
    result is a slice of the padded buffer, and the logits viewed over it came back laid out with
    the unpadded strides (BERT's training on the H200: the loss and every gradient wrong)."""
    torch.manual_seed(0)
    model, ids = TiedHead(), torch.randint(0, 30, (2, 8))
    labels = torch.randint(0, 30, (2, 8))
    compiled = kiln.compile(model, options={"pad_mm": "force", "strict": True, "cpu_backend": cpu_backend})

    def step(fn: Any) -> list[torch.Tensor]:
        model.zero_grad()
        with torch.set_grad_enabled(train):
            logits, last = fn(ids)
            loss = F.cross_entropy(logits.view(-1, 30), labels.view(-1))
            if not train:
                return [logits, last, loss]
            loss.backward()
        return [logits.detach(), last.detach(), loss.detach()] + [p.grad.clone() for p in model.parameters()]

    expected = step(model)
    for _ in range(2):
        torch.testing.assert_close(step(compiled), expected)


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_as_strided_of_a_view_of_an_offset_input_matches_eager(cpu_backend: str) -> None:
    """Note [as_strided reads its root's storage] (kiln_aotgrad tracer.py): the diagonal became an
    extern view held in a buffer of its own, and as_strided's storage offset read past it."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = x.diagonal(offset=1).as_strided((2, 2), (1, 1), 12)
        return t * -1, F.pad(t, (0, 2, 0, 2))

    x = torch.randn(5, 4)[1:]
    torch.testing.assert_close(kiln.compile(f, options={"strict": True, "cpu_backend": cpu_backend})(x), f(x))


def _as_strided_read_after_a_write(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    t = x.diagonal(offset=1).as_strided((2, 2), (1, 1), 12)
    u = torch.addmm(t, t, t.t(), beta=2)
    with torch.no_grad():
        x.masked_fill_(x @ x > 0, 3.0)
    return (torch.where(t > 0, t, u) * -1,)


@pytest.mark.parametrize("pad_mm", [None, "force"])
@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_as_strided_of_an_offset_input_read_after_its_write_matches_eager(
    cpu_backend: str, pad_mm: str | None
) -> None:
    """Note [as_strided reads its root's storage] (kiln_aotgrad tracer.py): read after the write,
    the view was replayed on the written input's diagonal, an extern held in a buffer of its own,
    and read past it (fuzzer seed 22016 under --pad-mm, minimised)."""
    x = torch.randn(5, 4)[1:]
    x_eager = torch.randn(5, 4)[1:]
    x_eager.copy_(x)
    options = {"strict": True, "cpu_backend": cpu_backend, **({"pad_mm": pad_mm} if pad_mm else {})}
    got = kiln.compile(_as_strided_read_after_a_write, options=options)(x)
    torch.testing.assert_close(got, _as_strided_read_after_a_write(x_eager))
    torch.testing.assert_close(x, x_eager)


class HandWrittenAttention(nn.Module):
    """Attention as older models write it: explicit scores, additive mask, softmax, product."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (y.view(b, t, 4, 8).transpose(1, 2) for y in self.qkv(x).split(32, dim=2))
        att = torch.softmax(q @ k.transpose(-2, -1) * (1.0 / 8**0.5) + mask, dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, t, c)


def test_hand_written_attention_becomes_sdpa(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model, x = HandWrittenAttention(), torch.randn(2, 8, 32)
    mask = torch.triu(torch.full((8, 8), float("-inf")), 1)  # causal, additive
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"), torch.no_grad():
        torch.testing.assert_close(kiln.compile(model, options={"strict": True})(x, mask), model(x, mask))
    assert "attention: rewrite" in caplog.text and "scaled_dot_product_attention" in caplog.text


class MinGPTAttention(HandWrittenAttention):
    """minGPT's causal self-attention: a 0/1 buffer mask applied with masked_fill(-inf)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (y.view(b, t, 4, 8).transpose(1, 2) for y in self.qkv(x).split(32, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / 8**0.5)
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        return (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)


def test_mingpt_attention_becomes_sdpa(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model, x = MinGPTAttention(), torch.randn(2, 8, 32)
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"), torch.no_grad():
        torch.testing.assert_close(kiln.compile(model, options={"strict": True})(x, x), model(x, x))
    assert "attention: rewrite" in caplog.text and "excluding" in caplog.text


def test_other_pass_options_recompile() -> None:
    """A compile with other graph-pass switches is another compile (its cache key says so)."""
    model, x = _fresh()
    kiln.compile(model)(x)
    assert len(kiln.compile_log()) == 1
    kiln.compile(model, options={"layout": False})(x)
    assert len(kiln.compile_log()) == 2
    kiln.compile(model, options={"layout": False})(x)
    assert len(kiln.compile_log()) == 2


class BroadcastMaskAttention(nn.Module):
    """SDPA with a padding mask built by ``expand`` (last dim of stride 0), as transformers does."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 192)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
        mask = keep[:, None, :, None].expand(b, 1, n, n)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, n, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_with_a_broadcast_mask_runs_a_fused_kernel_on_cuda(
    dtype: torch.dtype, caplog: pytest.LogCaptureFixture
) -> None:
    # Note [Attention masks that are constant along a row]: on CUDA the mask is applied after
    # an unmasked attention, so the traced graph holds a fused kernel, not the math decomposition
    kiln.reset()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = BroadcastMaskAttention().to(device, dtype).eval()
    x = torch.randn(2, 32, 64, device=device, dtype=dtype)
    keep = torch.rand(2, 32, device=device) > 0.2
    keep[:, 0] = True
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"), torch.no_grad():
        torch.testing.assert_close(
            kiln.compile(model, options={"strict": True})(x, keep), model(x, keep), **tol
        )
    assert ("attention_mask: unmasked" in caplog.text) == (device == "cuda")


@pytest.mark.parametrize("overlap", [True, False])
def test_a_failing_cpp_build_in_training_falls_back_with_eagers_gradients(
    monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """Note [Builds that overlap] (kiln_codegen_cpp): a C++ build that fails reaches the graph's
    first call (or, off, its compile); either way the step returns eager's values and gradients,
    with one warning that carries the compiler's message."""
    monkeypatch.setenv("KILN_CPP_FLAGS", "-O2 --no-such-flag-for-kiln")
    model, x = _fresh()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"cpp_options": {"overlap_builds": overlap}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(2):
            for m in (model, reference):
                m.zero_grad()
            y = compiled(x * (step + 1))
            expected = reference(x * (step + 1))
            torch.testing.assert_close(y, expected)
            y.square().mean().backward()
            expected.square().mean().backward()
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad)
    messages = [str(w.message) for w in caught if "kiln backend" in str(w.message)]
    assert messages and all("no-such-flag-for-kiln" in m for m in messages), messages
    assert "eagerly" in messages[0]
