"""Module backward hooks (`register_full_backward_hook`, `register_full_backward_pre_hook`,
`register_backward_hook`, torch's global ones): the call of a hooked module is one break, as in
torch.compile without compiled autograd; `Module._call_impl` runs as Python and wraps the inputs
and outputs in the autograd nodes that call the hooks, and the module's own forward is captured
on its own. Every hook runs once per backward with eager's gradients, and what the model's
parameters receive is eager's (the hooks here change the gradients, so a hook that did not run,
or ran on other values, shows)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import CountingBackend
from torch import nn

import kiln_dynamo


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kiln_dynamo.reset()
    yield
    kiln_dynamo.reset()


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) * 2


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Inner()
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).relu() + 1).sum()


Log = list[tuple[str, list[torch.Tensor | None]]]


def _clone(gs: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
    return [None if g is None else g.detach().clone() for g in gs]


def full(log: Log) -> Callable[..., Any]:
    def hook(mod: nn.Module, gin: tuple[torch.Tensor, ...], gout: tuple[torch.Tensor, ...]) -> Any:
        log.append(("full", _clone(gin) + _clone(gout)))
        return None if gin[0] is None else (gin[0] * 3,)  # changes what flows to the module's input

    return hook


def pre(log: Log) -> Callable[..., Any]:
    def hook(mod: nn.Module, gout: tuple[torch.Tensor, ...]) -> Any:
        log.append(("pre", _clone(gout)))
        return (gout[0] * 0.5,)  # changes what the module's backward receives

    return hook


def legacy(log: Log) -> Callable[..., Any]:
    def hook(mod: nn.Module, gin: tuple[torch.Tensor, ...], gout: tuple[torch.Tensor, ...]) -> None:
        log.append(("legacy", _clone(gout)))

    return hook


# where the hook goes: (module path, registration)
CASES: dict[str, tuple[str, str, Callable[[Log], Callable[..., Any]]]] = {
    "full": ("a", "register_full_backward_hook", full),
    "full_pre": ("a", "register_full_backward_pre_hook", pre),
    "legacy": ("b", "register_backward_hook", legacy),
    "full_on_the_compiled_module": ("", "register_full_backward_hook", full),
    "both_on_a_torch_module": ("b", "register_full_backward_pre_hook", pre),
}


def build(case: str, log: Log) -> Outer:
    torch.manual_seed(0)
    model = Outer()
    path, method, make = CASES[case]
    target = model.get_submodule(path)
    getattr(target, method)(make(log))
    if case == "both_on_a_torch_module":
        target.register_full_backward_hook(full(log))
    return model


def assert_same_log(got: Log, want: Log) -> None:
    assert [k for k, _ in got] == [k for k, _ in want]
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert len(g) == len(w)
        for a, b in zip(g, w, strict=True):
            if b is None:
                assert a is None
            else:
                torch.testing.assert_close(a, b)


@pytest.mark.filterwarnings("ignore:Using a non-full backward hook")
@pytest.mark.parametrize("case", list(CASES))
def test_backward_hooks_run_with_eager_gradients(case: str) -> None:
    want_log: Log = []
    got_log: Log = []
    model, ref = build(case, got_log), build(case, want_log)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(3, 4, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out = compiled(x)
        out.backward()
        ref(x_ref).backward()
        torch.testing.assert_close(out, ref(x_ref.detach()))
        torch.testing.assert_close(x.grad, x_ref.grad)
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert_same_log(got_log, want_log)
    assert len(want_log) == 2 * (2 if case == "both_on_a_torch_module" else 1)
    c = kiln_dynamo.counters
    assert c.recompiles == 0 and c.fallbacks == []
    if case != "full_on_the_compiled_module":  # one break, at the hooked module's call
        assert c.graph_breaks == 1
        (reason,) = c.break_reasons
        assert "has backward hooks" in reason.reason and reason.advice is not None
        assert "torch.compile" in reason.advice


def test_a_hook_removed_after_capture_is_not_called_again() -> None:
    """The split made for the hook stays (its guard does not read the hooks of the module called
    for real), but the call then runs without the hook, as in eager."""
    log: Log = []
    model, ref = Outer(), Outer()
    ref.load_state_dict(model.state_dict())
    handle = model.a.register_full_backward_hook(full(log))
    compiled = kiln_dynamo.compile(model, backend=CountingBackend())
    x = torch.randn(3, 4)
    compiled(x).backward()
    assert len(log) == 1 and kiln_dynamo.counters.graph_breaks == 1
    handle.remove()
    for p in model.parameters():
        p.grad = None
    compiled(x).backward()
    ref(x).backward()
    assert len(log) == 1  # not called again
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_global_backward_hooks_run() -> None:
    log: list[str] = []
    model, ref = Outer(), Outer()
    ref.load_state_dict(model.state_dict())
    compiled = kiln_dynamo.compile(model, backend=CountingBackend())
    x = torch.randn(3, 4)
    handle = nn.modules.module.register_module_full_backward_hook(
        lambda m, gin, gout: log.append(type(m).__name__)
    )
    try:
        compiled(x).backward()
        got = list(log)
        log.clear()
        ref(x).backward()
    finally:
        handle.remove()
    # Outer, Inner, and the two Linear layers, as in eager: the compiled wrapper is a module too,
    # but its call does not fire the global hooks a second time (torch.compile's OptimizedModule
    # does, with a warning; Note [Global module hooks and the wrapper])
    assert sorted(got) == sorted(log) and len(log) == 4
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
