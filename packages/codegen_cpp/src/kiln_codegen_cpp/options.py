"""The switches of the C++ code generator's own optimizations, so each one's effect can be measured.

``CppBackend(options=...)`` takes a :class:`CppOptions` or a mapping of its fields; without one the
defaults apply, overridden by the environment variable ``KILN_CPP_OPTIONS`` (``"split_reductions=0"``,
comma-separated), which reaches the backend that ``kiln.compile`` builds.

* ``split_reductions``: reductions with few outputs cut their reduced loop into chunks combined
  in order (Note [Reductions with few outputs] in parallel.py).
* ``weighted_work``: whether a kernel is worth a team, and how many threads, is decided from its
  element-iterations weighted by the statements of its body (Note [Work of a kernel] in
  parallel.py); off: element-iterations only.
* ``vector_width``: 0 (default) takes the build target's width: 512 where it has AVX-512 and
  ``wide_vectors`` is on (Note [512-bit vectors on AVX-512 targets] below), else the compiler's
  tuning for ``-march=native``; 128, 256 or 512 adds ``-mprefer-vector-width=N`` (Note [Vector
  width] in build.py: GCC's tuning for Intel's AVX-512 server cores prefers 256-bit vectors, AMD's
  Zen 4 512). ``wide_vectors=0``: the compiler's tuning, as before cpu20b.
* ``branch_free_checks``: an indirect index's bounds check and an integer divisor's zero check
  fold into max-reductions instead of an ``if`` in the loop body, so GCC can vectorize the loop
  (Note [Kernel errors] in kernel.py); off: the ``if`` with atomic stores.
* ``fuse_mixed_reductions``: let the scheduler fuse a row reduction with a column reduction
  (off by default: Note [Row and column reductions are not fused] in fusion.py).
* ``column_sum_fusion``: the scheduler may re-express a pointwise producer in the loop order of
  a column reduction that reads it (a bias gradient), so the two fuse into one kernel (Note
  [Pointwise producers in a column reduction's order] in kiln_loopir's scheduler.py). Off by
  default. First measured on Swin's training step at one thread: 15 fewer kernel calls but the
  kernels' own time 1.30 -> 1.46 ms (``bench/kernel_time.py``). Diagnosed (the Note): reordered
  producers fused with row reductions (strided loads and stores in the row kernel's order),
  gathered transposes lane by lane, and divided 64-bit indices per lane. Fixed, in one process
  with the two variants' steps interleaved (``bench/kernel_time.py --models swin --calls 25
  --ab-cpp column_sum_fusion=1``): 143 -> 140 kernel calls, 1.197 -> 1.177 ms (two more runs:
  1.620 -> 1.639 ms under heavier load, 1.250 -> 1.219 ms); keeping the gathering transposes:
  143 -> 128 calls, 1.242 -> 1.254 ms. The whole step (``bench/train1.py --backends eager,kiln,kiln_ab --ab-cpp
  ... --clock cpu``, six models, both orders; ``2026-12-02-cpu-s7-train1-column-sum-ab-*.json``)
  moved by less than the order bias of an A/A run (identical code 1.052x vs 1.080x,
  ``2026-12-02-cpu-s7-train1-aa-order-bias.json``): neutral on this machine, so it stays off.
* ``cse_indirect``: an indirect index of one value is made once per scope, and an r-phase's
  index matches an earlier phase's, so gathers through it and what is computed from them are
  common subexpressions, stashed across phases like other values (Note [Indirect indices are
  common subexpressions] in kernel.py).
* ``buffers_as_viewed``: a computed buffer is allocated in the dense shape its extern readers
  and the graph outputs view it with most often, so they take the tensor itself instead of an
  ``as_strided`` view (Note [Buffers allocated as their readers view them] in wrapper.py).
* ``laid_out_inputs``: a backward graph's inputs that the compiled forward laid out (saved
  activations, listed by kiln_aotgrad) are checked for their storage offset only (Note [Saved
  values the forward laid out, checked by offset] in wrapper.py); off: in full, as before.
* ``hoist_reductions``: in a kernel whose members all walk the rows, each member runs in the
  earliest r-phase its inputs allow, so a reduction of the inputs joins the first pass (Note
  [Reductions in the earliest phase] in kernel.py: _safe_softmax's ``any`` and ``where``). Off
  by default: Swin's softmax kernel ran 87 -> 125 us with it (three passes instead of four).
* ``shifted_welford``: float32 Welford statistics (variance, layer norm) accumulate per float
  block as shifted sums, folded into double Welford lanes (Note [Shifted Welford blocks] in
  kernel.py); off: a double Welford update per element, as before. ``shifted_welford_float``:
  the block's shifted sums in float instead of double (faster, less accurate on centred rows:
  the Note).
* ``peel_shifted_blocks``: in a row's main lane loop, each block's first step of a shifted
  Welford statistic is peeled (it picks the shift), the rest only add, and the block's count
  comes from its length (Note [Peeled shifted blocks] in kernel.py); off: ``shifted_add`` per
  element.
* ``select_minmax``: ``maximum``/``minimum`` and the max/min reductions' combines are two
  selects (an ordered compare, then the NaN), not one select on ``a > b || a != a`` (Note
  [Maximum and minimum as two selects] in prelude.py); off: the old spelling (``-DKILN_MINMAX_OR``).
* ``reduction_lanes``: 8, 16 (default) or 32 lanes per row reduction whose innermost reduced
  loop is static and at least 256 long, except a kernel with a Welford of shifted blocks (Note
  [More lanes on long rows] in kernel.py); 8: the old single vector of lanes.
* ``narrow_lanes``: a row reduction whose lane loop reads or writes 1- or 2-byte elements
  (bfloat16, float16, bool, int8) takes 32 or 16 lanes, one 256-bit vector of them, so GCC does
  not fall back to 16-byte vectors for the whole loop (Note [Lanes cover a vector of the narrowest
  type] in kernel.py). Off: the lanes of ``reduction_lanes`` and its exceptions.
* ``hoist_row_invariant``: in a row reduction's loops over a static row, the values and indirect
  indices that no reduced position changes (an embedding row's index, read per token) are
  computed once per row before the loops, so the row's loads through them are contiguous vector
  loads, not gathers (Note [Row-invariant values before the row loops] in kernel.py); off: they
  stay in the lane loop, as before.
* ``scoped_check_reductions``: the max-reductions of a kernel's branch-free index and divisor
  checks go only on the OpenMP loops whose body has a check (Note [Check reductions only where a
  check is] in kernel.py); off: on every ``omp parallel for`` and ``omp simd`` loop of the kernel.
* ``tree_lane_combine``: a reduction's lanes are combined pairwise after the row (Note [Lanes
  combined as a tree] in kernel.py); off: left to right, one dependency chain.
* ``table_columns_inner``: a pointwise kernel that gathers from a small table through an index
  that does not move with the loop over the table's columns runs that loop innermost and scalar,
  after the index is computed once for all columns (Note [A small table's columns innermost] in
  kernel.py: T5's relative-position bias); off: the loop order of the stores, gathers per column.
* ``split_guarded_loops``: a pointwise kernel whose values compare one loop's index with a
  constant (a padded window's bounds: max/avg pooling, a padded read, a `cat` along the innermost
  dim) runs its innermost loop in pieces between those bounds, and an enclosing loop's bounds as
  an ``if`` around them, the same body in each, so that GCC sees every comparison constant in a
  piece and vectorizes loads it left scalar under their masks (Note [Loops split at their guards]
  in kernel.py); off: one loop.
* ``check_indices_once``: an indirect index an earlier r-phase of the kernel checked from the same
  value is only clamped in a later phase (Note [An index checked once a row] in kernel.py); off:
  every phase checks it.
* ``wide_pointwise_passes``: a row kernel's pass over the row that reduces nothing (layer norm's
  normalisation after its statistics) runs two vectors of float32 lanes (32 at 512 bits), not the
  lanes of the kernel's reductions (8 beside a Welford of shifted blocks): Note [A row's pointwise
  pass takes two vectors] in kernel.py. Off by default: faster with operands hot, not in the
  training step (the Note's figures).
* ``row_column_sums``: a row kernel over ``[rows, cols]`` (a norm's backward) also computes
  the column sums over the same operands (its weight and bias gradients), per chunk of rows in
  the row loop, instead of a column kernel of their own (Note [Column sums in a row kernel] in
  kiln_loopir's scheduler.py and kernel.py). ``KILN_LOG=fusion`` prints each decision.
* ``parallel_grain`` and ``min_work_per_thread``: a kernel with less weighted work than the grain
  runs on the calling thread, and a team gives each thread at least ``min_work_per_thread`` of it
  (Note [Parallel plan] in parallel.py; defaults ``PARALLEL_GRAIN`` and ``MIN_WORK_PER_THREAD``).
  Switches for measuring the plans at many threads (the 16-core host: ConvNeXt at CPU size was
  slower at 16 threads than at 4 in the thirteenth session), e.g. ``KILN_CPP_OPTIONS=
  min_work_per_thread=16384`` or threads.py's ``--ab-cpp-options``.
* ``full_teams``: every parallel loop opens a team of all ``nt`` threads and gives its work to
  the ``ntk`` of them its plan allows (``schedule(static, chunk)``), so libgomp's pool keeps its
  threads (Note [Teams keep the pool's size] in parallel.py); off: a team of ``ntk`` threads
  (``num_threads(ntk)``), as before, which ends ``nt - ntk`` pool threads and makes the next full
  team create them again. The generated kernels show the clauses (``KILN_LOG=output_code``).
* ``weigh_statements``: in a kernel's weighed work (Note [Work of a kernel] in parallel.py), a
  reduction's statements that run once per row count as ``ROW_STATEMENT_WEIGHT`` statements of
  the vectorized body, its lane loops once per lane and its folds as often as they run, and a
  call of a math function (``erf``, ``log``, ``pow``, ...) as the statements of
  ``CALL_STATEMENTS``, and a body with a strided access along its vector loop (left scalar by
  GCC) at ``ROW_STATEMENT_WEIGHT`` a statement (Note [Statements that cost more than one] in
  parallel.py); off: every
  statement counts as one, as before. KILN_LOG=output_code prints each kernel's counts.
* ``fold_short_rows``: a row reduction whose innermost loop is short (BatchNorm's statistics
  over a few spatial positions) folds its lanes' float blocks after the outer row loops that keep
  a lane's block within FOLD_BLOCK / lanes positions, not after every pass of the innermost loop
  (Note [Folds after a row's short loops] in kernel.py); off: after every pass, as before.
* ``column_gathers``: the choice of a column reduction (Note [Column reductions] in kernel.py)
  counts a gathered read with the loops its index was loaded at, and a read that does not move
  with the innermost output loop as small (Note [Column reductions through gathers] in
  kernel.py); off: indirect indices count as no loop and any read that moves with an output
  loop as full-size, as before.
* ``guarded_log``: ``log``, ``log2`` and ``log10`` give the lanes that are not a positive finite
  number 1 as the library call's argument and pick their result after it, so that libmvec's
  vector call never takes its scalar path (Note [Logarithms off libmvec's slow path] in
  prelude.py); off: ``-DKILN_PLAIN_LOG``, the library's call on every lane, as before.
* ``guarded_exp``: ``exp`` the same way for the lanes whose result underflows to zero or
  overflows, and NaN (Note [Exponentials off libmvec's slow path] in prelude.py); off:
  ``-DKILN_PLAIN_EXP``.
* ``saved_inputs_as_is``: a training forward returns a saved value that is an input seen through
  a view that changes nothing as the input itself, not an ``as_strided`` view (Note [Saved inputs
  returned as themselves] in wrapper.py); the wrapper's source (``KILN_LOG=output_code``) shows it.
* ``symbolic_scratch``: a graph with symbolic sizes keeps its scratch buffers between calls for
  the symbol values of the last call, as a static graph keeps its own (Note [Scratch buffers of
  symbolic size] in wrapper.py); the wrapper's source shows ``_pool_shapes`` and ``_take(s0,
  ...)``. ``KILN_CPP_OPTIONS=symbolic_scratch=0`` allocates them fresh at every call as before.
* ``build_parts``: the translation units a graph's kernels are compiled in at the same time, each
  by its own ``g++ -c``, linked into one ``kernels.so`` (Note [Parallel C++ builds] in units.py):
  0 (default) decides from the kernels' source and the cores this process may use, so a graph of
  few or small kernels stays one unit; 1 is one unit, as before; N is N parts (at most one a
  kernel). ``KILN_LOG=cache`` prints each build's parts and their compile times.
* ``overlap_builds``: a graph's ``g++`` runs in the background while the compile goes on (a
  training step's forward builds while its backward is lowered and built); the wrapper's first
  kernel call waits for it (Note [Builds that overlap] in build.py). Off: each graph waits for its
  own build before the next is lowered, as before.
* ``share_twins``: a kernel whose code equals an earlier one's up to names (a repeated layer's)
  is written as an alias of it, not in full (Note [Twins share one body] in units.py): the same
  machine code, compiled once. Off: every kernel in full.
* ``precompiled_headers``: the prelude's system headers are read from a GCC precompiled header,
  built once per machine and flags (Note [Precompiled headers] in pch.py); the object code is
  the same. Off: every build parses them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .parallel import MIN_WORK_PER_THREAD, PARALLEL_GRAIN

# Note [512-bit vectors on AVX-512 targets]: GCC's tuning for Intel's AVX-512 server cores
# (skylake-avx512 to sapphirerapids) prefers 256-bit vectors against the frequency drop of
# heavy 512-bit code, and torch.compile's C++ kernels use 512-bit vectors on such machines. At
# one thread on a Sapphire Rapids core (cpu20b: bench/infer1.py and train1.py --clock cpu over
# the public suite, each run in both orders of the two variants, 512 against the tuning's 256):
# inference 0-4% faster (GPT-2 4.4%, T5 and ViT 2.2%; geomean ~2%), training steps even (-2.5%
# to +2.9%, within the order bias of one run), and the kernels of LLaMA's training step 2.52 ->
# 2.34 ms (bench/kernel_time.py); no model clearly slower (the figures in
# packages/bench/results/2026-12-05-cpu-s20b-vector-width.md). So where the build target has
# AVX-512F (the compiler's predefined macros for its flags, ``-march=native``: asked once per
# process, build.target_has_avx512) and ``vector_width`` is 0, the kernels are compiled with
# -mprefer-vector-width=512; an AVX2 target is left to the compiler as before. The flag is part
# of the compiler flags, hence of the cache key. KILN_LOG=output_code prints the decision with
# the options. The lanes of a row reduction that cover a vector of its narrowest elements (Note
# [Lanes cover a vector of the narrowest type] in kernel.py) do not follow the width past 256
# bits: covering 512 gave float32 rows 16 lanes (over the Welford exception) and bfloat16 rows
# 32, and layer norm's forward over rows of 64 ran 18.6 -> 29.4 us (float32) and 33.5 -> 54.2
# us (bfloat16), over rows of 256 30.3 -> 34.1 and 68.7 -> 80.2 (bench/layer_norm_ab.py, w256
# against new; ConvNeXt's layer norms, rows of 32 to 256 channels, 11 -> 34 us each): too few
# elements a lane to pay for the lanes' setup and combine. 256 bits already keeps GCC off
# 16-byte vectors, which is what the cover is for.

ENV = "KILN_CPP_OPTIONS"
# the vector GCC prefers at -march=native when no width is asked for, on the machines kiln is
# tuned on (AVX2, and Intel's AVX-512 tuning)
DEFAULT_VECTOR_BITS = 256
VECTOR_WIDTHS = (0, 128, 256, 512)
REDUCTION_LANES = (8, 16, 32)


@dataclass(frozen=True, slots=True)
class CppOptions:
    split_reductions: bool = True
    fuse_mixed_reductions: bool = False
    weighted_work: bool = True
    vector_width: int = 0
    branch_free_checks: bool = True
    column_sum_fusion: bool = False
    saved_inputs_as_is: bool = True
    symbolic_scratch: bool = True
    cse_indirect: bool = True
    buffers_as_viewed: bool = True
    laid_out_inputs: bool = True
    hoist_reductions: bool = False
    shifted_welford: bool = True
    shifted_welford_float: bool = False
    peel_shifted_blocks: bool = True
    select_minmax: bool = True
    reduction_lanes: int = 16
    narrow_lanes: bool = True
    hoist_row_invariant: bool = True
    scoped_check_reductions: bool = True
    tree_lane_combine: bool = True
    wide_vectors: bool = True
    table_columns_inner: bool = True
    split_guarded_loops: bool = True
    check_indices_once: bool = True
    wide_pointwise_passes: bool = False
    row_column_sums: bool = False
    parallel_grain: int = PARALLEL_GRAIN
    min_work_per_thread: int = MIN_WORK_PER_THREAD
    full_teams: bool = True
    fold_short_rows: bool = True
    weigh_statements: bool = True
    compile_time_tune: bool = True
    build_parts: int = 0
    overlap_builds: bool = True
    precompiled_headers: bool = True
    share_twins: bool = True
    column_gathers: bool = True
    guarded_log: bool = True
    guarded_exp: bool = True

    def __post_init__(self) -> None:
        if self.vector_width not in VECTOR_WIDTHS:
            raise ValueError(f"vector_width must be one of {VECTOR_WIDTHS}, not {self.vector_width!r}")
        if self.reduction_lanes not in REDUCTION_LANES:
            raise ValueError(
                f"reduction_lanes must be one of {REDUCTION_LANES}, not {self.reduction_lanes!r}"
            )
        for name in ("parallel_grain", "min_work_per_thread"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if type(self.build_parts) is not int or self.build_parts < 0:
            raise ValueError(f"build_parts must be an int of 0 (automatic) or more, not {self.build_parts!r}")

    def preferred_width(self, avx512: bool | None = None) -> int:
        """The ``-mprefer-vector-width`` these options ask for, 0 for none (Note [512-bit vectors
        on AVX-512 targets]); ``avx512``: whether the build target has AVX-512F (default: ask the
        compiler, once per process)."""
        if self.vector_width or not self.wide_vectors:
            return self.vector_width
        if avx512 is None:
            from .build import target_has_avx512

            avx512 = target_has_avx512()
        return 512 if avx512 else 0

    def vector_bits(self, avx512: bool | None = None) -> int:
        """The width of the vectors the kernels are compiled for (256 where left to the
        compiler's tuning: Note [Lanes cover a vector of the narrowest type] in kernel.py)."""
        return self.preferred_width(avx512) or DEFAULT_VECTOR_BITS

    def compiler_flags(self, avx512: bool | None = None) -> tuple[str, ...]:
        """Flags these options add to the compiler's command line (and to the cache key)."""
        width = self.preferred_width(avx512)
        out: tuple[str, ...] = (f"-mprefer-vector-width={width}",) if width else ()
        if not self.select_minmax:  # Note [Maximum and minimum as two selects] in prelude.py
            out += ("-DKILN_MINMAX_OR",)
        if self.compile_time_tune:  # Note [Tunings that are slow to compile] in build.py
            from .build import compile_time_tune_flags

            out += compile_time_tune_flags()
        if not self.guarded_log:  # Note [Logarithms off libmvec's slow path] in prelude.py
            out += ("-DKILN_PLAIN_LOG",)
        if not self.guarded_exp:  # Note [Exponentials off libmvec's slow path] in prelude.py
            out += ("-DKILN_PLAIN_EXP",)
        return out

    @staticmethod
    def from_mapping(options: Mapping[str, Any] | CppOptions | None) -> CppOptions:
        if isinstance(options, CppOptions):
            return options
        made = CppOptions.from_env()
        if options:
            known = {f.name for f in fields(CppOptions)}
            unknown = set(options) - known
            if unknown:
                raise ValueError(f"unknown C++ codegen options {sorted(unknown)}; supported: {sorted(known)}")
            made = replace(made, **options)
        return made

    @staticmethod
    def from_env() -> CppOptions:
        raw = os.environ.get(ENV, "")
        values: dict[str, Any] = {}
        known = {f.name for f in fields(CppOptions)}
        for item in filter(None, (part.strip() for part in raw.split(","))):
            key, _, value = item.partition("=")
            if key not in known:
                raise ValueError(f"{ENV}: unknown option {key!r}; supported: {sorted(known)}")
            text = value.strip().lower()
            if key in _INT_FIELDS:
                values[key] = int(text)
            else:
                values[key] = text not in ("0", "false", "off", "no")
        return CppOptions(**values)


_INT_FIELDS = frozenset(
    {"vector_width", "reduction_lanes", "parallel_grain", "min_work_per_thread", "build_parts"}
)
