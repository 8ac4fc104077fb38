"""Every lowering through the interpreter against eager, driven by PyTorch's OpInfo samples.

Each OpInfo whose aten op has a loopir lowering is run on a few samples per dtype (float32,
float64, bfloat16, int64, bool where the op supports it), contiguous and (float32, bfloat16)
non-contiguous; the
sample is recorded as an aten graph (``kiln_loopir.testing.record``), compiled, run and compared with
running that graph eagerly. ``KNOWN_FAILURES`` lists what does not pass yet, with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import assert_same

from kiln_loopir import compile_graph
from kiln_loopir.testing import lowered_op_infos, recorded_samples

# dtype -> how many samples (the second one non-contiguous); kept small so the sweep stays fast
DTYPES = {torch.float32: 2, torch.bfloat16: 2, torch.float64: 1, torch.int64: 1, torch.bool: 1}

# (OpInfo name, variant or "", dtype or None for all) -> reason
KNOWN_FAILURES: dict[tuple[str, str, torch.dtype | None], str] = {}

# OpInfo name -> why its lowering declines some samples (they run as extern calls, correctly)
KNOWN_FALLBACKS: dict[str, str] = {
    "index_put": "boolean-mask indices have a data-dependent shape: aten.index_put runs as an extern call",
}

# ops whose values are unspecified (uninitialized memory): only shape and dtype are compared
UNSPECIFIED_VALUES = {"empty", "empty_like", "new_empty", "empty_strided"}


# OpInfos named differently from the aten ops they record as (softmax -> aten._softmax, x[i] ->
# aten.index.Tensor), and ops without a lowering, which exercise the extern-kernel path.
EXTRA = {
    "softmax", "log_softmax", "nn.functional.layer_norm", "__getitem__", "take_along_dim",
    "mm", "bmm", "addmm", "cumsum", "sort", "topk", "nn.functional.conv2d", "index_select",
}  # fmt: skip


OPS = lowered_op_infos(EXTRA)


def _known(op: Any, dtype: torch.dtype) -> bool:
    return (op.name, op.variant_test_name, dtype) in KNOWN_FAILURES or (
        op.name,
        op.variant_test_name,
        None,
    ) in KNOWN_FAILURES


@pytest.mark.parametrize("op", OPS, ids=[f"{op.name}.{op.variant_test_name}".rstrip(".") for op in OPS])
def test_opinfo(op: Any) -> None:
    supported = op.supported_dtypes("cpu")
    checked = 0
    for dtype, count in DTYPES.items():
        if dtype not in supported or _known(op, dtype):
            continue
        for i, sample, gm, inputs in recorded_samples(op, dtype, count):
            expected = gm(*inputs)
            compiled = compile_graph(gm, inputs)
            actual = compiled(*inputs)
            if op.name in UNSPECIFIED_VALUES:
                assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype)
                checked += 1
                continue
            try:
                assert_same(actual, expected)
            except AssertionError as exc:
                raise AssertionError(f"{op.name} {dtype} sample {i}: {sample}\n{gm.code}\n{exc}") from exc
            if op.name not in KNOWN_FALLBACKS:
                assert compiled.stats.fallbacks == (), (op.name, dtype, compiled.stats.fallbacks)
            checked += 1
    assert checked > 0 or all(_known(op, d) or d not in supported for d in DTYPES)
