"""Data-dependent sizes end to end (Note [Unbacked sizes in capture], [Unbacked sizes in loopir]):
`nonzero`, boolean masks, `masked_select`, `unique` and `.item()` used as a size compile into one graph on
the C++ backend: the data-dependent operator runs as an extern call whose result the wrapper
reads the size from, and later kernels (pointwise, reductions, matmul) take that size as a run-time
argument. Every result equals eager's (values, shapes, dtypes) over calls whose counts differ,
with no recompile, no fallback and no kernel left to the interpreter; the same through the Triton
generator under Triton's interpreter (Note [Data-dependent sizes in the Triton wrapper])."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import kiln
import kiln_dynamo
from kiln_codegen_triton import interpreting


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()
    warnings.simplefilter("ignore", FutureWarning)  # torch._check_is_size's deprecation


def _clean_compiles() -> int:
    assert kiln_dynamo.counters.dynamic_fallbacks == []
    assert kiln_dynamo.counters.break_reasons == []
    log = kiln.compile_log()
    assert all(r.fell_back is None and not r.declined for r in log), log
    return kiln_dynamo.counters.graphs


def _sweep(fn: Callable[..., Any], argsets: list[tuple[Any, ...]], **kw: Any) -> None:
    compiled = kiln.compile(fn, **kw)
    for args in argsets:
        out, expected = compiled(*args), fn(*args)
        assert out.shape == expected.shape and out.dtype == expected.dtype, (out, expected)
        torch.testing.assert_close(out, expected, equal_nan=True)


def _masks(*shape: int) -> list[torch.Tensor]:
    """Inputs whose positive count differs: some, none, one, all."""
    torch.manual_seed(0)
    one = -torch.ones(shape)
    one.view(-1)[3] = 2.0
    return [torch.randn(shape), -torch.ones(shape), one, torch.ones(shape), torch.randn(shape)]


def _nonzero_then_reduce(x: torch.Tensor) -> torch.Tensor:
    idx = torch.nonzero(x > 0)
    return idx.sum(0) * 2 + idx.float().mean(0).nan_to_num().long()


def _mask_then_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    rows = x[x.sum(1) > 0]  # (u0, 4)
    return (rows @ w).relu().sum(0) + rows.shape[0]


def _masked_select_pointwise(x: torch.Tensor) -> torch.Tensor:
    sel = torch.masked_select(x, x > 0.5)
    return (sel * 3 + 1).exp().sum() / (sel.numel() + 1)


def _item_as_size(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    k = n.item()
    torch._check(k >= 0)
    torch._check(k <= x.size(0))
    return (x[:k] + torch.arange(k).unsqueeze(1)).sum(0) + x.new_zeros(k).sum()


def _unique_weighted(x: torch.Tensor) -> torch.Tensor:
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    return (values.float() * counts).sum() + inverse.sum() + values.numel()


CASES: list[tuple[Callable[..., Any], list[tuple[Any, ...]]]] = [
    (_nonzero_then_reduce, [(m,) for m in _masks(6, 5)]),
    (_mask_then_matmul, [(m, torch.randn(5, 3)) for m in _masks(7, 5)]),
    (_masked_select_pointwise, [(m,) for m in _masks(6, 5)]),
    (_item_as_size, [(torch.randn(8, 3), torch.tensor(k)) for k in (5, 0, 1, 8, 3)]),
    (_unique_weighted, [(torch.randint(0, k, (6, 3)),) for k in (5, 1, 2, 9)]),
]


@pytest.mark.parametrize(("fn", "argsets"), CASES, ids=[f.__name__ for f, _ in CASES])
def test_one_cpp_graph_serves_every_count(fn: Callable[..., Any], argsets: list[tuple[Any, ...]]) -> None:
    with torch.no_grad():
        _sweep(fn, argsets)
    assert _clean_compiles() == 1


def test_the_wrapper_reads_the_size_after_the_extern_call(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code"), torch.no_grad():
        _sweep(_mask_then_matmul, [(m, torch.randn(5, 3)) for m in _masks(7, 5)[:2]])
    source = "\n".join(r.getMessage() for r in caplog.records)
    lines = [line.strip() for line in source.splitlines()]
    bind = lines.index("u0 = _r.size(0)")
    assert lines[bind - 2] == "# extern aten.index.Tensor"
    # a C++ kernel after it takes the row count as an argument
    assert any(line.startswith("if _e := k_cpp") and "u0" in line for line in lines[bind:])


def test_training_through_a_masked_select() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh())
    ref = nn.Sequential(nn.Linear(5, 4), nn.Tanh())
    ref.load_state_dict(model.state_dict())

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        y = m(x)
        sel = torch.masked_select(y, y > 0)
        return (sel * sel).sum() / (sel.numel() + 1)

    compiled = kiln.compile(loss)
    for x in _masks(8, 5):
        out, expected = compiled(model, x), loss(ref, x)
        torch.testing.assert_close(out, expected)
        out.backward()
        expected.backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    assert _clean_compiles() == 1


def test_a_branch_on_a_count_breaks_and_both_sides_are_right() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if torch.nonzero(x > 0).size(0) > 3:
            return y + 1
        return y - 1

    with torch.no_grad():
        _sweep(f, [(m,) for m in _masks(4, 2)])
    reason = kiln_dynamo.counters.break_reasons[0]
    assert "data-dependent branch on u0 > 3" in reason.reason
    assert reason.frames[-1].source == "if torch.nonzero(x > 0).size(0) > 3:"
    assert kiln_dynamo.counters.dynamic_fallbacks == []


@pytest.mark.skipif(not interpreting(), reason="the Triton interpreter runs these on CPU tensors")
@pytest.mark.parametrize(("fn", "argsets"), CASES, ids=[f.__name__ for f, _ in CASES])
def test_one_triton_graph_serves_every_count(fn: Callable[..., Any], argsets: list[tuple[Any, ...]]) -> None:
    """Note [Data-dependent sizes in the Triton wrapper]: the same cases through the Triton
    generator (kernels under Triton's interpreter): one graph, every count (0 among them: an
    empty selection, `k = 0`) equal to eager, no fallback, no kernel left to the interpreter."""
    with torch.no_grad():
        _sweep(fn, argsets, options={"cpu_backend": "triton"})
    assert _clean_compiles() == 1


@pytest.mark.skipif(not interpreting(), reason="the Triton interpreter runs these on CPU tensors")
def test_the_triton_wrapper_reads_the_size_after_the_extern_call(caplog: pytest.LogCaptureFixture) -> None:
    """The row count is read from the extern call's result, a kernel after it takes it as a size
    argument (its grid computed from it), and a failing `torch._check` raises as in eager."""
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_triton"), torch.no_grad():
        _sweep(_masked_select_pointwise, [(m,) for m in _masks(6, 5)], options={"cpu_backend": "triton"})
    source = "\n".join(r.getMessage() for r in caplog.records)
    lines = [line.strip() for line in source.splitlines()]
    bind = lines.index("u0 = _r.size(0)")
    assert lines[bind - 2] == "# extern aten.masked_select.default"
    assert any(line.startswith("_k") and line.split("#")[0].rstrip().endswith("u0)") for line in lines[bind:])
    assert _clean_compiles() == 1

    def f(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= x.size(0))
        return x[:k].exp()

    kiln.reset()
    compiled = kiln.compile(f, dynamic=True, options={"strict": True, "cpu_backend": "triton"})
    x = torch.randn(6, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, torch.tensor(0)), f(x, torch.tensor(0)))
        with pytest.raises(RuntimeError, match=r"torch\._check"):
            compiled(x, torch.tensor(7))
        torch.testing.assert_close(compiled(x, torch.tensor(4)), f(x, torch.tensor(4)))


def test_with_a_dynamic_batch_and_a_count_returned_as_an_int() -> None:
    """A backed size symbol (the batch, automatic dynamic) and an unbacked one in one graph; a
    size computed from both leaves the graph as a Python int, as in eager."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        rows = x[x.sum(1) > 0]
        return rows.softmax(-1).sum(0), torch.nonzero(x > 0).shape[0] + x.shape[0]

    compiled = kiln.compile(f)
    torch.manual_seed(0)
    with torch.no_grad():
        for n in (4, 7, 9, 16, 3):
            x = torch.randn(n, 5)
            (out, count), (expected, expected_count) = compiled(x), f(x)
            torch.testing.assert_close(out, expected)
            assert type(count) is int and count == expected_count
    assert _clean_compiles() == 2  # static, then one graph with a batch symbol and u0


def test_a_failing_torch_check_raises_as_in_eager() -> None:
    """Note [Checks of data-dependent sizes at run time]: the facts capture used are checked by
    the wrapper; a call whose data break one raises a RuntimeError (eager's type), never runs on
    a false assumption, and is not taken for a compiler failure (no fallback to eager)."""

    def f(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= x.size(0))
        return x[:k] + 1

    compiled = kiln.compile(f, dynamic=True, options={"strict": True})
    x = torch.randn(6, 4)
    with torch.no_grad():
        for bad_first in (7, 3):  # a failing check on the compiling call, then on a warm one
            kiln.reset()
            compiled = kiln.compile(f, dynamic=True, options={"strict": True})
            if bad_first == 3:
                torch.testing.assert_close(compiled(x, torch.tensor(3)), f(x, torch.tensor(3)))
            for bad in (7, -1):
                with pytest.raises(RuntimeError):
                    f(x, torch.tensor(bad))
                with pytest.raises(RuntimeError, match=r"torch\._check"):
                    compiled(x, torch.tensor(bad))
            torch.testing.assert_close(compiled(x, torch.tensor(6)), f(x, torch.tensor(6)))
    assert not any(r.fell_back for r in kiln.compile_log())


def _two_items_equal(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k, m = a.item(), b.item()
    torch._check(k >= 0)
    torch._check(m >= 0)
    torch._check(k <= x.size(0))
    torch._check(m <= y.size(0))
    torch._check(k == m)  # `m` reads as `k` from here on
    return x[:k] * 2, m


def _checked_only(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k, m = a.item(), b.item()
    torch._check(k >= 0)
    torch._check(m == k + 1)  # `m` is read by nothing but this check
    return x * k


def _nonzero_rows_equal(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    i, j = x.nonzero(), y.nonzero()
    torch._check(i.size(0) == j.size(0))
    return i + j


@pytest.mark.parametrize(
    ("fn", "good", "bad"),
    [
        (
            _two_items_equal,
            (torch.arange(6.0).view(6, 1), torch.ones(6, 1), torch.tensor(3), torch.tensor(3)),
            (torch.arange(6.0).view(6, 1), torch.ones(6, 1), torch.tensor(3), torch.tensor(2)),
        ),
        (
            _checked_only,
            (torch.ones(3), torch.tensor(2), torch.tensor(3)),
            (torch.ones(3), torch.tensor(2), torch.tensor(2)),
        ),
        (
            _nonzero_rows_equal,
            (torch.tensor([1.0, 0, 2]), torch.tensor([0.0, 3, 2])),
            (torch.tensor([1.0, 0, 2]), torch.tensor([0.0, 0, 2])),
        ),
    ],
    ids=["two-items-equal", "checked-only", "two-nonzeros"],
)
def test_a_check_over_two_extern_calls_raises_as_in_eager(
    fn: Callable[..., Any], good: tuple, bad: tuple
) -> None:
    """Note [Checks of data-dependent sizes at run time]: a fact relating the symbols of two
    extern calls is checked after the second; one that became a replacement (`m` reads as `k`)
    still checks `m`'s own value, and the call computing `m` stays even when nothing else reads
    it. Before, each of these returned a value where eager raises (the first returned `k` as `m`)."""
    with pytest.raises(RuntimeError):
        fn(*bad)
    for bad_first in (True, False):
        kiln.reset()
        compiled = kiln.compile(fn, dynamic=True, options={"strict": True})
        with torch.no_grad():
            if not bad_first:
                torch.testing.assert_close(compiled(*good), fn(*good))
            with pytest.raises(RuntimeError, match=r"torch\._check"):
                compiled(*bad)
            torch.testing.assert_close(compiled(*good), fn(*good))
    assert not any(r.fell_back for r in kiln.compile_log())


_TRITON_ON_CPU = pytest.mark.skipif(
    not interpreting(), reason="the Triton interpreter runs these on CPU tensors"
)


@pytest.mark.parametrize("backend", ["cpp", pytest.param("triton", marks=_TRITON_ON_CPU)])
def test_a_slice_to_a_checked_count_is_a_view(backend: str) -> None:
    """`x[:k]` of an `.item()` k with `torch._check(0 <= k <= x.size(0))`: the length capture
    computed (`k`) is the slice's, a view of `x` instead of eager's slice kernel, since the
    wrapper checks both facts before anything reads the view (Note [Checks of data-dependent
    sizes at run time]); k = 0 and k = n included, a k past the end raises as in eager."""
    options = {"cpu_backend": "triton"} if backend == "triton" else {}
    with torch.no_grad():
        _sweep(
            _item_as_size, [(torch.randn(8, 3), torch.tensor(k)) for k in (5, 0, 1, 8, 3)], options=options
        )
        compiled = kiln.compile(_item_as_size, options=options)
        with pytest.raises(RuntimeError, match=r"torch\._check"):
            compiled(torch.randn(8, 3), torch.tensor(9))
    assert _clean_compiles() == 1
    fallbacks = [op for r in kiln.compile_log() for op, _ in r.op_fallbacks]
    assert not [op for op in fallbacks if "slice" in op], fallbacks
