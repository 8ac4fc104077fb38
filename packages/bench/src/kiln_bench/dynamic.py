"""The dynamic-shapes sweep: one compiled model called at many batch sizes.

For each backend (kiln's, kiln with capture only, torch.compile's default), the same freshly
reset model is called once per batch size in order; the figures are the number of compiles
(graphs handed to a backend; for torch.compile, its first compile plus every recompile it
logs), the wall time of the whole loop (compiles included) and of a second pass over the same
sizes (no compiles left, if dynamic shapes worked). Results are checked against eager.

    python -m kiln_bench.dynamic [--sizes 2,3,4,...] [--torch]
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import kiln

SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class MLPBlock(nn.Module):
    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln(x)))).softmax(-1)


@dataclass(frozen=True, slots=True)
class SweepResult:
    backend: str
    compiles: int
    first_pass_s: float
    second_pass_s: float

    def row(self) -> str:
        return f"{self.backend:<22} {self.compiles:>8} {self.first_pass_s:>14.2f} {self.second_pass_s:>15.3f}"


class _CountRecompiles(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "ecompil" in record.getMessage():
            self.count += 1


def _sweep(compiled: Callable[..., Any], model: nn.Module, sizes: tuple[int, ...]) -> tuple[float, float]:
    times = []
    with torch.no_grad():
        for _ in range(2):
            start = time.perf_counter()
            for b in sizes:
                x = torch.randn(b, 256)
                out = compiled(x)
                torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
            times.append(time.perf_counter() - start)
    return times[0], times[1]


def run_kiln(backend: str, sizes: tuple[int, ...]) -> SweepResult:
    kiln.reset()
    torch.manual_seed(0)
    model = MLPBlock().eval()
    compiled = kiln.compile(model, backend=backend)
    first, second = _sweep(compiled, model, sizes)
    return SweepResult(f"kiln ({backend})", kiln.capture_stats().graphs, first, second)


def run_torch(sizes: tuple[int, ...]) -> SweepResult:
    torch.manual_seed(0)
    model = MLPBlock().eval()
    torch._logging.set_logs(recompiles=True)
    handler = _CountRecompiles()
    root = logging.getLogger("torch._dynamo")
    root.addHandler(handler)
    root.propagate, previous = False, root.propagate
    try:
        compiled = torch.compile(model)  # dynamic=None: automatic dynamic
        first, second = _sweep(compiled, model, sizes)
    finally:
        root.removeHandler(handler)
        root.propagate = previous
        torch._logging.set_logs()
    return SweepResult("torch.compile", 1 + handler.count, first, second)


def main(argv: list[str] | None = None) -> list[SweepResult]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--torch", action="store_true", help="also run torch.compile (slow on the CPU)")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    results = [run_kiln("eager", sizes), run_kiln("kiln", sizes)]
    if args.torch:
        results.append(run_torch(sizes))
    print(f"batch sizes {list(sizes)}, MLP block d=256, CPU")
    print(f"{'backend':<22} {'compiles':>8} {'first pass s':>14} {'second pass s':>15}")
    for r in results:
        print(r.row())
    return results


if __name__ == "__main__":
    main()
