"""Index math: FloorDiv/ModularIndexing rules, range-aware simplification, loop merging."""

from __future__ import annotations

import itertools

import pytest
import sympy

from kiln_loopir import sizevars
from kiln_loopir.indexing import (
    FloorDiv,
    ModularIndexing,
    as_strided_params,
    contiguous_strides,
    drop_low_terms,
    linear_index,
    loop_vars,
    merge_loops,
    simplify_index,
    simplify_reordered,
    simplify_rewritten,
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


def test_common_factors_cancel() -> None:
    assert FloorDiv(8 * x0 + 4 * x1, Int(12)) == FloorDiv(2 * x0 + x1, Int(3))
    assert ModularIndexing(6 * x0, Int(4), Int(5)) == ModularIndexing(3 * x0, Int(2), Int(5))


def test_ranges_remove_divisions() -> None:
    ranges = {x0: Int(4), x1: Int(8)}
    assert simplify_index(FloorDiv(x1, Int(8)), ranges) == 0
    assert simplify_index(ModularIndexing(x1, Int(1), Int(8)), ranges) == x1
    assert simplify_index(8 * x0 + ModularIndexing(x1, Int(1), Int(8)), ranges) == 8 * x0 + x1


def test_digits_recombine() -> None:
    e = 2 * x1 + x2
    split = 8 * FloorDiv(e, Int(8)) + ModularIndexing(e, Int(1), Int(8))
    assert simplify_index(split, {x1: Int(8), x2: Int(2)}) == e


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        # the column kernel's flat position x0 + 32*x1 (x0 < 32) in a producer's digits
        (ModularIndexing(x0 + 32 * x1, Int(512), Int(16)), ModularIndexing(x1, Int(16), Int(16))),
        (FloorDiv(x0 + 32 * x1, Int(8192)), FloorDiv(x1, Int(256))),
        (ModularIndexing(x0 + 32 * x1, Int(32), Int(16)), ModularIndexing(x1, Int(1), Int(16))),
        # the low part x0 + 4*x2 reaches 59, past the 32 it must stay below: left alone
        (FloorDiv(x0 + 4 * x2 + 32 * x1, Int(64)), FloorDiv(x0 + 4 * x2 + 32 * x1, Int(64))),
        # a negative low term may borrow from the high part: left alone
        (FloorDiv(32 * x1 - 1, Int(64)), FloorDiv(32 * x1 - 1, Int(64))),
        # 16 does not divide the low part's bound (32): left alone
        (FloorDiv(x0 + 32 * x1, Int(16)), FloorDiv(x0 + 32 * x1, Int(16))),
    ],
)
def test_drop_low_terms(expr: sympy.Expr, want: sympy.Expr) -> None:
    ranges = {x0: Int(32), x1: Int(512), x2: Int(8)}
    got = drop_low_terms(expr, ranges)
    assert got == want
    # the same value at every point (x1 >= 1: index expressions are never negative)
    for a, b, c in itertools.product(range(0, 32, 5), range(1, 512, 37), range(8)):
        env = {x0: a, x1: b, x2: c}
        assert evaluate(got, env) == evaluate(expr, env), (got, expr, env)


def test_simplify_rewritten_runs_to_a_fixed_point() -> None:
    """Note [Two rewrites of low terms under a division]: the rewrite and ``simplify_index`` run
    until nothing changes, or ``rounds`` times."""
    ranges = {x0: Int(32), x1: Int(512)}
    seen: list[sympy.Expr] = []

    def rewrite(expr: sympy.Expr, within: object) -> sympy.Expr:
        seen.append(expr)
        return drop_low_terms(expr, ranges)

    expr = ModularIndexing(x0 + 32 * x1, Int(512), Int(16))
    want = ModularIndexing(x1, Int(16), Int(16))
    assert simplify_rewritten(rewrite, expr, ranges) == want
    assert seen == [expr, want]  # the second round changed nothing
    assert simplify_reordered(expr, ranges) == want
    seen.clear()
    assert simplify_rewritten(rewrite, expr, ranges, rounds=1) == want and seen == [expr]


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
    # Note [Views with symbolic strides]: size symbols may appear in strides and offset, no other
    s0, s1, t = sympy.symbols("s0 s1 tmp0", integer=True, positive=True)
    assert as_strided_params(16 + 48 * s1 * x0 + 48 * x1, [x0, x1], {s0, s1}) == ([48 * s1, 48], 16)
    assert as_strided_params(s0 + x0, [x0], {s0}) == ([1], s0)
    assert as_strided_params(48 * s1 * x0, [x0]) is None
    assert as_strided_params(t * x0, [x0], {s0, s1}) is None


def test_remembered_view_parameters_are_keyed_by_the_size_symbols_and_fresh() -> None:
    # Note [View parameters are memoized]: the same index is a view with s1 a size symbol, and
    # not one where s1 is another symbol; a caller may change the strides list it gets
    s1 = sympy.Symbol("s1", integer=True, positive=True)
    index = 48 * s1 * x0 + x1
    for _ in range(2):
        assert as_strided_params(index, [x0, x1], {s1}) == ([48 * s1, 1], 0)
        assert as_strided_params(index, [x0, x1]) is None
    got = as_strided_params(index, [x0, x1], {s1})
    assert got is not None
    got[0].append(Int(7))
    assert as_strided_params(index, [x0, x1], {s1}) == ([48 * s1, 1], 0)


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


def test_symbolic_divisors() -> None:
    """Note [Symbolic divisors]: multiples of a size symbol leave its division, a loop variable
    whose range is the divisor divides to 0, and a split with symbolic coefficients recombines."""
    from kiln_loopir.sizevars import SizeVars, using

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    x, r = sympy.symbols("x r", integer=True, nonnegative=True)
    flat = x * s1 + r
    assert FloorDiv(flat, s1) == x + FloorDiv(r, s1)
    assert ModularIndexing(flat, Int(1), s1) == ModularIndexing(r, Int(1), s1)
    assert FloorDiv(r + 1, s1) == FloorDiv(r + 1, s1)  # nothing to split: unchanged
    ranges = {x: s0, r: s1}
    assert simplify_index(FloorDiv(flat, s1), ranges) == x
    assert simplify_index(ModularIndexing(flat, Int(1), s1), ranges) == r
    assert simplify_index(FloorDiv(r, s0), ranges) == FloorDiv(r, s0)  # r < s1 says nothing of s0
    e = r + x * s0
    split = s1 * FloorDiv(e, s1) + ModularIndexing(e, Int(1), s1)
    with using(SizeVars(hints={s0: 5, s1: 7})):
        assert simplify_index(split, {x: s1, r: s0}) == e
        row = 32 * s1 * FloorDiv(x, s1) + 32 * ModularIndexing(x, Int(1), s1) + r
        assert simplify_index(row, {x: s0 * s1, r: Int(32)}) == 32 * x + r
    # outside a graph with those size symbols the coefficients are not known to be sizes
    assert simplify_index(split, {x: s1, r: s0}) != e


def test_a_rows_offset_leaves_a_symbolic_division() -> None:
    """Note [Symbolic divisors], ``_drop_low_symbolic``: ``(r + 64*x) // (64*s1)`` with ``r < 64``
    is ``x // s1``, so a fused layer norm's load of its row statistics is its own store's index
    (``x``) and the digits of a flat position recombine; a low part that may reach 64 stays."""
    from kiln_loopir.sizevars import SizeVars, using

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    x, r = sympy.symbols("x r", integer=True, nonnegative=True)
    flat = r + 64 * x
    ranges = {x: s0 * s1, r: Int(64)}
    assert simplify_index(FloorDiv(flat, 64 * s1), ranges) == FloorDiv(x, s1)
    assert simplify_index(ModularIndexing(flat, 64 * s1, s0), ranges) == FloorDiv(x, s1)  # x < s0*s1
    assert simplify_index(ModularIndexing(flat, 64 * s1, s0), {x: 2 * s0 * s1, r: Int(64)}) == (
        ModularIndexing(x, s1, s0)
    )
    with using(SizeVars(hints={s0: 5, s1: 7})):
        stats = s1 * FloorDiv(flat, 64 * s1) + ModularIndexing(x, Int(1), s1)
        assert simplify_index(stats, ranges) == x
        store = r + 64 * ModularIndexing(x, Int(1), s1) + 64 * s1 * FloorDiv(flat, 64 * s1)
        assert simplify_index(store, ranges) == flat
    wide = {x: s0 * s1, r: Int(65)}
    assert simplify_index(FloorDiv(flat, 64 * s1), wide) == FloorDiv(flat, 64 * s1)


def test_a_digit_whose_modulus_is_a_size_symbol_folds_where_the_position_is_below_it() -> None:
    """Note [Digits under symbolic sizes]: GPT-2's ``view(b, t, 256)`` read in its own loops,
    ``(r + 256*x1) // 256 % s1`` with ``r < 256`` and ``x1 < s1``, is ``x1``; the proof uses the
    largest value as an expression (``255 + 256*(s1 - 1)`` below ``256*s1``), and fails (the
    digit stays) when a loop may reach past it. Each answer is checked against the arithmetic."""
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    r = sympy.Symbol("r", integer=True, nonnegative=True)
    digit = ModularIndexing(r + 256 * x1, Int(256), s1)
    ranges = {x0: s0, x1: s1, r: Int(256)}
    assert simplify_index(r + 256 * digit + 256 * s1 * x0, ranges) == r + 256 * x1 + 256 * s1 * x0
    assert simplify_index(digit, ranges) == x1
    assert simplify_index(ModularIndexing(x1, Int(1), s1), ranges) == x1
    # r may reach 256 (a carry into the next digit), x1 may reach s1: neither folds
    assert simplify_index(digit, {**ranges, r: Int(257)}).has(ModularIndexing)
    assert simplify_index(digit, {**ranges, x1: s1 + 1}).has(ModularIndexing)
    # a factor without a range (a size symbol) gives no bound: left as it is
    assert simplify_index(ModularIndexing(r + 256 * s0, Int(256), s1), ranges).has(ModularIndexing)
    for hs0, hs1, vx0, vx1, vr in itertools.product((2, 3), (2, 5), (0, 1), (0, 1), (0, 255)):
        env = {s0: hs0, s1: hs1, x0: vx0, x1: min(vx1, hs1 - 1), r: vr}
        whole = r + 256 * digit + 256 * s1 * x0
        assert int(evaluate(whole, env)) == int(evaluate(simplify_index(whole, ranges), env))


def test_a_negative_base_is_not_below_a_symbolic_divisor() -> None:
    """Note [Bounds of indices that may be negative]: position ``s0**2 - 19`` of a flat
    ``(s0, s0)`` view splits into ``s0 + (-19 // s0)`` and ``-19 % s0``; -19's largest value is
    below any size, but the base is negative: the digits stay (they folded to ``s0`` and ``-19``,
    a read 18 rows before the tensor). Checked against the arithmetic."""
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    pos = s0**2 - 19
    with sizevars.using(sizevars.SizeVars(hints={s0: 5})):
        digits = reshape_indexer([s0, s0], [s0**2])([pos])
        got = [simplify_index(d, {}) for d in digits]
    for n in (5, 6, 9):
        assert [int(evaluate(d, {s0: n})) for d in got] == list(divmod(n * n - 19, n))
    assert simplify_index(FloorDiv(Int(-3), Int(4)), {}) == -1
    assert simplify_index(ModularIndexing(x0 - 1, Int(1), Int(4)), {x0: Int(3)}).has(ModularIndexing)


def test_broadcast_accepts_one_size_written_two_ways() -> None:
    """A flatten and a view spell one symbolic size differently (`(s - 2)*(4*s - 8)` and
    `4*s**2 - 16*s + 16`): they broadcast; sizes that differ still do not."""
    from kiln_loopir.lowering import broadcast_sizes

    s = sympy.Symbol("s", integer=True, positive=True)
    a, b = (s - 2) * (4 * s - 8), 4 * s**2 - 16 * s + 16
    out = broadcast_sizes((sympy.Integer(3), a), (sympy.Integer(1), b))
    assert out[0] == 3 and sympy.expand(out[1] - a) == 0
    with pytest.raises(RuntimeError, match="do not broadcast"):
        broadcast_sizes((a,), (b + 1,))


class _Truncating(int):
    """An int whose ``//`` and ``%`` truncate toward zero, as C++'s and Triton's do."""

    def __floordiv__(self, other: int) -> _Truncating:  # type: ignore[override]
        q = abs(int(self)) // abs(int(other))
        return _Truncating(q if (self < 0) == (other < 0) else -q)

    def __mod__(self, other: int) -> _Truncating:  # type: ignore[override]
        return _Truncating(int(self) - int(other) * int(self // other))

    def __add__(self, other: int) -> _Truncating:  # type: ignore[override]
        return _Truncating(int(self) + int(other))

    def __sub__(self, other: int) -> _Truncating:  # type: ignore[override]
        return _Truncating(int(self) - int(other))


def test_floor_division_text_floors_with_truncating_operators() -> None:
    """Note [Floor division of values that may be negative]: the text both code generators emit
    for ``a // b`` and ``a % b`` gives Python's floor results when run with truncating operators,
    for a numerator of any sign; a numerator known non-negative keeps the plain form."""
    from kiln_loopir.indexing import floor_division_text, floor_modulo_text

    s = sympy.Symbol("s", integer=True, positive=True)
    a = 3 - s  # any sign
    div = floor_division_text(a, sympy.Integer(4), "a", "b", "//")
    mod = floor_modulo_text(a, sympy.Integer(4), "a", "b")
    for value in range(-13, 14):
        env = {"a": _Truncating(value), "b": _Truncating(4)}
        assert eval(div, env) == value // 4 and eval(mod, env) == value % 4, value
    assert floor_division_text(s, sympy.Integer(4), "a", "b", "/") == "(a / b)"
    with pytest.raises(NotImplementedError):
        floor_division_text(a, -s, "a", "b", "//")


def test_a_size_expression_is_its_own_largest_value() -> None:
    """Note [Digits under symbolic sizes]: a mean over a pooled image of symbolic size reads its
    input at the flat position ``r1 + n*r0 + n*n*x1`` with ``n = s2 // 16`` and ``r0, r1 < n``;
    its digits fold to ``x1``, ``r0``, ``r1`` only when ``n``, a size expression, bounds itself
    (without that, a small CNN's last kernel kept three divisions and moduli per element and ran
    ~40x slower than the static one). A loop variable never counts as a size. Each answer is
    checked against the arithmetic."""
    s2 = sympy.Symbol("s2", integer=True, positive=True)
    n = FloorDiv(s2, Int(16))
    r0, r1 = loop_vars("r", 2)
    ranges = {x0: Int(2), x1: Int(128), r0: n, r1: n}
    flat = r1 + r0 * n + x1 * n * n
    digits = {
        FloorDiv(flat, n * n): x1,
        ModularIndexing(flat, n, n): r0,
        ModularIndexing(flat, Int(1), n): r1,
    }
    for expr, folded in list(digits.items())[:2]:
        assert simplify_index(expr, ranges) != folded  # no size symbols known: no bound
    with sizevars.using(sizevars.SizeVars(hints={s2: 64})):
        for expr, folded in digits.items():
            assert simplify_index(expr, ranges) == folded
            assert simplify_index(ModularIndexing(flat + x2, n, n), ranges).has(ModularIndexing)
    for hs2, vx1, vr0, vr1 in itertools.product((16, 40, 64), (0, 5), (0, 1, 3), (0, 2, 3)):
        hn = hs2 // 16
        env = {s2: hs2, x1: vx1, r0: min(vr0, hn - 1), r1: min(vr1, hn - 1)}
        for expr, folded in digits.items():
            assert int(evaluate(expr, env)) == int(evaluate(folded, env))


def test_a_division_of_sizes_is_a_stride_not_a_digit() -> None:
    """Note [Views with symbolic strides], Note [Symbolic divisors]: over a pooled image of side
    ``n = s2 // 4`` (ConvNeXt's stem under ``dynamic=True``), the ``[N*n*n, C]`` view of an
    ``[N, n, n, C]`` buffer recombines to ``C*v0 + v1`` and is an ``as_strided`` view, and a
    permute's strides ``(C*n*n, 1, C*n, C)`` are strides; a division of a loop variable is not."""
    s0, s2 = sympy.symbols("s0 s2", integer=True, positive=True)
    n = FloorDiv(s2, Int(4))
    old, new = [s0, n, n, Int(32)], [s0 * n * n, Int(32)]
    v = loop_vars("v", 2)
    with sizevars.using(sizevars.SizeVars(hints={s0: 2, s2: 64})):
        flat = linear_index(reshape_indexer(old, new)(list(v)), contiguous_strides(old))
        assert simplify_index(flat, dict(zip(v, new, strict=True))) == 32 * v[0] + v[1]
    assert as_strided_params(32 * v[0] + v[1], v, {s0, s2}) == ([32, 1], 0)
    x = loop_vars("x", 4)
    permuted = 32 * n * n * x[0] + x[1] + 32 * n * x[2] + 32 * x[3]
    assert as_strided_params(permuted, x, {s0, s2}) == ([32 * n**2, 1, 32 * n, 32], 0)
    assert as_strided_params(32 * FloorDiv(x[0], n) + x[1], x[:2], {s0, s2}) is None


def test_an_expanded_size_divides_a_group_of_terms() -> None:
    """Note [Multiples of an expanded divisor]: after a padded stride-2 pooling an image's side is
    ``n = (s2 - 1) // 32 + 1`` (ResNet's last stage under ``dynamic=True``) and its area ``n*n``
    is kept expanded, ``q**2 + 2*q + 1``; the flat position ``r1 + n*r0 + n*n*x1`` of a mean over
    that area divides by it only as a group of terms. Its digits fold to ``x1``, ``r0``, ``r1``
    (before: chains of divisions and moduli per element, ResNet's last kernel 20x its static
    compile's time), and each answer is checked against the arithmetic."""
    s2 = sympy.Symbol("s2", integer=True, positive=True)
    n = FloorDiv(s2 - 1, Int(32)) + 1
    area = sympy.expand(n * n)
    r0, r1 = loop_vars("r", 2)
    ranges = {x0: Int(2), x1: Int(256), r0: n, r1: n}
    flat = sympy.expand(r1 + r0 * n + x1 * area)
    assert FloorDiv(flat, area) == x1 + FloorDiv(sympy.expand(r1 + r0 * n), area)
    assert FloorDiv(flat + 3 * x1, area).has(FloorDiv)  # 4*x1 + ... is not a multiple: kept
    digits = {
        FloorDiv(flat, area): x1,
        ModularIndexing(flat, n, n): r0,
        ModularIndexing(flat, Int(1), n): r1,
        ModularIndexing(flat, area, Int(256)): x1,
    }
    with sizevars.using(sizevars.SizeVars(hints={s2: 64})):
        for expr, folded in digits.items():
            assert simplify_index(expr, ranges) == folded, expr
    for hs2, vx1, vr0, vr1 in itertools.product((1, 33, 64, 100), (0, 5, 255), (0, 1, 3), (0, 2, 3)):
        hn = (hs2 - 1) // 32 + 1
        env = {s2: hs2, x1: vx1, r0: min(vr0, hn - 1), r1: min(vr1, hn - 1)}
        for expr, folded in digits.items():
            assert int(evaluate(expr, env)) == int(evaluate(folded, env))
        env[x1] = vx1 + 7
        assert int(evaluate(FloorDiv(flat + 3 * x1, area), env)) == (
            int(evaluate(flat, env)) + 3 * (vx1 + 7)
        ) // (hn * hn)


def test_a_size_one_at_its_hint_stretched_to_one_that_is_not_is_stretched() -> None:
    # Note [Stretched sizes the trace proved 1] (lowering.py)
    from kiln_loopir.lowering import stretched

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    tail = s0 - 2 * FloorDiv(s0 + 2, sympy.Integer(3))  # a chunk's length, 1 at s0 = 3
    with sizevars.using(sizevars.SizeVars(hints={s0: 3, s1: 5})):
        assert stretched(sympy.Integer(1), s1) and stretched(tail, s1)
        assert not stretched(s1, s1) and not stretched(tail, tail) and not stretched(s0, s1)
    with sizevars.using(sizevars.SizeVars(hints={s0: 3, s1: 1})):
        assert not stretched(tail, s1)  # both 1 at the hints: not a stretch the trace decided
