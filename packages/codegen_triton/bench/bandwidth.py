"""Achieved memory bandwidth of kiln's Triton kernels against eager and torch.compile, on a GPU.

For each micro-kernel (float32, pointwise chains and reductions, 1M-64M elements) three
implementations of the same aten graph run on the same CUDA inputs: eager (the graph's aten
calls), kiln (``compile_graph(..., backend=TritonBackend(mode=...))``) and torch.compile
(inductor, same mode). They are timed interleaved (A B C A B C ...): each sample is ``--iters``
back-to-back calls between two CUDA events, after a warm-up; the table gives the median per call,
the achieved bandwidth (the bytes a perfect kernel must move: every input read once, every output
written once, divided by the median time) and that bandwidth as a fraction of ``--peak`` (the
~4.3 TB/s an H200 copies at). Every kiln result is checked against eager before timing. This is
a benchmark, not a test.

Wall time per call counts the host too: a one-kernel graph of a few MB is bound by the Python
call, not the kernel. The ``*_kernel_us`` columns are the GPU kernel time per call alone
(torch.profiler, every kernel the implementation launches), which is what the kernels issue's
target (≥ 70% of copy bandwidth for kernels moving ≥ 16 MB) is about; the table prints those.
``--set OUTER_XBLOCK=64,OUTER_WARPS=8`` overrides codegen_triton's heuristics constants and
``--split-target``/``--split-min`` the split-reduction thresholds, for a sweep (one process per
variant: each compiles into its own cache folder). In ``--variants`` a lower-case name is a
TritonBackend switch (``--variants "outer_partials=0"``: kiln with that option, a kernel time
beside the default's).

    PYTHONPATH=packages/loopir/src:packages/codegen_triton/src \\
        python packages/codegen_triton/bench/bandwidth.py --out bandwidth.json [--sizes 1,16,64] [--only softmax]
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
from collections.abc import Callable
from typing import Any

_tmp = tempfile.mkdtemp(prefix="kiln-bandwidth-")
os.environ.setdefault("KILN_CACHE_DIR", os.path.join(_tmp, "kiln"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_tmp, "inductor"))

import torch  # noqa: E402
import torch.fx  # noqa: E402

import kiln_loopir  # noqa: E402
from kiln_codegen_triton import TritonBackend  # noqa: E402

aten = torch.ops.aten
ROW = 1024  # row length of the reduction workloads (--row)
HW = 56  # the side of bn_stats' feature map (--hw)
DTYPE = torch.float32  # --dtype


def add(x: torch.Tensor, y: torch.Tensor) -> Any:
    return aten.add.Tensor(x, y)


def relu_chain(x: torch.Tensor) -> Any:
    return aten.relu.default(aten.add.Tensor(aten.mul.Tensor(x, 1.5), 0.25))


def gelu_chain(x: torch.Tensor, y: torch.Tensor) -> Any:
    a = aten.add.Tensor(x, y)
    return aten.mul.Tensor(aten.gelu.default(a), aten.sigmoid.default(y))


def softmax(x: torch.Tensor) -> Any:
    return aten._softmax.default(x, -1, False)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    return aten.native_layer_norm.default(x, [x.shape[-1]], w, b, 1e-5)[0]


def layer_norm_backward(
    g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor
) -> Any:
    """A layer norm's backward as aotgrad traces it (float32 math over the saved row statistics,
    gradients cast back): the input gradient's row kernel and the weight and bias gradients'
    column sums, split into partials (Note [Partials of a column reduction stay column
    reductions] in split.py; the kiln variant ``outer_partials=False`` is the form before)."""
    f32 = torch.float32
    gf, xf = aten._to_copy.default(g, dtype=f32), aten._to_copy.default(x, dtype=f32)
    xhat = aten.mul.Tensor(aten.sub.Tensor(xf, mean), rstd)
    gx = aten.mul.Tensor(gf, aten._to_copy.default(w, dtype=f32))
    inner = aten.sub.Tensor(
        aten.sub.Tensor(gx, aten.mean.dim(gx, [1], True)),
        aten.mul.Tensor(xhat, aten.mean.dim(aten.mul.Tensor(gx, xhat), [1], True)),
    )
    return (
        aten._to_copy.default(aten.mul.Tensor(inner, rstd), dtype=g.dtype),
        aten._to_copy.default(aten.sum.dim_IntList(aten.mul.Tensor(gf, xhat), [0]), dtype=g.dtype),
        aten._to_copy.default(aten.sum.dim_IntList(gf, [0]), dtype=g.dtype),
    )


def bn_stats(x: torch.Tensor) -> Any:
    """A BatchNorm's training statistics as CUDA's decomposition gives them (torch 2.11: the
    input in float32, then a ``var`` and a ``mean`` over every dimension but the channels) of a
    channels-last [N, ROW, HW, HW] activation (``--hw``, 56: ResNet-50's stage-1 BatchNorms). Split in two kernels
    (Note [Split reductions] in split.py): the first, a Welford per channel over chunks of rows,
    ran at 24-29% of an H100's copy bandwidth in ResNet-50's bfloat16 training."""
    xf = aten._to_copy.default(x, dtype=torch.float32)
    return aten.var.correction(xf, [0, 2, 3], correction=0), aten.mean.dim(xf, [0, 2, 3])


def row_sum(x: torch.Tensor) -> Any:
    return aten.sum.dim_IntList(x, [1])


def col_sum(x: torch.Tensor) -> Any:
    return aten.sum.dim_IntList(x, [0])


def transpose_add(x: torch.Tensor) -> Any:
    t = aten.permute.default(x, [1, 0])
    return aten.add.Tensor(aten.clone.default(t, memory_format=torch.contiguous_format), 1.0)


def _vec(n: int) -> list[torch.Tensor]:
    return [torch.randn(n, device="cuda", dtype=DTYPE)]


def _rows(n: int) -> list[torch.Tensor]:
    return [torch.randn(n // ROW, ROW, device="cuda", dtype=DTYPE)]


WORKLOADS: dict[str, tuple[Callable[..., Any], Callable[[int], list[torch.Tensor]]]] = {
    "add": (add, lambda n: _vec(n) + _vec(n)),
    "relu_chain": (relu_chain, _vec),
    "gelu_chain": (gelu_chain, lambda n: _vec(n) + _vec(n)),
    "softmax": (softmax, _rows),
    "layer_norm": (
        layer_norm,
        lambda n: [
            *_rows(n),
            torch.randn(ROW, device="cuda", dtype=DTYPE),
            torch.randn(ROW, device="cuda", dtype=DTYPE),
        ],
    ),
    "layer_norm_backward": (
        layer_norm_backward,
        lambda n: [
            *_rows(n),
            *_rows(n),
            torch.randn(n // ROW, 1, device="cuda"),
            torch.rand(n // ROW, 1, device="cuda") + 0.5,
            torch.randn(ROW, device="cuda", dtype=DTYPE),
        ],
    ),
    "bn_stats": (
        bn_stats,
        lambda n: [
            torch.randn(max(1, n // (ROW * HW * HW)), ROW, HW, HW, device="cuda", dtype=DTYPE).to(
                memory_format=torch.channels_last
            )
        ],
    ),
    "row_sum": (row_sum, _rows),
    "col_sum": (col_sum, _rows),
    "transpose_add": (transpose_add, _rows),
}


def _scale(value: Any) -> float:
    """The largest magnitude among a result's tensors (at least 1): the absolute tolerance's scale."""
    if isinstance(value, torch.Tensor):
        return max(1.0, value.abs().max().item())
    return max((_scale(v) for v in value), default=1.0)


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def _sample(fn: Callable[[], Any], iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def _kernel_time(fn: Callable[[], Any], iters: int) -> float:
    """GPU kernel seconds per call: the device time of every kernel ``fn`` launches."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total_us = sum(
        e.device_time
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and getattr(e, "device_time", 0) > 0
    )
    return total_us / 1e6 / iters


def measure(name: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    fn, make_inputs = WORKLOADS[name]
    torch.manual_seed(0)
    inputs = make_inputs(size)
    gm = torch.fx.symbolic_trace(fn)
    expected = gm(*inputs)
    t0 = time.perf_counter()
    backend = TritonBackend(
        mode=args.mode,
        split_target_programs=args.split_target,
        split_min_rnumel=args.split_min,
        **args.switches,
    )
    compiled = kiln_loopir.compile_graph(gm, inputs, backend=backend)
    got = compiled(*inputs)
    torch.cuda.synchronize()
    kiln_compile = time.perf_counter() - t0
    tol = 1e-4 if DTYPE is torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol * _scale(expected))
    t0 = time.perf_counter()
    inductor = torch.compile(gm, mode=None if args.mode == "default" else args.mode)
    inductor(*inputs)
    torch.cuda.synchronize()
    inductor_compile = time.perf_counter() - t0
    impls: dict[str, Callable[[], Any]] = {
        "eager": lambda: gm(*inputs),
        "kiln": lambda: compiled(*inputs),
        "inductor": lambda: inductor(*inputs),
    }
    for i, settings in enumerate(filter(None, args.variants.split(";"))):
        # a variant compiles into a cache of its own: kernels and tuning choices are keyed by source
        os.environ["KILN_CACHE_DIR"] = os.path.join(_tmp, f"variant-{name}-{size}-{i}")
        switches = args.apply(settings)
        variant = kiln_loopir.compile_graph(
            gm, inputs, backend=TritonBackend(mode=args.mode, autotune_min_bytes=0, **switches)
        )
        torch.testing.assert_close(variant(*inputs), expected, rtol=tol, atol=tol * _scale(expected))
        impls[f"kiln[{settings}]"] = lambda v=variant: v(*inputs)  # type: ignore[misc]
    args.apply(args.set)
    for f in impls.values():  # warm-up (CUDA graphs record on the second call)
        for _ in range(3):
            f()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(args.reps):
        for key, f in impls.items():
            samples[key].append(_sample(f, args.iters))
    kernel: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(3):
        for key, f in impls.items():
            kernel[key].append(_kernel_time(f, args.iters))
    moved = _nbytes(inputs) + _nbytes(expected)
    row: dict[str, Any] = {
        "workload": name,
        "elements": size,
        "bytes": moved,
        "kiln_compile_s": kiln_compile,
        "inductor_compile_s": inductor_compile,
        "kernels": compiled.stats.kernels,
    }
    for key, times in samples.items():
        if key.startswith("kiln["):
            k = statistics.median(kernel[key])
            row.setdefault("variants", {})[key[5:-1]] = {
                "kernel_us": k * 1e6,
                "kernel_of_peak": moved / k / (args.peak * 1e12),
            }
            continue
        median = statistics.median(times)
        row[f"{key}_us"] = median * 1e6
        row[f"{key}_gbps"] = moved / median / 1e9
        row[f"{key}_of_peak"] = moved / median / (args.peak * 1e12)
        k = statistics.median(kernel[key])
        row[f"{key}_kernel_us"] = k * 1e6
        row[f"{key}_kernel_of_peak"] = moved / k / (args.peak * 1e12)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="where to write the JSON results")
    parser.add_argument("--sizes", default="1,16,64", help="millions of float32 elements (comma-separated)")
    parser.add_argument("--only", default="", help="workloads to run (comma-separated; default all)")
    parser.add_argument("--mode", default="default", choices=["default", "max-autotune-no-cudagraphs"])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--peak", type=float, default=4.3, help="copy bandwidth in TB/s (H200: ~4.3)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--row", type=int, default=1024, help="row length of the reduction workloads")
    parser.add_argument("--set", default="", help="heuristics constants to override, NAME=INT,...")
    parser.add_argument(
        "--hw", type=int, default=56, help="bn_stats: the feature map's side (56: [N, ROW, 56, 56])"
    )
    parser.add_argument("--split-target", type=int, default=256, help="TritonBackend split_target_programs")
    parser.add_argument("--split-min", type=int, default=1024, help="TritonBackend split_min_rnumel")
    parser.add_argument(
        "--variants",
        default="",
        help="heuristics settings to compare in one process, ';'-separated --set strings "
        "(each compiled into a fresh cache, default-mode autotune off); eager and torch.compile once",
    )
    args = parser.parse_args(argv)
    global ROW, DTYPE, HW
    ROW, DTYPE, HW = args.row, getattr(torch, args.dtype), args.hw
    from kiln_codegen_triton import heuristics

    defaults = {k: getattr(heuristics, k) for k in dir(heuristics) if k.isupper()}

    from kiln_codegen_triton.backend import TRITON_OPTIONS

    def apply(settings: str) -> dict[str, Any]:
        """Set heuristics constants (upper case) and return TritonBackend switches (lower case)."""
        for key, value in defaults.items():
            setattr(heuristics, key, value)
        switches: dict[str, Any] = {}
        for item in filter(None, settings.split(",")):
            key, _, value = item.partition("=")
            if key in TRITON_OPTIONS:
                switches[key] = TRITON_OPTIONS[key](int(value))
            elif key not in defaults:
                parser.error(f"--set/--variants: neither a heuristics constant nor a triton option: {key}")
            else:
                setattr(heuristics, key, int(value))
        return switches

    args.switches = apply(args.set)
    args.apply = apply
    if not torch.cuda.is_available():
        print("bandwidth.py needs a CUDA GPU", file=sys.stderr)
        return 2
    names = [n for n in args.only.split(",") if n] or list(WORKLOADS)
    sizes = [int(float(s) * 2**20) for s in args.sizes.split(",")]
    rows = []
    header = f"{'workload':<14}{'elements':>10}  {'eager kern %':>12} {'kiln kern %':>11} {'inductor kern %':>15}  {'kiln wall %':>11} {'inductor wall %':>15}  {'kiln us':>8} {'ind us':>8}"
    print(header)
    print("-" * len(header))
    for name in names:
        for size in sizes:
            row = measure(name, size, args)
            rows.append(row)
            print(
                f"{name:<14}{size // 2**20:>9}M  {100 * row['eager_kernel_of_peak']:>11.1f}% "
                f"{100 * row['kiln_kernel_of_peak']:>10.1f}% {100 * row['inductor_kernel_of_peak']:>14.1f}%  "
                f"{100 * row['kiln_of_peak']:>10.1f}% {100 * row['inductor_of_peak']:>14.1f}%  "
                f"{row['kiln_kernel_us']:>8.1f} {row['inductor_kernel_us']:>8.1f}",
                flush=True,
            )
            for settings, v in row.get("variants", {}).items():
                print(
                    f"    variant {settings:<48} kern {100 * v['kernel_of_peak']:5.1f}%  {v['kernel_us']:8.1f} us"
                )
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "host": platform.node(),
        "peak_tbps": args.peak,
        "mode": args.mode,
        "reps": args.reps,
        "iters": args.iters,
        "dtype": args.dtype,
        "row": args.row,
        "set": args.set,
        "variants": args.variants,
        "split_target": args.split_target,
        "split_min": args.split_min,
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
