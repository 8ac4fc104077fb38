"""Host time per compiled call, split by layer: where kiln's time goes before (and around) the kernels.

On a GPU in reduce-overhead mode one compiled call is one CUDA-graph replay; everything kiln runs
around it is host time that sets the wall on small models (issue 14). All of that, except the
replay and the kernels, runs the same on the CPU, so it is measured here: the public models at a
*tiny* size (the GPU size's depth — layers, blocks, parameters — at widths of 8-64 and a batch of
one, two for images, so the kernels are trivial and the call is mostly host time), in eval mode
under no_grad.

Per model, interleaved rounds of `--calls` calls each, medians over the rounds
(`time.perf_counter_ns`), µs per call:

  eager     the model itself;
  before    the model compiled again with this issue's per-call cuts switched off (the C++
            wrapper's guarded layouts at compile time, `switched_off` at call time), interleaved
            with `kiln`: the A/B of what the cuts save;
  kiln      `kiln.compile(model)` as a user calls it;
  tc        `torch.compile(model)` (inductor, CPU; `--no-torch` skips it), the reference;
  layers    the same kiln call with a timer around each layer (a few tenths of a µs each):
              outside  everything before and after kiln's backend callable: the compiled module's
                       `__call__`, the frame hook and the guard, the trampoline's bytecode, and
                       rebuilding the output (a ModelOutput, a tuple) from the graph's outputs;
              guard    of `outside`, the frame guards alone (kiln_dynamo's C guard trees, timed by
                       themselves on the values the call passed them);
              backend  kiln's `_FirstCallFallback` (compile-time accounting and the fallback check);
              aotgrad  aotgrad's `AotFunction` and its runtime wrapper;
              graph    the compiled graph: the generated wrapper and its kernels/extern calls;
  stub      the kiln call with every compiled graph's function replaced by one returning its last
            outputs: kiln's host time per call but for the wrapper and kernels (on a GPU in
            reduce-overhead: but for the CUDA-graph runner and the replay), and `before`: the
            same with the cuts switched off, interleaved;
  counts    graphs run per call, graph inputs (tensors handed to the wrappers), guard-tree ops and
            tensors checked, outputs; and, with `--profile`, a cProfile breakdown of the graph's
            wrapper: its own Python (prologue/epilogue: input checks, buffer bookkeeping) against
            kernels and extern calls, as shares (cProfile inflates small calls: read the shares).

`--device cuda --dtype bfloat16 --mode reduce-overhead` measures the same split on a GPU (host time:
the device drained before each round, not after). On the CPU a mode changes nothing (kiln's CUDA
graphs need CUDA); the CUDA-graph runner's per-call path is timed there with a stand-in capture by
`--runner`: by itself at 20/100/270 static inputs, and per model inside the kiln call (every
compiled graph's function behind a runner whose replay does nothing: reduce-overhead's host path
but for the replay and the copies' kernels), planned and full path (Note [The runner's per-call
path] in kiln_codegen_triton.cudagraphs). `packages/codegen_triton/bench/runner_overhead.py` times
the runner alone at each public model's input counts, with an A/B against another version.

    python packages/kiln/bench/call_overhead.py [--models mlp,bert,distilbert] [--calls 200]
        [--rounds 15] [--no-torch] [--profile] [--runner] [--micro]

One thread (`torch.set_num_threads(1)`). A benchmark, not a test: numbers depend on the machine's
load (this machine is shared); compare figures from one run.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import kiln
import kiln_aotgrad.api
import kiln_dynamo
import kiln_loopir.compile
from kiln import backends as kiln_backends
from kiln_bench import accuracy, models

# --- tiny workloads: the GPU size's structure at trivial widths ---------------------------------

TINY_TEXT = {"batch": 1, "seq": 8, "hidden": 32, "layers": 6, "heads": 2, "ffn": 64, "vocab": 128}
TEXT_MODELS = ("gpt2", "bert", "distilbert", "llama", "t5")


def _tiny_vision(name: str) -> models.Workload:
    from transformers import (
        ConvNextConfig,
        ConvNextForImageClassification,
        ResNetConfig,
        ResNetForImageClassification,
        ViTConfig,
        ViTForImageClassification,
    )

    gen = torch.Generator().manual_seed(0)
    classes, image = 10, 32
    model: nn.Module
    if name == "vit":
        cfg = ViTConfig(
            image_size=image, patch_size=8, hidden_size=32, num_hidden_layers=6, num_attention_heads=2,
            intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        cfg.num_labels = classes
        model = ViTForImageClassification(cfg)
    elif name == "resnet":
        rcfg = ResNetConfig(
            embedding_size=8, hidden_sizes=[16, 32, 64, 128], depths=[3, 4, 6, 3], layer_type="bottleneck"
        )
        rcfg.num_labels = classes
        model = ResNetForImageClassification(rcfg)
    else:
        ccfg = ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[3, 3, 9, 3])
        ccfg.num_labels = classes
        model = ConvNextForImageClassification(ccfg)
    # a batch of two: BatchNorm's calibration (train mode) needs more than one value per channel
    pixels = torch.randn(2, 3, image, image, generator=gen)
    return models.Workload(name, model, {"pixel_values": pixels}, classes, torch.zeros(2, dtype=torch.long))


def tiny(name: str) -> models.Workload:
    """Model `name` of kiln_bench's public suite at the tiny size."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    if name in TEXT_MODELS:
        models._TEXT["tiny"] = TINY_TEXT  # the builders read their dims from this table
        try:
            w = models.BUILDERS[name]("tiny", gen)
        finally:
            del models._TEXT["tiny"]
    elif name in ("vit", "resnet", "convnext"):
        w = _tiny_vision(name)
    elif name == "mlp":
        x = torch.randn(8, 32, generator=gen)
        w = models.Workload("mlp", models.MLP(32, 6, 10), {"x": x}, 10, torch.zeros(8, dtype=torch.long))
    elif name == "cnn":
        x = torch.randn(2, 3, 32, 32, generator=gen)
        w = models.Workload(
            "cnn", models.CNN([8, 16, 32, 64], 10), {"x": x}, 10, torch.zeros(2, dtype=torch.long)
        )
    else:
        raise KeyError(name)
    models.calibrate_batchnorm(w.model, w.inputs)
    w.model.eval()
    return w


# --- layer timers -------------------------------------------------------------------------------

LAYERS = ("backend", "aotgrad", "graph")
_spent = dict.fromkeys(LAYERS, 0)
_calls = dict.fromkeys(LAYERS, 0)
_depth = dict.fromkeys(LAYERS, 0)
_inputs_seen: list[int] = []
_graphs_seen: list[Any] = []  # the compiled graphs the timers saw (their CUDA-graph runners)


def _timed(layer: str, method: Callable[..., Any]) -> Callable[..., Any]:
    clock = time.perf_counter_ns

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _depth[layer]:  # a layer inside itself (a compiled graph that dispatches to another)
            return method(self, *args, **kwargs)
        _depth[layer] += 1
        t0 = clock()
        try:
            return method(self, *args, **kwargs)
        finally:
            _depth[layer] -= 1
            _spent[layer] += clock() - t0
            _calls[layer] += 1
            if layer == "graph":
                _inputs_seen.append(len(args))
                if self not in _graphs_seen:
                    _graphs_seen.append(self)

    return call


_PATCHES = (
    (kiln_backends._FirstCallFallback, "backend"),
    (kiln_aotgrad.api.AotFunction, "aotgrad"),
    (kiln_loopir.compile.CompiledGraph, "graph"),
)
_ORIGINAL = {cls: cls.__call__ for cls, _ in _PATCHES}


class _Stub:
    """Stands in for a compiled graph's function: returns the outputs it returned last, as a CUDA
    graph's replay would (the kernels cost nothing here)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.out = fn, None

    def __call__(self, *args: Any) -> Any:
        if self.out is None:
            self.out = self.fn(*args)
        return self.out


_stubbed: list[Any] = []


def plain_calls() -> int:
    """Calls that CUDA-graph runners ran without a replay so far (warm-up, recording, every output
    slot still held), over every compiled graph the timers have seen: a reduce-overhead row whose
    count grows while timed is not timing replays."""
    total = 0
    for graph in _graphs_seen:
        total += getattr(getattr(graph, "_fn", None), "plain_calls", 0)
    return total


def stub_graphs(on: bool) -> None:
    """Make every CompiledGraph call a `_Stub` of its function (or restore the plain calls): a
    stubbed kiln call times everything kiln does except the generated wrapper and its kernels,
    which is what reduce-overhead leaves to the host, but for the CUDA-graph runner (`--runner`)."""
    method = _ORIGINAL[kiln_loopir.compile.CompiledGraph]
    if not on:
        kiln_loopir.compile.CompiledGraph.__call__ = method  # type: ignore[method-assign]
        # a stub keeps the outputs it returned: on a GPU in reduce-overhead those are a CUDA
        # graph's output slot, held for good, so every later call would find both slots busy and
        # run the plain wrapper (Note [Outputs of a CUDA graph]). Drop them with the stubs.
        for graph in _stubbed:
            graph.__dict__.pop("_bench_stub", None)
        _stubbed.clear()
        return

    def call(self: Any, *args: Any) -> Any:
        stub = self.__dict__.get("_bench_stub")
        if stub is None:
            stub = self._bench_stub = _Stub(self._fn)
            _stubbed.append(self)
        return stub(*args)

    kiln_loopir.compile.CompiledGraph.__call__ = call  # type: ignore[method-assign]


def instrument(on: bool) -> None:
    for cls, layer in _PATCHES:
        cls.__call__ = _timed(layer, _ORIGINAL[cls]) if on else _ORIGINAL[cls]  # type: ignore[method-assign]


# --- measuring ----------------------------------------------------------------------------------


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """µs per call until the calls return (on CUDA: the device drained first, not after; Note
    [Host time per call] in kiln_bench.profile)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e3


@contextlib.contextmanager
def switched_off() -> Iterator[None]:
    """This issue's per-call cuts switched off ("before" in the A/B): Note [A ModelOutput rebuilt
    without its methods] in kiln_dynamo.variables.model_output. (The other cut, Note [Inputs the
    frame guard checks in the C++ wrapper], is chosen at compile time: `measure` compiles the
    "before" model without it.)"""
    from kiln_dynamo.variables import model_output

    previous, model_output.FAST_REBUILD = model_output.FAST_REBUILD, False
    try:
        yield
    finally:
        model_output.FAST_REBUILD = previous


def guard_cost(w: models.Workload, calls: int, rounds: int) -> tuple[float, int, int, int]:
    """(µs per call of the frame guards alone, frames, tree ops, tensors checked), from a capture
    with kiln_dynamo's "eager" backend (the guards do not depend on the backend beyond its key)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dynamo" / "bench"))
    from guards import guards_of_one_call  # packages/dynamo/bench/guards.py

    from kiln_dynamo.backends import ACTIVE

    compiled, guards = guards_of_one_call(w.model, w.inputs, train=False)
    previous, ACTIVE.key = ACTIVE.key, compiled._kiln_key
    try:
        with torch.no_grad():

            def run() -> None:
                for tree, values in guards:
                    tree(*values)

            us = statistics.median(per_call_us(run, calls) for _ in range(rounds))
    finally:
        ACTIVE.key = previous
    kiln_dynamo.reset()
    return us, len(guards), sum(t.nops for t, _ in guards), sum(t.ntensors for t, _ in guards)


# what a callee of the generated wrapper is, by name (cProfile's function names)
def _kind(func: tuple[str, int, str]) -> str:
    _, _, name = func
    if name.startswith("<built-in method kiln_") or "cpp_fused" in name or "triton_" in name:
        return "kernels"
    if "_op_extern" in name or name.startswith("<built-in method torch.") or "aten" in name:
        return "extern"
    return "wrapper"


def _profile_stats(fn: Callable[[], Any], calls: int) -> dict[Any, Any]:
    """cProfile's raw table over `calls` calls of `fn`: function -> (cc, nc, tt, ct, callers)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    return pstats.Stats(prof).stats  # type: ignore[attr-defined,no-any-return]


def wrapper_breakdown(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    """Shares of the generated wrapper's time (its callees classified by `_kind`), from cProfile."""
    stats = _profile_stats(fn, calls)
    total = sum(ct for func, (_, _, _, ct, _) in stats.items() if func[2] == "call" and "wrapper_" in func[0])
    out = {"kernels": 0.0, "extern": 0.0}
    for func, (_, _, _, _, callers) in stats.items():
        kind = _kind(func)
        if kind == "wrapper":
            continue
        for caller, (_, _, _, cct) in callers.items():
            if caller[2] == "call" and "wrapper_" in caller[0]:
                out[kind] += cct
    out["wrapper"] = total - out["kernels"] - out["extern"]  # own body and metadata calls
    return {k: v / total if total else 0.0 for k, v in out.items()}


def top_functions(fn: Callable[[], Any], calls: int, n: int) -> list[tuple[float, float, str]]:
    """The `n` functions with the most own time over `calls` calls of `fn` (cProfile): µs of own
    time per call, calls per call, and the function, most first. cProfile inflates small calls:
    read the order and the counts, not the absolute µs."""
    stats = _profile_stats(fn, calls)
    rows = []
    for (file, line, func), (_, nc, tt, _, _) in stats.items():
        where = f"{Path(file).name}:{line}({func})" if file != "~" else func
        rows.append((tt / calls * 1e6, nc / calls, where))
    rows.sort(reverse=True)
    return rows[:n]


def workload(name: str, size: str) -> models.Workload:
    """`tiny` (this file's size: the call is mostly host time) or one of kiln_bench's sizes."""
    if size == "tiny":
        return tiny(name)
    torch.manual_seed(0)
    w = models.BUILDERS[name](size, torch.Generator().manual_seed(0))
    models.calibrate_batchnorm(w.model, w.inputs)
    w.model.eval()
    return w


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    _graphs_seen.clear()  # this model's graphs only
    w = workload(name, args.size).to(args.device, getattr(torch, args.dtype))
    m, inputs = w.model, w.inputs
    kiln.reset()
    row: dict[str, Any] = {"model": name}
    tol = 1e-3 if args.dtype == "float32" else 5e-2
    with torch.no_grad():
        expected = m(**inputs)
        k = kiln.compile(m, mode=args.mode, options=args.options, dynamic=args.dynamic)
        for _ in range(3):
            got = k(**inputs)
        # "before": compiled again without the C++ wrapper's guarded layouts (a compile-time
        # choice), under an option equal to its default so that it is a cache entry of its own
        kiln_backends.GUARDED_LAYOUTS = False
        try:
            kb = kiln.compile(
                m,
                mode=args.mode,
                options={**(args.options or {}), "linear_pack": False},
                dynamic=args.dynamic,
            )
            with switched_off():
                for _ in range(3):
                    kb(**inputs)
        finally:
            kiln_backends.GUARDED_LAYOUTS = True
        # kiln_bench's rule (the absolute part scaled by the logits' magnitude): ResNet-50's bf16
        # logits at gpu size failed a plain allclose at 5e-2 that kiln_bench's check passes
        ok = accuracy.check_tensor("logits", models.logits_of(expected), models.logits_of(got), None, tol).ok
        del got, expected  # a held output keeps a CUDA graph's slot busy (Note [Outputs of a CUDA graph])
        row["matches"] = bool(ok)
        row["graphs"] = kiln.capture_stats().graphs
        tc = None
        if not args.no_torch:
            torch._dynamo.reset()
            tc = torch.compile(m, mode=args.mode, dynamic=True if args.dynamic else None)
            for _ in range(3):
                tc(**inputs)

        def eager() -> Any:
            return m(**inputs)

        def kcall() -> Any:
            return k(**inputs)

        def bcall() -> Any:
            return kb(**inputs)

        def tcall() -> Any:
            assert tc is not None
            return tc(**inputs)

        runs: dict[str, list[float]] = {
            "eager": [],
            "kiln": [],
            "before": [],
            "tc": [],
            "instr": [],
            "stub": [],
            "stub_before": [],
        }
        layers: dict[str, list[float]] = {layer: [] for layer in LAYERS}
        for _ in range(args.rounds):  # interleaved A/B
            runs["eager"].append(per_call_us(eager, args.calls))
            runs["kiln"].append(per_call_us(kcall, args.calls))
            with switched_off():
                runs["before"].append(per_call_us(bcall, args.calls))
            if tc is not None:
                runs["tc"].append(per_call_us(tcall, args.calls))
            stub_graphs(True)
            try:
                runs["stub"].append(per_call_us(kcall, args.calls))
                with switched_off():
                    runs["stub_before"].append(per_call_us(bcall, args.calls))
            finally:
                stub_graphs(False)
            instrument(True)
            for layer in LAYERS:
                _spent[layer] = _calls[layer] = 0
            _inputs_seen.clear()
            try:
                runs["instr"].append(per_call_us(kcall, args.calls))
                for layer in LAYERS:
                    layers[layer].append(_spent[layer] / args.calls / 1e3)
                row["graph_calls"] = _calls["graph"] / args.calls
                row["inputs"] = sum(_inputs_seen) // args.calls
                plain_before = plain_calls()  # the timers have seen the graphs now
                per_call_us(kcall, args.calls)
                row["plain"] = row.get("plain", 0) + plain_calls() - plain_before
            finally:
                instrument(False)
        for key, values in runs.items():
            row[key] = statistics.median(values) if values else None
        for layer in LAYERS:
            row[layer] = statistics.median(layers[layer])
        if args.runner and args.device == "cpu":
            row["ro"], row["ro_full"] = ro_stub_us(kcall, list(_graphs_seen), args.calls, args.rounds)
        if args.profile:
            row["shares"] = wrapper_breakdown(kcall, args.calls)
        if args.top:
            row["top"] = {"kiln": top_functions(kcall, args.calls, args.top)}
            if tc is not None:
                row["top"]["tc"] = top_functions(tcall, args.calls, args.top)
    row["guard"], row["frames"], row["ops"], row["tensors"] = guard_cost(w, args.calls, args.rounds)
    kiln.reset()
    return row


def ro_stub_us(call: Callable[[], Any], graphs: list[Any], calls: int, rounds: int) -> tuple[float, float]:
    """reduce-overhead's host path on the CPU: the kiln call with every compiled graph's function
    behind a CudaGraphRunner whose capture is a stand-in (its replay does nothing, its outputs are
    the function's), µs per call, (planned, full path): Note [The runner's per-call path] in
    kiln_codegen_triton.cudagraphs, on and off (`KILN_CUDAGRAPH_PLAN=0`), interleaved."""
    from kiln_codegen_triton import cudagraphs
    from kiln_dynamo import tensor_check

    def capture(f: Callable[..., Any], a: list[Any], pool: Any) -> tuple[Callable[[], None], Any]:
        return (lambda: None), f(*a)

    plain = [g._fn for g in graphs]
    runners: dict[bool, list[Any]] = {}
    try:
        for planned in (True, False):
            runners[planned] = [
                cudagraphs.CudaGraphRunner(
                    fn,
                    capture=capture,
                    guarded_inputs=True,
                    planned=planned,
                    pointer_check=tensor_check.data_ptrs_equal,  # as kiln's TritonBackend passes it
                )
                for fn in plain
            ]
            for g, r in zip(graphs, runners[planned], strict=True):
                g._fn = r
            for _ in range(4):  # warm-up, slot one, slot two
                call()
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for planned in (True, False):
                for g, r in zip(graphs, runners[planned], strict=True):
                    g._fn = r
                times[planned].append(per_call_us(call, calls))
    finally:
        for g, fn in zip(graphs, plain, strict=True):
            g._fn = fn
    for rs in runners.values():  # every timed call replayed: a plain call would time the wrapper
        assert all(r.disabled is None and r.plain_calls == 1 for r in rs), [
            (r.disabled, r.plain_calls) for r in rs
        ]
    return statistics.median(times[True]), statistics.median(times[False])


def runner_us(n_static: int, calls: int, rounds: int) -> float:
    """kiln_codegen_triton's CudaGraphRunner per call on the CPU, `n_static` static inputs and one
    copied, with a stand-in capture whose replay does nothing: what the runner adds around
    `graph.replay()` on a GPU (there `torch._C._tensors_data_ptrs_at_indices_equal` checks the
    static inputs in one C call; torch's CPU build lacks it, so here a Python loop does)."""
    from kiln_codegen_triton.cudagraphs import CudaGraphRunner

    params = [torch.randn(4) for _ in range(n_static)]
    out = torch.randn(4)

    def fn(*a: Any) -> Any:
        return (out,)

    def capture(f: Callable[..., Any], a: list[Any], pool: Any) -> tuple[Callable[[], None], Any]:
        return (lambda: None), (torch.randn(4),)

    runner = CudaGraphRunner(fn, capture=capture, guarded_inputs=True)
    for _ in range(3):
        runner(*params, torch.randn(4))  # a fresh batch each call: copied
    x = torch.randn(4)
    assert runner.replays >= 1 and len(runner._copy_idx) == 1

    def call() -> Any:
        return runner(*params, x)

    return statistics.median(per_call_us(call, calls) for _ in range(rounds))


def micro(calls: int, rounds: int) -> None:
    """The two cuts by themselves, A/B interleaved: a ModelOutput rebuilt by its class or directly
    (Note [A ModelOutput rebuilt without its methods]), and the C++ wrapper's entry checks of 107
    inputs, in full or of the storage offset only (Note [Inputs the frame guard checks in the C++
    wrapper]), as the generated lines spell them."""
    from transformers.modeling_outputs import MaskedLMOutput, Seq2SeqLMOutput

    from kiln_dynamo.variables import model_output

    x = torch.randn(2)
    for cls, fields in (
        (MaskedLMOutput, {"logits": x}),
        (Seq2SeqLMOutput, {"logits": x, "encoder_last_hidden_state": x}),
    ):
        model_output._rebuild(cls, fields, None)  # the first rebuild runs the class and plans

        def rebuild(cls: type = cls, fields: dict[str, Any] = fields) -> Any:
            return model_output._rebuild(cls, fields, None)

        fast, slow = [], []
        for _ in range(rounds):
            fast.append(per_call_us(rebuild, calls))
            with switched_off():
                slow.append(per_call_us(rebuild, calls))
        print(
            f"{cls.__name__} rebuilt: by the class {statistics.median(slow):.2f} us, directly {statistics.median(fast):.2f} us"
        )
    ts = [torch.randn(32, 32) for _ in range(107)]
    full = "".join(
        f"    if ts[{i}].stride() != (32, 1) or ts[{i}].storage_offset() != 0 or ts[{i}].shape != (32, 32) "
        f"or ts[{i}].dtype is not f32: raise ValueError\n"
        for i in range(107)
    )
    offset = "".join(f"    if ts[{i}].storage_offset() != 0: raise ValueError\n" for i in range(107))
    scope: dict[str, Any] = {"f32": torch.float32}
    exec(f"def full(ts):\n{full}\ndef offset(ts):\n{offset}", scope)
    a, b = [], []
    for _ in range(rounds):
        a.append(per_call_us(lambda: scope["full"](ts), calls))
        b.append(per_call_us(lambda: scope["offset"](ts), calls))
    print(
        f"107 input checks: in full {statistics.median(a):.2f} us, storage offset only {statistics.median(b):.2f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(models.MODEL_NAMES))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-torch", action="store_true", help="skip torch.compile")
    parser.add_argument("--profile", action="store_true", help="cProfile shares of the generated wrapper")
    parser.add_argument(
        "--top", type=int, default=0, help="cProfile: the N functions with the most own time, kiln and tc"
    )
    parser.add_argument("--runner", action="store_true", help="time the CUDA-graph runner's per-call path")
    parser.add_argument("--micro", action="store_true", help="time the two cuts by themselves, and stop")
    parser.add_argument("--options", default=None, help="kiln.compile options, a Python dict literal")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dynamic", action="store_true", help="kiln with dynamic=True (symbolic sizes from the first call)"
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--size", default="tiny", help="tiny (host time alone), or a kiln_bench size: cpu, gpu"
    )
    parser.add_argument("--mode", default=None, help="torch.compile's mode, for kiln and torch.compile")
    args = parser.parse_args()
    if args.options:
        import ast

        args.options = ast.literal_eval(args.options)
    torch.set_num_threads(1)
    if args.micro:
        micro(args.calls * 10, args.rounds)
        return
    print(f"tensor checker: {kiln.prepare()}")
    print(
        f"{'model':<11} {'ok':>3} {'eager':>7} {'before':>7} {'kiln':>7} {'tc':>7} | {'outside':>7} {'guard':>6} "
        f"{'backend':>7} {'aotgrad':>7} {'graph':>7} {'stub':>6} {'before':>6} | {'graphs':>6} {'inputs':>6} {'ops':>5} {'tensors':>7}"
    )
    for name in args.models.split(","):
        r = measure(name, args)
        outside = r["instr"] - r["backend"]
        backend = r["backend"] - r["aotgrad"]
        aot = r["aotgrad"] - r["graph"]
        tc = f"{r['tc']:7.1f}" if r["tc"] is not None else f"{'-':>7}"
        print(
            f"{r['model']:<11} {'yes' if r['matches'] else 'NO':>3} {r['eager']:7.1f} {r['before']:7.1f} {r['kiln']:7.1f} {tc} | "
            f"{outside:7.1f} {r['guard']:6.1f} {backend:7.1f} {aot:7.1f} {r['graph']:7.1f} {r['stub']:6.1f} {r['stub_before']:6.1f} | "
            f"{r['graph_calls']:6.1f} {r['inputs']:6d} {r['ops']:5d} {r['tensors']:7d}",
            flush=True,
        )
        if r.get("plain"):
            print(
                f"{'':<11} CUDA-graph runners ran the plain wrapper {r['plain']} times in "
                f"{args.calls * args.rounds} timed calls (not replays: read the kiln row as such)"
            )
        if "ro" in r:
            print(
                f"{'':<11} reduce-overhead's host path (graphs behind a CUDA-graph runner, replay a no-op): "
                f"{r['ro']:.1f} us per call planned (static pointers in C where the tensor checker is in use), "
                f"{r['ro_full']:.1f} us full path (KILN_CUDAGRAPH_PLAN=0)"
            )
        if "shares" in r:
            s = r["shares"]
            print(
                f"{'':<11} wrapper shares (cProfile): own Python and metadata {s['wrapper']:.0%}, "
                f"kernels {s['kernels']:.0%}, extern calls {s['extern']:.0%}"
            )
        for who, rows in r.get("top", {}).items():
            print(f"{'':<11} {who}: own time per call (cProfile), calls per call, function")
            for us, n, where in rows:
                print(f"{'':<13} {us:8.1f} us {n:7.1f}  {where[:150]}")
    if args.runner:
        for n in (20, 100, 270):
            us = runner_us(n, args.calls * 10, args.rounds)
            print(f"CudaGraphRunner, {n} static inputs + 1 copied: {us:.2f} us per call (replay a no-op)")


if __name__ == "__main__":
    main()
