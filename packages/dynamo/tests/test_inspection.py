"""`inspect.signature` of a known function is answered while tracing; mappingproxies are read
like dicts and never mutated."""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import pytest
import torch
from conftest import CountingBackend, check
from torch import nn

import kiln_dynamo


def _chunk(x, y, *, scale=2.0):
    return x * y * scale


def _arity(fn: Any) -> int:
    return len(inspect.signature(fn).parameters)


def apply_chunked(fn, *tensors):
    # transformers.pytorch_utils.apply_chunking_to_forward's check
    if len(inspect.signature(fn).parameters) != len(tensors):
        raise ValueError("wrong arity")
    return fn(*tensors)


class Chunked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def ff_chunk(self, h):
        return self.lin(h).relu()

    def forward(self, x):
        return apply_chunked(self.ff_chunk, x) + 1


def test_signature_of_a_bound_method_is_folded() -> None:
    backend = check(Chunked(), torch.randn(2, 4))
    assert backend.ops >= 2


def test_signature_parameters_are_read() -> None:
    def f(x):
        sig = inspect.signature(_chunk)
        names = list(sig.parameters)
        p = sig.parameters["scale"]
        kinds = [q.kind == inspect.Parameter.KEYWORD_ONLY for q in sig.parameters.values()]
        no_default = sig.parameters["x"].default is inspect.Parameter.empty
        return x * len(names) + p.default + sum(kinds) + no_default + ("y" in sig.parameters)

    check(f, torch.randn(3))


_CHUNKED = Chunked()


def test_signature_of_a_function_argument_and_of_a_method() -> None:
    def f(x):
        return x * _arity(_chunk) + _arity(_CHUNKED.ff_chunk)

    check(f, torch.randn(3))


def test_signature_follows_a_changed_default() -> None:
    def g(x, k=1):
        return x

    def f(x):
        return x + inspect.signature(g).parameters["k"].default

    cf = kiln_dynamo.compile(f, backend=(backend := CountingBackend()))
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x + 1)
    g.__defaults__ = (5,)
    torch.testing.assert_close(cf(x), x + 5)
    assert backend.graphs == 2 and kiln_dynamo.counters.recompiles == 1


def test_signature_of_a_wrapper_breaks_with_a_reason() -> None:
    @functools.wraps(_chunk)
    def wrapper(*args, **kwargs):
        return _chunk(*args, **kwargs)

    def f(x):
        return x * len(inspect.signature(wrapper).parameters)

    x = torch.randn(3)
    report = kiln_dynamo.explain(f)(x)
    torch.testing.assert_close(report.result, x * 3)
    assert any("a wrapper" in str(r) for r in report.break_reasons), str(report)


def test_mappingproxy_is_read_lazily_and_not_mutated() -> None:
    def f(x, mp):
        out = x * mp["k"] + len(mp)
        if "missing" in mp:
            out = out + 100
        return out + sum(1 for _ in mp)

    backing: dict[str, Any] = {"k": 2.0, "other": [1, 2], "t": torch.ones(2)}
    mp = types.MappingProxyType(backing)
    cf = kiln_dynamo.compile(f, backend=(backend := CountingBackend()))
    x = torch.randn(2)
    torch.testing.assert_close(cf(x, mp), f(x, mp))
    backing["other"] = "unread"  # an unread value: no recompile (Note [Lazy dict entries])
    torch.testing.assert_close(cf(x, mp), f(x, mp))
    assert backend.graphs == 1 and kiln_dynamo.counters.fallbacks == []
    backing["k"] = 3.0
    torch.testing.assert_close(cf(x, mp), f(x, mp))
    assert backend.graphs == 2

    def g(x, mp):
        mp["k"] = 1  # TypeError at run time: never traced as a write
        return x

    with pytest.raises(TypeError):
        kiln_dynamo.compile(g, backend="eager")(torch.randn(2), mp)


def test_signature_follows_a_longer_defaults_tuple() -> None:
    def g(x, k=1):
        return x

    def f(x):
        return x + sum(p.default is inspect.Parameter.empty for p in inspect.signature(g).parameters.values())

    cf = kiln_dynamo.compile(f, backend=(backend := CountingBackend()))
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x + 1)
    g.__defaults__ = (0, 1)  # x has a default now
    torch.testing.assert_close(cf(x), x)
    assert backend.graphs == 2
