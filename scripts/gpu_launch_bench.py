"""Launch overhead on a GPU: a graph of N small independent pointwise kernels (issue 14's
micro-benchmark). Prints CPU microseconds per kernel launch (wall per call / N, where the GPU work
is tiny) for kiln (default and reduce-overhead) and torch.compile (default and reduce-overhead),
interleaved in one run, plus the GPU time per call of the CUDA-graph variants.

    python scripts/gpu_launch_bench.py --kernels 200 --out launch.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def make_fn(n: int) -> Callable[..., Any]:
    """A new code object every time: compiled caches hang on code objects, and each variant must
    compile its own."""
    scope: dict[str, Any] = {}
    exec("def fn(*xs):\n    return [x * 2.0 + 1.0 for x in xs]\n", scope)
    fn: Callable[..., Any] = scope["fn"]
    return fn


def raw_launch_us(calls: int = 20000) -> dict[str, float]:
    """One small kernel: µs per launch through kiln's launcher and through JITFunction.run."""
    from kiln_codegen_triton import TritonBackend
    from kiln_loopir import compile_graph

    aten = torch.ops.aten
    gm = torch.fx.symbolic_trace(lambda x: aten.add.Tensor(aten.mul.Tensor(x, 2.0), 1.0))
    x = torch.randn(1024, device="cuda")
    backend = TritonBackend()
    compiled = compile_graph(gm, [x], backend=backend)
    out = compiled(x)
    launcher = next(iter(backend.last_launchers.values()))
    stream = torch._C._cuda_getCurrentRawStream(0)
    px, po = x.data_ptr(), out.data_ptr()
    fast = launcher.fast
    assert fast is not None
    from kiln_codegen_triton import runtime

    compiled_kernel = launcher.compiled[launcher.config]
    python_launch = runtime._fast_launcher(compiled_kernel, launcher.spec, launcher.config, native=False)
    result = {}
    for name, call in [
        (f"kiln launcher ({type(fast).__name__})", lambda: fast(stream, px, po)),
        ("Triton's C launch from Python", lambda: python_launch(stream, px, po)),
        ("JITFunction.run", lambda: launcher.fn[(1,)](x, out, XBLOCK=1024, num_warps=4)),
    ]:
        for _ in range(100):
            call()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        result[name] = (time.perf_counter() - start) / calls * 1e6
    return result


def breakdown_us(n: int, numel: int, rounds: int, calls: int) -> dict[str, float]:
    """Where a default-mode call of the N-kernel graph spends its host time, µs per kernel: the
    graph's wrapper alone (loopir's compiled graph, no frame hook, guard or aotgrad), the same with
    every launch a no-op Python call (the wrapper's own work: input checks, allocations, pointers,
    outputs), and N bare allocations through the call the wrapper uses."""
    from torch._C._dynamo.guards import _empty_strided_cuda  # the wrapper's _alloc on CUDA

    from kiln_codegen_triton import TritonBackend
    from kiln_loopir import compile_graph

    aten = torch.ops.aten
    graph = torch.fx.Graph()
    inputs = [graph.placeholder(f"x{i}") for i in range(n)]
    outs = [
        graph.call_function(aten.add.Tensor, (graph.call_function(aten.mul.Tensor, (x, 2.0)), 1.0))
        for x in inputs
    ]
    graph.output(tuple(outs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    xs = [torch.randn(numel, device="cuda") for _ in range(n)]
    backend = TritonBackend()
    compiled = compile_graph(gm, xs, backend=backend)
    compiled(*xs)
    launchers = list(backend.last_launchers.values())
    real = [(lz.namespace, lz.slot, lz.namespace[lz.slot]) for lz in launchers if lz.namespace is not None]

    def noop(*args: Any) -> None:
        pass

    def wrapper_noop(*args: Any) -> Any:
        for ns, slot, _ in real:
            ns[slot] = noop
        try:
            return compiled(*args)
        finally:
            for ns, slot, fn in real:
                ns[slot] = fn

    def allocs(*args: Any) -> Any:
        return [_empty_strided_cuda((numel,), (1,), torch.float32) for _ in range(n)]

    variants = {
        "wrapper alone": compiled,
        "wrapper, launches no-op": wrapper_noop,
        "allocations alone": allocs,
    }
    walls: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            walls[name].append(wall_per_call(fn, xs, calls))
    result = {name: statistics.median(w) * 1e6 / n for name, w in walls.items()}
    result["launchers bound"] = float(len(real))
    WRAPPERS.append(backend.last_wrapper)
    return result


WRAPPERS: list[str] = []  # the breakdown graph's generated wrapper, written beside --out


def wall_per_call(fn: Callable[..., Any], args: list[torch.Tensor], calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def gpu_per_call(fn: Callable[..., Any], args: list[torch.Tensor], calls: int) -> float:
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(calls):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / 1e3 / calls


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", type=int, default=200)
    parser.add_argument("--numel", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import kiln

    n = args.kernels
    xs = [torch.randn(args.numel, device="cuda") for _ in range(n)]
    variants: dict[str, Callable[..., Any]] = {}
    compile_s: dict[str, float] = {}
    for name, make in [
        ("kiln", lambda: kiln.compile(make_fn(n))),
        # Note [Native launches]: the same graph launched through Triton's C launch function
        ("kiln, Triton's launcher", lambda: kiln.compile(make_fn(n))),
        ("kiln reduce-overhead", lambda: kiln.compile(make_fn(n), mode="reduce-overhead")),
        ("torch.compile", lambda: torch.compile(make_fn(n))),
        ("torch.compile reduce-overhead", lambda: torch.compile(make_fn(n), mode="reduce-overhead")),
    ]:
        fn = make()
        start = time.perf_counter()
        if name == "kiln, Triton's launcher":
            os.environ["KILN_TRITON_NATIVE_LAUNCH"] = "0"
        for _ in range(3):
            out = fn(*xs)
        torch.cuda.synchronize()
        os.environ.pop("KILN_TRITON_NATIVE_LAUNCH", None)
        compile_s[name] = time.perf_counter() - start
        ref = make_fn(n)(*xs)
        for a, b in zip(out, ref, strict=True):
            torch.testing.assert_close(a, b)
        variants[name] = fn
    walls: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):  # interleaved: A B C D A B C D ...
        for name, fn in variants.items():
            walls[name].append(wall_per_call(fn, xs, args.calls))
    rows = []
    for name, fn in variants.items():
        wall = statistics.median(walls[name])
        gpu = gpu_per_call(fn, xs, args.calls) if "reduce-overhead" in name else None
        rows.append(
            {
                "variant": name,
                "wall_us_per_call": wall * 1e6,
                "us_per_kernel": wall * 1e6 / n,
                "gpu_us_per_call": None if gpu is None else gpu * 1e6,
                "first_calls_s": compile_s[name],
            }
        )
    print(f"{n} pointwise kernels of {args.numel} elements; {torch.cuda.get_device_name()}")
    print(f"{'variant':32} {'wall us/call':>13} {'us/kernel':>10} {'GPU us/call':>12} {'compile s':>10}")
    for r in rows:
        gpu = "" if r["gpu_us_per_call"] is None else f"{r['gpu_us_per_call']:.1f}"
        print(
            f"{r['variant']:32} {r['wall_us_per_call']:13.1f} {r['us_per_kernel']:10.2f} {gpu:>12} "
            f"{r['first_calls_s']:10.2f}"
        )
    raw = raw_launch_us()
    for name, us in raw.items():
        print(f"one launch, {name:24} {us:6.2f} us")
    parts = breakdown_us(n, args.numel, args.rounds, args.calls)
    for name, us in parts.items():
        print(f"per kernel, {name:24} {us:6.2f} us")
    from kiln_codegen_triton import native_launch

    print("native launches:", native_launch.counters)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "kernels": n,
                    "numel": args.numel,
                    "rows": rows,
                    "raw_launch_us": raw,
                    "breakdown_us": parts,
                    "native_launch": native_launch.counters,
                },
                f,
                indent=1,
            )
        with open(args.out + ".wrapper.py", "w") as f:
            f.write(WRAPPERS[0] if WRAPPERS else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
