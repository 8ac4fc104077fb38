"""Why kiln_bench's host time per reduce-overhead call (Note [Host time per call]: the GPU drained
before each call) is 3-5x what `call_overhead.py` measures back to back on the same model (ResNet-50
at gpu size, H200: 0.58 ms against 0.12 ms). Per model: host µs per call, synced before each call
and back to back, with the garbage collector on and off, and cProfile's top functions over synced
calls. A diagnostic, run on a GPU machine:

    python scripts/gpu_host_probe.py [--models resnet,bert] [--mode reduce-overhead]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln
from kiln_bench import models
from kiln_bench.profile import host_ms


def host_us(step: Callable[[], Any], calls: int, synced: bool) -> float:
    """Synced: kiln_bench's host time (Note [Host time per call]); else back to back, drained first."""
    if synced:
        return host_ms(step, calls) * 1e3
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="resnet,bert")
    p.add_argument("--mode", default="reduce-overhead", help="'default' for kiln's default mode")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--threads", default="0,1", help="torch.set_num_threads per pass (0: as it is)")
    args = p.parse_args()
    print("tensor checker:", kiln.prepare())  # as kiln_bench does: guards read tensors in C
    default_threads = torch.get_num_threads()
    for name in args.models.split(","):
        torch.manual_seed(0)
        w = models.BUILDERS[name]("gpu", torch.Generator().manual_seed(0))
        models.calibrate_batchnorm(w.model, w.inputs)
        w = w.to("cuda", torch.bfloat16)
        w.model.eval()
        k = kiln.compile(w.model, mode=None if args.mode == "default" else args.mode)

        def step(k: Any = k, w: models.Workload = w) -> None:
            with torch.no_grad():
                models.logits_of(k(**w.inputs))

        for _ in range(5):
            step()
        rows = []
        for threads in (int(t) or default_threads for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for synced in (True, False, True, False):
                for collect in (True, False):
                    if not collect:
                        gc.disable()
                    try:
                        rows.append((threads, synced, collect, host_us(step, args.calls, synced)))
                    finally:
                        gc.enable()
        torch.set_num_threads(default_threads)
        for threads, synced, collect, us in rows:
            print(
                f"{name:8} {args.mode:16} threads {threads:2d} {'synced' if synced else 'back to back':13} "
                f"gc {'on ' if collect else 'off'} {us:8.1f} us"
            )
        prof = cProfile.Profile()
        for _ in range(args.calls):
            torch.cuda.synchronize()
            prof.enable()
            step()
            prof.disable()
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        top = sorted(
            ((tt, nc, f"{f[0].split('/')[-1]}:{f[1]}({f[2]})") for f, (_, nc, tt, _, _) in stats.items()),
            reverse=True,
        )
        for tt, nc, where in top[:10]:
            print(f"{'':10} {tt / args.calls * 1e6:8.1f} us {nc / args.calls:5.1f}  {where[:120]}")
        kiln.reset()


if __name__ == "__main__":
    main()
