"""Steady-state call overhead of kiln_dynamo.compile(backend="eager") vs eager vs torch.compile.

Run: python packages/dynamo/bench/overhead.py [--suite all | --suite resnet,gpt2] [--reps 15]
Prints, per model: eager µs/call; kiln_dynamo (backend "eager") with C guard trees and with
Python guards (KILN_C_GUARDS=0's path), each with its overhead over eager; torch.compile
(backend="eager"); and the guards alone, C and Python (bench/guards.py). Interleaves the runs,
takes medians. Without --suite: three small models defined here; with it, kiln_bench's public
models at cpu size (needs kiln_bench and transformers). This is a benchmark, not a test:
numbers depend on the machine and its load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from guards import best_us, guards_of_one_call  # bench/guards.py, beside this file
from torch import nn

import kiln_dynamo
from kiln_dynamo import guard_tree
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
    """µs per call, in this thread's CPU time (torch runs one thread here: see __main__)."""
    t0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t0) / n * 1e6


def measure(name: str, model: nn.Module, inputs: dict[str, Any], reps: int = 15, n: int = 200) -> None:
    """One row: eager, kiln with C guard trees, kiln with Python guards, torch.compile(eager),
    interleaved (A B C D A B C D ...), medians; and the guards alone, C and Python."""
    model.eval()
    kiln_dynamo.reset()
    kiln_c = kiln_dynamo.compile(model, backend="eager")
    previous = guard_tree.set_c_guards(False)
    try:
        kiln_py = kiln_dynamo.compile(model, backend="eager")
        with torch.no_grad():
            for _ in range(3):
                kiln_py(**inputs)  # its entries hold Python guards
    finally:
        guard_tree.set_c_guards(previous)
    tc = torch.compile(model, backend="eager")
    runs: dict[str, Callable[[], Any]] = {
        "eager": lambda: model(**inputs),
        "kiln C": lambda: kiln_c(**inputs),
        "kiln Py": lambda: kiln_py(**inputs),
        "torch.compile": lambda: tc(**inputs),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    with torch.no_grad():
        for f in runs.values():
            for _ in range(5):
                f()
        for _ in range(reps):
            for k, f in runs.items():
                times[k].append(_time(f, n))
    med = {k: statistics.median(v) for k, v in times.items()}
    _, guards = guards_of_one_call(model, inputs, train=False)
    previous_key, ACTIVE.key = ACTIVE.key, kiln_c._kiln_key
    try:
        with torch.no_grad():
            g_c = best_us(lambda: [t(*v) for t, v in guards], max(n, 500), 7)
            g_py = best_us(lambda: [t.reference.fn(*v) for t, v in guards], max(n, 500), 7)
    finally:
        ACTIVE.key = previous_key
    e = med["eager"]

    def pct(k: str) -> str:
        return f"{med[k]:9.1f} us ({(med[k] / e - 1) * 100:+5.1f}%)"

    print(
        f"{name:<26} eager {e:9.1f} us | kiln C {pct('kiln C')} | kiln Py {pct('kiln Py')} | "
        f"torch.compile(eager) {pct('torch.compile')} | guard C {g_c:6.1f} us, Py {g_py:6.1f} us",
        flush=True,
    )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--suite", default="", help="kiln_bench models (comma-separated, or 'all') at cpu size"
    )
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if not args.suite:
        measure("MLP 64-256-256-10, b=32", MLP(), {"x": torch.randn(32, 64)}, args.reps, args.calls)
        measure("transformer block d=128", Block(), {"x": torch.randn(4, 32, 128)}, args.reps, args.calls)
        measure("50 params, many attrs", ManyAttrs(), {"x": torch.randn(8, 16)}, args.reps, args.calls)
    else:
        from kiln_bench.models import MODEL_NAMES, build

        for model_name in MODEL_NAMES if args.suite == "all" else args.suite.split(","):
            w = build(model_name, "cpu")
            measure(model_name, w.model, w.inputs, args.reps, args.calls)
