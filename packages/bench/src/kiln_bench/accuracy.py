"""Is a compiled result right? The accuracy rule of PyTorch's benchmark harness, as MODELS.md gives it.

First `allclose` with atol = rtol = tol, the absolute part scaled by the reference's magnitude (a
random network's logits can be tiny or huge). Where that fails and a float64 eager reference
exists, the compiled result still passes when its RMSE against float64 is within `multiplier` times
eager's own RMSE against float64, plus tol/10: a compiled kernel may round differently from eager,
but not worse than eager is wrong. The multiplier is 2, or 3 for bf16/fp16 and small tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.sqrt(torch.mean((a.double() - b.double()) ** 2)))


def check_tensor(
    name: str, reference: torch.Tensor, result: torch.Tensor, fp64: torch.Tensor | None, tol: float
) -> Verdict:
    if reference.shape != result.shape:
        return Verdict(False, f"{name}: shape {tuple(result.shape)} != eager's {tuple(reference.shape)}")
    if reference.dtype != result.dtype:
        return Verdict(False, f"{name}: dtype {result.dtype} != eager's {reference.dtype}")
    if not reference.is_floating_point():
        same = torch.equal(reference, result)
        return Verdict(same, "" if same else f"{name}: integer values differ")
    ref, res = reference.detach().double().cpu(), result.detach().double().cpu()
    if torch.isnan(ref).any() or torch.isnan(res).any():
        same_nan = torch.equal(torch.isnan(ref), torch.isnan(res))
        if not same_nan:
            return Verdict(False, f"{name}: NaNs where eager has none (or the reverse)")
        ref, res = torch.nan_to_num(ref), torch.nan_to_num(res)
    scale = max(float(ref.abs().max()) if ref.numel() else 0.0, 1e-30)
    if torch.allclose(res, ref, rtol=tol, atol=tol * min(scale, 1.0)):
        return Verdict(True)
    if fp64 is not None:
        multiplier = (
            3.0 if reference.dtype in (torch.float16, torch.bfloat16) or reference.numel() < 1000 else 2.0
        )
        exact = fp64.detach().double().cpu()
        compiled_err, eager_err = _rmse(exact, res), _rmse(exact, ref)
        if compiled_err <= multiplier * eager_err + tol / 10 * min(scale, 1.0):
            return Verdict(True)
        return Verdict(
            False,
            f"{name}: RMSE vs float64 {compiled_err:.3g} > {multiplier} x eager's {eager_err:.3g} + tol/10",
        )
    worst = float((res - ref).abs().max())
    return Verdict(False, f"{name}: max abs difference {worst:.3g} (tol {tol}, magnitude {scale:.3g})")


def check(
    names: Sequence[str],
    reference: Sequence[torch.Tensor],
    result: Sequence[torch.Tensor],
    fp64: Sequence[torch.Tensor] | None,
    tol: float,
) -> Verdict:
    """All tensors must pass; the first failure is the reason."""
    if len(reference) != len(result):
        return Verdict(False, f"{len(result)} outputs, eager has {len(reference)}")
    for i, (name, ref, res) in enumerate(zip(names, reference, result, strict=True)):
        verdict = check_tensor(name, ref, res, fp64[i] if fp64 is not None else None, tol)
        if not verdict.ok:
            return verdict
    return Verdict(True)
