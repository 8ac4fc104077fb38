"""`logging` and `warnings` calls inside a compiled frame.

Note [Log calls at a disabled level]: model code logs from its forward (`logger.debug(...)`,
`logger.info(...)`, `if logger.isEnabledFor(DEBUG): ...`) at levels that are usually off. The
answer to "is this logger enabled for this level" is read from the real logger while tracing
(which also fills its level cache, as the first eager call would) and becomes a guard
(`Logger.isEnabledFor(<logger>, 10) is False`), so `setLevel` or a new handler level later
recompiles. A call at a disabled level then does nothing, as in eager: no break. A call that would
emit stays a break (its record's file and line come from the calling frame, which a replay after
the graph would not have). `logging.getLogger(name)` with a constant name is the real logger (one
object per name for the process, held by the capture).

Note [Warnings replayed after the graph]: `warnings.warn(message, category, stacklevel)` with a
constant message is recorded while tracing and replayed after the graph with
`warnings.warn_explicit`, given what `warn` itself would have computed from the calling frame:
the file and line of the frame `stacklevel` levels up the traced call chain, its module name and
its `__warningregistry__`, so the "once per location" filters and the message text are eager's.
Raising filters would raise at the call in eager, before the rest of the frame ran: the guard
`no warnings filter is "error"` keeps the replay only where no filter raises (else the frame
recompiles, and with such a filter the call is a break). A `stacklevel` above the traced frames
is replayed through the real frames above the compiled one (Note [Warnings from above the
compiled frame]; a break before breadth14). As every replayed side effect, the warning comes after the graph's own work: a
graph that fails at run time (where eager would have warned first) does not emit it.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import ConstSource, Source
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker

# method -> the level it logs at (None: the level is the first argument, `log(level, msg)`)
_LEVEL_OF: dict[str, int | None] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
    "log": None,
    # transformers' additions to Logger (lru_cached wrappers of warning/info)
    "warning_once": logging.WARNING,
    "info_once": logging.INFO,
    "warning_advice": logging.WARNING,
}


def is_logger(value: object) -> bool:
    return isinstance(value, logging.Logger) and not isinstance(value, logging.RootLogger)


class LoggerVariable(VariableTracker):
    """A `logging.Logger` (Note [Log calls at a disabled level])."""

    def __init__(self, logger: logging.Logger, source: Source) -> None:
        self.logger = logger
        self.source = source
        self.src: Source = source

    def describe(self) -> str:
        return f"logger {self.logger.name!r}"

    def python_type(self) -> type:
        return type(self.logger)

    def identity(self) -> object:
        return self.logger

    def enabled(self, tx: Tx, level: int) -> bool:
        answer = self.logger.isEnabledFor(level)
        guards = tx.output.guards
        code, name = guards._src(self.src)
        fn = guards.ctx.const(logging.Logger.isEnabledFor)
        guards.add(f"{fn}({code}, {level!r}) is {answer}", f"{name}.isEnabledFor({level}) is {answer}")
        return answer

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in ("name", "level", "disabled", "propagate"):
            return tx.wrap(getattr(self.logger, name), None if name == "name" else _attr(self.src, name))
        if name in _LEVEL_OF or name in ("isEnabledFor", "getEffectiveLevel"):
            from kiln_dynamo.variables.base import MethodVariable

            return MethodVariable(self, name)
        return tx.wrap(getattr(self.logger, name), _attr(self.src, name))  # read and guarded as any object's

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name == "isEnabledFor" and len(args) == 1 and args[0].is_constant():
            return ConstantVariable(self.enabled(tx, int(args[0].as_constant())))
        if name == "getEffectiveLevel" and not args and not kwargs:
            level = self.logger.getEffectiveLevel()
            guards = tx.output.guards
            code, readable = guards._src(self.src)
            fn = guards.ctx.const(logging.Logger.getEffectiveLevel)
            guards.add(f"{fn}({code}) == {level!r}", f"{readable}.getEffectiveLevel() == {level}")
            return ConstantVariable(level)
        if name in _LEVEL_OF:
            fixed = _LEVEL_OF[name]
            if fixed is None and (not args or not args[0].is_constant()):
                raise Unsupported(f"{self.describe()}.log with a level that is not a constant")
            level = int(args[0].as_constant()) if fixed is None else fixed
            if not self.enabled(tx, level):
                return ConstantVariable(None)  # a disabled level: nothing happens, as in eager
            raise Unsupported(
                f"{self.describe()}.{name}() at an enabled level: the record's file and line come from "
                "the calling frame"
            )
        raise Unsupported(f"method {name} of {self.describe()}")

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.src)


def _attr(source: Source, name: str) -> Source:
    from kiln_dynamo.source import AttrSource

    return AttrSource(source, name)


class GetLoggerVariable(VariableTracker):
    """`logging.getLogger`: with a constant name, the real logger of that name."""

    def describe(self) -> str:
        return "logging.getLogger"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if kwargs or len(args) > 1 or (args and not args[0].is_constant()):
            raise Unsupported("logging.getLogger with a name that is not a constant")
        name = args[0].as_constant() if args else None
        logger = logging.getLogger(name)
        if not is_logger(logger):
            raise Unsupported("logging.getLogger() of the root logger inside a compiled frame")
        return LoggerVariable(logger, tx.output.const_source(logger, f"logging.getLogger({name!r})"))

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.const(logging.getLogger)


def _no_error_filters() -> bool:
    return not any(f[0] == "error" for f in warnings.filters)


class WarnVariable(VariableTracker):
    """`warnings.warn` (Note [Warnings replayed after the graph])."""

    def describe(self) -> str:
        return "warnings.warn"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        names = ("message", "category", "stacklevel", "source")
        bound = dict(zip(names, args, strict=False))
        for k, v in kwargs.items():
            if k not in names or k in bound:
                raise Unsupported(f"warnings.warn with argument {k!r}")
            bound[k] = v
        if "source" in bound or "message" not in bound:
            raise Unsupported("warnings.warn with a source object or without a message")
        if not all(v.is_constant() for v in bound.values()):
            raise Unsupported("warnings.warn with a message or category that is not a constant")
        message = bound["message"].as_constant()
        category = bound["category"].as_constant() if "category" in bound else None
        stacklevel = int(bound["stacklevel"].as_constant()) if "stacklevel" in bound else 1
        if isinstance(message, Warning):
            raise Unsupported("warnings.warn of a Warning instance")
        if not isinstance(message, str):
            raise Unsupported(f"warnings.warn of a {type(message).__name__}")
        if category is None:
            category = UserWarning
        if not (isinstance(category, type) and issubclass(category, Warning)):
            raise Unsupported("warnings.warn with a category that is not a Warning class")
        if not _no_error_filters():
            raise Unsupported("warnings.warn while a warnings filter turns warnings into errors")
        frame: Any = tx
        guards = tx.output.guards
        for level in range(max(stacklevel, 1) - 1):
            if frame.parent is None:
                self._warn_above(tx, frame, message, category, stacklevel - level - 1)
                return ConstantVariable(None)
            if not frame.same_caller:  # Note [Warnings from above the compiled frame]
                raise Unsupported(
                    "warnings.warn whose stacklevel passes a call that eager makes through frames "
                    "kiln does not trace (Module.__call__, a hook, a stand-in)"
                )
            frame = frame.parent
        g = frame.f_globals
        lineno = frame.lineno if frame.lineno is not None else frame.code.co_firstlineno
        registry = g.setdefault("__warningregistry__", {})
        guards.add(f"{guards.ctx.const(_no_error_filters)}()", "no warnings filter is 'error'")
        tx.output.side_effects.calls.append(
            (
                warnings.warn_explicit,
                (message, category, frame.code.co_filename, lineno, g.get("__name__"), registry, g),
            )
        )
        return ConstantVariable(None)

    @staticmethod
    def _warn_above(tx: Tx, root: Any, message: str, category: type[Warning], above: int) -> None:
        """A `stacklevel` that reaches `above` frames past the compiled frame (Note [Warnings
        from above the compiled frame])."""
        from kiln_dynamo import loop_pieces, resume

        if resume.is_resume_code(root.code) or loop_pieces.is_loop_piece(root.code):
            raise Unsupported(
                "warnings.warn with a stacklevel above a continuation or loop piece (its callers are "
                "kiln's split code, not the frame's)"
            )
        guards = tx.output.guards
        guards.add(f"{guards.ctx.const(_no_error_filters)}()", "no warnings filter is 'error'")
        tx.output.side_effects.calls.append((_warn_from_runner, (message, category, above)))

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.const(warnings.warn)


# Note [Warnings from above the compiled frame]: `warnings.warn(msg, stacklevel=2)` in a module's
# forward names the forward's caller (library code warns on behalf of its caller). The frames
# above the compiled frame are not traced, but they are the real ones at run time: the runner,
# which the compiled frame's own code (the trampoline, or a split frame's code) calls directly,
# calls this function directly, so the compiled frame is 3 levels above `warnings.warn` here,
# and the frame `above` levels past it is `3 + above`. `warnings.warn` then computes file, line,
# module and registry from the real frame, as eager's call does. Not for a continuation or a
# loop piece, whose caller is kiln's split code (a break, as before). Inside the traced chain a
# level is one frame only across a plain call (`InstructionTranslator.same_caller`): a module's
# `forward` is inlined without eager's `_wrapped_call_impl`/`_call_impl` frames (and hooks and
# stand-ins without theirs), so a stacklevel that passes such a call is a break. Before
# breadth14, `stacklevel=2` in a submodule's forward named the outer forward's line where eager
# names `_call_impl`'s: a wrong location.
def _warn_from_runner(message: str, category: type[Warning], above: int) -> None:
    warnings.warn(message, category, stacklevel=3 + above)


def wrap_diagnostics(value: object, source: Source | None, tx_output: Any) -> VT | None:
    """The tracker for a logging/warnings value, or None when `value` is not one."""
    if value is warnings.warn:
        if source is not None:
            tx_output.guards.identity(source, value)
        return WarnVariable()
    if value is logging.getLogger:
        if source is not None:
            tx_output.guards.identity(source, value)
        return GetLoggerVariable()
    if is_logger(value):
        assert isinstance(value, logging.Logger)
        if source is None:
            source = ConstSource(value, f"logging.getLogger({value.name!r})")
        tx_output.guards.identity(source, value)
        return LoggerVariable(value, source)
    return None
