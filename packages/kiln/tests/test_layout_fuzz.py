"""The GPU layout rules through the Triton generator on CPU tensors, against eager: seeds of the
fuzzer in layout_fuzz.py (`python packages/kiln/tests/layout_fuzz.py --seeds 0:300 --gpu-form` for
more), each graph's GPU wrapper run too (Note [The GPU wrapper in the layout fuzzer]), and the
wrong answers it found, one test each."""

# mypy: ignore-errors
from __future__ import annotations

import pytest
import torch
from layout_fuzz import Program, check, compare, eager_reads_garbage, fixed_program, generate

# CI's share: a few seconds under the interpreter
CI_SEEDS = range(0, 4)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_layout_fuzz() -> None:
    failures = []
    for seed in CI_SEEDS:
        p = generate(seed)
        msg = check(p, gpu_form=True)
        if msg:
            failures.append(f"seed {seed}:\n{p.render()}{msg}")
    assert not failures, "\n\n".join(failures[:3]) + f"\n({len(failures)} failing seeds)"


def _program(lines: list[str], init: list[str], inputs, ret: list[str], **kw) -> Program:
    return fixed_program(lines, init, inputs, ret, grads_cl=False, **kw)


def test_a_padded_saved_value_reaches_the_gpu_wrapper_checked() -> None:
    """Seed 26, minimized: the backward's GPU wrapper took a padded GEMM's saved result (rows of 4
    for 3 columns) as laid out by the forward and read it as dense (kiln_aotgrad's Note [Only the
    strides the backward was compiled for are laid out])."""
    p = _program(
        [
            "t2 = x0[:, :3].mean((2, 3))",
            "t3 = torch.sigmoid(self.m3(F.relu(self.m2(t2))))",
            "t4 = x0[:, :3] * t3[:, :, None, None]",
        ],
        ["self.m2 = nn.Linear(3, 1)", "self.m3 = nn.Linear(1, 3)"],
        [("x0", (2, 4, 8, 8), "cl", False)],
        ["t4"],
        seed=26,
        pad_mm=True,
    )
    assert check(p, gpu_form=True) is None


def test_a_peeled_convolution_bias_keeps_eagers_output_strides() -> None:
    """Seed 11, minimized: a channels-last convolution whose bias ``conv_bias`` peels returned NCHW
    (kiln_loopir's Note [A peeled convolution keeps its layout])."""
    p = _program(
        ["t1 = torch.tanh(x0)", "t2 = self.m1(t1)"],
        ["self.m1 = nn.Conv2d(4, 2, 3, stride=2, padding=1, bias=True)"],
        [("x0", (3, 4, 8, 8), "cl", True)],
        ["t2"],
        seed=11,
    )
    assert check(p, gpu_form=True) is None


def test_a_gradient_rounding_decides_is_judged_by_eagers_one_ulp_band() -> None:
    """Seed 1070 (t2-t4, which nothing reads, left out): in bfloat16 a depthwise convolution's bias
    gradient under a LayerNorm over 2 channels is rounding noise; kiln's (``conv_bias`` peels the
    bias: one rounding more, the value eager computes for the peeled program bit for bit) was 9x
    further from float64 than eager's one draw, within eager's own spread on inputs one ulp away
    (layout_fuzz.py's Note [Eager's one-ulp band])."""
    p = _program(
        [
            "t1 = self.m1(x0)",
            "t5 = self.m4(t1)",
            "t6 = t5.permute(0, 2, 3, 1)",
            "t7 = self.m5(t6)",
            "t8 = self.m6(t7)",
            "t9 = F.gelu(t8)",
            "t10 = self.m7(t9)",
            "t11 = self.m8 * t10",
            "t12 = t11.permute(0, 3, 1, 2)",
            "t13 = t1 + t12",
        ],
        [
            "self.m1 = nn.Conv2d(8, 2, 3, stride=1, padding=1, dilation=1, groups=2, bias=True)",
            "self.m2 = nn.Linear(8, 4)",
            "self.m3 = nn.Linear(4, 8)",
            "self.m4 = nn.Conv2d(2, 2, 7, padding=3, groups=2)",
            "self.m5 = nn.LayerNorm(2, eps=1e-6)",
            "self.m6 = nn.Linear(2, 4)",
            "self.m7 = nn.Linear(4, 2)",
            "self.m8 = nn.Parameter(torch.rand(2) + 0.5)",
        ],
        [("x0", (1, 8, 6, 5), "contig", True)],
        ["t13"],
        seed=1070,
        dtype=torch.bfloat16,
        pad_mm=True,
    )
    assert check(p, gpu_form=True) is None


def test_eagers_band_accepts_rounding_noise_but_not_a_wrong_value() -> None:
    """Note [Eager's one-ulp band] loosens the float64 rule only as far as eager's own spread: a
    value eager's nudged runs scatter widely passes within it, values in the wrong order (a layout
    bug) do not, and where the nudged runs stay at eager's error the rule is as strict as before."""
    ref = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def noisy(scale: float, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return (ref + scale * torch.randn(64, dtype=torch.float64, generator=gen)).to(torch.bfloat16)

    want = noisy(0.02, 1)
    wide = [noisy(0.1, k) for k in range(2, 10)]
    narrow = [noisy(0.02, k) for k in range(2, 10)]
    got = noisy(0.12, 11)
    assert compare("g", got, want, ref, torch.bfloat16) != []
    assert compare("g", got, want, ref, torch.bfloat16, band=wide) == []
    assert compare("g", got.flip(0), want, ref, torch.bfloat16, band=wide) != []
    assert compare("g", got, want, ref, torch.bfloat16, band=narrow) != []


def test_a_returned_input_of_a_native_convolution_keeps_eagers_strides() -> None:
    """Seed 1404: the leaky ReLU of a channels-last convolution, returned and read by a small
    convolution that runs natively, came back NCHW (kiln_loopir's Note [A layout only lowerings
    read])."""
    p = _program(
        [
            "t1 = self.m1(x0)",
            "t2 = F.leaky_relu(t1, 0.1)",
            "t3 = self.m2(t2)",
            "loss = t3.float().square().mean()",
        ],
        [
            "self.m1 = nn.Conv2d(4, 8, 5, stride=1, padding=2, dilation=1, groups=4, bias=True)",
            "self.m2 = nn.Conv2d(8, 2, 2, stride=2, padding=0, dilation=1, groups=1, bias=True)",
        ],
        [("x0", (2, 4, 8, 5), "cl", True)],
        ["loss", "t1", "t2"],
        seed=1404,
        loss="scalar",
    )
    assert check(p, gpu_form=True) is None


def test_nan_eager_alone_makes_is_eagers_error() -> None:
    """Note [NaN that eager alone makes]: eager's NaN where float64 has a number (torch's bfloat16
    convolution backward reading uninitialized memory, cpu_conv_fuzz.py seed 1195) is judged as
    eager's error; kiln's NaN where eager has a number, or kiln's number where float64 too is NaN,
    stays a failure."""
    ref = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got = ref.to(torch.bfloat16)
    want = got.clone()
    want[:4] = float("nan")
    want[4:] += 0.5
    assert compare("g", got, want, None, torch.bfloat16) == ["?"]  # not close: float64 asked for
    assert compare("g", got, want, ref, torch.bfloat16) == []
    kiln_nan = got.clone()
    kiln_nan[8] = float("nan")
    assert "NaN" in compare("g", kiln_nan, want, ref, torch.bfloat16)[0]
    ref_nan = ref.clone()
    ref_nan[:4] = float("nan")
    assert "NaN" in compare("g", got, want, ref_nan, torch.bfloat16)[0]


def test_values_eager_leaves_unwritten_are_skipped_not_judged() -> None:
    """Note [Eager reading uninitialized memory]: a failing value that changes when eager runs
    after freed memory held NaN, then 1e30 (torch's bfloat16 convolution backward over a 1x1 map,
    stride 2: cpu_conv_fuzz.py seeds 1195, 1225) is named and the program skipped; a failing
    value eager computes the same way each time stays a failure."""
    bad = ["param grad 0: values differ: max |got-eager| 1e35"]

    def garbage():
        return (torch.ones(2),), [], [torch.empty(256)], []

    def steady():
        return (torch.empty(256),), [], [torch.zeros(256)], []

    assert "param grad 0" in eager_reads_garbage(bad, garbage)
    assert eager_reads_garbage(bad, steady) is None  # the unstable value is another one
    assert eager_reads_garbage([*bad, "out 0: strides (1,) against eager's (2,)"], garbage) is None
