"""Views (index remapping), cat, padding, indexing, gather, scatter and embedding against eager."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import aten, check, make, unary

from kiln_loopir import compile_graph

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool]

VIEWS = {
    "reshape": lambda x: aten.view.default(aten.mul.Tensor(x, x), [6, 4]),
    "split_merge": lambda x: aten.view.default(aten.view.default(x, [2, 3, 2, 2]), [3, 8]),
    "flatten": lambda x: aten.reshape.default(x, [-1]),
    "permute": lambda x: aten.permute.default(x, [1, 0]),
    "transpose_then_view": lambda x: aten.view.default(
        aten.clone.default(aten.t.default(x), memory_format=torch.contiguous_format), [2, 12]
    ),
    "expand": lambda x: aten.expand.default(aten.unsqueeze.default(x, 0), [3, 4, 6]),
    "squeeze": lambda x: aten.squeeze.dim(aten.unsqueeze.default(x, 1), 1),
    "slice_step": lambda x: aten.slice.Tensor(x, 1, 1, 6, 2),
    "slice_negative": lambda x: aten.slice.Tensor(x, 0, -3, 9223372036854775807),
    "select": lambda x: aten.select.int(x, 1, -2),
    "as_strided": lambda x: aten.as_strided.default(aten.clone.default(x), [3, 3], [2, 5], 1),
    "t": unary(aten.t.default),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_views(name: str, dtype: torch.dtype) -> None:
    check(VIEWS[name], make((4, 6), dtype))
    if name not in ("reshape", "split_merge", "transpose_then_view", "flatten"):
        check(VIEWS[name], make((6, 4), dtype).t())


def test_view_of_noncontiguous_pointwise() -> None:
    check(lambda x: aten.reshape.default(aten.add.Tensor(aten.t.default(x), 1), [24]), make((6, 4)))


def test_split_and_unbind() -> None:
    def fn(x: Any) -> Any:
        a, b, c = aten.split.Tensor(x, 2, 1)
        u = aten.unbind.int(x, 0)
        return aten.add.Tensor(a, c), b, u[3]

    check(fn, make((4, 6)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat(dtype: torch.dtype) -> None:
    def fn(a: Any, b: Any, c: Any) -> Any:
        return aten.cat.default([a, b, c], 1)

    check(fn, make((3, 2), dtype), make((3, 5), dtype), make((5, 3), dtype).t())


def test_cat_promotes_and_dim0() -> None:
    def fn(a: Any, b: Any) -> Any:
        return aten.cat.default([a, b])

    check(fn, make((2, 3), torch.int64), make((4, 3), torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_pad(dtype: torch.dtype) -> None:
    value = True if dtype == torch.bool else 3

    def fn(x: Any) -> Any:
        return aten.constant_pad_nd.default(x, [1, 2, 0, 1], value)

    def crop(x: Any) -> Any:
        return aten.constant_pad_nd.default(x, [-1, 2, 1, -1])

    check(fn, make((3, 4), dtype))
    check(crop, make((4, 3), dtype).t())


@pytest.mark.parametrize("dtype", DTYPES)
def test_advanced_indexing(dtype: torch.dtype) -> None:
    x = make((5, 6, 7), dtype)
    i = torch.tensor([[0, 4], [-1, 2]])
    j = torch.tensor([1, -6])

    def first(x: Any, i: Any) -> Any:
        return aten.index.Tensor(x, [i])

    def middle(x: Any, j: Any) -> Any:
        return aten.index.Tensor(x, [None, j])

    def split(x: Any, i: Any, j: Any) -> Any:
        return aten.index.Tensor(x, [i, None, j])

    check(first, x, i)
    check(middle, x, j)
    check(split, x, i, j)


def test_gather_and_embedding() -> None:
    x = make((4, 5))
    idx = torch.randint(0, 5, (4, 3))

    def gather(x: Any, idx: Any) -> Any:
        return aten.gather.default(x, 1, idx)

    def embed(w: Any, idx: Any) -> Any:
        return aten.embedding.default(w, idx)

    check(gather, x, idx)
    check(embed, make((10, 8), torch.bfloat16), torch.randint(0, 10, (2, 3)))


def test_index_select_is_a_gather_fused_with_its_reader() -> None:
    """Note [index_select is a gather]: every dim, int32 and 0-d indices, repeated indices; the
    select and the sum over it are one kernel, and option index_select=False restores the extern."""
    x = make((4, 5, 6))
    rows = torch.tensor([3, 0, 3, 1, 2])

    def select_sum(x: Any, i: Any) -> Any:
        return aten.sum.dim_IntList(aten.index_select.default(x, 0, i), [1])

    on = check(select_sum, x, rows)
    assert on.stats.kernels == 1 and on.stats.extern_calls == 0
    off = check(select_sum, x, rows, options={"index_select": False})
    assert off.stats.extern_calls == 1 and off.stats.extern_ops == ("index_select.default",)

    def along(dim: int) -> Callable[[Any, Any], Any]:
        def select(x: Any, i: Any) -> Any:
            return aten.index_select.default(x, dim, i)

        return select

    for dim, idx in [(1, torch.tensor([4, 0], dtype=torch.int32)), (-1, torch.tensor(5)), (2, rows)]:
        assert check(along(dim), x, idx).stats.extern_calls == 0
    assert check(along(0), make(()), torch.tensor([0])).stats.extern_calls == 0
    assert check(along(-1), make(()), torch.tensor(0)).stats.extern_calls == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_family(dtype: torch.dtype) -> None:
    x = make((4, 6), dtype)
    idx = torch.tensor([[0, 1, 2], [3, 4, 5], [5, 0, 1], [2, 2, 2]])
    src = make((4, 3), dtype)

    def scatter(x: Any, idx: Any, src: Any) -> Any:
        return aten.scatter.src(x, 1, idx, src)

    def scatter_value(x: Any, idx: Any) -> Any:
        return aten.scatter.value(x, 1, aten.slice.Tensor(idx, 1, 0, 1), 7)

    def scatter_add(x: Any, idx: Any, src: Any) -> Any:
        return aten.relu.default(aten.scatter_add.default(x, 1, idx, src))

    check(scatter, x, torch.tensor([[0, 1, 2], [3, 4, 5], [5, 0, 1], [2, 3, 4]]), src)
    check(scatter_value, x, idx)
    check(scatter_add, x, idx, src)


def test_index_put() -> None:
    x = make((5, 4))
    rows = torch.tensor([0, 3, 3])
    values = make((3, 4))

    def put(x: Any, rows: Any, v: Any) -> Any:
        return aten.index_put.default(x, [rows], v, True)

    def put_overwrite(x: Any, rows: Any, v: Any) -> Any:
        return aten.index_put.default(x, [aten.slice.Tensor(rows, 0, 0, 2)], aten.slice.Tensor(v, 0, 0, 2))

    check(put, x, rows, values)
    check(put_overwrite, x, rows, values)


def test_a_scatter_of_no_elements_is_a_no_op_node() -> None:
    # Note [Scatters with no elements] (codegen_cpp's wrapper): a no-op node, read by name later
    from kiln_loopir.ir import Scatter
    from kiln_loopir.scheduler import NopKernelSchedulerNode
    from kiln_loopir.testing import scatter_of_no_elements

    compiled = check(scatter_of_no_elements, make((5, 6)), torch.tensor([0, 2, 4]))
    nops = [n.node for n in compiled.schedule.nodes if isinstance(n, NopKernelSchedulerNode)]
    assert any(isinstance(b, Scatter) for b in nops), compiled.schedule.describe()


def test_creation_ops() -> None:
    def fn(x: Any) -> Any:
        a = aten.arange.start_step(2, 14, 3, dtype=torch.float32, device=torch.device("cpu"))
        b = aten.full.default([3, 4], 1.5, dtype=torch.float32, device=torch.device("cpu"))
        c = aten.zeros_like.default(x)
        d = aten.ones.default([4], dtype=torch.int64, device=torch.device("cpu"))
        e = aten.arange.default(4, device=torch.device("cpu"))
        return aten.add.Tensor(aten.add.Tensor(b, a), x), c, aten.mul.Tensor(d, e)

    check(fn, make((3, 4)))


def test_wrapper_support_refuses_an_extern_result_of_another_shape() -> None:
    """A (1,) result is never broadcast into a planned (4,) buffer (issue 19: a meta kernel that
    disagreed with the device kernel made the wrapper copy an empty tensor)."""
    from kiln_loopir.wrapper_support import ExternShapeMismatch, dense_storage, flat_storage

    for bad in (torch.zeros(1), torch.zeros(0)):
        with pytest.raises(
            ExternShapeMismatch, match=r"returned shape \[\d\] where its meta kernel promised \[4\]"
        ):
            dense_storage(bad, (4,), (1,), 0)
        with pytest.raises(ExternShapeMismatch):
            flat_storage(bad, 4, (4,), (1,), 0)
    t = torch.arange(6.0).view(2, 3)
    assert dense_storage(t, (2, 3), (3, 1), 0) is t
    torch.testing.assert_close(dense_storage(t.t(), (3, 2), (2, 1), 0), t.t())


COPYING_VIEWS = {
    "view_copy": (aten.view_copy.default, ([-1],)),
    "view_copy_same_shape": (aten.view_copy.default, ([4, 6],)),
    "permute_copy": (aten.permute_copy.default, ([1, 0],)),
    "transpose_copy": (aten.transpose_copy.int, (0, 1)),
    "expand_copy": (aten.expand_copy.default, ([2, 4, 6],)),
    "unsqueeze_copy": (aten.unsqueeze_copy.default, (0,)),
    "squeeze_copy_nothing": (aten.squeeze_copy.dim, (0,)),
    "slice_copy": (aten.slice_copy.Tensor, (0, 1, 3)),
    "slice_copy_whole": (aten.slice_copy.Tensor, (0, 0, 4)),
    "select_copy": (aten.select_copy.int, (0, 1)),
    "as_strided_copy": (aten.as_strided_copy.default, ([2, 2], [6, 1])),
}


@pytest.mark.parametrize("backend", ["interpret"])  # loopir alone: the C++ generator is not its dependency
@pytest.mark.parametrize("name", sorted(COPYING_VIEWS))
def test_copying_views_return_new_memory(name: str, backend: str) -> None:
    # Note [The copying variants of views are copies] in lowerings/views.py: a graph output
    # `permute_copy(x)` was a view of the input x, where eager's is a new tensor
    op, args = COPYING_VIEWS[name]
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(op, (x, *args)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    inp = make((4, 6))
    expected = op(inp.clone(), *args)
    (out,) = compile_graph(gm, [inp], backend=backend)(inp)
    torch.testing.assert_close(out, expected)
    assert out.untyped_storage().data_ptr() != inp.untyped_storage().data_ptr()
    out.fill_(7.0)  # an in-place update of the result leaves the input as it was
    torch.testing.assert_close(op(inp, *args), expected)


def test_split_copy_returns_new_memory() -> None:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    parts = g.call_function(aten.split_copy.Tensor, (x, 2))
    g.output(tuple(g.call_function(operator.getitem, (parts, i)) for i in range(2)))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    inp = make((4, 6))
    outs = compile_graph(gm, [inp])(inp)
    for out, expected in zip(outs, aten.split_copy.Tensor(inp, 2), strict=True):
        torch.testing.assert_close(out, expected)
        assert out.untyped_storage().data_ptr() != inp.untyped_storage().data_ptr()


@pytest.mark.parametrize("op", ["index_put", "scatter"])
def test_a_scatter_keeps_eager_strides(op: str) -> None:
    # Note [A scatter's copy in eager's strides] (test_alias_fuzz.py seed 681): the copy of a
    # transposed tensor was row-major, unlike eager's
    rows = torch.tensor([0, 1, 3])

    def fn(x: Any, v: Any) -> Any:
        if op == "index_put":
            y = aten.index_put.default(aten.mul.Tensor(x, 0.5), [rows], v)
        else:
            idx = aten.expand.default(aten.unsqueeze.default(rows, 1), [3, 6])
            y = aten.scatter.src(aten.mul.Tensor(x, 0.5), 0, idx, v)
        return y, aten.select.int(y, 0, 1)

    x, v = make((6, 6)).t(), make((3, 6))
    compiled = check(fn, x, v)
    want = fn(x, v)
    got = compiled(x, v)
    assert [t.stride() for t in got] == [t.stride() for t in want]
    if op == "index_put":  # eager's keeps the input's layout (its scatter is row-major)
        assert want[0].stride() == (1, 6)
