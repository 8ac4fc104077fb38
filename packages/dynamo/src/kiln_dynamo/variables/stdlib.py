"""Standard-library values that model code reads: `os.environ` and the pure `os.path` functions.

`os.environ` is a mapping over the process environment whose Python implementation encodes
keys to bytes (`_Environ.__getitem__`), which the capture does not step through. It is modelled
as what the program sees: `os.environ.get(k)`, `os.environ[k]`, `k in os.environ` answer with
the value the variable has now, and each answer is a guard (`os.environ.get(k) == value`), so
setting or unsetting that variable later recompiles. Writing to the environment stays a break.

Pure functions of their arguments (`os.path.join`, `os.path.basename`, `os.fspath`, ...) are
folded when every argument is a constant, as torch.compile folds them; with any other argument
the Python function is inlined as usual (a C one breaks). Functions that read the file system
(`os.path.exists`) are not pure and are not folded.
"""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING, Any

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import Source
from kiln_dynamo.variables.base import ConstantVariable, MethodVariable, VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker

_PURE_PATH_NAMES = (
    "join", "basename", "dirname", "split", "splitext", "splitdrive", "normpath", "normcase",
    "isabs", "commonprefix", "commonpath",
)  # fmt: skip
PURE_FUNCTIONS: frozenset[Any] = frozenset(
    {getattr(posixpath, n) for n in _PURE_PATH_NAMES}
    | {getattr(os.path, n) for n in _PURE_PATH_NAMES}
    | {os.fspath, os.fsencode, os.fsdecode}
)


def is_pure_function(value: Any) -> bool:
    try:
        return value in PURE_FUNCTIONS
    except TypeError:  # unhashable
        return False


class PureFunctionVariable(VariableTracker):
    """A pure standard-library function: folded on constant arguments, else inlined."""

    def __init__(self, fn: Any, source: Source | None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"function {getattr(self.fn, '__module__', '?')}.{self.fn.__name__}"

    def python_type(self) -> type:
        return type(self.fn)

    def identity(self) -> object:
        return self.fn

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.fn

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.source) if self.source is not None else cg.const(self.fn)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if all(a.is_constant() for a in [*args, *kwargs.values()]):
            try:
                out = self.fn(
                    *[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()}
                )
            except Exception as e:
                raise Unsupported(f"{self.describe()} raised {type(e).__name__}: {e}") from e
            return tx.wrap_constant(out)
        from kiln_dynamo.variables.functions import UserFunctionVariable
        from kiln_dynamo.variables.opaque import OpaqueCallableVariable

        if hasattr(self.fn, "__code__"):
            return UserFunctionVariable(self.fn, None).call(tx, args, kwargs)
        return OpaqueCallableVariable(self.fn, None).call(tx, args, kwargs)


class EnvironVariable(VariableTracker):
    """`os.environ`, read through its mapping methods; each read is guarded on its answer."""

    def __init__(self, environ: Any, source: Source | None) -> None:
        self.environ = environ
        self.source = source

    def describe(self) -> str:
        return "os.environ"

    def python_type(self) -> type:
        return type(self.environ)

    def identity(self) -> object:
        return self.environ

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.source) if self.source is not None else cg.const(self.environ)

    def _key(self, vt: VT) -> str:
        if not vt.is_constant() or not isinstance(vt.as_constant(), str):
            raise Unsupported(f"os.environ read with the key {vt.describe()}, not a constant string")
        key: str = vt.as_constant()
        return key

    def _read(self, tx: Tx, key: str) -> str | None:
        value: str | None = self.environ.get(key)
        guards = tx.output.guards
        env = guards.ctx.const(self.environ)
        if value is None:
            guards.add(f"{env}.get({key!r}) is None", f"os.environ has no {key!r}")
        else:
            guards.add(f"{env}.get({key!r}) == {value!r}", f"os.environ[{key!r}] == {value!r}")
        return value

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in ("get", "__getitem__", "__contains__", "keys", "items", "values", "copy"):
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of os.environ")

    def contains(self, tx: Tx, item: VT) -> bool:
        key = self._key(item)
        present = key in self.environ
        env = tx.output.guards.ctx.const(self.environ)
        tx.output.guards.add(
            f"({key!r} in {env}) is {present}", f"{key!r} {'in' if present else 'not in'} os.environ"
        )
        return present

    def getitem(self, tx: Tx, key: VT) -> VT:
        k = self._key(key)
        value = self._read(tx, k)
        if value is None:
            raise Unsupported(f"KeyError {k!r} raised by os.environ inside a compiled frame")
        return ConstantVariable(value)

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name == "get" and 1 <= len(args) <= 2 and not kwargs:
            value = self._read(tx, self._key(args[0]))
            if value is None:
                return args[1] if len(args) == 2 else ConstantVariable(None)
            return ConstantVariable(value)
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(self.contains(tx, args[0]))
        raise Unsupported(f"os.environ.{name}() inside a compiled frame (it reads the whole environment)")
