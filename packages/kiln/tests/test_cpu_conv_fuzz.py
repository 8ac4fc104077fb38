"""The CPU convolution passes through the C++ generator, against eager: seeds of the fuzzer in
cpu_conv_fuzz.py (`python packages/kiln/tests/cpu_conv_fuzz.py --seeds 0:300` for more), each
called twice with every parameter changed in place between the calls (a prepacked weight must be
packed again: kiln_loopir's Note [Prepacked weights])."""

# mypy: ignore-errors
from __future__ import annotations

import pytest
from cpu_conv_fuzz import check, generate

# CI's share: float32 inference through oneDNN (BatchNorms folded, a residual add, packed linear
# layers) and float32 training with depthwise backwards on small maps
CI_SEEDS = (12, 10)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_cpu_conv_fuzz(seed: int) -> None:
    p = generate(seed)
    msg = check(p)
    assert msg is None, f"seed {seed}:\n{p.render()}{msg}"
