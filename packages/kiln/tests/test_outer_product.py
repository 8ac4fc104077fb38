"""Note [Outer products are multiplications] (kiln_loopir's passes/outer_product.py), end to end:
attention over a single pooled key (PVT v2's spatial-reduction attention in its deep stages)
trains with eager's values and gradients, float32 and bfloat16, the forward's and the backward's
products of reduction length one made multiplications; ``outer_product=False`` keeps the GEMMs."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import kiln


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    kiln.reset()
    yield
    kiln.reset()


class _OneKeyAttention(nn.Module):
    """Queries of every position against one key pooled from the whole sequence."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.mean(dim=1, keepdim=True)  # [B, 1, D]
        q, k, v = self.q(x), self.k(pooled), self.v(pooled)
        scores = torch.matmul(q, k.transpose(1, 2)) / 8**0.5  # [B, S, 1]
        probs = scores.softmax(dim=-1)
        return self.out(torch.matmul(probs, v)) + x  # [B, S, 1] @ [B, 1, D]: an outer product


def _records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "outer_product" in r.getMessage()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("on", [True, False])
def test_one_key_attention_trains_with_eagers_gradients(
    dtype: torch.dtype, on: bool, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = _OneKeyAttention().to(dtype)
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"outer_product": on})
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"):
        for step in range(2):
            x = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(step)).to(dtype)
            got, want = compiled(x), reference(x)
            assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
            torch.testing.assert_close(got, want, **tol)
            got.float().square().sum().backward()
            want.float().square().sum().backward()
            for p, r in zip(model.parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(p.grad, r.grad, **tol)
    lines = _records(caplog)
    if on:
        # the forward's probs @ v, and the backward's gradient of q @ k^T's q side (grad @ k)
        assert sum("reduction length 1" in line for line in lines) >= 2, lines
    else:
        assert lines and all("off (option outer_product=False)" in line for line in lines)
