"""The C++ kernels of one training step, each timed by itself: which kernels a model's time goes to.

``kernel_ab.py`` reads kernel times from ``torch.profiler`` ranges (``KILN_PROFILE=1``), which
include the Python side of each call and the range itself (~5-10 us): on a model with 150 small
kernels (Swin at CPU size) that is most of what it reports. Here each kernel function the
compiled wrappers call (``k_<name>`` in the wrapper's namespace) is wrapped by a
``perf_counter_ns`` pair (~0.2 us), and for each call site the fastest of ``--calls`` steps is
kept: on the shared 2-core machine the fastest call of a kernel hardly moves while whole steps
move by 10-30%. Also prints the step's median CPU time (``time.process_time``) for eager and
kiln, interleaved. To compare two versions of the generator, run it from each checkout (or with
``PYTHONPATH`` naming the other ``codegen_cpp/src``), or switch one optimization off
(``KILN_CPP_OPTIONS=column_sum_fusion=0``, ``--kiln-options view_scatter=false``). A benchmark,
not a test.

    python packages/codegen_cpp/bench/kernel_time.py --models swin --top 10
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

os.environ.setdefault("KILN_PROFILE", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from train1 import MODELS, _parse_options, _step

import kiln


def _wrap_kernels(times: dict[str, list[int]]) -> int:
    """Wrap every ``k_*`` kernel in the namespaces of the live compiled wrappers; their count."""
    wrappers = 0
    for obj in gc.get_objects():
        if not (callable(obj) and getattr(obj, "__name__", "") == "call" and hasattr(obj, "__globals__")):
            continue
        namespace = obj.__globals__
        names = [k for k in namespace if k.startswith("k_") and not getattr(namespace[k], "_timed", False)]
        if not names:
            continue
        wrappers += 1
        for name in names:

            def timed(*args: Any, _fn: Callable[..., Any] = namespace[name], _name: str = name) -> Any:
                t0 = time.perf_counter_ns()
                out = _fn(*args)
                times[_name].append(time.perf_counter_ns() - t0)
                return out

            timed._timed = True  # type: ignore[attr-defined]
            namespace[name] = timed
    return wrappers


def run(name: str, calls: int, top: int, options: dict[str, Any] | None = None) -> None:
    w = MODELS[name]()
    w.model.train()
    model = copy.deepcopy(w.model)
    compiled = kiln.compile(model, options=options or None)
    _step(w, compiled, model)
    times: dict[str, list[int]] = defaultdict(list)
    wrappers = _wrap_kernels(times)
    for _ in range(3):
        _step(w, compiled, model)
    times.clear()
    eager, kiln_cpu = [], []
    for _ in range(calls):
        t0 = time.process_time()
        _step(w, w.model)
        eager.append(time.process_time() - t0)
        t0 = time.process_time()
        _step(w, compiled, model)
        kiln_cpu.append(time.process_time() - t0)
    rows = []
    for kernel, ns in times.items():
        per_step = len(ns) // calls
        if per_step:
            rows.append((sum(min(ns[i::per_step]) for i in range(per_step)) / 1e3, per_step, kernel[2:]))
    total = sum(r[0] for r in rows)
    e, k = statistics.median(eager) * 1e3, statistics.median(kiln_cpu) * 1e3
    print(
        f"{name}: {wrappers} wrappers, {sum(r[1] for r in rows)} kernel calls a step, fastest-call sum "
        f"{total / 1e3:.3f} ms; step CPU median eager {e:.3f} ms, kiln {k:.3f} ms ({e / k:.3f}x)",
        flush=True,
    )
    for us, per_step, kernel in sorted(rows, reverse=True)[:top]:
        print(f"  {us:8.1f} us x{per_step} {kernel}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="swin")
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--kiln-options", default="", help="k=v,... passed to kiln.compile(options=)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = _parse_options(args.kiln_options)
    for name in args.models.split(","):
        run(name, args.calls, args.top, options)


if __name__ == "__main__":
    main()
