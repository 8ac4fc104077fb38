"""Masked loads (cat, pad), indirect indexing (index, gather, embedding) with the debug-mode
bounds assert, scatter with atomics, creation ops and extern fallbacks through Triton."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from triton_check import DEVICES, aten, check, make

from kiln_codegen_triton import TritonBackend, interpreting
from kiln_loopir import compile_graph
from kiln_loopir.testing import with_vals


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool], ids=str)
def test_cat_and_pad(dtype: torch.dtype, device: str) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:
        c = aten.cat.default([a, b], 1)
        p = aten.constant_pad_nd.default(a, [2, 1, 0, 3], 0)
        return c, p, aten.cat.default([a, a, b], 1)

    check(fn, make((5, 7), dtype), make((5, 3), dtype), device=device)


def _gathers(x: torch.Tensor, idx: torch.Tensor, g: torch.Tensor, w: torch.Tensor, tok: torch.Tensor) -> Any:
    a = aten.index.Tensor(x, [idx])
    b = aten.gather.default(x, 1, g)
    e = aten.embedding.default(w, tok)
    return a, b, aten.sum.dim_IntList(e, [2])  # an indirect load feeding a reduction


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("debug", [False, True])
def test_indirect_indexing(debug: bool, device: str) -> None:
    x = make((10, 12))
    idx = torch.tensor([0, 9, -1, 3, -10])  # negative indices wrap
    g = torch.randint(0, 12, (10, 4))
    w = make((50, 16))
    tok = torch.randint(0, 50, (3, 7))
    backend = check(_gathers, x, idx, g, w, tok, device=device, backend=TritonBackend(debug=debug))
    # Note [Index checks in the interpreter]: interpreted kernels check in any mode
    assert ("device_assert(" in backend.last_source) == (debug or interpreting())


@pytest.mark.skipif(not interpreting(), reason="a device assert on a GPU poisons the CUDA context")
def test_out_of_range_index_asserts_in_debug_mode() -> None:
    gm = torch.fx.symbolic_trace(lambda x, i: aten.index.Tensor(x, [i]))
    x, bad = make((10, 4)), torch.tensor([1, 12])
    compiled = compile_graph(gm, [x, bad], backend=TritonBackend(debug=True))
    with pytest.raises(Exception, match="index out of bounds"):  # the interpreter wraps IndexError
        compiled(x, bad)


@pytest.mark.skipif(not interpreting(), reason="checked without debug only in the interpreter")
def test_out_of_range_index_put_raises_in_the_interpreter() -> None:
    # Note [Index checks in the interpreter]: the store wrote past the host copy's heap block
    # (test_alias_fuzz.py seed 2010: `free(): invalid next size`)
    gm = torch.fx.symbolic_trace(lambda x, i, v: aten.index_put.default(x, [i], v))
    x, bad, v = make((4, 5)), torch.tensor([0, 1, 2, 4]), make((4, 5))
    compiled = compile_graph(gm, [x, bad, v], backend=TritonBackend())
    with pytest.raises(Exception, match="index out of bounds"):
        compiled(x, bad, v)
    good = torch.tensor([0, 1, 3, 2])
    torch.testing.assert_close(compiled(x, good, v), aten.index_put.default(x, [good], v))


def _dead_index_put(x: torch.Tensor, i: torch.Tensor) -> Any:
    put = aten.index_put.default(x, [i], aten.full.default([1, 5], 4.0))
    zeros = aten.copy.default(put, aten.full_like.default(put, 0))
    return zeros, aten.add.Tensor(zeros, 1)


@pytest.mark.parametrize("debug", [False, True])
def test_a_dead_index_write_is_kept_only_where_indices_are_checked(
    debug: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kiln_loopir's Note [Dead index writes keep their bounds check]: kept where the kernels
    # check indirect indices (the interpreter, debug mode); on a GPU otherwise the kept
    # scatter would store out of range unchecked, so it is dropped as before
    import kiln_codegen_triton.backend as backend_module

    assert TritonBackend(debug=debug).checks_indices == (debug or interpreting())
    monkeypatch.setattr(backend_module, "interpreting", lambda: False)
    assert TritonBackend(debug=debug).checks_indices == debug
    monkeypatch.undo()
    if not interpreting():
        return
    gm = torch.fx.symbolic_trace(_dead_index_put)
    x = make((5, 5))
    compiled = compile_graph(gm, [x, torch.tensor([4])], backend=TritonBackend(debug=debug))
    torch.testing.assert_close(compiled(x, torch.tensor([4])), gm(x, torch.tensor([4])))
    with pytest.raises(Exception, match="index out of bounds"):  # the interpreter wraps IndexError
        compiled(x, torch.tensor([7]))


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_and_index_put(device: str) -> None:
    def fn(
        x: torch.Tensor, idx: torch.Tensor, src: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor
    ) -> Any:
        s = aten.scatter.src(x, 1, idx, src)
        acc = aten.index_put.default(x, [rows], vals, True)  # duplicates accumulate: atomics
        first, one = aten.slice.Tensor(rows, 0, 0, 1), aten.slice.Tensor(vals, 0, 0, 1)
        return s, acc, aten.index_put.default(x, [first], one, False)

    x = make((6, 5))
    idx = torch.stack([torch.randperm(5)[:3] for _ in range(6)])
    rows = torch.tensor([1, 4, 1, 0])
    check(fn, x, idx, make((6, 3)), rows, make((4, 5)), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_creation_and_extern_ops(device: str) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> Any:
        mm = aten.mm.default(a, b)  # extern: cuBLAS on a GPU
        act = aten.relu.default(aten.add.Tensor(mm, bias))  # epilogue kernel over the extern result
        z = aten.zeros.default([4, 3], dtype=torch.float32, device=a.device)
        r = aten.arange.default(10, dtype=torch.int64, device=a.device)
        cs = aten.cumsum.default(act, 1)  # no lowering: an extern call
        return act, z, r, cs

    check(fn, make((8, 16)), make((16, 12)), make((12,)), device=device)


def _sin_cos_cat(dim: int) -> Any:
    def fn(x: Any) -> Any:
        return aten.cat.default([aten.sin.default(x), aten.cos.default(x)], dim)

    return fn


@pytest.mark.parametrize("device", DEVICES)
def test_cat_of_sin_and_cos_of_one_input_is_one_kernel(device: str) -> None:
    """Issue 19, fusion bounds (Note [Why a value is realized] (f)): the cat reads each element of
    sin(x) and cos(x) once, so both are computed in the cat's kernel, with aotgrad's meta values."""
    for dim in (0, -1):
        x = make((4, 8, 16))
        gm = with_vals(_sin_cos_cat(dim), x)
        backend = check(gm, x, device=device)
        assert [s.name for s in backend.last_specs] == ["triton_poi_fused_cat_cos_sin_0"], dim
