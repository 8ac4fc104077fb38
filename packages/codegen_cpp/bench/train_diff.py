"""One training step of kiln next to torch.compile's, op by op and split into forward and backward.

Issue 20 (the Swin gap): ``train1.py --profile`` lists each backend's slowest ops, which does not
say where two compilers' steps differ. Here each step runs under ``torch.profiler`` with the
forward (and the loss) inside a ``fwd`` range and ``backward()`` inside a ``bwd`` range; every CPU
op (an ``aten::`` operator) and every C++ kernel range (kiln's ``kiln:cpp_fused_*`` under
``KILN_PROFILE=1``, torch.compile's ``graph_N_cpp_fused_*`` under
``TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1``) is put in its phase and in a class: ``kernel``
(generated code), ``gemm`` (mm/bmm/addmm/baddbmm and friends), ``other`` (every other extern op:
copies, index_put, native_layer_norm, ...). Per backend it prints, per phase and class, the self
CPU time per step and the count per step, then the largest per-op differences. Times include
each range's own cost (~5 us), which kernel counts show. ``--backends kiln,kiln_ab`` compares
kiln with itself under ``--ab-options`` (a copy of the model; e.g. ``cpu_layout_training=force``
against the layout rule's choice). A benchmark, not a test.

    python packages/codegen_cpp/bench/train_diff.py --models swin --steps 5
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import re
import sys
from collections import defaultdict
from typing import Any

os.environ.setdefault("KILN_PROFILE", "1")
os.environ.setdefault("TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_kept = {k: os.environ[k] for k in ("KILN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR") if k in os.environ}
import torch  # noqa: E402
from train1 import MODELS, _compile, _parse_options, _step  # noqa: E402

os.environ.update(_kept)  # train1 gives each run fresh caches; a cache named here is kept

GEMMS = frozenset(
    f"aten::{n}"
    for n in ("mm", "bmm", "addmm", "baddbmm", "addmv", "mv", "dot", "linear", "matmul", "_mkl_linear")
)
KERNEL = re.compile(r"^kiln:|(^|_)cpp_")
# aten ops that only call others (their self time is glue, counted but not as a leaf)


def _class(name: str) -> str:
    if KERNEL.search(name):
        return "kernel"
    return "gemm" if name in GEMMS else "other"


def _phase(e: Any) -> tuple[str, str]:
    """(phase, step range) of an event."""
    phase, step, p = "none", "", e.cpu_parent
    while p is not None:
        if p.name in ("fwd", "bwd"):
            phase = p.name
        elif p.name.startswith("step"):
            step = p.name
        p = p.cpu_parent
    return phase, step


def profile(w: Any, fn: Any, model: Any, steps: int) -> dict[tuple[str, str], list[float]]:
    """(phase, op) -> [self ms per step, calls per step]. The k-th call of an op in a phase takes
    the fastest of its times over the steps (the machine is shared: a slow call is someone else's
    load, not the op's)."""

    def step() -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        from kiln_bench.models import loss_of

        with torch.profiler.record_function("fwd"):
            loss = loss_of(w, fn(**w.inputs))
        with torch.profiler.record_function("bwd"):
            loss.backward()

    for _ in range(2):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            with torch.profiler.record_function(f"step{i}"):
                step()
    calls: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        if e.name in ("fwd", "bwd") or not ("::" in e.name or KERNEL.search(e.name)):
            continue
        phase, at = _phase(e)
        calls[(phase, _norm(e.name))][at].append(e.self_cpu_time_total / 1e3)
    out: dict[tuple[str, str], list[float]] = {}
    for key, per_step in calls.items():
        runs = [r for r in per_step.values() if len(r) == max(len(r) for r in per_step.values())]
        out[key] = [sum(min(col) for col in zip(*runs, strict=True)), float(len(runs[0]))]
    return out


def _norm(name: str) -> str:
    """Kernel names without the graph prefix and serial number, so the two compilers' compare."""
    name = re.sub(r"^kiln:", "", name)
    name = re.sub(r"^graph_\d+_", "", name)
    return re.sub(r"_\d+$", "", name)


def summary(name: str, prof: dict[tuple[str, str], list[float]]) -> dict[tuple[str, str], list[float]]:
    by: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (phase, op), (ms, n) in prof.items():
        by[(phase, _class(op))][0] += ms
        by[(phase, _class(op))][1] += n
    return by


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="swin")
    parser.add_argument("--backends", default="kiln,inductor")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kiln-options", default="")
    parser.add_argument(
        "--ab-options", default="", help="k=v,... for the kiln_ab backend (over --kiln-options)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for mname in args.models.split(","):
        w = MODELS[mname]()
        w.model.train()
        profs = {}
        for b in args.backends.split(","):
            model, options = w.model, _parse_options(args.kiln_options)
            if b == "kiln_ab":
                model, options = copy.deepcopy(w.model), {**options, **_parse_options(args.ab_options)}
            wb = dataclasses.replace(w, model=model)
            fn = _compile("kiln" if b == "kiln_ab" else b, model, options if b.startswith("kiln") else {})
            _step(wb, fn, model)
            profs[b] = profile(wb, fn, model, args.steps)
        print(f"== {mname}: self ms per step / ops per step, by phase and class")
        sums = {b: summary(b, p) for b, p in profs.items()}
        keys = sorted({k for s in sums.values() for k in s})
        print(f"{'phase':6} {'class':7} " + " ".join(f"{b:>18}" for b in profs))
        for k in keys:
            cells = " ".join(
                f"{sums[b].get(k, [0, 0])[0]:9.3f} /{sums[b].get(k, [0, 0])[1]:6.0f}  " for b in profs
            )
            print(f"{k[0]:6} {k[1]:7} {cells}")
        for b in profs:
            print(f"  {b} total {sum(v[0] for v in sums[b].values()):.3f} ms")
        names = list(profs)
        if len(names) == 2:
            a, c = names
            ops = {k for p in profs.values() for k in p}
            diffs = sorted(ops, key=lambda k: -abs(profs[a].get(k, [0, 0])[0] - profs[c].get(k, [0, 0])[0]))
            print(f"-- largest differences ({a} - {c}, ms per step; calls per step)")
            for k in diffs[: args.top]:
                x, y = profs[a].get(k, [0, 0]), profs[c].get(k, [0, 0])
                print(
                    f"{k[0]:4} {k[1][:90]:90} {x[0]:8.3f} {y[0]:8.3f} {x[0] - y[0]:+8.3f}  {x[1]:4.0f} {y[1]:4.0f}"
                )


if __name__ == "__main__":
    main()
