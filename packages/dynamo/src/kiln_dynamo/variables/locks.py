"""`with lock:` over a `threading.Lock` or `threading.RLock` inside a captured frame.

Note [Locks in the frame]: a lock orders the frame's effects against other threads'. A graph
has no effect of its own but its in-place ops, and the runner replays the frame's other effects
(attribute and global stores, container mutations, hooks) after the graph, long after a lock
taken while tracing would have been released. So a with-block over a lock is traced as
straight-line code only when that ordering cannot matter: the lock is free when the frame is
traced (it is tried without blocking and released at once), and the block makes no effect
outside the graph and no in-place op in it (checked when the block exits: the side effects and
graph nodes it added). Otherwise, one break before the block, which then runs as Python, lock
and all (torch.compile breaks at every lock). The compiled code does not take the lock: a block
that only reads and computes cannot be told apart from one that ran just before or just after
another thread's critical section. segformer's hook installation under a lock writes (it
installs hooks), so it stays a break there.
"""

from __future__ import annotations

import _thread
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.logs import decisions_log
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.translator import InstructionTranslator as Tx

VT = VariableTracker
LOCK_TYPES: tuple[type, ...] = (_thread.LockType, _thread.RLock)


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
        len(side.mutated_containers),
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
            e = LockBlockHasEffects(
                f"with-statement over {self.ctx.describe()} whose block has effects: they would be "
                "replayed after the compiled code, outside the lock",
                advice="keep writes under a lock out of the compiled function",
            )
            e.enter_offset = self.enter_offset
            raise e
        return ConstantVariable(None)
