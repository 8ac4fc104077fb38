"""Per-call overhead of the frame hook on a cache hit (a benchmark, not a test).

In one process, interleaved over several rounds (A B C D A B C D ...), each timing N calls:
  plain   f(1) with no hook installed;
  hooked  f(1) with the hook hitting a cached entry whose guard returns True and whose
          transformed code is f's own body (so only the hook's work differs);
  skipped f2 (same body as f) with the hook installed but f2 marked skip: what any PEP 523
          hook costs, since CPython stops inlining Python-to-Python calls while one is set;
  guard   the guard itself called N times from Python (an estimate of "the guard's own body":
          one Python-level call of a function that returns True);
  empty   the bare loop.
Reports medians in ns per call, and the hook's extra cost with and without the guard call.

    python packages/frame_hook/bench/overhead.py [--calls 1000000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import kiln_frame_hook as hook


def f(x):
    return x


def f2(x):
    return x


def f_transformed(x):
    return x


def guard(x):
    return True


def loop_call(fn, n):
    for _ in range(n):
        fn(1)


def loop_empty(n):
    for _ in range(n):
        pass


def callback(frame: hook.Frame) -> object:
    if frame.code is f.__code__:
        return hook.GuardedCode(guard, f_transformed.__code__)
    return hook.SKIP


def timed(fn, *args) -> float:
    start = time.perf_counter_ns()
    fn(*args)
    return time.perf_counter_ns() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n = args.calls
    samples: dict[str, list[float]] = {"plain": [], "hooked": [], "skipped": [], "guard": [], "empty": []}
    hook.skip_code(f2.__code__)
    with hook.callback(callback):
        f(1)  # compile: the callback adds the entry
    assert len(hook.cache_entries(f.__code__)) == 1
    for _ in range(args.rounds):
        samples["plain"].append(timed(loop_call, f, n) / n)
        with hook.callback(callback):
            samples["hooked"].append(timed(loop_call, f, n) / n)
            samples["skipped"].append(timed(loop_call, f2, n) / n)
        samples["guard"].append(timed(loop_call, guard, n) / n)
        samples["empty"].append(timed(loop_empty, n) / n)
    med = {k: statistics.median(v) for k, v in samples.items()}
    extra = med["hooked"] - med["plain"]
    guard_call = med["guard"] - med["empty"]
    print(
        f"python {platform.python_version()} on {platform.machine()}, {n:,} calls x {args.rounds} rounds (medians)"
    )
    for name in ("plain", "hooked", "skipped", "guard", "empty"):
        print(
            f"  {name:<7} {med[name]:7.1f} ns/call   (min {min(samples[name]):.1f}, max {max(samples[name]):.1f})"
        )
    print(f"hook extra per call:                      {extra:6.1f} ns")
    print(
        f"hook extra per call beyond the guard call: {extra - guard_call:6.1f} ns (guard call ~{guard_call:.1f} ns)"
    )
    print(f"  of which PEP 523 itself (skipped - plain): {med['skipped'] - med['plain']:6.1f} ns")
    sys.exit(0)


if __name__ == "__main__":
    main()
