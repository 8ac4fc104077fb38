"""Lowering aten ops to the IR: the registry and the shared machinery.

A lowering is a function with the aten op's signature in which tensors are :class:`TensorBox`
values; it returns TensorBoxes (or tuples/lists of them). Lowerings are found in a table keyed by
``OpOverload`` first and by the overload packet second (:func:`register_lowering`), and
``graph.GraphLowering`` calls them node by node. The families live in ``lowerings/``:
pointwise ops, views, reductions, and memory-shaped ops (cat, pad, indexing, scatter).

Any op without a lowering, and any lowering that declines (raises :class:`Unsupported`), becomes
an :class:`~kiln_loopir.ir.ExternKernel`: at run time the aten op itself is called on realized
buffers. Output metadata comes from the fx node (``meta["val"]`` or the graph's own meta run), so
the fallback never needs to understand the op.

This module also holds :func:`make_pointwise`: broadcasting, scalars, and type promotion done
the way eager does it (compute in ``elementwise_dtypes``' computation dtype, round once to the
result dtype), so one op's output matches eager bit for bit where the math library agrees.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from . import sizevars
from .indexing import Expr
from .ir import (
    Buffer,
    ExternKernel,
    ExternOutput,
    Index,
    Pointwise,
    ReinterpretView,
    TensorBox,
    realize_strided,
)
from .layout import FixedLayout, fixed_from_tensor, symbolic
from .sizevars import UnbackedSource
from .virtualized import current_graph, ops

aten = torch.ops.aten
passes_log = logging.getLogger("kiln.loopir.passes")
Kind = ELEMENTWISE_TYPE_PROMOTION_KIND
LoweringFn = Callable[..., Any]
OpKey = torch._ops.OpOverload | torch._ops.OpOverloadPacket

LOWERINGS: dict[OpKey, LoweringFn] = {}


class Unsupported(Exception):
    """Raised by a lowering that cannot handle these arguments: the op falls back to extern."""


def register_lowering(*keys: OpKey) -> Callable[[LoweringFn], LoweringFn]:
    """Register ``fn`` as the lowering of each aten overload or overload packet in ``keys``."""

    def wrap(fn: LoweringFn) -> LoweringFn:
        for key in keys:
            LOWERINGS[key] = fn
        return fn

    return wrap


def find_lowering(target: object) -> LoweringFn | None:
    """The lowering for an fx call target, by overload then by packet."""
    _ensure_registered()
    if isinstance(target, torch._ops.OpOverload):
        found = LOWERINGS.get(target)
        if found is None:
            found = LOWERINGS.get(target.overloadpacket)
        return found
    return None


_registered = False


def _ensure_registered() -> None:
    global _registered
    if not _registered:
        _registered = True
        from .lowerings import creation, linalg, memory, pointwise, pooling, reductions, views  # noqa: F401


# --------------------------------------------------------------------------------------------
# helpers shared by the families


def meta_of(value: object) -> object:
    """A meta tensor standing in for a box (for dtype rules); other values pass through."""
    if isinstance(value, TensorBox):
        size = [sizevars.hint(s) for s in value.get_size()]  # the rank decides, not the sizes
        return torch.empty(size, dtype=value.get_dtype(), device="meta")
    if isinstance(value, sympy.Expr) and not value.is_number:  # a symbolic int scalar
        return sizevars.hint(value)
    return value


def broadcast_sizes(*sizes: Sequence[Expr]) -> tuple[Expr, ...]:
    """The broadcast of several shapes (right-aligned; size 1 stretches)."""
    rank = max((len(s) for s in sizes), default=0)
    out: list[Expr] = []
    for i in range(rank):
        dim: Expr = sympy.Integer(1)
        for size in sizes:
            j = i - (rank - len(size))
            if j >= 0 and size[j] != 1:
                # equal expressions in another form (`(s - 2)*(4*s - 8)` against the expanded
                # `4*s**2 - 16*s + 16`, as a flatten and a view spell one size) broadcast
                if dim != 1 and dim != size[j] and sympy.expand(dim - size[j]) != 0:
                    raise RuntimeError(f"shapes {sizes} do not broadcast")
                dim = size[j]
        out.append(dim)
    return tuple(out)


# Note [Stretched sizes the trace proved 1]: a size that is 1 only by the guards of the trace
# (`x.chunk(3)[2]` of an (s0,) input is `s0 - 2*((s0 + 2)//3)` long, 1 for s0 = 3, a guard says
# so) is no literal 1, and an expand of it to (s1,) read element i of the chunk, past its end,
# where eager stretches its one element (`x1.copy_(x0.chunk(3)[2])` under dynamic=True wrote
# other memory into x1: test_alias_fuzz.py --pad-mm --dynamic true seed 20677). The trace
# checked broadcasting at the sizes it was called with (the hints) and guarded what it decided,
# so a dim whose size is 1 at its hint, stretched to a size that is not, is stretched for every
# call the graph serves.
def stretched(own: Expr, target: Expr) -> bool:
    """Whether a dim of size ``own`` is stretched to ``target`` by a broadcast or an expand (Note
    [Stretched sizes the trace proved 1])."""
    if own == 1:
        return True
    if own == target or not isinstance(own, sympy.Expr) or not own.free_symbols:
        return False
    return sizevars.hint(own) == 1 and sizevars.hint(target) != 1


def broadcast_loader(box: TensorBox, size: Sequence[Expr]) -> Callable[[Index], Any]:
    """Load ``box`` as if expanded to ``size``."""
    own = box.get_size()
    inner = box.make_loader()
    skip = len(size) - len(own)
    stretch = [stretched(own[i], size[i + skip]) for i in range(len(own))]

    def load(index: Index) -> Any:
        picked = [sympy.Integer(0) if stretch[i] else index[i + skip] for i in range(len(own))]
        return inner(picked)

    return load


def device_of(*values: object) -> torch.device:
    for v in values:
        if isinstance(v, TensorBox):
            return v.get_device()
    return torch.device("cpu")


def make_pointwise(
    compute: Callable[..., Any],
    kind: ELEMENTWISE_TYPE_PROMOTION_KIND = Kind.DEFAULT,
    *,
    compute_dtype: torch.dtype | None = None,
    result_dtype: torch.dtype | None = None,
) -> Callable[..., TensorBox]:
    """A lowering that applies ``compute`` elementwise to its tensor and scalar arguments.

    Each argument is loaded (broadcast), converted to the computation dtype, passed to
    ``compute`` as an ops value, and the result converted to the result dtype.
    """

    def lower(*args: Any) -> TensorBox:
        boxes = [a for a in args if isinstance(a, TensorBox)]
        if not boxes:
            raise Unsupported("pointwise op without tensor arguments")
        size = broadcast_sizes(*[b.get_size() for b in boxes])
        c_dtype, r_dtype = elementwise_dtypes(*[meta_of(a) for a in args], type_promotion_kind=kind)
        c_dtype = compute_dtype or c_dtype
        r_dtype = result_dtype or r_dtype
        # Note [Operands rounded to a half common dtype]: eager converts each tensor operand to
        # the common dtype before its kernel widens it to float32, so an int32 or float32
        # operand of a float16 computation is first rounded to float16 (65536 is inf there:
        # `half / int32` gave 7.6e-06 where eager gives 0). Python numbers keep their value.
        common, _ = elementwise_dtypes(*[meta_of(a) for a in args], type_promotion_kind=Kind.NO_OPMATH)
        via = common if common in (torch.float16, torch.bfloat16) and common != c_dtype else None
        loaders: list[Callable[[Index], Any]] = []
        for a in args:
            if isinstance(a, TensorBox):
                load = broadcast_loader(a, size)
                if via is not None and a.get_dtype() != via:
                    load = _rounded_through(load, via)
                loaders.append(load)
            else:
                loaders.append(_constant_loader(a, c_dtype))

        def inner(index: Index) -> Any:
            values = [ops.to_dtype(load(index), c_dtype) for load in loaders]
            return ops.to_dtype(compute(*values), r_dtype)

        return TensorBox.create(Pointwise(device_of(*args), r_dtype, inner, size))

    return lower


def _rounded_through(load: Callable[[Index], Any], dtype: torch.dtype) -> Callable[[Index], Any]:
    return lambda index: ops.to_dtype(load(index), dtype)


def _constant_loader(value: object, dtype: torch.dtype) -> Callable[[Index], Any]:
    if isinstance(value, sympy.Expr) and not value.is_number:
        # Note [Symbolic sizes in loopir]: a size used as a scalar (`x + x.size(0)`)
        def load_size(index: Index) -> Any:
            return ops.index_expr(value, dtype)

        return load_size

    def load(index: Index) -> Any:
        return ops.constant(value, dtype)

    return load


def pointwise_from(box: TensorBox, fn: Callable[[Any], Any], dtype: torch.dtype) -> TensorBox:
    """A new lazy Pointwise of the same shape as ``box``: ``fn(box[index])``."""
    load = box.make_loader()

    def inner(index: Index) -> Any:
        return fn(load(index))

    return TensorBox.create(Pointwise(box.get_device(), dtype, inner, box.get_size()))


def copy_with_strides(box: TensorBox, strides: Sequence[Any]) -> TensorBox:
    """A realized copy of ``box`` laid out with ``strides`` (one pointwise kernel)."""
    copy = pointwise_from(box, lambda v: v, box.get_dtype())
    storage = copy.storage()
    assert storage is not None
    # SymInt strides (an eager output's under dynamic shapes) by their expression, never int():
    # that would guard on the hint (Note [Symbolic sizes in loopir])
    storage.stride_hint = symbolic(strides)
    storage.realize()
    return copy


# aten ops that address their (first) input's storage with explicit strides and offset: they
# need its layout eager's (Notes [Readers of a GEMM's strides] in passes/pad_mm.py, [Storage
# readers of NHWC values] in graph.py)
READS_STORAGE = frozenset(
    {
        aten.as_strided.default,
        aten.as_strided_copy.default,
        aten.as_strided_scatter.default,
    }
)


def is_view_op(target: Any) -> bool:
    """Whether ``target`` is an aten overload whose result views its first input (torch's
    ``is_view`` tag): the walks of Notes [Readers of a GEMM's strides] and [Storage readers of
    NHWC values]."""
    return isinstance(target, torch._ops.OpOverload) and target.is_view


# aten ops that only reinterpret their input's memory (for analyses that look through views)
VIEW_OPS = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.permute.default,
        aten.transpose.int,
        aten.t.default,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.expand.default,
        aten.slice.Tensor,
    }
)


def to_dtype(box: TensorBox, dtype: torch.dtype) -> TensorBox:
    """``box`` converted to ``dtype`` (itself when already so)."""
    if box.get_dtype() == dtype:
        return box
    return pointwise_from(box, lambda v: ops.to_dtype(v, dtype), dtype)


# Note [Python numbers that do not fit the dtype]: ops that take a Python number and convert it
# to the tensor's dtype themselves (clamp's bounds, masked_fill's and full's value, where's
# scalar operand, so also threshold and fill_, which aotgrad rewrites into where and full_like)
# raise in eager when it does not fit ("value cannot be converted to type int8_t without
# overflow": `x.clamp(min=300)` of an int8 x; 1e300 for float32, 70000 for float16), where a
# kernel's constant would wrap or round (clamp returned 44, 300 mod 256). The check is eager's
# rule for its checked conversion: an integer dtype takes numbers in its range (an unsigned one
# also down to minus its maximum, which wrap), a float one anything up to its largest finite
# value and the infinities and NaN, bool anything. An op whose number does not fit is left to
# eager's kernel (an extern call, `Unsupported`), which raises the error at run time. Arithmetic
# (`x + 300`) converts its number unchecked in eager too, and is not checked. A half-type fill
# (`full`, `full_like`, `fill_`, `scalar_tensor`) whose number is beyond the half type's range
# is left to eager's kernel too, whose check depends on the element count (one element gives
# inf, two or more raise; a fill of two gave inf before the twenty-eighth session). Not matched:
# `threshold`, which aotgrad rewrites into a `where` computed in float32 for a float value and
# converted back, wraps as before.
def scalar_fits(value: object, dtype: torch.dtype) -> bool:
    """Does eager's checked conversion of the Python number ``value`` to ``dtype`` succeed?"""
    if isinstance(value, bool) or dtype == torch.bool or not isinstance(value, (int, float)):
        return True
    if dtype.is_floating_point:
        return not math.isfinite(value) or abs(value) <= torch.finfo(dtype).max
    if dtype.is_complex:
        return True
    info = torch.iinfo(dtype)
    if isinstance(value, float) and not math.isfinite(value):
        return False
    low = -info.max if info.min == 0 and isinstance(value, int) else info.min
    return low <= value <= info.max


def check_scalar(value: object, dtype: torch.dtype) -> None:
    """Note [Python numbers that do not fit the dtype]: ``Unsupported`` (eager's kernel runs, and
    raises) when eager's conversion of ``value`` to ``dtype`` would."""
    if not scalar_fits(value, dtype):
        raise Unsupported(f"{value!r} does not fit {dtype}: eager's kernel raises")


# Note [Dtypes eager's kernel does not take]: eager's CPU kernels are instantiated for some
# dtypes only, and refuse the others whatever the values ("pow" not implemented for 'Bool',
# `abs`/`clamp`/`remainder` of bools, `frac` of ints, a bitwise op of an empty float tensor);
# the meta kernels do not check, and a lowering computes the generic arithmetic, so kiln
# returned values where eager raises. Before a pointwise op of CPU tensors is lowered, eager's
# own kernel is asked once per (op, argument dtypes, Python numbers), on one-element tensors of
# those dtypes: a NotImplementedError leaves the op to eager's kernel (an extern call), which
# raises it at run time. A RuntimeError leaves it there too where the same call on tensors of
# ones raises one as well (`relu` of bools: "Boolean inputs not supported", a RuntimeError; an
# integer division, which refuses zeros only, does not); any other outcome lowers as before.
_REFUSED: dict[tuple[Any, ...], str | None] = {}


def eager_refuses(target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Note [Dtypes eager's kernel does not take]: eager's NotImplementedError for ``target``
    on ``args`` (fx nodes, whose ``val`` is a tensor, or Python values), or None."""
    tags = getattr(target, "tags", ())
    schema = getattr(target, "_schema", None)
    if torch.Tag.pointwise not in tags or torch.Tag.nondeterministic_seeded in tags:
        return None
    if schema is None or schema.is_mutable:
        return None
    probe: list[Any] = []
    key: list[Any] = [target]
    for arg in args:
        value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
        if isinstance(arg, torch.fx.Node) and not isinstance(value, torch.Tensor):
            return None  # a node of unknown value: nothing to probe with
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                return None
            probe.append(torch.zeros(1, dtype=value.dtype))
            key.append(value.dtype)
        elif isinstance(value, (bool, int, float, complex)) or value is None:
            probe.append(value)
            key.append((type(value), value))
        else:
            return None
    for name, value in kwargs.items():
        if isinstance(value, (torch.Tensor, torch.fx.Node, list, tuple, dict)):
            return None
        key.append((name, str(value)))
    hashable = tuple(key)
    if hashable not in _REFUSED:
        try:
            with torch.no_grad():
                target(*probe, **kwargs)
            _REFUSED[hashable] = None
        except NotImplementedError as exc:
            _REFUSED[hashable] = str(exc).splitlines()[0]
        except RuntimeError:
            _REFUSED[hashable] = _refused_on_ones(target, probe, kwargs)
        except Exception:
            _REFUSED[hashable] = None
    return _REFUSED[hashable]


def _refused_on_ones(target: Any, probe: list[Any], kwargs: dict[str, Any]) -> str | None:
    """Note [Dtypes eager's kernel does not take]: eager's error for ``target`` on one-element
    tensors of ones (``probe``'s zeros replaced), or None where that call succeeds."""
    ones = [torch.ones_like(p) if isinstance(p, torch.Tensor) else p for p in probe]
    try:
        with torch.no_grad():
            target(*ones, **kwargs)
    except RuntimeError as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    except Exception:
        return None
    return None


def opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype eager computes in for ``dtype`` (float32 for the half types)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def normalize_dim(dim: int, rank: int) -> int:
    return dim + max(rank, 1) if dim < 0 else dim


# --------------------------------------------------------------------------------------------
# the extern fallback


# Note [Aligned attention biases]: the memory-efficient and cuDNN attention kernels read the
# bias (the additive mask) with vector loads and refuse one whose strides other than the last are
# not multiples of 8 elements ("attn_bias is not correctly aligned"). Eager SDPA pads such a mask
# itself before calling them (a pad of the last dim to a multiple of 8, sliced back): a layout
# that only the padded storage gives. loopir chooses buffers' layouts on its own (a view of a pad
# may be realized as a copy, a size-1 dim's stride is normalized), so the bias argument of these
# ops is checked at lowering: unless its layout is provably aligned it is copied into one (the last
# dim padded to a multiple of 8, dims that were expanded (stride 0) kept expanded, not
# materialized), as inductor's SDPA stride constraint does. The copy never changes a value.
ATTENTION_BIAS_ALIGNMENT = 8
ALIGNED_BIAS_ARGS: dict[Any, int] = {
    aten._scaled_dot_product_efficient_attention.default: 3,
    aten._scaled_dot_product_efficient_attention_backward.default: 4,
    aten._scaled_dot_product_cudnn_attention.default: 3,
    aten._efficient_attention_forward.default: 3,
    aten._efficient_attention_backward.default: 4,
}


# Note [Aligned attention operands]: the same kernels read the query, key and value with vector
# loads too, and pick their kernel by the operands' alignment: with a stride (but the last) or an
# offset that is not a multiple of 8 elements, cutlass's memory-efficient attention may find no
# kernel at all ("cutlassF: no kernel found to launch!", seen on LeViT's split heads on the H200,
# which made the whole graph fall back to eager). Eager chooses the kernel per call from the
# tensors it is given; kiln chose it when tracing, from eager's layouts, and loopir may hand the
# op other ones. So the forward ops' query, key and value are aligned as their bias is (a copy
# only where the layout is not provably aligned). The backward ops are left as they are: their
# output-gradient and output arguments need one particular stride order, which a copy here
# would not keep.
#
# The attention pass (Note [Attention rewrite]) emits the public ``scaled_dot_product_attention``,
# which picks its kernel at run time from the tensors loopir hands it; its own checks look at the
# head dims and the last stride but not at the other strides, and cutlass then rejects every
# kernel when a head or row stride is not a multiple of 8 (LeViT's rewritten attention on the
# H200 still fell back after the private ops were aligned). So on a CUDA graph its query, key,
# value and mask are aligned too (``ALIGNED_ON_CUDA``); on the CPU its kernels read any layout, and
# no copy is made.
ALIGNED_OPERAND_ARGS: dict[Any, tuple[int, ...]] = {
    aten._scaled_dot_product_efficient_attention.default: (0, 1, 2),
    aten._scaled_dot_product_flash_attention.default: (0, 1, 2),
    aten._scaled_dot_product_cudnn_attention.default: (0, 1, 2),
    aten._efficient_attention_forward.default: (0, 1, 2),
    aten._flash_attention_forward.default: (0, 1, 2),
}
# ops aligned only where the graph runs on CUDA: (bias argument, operand arguments)
ALIGNED_ON_CUDA: dict[Any, tuple[int, tuple[int, ...]]] = {
    aten.scaled_dot_product_attention.default: (3, (0, 1, 2)),
}


def aligned_args(op: Any, device: torch.device) -> tuple[int | None, tuple[int, ...]]:
    """The bias argument and the operand arguments of ``op`` that reach it aligned on ``device``
    (Note [Aligned attention biases], Note [Aligned attention operands])."""
    if op in ALIGNED_ON_CUDA:
        return ALIGNED_ON_CUDA[op] if device.type == "cuda" else (None, ())
    return ALIGNED_BIAS_ARGS.get(op), ALIGNED_OPERAND_ARGS.get(op, ())


def _multiple_of(expr: Expr, n: int) -> bool:
    """Whether ``expr`` is provably a multiple of ``n`` (for every value of its symbols)."""
    return bool(sympy.Mod(sympy.sympify(expr), n) == 0)


def aligned_bias(
    value: TensorBox, alignment: int = ATTENTION_BIAS_ALIGNMENT, what: str = "attention bias"
) -> Any:
    """``value`` as memory whose strides (but the last, 1) and offset are multiples of
    ``alignment`` (Note [Aligned attention biases], Note [Aligned attention operands])."""
    realized = realize_strided(value)
    layout = realized.layout
    size, stride = layout.size, layout.stride
    if not size:
        return realized
    if any(n == 1 and not _multiple_of(s, alignment) for n, s in zip(size[:-1], stride[:-1], strict=False)):
        # a size-1 dim's stride is never followed: 0 says the same and is aligned (no copy)
        stride = (
            *(sympy.Integer(0) if n == 1 else s for n, s in zip(size[:-1], stride[:-1], strict=False)),
            stride[-1],
        )
        buffer = realized.buffer if isinstance(realized, ReinterpretView) else realized
        layout = FixedLayout(layout.device, layout.dtype, size, stride, layout.offset)
        realized = ReinterpretView(buffer, layout)
    if (
        stride[-1] == 1
        and all(_multiple_of(s, alignment) for s in stride[:-1])
        and _multiple_of(layout.offset, alignment)
    ):
        return realized
    expanded = [i for i, (n, s) in enumerate(zip(size, stride, strict=True)) if s == 0 and n != 1]
    base = [sympy.Integer(1) if i in expanded else n for i, n in enumerate(size)]
    last = base[-1]
    # the last dim rounded up to a multiple of the alignment: the row stride
    padded = last + sympy.Mod(-last, alignment)
    strides: list[Expr] = [sympy.Integer(1)] * len(base)
    if len(base) >= 2:
        strides[-2] = padded
        for i in range(len(base) - 3, -1, -1):
            strides[i] = strides[i + 1] * base[i + 1]
    load = value.make_loader()

    def inner(index: Index) -> Any:
        return load([sympy.Integer(0) if i in expanded else v for i, v in enumerate(index)])

    one_copy = TensorBox.create(Pointwise(value.get_device(), value.get_dtype(), inner, tuple(base)))
    storage = copy_with_strides(one_copy, strides).storage()
    assert storage is not None and isinstance(storage.data, Buffer)
    buffer = storage.data
    view_strides = tuple(sympy.Integer(0) if i in expanded else s for i, s in enumerate(strides))
    passes_log.info(
        "%s %s: strides %s not provably multiples of %d; copied with strides %s "
        "(Note [Aligned attention biases])",
        what,
        buffer.name,
        list(stride),
        alignment,
        list(view_strides),
    )
    return ReinterpretView(buffer, FixedLayout(layout.device, layout.dtype, tuple(size), view_strides))


# Note [Random ops read eager's layouts]: kiln's compiled graphs call the random operators eager
# calls, in eager's order, so one generator state gives eager's values (aotgrad's Note [RNG in
# compiled graphs]). But a random op fills its result in *memory* order: `randn_like` of an NHWC
# tensor puts the same numbers at other (n, c, h, w) positions than `randn_like` of an NCHW one,
# and so do dropout's and bernoulli's masks. loopir chooses layouts of its own (the layout pass's
# channels-last convolutions, a buffer realized in another order), so a random op handed such a
# value gave other values than eager: the VAE of the breadth suite, whose `randn_like(std)` read
# an NHWC `std`, returned a reconstruction 0.09 off eager's at the same seed. Each tensor argument
# of a seeded random op (`torch.Tag.nondeterministic_seeded`) of the result's shape is therefore
# given in the strides of eager's result (a copy only where its layout differs on a dim of more
# than one element); the result itself keeps eager's strides as every extern output does.
# Only ops that draw one number per element of such an argument (:data:`_ELEMENTWISE_RANDOM`):
# attention and RNN operators carry the same tag for their dropout, but draw nothing in their
# operands' memory order, and copying their strided query/key/value views into eager's output
# strides added a copy kernel before every attention (the symbolic-GEMM views test caught it).
_ELEMENTWISE_RANDOM = frozenset(
    {
        "aten::bernoulli",
        "aten::native_dropout",
        "aten::_fused_dropout",
        "aten::dropout",
        "aten::alpha_dropout",
        "aten::feature_alpha_dropout",
        "aten::feature_dropout",
        "aten::rand_like",
        "aten::randn_like",
        "aten::randint_like",
        "aten::normal",
        "aten::uniform",
        "aten::exponential",
        "aten::geometric",
        "aten::cauchy",
        "aten::log_normal",
        "aten::poisson",
        "aten::_standard_gamma",
        "aten::rrelu_with_noise",
        "aten::rrelu_with_noise_functional",
    }
)


def _draws_per_element(op: Any) -> bool:
    """Is ``op`` a seeded random op that draws its numbers in its tensor argument's memory order
    (Note [Random ops read eager's layouts])?"""
    if torch.Tag.nondeterministic_seeded not in getattr(op, "tags", ()):
        return False
    schema = getattr(op, "_schema", None)
    return schema is not None and str(schema.name).rstrip("_") in _ELEMENTWISE_RANDOM


def _eager_layout_for_random(op: Any, value: TensorBox, meta: Any) -> Any:
    """``value`` realized for a seeded random ``op`` whose eager result (or tuple of results) is
    ``meta``."""
    realized = realize_strided(value)
    shape = tuple(sympy.sympify(n) for n in value.get_size())
    results = (
        [meta] if isinstance(meta, torch.Tensor) else list(meta) if isinstance(meta, list | tuple) else []
    )
    results = [t for t in results if isinstance(t, torch.Tensor)]
    like = next((t for t in results if symbolic(t.shape) == shape), None)  # dropout: (result, mask)
    if like is None:
        return realized
    want = symbolic(like.stride())
    have = realized.layout.stride
    if all(n == 1 or sympy.sympify(a) == b for n, a, b in zip(shape, have, want, strict=True)):
        return realized
    passes_log.info(
        "random op %s: an argument with strides %s copied to eager's %s (Note [Random ops read eager's layouts])",
        op,
        list(have),
        list(want),
    )
    return realize_strided(copy_with_strides(value, want))


def fallback(op: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], meta: Any) -> Any:
    """Call ``op`` at run time on realized buffers; ``meta`` is the fx node's output value."""
    graph = current_graph()
    name = graph.new_buffer_name("extern")

    def to_ir(value: Any) -> Any:
        if isinstance(value, TensorBox):
            return realize_strided(value)
        if isinstance(value, list | tuple):
            return type(value)(to_ir(v) for v in value)
        return value

    bias, operands = aligned_args(op, graph.device)
    if _draws_per_element(op):
        args = [_eager_layout_for_random(op, a, meta) if isinstance(a, TensorBox) else a for a in args]
    ir_args = tuple(
        aligned_bias(a, what="attention operand" if i in operands else "attention bias")
        if (i == bias or i in operands) and isinstance(a, TensorBox)
        else to_ir(a)
        for i, a in enumerate(args)
    )
    ir_kwargs = {k: to_ir(v) for k, v in kwargs.items()}
    outputs: list[ExternOutput] = []

    def wrap(value: Any, path: tuple[int, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            out = ExternOutput(
                graph.new_buffer_name(), fixed_from_tensor(value, graph.device), kernel=name, path=path
            )
            outputs.append(out)
            return TensorBox.create(out)
        if isinstance(value, list | tuple):
            return type(value)(wrap(v, (*path, i)) for i, v in enumerate(value))
        return value

    result = wrap(meta, ())
    if isinstance(result, torch.SymInt):  # an `.item()` (Note [Unbacked sizes in loopir])
        result = graph.sizevars.define_unbacked(result, UnbackedSource(name, (), "value"))
    for out in outputs:
        val = meta
        for i in out.path:
            val = val[i]
        for d, n in enumerate(val.shape):
            if isinstance(n, torch.SymInt):
                graph.sizevars.define_unbacked(n, UnbackedSource(name, out.path, "size", d))
    graph.register_operation(ExternKernel(name, op, ir_args, ir_kwargs, tuple(outputs)))
    return result
