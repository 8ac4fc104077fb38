"""Measuring one model under one backend against eager, the way MODELS.md prescribes.

For each (model, mode): build the model twice from the same seed (the second in float64, the
accuracy reference), run eager once for the reference outputs, then for each backend: empty its
caches, time the first compiled call (compile time), check accuracy, warm up, and time eager and
compiled calls alternately (A B A B ...) so that load changes hit both equally. Speedup is the
ratio of medians. Training runs forward, a cross-entropy loss on the logits and backward, and
compares the loss and every parameter's gradient. With ``profile_calls`` (``--profile``), a few
more compiled calls run under torch.profiler, and ``extra["profile"]`` says where their time
went (``kiln_bench.profile``).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from kiln_bench import accuracy, backends
from kiln_bench import profile as profiling
from kiln_bench.models import Workload, build, logits_of, loss_of

MODES = ("inference", "training")


@dataclass(slots=True)
class Result:
    model: str
    mode: str
    backend: str
    ok: bool
    reason: str = ""
    compile_s: float | None = None
    eager_ms: float | None = None
    compiled_ms: float | None = None
    speedup: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def step(workload: Workload, fn: Callable[..., Any], mode: str) -> tuple[list[str], list[torch.Tensor]]:
    """One call of fn in `mode` (a training step: forward, the suite's loss, backward, the
    gradients cleared first); returns the named tensors to compare."""
    if mode == "inference":
        with torch.no_grad():
            out = fn(**workload.inputs)
        return ["logits"], [logits_of(out)]
    params = [(n, p) for n, p in workload.model.named_parameters() if p.requires_grad]
    for _, p in params:
        p.grad = None
    loss = loss_of(workload, fn(**workload.inputs))
    loss.backward()
    names = ["loss"] + [f"grad {n}" for n, p in params if p.grad is not None]
    return names, [loss.detach()] + [p.grad for _, p in params if p.grad is not None]


def _timed(workload: Workload, fn: Callable[..., Any], mode: str, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    step(workload, fn, mode)
    _sync(device)
    return time.perf_counter() - start


_CACHE_VARS = ("KILN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


@contextlib.contextmanager
def _fresh_disk_caches() -> Iterator[None]:
    """Point every compiler's on-disk cache at a new temporary folder; restore and delete after."""
    saved = {var: os.environ.get(var) for var in _CACHE_VARS}
    with tempfile.TemporaryDirectory(prefix="kiln_bench_cache_") as root:
        for var in _CACHE_VARS:
            os.environ[var] = os.path.join(root, var.lower())
        try:
            yield
        finally:
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value


@dataclass(slots=True)
class Reference:
    """What a compiled ``workload`` is checked against in ``mode``: eager's outputs (``names``,
    ``outputs``), the same model's in float64 (``exact``), and the tolerance of the suite's
    accuracy rule for the mode and dtype (``check`` applies it)."""

    workload: Workload
    mode: str
    names: list[str]
    outputs: list[torch.Tensor]
    exact: list[torch.Tensor]
    tol: float

    def check(self, names: list[str], outputs: list[torch.Tensor]) -> accuracy.Verdict:
        if names != self.names:
            return accuracy.Verdict(False, f"outputs {names[:3]}... differ from eager's {self.names[:3]}...")
        return accuracy.check(self.names, self.outputs, outputs, self.exact, self.tol)


def reference(
    name: str, mode: str, *, size: str = "cpu", device: str = "cpu", dtype: torch.dtype = torch.float32
) -> Reference:
    """Build model `name` for `mode` (train or eval) and run eager once, and once in float64."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    workload = build(name, size).to(device, dtype)
    reference_64 = build(name, size).to(device, torch.float64)
    for w in (workload, reference_64):
        w.model.train(mode == "training")
    names, outputs = step(workload, workload.model, mode)
    _, exact = step(reference_64, reference_64.model, mode)
    tol = 1e-3 if mode == "inference" and dtype == torch.float32 else 1e-2
    return Reference(workload, mode, names, [t.clone() for t in outputs], exact, tol)


def run_model(
    name: str,
    mode: str,
    backend_names: list[str],
    *,
    size: str = "cpu",
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 20,
    warmup: int = 3,
    compile_fn: Callable[[str, torch.nn.Module], Callable[..., Any]] = backends.compile_model,
    profile_calls: int = 0,
) -> list[Result]:
    """Measure `name` in `mode` under each backend; one Result per backend (profiled over
    `profile_calls` more calls when that is not 0)."""
    ref = reference(name, mode, size=size, device=device, dtype=dtype)
    results = []
    if any(b.partition(":")[0] == "kiln" for b in backend_names):
        backends.prepare_kiln()  # once per process, outside the fresh caches below
    for backend in backend_names:
        results.append(
            _measure(
                ref,
                backend,
                device,
                repeats,
                warmup,
                compile_fn,
                profile_calls,
            )
        )
    return results


def _measure(
    ref: Reference,
    backend: str,
    device: str,
    repeats: int,
    warmup: int,
    compile_fn: Callable[[str, torch.nn.Module], Callable[..., Any]],
    profile_calls: int = 0,
) -> Result:
    workload, mode = ref.workload, ref.mode
    result = Result(workload.name, mode, backend, ok=False)
    with _fresh_disk_caches():
        try:
            backends.reset(backend)
            start = time.perf_counter()
            compiled = compile_fn(backend, workload.model)
            out_names, outputs = step(workload, compiled, mode)
            _sync(device)
            result.compile_s = time.perf_counter() - start
            result.extra.update(backends.compile_details(backend))
            traffic = backends.kernel_bytes(backend) if profile_calls else {}
            verdict = ref.check(out_names, outputs)
            if not verdict.ok:
                result.reason = f"accuracy: {verdict.reason}"
                return result
            for _ in range(warmup):
                step(workload, workload.model, mode)
                step(workload, compiled, mode)
            eager_t, compiled_t = [], []
            for _ in range(repeats):
                eager_t.append(_timed(workload, workload.model, mode, device))
                compiled_t.append(_timed(workload, compiled, mode, device))
            result.eager_ms = statistics.median(eager_t) * 1e3
            result.compiled_ms = statistics.median(compiled_t) * 1e3
            result.speedup = result.eager_ms / result.compiled_ms
            result.ok = True
            if profile_calls:
                add_profile(
                    result,
                    lambda: step(workload, compiled, mode),
                    device,
                    profile_calls,
                    kernel_bytes=traffic,
                    # Note [Eager in the same calls] (kiln_bench.profile)
                    eager=None
                    if compiled is workload.model
                    else lambda: step(workload, workload.model, mode),
                )
        except Exception as e:  # a failing backend is a result, not a crash of the suite
            result.reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return result


def add_profile(
    result: Result,
    step: Callable[[], Any],
    device: str,
    calls: int,
    kernel_bytes: dict[str, int] | None = None,
    eager: Callable[[], Any] | None = None,
) -> None:
    """Profile ``calls`` more calls of ``step`` into ``result.extra["profile"]`` (with the
    bandwidth of the generated kernels ``kernel_bytes`` names); a profiler that fails leaves the
    measured result as it is and says why in ``extra["profile_error"]``."""
    try:
        profile = profiling.profile(
            step, device, calls, result.compiled_ms, kernel_bytes=kernel_bytes, eager=eager
        )
        result.extra["profile"] = profile.to_json()
    except Exception as e:
        result.extra["profile_error"] = f"{type(e).__name__}: {e}"[:300]


def geomean(values: list[float]) -> float | None:
    if not values:
        return None
    return float(torch.tensor(values, dtype=torch.float64).log().mean().exp())
