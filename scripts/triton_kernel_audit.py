"""A GPU-less audit of the Triton kernels kiln generates for a model: grids, blocks, bytes, and an
estimate of each kernel's time on an H200, to find kernels that cannot fill the GPU.

Why: the device is scarce (30 minutes a session, sometimes none). Most slow generated kernels are
slow for a reason visible without running them: too few programs for 132 SMs (a reduction with few
outputs left whole, a column reduction walking a huge extent in one program), or a launch config
whose tiles are tiny. This script compiles a model of kiln_bench at any size on CPU tensors through
the Triton generator (``cpu_backend="triton"``, the CUDA layout rule forced with
``layout_policy="cuda"``), and instead of running each kernel under Triton's interpreter it records
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

import torch
import torch.utils._python_dispatch
import torch.utils._pytree

import kiln
from kiln_codegen_triton import runtime as triton_runtime
from kiln_codegen_triton.heuristics import grid

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

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket.__name__)
        if name not in _QUIET:
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


def _recording_call(self: Any, *args: Any) -> None:
    config = self.config or self.candidates[0]
    g = grid(self.spec, config)
    programs = 1
    for n in g:
        programs *= int(n)
    nbytes = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    for a in args:  # integer outputs (pooling indices) must stay valid for the extern calls after
        if isinstance(a, torch.Tensor) and not a.is_floating_point():
            a.zero_()
    spec = self.spec
    numels = spec.hints()
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


def run(model: str, mode: str, size: str, dtype: torch.dtype, options: dict[str, Any]) -> list[Launch]:
    """Compile ``model`` with kiln's Triton generator under ``options`` and record one call's launches
    (the forward, and the backward for ``mode="train"``)."""
    from kiln_bench.models import build, logits_of, loss_of

    LAUNCHES.clear()
    kiln.reset()
    w = build(model, size).to("cpu", dtype if dtype != torch.float32 else None)
    opts = {"cpu_backend": "triton", "layout_policy": "cuda", "strict": True, **options}
    compiled = kiln.compile(w.model, options=opts)
    w.model.train(mode == "train")
    with torch.set_grad_enabled(mode == "train"):
        compiled(**w.inputs)  # compiles (and runs once)
        LAUNCHES.clear()
        EXTERNS.clear()
        with _Externs():
            out = compiled(**w.inputs)
            if mode == "train":
                loss_of(w, out).backward()
            else:
                logits_of(out)
    kiln.reset()
    return list(LAUNCHES)


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
    args = parser.parse_args()
    triton_runtime.Launcher.__call__ = _recording_call  # type: ignore[method-assign]
    dtype = getattr(torch, args.dtype)
    totals = []
    for text in [args.options] + ([args.ab] if args.ab is not None else []):
        launches = run(args.model, args.mode, args.size, dtype, _options(text))
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
