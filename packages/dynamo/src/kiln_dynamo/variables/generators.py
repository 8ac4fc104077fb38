"""Generator objects of the user's generator functions, run step by step while tracing.

Note [Generators traced step by step]: calling a generator function creates a child translator
that has not run yet (`GeneratorObjectVariable`). Each `next()` (a `for` loop's FOR_ITER,
`next(g)`, `list(g)`, `yield from g`, a `contextmanager`'s enter and exit) resumes that
translator until its next YIELD_VALUE, which hands the value back and leaves the translator's
stack and locals as they were, or until it returns (StopIteration, carrying the return value).
The generator's effects and its consumer's therefore interleave exactly as in CPython (the
order of prints, appends, graph nodes). A generator that has not started can cross a split (it
is rebuilt as a fresh call of its function: nothing of its body has run); one that has started
cannot leave the frame. A break inside the generator's body (an unsupported construct it runs)
moves to the instruction of the frame that created it: that call runs in CPython and the real
generator object runs as plain Python (Note [Generators run as Python]). Generator expressions
and torch's own generators are stepped the same way, unless the bytecode shows that a consuming
builtin takes them at once (Note [Generators consumed where they are made] in translator.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker
from kiln_dynamo.variables.exceptions import ExceptionVariable, ObservedException, raise_exception
from kiln_dynamo.variables.lists import ListIteratorVariable

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.translator import InstructionTranslator
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker


class GeneratorObjectVariable(ListIteratorVariable):
    """A generator object made in the frame: a suspended child translator."""

    def __init__(
        self,
        child: InstructionTranslator,
        label: str,
        rebuild: tuple[VT, list[VT], dict[str, VT]] | None,
        created_at: int | None,
    ) -> None:
        super().__init__([])
        self.child = child
        self.label = label
        self.rebuild = rebuild  # (function, args, kwargs) of the call that made it
        self.created_at = created_at  # offset of the captured frame's instruction that made it
        self.started = False
        self.finished = False
        self.return_value: VT = ConstantVariable(None)
        self.suspended_at: int | None = None

    def check_left_suspended(self) -> None:
        """At the frame's return: a generator left suspended inside a try (or with) block would
        run its cleanup when CPython frees it, which the graph cannot do; the generator then
        runs as plain Python (its creation breaks)."""
        if not self.started or self.finished or self.suspended_at is None:
            return
        at = self.suspended_at
        entry = next((e for e in self.child.exception_table if e.start <= at < e.end), None)
        if entry is None:
            return
        handler = self.child.instructions[self.child.index_of[entry.target]]
        if handler.argrepr == "INTRINSIC_STOPITERATION_ERROR":
            return  # 3.12's handler around every generator body: no cleanup of the user's
        raise self._break_at_creation(
            Unsupported(
                f"{self.describe()} is left suspended inside a try or with block, whose cleanup CPython runs"
            )
        )

    def describe(self) -> str:
        return f"generator object {self.label}"

    def python_type(self) -> type:
        import types

        return types.GeneratorType

    def send(self, tx: Tx, value: VT) -> VT | None:
        """Run the body to its next yield (None: it returned, see `return_value`)."""
        if self.finished:
            return None
        from kiln_dynamo.translator import Yielded

        if self.started:
            self.child.stack[-1] = value  # what the suspended YIELD_VALUE evaluates to
        elif not (value.is_constant() and value.as_constant() is None):
            raise Unsupported(f"send() of a value to the just-started {self.describe()}")
        self.started = True
        try:
            out = self.child.run()
        except Yielded as y:
            self.suspended_at = self.child.instructions[self.child.ip - 1].offset
            return y.value
        except ObservedException:
            self.finished = True
            raise
        except Unsupported as e:
            raise self._break_at_creation(e) from e
        self.finished = True
        self.return_value = out
        return None

    def _break_at_creation(self, e: Unsupported) -> Unsupported:
        if self.created_at is None:
            return e
        root = self.child
        while root.parent is not None:
            root = root.parent
        if e.where is None:  # raised at the frame's return, not in the generator's body
            e = e.located(root.where(), root.user_frames(), 0)
        moved = Unsupported(e.msg, e.where, advice=e.advice, frames=e.frames, depth=e.depth)
        moved.break_offset = self.created_at
        moved.note = f"split at the call that made {self.describe()}: it runs as plain Python"
        return root._split_before_try(moved)

    def next(self, tx: Tx) -> VT | None:
        return self.send(tx, ConstantVariable(None))

    def iterate(self, tx: Tx) -> list[VT]:
        out = []
        while (item := self.next(tx)) is not None:
            out.append(item)
        return out

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name == "send" and len(args) == 1:
            item = self.send(tx, args[0])
            if item is None:
                raise raise_exception(ExceptionVariable(StopIteration, [self.return_value]))
            return item
        if name == "close" and not args:
            if self.started and not self.finished:
                raise Unsupported(f"close() of the suspended {self.describe()}")
            self.finished = True
            return ConstantVariable(None)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.started or self.rebuild is None:
            raise Unsupported(f"{self.describe()}, already running, cannot leave the frame")
        fn, args, kwargs = self.rebuild
        inner = [a.reconstruct(cg) for a in args] + [f"{k}={v.reconstruct(cg)}" for k, v in kwargs.items()]
        return f"{fn.reconstruct(cg)}({', '.join(inner)})"


def is_generator_object(value: Any) -> bool:
    return isinstance(value, GeneratorObjectVariable)
