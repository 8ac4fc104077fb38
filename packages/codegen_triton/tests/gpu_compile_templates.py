"""Compile matmul templates (Note [Matmul templates]) with Triton's real compiler for sm_90.

Like ``gpu_compile.py``: run with ``TRITON_INTERPRET=0``, no GPU needed (compilation stops at a
cubin); prints one line per template and config and exits non-zero if any fails. The templates
are generated with ``matmul_templates="force"`` on CPU tensors (the GPU configs, since the
interpreter is off), so what compiles here is what a GPU would compile.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run with TRITON_INTERPRET=0"

import torch  # noqa: E402
import torch.fx  # noqa: E402
import triton  # noqa: E402
from gpu_compile import TYPES  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from kiln_codegen_triton import TritonBackend  # noqa: E402
from kiln_loopir import compile_graph  # noqa: E402

aten = torch.ops.aten


def mlp(x: Any, w: Any, b: Any, r: Any) -> Any:
    return aten.add.Tensor(aten.gelu.default(aten.addmm.default(b, x, w)), r)


def addmm(x: Any, w: Any, b: Any, r: Any) -> Any:
    return aten.addmm.default(b, x, w)  # a graph output: a lone template stores the product


def scores(q: Any, k: Any) -> Any:
    return aten.mul.Tensor(aten.bmm.default(q, aten.transpose.int(k, 1, 2)), 0.125)


def cases() -> list[tuple[str, Any, list[Any], int]]:
    def mlp_inputs(dtype: torch.dtype) -> list[Any]:
        return [torch.randn(s).to(dtype) for s in ((256, 192), (192, 320), (320,), (256, 320))]

    return [
        ("bf16 mm + bias, gelu, residual", mlp, mlp_inputs(torch.bfloat16), 99),
        ("fp32 mm + bias, gelu, residual", mlp, mlp_inputs(torch.float32), 2),
        ("bf16 addmm alone", addmm, mlp_inputs(torch.bfloat16), 1),
        (
            "fp16 bmm of a transposed key",
            scores,
            [torch.randn(4, 100, 64).half(), torch.randn(4, 77, 64).half()],
            1,
        ),
    ]


def main() -> int:
    target = GPUTarget("cuda", 90, 32)
    failures = 0
    for label, fn, inputs, limit in cases():
        backend = TritonBackend(mode="max-autotune", matmul_templates="force")
        compile_graph(torch.fx.symbolic_trace(fn), inputs, backend=backend)
        assert len(backend.last_templates) == 1, backend.last_wrapper
        choice = backend.last_templates[0]
        spec = choice.template
        assert spec is not None
        for config in spec.configs[:limit]:
            constexprs = spec.constexprs(config)
            signature = {f"p_{p}": TYPES[d] for p, d in zip(spec.params, spec.param_dtypes, strict=True)}
            signature.update(dict.fromkeys(constexprs, "constexpr"))
            try:
                source = triton.compiler.ASTSource(fn=choice.fn, signature=signature, constexprs=constexprs)
                compiled = triton.compile(
                    source,
                    target=target,
                    options={"num_warps": config.num_warps, "num_stages": config.num_stages},
                )
                # half types must reach the tensor cores (Hopper's warpgroup MMA)
                tensor_cores = "wgmma" in compiled.asm["ptx"]
                if spec.problem.dtype != torch.float32 and not tensor_cores:
                    raise AssertionError("no wgmma instruction in the PTX")
                print(
                    f"ok    {label}: {spec.name} {config.label()} (template{', wgmma' if tensor_cores else ''})"
                )
            except Exception:
                failures += 1
                print(f"FAIL  {label}: {spec.name} {config.label()}\n{spec.source}\n{traceback.format_exc()}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
