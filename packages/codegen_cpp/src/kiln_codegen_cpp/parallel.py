"""Which loops of a kernel run in parallel, in how many pieces, and on how many threads.

Note [Parallel plan]: a kernel's thread count is read at *run time*: the wrapper passes
``torch.get_num_threads()`` to every kernel call (``nt``), so ``torch.set_num_threads`` changes
compiled kernels' parallelism without a recompile (kiln's kernels run in torch's own OpenMP
runtime: the objects link ``libgomp.so.1``, which is the one torch already loaded, so the two
share one thread pool and ``omp_get_max_threads()`` follows ``torch.set_num_threads`` too; the
tests check both). What is decided at *compile time*, from the static sizes, is the shape of the
parallel loop (:class:`ParallelPlan`):

* ``units``: how many independent pieces of work the parallel loop has (outer iterations of a
  reduction, blocks of a column reduction, chunks of a split reduction, outer iterations times
  inner chunks of a pointwise kernel);
* ``cap``: the most threads worth using, ``min(units, work // MIN_WORK_PER_THREAD)``, so that a
  medium kernel (64K elements) does not wake 16 threads for 4K elements each. At run time the
  kernel gives its work to ``ntk = min(nt, cap)`` threads (of a team of ``nt``: Note [Teams keep
  the pool's size]), and with ``ntk == 1`` runs its serial copy (Note [Serial path] in
  kernel.py); a kernel below ``PARALLEL_GRAIN`` element-iterations (weighted by its body: Note
  [Work of a kernel]) has no parallel region at all, so adjacent tiny kernels never open one team
  each.

Pointwise kernels: when the outer loops alone have fewer than ``TARGET_UNITS`` iterations (a
[4, 1M] tensor, or one flat loop), the innermost loop is cut into chunks as well and collapsed
with them; the chunk length is computed at run time from ``ntk`` (about four chunks per thread, at
least ``MIN_CHUNK`` elements, a multiple of 16 so vector loops stay whole), since pointwise
results do not depend on how the loop is cut. Reductions are parallel over their outputs only
(lane accumulators make the result independent of the thread count: Note [Lane accumulators]);
a full reduction (one output) is split into fixed chunks combined in order (Note [Split
reductions]), whose number depends on the sizes alone.

Note [Teams keep the pool's size]: libgomp keeps one pool of threads per calling thread, sized
by the last team: a region asking for fewer threads than the last one releases the pool's
surplus threads, which end, and the next larger region creates them again (pthread_create,
fresh stacks, their first page faults). torch's own loops never ask for fewer (ATen opens the
whole team and idles the threads its grain leaves out, for this reason), nor did MKL in the
traces of the twenty-fourth session (it asks for torch's count), so every kiln kernel whose plan
capped its team below ``nt`` ended ``nt - ntk`` threads, and the next extern or kernel made them
again: ConvNeXt at 16 threads (cpu size) created 8 threads a call here (88 page faults a call),
none with full teams; on the 16-core host it ran slower at 16 threads than at 4 (1.44 against
1.21 ms, 2026-12-06-h100host-s23-threads), not yet measured with them. So each parallel loop
opens a team of all ``nt`` threads and hands its collapsed iterations to ``ntk`` of them in
chunks of ``ceil(units / ntk)`` (``schedule(static, kchN)``: chunk ``i`` goes to thread ``i``,
the threads past the last chunk only meet the barrier); which thread runs which iteration is all
that changes, never how the work is cut (split and column partials, chunked plans' lengths
follow ``ntk`` as before), so results are the same. ``CppOptions.full_teams=False`` asks for ``num_threads(ntk)`` as before;
``scripts/omp_probe.py`` counts the threads each call creates.

Note [Reductions with few outputs]: a reduction with fewer than ``FEW_OUTPUTS`` parallel units
(2..15 rows of a row reduction, or column blocks of a column reduction: the bias gradient of a
[2048, 256] activation has 4 blocks of 64 columns) would run on that many threads whatever the
team. Its outermost reduced loop is then cut into chunks too (:func:`split_chunks`: about
``TARGET_UNITS`` units in all, each of ``MIN_SPLIT_WORK`` element-iterations at least), each
(output, chunk) unit accumulates a partial, and a combine step merges each output's partials in
chunk order. The chunking depends on the sizes alone, so results are the same at any thread
count (and differ from the unsplit kernel's only in summation order). ``CppOptions.split_reductions``
switches it off; KILN_LOG=parallel prints the plan (kind ``split``).

Note [Work of a kernel]: "work" in the thresholds above is *weighted* element-iterations: each
iteration counts for the statements of the C++ body it runs over ``STATEMENTS_PER_ITERATION``
(never less than one), :func:`weighted_work`. Counting element-iterations alone left ResNet's
3x3/2 max-pool after its first batch norm ([2, 32, 16, 16] outputs, each reading 9 masked
inputs: ~125 statements a position, scalar since GCC 12 vectorizes no strided masked load)
below ``PARALLEL_GRAIN`` at 16384 iterations: a serial kernel of 76 us here, and 0.44 ms at 16
threads on the 16-core host (1.03x). A plain batch norm + ReLU runs ~15 statements an element at
~0.5 ns (vectorized); that max-pool ~9x as long an output, in line with its statement count.
Only the serial/parallel choice and the team cap read the weighted work; how a split reduction
is chunked reads element-iterations (its results must not depend on how the body is spelled).
``CppOptions.weighted_work=False`` counts element-iterations only; KILN_LOG=parallel prints both.

Note [Statements that cost more than one]: counting every statement alike left kernels of 20-55 us
at one thread serial, at 16 threads too (issue 20, the 16-core host, twenty-sixth session), in three
ways. (1) A reduction's statements that run once per row (its lanes' folds and combine, its
epilogue) are scalar, and the Welford ones sit on one dependency chain of double divisions (8 lanes
merged in turn, each merge a division): a row of a variance costs ~50 ns however short it is, while
the weighing gave its ~30 statements 2 element-iterations. ConvNeXt's first layer norm (512 rows of
32 channels, 48 us), ResNet's BatchNorm statistics over rows of 8 (256 channels, 11 us after Note
[Folds after a row's short loops] in kernel.py) and the MLP's layer norm + GELU (64 rows of 256, 21
us) had weights of 16384-26660. So in a reduction, a statement run once per row counts as
``ROW_STATEMENT_WEIGHT`` statements of the vectorized body, a lane loop (``for (int l ...) stmt``)
as a statement per lane, and a fold as often as the row loop runs it. (2) A call of a math library
function costs more than an add: at one thread over 64K float32 elements (L2-resident, a kernel
each, the call's ~4.5 us taken out), a plain ``x * 2 + 1`` element took 0.11 ns (16 statements'
worth), and ``exp``, ``log``, ``sin`` added 0.18-0.19 ns (~26 statements), ``sqrt`` 0.13,
``sigmoid`` 0.22, ``tanh`` 0.25, ``rsqrt`` 0.32, ``erf`` 0.41 (~60), ``pow`` (not vectorized) 1.33
(~195): each such call counts as the statements of :data:`CALL_STATEMENTS`, rounded down (the kiln
helpers with several statements inside too). T5's relative-position buckets (16384 int64 elements
through ``log``, whose vector variant takes a slow path on zeros: 55 us) and the MLP's GELU
(``erf``) so cross the grain. (3) A body that reads or writes along the vector loop with a stride
other than 1 (an access moving with several loops: a transposed read such as ConvNeXt's
channels-first layer norm over C of [N, C, H, W] written channels-last) is left scalar by GCC 12
(``-fopt-info-vec-missed``: "no vectype" on the strided load; the max-pool of Note [Work of a
kernel] is another): ``(x.permute(0, 2, 3, 1) * 2 + b)`` over [2, 32, 16, 16] ran at 0.7 ns an
element (5 statements), ConvNeXt's layer norm apply (``add_clone_mul_permute_rsqrt_sub``, 16384
elements, ~28 statements) at 3 ns, 46-52 us serial. Such a body's statements count as
``ROW_STATEMENT_WEIGHT`` each, as a row's scalar ones do (that transpose alone, a call at one and
two threads here: 15.6 and 15.6 us serial, 15.6 and 10.0 us with a team).
``CppOptions.weigh_statements=False`` counts every statement as one, as before. KILN_LOG=parallel
prints the weighed work, KILN_LOG=output_code each kernel's statements a row and an element.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

log = logging.getLogger("kiln.codegen_cpp.parallel")

# below this many element-iterations a kernel runs on the calling thread (no OpenMP team)
PARALLEL_GRAIN = 32768
# a body of this many C++ statements counts as one element-iteration (Note [Work of a kernel])
STATEMENTS_PER_ITERATION = 16
# a thread gets at least this many element-iterations (the cap on the team size)
MIN_WORK_PER_THREAD = 4096
# a pointwise kernel's parallel loop wants at least this many units (4 per thread at 16 threads)
TARGET_UNITS = 64
# the smallest chunk of a pointwise kernel's innermost loop when it is cut into chunks
MIN_CHUNK = 1024
# a reduction with fewer parallel units than this splits its reduced loop (Note [Reductions with
# few outputs]); 16 = the threads of the largest host measured
FEW_OUTPUTS = 16
# Note [Statements that cost more than one]: a reduction's statement run once per row (scalar,
# often on a dependency chain) counts as this many statements of its vectorized body
ROW_STATEMENT_WEIGHT = 16
# Note [Statements that cost more than one]: statements a call counts for (each figure: the time
# the call adds to a float32 element, in units of a plain element's 16 statements; the kiln
# helpers: their own statements); other calls count as part of their statement. Not ``sqrt`` and
# ``rsqrt``: in the kernels seen they take a row's or a channel's statistic (norms), the same value
# all along the vector loop, which GCC computes once before it
_TRANSCENDENTAL = "exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh hypot fmod"
CALL_STATEMENTS: dict[str, int] = {
    **{f"std::{name}": 24 for name in _TRANSCENDENTAL.split()},
    # Notes [Logarithms off libmvec's slow path], [Exponentials off ...] (prelude.py): the call and
    # the guard's selects
    **{f"kiln::{name}": 32 for name in ("exp", "log", "log2", "log10")},
    "std::tanh": 32,
    "kiln::sigmoid": 32,
    "std::erf": 56,
    "std::erfc": 56,
    "std::lgamma": 128,
    "std::pow": 192,
    "kiln::welford_merge": 8,
    "kiln::shifted_fold": 12,
}
# the least element-iterations of one (output, chunk) unit of a split reduction: with 4096, a
# [2048, 192] bias gradient in 66 units ran 10% slower at one thread than unsplit (23.7 against
# 21.5 us: each unit initializes, folds and stores a block of partials, and the combine reads them)
MIN_SPLIT_WORK = 16384


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """How one kernel's loop nest runs in parallel (Note [Parallel plan])."""

    kind: str  # "outer", "chunked", "column", "split"
    collapse: int  # loops collapsed into the parallel loop (the chunk loop counts)
    units: int
    cap: int

    def describe(self) -> str:
        return f"{self.kind}: collapse {self.collapse}, {self.units} units, at most {self.cap} threads"


def weighted_work(nx: int, nr: int, x_statements: int, r_statements: int, row_weight: int = 1) -> int:
    """Note [Work of a kernel]: ``nx`` outer iterations running ``x_statements`` each, of which
    each runs ``nr`` reduced iterations of ``r_statements`` (``nr`` = 0: no reduction); never
    less than the element-iterations ``nx * max(nr, 1)``. ``row_weight``: what a statement of a
    reduction's rows (``nr`` > 0) counts for (Note [Statements that cost more than one])."""
    plain = nx * max(nr, 1)
    statements = nx * x_statements * (row_weight if nr else 1) + nx * nr * r_statements
    return max(plain, statements // STATEMENTS_PER_ITERATION)


def call_statements(line: str) -> int:
    """Note [Statements that cost more than one]: what the calls of one C++ statement add to it."""
    if "(" not in line:
        return 0
    return sum((count - 1) * line.count(f"{name}(") for name, count in CALL_STATEMENTS.items())


def cap_for(units: int, work: int, min_work: int = MIN_WORK_PER_THREAD) -> int:
    """The most threads worth using for ``units`` pieces holding ``work`` element-iterations, each
    thread at least ``min_work`` of them (``CppOptions.min_work_per_thread``)."""
    return max(1, min(units, work // min_work))


def outer_plan(
    outer: list[int], work: int, grain: int = PARALLEL_GRAIN, min_work: int = MIN_WORK_PER_THREAD
) -> ParallelPlan | None:
    """Threads over the collapsed ``outer`` loops (a reduction's outputs), or None if not worth it."""
    units = math.prod(outer)
    if work < grain or not outer or units < 2:
        return None
    return ParallelPlan("outer", len(outer), units, cap_for(units, work, min_work))


def pointwise_plan(
    outer: list[int], inner: int, work: int, grain: int = PARALLEL_GRAIN, min_work: int = MIN_WORK_PER_THREAD
) -> ParallelPlan | None:
    """A pointwise loop nest: outer loops, plus the innermost cut into chunks when they are few."""
    if work < grain:
        return None
    outer_n = math.prod(outer)
    if outer_n >= TARGET_UNITS or inner < 2 * MIN_CHUNK:
        if not outer or outer_n < 2:
            return None
        return ParallelPlan("outer", len(outer), outer_n, cap_for(outer_n, work, min_work))
    units = outer_n * (-(-inner // MIN_CHUNK))
    return ParallelPlan("chunked", len(outer) + 1, units, cap_for(units, work, min_work))


def split_chunks(units: int, work: int, first: int, multiple: int) -> tuple[int, int] | None:
    """(chunk, chunks) cutting the outermost reduced loop (``first`` iterations) of a reduction
    with ``units`` parallel units and ``work`` element-iterations, or None when it should not be
    cut (Note [Reductions with few outputs]). ``chunk`` is a multiple of ``multiple`` (the lane
    count, when the cut loop is the innermost one) unless the loop is shorter."""
    if units >= FEW_OUTPUTS or work < 2 * PARALLEL_GRAIN or first < 2:
        return None
    want = min(-(-TARGET_UNITS // units), work // (units * MIN_SPLIT_WORK), first)
    if want < 2:
        return None
    chunk = -(-first // want)
    chunk = -(-chunk // multiple) * multiple
    chunks = -(-first // chunk)
    return (chunk, chunks) if chunks > 1 else None


def log_plan(
    kernel: str, plan: ParallelPlan | None, work: int, weighted: int | None = None, outputs: int | None = None
) -> None:
    """KILN_LOG=parallel: the kernel's plan and work; ``outputs``: a reduction's output count
    (``bench/parallel_audit.py`` reads these lines)."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    size = f"{work} element-iterations" + (f", weighted {weighted}" if weighted not in (None, work) else "")
    if outputs is not None:
        size += f"; a reduction of {outputs} outputs"
    if plan is None or plan.cap <= 1:
        log.debug("kernel %s: serial (%s)", kernel, size)
    else:
        log.debug("kernel %s: parallel %s (%s)", kernel, plan.describe(), size)
