"""maximum/minimum and the max/min reductions on NaN, signed zeros and infinities, exactly.

Note [Maximum and minimum as two selects] (prelude.py): the two-select spelling must give the
same bits as the or'ed select it replaced (``select_minmax=False``), and both must match eager:
a NaN in either operand wins; of equal values the second operand is kept (eager's vectorized
kernels do that; its scalar tail keeps the first, so eager's own sign of a zero tie is not a
rule to copy).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from cpp_check import In, aten, eager, graph_of

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph

SPECIAL = [float("nan"), float("-inf"), -1.5, -0.0, 0.0, 1.5, float("inf")]
DTYPES = [torch.float32, torch.bfloat16]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits, every NaN made one pattern (a NaN's payload is not specified)."""
    t = torch.where(t.isnan(), torch.full_like(t, float("nan")), t)
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _run(calls: list, inputs: list[torch.Tensor], select: bool) -> list[torch.Tensor]:
    gm = graph_of(calls, len(inputs))
    backend = CppBackend(options={"select_minmax": select})
    out = compile_graph(gm, inputs, backend=backend)(*inputs)
    assert backend.last_declined == [], backend.last_declined
    return list(out)


def _check(calls: list, inputs: list[torch.Tensor], exact: int) -> list[torch.Tensor]:
    """The outputs, checked; the first ``exact`` equal eager's exactly (others: its tolerance)."""
    expected = eager(graph_of(calls, len(inputs)), *inputs)
    new, old = _run(calls, inputs, True), _run(calls, inputs, False)
    for i, (got, was, want) in enumerate(zip(new, old, expected, strict=True)):
        assert got.dtype == want.dtype and got.shape == want.shape
        tolerance = {"rtol": 0, "atol": 0} if i < exact else {}
        torch.testing.assert_close(got, want, equal_nan=True, **tolerance)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(_bits(got), _bits(was))  # the old spelling's bits, zeros' signs too
    return new


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pointwise_special_pairs(dtype: torch.dtype) -> None:
    pairs = list(itertools.product(SPECIAL, SPECIAL))
    # long enough for the vector loop and a scalar tail: each pair 9 times, 441 elements
    a = torch.tensor([p[0] for p in pairs] * 9, dtype=dtype)
    b = torch.tensor([p[1] for p in pairs] * 9, dtype=dtype)
    calls = [
        (aten.maximum.default, (In(0), In(1)), {}),
        (aten.minimum.default, (In(0), In(1)), {}),
        (aten.clamp_min.default, (In(0), 0.0), {}),
        (aten.clamp_max.default, (In(0), -0.0), {}),
        (aten.clamp.default, (In(0), -1.0, 1.0), {}),
        (aten.hardtanh.default, (In(0), -1.0, 1.0), {}),
    ]
    high, low = _check(calls, [a, b], exact=len(calls))[:2]
    nan = a.isnan() | b.isnan()
    # the rule itself: NaN from either side; the larger (smaller), the second operand on a tie
    assert torch.equal(high.isnan(), nan) and torch.equal(low.isnan(), nan)
    want_high = torch.where(a > b, a, b)
    want_low = torch.where(a < b, a, b)
    assert torch.equal(_bits(high)[~nan], _bits(want_high)[~nan])
    assert torch.equal(_bits(low)[~nan], _bits(want_low)[~nan])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [5, 64, 771])
def test_reductions_special_rows(dtype: torch.dtype, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    rows = []
    for value in SPECIAL:  # a row of randn with one special value at each of a few positions
        for pos in sorted({0, n // 3, n - 1}):
            row = torch.randn(n, generator=g)
            row[pos] = value
            rows.append(row)
    for first in (-0.0, 0.0):  # rows of zeros of both signs, the other sign first or last
        row = torch.full((n,), -first)
        row[0] = first
        rows.append(row)
        rows.append(-row)
    rows.append(torch.full((n,), float("-inf")))
    rows.append(torch.full((n,), float("inf")))
    x = torch.stack(rows).to(dtype)
    calls = [
        (aten.amax.default, (In(0), [1]), {}),
        (aten.amin.default, (In(0), [1]), {}),
        (aten.amax.default, (In(0), [0]), {}),
        (aten.amin.default, (In(0), [0]), {}),
        (aten.max.default, (In(0),), {}),
        (aten._softmax.default, (In(0), 1, False), {}),
    ]
    out = _check(calls, [x], exact=len(calls) - 1)
    assert torch.equal(out[0].isnan(), x.isnan().any(1))
