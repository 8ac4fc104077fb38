"""An optimizer step inside a compiled training step (Note [Tracing an optimizer step]).

`forward; loss.backward(); opt.step(); opt.zero_grad()`: the forward is one graph, `backward()` the
one break, and the step with zero_grad one more graph; parameters, gradients and optimizer state
match eager after every step, across learning-rate changes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import CountingBackend
from torch import nn

import kiln_dynamo

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov_foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adam_foreach": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True, weight_decay=0.1),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True, maximize=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1),
}


def _train_step(model: nn.Module, opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step


def _pair(make: Callable[[Any], torch.optim.Optimizer]) -> tuple[Any, Any]:
    torch.manual_seed(0)
    m1 = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    m2 = copy.deepcopy(m1)
    return (m1, make(m1.parameters())), (m2, make(m2.parameters()))


def _assert_same_training_state(a: tuple[Any, Any], b: tuple[Any, Any]) -> None:
    (m1, o1), (m2, o2) = a, b
    for (name, p), q in zip(m1.named_parameters(), m2.parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=name)
        assert (p.grad is None) == (q.grad is None), name
        s1, s2 = o1.state[p], o2.state[q]
        assert list(s1) == list(s2), (name, list(s1), list(s2))
        for k in s1:
            assert type(s1[k]) is type(s2[k]) and s1[k].dtype == s2[k].dtype, (name, k)
            torch.testing.assert_close(s2[k], s1[k], msg=f"{name} {k}")
    assert [g["lr"] for g in o1.param_groups] == [g["lr"] for g in o2.param_groups]


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_a_training_step_traces_the_optimizer_step_and_matches_eager(kind: str) -> None:
    eager, mine = _pair(OPTIMIZERS[kind])
    backend = CountingBackend()
    step_e = _train_step(*eager)
    step_c = kiln_dynamo.compile(_train_step(*mine), backend=backend)
    for _ in range(4):
        x = torch.randn(3, 4)
        torch.testing.assert_close(step_c(x), step_e(x))
        _assert_same_training_state(eager, mine)
    reasons = [str(r) for r in kiln_dynamo.counters.break_reasons]
    assert len(reasons) == 1 and "backward()" in reasons[0], reasons
    assert kiln_dynamo.counters.fallbacks == []
    # the forward and the step; SGD with momentum compiles its step twice: the first step makes
    # the momentum buffers (written back into opt.state), the second reads them (keys guarded)
    assert backend.graphs == (3 if "sgd_m" in kind or "nesterov" in kind else 2), backend.graphs
    stepping = backend.gms[1]
    assert "_set_grad_enabled" in stepping.code  # the step runs with grad mode off, as eager


def test_first_momentum_buffers_are_written_into_the_optimizer_state() -> None:
    eager, mine = _pair(OPTIMIZERS["sgd_momentum"])
    x = torch.randn(3, 4)
    _train_step(*eager)(x)
    kiln_dynamo.compile(_train_step(*mine), backend=CountingBackend())(x)
    _assert_same_training_state(eager, mine)
    assert all("momentum_buffer" in mine[1].state[p] for p in mine[0].parameters())


def test_a_float_learning_rate_is_guarded_and_a_scheduler_change_recompiles() -> None:
    # torch.compile guards a float lr too; a tensor lr (next test) is a graph input instead
    eager, mine = _pair(OPTIMIZERS["adam"])
    sched_e = torch.optim.lr_scheduler.StepLR(eager[1], 1, gamma=0.5)
    sched_c = torch.optim.lr_scheduler.StepLR(mine[1], 1, gamma=0.5)
    step_e = _train_step(*eager)
    step_c = kiln_dynamo.compile(_train_step(*mine), backend=CountingBackend())
    for i in range(4):
        x = torch.randn(3, 4)
        torch.testing.assert_close(step_c(x), step_e(x))
        _assert_same_training_state(eager, mine)
        if i % 2 == 1:
            sched_e.step()
            sched_c.step()
    assert mine[1].param_groups[0]["lr"] == 0.0025 and mine[1]._opt_called  # the scheduler saw the step
    assert kiln_dynamo.counters.recompiles == 1  # one new lr value reached a step


def test_a_tensor_learning_rate_is_a_graph_input_and_never_recompiles() -> None:
    eager, mine = _pair(lambda ps: torch.optim.Adam(ps, lr=torch.tensor(0.01)))
    sched_e = torch.optim.lr_scheduler.StepLR(eager[1], 1, gamma=0.5)
    sched_c = torch.optim.lr_scheduler.StepLR(mine[1], 1, gamma=0.5)
    backend = CountingBackend()
    step_e = _train_step(*eager)
    step_c = kiln_dynamo.compile(_train_step(*mine), backend=backend)
    for _ in range(4):
        x = torch.randn(3, 4)
        torch.testing.assert_close(step_c(x), step_e(x))
        _assert_same_training_state(eager, mine)
        sched_e.step()
        sched_c.step()
    assert kiln_dynamo.counters.recompiles == 0 and backend.graphs == 2


def test_zero_grad_without_set_to_none_zeroes_in_the_graph() -> None:
    eager, mine = _pair(OPTIMIZERS["sgd"])

    def make(model: nn.Module, opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], torch.Tensor]:
        def step(x: torch.Tensor) -> torch.Tensor:
            loss = model(x).sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            return loss.detach()

        return step

    step_c = kiln_dynamo.compile(make(*mine), backend=CountingBackend())
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(step_c(x), make(*eager)(x))
        _assert_same_training_state(eager, mine)
    assert all(p.grad is not None and not p.grad.any() for p in mine[0].parameters())


def test_parameters_without_a_gradient_are_skipped_and_guarded() -> None:
    # the None gradient is guarded: when it appears, the step recompiles instead of skipping it
    eager, mine = _pair(OPTIMIZERS["adam"])
    for m, _ in (eager, mine):
        m[2].bias.requires_grad_(False)

    def make(model: nn.Module, opt: torch.optim.Optimizer) -> Callable[[], None]:
        def step() -> None:
            opt.step()

        return step

    step_c = kiln_dynamo.compile(make(*mine), backend=CountingBackend())
    for i in range(3):
        x = torch.randn(3, 4)
        for m, _ in (eager, mine):
            if i == 2:
                m[2].bias.requires_grad_(True)
            m(x).pow(2).sum().backward()
        make(*eager)()
        step_c()
        _assert_same_training_state(eager, mine)
    assert kiln_dynamo.counters.recompiles == 1


class _OwnStep(torch.optim.SGD):
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return super().step(closure)


@pytest.mark.parametrize(
    ("make", "call", "reason"),
    [
        (lambda ps: torch.optim.SGD(ps, lr=0.1), lambda opt: opt.step(lambda: None), "closure"),
        (lambda ps: torch.optim.Adam(ps, lr=0.1, fused=True), lambda opt: opt.step(), "fused=True"),
        (lambda ps: _OwnStep(ps, lr=0.1), lambda opt: opt.step(), "_OwnStep"),
    ],
    ids=["closure", "fused", "subclass"],
)
def test_what_the_step_would_do_differently_breaks_with_a_reason(make: Any, call: Any, reason: str) -> None:
    eager, mine = _pair(make)

    def fn_of(opt: torch.optim.Optimizer) -> Callable[[], None]:
        def fn() -> None:
            call(opt)

        return fn

    for m, _ in (eager, mine):
        m(torch.ones(2, 4)).sum().backward()
    fn_of(eager[1])()
    kiln_dynamo.compile(fn_of(mine[1]), backend=CountingBackend())()
    _assert_same_training_state(eager, mine)
    reasons = [str(r) for r in kiln_dynamo.counters.break_reasons]
    assert any(reason in r for r in reasons), reasons


def test_a_step_hook_breaks_and_runs_in_python() -> None:
    eager, mine = _pair(OPTIMIZERS["sgd"])
    calls: list[str] = []
    mine[1].register_step_post_hook(lambda opt, args, kwargs: calls.append("post"))
    mine[0](torch.ones(2, 4)).sum().backward()
    eager[0](torch.ones(2, 4)).sum().backward()
    eager[1].step()

    def fn() -> None:
        mine[1].step()

    kiln_dynamo.compile(fn, backend=CountingBackend())()
    _assert_same_training_state(eager, mine)
    assert calls == ["post"]
    assert any("step hooks" in str(r) for r in kiln_dynamo.counters.break_reasons)


def test_addcdiv_with_a_tensor_value_is_rewritten_only_where_eager_agrees() -> None:
    # Note [A tensor as the value of addcdiv]: floating operands and a value without grad
    def f(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.addcdiv_(a, b, value=s)
        return torch.addcmul(x, a, b, value=s) + y

    args = (torch.randn(4), torch.randn(4), torch.rand(4) + 1, torch.tensor(-0.3))
    backend = CountingBackend()
    torch.testing.assert_close(kiln_dynamo.compile(f, backend=backend)(*args), f(*args))
    assert backend.graphs == 1 and kiln_dynamo.counters.break_reasons == []
    ints = (torch.arange(4), torch.arange(4), torch.arange(4) + 1, torch.tensor(2))
    with pytest.raises(RuntimeError):
        f(*ints)
    kiln_dynamo.reset()
    with pytest.raises(RuntimeError):
        kiln_dynamo.compile(f, backend=CountingBackend())(*ints)


def test_a_step_patched_on_the_class_after_compiling_recompiles(monkeypatch: pytest.MonkeyPatch) -> None:
    eager, mine = _pair(OPTIMIZERS["adam"])
    step_e, step_c = _train_step(*eager), kiln_dynamo.compile(_train_step(*mine), backend=CountingBackend())
    x = torch.randn(3, 4)
    torch.testing.assert_close(step_c(x), step_e(x))
    calls: list[int] = []
    original = torch.optim.Adam.step

    def patched(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", patched)
    torch.testing.assert_close(step_c(x), step_e(x))
    _assert_same_training_state(eager, mine)
    assert calls == [1, 1]  # the compiled step ran the patched method, not the traced one
