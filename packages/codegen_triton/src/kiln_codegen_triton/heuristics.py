"""Launch configurations: block sizes and warps per kernel kind, and the launch grid.

A kernel's first config is the heuristic choice, used unless ``mode="max-autotune"`` asks the
launcher to time a small set around it (:func:`configs` with ``autotune=True``). The numbers
follow what a memory-bound kernel on an H100/H200 class GPU needs: enough elements per program
that every thread issues 128-bit loads, enough programs to fill the SMs, and a persistent
reduction's whole row in registers (``RBLOCK`` = the row length rounded up to a power of two,
``XBLOCK`` rows per program so that a program holds about 2K elements).

Note [Block sizes for symbolic sizes]: a kernel compiled for symbolic sizes (Note [Symbolic
sizes in Triton kernels] in kernel.py) runs one config at every size, so its blocks are chosen
from the size *hints* (the sizes of the call it was compiled at), with each symbolic extent
taken as at least ``SYMBOLIC_MIN_EXTENT``: a block too large for a small size wastes masked
lanes of a cheap kernel, one too small for a large size multiplies the programs of an expensive
one. The grid is computed at every launch from the run's sizes (:func:`grid_source`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln_loopir.wrapper_support import py_size

from .kernel import KernelSpec, next_pow2

POINTWISE_XBLOCK = 1024
TILE = 32
PERSISTENT_ELEMENTS = 2048
LOOPED_RBLOCK = 2048
OUTER_XBLOCK = 64
OUTER_RBLOCK = 32
# Note [Block sizes for symbolic sizes]
SYMBOLIC_MIN_EXTENT = 256


@dataclass(frozen=True, slots=True)
class Config:
    """One launch configuration (block sizes are ``tl.constexpr`` arguments of the kernel)."""

    XBLOCK: int
    YBLOCK: int = 1
    RBLOCK: int = 1
    num_warps: int = 4
    num_stages: int = 1

    def kwargs(self, kind: str) -> dict[str, int]:
        out = {"XBLOCK": self.XBLOCK, "num_warps": self.num_warps, "num_stages": self.num_stages}
        if kind == "tiled":
            out["YBLOCK"] = self.YBLOCK
        if kind in ("persistent", "looped"):
            out["RBLOCK"] = self.RBLOCK
        return out


def _warps(elements: int, low: int = 2, high: int = 8) -> int:
    return max(low, min(high, elements // 256))


def configs(spec: KernelSpec, *, autotune: bool = False, rblock_cap: int = LOOPED_RBLOCK) -> list[Config]:
    """Candidate configs for ``spec``, the heuristic choice first (alone unless ``autotune``)."""
    out: list[Config] = []
    xnumel, ynumel, rnumel = _extents(spec)
    nx = next_pow2(xnumel)
    if spec.kind == "pointwise":
        x = min(POINTWISE_XBLOCK, nx)
        out.append(Config(x, num_warps=_warps(x, 1, 4)))
        if autotune:
            for xb in (256, 512, 1024, 2048):
                for warps in (4, 8):
                    if xb <= max(nx, 256):
                        out.append(Config(min(xb, nx), num_warps=warps))
    elif spec.kind == "tiled":
        ny = next_pow2(ynumel)
        out.append(Config(min(TILE, nx), min(TILE, ny), num_warps=4))
        if autotune:
            for yb, xb, warps in ((64, 64, 8), (16, 64, 4), (64, 16, 4), (32, 128, 8), (128, 32, 8)):
                out.append(Config(min(xb, nx), min(yb, ny), num_warps=warps))
    elif spec.kind == "persistent":
        r = next_pow2(rnumel)
        x = min(128, nx) if spec.outer else max(1, min(nx, PERSISTENT_ELEMENTS // r))
        out.append(Config(x, RBLOCK=r, num_warps=_warps(x * r)))
        if autotune:
            for xb in (max(1, x // 2), x, min(nx, x * 2)):
                for warps in (4, 8, 16):
                    if xb * r <= 16384 and (warps * 32 <= xb * r):
                        out.append(Config(xb, RBLOCK=r, num_warps=warps))
    else:  # looped
        cap = max(1, min(rblock_cap, next_pow2(rnumel)))
        if spec.outer:
            x, r = min(OUTER_XBLOCK, nx), min(OUTER_RBLOCK, cap)
            out.append(Config(x, RBLOCK=r, num_warps=4))
            if autotune:
                for xb, rb, warps in ((128, 16, 4), (32, 64, 4), (256, 8, 8), (64, 64, 8)):
                    out.append(Config(min(xb, nx), RBLOCK=min(rb, cap), num_warps=warps))
        else:
            r = min(LOOPED_RBLOCK, cap)
            out.append(Config(1, RBLOCK=r, num_warps=_warps(r)))
            if autotune:
                for xb, rb, warps in ((1, 1024, 4), (1, 4096, 8), (2, 1024, 8), (4, 512, 8), (1, 2048, 16)):
                    out.append(Config(min(xb, nx), RBLOCK=min(rb, cap), num_warps=warps))
    unique: list[Config] = []
    for c in out:
        if c not in unique:
            unique.append(c)
    return unique


def _extents(spec: KernelSpec) -> tuple[int, int, int]:
    """The numels blocks are planned for (Note [Block sizes for symbolic sizes])."""
    if not spec.symbolic:
        return spec.xnumel, spec.ynumel, spec.rnumel
    hints = spec.hints()
    numels = (spec.xnumel, spec.ynumel, spec.rnumel)
    return tuple(
        h if isinstance(n, int) else max(h, SYMBOLIC_MIN_EXTENT) for n, h in zip(numels, hints, strict=True)
    )  # type: ignore[return-value]


def grid(spec: KernelSpec, config: Config) -> tuple[int, ...]:
    """The launch grid of ``spec`` under ``config``."""
    xs = -(-spec.xnumel // config.XBLOCK)
    if spec.kind == "tiled":
        return (xs, -(-spec.ynumel // config.YBLOCK))
    return (xs,)


def grid_source(spec: KernelSpec, config: Config) -> tuple[str, ...]:
    """The launch grid as Python expressions over the kernel's size arguments (named as the
    symbols): computed at every launch of a kernel with symbolic sizes; ints for static numels."""
    if not spec.symbolic:
        return tuple(str(g) for g in grid(spec, config))

    def blocks(numel: Any, block: int) -> str:
        if isinstance(numel, int):
            return str(-(-numel // block))
        return f"-(-({py_size(numel)}) // {block})"

    xs = blocks(spec.xnumel, config.XBLOCK)
    if spec.kind == "tiled":
        return (xs, blocks(spec.ynumel, config.YBLOCK))
    return (xs,)
