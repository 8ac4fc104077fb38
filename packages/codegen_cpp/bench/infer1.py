"""Inference at one thread on the public suite: eager, kiln, a second kiln and torch.compile, by CPU clock.

Issue 20 (cpu19): kiln_bench times wall clock, and on the shared 2-core machine its eager
medians of one model moved 3x between rows of one run (the MLP's training step 1.8 -> 23 ms), so
a model it lists behind torch.compile may not be. Here each backend's call is timed by the
process's CPU time (``time.process_time``, one thread), the backends interleaved (A B C A B C
...), medians of ``--repeats`` calls; every backend's logits are checked against eager's first.
``kiln_ab`` is kiln with its C++ generator under ``KILN_CPP_OPTIONS=--ab-cpp`` (an A/B of one
switch in one process), its ``kiln.compile`` options updated by ``--ab-options`` (a loopir switch:
``inplace_reuse=false``). A benchmark, not a test.

``--dtype bfloat16`` runs the models in bfloat16 (checked against eager's bfloat16 logits at
bfloat16 tolerance); ``--threads 2`` at two threads, timed by wall clock (the CPU time of two
threads is their sum). A backend ``kiln@k=v/k=v`` is kiln under those ``kiln.compile`` options
(``kiln@conv_prepack=true/linear_pack=true``), any number of them in one run.

    python packages/codegen_cpp/bench/infer1.py --models t5,llama --backends eager,kiln,kiln_ab,inductor \
        --ab-cpp hoist_row_invariant=0
    python packages/codegen_cpp/bench/infer1.py --models resnet --dtype bfloat16 \
        --backends eager,kiln,kiln@conv_prepack=true/linear_pack=true,inductor
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
    if backend.startswith("kiln@"):
        options = _parse_options(backend.removeprefix("kiln@").replace("/", ","))
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
    name: str,
    backends: list[str],
    repeats: int,
    ab_cpp: str,
    ab_options: dict[str, Any],
    dtype: torch.dtype = torch.float32,
    wall: bool = False,
) -> dict[str, float]:
    w = build(name, "cpu").to("cpu", dtype)
    w.model.eval()
    fns = {b: _compiled(b, w.model, w.inputs, ab_cpp, ab_options) for b in backends}
    times: dict[str, list[float]] = {b: [] for b in fns}
    clock = time.perf_counter if wall else time.process_time
    tol = 1e-3 if dtype == torch.float32 else 5e-2  # bfloat16: a few roundings of 2**-8 apart
    with torch.no_grad():
        ref = logits_of(w.model(**w.inputs))
        scale = max(1.0, ref.abs().max().item())
        for fn in fns.values():
            for _ in range(3):
                out = logits_of(fn(**w.inputs))
            torch.testing.assert_close(out, ref, rtol=tol, atol=tol * scale)
        for _ in range(repeats):
            for b, fn in fns.items():
                t0 = clock()
                fn(**w.inputs)
                times[b].append(clock() - t0)
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
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1, help="above 1: timed by wall clock")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backends = args.backends.split(",")
    dtype = getattr(torch, args.dtype)
    clock = "cpu clock" if args.threads == 1 else "wall clock"
    print(
        f"inference, {args.dtype}, {args.threads} thread(s), {clock}: medians in ms (speedup over the first backend)"
    )
    for name in args.models.split(","):
        ms = run(
            name,
            backends,
            args.repeats,
            args.ab_cpp,
            _parse_options(args.ab_options),
            dtype,
            args.threads > 1,
        )
        first = ms[backends[0]]
        print(f"{name:12} " + " ".join(f"{b} {v:8.3f} ({first / v:.3f}x)" for b, v in ms.items()), flush=True)


if __name__ == "__main__":
    main()
