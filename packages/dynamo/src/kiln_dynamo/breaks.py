"""Deciding a graph break: where the frame splits, and what crosses the split.

Capture traces a frame once; if an `Unsupported` escapes, the frame's own instruction that was
running (`Unsupported.break_offset`: the call that was being inlined, when the cause lies deeper)
is the break instruction. The frame is traced a second time, from scratch, and stops just before
that instruction (Note [Trace twice]); `prepare_split` then reads the evaluator's stack and
locals and turns them into the runner's tuple (`values`) and a `SplitPlan` for resume.py. When
the frame cannot be split safely (Note [What cannot be split] in resume.py), `CannotSplit` says
why and the frame runs as plain Python.

Note [Breaks deep in a call chain]: a break at depth d of inlined calls (frame f0 calls f1 ...
calls fd, which holds the unsupported instruction) splits f0 at its call to f1; CPython then runs
f1 itself, the hook captures f1, whose trace splits at its call to f2, and so on: d + 1 splits,
each counted as a break, with a graph before and after each where there are ops. torch.compile
(with its default `nested_graph_breaks=False`) splits the same way: its lower counts on the
breadth suite come from constructs it traces that kiln does not. Measured (`breaks.py --models
--only=segformer,wav2vec2 --no-torch`, graphs/breaks/frames in Python): segformer eval and train
2/5/6 (torch.compile 2/1): transformers installs output-capturing hooks on the first call, under a
lock, three frames below `forward` (`register_forward_hook` builds a `weakref.ref` in
torch.utils.hooks); from the second call it is one graph. wav2vec2 train 4/5/3 (torch.compile
4/3): `hidden_states.requires_grad = True`, two frames below `forward`, makes a new leaf that
requires grad, which no graph can (torch.compile breaks there too). Neither count changed this
session. A continuation that resumes the whole chain at once (one resume function per inlined
frame, called nested, each given its own locals, cells, stack and open with-blocks, with
exceptions unwinding through them as through the original frames, on 3.11 and 3.12) is not built:
it would turn d + 1 breaks into one where the chain's frames do work after the break, and these
two models' extra breaks are a first-call setup and a construct that breaks anyway.

Note [Trace twice]: the first pass has already put into the graph whatever the failing inlined
call did before it failed, and has recorded its side effects and guards. Undoing that piecemeal is
where bugs hide; a fresh pass that stops before the break instruction gives a graph, side effects
and guards that describe exactly the code before the break. Tracing is deterministic given the
same entry values, so the second pass reaches the same instruction with the same stack.
"""

from __future__ import annotations

import types

from kiln_dynamo import resume
from kiln_dynamo.translator import BreakHere
from kiln_dynamo.variables.base import NULL, VariableTracker
from kiln_dynamo.variables.torch import WithExitVariable

VT = VariableTracker


class CannotSplit(Exception):
    """The frame cannot be split at its break instruction; the message says why, for users.
    `loop_entry` is where the outermost loop around the break begins, when that is the reason."""

    def __init__(self, msg: str, loop_entry: int | None = None) -> None:
        super().__init__(msg)
        self.loop_entry = loop_entry


def loop_entry(f: resume.FrameFacts, offset: int) -> int:
    """Where the outermost loop around `offset` begins: its GET_ITER for a for loop (the iterator
    cannot cross a split, the iterable can), else the loop's first instruction."""
    head = min(h for h, back in f.loops if h <= offset <= back)
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
    starts_loop = before and all(head == offset for head, back in f.loops if head <= offset <= back)
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

    values: list[VT] = []
    index_of: dict[int, int] = {}

    def index(vt: VT) -> int:
        if id(vt) not in index_of:
            index_of[id(vt)] = len(values)
            values.append(vt)
        return index_of[id(vt)]

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
