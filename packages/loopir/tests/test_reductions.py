"""Reductions, softmax and layer norm against eager: dims, keepdim, dtypes, layouts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import aten, check, make, unary

FLOATS = [torch.float32, torch.float64, torch.bfloat16]

REDUCTIONS: dict[str, tuple[Any, list[torch.dtype]]] = {
    "sum_dim": (lambda x: aten.sum.dim_IntList(x, [1]), [*FLOATS, torch.int64, torch.bool]),
    "sum_keepdim_multi": (lambda x: aten.sum.dim_IntList(x, [0, 2], True), [*FLOATS, torch.int64]),
    "sum_all": (unary(aten.sum.default), [*FLOATS, torch.int64, torch.bool]),
    "sum_dtype": (lambda x: aten.sum.dim_IntList(x, [-1], dtype=torch.float64), [torch.float32, torch.int64]),
    "mean": (lambda x: aten.mean.dim(x, [-1], True), FLOATS),
    "mean_all": (unary(aten.mean.default), FLOATS),
    "amax": (lambda x: aten.amax.default(x, [1]), [*FLOATS, torch.int64, torch.bool]),
    "amin_keepdim": (lambda x: aten.amin.default(x, [0, 1], True), [*FLOATS, torch.int64]),
    "argmax": (lambda x: aten.argmax.default(x, 1), [*FLOATS, torch.int64]),
    "argmin_all": (unary(aten.argmin.default), [*FLOATS, torch.int64]),
    "argmax_keepdim": (lambda x: aten.argmax.default(x, -1, True), [torch.float32]),
    "max_dim": (lambda x: aten.max.dim(x, 2), [*FLOATS, torch.int64]),
    "min_dim": (lambda x: aten.min.dim(x, 0, True), [torch.float32, torch.int64]),
    "prod": (lambda x: aten.prod.dim_int(x, 1), [torch.float32, torch.float64, torch.int64]),
    "any": (lambda x: aten.any.dim(x, 1), [torch.float32, torch.int64, torch.bool]),
    "all": (lambda x: aten.all.dims(x, [0, 2]), [torch.float32, torch.bool]),
    "var": (lambda x: aten.var.correction(x, [1], correction=1), FLOATS),
    "var_keepdim_biased": (lambda x: aten.var.correction(x, [0, 2], correction=0, keepdim=True), FLOATS),
    "std": (lambda x: aten.std.correction(x, [2], correction=1), FLOATS),
    "var_mean": (lambda x: aten.var_mean.correction(x, [1], correction=0, keepdim=True), FLOATS),
    "logsumexp": (lambda x: aten.logsumexp.default(x, [1]), [torch.float32, torch.float64]),
    "softmax": (lambda x: aten._softmax.default(x, -1, False), FLOATS),
    "softmax_dim0": (lambda x: aten._softmax.default(x, 0, False), [torch.float32]),
    "log_softmax": (lambda x: aten._log_softmax.default(x, 1, False), FLOATS),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction(name: str) -> None:
    fn, dtypes = REDUCTIONS[name]
    for dtype in dtypes:
        # prod of many values overflows bf16/int quickly: keep magnitudes near 1
        low, high = (-1.5, 1.5) if name == "prod" else (-2, 2)
        check(fn, make((3, 5, 4), dtype, low=low, high=high))
        check(fn, make((4, 5, 3), dtype, low=low, high=high).permute(2, 1, 0))


@pytest.mark.parametrize("op", [aten._softmax.default, aten._log_softmax.default])
@pytest.mark.parametrize("dim", [0, -1])
def test_softmax_of_a_scalar(op: Any, dim: int) -> None:
    """Note [Softmax of a scalar]: a 0-d tensor's softmax is 1 and its log_softmax 0 (NaN for an
    infinite or NaN element), not exp(x) and x."""
    for value in (1.5, -3.0, 0.0, float("inf"), float("-inf"), float("nan")):
        for dtype in (torch.float32, torch.bfloat16):
            check(lambda x: op(x, dim, False), torch.tensor(value, dtype=dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_native_layer_norm(dtype: torch.dtype) -> None:
    def fn(x: Any, w: Any, b: Any) -> Any:
        return aten.native_layer_norm.default(x, [8], w, b, 1e-5)

    check(fn, make((4, 3, 8), dtype), make((8,), dtype), make((8,), dtype))


def test_layer_norm_without_affine_two_dims() -> None:
    def fn(x: Any) -> Any:
        return aten.native_layer_norm.default(x, [3, 8], None, None, 1e-5)[0]

    check(fn, make((4, 3, 8)))


def test_reduction_of_pointwise_and_broadcast_epilogue() -> None:
    def fn(x: Any, y: Any) -> Any:
        s = aten.sum.dim_IntList(aten.mul.Tensor(x, y), [1], True)
        return aten.sub.Tensor(x, s)

    check(fn, make((6, 7)), make((7,)))
