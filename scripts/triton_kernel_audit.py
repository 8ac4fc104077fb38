"""A GPU-less audit of the Triton kernels kiln generates for a model: grids, blocks, bytes, and an
estimate of each kernel's time on an H200, to find kernels that cannot fill the GPU.

Why: the device is scarce (30 minutes a session, sometimes none). Most slow generated kernels are
slow for a reason visible without running them: too few programs for 132 SMs (a reduction with few
outputs left whole, a column reduction walking a huge extent in one program), or a launch config
whose tiles are tiny. This script compiles a model of kiln_bench at any size on CPU tensors through
the Triton generator (``cpu_backend="triton"``, the CUDA layout rule forced with
``layout_policy="cuda"``; T5's strided attention mask made dense as on CUDA,
``attention_dense_mask="force"``), and instead of running each kernel under Triton's interpreter it records
what the GPU would be asked to do: kind, numels, config, grid, the bytes of its tensor arguments.
Extern calls (convolutions, GEMMs) still run for real on the CPU (they give the next kernel its
inputs' shapes and strides); generated kernels are skipped, so values are garbage and nothing is
checked — this is an instrument, not a test.

The estimate (Note [A static estimate of kernel time]): a memory-bound kernel moving ``B`` bytes
takes ``B / (COPY_BW * fill)``, where ``fill = min(1, warps in flight / WARPS_TO_FILL)`` and
warps in flight = programs x warps per program. ``WARPS_TO_FILL`` (132 SMs x 16 warps) is about what
the H200 needs in flight to reach its copy bandwidth; a kernel with 8 programs of 4 warps gets
fill 32/2112 and is estimated 66x slower than a full one. A kernel's bytes are the sizes of its tensor arguments: an upper bound (a kernel that reads a
slice, or gathers rows of an embedding table, is charged the whole tensor). It ignores compute, caches and
launch latency (a floor of ``LAUNCH_US``). Use it to rank kernels and to compare two option
sets on the same model (``--ab``), never as a time to report.

    python scripts/triton_kernel_audit.py --model cnn --mode train --size gpu \\
        --options layout_training=True --ab layout_training=False --top 12

Prints per compile: the kernels sorted by estimated time, with fill; a summary per option set.
"""

from __future__ import annotations

import argparse
import ast
import os
import tempfile
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-kernel-audit-"))

import sympy
import torch
import torch.utils._python_dispatch
import torch.utils._pytree

import kiln
from kiln_codegen_triton import runtime as triton_runtime
from kiln_codegen_triton.heuristics import grid, grid_source

# Note [A static estimate of kernel time]: H200 figures (copy bandwidth measured by
# bench/bandwidth.py on the device; 132 SMs; ~16 resident warps per SM saturate HBM)
COPY_BW = 4.3e12
WARPS_TO_FILL = 132 * 16
LAUNCH_US = 2.0


@dataclass(frozen=True)
class Launch:
    name: str
    kind: str
    outer: bool
    numels: tuple[int, int, int]
    config: str
    programs: int
    warps: int
    nbytes: int

    @property
    def fill(self) -> float:
        return min(1.0, self.programs * self.warps / WARPS_TO_FILL)

    @property
    def estimate_us(self) -> float:
        return max(LAUNCH_US, self.nbytes / (COPY_BW * self.fill) * 1e6)


# the CUDA decisions forced on CPU tensors: the layout rule, and T5's strided SDPA mask made dense
_CUDA_RULES: dict[str, Any] = {
    "cpu_backend": "triton",
    "layout_policy": "cuda",
    "attention_dense_mask": "force",
    "strict": True,
}

LAUNCHES: list[Launch] = []
EXTERNS: list[str] = []


def _layout(t: torch.Tensor) -> str:
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return "NHWC"
    if t.is_contiguous():
        return "C"
    return "strided" + str(tuple(t.stride()))


class _Externs(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the aten ops run outside generated kernels (extern calls, views, allocations) with
    the layout of each tensor argument: a mixed-layout call is where a library converts."""

    def __init__(self, copies: bool = False) -> None:
        super().__init__()
        self.quiet = _QUIET - _COPIES if copies else _QUIET

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket.__name__)
        if name not in self.quiet:
            tensors = [
                a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)
            ]
            outs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
            EXTERNS.append(
                f"{name}({', '.join(f'{tuple(t.shape)} {_layout(t)}' for t in tensors if t.dim() >= 2)})"
                f" -> {', '.join(_layout(o) for o in outs if o.dim() >= 2)}"
            )
        return out


# views and allocations: free or cheap, not where time goes
_QUIET = {
    "empty_strided",
    "empty",
    "as_strided",
    "view",
    "_reshape_alias",
    "reinterpret_tensor",
    "detach",
    "alias",
    "t",
    "permute",
    "expand",
    "unsqueeze",
    "squeeze",
    "slice",
    "select",
    "zeros",
    "zero_",
    "_to_copy",
    "lift_fresh",
    "resize_",
    "set_",
    "copy_",
    "fill_",
    "ones_like",
    "zeros_like",
    "new_empty",
    "new_empty_strided",
    "empty_like",
    "transpose",
    "split",
    "clone",
}


# the copies among them (``--copies`` lists these too): a layout conversion outside generated code
# (an extern's result copied into the layout its graph expected, a DtoD copy) shows up as one
_COPIES = {"copy_", "clone", "_to_copy"}


def _recording_call(self: Any, *args: Any) -> None:
    config = self.config or self.candidates[0]
    spec = self.spec
    if spec.symbolic:  # the size arguments come last: this launch's numels and grid from them
        values = dict(zip(spec.size_params, args[len(args) - len(spec.size_params) :], strict=True))
        numels = tuple(
            int(e.subs({sym: values[sym.name] for sym in e.free_symbols}))
            for e in map(sympy.sympify, (spec.xnumel, spec.ynumel, spec.rnumel))
        )
        g = tuple(eval(src, {}, dict(values)) for src in grid_source(spec, config))
    else:
        numels = spec.hints()
        g = grid(spec, config)
    programs = 1
    for n in g:
        programs *= int(n)
    nbytes = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    for a in args:  # integer outputs (pooling indices) must stay valid for the extern calls after
        if isinstance(a, torch.Tensor) and not a.is_floating_point():
            a.zero_()
    cfg = f"X{config.XBLOCK}" + (f" Y{config.YBLOCK}" if spec.kind == "tiled" else "")
    cfg += f" R{config.RBLOCK}" if spec.kind in ("persistent", "looped") else ""
    LAUNCHES.append(
        Launch(
            spec.name,
            spec.kind,
            spec.outer,
            numels,
            f"{cfg} w{config.num_warps}",
            programs,
            config.num_warps,
            nbytes,
        )
    )


def run(
    model: str, mode: str, size: str, dtype: torch.dtype, options: dict[str, Any], copies: bool = False
) -> list[Launch]:
    """Compile ``model`` with kiln's Triton generator under ``options`` and record one call's launches
    (the forward, and the backward for ``mode="train"``)."""
    from kiln_bench.models import build, logits_of, loss_of

    LAUNCHES.clear()
    kiln.reset()
    w = build(model, size).to("cpu", dtype if dtype != torch.float32 else None)
    opts = {**_CUDA_RULES, **options}
    compiled = kiln.compile(w.model, options=opts)
    w.model.train(mode == "train")
    with torch.set_grad_enabled(mode == "train"):
        compiled(**w.inputs)  # compiles (and runs once)
        LAUNCHES.clear()
        EXTERNS.clear()
        with _Externs(copies):
            out = compiled(**w.inputs)
            if mode == "train":
                loss_of(w, out).backward()
            else:
                logits_of(out)
    kiln.reset()
    return list(LAUNCHES)


# Note [Heavy extern calls in the audit]: at GPU sizes a GEMM or an attention on this CPU takes
# seconds (GPT-2's LM head at 32 x 512 tokens alone is ~1 TFLOP), and the audit does not read
# values. Under --shapes, GEMMs allocate their result (contiguous, as the real call returns it)
# and compute nothing; attention still runs. Every later kernel sees the layouts it would.
_HEAVY = {"mm": 0, "addmm": 1, "bmm": 0, "baddbmm": 1}  # op -> index of its first matrix


class _FakeHeavy(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        first = _HEAVY.get(func.overloadpacket.__name__)
        real = all(
            type(t) is torch.Tensor and t.device.type == "cpu"
            for t in args[:3]
            if isinstance(t, torch.Tensor)
        )
        if first is None or not real:  # not a GEMM, or a trace (fake tensors): as it is
            return func(*args, **kwargs)
        if "out" in kwargs:
            return kwargs["out"]
        a, b = args[first], args[first + 1]
        return torch.empty((*a.shape[:-1], b.shape[-1]), dtype=a.dtype)


def run_shapes(
    model: str,
    dtype: torch.dtype,
    options: dict[str, Any],
    dynamic: bool | None,
    shapes: list[tuple[int, int]],
) -> list[list[Launch]]:
    """Note [Kernels of a symbolic graph at each size]: one inference compile of ``model`` (gpu size)
    under ``dynamic``, called at every (batch, seq) of ``shapes`` in order as kiln_bench.dynamic's
    sweep does (so automatic dynamic compiles what it would), then one recorded call per shape:
    the launches each size would make on the GPU. ``dynamic=False`` compiles each shape on its own
    (the static graphs the sweep compares against)."""
    from kiln_bench.dynamic import _text_positions, inputs_at
    from kiln_bench.models import build

    with _text_positions(max(s for _, s in shapes)):
        w = build(model, "gpu").to("cpu", dtype if dtype != torch.float32 else None)
    w.model.eval()
    gen = torch.Generator().manual_seed(1)
    feeds = [inputs_at(w, b, s, gen) for b, s in shapes]
    opts = {**_CUDA_RULES, **options}
    out: list[list[Launch]] = []
    kiln.reset()
    with torch.no_grad(), _FakeHeavy():
        compiled = kiln.compile(w.model, options=opts, dynamic=dynamic)
        if dynamic is not False:
            for f in feeds:
                compiled(**f)
        for f in feeds:
            if dynamic is False:
                kiln.reset()
                compiled = kiln.compile(w.model, options=opts, dynamic=False)
                compiled(**f)
            LAUNCHES.clear()
            compiled(**f)
            out.append(list(LAUNCHES))
    graphs = kiln.capture_stats().graphs
    kiln.reset()
    print(f"-- {model} dynamic={dynamic}: {graphs} graph(s) compiled in the last compile's session")
    return out


def compare_shapes(
    shapes: list[tuple[int, int]], static: list[list[Launch]], dyn: list[list[Launch]]
) -> None:
    """Per shape: estimate static vs symbolic, and every launch whose config differs."""
    print(
        f"\n{'shape':>8} {'kernels s/d':>12} {'static us':>10} {'dynamic us':>11} {'ratio':>6} {'configs differ':>15}"
    )
    ratios = []
    diffs: list[str] = []
    for (b, s), st, dy in zip(shapes, static, dyn, strict=True):
        ts, td = sum(x.estimate_us for x in st), sum(x.estimate_us for x in dy)
        ratios.append(td / ts)
        differ = 0
        for a, c in zip(sorted(st, key=_key), sorted(dy, key=_key), strict=False):
            if (a.kind, a.config, a.programs) != (c.kind, c.config, c.programs):
                differ += 1
                diffs.append(
                    f"  {b}x{s}: {a.kind}{'/outer' if a.outer else ''} {'/'.join(map(str, a.numels))}: "
                    f"static {a.config} {a.programs} progs {a.estimate_us:.1f} us | dynamic {c.kind} "
                    f"{'/'.join(map(str, c.numels))} {c.config} {c.programs} progs {c.estimate_us:.1f} us"
                )
        print(f"{b:>3}x{s:<4} {len(st):>5}/{len(dy):<6} {ts:>10.1f} {td:>11.1f} {td / ts:>6.2f} {differ:>15}")
    geo = 2.0 ** (sum(__import__("math").log2(r) for r in ratios) / len(ratios))
    print(f"estimate dynamic/static: geomean {geo:.3f}, worst {max(ratios):.3f}")
    for line in diffs:
        print(line)


def _key(x: Launch) -> tuple[Any, ...]:
    return (x.kind, x.outer, x.numels, x.nbytes)


def report(label: str, launches: list[Launch], top: int) -> float:
    total = sum(x.estimate_us for x in launches)
    nbytes = sum(x.nbytes for x in launches)
    low = [x for x in launches if x.fill < 0.5 and x.nbytes >= 1 << 20]
    print(
        f"\n== {label}: {len(launches)} kernels, {nbytes / 1e6:.1f} MB, estimate {total / 1e3:.3f} ms "
        f"({len(low)} kernels >= 1 MB below half fill)"
    )
    print(
        f"{'kernel':42s} {'kind':12s} {'x/y/r numel':>24s} {'config':>18s} {'progs':>7s} "
        f"{'fill':>5s} {'MB':>8s} {'est us':>8s}"
    )
    shown = sorted(launches, key=lambda x: -x.estimate_us)[:top]
    shown += [x for x in low if x not in shown]  # and every large under-filled kernel
    for x in shown:
        kind = x.kind + ("/outer" if x.outer else "")
        numels = "/".join(str(n) for n in x.numels)
        print(
            f"{x.name[:42]:42s} {kind:12s} {numels:>24s} {x.config:>18s} {x.programs:>7d} "
            f"{x.fill:5.2f} {x.nbytes / 1e6:8.2f} {x.estimate_us:8.1f}"
        )
    return total


def _options(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        if key.startswith("triton."):  # a TritonBackend option, as kiln_bench's variants name them
            out.setdefault("triton_options", {})[key.removeprefix("triton.")] = parsed
        else:
            out[key] = parsed
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--mode", default="infer", choices=["infer", "train"])
    parser.add_argument("--size", default="gpu", choices=["cpu", "gpu"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--options", default="", help="kiln.compile options, k=v,k=v (triton.k=v: TritonBackend's)"
    )
    parser.add_argument("--ab", default=None, help="a second option set to compare, k=v,k=v")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--externs", action="store_true", help="list the aten calls between kernels")
    parser.add_argument("--copies", action="store_true", help="with --externs, list aten copies too")
    parser.add_argument(
        "--shapes",
        default="",
        help="batch x seq list (2x16,8x128): inference at each shape, static vs symbolic (--dynamic)",
    )
    parser.add_argument("--dynamic", default="none", choices=["none", "true"], help="with --shapes")
    args = parser.parse_args()
    triton_runtime.Launcher.__call__ = _recording_call  # type: ignore[method-assign]
    dtype = getattr(torch, args.dtype)
    if args.shapes:
        shapes = [(int(b), int(s)) for b, s in (t.split("x") for t in args.shapes.split(","))]
        options = _options(args.options)
        dyn = run_shapes(args.model, dtype, options, {"none": None, "true": True}[args.dynamic], shapes)
        static = run_shapes(args.model, dtype, options, False, shapes)
        if args.top:
            for (b, s), st, dy in zip(shapes, static, dyn, strict=True):
                report(f"{args.model} {b}x{s} static", st, args.top)
                report(f"{args.model} {b}x{s} dynamic={args.dynamic}", dy, args.top)
        compare_shapes(shapes, static, dyn)
        return 0
    totals = []
    for text in [args.options] + ([args.ab] if args.ab is not None else []):
        launches = run(args.model, args.mode, args.size, dtype, _options(text), args.copies)
        totals.append(
            report(
                f"{args.model} {args.mode} {args.size} {args.dtype} [{text or 'defaults'}]",
                launches,
                args.top,
            )
        )
        if args.externs:
            print(f"-- {len(EXTERNS)} other aten calls (tensor arguments of 2+ dims: shape, layout):")
            for line in EXTERNS:
                print("  ", line)
    if len(totals) == 2:
        print(f"\nestimate ratio (first / second): {totals[0] / totals[1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
