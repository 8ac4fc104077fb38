"""Forward hooks and pre-hooks registered inside the compiled frame (Note [Module hooks
registered in the frame] in variables/module_hooks.py): the layers called after the registration
run the hook in the same graph, the runner registers it on the real module, the handle is the
real one with eager's id, and the next call captures the hook as an ordinary one."""

from __future__ import annotations

import copy
import threading
from typing import Any

import torch
from conftest import CountingBackend
from torch import nn
from torch.utils.hooks import RemovableHandle

import kiln_dynamo
from kiln_dynamo import counters

COLLECT: list[tuple[str, torch.Tensor]] = []


def install(mod: nn.Module, key: str, scale: float) -> None:
    """transformers' `install_output_capuring_hook` in miniature: a closure made in an inlined call."""

    def record(m: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        COLLECT.append((key, out * scale))

    mod.register_forward_hook(record)


def install_all(model: nn.Module) -> None:
    for name, mod in model.named_children():
        install(mod, name, 2.0)
    model.installed = True


class Capturing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(self, "installed", False):
            install_all(self)
        return self.b(torch.relu(self.a(x)))


def _hook_state(model: nn.Module) -> list[tuple[str, list[str], list[str]]]:
    return [
        (
            n,
            [f.__qualname__ for f in m._forward_hooks.values()],
            [f.__qualname__ for f in m._forward_pre_hooks.values()],
        )
        for n, m in model.named_modules()
    ]


def _ids(model: nn.Module) -> list[int]:
    return [k for m in model.modules() for k in [*m._forward_pre_hooks, *m._forward_hooks]]


def _compare(eager: nn.Module, model: nn.Module, fn: Any, x: torch.Tensor, calls: int = 2) -> CountingBackend:
    """Eager and compiled calls side by side: results, what the hooks recorded, the hook dicts
    after each call and the handles' ids counted from the call's start (eager's counter)."""
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn(model), backend=backend)
    for _ in range(calls):
        COLLECT.clear()
        start = RemovableHandle.next_id
        expected = fn(eager)(x)
        seen_eager, eager_made = list(COLLECT), RemovableHandle.next_id - start
        COLLECT.clear()
        start_c = RemovableHandle.next_id
        got = compiled(x)
        assert RemovableHandle.next_id - start_c == eager_made
        torch.testing.assert_close(got, expected)
        assert [k for k, _ in COLLECT] == [k for k, _ in seen_eager]
        torch.testing.assert_close([v for _, v in COLLECT], [v for _, v in seen_eager])
        assert _hook_state(model) == _hook_state(eager)
        assert [i - start_c for i in _ids(model) if i >= start_c] == [
            i - start for i in _ids(eager) if i >= start
        ]
    assert counters.fallbacks == []
    return backend


def test_hooks_installed_by_the_first_call_run_in_the_same_graph() -> None:
    torch.manual_seed(0)
    eager = Capturing()
    model = copy.deepcopy(eager)
    report = kiln_dynamo.explain(copy.deepcopy(eager))(torch.randn(2, 4))
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    kiln_dynamo.reset()
    backend = _compare(eager, model, lambda m: m, torch.randn(2, 4), calls=3)
    assert backend.graphs == 2  # the second call recompiles once: the hooks are now real ones
    assert counters.recompiles == 1


class Ordered(nn.Module):
    """prepend, with_kwargs, pre-hooks: the order torch gives them when the layer runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lin.register_forward_hook(lambda m, a, out: out + 1)  # a real hook, registered before

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(self, "done", False):
            self.lin.register_forward_hook(times_two, prepend=True)
            self.lin.register_forward_hook(kw_hook, with_kwargs=True)
            self.lin.register_forward_pre_hook(pre_hook)
            self.done = True
        return self.lin(x)


def times_two(m: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
    return out * 2


def kw_hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor) -> torch.Tensor:
    return out - args[0].sum()


def pre_hook(m: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor]:
    return (args[0].cos(),)


def test_prepend_with_kwargs_and_pre_hooks_follow_torchs_order() -> None:
    torch.manual_seed(0)
    eager = Ordered()
    model = copy.deepcopy(eager)
    _compare(eager, model, lambda m: m, torch.randn(2, 4))
    assert [f.__name__ for f in model.lin._forward_hooks.values()] == ["times_two", "<lambda>", "kw_hook"]


def returns_handle(m: nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, RemovableHandle]:
    h = m.register_forward_hook(times_two)
    return m(x), h


def test_the_handle_leaving_the_frame_is_the_real_one() -> None:
    torch.manual_seed(0)
    m = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    report = kiln_dynamo.explain(returns_handle)(m, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    out, h = report.result
    assert isinstance(h, RemovableHandle) and list(m._forward_hooks) == [h.id]
    assert m._forward_hooks[h.id] is times_two
    torch.testing.assert_close(out, nn.functional.linear(x, m.weight, m.bias) * 2)
    h.remove()
    assert not m._forward_hooks


def removes_in_frame(m: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    h = m.register_forward_hook(times_two)
    y = m(x)
    h.remove()  # the handle has no real object inside the frame: a break
    return m(y)


def test_using_the_handle_in_the_frame_breaks_and_stays_correct() -> None:
    torch.manual_seed(0)
    m, x = nn.Linear(4, 4), torch.randn(2, 4)
    ref_m = copy.deepcopy(m)
    expected = removes_in_frame(ref_m, x)
    report = kiln_dynamo.explain(removes_in_frame)(m, x)
    assert report.graph_break_count >= 1
    torch.testing.assert_close(report.result, expected)
    assert not m._forward_hooks and not ref_m._forward_hooks


class RootClosure(nn.Module):
    """A hook closing over a local of a frame that goes on after a break: refused, not rebuilt."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 2.0
        self.lin.register_forward_hook(lambda m, a, out: self.seen.append(out * scale))
        y = self.lin(x)
        print("", end="")  # a break: the frame's code runs on after the runner
        scale = 5.0
        return self.lin(y)


def test_hook_closing_over_a_frame_running_on_is_refused() -> None:
    torch.manual_seed(0)
    eager = RootClosure()
    model = copy.deepcopy(eager)
    x = torch.randn(2, 4)
    expected = eager(x)
    got = kiln_dynamo.compile(model, backend="eager")(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(model.seen, eager.seen)  # the second call saw scale = 5


def made_and_returned(x: torch.Tensor) -> Any:
    def inner(k: int, c: float = 3.0) -> Any:
        return lambda y: y * k + c

    return inner(4), x + 1


def test_a_function_made_in_an_inlined_call_leaves_the_frame() -> None:
    report = kiln_dynamo.explain(made_and_returned)(torch.ones(2))
    assert report.break_reasons == []
    fn, _ = report.result
    torch.testing.assert_close(fn(torch.ones(2)), torch.full((2,), 7.0))


def counter_made(x: torch.Tensor) -> Any:
    def make() -> Any:
        n = 0

        def bump() -> int:
            nonlocal n
            n += 1
            return n

        return bump

    return make(), x + 1


def test_a_function_that_rebinds_a_closure_variable_is_not_rebuilt() -> None:
    report = kiln_dynamo.explain(counter_made)(torch.ones(2))
    bump, _ = report.result
    assert (bump(), bump()) == (1, 2)  # the real closure (the frame ran as Python)
    assert any("nonlocal" in str(r) for r in report.break_reasons), report.break_reasons


# --- transformers' double-checked installation under a lock (Note [Effects under a lock
# replayed under it] in variables/locks.py) ---------------------------------------------------

INSTALL_LOCK = threading.Lock()


def maybe_install(model: nn.Module) -> None:
    if getattr(model, "installed", False):
        return
    with INSTALL_LOCK:
        if getattr(model, "installed", False):
            return
        install_all(model)


class LockedCapturing(Capturing):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        maybe_install(self)
        return self.b(torch.relu(self.a(x)))


def test_hooks_installed_under_a_lock_are_registered_under_it() -> None:
    torch.manual_seed(0)
    eager = LockedCapturing()
    model = copy.deepcopy(eager)
    report = kiln_dynamo.explain(copy.deepcopy(eager))(torch.randn(2, 4))
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    kiln_dynamo.reset()
    backend = _compare(eager, model, lambda m: m, torch.randn(2, 4), calls=3)
    assert backend.graphs == 2 and counters.recompiles == 1
    assert not INSTALL_LOCK.locked()


class InstallsMeanwhile(CountingBackend):
    """Stands for another thread that installs the hooks while the frame is being compiled."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if self.graphs == 0:
            with INSTALL_LOCK:
                install_all(self.model)
        return super().__call__(gm, example_inputs)


def test_state_changed_under_the_lock_while_capturing_runs_the_frame_as_python() -> None:
    torch.manual_seed(0)
    eager, model = LockedCapturing(), LockedCapturing()
    model.load_state_dict(eager.state_dict())
    install_all(eager)  # what eager sees: the hooks installed by the other thread
    x = torch.randn(2, 4)
    compiled = kiln_dynamo.compile(model, backend=InstallsMeanwhile(model))
    for _ in range(2):
        COLLECT.clear()
        expected = eager(x)
        seen = list(COLLECT)
        COLLECT.clear()
        torch.testing.assert_close(compiled(x), expected)
        assert [k for k, _ in COLLECT] == [k for k, _ in seen]
        assert _hook_state(model) == _hook_state(eager)  # one set of hooks, not two
    assert not INSTALL_LOCK.locked()


def test_another_thread_installing_first_is_seen() -> None:
    """Whichever thread takes the lock first installs; the other sees the hooks (its guard fails,
    with or without the lock held)."""
    torch.manual_seed(0)
    eager = LockedCapturing()
    models = [copy.deepcopy(eager) for _ in range(2)]
    x = torch.randn(2, 4)
    compiled = kiln_dynamo.compile(lambda m, t: m(t), backend=CountingBackend())
    compiled(models[0], x)  # captures the installing path
    COLLECT.clear()
    other = models[1]
    with INSTALL_LOCK:
        worker = threading.Thread(target=compiled, args=(other, x))
        worker.start()  # waits at the lock (in the guard) or runs after it
        install_all(other)
    worker.join()
    assert _hook_state(other) == _hook_state(models[0])
    assert [k for k, _ in COLLECT] == ["a", "b"]  # the worker's call ran the installed hooks once
    assert not INSTALL_LOCK.locked()
