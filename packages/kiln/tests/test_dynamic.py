"""kiln.compile(dynamic=...) end to end on the CPU: every result equals eager's, and the
number of compiles follows torch.compile's contract."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln
import kiln_dynamo


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)).eval()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_batch_sizes_2_to_64(backend: str) -> None:
    model = _mlp()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for b in [2, 3, 4, 8, 17, 64]:
            x = torch.randn(b, 8)
            torch.testing.assert_close(compiled(x), model(x))
    graphs = kiln_dynamo.counters.graphs
    if backend == "eager":
        assert graphs == 2  # static, then one dynamic graph for every later size
    else:
        # the aot backends refuse symbolic sizes (not built yet): static per size, and said so
        assert graphs == 6 + 1  # one refused dynamic capture, then one static graph per size
        assert kiln_dynamo.counters.dynamic_fallbacks
        assert "does not compile symbolic sizes" in kiln_dynamo.counters.dynamic_fallbacks[0][1]


def test_dynamic_true_and_mark_dynamic_are_accepted() -> None:
    model = _mlp()
    compiled = kiln.compile(model, backend="eager", dynamic=True)
    with torch.no_grad():
        for b in [3, 5, 9]:
            x = torch.randn(b, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert kiln_dynamo.counters.graphs == 1
    kiln.reset()
    x = torch.randn(6, 8)
    kiln.mark_dynamic(x, 0, min=2, max=32)
    compiled = kiln.compile(model, backend="eager", dynamic=False)  # an explicit mark still counts
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        y = torch.randn(20, 8)
        torch.testing.assert_close(compiled(y), model(y))
    assert kiln_dynamo.counters.graphs == 1
