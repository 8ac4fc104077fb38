"""Values kiln does not look inside: C functions it cannot trace, generator objects, exits.

An opaque tracker only carries its value to where the frame splits: any use of it (a call, an
attribute, iteration) raises `Unsupported`, so the graph breaks right at that instruction and
CPython runs it on the real object (resume.py). It reconstructs from its source, or, for C
functions, which live as long as their module, as a constant.

`GradModeExit` is the real object that stands for the `__exit__` of a grad-mode with-block when a
frame splits inside the block (Note [Grad mode across a split]).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import torch

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import AttrSource, Source
from kiln_dynamo.variables.base import VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker

_UNTRACEABLE_ADVICE = "move the call outside the compiled function and pass its result in as an argument"


def c_function_name(fn: Any) -> str:
    self_obj = getattr(fn, "__self__", None)
    mod = self_obj.__name__ if isinstance(self_obj, types.ModuleType) else getattr(fn, "__module__", None)
    name = str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn)))
    return f"{mod}.{name}" if mod and mod != "builtins" else name


class OpaqueCallableVariable(VariableTracker):
    """A C function (os.getpid, id, time.time, ...) that the graph cannot hold."""

    def __init__(self, fn: Any, source: Source | None) -> None:
        self.fn = fn
        self.source = source
        self.label = c_function_name(fn)

    def describe(self) -> str:
        return f"C function {self.label}"

    def python_type(self) -> type:
        return type(self.fn)

    def identity(self) -> object:
        return self.fn

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        name = self.label
        if getattr(self.fn, "__module__", None) == "builtins" or "." not in name:
            raise Unsupported(
                f"call to the builtin {name}() that kiln cannot trace", advice=_UNTRACEABLE_ADVICE
            )
        raise Unsupported(f"call to a C function {name} that kiln cannot trace", advice=_UNTRACEABLE_ADVICE)

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in ("__name__", "__qualname__", "__module__"):
            return tx.wrap_constant(getattr(self.fn, name))
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.source is not None:
            return cg.source(self.source)
        return cg.const(self.fn)


class OpaqueVariable(VariableTracker):
    """An object kiln passes along but never inspects (a generator object, ...)."""

    def __init__(self, value: Any, source: Source | None, what: str) -> None:
        self.value = value
        self.source = source
        self.what = what

    def describe(self) -> str:
        return self.what

    def python_type(self) -> type:
        return type(self.value)

    def identity(self) -> object:
        return self.value

    def _unsupported(self, action: str) -> Unsupported:
        return Unsupported(f"{action} {self.what}: kiln runs it as plain Python")

    def getattr(self, tx: Tx, name: str) -> VT:
        if self.source is not None and callable(getattr(type(self.value), name, None)):
            # a method: the break comes at its call, where a frame can be split (not at the load)
            return OpaqueMethodVariable(self, name, AttrSource(self.source, name))
        raise self._unsupported(f"attribute {name!r} of")

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        raise self._unsupported("calling")

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.source is None:
            raise Unsupported(f"{self.what} without a source cannot be rebuilt")
        return cg.source(self.source)

    def iterate(self, tx: Tx) -> list[VT]:
        raise self._unsupported("iterating over")

    def truth(self, tx: Tx) -> bool:
        raise self._unsupported("the truth value of")


class OpaqueMethodVariable(VariableTracker):
    """A method of an opaque object, loaded but not yet called: calling it breaks the graph."""

    def __init__(self, owner: OpaqueVariable, name: str, source: Source) -> None:
        self.owner = owner
        self.name = name
        self.source = source

    def describe(self) -> str:
        return f"method {self.name} of {self.owner.what}"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        raise Unsupported(f"calling {self.describe()}: kiln runs it as plain Python")

    def reconstruct(self, cg: Reconstructor) -> str:
        assert self.source is not None
        return cg.source(self.source)


# Note [inference_mode in the frame]: since capture15 a block is traced whole (Note [inference_mode
# traced] in inference.py); what follows is the way kept for a break inside the block and for
# KILN_TRACE_INFERENCE_MODE=0. The tensors made under `torch.inference_mode()` are
# inference tensors, which no graph makes, so the mode is never entered inside a graph. Making the
# object (`torch.inference_mode()`, `torch.inference_mode(False)`) has no effect and is modelled
# (rebuilt as the same call if it crosses a split); entering the block is one break with the
# reason, at the `with` line: CPython enters the mode on the real object, and the block's body is
# captured on its own in the continuation, which the hook sees while the mode is on (its graph is
# traced and guarded under it). The block's exit is one more break, at the call of the real
# object's `__exit__` in that continuation (not inside torch's Python `__exit__`), and the code
# after the block is captured in a third graph. Before, the object's construction, its
# `__enter__` and two reads inside torch's `__exit__` were four breaks (two of them chains of two
# frames).
_INFERENCE_REASON = (
    "torch.inference_mode inside a compiled frame: the tensors it makes are inference tensors, "
    "which no graph makes; entering and leaving the block run as Python, and its body is a graph of its own"
)
_INFERENCE_ADVICE = (
    "call the compiled function under torch.inference_mode() (or use torch.no_grad() inside it)"
)


class InferenceModeVariable(VariableTracker):
    """`torch.inference_mode(mode)` made in the frame (Note [inference_mode in the frame])."""

    def __init__(self, mode: bool) -> None:
        self.mode = mode
        self.prev_grad = True

    def describe(self) -> str:
        return f"torch.inference_mode({self.mode})"

    def python_type(self) -> type:
        return torch.inference_mode

    def getattr(self, tx: Tx, name: str) -> VT:
        from kiln_dynamo.variables.base import ConstantVariable

        if name == "mode":
            return ConstantVariable(self.mode)
        if name in ("__class__", "clone"):  # torch's decorator: `self.__class__(self.mode)`
            from kiln_dynamo.variables.functions import BoundMethodVariable

            if name == "__class__":
                return tx.wrap(torch.inference_mode, None)
            return BoundMethodVariable(tx.wrap(torch.inference_mode.clone, None), self)
        raise Unsupported(_INFERENCE_REASON, advice=_INFERENCE_ADVICE)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        raise Unsupported(_INFERENCE_REASON, advice=_INFERENCE_ADVICE)

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{cg.const(torch.inference_mode)}({self.mode!r})"

    def enter(self, tx: Tx) -> VT:
        """Entering the block as a traced one (Note [inference_mode traced] in inference.py):
        grad mode off in the graph, and what the block makes is marked inference."""
        from kiln_dynamo.variables.base import ConstantVariable

        tx.output.guards.inference_mode()
        if not self.mode:
            if tx.output.inference_depth or torch.is_inference_mode_enabled():
                raise Unsupported(
                    "torch.inference_mode(False) inside an inference_mode block", advice=_INFERENCE_ADVICE
                )
            return ConstantVariable(None)  # outside the mode, (False) changes nothing
        from kiln_dynamo.logs import decisions_log

        decisions_log.info(
            "torch.inference_mode() block at %s traced: grad mode off in the graph, its results made "
            "inference tensors after the graph (KILN_TRACE_INFERENCE_MODE=0: two breaks instead)",
            tx.where(),
        )
        self.prev_grad = torch.is_grad_enabled()
        tx.output.set_grad_mode(False)
        tx.output.inference_depth += 1
        return ConstantVariable(None)

    def exit(self, tx: Tx) -> VT:
        from kiln_dynamo.variables.base import ConstantVariable

        if self.mode:
            tx.output.inference_depth -= 1
            tx.output.set_grad_mode(self.prev_grad)
        return ConstantVariable(None)


class TracedInferenceExitVariable(VariableTracker):
    """The `__exit__` BEFORE_WITH leaves for a traced `torch.inference_mode()` block (Note
    [inference_mode traced] in inference.py); `enter_offset` is the BEFORE_WITH of the frame
    itself, where a break inside the block moves (None in an inlined frame)."""

    def __init__(self, ctx: InferenceModeVariable, enter_offset: int | None) -> None:
        self.ctx = ctx
        self.enter_offset = enter_offset

    def describe(self) -> str:
        return "__exit__ of " + self.ctx.describe()

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.ctx.exit(tx)


class InferenceModeExitVariable(OpaqueCallableVariable):
    """The `__exit__` of a real `torch.inference_mode` object, as a continuation inside the block
    receives it (Note [inference_mode in the frame]): calling it is one break."""

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        raise Unsupported(_INFERENCE_REASON, advice=_INFERENCE_ADVICE)


def is_inference_mode_method(value: Any) -> bool:
    """The bound `__exit__` of a real `torch.inference_mode` (its other methods, `clone` behind
    the decorator, are traced as any method)."""
    return (
        isinstance(value, types.MethodType)
        and isinstance(value.__self__, torch.inference_mode)
        and value.__func__ is torch.inference_mode.__exit__
    )


# Note [Grad mode across a split]: when a frame splits inside `with torch.no_grad():`, the
# continuation runs the rest of the block, so it needs the block's __exit__ on its stack. The
# split passes one of these two objects in that slot; CPython calls it like any __exit__ (on the
# normal path and from the exception handler), and kiln models it as the exit of a grad-mode
# block whose previous mode is `prev` (builder.py), guarded by identity.
class GradModeExit:
    __slots__ = ("prev",)

    def __init__(self, prev: bool) -> None:
        self.prev = prev

    def __call__(self, *exc_info: object) -> None:
        torch._C._set_grad_enabled(self.prev)

    def __repr__(self) -> str:
        return f"<exit of a grad-mode block: restores grad mode {self.prev}>"


GRAD_MODE_EXITS = {True: GradModeExit(True), False: GradModeExit(False)}


def restore_autocast(device: str, enabled: bool, dtype: torch.dtype, cache_enabled: bool) -> None:
    """What leaving an autocast block does (torch.autocast.__exit__), from the saved state."""
    if torch.autocast_decrement_nesting() == 0:
        torch.clear_autocast_cache()
    set_autocast_state(device, enabled, dtype, cache_enabled)


# Note [Leaving a block entered before the frame]: a continuation that leaves an autocast block
# its runner re-entered (the frame split inside it) restores the state from before the block.
# The graph holds that as a `set_autocast_state` node, so that a backend tracing the graph
# traces the operators after it outside the block; but a backend that compiles the graph to aten
# operators (kiln_aotgrad) keeps no Python call, and the state change happened only once, while
# it traced. From the second call on, the program went on inside the block: autocast stayed
# enabled after the function returned, for the whole rest of the program. So the runner makes
# the change itself after the graph call (`restore_autocast`, which also counts the nesting down
# once), as it sets the final grad mode (Note [Grad mode at the end of a frame]); the node only
# sets the state, so that a backend that runs it (the eager one) sets it twice, harmlessly.
def set_autocast_state(device: str, enabled: bool, dtype: torch.dtype, cache_enabled: bool) -> None:
    """The autocast state of `device` (and the cache flag), the nesting count left as it is."""
    torch.set_autocast_enabled(device, enabled)
    torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(cache_enabled)


class AutocastExit:
    """The exit of an autocast block whose frame split inside it (Note [Grad mode across a
    split] applies the same way): the runner re-entered the block; this restores the state
    from before it."""

    __slots__ = ("args",)

    def __init__(self, device: str, prev: tuple[bool, torch.dtype, bool]) -> None:
        self.args: tuple[str, bool, torch.dtype, bool] = (device, *prev)

    def __call__(self, *exc_info: object) -> None:
        restore_autocast(*self.args)

    def __repr__(self) -> str:
        return f"<exit of an autocast block: restores {self.args}>"


_AUTOCAST_EXITS: dict[tuple[object, ...], AutocastExit] = {}


def autocast_exit(device: str, prev: tuple[bool, Any, bool] | None) -> AutocastExit:
    """One object per saved state, so that continuations can guard on it by identity."""
    assert prev is not None
    key = (device, *prev)
    if key not in _AUTOCAST_EXITS:
        _AUTOCAST_EXITS[key] = AutocastExit(device, prev)
    return _AUTOCAST_EXITS[key]


def autocast_state() -> tuple[object, ...]:
    """The whole autocast state of the thread (per device, the cache flag and the nesting), to
    put back after tracing, which enters and leaves autocast blocks for real."""
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    per_device = tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda"))
    return (per_device, torch.is_autocast_cache_enabled(), nesting)


def restore_autocast_state(state: tuple[object, ...]) -> None:
    per_device, cache, nesting = state
    for d, (on, dtype) in zip(("cpu", "cuda"), per_device, strict=True):  # type: ignore[call-overload]
        torch.set_autocast_enabled(d, on)
        torch.set_autocast_dtype(d, dtype)
    torch.set_autocast_cache_enabled(cache)  # type: ignore[arg-type]
    now = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    while now < nesting:  # type: ignore[operator]
        now = torch.autocast_increment_nesting()
    while now > nesting:  # type: ignore[operator]
        now = torch.autocast_decrement_nesting()
