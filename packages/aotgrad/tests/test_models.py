"""Outputs, gradients and state equal eager for modules and functions (one helper: check)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from aot_helpers import check
from torch import nn

torch.manual_seed(0)


def rnd(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class ManualAttention(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2, causal: bool = False, sdpa: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.h = heads
        self.causal = causal
        self.sdpa = sdpa

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.h, d // self.h).transpose(1, 2) for y in (q, k, v))
        if self.sdpa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            s = q @ k.transpose(-2, -1) / math.sqrt(d // self.h)
            if self.causal:
                mask = torch.ones(t, t, dtype=torch.bool).tril()
                s = s.masked_fill(~mask, float("-inf"))
            o = s.softmax(-1) @ v
        return self.proj(o.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = ManualAttention(d, causal=True, sdpa=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class ResBlock(nn.Module):
    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(x + self.b2(self.c2(y)))


class ResMLP(nn.Module):
    def __init__(self, d: int = 12) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.fc2 = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.silu(self.fc1(x)))


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3)
        self.c2 = nn.Conv2d(4, 8, 3)
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.avg_pool2d(torch.tanh(self.c2(x)), 2)
        return self.fc(x.flatten(1))


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.fc = nn.Linear(8, 5)

    def forward(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.fc(self.emb(idx).mean(1)), labels)


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.ln = nn.LayerNorm(6)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.ln(self.emb(idx)) @ self.emb.weight.t()


class DropMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(10, 32)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(F.relu(self.fc1(x))))


class LSTMCellByHand(nn.Module):
    def __init__(self, d: int = 6, h: int = 5) -> None:
        super().__init__()
        self.w = nn.Linear(d + h, 4 * h)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i, f, g, o = self.w(torch.cat([x, h], -1)).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


def _inplace_intermediate(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y += 1
    y.mul_(x)
    return y.relu_()


def _inplace_input(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * w


def _copy_into_input(buf: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    buf.copy_(w.detach() * 3)
    return buf.sum() * w


def _view_of_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.view(-1), x[1:].t()


def _views_of_output(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y = x * 2
    return y, y[0], y.t()


def _mutate_through_view(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[0].mul_(2)
    y[:, 1] += 5
    y.t()[2].zero_()
    return y


def _mutate_view_of_input(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x[:, 0].add_(1)
    x.t()[1].mul_(3)
    return (x * w).sum(0)


def _alias_after_mutation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x * 3
    v = y[1]
    y.mul_(2)
    return v * 1, y


def _softmaxes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.softmax(-1), x.log_softmax(0)


def _non_diff_outputs(x: torch.Tensor, unused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    return x.argmax(-1), x.sin(), 3


def _mixed_grad(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return (x * c).cos() + c


def _where_masked(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x * 2, x.exp()).masked_fill(x < -1, 0.5)


def _cat_stack_split(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a, b = torch.cat([x, y], 0).split([3, 5], 0)
    return torch.stack([a.sum(0), b.mean(0)])


def _reductions(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.var(0), x.std(-1), x.amax(1), x.norm(dim=0), x.logsumexp(-1)


def _bmm_broadcast(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b).tanh()


def _gather_index(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return x.gather(1, idx) + x[idx[:, 0]].sum(1, keepdim=True)


def _pointwise_zoo(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x) + torch.sigmoid(x) * F.softplus(x) - F.elu(x) + F.leaky_relu(x).abs().sqrt()


def _mse_and_l1(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(x, y) + F.smooth_l1_loss(x, y)


def _bn_functional_running(
    x: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    return F.batch_norm(x, rm, rv, w, None, training=True, momentum=0.2)


CASES: dict[str, Callable[[], tuple[Any, ...]]] = {
    "mlp": lambda: (nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), rnd(5, 8)),
    "mlp_gelu_ln": lambda: (
        nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)),
        rnd(6, 8),
    ),
    "conv_bn_train": lambda: (ConvBN().train(), rnd(2, 3, 6, 6)),
    "conv_bn_eval": lambda: (ConvBN().eval(), rnd(2, 3, 6, 6)),
    "batchnorm1d_train": lambda: (nn.BatchNorm1d(5), rnd(7, 5)),
    "layernorm": lambda: (nn.LayerNorm(10), rnd(3, 4, 10)),
    "groupnorm": lambda: (nn.GroupNorm(2, 4), rnd(2, 4, 3, 3)),
    "rmsnorm": lambda: (RMSNorm(10), rnd(4, 10)),
    "attention_manual": lambda: (ManualAttention(causal=True), rnd(2, 5, 16)),
    "attention_sdpa": lambda: (ManualAttention(sdpa=True), rnd(2, 5, 16)),
    "transformer_block": lambda: (Block(), rnd(2, 5, 16)),
    "multihead_attention": lambda: (
        nn.MultiheadAttention(8, 2, batch_first=True),
        rnd(2, 3, 8),
        rnd(2, 3, 8),
        rnd(2, 3, 8),
    ),
    "embedding_cross_entropy": lambda: (
        Classifier(),
        torch.randint(0, 20, (4, 3)),
        torch.randint(0, 5, (4,)),
    ),
    "tied_weights": lambda: (TiedLM(), torch.randint(0, 11, (2, 3))),
    "dropout_train": lambda: (DropMLP().train(), rnd(8, 10)),
    "dropout_eval": lambda: (DropMLP().eval(), rnd(8, 10)),
    "resblock_conv": lambda: (ResBlock(), rnd(2, 4, 5, 5)),
    "resblock_mlp": lambda: (ResMLP(), rnd(3, 12)),
    "convnet": lambda: (SmallConvNet(), rnd(2, 1, 14, 14)),
    "lstm_cell": lambda: (LSTMCellByHand(), rnd(3, 6), rnd(3, 5), rnd(3, 5)),
    "inplace_intermediate": lambda: (_inplace_intermediate, rnd(4, 5)),
    "inplace_input": lambda: (_inplace_input, rnd(3, 3, grad=False), rnd(3, 3)),
    "copy_into_input": lambda: (_copy_into_input, torch.zeros(4), rnd(4)),
    "views_of_input": lambda: (_view_of_input, rnd(3, 4)),
    "views_of_output": lambda: (_views_of_output, rnd(3, 4)),
    "mutate_through_view": lambda: (_mutate_through_view, rnd(4, 4)),
    "mutate_view_of_input": lambda: (_mutate_view_of_input, rnd(3, 3, grad=False), rnd(3, 3)),
    "alias_after_mutation": lambda: (_alias_after_mutation, rnd(3, 4)),
    "softmaxes": lambda: (_softmaxes, rnd(4, 6)),
    "non_diff_outputs": lambda: (_non_diff_outputs, rnd(3, 4), rnd(2)),
    "mixed_requires_grad": lambda: (_mixed_grad, rnd(3, 4), rnd(3, 4, grad=False)),
    "where_masked_fill": lambda: (_where_masked, rnd(5, 5)),
    "cat_stack_split": lambda: (_cat_stack_split, rnd(4, 3), rnd(4, 3)),
    "reductions": lambda: (_reductions, rnd(4, 6)),
    "bmm_broadcast": lambda: (_bmm_broadcast, rnd(2, 3, 4, 5), rnd(5, 6)),
    "gather_index": lambda: (_gather_index, rnd(4, 5), torch.randint(0, 4, (4, 2))),
    "pointwise_zoo": lambda: (_pointwise_zoo, rnd(6, 6)),
    "losses": lambda: (_mse_and_l1, rnd(4, 3), torch.randn(4, 3)),
    "bn_functional_running_stats": lambda: (
        _bn_functional_running,
        rnd(6, 3),
        torch.zeros(3),
        torch.ones(3),
        rnd(3),
    ),
}


@pytest.mark.parametrize("partition", ["min_cut", "default"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name: str, partition: str) -> None:
    target, *args = CASES[name]()
    check(target, *args, partition=partition)


@pytest.mark.parametrize(
    "name", ["mlp_gelu_ln", "conv_bn_eval", "transformer_block", "inplace_input", "views_of_input"]
)
def test_inference_matches_eager(name: str) -> None:
    target, *args = CASES[name]()
    res = check(target, *args, no_grad=True)
    assert len(res.recorder.graphs) == 1  # one functional graph, no backward
