"""The matrix products of a training step under eager, kiln and torch.compile: their operands'
layouts, and their time in context and alone, at a thread count (issue 20).

A GEMM's cost on the CPU depends on more than its sizes: a transposed or non-contiguous operand,
a padded one, an ``as_strided`` view, or a weight gradient computed as ``mm(a.t(), b)`` where
eager computes ``mm(b.t(), a).t()`` sends MKL down another path. So this answers, per model:

1. **layouts**: every ``mm``/``addmm``/``bmm``/``baddbmm`` a step runs (recorded by a dispatch
   mode, out-variants folded into their functional op, ``addmm`` into ``mm`` without its bias:
   kiln may add a bias after the product), as (op, operand shapes, operand strides), for eager
   and kiln, and what one has that the other has not. Equal
   multisets mean kiln hands MKL eager's products exactly (torch.compile's are read from the
   profiler in part 2: a dispatch mode changes the path torch.compile takes).
2. **time in context**: rounds in which each backend runs ``--calls`` steps under
   ``torch.profiler`` (``record_shapes``), the backends in turn and their order rotated per round,
   so a slow stretch of the machine hits all of them; per (op, shapes, strides) the median over
   rounds of its milliseconds a step, beside the step's wall time measured in the same rounds.
   Comparing backends in one window matters: kiln_bench's ``--profile`` profiles each backend
   after its own timing, minutes apart on a shared host.
3. **time alone** (``--alone``): each product replayed by itself on operands of the recorded
   shapes and strides, ``--alone-reps`` times: what MKL costs with nothing around it, so a product
   slower in one backend's step than alone is slowed by its context (threads, caches), not by its
   operands.

    python scripts/matmul_ab.py --models gpt2,llama,bert --threads 16 [--rounds 8] [--calls 3]
        [--backends eager,kiln,inductor] [--alone] [--layouts-only] [--out FILE.json]

Twenty-sixth session (helper mm26), this project's 2-core machine, torch 2.13 and 2.11: the
layouts of kiln's products equal eager's in every training step of the suite's transformers and
the MLP (gpt2 27, llama 45, bert 42, distilbert 42, t5 123, vit 39, mlp 14 products; no product
only one side has); torch.compile's differ from eager's in one place, GPT-2's tied LM-head weight
gradient, which it computes as ``addmm`` onto the embedding's gradient.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kiln_bench import backends, harness

PRODUCTS = ("mm", "addmm", "bmm", "baddbmm")
PROFILED = {f"aten::{p}" for p in PRODUCTS}
Key = tuple[str, tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]


def _key(op: str, shapes: list[tuple[int, ...]], strides: list[tuple[int, ...]]) -> Key:
    """(op, operand shapes, operand strides) of a product: ``addmm``/``baddbmm`` without their
    bias, every op without its ``out`` (the profiler lists it after the operands)."""
    first = 1 if op in ("addmm", "baddbmm") else 0
    return op, tuple(shapes[first : first + 2]), tuple(strides[first : first + 2])


class _Products(TorchDispatchMode):
    """Counts the products run under it by :func:`_key`."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[Key] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        op = func.overloadpacket.__name__
        if op in PRODUCTS:
            ts = [a for a in args if isinstance(a, torch.Tensor)]
            self.seen[_key(op, [tuple(t.shape) for t in ts], [t.stride() for t in ts])] += 1
        return func(*args, **(kwargs or {}))


def _fmt(key: Key) -> str:
    op, shapes, strides = key
    return f"{op:7s} " + "  ".join(f"{list(s)}/{list(st)}" for s, st in zip(shapes, strides, strict=True))


def layouts(workload: Any, fns: dict[str, Callable[..., Any]]) -> dict[str, collections.Counter[Key]]:
    """Eager's and kiln's products, ``addmm`` counted as ``mm`` and ``baddbmm`` as ``bmm``: kiln
    may add a bias in the kernel after the product (Note [Bias after the GEMM] in kiln_loopir)."""
    seen = {}
    for name in ("eager", "kiln"):
        if name not in fns:
            continue
        rec = _Products()
        with rec:
            harness.step(workload, fns[name], "training")
        folded: collections.Counter[Key] = collections.Counter()
        for (op, shapes, strides), n in rec.seen.items():
            folded[("bmm" if "bmm" in op else "mm", shapes, strides)] += n
        seen[name] = folded
    return seen


def in_context(
    workload: Any, fns: dict[str, Callable[..., Any]], rounds: int, calls: int
) -> tuple[dict[str, dict[Key, list[float]]], dict[str, list[float]], dict[str, dict[Key, float]]]:
    """Per backend, per product: ms a step in each round; each round's wall ms a step; and how
    many times a step runs the product."""
    per: dict[str, dict[Key, list[float]]] = {b: collections.defaultdict(list) for b in fns}
    count: dict[str, dict[Key, float]] = {b: {} for b in fns}
    wall: dict[str, list[float]] = {b: [] for b in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            start = time.perf_counter()
            for _ in range(calls):
                harness.step(workload, fn, "training")
            wall[name].append((time.perf_counter() - start) / calls * 1e3)
            with torch.profiler.profile(record_shapes=True) as prof:
                for _ in range(calls):
                    harness.step(workload, fn, "training")
            ms: dict[Key, float] = collections.defaultdict(float)
            n: collections.Counter[Key] = collections.Counter()
            for e in prof.profiler.kineto_results.events():
                if e.name() in PROFILED:
                    shapes = [tuple(s) for s in e.shapes()]
                    strides = [tuple(s) for s in e.structured_input_strides()]
                    key = _key(e.name()[6:], shapes, strides)
                    ms[key] += e.duration_ns() / 1e6 / calls
                    n[key] += 1
            for k, v in ms.items():
                per[name][k].append(v)
                count[name][k] = n[k] / calls
    return per, wall, count


def alone(key: Key, reps: int) -> float:
    """Median ms of one product by itself on operands of the key's shapes and strides."""
    op, shapes, strides = key
    ops = []
    for size, stride in zip(shapes, strides, strict=True):
        extent = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        ops.append(torch.randn(extent).as_strided(size, stride))
    fn = getattr(torch, op)
    if op in ("addmm", "baddbmm"):
        bias = torch.randn(ops[0].shape[:-1] + ops[1].shape[-1:])
        args: tuple[torch.Tensor, ...] = (bias, *ops)
    else:
        args = tuple(ops)
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2")
    ap.add_argument("--backends", default="eager,kiln,inductor", help="kiln_bench backend names")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: as it is)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=3, help="steps per backend per round")
    ap.add_argument("--alone", action="store_true", help="also time each product by itself")
    ap.add_argument("--alone-reps", type=int, default=30)
    ap.add_argument("--layouts-only", action="store_true")
    ap.add_argument("--out", default="", help="append one JSON line per model")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.backends.split(",")
    if any(b.partition(":")[0] == "kiln" for b in names):
        backends.prepare_kiln()
    for model in args.models.split(","):
        ref = harness.reference(model, "training")
        workload = ref.workload
        fns: dict[str, Callable[..., Any]] = {}
        for b in names:
            backends.reset(b)
            fn = backends.compile_model(b, workload.model)
            verdict = ref.check(*harness.step(workload, fn, "training"))
            print(f"{model}: {b} {'matches eager' if verdict.ok else 'DIFFERS: ' + verdict.reason}")
            for _ in range(2):
                harness.step(workload, fn, "training")
            fns[b] = fn
        row: dict[str, Any] = {"model": model, "threads": torch.get_num_threads(), "torch": torch.__version__}
        seen = layouts(workload, fns)
        if "eager" in seen and "kiln" in seen:
            only_eager, only_kiln = seen["eager"] - seen["kiln"], seen["kiln"] - seen["eager"]
            print(
                f"{model} layouts: eager {sum(seen['eager'].values())} products, kiln "
                f"{sum(seen['kiln'].values())}; eager's only {sum(only_eager.values())}, kiln's only "
                f"{sum(only_kiln.values())}"
            )
            for k, n in only_eager.items():
                print(f"   eager only x{n}  {_fmt(k)}")
            for k, n in only_kiln.items():
                print(f"   kiln only  x{n}  {_fmt(k)}")
            row["layouts"] = {
                b: [[k[0], [list(s) for s in k[1]], [list(s) for s in k[2]], n] for k, n in c.items()]
                for b, c in seen.items()
            }
        if not args.layouts_only:
            per, wall, count = in_context(workload, fns, args.rounds, args.calls)
            # a product seen in fewer than half the rounds is noise of the profiler's edges
            med = {
                b: {k: statistics.median(v) for k, v in per[b].items() if len(v) * 2 > args.rounds}
                for b in fns
            }
            keys = sorted(set().union(*med.values()), key=lambda k: -max(m.get(k, 0.0) for m in med.values()))
            solo = {k: alone(k, args.alone_reps) for k in keys} if args.alone else {}
            print(
                f"{model} training, {torch.get_num_threads()} threads, {args.rounds} rounds x {args.calls} steps; "
                "medians over rounds: ms a step (wall, all products), then each product's ms a call and calls a step"
            )
            pad = " " * 9 if solo else ""
            print("  " + "".join(f"{b[:18]:>19s}" for b in fns) + ("    alone" if solo else "") + "  product")
            print(
                "  " + "".join(f"{statistics.median(wall[b]):19.3f}" for b in fns) + pad + "  the step (wall)"
            )
            print("  " + "".join(f"{sum(med[b].values()):19.3f}" for b in fns) + pad + "  all products")
            for k in keys:
                cells = "".join(
                    f"{med[b][k] / count[b][k]:13.4f} x{count[b][k]:4.1f}" if k in med[b] else f"{'-':>19s}"
                    for b in fns
                )
                print("  " + cells + (f"{solo[k]:9.4f}" if solo else "") + "  " + _fmt(k))

            def rows(values: dict[Key, float]) -> list[list[Any]]:
                return [
                    [k[0], [list(s) for s in k[1]], [list(s) for s in k[2]], v] for k, v in values.items()
                ]

            row["wall_ms"] = {b: statistics.median(wall[b]) for b in fns}
            row["products_ms_a_step"] = {b: rows(med[b]) for b in fns}
            row["calls_a_step"] = {b: rows(count[b]) for b in fns}
            if solo:
                row["alone_ms_a_call"] = rows(solo)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
