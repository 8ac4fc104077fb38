"""The micro suite: kernel-level workloads where the memory system is the limit.

Each workload is a small module over float32 tensors of 1M-16M elements; its figure of merit is
achieved bandwidth, bytes that must be read and written at least once divided by the median call
time. Backends are compared in one process, calls interleaved (eager, compiled, eager, ...).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import IO

import torch
from torch import nn

from kiln_bench import accuracy, backends
from kiln_bench.harness import Result, add_profile


class PointwiseChain(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.relu(x * 2.0 + y) - 0.5) * y


class Softmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


class LayerNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class RowSum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=-1)


class ColumnSum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=0)


def workloads(device: str) -> list[tuple[str, nn.Module, tuple[torch.Tensor, ...], int]]:
    """(name, module, inputs, bytes moved) for each workload and size."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for millions in (1, 4, 16):
        n = millions * (1 << 20)
        rows, cols = n // 1024, 1024
        x = torch.randn(rows, cols, generator=gen).to(device)
        y = torch.randn(rows, cols, generator=gen).to(device)
        four = 4
        out += [
            (f"pointwise_chain_{millions}M", PointwiseChain(), (x, y), 3 * n * four),
            (f"softmax_{millions}M", Softmax(), (x,), 2 * n * four),
            (f"layer_norm_{millions}M", LayerNorm(cols).to(device), (x,), 2 * n * four),
            (f"row_sum_{millions}M", RowSum(), (x,), n * four + rows * four),
            (f"column_sum_{millions}M", ColumnSum(), (x,), n * four + cols * four),
        ]
    return out


def _time(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        fn(*inputs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run(
    backend_names: list[str],
    *,
    device: str = "cpu",
    repeats: int = 20,
    warmup: int = 3,
    progress: IO[str] | None = None,
    profile_calls: int = 0,
) -> list[Result]:
    results = []
    for name, module, inputs, nbytes in workloads(device):
        with torch.no_grad():
            reference = module(*inputs)
        for backend in backend_names:
            result = Result(name, "inference", backend, ok=False)
            try:
                backends.reset(backend)
                start = time.perf_counter()
                compiled = backends.compile_model(backend, module)
                with torch.no_grad():
                    out = compiled(*inputs)
                result.compile_s = time.perf_counter() - start
                verdict = accuracy.check_tensor(name, reference, out, None, 1e-4)
                if not verdict.ok:
                    result.reason = f"accuracy: {verdict.reason}"
                    results.append(result)
                    continue
                for _ in range(warmup):
                    _time(module, inputs, device)
                    _time(compiled, inputs, device)
                eager_t, compiled_t = [], []
                for _ in range(repeats):
                    eager_t.append(_time(module, inputs, device))
                    compiled_t.append(_time(compiled, inputs, device))
                result.eager_ms = statistics.median(eager_t) * 1e3
                result.compiled_ms = statistics.median(compiled_t) * 1e3
                result.speedup = result.eager_ms / result.compiled_ms
                result.extra = {
                    "bytes": nbytes,
                    "eager_gbps": nbytes / (result.eager_ms * 1e6),
                    "compiled_gbps": nbytes / (result.compiled_ms * 1e6),
                }
                result.ok = True
                if profile_calls:
                    step = functools.partial(_time, compiled, inputs, device)
                    add_profile(result, step, device, profile_calls)
            except Exception as e:  # a failing backend is a result
                result.reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            results.append(result)
            if progress is not None:
                print(f"  {name:<22} {backend:<9} {'ok' if result.ok else 'FAIL'}", file=progress, flush=True)
    return results
