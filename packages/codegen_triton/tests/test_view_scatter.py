"""``slice_scatter`` and ``select_scatter`` as pointwise kernels through Triton (Note [View
scatters are pointwise] in kiln_loopir's lowerings/memory.py), against eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from triton_check import DEVICES, aten, check, make

from kiln_codegen_triton import TritonBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import scatter_of_no_elements, trace


def _view_scatters(base: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor, s3: torch.Tensor) -> Any:
    zero = aten.zeros_like.default(base)
    a = aten.slice_scatter.default(zero, aten.mul.Tensor(s1, s1), 1, 1, 4)
    b = aten.slice_scatter.default(base, s2, 2, 1, None, 2)
    c = aten.select_scatter.default(base, s3, 0, -1)
    d = aten.slice_scatter.default(base, s1, -2, -4, -1)
    e = aten.slice_scatter.default(aten.slice_scatter.default(zero, s2, 2, 0, 6, 2), s2, 2, 1, None, 2)
    return a, b, c, d, e


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_view_scatters_are_pointwise(dtype: torch.dtype, device: str) -> None:
    inputs = (make((2, 6, 7), dtype), make((2, 3, 7), dtype), make((2, 6, 3), dtype), make((6, 7), dtype))
    check(_view_scatters, *inputs, device=device)
    moved = [t.to(device) for t in inputs]
    compiled = compile_graph(trace(_view_scatters), moved, backend=TritonBackend())
    assert compiled.stats.extern_calls == 0, compiled.stats.extern_ops
    assert compiled.stats.buffers == 5, compiled.schedule.describe()  # one per output


@pytest.mark.parametrize("device", DEVICES)
def test_a_scatter_of_no_elements_binds_its_name(device: str) -> None:
    # Note [Scatters with no elements] (codegen_cpp's wrapper): alias fuzzer seed 881
    check(scatter_of_no_elements, make((5, 6), torch.float32), torch.tensor([0, 2, 4]), device=device)
