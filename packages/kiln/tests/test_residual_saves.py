"""A residual stream's training step through `kiln.compile` against eager, loss and gradients,
in float32 and bfloat16, with the two rules that keep its sums from being recomputed on and off:
aotgrad's Note [Recomputing from many values] (the partition saves `h_k = h_(k-1) + x_k` instead
of recomputing it in the backward from every projection before it) and loopir's Note [Outputs
read back] (the forward's later layers load a saved sum instead of recomputing it)."""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

import pytest
import torch
from torch import nn

import kiln


class _RMSNorm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class _Decoder(nn.Module):
    """Embedding, then per layer `h = h + proj(norm(h))` and a SwiGLU MLP, then a final norm."""

    def __init__(self, vocab: int = 64, dim: int = 32, layers: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norms = nn.ModuleList(_RMSNorm(dim) for _ in range(2 * layers + 1))
        self.proj = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(layers))
        self.gate = nn.ModuleList(nn.Linear(dim, 48, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(dim, 48, bias=False) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(48, dim, bias=False) for _ in range(layers))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for i in range(len(self.proj)):
            h = h + self.proj[i](self.norms[2 * i](h))
            x = self.norms[2 * i + 1](h)
            h = h + self.down[i](nn.functional.silu(self.gate[i](x)) * self.up[i](x))
        return self.norms[-1](h)


@pytest.fixture(autouse=True)
def _reset() -> Any:
    kiln.reset()
    yield
    kiln.reset()


def _step(dtype: torch.dtype, options: dict[str, Any], caplog: pytest.LogCaptureFixture) -> str:
    """One compiled training step against eager's; the partition's log lines."""
    torch.manual_seed(0)
    model = _Decoder().to(dtype)
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 24))
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-5}
    with caplog.at_level(logging.INFO, logger="kiln.aotgrad.partition"):
        out = kiln.compile(model, options={"strict": True, **options})(ids)
        want = ref(ids)
        out.float().square().mean().backward()
        want.float().square().mean().backward()
    torch.testing.assert_close(out, want, **tol)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad, msg=name, **tol)
    log = kiln.compile_log()
    assert log and not [f for r in log for f in r.op_fallbacks], [r.op_fallbacks for r in log]
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "kiln.aotgrad.partition")


def _written_to_be_saved(text: str) -> int:
    match = re.search(r"(\d+) written only to be saved", text)
    assert match, text
    return int(match.group(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_sums_are_saved_not_recomputed(dtype: torch.dtype, caplog: pytest.LogCaptureFixture) -> None:
    text = _step(dtype, {}, caplog)
    # the sums of the residual stream cross to the backward: the forward writes them for it
    assert "not recomputed (read several values, more than twice their bytes): add" in text, text
    # h_2 = emb + p_0 + d_0, h_4 = h_2 + p_1 + d_1, h_6 = h_4 + p_2 + d_2 (three sources each); h_1,
    # h_3, h_5 read two and stay recomputed
    sums = 3
    assert _written_to_be_saved(text) >= sums * 2 * 24 * 32 * dtype.itemsize, text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recompute_sources_off_recomputes_them(dtype: torch.dtype, caplog: pytest.LogCaptureFixture) -> None:
    text = _step(dtype, {"recompute_sources": False}, caplog)
    assert "not recomputed" not in text, text
    # the projections, written anyway, are saved (and the embedding backward's index mask)
    assert _written_to_be_saved(text) < 2 * 24 * 32 * dtype.itemsize, text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_read_back_off_matches_eager(dtype: torch.dtype, caplog: pytest.LogCaptureFixture) -> None:
    _step(dtype, {"outputs_read_back": False}, caplog)
