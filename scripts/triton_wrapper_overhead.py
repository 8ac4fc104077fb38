"""The Triton wrapper's own host time per call, measured without a GPU (issue 14).

On the H200, kiln's default-mode host time per call loses to torch.compile's on the conv nets
(ResNet-50 3.78 against 2.92 ms for 124 launches each) and matches it on GPT-2. Everything in a
call but the kernels and the libraries' work runs the same on a CPU, so it is measured here.

Note [The GPU wrapper on CPU tensors]: a model of kiln_bench is compiled through the Triton
generator on CPU tensors with the CUDA layout rule (``cpu_backend="triton"``,
``layout_policy="cuda"``) and run once for real (under Triton's interpreter). Beside each graph's
interpreter wrapper, this script generates the wrapper the graph gets **on a GPU** — the same
``WrapperCodegen`` with its GPU switch forced (Note [Kernel arguments are pointers] in
codegen_triton's wrapper.py): pointers read once, buffers in their own shape, the stream read once
— and runs it on the recorded inputs of that graph, on CPU tensors, with

* every kernel launch replaced by a no-op function of the fast launcher's signature
  (``launch(stream, *pointers, *sizes)``): the arguments are still read and passed, Triton's C
  launch (~3-5 us on the H200 host, Note [Calling the C launch directly] in runtime.py) is not
  counted;
* every extern op (convolutions, GEMMs, pooling, their backwards) replaced by a stub returning the
  result the real op returned at the recorded call, so the wrapper's argument building, views and
  result checks are counted but not the library's work; the call forms of the externs themselves
  (``OpOverload`` against torch's Python binding) are timed by ``--micro``.

What is left is the wrapper's own cost per call: input checks, allocations (the CPU allocator here,
the caching allocator on a GPU: a few us either way), views, extern argument building and result
checks, the launchers' argument passing. Per model and mode it prints the wrapper's us per call for
two generations of the same graphs, interleaved (``before``: the cuts of Note [A lean wrapper]
switched off, ``KILN_LEAN_WRAPPER=0``; ``after``: as shipped), and the counts per call of
launches, externs, views (``as_strided``), allocations (``empty``/``empty_strided``), result
checks (``_dense``/``_flat``), pointer reads. Training measures the forward and the backward
wrappers of one step. Models run at call_overhead.py's tiny size (the GPU size's depth at trivial
widths, so allocations are small as with the caching allocator).

    python scripts/triton_wrapper_overhead.py --models resnet,convnext,gpt2 --modes infer,train \\
        --dtype bfloat16 --calls 200 --rounds 15 [--micro] [--show resnet] [--symbolic]

``--switch NAME[,NAME...]`` takes other switches for ``before``/``after`` (``before``: each
``NAME=0``), e.g. ``KILN_DIRECT_CALLS`` (Note [Allocations and views without torch's Python
layer] in wrapper.py) for that cut alone. A switch read at compile time (``KILN_LAID_OUT_INPUTS``
in aotgrad) is on for both forms; the wrapper reads it again when it is generated.

``--check`` also runs every GPU form with its kernels (under Triton's interpreter) and its extern
ops, and compares its outputs with the interpreter wrapper's bit for bit (Note [The GPU wrapper with
its kernels run]): a change to the GPU wrapper is checked for wrong answers here, without a GPU.

``--symbolic`` compares the shipped wrapper of the static graphs with that of the symbolic graphs
(``dynamic=True``) of the same model instead (issue 17: the symbolic wrapper's extra host work).

A benchmark, not a test: one thread; compare figures of one run only (this machine is shared).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-wrapper-overhead-"))

import torch

import kiln
from kiln_codegen_triton import backend as triton_backend
from kiln_codegen_triton import wrapper as triton_wrapper
from kiln_codegen_triton.interp import replay_gpu_form

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "kiln" / "bench"))
from call_overhead import tiny

SWITCH = "KILN_LEAN_WRAPPER"  # Note [A lean wrapper] in codegen_triton's wrapper.py
CHECK = False  # --check: Note [The GPU wrapper with its kernels run]
CHECK_FAILURES: list[str] = []


class _NoLaunch:
    """Stands in for a kernel's Launcher in the GPU form: installs a no-op of its signature."""

    def __init__(self, n: int) -> None:
        params = ", ".join(["stream", *(f"a{i}" for i in range(n))])
        scope: dict[str, Any] = {}
        exec(f"def launch({params}):\n    pass\n", scope)
        self.fn = scope["launch"]

    def install(self, namespace: dict[str, Any], slot: str) -> None:
        namespace[slot] = self.fn
        if self.real is not None:  # for --check (Note [The GPU wrapper with its kernels run])
            namespace.setdefault("_real_launchers", {})[slot] = self.real

    real: Any = None


def _copy(value: Any) -> Any:
    """A tensor over a copy of its storage, in its exact layout (offset, strides, overlaps)."""
    if not isinstance(value, torch.Tensor):
        return value
    storage = value.untyped_storage().clone()
    return torch.empty(0, dtype=value.dtype).set_(
        storage, value.storage_offset(), value.size(), value.stride()
    )


def _tree(value: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(value, list | tuple):
        return type(value)(_tree(v, fn) for v in value)
    return fn(value)


class _GpuForm(triton_wrapper.WrapperCodegen):
    """The wrapper a graph gets on a GPU, generated for CPU tensors (Note [The GPU wrapper on CPU
    tensors])."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pointers = True
        self.flat_inputs = self._inputs_needing_flat_views()
        self.namespace["_get_stream"] = lambda index: 0


class Graph:
    """One compiled graph: its interpreter wrapper (run for real once) and its GPU forms."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.args: tuple[Any, ...] | None = None
        self.results: dict[str, Any] = {}  # extern op slot -> the result of the recorded call
        self.forms: dict[str, tuple[Callable[..., Any], str, dict[str, Any]]] = {}
        self.snapshot: list[Any] = []  # the recorded inputs as they were before the call
        self.expected: Any = None  # what the interpreter wrapper returned for them


GRAPHS: list[Graph] = []


def _gpu_form(schedule: Any, graph: Any, groups: Any, launchers: Any, guarded: bool, lean: bool) -> Any:
    switches = SWITCH.split(",")  # several: all off in ``before``
    saved = {name: os.environ.get(name) for name in switches}
    os.environ.update(dict.fromkeys(switches, "1" if lean else "0"))
    try:
        fakes = {
            name: _NoLaunch(len(launcher.spec.params) + len(launcher.spec.size_params))
            for name, launcher in launchers.items()
        }
        for name, fake in fakes.items():
            fake.real = launchers[name]
        gen = _GpuForm(schedule, graph, groups, fakes, guarded)  # type: ignore[arg-type]
        source = gen.generate()
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    exec(compile(source, "<kiln-triton-wrapper gpu form>", "exec"), gen.namespace)
    return gen.namespace["call"], source, gen.namespace


def _patched_make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def make(
        schedule: Any, graph: Any, groups: Any, launchers: Any, guarded_layouts: bool = False, **kw: Any
    ) -> Any:
        fn, source = original(schedule, graph, groups, launchers, guarded_layouts, **kw)
        g = Graph(f"graph{len(GRAPHS)}")
        GRAPHS.append(g)
        for lean in (False, True):
            g.forms["after" if lean else "before"] = _gpu_form(
                schedule, graph, groups, launchers, guarded_layouts, lean
            )
        # record the extern results of the interpreter wrapper's first call: the stubs return them
        namespace = fn.__globals__
        for slot, op in list(namespace.items()):
            if slot.startswith("_op_"):

                def recording(*a: Any, _op: Any = op, _slot: str = slot, **k: Any) -> Any:
                    out = _op(*a, **k)
                    g.results.setdefault(_slot, out)
                    return out

                namespace[slot] = recording

        def call(*args: Any) -> Any:
            if g.args is not None:
                return fn(*args)
            g.args, g.snapshot = args, [_copy(a) for a in args]
            out = fn(*args)
            g.expected = _tree(out, _copy)
            return out

        return call, source

    return make


# Note [The GPU wrapper with its kernels run]: ``--check`` runs each GPU form with its kernels and
# extern ops for real, on CPU tensors (Note [A GPU form run under the interpreter] in
# kiln_codegen_triton's interp.py), and compares its outputs, bit for bit, with what the interpreter
# wrapper returned for the same inputs: a change to the GPU wrapper's allocations, views or checks
# that misplaces memory shows here without a GPU.
def check_form(g: Graph, form: str) -> str:
    """'' when the GPU form ``form`` of ``g``, its kernels run, returns what the interpreter
    wrapper did (bit for bit); else what differs."""
    fn, _, namespace = g.forms[form]
    saved = dict(namespace)
    seen = replay_gpu_form(namespace, saved.get("_real_launchers", {}))
    try:
        args = [seen(_copy(a)) for a in g.snapshot]
        with torch.no_grad():
            got = fn(*args)
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"
    finally:
        namespace.clear()
        namespace.update(saved)
    bad: list[str] = []

    def compare(a: Any, b: Any, where: str) -> None:
        if isinstance(b, list | tuple):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                compare(x, y, f"{where}[{i}]")
        elif isinstance(b, torch.Tensor):
            if a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype:
                bad.append(
                    f"{where}: {tuple(a.shape)} {a.stride()} {a.dtype} against {tuple(b.shape)} {b.stride()}"
                )
            elif not torch.equal(a.nan_to_num(), b.nan_to_num()):
                bad.append(f"{where}: values differ, max {float((a.double() - b.double()).abs().max()):.3g}")
        elif a is not b and a != b:
            bad.append(f"{where}: {a!r} against {b!r}")

    compare(got, g.expected, "out")
    return "; ".join(bad)


def _stub(value: Any) -> Callable[..., Any]:
    def stub(*args: Any, **kwargs: Any) -> Any:
        return value

    return stub


def counts(source: str, copies: tuple[int, int] = (0, 0)) -> dict[str, int]:
    """Per-call counts of what the wrapper does, read off its straight-line source (``copies``:
    inputs copied into their compiled layout at the recorded call, counted by :func:`copied`)."""
    body = [line.split("#")[0] for line in source.splitlines()]
    text = "\n".join(body)
    return {
        "launches": len(re.findall(r"\b_k\d+(?:_\d+)?\(", text)),
        "externs": len(re.findall(r"\b_op_\w+\(", text)),
        "views": text.count(".as_strided(") + len(re.findall(r"\b_reinterpret\(", text)),
        "allocs": len(re.findall(r"\b_(?:empty(?:_strided)?|alloc)\(", text)),
        "checks": len(re.findall(r"\b_(?:dense|flat)\(", text)),
        "pointers": len(re.findall(r"^\s+\w+_p = ", text, re.M)),
        "input copies": copies[0],
        "result copies": copies[1],
    }


def copied(g: Graph, form: str) -> tuple[int, int]:
    """How many inputs, and how many extern results, one call of ``g``'s ``form`` copies into
    their compiled layout (a fresh buffer and, on a GPU, a copy kernel each)."""
    fn, _, namespace = g.forms[form]
    saved = {k: namespace[k] for k in ("_conform", "_dense", "_flat")}
    n = [0, 0]

    def counting(name: str, i: int) -> Callable[..., Any]:
        def call(t: Any, *args: Any, **kwargs: Any) -> Any:
            out = saved[name](t, *args, **kwargs)
            if name == "_conform" or (out is not None and out.data_ptr() != t.data_ptr()):
                n[i] += 1
            return out

        return call

    namespace |= {
        "_conform": counting("_conform", 0),
        "_dense": counting("_dense", 1),
        "_flat": counting("_flat", 1),
    }
    try:
        fn(*g.args)  # type: ignore[misc]
    finally:
        namespace |= saved
    return n[0], n[1]


def compile_model(
    name: str, mode: str, dtype: torch.dtype, dynamic: bool | None = False, stub: bool = True
) -> list[Graph]:
    GRAPHS.clear()
    kiln.reset()
    w = tiny(name)
    if dtype != torch.float32:
        w.model.to(dtype)
        for k, v in w.inputs.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                w.inputs[k] = v.to(dtype)
    from kiln_bench.models import logits_of, loss_of

    w.model.train(mode == "train")
    opts = {
        "cpu_backend": "triton",
        "layout_policy": "cuda",
        "strict": True,
        "triton_options": {"matmul_templates": False},
    }
    compiled = kiln.compile(w.model, options=opts, dynamic=dynamic)
    with torch.set_grad_enabled(mode == "train"):
        out = compiled(**w.inputs)
        if mode == "train":
            loss_of(w, out).backward()
        else:
            logits_of(out)
    graphs = [g for g in GRAPHS if g.args is not None]
    if CHECK:
        for g in graphs:
            for form in g.forms:
                problem = check_form(g, form)
                print(
                    f"  check {name} {mode} {g.label} {form}: {problem or 'same as the interpreter wrapper'}"
                )
                CHECK_FAILURES.extend([problem] if problem else [])
    for g in graphs if stub else ():
        for _, _, namespace in g.forms.values():
            for slot in [s for s in namespace if s.startswith("_op_")]:
                namespace[slot] = _stub(g.results.get(slot))
    return graphs


def time_sets(
    sets: dict[str, list[tuple[Callable[..., Any], Any]]], calls: int, rounds: int
) -> dict[str, float]:
    """us per call of each set of (wrapper, args) together: interleaved ABBA rounds, medians.
    Under no_grad, as the wrappers run (inside the autograd.Function in training; an inference
    graph has no input that requires grad, or grad mode off): the recorded inputs are parameters,
    and an ``as_strided`` of one in grad mode would record an autograd node on every call."""
    with torch.no_grad():
        return _time_sets(sets, calls, rounds)


def _time_sets(
    sets: dict[str, list[tuple[Callable[..., Any], Any]]], calls: int, rounds: int
) -> dict[str, float]:
    for fns in sets.values():  # warm up (and check that the GPU form runs on these inputs)
        for fn, args in fns:
            fn(*args)
    samples: dict[str, list[float]] = {label: [] for label in sets}
    for r in range(rounds):
        order = list(samples.items())
        for label, out in order if r % 2 else order[::-1]:  # ABBA: no order bias
            fns = sets[label]
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                for fn, args in fns:
                    fn(*args)
            out.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return {label: statistics.median(v) for label, v in samples.items()}


def time_forms(graphs: list[Graph], calls: int, rounds: int) -> dict[str, float]:
    """us per call of all the model's graphs together, per form (before/after)."""
    return time_sets(
        {form: [(g.forms[form][0], g.args) for g in graphs] for form in ("before", "after")}, calls, rounds
    )


def _totals(graphs: list[Graph], form: str) -> dict[str, int]:
    sums: dict[str, int] = {}
    for g in graphs:
        for k, v in counts(g.forms[form][1], copied(g, form)).items():
            sums[k] = sums.get(k, 0) + v
    return sums


def symbolic_ab(name: str, mode: str, dtype: torch.dtype, calls: int, rounds: int) -> str:
    """``--symbolic``: the shipped wrapper of the static graphs against that of the symbolic ones
    (``dynamic=True``) of one model, us per call and counts (issue 17: is the host slower under
    symbols?). A graph kiln compiles static anyway shows equal counts."""
    static = compile_model(name, mode, dtype, dynamic=False)
    symbolic = compile_model(name, mode, dtype, dynamic=True)
    us = time_sets(
        {
            "static": [(g.forms["after"][0], g.args) for g in static],
            "symbolic": [(g.forms["after"][0], g.args) for g in symbolic],
        },
        calls,
        rounds,
    )
    a, b = _totals(static, "after"), _totals(symbolic, "after")
    items = " ".join(f"{a[k]}->{b[k]}" if a[k] != b[k] else str(a[k]) for k in a)
    lines = sum(len(g.forms["after"][1].splitlines()) for g in symbolic)
    return (
        f"{name:10s} {mode:5s} static {us['static']:8.1f} us, symbolic {us['symbolic']:8.1f} us "
        f"({lines} wrapper lines) | {items}"
    )


# --- --micro: the call forms of the externs a conv net calls ------------------------------------


def _bench(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    best = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(best)


def micro(calls: int, rounds: int) -> None:
    """Each extern a conv net calls, through its OpOverload and through torch's Python binding
    (the form torch.compile's Python wrapper uses for convolution), on tiny CPU tensors, interleaved."""
    aten = torch.ops.aten
    x = torch.randn(1, 2, 4, 4).to(memory_format=torch.channels_last)
    w = torch.randn(2, 2, 1, 1).to(memory_format=torch.channels_last)
    g = torch.randn(1, 2, 4, 4).to(memory_format=torch.channels_last)
    a, b = torch.randn(2, 2), torch.randn(2, 2)
    conv = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    pool = (x, [3, 3], [2, 2], [1, 1], [1, 1], False)
    # as kiln's wrapper spells a convolution (constant int lists as tuples, Note [A lean wrapper]),
    # and as a user's F.conv2d (a composite that reaches the same convolution)
    conv_t = (x, w, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 1)
    conv2d = (x, w, None, (1, 1), (0, 0), (1, 1), 1)
    w3 = torch.randn(2, 2, 3, 3)  # a parameter as the user holds it: NCHW
    w3_nhwc = w3.contiguous(memory_format=torch.channels_last)
    conv3 = (x, w3, None, (1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    _, idx = aten.max_pool2d_with_indices.default(*pool)
    gp = torch.randn(idx.shape).contiguous(memory_format=torch.channels_last)
    cases: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        ("convolution", lambda: aten.convolution.default(*conv), lambda: torch.convolution(*conv)),
        ("convolution / torch.conv2d", lambda: torch.convolution(*conv_t), lambda: torch.conv2d(*conv2d)),
        (
            "3x3 convolution, NCHW / NHWC weight",  # the weight converted inside aten, or not
            lambda: torch.convolution(*conv3),
            lambda: torch.convolution(conv3[0], w3_nhwc, *conv3[2:]),
        ),
        (
            "convolution_backward",
            lambda: aten.convolution_backward.default(
                g, x, w, [0], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]
            ),
            lambda: torch.ops.aten.convolution_backward(
                g, x, w, [0], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]
            ),
        ),
        (
            "max_pool2d_with_indices",
            lambda: aten.max_pool2d_with_indices.default(*pool),
            lambda: torch._C._nn.max_pool2d_with_indices(*pool),
        ),
        (
            "max_pool2d_with_indices_backward",
            lambda: aten.max_pool2d_with_indices_backward.default(
                gp, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx
            ),
            lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                gp, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx
            ),
        ),
        ("mm", lambda: aten.mm.default(a, b), lambda: torch.mm(a, b)),
        (
            "as_strided (a view)",
            lambda: x.as_strided((1, 2, 4, 4), (32, 1, 8, 2), 0),
            lambda: torch.ops.aten.as_strided.default(x, (1, 2, 4, 4), (32, 1, 8, 2), 0),
        ),
        (
            "empty_strided",
            lambda: torch.empty_strided((1, 2, 4, 4), (32, 1, 8, 2), dtype=torch.float32, device="cpu"),
            lambda: torch.empty((32,), dtype=torch.float32, device="cpu"),
        ),
    ]
    print(f"{'op':36s} {'first form us':>14s} {'second form us':>15s}")
    for name, first, second in cases:
        f = s = 0.0
        fs, ss = [], []
        for _ in range(rounds):
            fs.append(_bench(first, calls, 1))
            ss.append(_bench(second, calls, 1))
        f, s = statistics.median(fs), statistics.median(ss)
        print(f"{name:36s} {f:14.2f} {s:15.2f}")
    print(
        "forms: convolution OpOverload / torch.convolution; torch.convolution / torch.conv2d; a 3x3 convolution of\n"
        "an NHWC input with the weight NCHW (converted inside aten per call) / NHWC; convolution_backward OpOverload / its packet;\n"
        "max_pool2d_with_indices OpOverload / torch._C._nn binding (backward: its packet); mm OpOverload / torch.mm;\n"
        "as_strided Tensor method / OpOverload; empty_strided(4-d) / empty(flat)"
    )


def main() -> int:
    global SWITCH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet,convnext,gpt2")
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--micro", action="store_true", help="time the externs' call forms")
    parser.add_argument(
        "--check",
        action="store_true",
        help="run each GPU form's kernels and compare with the interpreter wrapper",
    )
    parser.add_argument("--show", default="", help="print the GPU-form wrapper sources of this model")
    parser.add_argument("--switch", default=SWITCH, help="the env switch of before (=0) and after (=1)")
    parser.add_argument(
        "--symbolic", action="store_true", help="static against dynamic=True graphs instead of before/after"
    )
    args = parser.parse_args()
    SWITCH = args.switch
    global CHECK
    CHECK = args.check
    torch.set_num_threads(1)
    if args.micro:
        micro(args.calls, args.rounds)
        return 0
    triton_backend.make_wrapper = _patched_make_wrapper(triton_backend.make_wrapper)  # type: ignore[assignment]
    dtype = getattr(torch, args.dtype)
    if args.symbolic:
        for name in args.models.split(","):
            for mode in args.modes.split(","):
                print(symbolic_ab(name, mode, dtype, args.calls, args.rounds), flush=True)
        print(
            "counts: launches externs views allocs checks pointers input-copies result-copies (static -> symbolic)"
        )
        return 0
    header = (
        f"{'model':10s} {'mode':5s} {'graphs':>6s} {'before us':>10s} {'after us':>9s} "
        "| launches externs views allocs checks pointers input-copies result-copies (before -> after)"
    )
    rows = []
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            graphs = compile_model(name, mode, dtype)
            if name == args.show:
                for g in graphs:
                    for form, (_, source, _) in g.forms.items():
                        print(f"# ---- {name} {mode} {g.label} {form}\n{source}")
            us = time_forms(graphs, args.calls, args.rounds)
            total = {form: _totals(graphs, form) for form in ("before", "after")}
            items = " ".join(
                f"{total['before'][k]}->{total['after'][k]}"
                if total["before"][k] != total["after"][k]
                else str(v)
                for k, v in total["after"].items()
            )
            row = f"{name:10s} {mode:5s} {len(graphs):6d} {us['before']:10.1f} {us['after']:9.1f} | {items}"
            rows.append(row)
            print(row, flush=True)
    print("\n" + header)
    print("\n".join(rows))
    return 1 if CHECK_FAILURES else 0


if __name__ == "__main__":
    raise SystemExit(main())
