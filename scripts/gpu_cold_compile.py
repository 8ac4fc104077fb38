"""Cold compile time on the GPU, each (model, backend) in a fresh process with empty disk caches:
seconds from the compile call to the end of the third call, and kiln's compile time by phase.

    python scripts/gpu_cold_compile.py --models resnet,gpt2 --backends kiln,kiln-threads,inductor

Backends: ``kiln`` (Triton kernels compiled in the worker pool), ``kiln-threads`` (the pool off,
``KILN_COMPILE_WORKERS=0``: kernels compiled in the parent's threads), ``inductor``
(torch.compile). Both compilers start cold: a fresh process, no FX/Triton/kiln cache on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DTYPES = ("float32", "bfloat16")


def child(model_name: str, backend: str, dtype: str, mode: str) -> dict[str, object]:
    import torch

    from kiln_bench.models import build, loss_of

    work = build(model_name, "gpu").to("cuda", getattr(torch, dtype))
    training = mode == "training"
    work.model.train(training)
    torch.cuda.synchronize()
    start = time.perf_counter()
    if backend == "inductor":
        fn = torch.compile(work.model)
    else:
        import kiln

        fn = kiln.compile(work.model)
    with torch.set_grad_enabled(training):
        for _ in range(3):
            out = fn(**work.inputs)
            if training:
                loss_of(work, out).backward()
    torch.cuda.synchronize()
    row: dict[str, object] = {"model": model_name, "backend": backend, "seconds": time.perf_counter() - start}
    if backend != "inductor":
        import kiln

        phases: dict[str, float] = {}
        for record in kiln.compile_log():
            for phase, seconds in record.phases.items():
                phases[phase] = round(phases.get(phase, 0.0) + seconds, 3)
        row["phases"] = phases
        row["graphs"] = len(kiln.compile_log())
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet,gpt2,bert")
    parser.add_argument("--backends", default="kiln,kiln-threads,inductor")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--mode", default="inference", choices=("inference", "training"))
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("ROW " + json.dumps(child(*args.child, args.dtype, args.mode)), flush=True)
        return 0
    rows = []
    for model in args.models.split(","):
        for backend in args.backends.split(","):
            with tempfile.TemporaryDirectory(prefix="cold_compile_") as root:
                env = dict(os.environ)
                for var in ("KILN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
                    env[var] = os.path.join(root, var.lower())
                if backend == "kiln-threads":
                    env["KILN_COMPILE_WORKERS"] = "0"
                cmd = [
                    sys.executable,
                    __file__,
                    "--dtype",
                    args.dtype,
                    "--mode",
                    args.mode,
                    "--child",
                    model,
                    backend,
                ]
                done = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=600)
            found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
            if not found:
                print(f"{model} {backend}: FAILED\n{done.stderr[-2000:]}")
                continue
            row = json.loads(found[0])
            rows.append(row)
            phases = " ".join(f"{k} {v:.2f}" for k, v in row.get("phases", {}).items())
            print(f"{model:10} {backend:13} {row['seconds']:6.1f} s  {phases}", flush=True)
    for backend in args.backends.split(","):
        times = [r["seconds"] for r in rows if r["backend"] == backend]
        if times:
            print(f"median {backend:13} {statistics.median(times):6.1f} s over {len(times)} models")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"dtype": args.dtype, "mode": args.mode, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
