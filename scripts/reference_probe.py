"""Which answer is right when kiln and eager disagree: each run in a process of its own (a CUDA
error such as a misaligned address poisons the process that meets it), against eager in float32
under the math attention backend, the reference none of the bf16 runs share.

    python scripts/reference_probe.py --model deepseek_v3 --device cuda --dtype bfloat16

Runs (each a subprocess): eager in --dtype with the default SDPA choice, then with each SDPA
backend forced (flash, efficient, cudnn, math); kiln in --dtype; eager in float32 (math). Each
prints whether it ran, its largest difference from the float32 reference and how many elements
differ by more than 0.05. `--sdpa-only` skips the models and probes one synthetic SDPA call whose
v is a view at an 8-byte offset, as deepseek_v3's multi-head latent attention passes it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parents[1] / "packages" / "dynamo" / "bench"
BACKENDS = ("default", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def _sdpa_context(backend: str) -> Any:
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    return contextlib.nullcontext() if backend == "default" else sdpa_kernel([getattr(SDPBackend, backend)])


def _one_model(model_name: str, device: str, dtype: str, backend: str, use_kiln: bool, out: str) -> None:
    sys.path.insert(0, str(BENCH))
    from breadth_models import MODELS, first_tensor  # type: ignore[import-not-found]

    dt = getattr(torch, dtype)
    model, inputs, _ = MODELS[model_name]()
    model = model.to(device).to(dt).eval()
    inputs = {
        k: (v.to(device).to(dt) if v.is_floating_point() else v.to(device))
        if isinstance(v, torch.Tensor)
        else v
        for k, v in inputs.items()
    }
    if use_kiln:
        import kiln

        model = kiln.compile(model)
    with torch.no_grad(), _sdpa_context(backend):
        model(**inputs)
        got = first_tensor(model(**inputs))
    if device == "cuda":
        torch.cuda.synchronize()
    torch.save(got.float().cpu(), out)


def _one_sdpa(device: str, backend: str, dense: bool, out: str) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, 8, generator=g).to(device, torch.bfloat16)
    k = torch.randn(2, 4, 8, 8, generator=g).to(device, torch.bfloat16)
    kv = torch.randn(2, 8, 4, 12, generator=g).to(device, torch.bfloat16)
    v = kv[..., 4:].transpose(1, 2)  # (2, 4, 8, 8), strides (384, 12, 48, 1), offset 4 elements
    if dense:
        v = v.contiguous()
    with torch.no_grad(), _sdpa_context(backend):
        got = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=8**-0.5)
    if device == "cuda":
        torch.cuda.synchronize()
    torch.save(got.float().cpu(), out)


def _spawn(argv: list[str], out: str) -> tuple[str, torch.Tensor | None]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(
        [sys.executable, __file__, *argv, "--child-out", out],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if r.returncode != 0 or not os.path.exists(out):
        lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip() and "Warning" not in ln]
        return f"FAILED ({lines[-1][:150] if lines else r.returncode})", None
    return "ran", torch.load(out)


def _report(label: str, status: str, got: torch.Tensor | None, ref: torch.Tensor | None) -> None:
    if got is None or ref is None:
        print(f"{label:38s} {status}")
        return
    d = (got - ref).abs()
    print(
        f"{label:38s} max |diff| vs fp32 math {d.max().item():.4g}, {int((d > 0.05).sum())} of {d.numel()} over 0.05"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="deepseek_v3")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--sdpa-only", action="store_true")
    p.add_argument("--child", choices=("model", "kiln", "sdpa", "sdpa-dense"))
    p.add_argument("--backend", default="default")
    p.add_argument("--child-out")
    a = p.parse_args()
    if a.child:
        if a.child in ("model", "kiln"):
            _one_model(a.model, a.device, a.dtype, a.backend, a.child == "kiln", a.child_out)
        else:
            _one_sdpa(a.device, a.backend, a.child == "sdpa-dense", a.child_out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = ["--device", a.device]
        _, ref = _spawn([*base, "--child", "sdpa", "--backend", "MATH"], f"{tmp}/sdpa-ref")
        _, dense_ref = _spawn([*base, "--child", "sdpa-dense", "--backend", "MATH"], f"{tmp}/sdpa-dref")
        print(
            f"synthetic SDPA (bf16, v at an 8-byte offset); dense and offset math agree: "
            f"{ref is not None and dense_ref is not None and torch.equal(ref, dense_ref)}"
        )
        for dense in (False, True):
            for backend in BACKENDS:
                kind = "sdpa-dense" if dense else "sdpa"
                status, got = _spawn(
                    [*base, "--child", kind, "--backend", backend], f"{tmp}/{kind}-{backend}"
                )
                _report(f"  {'dense v' if dense else 'offset v'} {backend}", status, got, dense_ref)
        if a.sdpa_only:
            return
        m = ["--model", a.model, *base]
        status, ref = _spawn(
            [*m, "--dtype", "float32", "--child", "model", "--backend", "MATH"], f"{tmp}/fp32"
        )
        print(f"{a.model}: eager float32 (math) {status}")
        for backend in BACKENDS:
            status, got = _spawn(
                [*m, "--dtype", a.dtype, "--child", "model", "--backend", backend], f"{tmp}/e-{backend}"
            )
            _report(f"  eager {a.dtype} {backend}", status, got, ref)
        status, got = _spawn([*m, "--dtype", a.dtype, "--child", "kiln"], f"{tmp}/kiln")
        _report(f"  kiln {a.dtype}", status, got, ref)
        status, got = _spawn([*m, "--dtype", "float32", "--child", "kiln"], f"{tmp}/kiln32")
        _report("  kiln float32", status, got, ref)


if __name__ == "__main__":
    main()
