"""Extern calls (GEMMs, convolutions, ...) that are slower in kiln's training step than in eager's.

Issue 20: kiln's wrappers call aten for the ops they do not generate (matmuls, convolutions and
their backwards, attention, RNNs), and those calls should cost what eager's do. This audit runs a
model's training step (``train1.py``'s models and step: forward, cross-entropy, ``backward()``) in
eager and in kiln, in one process, interleaved, and times every such call:

* eager: the whole step under a ``TorchDispatchMode`` that times each aten call it sees;
* kiln: each compiled wrapper's extern callables (its ``_op_<name>`` globals, Note [Extern calls
  through torch's Python bindings] in kiln_loopir's wrapper_support) are wrapped so that each call
  runs under the same mode; the mode is entered only inside the call, after the frame's guards
  (which refuse a dispatch mode around compiled code) have run.

Both sides are timed the same way (``time.thread_time`` around the aten call inside the mode: the
thread's CPU time, which other processes on a shared machine hardly move). A call is keyed by its
op (overload dropped: ``mm.out`` is ``mm``; ``addmm`` is ``mm`` with ``+bias`` noted, as kiln
may add a linear layer's bias in a kernel where eager's ``addmm`` does) and the shapes of its tensor arguments (an ``out=``
tensor left out); per step, the time of each key is summed, and the median over ``--steps`` steps
is taken. Keys of kiln's externs are matched with eager's; the table lists the keys where kiln's
median exceeds eager's by more than ``--threshold-us`` and ``--ratio``, with the strides (and
storage offsets) each side passed. Keys kiln calls that eager never does are listed apart.
``AUDIT_HOT=1`` runs each call twice and times the second, its operands then in the caches: a gap
that disappears so is where the operands were (the schedule's order), not how they are laid out.
A benchmark, not a test.

    python packages/codegen_cpp/bench/extern_audit.py --models convnext_v2 --steps 15
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train1 sets the cache directories
import torch
import train1
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import kiln

Key = tuple[str, tuple[tuple[int, ...], ...]]
# eager's linear layers call addmm where kiln may call mm and add the bias in a kernel (or the
# reverse): both are keyed as the GEMM, the bias shown with the strides
FOLDED = {"addmm": "mm", "baddbmm": "bmm"}


def _layout(t: torch.Tensor) -> str:
    s = f"{tuple(t.stride())}"
    if t.storage_offset():
        s += f"+{t.storage_offset()}"
    if t.numel() and t.data_ptr() % 64:
        s += f"@{t.data_ptr() % 64}"  # not 64-byte aligned
    return s


class Timer(TorchDispatchMode):
    """Times each aten call it sees: (key, strides, seconds) into ``calls``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Key, str, float]] = []
        self.site = ""  # the wrapper's name of the extern call being timed (kiln's side)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if os.environ.get("AUDIT_HOT"):
            func(*args, **kwargs)
        t0 = time.thread_time()
        out = func(*args, **kwargs)
        dt = time.thread_time() - t0
        flat, _ = tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        op, bias = func.overloadpacket.__name__, ""
        if op in FOLDED:  # a GEMM with its bias added in the call: keyed as the GEMM
            op, bias, tensors = FOLDED[op], f" +bias{_layout(tensors[0])}", tensors[1:]
        key = (op, tuple(tuple(t.shape) for t in tensors))
        strides = " ".join(_layout(t) for t in tensors) + bias + self.site
        self.calls.append((key, strides, dt))
        return out


def _wrappers() -> list[dict[str, Any]]:
    """The namespaces of every kiln C++ wrapper alive (``call`` functions with ``_op_`` globals)."""
    out, seen = [], set()
    for obj in gc.get_objects():
        if type(obj) is type(_wrappers) and obj.__name__ == "call":
            g = obj.__globals__
            if id(g) not in seen and any(k.startswith("_op_") for k in g):
                seen.add(id(g))
                out.append(g)
    return out


def _instrument(timer: Timer) -> int:
    """Wrap every extern callable of every wrapper so that it runs under ``timer``."""
    n = 0
    for g in _wrappers():
        for name, fn in list(g.items()):
            if not name.startswith("_op_") or getattr(fn, "_audited", False):
                continue

            def timed(
                *args: Any, _fn: Callable[..., Any] = fn, _site: str = f" [{name[4:]}]", **kwargs: Any
            ) -> Any:
                timer.site = _site
                try:
                    with timer:
                        return _fn(*args, **kwargs)
                finally:
                    timer.site = ""

            timed._audited = True  # type: ignore[attr-defined]
            g[name] = timed
            n += 1
    return n


def _per_step(calls: list[tuple[Key, str, float]]) -> tuple[dict[Key, float], dict[Key, Counter[str]]]:
    total: dict[Key, float] = defaultdict(float)
    strides: dict[Key, Counter[str]] = defaultdict(Counter)
    for key, s, dt in calls:
        total[key] += dt
        strides[key][s] += 1
    return total, strides


def audit(name: str, steps: int, warmup: int, options: dict[str, Any]) -> dict[str, Any]:
    w = train1.MODELS[name]()
    w.model.train()
    compiled = kiln.compile(w.model, options=options or None)
    for _ in range(warmup):
        train1._step(w, w.model)
        train1._step(w, compiled)
    timer = Timer()
    wrapped = _instrument(timer)
    eager_steps: list[dict[Key, float]] = []
    kiln_steps: list[dict[Key, float]] = []
    strides: dict[str, dict[Key, Counter[str]]] = {
        "eager": defaultdict(Counter),
        "kiln": defaultdict(Counter),
    }
    for _ in range(steps):
        for side in ("eager", "kiln"):
            timer.calls = []
            if side == "eager":
                with timer:
                    train1._step(w, w.model)
            else:
                train1._step(w, compiled)
            total, s = _per_step(timer.calls)
            (eager_steps if side == "eager" else kiln_steps).append(total)
            if not strides[side]:
                for k, c in s.items():
                    strides[side][k] = c
    keys = set().union(*kiln_steps)
    rows: list[dict[str, Any]] = []
    for key in keys:
        k_us = statistics.median(st.get(key, 0.0) for st in kiln_steps) * 1e6
        e_us = (
            statistics.median(st.get(key, 0.0) for st in eager_steps) * 1e6
            if key in strides["eager"]
            else None
        )
        rows.append(
            {
                "op": key[0],
                "shapes": [list(s) for s in key[1]],
                "kiln_us": round(k_us, 1),
                "eager_us": None if e_us is None else round(e_us, 1),
                "kiln_calls": sum(strides["kiln"][key].values()),
                "eager_calls": sum(strides["eager"][key].values()),
                "kiln_strides": dict(strides["kiln"][key]),
                "eager_strides": dict(strides["eager"].get(key, {})),
            }
        )
    rows.sort(key=lambda r: -(r["kiln_us"] - (r["eager_us"] or 0.0)))
    return {
        "model": name,
        "wrapped_externs": wrapped,
        "kiln_extern_us": round(sum(r["kiln_us"] for r in rows), 1),
        "eager_same_us": round(sum(r["eager_us"] or 0.0 for r in rows), 1),
        "rows": rows,
    }


def table(result: dict[str, Any], threshold_us: float, ratio: float) -> list[str]:
    lines = [
        f"{result['model']}: {result['wrapped_externs']} extern callables; kiln's externs "
        f"{result['kiln_extern_us']:.0f} us a step, eager's calls of the same keys {result['eager_same_us']:.0f} us"
    ]
    lines.append(
        f"  {'op':28s} {'kiln us':>8s} {'eager us':>8s} {'n':>5s}  shapes / kiln strides / eager strides"
    )
    unmatched = []
    for r in result["rows"]:
        e = r["eager_us"]
        if e is None:
            unmatched.append(r)
            continue
        if r["kiln_us"] - e < threshold_us or r["kiln_us"] < ratio * e:
            continue
        n = f"{r['kiln_calls']}/{r['eager_calls']}"
        lines.append(f"  {r['op']:28s} {r['kiln_us']:8.1f} {e:8.1f} {n:>5s}  {r['shapes']}")
        lines.append(f"  {'':28s} {'':8s} {'':8s} {'':5s}    kiln  {r['kiln_strides']}")
        lines.append(f"  {'':28s} {'':8s} {'':8s} {'':5s}    eager {r['eager_strides']}")
    if unmatched:
        lines.append("  kiln externs with no eager call of the same op and shapes:")
        for r in unmatched:
            lines.append(
                f"    {r['op']:26s} {r['kiln_us']:8.1f} {r['kiln_calls']:>5d}  {r['shapes']} {r['kiln_strides']}"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="convnext_v2")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--threshold-us", type=float, default=10.0)
    parser.add_argument("--ratio", type=float, default=1.2)
    parser.add_argument("--kiln-options", default="", help="k=v,... passed to kiln.compile(options=)")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    options = train1._parse_options(args.kiln_options)
    results = []
    for name in args.models.split(","):
        result = audit(name, args.steps, args.warmup, options)
        results.append(result)
        print("\n".join(table(result, args.threshold_us, args.ratio)), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
