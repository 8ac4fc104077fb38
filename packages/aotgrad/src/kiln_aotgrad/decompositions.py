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
`KEPT_NON_CORE`; `surviving_ops_ok` checks a graph against that contract (loopir lowers exactly
these or calls them as extern kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

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
    }
)


def _var_mean(
    x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    # torch._decomp's entry goes through prims; two core reductions say the same.
    return (
        aten.var.correction(x, dim, correction=correction, keepdim=keepdim),
        aten.mean.dim(x, dim, keepdim) if dim is not None else aten.mean.default(x),
    )


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


# kiln's own entries.
_KILN: DecompTable = {
    aten.index_add.default: _index_add,
    aten.index_add_.default: _index_add_,
    aten.take.default: _take,
    aten.var_mean.correction: _var_mean,
    aten._efficientzerotensor.default: _efficient_zeros,
    aten.angle.default: _angle,
}


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
        bad.append(str(node.target))
    return bad
