"""``_safe_softmax`` as aotgrad decomposes it, through the Triton generator, with loopir's
``shape_only_readers`` on and off (Note [Why a value is realized] (c) in kiln_loopir's graph.py)."""

from __future__ import annotations

import pytest
from triton_check import DEVICES, assert_same, to_device

from kiln_codegen_triton import TritonBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import safe_softmax, safe_softmax_inputs, trace


@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("on", [True, False])
def test_safe_softmax_matches_eager(device: str, on: bool) -> None:
    args = to_device(safe_softmax_inputs(), device)
    compiled = compile_graph(
        trace(safe_softmax), args, backend=TritonBackend(), options={"shape_only_readers": on}
    )
    assert_same(compiled(*args), safe_softmax(*args), "safe softmax")
