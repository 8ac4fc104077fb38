"""Accumulating scatters in bfloat16 and float16 through `kiln.compile`, against eager bit for bit.

Eager rounds differently by op (Note [Accumulating scatters in low precision] in kiln_loopir's
lowerings/memory.py): `scatter_add` and `index_add` sum in float32 and round once,
`index_put(accumulate=True)` rounds each add. With many repeated indices the two differ far
beyond a half type's tolerance, so each op is checked with 50 adds per element, where the other
rounding would be visibly off. On the CPU backend (C++) and, without a GPU, the Triton
generator under its interpreter (bfloat16's compare-and-swap loop: Note [16-bit atomic adds]).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import kiln

BACKENDS = ["cpp"] if torch.cuda.is_available() else ["cpp", "triton"]
HALF = [torch.bfloat16, torch.float16]

OPS: dict[str, Callable[..., torch.Tensor]] = {
    "scatter_add": lambda x, rows, v: x.scatter_add(0, rows[:, None].expand_as(v), v),
    "index_add": lambda x, rows, v: x.index_add(0, rows, v),
    "index_add_alpha": lambda x, rows, v: x.index_add(0, rows, v, alpha=1),
    "index_add_": lambda x, rows, v: x.clone().index_add_(0, rows, v),
    "index_put": lambda x, rows, v: x.index_put((rows,), v, accumulate=True),
}
ROUNDED_ONCE = {"scatter_add", "index_add", "index_add_alpha", "index_add_"}


def _many_adds(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 37, generator=gen).to(dtype)
    rows = torch.randint(0, 3, (150,), generator=gen)
    return x, rows, torch.randn(150, 37, generator=gen).to(dtype)


@pytest.fixture(autouse=True)
def _reset() -> Any:
    kiln.reset()
    yield
    kiln.reset()


@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_an_accumulating_scatter_rounds_as_eager(op: str, dtype: torch.dtype, backend: str) -> None:
    x, rows, v = _many_adds(dtype)
    want = OPS[op](x, rows, v)
    got = kiln.compile(OPS[op], options={"cpu_backend": backend, "strict": True})(x, rows, v)
    assert torch.equal(got, want)
    assert not [d for r in kiln.compile_log() for d in r.declined]
    once = x.float().index_add(0, rows, v.float()).to(dtype)
    add_by_add = x.clone()
    for row, val in zip(rows.tolist(), v, strict=True):
        add_by_add[row] += val
    # the test tells the two roundings apart, and eager's is the one documented
    assert not torch.equal(once, add_by_add)
    assert torch.equal(want, once if op in ROUNDED_ONCE else add_by_add)
