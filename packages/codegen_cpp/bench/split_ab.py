"""A/B of split reductions with few outputs (Note [Reductions with few outputs]): on and off.

Each case is one aten reduction compiled twice through the cpp backend, ``split_reductions``
on (A) and off (B), timed interleaved (A B A B ...) at each thread count: medians and fastest
calls in microseconds (on a busy 2-core machine a team of two threads stalls whenever another
process holds a core, and only the fastest calls show what the split does there).
A benchmark, not a test.

    python packages/codegen_cpp/bench/split_ab.py --threads 1,2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph

aten = torch.ops.aten

CASES: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "row sum [4, 262144]": (lambda x: aten.sum.dim_IntList(x, [1]), (4, 262144)),
    "row var_mean [8, 65536]": (lambda x: aten.var_mean.correction(x, [1], correction=0)[0], (8, 65536)),
    "bias grad [256, 256].sum(0)": (lambda x: aten.sum.dim_IntList(x, [0]), (256, 256)),
    "bias grad [2048, 192].sum(0)": (lambda x: aten.sum.dim_IntList(x, [0]), (2048, 192)),
    "col sum [65536, 40].sum(0)": (lambda x: aten.sum.dim_IntList(x, [0]), (65536, 40)),
}


def _time(fn: Callable[..., Any], x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    for name, (fn, shape) in CASES.items():
        x = torch.randn(shape)
        gm = torch.fx.symbolic_trace(fn)
        on = compile_graph(gm, [x], backend=CppBackend({"split_reductions": True}))
        off = compile_graph(gm, [x], backend=CppBackend({"split_reductions": False}))
        torch.testing.assert_close(on(x), off(x), rtol=1e-4, atol=1e-4)
        row = [f"{name:32}"]
        for n in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(n)
            for _ in range(10):
                on(x), off(x)
            a, b = [], []
            for _ in range(args.repeats):
                a.append(_time(on, x))
                b.append(_time(off, x))
            ma, mb = statistics.median(a) * 1e6, statistics.median(b) * 1e6
            fa, fb = min(a) * 1e6, min(b) * 1e6
            row.append(
                f"{n}T split {ma:8.1f} us (fastest {fa:7.1f}), unsplit {mb:8.1f} us (fastest {fb:7.1f}): "
                f"{mb / ma:4.2f}x ({fb / fa:4.2f}x)"
            )
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
