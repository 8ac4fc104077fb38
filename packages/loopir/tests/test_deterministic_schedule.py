"""Note [Deterministic schedules] (scheduler.py): a graph's schedule is the same in every process.

Each case is a graph whose schedule meets a tie that an iteration over a set of names used to
break: this file, run as a script, lowers and schedules every case and prints the schedules; the
test runs it under several ``PYTHONHASHSEED`` values (string hashes, and with them the order of
a set of buffer names, change per seed) and compares what the processes printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import torch
from helpers import aten, trace

from kiln_loopir import GraphLowering, Scheduler
from kiln_loopir.scheduler import output_buffer_names

# string hashes differ per seed; under the old order, the second case fused one way under seeds
# 0-3 and the other under 4-7, the first case's six producers ran in another order under each
SEEDS = (0, 1, 4, 5)


def producers_of_one_kernel(x: Any, u0: Any, u1: Any, u2: Any, u3: Any, u4: Any, u5: Any) -> Any:
    """Six reductions that only the second member of a fused kernel reads: late placement gives
    them all that kernel's position, so the topological sort meets a six-way tie."""
    row = aten.sum.dim_IntList(x, [1])
    y = x
    for u in (u0, u1, u2, u3, u4, u5):  # [16, 4] rows summed: no kernel fuses with another
        y = aten.mul.Tensor(y, aten.sum.dim_IntList(u, [1]))
    return row, aten.sum.dim_IntList(y, [1])


def pointwise_between_reductions(x1: Any, x2: Any) -> Any:
    """A pointwise kernel between two reductions of other shapes, each sharing one input with
    it at the same distance: two candidate pairs of one score, of which only one can fuse (the
    reductions' groups differ), first seen through a kernel that reads both inputs."""
    both = aten.sum.default(
        aten.add.Tensor(aten.slice.Tensor(x1, 0, 0, 64, 2), aten.slice.Tensor(x2, 0, 0, 64, 2))
    )
    rows8 = aten.sum.dim_IntList(aten.view.default(x1, [8, 8]), [1])
    m = x1
    for i in range(8):  # more loads than inlining takes: a kernel of its own at this place
        m = aten.add.Tensor(m, x2 if i % 2 == 0 else x1)
    rows4 = aten.sum.dim_IntList(aten.view.default(x2, [4, 16]), [1])
    return both, rows8, m, rows4


CASES = {
    "producers_of_one_kernel": (
        producers_of_one_kernel,
        lambda: [torch.randn(8, 16), *(torch.randn(16, 4) for _ in range(6))],
    ),
    "pointwise_between_reductions": (
        pointwise_between_reductions,
        lambda: [torch.randn(64), torch.randn(64)],
    ),
}


def describe(case: str) -> str:
    fn, inputs = CASES[case]
    graph = GraphLowering(trace(fn), inputs()).run()
    return Scheduler(graph.operations, graph.name_to_buffer, output_buffer_names(graph.outputs)).describe()


def test_schedules_do_not_depend_on_the_hash_seed() -> None:
    runs = {}
    for seed in SEEDS:
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        run = subprocess.run(
            [sys.executable, __file__], env=env, capture_output=True, text=True, check=True, timeout=600
        )
        runs[seed] = json.loads(run.stdout)
    for case in CASES:
        schedules = {seed: run[case] for seed, run in runs.items()}
        assert len(set(schedules.values())) == 1, f"{case}:\n" + "\n".join(
            f"seed {k}:\n{v}" for k, v in schedules.items()
        )


def test_producers_tied_by_position_run_in_graph_order() -> None:
    lines = describe("producers_of_one_kernel").splitlines()
    assert [line.split(": ")[1] for line in lines[:6]] == [f"buf{i}" for i in range(1, 7)]


if __name__ == "__main__":
    print(json.dumps({case: describe(case) for case in CASES}))
