"""Split reductions: a long reduction with few outputs runs as two kernels.

A reduction kernel gets one program per ``XBLOCK`` outputs. ``x.sum()`` has one output and a
column sum of a ``(65536, 1024)`` activation (a bias gradient) has sixteen blocks of 64 columns:
a few programs on a GPU of 132 SMs, each walking a long row alone, reach a few percent of the
memory bandwidth. Such a reduction is split in two (Note [Split reductions]):

1. a *partial* kernel reduces ``S`` chunks of each row into a buffer ``partial[s, x]`` (``S`` times
   more programs, each walking ``rnumel / S`` positions);
2. the reduction's own kernel reduces ``partial`` over ``s`` (a short, persistent reduction) and
   runs the node's fused epilogue as before.

Both are ordinary loopir IR built here from the original :class:`~kiln_loopir.ir.Reduction`:
the partial is a Reduction over ranges ``(S, *ranges)`` whose body is the original body at
reduced position ``s * chunk + r`` (masked past the end), and the second is a Reduction over
``(S,)`` that loads the partial. sum, prod, max, min and any split this way because reducing
partial results with the same operation gives the same result (up to float rounding order,
as in any parallel reduction). A Welford reduction (mean and variance: BatchNorm's batch
statistics in training, over N, H and W for each of a few channels) splits when the chunks
divide the row exactly: the partial kernel computes each chunk's (mean, m2, weight), and the
second combines them with Chan's formula (``welford_combine``, ``k_welford``), the same rule
that already combines the lanes of one kernel. argmax/argmin are left whole.

Note [The second kernel reduces rows]: the partial buffer holds each output's ``S`` chunk results
next to each other (``partial[x, s]``, ``s`` contiguous), so the second kernel is an inner (row)
reduction: one short row per output, persistent, one program (of one warp, for 513-1024 chunks:
Note [One warp per row] in heuristics.py) per output. Laid out ``partial[s, x]`` instead, as the
partial kernel's iteration order would have it, the second kernel was an outer (column) reduction
of ``ceil(nx / 64)`` programs: a BatchNorm of 64 channels combined its 1024 chunks in *one*
program walking 64 tiles in sequence (``scripts/triton_kernel_audit.py`` estimates ~130 us on an
H200 for 1 MB, against ~5 us with a program per channel). The partial kernel's stores become
strided by ``S``; they are ``S`` times fewer than its loads. ``split_rows=False`` (a
TritonBackend option) keeps the column layout.

Note [Split reductions]: only nodes whose members are one reduction followed by x-level
epilogues are split. A node that also computes r-level values (a fused prologue stored for
later: ConvNeXt's layer-scale gradient ``grad * gamma`` stored while ``sum(grad * x)`` over N, H, W
gives gamma's gradient) is split after its r-level members are *peeled* into a pointwise kernel
of their own (:func:`peel_rows`): that kernel stores them, and the reduction, split as above,
reads them back (one more pass over memory, at full bandwidth). Kept whole, such a node ran on a
few programs: ConvNeXt's bfloat16 training step had four column reductions of 3-6 programs over
14-67 MB each, estimated at 0.3-2.8 ms apiece on an H200 by ``scripts/triton_kernel_audit.py``.
Peeled only where every r-level member is stored anyway (not internal to the node) and reads
nothing the node reduces; ``split_peel=False`` (a TritonBackend option) keeps such nodes whole.

Note [Short chunks of column reductions]: a chunk of a row reduction is at least ``min_rnumel / 4``
positions (256), one program's worth of long vector loads. A column reduction's program walks a
tile of 64 columns by a few rows per step, so its chunks may be far shorter (``outer_min_chunk``,
64 rows, or one column tile under Note [Partials of a column reduction stay column reductions]:
``split_outer_min_chunk``, a TritonBackend option). Channels-last BatchNorm
statistics are column reductions over N*H*W rows; ResNet-50's at 14x14 and 7x7 (6272 and 1568 rows
for 256-2048 channels) were held to 32 and 8 chunks of 196 rows by the row rule: 64-128 programs
of 4 warps, a quarter of what fills an H200 (``scripts/triton_kernel_audit.py``: about 60 such
kernels of 3-9 us each in a bfloat16 training step). With 49-row chunks they get 4x the programs.
(Welford reductions, the BatchNorm statistics themselves, now follow Note [Welford chunks].)

Note [Partials of a column reduction stay column reductions]: a norm's weight and bias gradients
(column sums over the tokens, Note [Row statistics do not decide a column reduction] in kernel.py)
ran at 42-55% of copy bandwidth on an H100 (BERT and GPT-2 bf16 training, rows of 768 over 4096
tokens; every other generated kernel of 16 MB or more ran at 70% or more), for two reasons that
``scripts/triton_kernel_audit.py`` shows:
- the partial kernel was built as a row reduction. Its outputs are (chunk, column) and its row is
  the chunk's tokens, so a row statistic ``mean[chunk * len + r]`` moves with the outputs too (by
  the chunk digit) and steps by 1 along the row: the kernel was judged by it and ran persistent,
  a 64-column by 64-token tile of every input held in registers at once (8 warps; 8 KB of
  bfloat16 per input, 4-6 inputs; nothing in flight while it reduces and stores). The whole
  kernel, which saw the statistics move with the row only, had judged it a column reduction; its
  partial keeps that (``build_kernel(column=True)``): looped over the 4 KB tiles of heuristics'
  outer config (64 columns by 32 bfloat16 tokens, 4 warps).
- 64-token chunks (Note [Short chunks of column reductions]) cut 4096 tokens in 64 chunks: 12
  column tiles of 768 columns gave 768 programs, about a third of ``split_outer_target_programs``
  (the final norm's partial, already a column reduction, ran there at 55%; bias gradients of 2304
  and 3072 columns, the same tiles over 2304-3072 programs, at 70% or more). A chunk may now be as
  short as one tile step (``heuristics.outer_tile_rows``: 32 bfloat16 tokens, 16 float32 ones), so
  such a kernel has 1536 programs. The partial buffers double (768 x 128 float32 per output,
  ~6% of what the partial kernel reads), and the second kernel reads them in one short row per
  column as before. A static chunk is also rounded up to whole tile steps (Welford chunks must
  divide the row and stay as they are): ViT's 6304 tokens in 256 chunks were 25 rows each, a
  quarter of every step's lanes masked, and are now 197 chunks of 32.
torch.compile keeps these column sums apart from the row kernel too: split in about 32 chunks of
128 tokens, each program a 16-column by 32-token tile looped four times, 1536 programs of 4 warps
for 768 columns (its ``reduction_split_factor`` and outer-reduction config). Switch:
``triton_options={"outer_partials": True}`` turns it on; **off by default**: measured on an H100
(twenty-fifth session, ``scripts/gpu_next.sh call25b``, bf16 training, kiln against
``outer_partials=False`` in one run) it did not help: GPT-2's generated kernels 2.10 against 2.06
ms a step, BERT's 1.76 against 1.71, the norm partials at 40-46% of copy against 42-48% before, the
same 51/73 and 45/65 kernels at 70% or more. So neither the kernel kind nor the program count is
why they run at half of copy; what is remains open (the row statistics loaded as full tiles, see
the ln25 report in the twenty-fifth session's closing note). Off, the partial is built as its
accesses say with 64-token chunks (an explicit ``split_outer_min_chunk`` always wins).

Note [Welford chunks]: a BatchNorm's training statistics over a channels-last activation are a
Welford column reduction of an [N*H*W, C] matrix, split in two kernels. ResNet-50's bfloat16
training step on an H100 (``packages/bench/results/2026-12-06-h100-s28-resnet-train-bf16-kernel-
table.json``; C, rows, count: kiln's partial + second kernel against torch.compile's kernels, us a
BatchNorm):

    C     rows  n  kiln        torch.compile          C     rows  n  kiln        torch.compile
    64  401408  1  42.5 + 3.4  16.9 + 2.5 + 2.2      256   25088  1  14.6 + 3.7  9.4 + 2.5 + 1.7
    64  100352  6  11.9 + 3.3   9.7 + 2.3 + 2.2      256    6272 11   9.1 + 4.7  3.4 + 2.2
   256  100352  4  34.1 + 3.7  29.3 + 2.9 + 2.3     1024    6272  7  14.8 + 4.9  9.4 + 2.8
   128  100352  1  20.3 + 3.4  16.2 + 2.8 + 2.1      512    6272  1   9.6 + 4.7  5.4 + 2.3
   128   25088  7   9.6 + 3.5   5.4 + 2.2 + 1.8      512    1568  5   6.2 + 4.5  2.8 + 1.9
   512   25088  5  21.2 + 4.6  15.6 + 2.7 + 1.8     2048    1568  4   9.5 + 4.6  5.6 + 4.7

0.97 ms against 0.66 a step. torch.compile splits every one of them too (its
``reduction_split_factor``: no shape of the model has enough channels for one kernel; where the
combine of the partials is long it splits that again, a third kernel), in chunks of 128 rows where
the activation is small (32 elements a thread, four a step) and about 1,000 programs' worth
where it is large; a chunk that does not divide the row is masked (weights of 0 and 1). Its
partial kernel is a looped Welford over a tile of 16 channels by 32 rows (four warps) where it has
at most 32768 outputs (chunks x channels), else 64 channels by 8 rows. kiln cut the row in a
power of two of chunks rounded *up* from the 64-row bound (Note [Short chunks of column
reductions]) and halved to divide it: 49 rows at 6272 and 1568 rows, the shapes where its
partial took 1.6-2.7x torch.compile's (98-196 rows: 1.2-1.4x), and up to 1024 partials per
channel for the second kernel to combine. So a Welford column reduction's chunks are at least
``WELFORD_MIN_CHUNK`` rows (128), as many as the program target asks, their count the largest
divisor of the row within those bounds (not only a power of two: 49 chunks of 128 rows at 6272,
196 at 25088, 784 at 100352, 8 of 196 at 1568), and its looped kernel takes torch.compile's tile
(heuristics' ``WELFORD_CHUNK_TILES``; before Note [Welford tiles]). At 401408 and at [100352, 256]
the chunks are as before. This takes back, for Welford reductions, the 49-row chunks of Note
[Short chunks of column reductions] (chosen there from an estimate of programs, not a
measurement); the narrow tile keeps the programs (256 of 16 columns for [1568, 512], 784 for
[6272, 256]). An explicit ``split_outer_min_chunk`` wins over the rule, as over the 64-row bound.
**Not yet run on a GPU** (``scripts/gpu_next.sh call30b``). Switch: ``triton_options=
{"welford_chunks": False}``; ``KILN_LOG=output_code`` prints each split it cuts.

Note [One triple per Welford]: a ``var_mean`` (loopir's var_mean pass merges a BatchNorm's or a
norm's variance and mean into one; CPU graphs so far) is two members over one Welford reduction,
its mean and its m2. Split, each member made its own three partial buffers: the partial kernel
computed the Welford once (Note [One accumulator per reduction of a value] in kernel.py) and
stored it twice, six strided stores a chunk, and the second kernel loaded and combined both
copies (two ``k_welford`` trees over the same numbers). Members whose Welford is the same (sizes,
dtypes and the body rendered over the same index symbols) now share one triple of partials, and
the second kernel combines a triple once for all of its members: three stores, three loads, one
tree. Switch: ``triton_options={"welford_shared": False}``; ``KILN_LOG=output_code`` says which
partial kernels share. Where var + mean stay apart (CUDA graphs today: the pass's Note (c)) the
mean is a plain sum beside the Welford and nothing is shared.

Note [Split reductions under symbolic sizes]: a reduction whose outputs are static and whose
row length ``nr`` is symbolic (``x.sum()`` of an [s0, 1024] activation, a bias gradient's column
sum over s0 tokens) splits as a static one does, with three differences:
- the chunk count ``S`` is chosen from the row length's size hint (the sizes of the call it was
  compiled at; a heuristic, no guard) and stays fixed; the chunk length is the expression
  ``ceil(nr / S)`` (``FloorDiv(nr + S - 1, S)``), so the partial kernel's row length and its
  position ``s * chunk + r`` are expressions in the size symbols, its mask ``s * chunk + r < nr``
  is emitted over them, and the partial buffer (``S * nx``) stays static;
- a Welford reduction stays whole: its chunks must divide the row exactly (a padded position
  would count in the weight), a divisibility fact only a guard could give (recompiles per
  residue class, which kiln never adds: DYNAMIC.md);
- at a run's sizes far below the hint, chunks are short or empty (a row of 2 in 64 chunks: 62
  chunks of nothing, their neutral element): correct, and slower than one whole kernel would be
  there; far above it, there are fewer programs per element than the static heuristics would
  pick. A run-time choice between the two (two kernels and a branch in the wrapper) is not done.
Outputs of symbolic size (a row sum of [s0, 1024]) are not split: they already have a program
per output, and the partial buffer would be symbolic. ``split_symbolic=False`` (a TritonBackend
option) keeps every symbolic kernel whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from kiln_loopir.indexing import FloorDiv, contiguous_strides
from kiln_loopir.ir import ComputedBuffer, Reduction
from kiln_loopir.layout import FixedLayout, Layout, flexible
from kiln_loopir.virtualized import format_body, ops

from .kernel import _int, _real_reduction, next_pow2, unflatten

SPLITTABLE = ("sum", "prod", "max", "min", "any", "welford_reduce")
WELFORD_MIN_CHUNK = 128  # Note [Welford chunks]


@dataclass(frozen=True)
class SplitPlan:
    """The two kernels' members and the partial buffers between them."""

    partials: list[ComputedBuffer]
    first_reads: list[Set[str]]
    second: list[ComputedBuffer]
    second_reads: list[Set[str]]
    chunks: int
    welford_chunks: bool = False  # cut by Note [Welford chunks]
    shared: int = 0  # Welford members that took another's partials (Note [One triple per Welford])


def _neutral(reduction_type: str, dtype: torch.dtype) -> Any:
    if reduction_type == "sum":
        return 0
    if reduction_type == "prod":
        return 1
    if reduction_type == "any":
        return False
    if dtype.is_floating_point:
        return -math.inf if reduction_type == "max" else math.inf
    info = torch.iinfo(dtype)
    return info.min if reduction_type == "max" else info.max


def _static(*sizes: Sequence[Any]) -> bool:
    return all(sympy.sympify(s).is_Integer for group in sizes for s in group)


def plan_split(
    members: Sequence[ComputedBuffer],
    reads: Sequence[Set[str]],
    *,
    outer: bool,
    min_rnumel: int,
    target_programs: int,
    outer_target_programs: int | None = None,
    rows: bool = True,
    outer_min_chunk: int | None = None,
    outer_step: int | None = None,
    rnumel_hint: int | None = None,
    welford_min_chunk: int | None = None,
    shared_welford: bool = True,
) -> SplitPlan | None:
    """How to split this node's reductions (None: it keeps one kernel). An outer (column)
    reduction aims at ``outer_target_programs`` partial programs when given: each of its
    programs walks a narrow tile, so it needs more of them to keep the memory busy, and its
    chunks may be as short as ``outer_min_chunk`` rows (Note [Short chunks of column
    reductions]). ``rows``: Note [The second kernel reduces rows]. ``rnumel_hint``: the row
    length's size hint when it is symbolic (Note [Split reductions under symbolic sizes]; None:
    only static kernels split). ``outer_step``: the rows of one step of a column tile; a static
    column reduction's chunks are whole steps (Note [Partials of a column reduction stay column
    reductions]; None: any length). ``welford_min_chunk``: the shortest chunk of a Welford column
    reduction (Note [Welford chunks]; None: the rule of any other column reduction).
    ``shared_welford``: Note [One triple per Welford]."""
    names = {m.name for m in members}
    real = [m for m in members if _real_reduction(m)]
    if not real:
        return None
    first = real[0]
    ranges, rranges = first.iteration()
    if not all(_static(m.iteration()[0]) for m in members):
        # Note [Split reductions under symbolic sizes]: the outputs must be static
        return None
    symbolic = not all(_static(m.iteration()[1]) for m in members)
    if symbolic and rnumel_hint is None:
        # static kernels only; a static kernel's ranges may hold symbols whose product is static
        # (a dim of 0 beside a symbolic one): nothing to split there
        return None
    nx = math.prod(_int(s) for s in ranges)
    rsizes: list[Any] = [sympy.sympify(s) for s in rranges]
    nr_size: Any = sympy.Mul(*rsizes)  # Note [Split reductions under symbolic sizes]: may be symbolic
    nr = rnumel_hint if symbolic and rnumel_hint is not None else _int(nr_size)
    for member, read in zip(members, reads, strict=True):
        if _real_reduction(member):
            data = member.data
            assert isinstance(data, Reduction)
            if data.reduction_type not in SPLITTABLE or read & names:
                return None  # Welford/argmax, or a reduction of values this node computes
        elif member.is_reduction() or math.prod(_int(s) for s in member.iteration()[0]) != nx:
            return None  # an r-level member: Note [Split reductions]
    if nr < min_rnumel:
        return None
    programs = -(-nx // 64) if outer else nx
    if outer and outer_target_programs is not None:
        target_programs = outer_target_programs  # Note [Bytes per program] in heuristics.py
    if programs >= target_programs:
        return None
    shortest = outer_min_chunk if outer and outer_min_chunk is not None else min_rnumel // 4
    if symbolic and any(_welford(m) for m in real):
        return None  # Note [Split reductions under symbolic sizes]: whole chunks need a guard
    by_rows = bool(outer and welford_min_chunk and any(_welford(m) for m in real))
    if by_rows:
        assert welford_min_chunk is not None
        # Note [Welford chunks]: rows of at least welford_min_chunk, any whole divisor
        bound = min(-(-target_programs // programs), nr // welford_min_chunk, 1024)
        chunks = max((d for d in range(1, bound + 1) if nr % d == 0), default=1)
    else:
        chunks = min(-(-target_programs // programs), nr // max(1, shortest))
        chunks = min(next_pow2(chunks), 1024)
    if any(_welford(m) for m in real):
        while chunks >= 2 and nr % chunks:  # whole chunks only: a padded position would count
            chunks //= 2
    if chunks < 2:
        return None
    chunk: Any = -(-nr // chunks)
    if outer and outer_step and not symbolic and not any(_welford(m) for m in real):
        # Note [Partials of a column reduction stay column reductions]: whole tile steps
        chunk = -(-chunk // outer_step) * outer_step
    chunks = -(-nr // chunk)
    if chunks < 2:
        return None
    if symbolic:  # Note [Split reductions under symbolic sizes]: S from the hint, chunks of ceil(nr / S)
        chunk = FloorDiv(nr_size + chunks - 1, chunks)
    partials: list[ComputedBuffer] = []
    first_reads: list[Set[str]] = []
    second: list[ComputedBuffer] = []
    second_reads: list[Set[str]] = []
    triples: dict[tuple[Any, ...], list[ComputedBuffer]] = {}  # Note [One triple per Welford]
    shared = 0
    for member, read in zip(members, reads, strict=True):
        if not _real_reduction(member):
            second.append(member)
            second_reads.append(read)
            continue
        data = member.data
        assert isinstance(data, Reduction)
        if _welford(member):  # each chunk's (mean, m2, weight), combined by Chan's formula
            key = _welford_key(data) if shared_welford else None
            known = triples.get(key) if key is not None else None
            mine = known or [
                _partial(member, data, chunks, chunk, rows=rows, output_index=i) for i in range(3)
            ]
            if key is not None:
                triples.setdefault(key, mine)
            load, kind, index = _load_partials(mine), "welford_combine", data.output_index
        else:
            known = None
            mine = [_partial(member, data, chunks, chunk, rows=rows)]
            load, kind, index = _load_partial(mine[0]), data.reduction_type, 0
        if known is None:
            partials += mine
            first_reads += [read] * len(mine)
        else:
            shared += 1
        second.append(
            ComputedBuffer(
                member.name,
                member.layout,
                data=Reduction(
                    data.device,
                    data.dtype,
                    load,
                    data.ranges,
                    (sympy.Integer(chunks),),
                    kind,
                    data.dtype,
                    output_index=index,
                    origins=data.origins,
                ),
            )
        )
        second_reads.append(frozenset(p.name for p in mine))
    return SplitPlan(partials, first_reads, second, second_reads, chunks, by_rows, shared)


def _welford_key(data: Reduction) -> tuple[Any, ...]:
    """What makes two Welford members one reduction (Note [One triple per Welford]): their sizes,
    dtypes and the body they reduce, rendered over the same index symbols."""
    index = [sympy.Symbol(f"x{i}", integer=True) for i in range(len(data.ranges))]
    rindex = [sympy.Symbol(f"r{i}", integer=True) for i in range(len(data.reduction_ranges))]
    body = tuple(format_body(data.inner_fn, index, rindex))
    return (tuple(data.ranges), tuple(data.reduction_ranges), data.dtype, data.src_dtype, body)


def _welford(member: ComputedBuffer) -> bool:
    data = member.data
    return isinstance(data, Reduction) and data.reduction_type == "welford_reduce"


def _partial(
    red: ComputedBuffer,
    data: Reduction,
    chunks: int,
    chunk: Any,
    *,
    rows: bool,
    output_index: int | None = None,
) -> ComputedBuffer:
    """The partial reduction of ``red`` over ``chunks`` chunks; for a Welford reduction, the
    chunk statistic ``output_index`` (0 mean, 1 m2, 2 weight) of it.

    Note [Each member splits its own row]: the members of one kernel agree on the number of
    outputs and of reduced positions, not on how those are shaped: a bias gradient summed over
    ``[8, 512]`` tokens and a norm's weight gradient over ``[4096]`` flattened ones share a
    kernel (BERT's training backward). A chunk is a range of the member's own flattened row, cut
    into its own reduced dims, and the partial's outputs are its own: the first member's dims
    given to the second's body were one index short (an IndexError, and the whole graph ran
    unfused: BERT's float32 training on the GPU, 0.84x of eager)."""
    ranges: Sequence[Any] = data.ranges
    rsizes = [sympy.sympify(s) for s in data.reduction_ranges]
    nr = sympy.Mul(*rsizes)
    inner = data.inner_fn
    neutral = _neutral(data.reduction_type, data.dtype)
    exact = sympy.expand(chunk * chunks - nr) == 0

    def body(index: Sequence[Any], rindex: Sequence[Any]) -> Any:
        flat = index[0] * chunk + rindex[0]
        original = unflatten(flat, rsizes)
        if exact:
            return inner(index[1:], original)
        # past the row's end (a symbolic row: Note [Split reductions under symbolic sizes])
        end = ops.constant(int(nr), torch.int64) if nr.is_Integer else ops.index_expr(nr, torch.int64)
        inside = ops.lt(ops.index_expr(flat, torch.int64), end)
        return ops.masked(inside, lambda: inner(index[1:], original), ops.constant(neutral, data.src_dtype))

    partial_ranges = (sympy.Integer(chunks), *ranges)
    suffix = "_partial" if output_index is None else f"_partial{('_mean', '_m2', '_weight')[output_index]}"
    layout: Layout = flexible(data.device, data.dtype, partial_ranges)
    if rows:  # Note [The second kernel reduces rows]: partial[x, s], s contiguous
        strides = contiguous_strides(tuple(ranges))
        layout = FixedLayout(
            data.device,
            data.dtype,
            partial_ranges,
            (sympy.Integer(1), *(sympy.Integer(chunks) * st for st in strides)),
        )
    return ComputedBuffer(
        f"{red.name}{suffix}",
        layout,
        data=Reduction(
            data.device,
            data.dtype,
            body,
            partial_ranges,
            (sympy.sympify(chunk),),
            data.reduction_type,
            data.src_dtype,
            output_index=data.output_index if output_index is None else output_index,
            origins=data.origins,
        ),
    )


def _load_partials(triple: Sequence[ComputedBuffer]) -> Any:
    """The (mean, m2, weight) of a chunk, loaded from a split Welford's three partials."""
    loads = [_load_partial(p) for p in triple]

    def load(index: Sequence[Any], rindex: Sequence[Any]) -> Any:
        return tuple(f(index, rindex) for f in loads)

    return load


def _load_partial(partial: ComputedBuffer) -> Any:
    name, layout = partial.name, partial.layout

    def load(index: Sequence[Any], rindex: Sequence[Any]) -> Any:
        return ops.load(name, layout.indexer([rindex[0], *index]))

    return load


@dataclass(frozen=True)
class Peel:
    """A node's r-level members as a kernel of their own, and the rest (Note [Split reductions])."""

    rows: list[ComputedBuffer]
    rows_reads: list[Set[str]]
    rest: list[ComputedBuffer]
    rest_reads: list[Set[str]]


def peel_rows(
    members: Sequence[ComputedBuffer], reads: Sequence[Set[str]], internal: Set[str]
) -> Peel | None:
    """Split off the r-level (pointwise, full-size) members of a reduction node, if that is legal:
    each of them is stored anyway and reads nothing the node reduces or computes after its
    reduction. None if there is nothing to peel or it is not legal."""
    real = [m for m in members if _real_reduction(m)]
    if not real or not all(_static(m.iteration()[0]) for m in members):
        return None  # symbolic outputs are not split (Note [Split reductions under symbolic sizes])
    nx = math.prod(_int(s) for s in real[0].iteration()[0])
    rows: list[ComputedBuffer] = []
    rows_reads: list[Set[str]] = []
    rest: list[ComputedBuffer] = []
    rest_reads: list[Set[str]] = []
    for member, read in zip(members, reads, strict=True):
        r_level = not member.is_reduction() and math.prod(_int(s) for s in member.iteration()[0]) != nx
        if r_level:
            rows.append(member)
            rows_reads.append(read)
        else:
            rest.append(member)
            rest_reads.append(read)
    if not rows or not rest:
        return None
    later = {m.name for m in rest}
    if any(m.name in internal for m in rows) or any(read & later for read in rows_reads):
        return None
    return Peel(rows, rows_reads, rest, rest_reads)
