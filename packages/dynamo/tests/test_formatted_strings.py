"""Strings formatted from 0-d tensors are built after the graph (Note [Strings formatted from
tensors]): no break where the string is only handed on, eager's characters where it is used."""

from __future__ import annotations

from typing import Any

import torch
from conftest import CountingBackend, assert_same, check

import kiln_dynamo


def _ignore(cond: torch.Tensor, msg: str) -> None:
    torch._check_tensor_all(cond)  # a check whose message is only for the failure


def test_message_of_a_check_never_failing_is_no_break() -> None:
    # llava's get_placeholder_mask: f"... tokens: {n_image_tokens}, features: {n}" handed to a check
    def f(ids: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        n = (ids == 3).sum()
        _ignore(n == feats.shape[0], f"tokens: {n}, features: {feats.shape[0]}")
        return feats * 2

    ids, feats = torch.tensor([3, 1, 3, 3]), torch.randn(3, 2)
    report = kiln_dynamo.explain(f)(ids, feats)
    assert (report.graph_count, report.break_reasons) == (1, []), report
    assert_same(f(ids, feats), report.result)


def test_returned_strings_have_eager_characters() -> None:
    def f(x: torch.Tensor) -> tuple[str, str, str, torch.Tensor]:
        s = x.sum()
        return f"sum={s}", f"{s:.3f}|{x.max() > 0}", f"{(x * 0).long().sum():>5}{s:e}", s

    x = torch.randn(4)
    check(f, x)


def test_a_format_snapshots_the_value_before_an_in_place_change() -> None:
    def f(x: torch.Tensor) -> tuple[str, torch.Tensor]:
        s = x.sum()
        msg = f"before: {s}"
        s.add_(1)
        return msg, s

    check(f, torch.randn(3))


def test_a_format_of_a_tensor_that_requires_grad() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[str, torch.Tensor]:
        loss = (x * w).sum()
        return f"loss {loss:.4f}", loss

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    want, got = f(x, w), kiln_dynamo.compile(f)(x, w)
    assert want[0] == got[0]
    assert_same(want[1], got[1])


def test_a_string_live_across_a_later_break() -> None:
    def f(x: torch.Tensor) -> tuple[str, torch.Tensor]:
        msg = f"mean {x.mean()}"
        print("side")  # a graph break; msg is a live local of the continuation
        return msg + "!", x + 1

    check(f, torch.randn(3), graphs=2)


def test_characters_needed_during_capture_are_one_break() -> None:
    def f(x: torch.Tensor) -> tuple[int, torch.Tensor]:
        msg = f"{x.sum()}"
        return len(msg), x * 2

    x = torch.tensor([1.0, 2.5])
    report = kiln_dynamo.explain(f)(x)
    assert [b.split for b in report.break_reasons] == [True], report
    assert "formatted from tensor data" in report.break_reasons[0].reason
    assert_same(f(x), report.result)


def test_formats_that_show_more_than_the_value_still_break() -> None:
    # `str(t)` of a tensor that requires grad shows its grad_fn, which a graph's output differs in
    def f(x: torch.Tensor) -> str:
        return f"{x * 2}|{x.sum()!r}"

    x = torch.randn(2)
    report = kiln_dynamo.explain(f)(x)
    assert len(report.break_reasons) >= 1 and "formatting tensor" in report.break_reasons[0].reason
    assert report.result == f(x)


def test_comparisons_of_the_string_are_breaks_not_identity() -> None:
    # compared by identity, `f"{s}" == "1.5"` answered False: its characters decide
    def f(x: torch.Tensor) -> tuple[bool, bool, bool, torch.Tensor]:
        msg = f"{x.sum()}"
        return msg == "1.5", msg != "1.5", msg in ("1.5", "2"), x * 2

    x = torch.tensor([0.5, 1.0])
    report = kiln_dynamo.explain(f)(x)
    assert report.break_reasons and "formatted from tensor data" in report.break_reasons[0].reason
    assert_same(f(x), report.result)
    assert report.result[0] is True


class _SymbolicBackend(CountingBackend):
    __kiln_dynamic_shapes__ = True  # takes graphs of symbolic sizes (and runs them eagerly)


def _over_sizes(fn: Any, sizes: list[tuple[int, int]]) -> CountingBackend:
    """`fn` under `dynamic=True` at each size: eager's results (strings, lists and their types)."""
    kiln_dynamo.reset()
    backend = _SymbolicBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend, dynamic=True)
    for a, b in sizes:
        x = torch.randn(a, b)
        want, got = fn(x), compiled(x)
        assert_same(want, got)
        assert repr(want) == repr(got)  # the same characters and Python types all the way down
    assert kiln_dynamo.counters.fallbacks == []
    return backend


def test_strings_of_symbolic_sizes_are_built_after_the_graph() -> None:
    """Note [Strings formatted from symbolic sizes]: f-strings and `str()` of sizes, tuples and
    lists of symbolic sizes are no break and no guard: one graph serves every size."""

    def f(x: torch.Tensor) -> Any:
        n, m = x.shape
        return x + 1, (
            f"n={n}, m={m:>4}, half={n / 2}, {n!r}",
            str(x.shape),
            repr(x.shape),
            str((n, 3)),
            str((m,)),
            str([n, m, 7]),
            f"{x.shape}",
            "rows " + f"{n}",
        )

    backend = _over_sizes(f, [(4, 6), (5, 6), (7, 8), (16, 3), (12, 100)])
    assert backend.graphs == 1


def test_characters_of_a_string_of_sizes_needed_during_capture_specialize() -> None:
    # the characters decide a branch: the sizes are specialized there (guarded), not a break
    def f(x: torch.Tensor) -> Any:
        text = f"{x.shape[0]}x{x.shape[1]}"
        return (x * 2 if text == "4x6" else x * 3), len(text), text

    backend = _over_sizes(f, [(4, 6), (5, 6), (4, 6)])
    assert backend.graphs == 2  # one per specialized size, reused for the repeated one
    kiln_dynamo.reset()
    report = kiln_dynamo.explain(f)(torch.randn(4, 6))
    assert report.break_reasons == []


def test_sorted_sizes_guard_their_order() -> None:
    """Note [Ordering by constant keys]: `sorted`, `min` and `max` of symbolic sizes and numbers
    order by this run's values, each comparison guarded: a graph per order, not per size."""

    def f(x: torch.Tensor) -> Any:
        a, b = x.shape
        order = sorted([b, a, 5])
        return x + 1, order, sorted((a, b), reverse=True), min([a, b, 9]), max([b, a])

    backend = _over_sizes(f, [(4, 6), (3, 7), (7, 8), (6, 10), (9, 2), (12, 4)])
    # orders: a < 5 < b; 5 < a < b (twice); b < 5 < a (twice): three graphs
    assert backend.graphs == 3
