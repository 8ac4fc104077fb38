"""Masked loads (cat, pad), indirect indexing (index, gather, embedding), scatter, creation ops,
extern fallbacks, and the clean error for an out-of-range index."""

from __future__ import annotations

import operator
import re
from typing import Any

import pytest
import torch
from cpp_check import aten, check, make, trace

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import scatter_of_no_elements, with_vals


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool], ids=str)
def test_cat_and_pad(dtype: torch.dtype) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:
        c = aten.cat.default([a, b], 1)
        p = aten.constant_pad_nd.default(a, [2, 1, 0, 3], 0)
        return c, p, aten.cat.default([a, a, b], 1)

    check(fn, make((5, 7), dtype), make((5, 3), dtype))


def test_indirect_indexing() -> None:
    def fn(x: torch.Tensor, idx: torch.Tensor, g: torch.Tensor, w: torch.Tensor, tok: torch.Tensor) -> Any:
        a = aten.index.Tensor(x, [idx])
        b = aten.gather.default(x, 1, g)
        e = aten.embedding.default(w, tok)
        return a, b, e

    x = make((10, 12))
    idx = torch.tensor([0, 9, -1, 3, -10])  # negative indices wrap
    g = torch.randint(0, 12, (10, 4))
    w = make((50, 16))
    tok = torch.randint(0, 50, (3, 7))
    check(fn, x, idx, g, w, tok)


def test_scatter_and_index_put() -> None:
    def fn(
        x: torch.Tensor, idx: torch.Tensor, src: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor
    ) -> Any:
        s = aten.scatter.src(x, 1, idx, src)
        sa = aten.scatter_add.default(x, 1, idx, src)
        ip = aten.index_put.default(x, [rows], vals, True)
        return s, sa, ip

    x = make((6, 8))
    idx = torch.stack([torch.randperm(8)[:5] for _ in range(6)])  # unique per row: scatter is defined
    src = make((6, 5))
    rows = torch.tensor([1, 3, 1, 5])
    vals = make((4, 8))
    check(fn, x, idx, src, rows, vals)


def test_accumulating_scatter_with_repeated_targets_along_a_loop() -> None:
    """Regression (T5's relative-position bias gradient was ~100% off): lanes of a vectorized
    loop that add into the same element lose each other's updates, so an accumulating scatter
    is vectorized only along a loop whose iterations hit distinct elements
    (Note [Scatter loops and omp simd] in kernel.py)."""

    def fn(w: torch.Tensor, tok: torch.Tensor, g: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> Any:
        # embedding's backward on 2-d indices as torch's decompositions write it: a token out of
        # range or equal to padding_idx (-1: none) adds nothing, the rest accumulate into their
        # rows. The tokens are read several times, which puts the token loop innermost.
        keep = aten.bitwise_and.Tensor(aten.ge.Scalar(tok, 0), aten.lt.Scalar(tok, 8))
        keep = aten.unsqueeze.default(aten.bitwise_and.Tensor(keep, aten.ne.Scalar(tok, -1)), -1)
        masked = aten.where.self(aten.logical_not.default(keep), aten.zeros_like.default(g), g)
        rows = aten.clamp.default(tok, -8, 7)
        eb = aten.index_put.default(aten.zeros_like.default(w), [rows], masked, True)
        # every element of a row adds into one of two columns of the same row: no loop separates
        sa = aten.scatter_add.default(aten.zeros_like.default(src), 1, idx, src)
        # down the columns: the element (i, j) adds into (idx[i, j], j), so the column loop
        # separates the lanes although the row it hits depends on j
        sa0 = aten.scatter_add.default(aten.zeros_like.default(src), 0, idx, src)
        return eb, sa, sa0

    w = make((8, 2))
    tok = torch.randint(0, 3, (32, 32))  # 1,024 updates into 3 rows
    g = make((32, 32, 2))
    idx = torch.randint(0, 2, (4, 64))
    src = make((4, 64))
    names = ["embedding backward", "scatter_add", "scatter_add dim 0"]
    compiled = check(fn, w, tok, g, idx, src, names=names, scale=10.0)
    source: str = compiled.backend.last_source  # type: ignore[attr-defined]
    scatters = [k for k in source.split('extern "C" int64_t ')[1:] if re.search(r"\bind\d+", k)]
    assert len(scatters) == 3
    embedding, scatter_add, scatter_add0 = scatters
    # the embedding row's columns (x2, 2 of them) are vectorized: a lane per column
    assert re.search(r"#pragma omp simd[^\n]*\n\s*for \(int64_t x2 = 0; x2 < INT64_C\(2\)", embedding), (
        embedding
    )
    assert "#pragma omp simd" not in scatter_add and "not vectorized" in scatter_add, scatter_add
    assert re.search(r"#pragma omp simd[^\n]*\n\s*for \(int64_t x1 = 0; x1 < INT64_C\(64\)", scatter_add0)


def test_creation_ops_and_extern_fallback() -> None:
    def fn(x: torch.Tensor, m: torch.Tensor) -> Any:
        r = aten.arange.start_step(0, 20, 2, dtype=torch.float32, device="cpu")
        f = aten.full.default([3, 4], 1.5, dtype=torch.float32, device="cpu")
        mm = aten.mm.default(x, m)  # extern: aten's matmul
        return aten.add.Tensor(r, 1), aten.mul.Tensor(f, 2), aten.relu.default(mm)

    compiled = check(fn, make((4, 6)), make((6, 3)))
    assert compiled.stats.extern_calls == 1


def test_out_of_range_index_raises_index_error_naming_the_op() -> None:
    def fn(x: torch.Tensor, g: torch.Tensor) -> Any:
        return aten.gather.default(x, 1, g)

    x = make((4, 5))
    good = torch.randint(0, 5, (4, 3))
    compiled = check(fn, x, good)
    bad = good.clone()
    bad[2, 1] = 7
    with pytest.raises(IndexError, match=r"index 7 is out of bounds.*size 5.*gather"):
        compiled(x, bad)
    # the compiled graph stays usable after the error
    torch.testing.assert_close(compiled(x, good), torch.gather(x, 1, good))


def test_index_select_as_a_gather_in_cpp() -> None:
    """loopir's Note [index_select is a gather] in C++: rows (vector loads along the row), a
    middle and the last dim (scalar gathers), a negative-free int32 index, a fused sum; an index
    out of range raises eager's IndexError kind, and the graph stays usable."""

    def fn(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> Any:
        a = aten.index_select.default(x, 0, rows)
        b = aten.index_select.default(x, 1, cols)
        c = aten.index_select.default(x, 2, rows)
        return a, aten.sum.dim_IntList(a, [1]), b, c

    x = make((6, 5, 40))
    rows = torch.tensor([5, 0, 5, 2])
    cols = torch.tensor([4, 1], dtype=torch.int32)
    compiled = check(fn, x, rows, cols)
    assert compiled.stats.extern_calls == 0
    with pytest.raises(IndexError, match=r"index 6 is out of bounds.*size 6"):
        compiled(x, torch.tensor([6, 0, 1, 2]), cols)
    torch.testing.assert_close(compiled(x, rows, cols)[0], torch.index_select(x, 0, rows))

    def scalar(v: torch.Tensor, i: torch.Tensor) -> Any:
        return aten.index_select.default(v, 0, i)

    v = make(())
    compiled = check(scalar, v, torch.tensor([0]))
    with pytest.raises(IndexError, match=r"index 1 is out of bounds.*size 1"):
        compiled(v, torch.tensor([1]))


def _decline_abs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Complex values, the declined kind once, no longer reach kernels (loopir's Note [Complex
    values run as extern kernels]): a builder that declines every kernel reading `abs` stands in."""
    import kiln_codegen_cpp.backend as backend_module
    from kiln_codegen_cpp.cpp_ops import UnsupportedDtype

    class Declining(backend_module.KernelBuilder):  # type: ignore[misc,name-defined]
        def build(self) -> Any:
            if "abs" in self.name:
                raise UnsupportedDtype("a dtype this test makes unsupported")
            return super().build()

    monkeypatch.setattr(backend_module, "KernelBuilder", Declining)


def test_kernel_the_generator_declines_runs_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    _decline_abs(monkeypatch)

    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:
        return aten.mul.Tensor(a, b), aten.add.Tensor(aten.abs.default(a), 1)

    compiled = check(fn, make((4, 5)), make((4, 5)), allow_interpreted=True)
    declined = compiled.backend.last_declined  # type: ignore[attr-defined]
    assert len(declined) == 1 and "unsupported" in declined[0][1]
    assert compiled.stats.declined == tuple(declined)  # reported to loopir's stats too


def test_a_kernel_declined_under_symbolic_sizes_is_refused_before_the_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note [Declined kernels] (kiln_loopir): a graph of symbolic sizes with a declined kernel is
    refused (the caller compiles it static instead: the interpreter would be far slower), before
    any of its C++ is built; the refusal used to come from the wrapper, after the build."""
    from kiln_symbolic import DimDynamic, ShapeEnv, make_symint

    from kiln_codegen_cpp import counters

    _decline_abs(monkeypatch)

    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:  # two kernels (two sizes): one declined
        return aten.mul.Tensor(aten.sin.default(a), 3.0), aten.add.Tensor(aten.abs.default(b), 1)

    env = ShapeEnv()
    n = make_symint(env, env.create_symbol(7, "x0", DimDynamic.DYNAMIC), 7)
    meta = (torch.empty(n, 5, device="meta"), torch.empty(n, 3, device="meta"))
    backend = CppBackend()
    before = dict(counters)
    with pytest.raises(
        Exception, match=r"the C\+\+ generator declined it with symbolic sizes \(UnsupportedDtype"
    ):
        compile_graph(with_vals(fn, *meta), list(meta), backend=backend)
    assert len(backend.last_declined) == 1, backend.last_declined  # the sin kernel was generated
    assert counters == before  # but nothing built, nothing looked up


def test_masked_loads_run_without_a_branch() -> None:
    # Note [Masked loads without a branch]: padding that only loads and computes is evaluated for
    # every lane with the load index clamped where the mask is false, then selected
    def fn(x: Any) -> Any:
        return aten.mul.Tensor(aten.constant_pad_nd.default(aten.exp.default(x), [1, 2, 2, 1], 0.5), 3.0)

    backend = CppBackend()
    gm = trace(fn)
    x = make((3, 5, 7))
    compiled = compile_graph(gm, [x], backend=backend)
    torch.testing.assert_close(compiled(x), gm(x))
    assert ") : 0)]" in backend.last_source and "if (tmp" not in backend.last_source


def test_masked_body_that_can_fail_keeps_its_branch() -> None:
    # an indirect index (or an integer division) in the body runs only where the mask holds
    def fn(x: Any, idx: Any) -> Any:
        return aten.constant_pad_nd.default(aten.index.Tensor(x, [idx]), [1, 1], 0.0)

    backend = CppBackend()
    gm = trace(fn)
    x, idx = make((6, 4)), torch.tensor([5, 0, 3])
    compiled = compile_graph(gm, [x, idx], backend=backend)
    torch.testing.assert_close(compiled(x, idx), gm(x, idx))
    assert "if (tmp" in backend.last_source
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([5, 9, 3]))


@torch.library.custom_op("kiln_test_cpp::half_rows", mutates_args=())
def _half_rows(x: torch.Tensor) -> torch.Tensor:
    return x[: x.shape[0] // 2].clone()


@_half_rows.register_fake
def _half_rows_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)  # disagrees with the kernel, as a meta kernel that asks the device can


def test_extern_result_of_another_shape_is_an_error_naming_the_op() -> None:
    """Never a broadcasting copy into the planned buffer (issue 19): the wrapper names the op."""
    import torch.fx

    from kiln_loopir.wrapper_support import ExternShapeMismatch

    def f(x: torch.Tensor) -> torch.Tensor:
        return aten.add.Tensor(torch.ops.kiln_test_cpp.half_rows.default(x), 1)

    x = torch.randn(4, 3)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x], backend=CppBackend())
    with pytest.raises(ExternShapeMismatch, match=r"kiln_test_cpp.half_rows.default returned shape \[2, 3\]"):
        compiled(x)


def _sin_cos_cat(dim: int) -> Any:
    def fn(x: Any) -> Any:
        return aten.cat.default([aten.sin.default(x), aten.cos.default(x)], dim)

    return fn


def test_cat_of_sin_and_cos_of_one_input_is_one_kernel() -> None:
    """Issue 19, fusion bounds (Note [Why a value is realized] (f)): the cat reads each element of
    sin(x) and cos(x) once, so both are computed in the cat's kernel, with aotgrad's meta values."""
    for dim in (0, 1, -1):
        x = make((4, 8, 16))
        gm = with_vals(_sin_cos_cat(dim), x)
        compiled = check(gm, x)
        assert (compiled.stats.kernels, compiled.stats.buffers) == (1, 1), dim


def _undefined_second(x: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """An extern op whose kernel leaves its second result undefined (None in Python) where its
    meta value is a tensor, as CUDA flash attention's cum_seq_q is."""
    return x * 2, None


def _uses_maybe(x: torch.Tensor, maybe: Any) -> torch.Tensor:
    return x + (1.0 if maybe is None else 2.0)


def test_an_extern_result_that_is_none_passes_through_views() -> None:
    # Note [Extern results that may be None]: an empty result is viewed with as_strided as an
    # extern argument and as a graph output; a None one is None in both places, as in eager
    g = torch.fx.Graph()
    x = g.placeholder("x")
    pair = g.call_function(_undefined_second, (x,))
    first, second = (g.call_function(operator.getitem, (pair, i)) for i in range(2))
    used = g.call_function(_uses_maybe, (first, second))
    g.output((used, second))
    gm = with_vals(torch.fx.GraphModule(torch.nn.Module(), g), make((4, 8)))
    promised = torch.empty(0)  # what a meta kernel says
    pair.meta["val"] = (pair.meta["val"][0], promised)
    second.meta["val"] = promised
    inp = make((4, 8))
    backend = CppBackend()
    compiled = compile_graph(gm, [inp], backend=backend)
    out, none = compiled(inp)  # raised AttributeError ('NoneType' ... 'as_strided') before
    assert none is None
    torch.testing.assert_close(out, inp * 2 + 1)
    assert "is None else" in backend.last_wrapper  # the views were taken, None-safe


@pytest.mark.parametrize("branch_free", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_checked_gather_in_a_softmax_row_is_branch_free_and_still_raises(
    threads: int, branch_free: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Note [Kernel errors]: Swin's attention adds a bias gathered through an index to each
    # score row, then a safe softmax (a row of -inf gives zeros: the `any` reduction of Note
    # [Bool lanes]). The index check folds into max-reductions: no branch in the loop body
    # (CppOptions.branch_free_checks off: the `if` with atomic stores, the same results).
    monkeypatch.setenv("KILN_CPP_OPTIONS", f"branch_free_checks={int(branch_free)}")

    def fn(x: torch.Tensor, table: torch.Tensor, idx: torch.Tensor) -> Any:
        bias = aten.index.Tensor(table, [idx])
        return aten._safe_softmax.default(aten.add.Tensor(x, bias), -1)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = make((64, 16))
        x[5] = float("-inf")
        table = make((49,))
        idx = torch.randint(-49, 49, (16,))
        compiled = check(fn, x, table, idx)
        source: str = compiled.backend.last_source  # type: ignore[attr-defined]
        kernel = next(k for k in source.split('extern "C" int64_t ')[1:] if re.search(r"\bind\d+", k))
        branchy = "__atomic_store_n" in kernel
        assert branchy != branch_free and ("reduction(max:kchk,kchkv)" in kernel) == branch_free, kernel
        out = compiled(x, table, idx)
        out = out[0] if isinstance(out, tuple | list) else out
        assert torch.equal(out[5], torch.zeros(16))
        for wrong in (49, -50):
            bad = idx.clone()
            bad[3] = wrong
            with pytest.raises(IndexError, match=rf"index {wrong} is out of bounds.*size 49"):
                compiled(x, table, bad)
        torch.testing.assert_close(compiled(x, table, idx), out)  # usable after an error
    finally:
        torch.set_num_threads(before)


def _view_scatters(base: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor, s3: torch.Tensor) -> Any:
    # slice_backward's shape: a zero fill that only feeds the scatter, the src computed pointwise
    zero = aten.zeros_like.default(base)
    a = aten.slice_scatter.default(zero, aten.mul.Tensor(s1, s1), 1, 1, 4)
    b = aten.slice_scatter.default(base, s2, 2, 1, None, 2)  # step 2, odd start: x[:, :, 1::2]
    c = aten.select_scatter.default(base, s3, 0, -1)
    d = aten.slice_scatter.default(base, s1, -2, -4, -1)  # negative bounds
    # chained: two slices of one zero fill, as the backward of a strided split writes it
    e = aten.slice_scatter.default(aten.slice_scatter.default(zero, s2, 2, 0, 6, 2), s2, 2, 1, None, 2)
    f = aten.slice_scatter.default(base, aten.zeros_like.default(base), 1, 0, 9)  # all of it
    return a, b, c, d, e, f


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_view_scatters_are_pointwise(dtype: torch.dtype) -> None:
    """Note [View scatters are pointwise]: each scatter is a pointwise kernel fused with its
    producers (the zero fills and the ``mul`` make no buffer of their own), no extern call, and
    the same answers as eager; off by the ``view_scatter`` option, the extern calls come back."""
    inputs = (make((2, 6, 7), dtype), make((2, 3, 7), dtype), make((2, 6, 3), dtype), make((6, 7), dtype))
    compiled = check(_view_scatters, *inputs)
    assert compiled.stats.extern_calls == 0, compiled.stats.extern_ops
    assert compiled.stats.fallbacks == ()
    # one buffer per output: the zero fill and the mul are computed inside the scatters' kernels
    assert compiled.stats.buffers == 6, compiled.schedule.describe()
    off = compile_graph(
        trace(_view_scatters), list(inputs), backend=CppBackend(), options={"view_scatter": False}
    )
    assert off.stats.extern_ops.count("slice_scatter.default") == 6, off.stats.extern_ops
    assert off.stats.extern_ops.count("select_scatter.default") == 1, off.stats.extern_ops
    for a, e in zip(off(*inputs), compiled(*inputs), strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def test_a_scatter_of_no_elements_binds_its_name() -> None:
    """Note [Scatters with no elements] (wrapper.py): alias fuzzer seed 881, an ``index_add_``
    into a zero-size ``narrow``; the wrapper read ``p_buf1`` it never bound (a NameError)."""
    compiled = check(scatter_of_no_elements, make((5, 6)), torch.tensor([0, 2, 4]))
    wrapper: str = compiled.backend.last_wrapper  # type: ignore[attr-defined]
    assert "no elements" in wrapper, wrapper


def test_a_dead_index_write_keeps_its_bounds_check() -> None:
    # loopir's Note [Dead index writes keep their bounds check]: the kept scatter is its
    # buffer's last reader; that buffer was freed twice and two later buffers took over its
    # memory (the wrapper raised UnboundLocalError at its second `del`)
    def fn(x: torch.Tensor, i: torch.Tensor) -> Any:
        put = aten.index_put.default(x, [i], aten.full.default([1, 5], 4.0))
        zeros = aten.copy.default(put, aten.full_like.default(put, 0))
        return zeros, aten.add.Tensor(zeros, 1)

    x = make((5, 5))
    compiled = check(fn, x, torch.tensor([4]))
    with pytest.raises(IndexError, match=r"index 7 is out of bounds.*size 5"):
        compiled(x, torch.tensor([7]))
