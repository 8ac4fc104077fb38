"""One ``@triton.jit`` function per scheduled (possibly fused) node.

A kernel's members are the ComputedBuffers of one scheduler node. They share one iteration
space, the *reference*: the first real reduction's ``(ranges, reduction_ranges)``, or the first
member's ranges when there is none. A Triton program owns a block of that space, and the space is
named by at most three flat block indices, sympy symbols that the index expressions are written
in:

* ``pointwise``: ``xindex`` of shape ``[XBLOCK]`` walks the flat iteration space;
* ``tiled``: ``yindex`` ``[YBLOCK, 1]`` walks every dim but the last, ``xindex`` ``[1, XBLOCK]`` the
  last, so a transpose reads and writes along coalesced rows (Note [When to tile]);
* ``persistent`` / ``looped`` reductions: ``xindex`` ``[XBLOCK, 1]`` walks the outputs, ``rindex``
  ``[1, RBLOCK]`` the reduced positions (Note [Persistent and looped reductions]).

Each member's own loop variables are digits of the flat position (``FloorDiv`` /
``ModularIndexing`` of ``xindex`` or ``xindex * rnumel + rindex``), simplified under the block
indices' ranges: a contiguous access collapses back to ``xindex`` itself, which is what lets
Triton vectorize it. This is exactly what the scheduler checked when it fused the members: a
producer's flat iteration ``k`` writes what the consumer's flat iteration ``k`` reads.

A kernel is named ``triton_<kind>_fused_<aten ops>_<step>`` as in torch.compile: the backend
asks ``kiln_loopir.kernel_name`` for ``triton_{kind}_...`` and the generator fills the kind in
once it has chosen the blocking (``KIND_PREFIX``: poi, per, red); its source opens with the user's
lines it came from (``kiln_loopir.source_comment``).

Every ops value knows its *axes* (which block indices its shape spans), so a load is masked by
exactly the masks of the indices its address uses (a bias row read in a reduction is masked by
``rmask`` only) and a pointer that uses none is broadcast before a masked access.

Note [Symbolic sizes in Triton kernels]: a graph captured with dynamic shapes has sizes that are
expressions in size symbols (Note [Symbolic sizes in loopir]). One kernel then serves every size:

* every size symbol the kernel's code names (numels, strides in index math, extents of indirect
  indices) is a kernel argument after the pointers, named as the symbol (``s0``), never a
  ``tl.constexpr`` (one compile per size); the numels are computed from them in the kernel's
  head (``xnumel = (3 * s0)``), and static numels stay literals, as in a static kernel. On a GPU
  the argument is compiled as a generic int64 (``runtime.GENERIC_SIZE``): no divisibility or
  equal-to-one specialization, so one binary serves every value;
* masks are the same masks (``xindex < xnumel``, ``rindex < rnumel``): the ragged end of the
  last block is masked whatever the size; digits of the flat block indices divide by symbols
  at run time (``(xindex // s1)``) where no static simplification removes them;
* a reduction over a row of symbolic length is always *looped* (no block is known to hold the
  row), a persistent one only when the row is static (layer norm over the hidden size with a
  symbolic batch stays persistent); a 2-D tile only when its y extent is static (its grid must
  stay under CUDA's y limit); split reductions only over a symbolic row with static outputs
  (Note [Split reductions under symbolic sizes] in split.py);
* index math is int64 (no bound is known, and loopir adds no guard); which block sizes and
  configs are chosen is decided on the size hints (Note [Block sizes for symbolic sizes] in
  heuristics.py), and the grid is computed at each launch from the size arguments
  (``heuristics.grid_source``; the C launcher skips an empty grid).

A static graph generates exactly the kernels it generated before: every symbolic path is
taken only for a sympy size, and ``scripts/triton_static_dump.py`` checks the generated code.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from kiln_loopir import sizevars
from kiln_loopir.codegen_common import (
    ALWAYS_BOOL,
    FloatOp,
    OpsHandlerBase,
    marked_store,
    unflatten,
    unmark_stores,
)
from kiln_loopir.codegen_common import real_reduction as _real_reduction
from kiln_loopir.codegen_common import same_size as _same
from kiln_loopir.codegen_common import size_of as _size
from kiln_loopir.indexing import FloorDiv, ModularIndexing, bound, simplify_index, simplify_rewritten
from kiln_loopir.ir import ComputedBuffer, Scatter
from kiln_loopir.origins import KIND, source_comment
from kiln_loopir.virtualized import set_ops_handler

from .interp import interpreting
from .triton_ops import (
    HALF,
    compute_dtype,
    compute_type,
    constant_expr,
    convert_expr,
    deriving_ints,
    index_to_triton,
    load_expr,
    spell,
    store_expr,
    tl_type,
)

log = logging.getLogger("kiln.codegen_triton.output_code")

XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
YINDEX = sympy.Symbol("yindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)
AXIS_OF = {XINDEX: "x", YINDEX: "y", RINDEX: "r"}
_WORD = re.compile(r"\w+")  # the words of a kernel body: which parameters it reads
# Note [When to tile]: below this many elements along either tile axis a 2-D tile wastes lanes
MIN_TILE = 16
# torch.compile's kind prefixes, filled into a name's KIND field (kiln_loopir.kernel_name)
KIND_PREFIX = {"pointwise": "poi", "tiled": "poi", "persistent": "per", "looped": "red"}
# largest grid along CUDA's y dimension
MAX_GRID_Y = 65535
# an outer reduction (reduced dim strided, output dim contiguous) this short stays persistent
OUTER_PERSISTENT_MAX = 32

# Note [Row statistics do not decide a column reduction]: a reduction is *outer* (a column
# reduction: short RBLOCK, wide XBLOCK, split into partial chunks when it has few outputs) when a
# load along its row is contiguous across outputs and none is contiguous along the row. A norm's
# weight gradient, `sum over tokens of grad * (x - mean[t]) * rstd[t]`, also loads the per-row
# statistics `mean[t]`, `rstd[t]`: contiguous along the row, so it was taken for a row
# reduction, and ran as one persistent program per output column (XBLOCK 1 for 4096 bfloat16
# tokens) whose every load of `grad` and `x` used 2 bytes of a 32-byte sector. On an H100 these
# kernels ran at 9% of copy bandwidth in every transformer's bf16 training step (GPT-2 ~93 us for
# 24 MB, LLaMA ~260 us for 66 MB, ViT ~210 us for 56 MB, three or more a step:
# `2026-12-05-h100-s22-train-bf16-saves.json`). An access that moves with the row only is a
# broadcast across the tile's outputs (one load per row for all of them) and says nothing about
# coalescing, so only accesses that move with both decide; a kernel whose row accesses all move
# with the row only is decided by them as before. TritonBackend option `outer_by_tiles=False`
# decides by every access, as before.


class CodegenUnsupported(Exception):
    """Something the Triton generator does not handle; the wrapper interprets that kernel."""


@dataclass(slots=True)
class TValue:
    """An ops value: a Triton expression (usually a variable), its dtype and block axes."""

    expr: str
    dtype: torch.dtype
    axes: frozenset[str] = frozenset()
    py: Any = None  # the Python value of a constant

    @property
    def const(self) -> bool:
        return self.py is not None

    def __str__(self) -> str:
        return self.expr


@dataclass
class Section:
    """Straight-line code at one level: ``x`` (once per output block) or an ``r`` phase."""

    level: str
    lines: list[str] = field(default_factory=list)
    pre: list[str] = field(default_factory=list)  # accumulators, before the reduction loop
    post: list[str] = field(default_factory=list)  # final reduce and stores, after it
    reduced: set[str] = field(default_factory=set)
    # Note [One accumulator per reduction of a value]: (dtype, type, value, masks) -> result
    results: dict[tuple[Any, ...], Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelSpec:
    """A generated kernel and what the launcher and the wrapper need to know about it."""

    name: str
    source: str
    params: tuple[str, ...]
    param_dtypes: tuple[torch.dtype, ...]
    kind: str  # "pointwise" | "tiled" | "persistent" | "looped"
    xnumel: Any  # int, or a sympy expression of size symbols (Note [Symbolic sizes in Triton kernels])
    ynumel: Any
    rnumel: Any
    scratch: tuple[str, ...]
    members: tuple[str, ...]
    atomic: bool  # writes with atomics or into another buffer: running it twice is not idempotent
    outer: bool  # a reduction whose reduced dim is strided and output dim contiguous
    # Note [Reductions walk their reads' memory order]: its x digits are not in logical order
    reordered: bool = False
    # a looped kernel that keeps a Welford (mean, m2, weight) triple per element of its tile
    # (Note [Welford tiles] in heuristics.py)
    welford: bool = False
    # Note [Symbolic sizes in Triton kernels]: the size symbols the kernel takes as arguments
    # after its pointers (sorted by name), and the numels at the graph's size hints (heuristics
    # only); a static kernel has neither, and its numels are ints
    size_params: tuple[str, ...] = ()
    numel_hints: tuple[int, int, int] | None = None
    # Note [Floats of sizes in Triton]: the float64 arguments that end size_params, each with the
    # float expression of sizes (kiln_symbolic's FloatOp) the wrapper computes for it
    float_params: tuple[tuple[str, Any], ...] = ()
    # Note [Integers of floats of sizes in Triton] (triton_ops.py): the int arguments between
    # the size symbols and the floats, each with the integer of a float of sizes it holds
    int_params: tuple[tuple[str, Any], ...] = ()

    @property
    def symbolic(self) -> bool:
        return bool(self.size_params)

    def hints(self) -> tuple[int, int, int]:
        """(xnumel, ynumel, rnumel) for heuristics: the numels, or their size hints."""
        if self.numel_hints is not None:
            return self.numel_hints
        return int(self.xnumel), int(self.ynumel), int(self.rnumel)


def _int(expr: Any) -> int:
    expr = sympy.sympify(expr)
    if not expr.is_Integer:
        raise CodegenUnsupported(f"symbolic size {expr} (the Triton generator needs static shapes)")
    return int(expr)


def _is_static(*sizes: Any) -> bool:
    return all(isinstance(s, int) for s in sizes)


def _prod(sizes: Sequence[Any]) -> Any:
    """The product of sizes: an int where it is a number, even of symbolic factors (a dim of 0
    beside a symbolic one), since a static kernel's numels are ints; else its expression."""
    product = math.prod(sizes)
    return int(product) if isinstance(product, sympy.Integer) else product


def _nonnegative(term: sympy.Expr) -> bool:
    coeff, rest = term.as_coeff_Mul()
    if rest == 1:
        return bool(coeff >= 0)
    if coeff < 0:
        return False
    return all(
        (isinstance(f, sympy.Symbol) and f.is_nonnegative) or isinstance(f, FloorDiv | ModularIndexing)
        for f in sympy.Mul.make_args(rest)
    )


def _split_divisions(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """``(g*q + r) // d -> q // (d/g)`` (and the same digit of it) when ``0 <= r < g``, ``g | d``."""

    def split(base: sympy.Expr, d: int) -> tuple[sympy.Expr, int] | None:
        terms = sympy.Add.make_args(sympy.expand(base))
        coeffs = [term.as_coeff_Mul()[0] for term in terms]
        if not all(c.is_Integer for c in coeffs):
            return None
        for g in sorted({math.gcd(d, int(c)) for c in coeffs}, reverse=True):
            if g <= 1:
                continue
            kept = [t for t, c in zip(terms, coeffs, strict=True) if int(c) % g == 0]
            rest = [t for t, c in zip(terms, coeffs, strict=True) if int(c) % g != 0]
            if not kept or not rest or not all(_nonnegative(t) for t in rest):
                continue
            b = bound(sympy.Add(*rest), ranges)
            if b is not None and b <= g:
                return sympy.expand(sympy.Add(*kept) / g), d // g
        return None

    def visit(node: sympy.Expr) -> sympy.Expr:
        if not node.args:
            return node
        node = node.func(*[visit(a) for a in node.args])
        if isinstance(node, FloorDiv | ModularIndexing) and node.args[1].is_Integer:
            found = split(node.args[0], int(node.args[1]))
            if found is not None:
                q, d = found
                if isinstance(node, FloorDiv):
                    return FloorDiv(q, sympy.Integer(d))
                return ModularIndexing(q, sympy.Integer(d), node.args[2])
        return node

    return visit(expr)


def simplify(expr: sympy.Expr, ranges: dict[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """loopir's ``simplify_index`` plus Note [Splitting divisions of block indices], memoized
    (Note [Simplified indices are memoized])."""
    return _simplify(expr, tuple(ranges.items()), frozenset(sizevars.current().hints))


# Note [Simplified indices are memoized]: a kernel is generated once per plan it tries
# (persistent, then looped or reordered; tiled, then flat), every generation runs its members'
# bodies again, and members of one kernel load the same buffers at the same indices: ResNet's
# training graphs simplified 16,320 indices, 403 of them distinct, and that was over half of
# their code generation. The answer depends on the expression, the loop ranges and which symbols
# are size symbols (``_size_symbols`` in kiln_loopir.indexing: the graph's, which may grow while a
# graph is lowered), so all three make the key; nothing else is read. The cache is bounded, and
# its values are sympy expressions, immutable, so sharing them is safe.
@functools.lru_cache(maxsize=1 << 15)
def _simplify(
    expr: sympy.Expr, ranges: tuple[tuple[sympy.Symbol, sympy.Expr], ...], sizes: frozenset[sympy.Symbol]
) -> sympy.Expr:
    """``simplify`` itself: loopir's ``simplify_index`` plus Note [Splitting divisions of block
    indices].

    Note [Splitting divisions of block indices]: a tiled kernel's flat position is
    ``xindex + XN*yindex`` with ``xindex < XN``; digits of it (``(xindex + XN*yindex) // XN``)
    must reduce to digits of ``yindex`` alone, or no access looks contiguous along ``yindex`` and
    every index pays for divisions it does not need. loopir's simplifier does not split a sum
    under a division by the ranges of its terms; this does, to a fixed point. (loopir's
    ``drop_low_terms`` applies the same identity under a narrower precondition: Note [Two
    rewrites of low terms under a division] in kiln_loopir's indexing.py.)
    """
    del sizes  # the key only: simplify_index reads them from sizevars.current()
    within = dict(ranges)
    return simplify_rewritten(_split_divisions, simplify_index(expr, within), within)


# Note [Index texts are memoized]: a load or store is looked up by its buffer and index text
# (stores forwarded to later loads), and sympy prints an index slowly (it sorts every sum's
# terms): printing ResNet's training indices took as long again as simplifying them. Equal
# expressions print equally, so the text is memoized on the expression.
_text = functools.lru_cache(maxsize=1 << 15)(str)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Plan:
    """How the iteration space is laid onto blocks (see the module docstring)."""

    kind: str
    nx: Any  # int, or a sympy expression (Note [Symbolic sizes in Triton kernels])
    ny: Any = 1
    nr: Any = 1
    # Note [Pointwise kernels walk memory order]: the order the x digits are taken in, outermost
    # first (None: the logical order)
    order: tuple[int, ...] | None = None


class _Generator(OpsHandlerBase):
    """Generates one kernel for one plan; while members' bodies run it is the ``ops`` handler."""

    value_type = TValue
    unsupported = CodegenUnsupported

    def __init__(
        self,
        name: str,
        members: Sequence[ComputedBuffer],
        reads: Sequence[Set[str]],
        dtypes: dict[str, torch.dtype],
        internal: set[str],
        plan: Plan,
        *,
        index_dtype: str,
        debug: bool,
    ) -> None:
        super().__init__(name, members, reads, dtypes, internal)
        self.plan = plan
        self.index_dtype = index_dtype
        self.debug = debug
        self.accesses: list[tuple[str, sympy.Expr, bool]] = []
        self.atomic = any(isinstance(m, Scatter) for m in members)
        self.sym_axes: dict[sympy.Symbol, frozenset[str]] = {}
        self.mask_stack: list[TValue] = []
        self.level = "x"
        self.sections: list[Section] = []
        # scopes: (lines, cse, forwards); the bottom one is the x-scope
        self.scopes: list[tuple[list[str], dict[str, TValue], dict[tuple[str, str], TValue]]] = []
        self.xforward: dict[tuple[str, str], TValue] = {}
        self.xcse: dict[str, TValue] = {}
        self.looped = plan.kind == "looped"
        self.welford = False  # a Welford triple per element of a looped tile (KernelSpec.welford)
        # Note [One triple per Welford] in split.py: a persistent kernel's combines by their inputs
        self.combined: dict[tuple[Any, ...], Any] = {}
        # Note [Symbolic sizes in Triton kernels]: size symbols the kernel's code names
        self.size_symbols: set[sympy.Symbol] = set()
        # Note [Floats of sizes in Triton]: float of sizes -> the float64 argument that holds it
        self.float_params: dict[sympy.Expr, str] = {}
        # Note [Integers of floats of sizes in Triton]: such an integer -> the int argument
        self.int_params: dict[sympy.Expr, str] = {}
        if plan.kind == "tiled":
            self.ranges: dict[sympy.Symbol, sympy.Expr] = {
                YINDEX: sympy.sympify(plan.ny),
                XINDEX: sympy.sympify(plan.nx),
            }
            self.flat_x: sympy.Expr = YINDEX * plan.nx + XINDEX
        else:
            self.ranges = {XINDEX: sympy.sympify(plan.nx)}
            self.flat_x = XINDEX
        if plan.kind in ("persistent", "looped"):
            self.ranges[RINDEX] = sympy.sympify(plan.nr)
        for n in self.ranges.values():
            self.size_symbols |= n.free_symbols
        # the row length as the kernel's code spells it
        self.rnumel_text = str(plan.nr) if isinstance(plan.nr, int) else "rnumel"

    # ----------------------------------------------------------------------------------- setup

    def generate(self) -> KernelSpec:
        with deriving_ints(self.int_params):  # Note [Integers of floats of sizes in Triton]
            return self._generate()

    def _generate(self) -> KernelSpec:
        nr = self.plan.nr
        reducing = self.plan.kind in ("persistent", "looped")
        for member, reads in zip(self.members, self.reads, strict=True):
            mx, mr = member.iteration()
            msizes = [_size(s) for s in mx]
            numel = math.prod(msizes)
            nx_total = self.plan.nx * self.plan.ny
            self.trivial = member.is_reduction() and not _real_reduction(member)
            rindex: list[sympy.Expr] = []
            if member.is_reduction() and not self.trivial:
                if (
                    not reducing
                    or not _same(math.prod(_size(s) for s in mr), nr)
                    or not _same(numel, nx_total)
                ):
                    raise CodegenUnsupported(f"reduction {member.name} does not match its kernel")
                index = self._digits(self.flat_x, msizes, self.plan.order if reducing else None)
                rindex = self._digits(RINDEX, [_size(s) for s in mr])
                level = "r"
            elif _same(numel, nx_total):
                index, level = self._digits(self.flat_x, msizes, self.plan.order), "x"
            elif reducing and _same(numel, nx_total * nr):
                order = self.plan.order
                if order is not None and len(msizes) > len(order):
                    # Note [Reductions walk their reads' memory order]: the x digits in the
                    # plan's order, the reduced digits after them as they are
                    nxd = len(order)
                    index = self._digits(self.flat_x, msizes[:nxd], order)
                    index += self._digits(RINDEX, msizes[nxd:])
                else:
                    index = self._digits(self.flat_x * nr + RINDEX, msizes)
                level = "r"
            else:
                raise CodegenUnsupported(f"member {member.name} does not fit its kernel's blocks")
            if self.trivial:
                rindex = [sympy.Integer(0)] * len(mr)
            self._enter(level, reads)
            with set_ops_handler(self):
                member.body()(index, rindex)
            if member.is_reduction() and not self.trivial and self.sections:
                self.sections[-1].reduced.add(member.name)
        return self._render()

    def _digits(
        self, flat: sympy.Expr, sizes: list[Any], order: tuple[int, ...] | None = None
    ) -> list[sympy.Expr]:
        if order is None or len(order) != len(sizes):
            return [simplify(e, self.ranges) for e in unflatten(flat, sizes)]
        digits = unflatten(flat, [sizes[d] for d in order])
        index: list[sympy.Expr] = [sympy.Integer(0)] * len(sizes)
        for d, e in zip(order, digits, strict=True):
            index[d] = simplify(e, self.ranges)
        return index

    def _enter(self, level: str, reads: Set[str]) -> None:
        """Open the section a member of ``level`` runs in (Note [Persistent and looped reductions])."""
        self.level = level
        current = self.sections[-1] if self.sections else None
        if not self.looped:
            # one straight-line section: every value stays visible to every later member
            if current is None:
                self.sections.append(Section("x"))
                self.scopes = [(self.sections[-1].lines, self.xcse, self.xforward)]
            return
        if level == "x":
            if current is None or current.level != "x":
                self.sections.append(Section("x"))
            self.scopes = [(self.sections[-1].lines, self.xcse, self.xforward)]
            return
        if current is None or current.level != "r" or reads & current.reduced:
            self.sections.append(Section("r"))
            self.scopes = [([], self.xcse, self.xforward), (self.sections[-1].lines, {}, {})]

    # --------------------------------------------------------------------------------- helpers

    def _emit(self, line: str) -> None:
        self.lines.append(line)

    def _cse(self, expr: str, dtype: torch.dtype, axes: frozenset[str]) -> TValue:
        hit = self._computed(expr, dtype)
        if hit is not None:
            return hit
        var = self._new()
        self._emit(f"{var} = {expr}")
        value = TValue(var, dtype, axes)
        self.scopes[-1][1][expr] = value
        return value

    def _as(self, v: TValue, dtype: torch.dtype) -> TValue:
        if v.dtype == dtype:
            return v
        if v.const:
            return TValue(constant_expr(v.py, dtype), dtype, frozenset(), v.py)
        text = convert_expr(v.expr, v.dtype, dtype)
        if text == v.expr:
            return TValue(v.expr, dtype, v.axes)
        return self._cse(text, dtype, v.axes)

    def _index(self, index: Any) -> tuple[sympy.Expr, frozenset[str]]:
        expr = simplify(sympy.sympify(index), self.ranges)
        axes: set[str] = set()
        for s in expr.free_symbols:
            if s in AXIS_OF:
                axes.add(AXIS_OF[s])
            elif s in self.sym_axes:
                axes |= self.sym_axes[s]
            else:  # a size symbol (Note [Symbolic sizes in Triton kernels])
                self.size_symbols.add(s)
        return expr, frozenset(axes)

    def _ctx_axes(self) -> frozenset[str]:
        kind = self.plan.kind
        if kind == "tiled":
            return frozenset({"y", "x"})
        if kind == "pointwise" or self.level == "x":
            return frozenset({"x"})
        return frozenset({"x", "r"})

    def _shape(self, axes: frozenset[str]) -> str:
        kind = self.plan.kind
        if kind == "pointwise":
            return "[XBLOCK]"
        order = ("y", "x") if kind == "tiled" else ("x", "r")
        blocks = {"x": "XBLOCK", "y": "YBLOCK", "r": "RBLOCK"}
        return "[" + ", ".join(blocks[a] if a in axes else "1" for a in order) + "]"

    def _mask(self, axes: frozenset[str], extra: Sequence[TValue] = ()) -> str | None:
        parts = [f"{a}mask" for a in ("y", "x", "r") if a in axes]
        parts += [m.expr for m in extra]
        return " & ".join(parts) if parts else None

    def _pointer(self, name: str, expr: sympy.Expr, axes: frozenset[str], want: frozenset[str]) -> str:
        ptr = f"{self._param(name)} + ({index_to_triton(expr)})"
        if not want <= axes:
            ptr += f" + tl.zeros({self._shape(want | axes)}, tl.int32)"
        return ptr

    # ---------------------------------------------------------------------------- memory ops

    def load(self, name: str, index: Any) -> TValue:
        expr, axes = self._index(index)
        key = (name, _text(expr))
        hit = self._forwarded(key)
        if hit is not None:
            return hit
        self.accesses.append((name, expr, False))
        dtype = self.dtypes[name]
        extra = list(self.mask_stack)
        want = axes.union(*(m.axes for m in extra)) if extra else axes
        # no 0-d loads: the interpreter mishandles them, and a block of one address is as cheap
        want = want or frozenset({"x"})
        if name in self.stored:
            # a kernel-internal buffer written by another lane of this program
            self._emit("tl.debug_barrier()")
        self.loaded.add(name)
        mask = self._mask(axes, extra)
        ptr = self._pointer(name, expr, axes, want)
        text = f"tl.load({ptr}, {mask}, other=0)" if mask else f"tl.load({ptr})"
        return self._cse(load_expr(dtype, text), dtype, want)

    def store(self, name: str, index: Any, value: Any, mode: str | None = None) -> None:
        expr, axes = self._index(index)
        self.accesses.append((name, expr, True))
        dtype = self.dtypes[name]
        v = self._as(self._value(value, dtype), dtype)
        ctx = self._ctx_axes()
        ptr = self._pointer(name, expr, axes, ctx)
        mask = self._mask(ctx)
        self.stored.add(name)
        if mode == "atomic_add":
            # Note [16-bit atomic adds]: float16 accumulates with tl.atomic_add (PTX has a float16
            # atomic add from sm_70; Triton's interpreter has one too), each add rounded to float16
            # as eager's CPU and CUDA kernels round. bfloat16's tl.atomic_add is sm_90 only and
            # the interpreter's is wrong (it holds bfloat16 as uint16 and adds the integers), so
            # bfloat16 accumulates in a compare-and-swap loop on the 16-bit element
            # (`k_bf16_atomic_add` in triton_ops.PRELUDE: PTX `atom.cas.b16`, sm_70 on; the
            # interpreter has it): widen, add in float32, round to nearest even, swap if nobody
            # wrote in between, else retry with what they wrote. Each add is rounded to bfloat16,
            # as eager's kernels round. Narrower types have no 16-bit form: declined, loopir's
            # interpreter runs the kernel.
            if dtype in (torch.bool, torch.int8, torch.uint8, torch.int16):
                raise CodegenUnsupported(f"atomic add of {dtype}")
            self.atomic = True
            value = store_expr(dtype, v.expr)
            if dtype == torch.bfloat16:
                self._emit(f"k_bf16_atomic_add({ptr}, {value}, {mask}, {self._param(name)})")
                return
            self._emit(f"tl.atomic_add({ptr}, {value}, {mask}, sem='relaxed')")
            return
        if mode is not None:
            raise CodegenUnsupported(f"store mode {mode}")
        self._emit(marked_store(name, f"tl.store({ptr}, {store_expr(dtype, v.expr)}, {mask})"))
        self.scopes[-1][2][(name, _text(expr))] = v

    def store_reduction(self, name: str, index: Any, value: Any) -> None:
        if self.trivial:
            self.store(name, index, value)
            return
        expr, axes = self._index(index)
        self.accesses.append((name, expr, True))
        dtype = self.dtypes[name]
        v = self._value(value, dtype)
        v = (
            self._as(v, dtype)
            if not v.const
            else TValue(constant_expr(v.py, dtype), dtype, frozenset(), v.py)
        )
        ctx = frozenset({"x"})
        ptr = self._pointer(name, expr, axes, ctx)
        self.stored.add(name)
        line = marked_store(name, f"tl.store({ptr}, {store_expr(dtype, v.expr)}, xmask)")
        (self.sections[-1].post if self.looped else self.lines).append(line)
        self.xforward[(name, _text(expr))] = v

    def index_expr(self, expr: Any, dtype: torch.dtype) -> TValue:
        if isinstance(expr, FloatOp):
            return self._float_of_sizes(expr, dtype)
        e, axes = self._index(expr)
        if e.is_Integer:
            return self._value(int(e), dtype)
        return self._cse(f"({index_to_triton(e)}).to({tl_type(compute_dtype(dtype))})", dtype, axes)

    # Note [Floats of sizes in Triton]: a float computed from sizes (`torch.full(shape, n / 3)`,
    # Note [Python float arithmetic on sizes, in its order] in kiln_symbolic) is not computed in
    # the kernel: Triton divides two ints in float32, spells a float literal in float32, and on
    # a GPU may contract `a * b + c` into one fused multiply-add, each a different double than
    # Python's. The wrapper computes it once per call as the same Python operations on the same
    # int sizes (eager's value exactly, Note [Symbolic sizes in the Triton wrapper]) and passes it
    # as a float64 argument (`kf0: tl.float64`, after the size arguments); the kernel converts
    # it to its compute type as `index_expr` converts a size. `tl.full([], kf0, tl.float64)`
    # reads it as float64 both on a GPU (a float64 scalar, cast to itself) and in Triton's
    # interpreter (which passes a Python float through untyped: `kf0 + x` would make it float32).
    def _float_of_sizes(self, expr: Any, dtype: torch.dtype) -> TValue:
        if not expr.free_symbols or any(s in AXIS_OF or s in self.sym_axes for s in expr.free_symbols):
            raise CodegenUnsupported(f"a float of sizes over a kernel index ({expr})")
        if any(a.is_number and not isinstance(a, sympy.Integer | sympy.Float) for a in expr.atoms()):
            raise CodegenUnsupported(f"a float of sizes with a non-finite operand ({expr})")
        name = self.float_params.setdefault(expr, f"kf{len(self.float_params)}")
        return self._cse(
            f"tl.full([], {name}, tl.float64).to({tl_type(compute_dtype(dtype))})", dtype, frozenset()
        )

    # Note [Index checks in the interpreter]: an indirect index out of range (eager's IndexError:
    # `x.index_put_((torch.tensor([4]),), v)` once `x.t_()` left dim 0 of size 4) was loaded or
    # stored unchecked unless `debug`; Triton's interpreter runs kernels on host copies of the
    # arguments, so the store wrote past a heap block: `free(): invalid next size`, an abort of
    # the process (test_alias_fuzz.py seed 2010 under cpu_backend="triton"). Interpreted kernels
    # always check (the check costs little there and raises eager's IndexError). On a GPU the
    # checks stay behind `debug` (`tl.device_assert` needs Triton's debug mode): an out-of-range
    # index there is still undefined, where kiln's C++ kernels always check.
    def indirect_indexing(self, value: Any, size: Any, check: bool = True) -> sympy.Symbol:
        v = self._as(self._value(value), torch.int64)
        n = _size(size)
        if not isinstance(n, int):  # a run-time extent (Note [Symbolic sizes in Triton kernels])
            self.size_symbols |= n.free_symbols
            n = index_to_triton(n)
        var = self._new("ind")
        cast = f".to({self.index_dtype})" if self.index_dtype != "tl.int64" else ""
        self._emit(f"{var} = tl.where({v} < 0, {v} + {n}, {v}){cast}")
        if check and (self.debug or interpreting()):  # Note [Index checks in the interpreter]
            mask = self._mask(self._ctx_axes(), self.mask_stack)
            ok = f"(0 <= {var}) & ({var} < {n})"
            cond = f"({ok}) | ~({mask})" if mask else ok
            check_fn = "k_device_assert" if interpreting() else "tl.device_assert"
            self._emit(f'{check_fn}({cond}, "index out of bounds: 0 <= index < {n}")')
        symbol = sympy.Symbol(var, integer=True, nonnegative=True)  # wrapped into [0, n) above
        self.sym_axes[symbol] = v.axes
        return symbol

    # ------------------------------------------------------------------------------ control

    def masked(self, mask: Any, body: Callable[[], Any], other: Any) -> TValue:
        m = self._as(self._value(mask), torch.bool)
        self.mask_stack.append(m)
        try:
            result = self._value(body())
        finally:
            self.mask_stack.pop()
        dtype = result.dtype
        o = self._as(self._value(other, dtype), dtype)
        return self._cse(f"tl.where({m}, {result}, {o})", dtype, m.axes | result.axes | o.axes)

    def where(self, cond: Any, a: Any, b: Any) -> TValue:
        c = self._as(self._value(cond), torch.bool)
        va, vb, dtype = self._where_operands(a, b)
        return self._cse(f"tl.where({c}, {va}, {vb})", dtype, c.axes | va.axes | vb.axes)

    def constant(self, value: Any, dtype: torch.dtype) -> TValue:
        return TValue(constant_expr(value, dtype), dtype, frozenset(), value)

    # --------------------------------------------------------------------------------- math

    def _math(self, name: str, *args: Any) -> TValue:
        values, out, operand = self._math_operands(name, args)
        if name == "nextafter" and operand in HALF:
            text = f"k_nextafter_half({values[0]}, {values[1]}, {tl_type(operand)})"
        else:
            text = spell(name, compute_dtype(operand), *[v.expr for v in values])
        if out in HALF and name not in ALWAYS_BOOL:
            text = convert_expr(text, torch.float32, out)
        elif out != operand and name not in ALWAYS_BOOL:
            text = convert_expr(text, operand, out)
        axes = frozenset().union(*(v.axes for v in values))
        return self._cse(text, out, axes)

    # ---------------------------------------------------------------------------- reduction

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any) -> Any:
        if reduction_type == "welford_combine":
            return self._welford_combine(dtype, value)
        v = self._value(value)
        if self.trivial:
            return self._reduce_one(dtype, reduction_type, v)
        if self.level != "r":
            raise CodegenUnsupported("reduction outside the reduction axis")
        # Note [One accumulator per reduction of a value]: members of one kernel often reduce the
        # same value the same way and keep different parts of the result: a `var_mean` is two
        # buffers over one Welford, and the partial kernel of a split Welford (BatchNorm's
        # training statistics) stores mean, m2 and weight of each as six members. A looped kernel
        # gave each member accumulators of its own, updated identically in the loop: on an H100
        # (ResNet-50 bf16 training) those partial kernels ran at 24-29% of copy bandwidth with
        # six Welford triples of [XBLOCK, RBLOCK] registers. The result is kept per section
        # (one reduction loop: its values are named in it alone), so a second member reuses it.
        # A whole row in registers needs no cache: its reductions are CSE'd text already.
        key = (dtype, reduction_type, v.expr, v.dtype, tuple(str(m) for m in self.mask_stack))
        results = self.sections[-1].results if self.looped and self.sections else None
        if results is not None and key in results:
            return results[key]
        result = self._reduction(dtype, reduction_type, v)
        if results is not None:
            results[key] = result
        return result

    def _reduction(self, dtype: torch.dtype, reduction_type: str, v: TValue) -> Any:
        rmask = "xmask & rmask"
        xr = frozenset({"x", "r"})
        if reduction_type in ("argmax", "argmin"):
            if v.dtype == torch.bool:
                v = self._as(v, torch.int8)
            neutral = _extreme(v.dtype, low=reduction_type == "argmax")
            combine = f"k_{reduction_type}"
            vm = self._cse(f"tl.where({rmask}, {v}, {neutral})", v.dtype, xr)
            where = f"tl.where({rmask}, rindex, {self.rnumel_text})"
            if not isinstance(self.plan.nr, int):  # an int64 row length: positions stay int32
                where += ".to(tl.int32)"
            index = self._cse(where, torch.int32, xr)
            if not self.looped:
                _, idx = self._new("_"), self._new("idx")
                self._emit(f"_, {idx} = tl.reduce(({vm}, {index}), 1, {combine})")
                return self._x_value(f"{idx}[:, None].to(tl.int64)", torch.int64)
            acc, acci = self._new("acc"), self._new("acci")
            section = self.sections[-1]
            section.pre.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {neutral}, {compute_type(v.dtype)})")
            section.pre.append(f"{acci} = tl.full([XBLOCK, RBLOCK], {self.rnumel_text}, tl.int32)")
            self._emit(f"{acc}, {acci} = {combine}({acc}, {acci}, {vm}, {index})")
            idx = self._new("idx")
            section.post.append(f"_, {idx} = tl.reduce(({acc}, {acci}), 1, {combine})")
            return self._post_value(f"{idx}[:, None].to(tl.int64)", torch.int64)
        if reduction_type == "welford_reduce":
            v = self._as(v, dtype)
            t = compute_type(dtype)
            if not self.looped:
                # a whole row in registers: the two-pass mean and sum of squared deviations.
                # Note [One sum of a row]: the row's sum is spelled as a "sum" reduction's is,
                # so a layer norm's mean (a sum of the same value in the same kernel) reuses it
                masked = self._cse(f"tl.where({rmask}, {v}, 0)", dtype, xr)
                total = self._x_value(f"tl.sum({masked}, 1)[:, None]", dtype)
                mean_v = self._x_value(f"{total} / {self.rnumel_text}", dtype)
                dev = self._cse(f"tl.where({rmask}, {v} - {mean_v}, 0.0)", dtype, xr)
                m2_v = self._x_value(f"tl.sum({dev} * {dev}, 1)[:, None]", dtype)
                weight = self._x_value(f"tl.full([XBLOCK, 1], {self.rnumel_text}, {t})", dtype)
                return (mean_v, m2_v, weight)
            mean, m2, w = self._new("wmean"), self._new("wm2"), self._new("wweight")
            self.welford = True
            section = self.sections[-1]
            for acc in (mean, m2, w):
                section.pre.append(f"{acc} = tl.zeros([XBLOCK, RBLOCK], {t})")
            w1, delta, mean1 = self._new(), self._new(), self._new()
            self._emit(f"{w1} = {w} + 1")
            self._emit(f"{delta} = {v} - {mean}")
            self._emit(f"{mean1} = {mean} + {delta} / {w1}")
            self._emit(f"{m2} = tl.where({rmask}, {m2} + {delta} * ({v} - {mean1}), {m2})")
            self._emit(f"{mean} = tl.where({rmask}, {mean1}, {mean})")
            self._emit(f"{w} = tl.where({rmask}, {w1}, {w})")
            fm, fm2, fw = self._new("mean"), self._new("m2"), self._new("weight")
            section.post.append(f"{fm}, {fm2}, {fw} = tl.reduce(({mean}, {m2}, {w}), 1, k_welford)")
            return tuple(self._post_value(f"{n}[:, None]", dtype) for n in (fm, fm2, fw))
        if dtype == torch.bool and reduction_type in ("max", "min"):
            reduction_type = "any" if reduction_type == "max" else "all"
        if dtype == torch.bool and reduction_type not in ("any", "all"):
            raise CodegenUnsupported(f"{reduction_type} of bool")
        if reduction_type in ("any", "all"):
            # bools reduce as int8 0/1: any is a max, all a min
            v = self._cse(f"({v} != 0).to(tl.int8)", torch.int8, v.axes)
            fn = "max" if reduction_type == "any" else "min"
            neutral = "0" if reduction_type == "any" else "1"
            dtype_acc, final = torch.int8, f"tl.{fn}({{acc}}, 1)[:, None] != 0"
            update = f"tl.{fn}imum({{acc}}, {{v}})"
            result_dtype_ = torch.bool
        else:
            v = self._as(v, dtype)
            dtype_acc, result_dtype_ = dtype, dtype
            neutral = {
                "sum": "0",
                "prod": "1",
                "max": _extreme(dtype, low=True),
                "min": _extreme(dtype, low=False),
            }.get(reduction_type, "")
            if not neutral:
                raise CodegenUnsupported(f"reduction {reduction_type}")
            final = {
                "sum": "tl.sum({acc}, 1)[:, None]",
                "prod": "tl.reduce({acc}, 1, k_prod)[:, None]",
                "max": "tl.reduce({acc}, 1, k_max)[:, None]",
                "min": "tl.reduce({acc}, 1, k_min)[:, None]",
            }[reduction_type]
            update = {
                "sum": "{acc} + {v}",
                "prod": "{acc} * {v}",
                "max": "k_max({acc}, {v})",
                "min": "k_min({acc}, {v})",
            }[reduction_type]
        masked = self._cse(f"tl.where({rmask}, {v}, {neutral})", dtype_acc, xr)
        if not self.looped:
            return self._x_value(final.format(acc=masked), result_dtype_)
        acc = self._new("acc")
        section = self.sections[-1]
        section.pre.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {neutral}, {compute_type(dtype_acc)})")
        self._emit(f"{acc} = {update.format(acc=acc, v=masked)}")
        return self._post_value(final.format(acc=acc), result_dtype_)

    def _welford_combine(self, dtype: torch.dtype, value: Any) -> Any:
        """Partial (mean, m2, weight) triples combined by ``k_welford`` (the second kernel of a
        split Welford reduction, Note [Split reductions] in split.py); a masked lane weighs 0."""
        parts = tuple(self._as(self._value(v), dtype) for v in value)
        if self.trivial:
            return parts
        if self.level != "r":
            raise CodegenUnsupported("reduction outside the reduction axis")
        xr = frozenset({"x", "r"})
        masked = [self._cse(f"tl.where(xmask & rmask, {p}, 0.0)", dtype, xr) for p in parts]
        # Note [One triple per Welford] in split.py: the members of one Welford combine it once
        key = (
            "welford_combine",
            dtype,
            tuple(str(m) for m in masked),
            tuple(str(m) for m in self.mask_stack),
        )
        results = self.sections[-1].results if self.looped and self.sections else self.combined
        if key in results:
            return results[key]
        results[key] = result = self._combine_triples(dtype, masked)
        return result

    def _combine_triples(self, dtype: torch.dtype, masked: Sequence[Any]) -> Any:
        fm, fm2, fw = self._new("mean"), self._new("m2"), self._new("weight")
        if not self.looped:
            self._emit(f"{fm}, {fm2}, {fw} = tl.reduce(({', '.join(str(m) for m in masked)}), 1, k_welford)")
            return tuple(self._x_value(f"{n}[:, None]", dtype) for n in (fm, fm2, fw))
        t = compute_type(dtype)
        accs = self._new("cmean"), self._new("cm2"), self._new("cweight")
        section = self.sections[-1]
        for acc in accs:
            section.pre.append(f"{acc} = tl.zeros([XBLOCK, RBLOCK], {t})")
        joined = ", ".join(accs)
        self._emit(f"{joined} = k_welford({joined}, {', '.join(str(m) for m in masked)})")
        section.post.append(f"{fm}, {fm2}, {fw} = tl.reduce(({joined}), 1, k_welford)")
        return tuple(self._post_value(f"{n}[:, None]", dtype) for n in (fm, fm2, fw))

    def _x_value(self, text: str, dtype: torch.dtype) -> TValue:
        """A reduced value (persistent mode: computed in place, visible to later members)."""
        return self._cse(text, dtype, frozenset({"x"}))

    def _post_value(self, text: str, dtype: torch.dtype) -> TValue:
        """A reduced value computed after the reduction loop (looped mode)."""
        var = self._new()
        self.sections[-1].post.append(f"{var} = {text}")
        return TValue(var, dtype, frozenset({"x"}))

    # ------------------------------------------------------------------------------ render

    def _render(self) -> KernelSpec:
        elided, scratch = self._internal_stores()  # Note [Stores of kernel-internal buffers]

        def clean(lines: list[str]) -> list[str]:
            return unmark_stores(lines, elided)

        body: list[str] = []
        for section in self.sections:
            if section.level == "x":
                body.extend(clean(section.lines))
                continue
            body.extend(section.pre)
            body.append("for roffset in range(0, rnumel, RBLOCK):")
            body.append("    rindex = roffset + rbase")
            body.append("    rmask = rindex < rnumel")
            body.extend("    " + line for line in clean(section.lines))
            body.extend(clean(section.post))
        text = "\n".join(body)
        # a parameter is passed when its name appears as a word of the body; the body's words
        # are read once (a search per parameter compiled a pattern per name, most of them
        # missing re's cache), a name that is not one word is searched as before
        words = set(_WORD.findall(text))
        params = [
            n
            for n in self.param_order
            if (f"p_{n}" in words if _WORD.fullmatch(n) else re.search(rf"\bp_{re.escape(n)}\b", text))
        ]
        plan = self.plan
        prog = (
            f"tl.program_id({{axis}}).to({self.index_dtype})"
            if self.index_dtype == "tl.int64"
            else ("tl.program_id({axis})")
        )
        head: list[str] = []
        blocks = ["XBLOCK: tl.constexpr"]
        numel = {"x": _numel_text(plan.nx), "y": _numel_text(plan.ny), "r": _numel_text(plan.nr)}
        if plan.kind == "pointwise":
            head += [
                f"xnumel = {numel['x']}",
                f"xindex = {prog.format(axis=0)} * XBLOCK + tl.arange(0, XBLOCK)",
                "xmask = xindex < xnumel",
            ]
        elif plan.kind == "tiled":
            blocks = ["YBLOCK: tl.constexpr", "XBLOCK: tl.constexpr"]
            head += [
                f"ynumel = {numel['y']}",
                f"xnumel = {numel['x']}",
                f"yindex = {prog.format(axis=1)} * YBLOCK + tl.arange(0, YBLOCK)[:, None]",
                "ymask = yindex < ynumel",
                f"xindex = {prog.format(axis=0)} * XBLOCK + tl.arange(0, XBLOCK)[None, :]",
                "xmask = xindex < xnumel",
            ]
        else:
            blocks.append("RBLOCK: tl.constexpr")
            head += [
                f"xnumel = {numel['x']}",
                f"rnumel = {numel['r']}",
                f"xindex = {prog.format(axis=0)} * XBLOCK + tl.arange(0, XBLOCK)[:, None]",
                "xmask = xindex < xnumel",
                "rbase = tl.arange(0, RBLOCK)[None, :]",
            ]
            if plan.kind == "persistent":
                head += ["rindex = rbase", "rmask = rindex < rnumel"]
        # Note [Symbolic sizes in Triton kernels]: the size symbols after the pointers
        size_params = sorted(str(sym) for sym in self.size_symbols)
        ints = list(self.int_params.values())  # Note [Integers of floats of sizes in Triton]
        floats = list(self.float_params.values())  # Note [Floats of sizes in Triton]
        signature = ", ".join(
            [*(f"p_{n}" for n in params), *size_params, *ints, *(f"{f}: tl.float64" for f in floats), *blocks]
        )
        members = ", ".join(m.name for m in self.members)
        name = self.name.replace(KIND, KIND_PREFIX[plan.kind])
        lines = [
            *source_comment(name, self.members, "#"),
            "@triton.jit(debug=True)" if self.debug else "@triton.jit",
            f"def {name}({signature}):",
            f"    # {plan.kind} kernel for {members}",
            *("    " + h for h in head),
            *("    " + b for b in body),
        ]
        if not body:
            lines.append("    pass")
        return KernelSpec(
            name=name,
            source="\n".join(lines) + "\n",
            params=tuple(params),
            param_dtypes=tuple(self.dtypes[n] for n in params),
            kind=plan.kind,
            xnumel=plan.nx,
            ynumel=plan.ny,
            rnumel=plan.nr,
            scratch=tuple(scratch),
            members=tuple(m.name for m in self.members),
            atomic=self.atomic,
            outer=False,
            welford=self.welford,
            size_params=(*size_params, *ints, *floats),
            float_params=tuple((name, e) for e, name in self.float_params.items()),
            int_params=tuple((name, e) for e, name in self.int_params.items()),
            numel_hints=(
                None
                if _is_static(plan.nx, plan.ny, plan.nr)
                else (sizevars.hint(plan.nx), sizevars.hint(plan.ny), sizevars.hint(plan.nr))
            ),
        )


def _numel_text(n: Any) -> str:
    """A numel in the kernel's head: the int, or its expression over the size arguments."""
    return str(n) if isinstance(n, int) else index_to_triton(n)


def _extreme(dtype: torch.dtype, *, low: bool) -> str:
    """The neutral element of max (``low``) or min as Triton source."""
    if dtype.is_floating_point:
        return 'float("-inf")' if low else 'float("inf")'
    if dtype == torch.bool:
        return "0" if low else "1"
    info = torch.iinfo(dtype)
    return str(info.min if low else info.max)


def _unit(expr: sympy.Expr, symbol: sympy.Symbol) -> bool:
    """Does ``expr`` step by exactly 1 as ``symbol`` (or its last digit) steps by 1?"""
    for term in sympy.Add.make_args(sympy.expand(expr)):
        coeff, rest = term.as_coeff_Mul()
        if coeff != 1:
            continue
        if rest == symbol:
            return True
        if isinstance(rest, ModularIndexing) and rest.args[0] == symbol and rest.args[1] == 1:
            return True
    return False


def build_kernel(
    name: str,
    members: Sequence[ComputedBuffer],
    reads: Sequence[Set[str]],
    dtypes: dict[str, torch.dtype],
    internal: set[str],
    *,
    index_dtype: str = "tl.int32",
    debug: bool = False,
    max_persistent_rblock: int = 4096,
    allow_tiling: bool = True,
    reorder_reductions: bool = True,
    reorder_gathers: bool = False,
    outer_by_tiles: bool = True,
    column: bool = False,
) -> KernelSpec:
    """Generate the kernel for one scheduler node's members, choosing how to block it.
    ``column``: the caller knows the members are a column reduction (the partial kernel of a split
    one, Note [Partials of a column reduction stay column reductions] in split.py): looped over
    column tiles, whatever its accesses look like.

    Note [Persistent and looped reductions]: a reduction whose row fits ``max_persistent_rblock``
    lanes runs *persistent*: the whole row is in registers, every member is one straight line
    of code, and a member that reads a reduced value (softmax's normalisation reads the row max
    and sum) just uses it. A longer row runs *looped*: each r-phase is a loop over ``RBLOCK``
    chunks with lane accumulators, reduced after the loop; a member that reads a reduction
    finished in the current phase opens a new phase, so the row is walked again. An *outer*
    reduction (the reduced dim strided, the output dim contiguous, as in ``x.sum(0)``) loops
    with short ``RBLOCK`` and wide ``XBLOCK`` so each load is a coalesced row segment.

    Note [When to tile]: a pointwise kernel over two or more dims is tiled when one access walks
    the last dim contiguously and another walks the dim before it (a transpose): a 1-D block
    would make one of them strided. Otherwise a flat 1-D block is best.
    """
    reduction = next((m for m in members if _real_reduction(m)), None)
    ref = reduction if reduction is not None else members[0]
    xr, rr = ref.iteration()
    xsizes = [_size(s) for s in xr]
    nx = _prod(xsizes)
    rsizes = [_size(s) for s in rr]
    # a reduction over a broadcast input can iterate past every buffer's size; a symbolic
    # iteration has no known bound, and none is guarded (Note [Symbolic sizes in Triton kernels])
    if not _is_static(*xsizes, *rsizes) or nx * math.prod(rsizes) >= 2**31 - 1:
        index_dtype = "tl.int64"

    def gen(plan: Plan) -> tuple[KernelSpec, _Generator]:
        g = _Generator(name, members, reads, dtypes, internal, plan, index_dtype=index_dtype, debug=debug)
        return g.generate(), g

    if reduction is not None:
        nr = _prod(rsizes)
        if column:
            return _with_outer(gen(Plan("looped", nx, 1, nr))[0], True)
        spec, g = gen(Plan("persistent", nx, 1, nr))
        row = [a for a in g.accesses if a[1].has(RINDEX)]
        # Note [Row statistics do not decide a column reduction]: only accesses that move with
        # both the outputs and the row say how the tile's loads coalesce
        both = [a for a in row if a[1].has(XINDEX)] if outer_by_tiles else row
        outer = any(_unit(e, XINDEX) for _, e, _ in both) and not any(_unit(e, RINDEX) for _, e, _ in both)
        order = None
        loads = [e for _, e, store in row if not store]
        if reorder_reductions and loads and not any(_unit(e, s) for e in loads for s in (XINDEX, RINDEX)):
            for candidate in _reduction_orders(members, xsizes, rsizes):
                spec2, g2 = gen(Plan("persistent", nx, 1, nr, order=candidate))
                loads2 = [e for _, e, store in g2.accesses if not store and e.has(RINDEX)]
                if any(_unit(e, XINDEX) for e in loads2) and not any(_unit(e, RINDEX) for e in loads2):
                    spec, g, outer, order = spec2, g2, True, candidate
                    log.debug(
                        "%s: rows taken in dim order %s (Note [Reductions walk their reads' memory order])",
                        name.replace("{kind}", "*"),
                        candidate,
                    )
                    break
        if reorder_gathers and order is None and (gathers := _row_gathers(g)):
            for candidate in _reduction_orders(members, xsizes, rsizes):
                spec2, g2 = gen(Plan("persistent", nx, 1, nr, order=candidate))
                if all(_unit(e, XINDEX) for e in _row_gathers(g2)):
                    spec, g, order = spec2, g2, candidate
                    log.debug(
                        "%s: rows taken in dim order %s: %d gather(s) along the row walk the rows "
                        "(Note [Gathers along a row walk the rows])",
                        name.replace("{kind}", "*"),
                        candidate,
                        len(gathers),
                    )
                    break
        if not isinstance(nr, int):
            # Note [Symbolic sizes in Triton kernels]: a row of unknown length never fits a block
            spec, g = gen(Plan("looped", nx, 1, nr, order=order))
        elif next_pow2(nr) > max_persistent_rblock or (order is None and outer and nr > OUTER_PERSISTENT_MAX):
            # a reordered row stays persistent where it fits: its tile is a few rows deep (enough
            # for a sector of each row) and one row long, so the grid stays full
            spec, g = gen(Plan("looped", nx, 1, nr, order=order))
        return _with_outer(spec, outer, order is not None)
    squeezed = [s for s in xsizes if s != 1]
    tile = _tile(squeezed) if allow_tiling and len(squeezed) >= 2 else None
    if tile is not None:
        spec, g = gen(Plan("tiled", *tile))
        both = [e for _, e, _ in g.accesses if e.has(XINDEX) or e.has(YINDEX)]
        along_x = any(_unit(e, XINDEX) for e in both)
        along_y = any(_unit(e, YINDEX) and not _unit(e, XINDEX) for e in both)
        if along_x and along_y:
            return spec
    spec, _ = gen(Plan("pointwise", nx, order=_memory_order(members, xsizes, internal)))
    return spec


def _tile(squeezed: list[Any]) -> tuple[Any, int] | None:
    """(x extent, y extent) of a 2-D tiling of these dims (size 1 dropped), or None when too small
    (Note [When to tile]). Note [Symbolic sizes in Triton kernels]: only where the y extent is a
    known size (its grid must fit CUDA's y limit); a symbolic last dim is judged by its hint."""
    last = squeezed[-1]
    ny = math.prod(squeezed[:-1])
    if not isinstance(ny, int):
        return None
    extent = last if isinstance(last, int) else sizevars.hint(last)
    if extent >= MIN_TILE and ny >= MIN_TILE and -(-ny // MIN_TILE) <= MAX_GRID_Y:
        return last, ny
    return None


def _memory_order(
    members: Sequence[ComputedBuffer], xsizes: list[Any], internal: Set[str]
) -> tuple[int, ...] | None:
    """Note [Pointwise kernels walk memory order]: a flat pointwise kernel takes its x digits in
    the order of its outputs' strides, outermost first, so that consecutive lanes write
    consecutive addresses: a channels-last (NHWC) buffer iterated in logical (N, C, H, W) order
    would be written with a stride of C, and every load of another NHWC buffer would stride
    too (ResNet-50's batch-norm kernels ran 3x slower). Only when every member iterates the same
    sizes (they must all take the same digits) and every stored member agrees on one order;
    None keeps the logical order."""
    if len(xsizes) < 2:
        return None
    orders = set()
    for m in members:
        if [_size(s) for s in m.iteration()[0]] != xsizes:
            return None
        if m.name in internal:  # never stored: its layout is no one's memory
            continue
        try:
            strides = [int(st) for st in m.layout.stride]
            sizes = [int(sz) for sz in m.layout.size]
        except (TypeError, AttributeError):
            continue
        if sizes != xsizes:
            return None
        # size-1 dims go outermost: their stride says nothing
        orders.add(tuple(sorted(range(len(sizes)), key=lambda d: (sizes[d] != 1, -strides[d], d))))
    if len(orders) != 1:
        return None
    order = orders.pop()
    logical = tuple(sorted(range(len(xsizes)), key=lambda d: (xsizes[d] != 1, d)))
    return None if order == logical else order


@dataclass(frozen=True)
class KernelGroup:
    """The kernels one scheduler node runs as, in order, and the temporaries between them (one
    kernel and none, except for a split reduction: see ``split.py``)."""

    specs: tuple[KernelSpec, ...]
    temporaries: tuple[ComputedBuffer, ...] = ()

    @property
    def scratch(self) -> tuple[str, ...]:
        return tuple(n for s in self.specs for n in s.scratch)


def _with_outer(spec: KernelSpec, outer: bool, reordered: bool = False) -> KernelSpec:
    from dataclasses import replace

    return replace(spec, outer=outer, reordered=reordered)


def _row_gathers(g: _Generator) -> list[sympy.Expr]:
    """Note [Gathers along a row walk the rows]: T5's position-bias mask (transformers 5.17, where
    the bias reaches SDPA's mask without a ``contiguous()``) is one persistent reduction over rows
    ``(b, h, l)`` of ``S`` (the dense mask written, ``all(mask == -inf)`` reduced, Note [Attention
    masks read across their rows] in kiln_loopir), and the bias is no buffer: the embedding lookup
    is fused, so each element computes its bucket from an int64 ``[L, S]`` input and gathers
    ``weight[bucket, h]`` from the ``[32, H]`` table at ``H * bucket + h``. In logical order a
    program's rows are ``(b, h, l), (b, h, l + 1)``: every one of the ``B * H * L`` rows loads its
    own row of the bucket input, 8 bytes per 2-byte element written, so the ``[L, S]`` input is
    read ``B * H`` times over from L2 (201 MB for a 50 MB mask at the H200's batch 8, sequence 512,
    12 heads; the H200 ran the kernel at a fifth of copy bandwidth), while the gather's address
    jumps by ``H`` times a data-dependent step along the row. Taking the x digits with the dim the
    gather's address holds with step 1 (``h``) innermost, as in Note [Reductions walk their
    reads' memory order], puts the heads of one ``(b, l)`` in one program's rows: the gather steps
    by 1 along the rows, and everything the bucket is computed from is the same for a program's
    rows, so a 16-row program reads 2 rows of the bucket input (the rest are L1 hits) where 16
    programs read 16, and the stores stay along the row. What Triton emits for the gather itself
    is the same either way (its lanes lie along the row: the index is a loaded value, so no
    contiguity is known across rows); the table is 768 bytes and stays in L1. The gathers here:
    loads whose address holds an indirect index that varies along the row. Taken only when every
    such gather then steps by 1 along the rows, and never together with that Note's reorder.
    Measured on the H200 (twentieth session, T5 bf16 inference at gpu size, transformers 5.17,
    `2026-12-05-h200-s20-t5-gathers.json`): the reorder made both mask kernels slower, 61.5 ->
    69.3 us and 54.8 -> 60.4 us (21% -> 19% and 24% -> 22% of copy bandwidth): the L2 re-reads
    of the bucket input were not what bounds them (likely the rows' int64 bucket arithmetic and
    the stores, whose rows of one program now lie H rows apart in memory). So it is off by
    default. Switch: ``triton_options={"reorder_gathers": True}``."""
    return [
        e
        for _, e, store in g.accesses
        if not store and any("r" in g.sym_axes.get(s, frozenset()) for s in e.free_symbols)
    ]


def _reduction_orders(
    members: Sequence[ComputedBuffer], xsizes: list[Any], rsizes: list[Any]
) -> list[tuple[int, ...]]:
    """Note [Reductions walk their reads' memory order]: a reduction whose every row read is
    strided both along the row and across rows (T5's position-bias mask made dense: ``[L, S, H]``
    read as ``[H, L, S]`` rows over S, so consecutive rows are ``L`` elements apart and a row's
    elements ``H`` apart) reads one useful element per 32-byte sector. Taking the x digits in
    another order, one dim moved innermost, can make consecutive rows consecutive in memory
    (rows ``(l, h)``: the ``H`` rows of one ``l`` lie side by side); then the reduction is an
    *outer* one, loaded as ``[XBLOCK, RBLOCK]`` tiles whose rows are coalesced, and Triton
    converts the layout for a store along the row (the dense copy) through shared memory. The
    candidates: each static x dim of size > 1 but the innermost, moved innermost. Only when every
    member iterates the reference's dims as they are (x dims, or x dims then reduced dims: each
    takes the same digits); none otherwise. Switch: ``triton_options={"reorder_reductions":
    False}``."""
    nxd = len(xsizes)
    if nxd < 2 or not all(isinstance(s, int) for s in (*xsizes, *rsizes)):
        return []
    for m in members:
        sizes = [_size(s) for s in m.iteration()[0]]
        if m.is_reduction():
            if sizes != xsizes:
                return []
        elif sizes not in (xsizes, [*xsizes, *rsizes]):
            return []
    logical = list(range(nxd))
    out = []
    for d in range(nxd - 1):
        if xsizes[d] > 1:
            out.append(tuple([*(i for i in logical if i != d), d]))
    return out
