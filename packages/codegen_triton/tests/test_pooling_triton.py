"""Max pooling's backward as a generated kernel (Note [Max pooling backward as a gather] in
kiln_loopir's lowerings/pooling.py): eager's values in both layouts, eager's strides, and fused
with the ReLU backward that reads it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from triton_check import DEVICES, assert_same, check, make, to_device

from kiln_codegen_triton import TritonBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import max_pool_backward_inputs, with_vals

aten = torch.ops.aten

# (input shape, kernel, stride, padding, dilation, ceil_mode)
CASES: list[tuple[tuple[int, ...], Any, Any, Any, Any, bool]] = [
    ((2, 3, 8, 8), [2, 2], [], 0, 1, False),  # the CNN's: one candidate, no mask
    ((2, 3, 9, 7), [3, 3], [2, 2], 1, 1, False),  # ResNet's stem: 2x2 candidates, padding
    ((1, 2, 9, 9), [3, 2], [2, 1], [1, 0], [2, 1], True),  # dilation, ceil_mode
    ((2, 3, 10, 10), [3, 3], [1, 1], 1, 1, False),  # 3x3 overlapping candidates
]


def pool_inputs(case: Any, dtype: torch.dtype, channels_last: bool, device: str) -> list[torch.Tensor]:
    x = make(case[0], torch.float32).to(dtype)
    x.view(-1)[10:14] = 1.0  # a tie: only the first maximum gets the gradient
    return to_device(max_pool_backward_inputs(x, case, channels_last), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool2d_backward_is_a_kernel(
    case: Any, dtype: torch.dtype, channels_last: bool, device: str
) -> None:
    _, k, s, p, d, ceil = case
    inputs = pool_inputs(case, dtype, channels_last, device)

    def f(g: Any, x: Any, i: Any) -> Any:
        return aten.max_pool2d_with_indices_backward.default(g, x, k, s, p, d, ceil, i)

    gm = with_vals(f, *inputs)
    compiled = compile_graph(gm, inputs, backend=TritonBackend())
    got, want = compiled(*inputs), gm(*inputs)
    assert got.stride() == want.stride()  # NHWC in, NHWC out, as eager
    if dtype == torch.bfloat16:
        # the sum of overlapping windows' gradients is accumulated in float32 and rounded once,
        # as eager's CUDA kernels do; eager's CPU NHWC kernel rounds after every add, so the
        # reference is the float32 result rounded once
        grad, x, indices = inputs
        want = gm(grad.float(), x.float(), indices).to(dtype)
    assert_same(got, want)
    assert compiled.stats.extern_calls == 0 and compiled.stats.kernels == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_max_pool2d_backward_fuses_with_relu_backward(channels_last: bool, device: str) -> None:
    case = ((2, 8, 8, 8), [3, 3], [2, 2], 1, 1, False)
    grad, x, indices = pool_inputs(case, torch.float32, channels_last, device)

    def f(g: Any, x: Any, i: Any) -> Any:
        dx = aten.max_pool2d_with_indices_backward.default(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, i)
        return aten.threshold_backward.default(dx, x, 0.0)

    gm = with_vals(f, grad, x, indices)
    backend = TritonBackend()
    compiled = compile_graph(gm, [grad, x, indices], backend=backend)
    assert_same(compiled(grad, x, indices), gm(grad, x, indices))
    assert compiled.stats.kernels == 1 and compiled.stats.extern_calls == 0
    off = compile_graph(gm, [grad, x, indices], backend=TritonBackend(), options={"pool_backward": False})
    assert off.stats.extern_calls == 1  # options={"pool_backward": False}: eager's kernel


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool2d_values_alone_are_a_plain_max(
    case: Any, dtype: torch.dtype, channels_last: bool, device: str
) -> None:
    """Note [Max pooling values without their indices] in kiln_loopir's lowerings/pooling.py: the
    kernel selects, never rounds a step to bfloat16 and carries no int64 index; eager's values
    with NaN, -inf and ties planted."""
    shape, k, s, p, d, ceil = case
    x = make(shape, torch.float32).to(dtype)
    flat = x.view(-1)
    flat[::5] = float("-inf")
    flat[3] = float("nan")
    flat[20:26] = 0.5
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    backend = check(lambda x: aten.max_pool2d_with_indices.default(x, k, s, p, d, ceil)[0], x, device=device)
    kernel = backend.last_source.split("def triton_", 1)[1]  # past the prelude's helpers
    assert "k_maximum" not in kernel and "k_bf16_round(" not in kernel
    assert "== tl.full([], -1, tl.int64)" not in kernel
