"""kiln's own meta functions: output metadata for operators torch gives no meta kernel.

A fake tensor's operator runs on `meta` tensors (fake.py); an operator without a meta kernel
cannot, and the frame used to fall back to eager. Some of those have outputs whose sizes and
strides follow from the inputs' metadata and the constant arguments alone: `geqrf`, `histogram`,
the `histogramdd` pieces, `linalg_lstsq` with a driver whose outputs are data-independent. For
them this table answers with empty `meta` tensors of exactly the sizes and strides the CPU (and
CUDA) kernels return, so the operator is captured and runs as an extern kernel of the compiled
graph (the real kernel computes the values). It is consulted only when torch's own meta kernel is
missing (a later torch that adds one wins) and is kiln's alone: nothing is registered with torch.

Where an output's size depends on the data (`linalg_lstsq`'s residuals with `gelsd`/`gelss` when
the system is overdetermined: present only if every matrix has full rank), the function raises
`FakeUnsupported` and the frame still falls back, naming the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kiln_dynamo.exc import FakeUnsupported

MetaFunction = Callable[..., Any]


def _column_major(t: torch.Tensor, rows: Any, cols: Any, batch: Sequence[Any]) -> torch.Tensor:
    """An empty (*batch, rows, cols) tensor whose last two dims are column-major (LAPACK's)."""
    return t.new_empty((*batch, cols, rows)).transpose(-2, -1)


def _geqrf(device: torch.device, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    *batch, m, n = a.shape
    return _column_major(a, m, n, batch), a.new_empty((*batch, min(m, n)))


def _histogram(
    device: torch.device,
    x: torch.Tensor,
    bins: Any = 100,
    *,
    range: Any = None,
    weight: Any = None,
    density: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    count = bins.numel() - 1 if isinstance(bins, torch.Tensor) else bins
    return x.new_empty((count,)), x.new_empty((count + 1,))


def _histogramdd_bin_edges(
    device: torch.device, x: torch.Tensor, bins: Sequence[int], **_: Any
) -> list[torch.Tensor]:
    return [x.new_empty((b + 1,)) for b in bins]


def _histogramdd_from_bin_cts(
    device: torch.device, x: torch.Tensor, bins: Sequence[int], **_: Any
) -> torch.Tensor:
    return x.new_empty(tuple(bins))


def _histogramdd_from_bin_tensors(
    device: torch.device, x: torch.Tensor, bins: Sequence[torch.Tensor], **_: Any
) -> torch.Tensor:
    return x.new_empty(tuple(b.numel() - 1 for b in bins))


def _linalg_lstsq(
    device: torch.device, a: torch.Tensor, b: torch.Tensor, rcond: Any = None, *, driver: Any = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """LAPACK solves in place in a column-major (*, max(m, n), k) buffer; the solution is its
    first n rows. Residuals: `gels` has them when m > n, `gelsy` never, `gelsd`/`gelss` when
    m > n only if every matrix has full rank (data: not answered here). Ranks and singular
    values come from the rank-revealing drivers only."""
    if a.dim() < 2 or b.dim() < 1 or not a.dim() - 1 <= b.dim() <= a.dim():
        raise FakeUnsupported("linalg_lstsq: unexpected ranks (left to the kernel's own checks)")
    driver = driver or ("gelsy" if device.type == "cpu" else "gels")
    *batch, m, n = a.shape
    vector = b.dim() == a.dim() - 1
    k = 1 if vector else b.shape[-1]
    if list(b.shape[: len(batch)]) != batch or b.shape[len(batch)] != m:
        raise FakeUnsupported("linalg_lstsq: batch or row sizes differ (left to the kernel's checks)")
    rows = max(m, n)
    if vector:
        solution = a.new_empty((*batch, rows))[..., :n]
    else:
        solution = _column_major(a, rows, k, batch)[..., :n, :]
    if m > n and driver in ("gelsd", "gelss"):
        raise FakeUnsupported(f"linalg_lstsq: {driver}'s residuals exist only for full-rank data")
    residuals = a.new_empty((*batch, k)) if m > n and driver == "gels" else a.new_empty((0,))
    rank = (
        a.new_empty(tuple(batch), dtype=torch.int64)
        if driver != "gels"
        else a.new_empty((0,), dtype=torch.int64)
    )
    values = a.new_empty((*batch, min(m, n))) if driver in ("gelsd", "gelss") else a.new_empty((0,))
    return solution, residuals, rank, values


def _unique_of_one(
    device: torch.device,
    x: torch.Tensor,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_unique2` / `unique_consecutive` (dim=None) of at most one element: the element itself."""
    n = x.numel()
    if dim is not None or not isinstance(n, int) or n > 1:
        raise FakeUnsupported("unique: the number of distinct values depends on the data")
    meta = torch.device("meta")
    long = torch.int64
    inverse = torch.empty(x.shape if return_inverse else (0,), dtype=long, device=meta)
    counts = torch.empty((n if return_counts else 0,), dtype=long, device=meta)
    return torch.empty((n,), dtype=x.dtype, device=meta), inverse, counts


def _unique_of_one_or_none(device: torch.device, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    try:
        return _unique_of_one(device, x, *args, **kwargs)
    except FakeUnsupported:
        return None


def _unique_consecutive(
    device: torch.device,
    x: torch.Tensor,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _unique_of_one(device, x, True, return_inverse, return_counts, dim)


def _masked_select(device: torch.device, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """A mask known while tracing (Note [Constant fakes]) selects a known number of elements."""
    from kiln_dynamo.constants import constant_of

    values = constant_of(mask)
    if values is None or any(not isinstance(s, int) for s in x.shape):
        return None
    shape = torch.broadcast_shapes(x.shape, values.shape)
    count = int(values.broadcast_to(shape).sum())
    return torch.empty((count,), dtype=x.dtype, device=torch.device("meta"))


# Note [Fused GRU cell]: `nn.GRUCell` (and a GRU step) on CUDA calls `aten::_thnn_fused_gru_cell`,
# a CUDA-only kernel torch gives no meta kernel, so the frame broke there (the breadth suite's GRU
# attention decoder on the H200). Its outputs follow from `hx` alone: the new hidden state is
# `empty_like(hx)` in the legacy contiguous format, and the workspace that its backward reads is
# (batch, 5 * hidden) in the gates' options (five saved gate values per unit).
def _fused_gru_cell(
    device: torch.device,
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    hx: torch.Tensor,
    input_bias: torch.Tensor | None = None,
    hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if hx.dim() != 2 or input_gates.shape != hidden_gates.shape or input_gates.shape[1] != 3 * hx.shape[1]:
        raise FakeUnsupported("_thnn_fused_gru_cell: unexpected shapes (left to the kernel's own checks)")
    hy = torch.empty(hx.shape, dtype=hx.dtype, device=hx.device)
    workspace = input_gates.new_empty((hx.shape[0], 5 * hx.shape[1]))
    return hy, workspace


# "aten::name" -> meta function(device, *args, **kwargs) over meta tensors
META_FUNCTIONS: dict[str, MetaFunction] = {
    "aten::unique_consecutive": _unique_consecutive,
    "aten::geqrf": _geqrf,
    "aten::histogram": _histogram,
    "aten::_histogramdd_bin_edges": _histogramdd_bin_edges,
    "aten::_histogramdd_from_bin_cts": _histogramdd_from_bin_cts,
    "aten::_histogramdd_from_bin_tensors": _histogramdd_from_bin_tensors,
    "aten::linalg_lstsq": _linalg_lstsq,
    "aten::_thnn_fused_gru_cell": _fused_gru_cell,  # Note [Fused GRU cell]
}


def _view_copy(device: torch.device, x: torch.Tensor, size: Any) -> torch.Tensor | None:
    """Note [view_copy of a tensor no view can describe]: eager's ``view_copy`` computes
    ``reshape(size)`` into a new contiguous tensor when ``x``'s strides admit no view of that
    size (a transposed input flattened), but torch's meta kernel is ``view`` followed by a copy
    and raises there, so a frame calling ``torch.view_copy`` on such an input fell back to eager
    (the OpInfo sweep's ``--layout transposed``). Its result is contiguous either way. The
    ``dtype`` overload (a reinterpretation) is torch's kernel's to answer."""
    if isinstance(size, torch.dtype):
        return None
    return x.new_empty(x.reshape(size).shape)


# "aten::name" -> meta function(device, *args, **kwargs) over meta tensors, used instead of
# torch's meta kernel where that kernel rejects arguments the CPU kernel takes; None from the
# function: torch's kernel answers (another overload's arguments)
META_CORRECTIONS: dict[str, MetaFunction] = {
    "aten::view_copy": _view_copy,
}

# data-dependent operators that some arguments still answer: "aten::name" -> function(device,
# *args, **kwargs) over the fake arguments, giving meta results or None (no answer)
DATA_META_FUNCTIONS: dict[str, MetaFunction] = {
    "aten::_unique2": _unique_of_one_or_none,
    "aten::masked_select": _masked_select,
}
