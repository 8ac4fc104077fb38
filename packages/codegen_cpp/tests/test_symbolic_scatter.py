"""Accumulating scatters under symbolic sizes (Note [Scatter lanes over symbolic sizes] in
kernel.py): one C++ build serves every size, and a loop is vectorized only where its lanes
provably add into distinct elements for every value of the size symbols."""

from __future__ import annotations

import re
from typing import Any

import torch
from kiln_symbolic import DimDynamic, ShapeEnv, make_symint

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import with_vals

aten = torch.ops.aten


def _symbolic(*hints: int) -> list[Any]:
    env = ShapeEnv()
    return [
        make_symint(env, env.create_symbol(h, f"x{k}", DimDynamic.DYNAMIC), h) for k, h in enumerate(hints)
    ]


def _scatters(idx: torch.Tensor, src: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor) -> Any:
    # down the columns: (i, j) adds into (idx[i, j], j), index ``j + s1*idx``: the column loop
    # (length s1) separates the lanes for every s1
    sa0 = aten.scatter_add.default(aten.zeros_like.default(src), 0, idx, src)
    # along the rows: every element of a row adds into one of two columns: no loop separates
    sa1 = aten.scatter_add.default(aten.zeros_like.default(src), 1, idx, src)
    # an accumulating index_put of whole rows (embedding's backward): the row's columns separate
    ip = aten.index_put.default(aten.zeros_like.default(src), [rows], vals, True)
    return sa0, sa1, ip


def test_accumulating_scatters_under_symbolic_sizes_match_eager() -> None:
    n, m, k = _symbolic(4, 6, 9)
    meta = (
        torch.empty(n, m, dtype=torch.long, device="meta"),
        torch.empty(n, m, device="meta"),
        torch.empty(k, dtype=torch.long, device="meta"),
        torch.empty(k, m, device="meta"),
    )
    backend = CppBackend()
    compiled = compile_graph(with_vals(_scatters, *meta), list(meta), backend=backend)
    assert backend.last_declined == [], backend.last_declined
    scatters = [s for s in backend.last_source.split('extern "C" int64_t ')[1:] if re.search(r"\bind\d+", s)]
    assert len(scatters) == 3, backend.last_source
    vectorized = [
        bool(re.search(r"#pragma omp simd[^\n]*\n\s*for \(int64_t x1 = 0; x1 < s", s)) for s in scatters
    ]
    assert sorted(vectorized) == [False, True, True], scatters
    assert sum("not vectorized" in s for s in scatters) == 1, scatters
    for rows, cols, many in ((2, 3, 5), (4, 6, 9), (5, 2, 40), (7, 16, 3), (3, 33, 64)):
        torch.manual_seed(rows * cols)
        idx = torch.randint(0, min(rows, 2), (rows, cols))  # many repeated targets
        src = torch.randn(rows, cols)
        tok = torch.randint(0, rows, (many,))
        vals = torch.randn(many, cols)
        got = compiled(idx, src, tok, vals)
        for g, w in zip(got, _scatters(idx, src, tok, vals), strict=True):
            torch.testing.assert_close(g, w)
