"""BatchNorm training through the Triton generator under Note [Welford chunks] (codegen_triton's
split.py), on and off: outputs, running statistics and gradients as eager's."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import kiln


@pytest.mark.parametrize("welford_chunks", [True, False])
@pytest.mark.parametrize("shape", [(2, 8, 56), (2, 16, 28)])
def test_batch_norm_training_matches_eager(
    shape: tuple[int, int, int], welford_chunks: bool, caplog: pytest.LogCaptureFixture
) -> None:
    n, c, hw = shape
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    ref = copy.deepcopy(bn)
    x = (torch.randn(n, c, hw, hw) * 3 + 1).to(memory_format=torch.channels_last)
    grad = torch.randn(n, c, hw, hw)
    x_ref, x_kiln = x.clone().requires_grad_(), x.clone().requires_grad_()
    caplog.set_level(logging.DEBUG, logger="kiln.codegen_triton.output_code")
    compiled = kiln.compile(
        bn,
        dynamic=False,  # static sizes: Welford splits are static only (Note in split.py)
        options={
            "cpu_backend": "triton",
            "strict": True,
            "triton_options": {"welford_chunks": welford_chunks},
        },
    )
    for _ in range(2):  # the running statistics move twice, as eager's
        y_ref, y_kiln = ref(x_ref), compiled(x_kiln)
        (y_ref * grad).sum().backward()
        (y_kiln * grad).sum().backward()
    torch.testing.assert_close(y_kiln, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(bn.running_mean, ref.running_mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn.running_var, ref.running_var, atol=1e-5, rtol=1e-5)
    assert int(bn.num_batches_tracked) == int(ref.num_batches_tracked) == 2
    for got, want in (
        (x_kiln.grad, x_ref.grad),
        (bn.weight.grad, ref.weight.grad),
        (bn.bias.grad, ref.bias.grad),
    ):
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    # the forward's statistics split by the rule only where it is on
    assert ("Welford column reduction" in caplog.text) is welford_chunks
