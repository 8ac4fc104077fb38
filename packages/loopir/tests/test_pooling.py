"""max_pool2d_with_indices as an unrolled window (Note [Max pooling as a window])."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from helpers import aten, check

from kiln_loopir import compile_graph
from kiln_loopir.interpret import InterpretBackend
from kiln_loopir.testing import max_pool_backward_inputs

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


PLAIN_MAX = "indices unread, values as a plain maximum"


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("plain", [True, False])
def test_max_pool2d_values_alone(
    case: Any, dtype: torch.dtype, plain: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Note [Max pooling values without their indices]: with the indices dead the values are a
    plain maximum (NaN, -inf and ties planted), exactly eager's; option off, the take chain."""
    shape, k, s, p, d, ceil = case

    def f(x: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices.default(x, k, s, p, d, ceil)[0]

    caplog.set_level(logging.INFO, logger="kiln.loopir.passes")
    check(f, special_values(shape, dtype), options={"pool_values_max": plain})
    assert (PLAIN_MAX in caplog.text) == plain


def test_max_pool2d_values_alone_nan_windows_and_signed_zeros() -> None:
    x = torch.tensor([[[[-0.0, 0.0, 1.0, float("nan")], [0.0, -0.0, float("nan"), 2.0]]]])
    x = torch.cat([x, torch.full_like(x, float("-inf"))], dim=1)

    def f(x: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2], 0, 1, False)[0]

    compiled = compile_graph(torch.fx.symbolic_trace(f), [x])
    actual, expected = compiled(x), f(x)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(actual.signbit(), expected.signbit())  # the first of equal zeros


def test_max_pool2d_with_read_indices_keeps_the_take_chain(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kiln.loopir.passes")
    check(
        lambda x: aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], 1, 1, False),
        special_values((2, 3, 9, 7), torch.float32),
    )
    assert PLAIN_MAX not in caplog.text


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


# Note [Max pooling backward as a gather]: the cases above plus windows that overlap (3x3 stride
# 1, up to 9 candidates per element) and a 1-D-batched 3-D input
BACKWARD_CASES = [*CASES, ((2, 3, 10, 10), [3, 3], [1, 1], 1, 1, False)]


class _ScalarGathers(InterpretBackend):
    """The reference interpreter standing in for a generator whose gathers stay scalar (the C++
    one: Note [Overlapping max pooling backward on the CPU])."""

    scalar_gathers = True


def pool_backward_inputs(
    shape: tuple[int, ...], case: Any, dtype: torch.dtype, channels_last: bool
) -> list[torch.Tensor]:
    """(grad, x, indices) as autograd would pass them: indices from eager's forward, ties planted."""
    return max_pool_backward_inputs(special_values(shape, dtype), case, channels_last)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool2d_backward_gathers(case: Any, dtype: torch.dtype, channels_last: bool) -> None:
    shape, k, s, p, d, ceil = case
    grad, x, indices = pool_backward_inputs(shape, case, dtype, channels_last)
    compiled = check(
        lambda g, x, i: aten.max_pool2d_with_indices_backward.default(g, x, k, s, p, d, ceil, i),
        grad,
        x,
        indices,
        options={"pool_backward": "force"},  # Note [Overlapping max pooling backward on the CPU]
    )
    assert compiled.stats.extern_calls == 0  # a kernel, not eager's scatter


def test_max_pool2d_backward_fuses_with_the_relu_backward() -> None:
    def f(g: torch.Tensor, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        dx = aten.max_pool2d_with_indices_backward.default(g, x, [2, 2], [2, 2], 0, 1, False, i)
        return aten.threshold_backward.default(dx, x, 0.0)

    case = ((2, 4, 8, 8), [2, 2], [2, 2], 0, 1, False)
    grad, x, indices = pool_backward_inputs(case[0], case, torch.float32, False)
    compiled = check(f, grad, x, indices)
    assert compiled.stats.kernels == 1 and compiled.stats.extern_calls == 0


def test_max_pool2d_backward_extern_when_asked_or_too_many_windows() -> None:
    def f(g: torch.Tensor, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward.default(g, x, [9, 9], [1, 1], 0, 1, False, i)

    case = ((1, 2, 12, 12), [9, 9], [1, 1], 0, 1, False)
    grad, x, indices = pool_backward_inputs(case[0], case, torch.float32, False)
    compiled = check(f, grad, x, indices, allow_fallback=True, options={"pool_backward": "force"})
    assert compiled.stats.extern_calls == 1
    assert "candidate windows" in compiled.stats.fallbacks[0][1]
    small = ((2, 3, 8, 8), [2, 2], [2, 2], 0, 1, False)
    grad, x, indices = pool_backward_inputs(small[0], small, torch.float32, False)

    def g(g: torch.Tensor, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward.default(g, x, [2, 2], [2, 2], 0, 1, False, i)

    off = check(g, grad, x, indices, options={"pool_backward": False})
    assert off.stats.extern_calls == 1
    # Note [Overlapping max pooling backward on the CPU]: for a generator whose gathers stay scalar a
    # 3x3 stride-2 pool's backward is eager's scatter by default; 2x2 stride 2 (one candidate
    # window) stays a kernel; a generator that vectorizes gathers keeps the kernel
    overlap = ((2, 3, 9, 9), [3, 3], [2, 2], [1, 1], 1, False)
    grad, x, indices = pool_backward_inputs(overlap[0], overlap, torch.float32, False)

    def h(g: torch.Tensor, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward.default(g, x, [3, 3], [2, 2], [1, 1], 1, False, i)

    assert check(h, grad, x, indices, backend=_ScalarGathers()).stats.extern_calls == 1
    small_inputs = pool_backward_inputs(small[0], small, torch.float32, False)
    assert check(g, *small_inputs, backend=_ScalarGathers()).stats.extern_calls == 0
    assert check(h, grad, x, indices).stats.extern_calls == 0
    with pytest.raises(ValueError, match="pool_backward"):
        check(h, grad, x, indices, options={"pool_backward": "sometimes"})
