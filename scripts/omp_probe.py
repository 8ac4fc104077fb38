"""Issue 20 diagnostic: which OpenMP runtimes a process holds after kiln's C++ kernels ran, and
GPT-2's inference step (cpu size) at a thread count, eager against kiln. Run on the 16-core host
under different OpenMP environments (OMP_WAIT_POLICY, GOMP_SPINCOUNT) to tell a second runtime or
spinning teams apart (twenty-second session, H100 host: one runtime, torch's `libgomp.so.1`; with
the guard checker building in the background, `--no-prepare`, GPT-2 at 16 threads took 368 ms eager
and 164 ms compiled, against 3.7 ms eager in `threads.py`):

    python scripts/omp_probe.py --threads 16 [--models gpt2,bert] [--cpp vector_width=256] [--micro]

Twenty-third session: at 16 threads on that host only GPT-2's kernels that compute `tanh` (its GELU)
were slow (threads.py: 0.064 ms at 4 threads, 7.8 ms at 16). `--micro` times single activations
(tanh GELU, erf GELU, tanh alone, a multiply) on GPT-2's (256, 1024) activations, eager against kiln,
and against kiln with each `--cpp` option set (C++ generator options, e.g. `vector_width=256`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

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
    p.add_argument(
        "--cpp", action="append", default=[], help="KEY=INT: a C++ generator option for a second kiln"
    )
    p.add_argument("--micro", action="store_true", help="time single activations, not the models")
    args = p.parse_args()
    if args.prepare:  # the guard checker built first, not beside the timed calls
        print("guard checker:", kiln.prepare())
    torch.set_num_threads(args.threads)
    env = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_", "KMP_", "KILN_OMP"))}
    print("env", env, "threads", torch.get_num_threads())
    print("omp before:", omp_libs())
    cpp = {k: int(v) for k, v in (kv.split("=") for kv in args.cpp)}
    work: list[tuple[str, Callable[..., Any], dict[str, Any]]] = []
    if args.micro:
        x = torch.randn(256, 1024)
        for label, f in MICRO.items():
            work.append((label, f, {"x": x}))
    else:
        for name in args.models.split(","):
            w = models.BUILDERS[name]("cpu", torch.Generator().manual_seed(0))
            work.append((name, w.model.eval(), w.inputs))
    for name, model, inputs in work:
        fns: dict[str, Callable[..., Any]] = {"eager": model, "kiln": kiln.compile(model)}
        if cpp:
            fns["kiln+cpp"] = kiln.compile(model, options={"cpp_options": cpp})
        with torch.no_grad():
            for _ in range(2):
                for fn in fns.values():
                    fn(**inputs)
            times: dict[str, list[float]] = {label: [] for label in fns}
            for _ in range(args.calls):
                for label, fn in fns.items():
                    t = time.perf_counter()
                    fn(**inputs)
                    times[label].append((time.perf_counter() - t) * 1e3)
        e = statistics.median(times["eager"])
        row = " ".join(f"{label} {statistics.median(v):.3f} ms" for label, v in times.items())
        print(f"{name} {args.threads}t {row} (kiln {e / statistics.median(times['kiln']):.2f}x) {cpp or ''}")
    print("omp after:", omp_libs())


MICRO: dict[str, Callable[..., Any]] = {
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x + 1, approximate="tanh"),
    "gelu_erf": lambda x: torch.nn.functional.gelu(x + 1),
    "tanh": lambda x: torch.tanh(x + 1),
    "mul": lambda x: (x + 1) * 0.5,
}


if __name__ == "__main__":
    main()
