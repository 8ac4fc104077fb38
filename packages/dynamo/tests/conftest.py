"""Shared test helpers: one comparison with eager (`check`) and a counting backend."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import kiln_dynamo


class CountingBackend:
    """Counts graphs and ops handed to it, then runs the graph eagerly."""

    def __init__(self) -> None:
        self.graphs = 0
        self.ops = 0
        self.gms: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs += 1
        self.ops += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
        self.gms.append(gm)
        return gm.forward


def one_graph(fn: Any, *args: Any) -> Any:
    """`fn` captured as one graph with no break (kiln_dynamo.explain); returns its result."""
    report = kiln_dynamo.explain(fn)(*args)
    assert report.graph_count == 1, report
    assert report.break_reasons == [], report
    return report.result


def assert_same(a: Any, b: Any, path: str = "out") -> None:
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device, path
        assert a.requires_grad == b.requires_grad, f"{path}: requires_grad"
        torch.testing.assert_close(a, b, equal_nan=True, msg=path)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif hasattr(a, "__dict__") and not isinstance(a, type) and not callable(a):
        assert_same(vars(a), vars(b), f"{path}.__dict__")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def check(
    fn: Callable[..., Any],
    *args: Any,
    graphs: int = 1,
    state: Callable[..., Any] | None = None,
    calls: int = 2,
) -> CountingBackend:
    """Run `fn` eagerly and compiled on copies of `args`; outputs and visible state must agree.

    `state(args)` returns the externally visible state to compare (for frames that mutate). The
    compiled function is called `calls` times; exactly `graphs` graphs must be captured, with no
    fallback and no recompile.
    """
    kiln_dynamo.reset()
    torch.manual_seed(0)
    eager_args = copy.deepcopy(args)
    comp_args = copy.deepcopy(args)
    backend = CountingBackend()
    target = comp_args[0] if isinstance(fn, torch.nn.Module) else fn
    compiled = kiln_dynamo.compile(
        fn if not isinstance(fn, torch.nn.Module) else copy.deepcopy(fn), backend=backend
    )
    eager_fn = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    del target
    for _ in range(calls):
        expected = eager_fn(*eager_args)
        actual = compiled(*comp_args)
        assert kiln_dynamo.counters.fallbacks == [], kiln_dynamo.counters.fallbacks
        assert_same(expected, actual)
        if state is not None:
            assert_same(state(*eager_args), state(*comp_args), "state")
        if isinstance(fn, torch.nn.Module):
            assert_same(dict(eager_fn.state_dict()), dict(compiled.state_dict()), "state_dict")
    assert backend.graphs == graphs, f"{backend.graphs} graphs"
    assert kiln_dynamo.counters.recompiles == 0
    return backend


@pytest.fixture(autouse=True)
def _reset() -> Any:
    kiln_dynamo.reset()
    yield
    kiln_dynamo.reset()
