"""Every GPU kernel of one model's step, kiln against torch.compile (issue 15: where kiln's generated
kernels spend the time torch.compile's do not).

kiln_bench's profile view names the five slowest kernels; a model whose generated kernels take
1.3 ms more than torch.compile's in total (ResNet-50 bf16 training on an H100: 5.05 against 3.80
ms a step, twenty-fifth session) needs the whole list. For each backend this profiles ``--calls``
warm steps (inference: a call under no_grad; training: forward, the suite's loss, backward) and
prints every kernel name with its launches and microseconds per step, largest first, then the
totals per kind: the generated kernels grouped by what their names say they fuse (the words after
``fused`` that name a reduction or a pattern: ``var``/``mean``/``sum``/``max_pool2d``/...,
``partial`` for a split reduction's first kernel), and library kernels (cuDNN, cuBLAS, copies) by
family. JSON with every row in ``--out``.

    python3 scripts/gpu_kernel_table.py --model resnet --mode training --dtype bfloat16 --out t.json
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from typing import Any

import torch

from kiln_bench import harness
from kiln_bench.models import build
from kiln_bench.profile import device_events

WORDS = (
    "partial", "var", "mean", "sum", "max_pool2d", "avg_pool2d", "softmax", "convolution_backward",
    "native_batch_norm_backward", "native_layer_norm_backward", "native_layer_norm", "embedding_dense_backward",
    "threshold_backward", "relu", "gelu", "cat", "clone", "copy",
)  # fmt: skip


def kind(name: str) -> str:
    """A coarse label for a kernel: its family for library kernels, the telling words of a
    generated kernel's name otherwise."""
    if not name.startswith("triton_"):
        for key in (
            "Memcpy",
            "Memset",
            "nchwToNhwc",
            "nhwcToNchw",
            "cudnn",
            "cutlass",
            "xmma",
            "nvjet",
            "gemm",
            "at::native",
        ):
            if key in name:
                return key
        return "other"
    body = re.sub(r"_\d+(_partial)?$", lambda m: m.group(1) or "", name)
    found = [w for w in WORDS if re.search(rf"(^|_){w}(_|$)", body)]
    return "triton " + ("+".join(found[:3]) if found else name.split("_")[1])


def profile(
    backend: str, model_name: str, mode: str, dtype: torch.dtype, calls: int, device: str = "cuda"
) -> dict[str, Any]:
    workload = build(model_name, "gpu").to(device, dtype)
    model = workload.model
    model.train(mode == "training")
    if backend == "kiln":
        import kiln

        fn: Any = kiln.compile(model)
    elif backend == "inductor":
        fn = torch.compile(model)
    else:
        fn = model
    for _ in range(3):
        harness.step(workload, fn, mode)
    if device == "cuda":
        torch.cuda.synchronize()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        for _ in range(calls):
            harness.step(workload, fn, mode)
        if device == "cuda":
            torch.cuda.synchronize()
    kernels, copies = device_events(prof.events())
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for e in [*kernels, *copies]:
        span = e.time_range.end - e.time_range.start
        rows[str(e.name)][0] += 1 / calls
        rows[str(e.name)][1] += float(e.self_device_time_total or span) / calls
    return {name: {"launches": n, "us": us, "kind": kind(name)} for name, (n, us) in rows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet")
    parser.add_argument("--mode", default="training", choices=["inference", "training"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--backends", default="kiln,inductor")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--top", type=int, default=40, help="kernel rows printed per backend")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_kernel_table.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    result: dict[str, Any] = {"model": args.model, "mode": args.mode, "dtype": args.dtype, "backends": {}}
    for backend in filter(None, args.backends.split(",")):
        rows = profile(backend, args.model, args.mode, dtype, args.calls)
        result["backends"][backend] = rows
        total = sum(r["us"] for r in rows.values())
        print(
            f"\n== {backend}: {total / 1000:.3f} ms of kernels a step, {sum(r['launches'] for r in rows.values()):.0f} launches"
        )
        by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
        for r in rows.values():
            by_kind[r["kind"]][0] += r["launches"]
            by_kind[r["kind"]][1] += r["us"]
        for k, (n, us) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
            print(f"  {us / 1000:8.3f} ms {n:6.0f}x  {k}")
        print("  -- kernels")
        for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["us"])[: args.top]:
            print(f"  {r['us']:8.1f} us {r['launches']:5.0f}x  {name[:110]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
