"""Data-dependent sizes in capture (Note [Unbacked sizes in capture]): `nonzero`, `masked_select`,
boolean-mask indexing and an integer `.item()` stay in the graph as unbacked symbols when the
backend takes symbolic sizes; a branch on one is a graph break naming the line; a backend that
takes static sizes only, `KILN_UNBACKED=0`, or a float `.item()` keep breaking as before."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import sympy
import torch
from kiln_symbolic import ShapeEnv, expr_of

import kiln_dynamo


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln_dynamo.reset()


class SymbolicBackend:
    """Keeps the graphs it is given and runs them eagerly; takes symbolic sizes."""

    __kiln_dynamic_shapes__ = True

    def __init__(self) -> None:
        self.gms: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.gms.append(gm)
        return gm.forward


def _unbacked_vals(gm: torch.fx.GraphModule) -> list[tuple[str, Any]]:
    """(node name, expression) of every value whose size or int is a bare unbacked symbol."""
    out = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        items = val.shape if isinstance(val, torch.Tensor) else (val,)
        for s in items:
            if isinstance(s, torch.SymInt) and isinstance(s.node.shape_env, ShapeEnv):
                e = expr_of(s)
                if e.is_Symbol and s.node.shape_env.is_unbacked(e):
                    out.append((node.name, e))
    return out


def _rows(x: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(x > 0).sum(0) * 2


def _masked(x: torch.Tensor) -> torch.Tensor:
    return (x[x > 0] * 2).sum()


def _masked_cols(x: torch.Tensor) -> torch.Tensor:
    return x[:, x[0] > 0].sum(1)


def _select(x: torch.Tensor) -> torch.Tensor:
    return torch.masked_select(x, x > 0).sum()


def _arange_item(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return torch.arange(n.item()) * 2 + x.sum().long()


def _zeros_of_count(x: torch.Tensor) -> torch.Tensor:
    k = (x > 0).sum().item()
    torch._check(k >= 0)
    return x.new_zeros(k) + 1


def _prefix(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    k = n.item()
    torch._check(k >= 0)
    torch._check(k <= x.size(0))
    return x[:k] + 1


def _unique(x: torch.Tensor) -> torch.Tensor:
    values, counts = torch.unique(x, return_counts=True)
    return values * counts


CASES: list[tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = [
    (_rows, lambda: (torch.randn(6, 4),)),
    (_masked, lambda: (torch.randn(6, 4),)),
    (_masked_cols, lambda: (torch.randn(6, 4),)),
    (_select, lambda: (torch.randn(6, 4),)),
    (_arange_item, lambda: (torch.randn(3), torch.randint(0, 9, ()))),
    (_zeros_of_count, lambda: (torch.randn(6, 4),)),
    (_prefix, lambda: (torch.randn(6, 4), torch.randint(0, 7, ()))),
    (_unique, lambda: (torch.randint(0, 4, (5, 3)),)),
]


@pytest.mark.parametrize(("fn", "make"), CASES, ids=[f.__name__ for f, _ in CASES])
def test_data_dependent_sizes_stay_in_one_graph(fn: Callable[..., Any], make: Callable[[], Any]) -> None:
    backend = SymbolicBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    torch.manual_seed(0)
    for _ in range(4):  # other counts every call: the one graph serves them all
        args = make()
        out, expected = compiled(*args), fn(*args)
        assert out.shape == expected.shape and out.dtype == expected.dtype
        torch.testing.assert_close(out, expected)
    assert kiln_dynamo.counters.break_reasons == [] and kiln_dynamo.counters.graphs == 1
    (gm,) = backend.gms
    assert _unbacked_vals(gm), gm.graph


def test_the_rows_of_a_nonzero_are_bounded_by_the_elements() -> None:
    backend = SymbolicBackend()
    kiln_dynamo.compile(_rows, backend=backend)(torch.randn(6, 4))
    ((_, u),) = _unbacked_vals(backend.gms[0])
    env = next(
        v.shape[0].node.shape_env
        for n in backend.gms[0].graph.nodes
        if isinstance(v := n.meta.get("val"), torch.Tensor) and isinstance(v.shape[0], torch.SymInt)
    )
    assert str(env.var_to_range[u]) == "[0, 24]"
    assert env.guards == []  # nothing about the data-dependent size is guarded


def test_torch_check_facts_reach_the_shape_env() -> None:
    backend = SymbolicBackend()
    kiln_dynamo.compile(_prefix, backend=backend)(torch.randn(6, 4), torch.tensor(3))
    env = next(
        v.node.shape_env
        for n in backend.gms[0].graph.nodes
        if isinstance(v := n.meta.get("val"), torch.SymInt)
    )
    (u,) = env.unbacked
    assert str(env.var_to_range[u]) == "[0, 6]"
    assert [str(a.expr) for a in env.deferred_asserts] == ["u0 >= 0", "u0 <= 6"]


def _branch_on_item(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if n.item() > 3:
        return y + 1
    return y - 1


def _branch_on_rows(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if torch.nonzero(x > 0).size(0) >= 2:
        return y + 1
    return y - 1


@pytest.mark.parametrize(
    ("fn", "args", "line", "why"),
    [
        (_branch_on_item, lambda: (torch.randn(4), torch.randint(0, 8, ())), "if n.item() > 3:", "u0 > 3"),
        (_branch_on_rows, lambda: (torch.randn(4),), "if torch.nonzero(x > 0).size(0) >= 2:", "u0 >= 2"),
    ],
    ids=["item", "rows"],
)
def test_a_branch_on_a_data_dependent_value_is_a_graph_break_naming_the_line(
    fn: Callable[..., Any], args: Callable[[], Any], line: str, why: str
) -> None:
    compiled = kiln_dynamo.compile(fn, backend=SymbolicBackend())
    torch.manual_seed(0)
    for _ in range(6):
        a = args()
        torch.testing.assert_close(compiled(*a), fn(*a))
    reason = kiln_dynamo.counters.break_reasons[0]
    assert f"data-dependent branch on {why}" in reason.reason
    assert reason.frames[-1].source == line and reason.split


def test_backends_of_static_sizes_and_the_switch_keep_the_break(monkeypatch: pytest.MonkeyPatch) -> None:
    def static_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        return gm.forward

    x = torch.randn(6, 4)
    torch.testing.assert_close(kiln_dynamo.compile(_rows, backend=static_backend)(x), _rows(x))
    assert "aten::nonzero needs tensor data" in kiln_dynamo.counters.break_reasons[0].reason
    kiln_dynamo.reset()
    monkeypatch.setenv("KILN_UNBACKED", "0")
    torch.testing.assert_close(kiln_dynamo.compile(_rows, backend=SymbolicBackend())(x), _rows(x))
    assert "aten::nonzero needs tensor data" in kiln_dynamo.counters.break_reasons[0].reason


def test_a_float_item_still_breaks() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().item()

    x = torch.randn(5)
    torch.testing.assert_close(kiln_dynamo.compile(f, backend=SymbolicBackend())(x), f(x))
    assert "Tensor.item()" in kiln_dynamo.counters.break_reasons[0].reason


def test_explain_shows_the_graph_and_no_break() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        e = kiln_dynamo.explain(_masked)(torch.randn(6, 4))
    assert e.break_reasons == [] and len(e.graphs) == 1
    (_, u), *_ = _unbacked_vals(e.graphs[0])
    assert isinstance(u, sympy.Symbol) and u.name.startswith("u")
