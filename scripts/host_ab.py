"""kiln's host time per call against torch.compile's, op by op, in one process (issue 14).

On an H100 host kiln's default-mode host time per call was above torch.compile's on ResNet-50 bf16
inference (4.22 against 3.65 ms) and T5 (5.63 against 5.18), although on the CPU everything kiln
runs around the kernels is cheaper than torch.compile's (``call_overhead.py``: the frame guard,
runner and aotgrad runtime 3-5x; ``triton_wrapper_overhead.py``: the GPU wrapper with launches
and externs stubbed) and its launches cost 5.5 against 9.6 us. So the difference is in what only a
GPU runs: the extern ops' host paths (cuDNN's convolution, cuBLAS, attention), the caching
allocator, the launches. This script puts the two side by side per model, same inputs, same
process, interleaved:

* host us per call, the device drained before each call (Note [Host time per call] in
  kiln_bench.profile), medians over rounds;
* torch.profiler's host-side table per call for each backend: every aten op and CUDA runtime or
  driver call (``cudaLaunchKernel``, ``cuLaunchKernel(Ex)``, ``cudaMalloc``, ...) with its calls
  and self host us per call, the rows whose time differs most first (profiling inflates small
  events: read the counts and the differences, not the absolute us);
* cProfile's Python functions with the most own time per call, for each backend.

``--mode train`` times a training step (forward, the suite's loss, backward). On the CPU (``--device
cpu``, ``--size tiny``: call_overhead.py's models) it runs the same comparison against inductor's
C++ backend, a check that the script works more than a measurement of GPU host time.

    python scripts/host_ab.py --models resnet,t5 --device cuda --dtype bfloat16 [--mode train]
        [--size gpu] [--calls 20] [--rounds 5] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import kiln
from kiln_bench import models

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "kiln" / "bench"))


def workload(name: str, size: str, device: str, dtype: torch.dtype) -> models.Workload:
    if size == "tiny":
        from call_overhead import tiny

        w = tiny(name)
    else:
        torch.manual_seed(0)
        w = models.BUILDERS[name](size, torch.Generator().manual_seed(0))
        models.calibrate_batchnorm(w.model, w.inputs)
    return w.to(device, dtype)


def stepper(compiled: Any, w: models.Workload, train: bool) -> Callable[[], Any]:
    if train:

        def step() -> None:
            models.loss_of(w, compiled(**w.inputs)).backward()

        return step

    def infer() -> None:
        with torch.no_grad():
            models.logits_of(compiled(**w.inputs))

    return infer


def host_us(step: Callable[[], Any], calls: int, cuda: bool) -> float:
    """Median us until a call returns, the device drained before each."""
    times = []
    for _ in range(calls):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def op_table(step: Callable[[], Any], calls: int, cuda: bool) -> dict[str, tuple[float, float]]:
    """name -> (calls per step, self host us per step) from torch.profiler's host-side events."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            if cuda:
                torch.cuda.synchronize()
            step()
        if cuda:
            torch.cuda.synchronize()
    out: dict[str, tuple[float, float]] = {}
    for e in prof.key_averages():
        if e.self_cpu_time_total <= 0 and not e.count:
            continue
        out[e.key] = (e.count / calls, e.self_cpu_time_total / calls)
    return out


def py_table(step: Callable[[], Any], calls: int, cuda: bool) -> list[tuple[float, float, str]]:
    """(own us per step, calls per step, function) from cProfile, most first."""
    prof = cProfile.Profile()
    for _ in range(calls):
        if cuda:
            torch.cuda.synchronize()
        prof.enable()
        step()
        prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_, nc, tt, _, _) in stats.items():
        where = f"{Path(file).name}:{line}({func})" if file != "~" else func
        rows.append((tt / calls * 1e6, nc / calls, where))
    return sorted(rows, reverse=True)


def compare(name: str, args: argparse.Namespace) -> None:
    cuda = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype)
    train = args.mode == "train"
    w = workload(name, args.size, args.device, dtype)
    w.model.train(train)
    steps: dict[str, Callable[[], Any]] = {}
    kiln.reset()
    steps["kiln"] = stepper(kiln.compile(w.model, options=args.options), w, train)
    for _ in range(args.warmup):
        steps["kiln"]()
    torch._dynamo.reset()
    steps["tc"] = stepper(torch.compile(w.model), w, train)
    for _ in range(args.warmup):
        steps["tc"]()
    samples: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(args.rounds):
        order = list(steps.items())
        for label, step in order if r % 2 else order[::-1]:
            samples[label].append(host_us(step, args.calls, cuda))
    us = {k: statistics.median(v) for k, v in samples.items()}
    print(
        f"\n== {name} {args.mode} {args.dtype} {args.device} ({args.size}): host us per call "
        f"kiln {us['kiln']:.1f}, torch.compile {us['tc']:.1f} (kiln - tc {us['kiln'] - us['tc']:+.1f})",
        flush=True,
    )
    tables = {k: op_table(step, args.calls, cuda) for k, step in steps.items()}
    names = set(tables["kiln"]) | set(tables["tc"])
    rows = []
    for n in names:
        kc, ku = tables["kiln"].get(n, (0.0, 0.0))
        tcc, tcu = tables["tc"].get(n, (0.0, 0.0))
        rows.append((abs(ku - tcu), n, kc, ku, tcc, tcu))
    rows.sort(reverse=True)
    total = {k: sum(u for _, u in t.values()) for k, t in tables.items()}
    print(
        f"profiler, self host us per call (all events: kiln {total['kiln']:.0f}, tc {total['tc']:.0f}); "
        "rows by |difference|:"
    )
    print(f"  {'kiln calls':>10} {'kiln us':>9} {'tc calls':>9} {'tc us':>9} {'diff us':>9}  event")
    for _, n, kc, ku, tcc, tcu in rows[: args.top]:
        print(f"  {kc:10.1f} {ku:9.1f} {tcc:9.1f} {tcu:9.1f} {ku - tcu:+9.1f}  {n[:110]}")
    for label, step in steps.items():
        print(f"cProfile, {label}: own us per call (inflated for small calls), calls per call, function")
        for own, nc, where in py_table(step, args.calls, cuda)[: args.top_py]:
            print(f"  {own:9.1f} {nc:7.1f}  {where[:130]}")
    kiln.reset()
    torch._dynamo.reset()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet,t5")
    p.add_argument("--mode", default="infer", choices=["infer", "train"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--size", default="gpu", help="a kiln_bench size (gpu, cpu) or tiny (call_overhead.py's)")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=25, help="profiler rows")
    p.add_argument("--top-py", type=int, default=12, help="cProfile rows per backend")
    p.add_argument("--options", default=None, help="kiln.compile options, a Python dict literal")
    args = p.parse_args()
    if args.options:
        import ast

        args.options = ast.literal_eval(args.options)
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)
    print("tensor checker:", kiln.prepare())  # as kiln_bench does: guards read tensors in C
    for name in args.models.split(","):
        compare(name, args)


if __name__ == "__main__":
    main()
