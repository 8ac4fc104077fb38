"""Data-dependent sizes on fake tensors: the operators whose output size depends on tensor data.

Note [Unbacked sizes in capture]: `nonzero`, `masked_select`, indexing with a boolean mask, `unique`
and `.item()` of an integer tensor cannot be answered by a meta kernel: the size (or the value) is
in the data. While a capture with symbolic sizes allowed is running (`unbacked_sizes(env)`),
fake.py asks this module instead of breaking the graph: each such operator gets a fresh
unbacked symbol of the capture's ShapeEnv (`u0`, Note [Unbacked sizes] in kiln_symbolic) for
the data-dependent size, with the range the operator promises (`0 <= u0 <= numel` for the rows
of a `nonzero`), and its outputs are meta tensors laid out as eager's CPU kernels lay them out
(`nonzero` is column-major: strides `(1, u0)`). Later operators compute with the symbol like
any size; a branch on it that the range cannot settle is a graph break with the user's line
(`GuardOnDataDependent` -> `FakeUnsupported`). Outside such a capture (a backend that takes
static sizes only, or `KILN_UNBACKED=0`) these operators keep breaking the graph as before.

The backend learns the symbol's value at run time from the operator's result (the size of
its output, or the scalar itself): aotgrad binds it to that node (Note [SymInts in the aten
graph]), loopir to the extern kernel's output (Note [Unbacked sizes in loopir]).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx
from kiln_symbolic import ShapeEnv, expr_of, make_symint, symbol_of
from torch._dispatch.python import enable_python_dispatcher
from torch.utils._pytree import tree_flatten

_META = torch.device("meta")

_ENV: contextvars.ContextVar[ShapeEnv | None] = contextvars.ContextVar("kiln_unbacked_env", default=None)


@contextlib.contextmanager
def unbacked_sizes(env: ShapeEnv | None) -> Iterator[None]:
    """Data-dependent operators get unbacked symbols of `env` (None: they stay unsupported)."""
    token = _ENV.set(env)
    try:
        yield
    finally:
        _ENV.reset(token)


def current_env() -> ShapeEnv | None:
    return _ENV.get()


# Note [Tracing a captured graph again]: a backend that traces the captured graph once more
# (aotgrad) must meet the same symbols, not fresh ones: the facts capture learned about `u0`
# (`torch._check(n <= x.size(0))`, ranges) are recorded on `u0` and are not in the graph. While
# one captured node runs again, its data-dependent operator takes the symbols of that node's
# captured value, in order, before making new ones.
_REUSE: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("kiln_unbacked_reuse", default=None)


@contextlib.contextmanager
def same_unbacked(captured: Any) -> Iterator[None]:
    """Data-dependent operators run inside take the unbacked SymInts of `captured` (a node's
    value as capture saw it) first (Note [Tracing a captured graph again])."""
    symints = unbacked_symints(captured)
    token = _REUSE.set(symints or None)
    try:
        yield
    finally:
        _REUSE.reset(token)


def unbacked_symints(value: Any) -> list[Any]:
    """The SymInts of `value` (tensors' sizes, ints, nested) that are a bare unbacked symbol."""
    out: list[Any] = []
    seen: set[Any] = set()
    for v in tree_flatten(value)[0]:
        for s in v.shape if isinstance(v, torch.Tensor) else (v,):
            if isinstance(s, torch.SymInt):
                # the symbol as made: a `torch._check(m == k + 1)` made `m` read as `k + 1`
                e = symbol_of(s) or expr_of(s)
                env = getattr(s.node, "shape_env", None)
                if e.is_Symbol and e not in seen and isinstance(env, ShapeEnv) and env.is_unbacked(e):
                    seen.add(e)
                    out.append(s)
    return out


def _take() -> Any:
    queue = _REUSE.get()
    return queue.pop(0) if queue else None


def _numel_expr(shape: Any) -> Any:
    return math.prod((expr_of(s) for s in shape), start=expr_of(1))


def _size(env: ShapeEnv, upper: Any, why: str) -> Any:
    again = _take()
    if again is not None:
        return again
    return make_symint(env, env.create_unbacked_symbol(size_like=True, max=upper, why=why), None)


def _empty(sizes: list[Any], strides: list[Any], dtype: torch.dtype) -> torch.Tensor:
    with enable_python_dispatcher():
        return torch.empty_strided(sizes, strides, dtype=dtype, device=_META)


def _contiguous_strides(sizes: list[Any]) -> list[Any]:
    strides: list[Any] = []
    acc: Any = 1
    for s in reversed(sizes):
        strides.append(acc)
        acc = acc * s
    return strides[::-1]


def _nonzero(env: ShapeEnv, device: torch.device, x: torch.Tensor) -> torch.Tensor:
    n = _size(env, _numel_expr(x.shape), "rows of nonzero")
    # eager's CPU and CUDA kernels return the (n, dim) index matrix column-major
    return _empty([n, x.dim()], [1, n], torch.long)


def _masked_select(env: ShapeEnv, device: torch.device, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    n = _size(env, _numel_expr(shape), "elements of masked_select")
    return _empty([n], [1], x.dtype)


def _index(env: ShapeEnv, device: torch.device, x: torch.Tensor, indices: list[Any]) -> torch.Tensor | None:
    """`x[mask]`, `x[:, mask]`: one boolean index after full slices (None); other index lists
    with a boolean mask are not answered."""
    masks = [i for i, t in enumerate(indices) if t is not None]
    if len(masks) != 1:
        return None
    j = masks[0]
    mask = indices[j]
    if mask.dtype not in (torch.bool, torch.uint8) or j + mask.dim() > x.dim():
        return None
    n = _size(env, _numel_expr(mask.shape), "elements of a boolean-mask index")
    sizes = [*x.shape[:j], n, *x.shape[j + mask.dim() :]]
    return _empty(sizes, _contiguous_strides(sizes), x.dtype)


def _unique2(
    env: ShapeEnv,
    device: torch.device,
    x: torch.Tensor,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`torch.unique(x)` (no dim): the distinct values, the inverse (x's shape, or empty when not
    asked for) and the counts (one per value, or empty)."""
    n = _size(env, _numel_expr(x.shape), "values of unique")
    inverse_shape = list(x.shape) if return_inverse else [0]
    counts_shape = [n] if return_counts else [0]
    return (
        _empty([n], [1], x.dtype),
        _empty(inverse_shape, _contiguous_strides(inverse_shape), torch.long),
        _empty(counts_shape, [1], torch.long),
    )


def _local_scalar_dense(env: ShapeEnv, device: torch.device, x: torch.Tensor) -> Any:
    """`.item()` of an integer tensor: an int of any sign until `torch._check` says more."""
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype is torch.bool:
        return None
    again = _take()
    if again is not None:
        return again
    return make_symint(env, env.create_unbacked_symbol(size_like=False, why="Tensor.item()"), None)


def _has_bool_index(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices)


UnbackedMeta = Callable[..., Any]

# "aten::name" -> function(env, device, *args, **kwargs) over the fake arguments, giving meta
# results (or a SymInt) with unbacked sizes, or None when these arguments are not answered
UNBACKED_META_FUNCTIONS: dict[str, UnbackedMeta] = {
    "aten::nonzero": _nonzero,
    "aten::masked_select": _masked_select,
    "aten::_local_scalar_dense": _local_scalar_dense,
    "aten::index": _index,
    "aten::_unique2": _unique2,
}

# operators whose meta kernel would ask for tensor data with these arguments
NEEDS_DATA: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], bool]] = {
    "aten::index": _has_bool_index,
}


def _unbacked_env_of(value: Any) -> ShapeEnv | None:
    sizes: tuple[Any, ...] = ()
    if isinstance(value, torch.Tensor):
        sizes = (*value.shape, *value.stride())
    elif isinstance(value, torch.SymInt):
        sizes = (value,)
    for s in sizes:
        if isinstance(s, torch.SymInt):
            env = getattr(s.node, "shape_env", None)
            if isinstance(env, ShapeEnv) and env.is_unbacked(expr_of(s)):
                return env
    return None


def graph_unbacked_env(gm: torch.fx.GraphModule) -> ShapeEnv | None:
    """The ShapeEnv of a captured graph that computes a data-dependent size, else None: a
    backend traces such a graph from its placeholders within this env (`unbacked_sizes`)."""
    for node in gm.graph.nodes:
        for value in tree_flatten(node.meta.get("val"))[0]:
            env = _unbacked_env_of(value)
            if env is not None:
                return env
    return None
