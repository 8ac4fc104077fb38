"""Steady-state call overhead of kiln_dynamo.compile(backend="eager") vs eager vs torch.compile.

Run: PYTHONPATH=packages/dynamo/src:packages/frame_hook/src python packages/dynamo/bench/overhead.py
Prints, per model: eager µs/call, kiln µs/call (overhead %), torch.compile(backend="eager")
µs/call (overhead %), and kiln's guard-evaluation µs/call. Interleaves the runs, takes medians.
This is a benchmark, not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import kiln_dynamo
import kiln_frame_hook
from kiln_dynamo.backends import ACTIVE


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Block(nn.Module):
    def __init__(self, d: int = 128, h: int = 4) -> None:
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
        q, k, v = (z.view(b, n, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x))


class ManyAttrs(nn.Module):
    """50 parameters and many Python-level attributes read in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(25)])
        self.scales = [1.0 + i / 100 for i in range(25)]
        self.use_residual = True
        self.activation = "relu"
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, s in zip(self.layers, self.scales, strict=True):
            y = layer(x) * s
            y = torch.relu(y) if self.activation == "relu" else torch.tanh(y)
            x = x + y if self.use_residual else y
        return x / (x.norm() + self.eps)


def _time(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def measure(name: str, model: nn.Module, x: torch.Tensor, reps: int = 15, n: int = 200) -> None:
    model.eval()
    kiln_dynamo.reset()
    kiln = kiln_dynamo.compile(model, backend="eager")
    tc = torch.compile(model, backend="eager")
    with torch.no_grad():
        for f in (model, kiln, tc):
            for _ in range(5):
                f(x)
        e, k, c = [], [], []
        for _ in range(reps):
            e.append(_time(lambda: model(x), n))
            k.append(_time(lambda: kiln(x), n))
            c.append(_time(lambda: tc(x), n))
        entry = kiln_frame_hook.cache_entries(type(model).forward.__code__)[0]
        values = (model, x)
        ACTIVE.key = kiln._kiln_key  # the guard checks the compile first (backends.py)
        assert entry.guard(*values) is True
        g = _time(lambda: entry.guard(*values), 2000)
        ACTIVE.key = None
    me, mk, mc = statistics.median(e), statistics.median(k), statistics.median(c)
    print(
        f"{name:<28} eager {me:8.1f} us | kiln {mk:8.1f} us ({(mk / me - 1) * 100:+5.1f}%) | "
        f"torch.compile(eager) {mc:8.1f} us ({(mc / me - 1) * 100:+5.1f}%) | kiln guard {g:6.1f} us"
    )


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    measure("MLP 64-256-256-10, b=32", MLP(), torch.randn(32, 64))
    measure("transformer block d=128", Block(), torch.randn(4, 32, 128))
    measure("50 params, many attrs", ManyAttrs(), torch.randn(8, 16))
