"""Memory-shaped lowerings: cat, padding, view scatters, advanced indexing, gather, index_select,
scatter, embedding.

They all remain loops over an index space. ``cat`` and ``constant_pad_nd`` are Pointwise bodies
whose loads are guarded by ``ops.masked`` (the load outside its input's range is never used), and
so are ``slice_scatter`` and ``select_scatter`` (Note [View scatters are pointwise]).
Advanced indexing, ``gather``, ``index_select`` and ``embedding`` load the index tensor, turn the value into an
index variable with ``ops.indirect_indexing``, and load the source at an index containing that
variable. ``scatter``, ``scatter_add`` and ``index_put`` copy ``self`` into a fresh buffer and add a
:class:`~kiln_loopir.ir.Scatter` node that stores into it at indirect positions (accumulating for
the ``_add``/``accumulate`` forms).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ..indexing import Expr, FloorDiv, ModularIndexing
from ..ir import Index, Pointwise, Scatter, TensorBox
from ..layout import symbolic
from ..lowering import (
    Unsupported,
    broadcast_loader,
    broadcast_sizes,
    normalize_dim,
    opmath,
    register_lowering,
    to_dtype,
)
from ..virtualized import current_graph, ops
from .pointwise import clone

aten = torch.ops.aten


def _in_range(expr: Expr, lo: int | Expr, hi: int | Expr) -> Any:
    """ops value: ``lo <= expr < hi``; a bound in size symbols is computed in the kernel."""
    value = ops.index_expr(expr, torch.int64)
    return ops.logical_and(ops.ge(value, _int64(lo)), ops.lt(value, _int64(hi)))


def _int64(v: int | Expr) -> Any:
    return ops.constant(v, torch.int64) if isinstance(v, int) else ops.index_expr(v, torch.int64)


@register_lowering(aten.cat.default)
def cat(tensors: Sequence[TensorBox], dim: int = 0) -> TensorBox:
    inputs = [t for t in tensors if not (len(t.get_size()) == 1 and t.get_size()[0] == 0)]
    if not inputs:
        return tensors[0]
    rank = len(inputs[0].get_size())
    dim = normalize_dim(dim, rank)
    dtype = functools.reduce(torch.promote_types, [t.get_dtype() for t in inputs])
    if len(inputs) == 1:
        return clone(to_dtype(inputs[0], dtype))
    # offsets along `dim`: ints, or expressions in size symbols (Note [Symbolic sizes in loopir])
    starts: list[int | Expr] = []
    total: int | Expr = 0
    for t in inputs:
        starts.append(total)
        n = sympy.sympify(t.get_size()[dim])
        total = total + (int(n) if n.is_Integer else n)
    size = list(inputs[0].get_size())
    size[dim] = sympy.Integer(total) if isinstance(total, int) else total
    loaders = [t.make_loader() for t in inputs]

    def inner(index: Index) -> Any:
        def piece(k: int) -> Any:
            shifted = list(index)
            shifted[dim] = index[dim] - starts[k]
            return ops.to_dtype(loaders[k](shifted), dtype)

        result = ops.masked(_in_range(index[dim], starts[-1], total), lambda: piece(len(inputs) - 1), 0)
        for k in range(len(inputs) - 2, -1, -1):
            end = starts[k + 1]
            inside = _in_range(index[dim], starts[k], end)
            result = ops.where(inside, ops.masked(inside, lambda k=k: piece(k), 0), result)
        return result

    return TensorBox.create(Pointwise(inputs[0].get_device(), dtype, inner, tuple(size)))


@register_lowering(aten.constant_pad_nd.default)
def constant_pad_nd(x: TensorBox, pad: Sequence[int], value: float = 0) -> TensorBox:
    old = list(x.get_size())
    pairs = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]
    size = list(old)
    shifts: dict[int, tuple[int, int]] = {}
    for i, (lo, hi) in enumerate(pairs):
        d = len(old) - 1 - i
        size[d] = sympy.Integer(int(old[d]) + lo + hi)
        shifts[d] = (lo, int(old[d]))
    load = x.make_loader()
    dtype = x.get_dtype()

    def inner(index: Index) -> Any:
        src = list(index)
        mask = None
        for d, (lo, n) in shifts.items():
            src[d] = index[d] - lo
            ok = _in_range(src[d], 0, n)
            mask = ok if mask is None else ops.logical_and(mask, ok)
        if mask is None:
            return load(src)
        return ops.masked(mask, lambda: load(src), value)

    return TensorBox.create(Pointwise(x.get_device(), dtype, inner, tuple(size)))


# Note [View scatters are pointwise]
# ``slice_scatter(base, src, dim, start, end, step)`` (and ``select_scatter``) writes ``src``
# into a regular part of a copy of ``base``: every output element is either one element of
# ``src`` (inside the slice) or the same element of ``base`` (outside). So it lowers to a
# Pointwise over the output, ``where(inside, masked(inside, src[shifted]), base[i])``, which fuses
# with the producers of ``src`` and ``base`` like any other pointwise body: the zero fill that
# ``slice_backward`` makes for ``base`` becomes a constant inside the kernel instead of a
# buffer, and the ``src`` load is never made outside the slice. "Inside" along ``dim`` is
# ``lo <= i < hi`` and, for a step above 1, ``i % step == lo % step`` (the loop index is
# never negative, so that test needs no shifted modulo). Only a dimension of static size
# with integer bounds lowers; a symbolic one runs eager's kernel (an extern call). The
# lowering is switched by the pass option ``view_scatter`` (off: extern calls, as before).


def _slice_bounds(n: int, start: Any, end: Any, step: int) -> tuple[int, int, int]:
    """``(lo, length, step)`` of ``x[start:end:step]`` along a dimension of size ``n``."""
    lo = 0 if start is None else (start + n if start < 0 else start)
    hi = n if end is None else (end + n if end < 0 else end)
    lo, hi = min(max(lo, 0), n), min(max(hi, 0), n)
    return lo, max(0, (hi - lo + step - 1) // step), step


def _static_dim(x: TensorBox, dim: int, *bounds: Any) -> int:
    size = x.get_size()[dim]
    if not size.is_number or not all(b is None or isinstance(b, int) for b in bounds):
        raise Unsupported("a view scatter along a dimension of symbolic size or with symbolic bounds")
    return int(size)


@register_lowering(aten.slice_scatter.default)
def slice_scatter(
    x: TensorBox, src: TensorBox, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> TensorBox:
    """Note [View scatters are pointwise]."""
    size = list(x.get_size())
    dim = normalize_dim(dim, len(size))
    n = _static_dim(x, dim, start, end, step)
    if not isinstance(step, int) or step < 1:
        raise Unsupported("slice_scatter with a step below 1")
    lo, length, step = _slice_bounds(n, start, end, step)
    dtype = x.get_dtype()
    if lo == 0 and length == n and step == 1:
        return clone(to_dtype(src, dtype))
    load_x, load_s = x.make_loader(), src.make_loader()
    hi = lo + (length - 1) * step + 1 if length else lo

    def inner(index: Index) -> Any:
        i = index[dim]
        inside = _in_range(i, lo, hi)
        if step > 1:
            phase = ops.index_expr(ModularIndexing(i, sympy.Integer(1), sympy.Integer(step)), torch.int64)
            inside = ops.logical_and(inside, ops.eq(phase, ops.constant(lo % step, torch.int64)))
        shifted = list(index)
        shifted[dim] = FloorDiv(i - lo, sympy.Integer(step)) if step > 1 else i - lo
        picked = ops.masked(inside, lambda: ops.to_dtype(load_s(shifted), dtype), 0)
        return ops.where(inside, picked, load_x(index))

    return TensorBox.create(Pointwise(x.get_device(), dtype, inner, tuple(size)))


@register_lowering(aten.select_scatter.default)
def select_scatter(x: TensorBox, src: TensorBox, dim: int, index: int) -> TensorBox:
    """Note [View scatters are pointwise]: ``src`` has ``x``'s shape without ``dim``."""
    size = list(x.get_size())
    dim = normalize_dim(dim, len(size))
    n = _static_dim(x, dim, index)
    pos = index + n if index < 0 else index
    if not 0 <= pos < n:
        raise Unsupported("select_scatter index out of range")
    dtype = x.get_dtype()
    load_x, load_s = x.make_loader(), src.make_loader()

    def inner(idx: Index) -> Any:
        inside = ops.eq(ops.index_expr(idx[dim], torch.int64), ops.constant(pos, torch.int64))
        picked = ops.masked(inside, lambda: ops.to_dtype(load_s([*idx[:dim], *idx[dim + 1 :]]), dtype), 0)
        return ops.where(inside, picked, load_x(idx))

    return TensorBox.create(Pointwise(x.get_device(), dtype, inner, tuple(size)))


def _index_plan(x: TensorBox, indices: Sequence[TensorBox | None]) -> tuple[list[Expr], Any]:
    """Output size of ``x[indices]`` and a function from output index to source index."""
    old = list(x.get_size())
    idx = list(indices) + [None] * (len(old) - len(indices))
    used = [d for d, t in enumerate(idx) if t is not None]
    for d in used:
        t = idx[d]
        assert t is not None
        if t.get_dtype() in (torch.bool, torch.uint8):
            raise Unsupported("boolean mask indexing has a data-dependent shape")
    bshape = list(broadcast_sizes(*[t.get_size() for t in idx if t is not None]))
    adjacent = used == list(range(used[0], used[-1] + 1))
    if adjacent:
        before, after = list(range(used[0])), list(range(used[-1] + 1, len(old)))
        size = [old[d] for d in before] + bshape + [old[d] for d in after]
        bpos = len(before)
    else:
        before, after = [], [d for d in range(len(old)) if idx[d] is None]
        size = bshape + [old[d] for d in after]
        bpos = 0
    loaders = {d: broadcast_loader(t, bshape) for d, t in enumerate(idx) if t is not None}
    nb = len(bshape)

    def source(index: Index) -> list[Expr]:
        src: list[Expr] = [sympy.Integer(0)] * len(old)
        for pos, d in enumerate(before):
            src[d] = index[pos]
        bidx = list(index[bpos : bpos + nb])
        for d, load in loaders.items():
            src[d] = ops.indirect_indexing(load(bidx), old[d])
        rest = list(index[bpos + nb :]) if adjacent else list(index[nb:])
        for pos, d in enumerate(after):
            src[d] = rest[pos]
        return src

    return size, source


@register_lowering(aten.index.Tensor)
def index(x: TensorBox, indices: Sequence[TensorBox | None]) -> TensorBox:
    size, source = _index_plan(x, indices)
    load = x.make_loader()
    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), lambda i: load(source(i)), tuple(size)))


@register_lowering(aten.gather.default)
def gather(x: TensorBox, dim: int, index_: TensorBox, *, sparse_grad: bool = False) -> TensorBox:
    dim = normalize_dim(dim, len(x.get_size()))
    load, load_i = x.make_loader(), index_.make_loader()
    n = x.get_size()[dim] if x.get_size() else sympy.Integer(1)

    def inner(i: Index) -> Any:
        src = list(i)
        if src:
            src[dim] = ops.indirect_indexing(load_i(i), n)
        return load(src)

    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), inner, index_.get_size()))


@register_lowering(aten.index_select.default)
def index_select(x: TensorBox, dim: int, index_: TensorBox) -> TensorBox:
    """Note [index_select is a gather]: ``index_select(x, dim, i)`` is ``x`` with its ``dim``
    coordinate read through ``i``: a Pointwise body like ``embedding``'s, which the scheduler fuses
    with its readers (a sum over the selected rows, a permutation of an LSTM's state before a
    linear layer). As an extern call it cost a Python dispatch and a buffer of its own per call,
    which at the sizes where host time decides (packed sequences, GNN messages, beam reordering)
    was more than the copy. A 0-d ``i`` selects one element, like a 1-d ``i`` of one; a 0-d ``x``
    is itself, its one index checked. Option ``index_select=False``: extern."""
    size = list(x.get_size())
    load, load_i = x.make_loader(), index_.make_loader()
    scalar_index = len(index_.get_size()) == 0
    if not size and not scalar_index and index_.get_size()[0] != 1:
        # eager's kernel refuses a 0-d tensor's index of n != 1 values ("Index to scalar can have
        # only 1 value"), the meta kernel does not: left to eager's kernel, which raises
        raise Unsupported(
            "index_select of a 0-d tensor with an index of several values: eager's kernel raises"
        )
    if not size:  # its one index must be 0 (checked); the result is the 0-d value itself

        def only(i: Index) -> Any:
            ops.indirect_indexing(load_i([] if scalar_index else [sympy.Integer(0)]), sympy.Integer(1))
            return load([])

        return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), only, ()))
    dim = normalize_dim(dim, len(size))
    n = size[dim]

    def inner(i: Index) -> Any:
        src = list(i)
        src[dim] = ops.indirect_indexing(load_i([] if scalar_index else [i[dim]]), n)
        return load(src)

    out = list(size)
    out[dim] = sympy.Integer(1) if scalar_index else index_.get_size()[0]
    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), inner, tuple(out)))


@register_lowering(aten.embedding.default)
def embedding(weight: TensorBox, indices: TensorBox, *args: Any) -> TensorBox:
    load_w, load_i = weight.make_loader(), indices.make_loader()
    rows = weight.get_size()[0]
    nidx = len(indices.get_size())

    def inner(i: Index) -> Any:
        row = ops.indirect_indexing(load_i(list(i[:nidx])), rows)
        return load_w([row, *i[nidx:]])

    size = (*indices.get_size(), *weight.get_size()[1:])
    return TensorBox.create(Pointwise(weight.get_device(), weight.get_dtype(), inner, size))


def _scatter_into(
    x: TensorBox, ranges: Sequence[Expr], value_fn: Any, out_indexer: Any, mode: str | None
) -> TensorBox:
    """Copy ``x`` into a new buffer, then store ``value_fn(i)`` at ``out_indexer(i)`` into it.

    Note [A scatter's copy in eager's strides]: eager's functional ``index_put`` clones ``self``
    keeping its layout (``scatter`` does not), and an in-place one keeps the written tensor's;
    the copy here was laid out row-major whatever eager's strides, so an output (or a
    view rebuilt from it by the runtime) of a transposed tensor written by ``index_put_`` had
    other strides than eager's, and a view of it rebuilt with eager's strides read the wrong
    elements (test_alias_fuzz.py seed 681). The copy takes the strides of the node's meta value
    where they are dense (the graph's rule for values it computes, StorageBox.stride_hint), and
    the scatter stores through the copy's own layout."""
    graph = current_graph()
    target_box = clone(x)
    storage = target_box.storage()
    assert storage is not None
    meta = getattr(graph, "current_meta", None)
    if isinstance(meta, torch.Tensor) and symbolic(meta.shape) == tuple(
        sympy.sympify(n) for n in x.get_size()
    ):
        from ..graph import hint_eager_strides

        hint_eager_strides(target_box, meta)
    target = storage.realize()
    dtype = x.get_dtype()
    data = Pointwise(x.get_device(), dtype, lambda i: ops.to_dtype(value_fn(i), dtype), tuple(ranges))
    node = Scatter(
        graph.new_buffer_name(),
        target.layout,
        data=data,
        mutates=target.name,
        output_indexer=out_indexer,
        mode=mode,
    )
    graph.register_operation(node)
    return TensorBox.create(node)


def _scatter(x: TensorBox, dim: int, index_: TensorBox, src: Any, mode: str | None) -> TensorBox:
    dim = normalize_dim(dim, len(x.get_size()))
    load_i = index_.make_loader()
    n = x.get_size()[dim] if x.get_size() else sympy.Integer(1)
    load_s = src.make_loader() if isinstance(src, TensorBox) else None

    def value(i: Index) -> Any:
        return load_s(i) if load_s else ops.constant(src, x.get_dtype())

    def out(i: Index) -> Index:
        dst = list(i)
        if dst:
            dst[dim] = ops.indirect_indexing(load_i(i), n)
        return dst

    return _scatter_into(x, index_.get_size(), value, out, mode)


@register_lowering(aten.scatter.src, aten.scatter.value)
def scatter(x: TensorBox, dim: int, index_: TensorBox, src: Any) -> TensorBox:
    return _scatter(x, dim, index_, src, None)


@register_lowering(aten.scatter_add.default)
def scatter_add(x: TensorBox, dim: int, index_: TensorBox, src: TensorBox) -> TensorBox:
    """Note [Accumulating scatters in low precision]: eager's ``scatter_add`` (and
    ``index_add`` of more than one dimension, kiln_aotgrad's decompositions.py) on a bfloat16
    or float16 tensor sums in float32 and rounds once, where ``index_put(accumulate=True)``
    rounds each add. Rounding each add instead drifts with the number of repeated indices (150
    adds into 3 rows of bfloat16: 0.25 off eager on values near 10; near 6x relative where the
    sum cancels). So a half-precision ``scatter_add`` scatters into a float32 copy of ``x`` and
    converts the result once; ``index_put`` keeps the element type, and its atomic adds round
    each add as eager's do (Note [16-bit atomic adds] in kiln_codegen_triton's kernel.py)."""
    dtype = x.get_dtype()
    wide = opmath(dtype)
    if wide == dtype:
        return _scatter(x, dim, index_, src, "atomic_add")
    return to_dtype(_scatter(to_dtype(x, wide), dim, index_, to_dtype(src, wide), "atomic_add"), dtype)


@register_lowering(aten.index_put.default)
def index_put(
    x: TensorBox, indices: Sequence[TensorBox | None], values: TensorBox, accumulate: bool = False
) -> TensorBox:
    size, source = _index_plan(x, indices)
    load_v = broadcast_loader(values, size)
    return _scatter_into(x, size, load_v, source, "atomic_add" if accumulate else None)
