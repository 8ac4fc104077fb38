"""`torch.autograd.Function` subclasses called through `.apply`: one node that keeps the backward.

Note [autograd.Function in the graph]: inlining a Function's `forward` would put its ops in the
graph but lose its `backward` (autograd would differentiate the forward's ops instead: a wrong
gradient for a straight-through estimator or a custom GELU). torch.compile keeps both by
tracing forward and backward into a higher-order op. kiln keeps the call itself: `Cls.apply(*args)`
is one `call_function` node whose target is the class's `apply`, and its fake run (the real
`apply` over fake tensors) gives the outputs' metadata and `requires_grad`. What runs the graph
calls the real Function, so eager's forward and backward both run; a backend that traces the
graph to aten (kiln_aotgrad, under a dispatch mode) runs `apply` under its tracer, so the
forward's ops are recorded and, in the joint graph, autograd calls the user's `backward` on
traced tensors, which records the backward's ops: the gradients are the user's backward's.

That is sound only when running `forward` on fake tensors at capture time has no effect outside
it, so the call is taken into the graph only when `forward` (and `setup_context`) are Python
functions whose code writes nothing but `ctx` attributes (no global, closure-cell or attribute
store on another object, no `mark_dirty` of an input modified in place), `apply` is
torch's own, and every argument is a tensor or a constant. Otherwise it is one graph break with
the reason. The class's `forward`, `backward` and `setup_context` are pinned by guards.
"""

from __future__ import annotations

import dis
import inspect
import types
import weakref
from typing import TYPE_CHECKING, Any

import torch

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.variables.base import VariableTracker

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker

_FUNCTION_APPLY = inspect.getattr_static(torch.autograd.Function, "apply")
_FUNCTION_SETUP = inspect.getattr_static(torch.autograd.Function, "setup_context")
_STORES_OUTSIDE = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF", "IMPORT_NAME"})


def is_autograd_function(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, torch.autograd.Function)


_PURE_BUILTINS = frozenset(
    {len, isinstance, issubclass, range, tuple, list, dict, int, float, bool, str, max, min, abs,
     sum, getattr, hasattr, type, enumerate, zip, reversed, sorted, any, all, round, divmod, slice}
)  # fmt: skip


def _effect_outside(fn: types.FunctionType, depth: int = 0) -> str | None:
    """Why running `fn(ctx, ...)` may change state outside it, or None when it only writes ctx
    and its own locals: a static look at its code. Stores must be to locals or ctx attributes;
    every global or closure value it reads must be a module, a class, a constant, a torch
    callable, a pure builtin or a Python function that passes the same test (two levels deep),
    so that a mutable object outside (a list it appends to) is never reachable."""
    code = fn.__code__
    if "mark_dirty" in code.co_names:
        return "ctx.mark_dirty (the forward modifies an input in place)"
    ctx_name = code.co_varnames[0] if code.co_argcount else None
    return _scan(fn, code, ctx_name, frozenset(), depth)


_COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})


def _scan(
    fn: types.FunctionType,
    code: types.CodeType,
    ctx_name: str | None,
    outer_cells: frozenset[str],
    depth: int,
) -> str | None:
    """`_effect_outside` over one code object: `fn`'s own, or (3.11) a comprehension inside it,
    whose cells are `fn`'s locals (`outer_cells`)."""
    own_cells = frozenset(code.co_cellvars) | outer_cells
    prev: dis.Instruction | None = None
    for inst in dis.get_instructions(code):
        if inst.opname in ("STORE_DEREF", "DELETE_DEREF") and inst.argval in code.co_cellvars:
            pass  # a local of this code that a comprehension reads
        elif inst.opname in _STORES_OUTSIDE:
            return f"{inst.opname} {inst.argval} in {fn.__qualname__}"
        if inst.opname in ("STORE_ATTR", "DELETE_ATTR") and (
            prev is None or prev.opname != "LOAD_FAST" or prev.argval != ctx_name
        ):
            return f"an attribute store other than on ctx ({inst.argval}) in {fn.__qualname__}"
        if isinstance(inst.argval, types.CodeType):
            if inst.argval.co_name not in _COMPREHENSIONS:
                return f"a nested function in {fn.__qualname__}"
            why = _scan(fn, inst.argval, None, own_cells, depth)
            if why is not None:
                return why
        if inst.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF") and inst.argval in own_cells:
            pass  # a local of fn, through a cell
        elif inst.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF"):
            found, value = _lookup(fn, inst)
            why = _unsafe_value(inst.argval, value, depth) if found else f"{inst.argval} is not defined"
            if why is not None:
                return f"{why}, read in {fn.__qualname__}"
        prev = inst
    return None


def _lookup(fn: types.FunctionType, inst: dis.Instruction) -> tuple[bool, Any]:
    import builtins

    name = inst.argval
    if inst.opname == "LOAD_GLOBAL":
        if name in fn.__globals__:
            return True, fn.__globals__[name]
        return (True, getattr(builtins, name)) if hasattr(builtins, name) else (False, None)
    names = fn.__code__.co_freevars
    if name in names and fn.__closure__ is not None:
        try:
            return True, fn.__closure__[names.index(name)].cell_contents
        except ValueError:  # an empty cell
            return False, None
    return False, None


def _unsafe_value(name: str, value: Any, depth: int) -> str | None:
    from kiln_dynamo.variables.builder import is_constant_value
    from kiln_dynamo.variables.torch import is_torch_callable

    if isinstance(value, (types.ModuleType, type)) or is_constant_value(value):
        return None
    if is_torch_callable(value) or any(value is b for b in _PURE_BUILTINS):
        return None
    if isinstance(value, types.FunctionType):
        if depth >= 2:
            return f"{name} calls Python functions too deep to check"
        return _effect_outside(value, depth + 1)
    return f"{name}, a {type(value).__name__}"


def _python_static(cls: type, name: str) -> types.FunctionType | None:
    static = inspect.getattr_static(cls, name, None)
    fn = static.__func__ if isinstance(static, (staticmethod, classmethod)) else static
    return fn if isinstance(fn, types.FunctionType) else None


_TARGETS: weakref.WeakKeyDictionary[type, Any] = weakref.WeakKeyDictionary()


def apply_target(cls: type) -> Any:
    """The graph node's target for `cls.apply`: a plain function calling it, one per class (FX
    writes a torch-module callable as an import path, which `cls.apply` does not have)."""
    fn = _TARGETS.get(cls)
    if fn is None:
        ref = weakref.ref(cls)

        def fn(*args: Any) -> Any:
            c: Any = ref()
            return c.apply(*args)

        fn.__name__ = fn.__qualname__ = f"{cls.__name__}_apply"
        fn.__kiln_autograd_function__ = ref  # type: ignore[attr-defined]
        _TARGETS[cls] = fn
    return fn


class AutogradFunctionApplyVariable(VariableTracker):
    """`Cls.apply` for a `torch.autograd.Function` subclass (Note [autograd.Function in the graph])."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def describe(self) -> str:
        return f"{self.cls.__qualname__}.apply"

    def identity(self) -> object:
        cls: Any = self.cls
        return cls.apply

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{cg.const(self.cls)}.apply"

    def _check(self, tx: Tx) -> None:
        from kiln_dynamo.variables.nn_module import guard_class_attr

        cls = self.cls
        label = cls.__qualname__
        if inspect.getattr_static(cls, "apply") is not _FUNCTION_APPLY:
            raise Unsupported(f"{label} overrides autograd.Function.apply")
        forward = _python_static(cls, "forward")
        if forward is None:
            raise Unsupported(f"{label}.forward is not a Python function")
        checked = [forward]
        setup = inspect.getattr_static(cls, "setup_context")
        if setup is not _FUNCTION_SETUP:
            setup_fn = _python_static(cls, "setup_context")
            if setup_fn is None:
                raise Unsupported(f"{label}.setup_context is not a Python function")
            checked.append(setup_fn)
        for fn in checked:
            why = _effect_outside(fn)
            if why is not None:
                raise Unsupported(
                    f"autograd.Function {label} is called eagerly: its forward may have effects "
                    f"outside it ({why})",
                    advice="keep forward free of side effects other than ctx.save_for_backward "
                    "and ctx attributes",
                )
        for name in ("forward", "backward", "setup_context", "apply"):
            guard_class_attr(tx, cls, name, inspect.getattr_static(cls, name))

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        from kiln_dynamo.variables.lists import BaseListVariable
        from kiln_dynamo.variables.tensor import TensorVariable

        def plain(vt: VT) -> bool:
            if isinstance(vt, TensorVariable) or vt.is_constant():
                return True
            return isinstance(vt, BaseListVariable) and all(plain(i) for i in vt.items)

        if kwargs:
            raise Unsupported(f"{self.describe()} called with keyword arguments")
        if not all(plain(a) for a in args):
            bad = next(a for a in args if not plain(a))
            raise Unsupported(f"{self.describe()} called with {bad.describe()}, not a tensor or constant")
        self._check(tx)
        target = apply_target(self.cls)
        return tx.output.create_call(tx, "call_function", target, args, {})
