"""Note [Buffers allocated as their readers view them] (wrapper.py): a kernel's output that an
extern op or a graph output views in another dense shape is allocated in that shape."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from cpp_check import aten, eager, make

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph


def _graph(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = aten.tanh.default(x)  # [2, 16, 8], computed by a kernel
    z = aten.mm.default(aten.view.default(y, [32, 8]), w)  # mm reads it as [32, 8]
    s = aten.sigmoid.default(x)
    return z, aten.permute.default(s, [0, 2, 1]), aten.view.default(s, [2, 128])


@pytest.mark.parametrize("as_viewed", [True, False])
def test_kernel_outputs_are_allocated_as_externs_and_outputs_view_them(as_viewed: bool) -> None:
    x, w = make((2, 16, 8)), make((8, 4))
    backend = CppBackend(options={"buffers_as_viewed": as_viewed})
    compiled = compile_graph(torch.fx.symbolic_trace(_graph), [x, w], backend=backend)
    got, expected = compiled(x, w), eager(_graph, x, w)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
        assert a.shape == b.shape and a.stride() == b.stride()
    # the two outputs of one buffer are tensors of their own, as in eager
    assert got[1] is not got[2] and got[1].data_ptr() == got[2].data_ptr()
    strided = backend.last_wrapper.count(".as_strided(")
    if as_viewed:
        # the mm's operand and one of the sigmoid's two views pass the tensor itself
        assert ".as_strided((32, 8), (8, 1), 0)" not in backend.last_wrapper
        assert ".as_strided((2, 8, 16), (128, 1, 8), 0)" not in backend.last_wrapper
        assert strided == 1, backend.last_wrapper
    else:
        assert ".as_strided((32, 8), (8, 1), 0)" in backend.last_wrapper
        assert strided == 3, backend.last_wrapper
    got[1].mul_(0)  # outputs may be written by the caller: the other view sees it, as in eager
    assert got[2].abs().sum() == 0
