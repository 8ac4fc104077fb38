"""A norm's backward as aotgrad traces it (float32 math over the saved row statistics, the
gradients cast back to the input's dtype): the input gradient is a row reduction, the weight and
bias gradients are column sums over the tokens, split into partial kernels (Note [Partials of a
column reduction stay column reductions] in split.py). Every form is compared with eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from triton_check import DEVICES, aten, check, make

from kiln_codegen_triton import TritonBackend

F32 = torch.float32
# split from 256 rows on, so that a few hundred tokens (fast under the interpreter) split as
# 4096 tokens do on a GPU
SPLIT = {"split_min_rnumel": 256}


def _f32(t: torch.Tensor) -> Any:
    return aten._to_copy.default(t, dtype=F32)


def _back(t: Any, dtype: torch.dtype) -> Any:
    return t if dtype == F32 else aten._to_copy.default(t, dtype=dtype)


def norm_backward(rms: bool, affine: bool, dtype: torch.dtype) -> Any:
    """``(grad, x, mean, rstd, weight) -> (grad_x[, grad_weight[, grad_bias]])``: a layer norm's
    (``rms=False``) or an RMS norm's backward over rows of ``D``, the math aotgrad's decomposition
    does (the statistics are float32 ``[N, 1]``; an RMS norm has no mean and no bias; without
    ``affine`` the weight is not read)."""

    def fn(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor) -> Any:
        gf, xf = _f32(g), _f32(x)
        centred = xf if rms else aten.sub.Tensor(xf, mean)
        xhat = aten.mul.Tensor(centred, rstd)
        gx = aten.mul.Tensor(gf, _f32(w)) if affine else gf
        proj = aten.mean.dim(aten.mul.Tensor(gx, xhat), [1], True)
        inner = aten.sub.Tensor(gx, aten.mul.Tensor(xhat, proj))
        if not rms:
            inner = aten.sub.Tensor(inner, aten.mean.dim(gx, [1], True))
        grad_x = _back(aten.mul.Tensor(inner, rstd), dtype)
        if not affine:
            return (grad_x,)
        grad_w = _back(aten.sum.dim_IntList(aten.mul.Tensor(gf, xhat), [0]), dtype)
        if rms:
            return grad_x, grad_w
        return grad_x, grad_w, _back(aten.sum.dim_IntList(gf, [0]), dtype)

    return fn


def _inputs(rows: int, d: int, dtype: torch.dtype) -> list[torch.Tensor]:
    return [
        make((rows, d), dtype),
        make((rows, d), dtype),
        make((rows, 1), F32, low=-0.5, high=0.5),
        make((rows, 1), F32, low=0.5, high=2.0),
        make((d,), dtype),
    ]


def _partials(backend: TritonBackend) -> list[Any]:
    return [s for s in backend.last_specs if "_partial" in s.name]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, F32], ids=["bf16", "f32"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("d", [768, 771])
def test_norm_backward_equals_eager(d: int, rms: bool, affine: bool, dtype: torch.dtype, device: str) -> None:
    """Layer and RMS norms, with and without a weight, bfloat16 and float32 rows of 768 and of an
    odd length over an odd token count (chunks that do not divide the rows, column tiles past the
    last column): equal to eager, the weight gradients from column-reduction partials (the form
    ``outer_partials`` asks for; off by default, the default form is the one kiln's tests train)."""
    rows = 515 if d % 2 else 512
    backend = TritonBackend(**SPLIT, outer_partials=True)
    check(
        norm_backward(rms, affine, dtype), *_inputs(rows, d, dtype), device=device, backend=backend, scale=8.0
    )
    partials = _partials(backend)
    if affine:
        assert partials and all(p.outer and p.kind == "looped" for p in partials), backend.last_specs
    else:
        assert not partials


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, F32], ids=["bf16", "f32"])
@pytest.mark.parametrize("d", [1024, 4096])
def test_wide_norm_backward_equals_eager(d: int, dtype: torch.dtype, device: str) -> None:
    """Rows of 1024 and 4096 (LLaMA's width): 16 and 64 column tiles."""
    backend = TritonBackend(**SPLIT, outer_partials=True)
    check(
        norm_backward(False, True, dtype), *_inputs(256, d, dtype), device=device, backend=backend, scale=8.0
    )
    assert all(p.outer for p in _partials(backend))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, F32], ids=["bf16", "f32"])
@pytest.mark.parametrize("on", [True, False], ids=["column_partials", "before"])
def test_outer_partials_switch_chooses_the_form(on: bool, dtype: torch.dtype, device: str) -> None:
    """Note [Partials of a column reduction stay column reductions]: with ``outer_partials`` a
    layer norm's weight and bias gradients split into column-reduction partials (looped over 4 KB
    tiles) in chunks as short as one tile (32 bfloat16 rows, 16 float32 ones: 16 and 32 chunks of
    512 tokens); without it the partial is taken for a row reduction (its row statistics move with
    the chunk) and the chunks keep ``split_outer_min_chunk`` (64 rows: 8 chunks). Both equal eager."""
    backend = TritonBackend(**SPLIT, outer_partials=on)
    check(
        norm_backward(False, True, dtype),
        *_inputs(512, 768, dtype),
        device=device,
        backend=backend,
        scale=8.0,
    )
    (partial,) = _partials(backend)
    chunks = partial.xnumel // 768
    if on:
        assert partial.outer and partial.kind == "looped"
        assert (chunks, partial.rnumel) == ((16, 32) if dtype == torch.bfloat16 else (32, 16))
    else:
        assert not partial.outer and partial.kind == "persistent"
        assert (chunks, partial.rnumel) == (8, 64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("on", [True, False], ids=["column_partials", "before"])
def test_column_chunks_are_whole_tile_steps(on: bool, device: str) -> None:
    """A bias gradient over 800 tokens of 768 bfloat16 columns: 32 chunks of 25 tokens would mask
    a fifth of every 32-token step's lanes, so with ``outer_partials`` the chunk is rounded up to
    one step (25 chunks of 32); without it the 64-token floor gives 16 chunks of 50."""
    backend = TritonBackend(**SPLIT, outer_partials=on)
    check(
        lambda g: aten.sum.dim_IntList(g, [0]),
        make((800, 768), torch.bfloat16),
        device=device,
        backend=backend,
    )
    (partial,) = _partials(backend)
    assert partial.outer
    assert (partial.xnumel // 768, partial.rnumel) == ((25, 32) if on else (16, 50))
