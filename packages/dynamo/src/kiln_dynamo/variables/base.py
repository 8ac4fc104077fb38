"""The VariableTracker model: what the symbolic evaluator knows about each Python value.

The translator never holds real values on its stack: it holds trackers. A tracker says what
kind of value it stands for (a tensor that is a node in the graph, a Python constant, a list of
other trackers, a function to inline, a module, ...) and how the value behaves under the
operations the bytecode applies to it (`getattr`, `call`, `call_method`, `iterate`, `truth`,
`setitem`, ...). A tracker that came from outside the frame has a `source`; reading through it
is what creates guards (variables/builder.py). `reconstruct` renders the value as a Python
expression for the runner that rebuilds the frame's return value (codegen.py).

Operations that a tracker does not model raise `Unsupported` with a readable reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import Source

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.translator import InstructionTranslator

    Tx = InstructionTranslator


class VariableTracker:
    source: Source | None = None

    def python_type(self) -> type:
        raise Unsupported(f"type of {self.describe()} is unknown")

    def describe(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return self.describe()

    # --- constants ---------------------------------------------------------------------------
    def is_constant(self) -> bool:
        return False

    def as_constant(self) -> Any:
        raise Unsupported(f"{self.describe()} is not a Python constant here")

    # --- protocol ----------------------------------------------------------------------------
    def getattr(self, tx: Tx, name: str) -> VariableTracker:
        try:
            pt: type | None = self.python_type()
        except Unsupported:
            pt = None
        if pt is not None and callable(getattr(pt, name, None)):
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def hasattr(self, tx: Tx, name: str) -> bool:
        from kiln_dynamo.variables.exceptions import missing_attribute

        try:
            self.getattr(tx, name)
        except (Unsupported, AttributeError) as e:
            if missing_attribute(e):
                return False
            raise
        return True

    def setattr(self, tx: Tx, name: str, value: VariableTracker) -> None:
        raise Unsupported(f"setting attribute {name!r} on {self.describe()}")

    def call(
        self, tx: Tx, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> VariableTracker:
        raise Unsupported(f"calling {self.describe()}")

    def call_method(
        self, tx: Tx, name: str, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> VariableTracker:
        attr = self.getattr(tx, name)
        if isinstance(attr, MethodVariable) and attr.obj is self:
            raise Unsupported(f"method {name} of {self.describe()}")
        return attr.call(tx, args, kwargs)

    def iterate(self, tx: Tx) -> list[VariableTracker]:
        raise Unsupported(f"iterating over {self.describe()}")

    def truth(self, tx: Tx) -> bool:
        raise Unsupported(f"truth value of {self.describe()}")

    def length(self, tx: Tx) -> int:
        return len(self.iterate(tx))

    def getitem(self, tx: Tx, key: VariableTracker) -> VariableTracker:
        raise Unsupported(f"subscript of {self.describe()}")

    def setitem(self, tx: Tx, key: VariableTracker, value: VariableTracker) -> None:
        raise Unsupported(f"item assignment on {self.describe()}")

    def delitem(self, tx: Tx, key: VariableTracker) -> None:
        raise Unsupported(f"item deletion on {self.describe()}")

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.source is not None:
            return cg.source(self.source)
        raise Unsupported(f"cannot return or store {self.describe()} out of the compiled frame")

    def identity(self) -> object:
        """What `is` compares: the real object when known, else the tracker itself."""
        return self

    def replay_store(self) -> Any:
        """What the runner calls, as `f(obj, name, value)`, to replay an attribute store recorded
        on this tracker (SideEffects.store_attr): `setattr`, unless the object's class needs
        otherwise (a ModelOutput: Note [Stores into a ModelOutput from outside])."""
        return setattr


class ConstantVariable(VariableTracker):
    """An immutable Python value known at capture time (guarded when it came from outside)."""

    __slots__ = ("source", "value")

    def __init__(self, value: Any, source: Source | None = None) -> None:
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"constant {self.value!r}"

    def python_type(self) -> type:
        return type(self.value)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def identity(self) -> object:
        return self.value

    def truth(self, tx: Tx) -> bool:
        return bool(self.value)

    def length(self, tx: Tx) -> int:
        return len(self.value)

    def iterate(self, tx: Tx) -> list[VariableTracker]:
        try:
            items = list(self.value)
        except TypeError as e:
            raise Unsupported(f"iterating over {self.describe()}: {e}") from e
        return [ConstantVariable(v) for v in items]

    def getitem(self, tx: Tx, key: VariableTracker) -> VariableTracker:
        return tx.wrap_constant(self.value[key.as_constant()])

    def getattr(self, tx: Tx, name: str) -> VariableTracker:
        try:
            attr = getattr(self.value, name)
        except AttributeError:
            raise
        from kiln_dynamo.variables.builder import TYPING_CONSTANT_TYPES

        # an annotation's `__origin__` (`typing.Union`) is callable but a constant: Note [Type
        # annotations as constants]
        if callable(attr) and not isinstance(attr, (type, TYPING_CONSTANT_TYPES)):
            return ConstantMethodVariable(self, name)
        return tx.wrap_constant(attr)

    def call_method(
        self, tx: Tx, name: str, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> VariableTracker:
        return ConstantMethodVariable(self, name).call(tx, args, kwargs)

    def reconstruct(self, cg: Reconstructor) -> str:
        v = self.value
        if v is None or isinstance(v, (bool, int, str)):
            return repr(v)
        return cg.const(v)


class ConstantMethodVariable(VariableTracker):
    """A method of an immutable constant (`"a{}".format`, `(2, 3).index`), folded when called."""

    def __init__(self, obj: ConstantVariable, name: str) -> None:
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"method {self.name} of {self.obj.describe()}"

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{self.obj.reconstruct(cg)}.{self.name}"

    def call(
        self, tx: Tx, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> VariableTracker:
        if not all(a.is_constant() for a in [*args, *kwargs.values()]):
            raise Unsupported(f"{self.describe()} called with non-constant arguments")
        fn = getattr(self.obj.value, self.name)
        try:
            out = fn(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
        except Exception as e:
            raise Unsupported(f"{self.describe()} raised {type(e).__name__}: {e}") from e
        return tx.wrap_constant(out)


class NullVariable(VariableTracker):
    """The NULL that CPython 3.11+ pushes below a callable."""

    def describe(self) -> str:
        return "NULL"


NULL = NullVariable()


class CellVariable(VariableTracker):
    """A closure cell created inside the traced frames (its contents are a tracker)."""

    def __init__(self, contents: VariableTracker | None = None) -> None:
        self.contents = contents

    def describe(self) -> str:
        return "cell"


class SliceVariable(VariableTracker):
    def __init__(self, start: VariableTracker, stop: VariableTracker, step: VariableTracker) -> None:
        self.items = (start, stop, step)

    def describe(self) -> str:
        return "slice"

    def python_type(self) -> type:
        return slice

    def is_constant(self) -> bool:
        return all(i.is_constant() for i in self.items)

    def as_constant(self) -> Any:
        return slice(*(i.as_constant() for i in self.items))

    def as_graph_arg(self) -> slice:
        from kiln_dynamo.variables.tensor import graph_arg

        return slice(*(graph_arg(i) for i in self.items))

    def as_fake_arg(self) -> slice:
        from kiln_dynamo.variables.tensor import fake_arg

        return slice(*(fake_arg(i) for i in self.items))

    def getattr(self, tx: Tx, name: str) -> VariableTracker:
        if name in _SLICE_FIELDS:
            return self.items[_SLICE_FIELDS.index(name)]
        return super().getattr(tx, name)

    def reconstruct(self, cg: Reconstructor) -> str:
        return "slice(" + ", ".join(i.reconstruct(cg) for i in self.items) + ")"


_SLICE_FIELDS = ("start", "stop", "step")


class MethodVariable(VariableTracker):
    """`obj.name` for a method the tracker implements in `call_method`."""

    def __init__(self, obj: VariableTracker, name: str) -> None:
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"method {self.name} of {self.obj.describe()}"

    def call(
        self, tx: Tx, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> VariableTracker:
        return self.obj.call_method(tx, self.name, args, kwargs)

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{self.obj.reconstruct(cg)}.{self.name}"
