"""Constant fakes: small tensors whose values are known while tracing, because they were built
from constants alone.

Note [Constant fakes]: a fake tensor has no data, so an operator whose result depends on data
(`aten::equal`, `.item()`, `masked_select`, `nonzero`) cannot run on it and the frame falls
back. Some of that data is not the program's input but a constant the program builds: `cov`'s
composite compares `scalar_tensor(n) - correction <= 0` with `equal` to decide whether to warn;
`combinations` selects with a mask built from `full`, `arange` and `lt`. Those values depend only
on what the graph is specialized on anyway (the constant arguments and static sizes), so kiln
computes them once while tracing, on real CPU tensors beside the fake ones (`FakeTensor.constant`),
and answers the data-dependent questions from them: the answer is the same on every run the
graph's guards admit.

A result is constant when the operator is deterministic (no RNG, no uninitialized memory), every
tensor argument is a constant fake (a factory has none), no argument is symbolic, the device is
the CPU or the values are integers and bools (computed on the CPU, they are bit for bit the
device's own; floats could round differently) and every output has at most
`CONSTANT_LIMIT` elements. Views of a constant are real views of its real tensor, so an in-place
operator on constants updates every alias. Any other write into a constant fake (an in-place
operator with a non-constant argument) drops the constants of every fake sharing its storage.
Graph inputs never carry constants.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

if TYPE_CHECKING:
    from kiln_dynamo.fake import FakeTensor

CONSTANT_LIMIT = 4096
_CPU = torch.device("cpu")
# operators whose results are not values (uninitialized memory) or change storage
_NOT_VALUES = ("empty", "resize", "set_", "_efficientzerotensor")
# every fake that carries a constant, by id (to drop the constants of a storage's aliases; not a
# WeakSet, which would compare tensors with `==`)
_HOLDERS: dict[int, weakref.ref[Any]] = {}


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def constant_of(x: Any) -> torch.Tensor | None:
    c = getattr(x, "constant", None)
    if c is None or c.shape != x.shape or c.dtype != x.dtype:
        return None  # a metadata change that did not reach the constant: not trusted
    return c


def set_constant(fake: FakeTensor, real: torch.Tensor | None) -> None:
    fake.constant = real
    key = id(fake)
    if real is not None and key not in _HOLDERS:

        def forget(ref: weakref.ref[Any], key: int = key) -> None:
            if _HOLDERS.get(key) is ref:
                del _HOLDERS[key]

        _HOLDERS[key] = weakref.ref(fake, forget)


def drop_constants(written: FakeTensor) -> None:
    """`written` changed in a way not computed on constants: no alias of it is constant now."""
    key = _storage_key(written.meta)
    for ref in list(_HOLDERS.values()):
        holder = ref()
        if holder is not None and holder.constant is not None and _storage_key(holder.meta) == key:
            holder.constant = None


def computable(func: Any, flat: list[Any], device: torch.device) -> bool:
    """Can `func` on these (flattened) arguments be run on the constants?"""
    name = str(func._schema.name) if hasattr(func, "_schema") else ""
    if not name or any(part in name for part in _NOT_VALUES):
        return False
    if device.type != "cpu" and any(isinstance(x, torch.Tensor) and x.dtype.is_floating_point for x in flat):
        return False  # float math may round differently on the device; integers and bools do not
    if torch.Tag.nondeterministic_seeded in func.tags:
        return False
    for x in flat:
        if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
            return False
        if isinstance(x, torch.Tensor) and constant_of(x) is None:
            return False
    return True


def run_on_constants(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device) -> Any:
    """`func` on the real constants (an operator `computable` allowed), or None when an output
    is larger than `CONSTANT_LIMIT` (then no constants, and the caller decides as for any fake)."""

    def real(x: Any) -> Any:
        if isinstance(x, torch.device):
            return _CPU
        c = constant_of(x)
        return c if c is not None else x

    with _disable_current_modes():
        out = func(*tree_map(real, args), **tree_map(real, kwargs))
    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    if any(t.numel() > CONSTANT_LIMIT for t in leaves):
        return None
    if device.type != "cpu" and any(t.dtype.is_floating_point for t in leaves):
        return None
    return out
