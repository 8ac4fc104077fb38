"""Note [One Welford for a variance and its mean]: the var_mean pass over aten graphs."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from helpers import check, make

from kiln_loopir.passes import run_passes
from kiln_loopir.testing import with_vals

aten = torch.ops.aten


def normalize(x: Any) -> Any:
    # aotgrad's layer-norm decomposition: var and mean of the same rows, the mean also returned
    var = aten.var.correction(x, [-1], correction=0, keepdim=True)
    mean = aten.mean.dim(x, [1], True)
    out = aten.mul.Tensor(aten.sub.Tensor(x, mean), aten.rsqrt.default(aten.add.Tensor(var, 1e-5)))
    return out, mean, aten.var.correction(x, [0], correction=1)


def _records(compiled: Any) -> list[str]:
    return [text for name, text in compiled.passes.record if name == "var_mean"]


def test_a_variance_and_a_mean_of_the_same_rows_are_one_welford() -> None:
    x = make((6, 40))
    on = check(with_vals(normalize, x), x)
    off = check(with_vals(normalize, x), x, options={"var_mean": False})
    (line,) = _records(on)  # the column variance over dim 0 has no mean to pair with
    assert "one var_mean" in line and "dims [1]" in line
    assert _records(off) == ["off (option var_mean=False)"]
    rewritten, _ = run_passes(with_vals(normalize, x), [x], torch.device("cpu"))
    targets = [n.target for n in rewritten.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.var_mean.correction) == 1 and aten.mean.dim not in targets
    assert targets.count(aten.var.correction) == 1  # the column one


@pytest.mark.parametrize("special", [math.inf, -math.inf, math.nan, 3e38])
def test_the_merged_mean_is_mean_dims_at_special_values(special: float) -> None:
    """(b) of the Note: a row holding an infinity has an infinite mean, and a row whose float sum
    overflows has mean.dim's +-inf, not Welford's finite mean."""
    x = make((4, 40))
    x[1, 5] = special
    x[2, :3] = special
    check(with_vals(normalize, x), x)


def test_not_merged_where_the_rows_differ() -> None:
    def fn(x: Any) -> Any:
        return (
            aten.var.correction(x, [1], correction=0, keepdim=True),
            aten.mean.dim(x, [1], False),  # keepdim differs
            aten.mean.dim(x, [1], True, dtype=torch.float64),  # another dtype
        )

    x = make((5, 8))
    assert _records(check(with_vals(fn, x), x)) == []


def test_gpu_graphs_are_left_alone() -> None:
    x = make((6, 40))
    gm = with_vals(normalize, x)
    rewritten, ctx = run_passes(gm, [x], torch.device("cuda"), {"layout": False})
    assert ("var_mean", "not on cuda") in ctx.record
    assert aten.var_mean.correction not in [n.target for n in rewritten.graph.nodes]


@pytest.mark.parametrize("dim", [0, -1])
def test_a_scalars_variance_and_mean(dim: int) -> None:
    """A 0-d tensor's dim 0 / -1 names the scalar itself: the pair is one var_mean over no dim
    (the pass took dim 0 as a size and raised IndexError: std_mean(tensor(1.5), 0, keepdim=True)
    failed the backend)."""

    def fn(x: Any) -> Any:
        return aten.var.correction(x, [dim], correction=0, keepdim=True), aten.mean.dim(x, [dim], True)

    x = torch.tensor(1.5)
    (line,) = _records(check(with_vals(fn, x), x))
    assert "one var_mean" in line
