"""The CPU convolution passes through the C++ generator, against eager: seeds of the fuzzer in
cpu_conv_fuzz.py (`python packages/kiln/tests/cpu_conv_fuzz.py --seeds 0:300` for more), each
called twice with every parameter changed in place between the calls (a prepacked weight must be
packed again: kiln_loopir's Note [Prepacked weights])."""

# mypy: ignore-errors
from __future__ import annotations

import pytest
import torch
from cpu_conv_fuzz import check, generate
from layout_fuzz import Program, fixed_program

# CI's share: float32 inference through oneDNN (BatchNorms folded, a residual add, packed linear
# layers) and float32 training with depthwise backwards on small maps
CI_SEEDS = (12, 10)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_cpu_conv_fuzz(seed: int) -> None:
    p = generate(seed)
    msg = check(p)
    assert msg is None, f"seed {seed}:\n{p.render()}{msg}"


def _program(lines: list[str], init: list[str], inputs, ret: list[str], **kw) -> Program:
    return fixed_program(lines, init, inputs, ret, grads_cl=True, **kw)


def test_a_native_backward_over_a_one_pixel_map_runs() -> None:
    """Seed 1043, minimized: a small convolution over the 1x1 map of a channels-last one ran its
    native backward on eager's channels-last strides of the map and failed at run time
    (kiln_loopir's Note [Size-1 dims and the native kernels' layouts])."""
    p = _program(
        ["t1 = self.m1(x0)", "t3 = self.m2(t1)"],
        [
            "self.m1 = nn.Conv2d(2, 6, 3, stride=1, padding=0, dilation=1, groups=1, bias=True)",
            "self.m2 = nn.Conv2d(6, 6, 3, padding=1, bias=False)",
        ],
        [("x0", (3, 2, 3, 3), "cl", False)],
        ["t3"],
        seed=1043,
    )
    assert check(p) is None


def test_a_bias_gradient_a_batch_norm_zeroes_is_judged_by_eagers_band() -> None:
    """Seed 1047: in bfloat16 a convolution's bias before a BatchNorm in training has a gradient
    of 0 (float64's is 1e-15) that rounding makes 0.03; kiln's draw was twice as far from 0 as
    eager's, within eager's spread on inputs one ulp away (layout_fuzz.py's Note [Eager's one-ulp
    band])."""
    p = _program(
        ["t1 = self.m1(x0)", "t2 = self.m2(t1)", "t3 = self.m3(t2)", "t4 = F.relu(t3)"],
        [
            "self.m1 = nn.Conv2d(4, 4, 3, stride=2, padding=1, dilation=1, groups=4, bias=True)",
            "self.m2 = nn.Conv2d(4, 4, 3, stride=1, padding=1, dilation=1, groups=2, bias=True)",
            "self.m3 = nn.BatchNorm2d(4, affine=True)",
        ],
        [("x0", (3, 4, 7, 7), "cl", False)],
        ["t4"],
        seed=1047,
        dtype=torch.bfloat16,
    )
    assert check(p) is None
