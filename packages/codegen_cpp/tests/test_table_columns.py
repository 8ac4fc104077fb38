"""Note [A small table's columns innermost] (kernel.py): a relative-position bias, a small table
gathered through an index of (query, key) into an output laid out heads first, runs its head
loop innermost and scalar after the index is made once per (query, key); results match eager
with the switch on and off, and a bad index still raises."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from cpp_check import aten, check, make


def _bias(rel: torch.Tensor, table: torch.Tensor) -> Any:
    # T5's bucket, in small: the sign picks a half of the table, the distance the row in it
    half = table.shape[0] // 2
    side = aten.mul.Tensor(aten._to_copy.default(aten.gt.Scalar(rel, 0), dtype=torch.int64), half)
    bucket = aten.add.Tensor(side, aten.abs.default(rel))
    values = aten.embedding.default(table, bucket)  # [q, k, heads]
    return aten.clone.default(aten.permute.default(values, [2, 0, 1]), memory_format=torch.contiguous_format)


def _kernel(source: str) -> str:
    kernel = source[source.index('extern "C" int64_t cpp_fused') :]
    kernel = kernel[: kernel.index("\n}\n")]
    return kernel[kernel.rindex("} else {") :] if "} else {" in kernel else kernel


@pytest.mark.parametrize("inner", [True, False])
@pytest.mark.parametrize("heads", [4, 12])
def test_head_loop_inside_after_the_bucket(inner: bool, heads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CPP_OPTIONS", f"table_columns_inner={int(inner)}")
    rel = torch.randint(-15, 16, (48, 40), generator=torch.Generator().manual_seed(0))
    table = make((32, heads))
    compiled = check(_bias, rel, table)
    serial = _kernel(compiled.backend.last_source)  # type: ignore[attr-defined]
    column = re.search(rf"for \(int64_t (x\d) = 0; \1 < INT64_C\({heads}\); \+\+\1\) \{{", serial)
    assert column is not None
    body = serial[column.end() :]
    # on: the index and its check before the head loop, only the gather and store inside it,
    # and no omp simd (it would gather again); off: the head loop outside the vectorized one
    assert ("int64_t ind" not in body and "#pragma omp simd" not in serial) is inner
    assert ("#pragma omp simd" in body) is not inner
    bad = rel.clone()
    bad[3, 4] = 40  # row 56 of 32
    with pytest.raises(IndexError):
        compiled(bad, table)


def test_wide_tables_keep_the_store_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table of more columns than TABLE_COLUMNS_MAX keeps its columns outside the vector loop."""
    monkeypatch.setenv("KILN_CPP_OPTIONS", "table_columns_inner=1")
    rel = torch.randint(-15, 16, (40, 48), generator=torch.Generator().manual_seed(0))
    compiled = check(_bias, rel, make((32, 24)))
    serial = _kernel(compiled.backend.last_source)  # type: ignore[attr-defined]
    assert re.search(r"#pragma omp simd[^}]*int64_t ind\d+ = ", serial) is not None
