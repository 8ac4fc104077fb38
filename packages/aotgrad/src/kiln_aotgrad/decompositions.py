"""The decomposition table: which aten operators survive into kiln's graphs.

The tracer (tracer.py) looks every operator that reaches it up in one table. An entry is a
Python function written in terms of other torch operators; the tracer runs it under its own
dispatch mode, so the operators it calls are looked up again, recursively, until only operators
without an entry remain (a fixed point). An operator whose entry is already being expanded further
up the stack is recorded as is, so a table entry that calls its own operator cannot loop.
Operators registered as CompositeImplicitAutograd that reach the tracer are expanded through their
C++ composite kernel (`OpOverload.decompose`) the same way.

The table is `torch._decomp`'s core-ATen table (operator semantics that PyTorch maintains) plus
kiln's choices:
- *added* (decomposed although core ATen keeps them): `native_layer_norm`, `native_group_norm`,
  `gelu`, the batch-norm family. They become pointwise ops and small reductions, which loopir
  fuses, and which the min-cut partitioner may recompute in the backward instead of saving.
- *removed* (kept although the core table would expand them): CPU flash attention forward and
  backward (extern kernels), `empty_like`, and random operators (`bernoulli`, `native_dropout`,
  `rand_like`...). Note [RNG in compiled graphs]: kiln does not functionalize
  the RNG state; a compiled forward calls the same random operators, in the same order, as eager
  does, so the same generator state gives the same mask. Random nodes are banned from recompute
  (partition.py), so the backward always reads the saved mask.

What survives is, by construction, "core ATen" (`torch.Tag.core`) plus the operators listed in
`KEPT_NON_CORE` and those eager's kernel refuses (Note [Decompositions keep eager's errors]); `surviving_ops_ok` checks a graph against that contract (loopir lowers exactly
these or calls them as extern kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch._decomp.decompositions
from kiln_symbolic import is_symbolic
from torch._decomp import core_aten_decompositions, get_decompositions
from torch.utils._mode_utils import no_dispatch

aten = torch.ops.aten

DecompTable = dict[Any, Callable[..., Any]]

# Decomposed by kiln on top of the core table.
_ADDED = [
    aten.native_layer_norm,
    aten.native_group_norm,
    aten.gelu,
    aten.native_batch_norm,
    aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training,
    aten._batch_norm_with_update,
    aten._batch_norm_no_update,
    aten.new_empty_strided,
    aten.empty_permuted,
    aten.linalg_vector_norm,
    aten.clamp_min,
    aten.clamp_max,
]

# Never decomposed: see Note [RNG in compiled graphs].
_REMOVED = [
    aten.bernoulli,
    aten.native_dropout,
    aten.rand_like,
    aten.randn_like,
    aten.uniform,
    aten.normal,
    # CPU flash attention: kept whole, forward and backward (extern kernels for loopir); the
    # table's forward entry does not produce the layout its backward entry expects.
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    # Factories: kept (core ATen allows `empty_like`; its entry yields non-core `empty_permuted`).
    aten.empty_like,
]

# Operators that may survive although they carry no `core` tag: random ops kept on purpose,
# functional forms of mutations that functionalize.py emits, and pieces of backward formulas.
KEPT_NON_CORE = frozenset(
    {
        "aten::bernoulli",
        "aten::rand_like",
        "aten::randn_like",
        "aten::uniform",
        "aten::normal",
        "aten::native_dropout",
        "aten::copy",
        "aten::zero",
        "aten::fill",
        "aten::_unsafe_view",
        "aten::lift_fresh_copy",
        "aten::alias",
        "aten::t",
        "aten::_to_copy",
        "aten::squeeze",
        "aten::unbind",
        "aten::split",
        "aten::split_with_sizes",
        "aten::empty_like",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        # complex values (extern kernels in kiln_loopir): the tracer records conjugate views as
        # `conj_physical` (Note [Conjugate and negative views are traced as computations] in
        # tracer.py), and `real`/`imag` of a complex tensor are `view_as_real`
        "aten::conj_physical",
        "aten::view_as_real",
        # run-time assertions, kept for their effect (extern kernels in kiln_loopir)
        "aten::_assert_async",
        "aten::_assert_scalar",
    }
)


def _var_mean(
    x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    # torch._decomp's entry goes through prims; two core reductions say the same. A mean over
    # every dim (dim None) with keepdim keeps each as a size-1 dim, as eager's var_mean does:
    # mean.default has no keepdim (std_mean(x, keepdim=True)'s mean came back 0-d)
    mean = aten.mean.default(x) if dim is None and not keepdim else aten.mean.dim(x, dim, keepdim)
    return aten.var.correction(x, dim, correction=correction, keepdim=keepdim), mean


def _efficient_zeros(
    size: list[int], *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> torch.Tensor:
    return aten.full.default(size, 0, dtype=dtype or torch.float32, device=device)


def _angle(x: torch.Tensor) -> Any:
    # Real inputs only: pi where x < 0, 0 elsewhere, NaN stays NaN.
    if x.is_complex():
        return NotImplemented
    pi = aten.where.self(
        aten.lt.Scalar(x, 0), aten.full_like.default(x, torch.pi), aten.full_like.default(x, 0)
    )
    return aten.where.self(aten.isnan.default(x), x, pi)


def _take(x: torch.Tensor, index: torch.Tensor) -> Any:
    # torch._decomp's entry indexes with `flat[index]`, which reads a 0-dim index as a Python
    # integer (`.item()`: data the tracer does not have); aten.index takes it as a tensor.
    return aten.index.Tensor(aten.reshape.default(x, [-1]), [index])


_HALF = (torch.bfloat16, torch.float16)
_CORE_INDEX_ADD = get_decompositions([aten.index_add.default])


def _index_add(
    x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, alpha: Any = 1
) -> Any:
    # Note [Accumulating scatters in low precision] (kiln_loopir's lowerings/memory.py): eager
    # sums a half-precision index_add in float32 and rounds once (more than one dimension; one
    # dimension rounds each add, and float32 is then the nearer); torch._decomp's entry is an
    # index_put(accumulate=True) in the element type, rounding each add.
    core = _CORE_INDEX_ADD[aten.index_add.default]
    if x.dtype not in _HALF:
        return core(x, dim, index, source, alpha=alpha)
    wide = core(
        aten._to_copy.default(x, dtype=torch.float32),
        dim,
        index,
        aten._to_copy.default(source, dtype=torch.float32),
        alpha=alpha,
    )
    return aten._to_copy.default(wide, dtype=x.dtype)


def _index_add_(
    x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, alpha: Any = 1
) -> Any:
    return aten.copy_.default(x, _index_add(x, dim, index, source, alpha=alpha))


# Note [Batch norm under symbolic sizes]: torch's entries for the training batch-norm family
# (`native_batch_norm`, `_native_batch_norm_legit`, `_batch_norm_with_update` and their functional
# forms) scale the biased variance by `n / (n - 1)` for the running variance, where `n` is the
# element count per channel: under symbolic sizes that is a SymFloat, which no graph can carry.
# The entry then failed half-way, after it had written the new running mean, and the operator was
# kept whole (Note [One op kept when its decomposition fails]) with that half-updated mean as its
# argument: the running mean moved twice a step under `dynamic=True` (issue 17; a wrong answer,
# caught by a probe of BatchNorm training at varying batch sizes). Here, when the input has a
# symbolic size and the op trains, kiln's own entry scales by integers instead (`var * n / (n - 1)`,
# n a SymInt, no float of sizes in the graph) and otherwise does what torch's entries do. Static
# shapes keep torch's entries.
def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _HALF else dtype


def _symbolic_shape(x: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) and is_symbolic(s) for s in x.shape)


def _bn_train(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    momentum: float,
    eps: float,
    functional: bool,
) -> tuple[Any, Any, Any, Any, Any]:
    dims = [0, *range(2, x.dim())]
    per_channel = [1, -1] + [1] * (x.dim() - 2)
    wide = aten._to_copy.default(x, dtype=_acc_dtype(x.dtype))
    biased = aten.var.correction(wide, dims, correction=0, keepdim=True)
    mean = aten.mean.dim(wide, dims, True)
    rstd = aten.rsqrt.default(aten.add.Tensor(biased, eps))
    out = aten.mul.Tensor(aten.sub.Tensor(wide, mean), rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, aten.view.default(weight, per_channel))
    if bias is not None:
        out = aten.add.Tensor(out, aten.view.default(bias, per_channel))
    save_mean = aten.squeeze.dims(mean, dims)
    save_rstd = aten.squeeze.dims(rstd, dims)
    new_mean = new_var = None
    if running_mean is not None:
        new_mean = aten.add.Tensor(
            aten.mul.Tensor(save_mean, momentum), aten.mul.Tensor(running_mean, 1 - momentum)
        )
        if not functional:
            aten.copy_.default(running_mean, new_mean)
    if running_var is not None:
        count = x.numel() // x.shape[1]  # a SymInt: elements per channel
        unbiased = aten.div.Tensor(aten.mul.Tensor(aten.squeeze.dims(biased, dims), count), count - 1)
        new_var = aten.add.Tensor(
            aten.mul.Tensor(unbiased, momentum), aten.mul.Tensor(running_var, 1 - momentum)
        )
        if not functional:
            aten.copy_.default(running_var, new_var)
    if x.device.type == "cpu":  # eager's CPU kernel saves the statistics in the input's dtype
        save_mean = aten._to_copy.default(save_mean, dtype=x.dtype)
        save_rstd = aten._to_copy.default(save_rstd, dtype=x.dtype)
    return aten._to_copy.default(out, dtype=x.dtype), save_mean, save_rstd, new_mean, new_var


def _bn_reserve(x: torch.Tensor, *args: Any) -> Any:
    reserve = getattr(torch._decomp.decompositions, "_get_batch_norm_reserve_tensor", None)
    if reserve is not None:
        return reserve(x, *args, training=True)
    return aten.empty.memory_format([0], dtype=torch.uint8, device=x.device)


def _bn_symbolic_entries() -> DecompTable:
    torch_entries = get_decompositions(
        [
            aten.native_batch_norm.default,
            aten._native_batch_norm_legit.default,
            aten._native_batch_norm_legit_functional.default,
            aten._batch_norm_with_update.default,
            aten._batch_norm_with_update_functional.default,
        ]
    )

    def with_training_arg(op: Any, functional: bool) -> Callable[..., Any]:
        def entry(
            x: Any, w: Any, b: Any, rm: Any, rv: Any, training: bool, momentum: float, eps: float
        ) -> Any:
            if not (training and _symbolic_shape(x)):
                return torch_entries[op](x, w, b, rm, rv, training, momentum, eps)
            out, mean, rstd, new_mean, new_var = _bn_train(x, w, b, rm, rv, momentum, eps, functional)
            return (out, mean, rstd, new_mean, new_var) if functional else (out, mean, rstd)

        return entry

    def with_update(op: Any, functional: bool) -> Callable[..., Any]:
        def entry(x: Any, w: Any, b: Any, rm: Any, rv: Any, momentum: float, eps: float) -> Any:
            if not _symbolic_shape(x):
                return torch_entries[op](x, w, b, rm, rv, momentum, eps)
            out, mean, rstd, new_mean, new_var = _bn_train(x, w, b, rm, rv, momentum, eps, functional)
            reserve = _bn_reserve(x, w, b, rm, rv, eps)
            return (out, mean, rstd, reserve, new_mean, new_var) if functional else (out, mean, rstd, reserve)

        return entry

    table: DecompTable = {}
    for op, functional in [
        (aten.native_batch_norm.default, False),
        (aten._native_batch_norm_legit.default, False),
        (aten._native_batch_norm_legit_functional.default, True),
    ]:
        if op in torch_entries:
            table[op] = with_training_arg(op, functional)
    for op, functional in [
        (aten._batch_norm_with_update.default, False),
        (aten._batch_norm_with_update_functional.default, True),
    ]:
        if op in torch_entries:
            table[op] = with_update(op, functional)
    return table


# kiln's own entries.
def _as_strided_copy(x: torch.Tensor, size: Any, stride: Any, storage_offset: Any = None) -> Any:
    # Note [as_strided_copy is a view, then a copy]: eager's `as_strided_copy` addresses the
    # input's *storage* as `as_strided` does (an explicit offset counts from the storage's start,
    # whatever offset the input is at). Kept whole, it reached the code generators as a copy of
    # their buffer of the input: for an input that requires grad (traced through a clone at
    # offset 0) at storage offset 3, `as_strided_copy(x, (1,), (1,), 0)` read x's own first
    # element where eager reads the storage's (the OpInfo sweep, --layout mixed --grad: a wrong
    # answer). As the view and a contiguous copy, the view takes the tracer's `as_strided` path,
    # which refuses what lies outside the input's elements and counts the offset from the root
    # (Notes [as_strided within a tensor's own elements], [as_strided reads its root's storage]).
    view = aten.as_strided.default(x, size, stride, storage_offset)
    return aten.clone.default(view, memory_format=torch.contiguous_format)


_KILN: DecompTable = {
    aten.as_strided_copy.default: _as_strided_copy,
    aten.index_add.default: _index_add,
    aten.index_add_.default: _index_add_,
    aten.take.default: _take,
    aten.var_mean.correction: _var_mean,
    aten._efficientzerotensor.default: _efficient_zeros,
    aten.angle.default: _angle,
}


# Note [Decompositions keep eager's errors]: eager's CPU kernels refuse some dtypes and some
# Python numbers whatever the values (`frac` of an integer tensor: NotImplementedError;
# `masked_fill` of a float16 tensor with 1e6 or `threshold` of an int8 tensor with 300.5:
# "value cannot be converted ... without overflow"), but torch's table entries compute them from
# other ops that take them (`x - trunc(x)`; a `where` of a `scalar_tensor`, which gives inf): kiln
# returned values where eager raises. So before a pointwise operator of CPU tensors is
# decomposed, eager's own kernel is asked once per (op, argument dtypes and ranks, Python
# numbers) on one-element tensors of ones of those dtypes and ranks (ones, not zeros: an integer
# division by zero is a refusal of values, not of the call); where it raises, the operator is
# recorded whole, and kiln_loopir lowers it or, where it sees the same refusal, leaves it to
# eager's kernel, which raises at run time (kiln_loopir's Notes [Dtypes eager's kernel does not
# take] and [Python numbers that do not fit the dtype]). Any other call decomposes as before.
_EAGER_REFUSES: dict[tuple[Any, ...], bool] = {}


def eager_refuses(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Note [Decompositions keep eager's errors]: does eager's kernel of the pointwise ``func``
    raise on one-element CPU tensors of ``args``' dtypes and ranks and ``args``' Python numbers?"""
    if torch.Tag.pointwise not in func.tags or torch.Tag.nondeterministic_seeded in func.tags:
        return False
    key: list[Any] = [func]
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu" or value.layout != torch.strided:
                return False
            key.append((value.dtype, value.dim()))
        elif isinstance(value, (bool, int, float)) or value is None:
            key.append((type(value), value))
        elif isinstance(value, (torch.dtype, torch.memory_format, torch.layout, str)):
            key.append(value)
        else:  # lists, symbolic numbers, devices: not probed
            return False
    hashable = (*key, tuple(kwargs))
    if hashable not in _EAGER_REFUSES:

        def real(v: Any) -> Any:
            return torch.ones((1,) * v.dim(), dtype=v.dtype) if isinstance(v, torch.Tensor) else v

        try:
            with no_dispatch(), torch.no_grad():
                func(*[real(a) for a in args], **{k: real(v) for k, v in kwargs.items()})
            _EAGER_REFUSES[hashable] = False
        except Exception:
            _EAGER_REFUSES[hashable] = True
    return _EAGER_REFUSES[hashable]


# Note [Foreach ops, one tensor at a time]: the functional `_foreach_<op>` overloads (what
# functionalization makes of `clip_grad_norm_`'s `_foreach_mul_` and the foreach optimizers) have
# no entry in torch's tables; each is `<op>` applied to the lists element by element (an argument
# that is a list is indexed, the others are shared), so loopir sees pointwise ops it can fuse.
_FOREACH_SPECIAL: dict[str, Callable[..., Any]] = {
    "norm": lambda x, ord=2, dtype=None: aten.linalg_vector_norm.default(x, ord, dtype=dtype),
    # the foreach forms take the scalar positionally, the elementwise ops as `value=`
    "addcmul": lambda x, a, b, value=1: aten.addcmul.default(x, a, b, value=value),
    "addcdiv": lambda x, a, b, value=1: aten.addcdiv.default(x, a, b, value=value),
}
_FOREACH_SKIPPED = frozenset({"zero", "copy", "max"})  # no same-named elementwise op


def _foreach_entry(per_element: Callable[..., Any]) -> Callable[..., Any]:
    def decomposition(*args: Any, **kwargs: Any) -> list[Any]:
        lengths = {len(a) for a in args if isinstance(a, list | tuple)}
        (n,) = lengths
        return [
            per_element(*[a[i] if isinstance(a, list | tuple) else a for a in args], **kwargs)
            for i in range(n)
        ]

    return decomposition


def _foreach_decompositions() -> DecompTable:
    table: DecompTable = {}
    names = {
        n.split("::")[1].split(".")[0]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::_foreach_")
    }
    for name in sorted(names):
        if name.endswith("_"):
            continue
        base = name[len("_foreach_") :]
        per_element = _FOREACH_SPECIAL.get(base) or getattr(aten, base, None)
        if per_element is None or base in _FOREACH_SKIPPED:
            continue
        packet = getattr(aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            # `scalars` given as one tensor (addcmul/addcdiv.Tensor) is no per-element argument
            per_tensor_scalars = any(
                a.name == "scalars" and str(a.type) == "Tensor" for a in op._schema.arguments
            )
            if not op._schema.is_mutable and not per_tensor_scalars:
                table[op] = _foreach_entry(per_element)
    return table


def _packets_overloads(packets: list[Any]) -> set[Any]:
    out = set()
    for p in packets:
        for name in p.overloads():
            out.add(getattr(p, name))
    return out


def default_decompositions() -> DecompTable:
    """kiln's table: torch's core-ATen table, plus `_ADDED`, minus `_REMOVED`."""
    table: DecompTable = dict(core_aten_decompositions())
    table.update(get_decompositions(_ADDED))
    table.update(_KILN)
    table.update(_bn_symbolic_entries())  # Note [Batch norm under symbolic sizes]
    table.update(_foreach_decompositions())
    for op in _packets_overloads(_REMOVED):
        table.pop(op, None)
    return table


def op_name(target: Any) -> str:
    """`aten::add` for an OpOverload, the function's name otherwise."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return str(schema.name)
    return getattr(target, "__name__", str(target))


def surviving_ops_ok(gm: torch.fx.GraphModule) -> list[str]:
    """The call_function targets of `gm` outside the documented set (empty when all conform)."""
    bad = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if torch.Tag.core in node.target.tags or op_name(node.target) in KEPT_NON_CORE:
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        if eager_refuses(node.target, args, kwargs):  # Note [Decompositions keep eager's errors]
            continue
        bad.append(str(node.target))
    return bad
