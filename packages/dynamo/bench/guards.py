"""Guard cost per call on the public model suite: C guard trees vs the Python guards, in one run.

For each model of kiln_bench's suite (cpu size), in eval (inference, no grad) and train (grad on,
train mode) form: compile with kiln_dynamo (backend "eager", so only capture and guards differ),
call once, and record every guard the call evaluated with the entry values it saw (a model may
run several frames: graph breaks, continuations). Then time the sum of those guards per model
call, each way: the C tree (`GuardTree`, what the frame hook runs) and the Python guard it was
compiled from. Reports µs per call, the tree's size (ops, tensors, residual Python checks).

    python packages/dynamo/bench/guards.py [--models resnet,gpt2] [--modes eval,train] [--reps 15]

Needs kiln_bench (the suite) and transformers. A benchmark, not a test: times are the minimum
over repeats of this thread's CPU time (the machine is shared; the minimum is the least disturbed
figure).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln_dynamo
from kiln_dynamo import guard_tree
from kiln_dynamo.backends import ACTIVE


def best_us(fn: Callable[[], Any], n: int, reps: int) -> float:
    """µs per call of `fn`: the least over `reps` runs of `n` calls, in this thread's CPU time (on a
    shared machine wall time also counts the time other processes hold the core)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t0) / n * 1e6)
    return best


def guards_of_one_call(model: torch.nn.Module, inputs: dict[str, Any], train: bool) -> tuple[Any, list[Any]]:
    """Compile, call once (capture) and once more (cache hits), and return the compiled model and
    (GuardTree, entry values) of every guard the second call ran; `tree.reference` is the Python
    guard it was compiled from."""
    model.train(train)
    kiln_dynamo.reset()
    with guard_tree.checking_agreement() as seen, torch.set_grad_enabled(train):
        compiled = kiln_dynamo.compile(model, backend="eager")
        compiled(**inputs)  # captures; the entries hold Agreeing guards (both evaluators)
        seen.last_values.clear()
        compiled(**inputs)  # hits: records each guard run and its values
    assert not seen.disagreements, seen.disagreements
    return compiled, list(seen.last_values.values())


def measure(name: str, train: bool, reps: int) -> dict[str, Any]:
    from kiln_bench.models import build

    w = build(name, "cpu")
    compiled, guards = guards_of_one_call(w.model, w.inputs, train)
    previous, ACTIVE.key = ACTIVE.key, compiled._kiln_key
    try:
        with torch.set_grad_enabled(train):
            for tree, values in guards:
                assert tree(*values) is True and tree.reference.fn(*values) is True
            pairs = [(tree, tree.reference.fn, values) for tree, values in guards]
            n = 200

            def run_c() -> None:
                for tree, _, values in pairs:
                    tree(*values)

            def run_py() -> None:
                for _, fn, values in pairs:
                    fn(*values)

            c, py = best_us(run_c, n, reps), best_us(run_py, n, reps)
    finally:
        ACTIVE.key = previous
    return {
        "model": name,
        "mode": "train" if train else "eval",
        "frames": len(guards),
        "ops": sum(t.nops for t, _ in guards),
        "tensors": sum(t.ntensors for t, _ in guards),
        "residual": sum(t.reference.residual_parts for t, _ in guards),
        "c_us": c,
        "py_us": py,
    }


def main() -> None:
    from kiln_bench.models import MODEL_NAMES

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    parser.add_argument("--modes", default="eval,train")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(
        f"{'model':<11} {'mode':<5} {'frames':>6} {'ops':>6} {'tensors':>7} {'resid':>5} {'C us':>8} {'Python us':>9} {'x':>5}"
    )
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            r = measure(name, mode == "train", args.reps)
            print(
                f"{r['model']:<11} {r['mode']:<5} {r['frames']:>6} {r['ops']:>6} {r['tensors']:>7} "
                f"{r['residual']:>5} {r['c_us']:>8.1f} {r['py_us']:>9.1f} {r['py_us'] / r['c_us']:>5.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
