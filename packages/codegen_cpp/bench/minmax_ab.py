"""Maximum/minimum at one thread: two selects against the or'ed select, timed in one process.

Issue 20 (cpu17c): Note [Maximum and minimum as two selects] in prelude.py. Each kernel is compiled
twice with kiln (``new``: the defaults; ``old``: ``select_minmax=0``, the ``a > b || a != a``
spelling; ``--old`` picks other options: ``reduction_lanes=8``, Note [Lane accumulators]) and timed against eager, the three interleaved: medians of ``--repeats`` rounds of
``--calls`` calls, in the process's CPU time (steadier on a shared machine). The inputs are
``randn``, so a running maximum changes often (the case a branch mispredicts). A benchmark, not a
test.

    python packages/codegen_cpp/bench/minmax_ab.py --rows 256 --cols 1024
    python packages/codegen_cpp/bench/minmax_ab.py --old reduction_lanes=8 --only 'sum(x,-1)'
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-minmax-ab-"))

import torch

import kiln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layer_norm_ab import interleaved_us

F = torch.nn.functional
KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "maximum(x,y)": torch.maximum,
    "clamp(x,-1,1)": lambda x, y: torch.clamp(x, -1.0, 1.0),
    "relu6(x)": lambda x, y: F.relu6(x),
    "hardtanh(x*y)": lambda x, y: F.hardtanh(x * y),
    "amax(x,-1)": lambda x, y: x.amax(-1),
    "amin(x,-1)": lambda x, y: x.amin(-1),
    "amax(x,0)": lambda x, y: x.amax(0),
    "softmax(x,-1)": lambda x, y: torch.softmax(x, -1),
    "sum(x,-1)": lambda x, y: x.sum(-1),
    "layer_norm(x)": lambda x, y: F.layer_norm(x, x.shape[-1:]),
}
VARIANTS: dict[str, dict[str, Any]] = {"old": {"cpp_options": {"select_minmax": False}}, "new": {}}
_made = 0


def _compiled(fn: Callable[..., torch.Tensor], options: dict[str, Any]) -> Callable[..., torch.Tensor]:
    """kiln's compile of a function of its own code object (each variant's cache its own)."""
    global _made
    _made += 1
    scope: dict[str, Any] = {}
    source = f"def call_{_made}(x, y):\n    return fn(x, y)\n"
    exec(compile(source, f"<minmax_ab {_made}>", "exec"), {"fn": fn}, scope)
    return kiln.compile(scope[f"call_{_made}"], options=options)


def timing(
    fn: Callable[..., torch.Tensor], x: torch.Tensor, y: torch.Tensor, calls: int, repeats: int
) -> dict[str, float]:
    fns = {"eager": fn, **{k: _compiled(fn, o) for k, o in VARIANTS.items()}}
    want = fn(x, y)
    for f in fns.values():
        torch.testing.assert_close(f(x, y), want, rtol=1e-4, atol=1e-4)  # a sanity check
    return interleaved_us(fns, lambda f: f(x, y), calls, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--old", default="select_minmax=0", help="the old variant's C++ options, k=v,...")
    parser.add_argument("--only", default="", help="kernel names separated by ; (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    old = dict(item.split("=") for item in filter(None, args.old.split(",")))
    VARIANTS["old"] = {"cpp_options": {k: int(v) for k, v in old.items()}}
    names = ["eager", *VARIANTS]
    print(f"time per call, us (CPU time, median of {args.repeats} x {args.calls}), {args.rows} x {args.cols}")
    print(f"{'kernel':>16} {'dtype':>9} " + " ".join(f"{k:>9}" for k in names) + "   old/new")
    only = set(filter(None, args.only.split(";")))
    with torch.no_grad():
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            torch.manual_seed(0)
            x = torch.randn(args.rows, args.cols, dtype=dtype)
            y = torch.randn(args.rows, args.cols, dtype=dtype)
            for kname, fn in KERNELS.items():
                if only and kname not in only:
                    continue
                t = timing(fn, x, y, args.calls, args.repeats)
                d = str(dtype).removeprefix("torch.")
                cells = " ".join(f"{t[k]:9.1f}" for k in names)
                print(f"{kname:>16} {d:>9} {cells}   {t['old'] / t['new']:6.2f}x", flush=True)


if __name__ == "__main__":
    main()
