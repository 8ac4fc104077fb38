"""`with lock:` over a `threading.Lock` or `threading.RLock` inside a captured frame.

Note [Locks in the frame]: a lock orders the frame's effects against other threads'. A graph
has no effect of its own but its in-place ops, and the runner replays the frame's other effects
(attribute and global stores, container mutations, hooks) after the graph, long after a lock
taken while tracing would have been released. So a with-block over a lock is traced as
straight-line code in two cases, and is otherwise one break before the block, which then runs
as Python, lock and all (torch.compile breaks at every lock):
- the block makes no effect outside the graph and no in-place op in it (checked when the block
  exits: the side effects and graph nodes it added), and the lock is free when the frame is
  traced (tried without blocking and released at once). The compiled code does not take the
  lock: a block that only reads and computes cannot be told apart from one that ran just before
  or just after another thread's critical section.
- the block has effects, and the compiled code takes the real lock around them: Note [Effects
  under a lock replayed under it].

Note [Effects under a lock replayed under it]: transformers installs its output-capturing hooks
once, double-checked under a module lock (`if flag: return; with lock: if flag: return;
install(); flag = True`), and the same call's layers run them. Eager's block reads state (the
flag) and writes (registrations, the flag) atomically with respect to other threads that take
the lock. The compiled frame keeps that: its guard, which pins every value the block read,
holds when the lock is held, and the block's writes happen before it is released.
- the cache entry's guard (guards.py, `Guard.lock`) is checked once as usual; when it passes it
  takes the lock (blocking, as eager's `with` would) and checks again under it. A failure then
  releases the lock and the entry is not taken: another thread changed what the block read (it
  installed the hooks first), and the next entry or a recompile runs the frame for the new state.
  The first call after a capture, which the hook runs without its guard, checks it the same way
  (convert_frame.py) and runs the frame as Python when it fails.
- the runner (codegen.py) holds the lock it was given while it runs the graph and replays every
  effect the frame made up to the block's exit (each kind's log up to the exit's mark), then
  releases it, in a `finally`, and replays the rest. Effects before the block are then visible
  to the next holder, as in eager; effects after it are visible earlier than in eager, which is
  one of eager's interleavings (nothing orders them against the other thread).
- the lock is held over the graph (the block's reads may feed it) and over effects before the
  block, not only the block itself: longer than eager, never in another order with another lock,
  since the compiled code takes no other Python lock (a traced block without effects takes none).
  A thread that already holds a plain Lock and calls the frame deadlocks on the guard only where
  the frame would have reached the block (the first, lock-free check passed), as eager would.
- one such block per frame, over a lock the runner and the guard can name (a source, pinned by
  identity); a second one, or a lock made in the frame, stays the break.
"""

from __future__ import annotations

import _thread
import operator
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.logs import decisions_log
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.translator import InstructionTranslator as Tx

VT = VariableTracker
LOCK_TYPES: tuple[type, ...] = (_thread.LockType, _thread.RLock)

_replay = os.environ.get("KILN_REPLAY_UNDER_LOCKS", "1") != "0"


def set_replay_under_locks(on: bool) -> bool:
    """Capture a with-block over a lock whose block has effects, replayed under the real lock
    (Note [Effects under a lock replayed under it]); off, it is a break. Returns the previous
    setting."""
    global _replay
    prev, _replay = _replay, on
    return prev


@dataclass(frozen=True, slots=True)
class HeldLock:
    """The frame's block with effects (Note [Effects under a lock replayed under it]): the lock,
    and each effect log's length when the block exited (replayed before the lock is released)."""

    lock: object
    attr_stores: int
    containers: int
    tensor_hooks: int
    module_hooks: int
    calls: int


class LockBlockHasEffects(Unsupported):
    """Raised at the block's exit; `enter_offset` is where the frame splits instead."""

    enter_offset: int | None = None


@dataclass(frozen=True, slots=True)
class _Mark:
    attr_stores: int
    containers: int
    hooks: int
    nodes: int
    calls: int = 0


def _mark(tx: Tx) -> _Mark:
    side = tx.output.side_effects
    return _Mark(
        len(side.attr_stores),
        side.mutations,
        len(side.tensor_hooks) + len(side.module_hooks),
        len(tx.output.graph.nodes),
        len(side.calls),
    )


def enter_lock(tx: Tx, ctx: VT, lock: object, enter_offset: int | None) -> VT:
    """BEFORE_WITH over a lock: the bound exit to push (Note [Locks in the frame])."""
    acquire = getattr(lock, "acquire")  # noqa: B009 - a C method of the lock
    if not acquire(blocking=False):
        raise Unsupported(f"with-statement over {ctx.describe()} held by another thread while tracing")
    getattr(lock, "release")()  # noqa: B009
    decisions_log.info(
        "with-statement over %s at %s: free while tracing, traced (checked for effects at its exit)",
        ctx.describe(),
        tx.where(),
    )
    return LockExitVariable(ctx, _mark(tx), enter_offset)


def _in_place(node: object) -> bool:
    target = getattr(node, "target", None)
    if target is operator.setitem:
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return isinstance(name, str) and name.endswith("_") and not name.endswith("__")


class LockExitVariable(VariableTracker):
    """The lock's bound `__exit__`: checks that the block made no effect (Note [Locks in the frame])."""

    def __init__(self, ctx: VT, mark: _Mark, enter_offset: int | None) -> None:
        self.ctx = ctx
        self.mark = mark
        self.enter_offset = enter_offset

    def describe(self) -> str:
        return "__exit__ of " + self.ctx.describe()

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        now = _mark(tx)
        m = self.mark
        effect = (now.attr_stores, now.containers, now.hooks, now.calls) != (
            m.attr_stores,
            m.containers,
            m.hooks,
            m.calls,
        )
        nodes = list(tx.output.graph.nodes)[m.nodes :]
        if effect or any(_in_place(n) for n in nodes):
            why = _replay_under_lock(tx, self.ctx)
            if why is None:
                return ConstantVariable(None)
            e = LockBlockHasEffects(
                f"with-statement over {self.ctx.describe()} whose block has effects: they would be "
                f"replayed after the compiled code, outside the lock ({why})",
                advice="keep writes under a lock out of the compiled function",
            )
            e.enter_offset = self.enter_offset
            raise e
        return ConstantVariable(None)


def _replay_under_lock(tx: Tx, ctx: VT) -> str | None:
    """Records the block for the runner to replay under the real lock (Note [Effects under a
    lock replayed under it]); returns why it cannot, or None."""
    side = tx.output.side_effects
    if not _replay:
        return "replaying effects under the lock is off (KILN_REPLAY_UNDER_LOCKS=0)"
    if side.held_lock is not None:
        return "a second with-block over a lock with effects in the frame"
    if ctx.source is None:
        return f"{ctx.describe()} has no source for the compiled code to take it by"
    lock = ctx.identity()
    tx.output.guards.identity(ctx.source, lock)
    side.held_lock = HeldLock(
        lock,
        len(side.attr_stores),
        len(side.mutated_containers),
        len(side.tensor_hooks),
        len(side.module_hooks),
        len(side.calls),
    )
    decisions_log.info(
        "with-statement over %s at %s: its block has effects; the compiled code holds the lock "
        "(taken by the guard, which checks again under it) until they are replayed",
        ctx.describe(),
        tx.where(),
    )
    return None
