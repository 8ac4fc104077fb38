"""The partitioners: a min-cut checked by hand, min-cut vs default, what may be recomputed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from aot_helpers import check
from torch import nn

from kiln_aotgrad import Partition
from kiln_aotgrad.partition import recomputable


def _partition_of(res: object) -> Partition:
    compiled = res.compiled  # type: ignore[attr-defined]
    (art,) = compiled.compiled.values()
    assert art.partition is not None
    return art.partition


def _crafted(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x @ w  # matmul: never recomputed
    y = h.sin().exp()  # pointwise: recomputable from h
    return (y * y).sum()


def test_min_cut_saves_the_hand_computed_bytes() -> None:
    # The backward needs x (for dw = x^T dh), w (for dx = dh w^T) and the pointwise chain
    # sin -> exp -> square, all of which come back from h. The cheapest cut saves x, w and h:
    # 64*32*4 + 32*16*4 + 64*16*4 = 8192 + 2048 + 4096 = 14336 bytes.
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(32, 16, requires_grad=True)
    p = _partition_of(check(_crafted, x, w, partition="min_cut"))
    assert p.saved_bytes == 14336
    # Default saves what the backward reads: x^T, w^T, cos(h) and exp(sin(h)), plus no recompute.
    d = _partition_of(check(_crafted, x, w, partition="default"))
    assert d.saved_bytes == 8192 + 2048 + 4096 + 4096
    assert d.recomputed == []
    assert p.recomputed  # sin/exp/cos are recomputed in the backward


def test_min_cut_saves_fewer_bytes_than_default_on_linear_gelu_layernorm_linear() -> None:
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 32))
    x = torch.randn(256, 32, requires_grad=True)
    mc = _partition_of(check(model, x, partition="min_cut"))  # gradients equal eager
    df = _partition_of(check(model, x, partition="default"))
    assert mc.saved_bytes < df.saved_bytes, (mc.saved_bytes, df.saved_bytes)
    assert mc.activation_bytes <= 0.7 * df.activation_bytes, (mc.activation_bytes, df.activation_bytes)


def test_random_and_matmul_are_never_recomputed() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.dropout((x @ w).relu(), 0.5, training=True).sum(0)

    x = torch.randn(8, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    p = _partition_of(check(f, x, w, seed=3))
    by_name = {n.name: n for n in p.bw.graph.nodes}
    recomputed = {str(by_name[name].target) for name in p.recomputed}
    assert recomputed, "relu is cheap: expected some recompute"
    assert not any("bernoulli" in t or "mm" in t for t in recomputed), recomputed
    for n in p.fw.graph.nodes:
        if n.op == "call_function" and "bernoulli" in str(n.target):
            assert not recomputable(n)


def test_dropout_gradients_match_eager_for_the_same_seed() -> None:
    # Note [RNG in compiled graphs]: same random calls in the same order -> same mask.
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 4)).train()
    for seed in (0, 1, 2):
        check(model, torch.randn(32, 16, requires_grad=True), seed=seed)
