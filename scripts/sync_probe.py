"""Does a compiled call wait on the GPU? (issue 14: GPT-2's default-mode host time per call at gpu
size is about its GPU time under kiln and torch.compile alike, 1.86 / 1.46 ms for 1.78 / 1.51 ms of
kernels, where at tiny size kiln's host time is 0.82 ms against 1.14: a synchronization would
explain both.) Per model and backend: every synchronizing CUDA call a warm call makes
(`torch.cuda.set_sync_debug_mode("warn")`, with the Python line that made it), and the host time of
a call issued behind a long queue of GPU work against one issued on an idle GPU: a call that never
waits returns as fast in both.

    python scripts/sync_probe.py [--models gpt2,bert] [--backends eager,kiln,inductor]
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
import warnings

import torch

import kiln
from kiln_bench import models


def _compiled(backend: str, model: torch.nn.Module) -> torch.nn.Module:
    if backend == "eager":
        return model
    if backend == "kiln":
        return kiln.compile(model)
    return torch.compile(model)  # type: ignore[return-value]


def _host_ms(call: object, busy: torch.Tensor | None, calls: int = 10) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        if busy is not None:  # a few ms of queued GPU work ahead of the call
            for _ in range(20):
                busy = busy @ busy
        t0 = time.perf_counter()
        call()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gpt2,bert")
    p.add_argument("--backends", default="eager,kiln,inductor")
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    busy = torch.randn(4096, 4096, device="cuda", dtype=dtype) / 64
    for name in a.models.split(","):
        w = models.build(name, "gpu").to("cuda", dtype)
        model = w.model.eval()
        for backend in a.backends.split(","):
            fn = _compiled(backend, model)

            def call(fn: torch.nn.Module = fn, inputs: dict[str, object] = w.inputs) -> object:
                with torch.no_grad():
                    return fn(**inputs)

            for _ in range(3):
                call()
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    call()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [s for s in seen if "synchroniz" in str(s.message).lower()]
            idle, queued = _host_ms(call, None), _host_ms(call, busy)
            print(
                f"{name:8s} {backend:9s} host ms idle GPU {idle:7.3f}  behind a queue {queued:7.3f}  syncs {len(syncs)}"
            )
            for s in syncs[:5]:
                print(f"    {s.filename}:{s.lineno}: {str(s.message)[:120]}")
            if backend != "eager":
                torch.compiler.reset()
                kiln.reset()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
