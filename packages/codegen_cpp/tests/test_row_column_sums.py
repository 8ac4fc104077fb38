"""Note [Column sums in a row kernel]: a norm's backward computes its weight and bias gradients
(column sums over the rows) inside its row kernel, per fixed chunk of rows, when
``CppOptions.row_column_sums`` is on. Compared with eager (float32, bfloat16, odd sizes), bitwise
equal at 1 and 2 threads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from cpp_check import aten, eager, make, trace

from kiln_codegen_cpp import CppBackend, CppOptions
from kiln_loopir import compile_graph
from kiln_loopir.testing import assert_outputs


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _layer_norm_backward_of(n: int, ndim: int) -> Any:
    """LayerNorm's backward over rows of ``n`` (inputs of ``ndim`` dims), written out in aten."""

    def fn(g: Any, x: Any, mean: Any, rstd: Any, w: Any) -> Any:
        return _layer_norm_backward(g, x, mean, rstd, w, n, ndim)

    return fn


def _layer_norm_backward(g: Any, x: Any, mean: Any, rstd: Any, w: Any, n: int, ndim: int) -> Any:
    xhat = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
    gw = aten.mul.Tensor(g, w)
    s1 = aten.sum.dim_IntList(gw, [-1], True)
    s2 = aten.sum.dim_IntList(aten.mul.Tensor(gw, xhat), [-1], True)
    inner = aten.sub.Tensor(aten.sub.Tensor(aten.mul.Tensor(gw, n), s1), aten.mul.Tensor(xhat, s2))
    dx = aten.mul.Tensor(aten.div.Tensor(rstd, n), inner)
    dims = list(range(ndim - 1))
    return dx, aten.sum.dim_IntList(aten.mul.Tensor(g, xhat), dims), aten.sum.dim_IntList(g, dims)


def _rms_norm_backward(g: Any, x: Any, rstd: Any, w: Any) -> Any:
    xhat = aten.mul.Tensor(x, rstd)
    gw = aten.mul.Tensor(g, w)
    s = aten.mean.dim(aten.mul.Tensor(gw, xhat), [-1], True)
    dx = aten.mul.Tensor(rstd, aten.sub.Tensor(gw, aten.mul.Tensor(xhat, s)))
    return dx, aten.sum.dim_IntList(aten.mul.Tensor(g, xhat), [0])


def _group_norm_backward(g: Any, x: Any, mean: Any, rstd: Any) -> Any:
    # [N, G, C/G * HW] rows per group; the per-channel gradients sum over N and HW
    n, groups, per = x.shape
    xhat = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
    s = aten.sum.dim_IntList(aten.mul.Tensor(g, xhat), [2], True)
    dx = aten.sub.Tensor(g, aten.mul.Tensor(xhat, aten.div.Tensor(s, per)))
    channels = aten.view.default(aten.mul.Tensor(g, xhat), [n, groups * 4, per // 4])
    return dx, aten.sum.dim_IntList(channels, [0, 2])


def _compile(fn: Any, inputs: list[Any], on: bool) -> tuple[Any, CppBackend]:
    backend = CppBackend(CppOptions(row_column_sums=on))
    compiled = compile_graph(trace(fn), inputs, backend=backend)
    assert backend.last_declined == [], backend.last_declined
    return compiled, backend


def _norm_inputs(shape: tuple[int, ...], dtype: torch.dtype, rms: bool = False) -> list[torch.Tensor]:
    rows = (*shape[:-1], 1)
    g, x = make(shape, dtype), make(shape, dtype)
    rstd = (make(rows, dtype).abs() + 0.5).to(dtype)
    w = make(shape[-1:], dtype)
    return [g, x, rstd, w] if rms else [g, x, make(rows, dtype), rstd, w]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(256, 768), (37, 129), (5, 3), (3, 20, 48)])
def test_layer_norm_backward_in_one_kernel(threads: None, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    inputs = _norm_inputs(shape, dtype)
    fn = _layer_norm_backward_of(shape[-1], len(shape))
    expected = eager(trace(fn), *inputs)
    off, _ = _compile(fn, inputs, False)
    on, backend = _compile(fn, inputs, True)
    # bfloat16: the column kernel also rounds its float sums to bfloat16 (pointwise epilogues),
    # which the row kernel does not take: the two kernels as before
    fused = dtype == torch.float32
    assert off.stats.kernels == 2 and on.stats.kernels == (1 if fused else 2)
    assert ("xlo" in backend.last_source) == fused
    outs = []
    for n in (1, 2):
        torch.set_num_threads(n)
        outs.append(on(*inputs))
        assert_outputs(outs[-1], expected, ["dx", "dw", "db"])
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)  # the chunks do not follow the thread count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_backward_in_one_kernel(threads: None, dtype: torch.dtype) -> None:
    inputs = _norm_inputs((67, 200), dtype, rms=True)
    expected = eager(trace(_rms_norm_backward), *inputs)
    on, _ = _compile(_rms_norm_backward, inputs, True)
    assert on.stats.kernels == (1 if dtype == torch.float32 else 2)
    for n in (1, 2):
        torch.set_num_threads(n)
        assert_outputs(on(*inputs), expected, ["dx", "dw"])


def test_group_norm_backward_keeps_its_kernels() -> None:
    """The per-channel sums are over [N, HW], not the group rows' transpose: nothing to take."""
    inputs = [make((4, 2, 64)), make((4, 2, 64)), make((4, 2, 1)), make((4, 2, 1)).abs() + 0.5]
    expected = eager(trace(_group_norm_backward), *inputs)
    off, _ = _compile(_group_norm_backward, inputs, False)
    on, _ = _compile(_group_norm_backward, inputs, True)
    assert on.stats.kernels == off.stats.kernels
    assert_outputs(on(*inputs), expected, ["dx", "dw"])


def test_float32_column_sums_are_as_accurate_as_eager() -> None:
    """Note [float32 accumulation]: the chunks' partials fold into double every COLUMN_FOLD rows;
    kiln's weight gradient is no further from float64 than eager's."""
    torch.manual_seed(0)
    inputs = [t + 3.0 for t in _norm_inputs((3000, 40), torch.float32)]
    fn = _layer_norm_backward_of(40, 2)
    on, _ = _compile(fn, inputs, True)
    assert on.stats.kernels == 1
    ref = fn(*(t.double() for t in inputs))
    ours, theirs = on(*inputs), fn(*inputs)
    for k in (1, 2):
        assert (ours[k].double() - ref[k]).abs().max() <= (theirs[k].double() - ref[k]).abs().max() * 1.5
