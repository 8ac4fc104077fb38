"""Matmul templates against cuBLAS + a separate epilogue kernel, on a GPU (Note [Matmul templates]).

For the GEMMs of GPT-2 (small) and BERT-base at batch*seq tokens in ``--tokens`` (bfloat16
by default), each with the epilogue it has in the model, the graph is compiled with
``TritonBackend(mode="max-autotune-no-cudagraphs")``, so its template node times, at the first
call, the extern call (cuBLAS) followed by kiln's epilogue kernel against each template config
(``triton.testing.do_bench``: GPU ms per call, its default mean), and keeps the fastest. The table
prints those timings: the extern path, the best template and its config, the speedup, and what
was chosen; every result is first checked against eager. This is a benchmark, not a test.
The cache of choices is a fresh temporary folder, so every run times again.

    PYTHONPATH=packages/loopir/src:packages/codegen_triton/src \\
        python packages/codegen_triton/bench/matmul_templates.py [--tokens 4096,8192] [--out t.json]

Most of its time is Triton compiling each template config (one kernel per shape and config,
compiled at the first call): 8 problems x up to 5 configs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-mm-templates-"))

import torch
import torch.fx

import kiln_loopir
from kiln_codegen_triton import TritonBackend
from kiln_codegen_triton.templates import GemmConfig

aten = torch.ops.aten


def bias(x: Any, w: Any, b: Any, r: Any) -> Any:
    return aten.add.Tensor(aten.mm.default(x, w), b)


def bias_gelu(x: Any, w: Any, b: Any, r: Any) -> Any:
    return aten.gelu.default(aten.add.Tensor(aten.mm.default(x, w), b), approximate="tanh")


def bias_residual(x: Any, w: Any, b: Any, r: Any) -> Any:
    return aten.add.Tensor(aten.add.Tensor(aten.mm.default(x, w), b), r)


# (label, K, N, epilogue): GPT-2 small's c_attn / attention c_proj / MLP c_fc / MLP c_proj, and
# BERT-base's separate query/key/value projections (its other GEMMs have GPT-2's shapes)
PROBLEMS: list[tuple[str, int, int, Callable[..., Any]]] = [
    ("gpt2 attn qkv (+bias)", 768, 2304, bias),
    ("gpt2 attn proj (+bias+res)", 768, 768, bias_residual),
    ("gpt2/bert mlp up (+bias+gelu)", 768, 3072, bias_gelu),
    ("gpt2/bert mlp down (+bias+res)", 3072, 768, bias_residual),
    ("bert q/k/v (+bias)", 768, 768, bias),
]


def run(tokens: int, k: int, n: int, fn: Callable[..., Any], dtype: torch.dtype) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, k, generator=g).to(dtype).cuda()
    w = (torch.randn(k, n, generator=g) / k**0.5).to(dtype).cuda()
    b = torch.randn(n, generator=g).to(dtype).cuda()
    r = torch.randn(tokens, n, generator=g).to(dtype).cuda()
    gm = torch.fx.symbolic_trace(fn)
    backend = TritonBackend(mode="max-autotune-no-cudagraphs")
    start = time.perf_counter()
    compiled = kiln_loopir.compile_graph(gm, [x, w, b, r], backend=backend)
    got = compiled(x, w, b, r)  # the first call times every candidate
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    want = gm(x, w, b, r)
    error = float((got.float() - want.float()).norm() / want.float().norm())
    if error > 1e-2:
        raise AssertionError(f"{fn.__name__} [{tokens}x{k}x{n}]: relative error {error:.2e} against eager")
    if len(backend.last_templates) != 1:
        return {"tokens": tokens, "k": k, "n": n, "note": "no template node", "error": error}
    choice = backend.last_templates[0]
    timings = choice.timings_ms
    templates = {label: t for label, t in timings.items() if label != "extern"}
    best = min(templates, key=lambda label: templates[label]) if templates else ""
    chosen = choice.chosen
    return {
        "tokens": tokens,
        "k": k,
        "n": n,
        "extern_ms": timings.get("extern"),
        "template_ms": templates.get(best),
        "template_config": best,
        "chosen": chosen.label() if isinstance(chosen, GemmConfig) else chosen,
        "timings_ms": timings,
        "relative_error": error,
        "first_call_s": first_call_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="4096,8192", help="batch*seq values")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--only", default="", help="substring of the problem labels to run")
    parser.add_argument("--out", default="", help="write the rows as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    rows = []
    print(f"{torch.cuda.get_device_name()}, {args.dtype}; GPU ms per call (triton.testing.do_bench)")
    header = f"{'problem':32} {'M x K x N':>18} {'cuBLAS+epi':>10} {'template':>9} {'speedup':>7}  {'best config':24} chosen"
    print(header)
    print("-" * len(header))
    for tokens in (int(t) for t in args.tokens.split(",")):
        for label, k, n, fn in PROBLEMS:
            if args.only and args.only not in label:
                continue
            row = {"problem": label, **run(tokens, k, n, fn, dtype)}
            rows.append(row)
            ext, tem = row.get("extern_ms"), row.get("template_ms")
            speedup = f"{ext / tem:.2f}x" if ext and tem else "-"
            print(
                f"{label:32} {f'{tokens}x{k}x{n}':>18} {ext or float('nan'):10.4f} {tem or float('nan'):9.4f} "
                f"{speedup:>7}  {row.get('template_config', ''):24} {row.get('chosen', row.get('note'))}"
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "rows": rows}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
