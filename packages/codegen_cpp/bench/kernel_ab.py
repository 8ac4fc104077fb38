"""A/B of the C++ generator's options on one training step, kernel by kernel, robust to a busy machine.

Compiles a model of ``train1.py`` twice with ``kiln.compile`` (a copy of the model for the second),
A with the default C++ options and B with ``KILN_CPP_OPTIONS=--ab-cpp``, profiles ``--calls``
training steps of each at one thread (``KILN_PROFILE=1``: a range per C++ kernel), and reports for
each the sum over its C++ kernels of the *fastest* call of each kernel (times calls per step): on
a shared 2-core machine, where medians of whole steps move by +-10% between identical runs,
the fastest of ten calls of a kernel hardly moves. Then the slowest kernels of each. A benchmark,
not a test.

    python packages/codegen_cpp/bench/kernel_ab.py --models roberta,gpt_neox
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections import defaultdict
from typing import Any

os.environ["KILN_PROFILE"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from train1 import CPP_ENV, MODELS, _step

import kiln


def _kernels(step: Any, calls: int) -> dict[str, tuple[float, int]]:
    """Per C++ kernel (and per aten op): (fastest call in ms, calls per step)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    durations: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.name.startswith("kiln:") or e.name.startswith("aten::"):
            durations[e.name].append(
                e.cpu_time_total / 1e3 if e.name.startswith("kiln:") else e.self_cpu_time_total / 1e3
            )
    out = {}
    for name, ds in durations.items():
        per_step = len(ds) // calls
        if per_step == 0:
            continue
        # the fastest call per step position: the k-th call of a kernel in a step is one site
        sites = (
            [min(ds[k::per_step]) for k in range(per_step)]
            if len(ds) == per_step * calls
            else [min(ds)] * per_step
        )
        out[name] = (sum(sites), per_step)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="roberta")
    parser.add_argument("--ab-cpp", default="fuse_mixed_reductions=1,split_reductions=0")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.models.split(","):
        w = MODELS[name]()
        w.model.train()
        b_model = copy.deepcopy(w.model)
        a = kiln.compile(w.model)
        _step(w, a)
        os.environ[CPP_ENV] = args.ab_cpp
        b = kiln.compile(b_model, options={"layout": True, "pad_mm": True, "attention": True})
        _step(w, b, b_model)
        del os.environ[CPP_ENV]
        for _ in range(3):
            _step(w, a)
            _step(w, b, b_model)
        ka = _kernels(lambda w=w, a=a: _step(w, a), args.calls)
        kb = _kernels(lambda w=w, b=b, m=b_model: _step(w, b, m), args.calls)
        for label, ks in (("A (default)", ka), (f"B ({args.ab_cpp})", kb)):
            cpp = {k: v for k, v in ks.items() if k.startswith("kiln:")}
            aten = {k: v for k, v in ks.items() if k.startswith("aten::")}
            print(
                f"{name} {label}: C++ kernels {sum(v for v, _ in cpp.values()):.3f} ms in "
                f"{sum(n for _, n in cpp.values())} calls; aten self {sum(v for v, _ in aten.values()):.3f} ms"
            )
            for k, (v, n) in sorted(cpp.items(), key=lambda kv: -kv[1][0])[: args.top]:
                print(f"    {v:7.3f} ms x{n} {k}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
