"""Index math: FloorDiv/ModularIndexing rules, range-aware simplification, loop merging."""

from __future__ import annotations

import itertools

import pytest
import sympy

from kiln_loopir.indexing import (
    FloorDiv,
    ModularIndexing,
    as_strided_params,
    contiguous_strides,
    linear_index,
    loop_vars,
    merge_loops,
    simplify_index,
)
from kiln_loopir.interpret import evaluate
from kiln_loopir.lowerings.views import reshape_indexer

x0, x1, x2 = loop_vars("x", 3)
Int = sympy.Integer


def test_constant_folding_and_trivial_divisors() -> None:
    assert FloorDiv(Int(17), Int(5)) == 3
    assert ModularIndexing(Int(17), Int(2), Int(5)) == 3
    assert FloorDiv(x0, Int(1)) == x0
    assert ModularIndexing(x0, Int(3), Int(1)) == 0
    assert FloorDiv(FloorDiv(x0, Int(2)), Int(3)) == FloorDiv(x0, Int(6))


def test_multiples_leave_floor_div_and_modulus() -> None:
    assert FloorDiv(8 * x0 + x1, Int(4)) == 2 * x0 + FloorDiv(x1, Int(4))
    assert ModularIndexing(12 * x0 + x1, Int(2), Int(3)) == ModularIndexing(x1, Int(2), Int(3))


def test_ranges_remove_divisions() -> None:
    ranges = {x0: Int(4), x1: Int(8)}
    assert simplify_index(FloorDiv(x1, Int(8)), ranges) == 0
    assert simplify_index(ModularIndexing(x1, Int(1), Int(8)), ranges) == x1
    assert simplify_index(8 * x0 + ModularIndexing(x1, Int(1), Int(8)), ranges) == 8 * x0 + x1


def test_digits_recombine() -> None:
    e = 2 * x1 + x2
    split = 8 * FloorDiv(e, Int(8)) + ModularIndexing(e, Int(1), Int(8))
    assert simplify_index(split, {x1: Int(8), x2: Int(2)}) == e


def test_merge_loops_collapses_contiguous_dims() -> None:
    sizes, index = merge_loops((Int(4), Int(8)), 8 * x0 + x1, (x0, x1))
    assert sizes == (Int(32),)
    sizes_t, _ = merge_loops((Int(4), Int(8)), x0 + 4 * x1, (x0, x1))
    assert sizes_t == (Int(4), Int(8))  # transposed: nothing to merge
    assert merge_loops((Int(32),), x0, (x0,)) == (sizes, index)
    assert merge_loops((Int(1), Int(32)), x1, (x0, x1)) == (sizes, index)


def test_as_strided_params() -> None:
    assert as_strided_params(3 + 5 * x0 + x1, [x0, x1]) == ([5, 1], 3)
    assert as_strided_params(FloorDiv(x0, Int(2)), [x0]) is None


RESHAPES = [
    ([4, 6], [24]), ([4, 6], [2, 12]), ([4, 6], [3, 8]), ([2, 3, 4], [6, 4]), ([2, 3, 4], [4, 3, 2]),
    ([6, 4], [2, 3, 2, 2]), ([1, 12, 1], [3, 1, 4]), ([5], [1, 5, 1]), ([2, 2, 3], [12]),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new"), RESHAPES)
def test_reshape_index_matches_row_major(old: list[int], new: list[int]) -> None:
    """Reading a contiguous buffer through a reshape visits the same offsets as flat order."""
    old_s, new_s = [Int(s) for s in old], [Int(s) for s in new]
    reindex = reshape_indexer(old_s, new_s)
    vars_ = loop_vars("v", len(new))
    offset = linear_index(reindex(vars_), contiguous_strides(old_s))
    simple = simplify_index(offset, dict(zip(vars_, new_s, strict=True)))
    for flat, idx in enumerate(itertools.product(*[range(s) for s in new])):
        env = dict(zip(vars_, idx, strict=True))
        assert int(evaluate(offset, env)) == flat
        assert int(evaluate(simple, env)) == flat
    # a reshape of contiguous memory simplifies to affine arithmetic
    assert as_strided_params(simple, vars_) is not None
