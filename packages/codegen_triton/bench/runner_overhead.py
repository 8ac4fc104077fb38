"""Host time of the CUDA-graph runner's per-call path, measured without a GPU (issue 14).

In ``mode="reduce-overhead"`` a compiled call is, on the GPU, one ``graph.replay()`` plus what
kiln's :class:`~kiln_codegen_triton.cudagraphs.CudaGraphRunner` does around it: check that every
static input is at its recorded address, check the copied inputs' shapes and dtypes, find an
output slot the caller no longer holds, copy the inputs that move, replay, and hand back fresh
aliases of the outputs. All of that but the replay and the copies' kernels is Python over tensor
metadata, which runs the same on CPU tensors. So this bench drives the real runner with a
stand-in capture (a "graph" whose replay does nothing; its outputs are tensors of the model's
output shapes) over CPU tensors shaped like a public-suite model's compiled graph: as many
inputs as the graph has (parameters and buffers: static), of which ``batch`` are the user's
inputs, and as many outputs. The counts are those of kiln's inference graph of each model at
``packages/kiln/bench/call_overhead.py``'s tiny size, which keeps the GPU size's depth (the same
parameters), so they are the GPU graph's counts too.

Two scenarios per model:

  same   the batch is the same tensor on every call (kiln_bench's loop): every input is static;
  fresh  a new batch tensor on every call (serving): the batch inputs are copied into the
         graph's buffers before each replay (on a GPU one copy kernel each; here a CPU copy).

Rows: µs per call, the median of ``--rounds`` rounds of ``--calls`` calls: ``after`` this
version's runner, ``full`` the same with its plan off (every call on the full path, as
``triton_options={"cudagraph_plan": False}`` runs it). ``--before FILE``
loads another version of ``cudagraphs.py`` (``git show REV:packages/codegen_triton/src/
kiln_codegen_triton/cudagraphs.py > /tmp/before.py``) and times its runner interleaved with
this one (A B A B ...), for an A/B of a change in one process. ``--steps`` times the per-call
steps by themselves on the same tensors (the pointer check each way, a use count, an output's
alias, a copy); ``--profile`` prints cProfile's own time per function of the runner's call
(inflated for small calls: read the shares). ``--c-check`` gives this version's runner the C
pointer check kiln hands it (kiln_dynamo's torch-linked checker, built if missing).

    PYTHONPATH=packages/loopir/src:packages/codegen_triton/src \\
        python packages/codegen_triton/bench/runner_overhead.py [--models mlp,bert,resnet]
        [--before /tmp/before.py] [--steps] [--profile] [--calls 2000] [--rounds 15]

One thread. A benchmark, not a test: the numbers depend on the machine's load; compare the
columns of one run.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import operator
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from kiln_codegen_triton import cudagraphs

# model -> (graph inputs, of which the user's batch, outputs): kiln's inference graph of the
# public suite (call_overhead.py's tiny size: the GPU size's parameters)
PRESETS: dict[str, tuple[int, int, int]] = {
    "mlp": (27, 1, 1),
    "cnn": (23, 1, 1),
    "llama": (59, 2, 1),
    "gpt2": (77, 1, 1),
    "vit": (105, 1, 1),
    "distilbert": (107, 2, 1),
    "bert": (109, 3, 1),
    "t5": (133, 2, 2),
    "convnext": (183, 1, 1),
    "resnet": (268, 1, 1),
}


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e3


def load_module(path: str) -> ModuleType:
    """Another version of cudagraphs.py, as a module of its own."""
    spec = importlib.util.spec_from_file_location("cudagraphs_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class Workload:
    """A runner of ``module`` over a preset's inputs, recorded and warm: ``call()`` is one call."""

    def __init__(
        self,
        module: ModuleType,
        preset: tuple[int, int, int],
        fresh: bool,
        pointer_check: Any = None,
        planned: bool | None = None,
    ) -> None:
        n_inputs, n_batch, n_outputs = preset
        gen = torch.Generator().manual_seed(0)
        # parameters as the frame passes them (nn.Parameter: its own data_ptr path), then the batch
        self.params = [
            nn.Parameter(torch.randn(8, generator=gen), requires_grad=False)
            for _ in range(n_inputs - n_batch)
        ]
        self.batches = [[torch.randn(4, 8, generator=gen) for _ in range(n_batch)] for _ in range(2)]
        self.n_outputs = n_outputs

        def fn(*args: Any) -> tuple[torch.Tensor, ...]:
            return tuple(torch.empty(4, 8) for _ in range(n_outputs))

        def capture(f: Callable[..., Any], args: list[Any], pool: Any) -> tuple[Callable[[], None], Any]:
            return (lambda: None), f(*args)  # the stand-in graph: outputs of the model's count, no work

        extra: dict[str, Any] = {"pointer_check": pointer_check} if pointer_check is not None else {}
        if planned is not None:
            extra["planned"] = planned
        self.runner = module.CudaGraphRunner(fn, capture=capture, guarded_inputs=True, **extra)
        self.fresh = fresh
        self.k = 0
        for _ in range(4):
            self.call()
        assert self.runner.disabled is None and self.runner.recordings >= 1
        expected_copied = n_batch if fresh else 0
        assert len(self.runner._copy_idx) == expected_copied, (self.runner._copy_idx, expected_copied)
        self.replays = self.runner.replays

    def call(self) -> Any:
        if self.fresh:
            self.k ^= 1
        return self.runner(*self.params, *self.batches[self.k])

    def check(self) -> None:
        """Every timed call replayed (none ran the wrapper: a row of plain calls times nothing)."""
        assert self.runner.plain_calls == 1, self.runner.plain_calls


def steps(preset: tuple[int, int, int], calls: int, rounds: int) -> dict[str, float]:
    """The per-call steps by themselves, µs: what each costs at this model's counts."""
    w = Workload(cudagraphs, preset, fresh=True)
    args = (*w.params, *w.batches[0])
    n_static = len(w.params)
    statics = tuple(args[:n_static])
    ptrs = [t.data_ptr() for t in statics]
    pick = operator.itemgetter(*range(n_static))
    data_ptr = torch.Tensor.data_ptr
    outs = tuple(torch.empty(4, 8) for _ in range(w.n_outputs))
    cdata = outs[0].untyped_storage()._cdata
    use_count = torch._C._storage_Use_Count
    dst, src = torch.empty(4, 8), w.batches[0][0]
    fns: dict[str, Callable[[], Any]] = {
        "pick statics (itemgetter)": lambda: pick(args),
        "static pointers (map data_ptr, compare)": lambda: list(map(data_ptr, pick(args))) == ptrs,
        "one use count": lambda: use_count(cdata),
        "aliases of the outputs": lambda: tuple(map(torch.Tensor.detach, outs)),
        "copy one batch input (copy_)": lambda: dst.copy_(src),
        "copy one batch input (_foreach_copy_)": lambda: torch._foreach_copy_([dst], [src]),
    }
    helper = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
    if helper is not None:  # torch's CUDA builds: what the runner uses there
        all_ptrs: list[int | None] = [*ptrs, None]
        idx = list(range(n_static))
        fns["static pointers (torch's C helper)"] = lambda: helper(list(args), all_ptrs, idx)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            samples[k].append(per_call_us(f, calls))
    return {k: statistics.median(v) for k, v in samples.items()}


def profile(w: Workload, calls: int, n: int = 12) -> list[tuple[float, float, str]]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        w.call()
    prof.disable()
    rows = []
    for (file, line, func), (_, nc, tt, _, _) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).name}:{line}({func})" if file != "~" else func
        rows.append((tt / calls * 1e6, nc / calls, where))
    rows.sort(reverse=True)
    return rows[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(PRESETS))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--before", default=None, help="another cudagraphs.py to time interleaved")
    parser.add_argument("--steps", action="store_true", help="time the per-call steps by themselves")
    parser.add_argument("--profile", action="store_true", help="cProfile's own time per function")
    parser.add_argument(
        "--c-check",
        action="store_true",
        help="this version's runner with kiln_dynamo's C pointer check, as kiln passes it (needs kiln_dynamo)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = load_module(args.before) if args.before else None
    pointer_check = None
    if args.c_check:
        from kiln_dynamo import tensor_check  # the bench's only use of another package

        tensor_check.install(build=True)
        assert tensor_check.data_ptrs_equal() is not None, tensor_check.status()
        pointer_check = tensor_check.data_ptrs_equal
    head = f"{'model':<11} {'inputs':>6} {'batch':>5} {'outs':>4} | {'scenario':<6} {'after us':>8} {'full us':>8}"
    print(head + (f" {'before us':>9} {'ratio':>6}" if before else ""))
    for name in args.models.split(","):
        preset = PRESETS[name]
        for fresh in (False, True):
            after = Workload(cudagraphs, preset, fresh, pointer_check)
            # this version without its plan: every call takes the full path (on a GPU: torch's
            # pointer helper), what `triton.cudagraph_plan=False` runs
            full = Workload(cudagraphs, preset, fresh, planned=False)
            old = Workload(before, preset, fresh) if before else None
            a, f, b = [], [], []
            for _ in range(args.rounds):
                a.append(per_call_us(after.call, args.calls))
                f.append(per_call_us(full.call, args.calls))
                if old is not None:
                    b.append(per_call_us(old.call, args.calls))
            after.check()
            full.check()
            line = (
                f"{name:<11} {preset[0]:6d} {preset[1]:5d} {preset[2]:4d} | {'fresh' if fresh else 'same':<6} "
                f"{statistics.median(a):8.2f} {statistics.median(f):8.2f}"
            )
            if old is not None:
                old.check()
                line += f" {statistics.median(b):9.2f} {statistics.median(b) / statistics.median(a):6.2f}x"
            print(line, flush=True)
            if args.profile:
                for us, nc, where in profile(after, args.calls):
                    print(f"{'':<13} {us:7.2f} us {nc:5.1f}  {where[:110]}")
        if args.steps:
            for step, us in steps(preset, args.calls, args.rounds).items():
                print(f"{'':<13} {step:<42} {us:7.2f} us")


if __name__ == "__main__":
    main()
