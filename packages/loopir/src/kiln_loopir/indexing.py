"""Index math: sympy expressions over loop variables, and how they are simplified.

Every memory access in a loop body is ``load(name, index)`` where ``index`` is a sympy
expression of the loop variables (``x0, x1, ...`` for the iteration space, ``r0, r1, ...`` for
reduction dimensions, and ``indirect*`` symbols produced by ``ops.indirect_indexing``). Views
never copy: they rewrite the index, so the expression carries the whole view chain. Two integer
operations that sympy's own ``floor``/``Mod`` handle poorly get their own functions here:

* ``FloorDiv(a, b)``: ``a // b`` for non-negative integers;
* ``ModularIndexing(a, d, m)``: ``(a // d) % m``, the digit of ``a`` in a mixed-radix number,
  which is what splitting a dimension by a reshape produces.

Their ``eval`` rules fold constants and strip trivial divisors and moduli; :func:`simplify_index`
then uses the ranges of the loop variables to remove divisions and moduli that cannot change
the value (a variable smaller than the divisor, a digit that covers the whole range) and to
split sums into the part each divisor keeps (Note [Symbolic divisors]). :func:`merge_loops` collapses adjacent loop
dimensions that every access walks contiguously, which is how the scheduler compares accesses
of kernels whose loops were shaped differently (a ``(4, 8)`` pointwise and a ``(32,)`` one).

Note [Symbolic divisors]: with symbolic sizes (Note [Symbolic sizes in loopir]) a digit divides by
a size symbol (``(s1*x + r) // s1``). The same identities hold and are applied where they are
exact for every value of the symbols: terms that are integer multiples of a symbolic divisor
leave the division (``x + r // s1``); a loop variable whose range is the divisor itself divides
to 0 (``r // s1`` with ``r < s1``), and one whose range is ``divisor * modulus`` needs no modulus;
``_recombine_digits`` also undoes splits whose coefficients are size symbols (``s1*(e // s1) +
e % s1 -> e``); and ``(a + g*b) // (g*s1)`` with ``0 <= a < g`` divides to ``b // s1``
(``_drop_low_symbolic``: a row's offset inside a flat position, as a fused layer norm reads its
row statistics), without which a kernel's own stores are not recognised by its loads and go
through memory (a scratch buffer, a barrier, 64-bit divisions per element). Integer divisors take exactly the paths they took before.
A division of sizes only (``s2 // 4``: an image's side after a stride-4 convolution) is a size,
not a digit: it may be a coefficient of a digit, and it may be a view's stride
(:func:`as_strided_params`); only a division of a loop variable is a digit. Before, ConvNeXt's
``[N*H*W, C]`` views and the permutes around its LayerNorms were copy kernels under
``dynamic=True`` (issue 17: 8 view and 4 permute copies a call, 1.12x the static compiles).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import TypeAlias

import sympy

Expr: TypeAlias = sympy.Expr


class FloorDiv(sympy.Function):
    """``a // b`` on non-negative integers."""

    is_integer = True
    nargs = (2,)

    @classmethod
    def eval(cls, base: Expr, divisor: Expr) -> Expr | None:
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        if not divisor.is_Number:  # Note [Symbolic divisors]
            kept, rest = _split_symbolic_multiples(base, divisor)
            if kept != 0:
                return kept + FloorDiv(rest, divisor)
            return None
        if divisor.is_Integer:
            # (k*d*a + b) // d  ->  k*a + b // d  when every kept term is a multiple of d
            kept, rest = _split_multiples(base, int(divisor))
            if kept != 0:
                return kept / divisor + FloorDiv(rest, divisor)
            # (g*a) // (g*d)  ->  a // d
            g = _common_factor(base, int(divisor))
            if g > 1:
                return FloorDiv(sympy.expand(base / g), divisor / g)
        return None


class ModularIndexing(sympy.Function):
    """``(a // d) % m`` on non-negative integers: one digit of a mixed-radix number."""

    is_integer = True
    nargs = (3,)

    @classmethod
    def eval(cls, base: Expr, divisor: Expr, modulus: Expr) -> Expr | None:
        if base == 0 or modulus == 1:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer and modulus.is_Integer:
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        if not (divisor.is_Number and modulus.is_Number):  # Note [Symbolic divisors]
            kept, rest = _split_symbolic_multiples(base, divisor * modulus)
            if kept != 0:
                return ModularIndexing(rest, divisor, modulus)
            return None
        if divisor.is_Integer and modulus.is_Integer:
            # terms that are multiples of d*m never change the digit
            _, rest = _split_multiples(base, int(divisor) * int(modulus))
            if rest != base:
                return ModularIndexing(rest, divisor, modulus)
            # ((g*a) // (g*d)) % m  ->  (a // d) % m
            g = _common_factor(base, int(divisor))
            if g > 1:
                return ModularIndexing(sympy.expand(base / g), divisor / g, modulus)
        return None


def _common_factor(expr: Expr, divisor: int) -> int:
    """The gcd of ``divisor`` and every integer coefficient of the sum ``expr``."""
    g = divisor
    for term in sympy.Add.make_args(expr):
        coeff, _ = term.as_coeff_Mul()
        if not coeff.is_Integer:
            return 1
        g = math.gcd(g, int(coeff))
    return g


def _split_multiples(expr: Expr, divisor: int) -> tuple[Expr, Expr]:
    """Split a sum into (terms whose integer coefficient is a multiple of divisor, the rest)."""
    kept: list[Expr] = []
    rest: list[Expr] = []
    for term in sympy.Add.make_args(expr):
        coeff, _ = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % divisor == 0:
            kept.append(term)
        else:
            rest.append(term)
    return sympy.Add(*kept), sympy.Add(*rest)


def _split_symbolic_multiples(expr: Expr, divisor: Expr) -> tuple[Expr, Expr]:
    """Split a sum into (the sum of its terms divided by a symbolic ``divisor``, where each quotient
    is a product with an integer coefficient, the other terms) (Note [Symbolic divisors])."""
    kept: list[Expr] = []
    rest: list[Expr] = []
    for term in sympy.Add.make_args(expr):
        q = sympy.cancel(term / divisor)
        num, den = sympy.fraction(q)
        if den == 1 and not isinstance(num, sympy.Add) and num.as_coeff_Mul()[0].is_Integer:
            kept.append(q)
        else:
            rest.append(term)
    if len(rest) > 1:  # Note [Multiples of an expanded divisor]
        grouped, rest = _split_grouped_multiples(rest, divisor)
        kept.extend(grouped)
    return sympy.Add(*kept), sympy.Add(*rest)


def _split_grouped_multiples(terms: list[Expr], divisor: Expr) -> tuple[list[Expr], list[Expr]]:
    """Note [Multiples of an expanded divisor]: a divisor that is a sum of size terms (the
    elements of a pooled image, ``(s2 // 32 + 1)**2`` kept expanded as ``q**2 + 2*q + 1``) divides
    no single term of ``x*q**2 + 2*x*q + x``, only their sum. Terms are grouped by the part that
    does not involve the divisor's symbols (a loop variable's monomial, its integer coefficient
    apart) and a group whose sum the divisor divides into a polynomial with integer coefficients
    leaves the division as that quotient times the monomial. Without it, a global average pool
    under ``dynamic=True`` read its input through chains of 64-bit divisions and moduli (issue 17:
    ResNet's last kernel 20x its static compile's time)."""
    atoms = divisor.free_symbols
    groups: dict[Expr, list[Expr]] = {}
    for term in terms:
        independent, dependent = term.as_independent(*atoms, as_Add=False)
        coeff, key = independent.as_coeff_Mul()
        groups.setdefault(key, []).append(coeff * dependent)
    kept: list[Expr] = []
    rest: list[Expr] = []
    for key, parts in groups.items():
        if len(parts) > 1 and key.free_symbols:
            q = sympy.cancel(sympy.Add(*parts) / divisor)
            num, den = sympy.fraction(q)
            if den == 1 and all(
                t.as_coeff_Mul()[0].is_Integer for t in sympy.Add.make_args(sympy.expand(num))
            ):
                kept.append(key * q)
                continue
        rest.extend(key * p for p in parts)
    return kept, rest


def loop_vars(prefix: str, count: int) -> list[sympy.Symbol]:
    """``count`` fresh non-negative integer loop variables named ``prefix0, prefix1, ...``."""
    return [_symbol(f"{prefix}{i}") for i in range(count)]


@cache
def _symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def floor_division_text(a: Expr, b: Expr, ta: str, tb: str, div: str) -> str:
    """Note [Floor division of values that may be negative]: the generated languages' integer
    division (C++'s ``/``, Triton's ``//``) and ``%`` truncate toward zero. Index values are
    non-negative, where truncation and floor agree; a size used as a scalar can be negative
    (``x + (-n) // 4``, ``(n - 7) // 3`` for small n), where truncation gave -1 for Python's -2 in
    both code generators (a wrong answer found in the eleventh session). A numerator not known
    non-negative over a positive divisor is first rounded down to a multiple of the divisor, which
    truncation then divides exactly. ``ta``/``tb`` are the operands' text, ``div`` the language's
    operator. Divisors are sizes and strides, positive whether or not sympy can prove it
    (``s - 2`` under a range of at least 3); one known not positive raises NotImplementedError
    (the kernel is declined)."""
    if b.is_nonpositive:
        raise NotImplementedError(f"index expression {a} // {b} (a divisor that is not positive)")
    if a.is_nonnegative:
        return f"({ta} {div} {tb})"
    return f"(({ta} - ((({ta} % {tb}) + {tb}) % {tb})) {div} {tb})"


def floor_modulo_text(a: Expr, m: Expr, ta: str, tm: str) -> str:
    """Python's ``a % m`` (the divisor's sign) from a truncating ``%`` (Note [Floor division of
    values that may be negative])."""
    if m.is_nonpositive:
        raise NotImplementedError(f"index expression {a} % {m} (a modulus that is not positive)")
    if a.is_nonnegative:
        return f"({ta} % {tm})"
    return f"((({ta} % {tm}) + {tm}) % {tm})"


# Note [Bounds of indices that may be negative]: `bound` and `_below` prove `base < divisor`
# from the base's largest value, which folds `base // divisor` to 0 and `base % divisor` to
# `base` only where the base is also at least 0. A negative constant index counted from the end
# of a symbolic length (`t.reshape(-1)[-19]` under dynamic shapes: position `s0**2 - 19`, split
# into the digits `s0 + (-19 // s0)` and `-19 % s0` of an `(s0, s0)` view) has a base of -19,
# whose largest value is below any size: it folded to the digits `(s0, -19)` and the kernel read
# 18 rows before the tensor (test_alias_fuzz.py --dynamic true, seed 3676). Both now answer only
# for a base proven non-negative (`_nonnegative`).
def _nonnegative(expr: Expr) -> bool:
    """``expr >= 0`` for every value of the loop variables (non-negative) and size symbols."""
    if expr.is_Integer:
        return int(expr) >= 0
    if isinstance(expr, sympy.Symbol):
        return expr.is_nonnegative is True or expr in _size_symbols()
    if isinstance(expr, ModularIndexing):
        return True
    if isinstance(expr, FloorDiv):
        return _nonnegative(expr.args[0]) and expr.args[1].is_positive is not False
    if isinstance(expr, sympy.Add):  # sympy's sign rules know `s2 - 1` of a positive size
        return all(_nonnegative(a) for a in expr.args) or expr.is_nonnegative is True
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        return bool(coeff >= 0) and all(_nonnegative(a) for a in sympy.Mul.make_args(rest))
    if isinstance(expr, sympy.Pow):
        return expr.exp.is_Integer and int(expr.exp) > 0 and _nonnegative(expr.base)
    return expr.is_nonnegative is True


def bound(expr: Expr, ranges: Mapping[sympy.Symbol, Expr]) -> int | None:
    """An upper bound (exclusive) of a non-negative integer expression, if easy to prove: one
    more than its largest value (:func:`_max_value`) when that is a number; None for one that
    may be negative (Note [Bounds of indices that may be negative])."""
    if not _nonnegative(expr):
        return None
    top = _max_value(expr, ranges)
    return int(top) + 1 if top is not None and top.is_Integer else None


def simplify_index(expr: Expr, ranges: Mapping[sympy.Symbol, Expr]) -> Expr:
    """Simplify ``expr`` knowing each loop variable ``v`` lies in ``[0, ranges[v])``."""
    expr = sympy.expand(expr)
    if not expr.has(FloorDiv, ModularIndexing):
        return expr

    def visit(node: Expr) -> Expr:
        if not node.args:
            return node
        args = [visit(a) for a in node.args]
        node = node.func(*args)
        if isinstance(node, FloorDiv | ModularIndexing) and not node.args[1].is_Integer:
            node = _drop_low_symbolic(node, ranges)  # Note [Symbolic divisors]
            if not isinstance(node, FloorDiv | ModularIndexing):
                return node
        if isinstance(node, FloorDiv):
            base, divisor = node.args
            b = bound(base, ranges)
            if b is not None and divisor.is_Integer and b <= int(divisor):
                return sympy.Integer(0)
            if not divisor.is_Integer and _below(base, divisor, ranges):  # Note [Symbolic divisors]
                return sympy.Integer(0)
        if isinstance(node, ModularIndexing):
            base, divisor, modulus = node.args
            b = bound(base, ranges)
            if (
                b is not None
                and divisor.is_Integer
                and modulus.is_Integer
                and b <= int(divisor) * int(modulus)
            ):
                return FloorDiv(base, divisor)
            if not (divisor.is_Integer and modulus.is_Integer) and _below(base, divisor * modulus, ranges):
                return visit(FloorDiv(base, divisor))  # Note [Digits under symbolic sizes]
        return node

    return _recombine_digits(sympy.expand(visit(expr)))


def drop_low_terms(expr: Expr, ranges: Mapping[sympy.Symbol, Expr]) -> Expr:
    """``(a + g*b) // (g*k)  ->  b // k`` and ``((a + g*b) // (g*k)) % m  ->  (b // k) % m``
    where ``0 <= a < g`` over the loops' ``ranges``, throughout ``expr`` (static divisors only).

    A flat position of one loop order, split into the digits of another's, reads like that: the
    column reduction's ``x0 + 32*r0`` (``x0 < 32``) taken apart by a producer's ranges ``[16,
    16, 32]`` (Note [Pointwise producers in a column reduction's order]). ``simplify_index``
    leaves these alone (the Triton generator's code depends on its exact rules); the scheduler
    applies this to the positions it re-expresses.
    """

    def split(base: Expr, divisor: Expr) -> tuple[Expr, int] | None:
        if not divisor.is_Integer:
            return None
        d = int(divisor)
        coeffs = set()
        for term in sympy.Add.make_args(base):
            c, _ = term.as_coeff_Mul()
            if not c.is_Integer or int(c) < 0:
                return None  # a negative term: ``a`` may be below 0
            coeffs.add(math.gcd(d, int(c)))
        for g in sorted((c for c in coeffs if c > 1), reverse=True):
            kept, rest = _split_multiples(base, g)
            b = bound(rest, ranges)
            if kept != 0 and rest != 0 and b is not None and b <= g:
                return sympy.expand(kept / g), g
        return None

    def visit(node: Expr) -> Expr:
        if not node.args:
            return node
        node = node.func(*[visit(a) for a in node.args])
        if isinstance(node, FloorDiv):
            found = split(*node.args)
            if found is not None:
                return FloorDiv(found[0], node.args[1] / found[1])
        if isinstance(node, ModularIndexing):
            found = split(node.args[0], node.args[1])
            if found is not None:
                return ModularIndexing(found[0], node.args[1] / found[1], node.args[2])
        return node

    return visit(sympy.expand(expr)) if expr.has(FloorDiv, ModularIndexing) else expr


def simplify_rewritten(
    rewrite: Callable[[Expr, Mapping[sympy.Symbol, Expr]], Expr],
    expr: Expr,
    ranges: Mapping[sympy.Symbol, Expr],
    rounds: int = 4,
) -> Expr:
    """``simplify_index`` after ``rewrite``, to a fixed point (``rounds`` at most): a rewrite that
    splits a digit can leave a term (``FloorDiv(x0, 128)`` with ``x0 < 128``) that another round
    removes. Shared by :func:`simplify_reordered` and the Triton generator's block indices (Note
    [Two rewrites of low terms under a division])."""
    for _ in range(rounds):
        done = simplify_index(rewrite(expr, ranges), ranges)
        if done == expr:
            break
        expr = done
    return expr


# Note [Two rewrites of low terms under a division]: :func:`drop_low_terms` and the Triton
# generator's ``_split_divisions`` (Note [Splitting divisions of block indices] in its kernel.py)
# apply one identity, ``(g*q + r) // (g*k) == q // k`` for integers with ``0 <= r < g``, under
# preconditions that differ: ``drop_low_terms`` refuses a sum with any negative coefficient,
# where the identity holds for a ``q`` of either sign and only ``r`` must be non-negative, which
# ``_split_divisions`` checks term by term. One function would change the indices one of the
# two generators prints wherever they differ (a flipped dim beside a digit split), so they stay
# two until that change is made and checked on its own; the fixed-point loop around both is
# :func:`simplify_rewritten`.
def simplify_reordered(expr: Expr, ranges: Mapping[sympy.Symbol, Expr]) -> Expr:
    """``simplify_index`` after ``drop_low_terms``, to a fixed point (:func:`simplify_rewritten`),
    for positions re-expressed in another loop order (Note [Pointwise producers in a column
    reduction's order])."""
    return simplify_rewritten(drop_low_terms, expr, ranges)


def _drop_low_symbolic(node: Expr, ranges: Mapping[sympy.Symbol, Expr]) -> Expr:
    """``(a + g*b) // (g*k) -> b // k`` (and the same digit of ``ModularIndexing``) for a
    symbolic divisor ``g*k`` with integer ``g`` where ``0 <= a < g`` over the loops' ranges
    (Note [Symbolic divisors]): a row of 64 flattened with its row index, ``(r0 + 64*x0) //
    (64*s1)``, is ``x0 // s1``, which the digits around it then recombine into ``x0``."""
    base, divisor = node.args[0], node.args[1]
    g, k = divisor.as_coeff_Mul()
    if not g.is_Integer or int(g) <= 1:
        return node
    kept, rest = _split_multiples(base, int(g))
    b = bound(rest, ranges)
    if kept == 0 or rest == 0 or b is None or b > int(g):
        return node
    return node.func(sympy.expand(kept / g), k, *node.args[2:])


def _below(expr: Expr, limit: Expr, ranges: Mapping[sympy.Symbol, Expr]) -> bool:
    """``expr < limit`` for every value of the size symbols (Note [Symbolic divisors], Note
    [Digits under symbolic sizes]): ``expr``'s largest value over the loops' ranges, an expression
    in the size symbols, is at most ``limit - 1`` whatever positive values they take."""
    size = ranges.get(expr) if isinstance(expr, sympy.Symbol) else None
    if size is not None and sympy.expand(limit - size) == 0:
        return True
    if not _nonnegative(expr):  # Note [Bounds of indices that may be negative]
        return False
    top = _max_value(expr, ranges)
    return top is not None and sympy.expand(limit - 1 - top).is_nonnegative is True


# Note [Digits under symbolic sizes]: a view over a symbolic length splits a flat position into
# digits whose modulus is a size symbol: GPT-2's `x.view(b, t, 256)` read back in its own loops is
# ``(r0 + 256*x1) // 256 % s1`` with ``r0 < 256`` and ``x1 < s1``. With integer sizes ``bound``
# proves the digit needs no modulo (the position is below ``256*128``) and it folds to ``x1``;
# under a symbol ``bound`` has no integer to give, and every layer norm of the symbolic graph kept
# the division and modulo in its inner loop, and stored its statistics to memory because their
# reads no longer matched the reduction's output index (the C++ kernels of GPT-2's layer norms ran
# 3-10x slower than the static graph's, about 1.14x on the whole model at batch 8, length 128, one
# thread). ``_max_value`` gives the largest value as an expression in the size symbols instead
# (``255 + 256*(s1 - 1)``), and ``_below`` compares it with the limit (``256*s1``) by sympy's sign
# rules over positive sizes: the digit is then ``(r0 + 256*x1) // 256``, which FloorDiv splits into
# ``x1``. An expression with a factor that is not bounded (a size symbol outside the ranges) gives
# no answer and is left as it is.
def _max_value(expr: Expr, ranges: Mapping[sympy.Symbol, Expr]) -> Expr | None:
    """The largest value of a non-negative index expression over the loops' ``ranges`` (each
    variable ``v`` in ``[0, ranges[v])``), an integer, an expression in the size symbols, or
    None when a factor has no bound. :func:`bound` is its integer form."""
    if expr.is_Integer:
        return expr
    if isinstance(expr, sympy.Symbol):
        size = ranges.get(expr)
        if size is not None:
            return sympy.expand(size - 1)
    if expr.free_symbols and not expr.has(ModularIndexing) and expr.free_symbols <= _size_symbols():
        # a size expression (`s2 // 16`, a reduction's length over a pooled image) is the same
        # in every iteration: its own largest value (Note [Digits under symbolic sizes])
        return expr
    if isinstance(expr, sympy.Symbol):
        return None
    if isinstance(expr, sympy.Add):
        parts = [_max_value(a, ranges) for a in expr.args]
        return None if any(p is None for p in parts) else sympy.Add(*parts)
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        if not coeff.is_Integer or int(coeff) < 0:
            return None
        factors = [_max_value(a, ranges) for a in sympy.Mul.make_args(rest)]
        return None if any(f is None for f in factors) else coeff * sympy.Mul(*factors)
    if isinstance(expr, FloorDiv):
        top, divisor = _max_value(expr.args[0], ranges), expr.args[1]
        if top is None:
            return None
        # the quotient's largest value, or with a symbolic divisor an upper bound of it
        return top // divisor if top.is_Integer and divisor.is_Integer else top / divisor
    if isinstance(expr, ModularIndexing):
        return sympy.expand(expr.args[2] - 1)
    return None


def _size_symbols() -> frozenset[sympy.Symbol]:
    """The size symbols of the graph being lowered (none for a static graph)."""
    from .sizevars import current  # sizevars imports this module

    return frozenset(current().hints)


def _digit_term(term: Expr, sizes: frozenset[sympy.Symbol]) -> tuple[Expr, Expr]:
    """A term as (coefficient, the rest), as ``as_coeff_Mul`` splits it, except that a digit
    times size symbols keeps the symbols in its coefficient (Note [Symbolic divisors])."""
    cf, f = term.as_coeff_Mul()
    if sizes and isinstance(f, sympy.Mul):
        # a division of sizes only (``s2 // 4``, a pooled image's side) is a size, not a digit
        digits = [
            a for a in f.args if isinstance(a, FloorDiv | ModularIndexing) and not a.free_symbols <= sizes
        ]
        others = [a for a in f.args if a not in digits]
        if len(digits) == 1 and all(a.free_symbols <= sizes for a in others):
            return cf * sympy.Mul(*others), digits[0]
    return cf, f


def _equal(a: Expr, b: Expr) -> bool:
    return bool(a == b or sympy.expand(a - b) == 0)


def _recombine_digits(expr: Expr) -> Expr:
    """``c*d2*(e // (d1*d2)) + c*((e // d1) % d2)  ->  c*(e // d1)`` until nothing changes.

    A reshape splits an index into digits and a contiguous layout multiplies them back; this
    undoes the split, so a view chain over contiguous memory collapses to plain arithmetic.
    """
    from .sizevars import current  # the graph's size symbols (sizevars imports this module)

    sizes = frozenset(current().hints)
    changed = True
    while changed:
        changed = False
        terms = list(sympy.Add.make_args(expr))
        parts = [_digit_term(t, sizes) for t in terms]
        for i, (cf, f) in enumerate(parts):
            if not isinstance(f, FloorDiv):
                continue
            for j, (cm, m) in enumerate(parts):
                if not isinstance(m, ModularIndexing) or m.args[0] != f.args[0]:
                    continue
                e, d1, d2 = m.args
                if _equal(f.args[1], d1 * d2) and _equal(cf, cm * d2):
                    rest = [t for k, t in enumerate(terms) if k not in (i, j)]
                    expr = sympy.Add(*rest, cm * FloorDiv(e, d1))
                    changed = True
                    break
            if changed:
                break
    return expr


def merge_loops(
    sizes: Sequence[Expr], index: Expr, variables: Sequence[sympy.Symbol]
) -> tuple[tuple[Expr, ...], Expr]:
    """Collapse adjacent loop dims that ``index`` walks contiguously (and size-1 dims).

    Returns the new sizes and the index rewritten over fresh variables ``z0, z1, ...``. Two
    accesses that visit the same offsets in the same iteration order map to the same result,
    whatever shape their loops had.
    """
    sizes = list(sizes)
    variables = list(variables)
    # size-1 dims never move the index
    keep = [i for i, s in enumerate(sizes) if s != 1]
    index = index.subs({variables[i]: 0 for i in range(len(sizes)) if sizes[i] == 1})
    sizes = [sizes[i] for i in keep]
    variables = [variables[i] for i in keep]
    i = len(sizes) - 2
    while i >= 0:
        outer, inner = variables[i], variables[i + 1]
        if _linear_in(index, outer) and _linear_in(index, inner):
            c_outer = index.coeff(outer)
            c_inner = index.coeff(inner)
            if c_outer == c_inner * sizes[i + 1]:
                # outer*c_outer + inner*c_inner == (outer*size_inner + inner)*c_inner
                index = index.subs({outer: 0})
                sizes[i + 1] = sizes[i] * sizes[i + 1]
                del sizes[i]
                del variables[i]
        i = min(i - 1, len(sizes) - 2)
    fresh = loop_vars("z", len(sizes))
    index = index.subs(dict(zip(variables, fresh, strict=True)))
    return tuple(sizes), sympy.expand(index)


def merge_loop_ranges(
    sizes: Sequence[Expr],
    indices: Sequence[Expr],
    variables: Sequence[sympy.Symbol],
    boundary: int | None = None,
) -> tuple[tuple[Expr, ...], dict[sympy.Symbol, Expr], list[Expr]]:
    """Merge adjacent loop dims that *every* access in ``indices`` walks contiguously.

    This is the loop nest a code generator should emit: ``(4, 8)`` over a contiguous buffer is
    one loop of 32. Dims ``< boundary`` and ``>= boundary`` are never merged together (the
    reduction boundary). Returns the new sizes, the substitution of each old variable by an
    expression of the new ones (``z0, z1, ...``), and the indices rewritten over the new ones.
    """
    groups: list[list[int]] = [[i] for i in range(len(sizes))]
    i = len(groups) - 2
    while i >= 0:
        outer, inner = groups[i], groups[i + 1]
        ok = boundary is None or not (outer[-1] < boundary <= inner[0])
        vo, vi = variables[outer[-1]], variables[inner[0]]
        for index in indices if ok else ():
            if not (_linear_in(index, vo) and _linear_in(index, vi)):
                ok = False
                break
            if index.coeff(vo) != index.coeff(vi) * sizes[inner[0]]:
                ok = False
                break
        if ok and all(sizes[k] != 0 for k in outer + inner):
            groups[i] = outer + inner
            del groups[i + 1]
        i = min(i - 1, len(groups) - 2)
    fresh = loop_vars("z", len(groups))
    mapping: dict[sympy.Symbol, Expr] = {}
    new_sizes = []
    for z, group in zip(fresh, groups, strict=True):
        new_sizes.append(sympy.Mul(*[sizes[k] for k in group]))
        stride: Expr = sympy.Integer(1)
        for pos, k in enumerate(reversed(group)):
            digit = FloorDiv(z, stride) if pos == len(group) - 1 else ModularIndexing(z, stride, sizes[k])
            mapping[variables[k]] = digit
            stride = stride * sizes[k]
    ranges = dict(zip(fresh, new_sizes, strict=True))
    rewritten = [simplify_index(sympy.sympify(ix).subs(mapping), ranges) for ix in indices]
    return tuple(new_sizes), mapping, rewritten


def _linear_in(expr: Expr, var: sympy.Symbol) -> bool:
    """expr is ``c*var + rest`` with ``var`` appearing nowhere else."""
    if not expr.has(var):
        return True
    return bool((expr - expr.coeff(var) * var).free_symbols.isdisjoint({var})) and not expr.coeff(var).has(
        var
    )


def contiguous_strides(sizes: Sequence[Expr]) -> list[Expr]:
    """Row-major strides for ``sizes``, as torch computes them: a dim of size 0 counts as 1 in the
    strides of the dims before it (eager's ``empty((4, 0))`` has strides ``(1, 1)``, not ``(0, 1)``;
    only empty tensors differ, so no index changes). A symbolic size is taken as it is."""
    strides: list[Expr] = []
    running: Expr = sympy.Integer(1)
    for size in reversed(sizes):
        strides.append(running)
        running = running * (sympy.Integer(1) if size == 0 else size)
    return list(reversed(strides))


def linear_index(index: Sequence[Expr], strides: Sequence[Expr], offset: Expr | int = 0) -> Expr:
    """``offset + sum(index[i] * strides[i])``."""
    return sympy.Add(sympy.sympify(offset), *[i * s for i, s in zip(index, strides, strict=True)])


# Note [View parameters are memoized]: every view realized as memory (extern arguments, graph
# outputs) asks whether its index is affine in the loop variables, through sympy's expand, coeff
# and subs (T5's lowering: 959 views, a quarter of the phase under a profiler). A network's
# blocks repeat the same views over the same shapes, and loop variables are the same symbols
# everywhere (`loop_vars`), so the answer is kept per (index, variables, size symbols): sympy
# expressions are immutable and the answer is a function of them.
_STRIDED: dict[
    tuple[Expr, tuple[sympy.Symbol, ...], frozenset[sympy.Symbol]], tuple[list[Expr], Expr] | None
] = {}
_STRIDED_LIMIT = 1 << 14


def as_strided_params(
    index: Expr, variables: Sequence[sympy.Symbol], sizes: Iterable[sympy.Symbol] = ()
) -> tuple[list[Expr], Expr] | None:
    """If ``index`` is ``offset + sum(stride_i * var_i)``, return (strides, offset), else None
    (Note [View parameters are memoized])."""
    key = (index, tuple(variables), frozenset(sizes))
    if key in _STRIDED:
        known = _STRIDED[key]
    else:
        known = _as_strided_params(index, key[1], key[2])
        if len(_STRIDED) >= _STRIDED_LIMIT:
            _STRIDED.clear()
        _STRIDED[key] = known
    return None if known is None else (list(known[0]), known[1])


def _as_strided_params(
    index: Expr, variables: Sequence[sympy.Symbol], sizes: Iterable[sympy.Symbol] = ()
) -> tuple[list[Expr], Expr] | None:
    """If ``index`` is ``offset + sum(stride_i * var_i)``, return (strides, offset), else None.

    Note [Views with symbolic strides]: strides and offset may be expressions of the size
    symbols in ``sizes`` (the graph's input-bound symbols): a view of a symbolic buffer
    (``y.view(b, s, n)`` of a ``(b*s, n)`` GEMM result, the heads of a fused QKV projection)
    is then an ``as_strided`` view as in a static graph, not a copy kernel. Any other symbol
    (an indirect load's value) keeps the index from being a view."""
    expr = sympy.expand(index)
    if any(not d.free_symbols.isdisjoint(variables) for d in expr.atoms(FloorDiv, ModularIndexing)):
        return None  # a digit of a loop variable; one of sizes only (``s2 // 4``) is a stride
    strides = []
    for var in variables:
        if not _linear_in(expr, var):
            return None
        strides.append(expr.coeff(var))
    offset = expr.subs({v: 0 for v in variables})
    allowed = frozenset(sizes)
    if not offset.free_symbols <= allowed or any(not s.free_symbols <= allowed for s in strides):
        return None
    return strides, offset
