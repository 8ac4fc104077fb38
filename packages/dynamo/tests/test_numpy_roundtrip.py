"""NumPy round trips traced as tensor operations (Note [NumPy round trips], variables/ndarray.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import CountingBackend

import kiln_dynamo

np = pytest.importorskip("numpy")


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6)
    else:
        assert a == b, (a, b)


def _sigmoid(x: torch.Tensor) -> Any:
    a = x.numpy()
    b = np.exp(a) / (1.0 + np.exp(a))
    return torch.from_numpy(b), b.shape, b.dtype, b.ndim


def _scale(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(x.numpy() * 2 - 1)


def _clip_cast(x: torch.Tensor) -> torch.Tensor:
    a = x.numpy()
    return torch.tensor(np.maximum(a, a * 0.5).astype(np.float64))


def _mask(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy((x.numpy() > 0) * 1.5)  # bool * float: float64 in NumPy


def _halve(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(-x.numpy() / 2)  # int64 / 2: float64 in NumPy


def _array_out(x: torch.Tensor) -> Any:
    return np.sqrt(np.abs(x.numpy())) + 1


@pytest.mark.parametrize("fn", [_sigmoid, _scale, _clip_cast, _mask, _halve, _array_out])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_a_numpy_round_trip_is_one_graph_with_numpy_dtypes(
    fn: Callable[..., Any], dtype: torch.dtype
) -> None:
    x = (torch.randn(3, 4) * 4).to(dtype)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for _ in range(2):
        _same(compiled(x), fn(x))
    assert backend.graphs == 1 and kiln_dynamo.counters.break_reasons == [], (
        kiln_dynamo.counters.break_reasons
    )


def test_from_numpy_shares_the_tensor_memory_as_eager() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        t = torch.from_numpy(x.numpy())
        t.add_(1)  # writes through to x
        return t

    x, y = torch.zeros(3), torch.zeros(3)
    backend = CountingBackend()
    out = kiln_dynamo.compile(f, backend=backend)(y)
    expected = f(x)
    torch.testing.assert_close(y, x)
    torch.testing.assert_close(out, expected)
    assert out is not y and out.data_ptr() == y.data_ptr()
    assert backend.graphs == 1


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (lambda x: x.numpy().sum(), "attribute 'sum'"),  # a NumPy scalar
        (lambda x: torch.from_numpy(x.numpy() ** 2), "integer powers"),
        (lambda x: x.requires_grad_(True).numpy(), "requires_grad_"),
    ],
    ids=["reduction", "int-power", "requires-grad"],
)
def test_what_is_not_modelled_breaks_and_matches_eager(fn: Callable[..., Any], reason: str) -> None:
    x = torch.arange(6)
    if reason == "requires_grad_":
        x = torch.randn(3)
        with pytest.raises(RuntimeError):
            kiln_dynamo.compile(fn, backend=CountingBackend())(x.clone())
    else:
        _same(kiln_dynamo.compile(fn, backend=CountingBackend())(x), fn(x))
    assert any(reason in str(r) for r in kiln_dynamo.counters.break_reasons), (
        kiln_dynamo.counters.break_reasons
    )
