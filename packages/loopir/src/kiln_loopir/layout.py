"""Layouts: how a buffer's elements sit in memory.

A layout is device, dtype, sizes, strides and a storage offset, with sizes and strides as sympy
expressions (integers today; symbols once shapes are dynamic). It turns a logical index (one
sympy expression per dimension) into a memory offset: that is all a load or store needs.

``FixedLayout`` is decided and may be relied on by others (inputs, extern kernel results, views
into a buffer). ``FlexibleLayout`` belongs to a buffer the IR computes itself: its strides are
row-major until someone fixes them (:meth:`FlexibleLayout.freeze`), which lets a code generator
pick a better order for a buffer nobody outside the kernel sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy
import torch
from kiln_symbolic import expr_of

from .indexing import Expr, contiguous_strides, linear_index
from .sizevars import hint, to_loopir

ZERO = sympy.Integer(0)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the elements of a buffer live; see the module docstring."""

    device: torch.device
    dtype: torch.dtype
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]
    offset: Expr = ZERO

    def indexer(self, index: Sequence[Expr]) -> Expr:
        """Memory offset of the element at ``index`` (size-1 dims contribute nothing)."""
        assert len(index) == len(self.size), (index, self.size)
        kept = [(i, s) for i, s, n in zip(index, self.stride, self.size, strict=True) if n != 1]
        return linear_index([i for i, _ in kept], [s for _, s in kept], self.offset)

    def numel(self) -> Expr:
        return sympy.Mul(*self.size)

    def storage_size(self) -> Expr:
        """Elements of storage the layout touches (offset + furthest element + 1)."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return self.offset + sum(((n - 1) * s for n, s in zip(self.size, self.stride, strict=True)), 0) + 1

    def nbytes(self) -> int:
        """Bytes at the size hints (Note [Symbolic sizes in loopir])."""
        return hint(self.numel()) * self.dtype.itemsize

    def is_contiguous(self) -> bool:
        expected = contiguous_strides(self.size)
        return self.offset == 0 and all(
            n == 1 or s == e for n, s, e in zip(self.size, self.stride, expected, strict=True)
        )

    def int_size(self) -> list[int]:
        return [int(s) for s in self.size]

    def int_stride(self) -> list[int]:
        return [int(s) for s in self.stride]


@dataclass(frozen=True, slots=True)
class FixedLayout(Layout):
    """A layout others may rely on: inputs, extern results, views into buffers."""


@dataclass(frozen=True, slots=True)
class FlexibleLayout(Layout):
    """A row-major layout the IR may still change until :meth:`freeze`."""

    def freeze(self) -> FixedLayout:
        return FixedLayout(self.device, self.dtype, self.size, self.stride, self.offset)


def flexible(device: torch.device, dtype: torch.dtype, size: Sequence[Expr]) -> FlexibleLayout:
    """A fresh row-major layout for a computed buffer."""
    sizes = tuple(sympy.sympify(s) for s in size)
    return FlexibleLayout(device, dtype, sizes, tuple(contiguous_strides(sizes)))


def fixed_from_tensor(t: torch.Tensor, device: torch.device | None = None) -> FixedLayout:
    """The layout of an existing tensor (an input, a constant, a meta result on ``device``)."""
    return FixedLayout(
        device if device is not None else t.device,
        t.dtype,
        symbolic(t.shape),
        symbolic(t.stride()),
        symbolic([t.storage_offset()])[0],
    )


def symbolic(values: Sequence[object]) -> tuple[Expr, ...]:
    """Sizes as sympy: ints as Integers, SymInts by their expression (Note [Symbolic sizes in
    loopir]), never read as an int (that would add a guard)."""
    out = []
    for v in values:
        if isinstance(v, torch.SymInt):
            out.append(to_loopir(expr_of(v)))
        elif isinstance(v, sympy.Expr):
            out.append(v)
        else:
            out.append(sympy.Integer(int(v)))  # type: ignore[call-overload]
    return tuple(out)
