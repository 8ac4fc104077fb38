"""Memoized meta kernels: the output geometry of an operator, remembered by its inputs' geometry.

A fake tensor's operator runs its meta kernel on meta tensors (fake.py). Under torch 2.13 most
of those kernels are Python: `aten.mul` on meta tensors runs torch's reference implementation
and its prims' meta functions (about 130 us), `native_batch_norm` its whole decomposition
(about 1.2 ms). A compile runs the same operator on the same geometry many times: a network
repeats its blocks, and capture, aotgrad's trace and its joint trace each run every operator
of the program again. What a meta kernel returns is a function of what it can see: the
operator, its arguments' sizes, strides, offsets, dtypes and lazy bits, its Python arguments,
and a little process state (the default dtype, what `device_hint` answers, Note [Meta kernels
that ask the device] in kiln_aotgrad). So `meta_call` keeps the geometry of each answer under
that key and builds fresh meta tensors of it on the next call.

Note [Meta results are memoized]: only where the answer is fresh tensors the key describes
entirely: an operator whose schema neither aliases nor writes an argument, static sizes (a
symbolic call runs its kernel: it may guard on the ShapeEnv), strided tensors, and outputs that
are plain allocations (no view, offset 0, a storage exactly their extent, no lazy bit, none
an input or another output). A kernel that raises is not remembered: the next call raises
again. The generated code is unchanged: every later step reads the same geometry as before.
"""

from __future__ import annotations

import contextvars
from typing import Any

import torch

from kiln_dynamo.trees import CONSTANT_LEAVES

# Note [Meta kernels that ask the device] (kiln_aotgrad's tracer): the device that torch's
# `device_hint` answers while a meta kernel runs, None where it answers as torch's own. Part of
# the memo's key: the kernels that ask (FFTs, `_embedding_bag`, `linalg_eig`...) answer per device.
DEVICE_HINT: contextvars.ContextVar[str | None] = contextvars.ContextVar("kiln_device_hint", default=None)

_LIMIT = 1 << 15  # entries; the memo starts again when full
_MEMO: dict[tuple[Any, ...], Any] = {}
_PURE: dict[Any, bool] = {}  # operator -> whether its schema aliases or writes nothing


class _Unkeyable(Exception):
    """An argument or result the memo cannot describe: the kernel runs as before."""


def _pure(func: Any) -> bool:
    known = _PURE.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        known = (
            isinstance(func, torch._ops.OpOverload)
            and schema is not None
            and not any(a.alias_info is not None for a in schema.arguments)
            and not any(r.alias_info is not None for r in schema.returns)
            and torch.Tag.dynamic_output_shape not in func.tags
            and torch.Tag.inplace_view not in func.tags
        )
        _PURE[func] = known
    return known


def _key_of(x: Any, out: list[Any]) -> None:
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided or x.device.type != "meta":
            raise _Unkeyable
        shape, stride, offset = tuple(x.shape), x.stride(), x.storage_offset()
        nbytes = x.untyped_storage().nbytes()
        if any(type(n) is not int for n in (*shape, *stride, offset, nbytes)):
            # symbolic: a decomposition's meta tensor under fakes, or a static view of a
            # symbolic storage
            raise _Unkeyable
        out.append((shape, stride, offset, nbytes, x.dtype, x.is_conj(), x.is_neg()))
    elif isinstance(x, (tuple, list)):
        out.append((type(x), len(x)))
        for y in x:
            _key_of(y, out)
    elif isinstance(x, dict):
        out.append((dict, tuple(x)))
        for y in x.values():
            _key_of(y, out)
    elif isinstance(x, CONSTANT_LEAVES):
        out.append((type(x), x))  # 1, 1.0 and True promote differently: the type is part of it
    else:
        raise _Unkeyable  # a SymInt, a generator, an object of the caller's


def _extent(shape: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> int:
    if any(n == 0 for n in shape):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))) * itemsize


def _geometry_of(x: Any, inputs: set[int], seen: set[int]) -> Any:
    if isinstance(x, torch.Tensor):
        shape, stride = tuple(x.shape), x.stride()
        if (
            id(x) in inputs
            or id(x) in seen
            or x.layout != torch.strided
            or x.device.type != "meta"
            or x._is_view()
            or x.storage_offset() != 0
            or x.is_conj()
            or x.is_neg()
            or x.requires_grad
            or x.untyped_storage().nbytes() != _extent(shape, stride, x.element_size())
        ):
            raise _Unkeyable
        seen.add(id(x))
        return (torch.Tensor, shape, stride, x.dtype)
    if isinstance(x, (tuple, list)):
        return (type(x), tuple(_geometry_of(y, inputs, seen) for y in x))
    if isinstance(x, CONSTANT_LEAVES):
        return (None, x)
    raise _Unkeyable


def _build(g: Any) -> Any:
    kind = g[0]
    if kind is torch.Tensor:
        return torch.empty_strided(g[1], g[2], dtype=g[3], device="meta")
    if kind is None:
        return g[1]
    return kind(_build(y) for y in g[1])


def _input_ids(x: Any, out: set[int]) -> None:
    if isinstance(x, torch.Tensor):
        out.add(id(x))
    elif isinstance(x, (tuple, list)):
        for y in x:
            _input_ids(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _input_ids(y, out)


def meta_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`func(*args, **kwargs)` on meta tensors of static sizes, its result built from the memo
    where it can be (Note [Meta results are memoized])."""
    if not _pure(func):
        return func(*args, **kwargs)
    parts: list[Any] = [func, DEVICE_HINT.get(), torch.get_default_dtype()]
    try:
        _key_of(args, parts)
        _key_of(kwargs, parts)
    except _Unkeyable:
        return func(*args, **kwargs)
    key = tuple(parts)
    try:
        known = _MEMO.get(key)
    except TypeError:  # an unhashable value the key let through: the kernel answers
        return func(*args, **kwargs)
    if known is not None:
        return _build(known)
    out = func(*args, **kwargs)
    inputs: set[int] = set()
    _input_ids((args, kwargs), inputs)
    try:
        geometry = _geometry_of(out, inputs, set())
    except _Unkeyable:
        return out
    if len(_MEMO) >= _LIMIT:
        _MEMO.clear()
    _MEMO[key] = geometry
    return out


def clear() -> None:
    """Forget every remembered answer (tests)."""
    _MEMO.clear()
