"""LayerNorm at one thread: kiln variants against eager and each other, timed in one process.

Issue 20 (cpu17): the statistics of a CPU layer norm. Variants: ``new`` (the defaults: loopir's
``var_mean`` pass and the C++ generator's ``shifted_welford``), ``old`` (both off: the variance's
double Welford and a separate float sum for the mean), and the two in between; ``lanes8``: the
defaults with 8 lanes per row (cpu17c, Note [Lane accumulators]); ``narrow0``: the defaults
without ``narrow_lanes`` (cpu18, Note [Lanes cover a vector of the narrowest type];
``--dtypes float32,bfloat16`` times bfloat16 rows too); ``peel0``: the defaults without
``peel_shifted_blocks`` (cpu18b, Note [Peeled shifted blocks]); ``w256``: the defaults without
``wide_vectors`` (cpu20b, Note [512-bit vectors on AVX-512 targets]); ``pass32``: the defaults
with ``wide_pointwise_passes`` (cpu20c, Note [A row's pointwise pass takes two vectors]);
``saves0``: the defaults without aotgrad's ``fusion_aware_saves`` (ln21, Note [What saving a
value costs]: the training forward saves xhat instead of x and the row statistics); ``rowcol1`` /
``rowcol0``: ``row_column_sums`` on / off (lncol21, Note [Column sums in a row kernel]).
``--variants pass32`` times only those (and eager, new).
Timing (the process's CPU time, steadier on a shared machine): the
variants interleaved, medians of ``--repeats`` rounds of ``--calls`` calls, forward alone
(``torch.no_grad``) and forward + backward. Accuracy: the largest error of the forward output
against a float64 reference, eager's next to each variant's, rows ``offset + randn`` (float32 and
bfloat16). A benchmark, not a test.

    python packages/codegen_cpp/bench/layer_norm_ab.py --rows 256 --sizes 256,768,1024
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-ln-ab-"))

import torch

import kiln

VARIANTS: dict[str, dict[str, Any]] = {
    "old": {"var_mean": False, "cpp_options": {"shifted_welford": False}},
    "var_mean": {"var_mean": True, "cpp_options": {"shifted_welford": False}},
    "shifted": {"var_mean": False, "cpp_options": {"shifted_welford": True}},
    "lanes8": {"cpp_options": {"reduction_lanes": 8}},
    "narrow0": {"cpp_options": {"narrow_lanes": False}},
    "peel0": {"cpp_options": {"peel_shifted_blocks": False}},
    "w256": {"cpp_options": {"wide_vectors": False}},
    "pass32": {"cpp_options": {"wide_pointwise_passes": True}},
    "saves0": {"fusion_aware_saves": False},
    "rowcol1": {"cpp_options": {"row_column_sums": True}},
    "rowcol0": {"cpp_options": {"row_column_sums": False}},
    "new": {},
}


_made = 0
_only: set[str] = set()  # --variants: the variants timed, with new (empty: all)


def _compiled(n: int, dtype: torch.dtype, options: dict[str, Any]) -> tuple[torch.nn.Module, Any]:
    """The module, and kiln's compile of a function of its own code object that calls it (each
    variant's cache of compiled graphs is its own, none reaches the recompile limit)."""
    global _made
    torch.manual_seed(0)
    m = torch.nn.LayerNorm(n).to(dtype)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    _made += 1
    scope: dict[str, Any] = {}
    exec(
        compile(f"def call_{_made}(x):\n    return m(x)\n", f"<layer_norm_ab {_made}>", "exec"),
        {"m": m},
        scope,
    )
    return m, kiln.compile(scope[f"call_{_made}"], options=options)


def accuracy(rows: int, n: int, dtype: torch.dtype, offset: float) -> dict[str, float]:
    torch.manual_seed(1)
    x64 = offset + torch.randn(rows, n, dtype=torch.float64)
    x = x64.to(dtype)
    out: dict[str, float] = {}
    m, _ = _compiled(n, dtype, {})
    ref = torch.nn.functional.layer_norm(x.double(), (n,), m.weight.double(), m.bias.double(), m.eps)
    with torch.no_grad():
        out["eager"] = (m(x).double() - ref).abs().max().item()
        for name, options in VARIANTS.items():
            _, f = _compiled(n, dtype, options)
            got = f(x)
            assert got.dtype == dtype and got.shape == x.shape
            out[name] = (got.double() - ref).abs().max().item()
    return out


def timing(
    rows: int, n: int, calls: int, repeats: int, backward: bool, dtype: torch.dtype = torch.float32
) -> dict[str, float]:
    x = torch.randn(rows, n, dtype=dtype, requires_grad=backward)
    grad = torch.randn(rows, n, dtype=dtype)
    fns = {"eager": _compiled(n, dtype, {})[0]}
    for name, options in VARIANTS.items():
        if _only and name not in _only:
            continue
        fns[name] = _compiled(n, dtype, options)[1]

    def step(f: Any) -> None:
        if backward:
            f(x).backward(grad)
        else:
            with torch.no_grad():
                f(x)

    for f in fns.values():
        for _ in range(3):
            step(f)
    return interleaved_us(fns, step, calls, repeats)


def interleaved_us(fns: dict[str, Any], step: Any, calls: int, repeats: int) -> dict[str, float]:
    """CPU µs per call of `step(f)` for each of `fns`, the variants interleaved (A B C C B A ...),
    median of `repeats` rounds of `calls` calls (also minmax_ab.py's clock)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(repeats):
        # every other round in reverse order, so no variant keeps the position after another
        for name, f in list(fns.items())[:: 1 if i % 2 == 0 else -1]:
            t0 = time.process_time()
            for _ in range(calls):
                step(f)
            times[name].append((time.process_time() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--sizes", default="256,768,1024")
    parser.add_argument("--offsets", default="0,100,1000")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtypes", default="float32", help="dtypes timed, e.g. float32,bfloat16")
    parser.add_argument("--variants", default="", help="time only these variants (and eager, new)")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.variants:
        _only.update({*args.variants.split(","), "new"})
    names = ["eager", *(v for v in VARIANTS if not _only or v in _only)]
    if not args.skip_timing:
        print(f"time per call, us (CPU time, median of {args.repeats} x {args.calls}), rows={args.rows}")
        print(f"{'n':>6} {'pass':>12} " + " ".join(f"{k:>9}" for k in names))
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            for n in sizes:
                for backward in (False, True):
                    t = timing(args.rows, n, args.calls, args.repeats, backward, dtype)
                    kind = ("fwd+bwd" if backward else "fwd") + ("" if dtype == torch.float32 else " bf16")
                    print(f"{n:>6} {kind:>12} " + " ".join(f"{t[k]:9.1f}" for k in names), flush=True)
    if not args.skip_accuracy:
        print("max abs error of the output against float64")
        print(f"{'dtype':>9} {'n':>6} {'offset':>7} " + " ".join(f"{k:>9}" for k in names))
        for dtype in (torch.float32, torch.bfloat16):
            for n in sizes:
                for offset in (float(o) for o in args.offsets.split(",")):
                    e = accuracy(args.rows, n, dtype, offset)
                    name = str(dtype).removeprefix("torch.")
                    print(
                        f"{name:>9} {n:>6} {offset:7g} " + " ".join(f"{e[k]:9.2e}" for k in names), flush=True
                    )


if __name__ == "__main__":
    main()
