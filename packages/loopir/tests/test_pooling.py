"""max_pool2d_with_indices as an unrolled window (Note [Max pooling as a window])."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import aten, check

from kiln_loopir import compile_graph

# (input shape, kernel, stride, padding, dilation, ceil_mode)
CASES: list[tuple[tuple[int, ...], Any, Any, Any, Any, bool]] = [
    ((2, 3, 8, 8), [2, 2], [], 0, 1, False),
    ((2, 3, 9, 7), [3, 3], [2, 2], 1, 1, False),
    ((1, 2, 9, 9), [3, 2], [2, 1], [1, 0], [2, 1], True),
    ((3, 10, 11), [2, 2], [2, 2], 0, 1, True),
]


def special_values(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random values with -inf, a NaN and ties planted, so index choice is tested too."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    flat = x.view(-1)
    flat[::7] = float("-inf")
    flat[5] = float("nan")
    flat[10:14] = 1.0
    return x


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_max_pool2d_values_and_indices(case: Any, dtype: torch.dtype) -> None:
    shape, k, s, p, d, ceil = case
    compiled = check(
        lambda x: aten.max_pool2d_with_indices.default(x, k, s, p, d, ceil), special_values(shape, dtype)
    )
    assert compiled.stats.extern_calls == 0  # lowered, not an extern call


def test_max_pool2d_all_minus_inf_window_answers_its_first_position() -> None:
    x = torch.full((1, 1, 4, 4), float("-inf"))
    check(lambda x: aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], 1, 1, False), x)


def test_max_pool2d_fuses_with_its_producer_and_drops_dead_indices() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices.default(aten.relu.default(x), [2, 2], [2, 2])[0]

    x = torch.randn(2, 4, 8, 8)
    compiled = check(f, x)
    assert compiled.stats.kernels == 1


def test_large_windows_stay_extern() -> None:
    def f(x: torch.Tensor) -> Any:
        return aten.max_pool2d_with_indices.default(x, [9, 9], [1, 1])

    x = torch.randn(1, 2, 12, 12)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x])
    assert compiled.stats.extern_calls == 1
    assert "too large to unroll" in compiled.stats.fallbacks[0][1]
    values, indices = compiled(x)
    expected = f(x)
    torch.testing.assert_close(values, expected[0])
    assert torch.equal(indices, expected[1])
