"""Issue 20 diagnostic: which OpenMP runtimes a process holds after kiln's C++ kernels ran, and
GPT-2's inference step (cpu size) at a thread count, eager against kiln. Run on the 16-core host
under different OpenMP environments (OMP_WAIT_POLICY, GOMP_SPINCOUNT) to tell a second runtime or
spinning teams apart (twenty-second session, H100 host: one runtime, torch's `libgomp.so.1`; with
the guard checker building in the background, `--no-prepare`, GPT-2 at 16 threads took 368 ms eager
and 164 ms compiled, against 3.7 ms eager in `threads.py`):

    python scripts/omp_probe.py --threads 16 [--models gpt2,bert]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import kiln
from kiln_bench import models


def omp_libs() -> list[str]:
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "omp" in line.rsplit("/", 1)[-1]})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--models", default="gpt2")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument(
        "--no-prepare",
        dest="prepare",
        action="store_false",
        help="leave the checker to build in the background",
    )
    args = p.parse_args()
    if args.prepare:  # the guard checker built first, not beside the timed calls
        print("guard checker:", kiln.prepare())
    torch.set_num_threads(args.threads)
    env = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_", "KMP_", "KILN_OMP"))}
    print("env", env, "threads", torch.get_num_threads())
    print("omp before:", omp_libs())
    for name in args.models.split(","):
        w = models.BUILDERS[name]("cpu", torch.Generator().manual_seed(0))
        w.model.eval()
        k = kiln.compile(w.model)
        with torch.no_grad():
            for fn in (w.model, k, w.model, k):
                fn(**w.inputs)
            times: dict[str, list[float]] = {"eager": [], "kiln": []}
            for _ in range(args.calls):
                for label, fn in (("eager", w.model), ("kiln", k)):
                    t = time.perf_counter()
                    fn(**w.inputs)
                    times[label].append((time.perf_counter() - t) * 1e3)
        e, c = statistics.median(times["eager"]), statistics.median(times["kiln"])
        print(f"{name} {args.threads}t eager {e:.3f} ms kiln {c:.3f} ms ({e / c:.2f}x)")
    print("omp after:", omp_libs())


if __name__ == "__main__":
    main()
