"""View lowerings: index remapping, never a copy (but for the ``*_copy`` variants, which copy).

Each view op returns a :class:`~kiln_loopir.ir.View` whose ``reindex`` maps an index of the new
shape to an index of the old one. A reshape groups old and new dimensions into runs of equal
element count: inside a run the new index is flattened and the old digits are read back with
``FloorDiv``/``ModularIndexing``, which :func:`~kiln_loopir.indexing.simplify_index` later turns
into plain arithmetic where it can. Loading through a chain of views composes the remappings, so
a consumer reads the original memory directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from .. import sizevars
from ..indexing import Expr, FloorDiv, ModularIndexing, contiguous_strides, linear_index
from ..ir import Index, Pointwise, ReinterpretView, TensorBox, View, realize_strided
from ..layout import FixedLayout, symbolic
from ..lowering import Unsupported, normalize_dim, register_lowering, stretched

aten = torch.ops.aten
ZERO = sympy.Integer(0)


def make_view(x: TensorBox, size: Sequence[Expr], reindex: Any) -> TensorBox:
    return TensorBox(View(x.data, tuple(size), reindex))


def _infer_size(old: Sequence[Expr], new: Sequence[Any]) -> list[Expr]:
    sizes = list(symbolic([s if _is_minus_one(s) is False else 1 for s in new]))
    if any(_is_minus_one(s) for s in new):
        known = sympy.Mul(*[s for s, n in zip(sizes, new, strict=True) if not _is_minus_one(n)])
        numel = sympy.Mul(*old)
        if known == 0:
            inferred: Expr = ZERO
        elif numel.is_number and known.is_number:
            inferred = numel / known
        else:  # Note [Symbolic sizes in loopir]: exact when sympy proves it, else floor division
            exact = sympy.cancel(numel / known)
            inferred = exact if exact.is_integer else FloorDiv(numel, known)
        sizes[[_is_minus_one(s) for s in new].index(True)] = inferred
    return [sympy.Integer(int(s)) if s.is_number else s for s in sizes]


def _is_minus_one(s: Any) -> bool:
    return isinstance(s, int) and not isinstance(s, bool) and s == -1


def reshape_indexer(old: Sequence[Expr], new: Sequence[Expr]) -> Any:
    """reindex for a row-major reshape from ``old`` to ``new``."""
    old_nz = [i for i, s in enumerate(old) if s != 1]
    new_nz = [i for i, s in enumerate(new) if s != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(old_nz) or j < len(new_nz):
        og, ng = [old_nz[i]], [new_nz[j]]
        i, j = i + 1, j + 1
        po, pn = old[og[0]], new[ng[0]]
        while po != pn and sympy.expand(po - pn) != 0:
            if sizevars.hint(po) < sizevars.hint(pn):
                og.append(old_nz[i])
                po *= old[old_nz[i]]
                i += 1
            else:
                ng.append(new_nz[j])
                pn *= new[new_nz[j]]
                j += 1
        groups.append((og, ng))

    def reindex(index: Index) -> Index:
        out: list[Expr] = [ZERO] * len(old)
        for og, ng in groups:
            if len(og) == 1 and len(ng) == 1:
                out[og[0]] = index[ng[0]]
                continue
            flat = linear_index([index[k] for k in ng], contiguous_strides([new[k] for k in ng]))
            strides = contiguous_strides([old[k] for k in og])
            for pos, (k, stride) in enumerate(zip(og, strides, strict=True)):
                out[k] = FloorDiv(flat, stride) if pos == 0 else ModularIndexing(flat, stride, old[k])
        return out

    return reindex


@register_lowering(aten.view.default, aten.reshape, aten._unsafe_view)
def view(x: TensorBox, size: Sequence[Any]) -> TensorBox:
    old = x.get_size()
    new = _infer_size(old, size)
    if list(old) == new:
        return x
    if sympy.Mul(*old) == 0:
        raise Unsupported("reshape of an empty tensor")
    return make_view(x, new, reshape_indexer(old, new))


@register_lowering(aten.permute)
def permute(x: TensorBox, dims: Sequence[int]) -> TensorBox:
    rank = len(x.get_size())
    dims = [normalize_dim(d, rank) for d in dims]
    size = [x.get_size()[d] for d in dims]
    inverse = [dims.index(i) for i in range(rank)]

    def reindex(index: Index) -> Index:
        return [index[inverse[i]] for i in range(rank)]

    return make_view(x, size, reindex)


@register_lowering(aten.transpose.int)
def transpose(x: TensorBox, a: int, b: int) -> TensorBox:
    rank = len(x.get_size())
    dims = list(range(rank))
    if rank == 0:
        return x
    a, b = normalize_dim(a, rank), normalize_dim(b, rank)
    dims[a], dims[b] = dims[b], dims[a]
    return permute(x, dims)


@register_lowering(aten.t.default)
def t(x: TensorBox) -> TensorBox:
    return transpose(x, 0, 1) if len(x.get_size()) == 2 else x


@register_lowering(aten.expand.default)
def expand(x: TensorBox, size: Sequence[Any], *, implicit: bool = False) -> TensorBox:
    old = x.get_size()
    skip = len(size) - len(old)
    new = [old[i - skip] if _is_minus_one(s) else symbolic([s])[0] for i, s in enumerate(size)]
    if list(new) == list(old):
        return x
    stretch = [
        stretched(old[i], new[i + skip]) for i in range(len(old))
    ]  # Note [Stretched sizes the trace proved 1]

    def reindex(index: Index) -> Index:
        return [ZERO if stretch[i] else index[i + skip] for i in range(len(old))]

    return make_view(x, new, reindex)


@register_lowering(aten.unsqueeze)
def unsqueeze(x: TensorBox, dim: int) -> TensorBox:
    old = list(x.get_size())
    dim = normalize_dim(dim, len(old) + 1)
    new = [*old[:dim], sympy.Integer(1), *old[dim:]]

    def reindex(index: Index) -> Index:
        return [*index[:dim], *index[dim + 1 :]]

    return make_view(x, new, reindex)


@register_lowering(aten.squeeze)
def squeeze(x: TensorBox, dim: Any = None) -> TensorBox:
    old = list(x.get_size())
    if dim is None:
        drop = {i for i, s in enumerate(old) if s == 1}
    else:
        dims = dim if isinstance(dim, list | tuple) else [dim]
        drop = {normalize_dim(d, len(old)) for d in dims if old and old[normalize_dim(d, len(old))] == 1}
    if not drop:
        return x
    keep = [i for i in range(len(old)) if i not in drop]

    def reindex(index: Index) -> Index:
        out: list[Expr] = [ZERO] * len(old)
        for pos, k in enumerate(keep):
            out[k] = index[pos]
        return out

    return make_view(x, [old[i] for i in keep], reindex)


@register_lowering(aten.slice.Tensor)
def slice_(x: TensorBox, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> TensorBox:
    old = list(x.get_size())
    dim = normalize_dim(dim, len(old))
    if not old[dim].is_number or isinstance(end, sympy.Expr) or isinstance(start, sympy.Expr):
        return _symbolic_slice(x, old, dim, start, end, step)
    n = int(old[dim])
    lo = 0 if start is None else (start + n if start < 0 else start)
    hi = n if end is None else (end + n if end < 0 else end)
    lo, hi = min(max(lo, 0), n), min(max(hi, 0), n)
    length = max(0, (hi - lo + step - 1) // step)
    if lo == 0 and length == n and step == 1:
        return x
    new = [*old[:dim], sympy.Integer(length), *old[dim + 1 :]]

    def reindex(index: Index) -> Index:
        out = list(index)
        out[dim] = index[dim] * step + lo
        return out

    return make_view(x, new, reindex)


def _nonnegative(e: Expr) -> bool:
    """Whether ``e`` is provably >= 0 for every value of its (non-negative) size symbols. A
    ``FloorDiv(a, k)`` (``a >= 0``, ``k`` a positive integer) is relaxed two ways, each covering
    every value it can take: to some ``q >= 0``, and to ``(a - r) / k`` for some ``r >= 0`` (its
    remainder). A claim proved under either relaxation holds for the quotient itself
    (``s1 // 2 >= 0`` by the first, ``s1 - s1 // 2 >= 0`` by the second: ``s1 / 2 + r / 2``)."""
    if e.is_nonnegative:
        return True
    divs = list(e.atoms(FloorDiv))
    if not divs or not all(d.is_Integer and d > 0 and a.is_nonnegative for a, d in (f.args for f in divs)):
        return False
    quotients = {f: sympy.Symbol(f"_q{k}", integer=True, nonnegative=True) for k, f in enumerate(divs)}
    remainders = {
        f: (f.args[0] - sympy.Symbol(f"_r{k}", integer=True, nonnegative=True)) / f.args[1]
        for k, f in enumerate(divs)
    }
    return any(bool(sympy.expand(e.xreplace(subs)).is_nonnegative) for subs in (quotients, remainders))


_SLICE_OPS = frozenset({aten.slice.Tensor, aten.slice_copy.Tensor})


def _captured_length(dim: int) -> Expr | None:
    """Note [Slice lengths decided at capture]: the length of the slice being lowered as the
    capture computed it (the node's value), when it is an expression of the size symbols. Torch's
    slice rule (`min(end, n) - start`, clamped at 0) was decided there by the ShapeEnv with the
    symbols' ranges (`s1 >= 2` settles `x[:, 2:]`) and, where those do not settle it, a guard
    that the frame checks on every call (`s1 <= s2` for `position_ids[:, :s1]` of a buffer of
    `s2` positions): for every call that reaches this graph it is the length. None when the node
    has no such value, or one of a data-dependent size whose facts the wrapper cannot check (the
    rule below decides alone)."""
    from ..virtualized import current_graph

    graph = current_graph()
    node = getattr(graph, "current_node", None)
    if node is None or node.target not in _SLICE_OPS:  # a slice inside another op's lowering
        return None
    meta = graph.current_meta
    if not isinstance(meta, torch.Tensor) or dim >= meta.dim():
        return None
    size = meta.shape[dim]
    if not isinstance(size, torch.SymInt):
        return None
    env = getattr(size.node, "shape_env", None)
    expr = sizevars.expr_of(size)
    if env is None or (env.is_unbacked(expr) and not _facts_checked(env, expr)):
        return None
    return sizevars.to_loopir(expr)


def _facts_checked(env: Any, expr: Any) -> bool:
    """`x[:k]` of an `.item()` k: capture took the length `k` from `torch._check(k <= n)` (and
    `k >= 0`); the wrapper checks those facts right after the call that computes `k` and before
    anything reads the view (Note [Checks of data-dependent sizes at run time]), so a call that
    reaches the view has `0 <= k <= n` and the view is eager's clamped slice. True when every
    fact on the data-dependent symbols of ``expr`` is one the wrapper checks (a relation)."""
    from ..wrapper_support import checkable_fact

    mine = {s for s in expr.free_symbols if env.is_unbacked(s)}
    return all(checkable_fact(g.expr) for g in env.deferred_asserts if g.expr.free_symbols & mine)


def _symbolic_slice(x: TensorBox, old: list[Expr], dim: int, start: Any, end: Any, step: int) -> TensorBox:
    """Note [Symbolic sizes in loopir]: a slice of a dimension of symbolic size, or to a symbolic
    end: the end is ``min(end, n)``, and the start ``lo`` must be provably in ``[0, end]`` from
    the symbols' assumptions (sizes are non-negative integers: ``x[:, 1:]`` of a dim of size
    ``s1 + 1`` has length ``s1``), so the length is exact for every size. Other slices (a negative
    start or end, a start that may pass the end) decline: the op runs as an extern kernel."""
    n = old[dim]
    if not isinstance(step, int) or step < 1:
        raise Unsupported("a slice of a symbolic size with a symbolic or non-positive step")
    lo = sizevars.to_loopir(0 if start is None else start)  # `//` as loopir's FloorDiv
    if not _nonnegative(lo):
        raise Unsupported("a slice of a symbolic size with a start that may be negative")
    captured = _captured_length(dim)
    if captured is not None:
        if step == 1 and lo == 0 and sympy.expand(captured - n) == 0:
            return x

        def shifted(index: Index) -> Index:
            out = list(index)
            out[dim] = index[dim] * step + lo
            return out

        return make_view(x, [*old[:dim], captured, *old[dim + 1 :]], shifted)
    if end is None or (isinstance(end, int) and end >= 2**62):
        hi: Expr = n
    elif isinstance(end, int) and end < 0:
        raise Unsupported("a slice of a symbolic size with a negative end")
    else:
        e = sizevars.to_loopir(end)
        hi = n if sympy.expand(e - n) == 0 else sympy.Min(e, n)
    span = sympy.expand(hi - lo)
    if not _nonnegative(span):
        raise Unsupported(f"a slice of a symbolic size whose start may pass its end ({lo} > {hi})")
    length = span if step == 1 else FloorDiv(span + step - 1, sympy.Integer(step))
    if step == 1 and lo == 0 and hi == n:
        return x
    new = [*old[:dim], length, *old[dim + 1 :]]

    def reindex(index: Index) -> Index:
        out = list(index)
        out[dim] = index[dim] * step + lo
        return out

    return make_view(x, new, reindex)


@register_lowering(aten.narrow)
def narrow(x: TensorBox, dim: int, start: int, length: int) -> TensorBox:
    return slice_(x, dim, start, start + length)


@register_lowering(aten.select.int)
def select(x: TensorBox, dim: int, index: Any) -> TensorBox:
    """``x.select(dim, index)``. A negative constant index counts from the end of the dim, whose
    size may be symbolic (``index + s0``); a symbolic index (a size expression) must be provably
    non-negative, else the op declines and runs as an extern kernel (it used to raise a TypeError
    comparing the expression with 0)."""
    old = list(x.get_size())
    dim = normalize_dim(dim, len(old))
    if isinstance(index, int):
        pos: Expr = sympy.Integer(index) + old[dim] if index < 0 else sympy.Integer(index)
    else:
        pos = sizevars.to_loopir(index)
        if not _nonnegative(pos):
            raise Unsupported(f"select at a symbolic index that may be negative ({pos})")

    def reindex(idx: Index) -> Index:
        return [*idx[:dim], pos, *idx[dim:]]

    return make_view(x, [*old[:dim], *old[dim + 1 :]], reindex)


@register_lowering(aten.split.Tensor, aten.split_with_sizes)
def split(x: TensorBox, sizes: Any, dim: int = 0) -> list[TensorBox]:
    rank = len(x.get_size())
    dim = normalize_dim(dim, rank)
    n = int(x.get_size()[dim])
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)] or [0]
    out, start = [], 0
    for s in sizes:
        out.append(slice_(x, dim, start, start + s))
        start += s
    return out


@register_lowering(aten.unbind.int)
def unbind(x: TensorBox, dim: int = 0) -> list[TensorBox]:
    dim = normalize_dim(dim, len(x.get_size()))
    return [select(x, dim, i) for i in range(int(x.get_size()[dim]))]


@register_lowering(aten.alias, aten.detach, aten.lift_fresh)
def alias(x: TensorBox) -> TensorBox:
    return x


@register_lowering(aten.as_strided)
def as_strided(
    x: TensorBox, size: Sequence[Any], stride: Sequence[Any], storage_offset: Any = None
) -> TensorBox:
    base = realize_strided(x)
    buffer = base.buffer if isinstance(base, ReinterpretView) else base
    own_offset = base.layout.offset
    offset = own_offset if storage_offset is None else sympy.Integer(int(storage_offset))
    layout = FixedLayout(base.get_device(), base.get_dtype(), symbolic(size), symbolic(stride), offset)
    return TensorBox(ReinterpretView(buffer, layout))


# Note [The copying variants of views are copies]: ``view_copy``, ``permute_copy``, ``select_copy``
# and the rest compute the view's values into a new tensor: eager's result never shares memory with
# the input. Lowered as the view itself (as they were until the fifteenth session), a graph output
# ``permute_copy(x)`` was a view of the input ``x``, and an in-place update of either showed in the
# other (``torch.permute_copy`` under kiln.compile returned a tensor aliasing its argument). Each is
# the view read through a new, lazy Pointwise: inside the graph it inlines into its readers like
# the view (no kernel, no buffer); only where it is realized (a graph output) is it a copy.


def _fresh(box: TensorBox) -> TensorBox:
    return TensorBox.create(Pointwise(box.get_device(), box.get_dtype(), box.make_loader(), box.get_size()))


def _copying(view_lowering: Any) -> Any:
    def lower(*args: Any, **kwargs: Any) -> Any:
        out = view_lowering(*args, **kwargs)
        return [_fresh(b) for b in out] if isinstance(out, list) else _fresh(out)

    return lower


for _copy_op, _view_lowering in (
    (aten.view_copy.default, view),
    (aten.permute_copy, permute),
    (aten.transpose_copy.int, transpose),
    (aten.expand_copy.default, expand),
    (aten.unsqueeze_copy, unsqueeze),
    (aten.squeeze_copy, squeeze),
    (aten.slice_copy.Tensor, slice_),
    (aten.select_copy.int, select),
    (aten.split_copy.Tensor, split),
    (aten.as_strided_copy, as_strided),
):
    register_lowering(_copy_op)(_copying(_view_lowering))
