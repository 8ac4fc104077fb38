"""Graphs with symbolic sizes through the Triton generator (run by Triton's interpreter on the
CPU): what it plans from sizes must not need them static where the kernel is static."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kiln_symbolic import DimDynamic, ShapeEnv, make_symint
from torch._dispatch.python import enable_python_dispatcher
from triton_check import DEVICES

from kiln_codegen_triton import TritonBackend
from kiln_loopir import compile_graph
from kiln_loopir.graph import GRAPH_DEVICE
from kiln_loopir.testing import with_vals

DEVICE = DEVICES[0]
aten = torch.ops.aten


def _on_device(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Graphs traced on meta tensors compile for the session's device (Note [The device of a graph
    of meta inputs] in kiln_loopir's graph.py): CUDA on a GPU, the interpreter's CPU otherwise."""
    graph.meta[GRAPH_DEVICE] = DEVICE
    return graph


def test_a_static_reduction_over_a_symbolic_range_is_not_planned_for_splitting() -> None:
    # a (0, n) input: the kernel's numels are static (0), its ranges hold n; planning a split
    # reduction asked for n as an int and the whole graph compiled static (OpInfo var.unbiased,
    # std_mean.unbiased, ... under dynamic=True with --grow)
    env = ShapeEnv()
    n = make_symint(env, env.create_symbol(6, "x0", DimDynamic.DYNAMIC), 6)

    def f(x: Any, y: Any) -> Any:
        return aten.var.correction(x, None, correction=1), aten.sum.default(y)

    meta = (torch.empty(0, n, device="meta"), torch.empty(n, device="meta"))
    compiled = compile_graph(_on_device(with_vals(f, *meta)), list(meta), backend=TritonBackend())
    for cols in (6, 9, 2):
        x, y = torch.empty(0, cols, device=DEVICE), torch.randn(cols, device=DEVICE)
        for got, want in zip(compiled(x, y), f(x, y), strict=True):
            torch.testing.assert_close(got, want, equal_nan=True)


def test_an_int_of_a_float_of_sizes_is_an_argument_the_wrapper_computes() -> None:
    """Note [Integers of floats of sizes in Triton]: the output size of a nearest upsampling by
    1.5, `trunc(float(n) * 1.5)`, is computed per call by the wrapper in Python (an int
    argument `ki0`), not in the kernel's float32 arithmetic; one compiled graph serves every n."""
    env = ShapeEnv()
    h = make_symint(env, env.create_symbol(5, "x0", DimDynamic.DYNAMIC), 5)
    w = make_symint(env, env.create_symbol(7, "x1", DimDynamic.DYNAMIC), 7)

    def f(x: Any) -> Any:
        return aten.mul.Tensor(aten.upsample_nearest2d.vec(x, None, [1.5, 1 / 3]), 2)

    meta = (torch.empty(1, 2, h, w, device="meta"),)
    with enable_python_dispatcher():  # the upsampling's meta function computes the size in Python
        graph = with_vals(f, *meta)
    up = next(n for n in graph.graph.nodes if n.target == aten.upsample_nearest2d.vec)
    assert "TruncOfFloat" in str(up.meta["val"].shape)
    compiled = compile_graph(_on_device(graph), list(meta), backend=TritonBackend())
    for hv, wv in ((5, 7), (3, 9), (11, 6), (4, 4)):
        x = torch.randn(1, 2, hv, wv, device=DEVICE)
        torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.parametrize("split", [True, False])
def test_a_reduction_over_a_symbolic_row_with_static_outputs_splits(split: bool) -> None:
    """Note [Split reductions under symbolic sizes] (split.py): `x.sum()` and column sums over
    `n` rows split in chunks counted at the hint (n = 3000) and of length ceil(n / S) at run
    time; the partial kernel masks the row's end, so far smaller n are right too.
    A Welford reduction over the same rows stays whole. `split_symbolic=False`: one kernel."""
    env = ShapeEnv()
    n = make_symint(env, env.create_symbol(3000, "x0", DimDynamic.DYNAMIC), 3000)

    def f(x: Any, y: Any) -> Any:
        return (
            aten.sum.default(x),
            aten.amax.default(y, [0]),
            aten.sum.dim_IntList(y, [0]),
            aten.var.correction(x, [0], correction=0),
        )

    meta = (
        torch.empty(n, 33, device="meta", dtype=torch.float64),
        torch.empty(n, 130, device="meta", dtype=torch.float64),
    )
    backend = TritonBackend(split_symbolic=split)
    compiled = compile_graph(_on_device(with_vals(f, *meta)), list(meta), backend=backend)
    names = [s.name for s in backend.last_specs]
    assert sum(name.endswith("_partial") for name in names) == (2 if split else 0), names
    for rows in (3000, 2, 17, 1001):
        x = torch.randn(rows, 33, dtype=torch.float64, device=DEVICE)
        y = torch.randn(rows, 130, dtype=torch.float64, device=DEVICE)
        for got, want in zip(compiled(x, y), f(x, y), strict=True):
            torch.testing.assert_close(got, want)
