"""The dynamic-shapes sweep (issue 17's Measure): one compiled model called at many input shapes.

Per public model and per backend (kiln, torch.compile), in one run:

1. **dynamic**: the model compiled once with `dynamic=` as given (default None: automatic
   dynamic), then called once per shape of the sweep, in order -- batch in {2, 4, 8, 16, 32, 64}
   x sequence length in {16, 64, 128, 256, 512} for the text models, batch only for the image
   models and the MLP. Counted: compiles (graphs handed to the backend for kiln; for
   torch.compile its first compile plus every recompile it logs) and the wall time of that first
   pass. Then every shape is timed again (`--repeats` calls, median): the dynamic graph's speed.
   The compile time of the sweep is the first pass minus the steady-state time of the same calls.
2. **static**: per shape, a fresh `dynamic=False` compile, warmed up, timed the same way: the
   dynamic/static ratio of each shape is the cost of symbolic sizes (target <= 1.10). For kiln
   the two are timed alternately, call by call (Note [Interleaved dynamic and static timing]).

Every output is compared with eager (the logits; dtype-aware tolerances). `--device cuda --dtype
bfloat16` runs it on a GPU (synchronized timing). A reduced CPU run:

    python -m kiln_bench.dynamic --models gpt2,mlp --batches 2,8 --seqs 16,64 --repeats 3

The old MLP-block sweep (`--sizes`) is kept as `--block`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

import kiln
from kiln_bench import models

BATCHES = (2, 4, 8, 16, 32, 64)
SEQS = (16, 64, 128, 256, 512)
TEXT_MODELS = frozenset({"gpt2", "bert", "distilbert", "llama", "t5"})
BACKENDS = ("kiln", "inductor")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 6e-2, torch.float16: 2e-2}


# --- shapes ---------------------------------------------------------------------------------
def shapes_for(name: str, batches: tuple[int, ...], seqs: tuple[int, ...]) -> list[tuple[int, int | None]]:
    """(batch, seq) of the sweep: seq is None for models without a sequence dim."""
    if name in TEXT_MODELS:
        return [(b, s) for b in batches for s in seqs]
    return [(b, None) for b in batches]


@contextlib.contextmanager
def _text_positions(seq: int) -> Iterator[None]:
    """Text models built with room for `seq` positions (the suite's cpu size has 128)."""
    saved = {k: dict(v) for k, v in models._TEXT.items()}
    for v in models._TEXT.values():
        v["seq"] = max(v["seq"], seq)
    try:
        yield
    finally:
        models._TEXT.clear()
        models._TEXT.update(saved)


def inputs_at(w: models.Workload, batch: int, seq: int | None, gen: torch.Generator) -> dict[str, Any]:
    """The workload's inputs at another batch size (and sequence length): same dtypes, same
    value range (token ids below the vocabulary), same trailing dims."""
    out: dict[str, Any] = {}
    for k, v in w.inputs.items():
        shape = [batch, *v.shape[1:]]
        if seq is not None and v.dim() >= 2 and k.endswith("input_ids"):
            shape[1] = seq
        if v.dtype in (torch.long, torch.int):
            out[k] = torch.randint(0, int(v.max()) + 1, shape, generator=gen).to(v.device)
        else:
            out[k] = torch.randn(shape, generator=gen).to(device=v.device, dtype=v.dtype)
    return out


# --- timing ---------------------------------------------------------------------------------
def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fn: Callable[[], Any], device: str, repeats: int) -> float:
    """Median seconds of `repeats` calls after one untimed call (first-call costs: allocator,
    thread pool, a cache entry tried first)."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _time_ab(a: Callable[[], Any], b: Callable[[], Any], device: str, repeats: int) -> tuple[float, float]:
    """Median seconds of `a` and of `b`, their calls alternating (one untimed call each first):
    on a shared machine the load moves between minutes, and alternating puts both under it."""
    a()
    b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((a, times[0]), (b, times[1])):
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


class _CountRecompiles(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "ecompil" in record.getMessage():
            self.count += 1


@contextlib.contextmanager
def _torch_recompiles() -> Iterator[_CountRecompiles]:
    torch._logging.set_logs(recompiles=True)
    handler = _CountRecompiles()
    root = logging.getLogger("torch._dynamo")
    root.addHandler(handler)
    root.propagate, previous = False, root.propagate
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.propagate = previous
        torch._logging.set_logs()


def _compile(backend: str, model: nn.Module, dynamic: bool | None, reset: bool = True) -> Callable[..., Any]:
    if backend == "inductor":
        torch.compiler.reset()
        return torch.compile(model, dynamic=dynamic)
    if reset:
        kiln.reset()
    return kiln.compile(model, backend=backend, dynamic=dynamic)


# Note [Interleaved dynamic and static timing]: kiln's cache entries check the compile's key
# (backend, dynamic=...) first, so static compiles of the same model can sit next to the dynamic
# one without a reset, and each shape's symbolic and static graphs are timed alternately. That
# holds while every entry fits the frame's cache (8 per code object: the dynamic compile's up to
# 3 plus one static entry per shape); otherwise, and for torch.compile (whose entries do not
# check `dynamic=`: a dynamic call could hit a static entry), the static compiles run after the
# dynamic timing, each after a reset.
_INTERLEAVE_ENTRIES = 8 - 3


# --- one model ------------------------------------------------------------------------------
@dataclass(slots=True)
class ModelSweep:
    model: str
    backend: str
    dynamic: str
    shapes: list[tuple[int, int | None]]
    compiles: int = 0
    first_pass_s: float = 0.0
    compile_s: float = 0.0
    dynamic_ms: list[float] = field(default_factory=list)
    static_ms: list[float] = field(default_factory=list)
    eager_ms: list[float] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    interleaved: bool = False

    def ratios(self) -> list[float]:
        return [d / s for d, s in zip(self.dynamic_ms, self.static_ms, strict=False) if s > 0]

    def row(self) -> str:
        r = self.ratios()
        geo = math.exp(statistics.fmean(math.log(x) for x in r)) if r else float("nan")
        worst = max(r) if r else float("nan")
        bad = f" MISMATCH x{len(self.mismatches)}" if self.mismatches else ""
        return (
            f"{self.model:<11} {self.backend:<9} {len(self.shapes):>6} {self.compiles:>8} "
            f"{self.compile_s:>10.2f} {geo:>10.3f} {worst:>9.3f}{bad}"
        )


def _check(out: Any, expected: Any, dtype: torch.dtype, where: str, sweep: ModelSweep) -> None:
    a, b = models.logits_of(out).float(), models.logits_of(expected).float()
    tol = TOLERANCE.get(dtype, 2e-3)
    if a.shape != b.shape or not torch.allclose(a, b, rtol=tol, atol=tol):
        err = (a - b).abs().max().item() if a.shape == b.shape else float("nan")
        sweep.mismatches.append(f"{where}: shape {tuple(a.shape)} vs {tuple(b.shape)}, max error {err:.3g}")


def _call(fn: Callable[..., Any], feed: dict[str, Any]) -> Callable[[], Any]:
    return lambda: fn(**feed)


def sweep_model(
    name: str,
    backend: str,
    shapes: list[tuple[int, int | None]],
    *,
    device: str,
    dtype: torch.dtype,
    dynamic: bool | None,
    repeats: int,
    static: bool,
) -> ModelSweep:
    with _text_positions(max((s for _, s in shapes if s is not None), default=0)):
        w = models.build(name, "cpu" if device == "cpu" else "gpu")
    w = w.to(device, dtype if dtype is not torch.float32 else None)
    model = w.model.eval()
    gen = torch.Generator().manual_seed(1)
    feeds = [inputs_at(w, b, s, gen) for b, s in shapes]
    result = ModelSweep(name, backend, str(dynamic), shapes)
    with torch.no_grad():
        expected = [model(**f) for f in feeds]
        result.eager_ms = [1e3 * _time(_call(model, f), device, repeats) for f in feeds]
        with _torch_recompiles() if backend == "inductor" else contextlib.nullcontext() as counter:
            compiled = _compile(backend, model, dynamic)
            start = time.perf_counter()
            for (b, s), f, e in zip(shapes, feeds, expected, strict=True):
                _check(compiled(**f), e, dtype, f"batch {b} seq {s} (dynamic)", result)
            _sync(device)
            result.first_pass_s = time.perf_counter() - start
            if backend == "inductor":
                assert counter is not None
                result.compiles = 1 + counter.count
            else:
                result.compiles = kiln.capture_stats().graphs
            result.interleaved = static and backend != "inductor" and len(shapes) <= _INTERLEAVE_ENTRIES
            if result.interleaved:  # Note [Interleaved dynamic and static timing]
                for (b, s), f, e in zip(shapes, feeds, expected, strict=True):
                    fixed = _compile(backend, model, False, reset=False)
                    _check(fixed(**f), e, dtype, f"batch {b} seq {s} (static)", result)
                    dyn, sta = _time_ab(_call(compiled, f), _call(fixed, f), device, repeats)
                    result.dynamic_ms.append(1e3 * dyn)
                    result.static_ms.append(1e3 * sta)
            else:
                result.dynamic_ms = [1e3 * _time(_call(compiled, f), device, repeats) for f in feeds]
        steady = sum(result.dynamic_ms) / 1e3
        result.compile_s = max(result.first_pass_s - steady, 0.0)
        if static and not result.interleaved:
            for (b, s), f, e in zip(shapes, feeds, expected, strict=True):
                fixed = _compile(backend, model, False)
                _check(fixed(**f), e, dtype, f"batch {b} seq {s} (static)", result)
                result.static_ms.append(1e3 * _time(_call(fixed, f), device, repeats))
    return result


HEADER = (
    f"{'model':<11} {'backend':<9} {'shapes':>6} {'compiles':>8} {'compile s':>10} "
    f"{'dyn/static':>10} {'worst':>9}"
)


# --- the old MLP-block sweep ----------------------------------------------------------------
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


def _block_sweep(
    compiled: Callable[..., Any], model: nn.Module, sizes: tuple[int, ...]
) -> tuple[float, float]:
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
    first, second = _block_sweep(compiled, model, sizes)
    return SweepResult(f"kiln ({backend})", kiln.capture_stats().graphs, first, second)


def run_torch(sizes: tuple[int, ...]) -> SweepResult:
    torch.manual_seed(0)
    model = MLPBlock().eval()
    with _torch_recompiles() as handler:
        compiled = torch.compile(model)  # dynamic=None: automatic dynamic
        first, second = _block_sweep(compiled, model, sizes)
    return SweepResult("torch.compile", 1 + handler.count, first, second)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(",") if s)


def main(argv: list[str] | None = None) -> list[Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models.MODEL_NAMES))
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="kiln, inductor (torch.compile), eager"
    )
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--seqs", default=",".join(map(str, SEQS)))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    parser.add_argument("--dynamic", default="none", choices=("none", "true"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: as it is)")
    parser.add_argument("--no-static", action="store_true", help="skip the per-shape static compiles")
    parser.add_argument("--json", default="", help="write the results here")
    parser.add_argument("--block", action="store_true", help="the MLP-block sweep over --sizes instead")
    parser.add_argument("--sizes", default="2,3,4,6,8,12,16,24,32,64")
    parser.add_argument("--torch", action="store_true", help="with --block: also torch.compile")
    args = parser.parse_args(argv)
    if args.block:
        sizes = _ints(args.sizes)
        block = [run_kiln("eager", sizes), run_kiln("kiln", sizes)]
        if args.torch:
            block.append(run_torch(sizes))
        print(f"batch sizes {list(sizes)}, MLP block d=256, CPU")
        print(f"{'backend':<22} {'compiles':>8} {'first pass s':>14} {'second pass s':>15}")
        for b in block:
            print(b.row())
        return block
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    dynamic = {"none": None, "true": True}[args.dynamic]
    results: list[ModelSweep] = []
    print(
        f"dynamic sweep on {args.device} {args.dtype}, dynamic={dynamic}, median of {args.repeats}, "
        f"{torch.get_num_threads()} threads"
    )
    print(HEADER, flush=True)
    for name in args.models.split(","):
        shapes = shapes_for(name, _ints(args.batches), _ints(args.seqs))
        for backend in args.backends.split(","):
            r = sweep_model(
                name,
                backend,
                shapes,
                device=args.device,
                dtype=dtype,
                dynamic=dynamic,
                repeats=args.repeats,
                static=not args.no_static,
            )
            results.append(r)
            print(r.row(), flush=True)
            for m in r.mismatches:
                print(f"  mismatch: {m}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return results


if __name__ == "__main__":
    main()
