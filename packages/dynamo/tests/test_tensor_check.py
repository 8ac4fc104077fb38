"""`torch._check_tensor_all` as a run-time assertion in the graph (Note [A check of a whole tensor
as an assertion in the graph] in variables/torch.py): captured without a break, and raising
RuntimeError at run time exactly where eager does."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import CountingBackend, assert_same

import kiln_dynamo


def checked(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    y = x * 2
    torch._check_tensor_all(y.sum(-1) > n, lambda: f"row sums {y.sum(-1)} too small")
    return y + 1


def checked_with(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    torch._check_tensor_all_with(RuntimeError, x > n)
    return x - 1


def checked_other_type(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    torch._check_tensor_all_with(ValueError, x > n)  # another error type: not an assertion
    return x - 1


def checked_not_bool(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    torch._check_tensor_all(x - n)  # eager raises TypeError
    return x


def _raises(fn: Any, *args: Any) -> type[BaseException] | None:
    try:
        fn(*args)
    except Exception as e:
        return type(e)
    return None


@pytest.mark.parametrize("fn", [checked, checked_with], ids=["check", "check_with"])
def test_check_becomes_an_assertion_in_the_graph(fn: Any) -> None:
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    x, small, big = torch.ones(3, 4), torch.tensor(0.5), torch.tensor(100.0)
    assert_same(compiled(x, small), fn(x, small))
    assert backend.graphs == 1 and kiln_dynamo.counters.fallbacks == []
    targets = [n.target for n in backend.gms[0].graph.nodes]
    assert torch._assert_async in targets, targets
    # the same condition raises the same error type, from the compiled graph (no recompile)
    assert _raises(fn, x, big) is RuntimeError
    assert _raises(compiled, x, big) is RuntimeError
    assert backend.graphs == 1 and kiln_dynamo.counters.recompiles == 0


def checked_str_message(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    torch._check_tensor_all(x > n, "not callable")  # eager raises TypeError when x > n fails
    return x


@pytest.mark.parametrize(
    "fn",
    [checked_other_type, checked_not_bool, checked_str_message],
    ids=["value_error", "not_bool", "str_message"],
)
def test_other_checks_stay_eager_and_right(fn: Any) -> None:
    x = torch.ones(3, 4)
    for n in (torch.tensor(0.5), torch.tensor(100.0)):
        report = kiln_dynamo.explain(fn)
        expected = _raises(fn, x, n)
        assert _raises(report, x, n) is expected
        if expected is None:
            assert_same(kiln_dynamo.compile(fn, backend=CountingBackend())(x, n), fn(x, n))
