"""Fusions the C++ generator refuses (``CppBackend.can_fuse``, loopir's veto hook).

Note [Row and column reductions are not fused]: the scheduler fuses two reductions when their
iteration spaces have the same numbers of outputs and reduced elements, whatever the order they
walk memory in. A kernel has one loop nest, so when a *row* reduction (its reduced reads are
contiguous along the reduced loop: layer norm's backward over the hidden dim) and a *column*
reduction (contiguous along the output loop: a bias gradient, the sum over tokens of a
[tokens, hidden] gradient) share one, the second one's loads stride across memory at every lane
(Note [Column reductions] in kernel.py). The same holds for a pointwise member of
``outputs * reduced`` elements: its flat position is ``x * nr + r``, so one that walks its own
memory in order walks the rows. At the CPU size of the public suite and of train1.py, tokens =
hidden = 256, so every layer norm of RoBERTa's backward fused the bias and weight gradients that
read its input gradient: 0.5-0.6 ms per kernel at one thread, the C++ kernels of a training step
5.27 ms, against 3.79 ms with this veto (``bench/kernel_ab.py``). Such a pair is refused
(``CppOptions.fuse_mixed_reductions`` turns the veto off), and each runs in its own kernel: the
row one over rows, the column one alone in column blocks. KILN_LOG=fusion prints each refusal.
The exception is Note [Column sums in a row kernel] (kiln_loopir's scheduler.py, kernel.py):
column sums over the row kernel's own ``[rows, cols]`` operands join it as per-column partials,
not as a second loop nest (``CppOptions.row_column_sums``; ``FusionPolicy.row_column`` says which).
"""

from __future__ import annotations

import logging

import sympy

from kiln_loopir.ir import ReorderedPointwise, Scatter
from kiln_loopir.scheduler import BaseSchedulerNode, MemoryDep, SchedulerNode

log = logging.getLogger("kiln.codegen_cpp.fusion")


def _last_symbol(variables: tuple[sympy.Symbol, ...], sizes: tuple[object, ...]) -> sympy.Symbol | None:
    for var, size in zip(reversed(variables), reversed(sizes), strict=True):
        if sympy.sympify(size) != 1:
            return var
    return None


def orientation(node: SchedulerNode) -> str | None:
    """``"row"`` or ``"column"`` for a reduction over more than one element, from which of its
    innermost loops (reduced or output) more of its reduced reads walk with stride 1; else None."""
    buffer = node.node
    if not buffer.is_reduction():
        return None
    ranges, rranges = buffer.iteration()
    if sympy.sympify(sympy.Mul(*rranges)) == 1:
        return None
    nx = len(ranges)
    # (full, broadcast) counts: a reduced read that is the same for every output (a per-token
    # mean, over the batch and sequence loops) is small and only breaks ties, as in Note [Loop
    # order counts full-size accesses first] (kernel.py)
    x_unit, r_unit = [0, 0], [0, 0]
    for dep in node.reads:
        if not isinstance(dep, MemoryDep) or len(dep.variables) != nx + len(rranges):
            continue
        xl = _last_symbol(dep.variables[:nx], dep.sizes[:nx])
        rl = _last_symbol(dep.variables[nx:], dep.sizes[nx:])
        index = sympy.expand(dep.index)
        if xl is None or rl is None or not index.free_symbols & set(dep.variables[nx:]):
            continue
        kind = 0 if index.free_symbols & set(dep.variables[:nx]) else 1
        x_unit[kind] += int(index.coeff(xl) == 1)
        r_unit[kind] += int(index.coeff(rl) == 1)
    if x_unit == r_unit:
        return None
    return "column" if x_unit > r_unit else "row"


def pointwise_walks_rows(node: SchedulerNode) -> bool:
    """Do most of a pointwise node's accesses walk memory with stride 1 along its innermost
    loop? Fused into a reduction kernel with ``numel = outputs * reduced``, its flat position is
    ``x * nr + r``: such a node walks the kernel's rows (the reduced loop) contiguously."""
    ranges, _ = node.node.iteration()
    unit = other = 0
    for dep in (*node.reads, *node.writes):
        if not isinstance(dep, MemoryDep):
            continue
        last = _last_symbol(dep.variables, dep.sizes)
        if last is None:
            continue
        index = sympy.expand(dep.index)
        if len(index.free_symbols & set(dep.variables)) < 2:
            continue  # a broadcast operand (a per-channel scale) is small whichever way it is walked
        if index.coeff(last) == 1:
            unit += 1
        else:
            other += 1
    return len(ranges) > 0 and unit > other


class FusionPolicy:
    """Answers ``can_fuse`` for one schedule; orientations are cached per node name."""

    def __init__(self) -> None:
        self._orientation: dict[str, str | None] = {}
        self._rows: dict[str, bool] = {}

    def _orientations(self, node: BaseSchedulerNode, numel: object) -> set[str]:
        """The orientations of ``node``'s members in a reduction kernel of ``numel``
        element-iterations: its reductions', and "row" for a pointwise member of that size that
        walks its flat positions in order."""
        out: set[str] = set()
        for member in node.get_nodes():
            if not isinstance(member, SchedulerNode):
                continue
            if member.is_reduction():
                if member.name not in self._orientation:
                    self._orientation[member.name] = orientation(member)
                kind = self._orientation[member.name]
                if kind is not None:
                    out.add(kind)
                continue
            if sympy.Mul(*member.group()) != numel:
                continue
            if member.name not in self._rows:
                self._rows[member.name] = pointwise_walks_rows(member)
            if self._rows[member.name]:
                out.add("row")
        return out

    def mixed_reductions(self, a: BaseSchedulerNode, b: BaseSchedulerNode) -> bool:
        """Would fusing ``a`` and ``b`` put a column reduction in one loop nest with a row
        reduction, or with a pointwise member that walks the rows?"""
        if not (a.is_reduction() or b.is_reduction()):
            return False
        nx, nr = (a if a.is_reduction() else b).group()
        if nr == 1:
            return False
        numel = nx * nr
        oa, ob = self._orientations(a, numel), self._orientations(b, numel)
        if len(oa) > 1 or len(ob) > 1 or not oa or not ob or oa == ob:
            return False
        log.debug(
            "not fusing %s (%s) with %s (%s): one loop nest walks rows or columns", a.name, *oa, b.name, *ob
        )
        return True

    def row_column(self, row: BaseSchedulerNode, column: BaseSchedulerNode) -> bool:
        """May the column reductions ``column`` run inside the row kernel ``row`` (Note [Column
        sums in a row kernel])? Static sizes; ``column``: float sums whose reads walk their
        outputs (columns) contiguously; ``row``: a row reduction kernel, no scatter or reordered
        producer. Each decision is logged (KILN_LOG=fusion)."""

        def say(why: str) -> bool:
            log.debug("column sums %s in row kernel %s: %s", column.name, row.name, why)
            return why == "fused"

        sizes = (*row.group(), *column.group())
        if not all(isinstance(s, int) for s in sizes):
            return say("not fused: symbolic sizes")
        for m in column.get_nodes():
            if not isinstance(m, SchedulerNode) or isinstance(m.node, (Scatter, ReorderedPointwise)):
                return say(f"not fused: {m.name} is not a plain reduction")
            data = m.node.data
            if getattr(data, "reduction_type", None) != "sum" or not m.node.get_dtype().is_floating_point:
                return say(f"not fused: {m.name} is not a floating-point sum")
            if self._orientation.setdefault(m.name, orientation(m)) != "column":
                return say(f"not fused: {m.name} does not walk its columns")
        rows = False
        for m in row.get_nodes():
            if not isinstance(m, SchedulerNode) or isinstance(m.node, (Scatter, ReorderedPointwise)):
                return say(f"not fused: {m.name} is a scatter or a reordered producer")
            if m.is_reduction() and self._orientation.setdefault(m.name, orientation(m)) == "column":
                return say(f"not fused: {m.name} is a column reduction")
            rows = rows or (m.is_reduction() and self._orientation[m.name] == "row")
        if not rows:
            return say("not fused: no row reduction")
        return say("fused")
