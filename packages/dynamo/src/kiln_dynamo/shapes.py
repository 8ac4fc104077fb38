"""Sizes and strides, in one place.

Today every size is static: a fake tensor's sizes are the real input's sizes, and the guard on an
input pins each size and stride to the value seen at capture time. Every tracker that needs a
size asks this module (`sizes_of`, `strides_of`, `tensor_shape_guards`), so that the dynamic-shapes
work can turn sizes into SymInts carrying sympy expressions without touching the trackers: it
replaces these functions and the `ShapeEnv` below, which today only records that it specialised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class ShapeEnv:
    """Records every size that capture specialised on (all of them, while shapes are static)."""

    specialized: list[tuple[str, int, int]] = field(default_factory=list)

    def specialize_size(self, source_name: str, dim: int, value: int) -> int:
        self.specialized.append((source_name, dim, value))
        return value


def sizes_of(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.size())


def strides_of(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.stride())


def tensor_shape_guards(expr: str, t: torch.Tensor) -> list[tuple[str, str]]:
    """(code, readable) guard parts pinning the shape and strides of the tensor at `expr`."""
    sizes = sizes_of(t)
    strides = strides_of(t)
    parts = [(f"{expr}.dim() == {len(sizes)}", f"{expr}.dim() == {len(sizes)}")]
    parts.append(
        (
            f"{expr}.shape == {sizes!r}",
            " and ".join(f"{expr}.size({i}) == {s}" for i, s in enumerate(sizes)) or f"{expr}.dim() == 0",
        )
    )
    parts.append((f"{expr}.stride() == {strides!r}", f"{expr}.stride() == {strides!r}"))
    return parts
