"""ShapeEnv alone: static answers cost no guard, hinted answers record one, equalities replace,
ranges tighten, and the rendered guards accept exactly the sizes that would trace the same."""

from __future__ import annotations

import itertools

import pytest
import sympy
from kiln_symbolic import (
    UNBACKED_HINT,
    ConstraintViolation,
    DimDynamic,
    FloatAdd,
    FloatMul,
    FloatNeg,
    FloatSub,
    FloatTrueDiv,
    FloorDiv,
    GuardOnDataDependent,
    ShapeEnv,
    ToFloat,
    expr_of,
    make_symint,
    pexpr,
    symbol_of,
)


def _env_with(*hints: int) -> tuple[ShapeEnv, list[sympy.Symbol]]:
    env = ShapeEnv()
    syms = [env.create_symbol(h, f"x{i}", DimDynamic.DYNAMIC) for i, h in enumerate(hints)]
    return env, syms


def test_size_symbols_start_at_two_and_static_facts_need_no_guard() -> None:
    env, (s0,) = _env_with(8)
    assert str(env.var_to_range[s0]) == "[2, oo]"
    assert env.evaluate_expr(sympy.Gt(s0, 1)) is True
    assert env.evaluate_expr(sympy.Eq(s0, 1)) is False
    assert env.evaluate_expr(sympy.Ge(s0 * 2, 4)) is True
    assert env.guards == []


def test_shift_by_lower_bound_proves_products() -> None:
    env, (s0, s1) = _env_with(4, 5)
    assert env.evaluate_expr(sympy.Ge(s0 * s1 - s0, 0)) is True
    assert env.guards == []


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        # torch's meta kernels ask these for a dim of s0 >= 2 (dyn5 saw them as unproved guards)
        (lambda s0, s1: sympy.Ne(2 * sympy.Mod(1, s0), 0), True),
        (lambda s0, s1: sympy.Ne(s0, s0**2), True),
        (lambda s0, s1: sympy.Eq(s0, s0**2), False),
        (lambda s0, s1: sympy.Eq(sympy.Mod(1, s0), 1), True),
        (lambda s0, s1: sympy.Eq(sympy.Mod(s0, s0 + 1), s0), True),
        (lambda s0, s1: sympy.Ne(s0 * s1, s0), True),
        (lambda s0, s1: sympy.Eq(s0 * s1 + 1, s0), False),
        (lambda s0, s1: sympy.Lt(sympy.Mod(s1, s0), s0), True),
        (lambda s0, s1: sympy.Ge(sympy.Mod(s1, s0), 0), True),
    ],
)
def test_facts_about_sizes_of_at_least_two_need_no_guard(make: object, expected: bool) -> None:
    env, (s0, s1) = _env_with(4, 7)
    rel = make(s0, s1)  # type: ignore[operator]
    assert env.evaluate_expr(rel) is expected
    assert env.guards == []
    # the answer holds for every size the range allows (and so for the hint)
    for a, b in itertools.product(range(2, 12), repeat=2):
        assert bool(rel.xreplace({s0: a, s1: b})) is expected


def test_what_the_range_does_not_settle_still_guards() -> None:
    env, (s0, s1) = _env_with(4, 7)
    assert env.evaluate_expr(sympy.Eq(sympy.Mod(s1, s0), 3)) is True  # 7 % 4 == 3, not for 8 % 4
    assert env.evaluate_expr(sympy.Ne(s0, s1**2 - 45)) is False  # 4 == 49 - 45
    assert len(env.guards) == 2


def test_an_equality_with_a_coefficient_pins_the_symbol() -> None:
    """`Eq(2*s0, 8)` (a broadcast of `cat([f, f])` against a static 8) makes s0 the value 4:
    later sizes in s0 are plain 4s (loopir sees `8`, not `2*s0`), and the guards pin the input."""
    env, (s0, s1) = _env_with(4, 6)
    assert env.evaluate_expr(sympy.Eq(2 * s0, 8)) is True
    assert env.replace(2 * s0 + s1) == 8 + s1
    texts = [g.text for g in env.produce_guards(lambda src: src)]
    fn = eval(f"lambda x0, x1: {' and '.join(f'({t})' for t in texts)}")
    assert fn(4, 6) and fn(4, 9) and not fn(5, 6) and not fn(3, 6)


def test_an_equality_of_higher_degree_in_one_symbol_pins_it_to_its_hint() -> None:
    """Note [Equalities of one symbol of higher degree]: `Eq(4*(s0 - 2)**2, 64)` (a valid 3x3
    convolution's flatten against BatchNorm1d(64)) holds only for s0 = 6 among sizes: s0 becomes
    6, the question is not asked again, and the guard is the plain `x0 == 6`."""
    env, (s0, s1) = _env_with(6, 5)
    assert env.evaluate_expr(sympy.Eq(4 * (s0 - 2) ** 2, 64)) is True
    assert env.replace(4 * (s0 - 2) ** 2) == 64 and env.replace(s0 * s1) == 6 * s1
    guards = len(env.guards)
    assert env.evaluate_expr(sympy.Eq(4 * (s0 - 2) ** 2, 64)) is True and len(env.guards) == guards
    texts = [g.text for g in env.produce_guards(lambda src: src)]
    assert "x0 == 6" in texts
    fn = eval(f"lambda x0, x1: {' and '.join(f'({t})' for t in texts)}")
    assert fn(6, 5) and fn(6, 9) and not fn(-2, 5) and not fn(7, 5)


def test_an_equality_with_infinitely_many_solutions_stays_a_guard() -> None:
    """`Eq(Mod(s0, 4), 0)`, `Eq(s0 // 2, 3)` and `Eq(s0*s1, 24)` hold for other values too: no pin."""
    env, (s0, s1) = _env_with(8, 3)
    assert env.evaluate_expr(sympy.Eq(sympy.Mod(s0, 4), 0)) is True
    assert env.evaluate_expr(sympy.Eq(FloorDiv(s0, 2) * 1, 4)) is True
    assert env.evaluate_expr(sympy.Eq(s0 * s1, 24)) is True
    assert env.replace(s0) == s0 and env.replace(s1) == s1


def test_hinted_answer_records_a_guard_with_its_line() -> None:
    env, (s0,) = _env_with(4)
    env.where = lambda: "model.py:12"
    assert env.evaluate_expr(sympy.Eq(s0, 4)) is True
    assert [(str(g.expr), g.where) for g in env.guards] == [("Eq(s0, 4)", "model.py:12")]
    # Eq(s0, 4) pins the symbol: it is replaced by the value from now on
    assert env.replace(s0 + 1) == 5


def test_false_branch_guards_the_negation_and_tightens_the_range() -> None:
    env, (s0,) = _env_with(12)
    assert env.evaluate_expr(sympy.Lt(s0, 10)) is False
    assert str(env.guards[0].expr) == "s0 >= 10"
    assert str(env.var_to_range[s0]) == "[10, oo]"
    assert env.evaluate_expr(sympy.Gt(s0, 5)) is True  # now static
    assert len(env.guards) == 1


def test_equality_of_two_symbols_replaces_the_newer() -> None:
    env, (s0, s1) = _env_with(6, 6)
    assert env.evaluate_expr(sympy.Eq(s1, s0)) is True
    assert env.replace(s1) == s0
    texts = [g.text for g in env.produce_guards(lambda s: f"{s}.size")]
    assert "x1.size == x0.size" in texts


def test_duck_sizing_shares_a_symbol_unless_dynamic() -> None:
    env = ShapeEnv()
    a = env.create_symbol(5, "a", DimDynamic.DUCK)
    b = env.create_symbol(5, "b", DimDynamic.DUCK)
    c = env.create_symbol(5, "c", DimDynamic.DYNAMIC)
    assert a == b and c != a
    texts = [g.text for g in env.produce_guards(str)]
    assert "b == a" in texts


def test_zero_one_specialization() -> None:
    env = ShapeEnv()
    assert env.create_symbol(1, "x", DimDynamic.DYNAMIC) == 1
    assert env.create_symbol(0, "y", DimDynamic.DYNAMIC) == 0
    env2 = ShapeEnv(specialize_zero_one=False)
    assert isinstance(env2.create_symbol(1, "x", DimDynamic.DYNAMIC), sympy.Symbol)


def test_min_max_marks() -> None:
    env = ShapeEnv()
    s = env.create_symbol(8, "x", DimDynamic.DYNAMIC, min=2, max=64)
    assert [g.text for g in env.produce_guards(str)] == ["2 <= x <= 64"]
    assert env.evaluate_expr(sympy.Le(s, 64)) is True
    with pytest.raises(ConstraintViolation):
        env.create_symbol(100, "y", DimDynamic.DYNAMIC, max=64)


def test_floordiv_simplifies_exact_quotients() -> None:
    _, (s0, s1) = _env_with(4, 6)
    assert FloorDiv(2 * s0, 2) == s0
    assert FloorDiv(s0 * s1, s1) == s0
    assert FloorDiv(sympy.Integer(-7), 2) == -4  # Python semantics
    assert isinstance(FloorDiv(s0, 2), FloorDiv)
    assert pexpr(FloorDiv(s0 + 1, 2), {s0: "n"}) == "(n + 1) // 2"


def test_floats_of_sizes_print_as_the_python_operations_they_stand_for() -> None:
    """Note [Python float arithmetic on sizes, in its order]: the printed text, run as Python
    over int sizes, is the double Python computes (int / int correctly rounded, literals exact)."""
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    exprs = {
        FloatAdd(FloatAdd(FloatTrueDiv(s1 - s0, 3), 1), 2): lambda a, b: ((b - a) / 3 + 1) + 2,
        FloatMul(FloatMul(ToFloat(s0), sympy.Float(0.1, 53)), 3): lambda a, b: float(a) * 0.1 * 3,
        FloatSub(FloatNeg(FloatTrueDiv(s0, s1)), sympy.Float(1e-17, 53)): lambda a, b: -(a / b) - 1e-17,
    }
    assert pexpr(FloatTrueDiv(s0, 3)) == "s0 / 3"
    big = 2**60 + 1  # int / int is not float(int) / float(int) past 2**53
    for expr, python in exprs.items():
        text = pexpr(expr)
        for a, b in ((1, 2), (7, 3), (13, 40), (big, 3), (3, big)):
            assert eval(text, {"s0": a, "s1": b}) == python(a, b), text


def test_unbacked_symbols_raise_unless_a_fallback_is_given() -> None:
    env = ShapeEnv()
    u = env.create_unbacked_symbol()
    assert env.evaluate_expr(sympy.Ge(u, 0)) is True  # size-like: static
    with pytest.raises(GuardOnDataDependent):
        env.evaluate_expr(sympy.Gt(u, 3))
    assert env.evaluate_expr(sympy.Gt(u, 3), fallback=False) is False
    assert env.expect_true(sympy.Gt(u, 3)) is True
    assert len(env.deferred_asserts) == 1 and str(env.var_to_range[u]) == "[4, oo]"


def test_an_unbacked_int_of_any_sign_is_not_assumed_negative() -> None:
    """Note [Unbacked sizes]: an `.item()` is any integer until `torch._check` narrows it (a
    `nonnegative=False` sympy assumption would have read as "negative" and answered `n > 3`
    False without a guard: a wrong branch)."""
    env = ShapeEnv()
    n = env.create_unbacked_symbol(size_like=False)
    assert str(env.var_to_range[n]) == "[-oo, oo]"
    for question in (sympy.Gt(n, 3), sympy.Ge(n, 0), sympy.Lt(n, 0)):
        with pytest.raises(GuardOnDataDependent):
            env.evaluate_expr(question)
    env.expect_true(sympy.Ge(n, 0))  # torch._check(n >= 0): size-like from now on
    assert env.evaluate_expr(sympy.Ge(n, 0)) is True and env.guards == []


def test_unbacked_ranges_bound_questions_and_hints() -> None:
    env, (s0,) = _env_with(6)
    rows = env.create_unbacked_symbol(max=sympy.Integer(12))  # the nonzero of 12 elements
    assert str(env.var_to_range[rows]) == "[0, 12]"
    assert env.evaluate_expr(sympy.Le(rows, 12)) is True
    with pytest.raises(GuardOnDataDependent):
        env.evaluate_expr(sympy.Le(rows, 11))
    unbounded = env.create_unbacked_symbol(max=3 * s0)  # s0 has no upper bound: none for it either
    assert str(env.var_to_range[unbounded]) == "[0, oo]"
    # heuristics only: the fallback, clamped into the range; backed symbols at their hints
    assert env.optimization_hint(rows) == 12
    assert env.optimization_hint(unbounded + s0) == UNBACKED_HINT + 6
    assert env.hint_of(rows) is None
    # nothing about an unbacked size is guarded: only the input size's range
    assert [g.text for g in env.produce_guards(str)] == ["2 <= x0"]


def test_int_symbols_have_no_range_and_no_zero_one_specialization() -> None:
    env = ShapeEnv()
    n = env.create_int_symbol(1, "n")
    assert isinstance(n, sympy.Symbol)
    assert env.produce_guards(str) == []
    assert env.evaluate_expr(sympy.Gt(n, 0)) is True
    assert next(g.text for g in env.produce_guards(str)) == "n > 0"


def test_frozen_env_drops_new_guards() -> None:
    env, (s0,) = _env_with(4)
    env.freeze()
    env.evaluate_expr(sympy.Eq(s0, 4))
    assert env.guards == []


def _trace(x0: int, x1: int) -> tuple[ShapeEnv, tuple[object, ...]]:
    """A tiny 'program' that branches on sizes; returns the env and the branch outcomes."""
    env = ShapeEnv()
    s0 = env.create_symbol(x0, "x0")
    s1 = env.create_symbol(x1, "x1")
    if isinstance(s0, int) or isinstance(s1, int) or s0.is_Integer or s1.is_Integer:
        return env, ("static", x0, x1)
    outcome = (
        env.evaluate_expr(sympy.Lt(s0, 10)),
        env.evaluate_expr(sympy.Eq(s0, s1)),
        env.evaluate_expr(sympy.Eq(sympy.Mod(s0 * s1, 4), 0)),
    )
    return env, outcome


def test_rendered_guards_accept_exactly_the_sizes_that_trace_the_same() -> None:
    sizes = range(0, 14)
    for x0, x1 in [(4, 4), (12, 3), (6, 5), (3, 8)]:
        env, outcome = _trace(x0, x1)
        if outcome[0] == "static":
            continue
        guard_texts = [g.text for g in env.produce_guards(lambda s: s)]
        source = " and ".join(f"({t})" for t in guard_texts) or "True"
        fn = eval(f"lambda x0, x1: {source}")
        for y0, y1 in itertools.product(sizes, sizes):
            accepted = fn(y0, y1)
            same = _trace(y0, y1)[1] == outcome
            assert accepted == same, (x0, x1, y0, y1, guard_texts)


def test_a_check_that_became_a_replacement_keeps_both_symbols() -> None:
    """`torch._check(m == k)` on two data-dependent ints: `m` reads as `k` from then on, but the
    fact names both (`checked_unbacked`) and `symbol_of` still gives `m`'s own symbol, so a wrapper
    can read `m` and check it (Note [Checks of data-dependent sizes at run time] in kiln_loopir)."""
    env = ShapeEnv()
    k = env.create_unbacked_symbol(size_like=False)
    m = env.create_unbacked_symbol(size_like=False)
    other = env.create_unbacked_symbol(size_like=False)
    env.expect_true(sympy.Eq(m, k))
    assert env.replace(m) == k
    assert env.checked_unbacked() == {k, m} and other not in env.checked_unbacked()
    value = make_symint(env, m, None)
    assert expr_of(value) == k and symbol_of(value) == m
    assert symbol_of(make_symint(env, k + 1, None)) is None and symbol_of(3) is None


def test_a_question_already_answered_records_no_second_guard() -> None:
    """Note [Answers already given]: the same question asked again (a meta kernel per operator
    asks it) answers from the first answer; a static answer is remembered too."""
    env, (s0, s1) = _env_with(8, 3)
    question = sympy.Ge(s0 * s1, 20)
    assert env.evaluate_expr(question) is True and len(env.guards) == 1
    assert env.evaluate_expr(question) is True and env.evaluate_expr(sympy.Ge(s1 * s0, 20)) is True
    assert len(env.guards) == 1
    assert env.evaluate_expr(s0 * s1) == 24 and len(env.guards) == 2
    assert env.evaluate_expr(s0 * s1) == 24 and len(env.guards) == 2


def test_a_floor_division_guard_raises_the_lower_bound() -> None:
    """Note [Lower bounds through floor divisions]: four 2x2 poolings of a padded image check
    their output `((((s - 2)//2 - 1)//2 - 1)//2 - 1)//2 + 1 >= 1`, which holds exactly for
    `s >= 16`; the range says so, so `max(1, s // 16)` is `s // 16` (Note [Max and Min settled by
    ranges]). A guard that is not monotone in `s` leaves the range alone."""
    env, (s0, s1) = _env_with(64, 5)
    e = FloorDiv(FloorDiv(FloorDiv(FloorDiv(s0 - 2, 2) - 1, 2) - 1, 2) - 1, 2) + 1
    assert env.evaluate_expr(sympy.Ge(e, 1)) is True
    assert str(env.var_to_range[s0]) == "[16, oo]"
    for v in range(2, 40):  # the bound is the exact threshold
        assert (((((v - 2) // 2 - 1) // 2 - 1) // 2 - 1) // 2 + 1 >= 1) == (v >= 16)
    assert env.settle_min_max(sympy.Max(1, FloorDiv(s0, 16))) == FloorDiv(s0, 16)
    assert env.settle_min_max(sympy.Min(1, FloorDiv(s0, 16))) == 1
    assert env.settle_min_max(sympy.Max(2, FloorDiv(s0, 16))) == sympy.Max(2, FloorDiv(s0, 16))
    assert env.evaluate_expr(sympy.Ne(sympy.Mod(s1, 3), 1)) is True
    assert str(env.var_to_range[s1]) == "[2, oo]"


def test_an_int_symbol_pinned_by_a_float_is_an_integer() -> None:
    # Note [An int symbol pinned by a float] (shape_env.py): `round(float(k), 3)` specialized
    # `float(k)` with `Eq(s0, 3.0)`, and the int `k` came back from the frame as 3.0
    env, (s0,) = _env_with(3)
    env.add_guard(sympy.Eq(s0, sympy.Float(3.0)))
    value = env.simplify(s0)
    assert value.is_Integer and int(value) == 3
    env2, (s1,) = _env_with(3)
    env2.add_guard(sympy.Eq(s1, sympy.Float(2.5)))  # no integer: left as the guard says
    assert not env2.simplify(s1).is_Integer
