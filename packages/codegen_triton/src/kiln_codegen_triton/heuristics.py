"""Launch configurations: block sizes and warps per kernel kind, and the launch grid.

A kernel's first config is the heuristic choice, used unless ``mode="max-autotune"`` asks the
launcher to time a set around it (:func:`configs` with ``autotune=True``), or the kernel is large
enough for the default mode's small autotune (``autotune="small"``, Note [Autotuning large
kernels in the default mode] in backend.py). The numbers follow what a memory-bound kernel on an
H100/H200 class GPU needs: enough bytes per program that every thread issues 128-bit loads and
keeps several in flight, enough programs to fill the SMs, and a persistent reduction's whole row
in registers (``RBLOCK`` = the row length rounded up to a power of two).

Note [Bytes per program]: the unit of work is bytes, not elements. A persistent reduction takes
``XBLOCK`` rows so that a program reads about ``PERSISTENT_BYTES`` of them (8 KB: two float32 rows
of 1024, four bfloat16 rows of 768): sized in elements, a bfloat16 row program read half as much
as a float32 one and reached ~60% of the H200's copy bandwidth where float32 reached ~92%
(``bench/bandwidth.py``, layer norm and softmax over rows of 768). An outer (column) reduction
walks ``OUTER_XBLOCK`` contiguous columns and ``RBLOCK`` rows per step so that a step's tile is
``OUTER_TILE_BYTES`` (4 KB: 16 float32 rows, 32 bfloat16 rows); of the tiles swept on the H200
(2-8 KB, 4-8 warps) 4 KB tiles were fastest for both dtypes, once the split (split.py) gives
enough programs.

Note [One warp per row]: an inner persistent reduction whose row rounds up to 1024 elements
(513-1024) gives each row one program of one warp: 32 lanes with up to 32 elements each, reduced
by warp shuffles alone (no shared memory, no barrier between the two passes of a softmax or a
layer norm), and many small programs keep every SM busy. On the H200 (``bench/bandwidth.py
--variants``, 16M/64M elements) this moved bfloat16 rows of 768 from 66%/72% of copy bandwidth
(four rows, eight warps: the bytes-per-program rule) to 86%/94% for softmax and from 64%/95% to
88%/96% for layer norm, above torch.compile's 78%/87% and 90%/97%; float32 rows of 1024 were as
fast either way (95-98%). Shorter rows keep the bytes-per-program rule (bfloat16 rows of 128: it
was as fast as one or two warps over eight rows).

Note [One warp per 1024 elements]: the same holds for the half-precision rows between: a row that
rounds up to 256 or 512 lanes (129-512 elements: ConvNeXt's layer norms over 192 and 384
channels) gives a program of one warp over 1024 // RBLOCK rows (4 rows of 256, 2 of 512). Swept
on the H200 (sixteenth session, ``bench/bandwidth.py --dtype bfloat16 --row R --only layer_norm
--sizes 12 --variants ...``, 12M elements): rows of 192 went from 75% of copy bandwidth (16 rows,
eight warps) to 85% (torch.compile 87%), rows of 384 from 64% to 83% (torch.compile 84%); rows
of 96 (RBLOCK 128) were best as they were (80%; one warp over 8 rows: 74%), so the rule stops
at 256. Float32 rows keep the bytes-per-program rule (not measured). ``WARP_ELEMENTS = 0`` turns
the rule off.

Note [Welford tiles]: the first kernel of a split BatchNorm statistics reduction (a Welford per
channel over a chunk of rows, ``split.py``) is a looped column reduction like a column sum, but each
element of its tile carries a (mean, m2, weight) triple and a division per step: the 4 KB tile of
the column-sum rule (X64 R32, four warps) holds 48 float32 accumulators a thread. Measured on an
H100 (twenty-sixth session, ``bench/bandwidth.py --only bn_stats --dtype bfloat16 --row 256``, a
channels-last [32, 256, 56, 56] activation, ResNet-50's stage 1, both kernels): X64 R32 w4 54.8 us,
R64 w4 82.6, R16 w4 43.7, R8 w4 41.1, R32 w8 60.9, **R8 w2 35.2**; torch.compile 41.8. In ResNet-50's
bfloat16 training these kernels took 1.15 ms a step against ~0.5 ms for torch.compile's. Smaller
tiles leave registers for more programs on an SM, whose loads then overlap; that pays only where
the grid has programs to spare and each program's loop is long: at a quarter of the batch ([8,
256, 56, 56], 6M elements: as many programs, each over 49 rows instead of 196) the default took
13.0 us (torch.compile 18.5) and every smaller tile 14.6-18.7, each step of a short loop paying a
load's latency. So a Welford column loop with at least ``WELFORD_MIN_PROGRAMS`` programs (about
eight an SM on a 132-SM GPU) over rows of at least ``WELFORD_MIN_ROWS`` takes ``WELFORD_TILE_BYTES``
tiles (1 KB: 8 rows of 64 bfloat16 columns) of ``WELFORD_WARPS`` warps; others keep the column-sum
rule. ``WELFORD_MIN_ROWS`` was 128 from those two shapes; five shapes on the H100 in the
twenty-seventh session (``scripts/gpu_next.sh call26w``: channels, elements; kiln with rows >= 128
/ with WELFORD_MIN_ROWS=0 / the rule off / torch.compile, us) removed the row condition: 256, 24.5M:
35.4 / 35.4 / 54.9 / 41.8; 256, 6M: 12.9 / 12.7 / 12.9 / 17.5; 64, 24.5M: 42.0 / 41.8 / 46.8 / 35.5;
512, 12.25M: 35.2 / 22.2 / 35.0 / 24.5; 1024, 6M: 17.4 / 11.5 / 17.4 / 15.4. ResNet-50's bfloat16
training step with the rule of rows >= 128: 7.69 ms of GPU time against 7.77 with it off.
Switch: ``triton_options={"welford_tiles": False}``.

Note [Block sizes for symbolic sizes]: a kernel compiled for symbolic sizes (Note [Symbolic
sizes in Triton kernels] in kernel.py) runs one config at every size, so its blocks are chosen
from the size *hints* (the sizes of the call it was compiled at), with each symbolic extent
taken as at least ``SYMBOLIC_MIN_EXTENT``: a block too large for a small size wastes masked
lanes of a cheap kernel, one too small for a large size multiplies the programs of an expensive
one. The grid is computed at every launch from the run's sizes (:func:`grid_source`).

Decided (dyn9, issue 17): hints, not a per-size table picked at run time (torch.compile's
per-bucket autotuning). ``scripts/triton_kernel_audit.py --model gpt2 --dtype bfloat16 --shapes
2x16,...,32x512`` compares every launch of the symbolic graph with a static compile at the same
size: the large kernels (rows of 768, the pointwise epilogues) get the configs the static graph
gets at all nine shapes, because their blocks depend on static extents or saturate
(``POINTWISE_XBLOCK``); only small pointwise kernels (<= 16K elements, at the launch-latency
floor) differ (``X256 w1`` against ``X1024 w4``). A table would matter for a reduction whose
*reduced* extent is symbolic (persistent vs looped, ``RBLOCK``): revisit when the audit shows one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy

from kiln_loopir.wrapper_support import py_size

from .kernel import KernelSpec, next_pow2

POINTWISE_XBLOCK = 1024
TILE = 32
PERSISTENT_BYTES = 8192
PERSISTENT_WARPS = 0  # 0: from the elements per program (_warps); a sweep sets it (bench/bandwidth.py)
WARP_ROW_RBLOCK = 1024  # Note [One warp per row]; 0 turns the rule off
WARP_ELEMENTS = 1024  # Note [One warp per 1024 elements]; 0 turns the rule off
LOOPED_RBLOCK = 2048
OUTER_XBLOCK = 64
# a reordered persistent reduction's rows per program: 16 rows of 2 bytes fill a 32-byte sector at
# each position of the row (Note [Reductions walk their reads' memory order] in kernel.py)
REORDERED_XBLOCK = 16
OUTER_TILE_BYTES = 4096
OUTER_WARPS = 4
# Note [Welford tiles]: a looped column reduction that keeps a Welford triple per element, when it
# has at least WELFORD_MIN_PROGRAMS programs; WELFORD_TILE_BYTES = 0 turns the rule off
WELFORD_TILE_BYTES = 1024
WELFORD_WARPS = 2
WELFORD_MIN_PROGRAMS = 1024
WELFORD_MIN_ROWS = 0
# Note [Welford chunks] in split.py: a Welford column loop's tile, X16 R32 where its outputs (chunks
# x channels) are at most WELFORD_NARROW_XNUMEL, else X64 R8, of four warps; 0 turns the tiles off
WELFORD_CHUNK_TILES = 1
WELFORD_NARROW_XNUMEL = 32768
# the columns of a persistent outer reduction (rows of at most 32: a sum over a batch of 8); a
# constant so that bench/bandwidth.py can sweep it (GPT-2's position-embedding gradient, a bfloat16
# and a float32 [8, 512 * 768] summed over the batch in 3072 programs of 128 columns, ran at 38% of
# an H100's copy bandwidth: not yet understood)
OUTER_PERSISTENT_XBLOCK = 128
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


def _floor_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def itemsize(spec: KernelSpec) -> int:
    """The narrowest element the kernel moves (bytes): what a program's share is sized by."""
    sizes = [d.itemsize for d in spec.param_dtypes if d.is_floating_point or d.is_complex]
    return min(sizes) if sizes else 4


def outer_tile_rows(spec: KernelSpec) -> int:
    """The rows of one step of an outer (column) reduction's tile: ``OUTER_TILE_BYTES`` of the
    kernel's narrowest element over ``OUTER_XBLOCK`` columns (32 bfloat16 rows, 16 float32 ones),
    as the looped config below takes them."""
    return max(8, OUTER_TILE_BYTES // (OUTER_XBLOCK * itemsize(spec)))


def configs(
    spec: KernelSpec,
    *,
    autotune: bool | str = False,
    rblock_cap: int = LOOPED_RBLOCK,
    welford_tiles: bool = True,
    welford_chunks: bool = True,
) -> list[Config]:
    """Candidate configs for ``spec``, the heuristic choice first (alone unless ``autotune``:
    ``True`` for max-autotune's set, ``"small"`` for the default mode's few alternatives).
    ``welford_tiles``: Note [Welford tiles] (TritonBackend's switch of the same name);
    ``welford_chunks``: Note [Welford chunks] in split.py (which comes first where both apply)."""
    if autotune == "small":
        return _small(spec, rblock_cap, welford_tiles, welford_chunks)
    out: list[Config] = []
    xnumel, ynumel, rnumel = _extents(spec)
    nx = next_pow2(xnumel)
    size = itemsize(spec)
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
        # Note [Bytes per program]
        x = (
            min(OUTER_PERSISTENT_XBLOCK, nx)
            if spec.outer and not spec.reordered
            else max(1, min(nx, _floor_pow2(PERSISTENT_BYTES // (max(1, rnumel) * size))))
        )
        warps = PERSISTENT_WARPS or _warps(x * r)
        if spec.reordered:  # Note [Reductions walk their reads' memory order] in kernel.py
            x = min(nx, REORDERED_XBLOCK)
            warps = PERSISTENT_WARPS or _warps(x * r, 4)
        elif not spec.outer and r == WARP_ROW_RBLOCK and not PERSISTENT_WARPS:  # Note [One warp per row]
            x, warps = 1, 1
        elif not spec.outer and not PERSISTENT_WARPS and size == 2 and 256 <= r < WARP_ELEMENTS:
            x, warps = min(nx, WARP_ELEMENTS // r), 1  # Note [One warp per 1024 elements]
        out.append(Config(x, RBLOCK=r, num_warps=warps))
        if autotune:
            for xb in (max(1, x // 2), x, min(nx, x * 2)):
                for warps in (4, 8, 16):
                    if xb * r <= 16384 and (warps * 32 <= xb * r):
                        out.append(Config(xb, RBLOCK=r, num_warps=warps))
    else:  # looped
        cap = max(1, min(rblock_cap, next_pow2(rnumel)))
        if spec.outer:
            x = min(OUTER_XBLOCK, nx)
            r = min(max(8, OUTER_TILE_BYTES // (x * size)), 64, cap)  # Note [Bytes per program]
            warps = OUTER_WARPS
            if welford_chunks and spec.welford and WELFORD_CHUNK_TILES:
                # Note [Welford chunks] in split.py: torch.compile's tile for the chunks it cuts
                x, r = (16, 32) if nx <= WELFORD_NARROW_XNUMEL else (64, 8)
                x, r, warps = min(x, nx), min(r, cap), max(1, min(x, nx) * min(r, cap) // 128)
            elif (
                welford_tiles
                and spec.welford
                and WELFORD_TILE_BYTES
                and -(-nx // x) >= WELFORD_MIN_PROGRAMS
                and rnumel >= WELFORD_MIN_ROWS
            ):
                r = min(max(8, WELFORD_TILE_BYTES // (x * size)), cap)  # Note [Welford tiles]
                warps = WELFORD_WARPS
            out.append(Config(x, RBLOCK=r, num_warps=warps))
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


def _small(
    spec: KernelSpec, rblock_cap: int, welford_tiles: bool = True, welford_chunks: bool = True
) -> list[Config]:
    """The heuristic choice and two neighbours: half and twice its work per program (rows of a
    persistent reduction, the tile of an outer one, the block of a row loop or a tile), each
    also with the other warp count, which is where the heuristic most often misses."""
    first = configs(spec, rblock_cap=rblock_cap, welford_tiles=welford_tiles, welford_chunks=welford_chunks)[
        0
    ]
    xnumel, ynumel, rnumel = _extents(spec)
    nx = next_pow2(xnumel)
    out = [first]
    if spec.kind == "persistent":
        for x in (max(1, first.XBLOCK // 2), min(nx, first.XBLOCK * 2)):
            out.append(Config(x, RBLOCK=first.RBLOCK, num_warps=_warps(x * first.RBLOCK)))
        out.append(Config(first.XBLOCK, RBLOCK=first.RBLOCK, num_warps=max(2, first.num_warps // 2)))
    elif spec.kind == "looped" and spec.outer:
        cap = max(1, min(rblock_cap, next_pow2(rnumel)))
        for r in (max(1, first.RBLOCK // 2), min(cap, first.RBLOCK * 2)):
            out.append(Config(first.XBLOCK, RBLOCK=r, num_warps=first.num_warps))
        out.append(Config(first.XBLOCK, RBLOCK=first.RBLOCK, num_warps=8 if first.num_warps < 8 else 4))
    elif spec.kind == "looped":
        cap = max(1, min(rblock_cap, next_pow2(rnumel)))
        for r in (max(128, first.RBLOCK // 2), min(cap, first.RBLOCK * 2)):
            out.append(Config(1, RBLOCK=r, num_warps=_warps(r)))
    elif spec.kind == "tiled":
        ny = next_pow2(ynumel)
        for yb, xb, warps in ((64, 64, 8), (16, 64, 4)):
            out.append(Config(min(xb, nx), min(yb, ny), num_warps=warps))
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

    # an integer of a float of sizes is the argument that holds it (Note [Integers of floats of
    # sizes in Triton] in triton_ops.py)
    derived = {e: sympy.Symbol(name) for name, e in spec.int_params}

    def blocks(numel: Any, block: int) -> str:
        if isinstance(numel, int):
            return str(-(-numel // block))
        return f"-(-({py_size(sympy.sympify(numel).xreplace(derived))}) // {block})"

    xs = blocks(spec.xnumel, config.XBLOCK)
    if spec.kind == "tiled":
        return (xs, blocks(spec.ynumel, config.YBLOCK))
    return (xs,)
