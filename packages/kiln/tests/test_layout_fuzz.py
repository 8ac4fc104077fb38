"""The GPU layout rules through the Triton generator on CPU tensors, against eager: seeds of the
fuzzer in layout_fuzz.py (`python packages/kiln/tests/layout_fuzz.py --seeds 0:300 --gpu-form` for
more), each graph's GPU wrapper run too (Note [The GPU wrapper in the layout fuzzer]), and the
wrong answers it found, one test each."""

# mypy: ignore-errors
from __future__ import annotations

import pytest
import torch
from layout_fuzz import Program, check, generate

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
    """A fixed program, as the fuzzer wrote one (the regressions below)."""
    args = dict(seed=0, dtype=torch.float32, mode="train", eval_mode=False, loss="tensor")
    args.update(kw)
    p = Program(inputs=inputs, init=init, lines=lines, ret=ret, **args)
    p.grads_cl = [False] * len(ret)
    return p


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
