"""Note [Simplified indices are memoized] and Note [Index texts are memoized] (kernel.py): the
memos answer as the functions they stand for, and a key says everything the answer depends on."""

from __future__ import annotations

import sympy

from kiln_codegen_triton import kernel
from kiln_loopir import sizevars
from kiln_loopir.indexing import FloorDiv, ModularIndexing, simplify_index

S0 = sympy.Symbol("s0", integer=True, positive=True)
X0 = sympy.Symbol("x0", integer=True, nonnegative=True)


def test_a_simplified_index_is_keyed_by_the_graphs_size_symbols() -> None:
    # the digits of x0 over a row of s0 recombine into x0 only where s0 is a size symbol of the
    # graph (Note [Symbolic divisors] in kiln_loopir.indexing): one expression, two answers
    expr = S0 * FloorDiv(X0, S0) + ModularIndexing(X0, 1, S0)
    ranges = {X0: 4 * S0}
    outside = kernel.simplify(expr, ranges)
    with sizevars.using(sizevars.SizeVars(hints={S0: 8})):
        inside = kernel.simplify(expr, ranges)
        assert inside == simplify_index(expr, ranges) == X0
    assert outside == expr
    assert kernel.simplify(expr, ranges) == outside


def test_a_repeated_index_is_simplified_once() -> None:
    expr = ModularIndexing(X0 + 64 * FloorDiv(X0, 64), 1, 64)
    ranges = {X0: sympy.Integer(4096)}
    before = kernel._simplify.cache_info()
    first = kernel.simplify(expr, ranges)
    second = kernel.simplify(expr, dict(ranges))
    after = kernel._simplify.cache_info()
    assert first is second
    assert after.hits - before.hits >= 1
    # other ranges are another question
    assert kernel.simplify(ModularIndexing(X0, 1, 64), {X0: sympy.Integer(64)}) == X0
    assert kernel.simplify(ModularIndexing(X0, 1, 64), {X0: sympy.Integer(128)}) == ModularIndexing(X0, 1, 64)


def test_index_text_is_the_expressions_own() -> None:
    a = sympy.Symbol("x0", integer=True)
    b = sympy.Symbol("x0")  # another symbol of the same name: the same text, as str gives
    for e in (a + 3 * FloorDiv(a, 7), b * 2, sympy.Integer(5)):
        assert kernel._text(e) == str(e)
