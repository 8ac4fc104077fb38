"""Thread scaling on the CPU: eager vs kiln vs torch.compile (inductor) at several thread counts.

For each model of kiln_bench's public suite (CPU size, float32) and each thread count: the median
time of eager, kiln and inductor, timed interleaved (A B C A B C ...) after a warm-up, and each
compiler's speedup over eager at that thread count. ``--mode inference`` (the default) times a
call under no_grad; ``--mode training`` times a training step as kiln_bench's training mode does
(forward, the suite's loss, backward: ``kiln_bench.harness.step``). Before a compiler is timed at
a thread count its outputs are checked against eager's with the suite's accuracy rule
(``kiln_bench.harness.reference``: the logits, or the loss and every gradient; allclose, else RMSE
against float64 no worse than eager's): a mismatch is reported in the row (``<backend>_ok``,
``<backend>_reason``, a ``!`` in the table) and that backend is not timed at that count. Then,
per model, the scaling of kiln's slowest C++ kernels (a second kiln compile with
``KILN_PROFILE=1``, profiled at each thread count: ms per call and speedup over the first thread
count). kiln compiles once per model: its kernels read the thread count at run time (Note
[Parallel plan] in kiln_codegen_cpp/parallel.py), so the same compiled model is timed at every
count, which also checks that claim. Inductor bakes the thread count into its C++
(``parallel_num_threads`` at code generation), so it is compiled again at each count, each time
into an empty cache of its own (a torch whose FX-graph cache key leaves the thread count out
would otherwise reuse the graph of another count: on the H200 host, torch 2.11, the 16-thread compile of 2026-12-01 took
0.5 s against 69 s at one thread, likely such a reuse; torch 2.13 keys on the count).

At the end: a table of every model's medians (ms) and speedups over eager at each thread count
with a geomean row per count, and where each model's time went (kiln's compile, inductor's
compiles, the timed rounds, the kernel-scaling pass); the JSON holds the same (``timing_s``,
``inductor_compile_s``, ``kernel_scaling_s``). A time budget (``--budget-s``, default 400) keeps
the run bounded: a model starts only when one as long as the median so far would still end
within it; models left out are reported as skipped. Inductor's compiles take most of a model's
time (on this 2-core machine 20-60 s each; three per model), the timed rounds little: ``--row-s
2`` (the default) times each (model, count) for about two seconds (5 to 30 rounds) instead of a
fixed ``--repeats`` (``--row-s 0``), more rounds for millisecond models, fewer for slow ones. The JSON is rewritten
after every model. On the 16-core host, the run the lead makes (models in order of interest,
ResNet first; whether all eight end within 7 minutes there is not measured yet: the
where-the-time-went table of that run says what to cut):

    python packages/codegen_cpp/bench/threads.py --threads 1,4,16 \\
        --models resnet,gpt2,bert,mlp,cnn,convnext,t5,llama --budget-s 400 --row-s 2 --out threads.json

The same with ``--mode training`` measures training steps (scripts/gpu_next.sh call25c); every row
of the table and of the JSON says its mode.

``--kiln-options layout=False,conv_fusion=False`` passes loopir pass switches to kiln.compile;
``--backends kiln,kiln_ab,inductor`` adds a second kiln compiled with ``--ab-options`` (default:
the CPU passes of issue 20 off), timed in the same interleaved rounds, to measure what those
passes bring at each thread count; ``--ab-cpp-options weighted_work=false`` or
``--ab-cpp-options vector_width=512`` compile kiln_ab's C++ with other generator switches
(kiln.compile's ``cpp_options``; ``--ab-options ""`` keeps the passes the same). This is a
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_tmp = tempfile.mkdtemp(prefix="kiln-threads-")
for _var in ("KILN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
    os.environ[_var] = os.path.join(_tmp, _var.lower())

import torch  # noqa: E402

import kiln  # noqa: E402
from kiln_bench import harness  # noqa: E402
from kiln_bench import profile as profiling  # noqa: E402
from kiln_bench.models import Workload  # noqa: E402

DEFAULT_MODELS = "resnet,gpt2,bert,mlp,cnn,convnext,t5,llama"


def _value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered.isdigit():
        return int(lowered)
    return text


def _options(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        out[key.strip()] = _value(value.strip())
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _timed(workload: Workload, fn: Any, mode: str) -> float:
    start = time.perf_counter()
    harness.step(workload, fn, mode)
    return time.perf_counter() - start


def _kernel_scaling(workload: Workload, mode: str, counts: list[int], options: dict[str, Any],
                    top: int, calls: int) -> list[dict[str, Any]]:  # fmt: skip
    """ms per call of kiln's ``top`` slowest C++ kernels at each thread count."""
    os.environ["KILN_PROFILE"] = "1"  # read when the wrapper is generated
    try:
        kiln.reset()
        compiled = kiln.compile(workload.model, options=options or None)
        per: dict[int, dict[str, float]] = {}
        for n in counts:
            torch.set_num_threads(n)
            for _ in range(2):
                harness.step(workload, compiled, mode)
            events = profiling.record(lambda c=compiled: harness.step(workload, c, mode), "cpu", calls)
            times: dict[str, float] = {}
            for e in profiling.cpu_ops(events):
                if str(e.name).startswith("kiln:"):
                    times[e.name] = times.get(e.name, 0.0) + float(e.self_cpu_time_total) / calls / 1e3
            per[n] = times
    finally:
        os.environ.pop("KILN_PROFILE", None)
        kiln.reset()
    first = per[counts[0]]
    names = sorted(first, key=lambda k: -first[k])[:top]
    rows = []
    for name in names:
        ms = {str(n): round(per[n].get(name, float("nan")), 4) for n in counts}
        base = first[name]
        rows.append({
            "kernel": name.removeprefix("kiln:"),
            "ms": ms,
            "scaling": {str(n): round(base / per[n][name], 2) if per[n].get(name) else None for n in counts},
        })  # fmt: skip
    return rows


def run_model(
    name: str, counts: list[int], args: argparse.Namespace, options: dict[str, Any]
) -> dict[str, Any]:
    mode = args.mode
    torch.set_num_threads(counts[0])
    ref = harness.reference(name, mode)  # eager's outputs (or loss and gradients) to check against
    workload = ref.workload
    out: dict[str, Any] = {"model": name, "mode": mode, "rows": [], "kernels": []}
    backends = [b for b in args.backends.split(",") if b]

    kiln.reset()
    start = time.perf_counter()
    compiled: dict[str, Any] = {"eager": workload.model}
    if "kiln" in backends:
        compiled["kiln"] = kiln.compile(workload.model, options=options or None)
        harness.step(workload, compiled["kiln"], mode)
        out["kiln_compile_s"] = round(time.perf_counter() - start, 3)
    if "kiln_ab" in backends:  # kiln with other switches, timed in the same rounds
        ab = _options(args.ab_options)
        if args.ab_cpp_options:
            ab["cpp_options"] = _options(args.ab_cpp_options)
        compiled["kiln_ab"] = kiln.compile(workload.model, options=ab or None)
        harness.step(workload, compiled["kiln_ab"], mode)
    for n in counts:
        torch.set_num_threads(n)
        row: dict[str, Any] = {"threads": n, "mode": mode}
        fns = {"eager": workload.model}
        for backend in backends:
            if backend in ("kiln", "kiln_ab"):
                fns[backend] = compiled[backend]
            elif backend == "inductor":
                torch.compiler.reset()
                # an empty cache per thread count: a graph cached at another count would run
                # with that count's teams (torch versions whose FX-graph cache key leaves the
                # thread count out: the H200 run of 2026-12-01 "compiled" at 16 threads in 0.5 s)
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_tmp, f"inductor-{n}t-{name}")
                fn = torch.compile(workload.model)
                start = time.perf_counter()
                harness.step(workload, fn, mode)
                row["inductor_compile_s"] = round(time.perf_counter() - start, 3)
                fns["inductor"] = fn
        for backend, fn in list(fns.items()):
            if backend == "eager":
                continue
            verdict = ref.check(*harness.step(workload, fn, mode))
            row[f"{backend}_ok"] = verdict.ok
            if not verdict.ok:  # reported, never timed
                row[f"{backend}_reason"] = verdict.reason
                del fns[backend]
        start = time.perf_counter()
        for _ in range(args.warmup):
            for fn in fns.values():
                harness.step(workload, fn, mode)
        times: dict[str, list[float]] = {b: [] for b in fns}
        for _ in range(_repeats(args, sum(_timed(workload, fn, mode) for fn in fns.values()))):
            for backend, fn in fns.items():
                times[backend].append(_timed(workload, fn, mode))
        row["timing_s"] = round(time.perf_counter() - start, 2)
        for backend, ts in times.items():
            row[f"{backend}_ms"] = round(statistics.median(ts) * 1e3, 4)
        for backend in fns:
            if backend != "eager":
                row[f"{backend}_speedup"] = round(row["eager_ms"] / row[f"{backend}_ms"], 3)
        out["rows"].append(row)
        print(_row_text(name, row, backends), flush=True)
    torch.compiler.reset()
    if "kiln" in backends and args.kernels > 0:
        start = time.perf_counter()
        try:
            out["kernels"] = _kernel_scaling(workload, mode, counts, options, args.kernels, 3)
        except Exception as e:  # the scaling view is extra: a failure leaves the timings
            out["kernels_error"] = f"{type(e).__name__}: {e}"[:300]
        out["kernel_scaling_s"] = round(time.perf_counter() - start, 2)
        for k in out["kernels"]:
            scaling = " ".join(f"{n}t {k['ms'][n]:.3f}ms ({k['scaling'][n]}x)" for n in k["ms"])
            print(f"    kernel {k['kernel'][:60]:60s} {scaling}", flush=True)
    return out


def _repeats(args: argparse.Namespace, round_s: float) -> int:
    """``--repeats``, or with ``--row-s`` as many rounds (all backends once) as fit in that many
    seconds, between 5 and 3 * ``--repeats``: a model whose calls take 2 ms gets more rounds
    for a steadier median, one whose calls take 200 ms fewer, so the run's length is bounded."""
    if args.row_s <= 0:
        return args.repeats
    return max(5, min(3 * args.repeats, int(args.row_s / max(round_s, 1e-6))))


def _row_text(name: str, row: dict[str, Any], backends: list[str]) -> str:
    parts = [f"{name:10s} {row['mode']:9s} {row['threads']:3d}t  eager {row['eager_ms']:9.3f} ms"]
    for backend in backends:
        if f"{backend}_ms" in row:
            parts.append(f"{backend} {row[backend + '_ms']:9.3f} ms ({row[backend + '_speedup']:.2f}x)")
        elif not row.get(f"{backend}_ok", True):
            parts.append(f"{backend} ACCURACY FAILED, not timed: {row.get(backend + '_reason', '')[:80]}")
    return "  ".join(parts)


def summary(results: list[dict[str, Any]], counts: list[int], backends: list[str]) -> list[str]:
    """The per-model medians (ms) and speedups over eager at each thread count, a geomean row per
    count, and where each model's time went (compiles, timing, the kernel-scaling pass)."""
    timed = [b for b in backends if b in ("kiln", "kiln_ab", "inductor")]
    head = f"{'model':10s} {'mode':9s} {'thr':>3s} {'eager ms':>10s}" + "".join(
        f" {b + ' ms':>12s} {'x':>6s}" for b in timed
    )
    lines = [head]
    for m in results:
        for r in m.get("rows", []):
            cells = "".join(
                f" {r.get(b + '_ms', float('nan')):12.3f} {r.get(b + '_speedup', float('nan')):5.2f}"
                + ("!" if not r.get(f"{b}_ok", True) else " ")
                for b in timed
            )
            lines.append(f"{m['model']:10s} {r['mode']:9s} {r['threads']:3d} {r['eager_ms']:10.3f}{cells}")
        if "rows" not in m:
            lines.append(f"{m['model']:10s} {m.get('skipped') or m.get('error', '')}"[:120])
    for n, per in _geomeans(results, counts, backends).items():
        cells = "".join(
            f" {'':12s} {per[b]['geomean']:5.2f} " if b in per else f" {'':12s} {'-':>5s} " for b in timed
        )
        models = max((v["models"] for v in per.values()), default=0)
        mode = next((m["mode"] for m in results if "mode" in m), "")
        lines.append(f"{'geomean':10s} {mode:9s} {int(n):3d} {f'({models} models)':>10s}{cells}")
    lines.append("")
    lines.append(
        f"{'model':10s} {'total s':>8s} {'kiln cc':>8s} {'inductor cc':>12s} {'timing':>7s} {'kernels':>8s}"
    )
    for m in results:
        if "rows" not in m:
            continue
        ind = sum(r.get("inductor_compile_s", 0.0) for r in m["rows"])
        timing = sum(r.get("timing_s", 0.0) for r in m["rows"])
        lines.append(
            f"{m['model']:10s} {m.get('elapsed_s', 0.0):8.1f} {m.get('kiln_compile_s', 0.0):8.1f} "
            f"{ind:12.1f} {timing:7.1f} {m.get('kernel_scaling_s', 0.0):8.1f}"
        )
    return lines


def _geomeans(results: list[dict[str, Any]], counts: list[int], backends: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in counts:
        for backend in backends:
            values = [
                r[f"{backend}_speedup"]
                for m in results
                for r in m.get("rows", [])
                if r["threads"] == n and r.get(f"{backend}_ok", False) and f"{backend}_speedup" in r
            ]
            if values:
                g = float(torch.tensor(values, dtype=torch.float64).log().mean().exp())
                out.setdefault(str(n), {})[backend] = {"geomean": round(g, 3), "models": len(values)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,4,16")
    parser.add_argument(
        "--mode",
        default="inference",
        choices=harness.MODES,
        help="inference: a call under no_grad; training: forward, the suite's loss and backward",
    )
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument(
        "--backends", default="kiln,inductor", help="compilers to time against eager: kiln, kiln_ab, inductor"
    )
    parser.add_argument(
        "--ab-options",
        default="conv_fusion=False,linear_pack=False",
        help="kiln_ab's pass switches (k=v,...)",
    )
    parser.add_argument(
        "--ab-cpp-options", default="", help="kiln_ab's C++ generator switches (CppOptions: k=v,...)"
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--row-s",
        type=float,
        default=2.0,
        help="time each (model, thread count) for about this many seconds instead of a fixed "
        "--repeats (between 5 and 3x --repeats rounds); 0: --repeats rounds",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--kernels", type=int, default=3, help="kiln kernels whose scaling is shown")
    parser.add_argument("--kiln-options", default="", help="k=v,... loopir pass switches")
    parser.add_argument("--budget-s", type=float, default=400.0, help="no new model after this many seconds")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",") if t]
    models = [m for m in args.models.split(",") if m]
    options = _options(args.kiln_options)
    backends = [b for b in args.backends.split(",") if b]
    settings = {
        "threads": counts, "models": models, "backends": backends, "repeats": args.repeats,
        "warmup": args.warmup, "row_s": args.row_s, "kiln_options": options, "kiln_ab_options": _options(args.ab_options),
        "kiln_ab_cpp_options": _options(args.ab_cpp_options), "cpu": _cpu_model(), "cores": os.cpu_count(),
        "torch": torch.__version__, "size": "cpu", "mode": args.mode, "dtype": "float32",
    }  # fmt: skip
    # the guard checker built now, not in the background beside the timed calls (Note [The
    # background build yields the cores] in kiln_dynamo's tensor_check.py): this script's cache is
    # a fresh folder, and a compiler on one core wrecks every OpenMP team as wide as the machine
    settings["guard_checker"] = kiln.prepare()
    results: list[dict[str, Any]] = []
    started = time.perf_counter()

    def write(partial: bool) -> None:
        if args.out is None:
            return
        doc = {"settings": {**settings, "partial": partial}, "geomean": _geomeans(results, counts, backends),
               "results": results, "elapsed_s": round(time.perf_counter() - started, 1)}  # fmt: skip
        args.out.write_text(json.dumps(doc, indent=1) + "\n")

    durations: list[float] = []
    for name in models:
        # a model starts only if one as long as the median so far still fits in the budget
        elapsed = time.perf_counter() - started
        if elapsed + (statistics.median(durations) if durations else 0.0) > args.budget_s:
            results.append(
                {"model": name, "mode": args.mode, "skipped": f"time budget of {args.budget_s:.0f} s spent"}
            )
            print(f"{name:10s} skipped: time budget spent ({elapsed:.0f} s elapsed)", flush=True)
            continue
        try:
            results.append(run_model(name, counts, args, options))
        except Exception as e:  # one failing model is a result, not the end of the run
            results.append({"model": name, "mode": args.mode, "error": f"{type(e).__name__}: {e}"[:300]})
            print(f"{name:10s} error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        durations.append(time.perf_counter() - started - elapsed)
        results[-1]["elapsed_s"] = round(durations[-1], 1)
        write(partial=True)
    print()
    print("\n".join(summary(results, counts, backends)))
    print()
    for n, per in _geomeans(results, counts, backends).items():
        text = "  ".join(f"{b} {v['geomean']:.2f}x over {v['models']}" for b, v in per.items())
        print(f"geomean at {n:>2s} threads: {text}")
    print(f"elapsed {time.perf_counter() - started:.0f} s")
    write(partial=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
