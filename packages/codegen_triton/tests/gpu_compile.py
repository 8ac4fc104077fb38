"""Compile representative graphs' kernels with Triton's real compiler for an H100/H200 (sm_90).

Run as a script with ``TRITON_INTERPRET=0`` (Triton cannot compile for a GPU in a process that
imported it in interpreter mode): ``python gpu_compile.py`` prints one line per kernel and exits
non-zero if any kernel fails to compile. No GPU is needed: compilation stops at a cubin. This is
what keeps the GPU path honest in CI, where kernels otherwise only run in the interpreter.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from typing import Any

assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run with TRITON_INTERPRET=0"

import torch  # noqa: E402
import torch.fx  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from kiln_codegen_triton import TritonBackend  # noqa: E402
from kiln_codegen_triton.heuristics import configs  # noqa: E402
from kiln_codegen_triton.runtime import native_plan  # noqa: E402
from kiln_loopir import compile_graph  # noqa: E402

aten = torch.ops.aten

TYPES = {
    torch.float32: "*fp32", torch.float64: "*fp64", torch.float16: "*fp16", torch.bfloat16: "*bf16",
    torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8", torch.uint8: "*u8",
    torch.bool: "*i1",
}  # fmt: skip


def pointwise(x: torch.Tensor, y: torch.Tensor, h: torch.Tensor, i: torch.Tensor) -> Any:
    a = aten.gelu.default(aten.add.Tensor(x, y))
    b = aten.tanh.default(aten.erfinv.default(aten.mul.Tensor(aten.sigmoid.default(x), 0.5)))
    c = aten.remainder.Tensor(aten.floor_divide.default(x, y), y)
    d = aten.nextafter.default(h, aten.neg.default(h))
    e = aten.pow.Tensor_Tensor(i, aten.remainder.Scalar(i, 3))
    f = aten.where.self(aten.isnan.default(x), aten.log1p.default(aten.abs.default(y)), aten.round.default(x))
    g = aten.bitwise_xor.Tensor(aten.bitwise_left_shift.Tensor(i, aten.abs.default(e)), aten.sign.default(i))
    return a, b, c, d, e, f, g, aten.cat.default([x, y], 1), aten.constant_pad_nd.default(h, [1, 2], 0)


def transpose(x: torch.Tensor) -> Any:
    return aten.clone.default(aten.permute.default(x, [1, 0]), memory_format=torch.contiguous_format)


def reductions(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, h: torch.Tensor) -> Any:
    return (
        aten._softmax.default(x, 1, False),
        aten.native_layer_norm.default(x, [x.shape[1]], w, b, 1e-5)[0],
        aten.argmax.default(x, 1),
        aten.argmin.default(h, 1),
        aten.prod.dim_int(x, 1),
        aten.any.dim(aten.gt.Scalar(x, 1.0), 1),
        aten.amax.default(aten.gt.Scalar(x, 1.0), [1]),
        aten.sum.dim_IntList(h, [1]),
        aten.sum.dim_IntList(x, [0]),
        aten.sum.default(x),
    )


def memory(
    x: torch.Tensor, idx: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor, tok: torch.Tensor
) -> Any:
    g = aten.index.Tensor(x, [idx])
    acc = aten.index_put.default(x, [rows], vals, True)
    e = aten.sum.dim_IntList(aten.embedding.default(x, tok), [2])
    # Note [16-bit atomic adds]: float16's tl.atomic_add, bfloat16's compare-and-swap loop
    half = [
        aten.index_put.default(
            aten._to_copy.default(x, dtype=d), [rows], aten._to_copy.default(vals, dtype=d), True
        )
        for d in (torch.float16, torch.bfloat16)
    ]
    return g, acc, e, *half


def relu(x: torch.Tensor) -> Any:
    return aten.relu.default(x)


def cases() -> list[tuple[str, Any, list[Any], dict[str, Any]]]:
    x, y = torch.randn(64, 48), torch.randn(64, 48).abs() + 0.5
    h, i = torch.randn(64, 48, dtype=torch.bfloat16), torch.randint(-5, 5, (64, 48))
    w, b = torch.randn(48), torch.randn(48)
    idx, rows = torch.tensor([1, 5, -1]), torch.tensor([0, 3, 0])
    vals, tok = torch.randn(3, 48), torch.randint(0, 64, (4, 6))
    big = torch.randn(5000, 8)
    split = {"split_min_rnumel": 256, "split_target_programs": 64}
    return [
        ("pointwise", pointwise, [x, y, h, i], {}),
        ("transpose", transpose, [torch.randn(96, 80)], {}),
        ("reductions persistent", reductions, [x, w, b, h], {}),
        ("reductions looped", reductions, [x, w, b, h], {"max_persistent_rblock": 16}),
        (
            "split reductions",
            lambda t: (aten.sum.dim_IntList(t, [0]), aten.amax.default(t, [0, 1])),
            [big],
            split,
        ),
        (
            # Note [Bytes per program]: bfloat16 rows of 768, and a column sum split into partials
            "bf16 rows of 768",
            lambda t, tw, tb: (
                aten._softmax.default(t, 1, False),
                aten.native_layer_norm.default(t, [768], tw, tb, 1e-5)[0],
                aten.sum.dim_IntList(t, [0]),
            ),
            [torch.randn(4096, 768, dtype=torch.bfloat16), *torch.randn(2, 768, dtype=torch.bfloat16)],
            {},
        ),
        ("memory debug", memory, [x, idx, rows, vals, tok], {"debug": True}),
        (
            # Note [Negative zero constants]: the -0.0 must reach the binary (Triton 3.6 made the
            # negated +0.0 of the old spelling a +0.0: checked in main on the PTX)
            "negative zero",
            lambda t, d: (aten.mul.Tensor(aten.mul.Tensor(t, 0.0), -0.0), aten.mul.Tensor(d, -0.0)),
            [x, x.double()],
            {},
        ),
        (
            "int64 indexing",
            relu,
            [torch.empty_strided((2**31,), (1,), device="meta")],
            {},
        ),
    ]


PTX_PARAM = re.compile(r"\.param\s+\.(\w+)\b[^,)]*_param_(\d+)")


def check_native_plan(binary: Any, spec: Any) -> None:
    """Note [Native launches]: the plan runtime.py writes for the kernel must be the binary's
    parameter list, as the PTX declares it: as many parameters, each of the plan's size (on a
    GPU, ``cuFuncGetParamInfo`` checks the same before a launch object is built)."""
    plan = native_plan(binary, [f"p_{n}" for n in spec.params], spec.size_params)
    assert plan is not None, f"{spec.name}: no native plan"
    declared = [(int(i), t) for t, i in PTX_PARAM.findall(binary.asm["ptx"])]
    assert [i for i, _ in declared] == list(range(len(declared))), declared
    sizes = [int(t[1:]) // 8 for _, t in declared]
    want = [4 if kind in "ifk" else 8 for kind, _ in plan]
    assert sizes == want, f"{spec.name}: PTX parameters {declared}, plan {plan}"


def symbolic_case() -> tuple[str, Any, list[Any], dict[str, Any]]:
    """A graph of symbolic sizes (traced on meta tensors): its kernels take the sizes after their
    pointers (Note [Symbolic sizes in Triton kernels])."""
    from kiln_symbolic import DimDynamic, ShapeEnv, make_symint

    from kiln_loopir.testing import with_vals

    env = ShapeEnv()
    n = make_symint(env, env.create_symbol(3000, "x0", DimDynamic.DYNAMIC), 3000)

    def f(x: Any, y: Any) -> Any:
        return aten.sum.default(x), aten.amax.default(y, [0]), aten.gelu.default(y)

    meta = [torch.empty(n, 33, device="meta"), torch.empty(n, 130, device="meta")]
    return "symbolic sizes", with_vals(f, *meta), meta, {}


def main() -> int:
    target = GPUTarget("cuda", 90, 32)
    failures = 0
    for label, fn, inputs, options in [*cases(), symbolic_case()]:
        gm = fn if isinstance(fn, torch.fx.GraphModule) else torch.fx.symbolic_trace(fn)
        backend = TritonBackend(**options)
        compile_graph(gm, inputs, backend=backend)
        assert backend.last_declined == [], backend.last_declined
        for spec in backend.last_specs:
            # the heuristic choice; for one case also the default mode's autotune candidates
            # (heuristics._small: the same kernels at other block sizes, compiled only there to
            # keep this under a minute or two)
            candidates = configs(spec, autotune="small") if label == "bf16 rows of 768" else configs(spec)[:1]
            for config in candidates:
                blocks = {k: v for k, v in config.kwargs(spec.kind).items() if k.endswith("BLOCK")}
                signature = {f"p_{p}": TYPES[d] for p, d in zip(spec.params, spec.param_dtypes, strict=True)}
                # Note [Symbolic sizes in Triton kernels]: what warmup's GENERIC_SIZE / 0.5 specialize to
                floats = {name for name, _ in spec.float_params}
                signature.update({p: "fp32" if p in floats else "i64" for p in spec.size_params})
                signature.update(dict.fromkeys(blocks, "constexpr"))
                fn_ = backend.last_launchers[spec.name].fn
                try:
                    source = triton.compiler.ASTSource(fn=fn_, signature=signature, constexprs=blocks)
                    binary = triton.compile(source, target=target, options={"num_warps": config.num_warps})
                    check_native_plan(binary, spec)
                    if label == "negative zero":
                        ptx = binary.asm["ptx"]
                        assert "0f80000000" in ptx or "0d8000000000000000" in ptx, ptx
                    print(f"ok    {label}: {spec.name} {config} ({spec.kind})")
                except Exception:
                    failures += 1
                    print(
                        f"FAIL  {label}: {spec.name} {config} ({spec.kind})\n{spec.source}\n{traceback.format_exc()}"
                    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
