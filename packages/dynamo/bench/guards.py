"""Guard cost per call on the public model suite: C guard trees vs the Python guards, in one run.

For each model of kiln_bench's suite (cpu size), in eval (inference, no grad) and train (grad on,
train mode) form: compile with kiln_dynamo (backend "eager", so only capture and guards differ),
call once, and record every guard the call evaluated with the entry values it saw (a model may
run several frames: graph breaks, continuations). Then time the sum of those guards per model
call, each way: the Python guard, the C tree as it was before guard memos and the torch-linked
tensor checker ("C plain": every op on every call, tensor metadata through attributes), with the
memo only ("C memo"), and as the frame hook runs it now ("C": memo and, when built, the checker;
Note [Skipping what did not change] in kiln_frame_hook, Note [The torch-linked tensor checker] in
kiln_dynamo.tensor_check). Reports µs per call, the tree's size (ops, tensors, residual Python
checks) and, for the memo, how many ops a warm call still runs.

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
import kiln_frame_hook as hook
from kiln_dynamo import guard_tree, tensor_check
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
            n = 200

            def variant(memo: bool) -> list[tuple[Any, tuple[Any, ...]]]:
                return [
                    (
                        hook.GuardTree(
                            t.nvalues, t.nslots, t.ops, t.residual, t.reference, "bench", memo=memo
                        ),
                        v,
                    )
                    for t, v in guards
                ]

            def timed(pairs: list[tuple[Any, tuple[Any, ...]]]) -> float:
                def run() -> None:
                    for fn, values in pairs:
                        fn(*values)

                run()
                return best_us(run, n, reps)

            py = timed([(t.reference.fn, v) for t, v in guards])
            checker = tensor_check.install()
            c = timed(variant(True))
            memo_trees = variant(True)
            memo_c = plain = 0.0
            if checker:
                hook.set_tensor_checker(None)
            try:
                memo_c = timed(memo_trees)
                plain = timed(variant(False))
            finally:
                if checker:
                    tensor_check.uninstall()
                    tensor_check.install()
            run_ops = sum(t.memo["run_ops"] for t, _ in memo_trees)
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
        "memo_us": memo_c,
        "plain_us": plain,
        "py_us": py,
        "run_ops": run_ops,
        "checker": checker,
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
        f"{'model':<11} {'mode':<5} {'frames':>6} {'ops':>6} {'run':>5} {'tensors':>7} {'resid':>5} "
        f"{'Python us':>9} {'C plain':>8} {'C memo':>8} {'C us':>8} {'x py':>6} {'x plain':>7}"
    )
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            r = measure(name, mode == "train", args.reps)
            print(
                f"{r['model']:<11} {r['mode']:<5} {r['frames']:>6} {r['ops']:>6} {r['run_ops']:>5} {r['tensors']:>7} "
                f"{r['residual']:>5} {r['py_us']:>9.1f} {r['plain_us']:>8.1f} {r['memo_us']:>8.1f} {r['c_us']:>8.1f} "
                f"{r['py_us'] / r['c_us']:>6.1f} {r['plain_us'] / r['c_us']:>7.1f}",
                flush=True,
            )
    print(f"torch-linked tensor checker: {tensor_check.status()}")


if __name__ == "__main__":
    main()
