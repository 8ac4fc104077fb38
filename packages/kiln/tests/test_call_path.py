"""The per-call path of a compiled model (issue 14): what it skips must not change an answer.

- Note [Inputs the frame guard checks in the C++ wrapper]: a static forward graph's C++ wrapper
  checks only its inputs' storage offsets; the frame's guards check the rest. An input at another
  offset is still conformed, one with other strides recompiles, an in-place update of a parameter
  between calls is seen, and a backward graph (incoming gradients of any strides) is checked in
  full.
- Note [A ModelOutput rebuilt without its methods] (kiln_dynamo): a transformers model's output,
  rebuilt directly from the second call on, is the object eager returns.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
from torch import nn

import kiln


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    yield
    kiln.reset()


def test_input_at_another_storage_offset_is_conformed() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x + y).relu() * 2

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    c = kiln.compile(f)
    torch.testing.assert_close(c(x, y), f(x, y))
    shifted = torch.cat([torch.randn(1, 8), x])[1:]  # the frame guard passes: offsets are not guarded
    assert shifted.storage_offset() == 8
    torch.testing.assert_close(c(shifted, y), f(shifted, y))
    assert kiln.capture_stats().graphs == 1


def test_input_with_other_strides_recompiles() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() + 1

    x = torch.randn(6, 5)
    c = kiln.compile(f)
    torch.testing.assert_close(c(x), f(x))
    t = x.t().contiguous().t()  # same shape, other strides
    torch.testing.assert_close(c(t), f(t))
    assert kiln.capture_stats().graphs == 2


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_symbolic_graphs_check_offsets_and_the_guard_the_rest(cpu_backend: str) -> None:
    """A symbolic forward graph's wrapper checks only storage offsets too (Note [Inputs the frame
    guard checks]): an input at another offset is conformed, one with other strides recompiles,
    a parameter's new tensor of the same layout is read, sizes 2..9 share one graph."""
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    c = kiln.compile(m, dynamic=True, options={"cpu_backend": cpu_backend})
    with torch.no_grad():
        for b in (2, 5, 9):
            x = torch.randn(b, 8)
            torch.testing.assert_close(c(x), m(x))
        shifted = torch.cat([torch.randn(1, 8), torch.randn(6, 8)])[1:]
        assert shifted.storage_offset() == 8
        torch.testing.assert_close(c(shifted), m(shifted))
        assert kiln.capture_stats().graphs == 1
        m[2].bias.data = torch.randn(4)
        torch.testing.assert_close(c(x), m(x))
        t = torch.randn(8, 7).t()  # other strides: the guard sends it to another graph
        torch.testing.assert_close(c(t), m(t))
        assert kiln.capture_stats().graphs == 2


def test_in_place_parameter_update_is_seen() -> None:
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    c = kiln.compile(m)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
        m[0].weight.mul_(2)  # in place: same tensor, new values
        torch.testing.assert_close(c(x), m(x))
        m[2].bias.data = torch.randn(4)  # a new tensor of the same layout behind the parameter
        torch.testing.assert_close(c(x), m(x))
        m[2].weight.data = torch.randn(16, 4).t()  # other strides: the guard recompiles
        torch.testing.assert_close(c(x), m(x))


def test_backward_with_non_contiguous_gradients() -> None:
    w = torch.randn(8, 6, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x @ w).tanh()

    x = torch.randn(5, 8, requires_grad=True)
    grad = torch.randn(6, 5).t()  # a gradient with other strides than the forward's output
    c = kiln.compile(f)
    out = c(x)
    out.backward(grad)
    got = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    f(x).backward(grad)
    torch.testing.assert_close(got[0], x.grad)
    torch.testing.assert_close(got[1], w.grad)


def test_model_output_is_the_object_eager_returns() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DistilBertConfig(
        dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=64, max_position_embeddings=16,
        dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    m = transformers.DistilBertForMaskedLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 8))
    c = kiln.compile(m)
    with torch.no_grad():
        expected = m(input_ids=ids)
        for _ in range(3):  # the first call builds it through the class, later ones directly
            got = c(input_ids=ids)
            assert type(got) is type(expected)
            assert list(got.keys()) == list(expected.keys())
            assert list(vars(got)) == list(vars(expected))
            for k, v in vars(expected).items():
                if v is None:
                    assert getattr(got, k) is None
            torch.testing.assert_close(got.logits, expected.logits, rtol=1e-4, atol=1e-4)
            assert got[0] is got.logits is collections.OrderedDict.__getitem__(got, "logits")


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_empty_results_have_eagers_strides(cpu_backend: str) -> None:
    """A dim of size 0 counts as 1 in the strides before it, as torch computes contiguous strides:
    ``x[:, 1:1] * 2`` is (4, 0) with strides (1, 1) in eager; kiln gave (0, 1) (found by dyn8)."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x[:, 1:1] * 2, torch.zeros(3, 0, 2) + x.sum(), x.new_empty(0, 5) * 1

    x = torch.randn(4, 9)
    compiled = kiln.compile(f, options={"cpu_backend": cpu_backend, "strict": True})
    for expected, got in zip(f(x), compiled(x), strict=True):
        assert (got.shape, got.stride(), got.dtype) == (expected.shape, expected.stride(), expected.dtype)
