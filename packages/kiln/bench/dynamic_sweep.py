"""Dynamic shapes on the CPU: one compiled model called at 10 batch sizes, kiln against
torch.compile (both `dynamic=None`: static first, automatic dynamic after the first change).

Per model and compiler, in one process:
  - compiles: graphs handed to the backend over the loop (kiln: kiln_dynamo's counter;
    torch.compile: its first compile plus every recompile it logs);
  - loop s: wall time of the first pass over the 10 sizes (every compile included);
  - for 3 of the sizes, the median call time of the dynamic compile (after the loop) next to a
    static compile of that size alone (`dynamic=False`, a fresh compile per size), and their ratio.
Every result is compared with eager. One thread (`torch.set_num_threads(1)`) unless `--threads`.

    python packages/kiln/bench/dynamic_sweep.py [--models mlp,gpt2,bert] [--no-torch] [--reps 20]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln
import kiln_dynamo
from kiln_bench.models import build

SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
TIMED = (4, 16, 64)
SEQ = 64


def make_input(name: str, batch: int, vocab: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(batch)
    if name == "mlp":
        return {"x": torch.randn(batch, 256, generator=gen)}
    return {"input_ids": torch.randint(0, vocab, (batch, SEQ), generator=gen)}


def _out(value: Any) -> Any:
    return value.logits if hasattr(value, "logits") else value


class _CountRecompiles(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Recompiling" in record.getMessage():
            self.count += 1


def _median_call(fn: Callable[[], Any], reps: int) -> float:
    with torch.no_grad():
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def sweep(compiler: str, name: str, reps: int) -> dict[str, Any]:
    work = build(name, "cpu")
    model = work.model.eval()
    inputs = {b: make_input(name, b, work.num_classes) for b in SIZES}
    with torch.no_grad():
        expected = {b: _out(model(**inputs[b])) for b in SIZES}

    def compile_(dynamic: bool | None) -> Callable[..., Any]:
        if compiler == "kiln":
            kiln.reset()
            return kiln.compile(model, dynamic=dynamic)
        torch._dynamo.reset()
        return torch.compile(model, dynamic=dynamic)

    handler = _CountRecompiles()
    dynamo_log = logging.getLogger("torch._dynamo")
    if compiler == "torch":
        torch._logging.set_logs(recompiles=True)
        dynamo_log.addHandler(handler)
    try:
        compiled = compile_(None)
        start = time.perf_counter()
        with torch.no_grad():
            for b in SIZES:
                torch.testing.assert_close(_out(compiled(**inputs[b])), expected[b], rtol=1e-3, atol=1e-3)
        loop_s = time.perf_counter() - start
    finally:
        if compiler == "torch":
            dynamo_log.removeHandler(handler)
            torch._logging.set_logs()
    compiles = kiln_dynamo.counters.graphs if compiler == "kiln" else 1 + handler.count
    fallbacks = len(kiln_dynamo.counters.dynamic_fallbacks) if compiler == "kiln" else 0
    dynamic_ms = {b: 1e3 * _median_call(lambda b=b: compiled(**inputs[b]), reps) for b in TIMED}
    static_ms = {}
    for b in TIMED:
        static = compile_(False)
        with torch.no_grad():
            torch.testing.assert_close(_out(static(**inputs[b])), expected[b], rtol=1e-3, atol=1e-3)
        static_ms[b] = 1e3 * _median_call(lambda b=b, static=static: static(**inputs[b]), reps)
    return {
        "model": name,
        "compiler": compiler,
        "compiles": compiles,
        "dynamic_fallbacks": fallbacks,
        "loop_s": loop_s,
        "dynamic_ms": dynamic_ms,
        "static_ms": static_ms,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,gpt2,bert")
    parser.add_argument("--no-torch", action="store_true", help="kiln only")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    compilers = ["kiln"] if args.no_torch else ["kiln", "torch"]
    rows = [sweep(c, m, args.reps) for m in args.models.split(",") for c in compilers]
    print(f"batch sizes {list(SIZES)} (text: seq {SEQ}), CPU, {args.threads} thread(s), dynamic=None")
    head = f"{'model':<6} {'compiler':<8} {'compiles':>8} {'loop s':>7}"
    for b in TIMED:
        head += f" {f'b={b} dyn/static ms':>24}"
    print(head)
    for r in rows:
        line = f"{r['model']:<6} {r['compiler']:<8} {r['compiles']:>8} {r['loop_s']:>7.2f}"
        for b in TIMED:
            d, s = r["dynamic_ms"][b], r["static_ms"][b]
            line += f" {f'{d:.3f}/{s:.3f} ({d / s:.2f}x)':>24}"
        print(line)
    return rows


if __name__ == "__main__":
    main()
