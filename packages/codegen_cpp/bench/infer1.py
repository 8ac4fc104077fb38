"""Inference at one thread on the public suite: eager, kiln, a second kiln and torch.compile, by CPU clock.

Issue 20 (cpu19): kiln_bench times wall clock, and on the shared 2-core machine its eager
medians of one model moved 3x between rows of one run (the MLP's training step 1.8 -> 23 ms), so
a model it lists behind torch.compile may not be. Here each backend's call is timed by the
process's CPU time (``time.process_time``, one thread), the backends interleaved (A B C A B C
...), medians of ``--repeats`` calls; every backend's logits are checked against eager's first.
``kiln_ab`` is kiln with its C++ generator under ``KILN_CPP_OPTIONS=--ab-cpp`` (an A/B of one
switch in one process), its ``kiln.compile`` options updated by ``--ab-options`` (a loopir switch:
``inplace_reuse=false``). A benchmark, not a test.

    python packages/codegen_cpp/bench/infer1.py --models t5,llama --backends eager,kiln,kiln_ab,inductor \
        --ab-cpp hoist_row_invariant=0
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-infer1-"))

import torch

import kiln
from kiln_bench.models import build, logits_of


def _parse_options(text: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        k, _, v = item.partition("=")
        options[k] = {"true": True, "false": False}.get(v.lower(), v)
    return options


def _compiled(
    backend: str, model: torch.nn.Module, inputs: dict[str, Any], ab_cpp: str, ab_options: dict[str, Any]
) -> Any:
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model)
    saved = os.environ.get("KILN_CPP_OPTIONS")
    options = None
    if backend == "kiln_ab":
        os.environ["KILN_CPP_OPTIONS"] = ab_cpp
        # an explicit default: another cache key, so a fresh compile
        options = {"layout": True, **ab_options}
    try:
        fn = kiln.compile(model, options=options)
        with torch.no_grad():
            fn(**inputs)  # compiled here, under this backend's generator options
    finally:
        if saved is None:
            os.environ.pop("KILN_CPP_OPTIONS", None)
        else:
            os.environ["KILN_CPP_OPTIONS"] = saved
    return fn


def run(
    name: str, backends: list[str], repeats: int, ab_cpp: str, ab_options: dict[str, Any]
) -> dict[str, float]:
    w = build(name, "cpu")
    w.model.eval()
    fns = {b: _compiled(b, w.model, w.inputs, ab_cpp, ab_options) for b in backends}
    times: dict[str, list[float]] = {b: [] for b in fns}
    with torch.no_grad():
        ref = logits_of(w.model(**w.inputs))
        scale = max(1.0, ref.abs().max().item())
        for fn in fns.values():
            for _ in range(3):
                out = logits_of(fn(**w.inputs))
            torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3 * scale)
        for _ in range(repeats):
            for b, fn in fns.items():
                t0 = time.process_time()
                fn(**w.inputs)
                times[b].append(time.process_time() - t0)
    return {b: statistics.median(v) * 1e3 for b, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert,distilbert,llama,t5,vit,resnet,convnext,mlp,cnn")
    parser.add_argument("--backends", default="eager,kiln,inductor")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--ab-cpp", default="", help="KILN_CPP_OPTIONS of the kiln_ab backend")
    parser.add_argument(
        "--ab-options", default="", help="k=v,... kiln.compile options of the kiln_ab backend"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    backends = args.backends.split(",")
    print("inference, 1 thread, cpu clock: medians in ms (speedup over the first backend)")
    for name in args.models.split(","):
        ms = run(name, backends, args.repeats, args.ab_cpp, _parse_options(args.ab_options))
        first = ms[backends[0]]
        print(f"{name:12} " + " ".join(f"{b} {v:8.3f} ({first / v:.3f}x)" for b, v in ms.items()), flush=True)


if __name__ == "__main__":
    main()
