"""max_pool2d_with_indices through C++: values and indices equal eager's, special values included."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from cpp_check import aten, check

from kiln_loopir.testing import max_pool_backward_inputs

CASES: list[tuple[tuple[int, ...], Any, Any, Any, Any, bool]] = [
    ((2, 3, 8, 8), [2, 2], [], 0, 1, False),
    ((2, 3, 9, 7), [3, 3], [2, 2], 1, 1, False),
    ((1, 2, 9, 9), [3, 2], [2, 1], [1, 0], [2, 1], True),
    ((3, 10, 11), [2, 2], [2, 2], 0, 1, True),
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool2d_values_and_indices(case: Any, dtype: torch.dtype) -> None:
    shape, k, s, p, d, ceil = case
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    flat = x.view(-1)
    flat[::7] = float("-inf")
    flat[5] = float("nan")
    flat[10:14] = 1.0
    check(lambda x: aten.max_pool2d_with_indices.default(x, k, s, p, d, ceil), x)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool2d_values_alone_are_a_plain_max(case: Any, dtype: torch.dtype) -> None:
    """Note [Max pooling values without their indices]: no index chain in the kernel, eager's
    values (NaN, -inf, ties planted)."""
    shape, k, s, p, d, ceil = case
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    flat = x.view(-1)
    flat[::5] = float("-inf")
    flat[3] = float("nan")
    flat[20:26] = 0.5
    compiled = check(lambda x: aten.max_pool2d_with_indices.default(x, k, s, p, d, ceil)[0], x)
    source = compiled.backend.last_source  # type: ignore[attr-defined]
    assert "std::isnan" in source and "INT64_C(-1)) ==" not in source


def test_max_pool2d_after_batch_norm_walks_rows_innermost() -> None:
    # Note [Loop order counts full-size accesses first]: per-channel scale and shift must not
    # pull the channel loop innermost.
    def f(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        y = aten.relu.default(aten.mul.Tensor(x, aten.view.default(scale, [1, 4, 1, 1])))
        return aten.max_pool2d_with_indices.default(y, [2, 2], [2, 2])[0]

    compiled = check(f, torch.randn(2, 4, 8, 8), torch.randn(4))
    source = compiled.backend.last_source  # type: ignore[attr-defined]
    loops = re.findall(r"for \(int64_t (x\d) = 0; \1 < INT64_C\((\d+)\)", source)
    # The innermost loop is the output's last dim (4 columns), not the channels (4 too: by name).
    assert loops and loops[-1][0] == "x3", loops


BACKWARD_CASES = [*CASES, ((2, 3, 10, 10), [3, 3], [1, 1], 1, 1, False)]


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool2d_backward_gathers(case: Any, dtype: torch.dtype, channels_last: bool) -> None:
    # Note [Max pooling backward as a gather]: masked candidate windows compile to C++ too
    shape, k, s, p, d, ceil = case
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    x.view(-1)[10:14] = 1.0  # ties: the gradient goes to the first maximum only
    grad, x, indices = max_pool_backward_inputs(x, case, channels_last)
    compiled = check(
        lambda g, x, i: aten.max_pool2d_with_indices_backward.default(g, x, k, s, p, d, ceil, i),
        grad,
        x,
        indices,
        options={"pool_backward": "force"},  # overlapping windows too (Note [Overlapping max ...])
    )
    assert compiled.stats.extern_calls == 0


@pytest.mark.parametrize("force", [False, True], ids=["default", "force"])
def test_overlapping_max_pool2d_backward_is_eager_scatter_on_cpu(force: bool) -> None:
    # Note [Overlapping max pooling backward on the CPU]: ResNet's stem pool (3x3, stride 2, pad 1)
    # behind a ReLU backward; by default eager's scatter, under "force" the gather kernel
    case = ((2, 4, 9, 9), [3, 3], [2, 2], [1, 1], 1, False)
    x = torch.randn(case[0], generator=torch.Generator().manual_seed(0))
    grad, x, indices = max_pool_backward_inputs(x, case, False)

    def f(g: torch.Tensor, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        dx = aten.max_pool2d_with_indices_backward.default(
            aten.relu.default(g), x, [3, 3], [2, 2], [1, 1], 1, False, i
        )
        return aten.threshold_backward.default(dx, x, 0.0)

    compiled = check(f, grad, x, indices, options={"pool_backward": "force"} if force else None)
    assert compiled.stats.extern_calls == (0 if force else 1)
    assert not compiled.stats.fallbacks  # a decision, not a lowering that failed
