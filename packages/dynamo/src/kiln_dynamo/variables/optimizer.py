"""`torch.optim` optimizers inside a compiled training step: `opt.step()` and `opt.zero_grad()`.

Note [Tracing an optimizer step]: torch's optimizers keep their algorithm in plain Python over
lists of tensors (`Adam.step` gathers parameters, gradients and state with `_init_group`, then
calls the functional `adam(...)`), so `step()` is traced like any other code, with four things
answered here instead of traced:

- the wrappers around `step` (`Optimizer.profile_hook_step`: a profiler range and the step
  hooks; `_use_grad_for_differentiable`: grad mode off and two `torch._dynamo.graph_break()`
  calls) are not inlined: the hook registries, global and the instance's own, are guarded empty,
  and the unwrapped `step` is inlined with grad mode off (graph nodes, as `no_grad`);
- `self._init_group(group, params, grads, ...)` runs for real at trace time, on the real
  optimizer: it creates the state that eager's first step creates (Adam's zeros and `step`
  counters; the same values eager would make), then each item it appended is handed to the
  traced lists as the tracker of where it lives: a parameter `opt.param_groups[g]['params'][j]`,
  its gradient `<param>.grad` (Note [Gradients read in the frame]), a state tensor
  `opt.state[<param>]['exp_avg']` (a `KeyedSource`), each a guarded graph input;
- `self.state[p]` is the real per-parameter state dict, wrapped with its source: a tensor the
  step stores there (SGD's first momentum buffer) is written back after the graph, as any
  mutation of an outside dict; its keys are guarded, so the second step (the buffer now exists)
  compiles once more, as torch.compile does;
- `zero_grad()` sets every gradient to None after the graph (a recorded attribute store), or,
  with `set_to_none=False`, zeroes them in the graph.

Hyperparameters are read from `param_groups` with their sources: a float learning rate is a
guarded constant, so an LR scheduler that changes it makes the next call recompile (what
torch.compile does for a float lr). A schedule that changes it every step therefore recompiles
every step until the per-code cache limit (8), after which the step runs as Python (correct,
uncompiled); a tensor learning rate (`lr=torch.tensor(0.01)`, torch.compile's advice too) is a
graph input and never recompiles. Anything else that the step would
do differently — a closure, hooks, fused or differentiable or capturable groups, sparse
gradients, an optimizer class outside `_TRACED_STEPS` or a subclass with its own `step` —
breaks at the call with its reason, and CPython runs the step.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import optimizer as _optimizer_mod

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import AttrSource, GetItemSource, KeyedSource, Source
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker
from kiln_dynamo.variables.lists import ListVariable
from kiln_dynamo.variables.nn_module import guard_class_attr
from kiln_dynamo.variables.tensor import TensorVariable

if TYPE_CHECKING:
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker

# The optimizer classes whose stock `step` is traced, and the group flags under which that step
# runs its plain (not fused, not differentiable, not capturable) algorithm.
_TRACED_STEPS: dict[type, tuple[str, ...]] = {
    torch.optim.SGD: ("fused", "differentiable"),
    torch.optim.Adam: ("fused", "differentiable", "capturable"),
    torch.optim.AdamW: ("fused", "differentiable", "capturable"),
    torch.optim.RMSprop: ("differentiable", "capturable"),
    torch.optim.Adagrad: ("fused", "differentiable"),
}

_STEP_HOOK_DICTS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")


def is_traced_optimizer(value: object) -> bool:
    return type(value) in _TRACED_STEPS


def _stock_step(cls: type) -> Any:
    """The undecorated `step` of `cls`, if it is torch's own."""
    fn = inspect.unwrap(cls.step)  # type: ignore[attr-defined]
    module = getattr(fn, "__module__", "") or ""
    return fn if module.startswith("torch.optim.") and inspect.isfunction(fn) else None


class OptimizerVariable(VariableTracker):
    """A `torch.optim.Optimizer` of a class in `_TRACED_STEPS` (Note [Tracing an optimizer step])."""

    def __init__(self, value: torch.optim.Optimizer, source: Source) -> None:
        self.value = value
        self.source = source
        self.src: Source = source  # never None (for the type checker)
        self._states: dict[int, VT] = {}

    def describe(self) -> str:
        return f"optimizer {type(self.value).__qualname__}"

    def python_type(self) -> type:
        return type(self.value)

    def identity(self) -> object:
        return self.value

    # --- attributes -----------------------------------------------------------------------
    def getattr(self, tx: Tx, name: str) -> VT:
        if name in ("step", "zero_grad", "_init_group", "_accelerator_graph_capture_health_check"):
            if name in self.value.__dict__:
                return self._instance_method(tx, name)
            tx.output.guards.no_instance_attr(self.src, name)
            # the class's method is what was traced (a later monkeypatch recompiles)
            guard_class_attr(tx, type(self.value), name, inspect.getattr_static(type(self.value), name))
            return OptimizerMethodVariable(self, name)
        if name == "state":
            return OptimizerStateVariable(self)
        if name in ("param_groups", "defaults"):
            return tx.wrap(getattr(self.value, name), AttrSource(self.src, name))
        if name in self.value.__dict__:
            raise Unsupported(f"attribute {name!r} of {self.describe()} inside a compiled frame")
        if hasattr(type(self.value), name):
            raise Unsupported(f"class attribute {name!r} of {self.describe()} inside a compiled frame")
        tx.output.guards.no_instance_attr(self.src, name)  # `getattr(self, "grad_scale", None)`
        raise AttributeError(f"{type(self.value).__name__!r} object has no attribute {name!r}")

    def _instance_method(self, tx: Tx, name: str) -> VT:
        """An LR scheduler wraps `opt.step` in the instance (`_wrapped_by_lr_sched`) to set
        `opt._opt_called = True` before the class's step: that store is replayed after the graph,
        the wrapper itself guarded by identity."""
        fn = self.value.__dict__[name]
        if (
            name == "step"
            and getattr(fn, "_wrapped_by_lr_sched", False)
            and fn.__wrapped__ is type(self.value).step
        ):
            tx.output.guards.identity(AttrSource(self.src, name), fn)
            return OptimizerMethodVariable(self, name, mark_called=True)
        raise Unsupported(f"{self.describe()} with its own {name!r} set on the instance")

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.getattr(tx, name).call(tx, args, kwargs)

    # --- where each tensor lives ----------------------------------------------------------
    def param_source(self, tx: Tx, p: torch.Tensor) -> Source:
        for g, group in enumerate(self.value.param_groups):
            for j, q in enumerate(group["params"]):
                if q is p:
                    return GetItemSource(
                        GetItemSource(GetItemSource(AttrSource(self.src, "param_groups"), g), "params"), j
                    )
        raise Unsupported(f"a tensor that is not a parameter of {self.describe()}")

    def state_of(self, tx: Tx, p: torch.Tensor, p_source: Source) -> VT:
        """`self.state[p]`: the real per-parameter dict (created empty, as the defaultdict does)."""
        hit = self._states.get(id(p))
        if hit is None:
            real = self.value.state[p]
            if not isinstance(real, dict) or type(real) is not dict:
                raise Unsupported(f"optimizer state of type {type(real).__name__}")
            hit = tx.wrap(real, KeyedSource(AttrSource(self.src, "state"), p_source))
            self._states[id(p)] = hit
        return hit


def _real_tensor(tx: Tx, vt: VT) -> tuple[torch.Tensor, Source]:
    """The real input tensor behind a tracker, and its source."""
    if isinstance(vt, TensorVariable):
        for node, source, value in tx.output.inputs:
            if node is vt.node and isinstance(value, torch.Tensor):
                return value, source
    raise Unsupported(f"optimizer state indexed by {vt.describe()}, not a parameter from outside the frame")


class OptimizerStateVariable(VariableTracker):
    """`opt.state`, indexed by parameters."""

    def __init__(self, opt: OptimizerVariable) -> None:
        self.opt = opt

    def describe(self) -> str:
        return f"state of {self.opt.describe()}"

    def getitem(self, tx: Tx, key: VT) -> VT:
        p, _ = _real_tensor(tx, key)
        return self.opt.state_of(tx, p, self.opt.param_source(tx, p))


class OptimizerMethodVariable(VariableTracker):
    def __init__(self, opt: OptimizerVariable, name: str, mark_called: bool = False) -> None:
        self.opt = opt
        self.name = name
        self.mark_called = mark_called

    def describe(self) -> str:
        return f"method {self.name} of {self.opt.describe()}"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        handler = _METHODS.get(self.name)
        if handler is None:
            raise Unsupported(f"calling {self.describe()}")
        result = handler(tx, self.opt, args, kwargs)
        if self.mark_called:
            tx.output.side_effects.store_attr(self.opt, self.opt.value, "_opt_called", ConstantVariable(True))
        return result


def _flag(tx: Tx, group_vt: VT, key: str) -> Any:
    from kiln_dynamo.variables.dicts import DictVariable

    assert isinstance(group_vt, DictVariable)
    if key not in group_vt._items:
        return None
    vt = group_vt.getitem(tx, ConstantVariable(key))
    return vt.as_constant() if vt.is_constant() else vt


def _step(tx: Tx, opt: OptimizerVariable, args: list[VT], kwargs: dict[str, VT]) -> VT:
    real = opt.value
    cls = type(real)
    what = f"{cls.__qualname__}.step()"
    closure = [*args, *kwargs.values()]
    if closure and not (len(closure) == 1 and closure[0].is_constant() and closure[0].as_constant() is None):
        raise Unsupported(f"{what} with a closure", advice="call the closure yourself before opt.step()")
    fn = _stock_step(cls)
    if fn is None:
        raise Unsupported(f"{what} is not torch's own step function")
    hooks = [getattr(real, h) for h in _STEP_HOOK_DICTS]
    hooks += [_optimizer_mod._global_optimizer_pre_hooks, _optimizer_mod._global_optimizer_post_hooks]
    if any(hooks):
        raise Unsupported(f"{what} with optimizer step hooks registered")
    tx.output.guards.empty_dicts(tuple(hooks), f"no optimizer step hooks on {opt.src.name()} or global")
    devices = {p.device.type for g in real.param_groups for p in g["params"]}
    if devices - {"cpu"}:
        # on CUDA the functional steps route to `torch._disable_dynamo` wrappers and torch.compile
        # switches groups to `capturable`: neither is modelled here (the device is guarded by
        # every parameter's tensor guard)
        raise Unsupported(f"{what} with parameters on {sorted(devices - {'cpu'})}: only CPU steps are traced")
    groups = opt.getattr(tx, "param_groups")
    for group_vt in groups.iterate(tx):
        for flag in _TRACED_STEPS[cls]:
            value = _flag(tx, group_vt, flag)
            if value not in (None, False):
                raise Unsupported(f"{what} with {flag}={value!r} in a parameter group")
    defaults = opt.getattr(tx, "defaults")
    if _flag(tx, defaults, "differentiable") not in (None, False):
        raise Unsupported(f"{what} of a differentiable optimizer")
    from kiln_dynamo.variables.functions import UserFunctionVariable

    prev = torch.is_grad_enabled()
    tx.output.guards.global_state()
    try:
        if prev:
            tx.output.set_grad_mode(False)
        result = UserFunctionVariable(fn, None).call(tx, [opt], {})
        if prev:
            tx.output.set_grad_mode(True)
    finally:
        torch._C._set_grad_enabled(prev)
    return result


def _init_group(tx: Tx, opt: OptimizerVariable, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """Run the real `_init_group` (state created as eager's step creates it), then give each
    list the trackers of what it appended (Note [Tracing an optimizer step])."""
    from kiln_dynamo.variables.dicts import DictVariable

    if kwargs or not args or not isinstance(args[0], DictVariable) or args[0].source is None:
        raise Unsupported("_init_group of an optimizer with a parameter group built inside the frame")
    group_vt, lists = args[0], args[1:]
    if not all(isinstance(a, ListVariable) and a.source is None and not a.items for a in lists):
        raise Unsupported("_init_group with lists that are not empty lists made by the step")
    real_group = next((g for g in opt.value.param_groups if group_vt.source == _group_source(opt, g)), None)
    if real_group is None:
        raise Unsupported("_init_group with a parameter group the optimizer does not hold")
    params_vt = group_vt.getitem(tx, ConstantVariable("params"))
    params = list(real_group["params"])
    # every parameter's gradient is read with its source: None is guarded None, so a gradient
    # that appears later recompiles rather than being skipped
    grads = {}
    for j, p_vt in enumerate(params_vt.iterate(tx)):
        grads[j] = p_vt.getattr(tx, "grad")
    real_lists: list[list[Any]] = [[] for _ in lists]
    result = type(opt.value)._init_group(opt.value, real_group, *real_lists)  # type: ignore[attr-defined]
    found: dict[int, VT] = {}
    for j, p in enumerate(params):
        p_vt = params_vt.getitem(tx, ConstantVariable(j))
        found[id(p)] = p_vt
        if p.grad is not None:
            found[id(p.grad)] = grads[j]
        if p in opt.value.state:
            state_vt = opt.state_of(tx, p, opt.param_source(tx, p))
            assert isinstance(state_vt, DictVariable)
            for key, v in opt.value.state[p].items():
                if isinstance(v, torch.Tensor):
                    found.setdefault(id(v), state_vt.getitem(tx, ConstantVariable(key)))
    for list_vt, items in zip(lists, real_lists, strict=True):
        assert isinstance(list_vt, ListVariable)
        for item in items:
            if item is None:
                list_vt.items.append(ConstantVariable(None))  # absence guarded by the state's keys
            elif id(item) in found:
                list_vt.items.append(found[id(item)])
            else:
                raise Unsupported(
                    f"_init_group of {opt.describe()} gathered a {type(item).__name__} kiln cannot place"
                )
    # flags computed from what the guards fix (sparse layouts, complex dtypes)
    if isinstance(result, tuple) and all(isinstance(r, bool) for r in result):
        return tx.wrap_constant(result)
    if not isinstance(result, (bool, type(None))):
        raise Unsupported(f"_init_group of {opt.describe()} returned {type(result).__name__}")
    return ConstantVariable(result)


def _group_source(opt: OptimizerVariable, group: dict[str, Any]) -> Source | None:
    for g, q in enumerate(opt.value.param_groups):
        if q is group:
            return GetItemSource(AttrSource(opt.src, "param_groups"), g)
    return None


def _health_check(tx: Tx, opt: OptimizerVariable, args: list[VT], kwargs: dict[str, VT]) -> VT:
    return ConstantVariable(None)  # a no-op while compiling (torch.compiler.is_compiling())


def _zero_grad(tx: Tx, opt: OptimizerVariable, args: list[VT], kwargs: dict[str, VT]) -> VT:
    given = [*args, *kwargs.values()]
    if len(given) > 1 or (given and not given[0].is_constant()):
        raise Unsupported(f"{type(opt.value).__qualname__}.zero_grad() with arguments kiln cannot read")
    set_to_none = bool(given[0].as_constant()) if given else True
    if _stock_zero_grad(type(opt.value)) is None:
        raise Unsupported(f"{type(opt.value).__qualname__}.zero_grad() is not torch's own")
    for group_vt in opt.getattr(tx, "param_groups").iterate(tx):
        for p_vt in group_vt.getitem(tx, ConstantVariable("params")).iterate(tx):
            grad = p_vt.getattr(tx, "grad")
            if grad.is_constant() and grad.as_constant() is None:
                continue
            if set_to_none:
                p, _ = _real_tensor(tx, p_vt)
                tx.output.side_effects.store_attr(p_vt, p, "grad", ConstantVariable(None))
                continue
            if not isinstance(grad, TensorVariable) or grad.fake.requires_grad:
                raise Unsupported("zero_grad(set_to_none=False) of a gradient that requires grad")
            grad.call_method(tx, "zero_", [], {})
    return ConstantVariable(None)


def _stock_zero_grad(cls: type) -> Any:
    fn = inspect.unwrap(cls.zero_grad)  # type: ignore[attr-defined]
    return fn if fn is inspect.unwrap(torch.optim.Optimizer.zero_grad) else None


_METHODS = {
    "step": _step,
    "_init_group": _init_group,
    "_accelerator_graph_capture_health_check": _health_check,
    "zero_grad": _zero_grad,
}
