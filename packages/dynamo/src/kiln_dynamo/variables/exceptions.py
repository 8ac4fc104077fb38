"""Python exceptions the traced program raises and catches itself.

Note [Exceptions the frame raises and catches]: an exception the modelled program raises at
trace time (`raise MyError(...)`, a missing dict key, `next()` on an exhausted iterator, the
StopIteration a `contextmanager`'s generator ends with) is an `ObservedException` carrying an
`ExceptionVariable`. The translator that was running the instruction looks it up in its code's
exception table, exactly as CPython would (translator.py, `_enter_handler`): with a handler
there, the stack is cut to the handler's depth, the exception is pushed and tracing goes on in
the handler (`PUSH_EXC_INFO`, `CHECK_EXC_MATCH`, `POP_EXCEPT`, `RERAISE` are modelled); with
none, the exception leaves that translator and its caller's table is asked at the call site.
One that leaves the captured frame is an ordinary graph break (ObservedException is an
`Unsupported`): CPython runs the raising instruction and raises for real. Only exceptions the
trackers raise on purpose are observed: an error inside kiln is never caught by the user's
`except Exception:`. An exception that would pass through a `with` block's exit is a break too
(exits are not called with exceptions), and exceptions raised by graph operators at run time
do not reach handlers (as in torch.compile: the graph has no control flow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln_dynamo.exc import Unsupported, UserFrame
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker


def is_plain_exception_class(cls: type) -> bool:
    """An exception class whose instances are only their type and `args` (no own `__init__`,
    `__new__` or `__str__` in Python), so that a tracker can stand for one."""
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return False
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            break
        if any(name in vars(klass) for name in ("__init__", "__new__", "__str__", "__setattr__")):
            return False
    return True


class ExceptionVariable(VariableTracker):
    """An exception instance created in the frame: its class and its constructor arguments."""

    def __init__(self, cls: type[BaseException], args: list[VT]) -> None:
        self.cls = cls
        self.args = list(args)

    def describe(self) -> str:
        return f"exception {self.cls.__qualname__}"

    def python_type(self) -> type:
        return self.cls

    def getattr(self, tx: Tx, name: str) -> VT:
        from kiln_dynamo.variables.lists import TupleVariable

        if name == "args":
            return TupleVariable(self.args)
        if name == "__class__":
            return tx.wrap(self.cls, None)
        if name in ("__cause__", "__context__", "__traceback__"):
            return ConstantVariable(None)
        return super().getattr(tx, name)

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name in ("__str__", "__repr__") and not args and all(a.is_constant() for a in self.args):
            real = self.cls(*[a.as_constant() for a in self.args])
            return ConstantVariable(str(real) if name == "__str__" else repr(real))
        if name == "with_traceback" and len(args) == 1:
            return self
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{cg.const(self.cls)}({''.join(a.reconstruct(cg) + ', ' for a in self.args)})"


class ObservedException(Unsupported):
    """An exception of the modelled program, raised while tracing (Note [Exceptions the frame
    raises and catches]); a graph break where no handler of the traced frames takes it."""

    def __init__(
        self,
        msg: str,
        where: str | None = None,
        *,
        exc: ExceptionVariable | None = None,
        advice: str | None = None,
        frames: tuple[UserFrame, ...] = (),
        before: bool = False,
        depth: int = 0,
    ) -> None:
        super().__init__(msg, where, advice=advice, frames=frames, before=before, depth=depth)
        assert exc is not None
        self.exc = exc

    def located(self, where: str, frames: tuple[UserFrame, ...] = (), depth: int = 0) -> Unsupported:
        if self.where is not None:
            return self
        return ObservedException(
            self.msg, where, exc=self.exc, advice=self.advice, frames=frames, before=self.before, depth=depth
        )


def missing_attribute(e: BaseException) -> bool:
    """Whether `e`, raised by an attribute lookup, is the AttributeError that getattr's default,
    hasattr and `except AttributeError` take: one kiln's modelling raised (a tracker with no such
    attribute) or one of the program's own (`super().__getattribute__` in a class's Python
    `__getattribute__`, inlined: Note [Missing attributes seen by the program])."""
    return isinstance(e, AttributeError) or (
        isinstance(e, ObservedException) and issubclass(e.exc.cls, AttributeError)
    )


def observed(cls: type[BaseException], *args: Any, msg: str | None = None) -> ObservedException:
    """The exception `cls(*args)` raised by the modelled program (args are plain values)."""
    if not all(a is None or isinstance(a, (str, int, float, bool)) for a in args):
        # e.g. a missing module key: the exception could not be rebuilt if it left the frame
        return ObservedException(
            f"{cls.__name__} raised inside a compiled frame", exc=ExceptionVariable(cls, [])
        )
    exc = ExceptionVariable(cls, [ConstantVariable(a) for a in args])
    return raise_exception(exc, msg)


def raise_exception(exc: ExceptionVariable, msg: str | None = None) -> ObservedException:
    if msg is None:
        shown = ", ".join(repr(a.as_constant()) if a.is_constant() else a.describe() for a in exc.args)
        msg = f"{exc.cls.__name__}({shown}) raised inside a compiled frame"
    return ObservedException(msg, exc=exc)


def exception_classes(tx: Tx, vt: VT) -> tuple[type, ...]:
    """The classes an `except` clause names (one class or a tuple of them)."""
    from kiln_dynamo.variables.lists import TupleVariable

    items = vt.items if isinstance(vt, TupleVariable) else [vt]
    out = []
    for item in items:
        cls = item.as_constant() if item.is_constant() else None
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise Unsupported(f"except clause over {item.describe()}, not an exception class")
        out.append(cls)
    return tuple(out)
