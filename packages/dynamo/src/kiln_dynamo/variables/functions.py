"""Python functions, closures, lambdas, bound methods and functools.partial: all inlined.

Calling a function tracker binds the arguments to the code's parameters (`bind_args`, the same
rules as CPython: positional-only, defaults, *args, keyword-only, **kwargs) and runs an inlining
translator over the function's code with its own locals, cells and globals, writing into the
same graph. Functions come in two kinds: `UserFunctionVariable` wraps a real function object
(its defaults and closure cells are real values, read through sources so that they are guarded)
and `NestedFunctionVariable` is a function created by MAKE_FUNCTION inside the traced frames
(its defaults and cells are trackers).
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.logs import decisions_log
from kiln_dynamo.source import AttrSource, ConstSource, GetItemSource, Source
from kiln_dynamo.stand_ins import STAND_INS_FILE, stand_in_for
from kiln_dynamo.variables.base import CellVariable, ConstantVariable, VariableTracker
from kiln_dynamo.variables.dicts import DictVariable, LazyEntry
from kiln_dynamo.variables.inspection import FOLDED_CALLS
from kiln_dynamo.variables.lists import TupleVariable
from kiln_dynamo.variables.torch import trace_checkpoint

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker

CO_VARARGS = inspect.CO_VARARGS
CO_VARKEYWORDS = inspect.CO_VARKEYWORDS


def bind_args(
    code: types.CodeType,
    args: list[VT],
    kwargs: dict[str, VT],
    defaults: Sequence[VT | LazyEntry],
    kwdefaults: Mapping[str, VT | LazyEntry],
) -> dict[str, VT]:
    """Locals of a new frame of `code` called with these arguments (CPython's binding rules).
    A default is wrapped (and guarded) only when its parameter is not passed."""
    name = code.co_name
    nargs = code.co_argcount
    nkw = code.co_kwonlyargcount
    names = code.co_varnames
    pos_names = names[:nargs]
    kwonly = names[nargs : nargs + nkw]
    out: dict[str, VT] = {}
    extra_pos = args[nargs:]
    for n, a in zip(pos_names, args, strict=False):
        out[n] = a
    idx = nargs + nkw
    if code.co_flags & CO_VARARGS:
        out[names[idx]] = TupleVariable(list(extra_pos))
        idx += 1
    elif extra_pos:
        raise Unsupported(f"{name}() takes {nargs} positional arguments but {len(args)} were given")
    extra_kw: dict[str, VT] = {}
    for k, v in kwargs.items():
        if k in pos_names[code.co_posonlyargcount :] or k in kwonly:
            if k in out:
                raise Unsupported(f"{name}() got multiple values for argument {k!r}")
            out[k] = v
        else:
            extra_kw[k] = v
    if code.co_flags & CO_VARKEYWORDS:
        out[names[idx]] = DictVariable(dict(extra_kw.items()))
    elif extra_kw:
        raise Unsupported(f"{name}() got an unexpected keyword argument {next(iter(extra_kw))!r}")
    first_default = nargs - len(defaults)
    for i, n in enumerate(pos_names):
        if n not in out:
            if i >= first_default:
                out[n] = _realized(defaults[i - first_default])
            else:
                raise Unsupported(f"{name}() missing required argument {n!r}")
    for n in kwonly:
        if n not in out:
            if n in kwdefaults:
                out[n] = _realized(kwdefaults[n])
            else:
                raise Unsupported(f"{name}() missing required keyword-only argument {n!r}")
    return out


def _realized(v: VT | LazyEntry) -> VT:
    return v.realize() if isinstance(v, LazyEntry) else v


class BaseFunctionVariable(VariableTracker):
    def python_type(self) -> type:
        return types.FunctionType

    def get_code(self) -> types.CodeType:
        raise NotImplementedError

    def truth(self, tx: Tx) -> bool:
        return True  # a function is always true (`if validator := TABLE.get(key):`)


class UserFunctionVariable(BaseFunctionVariable):
    """A real Python function, inlined when called."""

    def __init__(self, fn: types.FunctionType, source: Source | None = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"function {self.fn.__qualname__}"

    def identity(self) -> object:
        return self.fn

    def get_code(self) -> types.CodeType:
        return self.fn.__code__

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.source) if self.source is not None else cg.const(self.fn)

    def _src(self) -> Source:
        return self.source if self.source is not None else ConstSource(self.fn, self.fn.__qualname__)

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__code__"):
            return ConstantVariable(getattr(self.fn, name))
        if (
            name in ("__annotations__", "__dict__")
            or (
                name == "__type_params__" and hasattr(self.fn, name)  # 3.12: what `functools.wraps` reads
            )
            or (not name.startswith("__") and name in getattr(self.fn, "__dict__", {}))
        ):
            # read through its source, so guarded as any value is (`functools.wraps(outside_fn)`
            # reads the first two; a flag set on a function, `fn._is_hook`, the last)
            return tx.wrap(getattr(self.fn, name), AttrSource(self._src(), name))
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        fn = self.fn
        if fn is _checkpoint():
            return trace_checkpoint(tx, args, kwargs)  # Note [Activation checkpointing]
        if fn in FOLDED_CALLS:
            return FOLDED_CALLS[fn](tx, args, kwargs)
        stand_in = stand_in_for(fn)
        if stand_in is not None and tx.code.co_filename != STAND_INS_FILE:
            # Note [Stand-ins for torch's higher-order functions]; the stand-in's own fallback
            # call of `fn` is traced as `fn`
            decisions_log.info("%s.%s traced as kiln's stand-in", fn.__module__, fn.__qualname__)
            return UserFunctionVariable(stand_in, None).call(tx, args, kwargs)  # type: ignore[arg-type]
        src = self._src()
        # Read from the end: parameter i's default is __defaults__[i - co_argcount] whatever the
        # tuple's length, so guarding only the defaults used stays exact.
        n = len(fn.__defaults__ or ())
        defaults = [
            LazyEntry(v, GetItemSource(AttrSource(src, "__defaults__"), i - n), tx.wrap)
            for i, v in enumerate(fn.__defaults__ or ())
        ]
        kwdefaults = {
            k: LazyEntry(v, GetItemSource(AttrSource(src, "__kwdefaults__"), k), tx.wrap)
            for k, v in (fn.__kwdefaults__ or {}).items()
        }
        bound = bind_args(fn.__code__, args, kwargs, defaults, kwdefaults)
        cells: list[CellVariable] = []
        for i, cell in enumerate(fn.__closure__ or ()):
            known = tx.output.known_cell(cell)
            if known is not None:  # a frame's cell, also while still empty (a class's own name
                cells.append(known)  # in its methods: Note [Class definitions in the frame])
                continue
            try:
                contents = cell.cell_contents
            except ValueError:
                cells.append(CellVariable(None))
                continue
            cells.append(
                tx.output.real_cell(cell, lambda c=contents, i=i: tx.wrap(c, _closure_source(src, i)))
            )
        return tx.inline_call(
            fn.__code__, fn.__globals__, bound, cells, self.describe(), (self, args, kwargs)
        )


def passes_result(fn: VT) -> bool:
    """Whether calling `fn` inlines one frame whose return value is the call's result, with
    nothing of kiln's modelling before or after it (Note [Resuming a chain of frames] in
    breaks.py): plain and nested functions, methods of them, and modules without hooks whose
    `__call__` is Module's (their `forward` is that frame)."""
    from torch import nn

    from kiln_dynamo.variables.nn_module import NNModuleVariable

    if type(fn) is BoundMethodVariable:
        fn = fn.fn
    if type(fn) is UserFunctionVariable:
        return fn.fn is not _checkpoint() and fn.fn not in FOLDED_CALLS
    if type(fn) is NestedFunctionVariable:
        return True
    if type(fn) is NNModuleVariable:
        m = fn.module
        hooks = m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        return not hooks and inspect.getattr_static(type(m), "__call__") is nn.Module.__call__
    return False


def _closure_source(fn_source: Source, index: int) -> Source:
    from kiln_dynamo.source import ClosureSource

    return ClosureSource(fn_source, index)


# Note [Attributes of a function made in the frame]: `functools.wraps(f)(w)` (a decorator
# defined or applied inside a forward) reads `__module__`, `__name__`, `__qualname__`, `__doc__`,
# `__annotations__` and `__dict__` of the wrapped function and sets them, and `__wrapped__`, on
# the wrapper; user code sets flags on functions too (`fn._is_hook = True`). A function made in
# the frame never leaves it as a real function object (it has no way to be rebuilt), so its
# attributes live on its tracker: the slot attributes as CPython's function object answers them
# (`__doc__` is the code's first constant when it is a string, `__module__` its globals'
# `__name__`) until the frame sets them, everything else in its own `__dict__` dict, which
# `getattr(f, "__dict__").update(...)` mutates in place. `__code__`, `__defaults__`,
# `__closure__` and `__globals__` stay a break (nothing here tracks writes to them), and a
# missing attribute raises AttributeError, as eager does (`getattr(f, "x", d)`, `hasattr`).
_FUNCTION_SLOTS = frozenset({"__code__", "__defaults__", "__kwdefaults__", "__closure__", "__globals__"})


class NestedFunctionVariable(BaseFunctionVariable):
    """A function (def, lambda, comprehension) created inside the traced frames."""

    def __init__(
        self,
        code: types.CodeType,
        f_globals: dict[str, Any],
        defaults: list[VT],
        kwdefaults: dict[str, VT],
        closure: list[CellVariable],
        qualname: str,
        annotations: VT | None = None,
    ) -> None:
        self.code = code
        self.f_globals = f_globals
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure
        self.qualname = qualname
        self.annotations = annotations
        # Note [Attributes of a function made in the frame]
        self.slots: dict[str, VT] = {}
        self.fdict: DictVariable | None = None

    def describe(self) -> str:
        return f"function {self.qualname}"

    def get_code(self) -> types.CodeType:
        return self.code

    def _dict(self) -> DictVariable:
        if self.fdict is None:
            self.fdict = DictVariable({})
        return self.fdict

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in self.slots:
            return self.slots[name]
        if name == "__name__":
            return ConstantVariable(self.code.co_name)
        if name == "__qualname__":
            return ConstantVariable(self.qualname)
        if name == "__module__":
            return tx.wrap_constant(self.f_globals.get("__name__"))
        if name == "__doc__":  # what CPython's function constructor takes as the docstring
            consts = self.code.co_consts
            return ConstantVariable(consts[0] if consts and isinstance(consts[0], str) else None)
        if name == "__annotations__":
            self.slots[name] = self._annotations(tx)
            return self.slots[name]
        if name == "__dict__":
            return self._dict()
        if name == "__type_params__" and sys.version_info >= (3, 12):
            return tx.wrap_constant(())  # MAKE_FUNCTION's; a generic `def f[T]` sets them after
        if name in _FUNCTION_SLOTS or (
            name.startswith("__") and name.endswith("__") and name != "__wrapped__"
        ):
            raise Unsupported(f"attribute {name!r} of {self.describe()}")
        if self.fdict is not None and name in self.fdict.items:
            return self.fdict.entry(name)
        raise AttributeError(f"'function' object has no attribute {name!r}")

    def _annotations(self, tx: Tx) -> VT:
        if self.annotations is None:
            return DictVariable({})
        flat = self.annotations.iterate(tx)  # (name, value, name, value, ...) as MAKE_FUNCTION gets it
        if not all(k.is_constant() and isinstance(k.as_constant(), str) for k in flat[::2]):
            raise Unsupported(f"annotations of {self.describe()} with a name that is not a string")
        return DictVariable({k.as_constant(): v for k, v in zip(flat[::2], flat[1::2], strict=True)})

    def setattr(self, tx: Tx, name: str, value: VT) -> None:
        what = f"setting attribute {name!r} on {self.describe()}"
        if name in ("__name__", "__qualname__"):
            if not (value.is_constant() and isinstance(value.as_constant(), str)):
                raise Unsupported(f"{what}: not a constant string")
            self.slots[name] = value
        elif name in ("__module__", "__doc__"):
            self.slots[name] = value
        elif name == "__type_params__" and sys.version_info >= (3, 12):
            # what `functools.wraps` copies under 3.12; CPython takes only a tuple
            if not (isinstance(value, TupleVariable) and value.is_constant()):
                raise Unsupported(f"{what}: not a constant tuple")
            self.slots[name] = value
        elif name == "__annotations__":
            if not isinstance(value, DictVariable) or value.user_cls is not dict:
                raise Unsupported(f"{what}: not a dict")
            self.slots[name] = value
        elif (
            name in _FUNCTION_SLOTS
            or name == "__dict__"
            or (name.startswith("__") and name.endswith("__") and name != "__wrapped__")
        ):
            raise Unsupported(what)
        else:
            d = self._dict()
            d.items = {**d.items, name: value}

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        bound = bind_args(self.code, args, kwargs, self.defaults, self.kwdefaults)
        return tx.inline_call(
            self.code, self.f_globals, bound, self.closure, self.describe(), (self, args, kwargs)
        )

    def escape_children(self) -> list[VT]:
        """What its rebuild reads (Note [Functions made in the frame that leave it])."""
        return [*self.defaults, *self.kwdefaults.values(), *(c.contents for c in self.closure if c.contents)]

    def reconstruct(self, cg: Reconstructor) -> str:
        # Note [Functions made in the frame that leave it]
        bound = cg.bound(self)
        if bound is not None:
            return bound
        what = f"{self.describe()}, made in the frame, leaving it"
        if self.slots or self.fdict is not None:
            raise Unsupported(f"{what}: it was given attributes")
        if len(self.closure) != len(self.code.co_freevars):
            raise Unsupported(f"{what}: closure does not match its free variables")
        if _writes_free_vars(self.code):
            raise Unsupported(f"{what}: it rebinds a variable of an enclosing function (nonlocal)")
        if getattr(self, "_rebuilding", False):
            raise Unsupported(f"{what}: its closure refers to itself")
        self._rebuilding = True
        try:
            cells = []
            for name, cell in zip(self.code.co_freevars, self.closure, strict=True):
                if not (getattr(cell, "closed", False) or (getattr(cell, "root_cell", False) and cg.final)):
                    raise Unsupported(
                        f"{what}: its free variable {name!r} belongs to a function still running after "
                        "the compiled code (its later value would not reach the rebuilt function)"
                    )
                cells.append("None" if cell.contents is None else _escaping_value(cell.contents, cg, what))
            annotations = "None"
            if self.annotations is not None:
                flat = self.annotations.items if isinstance(self.annotations, TupleVariable) else None
                if flat is None or not all(v.is_constant() for v in flat):
                    raise Unsupported(f"{what}: its annotations are not constants")
                annotations = cg.const(tuple(v.as_constant() for v in flat))
            empty = tuple(i for i, c in enumerate(self.closure) if c.contents is None)
            defaults = "".join(_escaping_value(d, cg, what) + ", " for d in self.defaults)
            kwdefaults = ", ".join(
                f"{k!r}: {_escaping_value(v, cg, what)}" for k, v in self.kwdefaults.items()
            )
            return (
                f"{cg.const(make_function)}({cg.const(self.code)}, {cg.const(self.f_globals)}, "
                f"{self.qualname!r}, ({defaults}), {{{kwdefaults}}}, ({''.join(c + ', ' for c in cells)}), "
                f"{empty!r}, {annotations})"
            )
        finally:
            self._rebuilding = False


# Note [Functions made in the frame that leave it]: a function a `def` or `lambda` made inside
# the traced frames may leave them (returned, stored, or registered as a module hook: Note
# [Module hooks registered in the frame]); the runner builds it again from its code, globals,
# defaults and closure, once (Note [One object, one rebuild]). Its closure is the subtle part:
# a rebuilt function gets fresh cells holding the values the variables had when the traced code
# ended, which is what eager's function sees only if nothing writes those variables later. So
# each cell must belong to a function that returned while tracing: an inlined call (its cells
# marked `closed` by the inliner when it returns) or the frame itself when the runner ends it
# (not a split, after which the frame's code goes on); a frame still running after a split, a
# generator's or a real function's cells are refused. The function must not rebind one
# (`nonlocal`), and
# each value must be rebuilt as the same object eager holds: a constant, an object read from
# outside (its source), or another such function. Anything else stays a clean refusal.
def _writes_free_vars(code: types.CodeType) -> bool:
    import dis

    free = set(code.co_freevars)
    return any(
        i.opname in ("STORE_DEREF", "DELETE_DEREF") and i.argval in free for i in dis.get_instructions(code)
    )


def _escaping_value(vt: VT, cg: Reconstructor, what: str) -> str:
    immutable = isinstance(vt, ConstantVariable) or (isinstance(vt, TupleVariable) and vt.is_constant())
    if immutable or vt.source is not None or isinstance(vt, NestedFunctionVariable):
        return vt.reconstruct(cg)
    raise Unsupported(f"{what}: it holds {vt.describe()}, which the runner cannot rebuild as the same object")


def make_function(
    code: types.CodeType,
    f_globals: dict[str, Any],
    qualname: str,
    defaults: tuple[Any, ...],
    kwdefaults: dict[str, Any],
    cell_values: tuple[Any, ...],
    empty: tuple[int, ...],
    annotations: tuple[Any, ...] | None,
) -> types.FunctionType:
    """The function MAKE_FUNCTION would make (Note [Functions made in the frame that leave it])."""
    closure = tuple(types.CellType() if i in empty else types.CellType(v) for i, v in enumerate(cell_values))
    fn = types.FunctionType(code, f_globals, code.co_name, defaults or None, closure or None)
    fn.__qualname__ = qualname
    fn.__kwdefaults__ = kwdefaults or None
    if annotations is not None:
        fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2], strict=True))
    return fn


class BoundMethodVariable(VariableTracker):
    """`obj.method`: a function with its first argument bound."""

    def __init__(self, fn: VT, obj: VT) -> None:
        self.fn = fn
        self.obj = obj

    def describe(self) -> str:
        return f"bound method {self.fn.describe()}"

    def python_type(self) -> type:
        return types.MethodType

    def getattr(self, tx: Tx, name: str) -> VT:
        if name == "__self__":
            return self.obj
        if name == "__func__":
            return self.fn
        return self.fn.getattr(tx, name)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.fn.call(tx, [self.obj, *args], kwargs)

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{cg.const(types.MethodType)}({self.fn.reconstruct(cg)}, {self.obj.reconstruct(cg)})"


class PartialVariable(VariableTracker):
    """functools.partial(func, *args, **kwargs), created in the frame or read from outside."""

    def __init__(self, func: VT, args: list[VT], kwargs: dict[str, VT], source: Source | None = None) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.source = source

    def describe(self) -> str:
        return f"functools.partial({self.func.describe()})"

    def python_type(self) -> type:
        return functools.partial

    def getattr(self, tx: Tx, name: str) -> VT:
        if name == "func":
            return self.func
        if name == "args":
            return TupleVariable(list(self.args))
        if name == "keywords":
            return DictVariable(dict(self.kwargs))
        raise Unsupported(f"attribute {name!r} of functools.partial")

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.func.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})


def _checkpoint() -> Any:
    import torch.utils.checkpoint

    return torch.utils.checkpoint.checkpoint
