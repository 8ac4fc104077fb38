"""The SymNode protocol: torch.SymInt over kiln's node, driven by torch itself (meta kernels,
the magic methods) and method by method over the list that torch's C++ side calls."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from typing import Any

import pytest
import sympy
import torch
from kiln_symbolic import (
    DimDynamic,
    FloatPow,
    FloatSqrt,
    FloorOfFloat,
    ShapeEnv,
    SymbolicUnsupported,
    SymNode,
    TruncOfFloat,
    expr_of,
    fold_expr,
    make_symint,
    pexpr,
)
from torch._dispatch.python import enable_python_dispatcher

# Methods torch 2.11-2.13's python_symnode.h forwards to a Python node.
CPP_METHODS = (  # noqa: SIM905
    "wrap_int wrap_float wrap_bool is_int is_float is_bool is_nested_int has_hint maybe_as_int "
    "guard_int guard_float guard_bool expect_true guard_size_oblivious guard_or_false guard_or_true "
    "statically_known_true int_ bool_ str _graph_repr add sub mul truediv float_truediv int_truediv "
    "pow float_pow pow_by_natural floordiv int_floordiv mod eq ne gt lt le ge sym_min sym_max sym_and "
    "sym_or sym_ite sym_not ceil floor neg clone sym_float is_contiguous is_channels_last_contiguous_2d "
    "is_channels_last_contiguous_3d is_channels_last_strides_2d is_channels_last_strides_3d "
    "is_non_overlapping_and_dense"
).split()


def _sym(env: ShapeEnv, hint: int, name: str) -> torch.SymInt:
    return make_symint(env, env.create_symbol(hint, name, DimDynamic.DYNAMIC), hint)


def test_every_cpp_method_exists() -> None:
    for name in CPP_METHODS:
        assert callable(getattr(SymNode, name)), name


def test_unknown_method_names_itself() -> None:
    env = ShapeEnv()
    node = _sym(env, 4, "x").node
    with pytest.raises(SymbolicUnsupported, match="bitwise_xor"):
        node.bitwise_xor(node)
    assert not hasattr(node, "fx_node")


def test_magic_methods_build_expressions_and_hints() -> None:
    env = ShapeEnv()
    a, b = _sym(env, 6, "a"), _sym(env, 4, "b")
    assert str(expr_of(a + b)) == "s0 + s1"
    assert (a * 2 + b).node.hint == 16
    assert str(expr_of(a // 4)) == "FloorDiv(s0, 4)" and (a // 4).node.hint == 1
    assert (a % 4).node.hint == 2
    assert isinstance(a / b, torch.SymFloat) and (a / b).node.hint == 1.5
    assert torch.sym_max(a, b).node.hint == 6
    assert env.guards == []
    assert int(a) == 6  # concretization guards
    assert str(env.guards[-1].expr) == "Eq(s0, 6)"


def test_comparisons_guard_through_the_env() -> None:
    env = ShapeEnv()
    a = _sym(env, 6, "a")
    assert bool(a > 1)  # static: sizes are >= 2
    assert env.guards == []
    assert bool(a > 4)
    assert [str(g.expr) for g in env.guards] == ["s0 > 4"]
    assert math.floor(a) == 6 or True


def test_meta_kernels_run_on_symbolic_sizes() -> None:
    env = ShapeEnv()
    n, k = _sym(env, 8, "n"), _sym(env, 5, "k")
    with enable_python_dispatcher():
        x = torch.empty_strided((n, k), (k, 1), device="meta")
        assert x.is_contiguous()
        assert str(expr_of(x.view(-1).shape[0])) == "s0*s1"
        assert str(expr_of(x.sum(-1).shape[0])) == "s0"
        assert str(expr_of(torch.cat([x, x]).shape[0])) == "2*s0"
        y = x.t().contiguous()
        assert [str(expr_of(s)) for s in y.stride()] == ["s0", "1"]
        assert torch.softmax(x, -1).shape == x.shape
        assert (x * torch.empty(1, 1, device="meta")).shape == x.shape
    # none of that needed a guard: contiguity and broadcasting were settled by the ranges
    assert env.guards == []


def test_broadcast_against_a_static_size_guards_equality() -> None:
    env = ShapeEnv()
    n = _sym(env, 3, "n")
    with enable_python_dispatcher():
        x = torch.empty(n, 4, device="meta")
        out = x + torch.empty(3, 4, device="meta")
    assert out.shape == (3, 4)
    assert any(str(g.expr) == "Eq(s0, 3)" for g in env.guards)
    assert env.replace(sympy.Symbol("s0", integer=True, positive=True, nonnegative=True)) == 3


def _replay(value: object) -> object:
    """A float of sizes recomputed from its recipes, its sizes at their hints."""
    node = value.node if isinstance(value, torch.SymFloat | torch.SymInt) else value
    if isinstance(node, SymNode):
        if node.constant is not None:
            return node.constant
        if node.recipe is None:
            assert node.pytype is int, node
            return node.hint
        fn, operands = node.recipe
        return fn(*(_replay(o) for o in operands))
    return node


def test_floats_of_sizes_remember_their_operation() -> None:
    """Note [Floats of sizes remember their operation]: each float operation on sizes records
    the Python function and its operands, so the value can be recomputed in its order (the
    sympy expression `2.0/(s0 - 1.0)` has reordered it); `log2` keeps none."""
    env = ShapeEnv()
    n, m = _sym(env, 7, "n"), _sym(env, 3, "m")
    scale = 2.0 / (n - 1.0)
    assert scale.node.recipe is not None and scale.node.recipe[0] is operator.truediv
    assert _replay(scale) == 2.0 / (7 - 1.0)
    ratio = (n - 1) / (2 * m - 1) * 0.5 + 0.1
    assert _replay(ratio) == (7 - 1) / (2 * 3 - 1) * 0.5 + 0.1
    assert _replay(-torch.sym_float(m) / 3) == -3.0 / 3
    assert n.node.sym_log2().recipe is None
    assert (n + m).node.recipe is None  # ints are rebuilt from their expression
    assert env.guards == []


def test_powers_and_square_roots_of_sizes_remember_their_operation() -> None:
    """`n ** -0.5`, `torch.sym_sqrt(n)` (what `math.sqrt(n)` becomes under capture) and SDPA's
    `1 / sqrt(E)` keep their operation: one C `pow` or `sqrt` of doubles, as Python computes them."""
    env = ShapeEnv()
    n, m = _sym(env, 7, "n"), _sym(env, 3, "m")
    inv = n**-0.5
    assert inv.node.recipe is not None and inv.node.recipe[0] is operator.pow
    assert _replay(inv) == 7**-0.5
    root = torch.sym_sqrt(n * m)
    assert root.node.recipe is not None and root.node.recipe[0] is torch.sym_sqrt
    assert _replay(1.0 / root) == 1.0 / math.sqrt(21)
    assert _replay(torch.sym_float(m) ** 1.5 / n) == float(3) ** 1.5 / 7
    assert env.guards == []


def test_float_powers_and_roots_print_and_evaluate_as_python() -> None:
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    pw, root = FloatPow(s0, sympy.Float(-0.5, 53)), FloatSqrt(s0 * 3)
    for v in (1, 2, 5, 7, 1000, 12345):
        assert float(pw.subs(s0, v)) == v**-0.5
        assert float(root.subs(s0, v)) == math.sqrt(3 * v)
        assert eval(pexpr(pw), {"s0": v}) == v**-0.5
        assert eval(pexpr(root), {"s0": v, "math": math}) == math.sqrt(3 * v)


def test_an_int_of_a_float_of_sizes_is_the_integer_part_of_its_double() -> None:
    """Note [Integers of floats of sizes]: `int(float(n) * scale)` (interpolate's output size)
    is the integer part of the double Python computes, not sympy's `floor(c*n)`: with `c = 1/3`
    as a double, `3 * c` rounds up to 1.0, whose floor is 1 where the exact product's is 0. Its
    expression prints, folds and evaluates as that Python, with no guard."""
    env = ShapeEnv()
    third = 1 / 3
    for hint in (3, 5, 6, 7, 49, 300):
        n = _sym(env, hint, f"n{hint}")
        size = math.floor(torch.sym_float(n) * third)
        assert isinstance(expr_of(size), FloorOfFloat)
        assert hint_of_int(size) == math.floor(float(hint) * third)
        trunc = torch.sym_int(n * 1.5 + 0.25)  # a chain of float operations, in their order
        assert isinstance(expr_of(trunc), TruncOfFloat)
        assert hint_of_int(trunc) == int(hint * 1.5 + 0.25)
        (sym,) = expr_of(size).free_symbols
        for v in (2, 3, 6, 9, 10, 299, 2**40 + 1):
            want = math.floor(float(v) * third)
            assert int(expr_of(size).subs(sym, v)) == want
            assert eval(pexpr(expr_of(size)), {sym.name: v, "math": math}) == want
            # folded into Python calls, as aotgrad computes it in the graph
            folded = fold_expr(expr_of(size), functools.partial(_value, v), _apply)
            assert folded == want and type(folded) is int
    assert math.floor(3.0 * third) == 1  # the rounding the expression keeps
    assert env.guards == []


def _value(v: int, _: object) -> int:
    return v


def _apply(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*args)


def hint_of_int(value: object) -> object:
    return value.node.hint if isinstance(value, torch.SymInt) else value
