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
(``KILN_CPP_OPTIONS=column_sum_fusion=0``, ``--kiln-options view_scatter=false``), or time a
second copy under other generator switches in the same process, its steps interleaved with the
first's (``--ab-cpp column_sum_fusion=1``: one process, so the machine's load moves both alike).
A benchmark, not a test.

    python packages/codegen_cpp/bench/kernel_time.py --models swin --top 10

``--inference`` times no-grad forward calls of the model in eval mode instead of training steps
(``--models suite.t5 --inference --ab-cpp table_columns_inner=0``).

``--threads 1,2`` times kiln's kernels at each thread count instead (the same compiled copy: the
thread count is read at run time, Note [Parallel plan] in parallel.py) and prints each kernel's
fastest call per count and its scaling over the first: a kernel that runs in parallel gets ~1.8x
at two threads, a serial one stays at 1.0x (``--models suite.resnet --threads 1,2``; with
``--ab-cpp weigh_statements=0`` a second copy under other generator switches, in the same rounds).
A kernel called several times a step keeps its fastest call (its call sites are not told apart).

``--ab-options k=v,...`` times a second copy compiled with other ``kiln.compile`` options (over
``--kiln-options``), its steps interleaved with the first's, as ``--ab-cpp`` does for generator
switches (``--models suite.llama --ab-options recompute_sources=false``: aotgrad's and loopir's
decisions, which change which kernels there are).
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


def _infer(w: Any, fn: Callable[..., Any], model: Any = None) -> Any:
    """One inference call (``--inference``), in place of a training step."""
    with torch.no_grad():
        return fn(**w.inputs)


def _compiled(
    w: Any, options: dict[str, Any] | None, cpp: str | None, step: Callable[..., Any] = _step
) -> tuple[Any, Any]:
    """A copy of the model compiled by kiln (its C++ generator under ``KILN_CPP_OPTIONS=cpp``
    when given), after one step, so both of its wrappers exist."""
    model = copy.deepcopy(w.model)
    saved = os.environ.get("KILN_CPP_OPTIONS")
    if cpp is not None:
        os.environ["KILN_CPP_OPTIONS"] = cpp
        # an explicit default makes kiln's cache key differ, so the copy compiles anew
        options = {"layout": True, **(options or {})}
    try:
        compiled = kiln.compile(model, options=options or None)
        step(w, compiled, model)
    finally:
        if saved is None:
            os.environ.pop("KILN_CPP_OPTIONS", None)
        else:
            os.environ["KILN_CPP_OPTIONS"] = saved
    return compiled, model


def _rows(times: dict[str, list[int]], calls: int) -> list[tuple[float, int, str]]:
    rows = []
    for kernel, ns in times.items():
        per_step = len(ns) // calls
        if per_step:
            rows.append((sum(min(ns[i::per_step]) for i in range(per_step)) / 1e3, per_step, kernel[2:]))
    return rows


def run(
    name: str,
    calls: int,
    top: int,
    options: dict[str, Any] | None = None,
    ab_cpp: str | None = None,
    inference: bool = False,
    ab_options: dict[str, Any] | None = None,
) -> None:
    w = MODELS[name]()
    w.model.train(not inference)
    step = _infer if inference else _step
    variants: dict[str, tuple[Any, Any, dict[str, list[int]], int]] = {}
    for label, cpp in (("kiln", None), ("kiln_ab", ab_cpp)):
        if label == "kiln_ab" and ab_cpp is None and not ab_options:
            continue
        opts = {**(options or {}), **(ab_options or {})} if label == "kiln_ab" else options
        compiled, model = _compiled(w, opts, cpp, step)
        times: dict[str, list[int]] = defaultdict(list)
        wrappers = _wrap_kernels(times)  # only this copy's: the others are wrapped already
        variants[label] = (compiled, model, times, wrappers)
    for compiled, model, _, _ in variants.values():
        for _ in range(3):
            step(w, compiled, model)
    for _, _, times, _ in variants.values():
        times.clear()
    cpu: dict[str, list[float]] = {"eager": [], **{label: [] for label in variants}}
    for _ in range(calls):  # interleaved: eager, kiln, kiln_ab, eager, ...
        t0 = time.process_time()
        step(w, w.model)
        cpu["eager"].append(time.process_time() - t0)
        for label, (compiled, model, _, _) in variants.items():
            t0 = time.process_time()
            step(w, compiled, model)
            cpu[label].append(time.process_time() - t0)
    e = statistics.median(cpu["eager"]) * 1e3
    for label, (_, _, times, wrappers) in variants.items():
        rows = _rows(times, calls)
        total = sum(r[0] for r in rows)
        k = statistics.median(cpu[label]) * 1e3
        print(
            f"{name} {label}: {wrappers} wrappers, {sum(r[1] for r in rows)} kernel calls a step, fastest-call "
            f"sum {total / 1e3:.3f} ms; step CPU median eager {e:.3f} ms, {label} {k:.3f} ms ({e / k:.3f}x)",
            flush=True,
        )
        for us, per_step, kernel in sorted(rows, reverse=True)[:top]:
            print(f"  {us:8.1f} us x{per_step} {kernel}", flush=True)


def scaling(name: str, calls: int, top: int, counts: list[int], options: dict[str, Any] | None,
            inference: bool, ab_cpp: str | None = None) -> None:  # fmt: skip
    """``--threads``: each kernel's fastest call at each thread count, the first count's slowest
    ``top`` kernels, with their scaling; with ``--ab-cpp`` a second copy under those generator
    switches too. The counts (and copies) take turns step by step, ``calls`` rounds, so that a
    moment when the other core is busy (a two-thread team then waits for its second thread)
    hits them alike and the fastest call of each is from a quiet moment."""
    w = MODELS[name]()
    w.model.train(not inference)
    step = _infer if inference else _step
    copies: dict[str, tuple[Any, Any, dict[str, list[int]]]] = {}
    for label, cpp in (("kiln", None), ("kiln_ab", ab_cpp)):
        if label == "kiln_ab" and ab_cpp is None:
            continue
        compiled, model = _compiled(w, options, cpp, step)
        times: dict[str, list[int]] = defaultdict(list)
        _wrap_kernels(times)
        copies[label] = (compiled, model, times)
    per: dict[tuple[str, int], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for round_ in range(calls + 2):
        for n in counts:
            torch.set_num_threads(n)
            # a step after the switch, untimed: the first team after it makes the pool's new
            # threads, which on a loaded machine wait a scheduler tick (~4 ms) to start
            step(w, *next(iter(copies.values()))[:2])
            for label, (compiled, model, times) in copies.items():
                times.clear()
                step(w, compiled, model)
                if round_ >= 2:  # two warm-up rounds
                    for kernel, ns in times.items():
                        per[label, n][kernel].extend(ns)
    torch.set_num_threads(1)
    print(f"{name} ({'inference' if inference else 'training'}): fastest call, us")
    for label in copies:
        fastest = {n: {k: min(v) / 1e3 for k, v in per[label, n].items()} for n in counts}
        first = fastest[counts[0]]
        print(f" {label}" + (f" (KILN_CPP_OPTIONS={ab_cpp})" if label == "kiln_ab" else ""))
        for kernel in sorted(first, key=lambda k: -first[k])[:top]:
            cells = "  ".join(
                f"{n}t {fastest[n][kernel]:7.1f} ({first[kernel] / fastest[n][kernel]:.2f}x)"
                for n in counts
                if fastest[n].get(kernel)
            )
            print(f"  {kernel[2:]:60s} {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="swin")
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--kiln-options", default="", help="k=v,... passed to kiln.compile(options=)")
    parser.add_argument(
        "--ab-cpp",
        default=None,
        help="also time a second kiln copy whose C++ generator runs under KILN_CPP_OPTIONS=AB_CPP "
        "(e.g. column_sum_fusion=1), its steps interleaved with the first's",
    )
    parser.add_argument(
        "--ab-options",
        default="",
        help="k=v,... kiln.compile options of a second copy (over --kiln-options), timed interleaved",
    )
    parser.add_argument("--inference", action="store_true", help="time no-grad forward calls, not steps")
    parser.add_argument("--threads", default="", help="e.g. 1,2: each kernel's scaling over thread counts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = _parse_options(args.kiln_options)
    for name in args.models.split(","):
        if args.threads:
            counts = [int(n) for n in args.threads.split(",")]
            scaling(name, args.calls, args.top, counts, options, args.inference, args.ab_cpp)
        else:
            run(
                name,
                args.calls,
                args.top,
                options,
                args.ab_cpp,
                args.inference,
                _parse_options(args.ab_options),
            )


if __name__ == "__main__":
    main()
