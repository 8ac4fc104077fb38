"""Graph breaks in bytecode: where a frame may be split, continuation functions, the split frame.

When the symbolic evaluator meets an instruction it cannot model (the *break instruction*), the
frame is split there (Note [Anatomy of a split frame]):

    runner(entry values)          # the graph so far, side effects replayed, returns the live state
    <the break instruction>       # run by CPython on the real stack, exactly as in the original
    return resume_in_f_at_42(stack..., live locals...)

The *continuation* `resume_in_<fn>_at_<offset>` is a copy of the original body behind a new
prologue that pushes the stack slots it receives as arguments and jumps to `offset`; the frame
hook sees it like any other function, so capture resumes there (and it may split again). A
conditional jump on a tensor gives two tails, one per branch. Continuations are cached per
(original code, offset, stack layout, live locals) and reused, and a break inside a continuation
maps back to the original code, so a chain of breaks never copies a copy.

`FrameFacts` holds the static facts the decision needs: loops, try and with-block extents (from
the exception table), and which locals a continuation must receive (`live_locals`).

Note [Anatomy of a split frame]: the replacement code keeps the frame's argument layout (the hook
requires it), runs the frame's COPY_FREE_VARS/MAKE_CELL prologue, calls the runner with the entry
values and keeps its tuple in a new local `___r`. It then pushes only the stack slots the break
instruction consumes (NULLs with PUSH_NULL), runs the instruction (with KW_NAMES / PRECALL in
front of a CALL), stores what it pushed into temporaries, and calls the continuation with: the
stack slots below the consumed ones (from `___r`), the pushed values (temporaries), then the live
locals (from `___r`; cell variables through their cell, since the instruction may be a
STORE_DEREF). Stack slots that hold NULL are never passed: the continuation's prologue pushes its
own. Inside `with torch.no_grad():` (or another grad-mode or autocast block) the break
instruction is covered by an exception handler that calls the blocks' exits (innermost first),
then re-raises, because the original handlers are not part of this code.

Note [What cannot be split]: a break inside a loop (the continuation would call itself once per
iteration, nesting frames without bound; the frame splits before the loop instead, Note
[Splitting before a loop] in convert_frame.py, and the code after the loop is captured as a
continuation of its own, Note [Compiling what follows a loop]), inside a try block (the handler would not see an
exception raised by the break instruction; the frame splits before the block instead, Note
[Tracing try blocks] in translator.py), inside a
with-block over a context manager other than grad mode and autocast (its __exit__ would not run
on an exception), and at an instruction whose stack effect `effect` does not know. Such a frame
runs as plain Python with the reason recorded; the functions it calls are still captured.

Note [A frame that reads its own locals]: a continuation receives only the locals live at the
break (plus its own `___r`, `___stack<i>`), and a loop piece returns only the locals live after
it; a dead local is gone from the frame that runs on. Eager code can still see it: `locals()`,
`vars()` and `dir()` without arguments, `eval`/`exec` without a mapping read the frame's own
locals by name (which liveness cannot see), so a split frame would show kiln's internals and
miss the user's locals (`locals()["u"]` a KeyError). A frame whose code names one of these
builtins (`reads_own_locals`) is never split, nor its loop cut into pieces or continued after
the loop: at a break it runs as plain Python, with the reason; the functions it calls are still
captured. (A callee reading its caller's frame through `sys._getframe(1).f_locals` is not seen.)
"""

from __future__ import annotations

import dis
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln_dynamo import bytecode
from kiln_dynamo.bytecode import NO_FALLTHROUGH, PY_VERSION, ExnEntry, Instr

_LOCAL_OPS = frozenset(dis.opname[o] for o in dis.haslocal)
_FREE_OPS = frozenset(dis.opname[o] for o in dis.hasfree)
_READS = frozenset(
    {
        "LOAD_FAST",
        "LOAD_FAST_CHECK",
        "LOAD_FAST_AND_CLEAR",
        "DELETE_FAST",
        "LOAD_DEREF",
        "LOAD_CLOSURE",
        "LOAD_CLASSDEREF",
        "LOAD_FROM_DICT_OR_DEREF",
        "DELETE_DEREF",
    }
)
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200
_ARG_FLAGS = 0x04 | 0x08


# --- static facts about a code object ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrameFacts:
    instrs: tuple[Instr, ...]
    loops: tuple[tuple[int, int], ...]  # (head, back edge) offsets
    try_extents: tuple[tuple[int, int], ...]  # [start, end) covered by a try/except/finally handler
    with_extents: tuple[tuple[int, int, int], ...]  # [start, end) of a with body, handler depth
    # the offsets of each loop's body, as `loops` (Note [A loop body is not a range])
    bodies: tuple[frozenset[int], ...]

    def in_loop(self, offset: int) -> bool:
        return any(offset in body for body in self.bodies)

    def loop_heads(self, offset: int) -> list[int]:
        """The heads of the loops whose body holds `offset`."""
        return [head for (head, _), body in zip(self.loops, self.bodies, strict=True) if offset in body]

    def in_try(self, offset: int) -> bool:
        return any(start <= offset < end for start, end in self.try_extents)

    def with_depths(self, offset: int) -> list[int]:
        """Stack depths of the with-block exits active at `offset`, outermost first."""
        return sorted(d for start, end, d in self.with_extents if start <= offset < end)

    def at(self, offset: int) -> int:
        for k, ins in enumerate(self.instrs):
            if ins.offset == offset:
                return k
        raise KeyError(offset)


_facts: weakref.WeakKeyDictionary[types.CodeType, FrameFacts] = weakref.WeakKeyDictionary()

# Builtins that read the calling frame's locals by name (Note [A frame that reads its own
# locals]); `vars` and `dir` only without an argument (`vars(config)` reads config).
_FRAME_READERS = frozenset({"locals", "vars", "dir", "eval", "exec"})
_WITH_ARGUMENT_ONLY = frozenset({"vars", "dir"})


def reads_own_locals(code: types.CodeType) -> str | None:
    """Why `code` may read its own locals by name (a builtin of `_FRAME_READERS` loaded as a
    global, `vars`/`dir` unless an argument follows), so that no split or loop rewrite of it is
    sound; None if it does not."""
    instrs = facts(code).instrs
    for k, ins in enumerate(instrs):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval in _FRAME_READERS:
            after = instrs[k + 1] if k + 1 < len(instrs) else None
            if (
                ins.argval in _WITH_ARGUMENT_ONLY
                and after is not None
                and (after.opname.startswith("LOAD_") or after.opname == "PUSH_NULL")
            ):
                continue  # the first argument is being pushed
            return (
                f"the frame calls {ins.argval}() (line {ins.lineno}), which reads its locals by name: "
                "a split would hide the locals a continuation does not take"
            )
    return None


def facts(code: types.CodeType) -> FrameFacts:
    hit = _facts.get(code)
    if hit is not None:
        return hit
    instrs = tuple(bytecode.disassemble(code))
    offsets = [ins.offset for ins in instrs]
    body_of: dict[int, frozenset[int]] = {}
    loops: list[tuple[int, int]] = []
    bodies: list[frozenset[int]] = []
    for k, ins in enumerate(instrs):
        if ins.target is None or ins.target.offset > ins.offset or not _closes_loop(instrs, k):
            continue
        head = ins.target.offset
        if head not in body_of:
            body_of[head] = frozenset(offsets[j] for j in loop_body(instrs, offsets.index(head)))
        if ins.offset in body_of[head]:  # else a jump back from a handler its target does not lead to
            loops.append((head, ins.offset))
            bodies.append(body_of[head])
    by_target: dict[int, list[tuple[int, int, int]]] = {}
    for e in bytecode.parse_exception_table(code):
        by_target.setdefault(e.target, []).append((e.start, e.end, e.depth))
    tries: list[tuple[int, int]] = []
    withs: list[tuple[int, int, int]] = []
    for target, ranges in by_target.items():
        k = next(i for i, off in enumerate(offsets) if off >= target)  # past an EXTENDED_ARG
        if instrs[k].opname != "PUSH_EXC_INFO":
            continue  # cleanup of a handler, or 3.12's comprehension restore: never reached normally
        extent = (min(r[0] for r in ranges), max(r[1] for r in ranges))
        if k + 1 < len(instrs) and instrs[k + 1].opname == "WITH_EXCEPT_START":
            withs.append((*extent, ranges[0][2]))
        else:
            tries.append(extent)
    result = FrameFacts(instrs, tuple(loops), tuple(tries), tuple(withs), tuple(bodies))
    _facts[code] = result
    return result


_WITH_EXIT_TAIL = frozenset({"POP_JUMP_IF_TRUE", "RERAISE", "POP_TOP", "POP_EXCEPT"})


def _closes_loop(instrs: tuple[Instr, ...], k: int) -> bool:
    """Whether the backward jump at `k` closes a loop. 3.12 places a with-block's exit handler
    (PUSH_EXC_INFO, WITH_EXCEPT_START, ...) after the code and jumps back from its end to the
    statement after the block: that jump is no loop when only an exception gets there (its
    target does not reach it again without one). Any other backward jump is a loop, as before."""
    j = k - 1
    while j > 0 and instrs[j].opname in _WITH_EXIT_TAIL:
        j -= 1
    if not (instrs[j].opname == "WITH_EXCEPT_START" and instrs[j - 1].opname == "PUSH_EXC_INFO"):
        return True
    target = instrs[k].target
    assert target is not None
    start = next(j for j, ins in enumerate(instrs) if ins is target)
    return _reaches(instrs, start, k, k, handlers=False)


def live_locals(code: types.CodeType, offset: int) -> set[str]:
    """Names that some path from `offset` may read before writing them: plain locals by a
    backward liveness analysis (STORE_FAST kills; exception handlers are successors), cell
    variables whenever any reachable instruction reads them (an inner function may read a cell
    at any time, so a write does not kill it)."""
    return set(_liveness(code)[facts(code).at(offset)])


_live_cache: weakref.WeakKeyDictionary[types.CodeType, list[frozenset[str]]] = weakref.WeakKeyDictionary()


def _liveness(code: types.CodeType) -> list[frozenset[str]]:
    hit = _live_cache.get(code)
    if hit is not None:
        return hit
    f = facts(code)
    n = len(f.instrs)
    index = {id(ins): k for k, ins in enumerate(f.instrs)}
    succs: list[list[int]] = []
    for k, ins in enumerate(f.instrs):
        out = []
        if ins.exn is not None:
            out.append(index[id(ins.exn.target)])
        if ins.target is not None:
            out.append(index[id(ins.target)])
        if ins.opname not in NO_FALLTHROUGH and k + 1 < n:
            out.append(k + 1)
        succs.append(out)
    cells = set(code.co_cellvars) | set(code.co_freevars)
    uses: list[set[str]] = []
    kills: list[set[str]] = []
    for ins in f.instrs:
        name = ins.argval if isinstance(ins.argval, str) else None
        use: set[str] = set()
        kill: set[str] = set()
        if name is not None and ins.opname in _READS:
            use.add(name)
        if name is not None and ins.opname in ("STORE_FAST", "STORE_FAST_MAYBE_NULL") and name not in cells:
            kill.add(name)
        uses.append(use)
        kills.append(kill)
    live: list[set[str]] = [set() for _ in range(n)]
    changed = True
    while changed:  # a fixed point; instructions visited last to first converge in few rounds
        changed = False
        for k in range(n - 1, -1, -1):
            after: set[str] = set()
            for j in succs[k]:
                after |= live[j]
            new = uses[k] | (after - kills[k])
            if new != live[k]:
                live[k] = new
                changed = True
    result = [frozenset(x) for x in live]
    _live_cache[code] = result
    return result


# --- the stack effect of a break instruction ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Effect:
    """How many stack slots the instruction consumes, and how many it leaves on each path
    (`branch` is None for a non-jump; `falls` is None when it never falls through)."""

    pops: int
    falls: int | None
    branch: int | None = None


def effect(ins: Instr) -> Effect | None:
    name, arg = ins.opname, ins.arg
    if name == "CALL":
        return Effect(arg + 2, 1)
    if name == "CALL_FUNCTION_EX":
        return Effect(3 + (arg & 1), 1)
    if name.startswith("POP_JUMP") and (name.endswith("_IF_TRUE") or name.endswith("_IF_FALSE")):
        return Effect(1, 0, 0)
    if name in ("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"):
        return Effect(1, 0, 1)
    if name == "LOAD_ATTR":
        return None if PY_VERSION == (3, 12) and arg & 1 else Effect(1, 1)
    if name == "FORMAT_VALUE":
        return Effect(1 + bool(arg & 0x04), 1)
    if name == "BUILD_STRING":
        return Effect(arg, 1)
    if name == "UNPACK_SEQUENCE":
        return Effect(1, arg)
    if name == "UNPACK_EX":
        return Effect(1, (arg & 0xFF) + (arg >> 8) + 1)
    if name == "RAISE_VARARGS":
        return Effect(arg, None) if arg else None
    return _FIXED.get(name)


_FIXED: dict[str, Effect] = {
    **{
        n: Effect(2, 1)
        for n in ("BINARY_OP", "BINARY_SUBSCR", "COMPARE_OP", "IS_OP", "CONTAINS_OP", "IMPORT_NAME")
    },
    **{
        n: Effect(1, 1)
        for n in (
            "UNARY_NEGATIVE",
            "UNARY_POSITIVE",
            "UNARY_INVERT",
            "UNARY_NOT",
            "GET_ITER",
            "CALL_INTRINSIC_1",
        )
    },
    "STORE_ATTR": Effect(2, 0),
    "STORE_SUBSCR": Effect(3, 0),
    "DELETE_SUBSCR": Effect(2, 0),
    "BINARY_SLICE": Effect(3, 1),
    "STORE_SLICE": Effect(4, 0),
    "BEFORE_WITH": Effect(1, 2),
    "IMPORT_FROM": Effect(1, 2),
    "STORE_DEREF": Effect(1, 0),
    "LOAD_ASSERTION_ERROR": Effect(0, 1),
}


def call_group(f: FrameFacts, k: int) -> list[Instr]:
    """The break instruction with what must run right before it: KW_NAMES and (3.11) PRECALL."""
    group = [f.instrs[k]]
    if f.instrs[k].opname == "CALL":
        j = k - 1
        if PY_VERSION == (3, 11) and j >= 0 and f.instrs[j].opname == "PRECALL":
            group.insert(0, f.instrs[j])
            j -= 1
        if j >= 0 and f.instrs[j].opname == "KW_NAMES":
            group.insert(0, f.instrs[j])
    return group


# --- continuation functions ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResumeInfo:
    original: types.CodeType
    entry: int  # offset in the original where the continuation starts
    to_original: dict[int, int]  # offset in the continuation -> offset in the original


_resume_info: weakref.WeakKeyDictionary[types.CodeType, ResumeInfo] = weakref.WeakKeyDictionary()
_resume_cache: weakref.WeakKeyDictionary[types.CodeType, dict[tuple[object, ...], types.CodeType]] = (
    weakref.WeakKeyDictionary()
)


def resume_info(code: types.CodeType) -> ResumeInfo | None:
    return _resume_info.get(code)


def is_resume_code(code: types.CodeType) -> bool:
    return code in _resume_info


def original_of(code: types.CodeType, offset: int) -> tuple[types.CodeType, int]:
    """Where `offset` of `code` comes from: itself, or the original behind a continuation."""
    info = _resume_info.get(code)
    if info is None:
        return code, offset
    return info.original, info.to_original[offset]


def _localsplus_index(
    varnames: list[str], cellvars: tuple[str, ...], freevars: tuple[str, ...], name: str
) -> int:
    if name in varnames:
        return varnames.index(name)
    cells = [c for c in cellvars if c not in varnames]
    if name in cells:
        return len(varnames) + cells.index(name)
    return len(varnames) + len(cells) + freevars.index(name)


# Note [Cell slots of rewritten code]: the instructions that take a cell (MAKE_CELL,
# LOAD_CLOSURE, LOAD_DEREF, STORE_DEREF, DELETE_DEREF, LOAD_CLASSDEREF) index the frame's
# "fast locals plus" array, whose layout CPython derives from co_varnames, co_cellvars and
# co_freevars (a cell variable that is also a local shares the local's slot). A continuation
# renumbers that array (its arguments first), and CPython does not check at run time that such
# an index reaches a cell: a LOAD_CLOSURE of a plain local puts a non-cell into a closure, and
# the generator expression or closure made from it crashes the process on its first
# LOAD_DEREF. So every code object built here is checked once, against CPython's own reading of
# its layout (`dis` resolves each index to a name): an index that reaches no cell or free
# variable is a ValueError, which capture turns into the frame running as plain Python (Note
# [Never a crash] in convert_frame.py), never a crash.
_CELL_OPS = frozenset(dis.hasfree)


def check_cell_slots(code: types.CodeType) -> types.CodeType:
    """`code`, after checking that every cell instruction of it reaches a cell or free variable
    (Note [Cell slots of rewritten code]); ValueError if one does not."""
    cells = set(code.co_cellvars)
    shared = cells | set(code.co_freevars)
    for ins in dis.get_instructions(code):
        if ins.opcode in _CELL_OPS and ins.argval not in (cells if ins.opname == "MAKE_CELL" else shared):
            raise ValueError(
                f"{ins.opname} at {ins.offset} of {code.co_name} reaches {ins.argval!r}, not a cell"
            )
    return code


def _copy(instrs: tuple[Instr, ...]) -> list[Instr]:
    new = {id(i): Instr(i.opname, i.arg, None, i.lineno, i.argval, None, i.offset) for i in instrs}
    entries: dict[int, ExnEntry] = {}
    for i in instrs:
        n = new[id(i)]
        if i.target is not None:
            n.target = new[id(i.target)]
        if i.exn is not None:
            e = entries.get(id(i.exn))
            if e is None:
                e = entries[id(i.exn)] = ExnEntry(new[id(i.exn.target)], i.exn.depth, i.exn.lasti)
            n.exn = e
    return [new[id(i)] for i in instrs]


def _remap(ins: Instr, varnames: list[str], code: types.CodeType) -> None:
    if ins.opname in _LOCAL_OPS and isinstance(ins.argval, str):
        ins.arg = varnames.index(ins.argval)
    elif ins.opname in _FREE_OPS and isinstance(ins.argval, str):
        ins.arg = _localsplus_index(varnames, code.co_cellvars, code.co_freevars, ins.argval)


def keeps_first_argument(original: types.CodeType) -> bool:
    """Note [Zero-argument super in a continuation]: `super()` without arguments reads the
    frame's first local (`self`) and the `__class__` cell. A continuation of such code keeps the
    original's first argument as its own first argument (always passed, live or not), so that
    `super()` in it still finds `self`."""
    return "__class__" in original.co_freevars and original.co_argcount > 0


def resume_code(
    original: types.CodeType,
    offset: int,
    stack: tuple[bool, ...],
    live: tuple[str, ...],
    inner: tuple[object, int] | None = None,
    pushes: int = 1,
) -> types.CodeType:
    """The continuation of `original` at `offset`. `stack[i]` says whether slot i holds a value
    (passed as argument `___stack<i>`) or NULL (pushed by the prologue); `live` are the locals
    (and cell variables) it receives after the stack values. With `inner` (a function and its
    argument count: Note [Resuming a chain of frames] in breaks.py) the prologue calls that
    function with the arguments `___inner<i>`, which come between the stack values and the
    locals, and pushes its result as the last stack slot, as the call at `offset - 1` would.
    `pushes`: how many stack slots the instruction at `offset - 1` leaves, when it is no call
    (Note [A break inside a try block of the innermost frame] in breaks.py): `inner` then never
    returns, and the prologue only keeps the stack's depth what the code at `offset` expects."""
    assert pushes == 1 or inner is not None
    key = (offset, stack, live, inner, pushes)
    per_code = _resume_cache.setdefault(original, {})
    hit = per_code.get(key)
    if hit is not None:
        return hit
    f = facts(original)
    body = _copy(f.instrs)
    n_inner = inner[1] if inner is not None else 0
    args = (
        [f"___stack{i}" for i, is_value in enumerate(stack) if is_value]
        + [f"___inner{i}" for i in range(n_inner)]
        + list(live)
    )
    if keeps_first_argument(original):
        assert live and live[0] == original.co_varnames[0], live
        args.insert(0, args.pop(len(args) - len(live)))  # Note [Zero-argument super in a continuation]
    varnames = args + [v for v in original.co_varnames if v not in args]
    for ins in body:
        _remap(ins, varnames, original)
    prologue: list[Instr] = []
    if original.co_freevars:
        prologue.append(Instr("COPY_FREE_VARS", len(original.co_freevars)))
    for name in original.co_cellvars:
        prologue.append(
            Instr("MAKE_CELL", _localsplus_index(varnames, original.co_cellvars, original.co_freevars, name))
        )
    prologue.append(Instr("RESUME", 0))
    for i, is_value in enumerate(stack):
        prologue.append(
            Instr("LOAD_FAST", varnames.index(f"___stack{i}")) if is_value else Instr("PUSH_NULL")
        )
    consts = original.co_consts
    if inner is not None:
        consts = (*consts, inner[0])
        prologue += [Instr("PUSH_NULL"), Instr("LOAD_CONST", len(consts) - 1)]
        prologue += [Instr("LOAD_FAST", varnames.index(f"___inner{i}")) for i in range(n_inner)]
        # Note [A chain through try and with blocks] (breaks.py): the call stands for the
        # original's instruction before `offset` (a call, or the innermost frame's break
        # instruction), so the handler around that instruction covers it too
        k_call = f.at(offset) - 1
        exn = body[k_call].exn if k_call >= 0 else None
        prologue += [Instr(c.opname, c.arg, exn=exn) for c in _call(n_inner)]
        if pushes == 0:  # dead code after a call that never returns: the depth at `offset`
            prologue.append(Instr("POP_TOP"))
        prologue += [Instr("COPY", 1) for _ in range(pushes - 1)]
    jump = Instr("JUMP_FORWARD", target=body[f.at(offset)])
    prologue.append(jump)
    instrs = prologue + body
    asm = bytecode.assemble(instrs, original.co_firstlineno)
    name = f"resume_in_{original.co_name}_at_{offset}"
    code = function_code(original, asm, instrs, len(args), varnames, name, consts)
    to_original = {asm.real[id(ins)]: ins.offset for ins in body}
    if inner is not None:
        # a break at the prologue's call (the inner continuation splits again) continues at
        # `offset` with the call's result on the stack: the jump stands for that point
        to_original[asm.real[id(jump)]] = offset
    _resume_info[code] = ResumeInfo(original, offset, to_original)
    per_code[key] = code
    return code


def handler_at_call(original: types.CodeType, offset: int) -> int | None:
    """The offset of the handler that covers the instruction right before `offset` in `original`
    (the call, or the innermost frame's break instruction, that a chain continuation's prologue
    stands for), or None."""
    f = facts(original)
    k = f.at(offset) - 1
    if k < 0:
        return None
    exn = f.instrs[k].exn
    return None if exn is None else exn.target.offset


def reraise(e: BaseException) -> None:
    """The innermost call of a chain's continuations on the path where the break instruction
    raised (Note [A chain through try and with blocks] in breaks.py): the exception leaves the
    innermost frame as it left the break instruction."""
    raise e


# --- the code that replaces a split frame ------------------------------------------------------

# One source for each kind of value a continuation call receives, in order (Note [Anatomy of a
# split frame]): ("r", i) item i of the runner's tuple, ("t", i) what the break instruction left
# in stack position i (0: deepest), ("c", name) the contents of a cell variable of the frame,
# ("x", 0) the exception the break instruction raised (Note [A chain through try and with blocks]).
ArgSource = tuple[str, object]


@dataclass(frozen=True, slots=True)
class Tail:
    resume: types.CodeType
    args: tuple[ArgSource, ...]
    pushed: int  # how many values the break instruction left on this path
    # the continuation as a function made at capture, for a frame inlined below the split one
    # (its own globals and closure), which the next outer continuation's prologue calls (Note
    # [Resuming a chain of frames] in breaks.py); None: made in the split code with the frame's
    # closure
    function: object | None = None


@dataclass(frozen=True, slots=True)
class SplitPlan:
    group: tuple[Instr, ...]  # the break instruction, with KW_NAMES / PRECALL before a CALL
    consumed: tuple[int | None, ...]  # per consumed stack slot: index in the runner's tuple, None for NULL
    cells: tuple[tuple[str, int], ...]  # cell variables to set from the runner's tuple first
    fall: Tail | None
    branch: Tail | None
    exits: tuple[object, ...]  # with-block exits to call, innermost first, if the break instruction raises
    lineno: int | None  # the user's line of the break instruction
    # Note [Resuming a chain of frames] (breaks.py): the code the break instruction comes from,
    # when it is an inlined frame's
    group_code: types.CodeType | None = None
    # Note [A chain through try and with blocks] (breaks.py): the continuation to call with the
    # exception if the break instruction raises, when a frame of the chain has a handler there
    on_raise: Tail | None = None


def _call(n: int) -> list[Instr]:
    if PY_VERSION == (3, 11):
        return [Instr("PRECALL", n), Instr("CALL", n)]
    return [Instr("CALL", n)]


def split_code(
    code: types.CodeType, runner: object, entry_names: list[str], plan: SplitPlan
) -> types.CodeType:
    """The code object that runs in place of the frame of `code` (Note [Anatomy of a split frame])."""
    pushed = max((t.pushed for t in (plan.fall, plan.branch) if t is not None), default=0)
    temps = ["___r"] + [f"___t{i}" for i in range(pushed)] + (["___e"] if plan.on_raise is not None else [])
    varnames = list(code.co_varnames) + temps
    names = list(code.co_names)
    consts: list[object] = list(code.co_consts)
    const_at: dict[tuple[type, object], int] = {}
    lineno = plan.lineno

    def const(value: object) -> int:
        key = (type(value), value if isinstance(value, (int, bool, str, type(None))) else id(value))
        if key not in const_at:
            const_at[key] = len(consts)
            consts.append(value)
        return const_at[key]

    def lp(name: str) -> int:
        return _localsplus_index(varnames, code.co_cellvars, code.co_freevars, name)

    def r_item(i: int) -> list[Instr]:
        return [
            Instr("LOAD_FAST", varnames.index("___r")),
            Instr("LOAD_CONST", const(i)),
            Instr("BINARY_SUBSCR"),
        ]

    out: list[Instr] = []
    if code.co_freevars:
        out.append(Instr("COPY_FREE_VARS", len(code.co_freevars)))
    for name in code.co_cellvars:
        out.append(Instr("MAKE_CELL", lp(name)))
    out.append(Instr("RESUME", 0))
    out += [Instr("PUSH_NULL"), Instr("LOAD_CONST", const(runner))]
    for name in entry_names:
        cell = name in code.co_freevars or name in code.co_cellvars
        out.append(Instr("LOAD_DEREF", lp(name)) if cell else Instr("LOAD_FAST", varnames.index(name)))
    out += _call(len(entry_names))
    out.append(Instr("STORE_FAST", varnames.index("___r")))
    for name, i in plan.cells:
        out += [*r_item(i), Instr("STORE_DEREF", lp(name))]
    for slot in plan.consumed:
        out += [Instr("PUSH_NULL")] if slot is None else r_item(slot)
    handler: list[Instr] = []
    if plan.exits:
        for exit_fn in plan.exits:
            handler += [Instr("PUSH_NULL"), Instr("LOAD_CONST", const(exit_fn)), *_call(0), Instr("POP_TOP")]
        handler.append(Instr("RERAISE", 0))
    if plan.on_raise is not None:
        assert not plan.exits  # a chain's with-blocks exit in their own continuations
        # the exception goes to the continuations as an argument, without PUSH_EXC_INFO: no
        # handler of the original frames is between the break instruction and theirs
        handler.append(Instr("STORE_FAST", varnames.index("___e")))
    entry = ExnEntry(handler[0], 0, False) if handler else None
    branch_label: Instr | None = None
    for ins in plan.group:
        new = Instr(ins.opname, ins.arg, None, ins.lineno, ins.argval, entry)
        if plan.group_code is not None:
            _remap_foreign(new, plan.group_code, names, const)
        else:
            _remap(new, varnames, code)
        if ins.target is not None:
            if PY_VERSION == (3, 11):
                new.opname = new.opname.replace("BACKWARD", "FORWARD")
            branch_label = new  # patched below, once the branch tail exists
        out.append(new)

    def tail(t: Tail) -> list[Instr]:
        seq: list[Instr] = []
        for i in reversed(range(t.pushed)):
            seq.append(Instr("STORE_FAST", varnames.index(f"___t{i}")))
        seq.append(Instr("PUSH_NULL"))
        assert t.function is None  # the split code calls its own frame's continuation
        if code.co_freevars:
            seq += [Instr("LOAD_CLOSURE", lp(n)) for n in code.co_freevars]
            seq += [Instr("BUILD_TUPLE", len(code.co_freevars)), Instr("LOAD_CONST", const(t.resume))]
            seq.append(Instr("MAKE_FUNCTION", 0x08))
        else:
            seq += [Instr("LOAD_CONST", const(t.resume)), Instr("MAKE_FUNCTION", 0)]
        for kind, x in t.args:
            if kind == "r":
                assert isinstance(x, int)
                seq += r_item(x)
            elif kind == "t":
                seq.append(Instr("LOAD_FAST", varnames.index(f"___t{x}")))
            elif kind == "x":
                seq.append(Instr("LOAD_FAST", varnames.index("___e")))
            else:
                seq.append(Instr("LOAD_DEREF", lp(str(x))))
        seq += _call(len(t.args))
        seq.append(Instr("RETURN_VALUE"))
        return seq

    if plan.fall is not None:
        out += tail(plan.fall)
    if plan.branch is not None:
        assert branch_label is not None
        seq = tail(plan.branch)
        branch_label.target = seq[0]
        out += seq
    if plan.on_raise is not None:
        handler += tail(plan.on_raise)
    out += handler
    for ins in out:
        if ins.lineno is None:
            ins.lineno = lineno
    asm = bytecode.assemble(out, code.co_firstlineno)
    split = code.replace(
        co_code=asm.code,
        co_linetable=asm.linetable,
        co_exceptiontable=asm.exceptiontable,
        co_consts=tuple(consts),
        co_names=tuple(names),
        co_nlocals=len(varnames),
        co_varnames=tuple(varnames),
        co_stacksize=bytecode.stack_depth(out) + 1,
        co_flags=code.co_flags & ~_GENERATOR_FLAGS,
    )
    return check_cell_slots(split)  # Note [Cell slots of rewritten code]


# Instructions whose meaning does not depend on the frame that runs them (no local, cell, global
# or import): the innermost frame's break instruction of a chain split runs in the outermost
# frame's split code, with its name and constant arguments moved there (Note [Resuming a chain
# of frames] in breaks.py).
FRAME_FREE = frozenset(
    {
        "POP_JUMP_IF_TRUE",
        "POP_JUMP_IF_FALSE",
        "POP_JUMP_FORWARD_IF_TRUE",
        "POP_JUMP_FORWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "JUMP_IF_TRUE_OR_POP",
        "JUMP_IF_FALSE_OR_POP",
        "CALL",
        "CALL_FUNCTION_EX",
        "BINARY_OP",
        "BINARY_SUBSCR",
        "COMPARE_OP",
        "IS_OP",
        "CONTAINS_OP",
        "UNARY_NEGATIVE",
        "UNARY_POSITIVE",
        "UNARY_INVERT",
        "UNARY_NOT",
        "STORE_ATTR",
        "LOAD_ATTR",
        "STORE_SUBSCR",
        "DELETE_SUBSCR",
        "BINARY_SLICE",
        "STORE_SLICE",
        "FORMAT_VALUE",
        "BUILD_STRING",
        "UNPACK_SEQUENCE",
        "UNPACK_EX",
    }
)
_NAME_OPS = frozenset({"LOAD_ATTR", "STORE_ATTR"})


def _remap_foreign(
    ins: Instr, source: types.CodeType, names: list[str], const: Callable[[object], int]
) -> None:
    """An instruction of `source` (FRAME_FREE, or KW_NAMES / PRECALL before a CALL), its name
    or constant argument re-indexed into the code being built (read from `source` by index:
    3.11's dis does not resolve KW_NAMES' constant)."""
    assert ins.arg is not None or ins.opname not in ("KW_NAMES", *_NAME_OPS)
    if ins.opname == "KW_NAMES":
        assert ins.arg is not None
        ins.arg = const(source.co_consts[ins.arg])
    elif ins.opname in _NAME_OPS:
        assert ins.arg is not None
        name = source.co_names[
            ins.arg >> 1 if ins.opname == "LOAD_ATTR" and PY_VERSION >= (3, 12) else ins.arg
        ]
        if name not in names:
            names.append(name)
        index = names.index(name)
        ins.arg = (
            (index << 1) | (ins.arg & 1) if ins.opname == "LOAD_ATTR" and PY_VERSION >= (3, 12) else index
        )
    else:
        assert ins.opname in FRAME_FREE or ins.opname == "PRECALL", ins.opname


# --- compiling what follows a loop that holds a break -------------------------------------------

# Note [Compiling what follows a loop]
# A break inside a loop cannot split the frame there (Note [What cannot be split]), so the loop
# runs as plain Python (the functions it calls, each decoder layer's `forward`, are captured on
# their own). Before, everything after the loop ran as Python too: the final norm, the head, the
# loss. `after_loop_code` rewrites the frame's code so that reaching the loop's exit calls a
# continuation at the exit (`resume_in_<fn>_at_<exit>`, with the live locals) and returns what it
# returns; the frame hook sees that continuation like any function, so the code after the loop
# gets its own graph (and may split again). The loop itself is left byte for byte as it was.
# Sound only where the exit is an ordinary point of the frame: the stack is empty there, no
# exception handler covers it (a try or with around the loop would see the continuation's
# exceptions with stale locals), the frame has no cell variables (a closure made before the exit
# would not see the continuation's writes), and every live local is bound on every path to it
# (a continuation takes them as arguments); any other path into the code after the exit (a
# `break` past a for-else block, a handler) runs the original instructions, unchanged. Where one
# of these does not hold the frame runs as plain Python, as before, with the reason.


def _depths(instrs: list[Instr]) -> dict[int, int]:
    """Stack depth at each reachable instruction (index -> depth), as `bytecode.stack_depth`."""
    index = {id(ins): k for k, ins in enumerate(instrs)}
    depth_at: dict[int, int] = {0: 0}
    work = [0]
    while work:
        k = work.pop()
        ins, d = instrs[k], depth_at[k]
        arg = ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None
        nexts: list[tuple[int, int]] = []
        if ins.exn is not None:
            nexts.append((index[id(ins.exn.target)], ins.exn.depth + 1 + int(ins.exn.lasti)))
        if ins.target is not None:
            nexts.append((index[id(ins.target)], d + dis.stack_effect(ins.opcode, arg, jump=True)))
        if ins.opname not in NO_FALLTHROUGH:
            nexts.append((k + 1, d + dis.stack_effect(ins.opcode, arg, jump=False)))
        for j, nd in nexts:
            if j < len(instrs) and j not in depth_at:
                depth_at[j] = nd
                work.append(j)
    return depth_at


def _reaches(
    instrs: Sequence[Instr],
    start: int,
    lo: int,
    hi: int,
    *,
    handlers: bool = True,
    among: frozenset[int] = frozenset(),
) -> bool:
    """Whether some path from instruction `start` (jumps, fall-through, and exception handlers
    unless `handlers` is False) reaches one of instructions lo..hi: then `start` is not past the
    loop that spans them (3.12 places a loop's cold blocks, such as the path of a `break`, after
    its back edge)."""
    index = {id(ins): k for k, ins in enumerate(instrs)}
    seen = {start}
    work = [start]
    while work:
        k = work.pop()
        if lo <= k <= hi or k in among:
            return True
        ins = instrs[k]
        exn = ins.exn.target if ins.exn and handlers else None
        nexts = [index[id(t)] for t in (ins.target, exn) if t is not None]
        if ins.opname not in NO_FALLTHROUGH:
            nexts.append(k + 1)
        for j in nexts:
            if j < len(instrs) and j not in seen:
                seen.add(j)
                work.append(j)
    return False


def _bound(code: types.CodeType, instrs: list[Instr]) -> dict[int, frozenset[str]]:
    """Locals certainly bound before each reachable instruction (a forward must-analysis:
    arguments at entry, STORE_FAST binds, DELETE_FAST and LOAD_FAST_AND_CLEAR unbind)."""
    nargs = (
        code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    )
    index = {id(ins): k for k, ins in enumerate(instrs)}
    state: dict[int, frozenset[str]] = {0: frozenset(code.co_varnames[:nargs])}
    work = [0]
    while work:
        k = work.pop()
        ins, before = instrs[k], state[k]
        after = before
        if ins.opname == "STORE_FAST" and isinstance(ins.argval, str):
            after = before | {ins.argval}
        elif ins.opname in ("DELETE_FAST", "LOAD_FAST_AND_CLEAR") and isinstance(ins.argval, str):
            after = before - {ins.argval}
        nexts: list[tuple[int, frozenset[str]]] = []
        if ins.exn is not None:
            nexts.append((index[id(ins.exn.target)], before))
        if ins.target is not None:
            nexts.append((index[id(ins.target)], after))
        if ins.opname not in NO_FALLTHROUGH:
            nexts.append((k + 1, after))
        for j, s in nexts:
            if j >= len(instrs):
                continue
            old = state.get(j)
            new = s if old is None else old & s
            if new != old:
                state[j] = new
                work.append(j)
    return state


@dataclass(frozen=True, slots=True)
class Insertion:
    """New instructions placed right before `anchor` in a rewritten frame; every jump that
    targeted `anchor` goes to the first of them instead."""

    anchor: Instr
    seq: tuple[Instr, ...]


def rewrite(
    code: types.CodeType, instrs: list[Instr], consts: list[object], edits: Sequence[Insertion]
) -> types.CodeType:
    """`code` with `edits` applied to `instrs` (a `_copy` of its instructions) and `consts`."""
    for edit in edits:
        for ins in instrs:
            if ins.target is edit.anchor:
                ins.target = edit.seq[0]
        k = next(i for i, ins in enumerate(instrs) if ins is edit.anchor)
        instrs[k:k] = edit.seq
    asm = bytecode.assemble(instrs, code.co_firstlineno)
    return code.replace(
        co_code=asm.code,
        co_linetable=asm.linetable,
        co_exceptiontable=asm.exceptiontable,
        co_consts=tuple(consts),
        co_stacksize=max(code.co_stacksize, bytecode.stack_depth(instrs) + 1),
    )


def make_function(
    code: types.CodeType, consts: list[object], fn: types.CodeType, lineno: int | None
) -> list[Instr]:
    """PUSH_NULL, then a new function of `fn` that shares the frame's closure (its free
    variables), ready for its arguments and a call."""
    consts.append(fn)
    seq: list[Instr] = [Instr("PUSH_NULL", lineno=lineno)]
    if code.co_freevars:
        varnames = list(code.co_varnames)
        seq += [
            Instr("LOAD_CLOSURE", _localsplus_index(varnames, code.co_cellvars, code.co_freevars, n))
            for n in code.co_freevars
        ]
        seq += [Instr("BUILD_TUPLE", len(code.co_freevars)), Instr("LOAD_CONST", len(consts) - 1)]
        seq.append(Instr("MAKE_FUNCTION", 0x08))
    else:
        seq += [Instr("LOAD_CONST", len(consts) - 1), Instr("MAKE_FUNCTION", 0)]
    return seq


@dataclass(frozen=True, slots=True)
class LoopShape:
    """The outermost loop that begins at a loop entry, as indices into the frame's instructions."""

    head: int  # the loop's first instruction (FOR_ITER for a `for` loop)
    back: int  # its last back edge
    exit: int  # where the loop goes when it ends (past 3.12's END_FOR)
    body: frozenset[int]  # the instructions of one iteration (Note [A loop body is not a range])


def loop_shape(instrs: Sequence[Instr], code: types.CodeType, loop_entry: int) -> LoopShape | str:
    offsets = [ins.offset for ins in instrs]
    loops = [(h, b) for h, b in facts(code).loops if loop_entry <= h <= b]
    if not loops:
        return "no loop at its entry"
    head = min(h for h, _ in loops)  # the outermost loop that begins there; its last back edge
    back = max(b for h, b in loops if h == head)  # (an if/else body has one per branch)
    k_head, k_back = offsets.index(head), offsets.index(back)
    first = instrs[k_head]
    body = loop_body(instrs, k_head)
    if first.opname == "FOR_ITER" and first.target is not None:
        k_exit = next(i for i, ins in enumerate(instrs) if ins is first.target)  # the exhausted iterator
    else:
        # where the body's own jumps and fall-throughs leave it, when that is one place (3.12's
        # last back edge may be a cold block's: Note [A loop body is not a range])
        index = {id(ins): k for k, ins in enumerate(instrs)}
        exits = {
            j
            for k in body
            for j in (
                index[id(instrs[k].target)] if instrs[k].target is not None else None,
                None if instrs[k].opname in NO_FALLTHROUGH else k + 1,
            )
            if j is not None and j not in body
        }
        k_exit = exits.pop() if len(exits) == 1 else k_back + 1
    if PY_VERSION >= (3, 12) and k_exit < len(instrs) and instrs[k_exit].opname == "END_FOR":
        k_exit += 1
    return LoopShape(k_head, k_back, k_exit, body)


# Note [A loop body is not a range]: the instructions between a loop's head and its last back
# edge are not always its body. CPython 3.12 moves cold blocks (exception handlers, the path of
# a `break`) after the function's hot code: an `except` clause at the end of a `for` body ends
# with a JUMP_BACKWARD to the loop's FOR_ITER from past the code that follows the loop, so the
# range [head, last back edge] holds the code after the loop too, where values of that code's
# own expressions sit on the stack at the loop's depth (`"-".join(...)`: the string, where the
# body has the iterator). Loop pieces (Note [Loop body pieces] in loop_pieces.py) cut from such
# a range took the string's slot for the iterator's: the piece began after the string was
# pushed, popped below its own stack and read the frame's last fast local (under 3.12 the
# closure cell of a frame with free variables: "'cell' object has no attribute 'join'", or a
# NULL, a crash). `loop_body` is the loop as a set: the instructions reachable from the head
# that reach one of its back edges (jumps to the head, through handlers too) without passing
# the head again; pieces are cut from those only. The frame's facts read loops the same way
# (`FrameFacts.in_loop`): the code after such a loop is not inside it, so a break there splits
# the frame and the loop's exit may be continued (Note [Compiling what follows a loop]), as
# under 3.11; a jump back from a handler that its target does not lead to (3.12: the end of an
# `except` clause, back to the statement after its `try`) closes no loop. 3.11 keeps handlers
# in line, where the two readings agree. (Closures had nothing to do with it: an earlier gate made no pieces for
# frames with free variables under 3.12 (Note [Pieces of closures under 3.12], now removed):
# that hid the symptom in the fuzzer, whose functions all close over a cell, and kept the crash.) A jump
# back to the head from a cold block is a back edge like any other: a piece may end at any of
# them with a `continue` inside it.


def loop_body(instrs: Sequence[Instr], head: int) -> frozenset[int]:
    """The indices of the instructions of the loop whose first instruction is `head`: those
    that only `head` leads to (every path from the code's entry passes it) and that reach a
    jump back to it without passing it again (Note [A loop body is not a range])."""
    index = {id(ins): k for k, ins in enumerate(instrs)}
    preds: list[list[int]] = [[] for _ in instrs]
    succs: list[list[int]] = []
    for k, ins in enumerate(instrs):
        nexts = [index[id(t)] for t in (ins.target, ins.exn.target if ins.exn else None) if t is not None]
        if ins.opname not in NO_FALLTHROUGH and k + 1 < len(instrs):
            nexts.append(k + 1)
        succs.append(nexts)
        for j in nexts:
            preds[j].append(k)
    # reachable from the entry without passing the head: not dominated by it, so not in the loop
    outside = set() if head == 0 else {0}
    work = list(outside)
    while work:
        for j in succs[work.pop()]:
            if j != head and j not in outside:
                outside.add(j)
                work.append(j)
    inside = {head}  # reachable from the head (dead code is in no loop)
    work = [head]
    while work:
        for j in succs[work.pop()]:
            if j not in inside:
                inside.add(j)
                work.append(j)
    outside |= set(range(len(instrs))) - inside
    body = {head}
    work = [k for k in preds[head] if k not in outside]  # the back edges' sources
    body.update(work)
    while work:
        for j in preds[work.pop()]:
            if j not in body and j not in outside:
                body.add(j)
                work.append(j)
    return frozenset(body)


def after_loop_edit(
    code: types.CodeType, instrs: list[Instr], consts: list[object], shape: LoopShape
) -> tuple[Insertion, types.CodeType] | str:
    """The insertion at the loop's exit that calls the continuation there and returns its
    result (Note [Compiling what follows a loop]), with that continuation; or why that is not
    sound here."""
    if code.co_cellvars:
        return "the frame has cell variables"
    k_exit = shape.exit
    if k_exit >= len(instrs):
        return "the loop ends the code"
    if k_exit in shape.body or _reaches(instrs, k_exit, 0, -1, among=shape.body):
        return "the instruction after the loop leads back into it"
    return continue_at(code, instrs, consts, k_exit, "the loop's exit")


def continue_at(
    code: types.CodeType, instrs: list[Instr], consts: list[object], k: int, where: str
) -> tuple[Insertion, types.CodeType] | str:
    """The insertion before instruction `k` (reached at most once per call: the caller checks)
    that calls the continuation of the code at `k` with the live locals and returns its result,
    with that continuation; or why that is not sound here (`where` names `k` in the reason)."""
    if code.co_cellvars:
        return "the frame has cell variables"
    at = instrs[k]
    if at.exn is not None:
        return f"a try or with block covers {where}"
    if _depths(instrs).get(k) != 0:
        return f"values are on the stack at {where}"
    original, offset = original_of(code, at.offset)
    live = live_locals(original, offset)
    bound = _bound(code, instrs).get(k, frozenset())
    if original.co_cellvars and live & set(original.co_cellvars):
        return f"a cell variable is live after {where}"
    live -= set(original.co_freevars)  # the continuation shares the frame's closure
    unbound = sorted(live - bound)
    if unbound:
        return f"{', '.join(unbound)} may be unbound at {where}"
    names = sorted(live)
    if keeps_first_argument(original):  # Note [Zero-argument super in a continuation]
        self_name = original.co_varnames[0]
        if self_name not in bound:
            return f"super() needs {self_name!r}, which may be unbound at {where}"
        names = [self_name] + [n for n in names if n != self_name]
    after = resume_code(original, offset, (), tuple(names))
    tail = make_function(code, consts, after, at.lineno)
    tail += [Instr("LOAD_FAST", code.co_varnames.index(n)) for n in names]
    tail += _call(len(names))
    tail.append(Instr("RETURN_VALUE"))
    for ins in tail:
        ins.lineno = at.lineno
    return Insertion(at, tuple(tail)), after


def after_loop_code(code: types.CodeType, loop_entry: int) -> tuple[types.CodeType, types.CodeType] | str:
    """`code` rewritten so that the exit of the loop that begins at `loop_entry` (an offset of
    `code`: the loop's GET_ITER or first instruction) calls the continuation at the exit and
    returns its result (Note [Compiling what follows a loop]); returns (new code, continuation),
    or why that is not sound here."""
    instrs = _copy(facts(code).instrs)
    consts = list(code.co_consts)
    shape = loop_shape(instrs, code, loop_entry)
    if isinstance(shape, str):
        return shape
    edit = after_loop_edit(code, instrs, consts, shape)
    if isinstance(edit, str):
        return edit
    return rewrite(code, instrs, consts, [edit[0]]), edit[1]


def function_code(
    original: types.CodeType,
    asm: bytecode.Assembled,
    instrs: list[Instr],
    n_args: int,
    varnames: list[str],
    name: str,
    consts: tuple[object, ...] | None = None,
) -> types.CodeType:
    """``original`` turned into a plain function of ``n_args`` positional arguments running the
    assembled ``instrs`` (a continuation, a loop piece): no generator or *args/**kwargs flags, its
    own name, nested under the original's qualified name."""
    made = original.replace(
        co_code=asm.code,
        co_linetable=asm.linetable,
        co_exceptiontable=asm.exceptiontable,
        co_argcount=n_args,
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_nlocals=len(varnames),
        co_varnames=tuple(varnames),
        co_stacksize=bytecode.stack_depth(instrs) + 1,
        co_flags=original.co_flags & ~(_GENERATOR_FLAGS | _ARG_FLAGS),
        co_name=name,
        co_qualname=f"{original.co_qualname}.<{name}>",
        co_consts=original.co_consts if consts is None else consts,
    )
    return check_cell_slots(made)  # Note [Cell slots of rewritten code]
