"""OpInfo samples whose tensors are stored in other layouts (Note [Layouts in the sweep] in
opinfo_sweep.py): transposed, strided, offset, channels-last and a mix, through `kiln.compile` on
the CPU, judged as the contiguous sweep (test_opinfo_kiln.py). Both code generators index their
inputs by strides, and a sample that is contiguous never tests that.

A slice of the sweep for CI: a few dozen ops that read their inputs in the ways kernels differ
(pointwise with broadcasting, reductions over inner and outer dims, views and reshapes, gathers
and scatters, concatenation, matmul and convolution as extern kernels, pooling and norms), each
under two layouts (its position picks them, so every layout meets every kind of op), the C++
generator by default and every fourth case through Triton's interpreter. The whole sweep per
layout: `python packages/kiln/tests/opinfo_sweep.py --layout L` (with `--shard i/4` to split it).

Budget: 89 cases, 47 s of CPU (user, compilers included) with a cold kiln cache; 183 s of wall
time on the 2-core machine while other jobs loaded it six times over. Plus 14 dynamic cases
(seven ops, offset and mixed, one `dynamic=True` frame per op): 83 s under the same load.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from opinfo_sweep import LAYOUTS, _relaid, assert_passes, key, op_outcome, run_sample, select, sweep_op
from torch.utils._pytree import tree_flatten

import kiln

SAMPLES = 2
OPS = (
    "add", "mul", "sub", "where", "addcmul", "lerp", "clamp", "masked_fill", "nn.functional.gelu",
    "sum", "mean", "var", "amax", "softmax", "log_softmax", "cumsum",
    "transpose", "permute", "reshape", "flatten", "expand", "view", "reshape_as", "contiguous",
    "roll", "flip", "tril", "index_select", "gather", "scatter_add", "cat", "stack",
    "mm", "bmm", "mv", "addmm", "nn.functional.linear", "nn.functional.conv2d",
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.batch_norm",
    "nn.functional.layer_norm", "nn.functional.interpolate.bilinear", "view_copy",
)  # fmt: skip
_OTHER = LAYOUTS[1:]  # every layout but contiguous
_BY_NAME = {key(info): info for info in select(ops=",".join(OPS)) if key(info) in OPS}
CASES = [
    (_BY_NAME[name], _OTHER[(i + k) % len(_OTHER)], "triton" if (2 * i + k) % 4 == 3 else "cpp")
    for i, name in enumerate(OPS)
    for k in (0, 2)
]


def _id(case: Any) -> str:
    return case if isinstance(case, str) else key(case)


@pytest.fixture(autouse=True)
def _reset() -> None:
    kiln.reset()


def test_the_slice_names_real_ops() -> None:
    assert set(OPS) == set(_BY_NAME), set(OPS) - set(_BY_NAME)


@pytest.mark.parametrize(("info", "layout", "backend"), CASES, ids=_id)
def test_opinfo_layout_through_kiln(info: Any, layout: str, backend: str) -> None:
    assert_passes(info, sweep_op(info, SAMPLES, cpu_backend=backend, layout=layout))


# Note [Static views of inputs start at the input's offset] (kiln_aotgrad): views of offset
# inputs through one dynamic frame, where a view's sizes may specialize
DYNAMIC_OPS = ("expand", "split_with_sizes", "transpose", "select", "unbind", "add", "sum")
DYNAMIC_CASES = [
    (info, layout)
    for info in select(ops=",".join(DYNAMIC_OPS))
    if key(info) in DYNAMIC_OPS
    for layout in ("offset", "mixed")
]


@pytest.mark.parametrize(("info", "layout"), DYNAMIC_CASES, ids=_id)
def test_opinfo_layout_through_kiln_dynamic(info: Any, layout: str) -> None:
    outcomes = sweep_op(info, 3, dynamic="true", layout=layout)
    kind = op_outcome(outcomes)
    details = "\n".join(f"sample {o.sample}: {o.kind}: {o.detail}" for o in outcomes if o.kind != "pass")
    assert kind == "pass", details


def _weight_strided(index: int, sample: Any) -> bool:
    """Does `--layout mixed` store `sample`'s input contiguous and its weight at stride 2?"""
    x, w, *_ = (t for t in tree_flatten(_relaid((sample.input, sample.args, {}), "mixed", index, True))[0])
    return x.is_contiguous() and w.stride() == (2,)


def test_eager_that_reads_a_layout_wrong() -> None:
    """Note [Eager that reads a layout wrong]: torch.native_group_norm reads a weight at stride 2
    as if contiguous, so eager's answer moves with the layout; kiln's is the sample's own (the
    contiguous weight's) and passes, the detail naming eager's move."""
    from torch.testing._internal.opinfo.core import SampleInput

    (info,) = (i for i in select(ops="native_group_norm") if key(i) == "native_group_norm")
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g).requires_grad_() for s in ((2, 6, 3), (6,), (6,)))
    sample = SampleInput(x, args=(w, b, 2, 6, 3, 2, 1e-5))
    index = next(i for i in range(200) if _weight_strided(i, sample))
    relaid = _relaid((x, (w, b), {}), "mixed", index, False)
    moved = torch.native_group_norm(relaid[0], *relaid[1], 2, 6, 3, 2, 1e-5)[0]
    assert not torch.allclose(moved, torch.native_group_norm(x, w, b, 2, 6, 3, 2, 1e-5)[0])  # eager moves
    outcome = run_sample(info, index, sample, grad=True, layout="mixed")
    assert outcome is not None and outcome.kind == "pass", outcome
    assert "moves with the layout" in outcome.detail
