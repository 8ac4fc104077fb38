"""The body of a loop that holds a graph break, cut into pieces the frame hook captures.

A break inside a loop cannot split the frame there (Note [What cannot be split] in resume.py): the
loop runs as plain Python. Its callees were already captured on their own, and the code after the
loop too (Note [Compiling what follows a loop]); this module compiles the loop body's own
statements as well (Note [Loop body pieces]).

Note [Loop body pieces]: the loop body (after the loop target is stored; its instructions as a
set, not the range up to the last back edge: Note [A loop body is not a range] in resume.py) is
cut, at statement boundaries (stack at the loop's own depth), into the longest ranges of
instructions that behave like a straight function body: control enters only at the range's
first instruction and leaves only by falling off its end (or, for a range that ends at a `for`
loop's back edge, by a `continue`); no return, yield, exception handler or with block inside.
Each such range becomes
a *piece*, a function `piece_of_<fn>_at_<start>_to_<end>` whose code is a copy of the range
behind a prologue and before an epilogue that returns the locals the frame reads afterwards. The
frame's code calls the piece in place of the range, stores what it returns and jumps to the
range's end:

    for layer in self.layers:                       # FOR_ITER, run by CPython
        h, hidden = piece_of_forward_at_40_to_96(h, hidden, layer)   # the body, a function
                                                    # JUMP_BACKWARD, run by CPython

The frame hook sees each piece as it sees any function: it is captured (one graph per iteration,
reused by every iteration whose guards pass), and a break inside it splits the piece as any frame
is split, since the piece itself holds no loop (a loop inside the piece is handled recursively).
So the break that made the frame run as Python is itself inside a piece, most of the time, and
the statements before and after it get graphs of their own. The piece receives the locals it may
read before writing them (and those it returns, so an unwritten path returns the old value),
all bound at the range's start on every path; it returns the locals it writes that are live at
the range's end. A local unbound at the start (other than the target of a 3.12 inlined
comprehension) refuses the range. The frame has no cell variables (as for the code after the
loop: a closure made in the frame would not see a piece's writes); the frame's free variables
are shared through the piece's closure, so its writes to them are the frame's. An exception a
piece raises leaves the frame as it would (no handler covers a piece); only the locals the
piece wrote before raising are not seen by the frame's traceback. `KILN_LOOP_PIECES=0`
(`convert_frame.set_loop_pieces(False)`) turns this off; explain's "not split" line names the
pieces, `counters.loop_pieces` counts them. The loop's targets (`i` in `for i, layer in
enumerate(...)`) take a new value every call: where a piece receives one that is an int, it is a
symbolic int from the piece's first capture under `dynamic=None` (for a backend that takes
symbolic sizes), rather than a constant recompiled once (Note [Int inputs] in shapes.py).

Note [A piece with nothing before its break]: a piece is called once per iteration with the
loop's carried values (`hidden_states`, a tuple of them that grows per layer), and every capture
guards what it read. When the first piece of a decoder loop splits right at the layer call (the
break is inside the layer), nothing before the break is worth a graph, and guarding it would
only recompile the piece once per layer (the tuple's length changes). Such a piece is not split:
its code is rewritten, unguarded, to run as Python up to the end of the break's statement and
return the result of a continuation there (as the code after a loop is, Note [Compiling what
follows a loop]), which the hook captures; where that is not sound it runs as plain Python.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln_dynamo import bytecode, resume, shapes
from kiln_dynamo.bytecode import NO_FALLTHROUGH, Instr
from kiln_dynamo.resume import (
    _GENERATOR_FLAGS,
    _READS,
    Insertion,
    LoopShape,
    _bound,
    _call,
    _depths,
    _remap,
    make_function,
)

# Instructions a piece may not hold: they leave the function or need a frame of their own kind.
_FORBIDDEN = frozenset(
    {
        "RETURN_VALUE",
        "RETURN_CONST",
        "YIELD_VALUE",
        "SEND",
        "RETURN_GENERATOR",
        "GET_AWAITABLE",
        "BEFORE_WITH",
        "BEFORE_ASYNC_WITH",
        "SETUP_ANNOTATIONS",
        "IMPORT_STAR",
        "LOAD_LOCALS",
        "MAKE_CELL",
        "DELETE_DEREF",
    }
)
# A piece worth a function: it calls something or computes (tensor work is done by these).
_WORK = frozenset(
    {
        "CALL",
        "CALL_FUNCTION_EX",
        "BINARY_OP",
        "BINARY_SUBSCR",
        "STORE_SUBSCR",
        "COMPARE_OP",
        "UNARY_NEGATIVE",
        "UNARY_INVERT",
    }
)
# How many stack slots an instruction reaches, for those that read below what they pop: a
# comprehension's LIST_APPEND reaches the list below the loop's iterator.
_REACH: dict[str, Callable[[int], int]] = {
    "LIST_APPEND": lambda a: a + 1,
    "SET_ADD": lambda a: a + 1,
    "MAP_ADD": lambda a: a + 2,
    "COPY": lambda a: a,
    "SWAP": lambda a: a,
}
_MAX_CHECKS = 20_000  # ranges tried per loop body: a huge body is cut less finely, not slowly
_NO_REACH: Callable[[int], int] = lambda a: 0  # noqa: E731
_STORES = frozenset({"STORE_FAST", "DELETE_FAST", "STORE_FAST_MAYBE_NULL"})

_pieces: weakref.WeakSet[types.CodeType] = weakref.WeakSet()


def is_loop_piece(code: types.CodeType) -> bool:
    return code in _pieces


@dataclass(frozen=True, slots=True)
class Pieces:
    edits: tuple[Insertion, ...]
    codes: tuple[types.CodeType, ...]


@dataclass(frozen=True, slots=True)
class LoopCode:
    """A frame whose loop (holding a break) runs as Python, rewritten: `code` is None when
    nothing could be done; `after` the continuation at the loop's exit or why there is none;
    `pieces` the loop body's pieces or why there are none (None: switched off)."""

    code: types.CodeType | None
    after: types.CodeType | str | None
    pieces: Pieces | str | None


def loop_code(code: types.CodeType, loop_entry: int, *, after: bool, pieces: bool) -> LoopCode | str:
    """`code` with the exit of the loop at `loop_entry` continuing in a continuation (Note
    [Compiling what follows a loop] in resume.py) and its body calling pieces (Note [Loop body
    pieces]), each where it is sound and switched on."""
    instrs = resume._copy(resume.facts(code).instrs)
    consts = list(code.co_consts)
    shape = resume.loop_shape(instrs, code, loop_entry)
    if isinstance(shape, str):
        return shape
    edits: list[Insertion] = []
    tail: types.CodeType | str | None = None
    if after:
        edit = resume.after_loop_edit(code, instrs, consts, shape)
        if isinstance(edit, str):
            tail = edit
        else:
            edits.append(edit[0])
            tail = edit[1]
    cut: Pieces | str | None = None
    if pieces:
        cut = piece_edits(code, instrs, consts, shape)
        if isinstance(cut, Pieces):
            edits += cut.edits
    new = resume.rewrite(code, instrs, consts, edits) if edits else None
    return LoopCode(new, tail, cut)


def continue_after(code: types.CodeType, break_offset: int) -> tuple[types.CodeType, types.CodeType] | str:
    """A loop piece whose capture found nothing to compile before its break (Note [A piece with
    nothing before its break]) rewritten to run as Python up to the end of the break's
    statement and return the result of a continuation there; or why not."""
    f = resume.facts(code)
    instrs = resume._copy(f.instrs)
    k_break = f.at(break_offset)
    if f.in_loop(break_offset):
        return "the break is inside a loop of the piece"
    depth = _depths(instrs)
    k = next((j for j in range(k_break + 1, len(instrs)) if depth.get(j) == 0), None)
    if k is None or f.in_loop(instrs[k].offset):
        return "no statement follows the break"
    if not any(ins.opname in _WORK for ins in instrs[k:]):
        return "nothing follows the break"
    consts = list(code.co_consts)
    edit = resume.continue_at(code, instrs, consts, k, "the end of the break's statement")
    if isinstance(edit, str):
        return edit
    return resume.rewrite(code, instrs, consts, [edit[0]]), edit[1]


def piece_edits(
    code: types.CodeType, instrs: list[Instr], consts: list[object], shape: LoopShape
) -> Pieces | str:
    """The loop body of `shape` cut into pieces (Note [Loop body pieces]): the insertions that
    call them from the frame, and their codes; or why no piece could be made."""
    if code.co_cellvars:
        return "the frame has cell variables"
    if code.co_flags & _GENERATOR_FLAGS:
        return "the frame is a generator"
    depth = _depths(instrs)
    base = depth.get(shape.head)
    if base is None:
        return "the loop is not reachable"
    start = shape.head
    if instrs[shape.head].opname == "FOR_ITER":
        start = next((k for k in range(shape.head + 1, shape.back + 1) if depth.get(k) == base), shape.back)
    bounds = [k for k in range(start, shape.back + 1) if depth.get(k) == base]
    index = {id(ins): k for k, ins in enumerate(instrs)}
    lo, hi = start, shape.back
    edges = [
        (k, t)
        for k, ins in enumerate(instrs)
        if ins.target is not None
        for t in (index[id(ins.target)],)
        if lo <= k <= hi or lo <= t <= hi
    ]
    handlers = {index[id(ins.exn.target)] for ins in instrs if ins.exn is not None}
    # the back edges a range may end at while a `continue` inside it jumps to the head
    continues_at = {
        k
        for k in shape.body
        if instrs[k].opname == "JUMP_BACKWARD" and instrs[k].target is instrs[shape.head]
    }
    # bad[k]: instruction k can be in no piece; work_before[k]: work instructions before k
    bad = [False] * (hi + 2)
    work_before = [0] * (hi + 2)
    for k in range(lo, hi + 1):
        ins = instrs[k]
        d = depth.get(k)
        bad[k] = (
            ins.exn is not None
            or ins.opname in _FORBIDDEN
            or (d is not None and d < base)
            or (d is not None and d - base < _REACH.get(ins.opname, _NO_REACH)(ins.arg))
            or k in handlers
            or k not in shape.body  # Note [A loop body is not a range] in resume.py
        )  # (a reach below the piece's own stack: a comprehension's list)
        work_before[k + 1] = work_before[k] + (ins.opname in _WORK)
    next_bad = [hi + 1] * (hi + 2)
    for k in range(hi, lo - 1, -1):
        next_bad[k] = k if bad[k] else next_bad[k + 1]

    def valid(s: int, e: int) -> bool:
        if next_bad[s] < e or work_before[e] == work_before[s]:
            return False
        for k, t in edges:
            if s <= k < e:
                if t == shape.head:
                    if e not in continues_at:
                        return False
                elif not s <= t <= e:
                    return False
            elif s < t < e:
                return False
        return True

    ranges: list[tuple[int, int]] = []
    i = 0
    budget = [_MAX_CHECKS]

    def valid_within_budget(s: int, e: int) -> bool:
        budget[0] -= 1
        return budget[0] > 0 and valid(s, e)

    while i < len(bounds) - 1:
        s_i = bounds[i]
        j = next(
            (
                j
                for j in range(len(bounds) - 1, i, -1)
                if bounds[j] <= next_bad[s_i] and valid(s_i, bounds[j])
            ),
            None,
        )
        if j is None:
            i += 1
            continue
        ranges.append((s_i, bounds[j]))
        i = j
    if not ranges:
        return "no part of the loop body can be a function (a return, break or handler in each)"
    live = _liveness(instrs, frozenset(code.co_freevars))
    bound = _bound(code, instrs)
    # the loop's targets (`i` of `for i, layer in enumerate(...)`): new values every iteration
    targets = frozenset(
        f"L[{ins.argval!r}]" for ins in instrs[shape.head + 1 : start] if ins.opname == "STORE_FAST"
    )
    edits: list[Insertion] = []
    codes: list[types.CodeType] = []
    refused: list[str] = []
    for s, e in ranges:
        made = _piece(code, instrs, consts, shape, s, e, live, bound)
        if isinstance(made, str):
            refused.append(made)
            continue
        edits.append(made[0])
        codes.append(made[1])
        shapes.frame_state(made[1]).dynamic_ints = targets
    if not codes:
        return "; ".join(refused)
    return Pieces(tuple(edits), tuple(codes))


def _piece(
    code: types.CodeType,
    instrs: list[Instr],
    consts: list[object],
    shape: LoopShape,
    s: int,
    e: int,
    live: list[frozenset[str]],
    bound: dict[int, frozenset[str]],
) -> tuple[Insertion, types.CodeType] | str:
    frees = frozenset(code.co_freevars)
    written = {ins.argval for ins in instrs[s:e] if ins.opname in _STORES and isinstance(ins.argval, str)}
    outs = sorted(written & live[e])
    at_start = bound.get(s, frozenset())
    # read before written on some path through the piece: must be passed in, so bound at the start
    needed = _exposed(instrs, s, e, shape.head, frozenset(), frees, clears=False)
    exposed = _exposed(instrs, s, e, shape.head, frozenset(), frees, clears=True)
    unbound = sorted(needed - at_start)
    if unbound:
        return f"{', '.join(unbound)} may be unbound where the piece at line {instrs[s].lineno} starts"
    ins_names = sorted((exposed | (set(outs) & at_start)) & at_start)
    if "__class__" in frees and code.co_argcount > 0:  # Note [Zero-argument super in a continuation]
        self_name = code.co_varnames[0]
        if self_name not in at_start:
            return f"super() needs {self_name!r}, which may be unbound in the loop"
        ins_names = [self_name] + [n for n in ins_names if n != self_name]
    piece = _piece_code(code, instrs, shape, s, e, ins_names, outs)
    piece_instrs = bytecode.disassemble(piece)
    end_bound = _bound(piece, piece_instrs).get(len(piece_instrs) - len(outs) - 2, frozenset())
    missing = sorted(set(outs) - end_bound)
    if missing:
        return f"{', '.join(missing)} may be unbound where the piece at line {instrs[s].lineno} ends"
    lineno = instrs[s].lineno
    seq = make_function(code, consts, piece, lineno)
    seq += [Instr("LOAD_FAST", code.co_varnames.index(n)) for n in ins_names]
    seq += _call(len(ins_names))
    if outs:
        seq.append(Instr("UNPACK_SEQUENCE", len(outs)))
        seq += [Instr("STORE_FAST", code.co_varnames.index(n)) for n in outs]
    else:
        seq.append(Instr("POP_TOP"))
    seq.append(Instr("JUMP_FORWARD", target=instrs[e]))
    for ins in seq:
        ins.lineno = lineno
    _pieces.add(piece)
    return Insertion(instrs[s], tuple(seq)), piece


def _piece_code(
    code: types.CodeType,
    instrs: list[Instr],
    shape: LoopShape,
    s: int,
    e: int,
    args: Sequence[str],
    outs: Sequence[str],
) -> types.CodeType:
    """A function whose body is instructions s..e-1 of `code`, returning the tuple of `outs`."""
    varnames = list(args) + [v for v in code.co_varnames if v not in args]
    epilogue = [Instr("LOAD_FAST", varnames.index(n)) for n in outs]
    epilogue += [Instr("BUILD_TUPLE", len(outs)), Instr("RETURN_VALUE")]
    body = [Instr(i.opname, i.arg, None, i.lineno, i.argval, None, i.offset) for i in instrs[s:e]]
    for old, new in zip(instrs[s:e], body, strict=True):
        _remap(new, varnames, code)
        if old.target is None:
            continue
        t = next(k for k, ins in enumerate(instrs) if ins is old.target)
        if s <= t < e:
            new.target = body[t - s]
        else:  # the range's end, or the loop head (a `continue`): both go on past the piece
            new.target = epilogue[0]
            if "BACKWARD" in new.opname:
                new.opname = new.opname.replace("BACKWARD", "FORWARD")
    for ins in epilogue:
        ins.lineno = instrs[e - 1].lineno
    prologue: list[Instr] = []
    if code.co_freevars:
        prologue.append(Instr("COPY_FREE_VARS", len(code.co_freevars)))
    prologue.append(Instr("RESUME", 0))
    out = prologue + body + epilogue
    asm = bytecode.assemble(out, code.co_firstlineno)
    start, end = instrs[s].offset, instrs[e].offset
    name = f"piece_of_{code.co_name}_at_{start}_to_{end}"
    return resume.function_code(code, asm, out, len(args), varnames, name)


def _successors(instrs: Sequence[Instr], k: int, index: dict[int, int]) -> list[int]:
    ins = instrs[k]
    out = []
    if ins.exn is not None:
        out.append(index[id(ins.exn.target)])
    if ins.target is not None:
        out.append(index[id(ins.target)])
    if ins.opname not in NO_FALLTHROUGH and k + 1 < len(instrs):
        out.append(k + 1)
    return out


def _liveness(instrs: Sequence[Instr], frees: frozenset[str]) -> list[frozenset[str]]:
    """Locals some path from each instruction may read before writing (free variables left out:
    a piece shares them through its closure)."""
    index = {id(ins): k for k, ins in enumerate(instrs)}
    n = len(instrs)
    succs = [_successors(instrs, k, index) for k in range(n)]
    uses = [_use(ins, frees, clears=True) for ins in instrs]
    kills = [_kill(ins) for ins in instrs]
    live: list[frozenset[str]] = [frozenset() for _ in range(n + 1)]
    changed = True
    while changed:
        changed = False
        for k in range(n - 1, -1, -1):
            after: set[str] = set()
            for j in succs[k]:
                after |= live[j]
            new = frozenset(uses[k] | (after - kills[k]))
            if new != live[k]:
                live[k] = new
                changed = True
    return live


def _exposed(
    instrs: Sequence[Instr],
    s: int,
    e: int,
    head: int,
    outs: frozenset[str],
    frees: frozenset[str],
    *,
    clears: bool,
) -> set[str]:
    """Locals the range s..e-1 may read before writing them, with `outs` read at its exit.
    Without `clears`, 3.12's LOAD_FAST_AND_CLEAR (an inlined comprehension saving its variable,
    which may be unbound) is not a read."""
    index = {id(ins): k for k, ins in enumerate(instrs)}
    live: dict[int, set[str]] = {k: set() for k in range(s, e)}
    changed = True
    while changed:
        changed = False
        for k in range(e - 1, s - 1, -1):
            after: set[str] = set()
            for j in _successors(instrs, k, index):
                after |= live[j] if s <= j < e else set(outs) if j in (e, head) else set()
            new = _use(instrs[k], frees, clears=clears) | (after - _kill(instrs[k]))
            if new != live[k]:
                live[k] = new
                changed = True
    return live[s]


def _use(ins: Instr, frees: frozenset[str], *, clears: bool) -> set[str]:
    name = ins.argval
    if not isinstance(name, str) or ins.opname not in _READS or name in frees:
        return set()
    if ins.opname == "LOAD_FAST_AND_CLEAR" and not clears:
        return set()
    if ins.opname in ("LOAD_CLOSURE", "LOAD_CLASSDEREF"):
        return set()
    return {name}


def _kill(ins: Instr) -> set[str]:
    if ins.opname in ("STORE_FAST", "STORE_FAST_MAYBE_NULL") and isinstance(ins.argval, str):
        return {ins.argval}
    return set()
