"""Throughput of kiln's cpp backend against eager and torch.compile (inductor), in one run.

For each workload (float32, 1M-16M elements) the three implementations are timed interleaved
(A B C A B C ...) on the same inputs, each call timed alone with ``perf_counter``; the table gives
the median time (and the minimum: on a shared machine preemption inflates medians), the achieved
bandwidth (the bytes a perfect kernel must move: inputs read once,
outputs written once, divided by the median) and kiln's speed relative to the other two. Compile
time is kiln's ``compile_graph`` (cold cache) against inductor's first call minus an eager call
(cold cache). This is a benchmark, not a test: numbers depend on the machine and its load.

    PYTHONPATH=packages/codegen_cpp/src:packages/loopir/src \\
        python packages/codegen_cpp/bench/throughput.py [--reps 15] [--threads 1] [--only softmax,layer_norm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

_tmp = tempfile.mkdtemp(prefix="kiln-bench-")
os.environ.setdefault("KILN_CACHE_DIR", os.path.join(_tmp, "kiln"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_tmp, "inductor"))

import torch  # noqa: E402
import torch.fx  # noqa: E402

import kiln_loopir  # noqa: E402
from kiln_codegen_cpp import CppBackend  # noqa: E402

aten = torch.ops.aten


def pointwise_chain(x: torch.Tensor, y: torch.Tensor) -> Any:
    a = aten.add.Tensor(aten.mul.Tensor(x, 1.5), y)
    b = aten.mul.Tensor(aten.sigmoid.default(a), a)
    return aten.sub.Tensor(aten.mul.Tensor(b, b), x)


def gelu_chain(x: torch.Tensor) -> Any:
    return aten.mul.Tensor(aten.gelu.default(x), 2.0)


def softmax(x: torch.Tensor) -> Any:
    return aten._softmax.default(x, -1, False)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    return aten.native_layer_norm.default(x, [x.shape[-1]], w, b, 1e-5)[0]


def gelu_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    # an MLP block's tail: the norm's two passes over the row both need gelu(x)
    return aten.native_layer_norm.default(aten.gelu.default(x), [x.shape[-1]], w, b, 1e-5)[0]


def row_sum(x: torch.Tensor) -> Any:
    return aten.sum.dim_IntList(x, [1])


def col_sum(x: torch.Tensor) -> Any:
    return aten.sum.dim_IntList(x, [0])


def row_max(x: torch.Tensor) -> Any:
    return aten.amax.default(x, [1])


def full_sum(x: torch.Tensor) -> Any:
    return aten.sum.default(x)


def _workloads() -> list[tuple[str, Callable[..., Any], list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    rows, cols = 2048, 2048  # 4M elements
    return [
        ("pointwise 1M", pointwise_chain, [r(1 << 20), r(1 << 20)]),
        ("pointwise 16M", pointwise_chain, [r(1 << 24), r(1 << 24)]),
        ("gelu 16M", gelu_chain, [r(1 << 24)]),
        ("softmax 4M", softmax, [r(rows, cols)]),
        ("softmax 1M (rows of 256)", softmax, [r(4096, 256)]),
        ("layer_norm 4M", layer_norm, [r(rows, cols), r(cols), r(cols)]),
        ("layer_norm 1M (rows of 768)", layer_norm, [r(1365, 768), r(768), r(768)]),
        ("gelu+layer_norm 4M", gelu_layer_norm, [r(rows, cols), r(cols), r(cols)]),
        ("row sum 16M", row_sum, [r(4096, 4096)]),
        ("col sum 16M", col_sum, [r(4096, 4096)]),
        ("row max 4M", row_max, [r(rows, cols)]),
        ("full sum 16M", full_sum, [r(1 << 24)]),
    ]


def _nbytes(values: Any) -> int:
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, list | tuple):
        return sum(_nbytes(v) for v in values)
    return 0


def _time(fn: Callable[..., Any], args: list[torch.Tensor]) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--only", default="", help="comma-separated parts of workload names")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpus {os.cpu_count()}")
    rows = []
    for name, fn, args in _workloads():
        if opts.only and not any(part in name for part in opts.only.split(",")):
            continue
        gm = torch.fx.symbolic_trace(fn)
        t0 = time.perf_counter()
        kiln = kiln_loopir.compile_graph(gm, args, backend=CppBackend())
        kiln_compile = time.perf_counter() - t0
        impls: dict[str, Callable[..., Any]] = {"eager": fn, "kiln": kiln}
        ind_compile = float("nan")
        if not opts.no_inductor:
            compiled = torch.compile(fn)
            eager_once = _time(fn, args)
            ind_compile = _time(compiled, args) - eager_once
            impls["inductor"] = compiled
        expected = fn(*args)
        got = kiln(*args)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        for impl in impls.values():  # warm-up
            for _ in range(3):
                impl(*args)
        times: dict[str, list[float]] = {k: [] for k in impls}
        for _ in range(opts.reps):
            for key, impl in impls.items():
                times[key].append(_time(impl, args))
        nbytes = _nbytes(args) + _nbytes(expected)
        med = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        rows.append((name, nbytes, med, best, kiln_compile, ind_compile))
        _print_row(rows[-1])
        sys.stdout.flush()
    print()
    print(
        "| workload | eager GB/s | inductor GB/s | kiln GB/s | kiln/eager | kiln/inductor "
        "| kiln/inductor (min) | compile kiln s | compile inductor s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    nan = float("nan")
    for name, nbytes, med, best, kc, ic in rows:
        gbs = {k: nbytes / v / 1e9 for k, v in med.items()}
        print(
            f"| {name} | {gbs['eager']:.2f} | {gbs.get('inductor', nan):.2f} | {gbs['kiln']:.2f} | "
            f"{med['eager'] / med['kiln']:.2f}x | {med.get('inductor', nan) / med['kiln']:.2f}x | "
            f"{best.get('inductor', nan) / best['kiln']:.2f}x | {kc:.2f} | {ic:.2f} |"
        )


def _print_row(row: tuple[str, int, dict[str, float], dict[str, float], float, float]) -> None:
    name, _, med, best, kc, ic = row
    parts = ", ".join(f"{k} {v * 1e3:.3f} ms (min {best[k] * 1e3:.3f})" for k, v in med.items())
    print(f"{name}: {parts}; compile kiln {kc:.2f}s inductor {ic:.2f}s", flush=True)


if __name__ == "__main__":
    main()
