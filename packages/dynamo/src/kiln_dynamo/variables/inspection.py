"""`inspect.signature` of a known function, folded at trace time, and read-only mappings.

Library code checks a callback's arity with `len(inspect.signature(fn).parameters)`
(transformers' `apply_chunking_to_forward`). Tracing `inspect.signature` itself would walk
`inspect.unwrap` (`id()` bookkeeping) and a dozen C helpers, so a call on a function the capture
knows (a real Python function, or one bound as a method) is computed once, while tracing, on the
real function: the result depends only on the function, its code, defaults and annotations, which
the capture already takes as they are when it inlines the function (its identity is guarded where
it has a source; its defaults are guarded here as when it is called). The `Signature` and its
`Parameter`s are immutable, so their trackers answer attribute reads from the real objects.

`MappingProxyVariable` is a read-only view of a dict (`Signature.parameters`, a class's
`__dict__`): a `DictVariable` that refuses mutation and reports its real type.
"""

from __future__ import annotations

import enum
import inspect
import types
from typing import TYPE_CHECKING, Any

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import AttrSource
from kiln_dynamo.variables.base import VariableTracker
from kiln_dynamo.variables.dicts import DictVariable

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker


class MappingProxyVariable(DictVariable):
    """`types.MappingProxyType`: a dict's read protocol, no mutation (the real one raises)."""

    def __init__(self, items: Any, source: Any = None, real: types.MappingProxyType[Any, Any] | None = None):
        super().__init__(items, dict, source)
        self.real = real  # the real mapping, when it was made while tracing (to rebuild it)

    def describe(self) -> str:
        return f"mappingproxy with keys {list(self._items)!r}"

    def python_type(self) -> type:
        return types.MappingProxyType

    def as_constant(self) -> Any:
        return types.MappingProxyType(super().as_constant())

    def _mutate(self, tx: Tx) -> None:
        raise Unsupported("mutating a mappingproxy (it raises TypeError)")

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.source is not None:
            return cg.source(self.source)
        if self.real is not None:
            return cg.const(self.real)
        return f"{cg.const(types.MappingProxyType)}({super().reconstruct(cg)})"


def _attr_value(tx: Tx, value: Any, what: str) -> VT:
    """An attribute of a Signature or Parameter: constants, `Parameter.empty`, parameter kinds."""
    from kiln_dynamo.variables.builder import is_constant_value

    if value is inspect.Parameter.empty or isinstance(value, (type, enum.Enum)) or is_constant_value(value):
        return tx.wrap(value, None)
    raise Unsupported(f"{what} is a {type(value).__qualname__}, not a constant")


class ParameterVariable(VariableTracker):
    def __init__(self, param: inspect.Parameter) -> None:
        self.param = param

    def describe(self) -> str:
        return f"inspect.Parameter {self.param}"

    def python_type(self) -> type:
        return inspect.Parameter

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in ("name", "kind", "default", "annotation"):
            return _attr_value(tx, getattr(self.param, name), f"{self.param.name}.{name}")
        if name == "empty":
            return tx.wrap(inspect.Parameter.empty, None)
        return super().getattr(tx, name)

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.const(self.param)


class SignatureVariable(VariableTracker):
    def __init__(self, sig: inspect.Signature) -> None:
        self.sig = sig

    def describe(self) -> str:
        return f"inspect.Signature {self.sig}"

    def python_type(self) -> type:
        return inspect.Signature

    def getattr(self, tx: Tx, name: str) -> VT:
        if name == "parameters":
            params = {k: ParameterVariable(p) for k, p in self.sig.parameters.items()}
            return MappingProxyVariable(params, real=self.sig.parameters)
        if name == "return_annotation":
            return _attr_value(tx, self.sig.return_annotation, "return annotation")
        if name == "empty":
            return tx.wrap(inspect.Signature.empty, None)
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.const(self.sig)


def fold_signature(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """`inspect.signature(fn)` for a real Python function or a method bound to one."""
    from kiln_dynamo.variables.functions import BoundMethodVariable, UserFunctionVariable

    if len(args) != 1 or kwargs:
        raise Unsupported("inspect.signature with options")
    target = args[0]
    fn = target.fn if isinstance(target, BoundMethodVariable) else target
    if not isinstance(fn, UserFunctionVariable):
        raise Unsupported(f"inspect.signature of {target.describe()}")
    real = fn.fn
    if "__wrapped__" in vars(real) or "__signature__" in vars(real):
        raise Unsupported(
            f"inspect.signature of {target.describe()}, a wrapper (its __wrapped__ is not guarded)"
        )
    if fn.source is not None:  # what the signature shows of the function: every default
        tx.wrap(real.__defaults__, AttrSource(fn.source, "__defaults__"))  # type, length, items
        kwdefaults = tx.wrap(real.__kwdefaults__, AttrSource(fn.source, "__kwdefaults__"))
        if isinstance(kwdefaults, DictVariable):
            kwdefaults.items  # noqa: B018  (every value, guarded: Note [Lazy dict entries])
    try:
        # A bound method's signature is its function's without the first parameter; the object
        # it is bound to plays no part.
        sig = inspect.signature(types.MethodType(real, object()) if fn is not target else real)
    except (TypeError, ValueError) as e:
        raise Unsupported(f"inspect.signature of {target.describe()} raised {type(e).__name__}") from e
    return SignatureVariable(sig)


# Python functions whose calls are answered while tracing instead of being inlined.
FOLDED_CALLS = {inspect.signature: fold_signature}
