"""Symbolic sizes through kiln_aotgrad (Note [SymInts in the aten graph], Note [Symbolic
signatures]): one aten graph, traced from the captured graph's fake placeholders, serves every
size the frame's guards let through. Every result is compared with eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from aot_helpers import Recorder, assert_functional
from torch import nn

import kiln_aotgrad
import kiln_dynamo
from kiln_dynamo import counters


@pytest.fixture(autouse=True)
def _reset() -> Any:
    kiln_dynamo.reset()
    yield
    kiln_dynamo.reset()


def dynamic_backend(recorder: Recorder) -> Callable[..., Any]:
    backend = kiln_aotgrad.aot_backend(recorder)
    backend.__kiln_dynamic_shapes__ = True  # type: ignore[attr-defined]
    return backend


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether some placeholder of the aten graph has a symbolic size."""
    return any(
        isinstance(s, torch.SymInt)
        for n in gm.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
        for s in n.meta["val"].shape
    )


def test_one_aten_graph_serves_every_batch_under_dynamic_true() -> None:
    def f(x: torch.Tensor, y: torch.Tensor, n: int) -> Any:
        a = (x * y).sum(-1).view(-1, 1) + x.shape[0]
        return a.softmax(0) * n, (x + 1).reshape(-1), x.shape[0] * 2

    rec = Recorder()
    compiled = kiln_dynamo.compile(f, backend=dynamic_backend(rec), dynamic=True)
    for b in (4, 7, 9, 2, 33):
        x, y = torch.randn(b, 3), torch.randn(b, 3)
        got, want = compiled(x, y, b), f(x, y, b)
        torch.testing.assert_close(got, want)
        assert type(got[2]) is int
    assert len(rec.graphs) == 1 and counters.dynamic_fallbacks == []
    gm = rec.graphs[0]
    assert_functional(gm)
    assert _symbolic(gm) and any(n.target is torch.ops.aten.sym_size.int for n in gm.graph.nodes)
    placeholders = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    assert isinstance(placeholders[2], torch.SymInt)  # the int input `n`
    assert "sym_size_int * 2" in gm.code


def test_automatic_dynamic_compiles_twice_for_batch_2_to_64() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)).eval()
    rec = Recorder()
    compiled = kiln_dynamo.compile(model, backend=dynamic_backend(rec))
    with torch.no_grad():
        for b in range(2, 65, 3):
            x = torch.randn(b, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(rec.graphs) == 2 and counters.dynamic_fallbacks == []
    assert not _symbolic(rec.graphs[0]) and _symbolic(rec.graphs[1])


def test_views_reshapes_and_reductions_over_a_symbolic_dim() -> None:
    def f(x: torch.Tensor) -> Any:
        b, t = x.shape
        y = x.view(b, t // 2, 2).transpose(1, 2).reshape(b * 2, t // 2)
        return y.softmax(-1), nn.functional.layer_norm(x, (t,)), x.mean(0), torch.zeros(b, 4) + x[:, :1]

    rec = Recorder()
    compiled = kiln_dynamo.compile(f, backend=dynamic_backend(rec), dynamic=True)
    for b, t in ((3, 8), (5, 12), (7, 4)):
        x = torch.randn(b, t)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(rec.graphs) == 1


def test_an_output_viewing_an_input_is_refused_and_compiled_static() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1)

    rec = Recorder()
    compiled = kiln_dynamo.compile(f, backend=dynamic_backend(rec), dynamic=True)
    for b in (3, 4):
        x = torch.randn(b, 2)
        out = compiled(x)
        torch.testing.assert_close(out, f(x))
        assert out._base is x  # still a view, as eager's
    assert len(rec.graphs) == 2
    assert counters.dynamic_fallbacks and "view of an input" in counters.dynamic_fallbacks[0][1]


def test_training_with_a_smaller_last_batch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())
    rec = Recorder()
    compiled = kiln_dynamo.compile(model, backend=dynamic_backend(rec))
    for b in [16, 16, 10, 16, 7, 3]:
        x = torch.randn(b, 6)
        out, expected = compiled(x), ref(x)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    assert counters.dynamic_fallbacks == []
    # static forward+backward for 16, then one symbolic forward+backward for every other size
    assert len(rec.graphs) == 4
    assert _symbolic(rec.graphs[2])
