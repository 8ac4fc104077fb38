"""Every loopir lowering through Triton against eager, driven by PyTorch's OpInfo samples.

Each OpInfo whose aten op has a loopir lowering runs on a few samples per dtype (the second
float32 one non-contiguous); the sample is recorded as an aten graph (kiln_loopir.testing), compiled
with the triton backend, run and compared with running the recorded graph eagerly. Every kernel
must be generated as Triton (no kernel may fall back to the interpreter) unless the op is listed
in ``DECLINED`` with the reason. Ops loopir itself does not lower run as extern calls.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx
from triton_check import DEVICES, assert_same, graph_to_device, to_device

from kiln_codegen_triton import TritonBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import lowered_op_infos, recorded_samples

# dtype -> samples (kept small: the interpreter runs every kernel in numpy; integer and bool
# spellings are swept op by op in test_pointwise.py and test_reductions.py)
DTYPES = {torch.float32: 2, torch.bfloat16: 1, torch.int64: 1}

# OpInfo name -> why some of its kernels run in loopir's interpreter (correct, only slower);
# bfloat16 atomic adds are generated (Note [16-bit atomic adds] in kernel.py)
DECLINED: dict[str, str] = {}

# ops whose values are unspecified (uninitialized memory): only shape and dtype are compared
UNSPECIFIED_VALUES = {"empty", "empty_like", "new_empty", "empty_strided"}


# OpInfos named differently from the aten ops they record as
EXTRA = {
    "softmax",
    "log_softmax",
    "nn.functional.layer_norm",
    "__getitem__",
    "take_along_dim",
    "index_select",
}

OPS = lowered_op_infos(EXTRA)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS, ids=[f"{op.name}.{op.variant_test_name}".rstrip(".") for op in OPS])
def test_opinfo(op: Any, device: str) -> None:
    checked = 0
    supported = op.supported_dtypes(device)  # CUDA lacks some (addmm on int64)
    for dtype, count in DTYPES.items():
        if dtype not in supported:
            continue
        for i, sample, recorded, cpu_inputs in recorded_samples(op, dtype, count):
            inputs = to_device(cpu_inputs, device)
            gm = graph_to_device(recorded, device)
            expected = gm(*inputs)
            backend = TritonBackend()
            actual = compile_graph(gm, inputs, backend=backend)(*inputs)
            if op.name in UNSPECIFIED_VALUES:
                assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype)
            else:
                try:
                    assert_same(actual, expected)
                except AssertionError as exc:
                    raise AssertionError(f"{op.name} {dtype} sample {i}: {sample}\n{gm.code}\n{exc}") from exc
            if op.name not in DECLINED:
                assert backend.last_declined == [], (op.name, dtype, backend.last_declined)
            checked += 1
    assert checked > 0 or not any(d in supported for d in DTYPES)
