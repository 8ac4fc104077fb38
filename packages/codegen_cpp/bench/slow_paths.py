"""libmvec's scalar path in generated kernels: a log over zeros, a softmax over masked scores.

Notes [Logarithms off libmvec's slow path] and [Exponentials off libmvec's slow path] (prelude.py):
glibc's vector log and exp run a whole vector through a scalar loop when one lane is special (a
zero for log; a result that underflows or overflows for exp). This times small graphs whose
inputs hold such lanes, each compiled twice (the guards on, and off through ``guarded_log`` /
``guarded_exp``), against eager, at each thread count: the fastest of ``--calls`` calls.
A benchmark, not a test.

    python packages/codegen_cpp/bench/slow_paths.py --threads 1,2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from kiln_codegen_cpp import CppBackend, CppOptions
from kiln_loopir import compile_graph
from kiln_loopir.testing import trace

aten = torch.ops.aten


def _fastest(fn: Callable[..., Any], x: torch.Tensor, calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def _cases() -> list[tuple[str, Callable[..., Any], torch.Tensor]]:
    n = 1 << 16
    positive = torch.arange(n, dtype=torch.float32) % 100 + 1
    zeros = positive.clone()
    zeros[1::2] = 0
    scores = torch.randn(4, 256, 256)
    causal = torch.ones(256, 256, dtype=torch.bool).tril()

    def log(v: torch.Tensor) -> Any:
        return aten.log.default(v)

    def softmax(v: torch.Tensor) -> Any:
        return aten._softmax.default(v, -1, False)

    return [
        ("log, positive [65536]", log, positive),
        ("log, half zeros [65536]", log, zeros),
        ("softmax [4, 256, 256]", softmax, scores),
        ("softmax, causal -inf", softmax, scores.masked_fill(~causal, float("-inf"))),
        ("softmax, causal finfo.min", softmax, scores.masked_fill(~causal, torch.finfo(torch.float32).min)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    variants = {"guarded": CppOptions(), "plain": CppOptions(guarded_log=False, guarded_exp=False)}
    for label, fn, x in _cases():
        compiled = {k: compile_graph(trace(fn), [x], backend=CppBackend(o)) for k, o in variants.items()}
        ref = fn(x)
        for c in compiled.values():
            torch.testing.assert_close(c(x), ref, equal_nan=True)
        for n in counts:
            torch.set_num_threads(n)
            cells = [f"{k} {_fastest(c, x, args.calls):8.1f}" for k, c in compiled.items()]
            cells.append(f"eager {_fastest(fn, x, args.calls):8.1f}")
            print(f"{label:28s} {n:2d}t  " + "  ".join(cells) + "  (us)", flush=True)


if __name__ == "__main__":
    main()
