"""``_safe_softmax`` as aotgrad decomposes it (Swin's window attention): with loopir's
``shape_only_readers`` (Note [Why a value is realized] (c) in kiln_loopir's graph.py) the softmax
is computed inside the ``where`` and never stored; against eager at one and two threads, the
option on and off."""

from __future__ import annotations

import pytest
import torch
from cpp_check import assert_same, eager, trace

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import safe_softmax, safe_softmax_inputs


@pytest.mark.parametrize("hoist", [True, False])
@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_safe_softmax_matches_eager(threads: int, on: bool, hoist: bool) -> None:
    args = safe_softmax_inputs()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        backend = CppBackend(options={"hoist_reductions": hoist})
        compiled = compile_graph(
            trace(safe_softmax), args, backend=backend, options={"shape_only_readers": on}
        )
        got = compiled(*args)
    finally:
        torch.set_num_threads(before)
    assert_same(got, eager(safe_softmax, *args), "safe softmax")
    assert torch.equal(got[1, :, 2], torch.zeros(2, 4))
    assert backend.last_declined == []
    signature = next(
        line for line in backend.last_source.splitlines() if line.startswith('extern "C" int64_t')
    )
    written = signature.count("(float* __restrict__") + signature.count(", float* __restrict__")
    # one kernel; the softmax is a second buffer it writes when it is realized and a later pass
    # reads it back: with the any() hoisted into the first pass (Note [Reductions in the
    # earliest phase] in kernel.py, off by default) the where runs in the softmax's pass
    assert compiled.stats.kernels == 1 and written == (1 if on or hoist else 2), signature
