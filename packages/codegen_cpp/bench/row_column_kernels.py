"""LayerNorm's backward kernels timed by themselves: row_column_sums on (one fused kernel) and off
(a row kernel and a column kernel), next to eager's ``native_layer_norm_backward``, one thread.

Note [Column sums in a row kernel] (kernel.py): the step timings of ``layer_norm_ab.py`` include
the wrapper, the forward and autograd; here kiln compiles LayerNorm(n) forward + backward once per
variant, and the backward's extern "C" kernels are loaded from the cache's ``kernels.so`` with
ctypes and called on the same buffers (the parameters are mapped by their names in the generated
signature: ``p_tangents_1`` the gradient, ``p_primals_1`` x, ``p_primals_2`` the weight,
``p_mean_dim`` / ``p_var_correction`` the row statistics;
any other pointer an output). Fastest and median of ``--rounds`` rounds of ``--calls`` calls, interleaved.
A benchmark, not a test.

    python packages/codegen_cpp/bench/row_column_kernels.py --rows 256 --size 768
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

CACHE = tempfile.mkdtemp(prefix="kiln-rowcol-")
os.environ["KILN_CACHE_DIR"] = CACHE

import torch  # noqa: E402

import kiln  # noqa: E402

SIGNATURE = re.compile(r'^extern "C" int64_t (\w+)\(([^)]*)\)', re.M)


def _kernels(rows: int, n: int, on: bool) -> list[tuple[str, list[str], Path]]:
    """Compile LayerNorm(n) fwd + bwd with row_column_sums ``on``; the backward's kernels."""
    before = set(Path(CACHE).rglob("kernels*.cpp"))
    m = torch.nn.LayerNorm(n)

    def step(t: torch.Tensor) -> torch.Tensor:
        return m(t)

    c = kiln.compile(step, options={"cpp_options": {"row_column_sums": on}})
    x = torch.randn(rows, n, requires_grad=True)
    c(x).sum().backward()
    out = []
    for src in sorted(set(Path(CACHE).rglob("kernels*.cpp")) - before):
        for name, params in SIGNATURE.findall(src.read_text()):
            names = [p.split()[-1] for p in params.split(",")]
            if "p_tangents_1" in names:
                out.append((name, names, src.parent / "kernels.so"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--size", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, n = args.rows, args.size
    torch.manual_seed(0)
    g, x, w, b = torch.randn(rows, n), torch.randn(rows, n), torch.randn(n), torch.randn(n)
    mean = x.mean(1, keepdim=True)
    var = x.var(1, unbiased=False, keepdim=True)
    rstd = (var + 1e-5).rsqrt()
    named = {
        "p_tangents_1": g,
        "p_primals_1": x,
        "p_primals_2": w,
        "p_mean_dim": mean,
        "p_var_correction": var,
    }
    xhat = (x.double() - mean.double()) * rstd.double()
    refs = {"dw": (g.double() * xhat).sum(0), "db": g.double().sum(0)}
    variants: dict[str, Any] = {}
    keep: list[torch.Tensor] = []  # the outputs the kernels write (alive while they run)
    for label, on in (("rowcol1", True), ("rowcol0", False)):
        calls = []
        outs: list[torch.Tensor] = []
        for name, params, so in _kernels(rows, n, on):
            fn = getattr(ctypes.CDLL(str(so)), name)
            fn.restype = ctypes.c_int64
            ptrs: list[Any] = []
            for p in params:
                if p == "nt":
                    ptrs.append(ctypes.c_int64(1))
                    continue
                if p not in named:
                    outs.append(torch.empty(rows * n))  # large enough for dx or a column sum
                    ptrs.append(ctypes.c_void_p(outs[-1].data_ptr()))
                    continue
                ptrs.append(ctypes.c_void_p(named[p].data_ptr()))
            calls.append((fn, ptrs))
        variants[label] = lambda calls=calls: [fn(*ptrs) for fn, ptrs in calls]
        keep.extend(outs)
        variants[label]()
        errors = [min((o[:n].double() - r).abs().max().item() for o in outs) for r in refs.values()]
        print(
            f"{label}: {len(calls)} kernel(s); dw, db errors against float64 {errors[0]:.2e} {errors[1]:.2e}"
        )
    variants["eager"] = lambda: torch.ops.aten.native_layer_norm_backward(
        g, x, [n], mean, rstd, w, b, [True, True, True]
    )
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for k, call in variants.items():
            t0 = time.perf_counter_ns()
            for _ in range(args.calls):
                call()
            times[k].append((time.perf_counter_ns() - t0) / args.calls / 1000)
    for k, v in times.items():
        print(f"{k:8s} fastest {min(v):8.1f} us  median {statistics.median(v):8.1f} us")


if __name__ == "__main__":
    main()
