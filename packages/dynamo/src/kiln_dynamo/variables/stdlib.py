"""Standard-library values that model code reads: `os.environ` and the pure `os.path` functions.

`os.environ` is a mapping over the process environment whose Python implementation encodes
keys to bytes (`_Environ.__getitem__`), which the capture does not step through. It is modelled
as what the program sees: `os.environ.get(k)`, `os.environ[k]`, `k in os.environ` answer with
the value the variable has now, and each answer is a guard (`os.environ.get(k) == value`), so
setting or unsetting that variable later recompiles. Writing to the environment stays a break.

A NumPy function or ufunc called on constants folds when it returns a scalar. A
`functools.lru_cache` wrapper called with constants inlines the function it wraps. A
`weakref.ref` is called for its referent, which is then guarded through the source `ref()`.
`weakref.ref(obj)` made in the frame for an object from outside it is modelled too (Note [Weak
references made in the frame]).

Pure functions of their arguments (`os.path.join`, `os.path.basename`, `os.fspath`, ...) are
folded when every argument is a constant, as torch.compile folds them; with any other argument
the Python function is inlined as usual (a C one breaks). Functions that read the file system
(`os.path.exists`) are not pure and are not folded. A function marked as having a constant
result (`torch._dynamo.assume_constant_result`'s marker `_dynamo_marked_constant`, which
transformers sets on its install and hardware probes) is folded the same way: its contract is
that the answer is fixed for the process.
"""

from __future__ import annotations

import bisect
import heapq
import os
import posixpath
import re
import sys
import types
import weakref
from typing import TYPE_CHECKING, Any

import torch

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import Source
from kiln_dynamo.variables.base import (
    ConstantMethodVariable,
    ConstantVariable,
    MethodVariable,
    VariableTracker,
)

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
    | {bisect.bisect_left, bisect.bisect_right, heapq.nlargest, heapq.nsmallest}
    | {re.match, re.fullmatch, re.search, re.sub, re.subn, re.split, re.findall, re.compile, re.escape}
    | {sys.intern}
)
# Note [Device probes]: what the process's devices are never changes while it runs, so the
# functions that ask (`torch.cuda.get_device_capability(w.device) >= (8, 0)`, transformers'
# check before its grouped-GEMM experts; `get_device_properties(0).major`) are folded on constant
# arguments, as torch.compile folds them, without a guard; their C calls would otherwise break the
# graph inside every MoE layer on CUDA. A properties object is a frozen value (Note [Frozen
# values]): its plain attributes read as constants.
DEVICE_PROBES: frozenset[Any] = frozenset(
    {
        torch.cuda.get_device_capability, torch.cuda.get_device_properties, torch.cuda.get_device_name,
        torch.cuda.is_available, torch.cuda.device_count, torch.cuda.is_bf16_supported,
    }
)  # fmt: skip
# heapq/bisect functions that reorder or grow their list argument in place (C functions): run on
# the constant items of the list, which then holds the result (Note [Heaps of constants])
LIST_MUTATORS: frozenset[Any] = frozenset(
    {heapq.heapify, heapq.heappush, heapq.heappop, heapq.heapreplace, heapq.heappushpop}
    | {bisect.insort_left, bisect.insort_right}
)


def is_list_mutator(value: Any) -> bool:
    try:
        return value in LIST_MUTATORS
    except TypeError:  # unhashable
        return False


def _packaging_versions() -> list[Any]:
    """The `packaging.version` modules the program loaded (kiln_dynamo does not depend on
    packaging; torch vendors its own copy for `TorchVersion`)."""
    return [m for n in _VERSION_MODULES if (m := sys.modules.get(n)) is not None]


_VERSION_MODULES = ("packaging.version", "torch._vendor.packaging.version")


def is_pure_function(value: Any) -> bool:
    try:
        if value in PURE_FUNCTIONS or value in DEVICE_PROBES:
            return True
    except TypeError:  # unhashable
        return False
    # Note [Frozen values]: `version.parse(torch.__version__)` and `Version("2.0")`
    return any(
        value is getattr(m, "parse", None) or value is getattr(m, "Version", None)
        for m in _packaging_versions()
    )


# Note [Frozen values]: a compiled `re.Pattern`, a `re.Match` and a `packaging.version.Version`
# never change once made, and what model code reads from them is a pure function of the strings
# they were made from (`re.match(r"layer_(\d+)", name).group(1)`, transformers' and user code's
# `version.parse(torch.__version__) >= version.parse("2.0")`). The `re` functions above and
# `version.parse`/`Version` are folded on constant arguments, and the object they give is a
# constant: its methods in the table below fold on constant arguments, its listed attributes
# read as constants, and comparisons (`Version >= Version`) run for real at capture time. Such an
# object from outside the frame (a module-level `_PAT = re.compile(...)`, a parsed version kept
# in a global) is guarded on its type and `==` (a pattern compares its pattern string and flags,
# a version its parsed key, a match its identity). Anything else on them breaks with its name:
# `finditer`/`scanner` give iterators that are not constants, and a call with an argument that
# is not a constant (a callable `repl`, a string made from a tensor) keeps the break it had.
_FROZEN_METHODS: dict[str, frozenset[str]] = {
    "Pattern": frozenset({"match", "fullmatch", "search", "sub", "subn", "split", "findall"}),
    "Match": frozenset({"group", "groups", "groupdict", "start", "end", "span", "expand", "__getitem__"}),
    "Version": frozenset({"__str__", "__repr__", "__hash__"}),
    "DeviceProperties": frozenset(),
}
_FROZEN_ATTRS: dict[str, frozenset[str]] = {
    "Pattern": frozenset({"pattern", "flags", "groups"}),
    "Match": frozenset({"string", "re", "pos", "endpos", "lastindex", "lastgroup"}),
    "Version": frozenset(
        {"epoch", "release", "pre", "post", "dev", "local", "public", "base_version", "is_prerelease",
         "is_postrelease", "is_devrelease", "major", "minor", "micro"}
    ),
    "DeviceProperties": frozenset(
        {"name", "major", "minor", "total_memory", "multi_processor_count", "is_integrated",
         "is_multi_gpu_board", "warp_size", "max_threads_per_multi_processor", "L2_cache_size",
         "regs_per_multiprocessor", "shared_memory_per_block", "shared_memory_per_block_optin",
         "shared_memory_per_multiprocessor", "gcnArchName", "clock_rate", "memory_clock_rate",
         "memory_bus_width"}
    ),
}  # fmt: skip


def frozen_kind(value: Any) -> str | None:
    """Which row of the Note [Frozen values] tables `value` is (its exact type), else None."""
    t = type(value)
    if t is re.Pattern:
        return "Pattern"
    if t is re.Match:
        return "Match"
    if any(t is getattr(m, "Version", None) for m in _packaging_versions()):
        return "Version"
    if t is getattr(torch._C, "_CudaDeviceProperties", None):  # Note [Device probes]
        return "DeviceProperties"
    return None


class FrozenValueVariable(ConstantVariable):
    """A `re.Pattern`, `re.Match` or `packaging` `Version` (Note [Frozen values])."""

    __slots__ = ("kind",)

    def __init__(self, value: Any, kind: str, source: Source | None = None) -> None:
        super().__init__(value, source)
        self.kind = kind

    def describe(self) -> str:
        return f"{self.kind} {self.value!r}"

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in _FROZEN_METHODS[self.kind]:
            return ConstantMethodVariable(self, name)
        if name in _FROZEN_ATTRS[self.kind]:
            return tx.wrap_constant(getattr(self.value, name))
        raise Unsupported(f"attribute {name!r} of {self.kind} {self.value!r} (Note [Frozen values])")

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name not in _FROZEN_METHODS[self.kind]:
            raise Unsupported(f"method {name!r} of {self.kind} {self.value!r} (Note [Frozen values])")
        return ConstantMethodVariable(self, name).call(tx, args, kwargs)

    def iterate(self, tx: Tx) -> list[VT]:
        raise Unsupported(f"iterating over {self.kind} {self.value!r}")

    def getitem(self, tx: Tx, key: VT) -> VT:
        if self.kind != "Match":
            raise Unsupported(f"indexing {self.kind} {self.value!r}")
        return super().getitem(tx, key)


class _CallableVariable(VariableTracker):
    """A standard-library (or NumPy) callable reached from the frame: what its variables share
    (the function, where it came from, its type and identity, and how the frame gets it back)."""

    def __init__(self, fn: Any, source: Source | None) -> None:
        self.fn = fn
        self.source = source

    def python_type(self) -> type:
        return type(self.fn)

    def identity(self) -> object:
        return self.fn

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.source) if self.source is not None else cg.const(self.fn)


class PureFunctionVariable(_CallableVariable):
    """A pure standard-library function: folded on constant arguments, else inlined."""

    def describe(self) -> str:
        return f"function {getattr(self.fn, '__module__', '?')}.{self.fn.__name__}"

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.fn

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
        from kiln_dynamo.variables.user_defined import UserClassVariable

        if isinstance(self.fn, type):
            return UserClassVariable(self.fn, None).call(tx, args, kwargs)
        if hasattr(self.fn, "__code__"):
            return UserFunctionVariable(self.fn, None).call(tx, args, kwargs)
        return OpaqueCallableVariable(self.fn, None).call(tx, args, kwargs)


class ListMutatorVariable(VariableTracker):
    """Note [Heaps of constants]: `heapq.heappush(h, (score, i))`, `bisect.insort(l, v)` on a list
    whose items are constants (a beam's scores, an LR schedule's milestones) run for real on a
    copy of those items; the list's tracker then holds what the call left in it (a list from
    outside the frame is rewritten after the graph, as any mutated list). Other lists break."""

    def __init__(self, fn: Any, source: Source | None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__name__}"

    def identity(self) -> object:
        return self.fn

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.source) if self.source is not None else cg.const(self.fn)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln_dynamo.variables.lists import ListVariable

        rest = [*args[1:], *kwargs.values()]
        if not args or type(args[0]) is not ListVariable or not all(a.is_constant() for a in rest):
            raise Unsupported(f"{self.describe()} on something other than a list of constants")
        target = args[0]
        if not all(i.is_constant() for i in target.items):
            raise Unsupported(f"{self.describe()} on a list that holds values other than constants")
        real = [i.as_constant() for i in target.items]
        try:
            out = self.fn(
                real, *[a.as_constant() for a in args[1:]], **{k: v.as_constant() for k, v in kwargs.items()}
            )
        except Exception as e:
            raise Unsupported(f"{self.describe()} raised {type(e).__name__}: {e}") from e
        target._mutate(tx)
        target.items = [tx.wrap_constant(v) for v in real]
        return tx.wrap_constant(out)


# Note [namedtuple made in the frame]: `P = collections.namedtuple("P", "a b")` inside a forward
# builds its class with `sys._getframe`, `eval` and `type(...)`, which the capture cannot step
# through. With constant arguments the call is made for real once, while tracing (as
# torch.compile does), with `module=` set to the calling frame's `__name__` as namedtuple itself
# would read it; the compiled code then uses that one class on every call. Instances behave as
# eager's (fields, indexing, `_fields`, `_asdict`, repr, equality with tuples); what differs is
# only that eager makes a new class per call, so `type(f(x)) is type(f(y))` is True compiled and
# False in eager — the same trade torch.compile makes. A field list or name that is not a
# constant breaks, and an invalid one raises the same error as eager at trace time, which breaks.
class NamedTupleFactoryVariable(_CallableVariable):
    """`collections.namedtuple` (Note [namedtuple made in the frame])."""

    def describe(self) -> str:
        return "collections.namedtuple"

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.fn

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln_dynamo.variables.user_defined import UserClassVariable

        if not all(a.is_constant() for a in [*args, *kwargs.values()]):
            raise Unsupported("collections.namedtuple called with a name or fields that are not constants")
        kw = {k: v.as_constant() for k, v in kwargs.items()}
        kw.setdefault("module", getattr(tx, "f_globals", {}).get("__name__", "__main__"))
        try:
            cls = self.fn(*[a.as_constant() for a in args], **kw)
        except Exception as e:
            raise Unsupported(f"collections.namedtuple raised {type(e).__name__}: {e}") from e
        tx.output.builder.keepalive.append(cls)
        return UserClassVariable(cls, None)


def is_python_rng_method(value: Any) -> bool:
    """A method of a `random.Random` (the `random` module's functions are those of its hidden
    instance: `random.seed`, `random.random`, `random.uniform`, ...)."""
    import random

    return isinstance(value, (types.MethodType, types.BuiltinMethodType)) and isinstance(
        getattr(value, "__self__", None), random.Random
    )


class PythonRngCallVariable(_CallableVariable):
    """Note [Python's random module]: `random.seed(0)`, `random.random()`, `rng.uniform(a, b)` read
    or set the state of a `random.Random` (the `random` module's hidden one, for its functions).
    No graph carries that state, and folding a draw at capture time would replay one number on
    every call, so each call is one clean break at the call: CPython runs it on the real
    generator, in program order (a seed before a draw stays before it), and the frame resumes
    after it with the result. torch.compile draws module-level values before its graph instead;
    kiln does not (a seed in the same frame would then come after the draw)."""

    def describe(self) -> str:
        return f"random.{getattr(self.fn, '__name__', '?')}"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        raise Unsupported(
            f"{self.describe()}() uses the state of Python's random number generator, which no graph "
            "carries (Note [Python's random module]); the call runs in Python",
            advice="draw the number outside the compiled function, or use torch's generator",
        )


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


class WeakrefVariable(VariableTracker):
    """A `weakref.ref` from outside the frame (nn.RNN's `_flat_weight_refs`): calling it gives
    its referent, read through the source `ref()`, so the referent is guarded like any value
    (a tensor's properties, `is None` once it died)."""

    def __init__(self, ref: weakref.ref[Any], source: Source | None) -> None:
        self.ref = ref
        self.source = source

    def describe(self) -> str:
        return "weak reference"

    def python_type(self) -> type:
        return type(self.ref)

    def identity(self) -> object:
        return self.ref

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if args or kwargs:
            raise Unsupported("calling a weak reference with arguments")
        from kiln_dynamo.source import WeakrefCallSource

        return tx.wrap(self.ref(), WeakrefCallSource(self.source) if self.source is not None else None)


class LruCacheVariable(VariableTracker):
    """A `functools.lru_cache`/`cache` wrapper (transformers' `is_torch_distributed_available`).
    Called with constant arguments, its `__wrapped__` function is inlined (pinned with its code):
    what it reads is guarded as in any inlined call, so the answer holds while those guards do,
    which is what the cache assumes too. Other arguments (a tensor is unhashable in eager) break."""

    def __init__(self, wrapper: Any, source: Source | None) -> None:
        self.wrapper = wrapper
        self.source = source

    def describe(self) -> str:
        return f"lru_cache of {getattr(self.wrapper, '__qualname__', '?')}"

    def python_type(self) -> type:
        return type(self.wrapper)

    def identity(self) -> object:
        return self.wrapper

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln_dynamo.source import AttrSource

        if not all(a.is_constant() for a in [*args, *kwargs.values()]):
            raise Unsupported(f"{self.describe()} called with arguments that are not constants")
        src = AttrSource(self.source, "__wrapped__") if self.source is not None else None
        return tx.wrap(self.wrapper.__wrapped__, src).call(tx, args, kwargs)


def is_numpy_callable(value: Any) -> bool:
    """A NumPy function or ufunc (numpy is looked up only if the program loaded it: kiln_dynamo
    does not depend on it)."""
    np = sys.modules.get("numpy")
    if np is None or isinstance(value, type):
        return False
    if isinstance(value, np.ufunc):
        return True
    mod = getattr(value, "__module__", None) or ""
    return callable(value) and mod.split(".")[0] == "numpy"


class NumpyFoldVariable(_CallableVariable):
    """A NumPy function called on constants (`np.sqrt(d)`, `np.log(2)`), folded when it returns a
    scalar; with a tensor or an array result it breaks (kiln does not trace NumPy as tensor ops)."""

    def describe(self) -> str:
        return f"numpy.{getattr(self.fn, '__name__', '?')}"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln_dynamo.variables.ndarray import NdarrayVariable, ndarray_ufunc

        if any(isinstance(a, NdarrayVariable) for a in [*args, *kwargs.values()]):
            return ndarray_ufunc(tx, self.fn, args, kwargs)  # Note [NumPy round trips]
        if not all(a.is_constant() for a in [*args, *kwargs.values()]):
            raise Unsupported(f"{self.describe()} called with values that are not constants")
        try:
            out = self.fn(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
        except Exception as e:
            raise Unsupported(f"{self.describe()} raised {type(e).__name__}: {e}") from e
        if not isinstance(out, (bool, int, float, complex)):
            raise Unsupported(f"{self.describe()} returned {type(out).__name__}, not a Python scalar")
        return ConstantVariable(out)


# Note [Weak references made in the frame]: `weakref.ref(obj)` (torch's `RemovableHandle` takes one
# of the module's hook dict when a forward hook is registered) is modelled when `obj` came from
# outside the frame (its tracker has a source): something outside holds it for the whole call, so
# calling the reference inside the frame gives `obj` itself, as eager's does, and a reference that
# leaves the frame is rebuilt by the runner as `weakref.ref(<obj>)`, which CPython answers with the
# same reference object eager made (without a callback a referent has one shared plain reference).
# Two references to one source are one tracker (`weakref.ref(o) is weakref.ref(o)` holds, as in
# eager). What is not modelled is a break with its reason: a callback; an object made in the frame
# (whether a reference to it is dead depends on the frame's reference counts: `del o; r()`); a type
# that refuses weak references (CPython raises TypeError there); comparing such a reference with
# `is` against one read from outside.
def new_weakref(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    if kwargs or len(args) != 1:
        raise Unsupported("weakref.ref with a callback inside a compiled frame")
    (referent,) = args
    source = getattr(referent, "source", None)
    if source is None:
        raise Unsupported(
            f"weakref.ref of {referent.describe()}, made in the frame: whether the reference dies "
            "depends on the frame's reference counts"
        )
    cls = referent.python_type()
    if not getattr(cls, "__weakrefoffset__", 0):
        raise Unsupported(f"weakref.ref of a {cls.__qualname__}, which does not support weak references")
    # the type read here is guarded already: wrapping a value with a source guards its type
    memo = tx.output.new_weakrefs
    if source not in memo:
        memo[source] = NewWeakrefVariable(referent)
    return memo[source]


class NewWeakrefVariable(VariableTracker):
    """`weakref.ref(obj)` made in the frame for an object from outside (Note [Weak references
    made in the frame])."""

    def __init__(self, referent: VT) -> None:
        self.referent = referent

    def describe(self) -> str:
        return f"new weak reference to {self.referent.describe()}"

    def python_type(self) -> type:
        return weakref.ref

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if args or kwargs:
            raise Unsupported("calling a weak reference with arguments")
        return self.referent

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{cg.const(weakref.ref)}({self.referent.reconstruct(cg)})"
