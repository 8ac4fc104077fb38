"""Guard fuzz (issue 18): no perturbation of what a cached entry relied on gives a stale answer.

For every capture case of the test corpus (test_capture_functions, test_capture_modules,
test_capture_more), the case is compiled and called once, so that its frame has an entry in the
cache. Then, one at a time, something that could make that entry stale is changed — a tensor
argument's dtype, shape, strides (a transposed-contiguous or a sliced layout), requires_grad; the
grad mode; the default dtype; train/eval; the length of a list argument; the keys of a dict
argument; a global constant the function reads; a plain attribute of the module or of an
argument object; a constant of their class; a method of their class (monkey-patched to add 1
to every tensor it returns); a global function the function calls (wrapped likewise) — and the
compiled function is called again, and once more after the change is undone, and each result
must equal eager's under the same conditions (same type at every level, as `assert_same`). A
perturbation under which eager itself raises is not applicable (the compiled function must
raise too). Entries accumulate per case (the cache limit is raised for the fuzz), so a wrong
guard that let an entry made under one perturbation serve another would show as well.

The perturbations are chosen deterministically from a seeded generator (which tensor argument,
which dimension); the test asserts how many ran, so a corpus change that silently shrinks the
fuzz fails loudly.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import math
import random
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from conftest import CountingBackend, assert_same
from test_capture_functions import CASES as FUNCTION_CASES
from test_capture_modules import MODULE_CASES
from test_capture_more import MORE
from torch import nn

import kiln_dynamo
import kiln_frame_hook
from kiln_dynamo import guard_tree
from kiln_dynamo.convert_frame import capture_listeners

MIN_PERTURBATIONS = 1000
SHADOWED_BUILTINS = ("len", "abs", "sum", "max", "min", "round")
MODULE_SAMPLE = 8  # perturbations per module case (all of them for functions)


@dataclass
class Env:
    """One case: the eager and the compiled copy of the callable, and the base arguments."""

    name: str
    eager: Callable[..., Any]
    target: Callable[..., Any]  # what was compiled (a module copy, or the function)
    compiled: Callable[..., Any]
    args: tuple[Any, ...]
    eager_module: nn.Module | None
    compiled_module: nn.Module | None


Perturbation = tuple[str, Callable[[Env], contextlib.AbstractContextManager[tuple[Any, ...]]]]


# --- the corpus -----------------------------------------------------------------------------------
def _corpus() -> list[tuple[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]]]:
    out: list[tuple[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]]] = []
    for name, fn, args in FUNCTION_CASES:
        out.append((f"fn:{name}", lambda fn=fn, args=args: (fn, args)))
    for name, make, args in MODULE_CASES:
        out.append((f"module:{name}", lambda make=make, args=args: (make(), args)))
    for name, fn, args in MORE:
        if name.startswith("super_") and name != "super_in_new_object":

            def factory(fn: Any = fn, args: Any = args) -> tuple[Any, Any]:
                torch.manual_seed(0)
                return fn(), args

            out.append((f"more:{name}", factory))
        else:
            out.append((f"more:{name}", lambda fn=fn, args=args: (fn, args)))
    return out


# --- helpers --------------------------------------------------------------------------------------
def _tensor_slots(args: tuple[Any, ...]) -> list[int]:
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]


def _replace(args: tuple[Any, ...], i: int, value: Any) -> tuple[Any, ...]:
    return (*args[:i], value, *args[i + 1 :])


def _plus_one(out: Any) -> Any:
    return pytree.tree_map(lambda v: v + 1 if isinstance(v, torch.Tensor) else v, out)


def _tweak(value: Any) -> Any:
    """A different value of the same type, or None when there is no sensible one."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 0.25
    if isinstance(value, tuple) and value and all(type(v) is int for v in value):
        return tuple(v + 1 for v in value)
    return None


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _function_of(target: Any) -> types.FunctionType | None:
    if isinstance(target, nn.Module):
        fwd = type(target).forward
        return fwd if isinstance(fwd, types.FunctionType) else None
    return target if isinstance(target, types.FunctionType) else None


def _names_read(fn: types.FunctionType) -> list[str]:
    names: list[str] = []
    for code in _codes(fn.__code__):
        names += [n for n in code.co_names if n not in names]
    return names


def _number_plus_one(orig: Callable[..., Any]) -> Callable[..., Any]:
    """`orig`, with 1 added to a numeric or tensor result (other results unchanged)."""

    def patched(*a: Any, **k: Any) -> Any:
        out = orig(*a, **k)
        return out + 1 if isinstance(out, (int, float, torch.Tensor)) and not isinstance(out, bool) else out

    return patched


def _shadow(env: Env, fn: types.FunctionType, name: str, value: Any) -> Any:
    @contextlib.contextmanager
    def ctx() -> Iterator[tuple[Any, ...]]:
        fn.__globals__[name] = value
        try:
            yield env.args
        finally:
            del fn.__globals__[name]

    return ctx()


def _globals_read(fn: types.FunctionType) -> list[str]:
    names: list[str] = []
    for code in _codes(fn.__code__):
        names += [n for n in code.co_names if n in fn.__globals__ and n not in names]
    return names


def _user_objects(env: Env) -> list[tuple[Any, Any]]:
    """(eager copy, compiled copy) of the user objects the case reads: modules and object args."""
    pairs: list[tuple[Any, Any]] = []
    if env.eager_module is not None and env.compiled_module is not None:
        pairs += list(zip(env.eager_module.modules(), env.compiled_module.modules(), strict=True))
    return pairs


def _is_user_class(cls: type) -> bool:
    return cls.__module__.startswith("test_")


# --- perturbations ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _args(args: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    yield args


@contextlib.contextmanager
def _grad_mode(env: Env, enabled: bool) -> Iterator[tuple[Any, ...]]:
    with torch.set_grad_enabled(enabled):
        yield env.args


@contextlib.contextmanager
def _default_dtype(env: Env) -> Iterator[tuple[Any, ...]]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield env.args
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _train_mode(env: Env) -> Iterator[tuple[Any, ...]]:
    assert env.eager_module is not None and env.compiled_module is not None
    was = env.eager_module.training
    env.eager_module.train(not was)
    env.compiled_module.train(not was)
    try:
        yield env.args
    finally:
        env.eager_module.train(was)
        env.compiled_module.train(was)


@contextlib.contextmanager
def _setattr_on(pairs: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set attributes (restored after); `pairs` of (object, name, value)."""
    missing = object()
    saved = [(obj, name, obj.__dict__.get(name, missing)) for obj, name, _ in pairs]
    for obj, name, value in pairs:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, old in reversed(saved):
            if old is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


def _global(env: Env, fn: types.FunctionType, name: str, value: Any) -> Any:
    @contextlib.contextmanager
    def ctx() -> Iterator[tuple[Any, ...]]:
        g = fn.__globals__
        old = g[name]
        g[name] = value
        try:
            yield env.args
        finally:
            g[name] = old

    return ctx()


def _dict_global(env: Env, d: dict[str, Any], key: str, value: Any) -> Any:
    @contextlib.contextmanager
    def ctx() -> Iterator[tuple[Any, ...]]:
        old = d[key]
        d[key] = value
        try:
            yield env.args
        finally:
            d[key] = old

    return ctx()


def _patched_attrs(env: Env, pairs: list[tuple[Any, str, Any]]) -> Any:
    @contextlib.contextmanager
    def ctx() -> Iterator[tuple[Any, ...]]:
        with _setattr_on(pairs):
            yield env.args

    return ctx()


def _wrapped_method(orig: Callable[..., Any]) -> Callable[..., Any]:
    def patched(*a: Any, **k: Any) -> Any:
        return _plus_one(orig(*a, **k))

    return patched


def _tensor_perturbations(x: torch.Tensor, i: int, rng: random.Random) -> list[Perturbation]:
    """dtype, requires_grad, shape (one dimension, chosen by `rng`) and strides of argument `i`."""
    out: list[Perturbation] = []
    at = f"arg {i}"
    if x.is_floating_point():
        other = torch.float64 if x.dtype != torch.float64 else torch.float32
        out.append((f"{at} dtype", lambda e: _args(_replace(e.args, i, e.args[i].detach().to(other)))))
        leaf = x.detach().requires_grad_(not x.requires_grad)
        out.append((f"{at} requires_grad", lambda e: _args(_replace(e.args, i, leaf))))
    if x.dim() >= 1:
        d = rng.randrange(x.dim())
        grown = torch.cat([x.detach(), x.detach().narrow(d, 0, 1)], d).requires_grad_(x.requires_grad)
        out.append((f"{at} shape (dim {d})", lambda e: _args(_replace(e.args, i, grown))))
    if x.dim() >= 2 and x.size(-1) > 1 and x.size(-2) > 1:
        t = x.detach().transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_(x.requires_grad)
        out.append((f"{at} stride (transposed)", lambda e: _args(_replace(e.args, i, t))))
    if x.dim() >= 1 and x.numel() > 0:
        wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
        wide[..., ::2] = x.detach()
        sliced = wide[..., ::2]
        if x.requires_grad:
            sliced = sliced.requires_grad_()
        out.append((f"{at} stride (sliced)", lambda e: _args(_replace(e.args, i, sliced))))
    return out


def perturbations(env: Env, rng: random.Random) -> list[Perturbation]:
    out: list[Perturbation] = []
    args = env.args
    for i in _tensor_slots(args)[:3]:
        out += _tensor_perturbations(args[i], i, rng)
    base_grad = torch.is_grad_enabled()
    out.append(("grad mode", lambda e, b=base_grad: _grad_mode(e, not b)))
    out.append(("default dtype", _default_dtype))
    if env.eager_module is not None:
        out.append(("train/eval", _train_mode))
    for i, a in enumerate(args):
        if isinstance(a, list) and a:
            longer = [*a, copy.deepcopy(a[-1])]
            out.append(("list length +1", lambda e, i=i, v=longer: _args(_replace(e.args, i, v))))
            if len(a) > 1:
                out.append(("list length -1", lambda e, i=i, v=a[:-1]: _args(_replace(e.args, i, v))))
        if isinstance(a, dict) and a:
            extra = {**a, "extra_key": next(iter(a.values()))}
            out.append(("dict keys +1", lambda e, i=i, v=extra: _args(_replace(e.args, i, v))))
            fewer = dict(list(a.items())[1:])
            out.append(("dict keys -1", lambda e, i=i, v=fewer: _args(_replace(e.args, i, v))))
    fn = _function_of(env.target)
    if fn is not None:
        for name in _globals_read(fn):
            value = fn.__globals__[name]
            new = _tweak(value)
            if new is not None:
                out.append((f"global {name}", lambda e, fn=fn, n=name, v=new: _global(e, fn, n, v)))
            elif isinstance(value, dict) and type(value) is dict:
                for key, item in value.items():
                    new = _tweak(item)
                    if new is not None and isinstance(key, str):
                        out.append(
                            (
                                f"global {name}[{key!r}]",
                                lambda e, d=value, k=key, v=new: _dict_global(e, d, k, v),
                            )
                        )
            elif isinstance(value, types.FunctionType) and value.__module__.startswith("test_"):
                wrapped = _wrapped_method(value)
                out.append(
                    (f"global function {name}", lambda e, fn=fn, n=name, v=wrapped: _global(e, fn, n, v))
                )
            elif value is math:
                for attr in _names_read(fn):
                    if callable(getattr(math, attr, None)):
                        patched = _number_plus_one(getattr(math, attr))
                        out.append(
                            (f"math.{attr}", lambda e, a=attr, v=patched: _patched_attrs(e, [(math, a, v)]))
                        )
        for name in _names_read(fn):
            if name in SHADOWED_BUILTINS and name not in fn.__globals__:
                shadow = _number_plus_one(getattr(builtins, name))
                out.append(
                    (f"builtin {name} shadowed", lambda e, fn=fn, n=name, v=shadow: _shadow(e, fn, n, v))
                )
    objects = _user_objects(env)
    for a in args:  # plain objects passed as arguments (shared: the args are deep-copied per call)
        if hasattr(a, "__dict__") and not isinstance(a, (nn.Module, torch.Tensor, type)):
            objects.append((a, None))
    classes: list[type] = []
    for eager_obj, comp_obj in objects:
        for attr, value in list(vars(eager_obj).items()):
            new = _tweak(value)
            if attr.startswith("_") or attr == "training" or new is None:
                continue
            targets = [(eager_obj, attr, new)] + ([(comp_obj, attr, new)] if comp_obj is not None else [])
            label = f"attribute {type(eager_obj).__name__}.{attr}"
            out.append((label, lambda e, t=targets: _patched_attrs(e, t)))
        if _is_user_class(type(eager_obj)) and type(eager_obj) not in classes:
            classes.append(type(eager_obj))
    for cls in classes:
        for attr, value in list(vars(cls).items()):
            new = _tweak(value)
            if not attr.startswith("_") and new is not None:
                out.append(
                    (
                        f"class attribute {cls.__name__}.{attr}",
                        lambda e, c=cls, a=attr, v=new: _patched_attrs(e, [(c, a, v)]),
                    )
                )
            if isinstance(value, types.FunctionType) and attr != "__init__":
                patched = _wrapped_method(value)
                out.append(
                    (
                        f"method {cls.__name__}.{attr}",
                        lambda e, c=cls, a=attr, v=patched: _patched_attrs(e, [(c, a, v)]),
                    )
                )
    if env.eager_module is not None and len(out) > MODULE_SAMPLE:
        # Modules cost the most to capture: a seeded sample of their perturbations, in order.
        keep = sorted(rng.sample(range(len(out)), MODULE_SAMPLE))
        out = [out[k] for k in keep]
    return out


# --- module state changed in place (what a guard memo must not miss) ------------------------------
def _twins(env: Env, kind: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, eager tensor, compiled tensor) of the modules' parameters or buffers."""
    assert env.eager_module is not None and env.compiled_module is not None
    named = "named_parameters" if kind == "param" else "named_buffers"
    e = dict(getattr(env.eager_module, named)())
    c = dict(getattr(env.compiled_module, named)())
    return [(n, e[n], c[n]) for n in e if n in c]


def _owner(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, leaf = name.split(".")
    for part in path:
        module = getattr(module, part)
    return module, leaf


@contextlib.contextmanager
def _in_place(env: Env, tensors: tuple[torch.Tensor, torch.Tensor], change: str) -> Iterator[tuple[Any, ...]]:
    """A tensor's metadata changed in place: `.data =` (dtype, layout, shape), `requires_grad_()`,
    `resize_`; restored after."""
    saved = [(t.data, t.requires_grad) for t in tensors]
    for t in tensors:
        with torch.no_grad():
            if change == ".data = float64":
                t.data = t.data.double()
            elif change == ".data = transposed layout":
                t.data = t.data.t().contiguous().t()
            elif change == ".data = longer":
                t.data = torch.cat([t.data.reshape(-1), t.data.reshape(-1)])
            elif change == "requires_grad_()":
                t.requires_grad_(not t.requires_grad)
            elif change == "resize_":
                t.requires_grad_(False)
                t.resize_(t.numel() + 1)
    try:
        yield env.args
    finally:
        for t, (data, rg) in zip(tensors, saved, strict=True):
            t.data = data
            t.requires_grad_(rg)


@contextlib.contextmanager
def _module_dicts(env: Env, name: str, change: str) -> Iterator[tuple[Any, ...]]:
    """A module's dicts changed (a new dict version, same or different meaning); restored after."""
    assert env.eager_module is not None and env.compiled_module is not None
    undo: list[Callable[[], None]] = []
    for root in (env.eager_module, env.compiled_module):
        owner, leaf = _owner(root, name)
        if change == "parameter replaced by an equal one":
            old = owner._parameters[leaf]
            assert old is not None
            owner._parameters[leaf] = nn.Parameter(old.detach().clone(), old.requires_grad)
            undo.append(lambda o=owner, k=leaf, v=old: o._parameters.__setitem__(k, v))
        elif change == "attribute added":
            owner.__dict__["kiln_fuzz_extra"] = 1
            undo.append(lambda o=owner: o.__dict__.pop("kiln_fuzz_extra"))
        elif change == "forward hook adds 1":
            handle = owner.register_forward_hook(lambda m, a, out: _plus_one(out))
            undo.append(handle.remove)
        elif change == "submodule swapped for a copy":
            parent, child = _owner(root, name.rpartition(".")[0] or name)
            if child in parent._modules:
                old_mod = parent._modules[child]
                parent._modules[child] = copy.deepcopy(old_mod)
                undo.append(lambda p=parent, k=child, v=old_mod: p._modules.__setitem__(k, v))
    try:
        yield env.args
    finally:
        for u in reversed(undo):
            u()


IN_PLACE = (".data = float64", ".data = transposed layout", ".data = longer", "requires_grad_()", "resize_")
DICT_CHANGES = (
    "parameter replaced by an equal one",
    "attribute added",
    "forward hook adds 1",
    "submodule swapped for a copy",
)


def module_state_perturbations(env: Env, rng: random.Random) -> list[Perturbation]:
    """For a module case: in-place metadata changes of one parameter and one buffer, and changes
    of the module dicts that a guard memo witnesses."""
    if env.eager_module is None:
        return []
    out: list[Perturbation] = []
    for kind in ("param", "buffer"):
        twins = _twins(env, kind)
        if not twins:
            continue
        name, e, c = twins[rng.randrange(len(twins))]
        for change in IN_PLACE:
            if (change == ".data = transposed layout" and e.dim() != 2) or (
                change == "requires_grad_()" and not e.is_floating_point()
            ):
                continue
            out.append((f"{kind} {name} {change}", lambda env, t=(e, c), ch=change: _in_place(env, t, ch)))
    params = _twins(env, "param")
    if params:
        name = params[rng.randrange(len(params))][0]
        for change in DICT_CHANGES:
            out.append((f"{name}: {change}", lambda env, n=name, ch=change: _module_dicts(env, n, ch)))
    return out


# --- running --------------------------------------------------------------------------------------
def _run(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, BaseException | None, bool]:
    """The result or the error, and the grad mode the call left (then restored for the next)."""
    torch.default_generator.manual_seed(1234)  # (torch.manual_seed also seeds lazy CUDA)
    grad = torch.is_grad_enabled()
    try:
        return fn(*copy.deepcopy(args)), None, torch.is_grad_enabled()
    except Exception as e:  # eager's own error is part of the behaviour compared
        return None, e, torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(grad)


def _compare(env: Env, args: tuple[Any, ...], what: str, stale: list[str]) -> bool:
    """False when eager raises (the perturbation does not apply); records a stale answer."""
    expected, e_err, e_grad = _run(env.eager, args)
    actual, c_err, c_grad = _run(env.compiled, args)
    if e_grad != c_grad:
        stale.append(f"{env.name} / {what}: grad mode after the call is {c_grad}, eager leaves {e_grad}")
    if e_err is not None:
        if c_err is None:
            stale.append(f"{env.name} / {what}: eager raised {type(e_err).__name__}, compiled did not")
        return False
    if c_err is not None:
        stale.append(f"{env.name} / {what}: compiled raised {type(c_err).__name__}: {c_err}")
        return True
    try:
        assert_same(expected, actual)
    except AssertionError as err:
        stale.append(f"{env.name} / {what}: {err}")
    return True


@pytest.fixture
def big_cache() -> Iterator[None]:
    previous = kiln_frame_hook.set_cache_limit(64)
    try:
        yield
    finally:
        kiln_frame_hook.set_cache_limit(previous)


def test_guard_fuzz_finds_no_stale_answer(big_cache: None) -> None:
    """With C guard trees answering (issue 18), each also compared with its Python guard on
    every call (`checking_agreement`): no stale answer, no disagreement."""
    assert guard_tree.c_guards_enabled()
    residual: list[str] = []

    def listen(name: str, captured: Any) -> None:
        if captured.guard.tree is None or captured.guard.residual_parts:
            residual.append(name)

    capture_listeners.append(listen)
    try:
        with guard_tree.checking_agreement() as agreement:
            applied, not_applicable, stale = _fuzz()
    finally:
        capture_listeners.remove(listen)
    print(
        f"guard fuzz: {applied} perturbations applied, {not_applicable} not applicable, {len(stale)} stale; "
        f"{agreement.calls} guard calls compared C with Python, {len(agreement.disagreements)} disagreed; "
        f"{len(residual)} entries with a residual Python guard"
    )
    assert stale == [], "\n".join(stale)
    assert residual == [], residual
    assert agreement.disagreements == [], "\n".join(agreement.disagreements[:20])
    assert applied >= MIN_PERTURBATIONS, applied
    assert agreement.calls >= applied


def _fuzz() -> tuple[int, int, list[str]]:
    rng = random.Random(18)
    stale: list[str] = []
    applied = 0
    not_applicable = 0
    for name, make in _corpus():
        kiln_dynamo.reset()
        target, args = make()
        if isinstance(target, nn.Module):
            eager_module, compiled_module = copy.deepcopy(target), copy.deepcopy(target)
            env = Env(
                name,
                eager_module,
                compiled_module,
                kiln_dynamo.compile(compiled_module, backend=CountingBackend()),
                args,
                eager_module,
                compiled_module,
            )
        else:
            env = Env(
                name, target, target, kiln_dynamo.compile(target, backend=CountingBackend()), args, None, None
            )
        if not _compare(env, args, "base", stale):
            continue
        # Another backend over the same cache: its compile must not reuse the first one's entries.
        first, other = env.compiled, CountingBackend()
        env.compiled = kiln_dynamo.compile(
            env.compiled_module if env.compiled_module is not None else env.target, backend=other
        )
        had_graphs = kiln_dynamo.counters.graphs > 0
        if _compare(env, env.args, "another backend", stale):
            applied += 1
            if had_graphs and not other.graphs:
                stale.append(f"{name} / another backend: the first backend's entries were reused")
        env.compiled = first
        for what, perturb in perturbations(env, rng) + module_state_perturbations(env, rng):
            with perturb(env) as new_args:
                ran = _compare(env, new_args, what, stale)
            if ran:
                applied += 1
                _compare(env, env.args, f"{what}, undone", stale)
            else:
                not_applicable += 1
    kiln_dynamo.reset()
    return applied, not_applicable, stale
