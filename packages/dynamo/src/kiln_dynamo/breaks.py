"""Deciding a graph break: where the frame splits, and what crosses the split.

Capture traces a frame once; if an `Unsupported` escapes, the frame's own instruction that was
running (`Unsupported.break_offset`: the call that was being inlined, when the cause lies deeper)
is the break instruction. The frame is traced a second time, from scratch, and stops just before
that instruction (Note [Trace twice]); `prepare_split` then reads the evaluator's stack and
locals and turns them into the runner's tuple (`values`) and a `SplitPlan` for resume.py. When
the frame cannot be split safely (Note [What cannot be split] in resume.py), `CannotSplit` says
why and the frame runs as plain Python. A break deep in inlined calls splits the whole chain of
frames instead, where it can (`prepare_chain`, Note [Resuming a chain of frames]).

Note [Breaks deep in a call chain]: a break at depth d of inlined calls (frame f0 calls f1 ...
calls fd, which holds the unsupported instruction) splits the whole chain at once where it can
(Note [Resuming a chain of frames]): one split, one graph before it, one after it. Where a frame
of the chain cannot take part, the chain ends at the frame above it, whose call into that frame
is the break instruction; that frame then runs for real, the hook captures it and it splits on
its own (one more split for each such cut). With no chain at all (KILN_CHAIN_SPLITS=0, or the
first frame below f0 cannot take part) f0 splits at its call to f1, CPython runs f1, the hook
captures and splits it at its call to f2, and so on down: d + 1 splits, as torch.compile with its
default `nested_graph_breaks=False`. Measured (`breaks.py --models --only=segformer,wav2vec2
--no-torch`, graphs/breaks/frames in Python, before -> after chain splits): wav2vec2 train 4/5/3
-> 3/3/3 (torch.compile 4/3; `hidden_states.requires_grad = True` several frames below
`forward` makes a new leaf that requires grad, which no graph can), segformer eval and train
2/5/6 -> 2/4/5 on the first call only (torch.compile 2/1; transformers installs output-capturing
hooks under a lock). In both the chain is cut at transformers' `capture_outputs` wrapper, whose
call into the model sits in a try/finally, and for segformer at the `with lock:` block.

Note [Resuming a chain of frames]: the first pass records, as `Unsupported` leaves each frame's
evaluator, the instruction that frame was running (`Unsupported.chain`); `chain_path` keeps the
frames reached through calls whose result is exactly the inlined frame's return value
(`InstructionTranslator.direct`, set by `passes_result`: plain and nested functions, methods,
modules without hooks; not a hooked module, whose hooks see the result, nor a call made by a
builtin such as `map`). The second pass stops in the innermost frame at that path
(`OutputGraph.break_path`), and `prepare_chain` builds one split of f0:

    runner(entry values)                  # the graph: f0 .. fd up to the break
    <fd's break instruction>              # run in f0's split code
    return resume_in_f0(f0's stack..., <f1's arguments>..., f0's live locals)

where each continuation of an outer frame is the usual one (resume.py) with one more step in its
prologue (`resume_code(..., inner=)`): it calls the continuation of the frame it had called,
with that frame's arguments, and pushes the result as the value its call returns, then jumps in:

    resume_in_f0:  push f0's stack; push resume_in_f1(f1's stack..., <f2's arguments>..., f1's
                   locals); jump after f0's call
    ...
    resume_in_fd:  the ordinary continuation after the break instruction, taking what it pushed

so the hook sees one frame after the break and captures the whole rest of the chain as one graph
(the inner continuations inline), as torch.compile's nested graph breaks do; if something in them
breaks again, that continuation splits as a chain in turn (a break at a prologue's call maps back
to the original frame at the call's return point). Continuations of inlined frames are functions
made at capture with that frame's globals and, for a closure, the cells of the function object
the trace inlined (the trace already depends on that object: it read its cells). The break
instruction runs in f0's code, so it must not depend on the frame it comes from
(`resume.FRAME_FREE`: calls, operators, attribute and item stores, a jump on a tensor, which gives
two chains of continuations, one per path); its name and constant arguments are moved into f0's
code. A frame takes part only when no loop surrounds its instruction; its instruction (an outer
frame's call, or the innermost one's break instruction) may sit in a try block or in a
with-block whose exit kiln rebuilds (Note [A chain through try and with blocks], Note [A break
inside a try block of the innermost frame]); and, for inlined frames, when it is not a generator, its
closure is a real function's, and it does not read its own locals by name (cell variables are
fine: Note [Cells of a chain's frames]). Otherwise `ChainCut` ends the chain above that frame (a third pass traces up to
the shorter path); a chain of one frame is the ordinary split. Exceptions leave as in eager:
raised by the break instruction or by a continuation, they propagate out with no handler of the
chain's frames skipped (Note [A chain through try and with blocks]); tracebacks show the
continuations' frames instead of the originals. Measured on the generated matrix (`test_graph_breaks.py`): a break
three calls down was 8 graphs / 4 splits, now 2 / 1, the same as at top level.

Note [A chain through try and with blocks]: transformers calls every model through a wrapper
whose call sits in a try/finally (`capture_outputs`), so a break in the model must split a chain
through that frame. An outer frame fi (i < d) whose call into fi+1 sits in a try block, or in a
with-block over a context manager whose exit the runner rebuilds (grad mode, autocast:
`WithExitVariable`), takes part; each point where eager would enter fi's handler then enters the
same handler in fi's continuation:
- the continuation is a copy of fi's code, exception table included, and its prologue's call of
  fi+1's continuation stands for fi's call, so it carries that call's handler (`resume_code`):
  an exception a continuation raises unwinds into fi's handler, with fi's locals (the locals the
  handler reads are passed too: `handler_at_call`), and a with-block's exit on the stack below;
- the break instruction runs in f0's split code, where none of those handlers is: there it is
  covered by a handler that calls a second set of continuations (`SplitPlan.on_raise`), the same
  frames at the same points, whose innermost call is `reraise(e)` instead of fd's continuation
  (or fd's raising continuation, when a handler of fd covers the break instruction: Note [A break
  inside a try block of the innermost frame]). The exception leaves fd and reaches fd-1's
  handler, and so on out, as in eager; a handler that catches it returns a value, which
  the frame above continues with. The split code does not PUSH_EXC_INFO: no handler runs between
  the break instruction and the frames' own.
A finally body or `__exit__` so runs exactly once, in eager's order, on every path (tested against
eager in test_chain_splits.py, on 3.11 and 3.12). What stays as before: an exception raised at run
time by an operator of the graph before the break (Note [Tracing try blocks] in translator.py).
The first pass of a frame whose own call sits in a try block moves its break before the block
(`before`); a chain split is still tried first, and that split is the fallback. Measured
(`breaks.py --models --only=segformer,wav2vec2 --no-torch`): wav2vec2 train 3/3/3 -> 3/2/2;
segformer is unchanged (2/4/5: its breaks register forward hooks under transformers' lock; since
capture10 the handle's weakref is modelled, and the break is its counter store on torch's
`RemovableHandle`, then the hook closure stored into the module).

Note [A break inside a try block of the innermost frame]: the innermost frame fd's break
instruction runs in f0's split code, outside fd's handlers; fd may still take part when a try
block (or a with-block whose exit kiln rebuilds) covers that instruction. Its continuation on the
normal path is a copy of fd's code with its exception table (as for any frame of the chain), so
what runs after the break instruction is covered as in eager. On the raising path (`on_raise`),
fd gets a continuation too, at the same point, whose prologue pushes the stack below the consumed
slots and calls `reraise(e)` covered by the break instruction's own handler (`resume_code(...,
pushes=)`: the call stands for the break instruction, whatever it is, and never returns, so the
prologue only keeps the stack's depth what the code expects); the handler sees fd's locals (the
ones it reads are passed: `handler_at_call`) and the stack below as in eager, and a handler that
catches returns or falls through into fd's code, whose result the frame above continues with.
The handler's depth must not reach into the consumed slots (a try starts at a statement, so it
never does in compiled code; refused otherwise). A continuation's own prologue call of `reraise`
is never the innermost break instruction of a new chain: its split would build again the very
continuations being captured (they are cached by their shape), a recursion; that frame is cut
and splits on its own as before. Before capture18c the innermost frame in a try block cut the
chain: transformers' `capture_outputs` wrapper (the chain is cut below it at the encoder's layer
loop) and the `merge_with_config_defaults` wrapper above it each cut it, and the latter split
before its try block with nothing to compile before it, leaving its continuation to Python.
Measured (`breaks.py --models --no-torch --only detr,m2m100`, graphs/breaks/frames in Python,
before -> after): detr train 5/5/4 -> 5/4/2, m2m100 train 9/8/4 -> 9/6/2.

Note [Cells of a chain's frames]: a continuation makes its cells afresh (resume.py's prologue:
MAKE_CELL wraps the value it receives as an argument), so after the split each frame of a chain
runs with new cell objects holding the values the trace had at the break. The captured frame f0
gets its cells' values through its split code's own cells (`SplitPlan.cells`: the break
instruction may read or write them); an inlined frame's cells are modelled only (`CellVariable`),
so their values go to its continuation as plain arguments from the runner's tuple. A new cell is
what eager's code after the break sees exactly when nothing made before the break still holds the
old one. A comprehension (3.11) made before the break ran in the trace, and a generator expression
ran to completion where it was made (Note [Generators traced step by step] in translator.py):
neither holds a cell after the break. A closure made before the break that lives on (a live local, a stack
slot, stored somewhere) has to be rebuilt by the runner, and the runner refuses a closure over a
cell of a frame still running after the compiled code (Note [Functions made in the frame that
leave it] in functions.py): that chain fails, the frame above splits at its call instead, and the
frame that made the closure runs as plain Python, with the reason. So a closure never misses a
write made after the break. Before capture18b a frame of the chain with any cell variable cut the
chain: transformers' `capture_outputs` wrapper (cells for its dict comprehensions) and
Longformer's encoder (generator expressions) split once per frame. Measured (`breaks.py --models
--no-torch --only=...`, graphs/breaks/frames in Python, before -> after): wav2vec2 and hubert
train 3/2/1 -> 2/1/0, longformer eval and train 4/2/0 -> 2/1/0, m2m100 train 9/13/4 -> 9/8/4.

Note [Trace twice]: the first pass has already put into the graph whatever the failing inlined
call did before it failed, and has recorded its side effects and guards. Undoing that piecemeal is
where bugs hide; a fresh pass that stops before the break instruction gives a graph, side effects
and guards that describe exactly the code before the break. Tracing is deterministic given the
same entry values, so the second pass reaches the same instruction with the same stack.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from kiln_dynamo import resume
from kiln_dynamo.exc import Unsupported
from kiln_dynamo.translator import BreakHere, InstructionTranslator
from kiln_dynamo.variables.base import NULL, VariableTracker
from kiln_dynamo.variables.functions import UserFunctionVariable
from kiln_dynamo.variables.torch import WithExitVariable

VT = VariableTracker


class CannotSplit(Exception):
    """The frame cannot be split at its break instruction; the message says why, for users.
    `loop_entry` is where the outermost loop around the break begins, when that is the reason."""

    def __init__(self, msg: str, loop_entry: int | None = None) -> None:
        super().__init__(msg)
        self.loop_entry = loop_entry


def _interner() -> tuple[list[VT], Callable[[VT], int]]:
    """The runner's values, each stack/local value once (by identity), and the function that gives
    a value's index in them, adding it the first time."""
    values: list[VT] = []
    index_of: dict[int, int] = {}

    def index(vt: VT) -> int:
        if id(vt) not in index_of:
            index_of[id(vt)] = len(values)
            values.append(vt)
        return index_of[id(vt)]

    return values, index


def loop_entry(f: resume.FrameFacts, offset: int) -> int:
    """Where the outermost loop around `offset` begins: its GET_ITER for a for loop (the iterator
    cannot cross a split, the iterable can), else the loop's first instruction."""
    head = min(f.loop_heads(offset))
    k = f.at(head)
    return f.instrs[k - 1].offset if k > 0 and f.instrs[k - 1].opname == "GET_ITER" else head


def prepare_split(b: BreakHere, code: types.CodeType, before: bool) -> tuple[list[VT], resume.SplitPlan]:
    """What the runner returns and how the split code uses it, for a break at `b.inst` of `code`.

    `before`: the instruction must not run in the split code (a try block starts there); the
    continuation starts at it instead of after it."""
    tx = b.tx
    offset = b.inst.offset
    f = resume.facts(code)
    k = f.at(offset)
    ins = f.instrs[k]
    if (
        not before
        and ins.opname == "GET_ITER"
        and k + 1 < len(f.instrs)
        and f.in_loop(f.instrs[k + 1].offset)
    ):
        # The loop's own GET_ITER (over an iterable kiln cannot look into): splitting here would
        # hand the loop to a continuation that breaks at once; split before the loop instead.
        raise CannotSplit(
            "the break is at the start of a loop, and kiln does not split a frame inside a loop",
            loop_entry(f, f.instrs[k + 1].offset),
        )
    # a split before the loop at its first instruction (a while loop's body: its entry test came
    # before) leaves the whole loop to the continuation, as a for loop's GET_ITER does
    starts_loop = before and all(head == offset for head in f.loop_heads(offset))
    if f.in_loop(offset) and not starts_loop:
        raise CannotSplit(
            "the break is inside a loop, and kiln does not split a frame inside a loop", loop_entry(f, offset)
        )
    if not before and f.in_try(offset):
        raise CannotSplit("the break is inside a try block, whose handler must see what it raises")
    stack = list(tx.stack)
    depths = f.with_depths(offset)
    for d in depths:
        slot = stack[d - 1] if 0 < d <= len(stack) else None
        if not isinstance(slot, WithExitVariable):
            what = slot.describe() if slot is not None else "an unknown context manager"
            raise CannotSplit(f"the break is inside a with-block ({what})")
    if before:
        effect: resume.Effect | None = resume.Effect(0, 0)
        group: tuple[resume.Instr, ...] = ()
    else:
        effect = resume.effect(ins)
        group = tuple(resume.call_group(f, k))
    if effect is None:
        raise CannotSplit(f"kiln cannot split a frame at a {ins.opname} instruction")
    if effect.pops > len(stack):
        raise CannotSplit(f"the stack at {ins.opname} is shallower than it consumes")

    values, index = _interner()

    slots = [None if vt is NULL else index(vt) for vt in stack]
    below = slots[: len(stack) - effect.pops]
    consumed = tuple(slots[len(stack) - effect.pops :])
    cells: dict[str, int] = {}

    def tail(target: int, pushed: int) -> resume.Tail:
        original, at = resume.original_of(code, target)
        live = resume.live_locals(original, at)
        args: list[resume.ArgSource] = [("r", i) for i in below if i is not None]
        args += [("t", j) for j in range(pushed)]
        names: list[str] = []
        order = sorted(live)
        if resume.keeps_first_argument(original):  # Note [Zero-argument super in a continuation]
            first = original.co_varnames[0]
            order = [first] + [n for n in order if n != first]
            if first in code.co_cellvars:
                cell = tx.cells.get(first)
                bound = cell is not None and cell.contents is not None
            else:
                bound = first in tx.locals and tx.locals[first] is not NULL
            if not bound:
                raise CannotSplit(f"super() needs {first!r}, which is not bound at the break")
        for name in order:
            if name in code.co_cellvars:
                cell = tx.cells.get(name)
                if cell is None or cell.contents is None:
                    continue
                cells[name] = index(cell.contents)
                args.append(("c", name))
            elif name in code.co_freevars:
                continue  # the continuation shares the frame's closure
            elif name in tx.locals and tx.locals[name] is not NULL:
                args.append(("r", index(tx.locals[name])))
            else:
                continue  # unbound here: unbound in the continuation too
            names.append(name)
        stack_kinds = tuple(i is not None for i in below) + (True,) * pushed
        if resume.keeps_first_argument(original):  # the first argument goes first in the call too
            n_stack = len(args) - len(names)
            args.insert(0, args.pop(n_stack))
        return resume.Tail(resume.resume_code(original, at, stack_kinds, tuple(names)), tuple(args), pushed)

    fall = branch = None
    if effect.falls is not None:
        fall = tail(offset if before else f.instrs[k + 1].offset, effect.falls)
    if effect.branch is not None:
        assert ins.target is not None
        branch = tail(ins.target.offset, effect.branch)
    exits: list[object] = []
    if not before:
        for d in reversed(depths):
            exit_slot = stack[d - 1]
            assert isinstance(exit_slot, WithExitVariable)
            exits.append(exit_slot.real_exit())
    plan = resume.SplitPlan(group, consumed, tuple(cells.items()), fall, branch, tuple(exits), ins.lineno)
    return values, plan


# --- splitting a chain of frames at once (Note [Resuming a chain of frames]) ----------------------


class ChainCut(Exception):
    """Frame `level` of a chain (0: the captured frame) cannot take part in a chain split; the
    message says why. The chain then ends at the frame above it (`level - 1`), whose call into
    this frame becomes the break instruction."""

    def __init__(self, level: int, msg: str) -> None:
        super().__init__(msg)
        self.level = level


def chain_path(e: Unsupported) -> tuple[int, ...] | None:
    """The offsets, per inlining depth, of the instructions that were running in each frame when
    `e` escaped, down to the deepest frame reached through calls that return what the inlined
    frame returns (`InstructionTranslator.direct`); None when that is the captured frame alone."""
    levels = list(reversed(e.chain))
    if [depth for depth, _, _ in levels] != list(range(len(levels))):
        return None  # not one unbroken chain of evaluators (an exception re-raised elsewhere)
    path = [levels[0][1]] if levels else []
    for _, offset, direct in levels[1:]:
        if not direct:
            break
        path.append(offset)
    return tuple(path) if len(path) > 1 else None


def _chain_obstacle(tx: InstructionTranslator, level: int, innermost: bool) -> str | None:
    """Why frame `level` of a chain cannot be resumed by a continuation of its own, or None."""
    code = tx.code
    assert tx.current is not None
    offset = tx.current.offset
    f = resume.facts(code)
    if level > 0:
        if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):
            return "it is a generator"
        if code.co_freevars and type(tx.function) is not UserFunctionVariable:
            return "its closure was made inside the compiled frames"
        own = resume.reads_own_locals(code)
        if own is not None:
            return own
    if f.in_loop(offset):
        return "the call is inside a loop"
    # Note [A chain through try and with blocks], Note [A break inside a try block of the
    # innermost frame]
    for d in f.with_depths(offset):
        slot = tx.stack[d - 1] if 0 < d <= len(tx.stack) else None
        if not isinstance(slot, WithExitVariable):
            what = slot.describe() if slot is not None else "an unknown context manager"
            return f"the call is inside a with-block ({what}) whose exit kiln cannot rebuild"
    if innermost:
        ins = f.instrs[f.at(offset)]
        eff = resume.effect(ins)
        if ins.opname not in resume.FRAME_FREE or eff is None or eff.falls is None:
            return f"its break instruction {ins.opname} cannot run in another frame's code"
        if ins.exn is not None and ins.exn.depth > len(tx.stack) - eff.pops:
            return "the handler around its break instruction expects the values it consumes"
        if ins.exn is not None and _calls_reraise(tx, ins):
            # Note [A break inside a try block of the innermost frame]: the raising path's own
            # re-raise; its split would build the very continuations being captured
            return "its break instruction re-raises the exception of a split's raising path"
        reader = _frame_reader(tx, ins)
        if reader is not None:
            return f"its break instruction calls {reader}, which reads its caller's frame"
    return None


# Note [A break that reads its caller's frame]: a chain's innermost break instruction runs in the
# outermost frame's split code, so what it calls sees that frame as its caller. A log call at an
# enabled level (the record's funcName, file and line), `warnings.warn` (its stacklevel),
# `sys._getframe`, and a Python function whose own code names a frame reader (`_getframe`,
# `currentframe`, `stack`, `f_back`, `findCaller`, or passes a `stacklevel`) would see the outer
# frame where eager's sees the inner one: before breadth14, `log.warning(...)` in an inlined
# helper recorded the outer function's name. Such a break stops the chain at the innermost
# frame, which then runs as a real call and is split on its own (as with KILN_CHAIN_SPLITS=0).
# Any other Python function called as the break instruction keeps the chain (the common case: a
# call kiln could not inline, whose frame the hook then compiles); only its own code is looked
# at, so a frame reader two calls below it still sees the outer frame (a known limit).
_FRAME_READERS = frozenset(
    f for f in (getattr(sys, "_getframe", None), getattr(sys, "_getframemodulename", None)) if f
)
_FRAME_READING_NAMES = frozenset({"_getframe", "currentframe", "stack", "f_back", "findCaller", "stacklevel"})


def _reads_frames(code: types.CodeType) -> bool:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, tuple):  # KW_NAMES: `stacklevel=` in a call
            names.update(x for x in c if isinstance(x, str))
    return not names.isdisjoint(_FRAME_READING_NAMES)


def _python_code(fn: VariableTracker) -> types.CodeType | None:
    from kiln_dynamo.variables.functions import BoundMethodVariable, NestedFunctionVariable

    if isinstance(fn, BoundMethodVariable):
        fn = fn.fn
    if isinstance(fn, UserFunctionVariable):
        return getattr(fn.fn, "__code__", None)
    if isinstance(fn, NestedFunctionVariable):
        return fn.code
    return None


def _callee(tx: InstructionTranslator, ins: Any) -> VariableTracker | None:
    """What the call at `ins` (the instruction `tx` is at) calls, or None for another instruction."""
    if ins.opname in ("PRECALL", "CALL"):
        n = ins.arg or 0
        if len(tx.stack) < n + 2:
            return None
        below, above = tx.stack[-n - 2], tx.stack[-n - 1]
        return above if below is NULL else below
    if ins.opname == "CALL_FUNCTION_EX":
        k = 3 if (ins.arg or 0) & 1 else 2
        return tx.stack[-k] if len(tx.stack) >= k else None
    return None


def _calls_reraise(tx: InstructionTranslator, ins: Any) -> bool:
    fn = _callee(tx, ins)
    return isinstance(fn, UserFunctionVariable) and fn.fn is resume.reraise


def _frame_reader(tx: InstructionTranslator, ins: Any) -> str | None:
    """What the call at `ins` calls, when that may read its caller's frame, else None."""
    from kiln_dynamo.variables.base import MethodVariable
    from kiln_dynamo.variables.diagnostics import LoggerVariable, WarnVariable
    from kiln_dynamo.variables.opaque import OpaqueCallableVariable

    fn = _callee(tx, ins)
    if fn is None:
        return None
    if isinstance(fn, WarnVariable):
        return "warnings.warn"
    if isinstance(fn, MethodVariable) and isinstance(fn.obj, LoggerVariable):
        return f"{fn.obj.describe()}.{fn.name}"
    if isinstance(fn, OpaqueCallableVariable):
        return fn.label if fn.fn in _FRAME_READERS else None
    code = _python_code(fn)
    if code is not None and _reads_frames(code):
        return f"the Python function {fn.describe()}"
    return None


def prepare_chain(b: BreakHere) -> tuple[list[VT], resume.SplitPlan]:
    """The runner's values and the split plan for a break in an inlined frame that splits every
    frame of the chain at once (Note [Resuming a chain of frames]). Raises ChainCut when a frame
    of the chain cannot take part."""
    txs: list[InstructionTranslator] = []
    t: InstructionTranslator | None = b.tx
    while t is not None:
        txs.append(t)
        t = t.parent
    txs.reverse()  # outermost first
    d = len(txs) - 1
    for level, t in enumerate(txs):
        why = _chain_obstacle(t, level, level == d)
        if why is not None:
            raise ChainCut(level, f"frame {t.code.co_name} of the chain: {why}")

    values, index = _interner()

    cells: dict[str, int] = {}

    def tail(
        level: int,
        below: list[int | None],
        pushed: int,
        target: int | None = None,
        inner: resume.Tail | None = None,
        pushes: int = 1,
    ) -> resume.Tail:
        """The continuation of frame `level` after its instruction (at `target` on a jump's
        other path); with `inner`, one whose prologue calls that inner frame's continuation
        and takes its arguments too, so `pushed` is the innermost break instruction's; `pushes`
        is what the instruction the prologue's call stands for leaves on the stack (the
        innermost frame's break instruction, on the raising path, where `inner` is `reraise`)."""
        t = txs[level]
        assert t.current is not None
        f = resume.facts(t.code)
        k = f.at(t.current.offset)
        original, at = resume.original_of(t.code, f.instrs[k + 1].offset if target is None else target)
        live = resume.live_locals(original, at)
        handler = resume.handler_at_call(original, at) if inner is not None else None
        if handler is not None:  # what the handler around the call reads, when it runs
            live |= resume.live_locals(original, handler)
        args: list[resume.ArgSource] = [("r", i) for i in below if i is not None]
        args += list(inner.args) if inner is not None else [("t", j) for j in range(pushed)]
        names: list[str] = []
        order = sorted(live)
        keep_first = resume.keeps_first_argument(original)
        if keep_first:  # Note [Zero-argument super in a continuation]
            first = original.co_varnames[0]
            order = [first] + [n for n in order if n != first]
            bound = (
                first in t.cells and t.cells[first].contents is not None
                if first in t.code.co_cellvars
                else first in t.locals and t.locals[first] is not NULL
            )
            if not bound:
                raise ChainCut(level, f"super() needs {first!r}, which is not bound at the break")
        for name in order:
            if name in t.code.co_cellvars:  # Note [Cells of a chain's frames]
                cell = t.cells.get(name)
                if cell is None or cell.contents is None:
                    continue  # unbound here: an empty cell in the continuation too
                if level == 0:  # through f0's own cell, which the break instruction may use
                    cells[name] = index(cell.contents)
                    args.append(("c", name))
                else:  # a modelled cell: its value, which the continuation puts in a new cell
                    args.append(("r", index(cell.contents)))
            elif name in t.code.co_freevars:
                continue  # the continuation shares the frame's closure
            elif name in t.locals and t.locals[name] is not NULL:
                args.append(("r", index(t.locals[name])))
            else:
                continue
            names.append(name)
        stack_kinds = tuple(i is not None for i in below) + ((True,) * pushed if inner is None else ())
        if keep_first:
            n_stack = len(args) - len(names)
            args.insert(0, args.pop(n_stack))
        call = None if inner is None else (inner.function, len(inner.args))
        code = resume.resume_code(original, at, stack_kinds, tuple(names), call, pushes)
        function: object | None = None
        if level > 0:
            closure = None
            if t.code.co_freevars:
                assert isinstance(t.function, UserFunctionVariable)
                closure = t.function.fn.__closure__
            function = types.FunctionType(code, t.f_globals, code.co_name, None, closure)
        return resume.Tail(code, tuple(args), pushed, function)

    inner = txs[d]
    assert inner.current is not None
    f = resume.facts(inner.code)
    k = f.at(inner.current.offset)
    ins = f.instrs[k]
    eff = resume.effect(ins)
    assert eff is not None and eff.falls is not None
    stack = list(inner.stack)
    if eff.pops > len(stack):
        raise ChainCut(d, f"the stack at {ins.opname} is shallower than it consumes")
    slots = [None if vt is NULL else index(vt) for vt in stack]
    consumed = tuple(slots[len(stack) - eff.pops :])

    def nest(innermost: resume.Tail) -> resume.Tail:
        t = innermost
        for level in range(d - 1, -1, -1):
            below = [None if vt is NULL else index(vt) for vt in txs[level].stack]
            t = tail(level, below, innermost.pushed, inner=t)
        return t

    fall = nest(tail(d, slots[: len(stack) - eff.pops], eff.falls))
    branch = None
    if eff.branch is not None:  # a jump on a tensor's truth value: a continuation per path
        assert ins.target is not None
        branch = nest(tail(d, slots[: len(stack) - eff.pops], eff.branch, ins.target.offset))
    on_raise = None
    if any(_covered(t) for t in txs):  # Note [A chain through try and with blocks]
        reraise = resume.Tail(resume.reraise.__code__, (("x", 0),), 0, resume.reraise)
        if _covered(inner):  # Note [A break inside a try block of the innermost frame]
            below = slots[: len(stack) - eff.pops]
            reraise = tail(d, below, 0, inner=reraise, pushes=eff.falls)
        on_raise = nest(reraise)
    plan = resume.SplitPlan(
        tuple(resume.call_group(f, k)),
        consumed,
        tuple(cells.items()),
        fall,
        branch,
        (),
        ins.lineno,
        group_code=inner.code,
        on_raise=on_raise,
    )
    return values, plan


def _covered(tx: InstructionTranslator) -> bool:
    """Whether a handler (try or with-block) covers the call frame `tx` is running."""
    assert tx.current is not None
    f = resume.facts(tx.code)
    return f.instrs[f.at(tx.current.offset)].exn is not None
