"""Where a model's time goes on the GPU, per backend: wall ms per call (median of interleaved
rounds), GPU kernel ms per call and kernels per call (torch.profiler), the GPU's idle share and
the slowest kernels. For the GPU issues' before/after tables; inference only.

    python scripts/gpu_profile.py --models resnet,gpt2 --dtype bfloat16 --out prof.json
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import torch

from kiln_bench.models import build

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _compile(backend: str, model: torch.nn.Module) -> Callable[..., Any]:
    import copy

    import kiln

    # "kiln:<mode>:<option>=<value>&<option>=<value>": kiln with options, for A/B of one pass
    name, _, rest = backend.partition(":")
    mode, _, opts = rest.partition(":")
    options = {k: ast.literal_eval(v) for k, _, v in (o.partition("=") for o in opts.split("&") if o)}
    if name == "eager":
        return model
    model = copy.deepcopy(model)
    if name == "inductor":
        return torch.compile(model, mode=mode or None)
    # each kiln variant gets a forward of its own code object: compiled code is cached per code
    # object, and (issue 18) an entry does not yet say which mode compiled it
    f = type(model).forward
    tag = "".join(ch if ch.isalnum() else "_" for ch in f"{mode or 'default'}_{opts}")
    code = f.__code__.replace(co_name=f"{f.__code__.co_name}_{tag}")
    fresh = types.FunctionType(code, f.__globals__, code.co_name, f.__defaults__, f.__closure__)
    fresh.__kwdefaults__ = f.__kwdefaults__
    cls = type(model)
    model.__class__ = type(cls.__name__, (cls,), {"forward": fresh, "__module__": cls.__module__})
    return kiln.compile(model, mode=mode or None, options=options or None)


def _cprofile(fn: Callable[..., Any], inputs: dict[str, Any], calls: int, top: int = 22) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(calls):
        fn(**inputs)
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(top)


def _wall(fn: Callable[..., Any], inputs: dict[str, Any], calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(**inputs)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def _cpu(fn: Callable[..., Any], inputs: dict[str, Any], calls: int) -> float:
    """Median CPU time of one call (ms): from an idle GPU until the call returns, not waiting for
    its kernels; what the host spends per call, comparable across backends whatever the GPU does."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn(**inputs)
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e3


def _kernels(fn: Callable[..., Any], inputs: dict[str, Any], calls: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn(**inputs)
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    count = 0
    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and getattr(e, "device_time", 0) > 0:
            totals.setdefault(e.name, []).append(e.device_time)
            count += 1
            spans.append((e.time_range.start, e.time_range.end))
    # gaps between one kernel's end and the next one's start on the GPU (µs): those under 100 µs
    # are the GPU waiting inside a call (launch latency, CUDA-graph node gaps), not between calls
    spans.sort()
    gaps = [max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(spans)]
    inner = [g for g in gaps if g < 100]
    busy = sum(sum(v) for v in totals.values()) / calls / 1e3  # ms
    top = sorted(totals.items(), key=lambda kv: -sum(kv[1]))[:6]
    return {
        "gpu_ms": busy,
        "kernels_per_call": count / calls,
        "inner_gap_ms": sum(inner) / calls / 1e3,
        "median_gap_us": statistics.median(inner) if inner else 0.0,
        "top": [{"name": k[:90], "ms_per_call": sum(v) / calls / 1e3, "n": len(v) // calls} for k, v in top],
    }


def _breakdown(fn: Callable[..., Any], inputs: dict[str, Any], calls: int) -> dict[str, float]:
    """Where kiln's CPU time per call goes (µs): the whole call; the compiled graphs' wrappers
    alone, on the arguments they last received; the wrappers with every Triton launch a no-op;
    with every extern op answering its last result; with both (the wrapper's own Python). The
    rest of the call (frame hook, guard, aotgrad's runtime) is the whole call less the wrappers."""
    from kiln_loopir import compile as loopir_compile

    seen: dict[int, tuple[Any, tuple[Any, ...]]] = {}
    original = loopir_compile.CompiledGraph.__call__

    def spy(self: Any, *args: Any) -> Any:
        seen[id(self)] = (self, args)
        return original(self, *args)

    loopir_compile.CompiledGraph.__call__ = spy  # type: ignore[method-assign]
    try:
        fn(**inputs)
    finally:
        loopir_compile.CompiledGraph.__call__ = original  # type: ignore[method-assign]
    torch.cuda.synchronize()
    graphs = list(seen.values())

    def us(f: Callable[[], Any]) -> float:
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                f()
            torch.cuda.synchronize()
            rounds.append((time.perf_counter() - start) / calls * 1e6)
        return statistics.median(rounds)

    def run_graphs() -> None:
        for g, a in graphs:
            g(*a)

    namespaces = [getattr(g._fn, "__globals__", {}) for g, _ in graphs]
    launches = [{k: v for k, v in ns.items() if k.startswith("_k") and callable(v)} for ns in namespaces]
    externs = [{k: v for k, v in ns.items() if k.startswith("_op_") and callable(v)} for ns in namespaces]
    memo: dict[str, Any] = {}
    for ns, ops in zip(namespaces, externs, strict=True):
        for k, op in ops.items():

            def answer(*a: Any, _k: str = k, _op: Any = op, **kw: Any) -> Any:
                if _k not in memo:
                    memo[_k] = _op(*a, **kw)
                return memo[_k]

            ns[k] = answer
    run_graphs()  # fill the memo
    for ns, ops in zip(namespaces, externs, strict=True):
        ns.update(ops)

    def swap(table: list[dict[str, Any]], fake: Callable[[str, Any], Any]) -> None:
        for ns, entries in zip(namespaces, table, strict=True):
            for k, v in entries.items():
                ns[k] = fake(k, v)

    out = {"call_us": us(lambda: fn(**inputs)), "wrappers_us": us(run_graphs)}
    swap(launches, lambda k, v: lambda *a: None)
    out["no_launch_us"] = us(run_graphs)
    swap(externs, lambda k, v: lambda *a, _k=k, **kw: memo[_k])
    out["skeleton_us"] = us(run_graphs)
    swap(launches, lambda k, v: v)
    out["no_extern_us"] = us(run_graphs)
    swap(externs, lambda k, v: v)
    out["graphs"] = len(graphs)
    out["launch_fns"] = sum(len(t) for t in launches)
    out["extern_fns"] = sum(len(t) for t in externs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet,gpt2")
    parser.add_argument(
        "--backends", default="eager,inductor,kiln,inductor:reduce-overhead,kiln:reduce-overhead"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--cprofile", default="", help="backends to cProfile after timing (e.g. kiln,inductor)"
    )
    parser.add_argument("--breakdown", action="store_true", help="where kiln's CPU time per call goes")
    args = parser.parse_args()
    if any(b.startswith("kiln") for b in args.backends.split(",")):
        import kiln

        print(f"kiln guard checker: {kiln.prepare()}")  # built once, before anything is timed
    results = []
    for model_name in args.models.split(","):
        work = build(model_name, "gpu").to("cuda", DTYPES[args.dtype])
        work.model.eval()
        fns: dict[str, Callable[..., Any]] = {}
        compile_s: dict[str, float] = {}
        with torch.no_grad():
            for backend in args.backends.split(","):
                torch.compiler.reset()
                try:
                    start = time.perf_counter()
                    fn = _compile(backend, work.model)
                    for _ in range(3):
                        fn(**work.inputs)
                    torch.cuda.synchronize()
                    compile_s[backend] = time.perf_counter() - start
                    fns[backend] = fn
                except Exception as exc:  # report and go on
                    print(f"{model_name} {backend}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
            walls: dict[str, list[float]] = {b: [] for b in fns}
            cpus: dict[str, list[float]] = {b: [] for b in fns}
            for _ in range(args.rounds):
                for backend, fn in fns.items():
                    walls[backend].append(_wall(fn, work.inputs, args.calls))
                    cpus[backend].append(_cpu(fn, work.inputs, args.calls))
            for backend, fn in fns.items():
                wall = statistics.median(walls[backend]) * 1e3
                k = _kernels(fn, work.inputs, args.calls)
                row = {
                    "model": model_name,
                    "backend": backend,
                    "wall_ms": wall,
                    "cpu_ms": statistics.median(cpus[backend]),
                    "first3_s": compile_s[backend],
                    **k,
                }
                row["gpu_idle"] = max(0.0, 1 - k["gpu_ms"] / wall)
                results.append(row)
                print(
                    f"{model_name:10} {backend:26} wall {wall:7.2f} ms  cpu {row['cpu_ms']:7.2f} ms  gpu {k['gpu_ms']:6.2f} ms  "
                    f"kernels {k['kernels_per_call']:6.1f}  idle {row['gpu_idle']:4.0%}  gaps {k['inner_gap_ms']:5.2f} ms "
                    f"(median {k['median_gap_us']:4.1f} µs)  first3 {compile_s[backend]:6.1f}s"
                )
                for t in k["top"][:4]:
                    print(f"      {t['ms_per_call']:6.3f} ms x{t['n']:<3} {t['name']}")
            for backend, fn in fns.items():
                if args.breakdown and backend.startswith("kiln"):
                    b = _breakdown(fn, work.inputs, args.calls)
                    print(
                        f"== breakdown {model_name} {backend}: "
                        + ", ".join(f"{k} {v:.0f}" for k, v in b.items())
                    )
                    print(
                        f"   outside the wrappers {b['call_us'] - b['wrappers_us']:.0f} us, Triton launches "
                        f"{b['wrappers_us'] - b['no_launch_us']:.0f} us, extern ops {b['wrappers_us'] - b['no_extern_us']:.0f} us, "
                        f"wrapper Python {b['skeleton_us']:.0f} us"
                    )
                    results.append({"model": model_name, "backend": backend, "breakdown": b})
            for target in args.cprofile.split(","):
                if target in fns:
                    print(f"== cProfile {model_name} {target}, {args.calls * 2} calls")
                    _cprofile(fns[target], work.inputs, args.calls * 2)
        del work, fns
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"dtype": args.dtype, "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
