"""KILN_LOG artifacts print. (The layering rules are checked for every package by tests/e2e.)"""

from __future__ import annotations

import logging

import pytest
import torch

import kiln_dynamo
from kiln_dynamo import logs


def _fn(x):
    return torch.relu(x) + 1


@pytest.mark.parametrize(
    ("artifact", "needle"),
    [("graph", "torch.relu"), ("guards", "L['x'].dtype == torch.float32"), ("bytecode", "def ___run")],
)
def test_log_artifacts(artifact: str, needle: str, caplog: pytest.LogCaptureFixture) -> None:
    enabled = logs.configure(artifact)
    try:
        assert enabled == [artifact]
        with caplog.at_level(logging.INFO, logger=f"kiln.dynamo.{artifact}"):
            kiln_dynamo.compile(_fn)(torch.randn(3))
        assert needle in caplog.text
        if artifact == "graph":
            assert "test_layering_and_logs.py" in caplog.text  # the user's line per node
    finally:
        logs.configure("")


def test_an_artifact_turned_off_makes_no_records() -> None:
    logger = logging.getLogger("kiln.dynamo.graph")
    try:
        logs.configure("graph")
        assert logger.isEnabledFor(logging.INFO)
        logs.configure("")
        assert logger.level == logging.NOTSET and not logger.isEnabledFor(logging.INFO)
    finally:
        logs.configure("")


def test_backend_protocol_receives_graph_and_real_inputs() -> None:
    seen = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        seen["gm"] = gm
        seen["inputs"] = example_inputs
        return gm.forward

    x = torch.randn(3)
    kiln_dynamo.compile(_fn, backend=backend)(x)
    assert isinstance(seen["gm"], torch.fx.GraphModule)
    assert seen["inputs"][0] is x


def test_unknown_backend_name() -> None:
    with pytest.raises(ValueError, match="unknown kiln_dynamo backend"):
        kiln_dynamo.compile(_fn, backend="nope")


def test_registered_backend_by_name() -> None:
    calls = []

    def mine(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        calls.append(gm)
        return gm.forward

    kiln_dynamo.register_backend("test_mine", mine)
    kiln_dynamo.compile(_fn, backend="test_mine")(torch.randn(2))
    assert len(calls) == 1


def test_torch_backend_plugs_in() -> None:
    """PyTorch's own backends follow the same protocol (tests may use torch.compile's registry)."""
    from torch._dynamo.backends.registry import lookup_backend

    x = torch.randn(4)
    out = kiln_dynamo.compile(_fn, backend=lookup_backend("eager"))(x)
    torch.testing.assert_close(out, _fn(x))


def test_torch_aot_eager_backend_with_grad() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    w1 = torch.randn(4, 5, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_()
    x = torch.randn(3, 4)

    def f(x, w):
        return (x @ w).relu().sum(0)

    out = kiln_dynamo.compile(f, backend=lookup_backend("aot_eager"))(x, w1)
    ref = f(x, w2)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad)
    assert kiln_dynamo.counters.fallbacks == []


class _CallableObject:
    def __init__(self) -> None:
        self.k = 3

    def __call__(self, x):
        return x * self.k


def test_compile_callable_object() -> None:
    obj = _CallableObject()
    x = torch.randn(2)
    torch.testing.assert_close(kiln_dynamo.compile(obj)(x), x * 3)
    assert kiln_dynamo.counters.graphs == 1
