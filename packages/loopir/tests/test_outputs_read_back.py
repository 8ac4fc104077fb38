"""A graph output that other nodes read is realized when it is computed, and its readers load it
(Note [Outputs read back] in graph.py): a training forward's saved residual sums, which the next
layer reads again. Against eager through the reference interpreter, with the option on and off;
kiln's tests/test_residual_saves.py runs the C++ kernels of a training step."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import check

from kiln_loopir.ir import ComputedBuffer, InputBuffer
from kiln_loopir.scheduler import extract_read_writes

aten = torch.ops.aten


def _residual(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
    h1 = aten.add.Tensor(a, b)  # an output that two more nodes read
    h2 = aten.add.Tensor(h1, c)
    s = aten.sum.dim_IntList(aten.mul.Tensor(h1, h1), [-1])
    return h1, h2, s


def _reads(compiled: Any) -> dict[str, set[str]]:
    """Per computed buffer, the buffers its body loads."""
    graph = compiled.graph
    return {
        name: {d.name for d in extract_read_writes(b)[0]}
        for name, b in graph.name_to_buffer.items()
        if isinstance(b, ComputedBuffer)
    }


def _inputs(compiled: Any) -> set[str]:
    return {b.name for b in compiled.graph.graph_inputs if isinstance(b, InputBuffer)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("on", [True, False])
def test_an_output_read_again_is_loaded_not_recomputed(on: bool, dtype: torch.dtype) -> None:
    args = [torch.randn(6, 32, dtype=dtype) for _ in range(3)]
    compiled = check(_residual, *args, options={"outputs_read_back": on})
    reads, inputs = _reads(compiled), _inputs(compiled)
    # the buffers that load both a and b: h1's alone with the option, every reader of h1 without
    a, b, _ = sorted(inputs)
    both = [name for name, r in reads.items() if {a, b} <= r]
    assert len(both) == (1 if on else 3), reads
    if on:
        (h1,) = both
        assert sum(h1 in r for r in reads.values()) == 2, reads  # h2 and the sum load it
    assert ("outputs_read_back" in str(compiled.passes.record)) is not on


def test_an_output_of_one_load_stays_inlined() -> None:
    def f(a: torch.Tensor, c: torch.Tensor) -> Any:
        h = aten.mul.Tensor(a, 2.0)
        return h, aten.add.Tensor(h, c)

    args = [torch.randn(6, 32) for _ in range(2)]
    compiled = check(f, *args)
    reads, inputs = _reads(compiled), _inputs(compiled)
    a = min(inputs)
    assert sum(a in r for r in reads.values()) == 2, reads  # recomputing it costs what loading it does
