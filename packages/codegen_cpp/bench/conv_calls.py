"""Each convolution call of a training step, with the strides it got and its time, per backend.

``train_diff.py`` sums a step's ``aten::convolution_backward`` time; where two backends differ,
the question is which calls, and in which layouts: oneDNN picks each call's memory format from
its operands' strides (for a depthwise convolution from the input alone), so a call's strides
decide its kernel (Note [Depthwise convolution backwards on small maps] in kiln_loopir's
passes/channels_last.py). Here a ``train1.py`` model's step runs under ``torch.profiler`` with
``record_shapes`` (shapes and strides of each call) for each backend of ``--backends``: ``eager``,
``inductor``, ``kiln``, or ``kiln:k=v,...`` (kiln with those ``kiln.compile`` options, on a copy of
the model). Each ``aten::convolution`` and ``aten::convolution_backward`` is printed in step order
with the fastest of ``--steps`` profiled steps, and the backward calls' sum. A benchmark, not a test.

    python packages/codegen_cpp/bench/conv_calls.py --models convnext_v2 \\
        --backends kiln,kiln:depthwise_backward_nchw=false,inductor
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from train1 import MODELS, _compile, _parse_options

from kiln_bench.models import loss_of

NAMES = ("aten::convolution", "aten::convolution_backward")


def calls(w: Any, backend: str, steps: int) -> list[tuple[str, float, Any, Any, Any]]:
    """(op, fastest us, input dims, input strides, last concrete argument) per call, in order."""
    name, options = backend, {}
    if backend.startswith("kiln:"):
        name, options = "kiln", _parse_options(backend[5:])
    model = copy.deepcopy(w.model)
    fn = _compile(name, model, options)

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        loss_of(w, fn(**w.inputs)).backward()

    for _ in range(4):
        step()
    best: dict[int, tuple[str, float, Any, Any, Any]] = {}
    for _ in range(steps):
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        ) as prof:
            step()
        path = tempfile.mktemp(suffix=".json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        os.unlink(path)
        found = [e for e in events if e.get("ph") == "X" and e.get("name") in NAMES]
        for i, e in enumerate(sorted(found, key=lambda e: e["ts"])):
            a = e.get("args", {})
            row = (
                e["name"],
                float(e["dur"]),
                a.get("Input Dims"),
                a.get("Input Strides"),
                a.get("Concrete Inputs"),
            )
            if i not in best or best[i][1] > row[1]:
                best[i] = row
    return [best[i] for i in sorted(best)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="convnext_v2")
    parser.add_argument("--backends", default="kiln,inductor")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for mname in args.models.split(","):
        w = MODELS[mname]()
        w.model.train()
        for backend in args.backends.split(","):
            print(f"== {mname} {backend}")
            total = 0.0
            for op, us, dims, strides, concrete in calls(w, backend, args.steps):
                if op.endswith("_backward"):
                    total += us
                last = concrete[-1] if concrete else ""
                print(f"  {op[6:]:21} {us:7.0f} us  dims {dims[:3]}  strides {strides[:3]}  {last}")
            print(f"  convolution_backward sum {total / 1e3:.2f} ms")


if __name__ == "__main__":
    main()
