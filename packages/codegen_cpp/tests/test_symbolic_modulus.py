"""Note [Python's modulus in C++ index expressions]: sympy's ``Mod`` (Python's modulus, the
divisor's sign), which sizes used as scalars bring into index and value expressions under
symbolic sizes, is spelled with C++'s truncating ``%`` so that it equals Python's for every sign
of the dividend; a graph with one compiles once for every size instead of falling back to static
sizes."""

from __future__ import annotations

import ast
import math
from typing import Any

import pytest
import sympy
import torch
from kiln_symbolic import DimDynamic, ShapeEnv, make_symint

from kiln_codegen_cpp import CppBackend
from kiln_codegen_cpp.cpp_ops import index_to_cpp
from kiln_loopir import compile_graph
from kiln_loopir.testing import with_vals

aten = torch.ops.aten


class _Truncating(ast.NodeTransformer):
    """Evaluates ``%`` and ``/`` as C++ does on int64: toward zero."""

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        self.generic_visit(node)
        if isinstance(node.op, ast.Mod | ast.Div):
            name = "tmod" if isinstance(node.op, ast.Mod) else "tdiv"
            return ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], [])
        return node


def _run_cpp_index(text: str, env: dict[str, int]) -> int:
    tree = ast.fix_missing_locations(_Truncating().visit(ast.parse(text, mode="eval")))
    names = {
        "INT64_C": lambda v: v,
        "tmod": lambda a, b: int(math.fmod(a, b)),
        "tdiv": lambda a, b: int(a / b),
        **env,
    }
    return int(eval(compile(tree, "<index>", "eval"), names))


def test_python_modulus_is_printed_for_every_sign_of_the_dividend() -> None:
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    s1 = sympy.Symbol("s1", integer=True, positive=True)
    i = sympy.Symbol("i", integer=True)  # sign unknown
    exprs = (
        sympy.Mod(-s0, 8),
        sympy.Mod(1 - s0, 3),
        sympy.Mod(i - s0, 8),
        8 - sympy.Mod(s0 + 3, 8),
        sympy.Mod(1 - s0, s1),  # a symbolic divisor, positive
    )
    for expr in exprs:
        text = index_to_cpp(expr)
        for v0 in range(1, 14):
            for v1 in (1, 2, 5):
                for vi in (-9, -1, 0, 5):
                    env = {"s0": v0, "s1": v1, "i": vi}
                    want = int(expr.subs({s0: v0, s1: v1, i: vi}))
                    assert _run_cpp_index(text, env) == want, (expr, env, text)
    # a dividend known non-negative keeps the plain (truncating) %
    assert index_to_cpp(sympy.Mod(s0 + 3, 8)) == "((INT64_C(3) + s0) % INT64_C(8))"
    with pytest.raises(NotImplementedError, match="not known positive"):
        index_to_cpp(sympy.Mod(s0, i))


def _symbolic(*hints: int) -> list[Any]:
    env = ShapeEnv()
    return [
        make_symint(env, env.create_symbol(h, f"x{k}", DimDynamic.DYNAMIC), h) for k, h in enumerate(hints)
    ]


def _values_of_sizes(x: Any) -> Any:
    n, m = aten.sym_size.int(x, 0), aten.sym_size.int(x, 1)
    y = aten.add.Tensor(x, (1 - n) % 3)
    y = aten.add.Tensor(y, (n - 7) // 3)
    y = aten.mul.Tensor(y, (-n) % m + 1)
    return aten.add.Tensor(y, (2 - 3 * n) // m)


def test_sizes_as_scalars_under_symbolic_sizes_match_eager() -> None:
    """``(1 - n) % 3``, ``(-n) % m`` and floor divisions of negative values, ``n`` and ``m`` a
    tensor's symbolic sizes: one C++ build (no kernel declined) serves every size."""
    n, m = _symbolic(5, 4)
    x = torch.empty(n, m, device="meta")
    backend = CppBackend()
    compiled = compile_graph(with_vals(_values_of_sizes, x), [x], backend=backend)
    assert backend.last_declined == [], backend.last_declined
    assert "% INT64_C(3)) + INT64_C(3)) % INT64_C(3))" in backend.last_source
    for rows, cols in ((2, 4), (3, 3), (4, 1), (5, 7), (8, 2), (13, 5)):
        xx = torch.randn(rows, cols)
        got = compiled(xx)
        got = got[0] if isinstance(got, tuple | list) else got
        torch.testing.assert_close(got, _values_of_sizes(xx))


def _selects(x: Any) -> Any:
    rows = aten.sym_size.int(x, 0)
    return (
        aten.select.int(x, 1, -1),  # a negative index on a dim of symbolic size
        aten.select.int(x, 0, (1 - rows) % 3),  # a symbolic index, provably non-negative
        aten.add.Tensor(aten.select.int(x, 0, rows - 2), 1.0),
    )


def test_select_under_symbolic_sizes_matches_eager() -> None:
    """loopir's select: a negative constant index on a dim of symbolic size counts from its end (it
    read the size with ``int()``), a symbolic index must be provably non-negative (comparing it
    with 0 raised a TypeError while lowering)."""
    n, m = _symbolic(5, 4)
    x = torch.empty(n, m, device="meta")
    compiled = compile_graph(with_vals(_selects, x), [x], backend=CppBackend())
    for rows, cols in ((3, 4), (5, 2), (8, 7)):
        xx = torch.randn(rows, cols)
        for got, want in zip(compiled(xx), _selects(xx), strict=True):
            torch.testing.assert_close(got, want)
