"""Operators that used to run eagerly because capture could not describe their results, compiled
whole through `kiln.compile` and compared with eager (issue 19's fallback list):

- no meta kernel in torch: kiln's own meta functions (kiln_dynamo's meta.py) for `geqrf`,
  `histogram`, `histogramdd`, `linalg.lstsq` (drivers whose outputs do not depend on the data),
  `unique`/`unique_consecutive` of at most one element;
- data read while tracing, where the data is a constant the program builds (Note [Constant
  fakes], kiln_dynamo's constants.py): `corrcoef`/`cov` without weights (`equal` on a norm factor),
  `combinations` (`masked_select` with a mask from `full`/`arange`/`lt`, mutated in place);
- a module passed to a torch function (Note [torch functions that take a callable]).

Each case must be one graph, no fallback of any kind, eager's values, shapes, dtypes and strides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

import kiln


def _cases() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    return [
        ("geqrf", torch.geqrf, (r(5, 3),)),
        ("geqrf_batched", torch.geqrf, (r(2, 3, 4),)),
        ("histogram", lambda x: torch.histogram(x, 5), (r(20),)),
        ("histogram_edges", torch.histogram, (r(20), torch.tensor([-1.0, 0.0, 2.0]))),
        ("histogramdd", lambda x: torch.histogramdd(x, [2, 3]), (r(10, 2),)),
        ("lstsq_gels_tall", lambda a, b: torch.linalg.lstsq(a, b, driver="gels"), (r(5, 3), r(5, 2))),
        ("lstsq_gelsy_wide", lambda a, b: torch.linalg.lstsq(a, b, driver="gelsy"), (r(2, 3), r(2, 4))),
        (
            "lstsq_gelsd_batched",
            lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd"),
            (r(2, 3, 3), r(2, 3, 1)),
        ),
        ("unique_one", lambda x: torch.unique(x, return_inverse=True, return_counts=True), (r(1, 1),)),
        ("unique_consecutive_one", lambda x: torch.unique_consecutive(x, return_counts=True), (r(()),)),
        ("corrcoef", torch.corrcoef, (r(3, 6),)),
        ("cov", lambda x: torch.cov(x, correction=0), (r(2, 5),)),
        ("combinations_2", lambda x: torch.combinations(x, 2), (r(5),)),
        ("combinations_3_replacement", lambda x: torch.combinations(x, 3, with_replacement=True), (r(4),)),
        (
            "triplet_module_distance",
            lambda a, p, n: F.triplet_margin_with_distance_loss(
                a, p, n, distance_function=torch.nn.PairwiseDistance()
            ),
            (r(4, 6), r(4, 6), r(4, 6)),
        ),
        (
            "triplet_function_distance",
            lambda a, p, n: F.triplet_margin_with_distance_loss(
                a, p, n, distance_function=lambda x, y: (x - y).abs().sum(-1)
            ),
            (r(4, 6), r(4, 6), r(4, 6)),
        ),
    ]


CASES = _cases()


@pytest.fixture(autouse=True)
def _reset() -> Any:
    kiln.reset()
    yield
    kiln.reset()


@pytest.mark.parametrize(("name", "fn", "args"), CASES, ids=[c[0] for c in CASES])
def test_compiled_whole_and_as_eager(name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    want = fn(*args)
    frame = lambda *a: fn(*a)  # noqa: E731, PLW0108  (a frame around torch's builtins)
    got = kiln.compile(frame, options={"strict": True})(*args)
    stats = kiln.capture_stats()
    assert stats.graphs == 1 and not stats.frames_not_captured and not stats.break_reasons, stats
    assert not [r for r in kiln.compile_log() if r.fell_back or r.declined]
    g_leaves, g_spec = tree_flatten(got)
    w_leaves, w_spec = tree_flatten(want)
    assert g_spec == w_spec
    for g, w in zip(g_leaves, w_leaves, strict=True):
        assert (g.shape, g.dtype, g.stride()) == (w.shape, w.dtype, w.stride()), name
        torch.testing.assert_close(g, w, equal_nan=True)


def test_a_constant_transposed_in_place_keeps_its_values() -> None:
    """Note [Constant fakes]: a constant mask transposed in place (dynamo's fake run and aotgrad's
    `_inplace_view` both move its values with its metadata) is compiled whole, eager's answer."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        mask = torch.arange(4).reshape(2, 2) < 2
        mask.t_()
        return torch.masked_select(x, mask)

    x = torch.randn(2, 2)
    got = kiln.compile(fn, options={"strict": True})(x)
    assert kiln.capture_stats().graphs == 1 and torch.equal(got, fn(x))


def test_a_data_dependent_answer_is_still_a_fallback() -> None:
    """cov with input weights compares a norm factor computed from them: data, not a constant."""
    x, w = torch.randn(2, 5), torch.rand(5)
    got = kiln.compile(lambda x, w: torch.cov(x, aweights=w))(x, w)
    torch.testing.assert_close(got, torch.cov(x, aweights=w))
    stats = kiln.capture_stats()
    assert stats.graphs == 0 and any("aten::equal" in b.reason for b in stats.break_reasons), stats


def _resize(x: torch.Tensor) -> torch.Tensor:
    return x.resize_(25, 5)


def _shrink_then_add(x: torch.Tensor) -> torch.Tensor:
    x.resize_(2, 3)
    x.add_(1)
    return x * 2


def _resize_as(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.resize_as_(like)


def _transpose_in_place(x: torch.Tensor) -> torch.Tensor:
    x.t_()
    return x.sum(0)


METADATA = [
    ("resize_same_numel", _resize, (torch.randn(5, 5, 5),)),
    ("resize_shrink_then_write", _shrink_then_add, (torch.randn(8),)),
    ("resize_0d_to_3d", lambda x: x.resize_(1, 1, 1), (torch.tensor(2.0),)),
    ("resize_as", _resize_as, (torch.randn(6), torch.randn(3, 2))),
    ("t_", _transpose_in_place, (torch.randn(3, 4),)),
]


@pytest.mark.parametrize(("name", "fn", "args"), METADATA, ids=[m[0] for m in METADATA])
def test_a_metadata_mutation_of_an_input_is_compiled(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    """Note [Metadata mutations of inputs] (kiln_aotgrad): the caller's tensor ends with eager's
    sizes, strides and values; a result that is the input is the caller's tensor itself."""
    eager_args = tuple(a.clone() for a in args)
    mine = tuple(a.clone() for a in args)
    want = fn(*eager_args)
    got = kiln.compile(fn, options={"strict": True})(*mine)
    assert kiln.capture_stats().graphs == 1 and not [r for r in kiln.compile_log() if r.fell_back]
    for m, e in zip(mine, eager_args, strict=True):
        assert (m.shape, m.stride(), m.storage_offset()) == (e.shape, e.stride(), e.storage_offset())
        assert torch.equal(m, e)
    assert (got.shape, got.stride()) == (want.shape, want.stride())
    torch.testing.assert_close(got, want)
    assert (got is mine[0]) == (want is eager_args[0])


def test_a_resize_that_grows_the_storage_breaks_the_graph() -> None:
    # Note [In-place changes of a tensor's shape] (kiln_dynamo's fake.py): a fake tensor's storage
    # cannot grow, so the resize runs eagerly, with the reason
    x = torch.randn(4)
    xe = x.clone()
    got = kiln.compile(lambda t: t.resize_(3, 3).fill_(1.0))(x)
    assert x.shape == (3, 3) and torch.equal(got, xe.resize_(3, 3).fill_(1.0))
    stats = kiln.capture_stats()
    assert any("grows the tensor's storage" in b.reason for b in stats.break_reasons), stats


def test_an_operator_of_python_numbers_is_a_constant() -> None:
    """Longformer's `torch.div(seq_len, window, rounding_mode="trunc")` on Python ints, used as a
    view size: a constant fake of its value (kiln_dynamo fake.py), one graph, eager's answer."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chunks = torch.div(x.shape[1], 4, rounding_mode="trunc")
        return x.view(x.shape[0], chunks, 4) * 2, chunks

    x = torch.randn(2, 8)
    got, want = kiln.compile(fn)(x), fn(x)
    assert kiln.capture_stats().graphs == 1 and not kiln.capture_stats().break_reasons
    for g, w in zip(got, want, strict=True):
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        torch.testing.assert_close(g, w)


def _pool_transposed(x: torch.Tensor) -> torch.Tensor:
    # Swin's pooler: torch's composite pools a channels-last view with `out.as_strided_(...)`
    return F.adaptive_avg_pool1d(x.transpose(1, 2), 1).flatten(1) * 2


def _pool_permuted(x: torch.Tensor) -> torch.Tensor:
    return F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1) + 1


def _t_of_intermediate(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.t_()
    return y + 1


def _unsqueeze_of_intermediate(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.unsqueeze_(1)
    return y.sum(1) + y


@pytest.mark.parametrize(
    ("fn", "shapes"),
    [
        (_pool_transposed, [(2, 49, 32), (3, 20, 32)]),
        (_pool_permuted, [(2, 4, 5, 8), (3, 6, 7, 8)]),
        (_t_of_intermediate, [(3, 4), (5, 6)]),
        (_unsqueeze_of_intermediate, [(3, 4), (5, 6)]),
    ],
    ids=["adaptive_avg_pool1d", "adaptive_avg_pool2d", "t_", "unsqueeze_"],
)
def test_geometry_changes_of_symbolic_intermediates_stay_in_the_graph(
    fn: Callable[[torch.Tensor], torch.Tensor], shapes: list[tuple[int, ...]]
) -> None:
    """Note [Geometry changes of symbolic intermediates] (kiln_dynamo's fake.py): under
    dynamic=True an in-place geometry change of a tensor the graph made (torch's pooling composite
    ends with one) broke the graph; now one graph for both sizes, eager's values and gradients."""
    compiled = kiln.compile(fn, dynamic=True, options={"strict": True})
    for shape in shapes:
        x = torch.randn(*shape, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        got, want = compiled(x), fn(xe)
        got.pow(2).sum().backward()
        want.pow(2).sum().backward()
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x.grad, xe.grad)
    stats = kiln.capture_stats()
    assert stats.graphs == 1 and not stats.break_reasons, stats
    assert not [r for r in kiln.compile_log() if r.fell_back]


def test_a_geometry_change_of_a_symbolic_input_still_breaks_the_graph() -> None:
    # Note [Placeholders keep their entry geometry] restores only static inputs' fakes
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.as_strided_((x.shape[1],), (1,))
        return x * 3

    x, xe = torch.randn(3, 4), torch.randn(3, 4)
    xe.copy_(x)
    got = kiln.compile(fn, dynamic=True)(x)
    torch.testing.assert_close(got, fn(xe))
    assert (x.shape, x.stride()) == (xe.shape, xe.stride())
    stats = kiln.capture_stats()
    assert any("its sizes are symbolic" in b.reason for b in stats.break_reasons), stats
