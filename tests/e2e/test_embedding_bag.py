"""A small recommendation model (EmbeddingBag + MLP) through kiln.compile on the CPU, against eager.

Issue 19: `EmbeddingBag(mode="sum")` with offsets crashed at its first call, because the fake
tensors' meta kernel described the CUDA kernel's auxiliary outputs (Note [Meta kernels that ask
the device] in kiln_aotgrad/tracer.py). Every mode, with and without offsets and per-sample
weights, in eval and in train (forward, gradients, an optimizer step), in strict mode so that a
fallback to eager would fail the test.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import kiln


class Recommender(nn.Module):
    def __init__(self, mode: str, rows: int = 500, dim: int = 16) -> None:
        super().__init__()
        self.user = nn.EmbeddingBag(rows, dim, mode=mode)
        self.item = nn.EmbeddingBag(rows, dim, mode=mode)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(
        self,
        users: torch.Tensor,
        items: torch.Tensor,
        offsets: torch.Tensor | None,
        weights: torch.Tensor | None,
    ) -> torch.Tensor:
        u = self.user(users, offsets, per_sample_weights=weights)
        v = self.item(items, offsets)
        return self.mlp(torch.cat([u, v], dim=1)).squeeze(1)


def _inputs(with_offsets: bool, with_weights: bool) -> tuple[torch.Tensor | None, ...]:
    g = torch.Generator().manual_seed(0)
    bags, per_bag = 32, 8
    users = torch.randint(0, 500, (bags * per_bag,), generator=g)
    items = torch.randint(0, 500, (bags * per_bag,), generator=g)
    weights = torch.rand(bags * per_bag, generator=g) if with_weights else None
    if with_offsets:
        offsets: torch.Tensor | None = torch.arange(0, bags * per_bag, per_bag)
    else:
        users, items = users.view(bags, per_bag), items.view(bags, per_bag)
        weights = weights.view(bags, per_bag) if weights is not None else None
        offsets = None
    return users, items, offsets, weights


CASES = [
    pytest.param(
        mode, offsets, weights, id=f"{mode}-{'offsets' if offsets else '2d'}{'-psw' if weights else ''}"
    )
    for mode in ("sum", "mean", "max")
    for offsets in (True, False)
    for weights in (False, True)
    if not (weights and mode != "sum")  # per-sample weights are defined for "sum" only
]


@pytest.mark.parametrize(("mode", "with_offsets", "with_weights"), CASES)
def test_recommender_eval(mode: str, with_offsets: bool, with_weights: bool) -> None:
    kiln.reset()
    torch.manual_seed(0)
    model = Recommender(mode).eval()
    args = _inputs(with_offsets, with_weights)
    compiled = kiln.compile(model, options={"strict": True})
    with torch.no_grad():
        for _ in range(2):  # the first call compiles, the second reuses
            torch.testing.assert_close(compiled(*args), model(*args))
    assert kiln.compile_log() and all(r.fell_back is None for r in kiln.compile_log())


@pytest.mark.parametrize(("mode", "with_offsets", "with_weights"), CASES)
def test_recommender_train(mode: str, with_offsets: bool, with_weights: bool) -> None:
    kiln.reset()
    torch.manual_seed(0)
    eager = Recommender(mode).train()
    mine = copy.deepcopy(eager)
    compiled = kiln.compile(mine, options={"strict": True})
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(mine.parameters(), lr=0.1)
    users, items, offsets, weights = _inputs(with_offsets, with_weights)
    target = torch.randn(32)
    for _ in range(2):
        for model, opt in ((eager, opt_e), (compiled, opt_c)):
            opt.zero_grad()
            w = weights.clone().requires_grad_() if weights is not None else None
            loss = nn.functional.mse_loss(model(users, items, offsets, w), target)
            loss.backward()
            opt.step()
            if model is eager:
                loss_e, w_e = loss, w
            else:
                torch.testing.assert_close(loss, loss_e)
                if w is not None:
                    assert w_e is not None
                    torch.testing.assert_close(w.grad, w_e.grad)
        for (name, p_e), p_c in zip(eager.named_parameters(), mine.parameters(), strict=True):
            torch.testing.assert_close(p_c, p_e, msg=f"parameter {name}")
    assert kiln.compile_log() and all(r.fell_back is None for r in kiln.compile_log())
