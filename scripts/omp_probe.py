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

Twenty-fourth session (cpu16): threads.py's per-kernel rows average three calls, so its 2.65 ms rows
are one stall of ~7.9 ms in three calls and its 7.8 ms rows a stall in every call; the three slowest
included `cpp_fused_add_addmm_arange_embedding_isinf_mul_8` (embedding + attention output + layer
norm), which computes no tanh. kiln's kernels have the same parallel structure at every thread count
(the team is read at run time: Note [Parallel plan] in kiln_codegen_cpp/parallel.py), so this probe
measures what the host does to a 16-thread team, per call and beside eager:

* every row also gives, per call (medians), the process's involuntary and voluntary context switches
  (`getrusage`: a thread preempted by another runnable one; a thread that slept), its minor page
  faults, and the threads that were not there before the call (libgomp ends a pool's surplus threads
  when a team is smaller than the last one, and creates them again for a larger team);
* `--micro` also times the tanh GELU where tanh saturates (x 30) and where x**3 is subnormal
  (x 1e-13): on this project's machine, one thread, kiln 0.17 / 0.21 / 1.5 ms (subnormals: no
  flush-to-zero in the generated code, as in eager, which took 0.5 / 11 / 10 ms);
* `--kernels N` profiles N more calls (kiln's kernels as named ranges, KILN_PROFILE=1) and prints
  each kernel's and operator's median and largest single call: a stall is a maximum far above the
  median, and it shows where stalls fall (kiln's kernels, the externs, everything);
* `--alone` times each backend in its own block instead of interleaved with the others;
* `--out FILE` appends every printed row to FILE as a JSON line, so a device run keeps them;
  `--summary FILE` prints such a file's rows as one table (label from `--label`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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


def _usage() -> tuple[int, int, int]:
    """(involuntary switches, voluntary switches, minor faults) of the whole process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nivcsw, r.ru_nvcsw, r.ru_minflt


def _tids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


class Counters:
    """Per-call medians of what the process did besides computing (see the module docstring)."""

    def __init__(self) -> None:
        self.seen = _tids()
        self.rows: list[tuple[int, int, int, int]] = []

    def call(self, fn: Callable[[], Any]) -> float:
        before = _usage()
        t = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t) * 1e3
        after = _usage()
        now = _tids()
        self.rows.append((*(a - b for a, b in zip(after, before, strict=True)), len(now - self.seen)))
        self.seen |= now
        return ms

    def summary(self) -> dict[str, float]:
        if not self.rows:
            return {}
        cols = list(zip(*self.rows, strict=True))
        out = {
            k: statistics.median(c)
            for k, c in zip(("invol", "vol", "faults", "new_threads"), cols, strict=True)
        }
        out["new_threads_total"] = sum(cols[3])
        return out


def _emit(out: str | None, row: dict[str, Any]) -> None:
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def _profile_kernels(fn: Callable[[], Any], calls: int, top: int) -> list[dict[str, Any]]:
    """Each kiln kernel's and operator's median and largest single-call ms over ``calls`` calls."""
    from kiln_bench import profile as profiling

    durations: dict[str, list[float]] = {}
    for e in profiling.cpu_ops(profiling.record(fn, "cpu", calls)):
        durations.setdefault(str(e.name), []).append(e.time_range.elapsed_us() / 1e3)
    rows = [
        {"name": name, "n": len(v), "median_ms": statistics.median(v), "max_ms": max(v), "total_ms": sum(v)}
        for name, v in durations.items()
    ]
    return sorted(rows, key=lambda r: -r["total_ms"])[:top]


def host() -> dict[str, Any]:
    """What the host is (cores the process may use, load, glibc, the CPU's name)."""
    name = ""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpu": name,
        "affinity": len(os.sched_getaffinity(0)),
        "loadavg": os.getloadavg(),
        "libc": " ".join(platform.libc_ver()),
        "torch": torch.__version__,
    }


def summary(path: str) -> None:
    """One line per row of an --out file: label, workload, threads, each backend's median ms and
    per-call counters (involuntary switches / minor faults / threads created over the calls)."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for r in rows:
        if r["row"] in ("start", "end"):
            continue
        parts = []
        for label, ms in r["ms"].items():
            c = r["counters"].get(label, {})
            parts.append(
                f"{label} {ms:8.3f} ms ({c.get('invol', 0):g} inv, {c.get('faults', 0):g} flt, "
                f"{c.get('new_threads_total', 0)} new)"
            )
        label = r["label"] + (" alone" if r.get("alone") else "")
        print(f"{label[:34]:34s} {r['row'][:15]:15s} {r['threads']:3d}t  " + "  ".join(parts), r["cpp"] or "")


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
    p.add_argument("--kernels", type=int, default=0, help="profile this many more calls, per kernel")
    p.add_argument("--alone", action="store_true", help="time each backend in its own block")
    p.add_argument("--label", default="", help="a label for the rows (--out)")
    p.add_argument("--out", default=None, help="append every row to this file as a JSON line")
    p.add_argument("--summary", default=None, help="print the rows of an --out file as a table, and stop")
    args = p.parse_args()
    if args.summary:
        summary(args.summary)
        return
    if args.kernels:
        os.environ["KILN_PROFILE"] = "1"  # kiln's kernels as named ranges (read when a wrapper is made)
    if args.prepare:  # the guard checker built first, not beside the timed calls
        print("guard checker:", kiln.prepare())
    torch.set_num_threads(args.threads)
    env = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_", "KMP_", "KILN_OMP"))}
    facts = host()
    print("env", env, "threads", torch.get_num_threads(), facts)
    print("omp before:", omp_libs())
    base = {"label": args.label, "threads": args.threads, "env": env, "host": facts}
    _emit(args.out, {**base, "row": "start", "omp": omp_libs()})
    cpp = {k: int(v) for k, v in (kv.split("=") for kv in args.cpp)}
    work: list[tuple[str, Callable[..., Any], dict[str, Any]]] = []
    if args.micro:
        x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0))
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
            counters = {label: Counters() for label in fns}
            if args.alone:
                order = [label for label in fns for _ in range(args.calls)]
            else:
                order = [label for _ in range(args.calls) for label in fns]
            for label in order:
                fn = fns[label]
                times[label].append(counters[label].call(lambda fn=fn, a=inputs: fn(**a)))
            kernels = {
                label: _profile_kernels(lambda fn=fn, a=inputs: fn(**a), args.kernels, 12)
                for label, fn in fns.items()
                if args.kernels and label != "eager"
            }
        e = statistics.median(times["eager"])
        row = " ".join(f"{label} {statistics.median(v):.3f} ms" for label, v in times.items())
        print(f"{name} {args.threads}t {row} (kiln {e / statistics.median(times['kiln']):.2f}x) {cpp or ''}")
        for label in fns:
            c = counters[label].summary()
            print(f"    {label:9s} per call: {c['invol']:g} involuntary / {c['vol']:g} voluntary switches, "
                  f"{c['faults']:g} faults, {c['new_threads_total']} new threads in {args.calls} calls")  # fmt: skip
        for label, rows in kernels.items():
            print(f"    {label} kernels and operators over {args.kernels} calls (median / largest ms):")
            for r in rows:
                print(f"      {r['name'][:70]:70s} {r['n']:4d}x {r['median_ms']:8.3f} {r['max_ms']:8.3f}")
        _emit(args.out, {
            **base, "row": name, "micro": args.micro, "alone": args.alone, "cpp": cpp,
            "ms": {label: statistics.median(v) for label, v in times.items()},
            "ms_all": {label: [round(t, 4) for t in v] for label, v in times.items()},
            "counters": {label: counters[label].summary() for label in fns},
            "kernels": kernels,
        })  # fmt: skip
    print("omp after:", omp_libs())
    _emit(args.out, {**base, "row": "end", "omp": omp_libs()})


MICRO: dict[str, Callable[..., Any]] = {
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x + 1, approximate="tanh"),
    "gelu_erf": lambda x: torch.nn.functional.gelu(x + 1),
    "tanh": lambda x: torch.tanh(x + 1),
    "mul": lambda x: (x + 1) * 0.5,
    # the tanh GELU where tanh saturates, and where x**3 and 0.044715 * x**3 are subnormal
    "gelu_tanh@big": lambda x: torch.nn.functional.gelu(x * 30, approximate="tanh"),
    "gelu_tanh@tiny": lambda x: torch.nn.functional.gelu(x * 1e-13, approximate="tanh"),
}


if __name__ == "__main__":
    main()
