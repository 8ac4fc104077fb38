"""One C++ function per scheduled (possibly fused) node: loop nests, phases and the ops handler.

A kernel's members are the ComputedBuffers of one scheduler node. They share one loop nest,
the *reference* iteration space: the first reduction's ``(ranges, reduction_ranges)``, or the
first member's ranges when there is no reduction. Every other member's index is its position in
that space's flat iteration order, re-expressed over its own ranges with ``FloorDiv`` /
``ModularIndexing`` and simplified. This is exactly what the scheduler checked when it fused them:
a producer's flat iteration ``k`` writes what the consumer's flat iteration ``k`` reads.

Note [Phases of a reduction kernel]: inside one iteration of the outer (``x``) loops the members
run in schedule order as *sections*: an x-section holds members with one element per outer
iteration (pointwise epilogues, or producers of the reduction); an r-phase is one loop over the
reduction ranges holding reductions and pointwise members with ``n*r`` elements. A member that
reads a reduction finished in the current r-phase (softmax's normalisation reads its row sum)
opens a new r-phase, so the same row is walked again after the sum completed.

Note [Lane accumulators]: each reduction accumulates into ``L`` = 8 lanes (``acc[l]``) inside an
inner ``#pragma omp simd`` loop of 8 consecutive reduction positions, plus a scalar tail into the
low lanes; after the loop the lanes are combined in a fixed order. The compiler turns the lane
loop into AVX registers (sum, max, argmax and Welford alike) and, because the combination order
depends only on the sizes, results do not depend on the number of threads: threads only ever
split the outer loops, or (``split_r``) fixed chunks of a full reduction combined in order.

Note [Column sums in a row kernel] (the scheduler's half in kiln_loopir's scheduler.py): the
members of a RowColumnSchedulerNode's column part are float sums whose outputs are the kernel's
reduced positions (columns) and whose reduced positions are its rows. Each adds its value into a
per-column block, ``cacc_b[r0] += v``, in whichever r-phase it falls (contiguous along the lane
loop), and stores nothing until the end. The rows run in fixed chunks (at most ROW_CHUNKS, each a
multiple of COLUMN_FOLD rows: decided by the sizes alone, so results do not depend on the thread
count), each chunk with its own float block and double partial (heap arrays of chunks x columns),
the block folded into the partial every COLUMN_FOLD rows (Note [float32 accumulation]); the
threads split the chunks; after them the partials are added in chunk order and stored. Static
sizes only; the column part must be sums only (a bfloat16 column kernel's rounding epilogues
keep it apart). lncol21, one thread, ``bench/layer_norm_ab.py --variants rowcol1,rowcol0``
(LayerNorm(768) over 256 rows, fwd+bwd, loaded 2-core machine): rowcol1 590.9 us against 565.8
(rowcol0) and 552.8 (new, also off): slower, so ``CppOptions.row_column_sums`` is off.
rowcol21, the kernels by themselves (``bench/row_column_kernels.py``, and hand-edited copies of
the generated source, 256 rows of 768, one thread, fastest of 40 rounds of 20 calls): fused 126
us; row kernel 59 + column kernel 32 = 85; eager's native_layer_norm_backward 98-105. Not the
heap: static buffers 123. The fold every COLUMN_FOLD rows ~10 us (123 -> 113 without it), the
``cacc_b[r0] += v`` load + store per vector per sum in the row pass ~35 (84 without the sums): the
pass is bound by its loads and stores, and the sums add two of each to its three loads and one
store. The cure, prototyped by hand and bitwise equal: the last r-phase over a block of
COLUMN_FOLD rows at once, the columns outer (64 at a time) and the block's rows inner, each
column's float block a register (the same float additions in the same row order, then folded into
the double partial), the earlier phases' row values kept in arrays of COLUMN_FOLD: 89 us, still
not below the two kernels' 85 at 256 rows (the operands, 1.5 MB, stay in the 2 MB L2 for the
column kernel); at 1024 rows (operands beyond L2) 437 against 811 fastest (645 against 1011
median, a loaded machine). So: off until the generator emits that row-blocked form (it needs the
last phase re-rendered with a row loop inside the column vectors, and its tails and
multi-dimensional rows handled), and then re-measure at 256 and 1024 rows.

Note [Lanes combined as a tree]: after a row's loop the lanes of a sum, product, max or min
are combined pairwise, ``acc[l] += acc[l + ceil(n/2)]`` for n = L, ceil(L/2), ..., 2 (any L),
not left to right: the left-to-right fold is one dependency chain of L - 1 combines per row (16 double adds of ~4 cycles
after a float32 RMSNorm's 16 lanes, ~60 cycles a row against a row loop of 16 vectors), the tree
log2(L) steps of independent vector operations. The order is still fixed by the sizes alone
(Note [Lane accumulators]). ``CppOptions.tree_lane_combine`` (off: left to right, as before).

Note [More lanes on long rows]: a lane's accumulator is one dependency chain (an add or a
max-and-blend per step, ~4-6 cycles), so 8 lanes in one vector run a row at one vector per chain
latency, not at the load rate. A row reduction whose innermost reduced loop is static and at least
``WIDE_LANES_MIN_ROW`` long takes ``CppOptions.reduction_lanes`` (default 16) lanes instead: the
lane loop of 16 is two vectors, two independent chains, combined in lane order at the end (still
independent of the thread count). cpu17c, one thread, 256 rows of 768 (``bench/minmax_ab.py --old
reduction_lanes=8``): amax 27.7 -> 23.5 us, sum 16.2 -> 15.0, softmax 162 -> 154; bfloat16 amax
43.9 -> 32.6, softmax 309 -> 193. Not in a kernel with a float32 Welford of shifted blocks (Note
[Shifted Welford blocks]): float32 layer norm ran slower with 16 lanes (``bench/layer_norm_ab.py``:
85.8 -> 92.6 us at 768), so such a kernel keeps 8 lanes (a bfloat16 layer norm, whose
statistic is such a float32 one, ran 278 -> 151 us with 16: the cause was its 2-byte loads, Note
[Lanes cover a vector of the narrowest type]). The decision is logged under ``output_code``.

Note [A row's pointwise pass takes two vectors]: the lanes above are for accumulators; an
r-phase that reduces nothing (layer norm's normalisation, ``(x - mean) * rstd * w + b``, after
its statistics; softmax's division after its sum) has none, so its lane count is only how many
positions one step of its loop covers, but it took the kernel's: 8 in a kernel with a Welford of
shifted blocks, and GCC then ran the pass on 256-bit vectors even where the kernels are built for
512. Such a phase (no accumulators, folds or Welford updates, no statement indexed by the lane)
over a static row at least that long takes two vectors of float32 lanes at the build's width (32
at 512 bits, 16 at 256), never fewer than the kernel's lanes. Results are bitwise the same (each
position is computed alone). cpu20c, one thread, layer norm's training forward over 256 rows of
768 (the generated kernel called by itself, fastest of 40 rounds of 20 calls, both orders): 8
lanes 92-110 us, 16 lanes 82-88, 32 lanes 78-86. But in the step (each kernel's fastest call
among 60 interleaved fwd+bwd calls of ``LayerNorm``, the two variants alternating, its buffers as
the step leaves them) it did not hold: rows of 768, training forward 106.4 -> 105.1 us (16 lanes:
115.8 -> 106.9), inference 71.0 -> 70.8 (65.0 -> 66.4); rows of 256, inference 23.8 -> 27.1 (16
lanes: 20.9 -> 24.0), training forward 28.3 -> 31.1. With cold operands the pass is bound by its
loads and stores, not its vectors, and short rows lose to the wider vectors' cost (as in Note
[512-bit vectors on AVX-512 targets]). So ``CppOptions.wide_pointwise_passes`` is off by default
(the kernel's lanes); KILN_LOG=output_code logs each widened pass when it is on.

Note [Lanes cover a vector of the narrowest type]: GCC vectorizes a loop with one vector size
for all its types, the largest whose vector of the loop's narrowest element still fits the trip
count. A lane loop of 8 that loads bfloat16 (2 bytes) therefore runs at 16-byte vectors, 8
uint16 = one xmm, and every float of it in xmm halves and every double in quarters: SSE code on
an AVX-512 machine (GCC: "loop vectorized using 16 byte vectors"). So a row reduction whose
lane loop loads or stores elements narrower than a float takes enough lanes for one 256-bit
vector of them (16 for 2 bytes, 32 for 1 byte; ``CppOptions.vector_width=128`` halves them;
also where the kernels are compiled for 512-bit vectors the lanes cover 256 bits, not 512: Note
[512-bit vectors on AVX-512 targets]),
when its static row is at least that long, over both the lane count above and the Welford
exception. cpu18, one thread, bfloat16 layer norm over 256 rows of 768 (``bench/layer_norm_ab.py
--dtypes bfloat16 --sizes 768``, another process on the second core): forward 336 -> 187 us
(eager 104), forward + backward 822 -> 643 us (eager 535). ``narrow_lanes=0`` keeps the lanes as
above; the choice is logged under ``output_code``.

Note [A small table's columns innermost]: T5's relative-position bias (and Swin's) gathers a
row of a small table, ``bias[h, q, k] = table[bucket(q, k), h]``, into an output laid out heads
first, so the loop order (Note [Loop order counts full-size accesses first]) keeps the head
loop outermost, as the output's stores walk ``k``: every head recomputes the bucket (compares,
a load, mins, the index check) and GCC vectorizes the ``k`` loop with a gather of 64-bit indices
(``vgatherqps``, 8 floats per two instructions; slow where the Gather Data Sampling mitigation
is on). When a pointwise kernel loads a table through indirect indices that do not move with a
loop ``h`` whose variable is the load's contiguous column (coefficient 1) of at most
``TABLE_COLUMNS_MAX`` iterations, and the table has at most ``TABLE_ELEMENTS_MAX`` elements,
``h`` becomes a scalar loop inside the others, after the statements that do not move with it
(the index and its check, computed once for all columns), and the loop around it is no longer
``omp simd`` (vectorized, it would gather again). Only where at least as many statements move
out of ``h`` as stay in it. cpu20b, one thread, T5's decoder bias kernel by itself (a copy of
its source, 4 heads of 128 x 128 from a 32 x 4 table): 67 -> 27 us at 256-bit vectors, 46 ->
25 us at 512. ``CppOptions.table_columns_inner``; the choice is logged under ``output_code``.

Note [Row-invariant values before the row loops]: a row reduction's body is written once per
reduced position, so a value no reduced position changes (the token's embedding index in
Llama's first RMSNorm, read from ``input_ids[x]``, and its bounds check) sits in the lane loop
too. GCC vectorizes the loop but not the index: every lane computes its own 64-bit index and the
row's loads through it become ``vgatherqps`` gathers (slow where the Gather Data Sampling
mitigation is on, as here), though all lanes hold the same index. Before the row loops of a
static, non-empty row, each top-level statement of the body that depends on no reduced loop
variable and only on values hoisted before it (value definitions, indirect indices and their
checks) is emitted once per row; the loads through the index are then contiguous. Only
unconditional statements move (nothing inside a masked block), and only over rows of static
positive length, so a hoisted load runs only where the loop would have run it. cpu19, one
thread, kiln_bench's Llama training step (``bench/kernel_time.py --models suite.llama --ab-cpp
hoist_row_invariant=0``): the four embedding + RMSNorm kernels 306/204/197/182 -> 170/<100/<100/100
us, the step's kernels 3.12 -> 2.71 ms. ``CppOptions.hoist_row_invariant`` (off: as before).

Note [Why scalar C++ and omp simd]: kernels are scalar C++ over float/double with
``#pragma omp simd`` on the innermost loop; GCC vectorizes them at ``-O3 -march=native`` (AVX2
here) and, because prelude.py declares the math functions ``omp declare simd``, calls glibc's
libmvec for exp/log/tanh/erf/... (checked: the objects import ``_ZGVdN8v_expf`` etc.). Measured
on this project's 2-core machine: a translation unit using ATen's ``at::vec`` headers took 19.7 s
to compile against ~1 s for ours (a whole graph's kernels), which alone would miss the goal of
compiling faster than inductor; GCC vector extensions have no vector exp/log and would need
hand-written tails and gathers. Kernel for kernel, the scalar + libmvec code was within ~20% of
eager's own vectorized kernels on row reductions and ahead on fused pointwise chains (see the
benchmark in bench/throughput.py).

Note [Scatter loops and omp simd]: ``#pragma omp simd`` promises GCC that the iterations of the
innermost loop are independent, so it may compute them as lanes of one vector: gather the old
values, add, store back lane by lane. An accumulating scatter (``index_put(accumulate=True)``,
``scatter_add``, embedding's backward) breaks that promise when two lanes can add into the same
element: all but one update are lost (T5's relative-position bias gradient was ~100% off: its
2-d bucket indices put the token loop innermost, and many tokens share a bucket). A scatter
loop is vectorized only along a loop variable ``v`` that provably separates the lanes' targets:
every accumulating store's index is ``c*v + rest``, ``c`` a non-zero integer, where the terms of
``rest`` that may change with ``v`` (through an indirect index: ``KernelBuilder.deps`` tracks the
loop variables each C++ value depends on) are multiples of at least ``|c|`` times ``v``'s trip
count (``_lanes_apart``). Such a variable is put innermost when one exists (an embedding row's
columns); otherwise the loop stays scalar, with a comment in the kernel and a KILN_LOG line.

Note [Symbolic sizes in C++ kernels]: a kernel whose loop sizes are expressions in size symbols
(Note [Symbolic sizes in loopir]) takes each symbol it names as an ``int64_t`` argument after the
pointers (``Kernel.size_params``; the wrapper passes the values it read from the inputs), so one
build serves every size. Loops run to printed bounds (``x0 < s0``), index expressions name the
symbols, and a reduction runs its 8 lanes up to ``s1 / 8 * 8`` and a scalar tail after it. Which
team runs it is decided at run time from the run-time work, times the body's weight at the
hints (Note [Work of a kernel]; ``ntk``: 1 below ``PARALLEL_GRAIN``, else at most one thread per
``MIN_WORK_PER_THREAD``); the outer loops are split (no chunked
inner loop). Only heuristics read the size hints (``sizevars.hint``); correctness never does.
Declined with symbolic sizes (``CodegenUnsupported``, and the graph is compiled static): split
reductions and row stashes (their blocking is static). Accumulating scatters run serially as
they do with static sizes, vectorized only along a loop proved to separate their targets (Note
[Scatter lanes over symbolic sizes]). A static kernel takes exactly the code path it took before.

Note [Column reductions over symbolic lengths]: a column reduction (Note [Column reductions])
blocks its innermost *output* loop; when that one is static (a mean over the `h x w` positions
of a channels-last image of any size and batch, 128 channels), the column plan applies as it is,
the other loops running to run-time bounds (never split into chunks: their chunking is decided
from static lengths; whether to run in parallel is judged at the size hints, the team chosen at
run time as for every symbolic kernel). Before, such a kernel vectorized the reduced
loop instead, whose elements are a channel-stride apart, and at a length of 4 ran all in the
scalar tail: a small CNN's last kernel under `dynamic=True` took 0.77 ms against 0.09 ms static.

Note [Reductions in the earliest phase]: members run in schedule order, and one that reads a
reduction of the current r-phase opens the next phase, so a reduction that reads only the inputs
but comes after such a member in the schedule waits for a later phase: _safe_softmax's
``any(x != -inf)`` ran in the normalising pass, and its ``where`` in a fourth pass that read the
stored softmax back (Swin's window attention). When every member walks the rows, members are
first ordered (stably) by the earliest phase each can run in: one more than the latest phase of
a reduction it reads, the same as a pointwise member it reads. A member still follows everything
it reads, so the values are the same; the ``any`` joins the max's pass and the ``where`` the
normalising one, and the softmax is no longer stored for a fourth pass. Measured on Swin's
window-attention softmax at its size (32 x 2 x 16 rows of 16, one thread, the kernel alone, 400
interleaved calls, fastest): 87 us in four passes, 125 us in three (twice, the same), so
``CppOptions.hoist_reductions`` is off by default: the pass that now holds both the max and the
any, or the normalising pass with the where, is slower than the two it replaces; why (GCC's
code for the pair of lane accumulators of two types) is not diagnosed yet.

Kernel-internal buffers (written and read only inside the kernel) are never stored when every
read of them sees the value in a C++ variable (same index, same loop); otherwise they are stored
and the wrapper allocates them (``Kernel.scratch``).
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from kiln_loopir import sizevars
from kiln_loopir.codegen_common import ALWAYS_BOOL, OpsHandlerBase, marked_store, unmark_stores
from kiln_loopir.codegen_common import real_reduction as _real_reduction
from kiln_loopir.codegen_common import same_size as _same
from kiln_loopir.codegen_common import size_of as _size
from kiln_loopir.codegen_common import unflatten as _unflatten
from kiln_loopir.indexing import (
    contiguous_strides,
    linear_index,
    simplify_index,
    simplify_reordered,
)
from kiln_loopir.ir import ComputedBuffer, ReorderedPointwise, Scatter
from kiln_loopir.origins import source_comment
from kiln_loopir.virtualized import op_names

from .cpp_ops import (
    HALF,
    compute_type,
    constant_expr,
    convert_expr,
    index_to_cpp,
    load_expr,
    round_expr,
    spell,
    storage_type,
    store_expr,
)
from .options import REDUCTION_LANES, CppOptions
from .parallel import (
    MIN_CHUNK,
    ROW_STATEMENT_WEIGHT,
    ParallelPlan,
    call_statements,
    cap_for,
    log_plan,
    outer_plan,
    pointwise_plan,
    split_chunks,
    weighted_work,
)

log = logging.getLogger("kiln.codegen_cpp.output_code")

LANES = 8
# a row reduction whose innermost reduced loop is at least this long takes
# CppOptions.reduction_lanes lanes (Note [More lanes on long rows])
WIDE_LANES_MIN_ROW = 256
# a full reduction (one output) of at least this many elements is split into fixed chunks
SPLIT_R_MIN = 65536

# Note [512-bit vectors on AVX-512 targets] (options.py): the lanes of a row reduction cover at
# most this many bits of its narrowest elements (Note [Lanes cover a vector of the narrowest type])
COVER_BITS_MAX = 256
# Note [A small table's columns innermost]: the most columns (the loop's size) and elements of a
# gathered table whose column loop moves innermost
TABLE_COLUMNS_MAX = 16
TABLE_ELEMENTS_MAX = 16384

# Note [Loops split at their guards]: a pointwise kernel's innermost loop runs as pieces between
# the positions where a comparison of a loop's index with a constant changes answer (a padded
# window's bounds), the same body in each piece, and the loop around it puts its own such positions
# in an `if` around the pieces. GCC 12 vectorizes no load under a mask whose index is not unit-stride
# ("no vectype for MASK_LOAD": a 3x3 max pooling of stride 2 and padding 1, loads 2 apart, masked
# by row and column bounds, was scalar: `scripts/cpp_vector_audit.py`); in a piece and under the
# `if`, its value-range analysis knows each comparison's answer from the loop bounds, the masks fold
# away and the loads are plain strided loads, which it vectorizes. Masked loads of unit stride (a
# `cat`, a stride-1 window) it vectorizes as they are, so only a kernel with a masked load that
# steps by more than one element along its innermost loop is split. ResNet's stem pooling at
# [2, 32, 32, 32] -> 16x16, one thread, by hand on this project's 2-core machine: 230-340 us ->
# 93-130 us, the same bits (the two loops split; the column loop alone stays scalar, since the row
# masks remain). Correct by construction: the pieces run the same iterations in the same order.
# The `if` takes the widest span of the enclosing loop between its points (the interior rows of a
# padded window), the rest of that loop runs the loop unsplit, as before: one more copy of the
# body, not one per span. Pieces cost compile time and code, so: at most SPLIT_MAX_POINTS points
# per loop and SPLIT_MAX_LINES lines of body copies in all; kernels without such comparisons
# (most) are unchanged.
# CppOptions.split_guarded_loops; KILN_LOG=output_code says which loops were split.
SPLIT_MAX_POINTS = 3
SPLIT_MAX_LINES = 1500
_GUARD_OPS = ("ge", "gt", "lt", "le")
_MIRRORED = {"ge": "le", "le": "ge", "gt": "lt", "lt": "gt"}


def _strided_in(expr: sympy.Expr, var: sympy.Expr) -> bool:
    """Does ``expr`` step by more than one element along ``var`` (Note [Loops split at their
    guards]: GCC vectorizes masked loads of unit stride, as a `cat`'s, by itself)?"""
    step = sympy.expand(expr).coeff(var)
    return bool(step.is_Integer) and abs(int(step)) > 1


def _guard_point(a: int, b: int, op: str, c: int) -> int:
    """The first integer ``v`` at which ``a*v + b <op> c`` answers otherwise than at ``v - 1``
    (Note [Loops split at their guards]). Over integers ``>`` is ``>= c + 1`` and ``<``/``<=`` are
    the negations of ``>=``/``>``, so each is ``a*v >= t``, which changes at ``ceil(t / a)``
    where ``a > 0`` and after ``floor(t / a)`` where ``a < 0``."""
    t = (1 if op in ("gt", "le") else 0) - b + c
    return -(-t // a) if a > 0 else t // a + 1


# how a split reduction's combine folds partial `s` of accumulator `a` into it, per reduction kind
# (Note [Split reductions], Note [Reductions with few outputs] in parallel.py)
_PARTIAL_MERGE = {
    "sum": "{a}[l] = {a}[l] + {a}_part[{s}][l];",
    "prod": "{a}[l] = {a}[l] * {a}_part[{s}][l];",
    "any": "{a}[l] = {a}[l] || {a}_part[{s}][l];",
    "max": "{a}[l] = kiln::red_max({a}[l], {a}_part[{s}][l]);",
    "min": "{a}[l] = kiln::red_min({a}[l], {a}_part[{s}][l]);",
    "argmax": "kiln::arg_max_merge({a}[l], {a}_i[l], {a}_part[{s}][l], {a}_i_part[{s}][l]);",
    "argmin": "kiln::arg_min_merge({a}[l], {a}_i[l], {a}_part[{s}][l], {a}_i_part[{s}][l]);",
    "welford": "kiln::welford_merge({a}_mean[l], {a}_m2[l], {a}_w[l], "
    "{a}_mean_part[{s}][l], {a}_m2_part[{s}][l], {a}_w_part[{s}][l]);",
}
SPLIT_R_CHUNK = 32768
# a check of an indirect index or an integer divisor, spelled at render time (Note [Kernel errors])
CHECK_MARK = "\x00check:"
# a later r-phase reads these back from a row stash instead of recomputing them when the row
# takes at most STASH_BYTES (Note [Stashing across phases])
EXPENSIVE = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sigmoid", "erf", "erfc", "erfinv",
    "lgamma", "pow", "atan2", "hypot",
})  # fmt: skip
STASH_BYTES = 65536
# the calls of Notes [Logarithms off libmvec's slow path], [Exponentials off libmvec's slow path]
_GUARDED_LOG = re.compile(r"\bkiln::log(?:2|10)?\(")
_GUARDED_EXP = re.compile(r"\bkiln::exp\(")
_VARIABLE = re.compile(r"\b(?:tmp|ind)\d+\b")  # values and indirect indices
# Note [Indirect indices are common subexpressions]: ``indirect_indexing`` of one value (with one
# extent and check) in one scope returns the index variable made the first time, keyed in the
# scope's CSE table as ``_INDIRECT_KEY`` + value, so a second gather through it (Swin's
# window-attention softmax reads its relative-position bias table twice in its normalising pass:
# once for the softmax, once for ``where(x == -inf)``) is one load, and the values computed from
# it are common subexpressions too. An index variable also joins its r-phase's values (Note
# [Stashing across phases]): a later phase's index is matched with the earlier phase's, so what
# is computed from a gathered value matches across phases, and the softmax's exp is read back
# from the row stash instead of recomputed (with the bias gathered and bounds-checked again)
# in the normalising pass. ``CppOptions.cse_indirect`` (default on) turns both off.
_INDIRECT_KEY = "\x01indirect\x00"
# Note [An index checked once a row]: an indirect index that an earlier r-phase of the kernel made
# from the same value (matched as above) was bounds-checked there at every position of the row, so
# a later phase only clamps it (memory stays safe; an index out of range has already made the
# earlier phase's site the kernel's error). The checks are two max-reductions over int64 per
# element, which AVX2 has no instruction for: T5's attention softmax gathers its position bias
# through one index in each of its three passes over a row, and dropping the two later passes'
# checks took one of these kernels 1240 -> 1080 us at one thread (by hand, the same bits).
# ``CppOptions.check_indices_once`` (off: every phase checks, as before).
_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*\b")
_KERNEL_VALUE = re.compile(r"(?:tmp|ind|stash|acc)\d+")  # names that _new() gives
# Note [Row-invariant values before the row loops]: a value statement or an indirect index
# (``const T tmpN = ...;``, ``int64_t indN = ...;``, ``indN = ...;``) and the lane loop's names
_INVARIANT_CANDIDATE = re.compile(
    r"(?:const [\w:<>]+ (?P<const>tmp\d+)|int64_t (?P<decl>ind\d+)|(?P<assign>ind\d+)) = (?P<expr>.*);"
)
_LANE_NAMES = frozenset({"l", "rb", "rbo", "rbe", "rmain", "winv"})
# a statement that reads or writes lane l's slot of an array (an accumulator)
_LANE_INDEX = re.compile(r"\[l\]")
# ops.* that divide: on integers a zero divisor is an error (Note [Kernel errors])
INT_DIVISION = frozenset({"floordiv", "truncdiv", "mod", "fmod", "remainder"})
# ops that can fail for some operand (an error site): a masked body with one keeps its branch
_CAN_FAIL = INT_DIVISION | {"indirect_indexing"}


def _branch_free(body: Callable[[], Any]) -> bool:
    """Whether a masked body may run where its mask is false (Note [Masked loads without a branch])."""
    try:
        names = op_names(body)
    except Exception:  # an analysis the body does not support: keep the branch
        return False
    return not (names & _CAN_FAIL)


# float32 sums add this many positions per lane in float before folding into double
FOLD_BLOCK = 1024
# Note [Folds after a row's short loops]: a row's float blocks (float32 sums, shifted Welford
# blocks) fold into their double lanes after the innermost row loop, in blocks of FOLD_BLOCK
# positions. Where that loop is short, BatchNorm's statistics over [N, C, H, W] with H * W of
# 4 to 64 (ResNet's later stages at CPU size: rows of 2 x 4 x 4 walked as r0, r1, r2), every
# pass of it ended in a fold of all lanes: 8 shifted_folds, each two double divisions and a
# Welford merge, for 4 positions. The kernels ran at ~19 ns a position (35-39 us for 2048-4096
# positions at one thread), which their weighed work (Note [Work of a kernel] in parallel.py)
# does not see, so they stayed serial at 16 threads too. The fold now goes after the outermost
# row loop that adds no more positions to a lane (the innermost loop's passes, each
# ceil(length / lanes) positions a lane, times the loops inside it) than a block of the
# innermost loop does (FOLD_BLOCK / lanes): so the float accumulation is as accurate as before,
# and a row of 32 folds once. A block folded further out spans several passes of the innermost
# loop, so it is not peeled (Note [Peeled shifted blocks]: the peel sets a block's count from
# one pass's length); shifted_add counts instead. ``CppOptions.fold_short_rows`` (off: after
# every pass, as before). ResNet-50's training step at CPU size here, fastest calls at one
# thread (bench/kernel_time.py --models suite.resnet --threads 1,2): var_mean kernels over rows
# of 32 35 -> 7 us, of 8 39 -> 11 us, of 2048 28 -> 17 us.
# outputs per block in a column reduction (Note [Column reductions])
COLUMN_BLOCK = 64
# a column lane folds its float32 sum into double every this many reduction positions: at
# [4000, 40].sum(0) the largest error against float64 was 1.1e-5 (eager's: 3.8e-5; folding every
# 128 positions, as many as a row lane adds per FOLD_BLOCK: 5e-5), and folding at every position
# ran 2.2x slower (the conversions in the vector loop)
COLUMN_FOLD = 8
# Note [Column sums in a row kernel]: the rows are cut into at most this many chunks (each a
# multiple of COLUMN_FOLD rows), one column partial per chunk
ROW_CHUNKS = 16


def _shifted_step(body: list[str], kind: str) -> list[str]:
    """``body`` with its shifted Welford updates as the block's first (``kiln::shifted_first``)
    or a later (``kiln::shifted_next``) element (Note [Peeled shifted blocks])."""
    return [b.replace("kiln::shifted_add(", f"kiln::shifted_{kind}(") for b in body]


class CodegenUnsupported(Exception):
    """Something the C++ generator does not handle; the backend reports it by name."""


@dataclass(slots=True)
class CppValue:
    """An ops value: a C++ expression (usually a variable) of a dtype."""

    expr: str
    dtype: torch.dtype
    const: bool = False
    py: Any = None

    def __str__(self) -> str:
        return self.expr


@dataclass
class XSection:
    lines: list[str] = field(default_factory=list)


@dataclass
class RPhase:
    pre: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    post: list[str] = field(default_factory=list)
    combine: list[str] = field(default_factory=list)  # lanes -> one value (lane mode)
    pick: list[str] = field(default_factory=list)  # lane l's value (column mode)
    reduced: set[str] = field(default_factory=set)
    cse: dict[str, CppValue] = field(default_factory=dict)  # the phase's unconditional values
    defined: set[str] = field(default_factory=set)  # variables defined in the phase
    stashed: dict[str, str] = field(default_factory=dict)  # variable -> its row stash
    results: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # reduction CSE
    accumulators: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, ctype, name)
    # float32 sums and Welford statistics: lane l's statement that folds its float block
    # accumulators into its double ones and clears them (Note [float32 accumulation])
    folds: list[str] = field(default_factory=list)
    # (ctype, name) of the Welford accumulators updated per element by welford_add, which reads
    # ``winv`` (Note [Welford reciprocal])
    welford_adds: list[tuple[str, str]] = field(default_factory=list)
    shifted: bool = False  # a Welford statistic of shifted blocks (Note [More lanes on long rows])
    shifted_counts: list[str] = field(default_factory=list)  # their blocks' count arrays (``acc_bn``)


@dataclass(frozen=True, slots=True)
class ErrorSite:
    """A run-time check in a kernel; its 1-based position in ``Kernel.errors`` is the code the
    kernel returns when it fails (Note [Kernel errors]).

    ``kind`` is ``"index"`` (an indirect index, ``size`` the extent it must fit) or
    ``"zero_division"`` (an integer ``ops.<op>`` whose divisor was 0).
    """

    kernel: str
    buffer: str
    size: int
    kind: str = "index"
    op: str = ""


@dataclass
class Kernel:
    """The generated function and what the wrapper needs to call it."""

    name: str
    source: str
    params: list[str]
    scratch: list[str]
    errors: list[ErrorSite]
    members: list[str]
    param_types: list[str] = field(default_factory=list)
    release_gil: bool = False
    size_params: list[str] = field(default_factory=list)  # int64_t size symbols, after the pointers


def _int(expr: Any) -> int:
    expr = sympy.sympify(expr)
    if not expr.is_Integer:
        raise CodegenUnsupported(f"symbolic size {expr} (the C++ generator needs static shapes)")
    return int(expr)


def _statements(lines: Sequence[str], lanes: int = 0) -> int:
    """C++ statements among generated lines (not loops, braces, pragmas or comments). With
    ``lanes`` (Note [Statements that cost more than one] in parallel.py): a lane loop on one line
    counts its statement once per lane, and each statement what its calls add."""
    total = 0
    for line in lines:
        text = line.lstrip()
        if ";" not in line or text.startswith(("#", "//")):
            continue
        if lanes and _LANE_LOOP.match(text):
            body = text[text.index(")") + 1 :]
            total += lanes * (body.count(";") + call_statements(body))
        elif not text.startswith(("for ", "for(")):
            total += 1 + (call_statements(text) if lanes else 0)
    return total


# a lane loop on one line: `for (int l = 0; l < KL; ++l) stmt;` (Note [Statements that cost more
# than one] in parallel.py)
_LANE_LOOP = re.compile(r"for \(int l = 0; l < \w+; \+\+l\)")


# Note [Check reductions only where a check is]: the max-reductions of the branch-free checks
# (Note [Kernel errors]) are wanted only on an OpenMP loop whose body updates ``kchk``. On a lane
# loop that does not (the check was hoisted before the row loops: Note [Row-invariant values
# before the row loops]), GCC 12 still makes the clause's per-lane copies and combines them
# after every run of the loop: per 16 lanes a ``vpbroadcastq``/``vpmaxsq``/``vmovq`` round trip
# for each of ``kchk`` and ``kchkv``, two loop-carried chains through the vector unit that set
# the pace of the whole row. T5's embedding + RMSNorm kernel (256 rows of 256, one thread) ran
# 21.8 us against torch.compile's 9.4 us for the same loads and arithmetic. So a loop carries the
# clause only when its body (the lines from its ``for`` to the matching brace) spells a check; a
# loop whose body cannot be delimited keeps it. ``CppOptions.scoped_check_reductions`` (off: on
# every ``omp parallel for`` and ``omp simd`` loop, as before).
_CHECK_REDUCTION = " reduction(max:kchk,kchkv)"


def _loop_body_checks(lines: list[str], pragma: int) -> bool:
    """Whether the loop after the pragma at ``lines[pragma]`` updates ``kchk`` (True when its
    body cannot be delimited by braces)."""
    depth = 0
    opened = False
    for line in lines[pragma + 1 :]:
        if "kchk = " in line:
            return True
        for ch in line:
            if ch == "{":
                depth += 1
                opened = True
            elif ch == "}":
                depth -= 1
        if not opened:
            return True  # a loop without braces: keep the clause
        if depth <= 0:
            return False
    return True


def _with_check_reductions(lines: list[str], scoped: bool = True) -> tuple[list[str], int, int]:
    """Note [Kernel errors]: the OpenMP loops carry the checks' max-reductions; scoped, only
    those whose body has a check (Note [Check reductions only where a check is]). Returns the
    lines and how many loops carry the clause of how many."""
    out: list[str] = []
    loops = carried = 0
    for i, line in enumerate(lines):
        clause = ""
        if line.lstrip().startswith(("#pragma omp parallel for", "#pragma omp simd")):
            loops += 1
            if not scoped or _loop_body_checks(lines, i):
                carried += 1
                clause = _CHECK_REDUCTION
        out.append(line + clause)
    return out, carried, loops


def _spell_checks(lines: list[str], branch_free: bool) -> list[str]:
    """Note [Kernel errors]: each check marker as C++, branch-free (max-reductions) or with an
    ``if`` that stores the site's code (and the index) atomically."""
    out = []
    for line in lines:
        at = line.find(CHECK_MARK)
        if at < 0:
            out.append(line)
            continue
        pad = line[:at]
        var, value, extent, code = line[at + len(CHECK_MARK) :].split("\x00")
        if not var:  # an integer divisor
            if branch_free:
                out.append(
                    f"{pad}kchk = std::max<int64_t>(kchk, {value} == 0 ? INT64_C({code}) : INT64_C(0));"
                )
            else:
                out.append(
                    f"{pad}if ({value} == 0) __atomic_store_n(&kerr, INT64_C({code}), __ATOMIC_RELAXED);"
                )
        elif branch_free:
            bad = f"{var}_bad"
            out.append(f"{pad}const bool {bad} = {var} < 0 || {var} >= {extent};")
            out.append(f"{pad}kchk = std::max<int64_t>(kchk, {bad} ? INT64_C({code}) : INT64_C(0));")
            out.append(
                f"{pad}kchkv = std::max<int64_t>(kchkv, {bad} ? static_cast<int64_t>({value}) : INT64_MIN);"
            )
            out.append(f"{pad}{var} = {bad} ? INT64_C(0) : {var};")
        else:
            out.append(
                f"{pad}if ({var} < 0 || {var} >= {extent}) {{ "
                f"__atomic_store_n(&kiln_err_value, static_cast<int64_t>({value}), __ATOMIC_RELAXED); "
                f"__atomic_store_n(&kerr, INT64_C({code}), __ATOMIC_RELAXED); {var} = 0; }}"
            )
    return out


def _size_factor(term: sympy.Expr) -> sympy.Expr | None:
    """The integer and size-symbol factors of a product (Note [Scatter lanes over symbolic sizes]),
    the rest being integer-valued (loop variables, indirect indices); None for a term that is no
    such product (a non-integer coefficient)."""
    sizes = sizevars.current().hints
    factor: sympy.Expr = sympy.Integer(1)
    for arg in sympy.Mul.make_args(term):
        if arg.is_Number:
            if not arg.is_Integer:
                return None
            factor *= arg
        elif arg in sizes or (arg.is_Pow and arg.base in sizes and arg.exp.is_Integer and arg.exp > 0):
            factor *= arg
    return factor


def _provably_nonnegative(expr: sympy.Expr) -> bool:
    """Whether ``expr`` is >= 0 for every value its symbols' assumptions allow (sizes are
    non-negative integers)."""
    expr = sympy.expand(expr)
    return bool(expr.is_Integer and expr >= 0) or expr.is_nonnegative is True


def _rename(expr: str, mapping: dict[str, str]) -> str:
    """``expr`` with each variable in ``mapping`` replaced by its image."""
    return _VARIABLE.sub(lambda m: mapping.get(m.group(0), m.group(0)), expr)


class KernelBuilder(OpsHandlerBase):
    """Generates one kernel; while members' bodies run it is the ``ops`` handler."""

    value_type = CppValue
    unsupported = CodegenUnsupported

    def __init__(
        self,
        name: str,
        members: Sequence[ComputedBuffer],
        reads: Sequence[Set[str]],
        dtypes: dict[str, torch.dtype],
        internal: set[str],
        options: CppOptions | None = None,
        *,
        aliased: Set[str] = frozenset(),
        columns: Set[str] = frozenset(),
    ) -> None:
        super().__init__(name, members, reads, dtypes, internal)
        # Note [Column sums in a row kernel]: the members that are column sums over the rows, and
        # for each its accumulator's name and block type, and the stores after the row loop
        self.columns = columns
        self.column_member = False
        self.colsums: list[tuple[str, str]] = []
        self.colstores: list[str] = []
        self.aliased = aliased  # buffers that share memory with another parameter
        self.options = options or CppOptions()
        self._teams = 0  # parallel loops given a chunk variable (Note [Teams keep the pool's size])
        self.serial = any(isinstance(m, Scatter) for m in members)
        # Note [Pointwise producers in a column reduction's order] (kiln_loopir's scheduler.py):
        # a reordered producer's body splits the column kernel's flat position ``x0 + 32*r0``
        # into its own digits; those drop the low term (``((x0 + 32*r0) // 32) % 16 -> r0 % 16``
        # for ``x0 < 32``), else every lane divides 64-bit integers (45 against 15 us on Swin)
        self._simplify: Callable[[sympy.Expr, Any], sympy.Expr] = (
            simplify_reordered if any(isinstance(m, ReorderedPointwise) for m in members) else simplify_index
        )
        self.errors: list[ErrorSite] = []
        self.accesses: list[sympy.Expr] = []
        # Note [Scatter loops and omp simd]: the index of every accumulating store, and for each
        # C++ value the names of the loop variables it depends on
        self.accumulates: list[sympy.Expr] = []
        self.deps: dict[str, frozenset[str]] = {}
        # scopes: (lines, cse, forwards); the bottom one is the x-scope
        self.scopes: list[tuple[list[str], dict[str, CppValue], dict[tuple[str, str], CppValue]]] = []
        self.masks: list[str] = []  # the masks around a branch-free masked body
        self.xforward: dict[tuple[str, str], CppValue] = {}
        self.phase: RPhase | None = None
        # Note [Stashing across phases]: the r-phases that are finished, and for each variable
        # of the current phase the variable of an earlier phase that holds the same value
        self.done_phases: list[RPhase] = []
        self.equiv: dict[str, tuple[int, str]] = {}
        self.stash_bytes = 0
        # Note [Parallel plan]: what the parallel rendering of the loop nest chose
        self.plan: ParallelPlan | None = None
        self.weighted = 0  # Note [Work of a kernel]: set by _render
        # Note [Lanes cover a vector of the narrowest type]: the element sizes of the loads and
        # stores that move with the innermost reduced loop (the lane loop)
        self.lane_itemsizes: set[int] = set()
        self.lane_var: sympy.Symbol | None = None
        # Note [A small table's columns innermost]: the loads through an indirect index, and each
        # indirect index's extent
        self.gathers: list[sympy.Expr] = []
        # Note [Loops split at their guards]: integer index values by variable, and the points
        # where a comparison of one loop's index with a constant changes its answer, by loop
        self.index_values: dict[str, sympy.Expr] = {}
        self.guard_points: dict[str, set[int]] = {}
        self.masked_loads: list[sympy.Expr] = []
        self.extents: dict[str, int] = {}

    # ----------------------------------------------------------------------------------- setup

    def build(self) -> Kernel:
        reduction = next((m for m in self.members if _real_reduction(m)), None)
        ref = reduction if reduction is not None else self.members[0]
        xr, rr = ref.iteration()
        # Note [Symbolic sizes in C++ kernels]
        self.symbolic = any(
            not sympy.sympify(s).is_Integer
            for m in self.members
            for s in (*m.iteration()[0], *m.iteration()[1])
        )
        as_size = _size if self.symbolic else _int
        self.xsizes = [as_size(s) for s in xr]
        self.rsizes = [as_size(s) for s in rr] if reduction is not None else []
        self.xvars: list[sympy.Expr] = [
            sympy.Symbol(f"x{i}", integer=True, nonnegative=True) if s != 1 else sympy.Integer(0)
            for i, s in enumerate(self.xsizes)
        ]
        self.rvars: list[sympy.Expr] = [
            sympy.Symbol(f"r{i}", integer=True, nonnegative=True) if s != 1 else sympy.Integer(0)
            for i, s in enumerate(self.rsizes)
        ]
        self.ranges = {
            v: sympy.sympify(s)
            for v, s in zip([*self.xvars, *self.rvars], [*self.xsizes, *self.rsizes], strict=True)
            if isinstance(v, sympy.Symbol)
        }
        self.loop_names = frozenset(str(v) for v in self.ranges)
        self.lane_var = next((v for v in reversed(self.rvars) if isinstance(v, sympy.Symbol)), None)
        self.nx = math.prod(self.xsizes)
        self.nr = math.prod(self.rsizes)
        self.lanes = LANES  # decided at render time, when the accumulators are known
        flat_x = linear_index(self.xvars, contiguous_strides([sympy.sympify(s) for s in self.xsizes]))
        flat_r = linear_index(self.rvars, contiguous_strides([sympy.sympify(s) for s in self.rsizes]))
        if self.symbolic:
            self.nx, self.nr = sympy.expand(self.nx), sympy.expand(self.nr)
        self.flat_r = flat_r
        self.flat_x = flat_x
        if self.options.hoist_reductions and reduction is not None:
            self._hoist_reductions(as_size)
        sections: list[XSection | RPhase] = []
        xlines: list[str] = []
        self.scopes = [(xlines, {}, self.xforward)]
        for member, reads in zip(self.members, self.reads, strict=True):
            mx, mr = member.iteration()
            msizes = [as_size(s) for s in mx]
            numel = sympy.expand(math.prod(msizes)) if self.symbolic else math.prod(msizes)
            self.trivial = member.is_reduction() and not _real_reduction(member)
            if self.trivial:
                # a reduction over one element: its value, computed wherever it fits
                place = "x" if _same(numel, self.nx) else "r"
                if not (_same(numel, self.nx) or _same(numel, self.nx * self.nr)):
                    raise CodegenUnsupported(f"member {member.name} does not fit its kernel's loops")
                if place == "x":
                    index, rindex = (
                        self._map(flat_x, msizes, self.xsizes, self.xvars),
                        [sympy.Integer(0)] * len(mr),
                    )
                else:
                    sizes = [*self.xsizes, *self.rsizes]
                    index = self._map(flat_x * self.nr + flat_r, msizes, sizes, None)
                    rindex = [sympy.Integer(0)] * len(mr)
            elif member.name in self.columns:
                # Note [Column sums in a row kernel]: its outputs are the kernel's columns, its
                # reduced positions the kernel's rows
                if self.symbolic or reduction is None:
                    raise CodegenUnsupported(f"column sum {member.name} needs a row kernel of static sizes")
                if not _same(math.prod(as_size(s) for s in mr), self.nx) or not _same(numel, self.nr):
                    raise CodegenUnsupported(f"column sum {member.name} does not match its row kernel")
                index = self._map(flat_r, msizes, self.rsizes, self.rvars)
                rindex = self._map(flat_x, [as_size(s) for s in mr], self.xsizes, self.xvars)
                place = "r"
            elif member.is_reduction():
                if not _same(math.prod(as_size(s) for s in mr), self.nr) or not _same(numel, self.nx):
                    raise CodegenUnsupported(f"reduction {member.name} does not match its kernel")
                index = self._map(flat_x, msizes, self.xsizes, self.xvars)
                rindex = self._map(flat_r, [as_size(s) for s in mr], self.rsizes, self.rvars)
                place = "r"
            elif _same(numel, self.nx):
                index, rindex, place = self._map(flat_x, msizes, self.xsizes, self.xvars), [], "x"
            elif _same(numel, self.nx * self.nr):
                index = self._map(flat_x * self.nr + flat_r, msizes, [*self.xsizes, *self.rsizes], None)
                rindex, place = [], "r"
            else:
                raise CodegenUnsupported(f"member {member.name} does not fit its kernel's loops")
            if place == "x":
                self._close_phase()
                if not sections or not isinstance(sections[-1], XSection):
                    sections.append(XSection())
                section = sections[-1]
                assert isinstance(section, XSection)
                self.scopes[0] = (section.lines, self.scopes[0][1], self.xforward)
            elif self.phase is None or reads & self.phase.reduced:
                self._close_phase()
                self.phase = RPhase()
                sections.append(self.phase)
                self.scopes.append((self.phase.body, self.phase.cse, {}))
            from kiln_loopir.virtualized import set_ops_handler

            self.column_member = member.name in self.columns
            with set_ops_handler(self):
                member.body()(index, rindex)
            self.column_member = False
            if self.phase is not None and member.name in self.columns:
                pass  # its sums are complete only after the row loop (Note [Column sums in a row kernel])
            elif member.is_reduction() and not self.trivial and self.phase is not None:
                self.phase.reduced.add(member.name)
        self._close_phase()
        return self._render(sections)

    def _hoist_reductions(self, as_size: Callable[[Any], Any]) -> None:
        """Note [Reductions in the earliest phase]: members ordered by the r-phase they can
        first run in (stable), when every member walks the rows (no x-section member, no
        scatter, no reordered producer, static sizes)."""
        if self.symbolic or self.serial:
            return
        for m in self.members:
            if isinstance(m, ReorderedPointwise):
                return
            if _real_reduction(m):
                continue
            if m.is_reduction() or math.prod(as_size(s) for s in m.iteration()[0]) != self.nx * self.nr:
                return
        real = {m.name: _real_reduction(m) for m in self.members}
        level: dict[str, int] = {}
        for m, reads in zip(self.members, self.reads, strict=True):
            level[m.name] = max((level[p] + int(real[p]) for p in reads if p in level), default=0)
        order = sorted(range(len(self.members)), key=lambda i: level[self.members[i].name])
        self.members = [self.members[i] for i in order]
        self.reads = [self.reads[i] for i in order]

    def _map(
        self, flat: sympy.Expr, msizes: list[int], refsizes: list[int], refvars: list[sympy.Expr] | None
    ) -> list[sympy.Expr]:
        if refvars is not None and msizes == refsizes:
            return list(refvars)
        return [self._simplify(e, self.ranges) for e in _unflatten(flat, msizes)]

    def _close_phase(self) -> None:
        if self.phase is not None:
            self.scopes.pop()
            self.done_phases.append(self.phase)
            self.phase = None

    # --------------------------------------------------------------------------------- helpers

    def _cse(self, expr: str, dtype: torch.dtype, const: bool = False, expensive: bool = False) -> CppValue:
        hit = self._computed(expr, dtype)
        if hit is not None:
            return hit
        var = self._new()
        earlier = self._in_earlier_phase(expr, dtype)
        if earlier is not None and expensive and self._may_stash(dtype):
            phase, earlier_var = earlier
            self.lines.append(
                f"const {compute_type(dtype)} {var} = {self._stash(phase, earlier_var, dtype)};"
            )
        else:
            self.lines.append(f"const {compute_type(dtype)} {var} = {expr};")
        if earlier is not None:
            self.equiv[var] = earlier
        if self.phase is not None:
            self.phase.defined.add(var)
        self.deps[var] = self._depends(expr)
        value = CppValue(var, dtype, const)
        self.scopes[-1][1][expr] = value
        return value

    def _depends(self, *texts: str) -> frozenset[str]:
        """The loop variables the C++ expressions ``texts`` depend on (Note [Scatter loops and
        omp simd]); a kernel value of unknown origin counts as depending on every loop."""
        loops = self.loop_names
        out: set[str] = set()
        for text in texts:
            for token in _IDENTIFIER.findall(text):
                if token in loops:
                    out.add(token)
                elif token in self.deps:
                    out |= self.deps[token]
                elif _KERNEL_VALUE.fullmatch(token):
                    out |= loops
        return frozenset(out)

    def _in_earlier_phase(self, expr: str, dtype: torch.dtype) -> tuple[int, str] | None:
        """(phase, variable) of an earlier r-phase that computed ``expr``'s value, if any.

        Note [Stashing across phases]: a kernel's r-phases walk the same row, so a value a later
        phase recomputes (softmax's exp(x - max) in the normalisation, a fused gelu in layer
        norm's second pass) was already computed, under other variable names, by an earlier
        one. ``expr`` is rewritten with each variable of the current phase replaced by its
        counterpart in the earlier phase, and looked up among that phase's values. A cheap hit
        is recomputed (and remembered, so the expressions above it match too); an expensive one
        (a libm call) is read back from a row-sized stack buffer the earlier phase fills.
        """
        if self.phase is None or not self.done_phases:
            return None
        tokens = set(_VARIABLE.findall(expr))
        mine = [t for t in tokens if t in self.phase.defined]
        for p in range(len(self.done_phases) - 1, -1, -1):
            mapping = {}
            for t in mine:
                e = self.equiv.get(t)
                if e is None or e[0] != p:
                    break
                mapping[t] = e[1]
            else:
                canon = _rename(expr, mapping)
                hit = self.done_phases[p].cse.get(canon)
                if hit is not None and hit.dtype == dtype:
                    return p, hit.expr
        return None

    def _may_stash(self, dtype: torch.dtype) -> bool:
        """Stashes live on the stack of each thread: all of a kernel's take at most STASH_BYTES."""
        if self.symbolic:
            return False  # a row of run-time length does not fit a stack array
        size = self.nr * torch.empty((), dtype=dtype).element_size()
        return not self.serial and self.stash_bytes + size <= STASH_BYTES

    def _stash(self, p: int, var: str, dtype: torch.dtype) -> str:
        """``var`` of earlier phase ``p`` at this row position, stored there once per row."""
        phase = self.done_phases[p]
        name = phase.stashed.get(var)
        if name is None:
            name = phase.stashed[var] = self._new("stash")
            self.stash_bytes += max(self.nr, 1) * torch.empty((), dtype=dtype).element_size()
            phase.pre.append(f"{compute_type(dtype)} {name}[{max(self.nr, 1)}];")
            phase.body.append(f"{name}[{index_to_cpp(self.flat_r)}] = {var};")
        return f"{name}[{index_to_cpp(self.flat_r)}]"

    def _as(self, v: CppValue, dtype: torch.dtype) -> CppValue:
        if v.dtype == dtype:
            return v
        if v.const and v.py is not None:
            return CppValue(constant_expr(v.py, dtype), dtype, True, v.py)
        return self._cse(convert_expr(v.expr, v.dtype, dtype), dtype, v.const)

    def _index(self, index: Any, name: str | None = None) -> sympy.Expr:
        expr = self._simplify(sympy.sympify(index), self.ranges)
        self.accesses.append(expr)
        if name is not None and self.lane_var is not None and self.lane_var in expr.free_symbols:
            self.lane_itemsizes.add(self.dtypes[name].itemsize)
        return expr

    # ---------------------------------------------------------------------------- memory ops

    def load(self, name: str, index: Any) -> CppValue:
        expr = self._index(index, name)
        key = (name, str(expr))
        hit = self._forwarded(key)
        if hit is not None:
            return hit
        hit = self.xforward.get(key)
        if hit is not None:
            return hit
        self.loaded.add(name)
        if any(str(sym) in self.extents for sym in expr.free_symbols):
            self.gathers.append(expr)
        dtype = self.dtypes[name]
        offset = index_to_cpp(expr)
        if self.masks:  # Note [Masked loads without a branch]
            offset = f"(({' && '.join(self.masks)}) ? ({offset}) : 0)"
            self.masked_loads.append(expr)  # Note [Loops split at their guards]
        ref = f"{self._param(name)}[{offset}]"
        return self._cse(load_expr(dtype, ref), dtype)

    def store(self, name: str, index: Any, value: Any, mode: str | None = None) -> None:
        expr = self._index(index, name)
        dtype = self.dtypes[name]
        v = self._as(self._value(value, dtype), dtype)
        ref = f"{self._param(name)}[{index_to_cpp(expr)}]"
        self.stored.add(name)
        if mode == "atomic_add":
            self.accumulates.append(expr)
            total = self._cse(f"{load_expr(dtype, ref)} + {v}", dtype)
            total = self._as(CppValue(round_expr(dtype, total.expr), dtype), dtype)
            self.lines.append(marked_store(name, f"{ref} = {store_expr(dtype, total.expr)};"))
            return
        if mode is not None:
            raise CodegenUnsupported(f"store mode {mode}")
        self.lines.append(marked_store(name, f"{ref} = {store_expr(dtype, v.expr)};"))
        self.scopes[-1][2][(name, str(expr))] = v

    def store_reduction(self, name: str, index: Any, value: Any) -> None:
        if self.trivial:
            self.store(name, index, value)
            return
        assert self.phase is not None
        expr = self._index(index)
        dtype = self.dtypes[name]
        v = value if isinstance(value, CppValue) else self._value(value, dtype)
        if v.dtype != dtype:
            v = CppValue(convert_expr(v.expr, v.dtype, dtype), dtype)
        ref = f"{self._param(name)}[{index_to_cpp(expr)}]"
        self.stored.add(name)
        if self.column_member:  # Note [Column sums in a row kernel]: stored after the row loop
            self.colstores.append(marked_store(name, f"{ref} = {store_expr(dtype, v.expr)};"))
            return
        self.phase.post.append(marked_store(name, f"{ref} = {store_expr(dtype, v.expr)};"))
        self.xforward[(name, str(expr))] = v

    def index_expr(self, expr: Any, dtype: torch.dtype) -> CppValue:
        e = self._simplify(sympy.sympify(expr), self.ranges)
        value = self._cse(f"static_cast<{compute_type(dtype)}>({index_to_cpp(e)})", dtype)
        if dtype in (torch.int64, torch.int32) and not value.const:
            self.index_values[value.expr] = e
        return value

    def indirect_indexing(self, value: Any, size: Any, check: bool = True) -> sympy.Symbol:
        v = self._as(self._value(value), torch.int64)
        size = _size(size) if self.symbolic else _int(size)
        # a run-time extent (Note [Symbolic sizes in C++ kernels]); the error names its hint
        n, extent = (
            (size, f"INT64_C({size})") if isinstance(size, int) else (sizevars.hint(size), index_to_cpp(size))
        )
        key = f"{_INDIRECT_KEY}{v.expr}\x00{extent}\x00{int(check)}"
        if self.options.cse_indirect:  # Note [Indirect indices are common subexpressions]
            for _, cse, _ in reversed(self.scopes):
                hit = cse.get(key)
                if hit is not None:
                    return sympy.Symbol(hit.expr, integer=True, nonnegative=True)
        var = self._new("ind")
        self.deps[var] = self._depends(v.expr)
        self.extents[var] = n
        self.lines.append(f"int64_t {var} = {v};")
        self.lines.append(f"{var} = {var} < 0 ? {var} + {extent} : {var};")
        earlier = self._in_earlier_phase(key, torch.int64) if self.options.cse_indirect else None
        if check and earlier is not None and self.options.check_indices_once:
            # Note [An index checked once a row]: an earlier r-phase checked this very index
            self.lines.append(f"{var} = ({var} < 0 || {var} >= {extent}) ? INT64_C(0) : {var};")
        elif check:  # Note [Kernel errors]: spelled at render time, with or without a branch
            code = self._error_site(ErrorSite(self.name, "", n))
            self.lines.append(f"{CHECK_MARK}{var}\x00{v}\x00{extent}\x00{code}")
        if self.options.cse_indirect:
            if earlier is not None:
                self.equiv[var] = earlier
            if self.phase is not None:
                self.phase.defined.add(var)
            self.scopes[-1][1][key] = CppValue(var, torch.int64)
        return sympy.Symbol(var, integer=True, nonnegative=True)  # wrapped into [0, n) above

    def _error_site(self, site: ErrorSite) -> int:
        """Note [Kernel errors]: a failed check makes its site's code (1-based) the kernel's
        return value, and the kernel computes on with a harmless value (index 0, quotient 0); the
        wrapper turns a non-zero return into the Python error the site describes (an index error
        names one offending index, ``kiln_err_value``). Checks inside ``ops.masked`` run only
        where the mask holds, as eager never evaluates there.

        A check is branch-free: it folds into two max-reductions, ``kchk`` (the largest failed
        site's code) and ``kchkv`` (the largest offending index), declared at the top of a
        kernel that has checks, carried by a ``reduction(max:...)`` clause on each of its
        ``omp parallel for`` and ``omp simd`` loops whose body has a check (Note [Check
        reductions only where a check is]), and copied into the return value at the end
        (with two failing index sites, the index named may be the other site's: it was the
        racing threads' last store before). An ``if`` that stores to memory inside the loop body kept GCC from vectorizing it
        ("control flow in loop"): Swin's attention softmax, which gathers its relative-position
        bias through an index, was scalar; its forward kernel ran 193 us at one thread."""
        self.errors.append(site)
        return len(self.errors)

    def _check_divisor(self, name: str, divisor: CppValue) -> None:
        """Integer division and modulo by zero raise in eager ("ZeroDivisionError"); so do we."""
        if divisor.const and divisor.py is not None and int(divisor.py) != 0:
            return
        code = self._error_site(ErrorSite(self.name, "", 0, "zero_division", name))
        self.lines.append(f"{CHECK_MARK}\x00{divisor}\x00\x00{code}")

    # ------------------------------------------------------------------------------ control

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> CppValue:
        m = self._as(self._value(mask), torch.bool)
        if _branch_free(body):
            return self._masked_select(m, body, other)
        inner: list[str] = []
        self.scopes.append((inner, {}, {}))
        try:
            result = self._value(body())
        finally:
            self.scopes.pop()
        dtype = result.dtype
        o = self._as(self._value(other, dtype), dtype)
        var = self._new()
        self.deps[var] = self._depends(m.expr, o.expr, result.expr)
        self.lines.append(f"{compute_type(dtype)} {var} = {o};")
        self.lines.append(f"if ({m}) {{")
        self.lines.extend("  " + line for line in inner)
        self.lines.append(f"  {var} = {result};")
        self.lines.append("}")
        return CppValue(var, dtype)

    def _masked_select(self, m: CppValue, body: Callable[[], Any], other: Any) -> CppValue:
        """Note [Masked loads without a branch]: a masked body that only loads at affine indices
        and computes (no indirect index, no integer division: nothing that can fail) runs for
        every lane, each load's index replaced by 0 where the mask is false (always in bounds),
        and the result selected. GCC 12 does not vectorize loads under an ``if``: a padded 3x3
        max-pool ran 3x slower so. Values computed here stay in their own CSE scope, since a
        clamped load must not stand in for the same load outside the mask."""
        inner: list[str] = []
        self.scopes.append((inner, {}, {}))
        self.masks.append(str(m))
        try:
            result = self._value(body())
        finally:
            self.masks.pop()
            self.scopes.pop()
        self.lines.extend(inner)
        dtype = result.dtype
        o = self._as(self._value(other, dtype), dtype)
        var = self._new()
        self.deps[var] = self._depends(m.expr, o.expr, result.expr)
        self.lines.append(f"const {compute_type(dtype)} {var} = ({m} ? {result} : {o});")
        return CppValue(var, dtype)

    def where(self, cond: Any, a: Any, b: Any) -> CppValue:
        c = self._as(self._value(cond), torch.bool)
        va, vb, dtype = self._where_operands(a, b)
        return self._cse(f"({c} ? {va} : {vb})", dtype, va.const and vb.const)

    def constant(self, value: Any, dtype: torch.dtype) -> CppValue:
        return CppValue(constant_expr(value, dtype), dtype, True, value)

    # --------------------------------------------------------------------------------- math

    def _math(self, name: str, *args: Any) -> CppValue:
        values, out, operand = self._math_operands(name, args)
        if name in _GUARD_OPS and len(values) == 2:
            self._note_guard(name, values[0], values[1])
        if name in INT_DIVISION and not operand.is_floating_point and operand != torch.bool:
            self._check_divisor(name, values[1])
        text = spell(name, operand, *[v.expr for v in values])
        if out in HALF and name not in ALWAYS_BOOL:
            text = round_expr(out, text)
        elif out != operand and name not in ALWAYS_BOOL:
            text = convert_expr(text, operand, out)
        expensive = name in EXPENSIVE and operand.is_floating_point
        return self._cse(text, out, all(v.const for v in values), expensive)

    def _note_guard(self, name: str, a: CppValue, b: CppValue) -> None:
        """Note [Loops split at their guards]: where ``a <name> b`` compares one loop's index (an
        affine integer index value) with an integer constant, the loop position at which its
        answer changes."""
        if a.const and b.expr in self.index_values:
            a, b, name = b, a, _MIRRORED[name]
        e = self.index_values.get(a.expr)
        if e is None or not b.const or not isinstance(b.py, int) or isinstance(b.py, bool):
            return
        symbols = [v for v in e.free_symbols if str(v) in self.loop_names]
        if len(symbols) != 1 or len(e.free_symbols) != 1:
            return
        v = symbols[0]
        poly = sympy.Poly(e, v) if e.is_polynomial(v) else None
        if poly is None or poly.degree() != 1:
            return
        coeff, rest = poly.all_coeffs()
        if not (coeff.is_Integer and rest.is_Integer) or coeff == 0:
            return
        self.guard_points.setdefault(str(v), set()).add(_guard_point(int(coeff), int(rest), name, b.py))

    # ---------------------------------------------------------------------------- reduction

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any) -> Any:
        v = self._value(value)
        if self.trivial:
            return self._reduce_one(dtype, reduction_type, v)
        if self.column_member:
            return self._column_sum(dtype, reduction_type, v)
        phase = self.phase
        if phase is None:
            raise CodegenUnsupported("reduction outside a reduction loop")
        # the same reduction of the same value in one phase is accumulated once (layer norm's
        # Welford mean and m2 are two buffers over one reduction)
        key = (dtype, reduction_type, v.expr, v.dtype)
        if key not in phase.results:
            phase.results[key] = self._reduction(dtype, reduction_type, v, phase)
        return phase.results[key]

    def _column_sum(self, dtype: torch.dtype, reduction_type: str, v: CppValue) -> CppValue:
        """Note [Column sums in a row kernel]: the member's sum over the rows, accumulated per
        column (the kernel's reduced position) into its chunk's block; its value, read after the
        row loop, is the chunks' partials added in chunk order."""
        if reduction_type != "sum" or not dtype.is_floating_point:
            raise CodegenUnsupported(f"a column {reduction_type} of {dtype} in a row kernel")
        acc = self._new("cacc")
        block = "double" if dtype == torch.float64 else "float"
        v = self._as(v, dtype)
        self.colsums.append((acc, block))
        self.lines.append(f"{acc}_b[{index_to_cpp(self.flat_r)}] += {v};")
        result = f"static_cast<{compute_type(dtype)}>({acc}_f)"
        if dtype in HALF:
            result = round_expr(dtype, result)
        return CppValue(result, dtype)

    def _reduction(self, dtype: torch.dtype, reduction_type: str, v: CppValue, phase: RPhase) -> Any:
        acc = self._new("acc")
        # Note [float32 accumulation]: float32 sums add FOLD_BLOCK positions per lane in float,
        # then fold into double lanes (a two-level cascade, full float speed); Welford
        # statistics accumulate in double, from float blocks of shifted sums (Note [Shifted
        # Welford blocks]). A long row or a full reduction stays as accurate as eager's cascade
        # summation.
        wide = dtype == torch.float32 and reduction_type in ("sum", "welford_reduce")
        if reduction_type == "welford_reduce":
            t = "double" if wide else compute_type(dtype)
            v = self._as(v, dtype)
            for part in ("mean", "m2", "w"):
                phase.pre.append(f"{t} {acc}_{part}[KL] = {{}};")
            phase.accumulators.append(("welford", t, acc))
            if wide and self.options.shifted_welford:
                # Note [Shifted Welford blocks]: Welford's update is a subtract and a multiply-add
                # on each lane's dependency chain (its running mean), so a row of float lanes ran
                # at one lane step per ~8 cycles however wide the vector. Per block instead (the
                # FOLD_BLOCK blocks of float sums), a lane keeps its first finite element k and the
                # sums of d = v - k (float) and d * d: one add on each chain. At the block's end
                # the lane's (k + s1 / n, s2 - s1 * s1 / n, n) is merged into its double Welford
                # lanes (Chan's formula), so everything after the fold (lane combine, split and
                # column partials) is Welford's as before. The shift keeps the sums small (s2 -
                # s1 * s1 / n cancels at most a factor n, Samuelson's bound on a sample's distance
                # from the mean). The sums are double: in float (``shifted_welford_float``) the
                # rounding of s1 showed through that cancellation, rows of randn(768) normalized
                # with 4.2e-6 error against eager's 1.7e-6 (25% faster than double sums). cpu17,
                # bench/layer_norm_ab.py at one thread, 256 rows of 768: forward 86 -> 79 us
                # (old -> new, CPU time), error at 1000 + randn 7.9e-4 -> 1.3e-4 (eager 3.3e-4).
                sums = "float" if self.options.shifted_welford_float else "double"
                phase.shifted = True
                phase.shifted_counts.append(f"{acc}_bn")
                for part, ctype in (("k", "float"), ("s1", sums), ("s2", sums), ("n", "float")):
                    phase.pre.append(f"{ctype} {acc}_b{part}[KL] = {{}};")
                # Note [Peeled shifted blocks]: in a row's blocks of FOLD_BLOCK positions (the
                # main lane loop) shifted_add's per-element work beyond the two sums, choosing k
                # while n is 0 and counting n, is moved out of the loop: the block's first lane
                # step is peeled (``shifted_first``: k is the element when finite, else 0, as
                # shifted_add leaves it), the others add only (``shifted_next``), and n is set
                # from the block's length before the fold. The same bits as without the peel; the
                # tail, column blocks and other loops keep shifted_add. ``peel_shifted_blocks``
                # (CppOptions) off: shifted_add everywhere. cpu18b, one thread, forward of 256
                # rows (a script timing eager, peel off, peel on interleaved, medians of 60 x 50
                # calls, CPU time; another process on the second core): 768: 92.7 -> 86.7 us
                # (eager 69.3), 1024: 127.8 -> 124.8 us (eager 93.7). The rest of the gap to eager
                # is elsewhere (the double sums' conversions, the second pass).
                phase.folds.append(
                    f"kiln::shifted_fold({acc}_mean[l], {acc}_m2[l], {acc}_w[l], "
                    f"{acc}_bk[l], {acc}_bs1[l], {acc}_bs2[l], {acc}_bn[l]);"
                )
                self.lines.append(
                    f"kiln::shifted_add({acc}_bk[l], {acc}_bs1[l], {acc}_bs2[l], {acc}_bn[l], {v});"
                )
            else:
                if wide:
                    v = CppValue(f"static_cast<double>({v})", dtype)
                phase.welford_adds.append((t, acc))
                # Note [Welford reciprocal]: ``winv`` is 1 / (count after this element), defined
                # by the loop around the body: one scalar division per lane step where every lane
                # has the same count (the main lane loop, column blocks), per lane elsewhere.
                self.lines.append(f"kiln::welford_add({acc}_mean[l], {acc}_m2[l], {acc}_w[l], {v}, winv);")
            # the mean of no elements is NaN (as eager's, and loopir's interpreter's); m2 stays 0
            nan = f"std::numeric_limits<{t}>::quiet_NaN()"
            phase.pick.append(
                f"{t} {acc}_fmean = {acc}_w[l] == 0 ? {nan} : {acc}_mean[l], {acc}_fm2 = {acc}_m2[l], "
                f"{acc}_fw = {acc}_w[l];"
            )
            phase.combine.append(f"{t} {acc}_fmean = 0, {acc}_fm2 = 0, {acc}_fw = 0;")
            phase.combine.append(
                f"for (int l = 0; l < KL; ++l) kiln::welford_merge({acc}_fmean, {acc}_fm2, {acc}_fw, "
                f"{acc}_mean[l], {acc}_m2[l], {acc}_w[l]);"
            )
            phase.combine.append(f"if ({acc}_fw == 0) {acc}_fmean = {nan};")
            cast = "static_cast<float>" if wide else ""
            return tuple(CppValue(f"{cast}({acc}_f{p})", dtype) for p in ("mean", "m2", "w"))
        if reduction_type in ("argmax", "argmin"):
            vd = v.dtype
            t = compute_type(vd)
            init = (
                "-std::numeric_limits<{t}>::infinity()"
                if reduction_type == "argmax"
                else ("std::numeric_limits<{t}>::infinity()")
            )
            if not vd.is_floating_point:
                init = (
                    "std::numeric_limits<{t}>::lowest()"
                    if reduction_type == "argmax"
                    else ("std::numeric_limits<{t}>::max()")
                )
            init = init.format(t=t)
            phase.pre.append(f"{t} {acc}[KL]; int64_t {acc}_i[KL];")
            phase.pre.append(f"for (int l = 0; l < KL; ++l) {{ {acc}[l] = {init}; {acc}_i[l] = 0; }}")
            fn = "arg_max" if reduction_type == "argmax" else "arg_min"
            self.lines.append(f"kiln::{fn}({acc}[l], {acc}_i[l], {v}, {index_to_cpp(self.flat_r)});")
            phase.pick.append(f"{t} {acc}_fv = {acc}[l]; int64_t {acc}_f = {acc}_i[l];")
            phase.combine.append(f"{t} {acc}_fv = {acc}[0]; int64_t {acc}_f = {acc}_i[0];")
            merge = f"kiln::{fn}_merge({acc}_fv, {acc}_f, {acc}[l], {acc}_i[l]);"
            phase.combine.append(f"for (int l = 1; l < KL; ++l) {merge}")
            phase.accumulators.append((reduction_type, t, acc))
            return CppValue(f"{acc}_f", torch.int64)
        t = compute_type(dtype)
        v = self._as(v, dtype)
        inits = {
            "sum": f"{t}(0)",
            "prod": f"{t}(1)",
            "any": "false",
            "max": (
                f"-std::numeric_limits<{t}>::infinity()"
                if dtype.is_floating_point
                else f"std::numeric_limits<{t}>::lowest()"
            ),
            "min": (
                f"std::numeric_limits<{t}>::infinity()"
                if dtype.is_floating_point
                else f"std::numeric_limits<{t}>::max()"
            ),
        }
        combine = {
            "sum": "{a} + {b}",
            "prod": "{a} * {b}",
            "any": "{a} || {b}",
            "max": "kiln::red_max({a}, {b})",
            "min": "kiln::red_min({a}, {b})",
        }
        if dtype == torch.bool and reduction_type in ("sum", "prod"):
            raise CodegenUnsupported(f"{reduction_type} of bool")
        if dtype == torch.bool:
            # Note [Bool lanes]: max of bools is any, min is all; the lanes are int32 0/1, not
            # bool: 8 one-byte lanes would need a 64-bit vector, which GCC's x86 vectorizer does
            # not have, and the whole lane loop stayed scalar ("no vectype") beside float lanes
            # (the all-masked-row check of a safe softmax)
            t = "int32_t"
            inits = {"any": "0", "max": "0", "min": "1"}
            combine = {"any": "{a} | {b}", "max": "{a} | {b}", "min": "{a} & {b}"}
            v = CppValue(f"static_cast<int32_t>({v})", dtype)
        if reduction_type not in inits:
            raise CodegenUnsupported(f"reduction {reduction_type}")
        fmt = combine[reduction_type]
        if wide:
            # float lanes over blocks of FOLD_BLOCK positions, folded into double lanes
            t = "double"
            phase.pre.append(f"float {acc}_b[KL];")
            phase.pre.append(f"for (int l = 0; l < KL; ++l) {acc}_b[l] = 0.0f;")
            phase.folds.append(f"{acc}[l] += {acc}_b[l]; {acc}_b[l] = 0.0f;")
            self.lines.append(f"{acc}_b[l] = {acc}_b[l] + {v};")
        else:
            self.lines.append(f"{acc}[l] = {fmt.format(a=f'{acc}[l]', b=v)};")
        phase.pre.append(f"{t} {acc}[KL];")
        phase.pre.append(
            f"for (int l = 0; l < KL; ++l) {acc}[l] = {inits[reduction_type].replace('float', t)};"
        )
        phase.pick.append(f"{t} {acc}_f = {acc}[l];")
        if self.options.tree_lane_combine:  # Note [Lanes combined as a tree]
            phase.combine.append(
                f"for (int n = KL; n > 1; n = (n + 1) / 2) for (int l = 0; l < n / 2; ++l) "
                f"{acc}[l] = {fmt.format(a=f'{acc}[l]', b=f'{acc}[l + (n + 1) / 2]')};"
            )
            phase.combine.append(f"{t} {acc}_f = {acc}[0];")
        else:
            phase.combine.append(f"{t} {acc}_f = {acc}[0];")
            phase.combine.append(
                f"for (int l = 1; l < KL; ++l) {acc}_f = {fmt.format(a=f'{acc}_f', b=f'{acc}[l]')};"
            )
        phase.accumulators.append((reduction_type, t, acc))
        result = f"static_cast<float>({acc}_f)" if wide else f"{acc}_f"
        if dtype == torch.bool:  # Note [Bool lanes]
            result = f"({acc}_f != 0)"
        if dtype in HALF:
            result = round_expr(dtype, result)
        return CppValue(result, dtype)

    # ------------------------------------------------------------------------------ render

    def _render(self, sections: list[XSection | RPhase]) -> Kernel:
        self.lanes = self._lanes(sections)
        elided, scratch = self._internal_stores()  # Note [Stores of kernel-internal buffers]

        def clean(lines: list[str]) -> list[str]:
            return unmark_stores(lines, elided)

        used = set()
        for section in [*sections, XSection(self.colstores)]:
            texts = section.lines if isinstance(section, XSection) else [*section.body, *section.post]
            for line in clean(texts):
                for name in self.param_order:
                    if f"p_{name}[" in line:
                        used.add(name)
        params = [n for n in self.param_order if n in used]
        restrict = "" if self.serial else " __restrict__"
        sig = []
        types = []
        for name in params:
            const = "const " if name not in self.stored else ""
            types.append(f"{const}{storage_type(self.dtypes[name])}*")
            sig.append(f"{types[-1]}{'' if name in self.aliased else restrict} p_{name}")
        sig.append("int64_t nt")
        out: list[str] = [
            *source_comment(self.name, self.members, "//"),
            f'extern "C" int64_t {self.name}({", ".join(sig)}) {{',
            "  int64_t kerr = 0;",
            "  (void)nt;",
        ]
        self.weighted = self._weigh(sections, clean)
        rows = bool(self.colsums)  # Note [Column sums in a row kernel]: the row loop in chunks
        split = None if rows else self._split_plan(sections)
        column = split is None and not rows and self._column_mode(sections)
        column_split = self._column_split(sections) if column else None
        body: list[str] = []
        if split is None and not column:
            for section in sections:
                if isinstance(section, XSection):
                    body.extend(clean(section.lines))
                else:
                    body.extend(self._render_phase(section, clean))

        def nest(par: bool) -> list[str]:
            if split is not None:
                return self._render_split(sections, clean, split, par)
            if column:
                return self._render_column(sections, clean, par, column_split)
            if rows:
                return self._render_row_chunks(body, clean, par)
            return self._render_x(body, par)

        # Note [Serial path]: a loop under "#pragma omp parallel for" is compiled into an
        # outlined function that GCC vectorizes worse, and entering a team costs even with
        # if(false); with one thread the kernel takes a plain copy of the same loops (same
        # iteration order and chunking, so the same results).
        parallel, serial = nest(True), nest(False)
        # Note [Kernel errors]: branch-free checks, except in a kernel with an accumulating
        # scatter (its loop rarely vectorizes, and LSTM's embedding gradient ran 2x slower so)
        branch_free = bool(self.errors) and self.options.branch_free_checks and not self.accumulates
        parallel, serial = _spell_checks(parallel, branch_free), _spell_checks(serial, branch_free)
        if branch_free:
            out.append("  int64_t kchk = 0, kchkv = INT64_MIN;")
            scoped = self.options.scoped_check_reductions
            parallel, _, _ = _with_check_reductions(parallel, scoped)
            serial, carried, loops = _with_check_reductions(serial, scoped)
            if scoped:  # Note [Check reductions only where a check is]
                log.debug("%s: check reductions on %d of %d OpenMP loops", self.name, carried, loops)
        outputs = (
            (sizevars.hint(self.nx) if self.symbolic else self.nx) if self.rsizes and self.nr != 1 else None
        )
        log_plan(self.name, self.plan, self._work(), self.weighted, outputs)
        if parallel == serial or self.plan is None or (self.plan.cap <= 1 and not self.symbolic):
            out.extend("  " + line for line in serial)
        else:
            # Note [Parallel plan]: the team is the run-time thread count, capped by the work
            if self.symbolic:  # Note [Symbolic sizes in C++ kernels]: the threshold at run time
                # Note [Work of a kernel]: the body's weight, a whole factor at the size hints
                factor = max(1, self.weighted // max(self._work(), 1))
                work = index_to_cpp(self.nx * sympy.Max(self.nr, 1) * factor)
                out.append(
                    f"  const int64_t ntk = {work} < INT64_C({self.options.parallel_grain}) ? 1 : "
                    f"std::min<int64_t>(nt, std::max<int64_t>(INT64_C(1), {work} / "
                    f"INT64_C({self.options.min_work_per_thread})));"
                )
            else:
                out.append(f"  const int64_t ntk = std::min<int64_t>(nt, INT64_C({self.plan.cap}));")
            out.append("  if (ntk > 1) {")
            out.extend("    " + line for line in parallel)
            out.append("  } else {")
            out.extend("    " + line for line in serial)
            out.append("  }")
        if branch_free:
            out.append("  if (kchk != 0) { kiln_err_value = kchkv; kerr = kchk; }")
        out.append("  return kerr;")
        out.append("}")
        members = [m.name for m in self.members]
        big = self.weighted >= self.options.parallel_grain
        if not self.loaded and any(self._guarded_calls(line) for line in out):
            # Note [Logarithms off libmvec's slow path] (prelude.py): in a kernel that computes
            # from its loop indices alone, GCC's PRE moves the guarded call into the latch of the
            # serial copy's loop, which then does not vectorize
            out = [
                "#pragma GCC push_options",
                '#pragma GCC optimize("no-tree-pre")',
                *out,
                "#pragma GCC pop_options",
            ]
        source = "\n".join(out)
        size_params: list[str] = []
        if sizevars.current().symbolic:
            # Note [Symbolic sizes in C++ kernels]: every size symbol the code names is an argument
            # (also in a kernel of static loops that reads a size as a value: `x.sum() + n.numel()`)
            code = re.sub(r"//[^\n]*", "", source)  # not the origin comments' user lines
            size_params = sorted(
                {str(sym) for sym in sizevars.current().hints if re.search(rf"\b{sym}\b", code)}
            )
            sizes = ", ".join(f"int64_t {p}" for p in size_params)
            source = source.replace("int64_t nt) {", f"{sizes}, int64_t nt) {{", 1) if sizes else source
            types = [*types, *(["int64_t"] * len(size_params))]
        return Kernel(self.name, source, params, scratch, self.errors, members, types, big, size_params)

    def _guarded_calls(self, line: str) -> bool:
        """Does a line of the kernel call a guarded math function (prelude.py's Notes
        [Logarithms off libmvec's slow path], [Exponentials off libmvec's slow path])?"""
        return bool(
            (self.options.guarded_log and _GUARDED_LOG.search(line))
            or (self.options.guarded_exp and _GUARDED_EXP.search(line))
        )

    def _weigh(self, sections: list[XSection | RPhase], clean: Callable[[list[str]], list[str]]) -> int:
        """Note [Work of a kernel]: the element-iterations weighted by the statements of the body
        (at the size hints when symbolic); the element-iterations when ``weighted_work`` is off."""
        work = self._work()
        if not self.options.weighted_work:
            return work
        # Note [Statements that cost more than one] in parallel.py
        lanes = self.lanes if self.options.weigh_statements else 0
        x_statements = r_statements = 0
        for section in sections:
            if isinstance(section, XSection):
                x_statements += _statements(clean(section.lines), lanes)
            else:
                x_statements += _statements([*section.pre, *section.combine, *clean(section.post)], lanes)
                if lanes and section.folds:
                    folds = self._folds_per_row() * lanes
                    x_statements += folds * sum(1 + call_statements(f) for f in section.folds)
                r_statements += _statements(clean(section.body), lanes)
        if self.symbolic:
            nx, nr = sizevars.hint(self.nx), sizevars.hint(self.nr) if self.rsizes else 0
        else:
            nx, nr = self.nx, self.nr if self.rsizes else 0
        # a column reduction's per-output statements run vectorized across a block of outputs
        column = bool(lanes) and self._column_mode(sections)
        row_weight = ROW_STATEMENT_WEIGHT if lanes and not column else 1
        scalar = bool(lanes) and not column and not self.accumulates and self._strided_inner()
        if scalar:  # Note [Statements that cost more than one]: (3), a body GCC leaves scalar
            if nr:
                r_statements *= ROW_STATEMENT_WEIGHT
            else:
                x_statements *= ROW_STATEMENT_WEIGHT
        weighted = weighted_work(nx, nr, x_statements, r_statements, row_weight)
        if lanes:
            log.debug(
                "%s: %d statements a row (each %d), %d an element%s: weighted %d",
                self.name, x_statements, row_weight if nr else 1, r_statements,
                " (a strided access along the vector loop: scalar)" if scalar else "", weighted,
            )  # fmt: skip
        return max(work, weighted)

    def _strided_inner(self) -> bool:
        """Note [Statements that cost more than one], (3): whether an access that moves with
        several loops (not a broadcast row or channel) walks the innermost loop, the one the
        vector loop runs along, with a stride other than 1."""
        if self.rsizes:
            loops = [
                (v, s) for v, s in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol)
            ]
        else:
            loops = [
                (v, s) for v, s in zip(self.xvars, self.xsizes, strict=True) if isinstance(v, sympy.Symbol)
            ]
            loops = self._order_pointwise(loops) if loops else loops
        if not loops:
            return False
        inner = loops[-1][0]
        names = {v for v in (*self.xvars, *self.rvars) if isinstance(v, sympy.Symbol)}
        for a in self.accesses:
            if inner not in a.free_symbols or len(a.free_symbols & names) < 2:
                continue
            try:
                stride = sympy.expand(a).coeff(inner)
            except (TypeError, ValueError):
                continue
            if stride != 1:
                return True
        return False

    def _folds_per_row(self) -> int:
        """How often a row's loops fold their lanes' blocks (Note [Folds after a row's short
        loops]): at the size hints when symbolic."""
        loops = [(v, s) for v, s in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol)]
        if not loops:
            return 1
        if not all(isinstance(s, int) for _, s in loops):
            return max(1, sizevars.hint(self.nr) // FOLD_BLOCK)
        at = self._fold_depth(loops, self.lanes)
        sizes = [s for _, s in loops]
        if at < len(loops) - 1:
            return math.prod(sizes[:at])
        inner = sizes[-1]
        main = inner - inner % self.lanes
        return math.prod(sizes[:-1]) * (-(-main // FOLD_BLOCK) + (inner % self.lanes != 0))

    def _work(self) -> int:
        """Element-iterations of the kernel (at the size hints when symbolic: heuristics only)."""
        if self.symbolic:
            return sizevars.hint(self.nx) * max(sizevars.hint(self.nr), 1)
        return self.nx * max(self.nr, 1)

    def _column_mode(self, sections: list[XSection | RPhase]) -> bool:
        """Note [Column reductions]: reduce with the innermost *output* loop vectorized.

        When the reduced loop walks memory with a large stride and the innermost output loop
        walks it contiguously (``x.sum(0)``), lanes become a block of ``COLUMN_BLOCK`` adjacent
        outputs (all of them when there are fewer): for each reduction position the block is
        updated with contiguous loads, in one vector loop.
        """
        if self.serial or not self.rsizes or not sections or not isinstance(sections[0], RPhase):
            return False
        if any(isinstance(s, RPhase) for s in sections[1:]):
            return False
        xs = [(v, n) for v, n in zip(self.xvars, self.xsizes, strict=True) if isinstance(v, sympy.Symbol)]
        rs = [v for v in self.rvars if isinstance(v, sympy.Symbol)]
        # Note [Column reductions over symbolic lengths]: the blocked output loop must be static
        if not xs or not rs or not isinstance(xs[-1][1], int) or xs[-1][1] < 16:
            return False
        xl, rl = xs[-1][0], rs[-1]
        out_vars = {v for v, _ in xs}
        gathers = self.options.column_gathers
        # (full, broadcast) counts, compared in that order
        x_unit, r_unit = [0, 0], [0, 0]
        for a in self.accesses:
            e = sympy.expand(a)
            # Note [Column reductions through gathers]: the loops an access moves with, through
            # the loops its indirect indices were loaded at
            moves = self._access_loops(e) if gathers else e.free_symbols
            # Only the reduced reads decide (Note [Loop order counts full-size accesses first]):
            # a per-output store or a per-channel parameter is small whichever loop is innermost;
            # so is a read that is the same for every output (layer norm's per-token mean and
            # rstd in its weight gradient, the sum over tokens of grad * (x - mean[t]) * rstd[t]),
            # which only breaks ties.
            if not moves & set(rs):
                continue
            kind = 0 if (xl in moves if gathers else moves & out_vars) else 1
            x_unit[kind] += int(e.coeff(xl) == 1)
            r_unit[kind] += int(e.coeff(rl) == 1)
        return x_unit > r_unit

    # Note [Column reductions through gathers]: a mixture of experts combines its experts'
    # outputs by gathering them back into token order and summing each token's k of them
    # (transformers' ``weighted_out[inv_perm].view(T, K, H).sum(1)``, weighted by the routing
    # probabilities): outputs [T, H], a reduced loop of K = 2, and the one full-size read,
    # ``y[inv[t, k], h]``, contiguous along h. The column decision read its index as ``h + H *
    # ind2``: no reduced variable, so it was skipped, and the index read ``inv[t, k]`` (contiguous
    # along k) made it a row reduction: per output 8 float and 8 double lanes set up, 2
    # positions, a fold and a tree combine, none of it vectorized (Mixtral at batch 32, 8192
    # outputs: 93 us a call at one thread here, the model's slowest kernel). So an access counts with the loops its indirect indices were loaded at
    # (``KernelBuilder.deps``), and a read counts as full-size only if it moves with the
    # innermost output loop: one that does not (the index read, a per-token weight) is the same
    # for every column of a block, a scalar the block's vector loop broadcasts, so it only breaks
    # ties as the per-token statistics above do. The combine then runs as a column reduction
    # over 32 outputs a block: 11 us. The second half of the rule holds without gathers too: a
    # product summed over a shared dim, ``sum_r a[t, r] * b[r, h]`` (a matrix product that
    # reached loopir as a mul and a sum), tied between ``b`` (contiguous along h) and ``a``
    # (along r, the same for every h) and ran as rows, ``b`` read with a stride of H; it is a
    # column reduction now, ``a[t, r]`` broadcast: [64, 48] x [48, 64] 94 -> 6.9 us at one
    # thread (the moe combine alone 89 -> 9.4). ``CppOptions.column_gathers=False`` decides as
    # before.
    def _access_loops(self, expr: sympy.Expr) -> set[sympy.Symbol]:
        """The loop variables an access at ``expr`` moves with: its own, and for each indirect
        index in it (``ind3``) those the index's value was computed from (Note [Column
        reductions through gathers])."""
        out: set[sympy.Symbol] = set()
        for sym in expr.free_symbols:
            if sym in self.ranges:
                out.add(sym)
            elif str(sym) in self.deps:
                names = self.deps[str(sym)]
                out.update(v for v in self.ranges if str(v) in names)
        return out

    def _column_split(self, sections: list[XSection | RPhase]) -> tuple[int, int] | None:
        """(chunk, chunks) of the outermost reduced loop when a column reduction has too few
        column blocks to keep the threads busy (Note [Reductions with few outputs]), else None."""
        if not self.options.split_reductions or self.symbolic:  # chunks of a static length only
            return None
        xs = [n for v, n in zip(self.xvars, self.xsizes, strict=True) if isinstance(v, sympy.Symbol)]
        rs = [n for v, n in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol)]
        units = math.prod(xs[:-1]) * -(-xs[-1] // COLUMN_BLOCK)
        return split_chunks(units, self.nx * self.nr, rs[0], 1)

    def _render_column(
        self,
        sections: list[XSection | RPhase],
        clean: Callable[[list[str]], list[str]],
        par: bool,
        split: tuple[int, int] | None = None,
    ) -> list[str]:
        """Note [Column reductions]; with ``split`` = (chunk, chunks), each (column block, chunk
        of the outermost reduced loop) accumulates a partial block, merged in chunk order (Note
        [Reductions with few outputs])."""
        phase = sections[0]
        assert isinstance(phase, RPhase)
        xs = [(v, n) for v, n in zip(self.xvars, self.xsizes, strict=True) if isinstance(v, sympy.Symbol)]
        rs = [(v, n) for v, n in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol)]
        (xl, xsize), outer = xs[-1], xs[:-1]
        block = min(COLUMN_BLOCK, xsize)  # fewer columns: one block of a constant trip count
        nblocks = -(-xsize // block)
        units = math.prod(n for _, n in outer) * nblocks
        if self.symbolic:  # Note [Column reductions over symbolic lengths]: heuristics at the hints
            units = sizevars.hint(units)
        chunks = split[1] if split is not None else 1
        parallel = par and self.weighted >= self.options.parallel_grain and units * chunks > 1
        parts = {"welford": ("_mean", "_m2", "_w"), "argmax": ("", "_i"), "argmin": ("", "_i")}
        lines: list[str] = []
        if split is not None:
            for kind, t, acc in phase.accumulators:
                for suffix in parts.get(kind, ("",)):
                    ctype = "int64_t" if suffix == "_i" else t
                    lines.append(f"{ctype} {acc}{suffix}_part[{units * chunks}][{block}];")
        # the unit (outer position, column block) the loops below are at, for the partials
        unit = "xblk"
        stride = nblocks
        for var, size in reversed(outer):
            unit = f"{unit} + {stride} * {var}"
            stride *= size
        slot = f"({unit}) * {chunks} + c"
        if parallel:
            collapse = len(outer) + 1 + (split is not None)
            kind = "column" if split is None else "split"
            self.plan = ParallelPlan(
                kind,
                collapse,
                units * chunks,
                cap_for(units * chunks, self.weighted, self.options.min_work_per_thread),
            )
            pre, team = self._team("", [*(n for _, n in outer), nblocks, chunks], static=False)
            lines.extend(pre)
            lines.append(f"#pragma omp parallel for collapse({collapse}) {team}")
        depth = 0
        for var, size in outer:
            lines.append("  " * depth + self._loop(var, size) + " {")
            depth += 1
        pad = "  " * depth
        lines.append(f"{pad}for (int64_t xblk = 0; xblk < INT64_C({nblocks}); ++xblk) {{")
        pad += "  "
        if split is not None:
            lines.append(f"{pad}for (int64_t c = 0; c < INT64_C({chunks}); ++c) {{")
            pad += "  "
            lines.append(f"{pad}const int64_t lo = c * {split[0]};")
            lines.append(f"{pad}const int64_t hi = std::min<int64_t>(lo + {split[0]}, INT64_C({rs[0][1]}));")
        lines.append(f"{pad}const int64_t xb = xblk * {block};")
        lines.append(
            f"{pad}const int xlen = static_cast<int>(std::min<int64_t>({block}, INT64_C({xsize}) - xb));"
        )
        lines.extend(pad + p.replace("KL", str(block)) for p in phase.pre)
        inner = pad
        for i, (var, size) in enumerate(rs):
            if i == 0 and split is not None:
                lines.append(f"{inner}for (int64_t {var} = lo; {var} < hi; ++{var}) {{")
            else:
                lines.append(inner + self._loop(var, size) + " {")
            inner += "  "
        body = clean(phase.body)
        # every output of the block has seen the same reduction positions: flat_r of them (in
        # a split, those of its chunk)
        seen = index_to_cpp(self.flat_r)
        if split is not None:
            seen = f"{seen} - lo * INT64_C({math.prod(n for _, n in rs[1:])})"
        lines.extend(inner + w for w in self._winv(phase, f"{seen} + 1"))
        # a full block has a constant trip count; a partial one (fewer than COLUMN_BLOCK
        # columns, or the last block) is still one vector loop over its xlen lanes
        lines.append(f"{inner}if (xlen == {block}) {{")
        lines.append(f"{inner}  #pragma omp simd")
        lines.append(f"{inner}  for (int l = 0; l < {block}; ++l) {{")
        lines.append(f"{inner}    const int64_t {xl} = xb + l;")
        lines.extend(f"{inner}    {b}" for b in body)
        lines.append(f"{inner}  }}")
        lines.append(f"{inner}}} else {{")
        lines.append(f"{inner}  #pragma omp simd")
        lines.append(f"{inner}  for (int l = 0; l < xlen; ++l) {{")
        lines.append(f"{inner}    const int64_t {xl} = xb + l;")
        lines.extend(f"{inner}    {b}" for b in body)
        lines.append(f"{inner}  }}")
        lines.append(f"{inner}}}")
        # Note [float32 accumulation] in column blocks: each float lane (a column) adds
        # COLUMN_FOLD positions before it folds into its double lane, and once more at the end
        fold = phase.folds
        if fold:
            lines.append(f"{inner}if ((({seen}) + 1) % {COLUMN_FOLD} == 0) {{")
            lines.append(f"{inner}  #pragma omp simd")
            lines.append(f"{inner}  for (int l = 0; l < {block}; ++l) {{ {' '.join(fold)} }}")
            lines.append(f"{inner}}}")
        for _ in rs:
            inner = inner[:-2]
            lines.append(inner + "}")
        if fold:
            lines.append(f"{pad}#pragma omp simd")
            lines.append(f"{pad}for (int l = 0; l < {block}; ++l) {{ {' '.join(fold)} }}")
        if split is not None:
            for kind, _, acc in phase.accumulators:
                for suffix in parts.get(kind, ("",)):
                    lines.append(
                        f"{pad}for (int l = 0; l < xlen; ++l) {acc}{suffix}_part[{slot}][l] = {acc}{suffix}[l];"
                    )
            pad = pad[:-2]
            lines.append(f"{pad}}}")
            lines.append(pad[:-2] + "}")
            for d in range(depth - 1, -1, -1):
                lines.append("  " * d + "}")
            # the combine: per column block, its chunks' partials in order, then the epilogue
            for d, (var, size) in enumerate(outer):
                lines.append("  " * d + self._loop(var, size) + " {")
            lines.append(f"{pad[:-2]}for (int64_t xblk = 0; xblk < INT64_C({nblocks}); ++xblk) {{")
            lines.append(f"{pad}const int64_t xb = xblk * {block};")
            lines.append(
                f"{pad}const int xlen = static_cast<int>(std::min<int64_t>({block}, INT64_C({xsize}) - xb));"
            )
            lines.extend(pad + p.replace("KL", str(block)) for p in phase.pre)
            lines.append(f"{pad}for (int64_t c = 0; c < INT64_C({chunks}); ++c) {{")
            lines.append(f"{pad}  for (int l = 0; l < xlen; ++l) {{")
            for kind, _, acc in phase.accumulators:
                lines.append(f"{pad}    " + _PARTIAL_MERGE[kind].format(a=acc, s=slot))
            lines.append(f"{pad}  }}")
            lines.append(f"{pad}}}")
        lines.append(f"{pad}for (int l = 0; l < xlen; ++l) {{")
        lines.append(f"{pad}  const int64_t {xl} = xb + l;")
        lines.extend(f"{pad}  {b}" for b in phase.pick)
        lines.extend(f"{pad}  {b}" for b in clean(phase.post))
        for section in sections[1:]:
            assert isinstance(section, XSection)
            lines.extend(f"{pad}  {b}" for b in clean(section.lines))
        lines.append(f"{pad}}}")
        lines.append("  " * depth + "}")
        for d in range(depth - 1, -1, -1):
            lines.append("  " * d + "}")
        return lines

    def _render_row_chunks(
        self, body: list[str], clean: Callable[[list[str]], list[str]], par: bool
    ) -> list[str]:
        """Note [Column sums in a row kernel]: the rows in fixed chunks, each with its column
        partials; after the chunks, the partials added in chunk order and stored."""
        nx, nr = self.nx, self.nr
        assert isinstance(nx, int) and isinstance(nr, int)
        chunk = max(COLUMN_FOLD, -(-nx // ROW_CHUNKS))
        chunk = -(-chunk // COLUMN_FOLD) * COLUMN_FOLD
        chunks = -(-nx // chunk)
        xs = [(v, n) for v, n in zip(self.xvars, self.xsizes, strict=True) if isinstance(v, sympy.Symbol)]
        lines: list[str] = []
        for acc, block in self.colsums:
            lines.append(f"double* {acc}_part = new double[{chunks * nr}];")
            lines.append(f"{block}* {acc}_blk = new {block}[{chunks * nr}];")
        if par:
            self.plan = ParallelPlan(
                "rows", 1, chunks, cap_for(chunks, self.weighted, self.options.min_work_per_thread)
            )
            pre, team = self._team("", [chunks])
            lines.extend(pre)
            lines.append(f"#pragma omp parallel for {team}")
        lines.append(f"for (int64_t xc = 0; xc < INT64_C({chunks}); ++xc) {{")
        for acc, block in self.colsums:
            lines.append(f"  {block}* __restrict__ {acc}_b = {acc}_blk + xc * INT64_C({nr});")
            lines.append(f"  double* __restrict__ {acc} = {acc}_part + xc * INT64_C({nr});")
        zero = " ".join(f"{acc}_b[c] = 0; {acc}[c] = 0;" for acc, _ in self.colsums)
        fold = " ".join(f"{acc}[c] += {acc}_b[c]; {acc}_b[c] = 0;" for acc, _ in self.colsums)
        lines.append("  #pragma omp simd")
        lines.append(f"  for (int64_t c = 0; c < INT64_C({nr}); ++c) {{ {zero} }}")
        lines.append(f"  const int64_t xlo = xc * INT64_C({chunk});")
        lines.append(f"  const int64_t xhi = std::min<int64_t>(xlo + INT64_C({chunk}), INT64_C({nx}));")
        lines.append("  for (int64_t xf = xlo; xf < xhi; ++xf) {")
        stride = 1
        for var, size in reversed(xs):
            lines.append(f"    const int64_t {var} = xf / INT64_C({stride}) % INT64_C({size});")
            stride *= size
        lines.extend("    " + b for b in body)
        lines.append(f"    if ((xf - xlo) % {COLUMN_FOLD} == {COLUMN_FOLD - 1} || xf == xhi - 1) {{")
        lines.append("      #pragma omp simd")
        lines.append(f"      for (int64_t c = 0; c < INT64_C({nr}); ++c) {{ {fold} }}")
        lines.append("    }")
        lines.append("  }")
        lines.append("}")
        # the combine: each column's partials in chunk order, on the calling thread
        for acc, _ in self.colsums:
            lines.append(f"for (int64_t xc = 1; xc < INT64_C({chunks}); ++xc) {{")
            lines.append("  #pragma omp simd")
            lines.append(
                f"  for (int64_t c = 0; c < INT64_C({nr}); ++c) {acc}_part[c] += {acc}_part[xc * INT64_C({nr}) + c];"
            )
            lines.append("}")
        rloops = [(v, n) for v, n in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol)]
        for d, (var, size) in enumerate(rloops):
            lines.append("  " * d + self._loop(var, size) + " {")
        pad = "  " * len(rloops)
        flat = index_to_cpp(self.flat_r)
        lines.extend(f"{pad}const double {acc}_f = {acc}_part[{flat}];" for acc, _ in self.colsums)
        lines.extend(pad + line for line in clean(self.colstores))
        for d in range(len(rloops) - 1, -1, -1):
            lines.append("  " * d + "}")
        for acc, _ in self.colsums:
            lines.append(f"delete[] {acc}_part;")
            lines.append(f"delete[] {acc}_blk;")
        return ["{", *("  " + line for line in lines), "}"]

    def _loop(self, var: sympy.Expr, size: Any) -> str:
        if not isinstance(size, int):  # a run-time bound (Note [Symbolic sizes in C++ kernels])
            return f"for (int64_t {var} = 0; {var} < {index_to_cpp(size)}; ++{var})"
        return f"for (int64_t {var} = 0; {var} < INT64_C({size}); ++{var})"

    def _team(
        self, pad: str, sizes: Sequence[Any], times: str = "", static: bool = True
    ) -> tuple[list[str], str]:
        """Note [Teams keep the pool's size]: the lines before a parallel loop whose collapsed
        loops run ``sizes`` iterations (static or symbolic; ``times``: a run-time factor, the
        chunk count of a chunked plan) and the loop's team and schedule clauses (``static``: the
        clauses without full teams name the schedule, as they always did there)."""
        if not self.options.full_teams:
            return [], "num_threads(ntk) schedule(static)" if static else "num_threads(ntk)"
        total = sympy.Mul(*(sympy.Integer(n) if isinstance(n, int) else n for n in sizes))
        count = f"INT64_C({total})" if total.is_Integer else f"({index_to_cpp(total)})"
        if times:
            count = f"{count} * {times}"
        name = f"kch{self._teams}"
        self._teams += 1
        per = f"std::max<int64_t>(INT64_C(1), ({count} + ntk - 1) / ntk)"
        return [f"{pad}const int64_t {name} = {per};"], f"num_threads(nt) schedule(static, {name})"

    def _render_x(self, body: list[str], par: bool) -> list[str]:
        loops = [(v, s) for v, s in zip(self.xvars, self.xsizes, strict=True) if isinstance(v, sympy.Symbol)]
        work = self.weighted  # Note [Work of a kernel]
        # symbolic: always a parallel copy, which the run-time threshold in `_render` chooses
        parallel = par and not self.serial and (self.symbolic or work >= self.options.parallel_grain)
        if not loops:
            return ["{", *("  " + b for b in body), "}"]
        is_reduction = bool(self.rsizes)
        if self.accumulates and is_reduction:
            raise CodegenUnsupported("an accumulating scatter in a reduction kernel")
        lines: list[str] = []
        simd = True
        if not is_reduction:
            loops = self._order_pointwise(loops)
            if self.accumulates:
                loops, simd = self._order_scatter(loops)
                if not simd:
                    lines.append(f"// scatter: targets may repeat along {loops[-1][0]}: not vectorized")
                if not par:  # rendered twice (Note [Serial path]): say it once
                    log.debug(
                        "kernel %s: accumulating scatter %s",
                        self.name,
                        f"vectorized along {loops[-1][0]}" if simd else "not vectorized: targets may repeat",
                    )
        if not is_reduction and not self.accumulates and self.options.table_columns_inner:
            loops, body, column = self._table_columns_inner(loops, body, say=not par)
            if column:
                simd = False
        depth = 0
        outer = loops[:-1] if not is_reduction else loops
        outer_sizes = [size for _, size in outer]
        plan: ParallelPlan | None = None
        if parallel and self.symbolic:
            # Note [Symbolic sizes in C++ kernels]: the outer loops (or the only one) split
            # across threads; the team size is decided at run time in `_render`
            collapse = max(len(outer), 1) if not is_reduction else len(outer)
            units = math.prod(sizevars.hint(size) for _, size in loops[:collapse]) if collapse else 1
            plan = (
                ParallelPlan("outer", collapse, units, cap_for(units, work, self.options.min_work_per_thread))
                if collapse
                else None
            )
        elif parallel:
            if is_reduction:
                plan = outer_plan(
                    outer_sizes, work, self.options.parallel_grain, self.options.min_work_per_thread
                )
            else:
                plan = pointwise_plan(
                    outer_sizes,
                    loops[-1][1],
                    work,
                    self.options.parallel_grain,
                    self.options.min_work_per_thread,
                )
        if plan is not None:
            self.plan = plan
        for i, (var, size) in enumerate(loops):
            pad = "  " * depth
            last = i == len(loops) - 1
            if i == 0 and plan is not None and plan.kind == "chunked":
                # the innermost loop in chunks whose length follows the team (Note [Parallel plan])
                inner_size = loops[-1][1]
                lines.append(
                    f"{pad}const int64_t xch = kiln::chunk_len(INT64_C({inner_size}), "
                    f"INT64_C({math.prod(outer_sizes)}), ntk, {MIN_CHUNK});"
                )
                lines.append(f"{pad}const int64_t xnc = (INT64_C({inner_size}) + xch - 1) / xch;")
            if i == 0 and plan is not None:
                chunked = plan.kind == "chunked"
                sizes = [n for _, n in loops[: plan.collapse - chunked]]
                pre, team = self._team(pad, sizes, "xnc" if chunked else "")
                lines.extend(pre)
                lines.append(f"{pad}#pragma omp parallel for collapse({plan.collapse}) {team}")
            if last and plan is not None and plan.kind == "chunked":
                lines.append(f"{pad}for (int64_t xc = 0; xc < xnc; ++xc) {{")
                lines.append(f"{pad}  const int64_t lo = xc * xch;")
                lines.append(f"{pad}  const int64_t hi = std::min<int64_t>(lo + xch, INT64_C({size}));")
                if simd:
                    lines.append(f"{pad}  #pragma omp simd")
                lines.append(f"{pad}  for (int64_t {var} = lo; {var} < hi; ++{var}) {{")
                depth += 2
                continue
            if last and not is_reduction and simd:
                pieces = self._guard_pieces(loops, plan, body, say=not par)
                if pieces is not None:  # Note [Loops split at their guards]
                    lines.extend(pad + b for b in pieces)
                    for d in range(depth - 1, -1, -1):
                        lines.append("  " * d + "}")
                    return lines
            if last and not is_reduction and simd and not (self.symbolic and i == 0 and plan is not None):
                lines.append(f"{pad}#pragma omp simd")
            lines.append(f"{pad}{self._loop(var, size)} {{")
            depth += 1
        pad = "  " * depth
        lines.extend(pad + b for b in body)
        for d in range(depth - 1, -1, -1):
            lines.append("  " * d + "}")
        return lines

    def _guard_pieces(
        self, loops: list[tuple[sympy.Expr, Any]], plan: ParallelPlan | None, body: list[str], say: bool
    ) -> list[str] | None:
        """Note [Loops split at their guards]: the innermost loop of a pointwise kernel (and its
        body) as pieces between the points where its comparisons change answer, inside an ``if``
        on the widest span of the enclosing loop between its own points (the rest of that loop
        runs the one loop as before); None where nothing is split."""
        if not self.options.split_guarded_loops or self.symbolic:
            return None
        if plan is not None and (plan.kind == "chunked" or plan.collapse >= len(loops)):
            return None
        var, size = loops[-1]
        if not isinstance(size, int) or not any(_strided_in(e, var) for e in self.masked_loads):
            return None
        inner = sorted(p for p in self.guard_points.get(str(var), ()) if 0 < p < size)
        if len(inner) > SPLIT_MAX_POINTS:
            inner = []
        span: list[str] = []
        if len(loops) > 1 and isinstance(loops[-2][1], int):
            outer_var, outer_size = loops[-2]
            outer = sorted(p for p in self.guard_points.get(str(outer_var), ()) if 0 < p < outer_size)
            if 0 < len(outer) <= SPLIT_MAX_POINTS:
                lo, hi = max(itertools.pairwise([0, *outer, outer_size]), key=lambda b: b[1] - b[0])
                span = [f"{outer_var} >= INT64_C({lo})"] * (lo > 0) + [f"{outer_var} < INT64_C({hi})"] * (
                    hi < outer_size
                )
        copies = len(inner) + 1 + bool(span)
        if copies == 1 or copies * len(body) > SPLIT_MAX_LINES:
            return None
        if say:  # rendered twice (Note [Serial path]): say it once
            log.debug(
                "kernel %s: loop %s split at %s%s (%d copies of its body)",
                self.name,
                var,
                inner or "no point",
                f", where {' && '.join(span)}" if span else "",
                copies,
            )
        bounds = [0, *inner, size]
        pad = "  " if span else ""
        lines = [f"if ({' && '.join(span)}) {{"] if span else []
        for lo, hi in itertools.pairwise(bounds):
            lines.append(f"{pad}#pragma omp simd")
            lines.append(f"{pad}for (int64_t {var} = INT64_C({lo}); {var} < INT64_C({hi}); ++{var}) {{")
            lines.extend(f"{pad}  {b}" for b in body)
            lines.append(f"{pad}}}")
        if span:
            lines += ["} else {", "  #pragma omp simd", f"  {self._loop(var, size)} {{"]
            lines += [f"    {b}" for b in body] + ["  }", "}"]
        return lines

    def _table_column(self, loops: list[tuple[sympy.Expr, Any]]) -> tuple[sympy.Symbol, int] | None:
        """Note [A small table's columns innermost]: the loop (and its size) that walks the
        columns of a small table gathered through an index that does not move with it."""
        sizes = {v: s for v, s in loops if isinstance(s, int)}
        innermost = loops[-1][0]
        for expr in self.gathers:
            e = sympy.expand(expr)
            own = [sym for sym in e.free_symbols if sym in sizes or str(sym) in self.loop_names]
            indices = [sym for sym in e.free_symbols if str(sym) in self.extents]
            if len(own) != 1 or not indices or len(own) + len(indices) != len(e.free_symbols):
                continue
            var = own[0]
            if var == innermost or var not in sizes or e.coeff(var) != 1 or var in (e - var).free_symbols:
                continue
            if sizes[var] > TABLE_COLUMNS_MAX:
                continue
            # the index moves with the other loops only (else there is nothing to hoist)
            deps = [self.deps.get(str(i), self.loop_names) for i in indices]
            if any(str(var) in d or not d for d in deps):
                continue
            if sizes[var] * math.prod(self.extents[str(i)] for i in indices) > TABLE_ELEMENTS_MAX:
                continue
            return var, sizes[var]
        return None

    def _table_columns_inner(
        self, loops: list[tuple[sympy.Expr, Any]], body: list[str], say: bool
    ) -> tuple[list[tuple[sympy.Expr, Any]], list[str], bool]:
        """Note [A small table's columns innermost]: (the other loops, the body with the column
        loop inside, after the statements that do not move with it; whether it applied)."""
        found = self._table_column(loops)
        if found is None:
            return loops, body, False
        var, size = found
        hoisted, rest = self._invariant(body, {str(var)})
        if len(hoisted) < len(rest):
            if say:  # rendered twice (Note [Serial path]): say it once
                log.debug(
                    "%s: columns %s of a gathered table stay outer: %d statements move with it, %d do not",
                    self.name,
                    var,
                    len(rest),
                    len(hoisted),
                )
            return loops, body, False
        if say:
            log.debug(
                "%s: the gathered table's columns %s innermost (%d), %d statements once for them",
                self.name,
                var,
                size,
                len(hoisted),
            )
        inner = [*hoisted, f"{self._loop(var, size)} {{", *("  " + r for r in rest), "}"]
        return [(v, s) for v, s in loops if v != var], inner, True

    def _order_scatter(
        self, loops: list[tuple[sympy.Expr, int]]
    ) -> tuple[list[tuple[sympy.Expr, int]], bool]:
        """Note [Scatter loops and omp simd]: (loop order, vectorize?) for an accumulating scatter.

        ``loops`` comes in :meth:`_order_pointwise`'s order. The innermost loop stays when its
        lanes add into distinct elements; else the nearest loop whose lanes do moves innermost;
        with none, the order stays and the innermost loop runs scalar.
        """
        for pos in range(len(loops) - 1, -1, -1):
            var = loops[pos][0]
            if isinstance(var, sympy.Symbol) and self._lanes_apart(var, loops[pos][1]):
                return [*loops[:pos], *loops[pos + 1 :], loops[pos]], True
        return loops, False

    def _lanes_apart(self, var: sympy.Symbol, size: Any) -> bool:
        """Do the ``size`` iterations of loop ``var`` (all else fixed) add into distinct elements?

        Each accumulating store's index must read ``c*var + g + K*f``: ``c`` a non-zero integer,
        ``g`` free of ``var``, and ``f`` the integer-valued terms that may move with ``var``
        (through an indirect index that depends on it) scaled by multiples of a ``K >= |c|*size``
        (``out[idx[i, j], j] += src[i, j]``: ``j + n*idx``). Two lanes then differ by less than
        ``K`` in ``c*var`` and by a multiple of ``K`` in the rest, so never by zero.

        Note [Scatter lanes over symbolic sizes]: with symbolic sizes (``j + s1*idx`` over a loop
        of ``s1``) ``K`` is the polynomial gcd of the moving terms' coefficients, each a product
        of an integer and size symbols (so each is ``K`` times an integer), and ``K >= |c|*size``
        must be provable from the symbols' assumptions (sizes are non-negative); what cannot be
        proved leaves the loop scalar, which is always right.
        """
        for index in self.accumulates:
            expr = sympy.expand(index)
            coeff = expr.coeff(var)
            if not (coeff.is_Integer and coeff != 0):
                return False
            rest = expr - coeff * var
            if var in rest.free_symbols:
                return False
            step: sympy.Expr = sympy.Integer(0)  # gcd of the factors of the terms that move with var
            for term in sympy.Add.make_args(rest):
                moving = [s for s in term.free_symbols if self._moves_with(s, var)]
                if not moving:
                    continue
                factor = _size_factor(term)
                if factor is None:
                    return False
                step = sympy.gcd(step, factor)
            if step != 0 and not _provably_nonnegative(abs(step) - abs(int(coeff)) * size):
                return False
        return True

    def _moves_with(self, symbol: sympy.Symbol, var: sympy.Symbol) -> bool:
        """May ``symbol`` (another loop's variable, or an indirect index) change along ``var``?"""
        name = str(symbol)
        return name not in self.loop_names and str(var) in self.deps.get(name, self.loop_names)

    def _order_pointwise(self, loops: list[tuple[sympy.Expr, int]]) -> list[tuple[sympy.Expr, int]]:
        """Put innermost the loop that most accesses walk with stride 1 (ties: the last dim).

        Note [Loop order counts full-size accesses first]: an access that depends on one loop
        variable only (a per-channel scale, a bias) is a small broadcast buffer that stays in
        cache whichever loop is innermost; counting it would put a channel loop innermost under a
        batch norm and walk the activations with a stride of H*W. Accesses that depend on several
        loop variables decide; broadcast ones only break ties.
        """
        loop_vars = {var for var, _ in loops if isinstance(var, sympy.Symbol)}

        def score(item: tuple[int, tuple[sympy.Expr, int]]) -> tuple[int, int, int]:
            pos, (var, _) = item
            full = broadcast = 0
            for a in self.accesses:
                try:
                    expanded = sympy.expand(a)
                    if expanded.coeff(var) != 1:
                        continue
                except (TypeError, ValueError):
                    continue
                if len(expanded.free_symbols & loop_vars) > 1:
                    full += 1
                else:
                    broadcast += 1
            return (full, broadcast, pos)

        best = max(enumerate(loops), key=score)[0]
        return [*loops[:best], *loops[best + 1 :], loops[best]]

    def _lanes(self, sections: list[XSection | RPhase]) -> int:
        """Note [More lanes on long rows] and Note [Lanes cover a vector of the narrowest type]:
        the lanes of this kernel's row reductions."""
        inner = [s for v, s in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol)]
        want = self.options.reduction_lanes
        static = bool(inner) and isinstance(inner[-1], int)
        lanes = LANES
        if want != LANES and static and inner[-1] >= WIDE_LANES_MIN_ROW:
            if any(isinstance(s, RPhase) and s.shifted for s in sections):
                log.debug("%s: %d lanes (a Welford of shifted blocks)", self.name, LANES)
            else:
                log.debug("%s: %d lanes per row of %d", self.name, want, inner[-1])
                lanes = want
        if self.options.narrow_lanes and static and self.lane_itemsizes:
            # at most 256 bits: Note [512-bit vectors on AVX-512 targets]
            vector_bytes = min(self.options.vector_bits(), COVER_BITS_MAX) // 8
            cover = min(max(REDUCTION_LANES), vector_bytes // min(self.lane_itemsizes))
            if cover > lanes and inner[-1] >= cover:
                log.debug(
                    "%s: %d lanes, a vector of its %d-byte elements (not %d)",
                    self.name,
                    cover,
                    min(self.lane_itemsizes),
                    lanes,
                )
                lanes = cover
        return lanes

    def _phase_lanes(self, phase: RPhase) -> int:
        """Note [A row's pointwise pass takes two vectors]: the lanes of ``phase``'s loop."""
        wide = 2 * self.options.vector_bits() // 32
        if (
            not self.options.wide_pointwise_passes
            or wide <= self.lanes
            or phase.accumulators
            or phase.folds
            or phase.welford_adds
            or phase.shifted
            or any(_LANE_INDEX.search(b) for b in phase.body)
        ):
            return self.lanes
        inner = [s for v, s in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol)]
        if not inner or not isinstance(inner[-1], int) or inner[-1] < wide:
            return self.lanes
        if phase.body:
            log.debug("%s: a pointwise pass over the row in %d lanes (not %d)", self.name, wide, self.lanes)
        return wide

    def _render_phase(self, phase: RPhase, clean: Callable[[list[str]], list[str]]) -> list[str]:
        lines = [p.replace("KL", str(self.lanes)) for p in phase.pre]
        lines.extend(self._render_rloops(phase, clean, None))
        lines.extend(c.replace("KL", str(self.lanes)) for c in phase.combine)
        lines.extend(clean(phase.post))
        return lines

    def _render_rloops(
        self, phase: RPhase, clean: Callable[[list[str]], list[str]], chunk: tuple[str, str] | None
    ) -> list[str]:
        """The reduction loops; ``chunk`` = (lo, hi) bounds the outermost one (split reductions)."""
        lanes = self.lanes if chunk is not None else self._phase_lanes(phase)
        loops = [(v, s) for v, s in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol)]
        body = clean(phase.body)
        lines: list[str] = []
        if loops and self.options.hoist_row_invariant and all(isinstance(s, int) and s > 0 for _, s in loops):
            # Note [Row-invariant values before the row loops]
            hoisted, body = self._row_invariant(body)
            lines.extend(hoisted)
        depth = 0
        folds_at = self._fold_depth(loops, lanes) if phase.folds else len(loops) - 1
        for i, (var, size) in enumerate(loops[:-1]):
            if i == 0 and chunk is not None:
                lines.append(f"for (int64_t {var} = {chunk[0]}; {var} < {chunk[1]}; ++{var}) {{")
            else:
                lines.append("  " * depth + self._loop(var, size) + " {")
            depth += 1
        pad = "  " * depth
        lane_winv = self._winv(phase, None)
        if not loops:
            lines.append(pad + "{")
            lines.append(pad + "  const int l = 0;")
            lines.extend(pad + "  " + w for w in lane_winv)
            lines.extend(pad + "  " + b for b in body)
            lines.extend(f"{pad}  {f}" for f in phase.folds)
            lines.append(pad + "}")
        else:
            var, size = loops[-1]
            if chunk is not None and len(loops) == 1:
                lo, hi = chunk
                lines.append(f"{pad}const int64_t rmain = {lo} + (({hi} - {lo}) / {lanes}) * {lanes};")
                start, main_end, end = lo, "rmain", hi
                has_main = has_tail = True
            elif not isinstance(size, int):  # a run-time length: lanes, then a scalar tail
                n = index_to_cpp(size)
                start, main_end, end = "INT64_C(0)", f"({n} / {lanes} * {lanes})", n
                has_main = has_tail = True
            else:
                main = size - size % lanes
                start, main_end, end = "INT64_C(0)", f"INT64_C({main})", f"INT64_C({size})"
                has_main, has_tail = bool(main), bool(size % lanes)
            fold = [f"for (int l = 0; l < {lanes}; ++l) {{ {f} }}" for f in phase.folds]
            if folds_at < len(loops) - 1:  # Note [Folds after a row's short loops]: further out
                fold = []
            if has_main:
                inner = pad
                origin = start
                if fold:
                    lines.append(
                        f"{pad}for (int64_t rbo = {start}; rbo < {main_end}; rbo += {FOLD_BLOCK}) {{"
                    )
                    lines.append(
                        f"{pad}  const int64_t rbe = std::min<int64_t>(rbo + {FOLD_BLOCK}, {main_end});"
                    )
                    start, stop, inner = "rbo", "rbe", pad + "  "
                else:
                    stop = main_end
                # one loop: every lane has seen (rb - origin) / lanes elements before this one
                uniform = self._winv(phase, f"(rb - {origin}) / {lanes} + 1") if len(loops) == 1 else []
                steps = [(f"{inner}for (int64_t rb = {start}; rb < {stop}; rb += {lanes}) {{", body)]
                peel = bool(fold) and phase.shifted and self.options.peel_shifted_blocks
                if peel:  # Note [Peeled shifted blocks]
                    steps = [
                        (f"{inner}{{ const int64_t rb = {start};", _shifted_step(body, "first")),
                        (
                            f"{inner}for (int64_t rb = {start} + {lanes}; rb < {stop}; rb += {lanes}) {{",
                            _shifted_step(body, "next"),
                        ),
                    ]
                for head, step in steps:
                    lines.append(head)
                    lines.extend(f"{inner}  {w}" for w in uniform)
                    lines.append(f"{inner}  #pragma omp simd")
                    lines.append(f"{inner}  for (int l = 0; l < {lanes}; ++l) {{")
                    lines.append(f"{inner}    const int64_t {var} = rb + l;")
                    lines.extend(f"{inner}    {w}" for w in ([] if uniform else lane_winv))
                    lines.extend(f"{inner}    {b}" for b in step)
                    lines.append(f"{inner}  }}")
                    lines.append(f"{inner}}}")
                if peel:
                    count = f"static_cast<float>(({stop} - {start}) / {lanes})"
                    lines.extend(
                        f"{inner}for (int l = 0; l < {lanes}; ++l) {n}[l] = {count};"
                        for n in phase.shifted_counts
                    )
                if fold:
                    lines.extend(f"{inner}{f}" for f in fold)
                    lines.append(f"{pad}}}")
            if has_tail:
                lines.append(f"{pad}for (int64_t {var} = {main_end}; {var} < {end}; ++{var}) {{")
                lines.append(f"{pad}  const int l = static_cast<int>({var} - {main_end});")
                lines.extend(f"{pad}  {w}" for w in lane_winv)
                lines.extend(f"{pad}  {b}" for b in body)
                lines.append(f"{pad}}}")
                lines.extend(f"{pad}{f}" for f in fold)
        for d in range(depth - 1, -1, -1):
            lines.append("  " * d + "}")
            if d == folds_at and loops and folds_at < len(loops) - 1:
                lines.extend(f"{'  ' * d}for (int l = 0; l < {lanes}; ++l) {{ {f} }}" for f in phase.folds)
        return lines

    def _fold_depth(self, loops: list[tuple[sympy.Symbol, Any]], lanes: int) -> int:
        """Note [Folds after a row's short loops]: the index of the row loop after which the
        lanes' float blocks fold (the innermost loop's, ``len(loops) - 1``, as before: after it,
        in blocks of FOLD_BLOCK positions), the outermost whose loops add at most as many
        positions to a lane as a block of the innermost loop does."""
        innermost = len(loops) - 1
        if not self.options.fold_short_rows or not all(isinstance(s, int) for _, s in loops):
            return innermost
        per_lane = -(-loops[-1][1] // lanes)  # positions a lane adds in one pass of the innermost
        at = innermost
        for i in range(innermost - 1, -1, -1):
            per_lane *= loops[i][1]
            if per_lane > FOLD_BLOCK // lanes:
                break
            at = i
        return at

    def _row_invariant(self, body: list[str]) -> tuple[list[str], list[str]]:
        """Note [Row-invariant values before the row loops]: (statements of ``body`` that no
        reduced position changes, the rest), each in its order."""
        return self._invariant(body, {str(v) for v in self.rvars if isinstance(v, sympy.Symbol)})

    def _invariant(self, body: list[str], rnames: set[str]) -> tuple[list[str], list[str]]:
        """(statements of ``body`` that none of the loops ``rnames`` changes, the rest), each in
        its order: top-level value definitions, indirect indices and their checks whose inputs
        are all hoisted (Note [Row-invariant values before the row loops])."""
        blocked = rnames | _LANE_NAMES
        hoisted: set[str] = set()
        out: list[str] = []
        rest: list[str] = []
        depth = 0
        for line in body:
            var = None
            if depth == 0:
                if line.startswith(CHECK_MARK):
                    checked, value = line[len(CHECK_MARK) :].split("\x00")[:2]
                    ok = checked in hoisted and not (set(_VARIABLE.findall(value)) - hoisted)
                    var = checked if ok else None
                else:
                    m = _INVARIANT_CANDIDATE.fullmatch(line)
                    if m is not None:
                        name = m["const"] or m["decl"] or m["assign"]
                        used = set(_KERNEL_VALUE.findall(m["expr"])) - {name}
                        ok = (
                            (name in hoisted if m["assign"] else name not in hoisted)
                            and not (used - hoisted)
                            and not (set(_IDENTIFIER.findall(m["expr"])) & blocked)
                            and not (self.deps.get(name, self.loop_names) & rnames)
                        )
                        var = name if ok else None
            depth += line.count("{") - line.count("}")
            if var is None:
                rest.append(line)
            else:
                hoisted.add(var)
                out.append(line)
        return out, rest

    def _winv(self, phase: RPhase, count: str | None) -> list[str]:
        """The definition of ``winv`` (Note [Welford reciprocal]) for a body that updates
        Welford lanes: from ``count``, shared by all lanes, or per lane from its weight."""
        if not phase.welford_adds:
            return []
        t, acc = phase.welford_adds[0]
        if count is None:
            return [f"const {t} winv = {t}(1) / ({acc}_w[l] + {t}(1));"]
        return [f"const {t} winv = {t}(1) / static_cast<{t}>({count});"]

    def _split_plan(self, sections: list[XSection | RPhase]) -> tuple[int, int] | None:
        """(chunk, chunks) when a reduction should be split across threads, else None: a full
        reduction (Note [Split reductions]) or one with few outputs (Note [Reductions with few
        outputs]) whose reads walk the reduced loop contiguously (else it is a column reduction);
        never with symbolic sizes (the chunking is decided from static sizes)."""
        if self.symbolic or self.serial or not sections or not self.rsizes:
            return None
        if not isinstance(sections[0], RPhase) or any(isinstance(s, RPhase) for s in sections[1:]):
            return None
        loops = [s for v, s in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol)]
        if not loops:
            return None
        first, inner = loops[0], math.prod(loops[1:])
        if self.nx != 1:
            if not self.options.split_reductions or self._column_mode(sections):
                return None
            return split_chunks(self.nx, self.nx * self.nr, first, self.lanes if len(loops) == 1 else 1)
        if self.nr < SPLIT_R_MIN:
            return None
        chunk = max(1, SPLIT_R_CHUNK // inner)
        if len(loops) == 1:
            chunk = max(self.lanes, chunk - chunk % self.lanes)
        chunks = -(-first // chunk)
        while chunks > 1024:
            chunk *= 2
            chunks = -(-first // chunk)
        return (chunk, chunks) if chunks > 1 else None

    def _render_split(
        self,
        sections: list[XSection | RPhase],
        clean: Callable[[list[str]], list[str]],
        plan: tuple[int, int],
        par: bool,
    ) -> list[str]:
        """Note [Split reductions]: a reduction in fixed chunks, one partial per (output, chunk).

        The chunking depends only on the sizes, and each output's partials are merged in chunk
        order, so the result is the same for any number of threads. A full reduction has one
        output; one with few outputs (Note [Reductions with few outputs]) runs the (outputs x
        chunks) units in one collapsed parallel loop, then merges and runs the epilogue per output.
        """
        phase = sections[0]
        assert isinstance(phase, RPhase)
        chunk, chunks = plan
        first = next(s for v, s in zip(self.rvars, self.rsizes, strict=True) if isinstance(v, sympy.Symbol))
        xs = [(v, n) for v, n in zip(self.xvars, self.xsizes, strict=True) if isinstance(v, sympy.Symbol)]
        slots = self.nx * chunks
        slot = f"xf * {chunks} + c" if xs else "c"
        parts = {"welford": ("_mean", "_m2", "_w"), "argmax": ("", "_i"), "argmin": ("", "_i")}
        lines: list[str] = []
        for kind, t, acc in phase.accumulators:
            for suffix in parts.get(kind, ("",)):
                ctype = "int64_t" if suffix == "_i" else t
                lines.append(f"{ctype} {acc}{suffix}_part[{slots}][{self.lanes}];")
        if par:
            self.plan = ParallelPlan(
                "split", len(xs) + 1, slots, cap_for(slots, self.weighted, self.options.min_work_per_thread)
            )
            pre, team = self._team("", [*(n for _, n in xs), chunks])
            lines.extend(pre)
            lines.append(f"#pragma omp parallel for collapse({len(xs) + 1}) {team}")
        flat = f"const int64_t xf = {index_to_cpp(self.flat_x)};"
        for d, (var, size) in enumerate(xs):
            lines.append("  " * d + self._loop(var, size) + " {")
        pad = "  " * len(xs)
        lines.append(f"{pad}for (int64_t c = 0; c < INT64_C({chunks}); ++c) {{")
        if xs:
            lines.append(f"{pad}  {flat}")
        lines.append(f"{pad}  const int64_t lo = c * {chunk};")
        lines.append(f"{pad}  const int64_t hi = std::min<int64_t>(lo + {chunk}, INT64_C({first}));")
        lines.extend(f"{pad}  " + p.replace("KL", str(self.lanes)) for p in phase.pre)
        lines.extend(f"{pad}  " + b for b in self._render_rloops(phase, clean, ("lo", "hi")))
        for kind, _, acc in phase.accumulators:
            for suffix in parts.get(kind, ("",)):
                lines.append(
                    f"{pad}  for (int l = 0; l < {self.lanes}; ++l) {acc}{suffix}_part[{slot}][l] = {acc}{suffix}[l];"
                )
        lines.append(f"{pad}}}")
        for d in range(len(xs) - 1, -1, -1):
            lines.append("  " * d + "}")
        # the combine: per output, its partials in chunk order, then the epilogue
        for d, (var, size) in enumerate(xs):
            lines.append("  " * d + self._loop(var, size) + " {")
        if xs:
            lines.append(f"{pad}{flat}")
        lines.extend(pad + p.replace("KL", str(self.lanes)) for p in phase.pre)
        lines.append(f"{pad}for (int64_t c = 0; c < INT64_C({chunks}); ++c) {{")
        lines.append(f"{pad}  for (int l = 0; l < {self.lanes}; ++l) {{")
        for kind, _, acc in phase.accumulators:
            lines.append(f"{pad}    " + _PARTIAL_MERGE[kind].format(a=acc, s=slot))
        lines.append(f"{pad}  }}")
        lines.append(f"{pad}}}")
        lines.extend(pad + c.replace("KL", str(self.lanes)) for c in phase.combine)
        lines.extend(pad + c for c in clean(phase.post))
        for section in sections[1:]:
            assert isinstance(section, XSection)
            lines.extend(pad + c for c in clean(section.lines))
        for d in range(len(xs) - 1, -1, -1):
            lines.append("  " * d + "}")
        return ["{", *("  " + line for line in lines), "}"]
