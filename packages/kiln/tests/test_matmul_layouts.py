"""The matrix products of compiled training steps have eager's operands (issue 20).

MKL's GEMM takes a transposed operand as a flag, but a non-contiguous one, a padded one, or a
weight gradient computed as ``mm(a.t(), b)`` where eager's autograd computes ``mm(b.t(), a).t()``
(the gradient laid out as the weight is: Conv1D's ``[in, out]``, nn.Linear's ``[out, in]``) runs
another path at another cost. So every ``mm``/``addmm``/``bmm`` a kiln training step hands to
aten (its out-variants folded into the functional op; addmm's bias left out, since kiln may add
it in the kernel after the product: Note [Bias after the GEMM] in kiln_loopir) must have the
operand shapes and strides of one eager runs, as many times, in a block of each weight layout the
public suite trains: GPT-2's Conv1D projections with a tied LM head, LLaMA's bias-free linears,
BERT's biased ones, and attention through batched products. ``scripts/matmul_ab.py`` checks the
same on the suite's models and times the products in context.
"""

from __future__ import annotations

import collections
import copy
import math
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kiln

PRODUCTS = ("mm", "addmm", "bmm", "baddbmm")
Key = tuple[str, tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    kiln.reset()
    yield
    kiln.reset()


class _Products(TorchDispatchMode):
    """The products run under it, by (op, operand shapes, operand strides)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[Key] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        op = func.overloadpacket.__name__
        if op in PRODUCTS:
            ts = [a for a in args if isinstance(a, torch.Tensor)]
            first = 1 if op in ("addmm", "baddbmm") else 0
            operands = ts[first : first + 2]
            product = "bmm" if "bmm" in op else "mm"  # kiln may add a bias after the GEMM
            self.seen[
                (product, tuple(tuple(t.shape) for t in operands), tuple(t.stride() for t in operands))
            ] += 1
        return func(*args, **(kwargs or {}))


class _Conv1D(nn.Module):
    """GPT-2's projection: ``addmm(bias, x, W)`` with ``W`` stored ``[in, out]``."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.05)
        self.bias = nn.Parameter(torch.randn(n_out) * 0.05)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class _Gpt2Like(nn.Module):
    def __init__(self, vocab: int = 96, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, dim)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.c_proj = _Conv1D(dim, 3 * dim), _Conv1D(dim, dim)
        self.c_fc, self.c_out = _Conv1D(dim, 4 * dim), _Conv1D(4 * dim, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        h = self.wte(ids)
        q, k, v = self.c_attn(self.ln1(h)).split(h.shape[-1], dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.c_proj(a.transpose(1, 2).reshape(b, t, -1))
        h = h + self.c_out(F.gelu(self.c_fc(self.ln2(h)), approximate="tanh"))
        return F.linear(self.ln_f(h), self.wte.weight)  # the tied LM head


class _LinearBlock(nn.Module):
    """nn.Linear's ``[out, in]`` weights, with or without biases (LLaMA's gated MLP, BERT's), and
    attention as explicit batched products (T5's math path)."""

    def __init__(self, bias: bool, dim: int = 32, hidden: int = 86) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=bias) for _ in range(4))
        self.gate, self.up = nn.Linear(dim, hidden, bias=bias), nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        x = x + self.o(torch.bmm(scores.softmax(-1), v))
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


def _step(fn: nn.Module, model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    for p in model.parameters():
        p.grad = None
    out = fn(x)
    out.square().mean().backward()
    return [out.detach()] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize(
    ("name", "build", "make_input"),
    [
        ("gpt2", _Gpt2Like, lambda: torch.randint(0, 96, (2, 16))),
        ("linear", lambda: _LinearBlock(bias=False), lambda: torch.randn(2, 16, 32)),
        ("linear_bias", lambda: _LinearBlock(bias=True), lambda: torch.randn(2, 16, 32)),
    ],
)
def test_a_training_steps_products_have_eagers_operands(name, build, make_input) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = build().train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"strict": True})
    x = make_input()
    _step(compiled, model, x)  # compiles the forward and the backward
    kiln_products, eager_products = _Products(), _Products()
    with kiln_products:
        got = _step(compiled, model, x)
    with eager_products:
        want = _step(reference, reference, x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert sum(eager_products.seen.values()) > 0
    only_eager = eager_products.seen - kiln_products.seen
    only_kiln = kiln_products.seen - eager_products.seen
    assert not only_eager and not only_kiln, (name, dict(only_eager), dict(only_kiln))
