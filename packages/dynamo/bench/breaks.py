"""Graph breaks: graph and break counts against the ideal, and steady-state overhead vs eager.

Run: PYTHONPATH=packages/dynamo/src:packages/frame_hook/src python packages/dynamo/bench/breaks.py
     (`--models`: the breadth suite over real architectures instead, breadth.py)

Ten functions with 1-5 graph breaks each (data-dependent branches, .item(), print, C calls,
generators, inlined calls that break, a break inside no_grad). For each, the table gives the
graphs and breaks an ideal capturer would make (each break splits one region into two: graphs =
breaks + 1), what kiln makes, and what torch.compile makes (torch._dynamo.explain); then the
steady-state time per call of eager, kiln_dynamo.compile(backend="eager") and
torch.compile(backend="eager"), measured interleaved in short blocks (eager, kiln, torch.compile,
eager, ...): the ratios are medians of per-round ratios, so that load drift on a shared machine
cancels; `kiln +us` is the difference of medians; `kiln/region` is kiln's overhead divided by the
number of graph regions kiln made (target: <= 5% per region). print goes to os.devnull while
timing. This is a benchmark, not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo

import kiln_dynamo

W = torch.randn(128, 128) / 12


def branch1(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ W)
    if y.sum() > 0:
        y = y * 2
    return torch.relu(y @ W)


def item1(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ W)
    s = y.abs().max().item()
    return (y / s) @ W


def print2(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ W)
    print("first", y.shape)
    y = torch.relu(y @ W)
    print("second", y.shape)
    return y @ W


def c_call1(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ W)
    y = y + os.getpid() * 0
    return torch.relu(y @ W)


def _logged(y: torch.Tensor) -> torch.Tensor:
    y = y @ W
    print("inside", y.shape)
    return torch.sigmoid(y)


def inline1(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ W)
    y = _logged(y)
    return torch.relu(y @ W)


def mixed3(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ W)
    if y.mean() > -1:
        y = y @ W
    k = int(y.abs().sum().item()) % 3 + 1
    y = y * k
    print("mixed", k)
    return torch.relu(y @ W)


def _level3(y: torch.Tensor) -> torch.Tensor:
    print("deep", y.shape)
    return y @ W


def _level2(y: torch.Tensor) -> torch.Tensor:
    return torch.tanh(_level3(y @ W))


def deep3(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(_level2(x @ W) @ W)


def _pieces(y: torch.Tensor) -> Any:
    yield y @ W
    yield torch.tanh(y)


def generator2(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ W)
    parts = list(_pieces(y))
    return parts[0] + parts[1] @ W


def nograd1(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ W)
    with torch.no_grad():
        z = y @ W
        print("no_grad", z.shape)
        z = torch.relu(z @ W)
    return y + z


def print5(x: torch.Tensor) -> torch.Tensor:
    y = x
    for tag in ("a", "b", "c", "d", "e"):  # unrolled by hand below: kiln does not split loops
        del tag
    y = torch.tanh(y @ W)
    print("a")
    y = torch.tanh(y @ W)
    print("b")
    y = torch.tanh(y @ W)
    print("c")
    y = torch.tanh(y @ W)
    print("d")
    y = torch.tanh(y @ W)
    print("e")
    return y @ W


def loop3(x: torch.Tensor) -> torch.Tensor:
    y = x
    for _ in range(3):  # a break in the loop body: its pieces are graphs (Note [Loop body pieces])
        y = torch.tanh(y @ W)
        print("step")
        y = y @ W
    return y.sum()


# name -> (function, ideal graphs, ideal breaks)
FUNCTIONS: list[tuple[Callable[..., Any], int, int]] = [
    (branch1, 2, 1),
    (item1, 2, 1),
    (print2, 3, 2),
    (c_call1, 2, 1),
    (inline1, 2, 1),
    (mixed3, 4, 3),
    (deep3, 2, 1),
    (generator2, 2, 1),
    (nograd1, 2, 1),
    (print5, 6, 5),
    (loop3, 4, 3),  # unrolled, as torch.compile does; kiln: the two pieces, reused, and the tail
]


def _per_call(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def _counting_backend() -> tuple[Callable[..., Any], list[int]]:
    graphs = [0]

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs[0] += 1
        return gm.forward

    return backend, graphs


def measure(
    fn: Callable[..., Any], ideal_graphs: int, ideal_breaks: int, rounds: int, n: int
) -> dict[str, Any]:
    x = torch.randn(64, 128)
    kiln_dynamo.reset()
    torch._dynamo.reset()
    report = kiln_dynamo.explain(fn)(x)
    kiln_graphs, kiln_breaks = report.graph_count, report.graph_break_count
    kiln_dynamo.reset()
    kiln = kiln_dynamo.compile(fn, backend="eager")
    tc = torch.compile(fn, backend="eager")
    tex = torch._dynamo.explain(fn)(x)
    torch._dynamo.reset()
    tc = torch.compile(fn, backend="eager")
    with torch.no_grad():
        for f in (fn, kiln, tc):
            for _ in range(5):
                f(x)
        e, k, c = [], [], []
        for _ in range(rounds):  # A B C A B C ...: each round's ratios compare neighbours in time
            e.append(_per_call(lambda: fn(x), n))
            k.append(_per_call(lambda: kiln(x), n))
            c.append(_per_call(lambda: tc(x), n))
    kiln_ratio = statistics.median(b / a for a, b in zip(e, k, strict=True))
    torch_ratio = statistics.median(b / a for a, b in zip(e, c, strict=True))
    return {
        "name": fn.__name__,
        "ideal": (ideal_graphs, ideal_breaks),
        "kiln": (kiln_graphs, kiln_breaks),
        "torch": (tex.graph_count, tex.graph_break_count),
        "eager_us": statistics.median(e),
        "kiln_us": statistics.median(k) - statistics.median(e),
        "kiln_ratio": kiln_ratio,
        "torch_ratio": torch_ratio,
        "kiln_per_region": (kiln_ratio - 1) / max(kiln_graphs, 1),
    }


def _pair(p: tuple[int, int]) -> str:
    return f"{p[0]}/{p[1]}"


def main() -> None:
    if "--models" in sys.argv:  # the breadth suite: per-model graphs / breaks / frames in Python
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import breadth

        breadth.main(sys.argv[1:])
        return
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rounds, n = (5, 20) if "--quick" in sys.argv else (60, 20)
    rows = []
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        for fn, g, b in FUNCTIONS:
            rows.append(measure(fn, g, b, rounds, n))
    head = (
        f"{'function':<11} {'graphs/breaks ideal':>19} {'kiln':>7} {'torch':>7} | {'eager us':>9} "
        f"{'kiln +us':>8} {'kiln/eager':>10} {'torch/eager':>11} {'kiln/region':>11}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['name']:<11} {_pair(r['ideal']):>19} {_pair(r['kiln']):>7} {_pair(r['torch']):>7} | "
            f"{r['eager_us']:9.1f} {r['kiln_us']:8.1f} {r['kiln_ratio']:10.3f} {r['torch_ratio']:11.3f} {r['kiln_per_region'] * 100:10.1f}%"
        )
    print(
        f"geomean kiln/eager {statistics.geometric_mean([r['kiln_ratio'] for r in rows]):.3f}, "
        f"torch.compile/eager {statistics.geometric_mean([r['torch_ratio'] for r in rows]):.3f}"
    )


if __name__ == "__main__":
    main()
