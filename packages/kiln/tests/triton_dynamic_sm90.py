"""Compile the Triton kernels of symbolic-size graphs with Triton's real compiler for sm_90.

Run as a script with ``TRITON_INTERPRET=0`` (Triton cannot compile for a GPU in a process that
imported it in interpreter mode); no GPU is needed, compilation stops at a cubin. Each function is
captured with ``dynamic=True`` through ``kiln.compile(..., options={"cpu_backend": "triton"})``;
the kernels its symbolic graphs generate (Note [Symbolic sizes in Triton kernels]) are compiled
with their size arguments typed as the launcher compiles them (a generic int64). Running them
needs a GPU, so each graph's first call falls back to eager here (the warning is expected).
Prints one line per kernel; exits non-zero if any fails to compile or no kernel was symbolic.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
import warnings
from typing import Any

assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run with TRITON_INTERPRET=0"
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-dynamic-sm90-"))

import torch  # noqa: E402
import triton  # noqa: E402
from torch import nn  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import kiln  # noqa: E402
import kiln.backends  # noqa: E402
import kiln_codegen_triton.backend as tb  # noqa: E402
from kiln_codegen_triton.heuristics import configs  # noqa: E402
from kiln_codegen_triton.runtime import GENERIC_SIZE  # noqa: E402

TYPES = {
    torch.float32: "*fp32", torch.float64: "*fp64", torch.float16: "*fp16", torch.bfloat16: "*bf16",
    torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8", torch.uint8: "*u8",
    torch.bool: "*i1",
}  # fmt: skip
RECORDED: list[tuple[Any, Any]] = []  # (spec, its JITFunction)
_codegen_wrapper = tb.TritonBackend.codegen_wrapper


def _recording(self: Any, schedule: Any, graph: Any, kernels: Any) -> Any:
    fn = _codegen_wrapper(self, schedule, graph, kernels)
    RECORDED.extend((spec, self.last_launchers[spec.name].fn) for spec in self.last_specs)
    return fn


def functions() -> list[tuple[str, Any, list[tuple[Any, ...]]]]:
    def views(x: torch.Tensor) -> Any:
        b = x.shape[0]
        return (
            x.view(b, -1, 2).transpose(1, 2).reshape(-1),
            x.t() + 1,
            x[:, ::2] * 2,
            x.narrow(0, 1, b - 1).cos(),
        )

    def reductions(x: torch.Tensor) -> Any:
        return (
            x.sum(0),
            x.mean(-1),
            x.softmax(-1),
            nn.functional.layer_norm(x, (x.shape[-1],)),
            x.argmax(-1),
            x.var(-1),
        )

    def gather(x: torch.Tensor, idx: torch.Tensor) -> Any:
        return x[idx] * 2, x.t().contiguous()

    def floats_of_sizes(x: torch.Tensor) -> Any:
        # Note [Floats of sizes in Triton]: float64 arguments the wrapper computes
        m = x.shape[0]
        return x * (m / 3), torch.full((2, x.shape[1]), float(m) * 0.1, dtype=torch.float64)

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))
    return [
        ("views", views, [(torch.randn(6, 8),)]),
        ("reductions", reductions, [(torch.randn(6, 40),)]),
        ("gather", gather, [(torch.randn(6, 40), torch.tensor([0, 5, 2]))]),
        ("mlp training", mlp, [(torch.randn(6, 8),)]),
        ("floats of sizes", floats_of_sizes, [(torch.randn(6, 8),)]),
    ]


def main() -> int:
    tb.TritonBackend.codegen_wrapper = _recording  # type: ignore[method-assign]
    # CPU graphs to the Triton generator outside the interpreter: compiled here, never run
    kiln.backends._codegen_for = lambda device, cpu_backend="cpp": "triton"  # type: ignore[attr-defined]
    for _, fn, argsets in functions():
        compiled = kiln.compile(fn, dynamic=True, options={"cpu_backend": "triton"})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the kernels cannot run without a GPU: eager fallback
            for args in argsets:
                out = compiled(*args)
                if isinstance(out, torch.Tensor) and out.requires_grad:
                    out.sum().backward()
    target = GPUTarget("cuda", 90, 32)
    failures = symbolic = floating = 0
    for spec, jit in RECORDED:
        config = configs(spec)[0]
        blocks = {k: v for k, v in config.kwargs(spec.kind).items() if k.endswith("BLOCK")}
        signature = {f"p_{p}": TYPES[d] for p, d in zip(spec.params, spec.param_dtypes, strict=True)}
        # what warmup makes of GENERIC_SIZE: an int64 with no specialization
        assert triton.runtime.jit.mangle_type(GENERIC_SIZE, True) == "i64"
        signature.update(dict.fromkeys(spec.size_params, "i64"))
        # Note [Floats of sizes in Triton]: a float of sizes is annotated float64, which the
        # launcher's signature takes as it is (floats are never specialized)
        floats = [name for name, _ in spec.float_params]
        assert [p.annotation_type for p in jit.params if p.name in floats] == ["fp64"] * len(floats)
        signature.update(dict.fromkeys(floats, "fp64"))
        floating += bool(floats)
        signature.update(dict.fromkeys(blocks, "constexpr"))
        symbolic += spec.symbolic
        try:
            source = triton.compiler.ASTSource(fn=jit, signature=signature, constexprs=blocks)
            triton.compile(source, target=target, options={"num_warps": config.num_warps})
            print(f"ok    {spec.name} ({spec.kind}, sizes {', '.join(spec.size_params) or 'static'})")
        except Exception:
            failures += 1
            print(f"FAIL  {spec.name} ({spec.kind})\n{spec.source}\n{traceback.format_exc()}")
    print(
        f"{len(RECORDED)} kernels, {symbolic} with symbolic sizes, {floating} with floats of sizes, {failures} failed"
    )
    return 1 if failures or not symbolic or not floating else 0


if __name__ == "__main__":
    sys.exit(main())
