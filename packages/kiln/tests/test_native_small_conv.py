"""Note [Small convolutions outside oneDNN] (kiln_loopir's passes/native_conv.py), end to end: a CPU
training step of a network with small convolutions (a patch embedding, a strided one read
through a permuted layout, one without bias, a spatial reduction to one position) runs them and
their backwards through PyTorch's native kernels, with eager's outputs and gradients; a depthwise
and a large convolution stay on oneDNN; ``native_small_conv=False`` keeps all on oneDNN."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import kiln

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    kiln.reset()
    yield
    kiln.reset()


class _Counting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[Any] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))


class _SmallConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 7, stride=4, padding=3)  # 32 px -> 8 px
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)  # -> 4 px
        self.reduce = nn.Conv2d(16, 16, 4, stride=4)  # -> 1 px
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)  # depthwise: oneDNN
        self.big = nn.Conv2d(64, 64, 3, padding=1)  # 64 x 64 x 9 x 16 x 16 x 2 multiply-adds: oneDNN
        self.head = nn.Linear(16 + 64, 4)

    def forward(self, x: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
        y = self.embed(x)
        b, c, h, w = y.shape
        tokens = y.flatten(2).transpose(1, 2) * 2.0  # [B, HW, C]
        y = tokens.transpose(1, 2).reshape(b, c, h, w)  # channels-last strides, as PVT's
        y = torch.relu(self.down(y))
        pooled = self.reduce(y).flatten(1) + self.dw(y).mean(dim=(2, 3))
        return self.head(torch.cat([pooled, self.big(wide).mean(dim=(2, 3))], dim=1))


@pytest.mark.parametrize("on", [True, False])
def test_small_convolutions_train_natively_with_eagers_gradients(on: bool) -> None:
    torch.manual_seed(0)
    model = _SmallConvs().train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"cpu_backend": "cpp", "native_small_conv": on, "strict": True})
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, wide = torch.randn(2, 3, 32, 32, generator=g), torch.randn(2, 64, 16, 16, generator=g)
        for p in [*model.parameters(), *reference.parameters()]:
            p.grad = None
        counting = _Counting()
        with counting:
            got = compiled(x, wide)
            (got * torch.arange(4.0)).sum().backward()
        want = reference(x, wide)
        (want * torch.arange(4.0)).sum().backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=f"{name} step {step}")
        if step == 0:
            continue  # the first call compiles (and runs fake tensors through the mode)
        ops = counting.ops
        if on:
            assert ops[aten._slow_conv2d_forward.default] == 3, ops
            assert ops[aten._slow_conv2d_backward.output_mask] == 3, ops
        else:
            assert (
                not ops[aten._slow_conv2d_forward.default] and not ops[aten._slow_conv2d_backward.output_mask]
            )
        assert ops[aten.convolution.default] == (2 if on else 5), ops  # the depthwise and the big one
        assert ops[aten.convolution_backward.default] == (2 if on else 5), ops


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stride": 2, "padding": "valid"},
        {"stride": 1, "padding": "same"},
        {"stride": (2, 1), "padding": (1, 0)},
    ],
)
def test_small_convolutions_take_one_number_for_both_dims(kwargs: dict[str, Any]) -> None:
    """`padding="valid"` reaches ``aten.convolution`` as the one-number list ``[0]``, which the
    native kernels refuse ("2D padding expected"; the OpInfo conv2d samples fell back at run
    time): their stride and padding are handed over as pairs."""

    def step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, w, b, **kwargs)

    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g, requires_grad=True) for s in [(2, 4, 5, 5), (3, 4, 3, 3), (3,)])
    compiled = kiln.compile(step, options={"cpu_backend": "cpp", "native_small_conv": True, "strict": True})
    counting = _Counting()
    with counting:
        got = compiled(x, w, b)
    got.sum().backward()
    grads = [t.grad for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    want = step(x, w, b)
    want.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for got_grad, t in zip(grads, (x, w, b), strict=True):
        torch.testing.assert_close(got_grad, t.grad, rtol=1e-4, atol=1e-5)
    assert counting.ops[aten._slow_conv2d_forward.default] == 1, counting.ops
