"""Speed of the breadth suite's architectures: eager, kiln and torch.compile per call, side by side.

The public model suite is ten models; kiln is judged on many more. This times every architecture
of the breadth suite (`packages/dynamo/bench/breadth_models.py`, 105 architectures and 16
hand-written programs, built from configs at tiny size; `--only` also takes the names of its
`WIDER` set) in inference or training, on any device and dtype:

    python packages/kiln/bench/breadth_speed.py --device cuda --dtype bfloat16 [--only gpt2,bert]
        [--skip ...] [--backends eager,kiln,inductor] [--batch 8] [--threads 1,4,16] [--procs 4]
        [--mode eval|train] [--budget-s 500] [--json out.json]

`--mode eval` (the default) times a call under no_grad; `--mode train` a training step: train
mode, forward, a loss on the main output (breadth.py's), backward, each backend on its own copy
of the model (its gradients cleared before every step), checked before timing on the main output
and every parameter's gradient against eager's (Note [Gradients checked by the suite's rule]); a
backend that differs is reported and not timed. `--threads 1,4,16` measures each model at each
count in turn, every backend compiled again per count (torch.compile bakes the count into its
C++; kiln's second compile of a model finds its C++ in the disk cache), one row per (model,
count).

Per model and backend: the first call's seconds (capture and compile), the wall time per call
(median over `--rounds` rounds of `--calls` calls, the backends timed in turn within each round,
the order rotated per round: A B C, B C A, ..., so a slow stretch of a shared machine hits all of
them and no backend always runs after the same one) and the speedup over eager (the median of the
rounds' ratios, each round timing the backends back to back; 5 rounds of 20 calls, the old
default, put 2-3 rows per run below eager on a loaded 2-core machine, different ones each run; on
such a machine `--calls 1 --rounds 300` interleaves call by call). Tiny models that one extern call
dominates (an LSTM) run slower when another model instance runs between their calls, eager's too
(~10%): compare such rows with every backend interleaved, never one alone, kiln's graphs and graph
breaks (torch.compile's unique graphs beside them), and whether the main output matches eager's
(dtype-aware tolerance; a mismatch is reported, never hidden; Note [Eager is not always the
reference] says when eager's own answer is the one that is off). At tiny size a call costs the
host more than the device: these rows measure what a compiler adds or saves per call (guards,
wrappers, launches, graph breaks), which decides models of moderate size on a fast GPU.

`--backends eager,kiln,kiln_ab,inductor --ab-cpp column_gathers=0` adds kiln with its C++
generator under other switches (`KILN_CPP_OPTIONS` while it compiles), timed in the same rounds;
a backend `kiln@k=v/k=v` is kiln under those `kiln.compile` options (any number of them).

`--procs N` runs the models in N processes (shards) and merges their rows: compile dominates the
time, and the device's host has cores to spare. Rows from concurrent processes are noisier;
compare within a row (ratios), and re-time an outlier alone (`--only`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

BENCH = Path(__file__).resolve().parents[2] / "dynamo" / "bench"
sys.path.insert(0, str(BENCH))
import breadth_models  # type: ignore[import-not-found]  # noqa: E402
from breadth import _loss, build  # type: ignore[import-not-found]  # noqa: E402
from breadth_models import MODELS, first_tensor  # type: ignore[import-not-found]  # noqa: E402

TOL = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def _to(x: Any, device: str, dtype: torch.dtype) -> Any:
    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        t = t.to(device)
        return t.to(dtype) if t.is_floating_point() else t

    return pytree.tree_map(move, x)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _compiled(
    backend: str, model: torch.nn.Module, ab_cpp: str = "", ab_options: str = ""
) -> Callable[..., Any]:
    torch.compiler.reset()
    from torch._dynamo.utils import counters  # bench code only: the baseline's own counts

    counters.clear()
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model)
    import kiln

    if backend == "kiln_ab":
        return _kiln_ab(model, ab_cpp, ab_options)
    if backend.startswith("kiln@"):  # kiln@k=v/k=v: kiln under those options, beside the others
        return _kiln_ab(model, "", backend.removeprefix("kiln@").replace("/", ","))
    kiln.reset()
    return kiln.compile(model)


def _kiln_ab(model: torch.nn.Module, ab_cpp: str, ab_options: str = "") -> Callable[..., Any]:
    """``kiln_ab``: kiln with its C++ generator under ``KILN_CPP_OPTIONS=ab_cpp`` (``--ab-cpp``)
    and ``kiln.compile`` options ``ab_options`` (``--ab-options k=v,...``: ``true``/``false`` are
    bools), timed in the same rounds as the others. The generator reads the variable when a graph
    compiles, at the first call, so it is set around that call; an explicit default option makes
    kiln's cache key differ from plain kiln's, whose compiled entry stays (no ``kiln.reset()``)."""
    import kiln

    options: dict[str, Any] = {"layout": True}
    for item in filter(None, ab_options.split(",")):
        key, _, value = item.partition("=")
        options[key] = {"true": True, "false": False}.get(value.lower(), value)
    compiled = kiln.compile(model, options=options)
    first = [True]

    def call(*args: Any, **kwargs: Any) -> Any:
        if not first[0]:
            return compiled(*args, **kwargs)
        saved = os.environ.get("KILN_CPP_OPTIONS")
        os.environ["KILN_CPP_OPTIONS"] = ab_cpp
        try:
            return compiled(*args, **kwargs)
        finally:
            first[0] = False
            if saved is None:
                os.environ.pop("KILN_CPP_OPTIONS", None)
            else:
                os.environ["KILN_CPP_OPTIONS"] = saved

    return call


def _details(backend: str) -> dict[str, Any]:
    if backend == "kiln":
        import kiln
        import kiln_dynamo

        log = kiln.compile_log()
        stats = kiln.capture_stats()
        return {
            "graphs": len(log),
            "breaks": kiln_dynamo.counters.graph_breaks,
            "fell_back": sorted({str(g.fell_back)[:160] for g in log if g.fell_back}),
            "break_reasons": sorted({" ".join(str(r).split())[:300] for r in stats.break_reasons})[:8],
            "frames_not_captured": len(stats.frames_not_captured),
        }
    if backend == "inductor":
        from torch._dynamo.utils import counters  # bench code only: the baseline's own counts

        return {"graphs": counters["stats"]["unique_graphs"]}
    return {}


def _mismatch(got: Any, ref: Any, dtype: torch.dtype, values_only: bool = False) -> str:
    """'' when the main outputs match at ``dtype``'s tolerance, else why not; ``values_only``:
    the dtypes may differ (a float32 reference, Note [Eager is not always the reference])."""
    try:
        a, b = first_tensor(got), first_tensor(ref)
        if a.shape != b.shape or (a.dtype != b.dtype and not values_only):
            return f"{tuple(a.shape)} {a.dtype} != {tuple(b.shape)} {b.dtype}"
        tol = TOL.get(dtype, 1e-3)
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol, equal_nan=True)
    except AssertionError as e:
        return " ".join(str(e).split())[:200]
    except Exception as e:  # a result with no tensor is reported, not fatal
        return f"{type(e).__name__}: {e}"[:200]
    return ""


# Note [Eager is not always the reference]: eager in a low-precision dtype can itself be wrong.
# deepseek_v3's multi-head latent attention hands SDPA a v that is a view at an 8-byte offset;
# on an H100 with torch 2.11, eager picks cuDNN attention for it, which reads it misaligned and
# returns garbage (the synthetic call: max error 3.9 against float32 math, 489 of 512 elements off;
# the model's logits 265 of 1536 off by up to 0.19), while kiln, which aligns attention operands
# (loopir's Note [Aligned attention operands]), agrees with float32 to 0.002
# (scripts/reference_probe.py; torch.compile passes the view on and agrees with eager). So when a
# backend's inference output differs from eager's, both are compared with a reference none of the
# low-precision paths share: eager on a float32 copy of the model under SDPA's math backend. A
# backend within the dtype's tolerance of that reference where eager is not is not a mismatch:
# the row keeps eager's difference as `eager_off` (flagged "e" in the table) and is timed; any
# other difference stays a mismatch.


def _float32_reference(model: torch.nn.Module, inputs: dict[str, Any], device: str) -> Any:
    """Eager's answer in float32 under SDPA's math backend (Note [Eager is not always the
    reference]), or None when the model cannot run so."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        m = copy.deepcopy(model).to(torch.float32)
        with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), contextlib.redirect_stdout(io.StringIO()):
            torch.manual_seed(3)
            return m(**_to(inputs, device, torch.float32))
    except Exception:
        return None


def _arbitrate(got: Any, ref: Any, fp32: Any, dtype: torch.dtype) -> str:
    """'' when ``got`` (a backend's output that differs from eager's ``ref``) is off the float32
    reference too; else eager's difference from that reference (Note [Eager is not always the
    reference])."""
    if fp32 is None or _mismatch(got, fp32, dtype, values_only=True):
        return ""
    eager_off = _mismatch(ref, fp32, dtype, values_only=True)
    return f"eager off the float32 reference: {eager_off}" if eager_off else ""


# Note [Gradients checked by the suite's rule]: a weight gradient sums over the batch and every
# position, so its float32 rounding grows with its magnitude: the tiny ResNet's stem convolution
# weight gradient reaches 9.1, and eager's own float32 gradient is 3.3e-3 off float64's there
# (torch.compile's 3.0e-3): an allclose at 1e-3, right for one output, flagged torch.compile's
# ResNet step as wrong. And a gradient that is zero but for rounding (nn_multihead_attention's
# projection weights, magnitude 3e-9) differs by a few percent from any other order of the same
# sums. So gradients are checked as kiln_bench checks a training step: its accuracy rule at its
# training tolerance (allclose with the absolute part scaled by the magnitude, else an RMSE
# against eager's float64 gradients no worse than twice eager's own), the float64 step run once
# per model on a float64 copy of eager's.
TRAIN_TOL = 1e-2


def _fp64_grads(model: torch.nn.Module, inputs: dict[str, Any], device: str) -> list[Any] | None:
    """Eager's gradients of a float64 copy of ``model``, the accuracy rule's reference (None when
    the model cannot run in float64: the rule then has allclose alone)."""
    try:
        m = copy.deepcopy(model).to(torch.float64)
        for p in m.parameters():
            p.grad = None
        torch.manual_seed(3)
        _loss(m(**_to(inputs, device, torch.float64))).backward()
        return [p.grad for p in m.parameters()]
    except Exception:
        return None


def _grad_mismatch(
    module: torch.nn.Module, ref: torch.nn.Module, dtype: torch.dtype, exact: list[Any] | None = None
) -> str:
    """'' when every parameter's gradient of ``module`` matches ``ref``'s (eager's), else the first
    that does not (Note [Gradients checked by the suite's rule]; ``exact``: float64 gradients)."""
    from kiln_bench import accuracy

    tol = max(TOL.get(dtype, 1e-3), TRAIN_TOL)
    pairs = zip(module.named_parameters(), ref.parameters(), strict=True)
    for i, ((pname, p), q) in enumerate(pairs):
        if (p.grad is None) != (q.grad is None):
            return f"grad of {pname}: {'None' if p.grad is None else 'a tensor'}, eager's is not"
        if p.grad is not None:
            fp64 = exact[i] if exact is not None else None
            verdict = accuracy.check_tensor(f"grad of {pname}", q.grad, p.grad, fp64, tol)
            if not verdict.ok:
                return verdict.reason[:240]
    return ""


def _call_of(
    fn: Callable[..., Any], module: torch.nn.Module, inputs: dict[str, Any], train: bool
) -> Callable[[], Any]:
    """One timed unit: a call, or with ``train`` a training step (gradients cleared, forward, the
    loss, backward) whose gradients land in ``module``'s parameters."""
    if not train:
        return lambda: fn(**inputs)

    def step() -> Any:
        for p in module.parameters():
            p.grad = None
        out = fn(**inputs)
        _loss(out).backward()
        return out

    return step


# Note [Training steps without randomness]: a training step is checked against eager's before it
# is timed, and a compiled graph draws its random numbers in another order than eager (kiln's and
# torch.compile's alike): a model that drops in train mode (SegFormer's classifier dropout and
# stochastic depth, Swin's stochastic depth, at their configs' defaults) differed from eager on
# every backend, a mismatch of the harness, not of a compiler, and the row went untimed. So train
# mode sets every dropout probability to zero (``nn.Dropout*`` and the stochastic-depth modules'
# ``drop_prob``); the row says how many (``dropout_zeroed``).


def _without_randomness(model: torch.nn.Module) -> int:
    zeroed = 0
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p:
            m.p, zeroed = 0.0, zeroed + 1
        elif isinstance(getattr(m, "drop_prob", None), float) and m.drop_prob:
            m.drop_prob, zeroed = 0.0, zeroed + 1
    return zeroed


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name, "mode": args.mode, "threads": torch.get_num_threads()}
    dtype = getattr(torch, args.dtype)
    train = args.mode == "train"
    # a training step builds the graph autograd runs backward through; inference runs under no_grad
    grad_mode = contextlib.nullcontext if train else torch.no_grad
    try:
        model, inputs, kind = build(name, args.mode)
        if train:
            row["dropout_zeroed"] = _without_randomness(model)
        model = model.to(args.device).to(dtype)
        inputs = _to(inputs, args.device, dtype)
    except Exception as e:
        return {**row, "error": f"BUILD {type(e).__name__}: {e}"[:300]}
    row["kind"] = kind
    calls: dict[str, Callable[[], Any]] = {}
    ref = exact = None
    fp32_ref: Any = None  # eager in float32 under SDPA's math backend, made on a first mismatch
    fp32_made = False
    for backend in args.backends:
        entry: dict[str, Any] = {}
        row[backend] = entry
        try:
            module = model if backend == "eager" else copy.deepcopy(model)
            call = _call_of(_compiled(backend, module, args.ab_cpp, args.ab_options), module, inputs, train)
            with grad_mode(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                torch.manual_seed(3)
                t0 = time.perf_counter()
                out = call()
                _sync(args.device)
                entry["first_call_s"] = round(time.perf_counter() - t0, 3)
                for _ in range(args.warmup):
                    torch.manual_seed(3)
                    out = call()
            entry.update(_details(backend))
            if backend == "eager":
                ref = out
                exact = _fp64_grads(model, inputs, args.device) if train else None
            elif ref is not None:
                entry["mismatch"] = _mismatch(out, ref, dtype)
                if entry["mismatch"] and not train:
                    if not fp32_made:
                        fp32_ref, fp32_made = _float32_reference(model, inputs, args.device), True
                    verdict = _arbitrate(out, ref, fp32_ref, dtype)
                    if verdict:
                        entry["eager_off"], entry["mismatch"] = verdict[:300], ""
                if train and not entry["mismatch"]:
                    entry["mismatch"] = _grad_mismatch(module, model, dtype, exact)
            if entry.get("mismatch"):  # reported, never timed
                continue
            calls[backend] = call
        except Exception as e:  # a crash is a row
            entry["error"] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc(file=sys.stderr)
    times: dict[str, list[float]] = {b: [] for b in calls}
    with grad_mode(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        order = list(calls.items())
        for r in range(args.rounds if order else 0):  # nothing to time when every backend failed its check
            # each round starts at the next backend (A B C, B C A, ...): running right after
            # another backend's calls was measured to favour or hurt one position by up to ~10%
            # on tiny models (caches, the allocator), which a fixed order charged to one backend
            for backend, call in order[r % len(order) :] + order[: r % len(order)]:
                _sync(args.device)
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    call()
                _sync(args.device)
                times[backend].append((time.perf_counter() - t0) / args.calls * 1e3)
    for backend, ts in times.items():
        row[backend]["ms"] = round(statistics.median(ts), 4)
        if args.profile:  # where the time goes: kiln_bench's profile view of a few more calls
            from kiln_bench import profile

            try:
                with grad_mode(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                    warnings.simplefilter("ignore")
                    found = profile.profile(calls[backend], args.device, 3, row[backend]["ms"])
                row[backend]["profile"] = found.to_json()
            except Exception as e:  # a profiler failure leaves the timing as it is
                row[backend]["profile_error"] = f"{type(e).__name__}: {e}"[:200]
    for backend in calls:  # the median of the rounds' ratios: a round times the backends back to back
        if "eager" in times and times[backend] and all(times[backend]):
            ratios = [e / t for e, t in zip(times["eager"], times[backend], strict=True)]
            row[backend]["speedup"] = round(statistics.median(ratios), 3)
    torch.compiler.reset()
    return row


def _label(row: dict[str, Any], many: bool) -> str:
    """A row's model, with its thread count where the run measured several."""
    return f"{row['model']} @{row.get('threads', 0)}t" if many else row["model"]


def _summary(rows: list[dict[str, Any]], backends: list[str]) -> str:
    lines = []
    counts = sorted({r.get("threads", 0) for r in rows})
    many = len(counts) > 1
    modes = sorted({r["mode"] for r in rows if "mode" in r})
    if modes:
        lines.append(f"mode {', '.join(modes)}; threads {', '.join(str(n) for n in counts)}")
    head = f"{'model':24s}" + "".join(f"{b:>22s}" for b in backends) + "  graphs/breaks kiln, tc"
    lines.append(head)
    speedups: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        cells = []
        for b in backends:
            e = row.get(b, {})
            if "error" in e or "error" in row:
                cells.append(f"{'ERROR':>22s}")
                continue
            sp = e.get("speedup")
            flag = "!" if e.get("mismatch") else "e" if e.get("eager_off") else " "
            cells.append(f"{e.get('ms', float('nan')):9.3f}ms {sp if sp else 0:6.2f}x{flag}    ")
            if sp:
                speedups.setdefault((b, row.get("threads", 0)), []).append(sp)
        k, t = row.get("kiln", {}), row.get("inductor", {})
        lines.append(
            f"{_label(row, many):24s}"
            + "".join(cells)
            + f"  {k.get('graphs', '-')}/{k.get('breaks', '-')}, {t.get('graphs', '-')}"
        )
    for row in rows:  # the profile view, where asked
        for b in backends:
            p = row.get(b, {}).get("profile")
            if p:
                hot = ", ".join(f"{h['name'][:40]} {h['share']:.0%}" for h in p.get("top", [])[:3])
                lines.append(
                    f"  {_label(row, many):22s} {b:9s} dev {p.get('device_ms', 0):7.3f} ms  launches "
                    f"{p.get('launches', 0):5}  host {p.get('host_ms') or 0:7.3f} ms  {hot}"
                )
        for b in backends:
            off = row.get(b, {}).get("eager_off")
            if off:
                lines.append(f"  {_label(row, many):22s} {b}: matches float32, eager does not: {off[:150]}")
        for reason in row.get("kiln", {}).get("break_reasons", [])[:4]:
            lines.append(f"  {_label(row, many):22s} break: {reason[:170]}")
    for n in counts:
        at = f" at {n} threads" if many else ""
        for b in backends:
            s = speedups.get((b, n))
            if s:
                g = statistics.geometric_mean(s)
                slower = sum(1 for v in s if v < 1.0)
                lines.append(
                    f"{b}{at}: geomean {g:.3f}x over eager on {len(s)} models; slower than eager on {slower}"
                )
        if "kiln" in backends and "inductor" in backends:
            pairs = [
                (r["kiln"]["ms"], r["inductor"]["ms"])
                for r in rows
                if r.get("threads", 0) == n
                and r.get("kiln", {}).get("ms")
                and r.get("inductor", {}).get("ms")
            ]
            if pairs:
                g = statistics.geometric_mean([t / k for k, t in pairs])
                behind = sum(1 for k, t in pairs if k > t * 1.05)
                lines.append(
                    f"kiln over torch.compile{at}: {g:.3f}x geomean on {len(pairs)}; behind by >5% on {behind}"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--only", default="")
    parser.add_argument("--skip", default="")
    parser.add_argument("--backends", default="eager,kiln,inductor")
    parser.add_argument("--batch", type=int, default=0, help="the suite's batch (0: its own, 2)")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads", default="0", help="torch.set_num_threads, one count or several (1,4,16); 0: torch's own"
    )
    parser.add_argument(
        "--mode", default="eval", choices=["eval", "train"], help="eval: a call under no_grad; train: a step"
    )
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--shard", default="0/1")
    parser.add_argument("--budget-s", type=float, default=0.0, help="stop starting models after this")
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", action="store_true", help="kiln_bench's profile view per backend")
    parser.add_argument(
        "--ab-cpp", default="", help="backend kiln_ab: kiln under KILN_CPP_OPTIONS=this (k=v,...)"
    )
    parser.add_argument(
        "--ab-options", default="", help="backend kiln_ab: kiln.compile options (k=v,...; true/false bools)"
    )
    args = parser.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    counts = [int(t) for t in str(args.threads).split(",") if t] or [0]
    if args.batch:
        breadth_models.BATCH = args.batch
    names = [n for n in (args.only.split(",") if args.only else MODELS) if n]
    names = [n for n in names if n not in set(args.skip.split(","))]
    if args.procs > 1:
        return _fan_out(names, args)
    i, n = (int(v) for v in args.shard.split("/"))
    names = names[i::n]
    start = time.perf_counter()
    if "kiln" in args.backends:
        import kiln

        kiln.prepare()
    rows = []
    inductor_caches = tempfile.mkdtemp(prefix="breadth-speed-inductor-")
    for name in names:
        for n in counts:  # each count in turn, the model's compiles again at each
            if n:  # eager and the compiled kernels alike read torch's thread count
                torch.set_num_threads(n)
                # torch.compile into an empty cache per count: its C++ holds the count it was
                # generated for, and a torch whose cache key leaves the count out (2.11, seen by
                # threads.py) would run another count's graph
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(inductor_caches, f"{n}t")
            if args.budget_s and time.perf_counter() - start > args.budget_s:
                rows.append(
                    {"model": name, "mode": args.mode, "threads": n, "error": "not run: budget spent"}
                )
                continue
            t0 = time.perf_counter()
            row = run_model(name, args)
            row["seconds"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if args.json:  # written as it goes: a run cut short keeps its rows
                Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(_summary(rows, args.backends))
    return 0


def _fan_out(names: list[str], args: argparse.Namespace) -> int:
    """Run the models in `args.procs` child processes, one shard each; merge their JSONs."""
    out = Path(args.json) if args.json else Path(f"/tmp/breadth-speed-{os.getpid()}.json")
    base = [  # the child's arguments, from what was parsed: the models named, one process each
        f"--device={args.device}", f"--dtype={args.dtype}", f"--only={','.join(names)}",
        f"--backends={','.join(args.backends)}", f"--batch={args.batch}", f"--calls={args.calls}",
        f"--threads={args.threads}", f"--mode={args.mode}",
        f"--rounds={args.rounds}", f"--warmup={args.warmup}", f"--budget-s={args.budget_s}",
        *(["--profile"] if args.profile else []),
        *([f"--ab-cpp={args.ab_cpp}"] if args.ab_cpp else []),
        *([f"--ab-options={args.ab_options}"] if args.ab_options else []),
    ]  # fmt: skip
    children = []
    parts = Path(tempfile.mkdtemp(prefix="breadth-speed-"))  # beside no one's results
    for i in range(args.procs):
        part = parts / f"part{i}.json"
        cmd = [sys.executable, __file__, *base, "--shard", f"{i}/{args.procs}", "--json", str(part)]
        log = open(parts / f"part{i}.log", "w")  # noqa: SIM115 - closed below
        children.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), part, log))
    rows: list[dict[str, Any]] = []
    for proc, part, log in children:
        proc.wait()
        log.close()
        if part.exists():
            rows.extend(json.loads(part.read_text())["rows"])
        if proc.returncode:
            print(f"shard {part.stem} exited {proc.returncode}:", Path(log.name).read_text()[-1500:])
    order = {n: i for i, n in enumerate(names)}
    rows.sort(key=lambda r: order.get(r["model"], len(order)))  # stable: a model's counts stay in order
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(_summary(rows, args.backends))
    return 0


if __name__ == "__main__":
    sys.exit(main())
