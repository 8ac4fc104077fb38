"""`torch.inference_mode()` traced into the graph (issue 16; Note [inference_mode traced] in
inference.py): as a with-block and as a decorator, inside the compiled frame and around the
compiled call. Every case counts graphs and breaks and compares with eager: values, Python
types, `is_inference()`, `requires_grad`, and the errors eager raises for inference tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import CountingBackend, assert_same
from torch import nn

import kiln_dynamo


def t(*shape: int, grad: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(5 * sum(shape) + 1)
    return torch.randn(*shape, generator=g).requires_grad_(grad)


def _flat(v: Any) -> list[Any]:
    if isinstance(v, (tuple, list)):
        return [y for x in v for y in _flat(x)]
    return [v]


def _same(got: Any, want: Any) -> None:
    """Values and types (assert_same), and each tensor's inference state and view-ness of grad."""
    assert_same(got, want)
    for g, w in zip(_flat(got), _flat(want), strict=True):
        if isinstance(w, torch.Tensor):
            assert g.is_inference() == w.is_inference()
            assert g.requires_grad == w.requires_grad
            assert g.stride() == w.stride()


_OUTER: dict[str, Callable[[], Any]] = {
    "plain": torch.enable_grad,
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


def _run(fn: Callable[..., Any], args: tuple[Any, ...], outer: str, graphs: int = 1, breaks: int = 0) -> None:
    kiln_dynamo.reset()
    with _OUTER[outer]():
        want = fn(*args)
        report = kiln_dynamo.explain(fn)(*args)
        backend = CountingBackend()
        compiled = kiln_dynamo.compile(fn, backend=backend)
        first, second = compiled(*args), compiled(*args)
    assert report.graph_count == graphs, report
    assert len(report.break_reasons) == breaks, report
    _same(report.result, want)
    _same(first, want)
    _same(second, want)
    assert not torch.is_inference_mode_enabled() or outer == "inference_mode"


def _block_between(x: torch.Tensor, w: torch.Tensor) -> Any:
    y = x * 2
    with torch.inference_mode():
        z = (y @ w).relu()
        v = x[0]  # a view of a normal tensor stays normal (and keeps requires_grad)
    return y + 1, z, v


def _return_inside(x: torch.Tensor, w: torch.Tensor) -> Any:
    with torch.inference_mode():
        return (x @ w).sin()


def _used_after(x: torch.Tensor, w: torch.Tensor) -> Any:
    with torch.inference_mode():
        a = (x @ w).sin()
    return a * 2, a.sum(0)  # new results outside the block are normal tensors


def _views_share(x: torch.Tensor, w: torch.Tensor) -> Any:
    with torch.inference_mode():
        z = x @ w
        v = z[1:3].t()
    return z, v


def _queries(x: torch.Tensor, w: torch.Tensor) -> Any:
    before = torch.is_inference_mode_enabled()
    with torch.inference_mode():
        z = x @ w
        inside = (
            torch.is_inference_mode_enabled(),
            z.is_inference(),
            torch.is_grad_enabled(),
            x[0].is_inference(),
        )
    after = (z.is_inference(), (z + 1).is_inference(), z[0].is_inference(), torch.is_grad_enabled())
    return z, before, inside, after


def _factory_and_inplace(x: torch.Tensor, w: torch.Tensor) -> Any:
    with torch.inference_mode():
        z = torch.zeros(3)  # a factory in the block makes an inference tensor
        w.mul_(1)  # an in-place op on a normal tensor leaves it normal
    return z, w


def _mode_false_outside(x: torch.Tensor, w: torch.Tensor) -> Any:
    with torch.inference_mode(False):
        return x @ w


@torch.inference_mode()
def _decorated(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).cos()


def _calls_decorated(x: torch.Tensor, w: torch.Tensor) -> Any:
    return _decorated(x, w), _decorated(x, w) + 1


CASES = [_block_between, _return_inside, _used_after, _views_share, _queries, _calls_decorated]


@pytest.mark.parametrize("outer", list(_OUTER))
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_inference_mode_block_is_one_graph_and_matches_eager(fn: Callable[..., Any], outer: str) -> None:
    _run(fn, (t(4, 4, grad=True), t(4, 4, grad=True)), outer)
    _run(fn, (t(4, 4), t(4, 4)), outer)


def test_factory_and_in_place_in_the_block() -> None:
    _run(_factory_and_inplace, (t(4, 4), t(4, 4)), "plain")
    _run(_mode_false_outside, (t(4, 4, grad=True), t(4, 4, grad=True)), "plain")


def test_views_of_one_inference_output_stay_aliases() -> None:
    x, w = t(4, 4), t(4, 4)
    z, v = kiln_dynamo.compile(_views_share)(x, w)
    assert z.is_inference() and v.is_inference()
    assert v.untyped_storage().data_ptr() == z.untyped_storage().data_ptr()
    with torch.inference_mode():
        z.zero_()  # allowed in the mode, and seen through the alias, as in eager
    assert float(v.abs().sum()) == 0.0


def _saved_for_backward(x: torch.Tensor, w: torch.Tensor) -> Any:
    with torch.inference_mode():
        z = x @ w
    return (z * w).sum()  # eager refuses to save an inference tensor for backward


def _written_after(x: torch.Tensor, w: torch.Tensor) -> Any:
    with torch.inference_mode():
        z = x @ w
    z.add_(1)  # eager refuses an in-place write to an inference tensor outside the mode
    return z


@pytest.mark.parametrize("fn", [_saved_for_backward, _written_after], ids=lambda f: f.__name__)
def test_what_eager_refuses_is_a_break_and_raises_as_eager(fn: Callable[..., Any]) -> None:
    x, w = t(4, 4, grad=True), t(4, 4, grad=True)
    with pytest.raises(RuntimeError) as eager:
        fn(x, w)
    kiln_dynamo.reset()
    with pytest.raises(RuntimeError) as compiled:
        kiln_dynamo.compile(fn)(x, w)
    assert str(compiled.value).splitlines()[0] == str(eager.value).splitlines()[0]
    (reason,) = {b.reason for b in kiln_dynamo.counters.break_reasons}
    assert "inference tensor" in reason


def _break_inside(x: torch.Tensor, w: torch.Tensor, log: list[int]) -> Any:
    y = x * 2
    with torch.inference_mode():
        z = y @ w
        log.append(len(log))  # a list from outside, read: a break
        print(end="")
        z = z.relu()
    return y + 1, z


def test_a_break_inside_the_block_splits_at_the_with_line() -> None:
    x, w = t(4, 4, grad=True), t(4, 4, grad=True)
    want_log: list[int] = []
    want = _break_inside(x, w, want_log)
    kiln_dynamo.reset()
    got_log: list[int] = []
    report = kiln_dynamo.explain(_break_inside)(x, w, got_log)
    _same(report.result, want)
    assert got_log == want_log
    assert report.break_reasons and report.break_reasons[0].note is not None
    assert "torch.inference_mode() block" in report.break_reasons[0].note
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Any:
        h = self.proj(x)
        with torch.inference_mode():
            scores = self.proj(h).softmax(-1)
        return h, scores


def test_module_with_a_block_in_forward() -> None:
    torch.manual_seed(0)
    model = _Head()
    x = t(2, 4)
    want = model(x)
    kiln_dynamo.reset()
    report = kiln_dynamo.explain(model)(x)
    assert report.graph_count == 1 and not report.break_reasons, report
    _same(report.result, want)
    _same(kiln_dynamo.compile(model)(x), want)


def test_called_under_the_mode_then_outside_recompiles() -> None:
    x, w = t(4, 4, grad=True), t(4, 4, grad=True)
    compiled = kiln_dynamo.compile(_queries)
    with torch.inference_mode():
        _same(compiled(x, w), _queries(x, w))
    _same(compiled(x, w), _queries(x, w))


@pytest.mark.parametrize(
    ("fn", "copies"), [(_return_inside, False), (_calls_decorated, True), (_block_between, True)]
)
def test_a_graph_wholly_inside_a_block_runs_under_the_mode_without_a_copy(
    fn: Callable[..., Any], copies: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Note [inference_mode traced]: when every operator of the graph is in the block, the runner
    calls the graph under the mode (no copy); otherwise it copies the marked outputs."""
    from kiln_dynamo import inference

    calls: list[int] = []
    real = inference.to_inference

    def counting(outs: Any, indices: tuple[int, ...]) -> Any:
        calls.append(len(indices))
        return real(outs, indices)

    monkeypatch.setattr(inference, "to_inference", counting)
    x, w = t(4, 4, grad=True), t(4, 4, grad=True)
    kiln_dynamo.reset()
    _same(kiln_dynamo.compile(fn)(x, w), fn(x, w))
    assert bool(calls) == copies
