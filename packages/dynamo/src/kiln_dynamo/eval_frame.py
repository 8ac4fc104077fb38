"""User-facing entry points: `compile`, `reset`, and the module wrapper.

`compile(fn, backend)` returns a callable that, on each call, looks for a cache entry of `fn`'s
code whose guard accepts the call's entry values and runs its trampoline; on a miss it captures
the frame (convert_frame.py) and adds an entry, up to the cache limit. A frame with code no
graph can hold is split at a graph break and capture resumes in a continuation function; one
that cannot be split runs as plain Python, with the reason recorded in `counters.fallbacks` (or,
with `fullgraph=True`, raised as `Unsupported`).

The normal path is kiln_frame_hook: the wrapper installs this compile's callback as the thread
callback while `fn` runs (Note [One callback per compile] in convert_frame.py), and the hook's
per-code cache holds (guard, trampoline) entries. A frame that falls back runs as plain Python
and the frames it calls are offered to the callback in turn.

Note [Dispatch without the frame hook]: when the hook's C extension is not importable (a source
checkout that was not built), the cache lives here, per code object, and the wrapper does the
hook's work in Python: it binds the call's arguments exactly as CPython would (by calling a
trampoline whose runner just returns the entry values), checks guards most-recently-hit first,
and calls the chosen trampoline as a function with the original globals, defaults and closure.
Only the frame of `fn` itself is captured then (a split frame's continuations run as plain
Python there).
"""

from __future__ import annotations

import functools
import linecache
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from kiln_dynamo import bytecode, convert_frame
from kiln_dynamo.backends import ACTIVE, Backend, CompileKey, compile_key, lookup_backend
from kiln_dynamo.convert_frame import CapturedFrame, _logged_sites, capture, entry_names, make_callback
from kiln_dynamo.counters import counters
from kiln_dynamo.exc import Unsupported, UserFrame
from kiln_dynamo.logs import graph_breaks_log, recompiles_log
from kiln_dynamo.shapes import reset_frame_states

CACHE_LIMIT = 8

try:
    import kiln_frame_hook as _hook

    HAVE_HOOK = True
except ImportError:  # Note [Dispatch without the frame hook]
    _hook = None  # type: ignore[assignment]
    HAVE_HOOK = False


@dataclass(slots=True)
class _Entry:
    captured: CapturedFrame
    fn: Callable[..., Any]


@dataclass(slots=True)
class _CodeCache:
    entries: list[_Entry] = field(default_factory=list)
    skip_reason: str | None = None
    binder: Callable[..., tuple[Any, ...]] | None = None


_caches: dict[types.CodeType, _CodeCache] = {}


def reset() -> None:
    """Drop every cache entry and zero the counters."""
    _caches.clear()
    _logged_sites.clear()
    reset_frame_states()
    if HAVE_HOOK:
        _hook.reset()
    counters.reset()


def _call_hooked(
    callback: Any, key: CompileKey, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    previous = _hook.set_thread_callback(callback)
    previous_key, ACTIVE.key = ACTIVE.key, key  # Note [The compile key in every guard]
    try:
        return fn(*args, **kwargs)
    finally:
        ACTIVE.key = previous_key
        _hook.set_thread_callback(previous)


def _as_function(fn: Callable[..., Any]) -> tuple[types.FunctionType, tuple[Any, ...]]:
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return fn.__func__, (fn.__self__,)
    if isinstance(fn, types.FunctionType):
        return fn, ()
    raise TypeError(
        f"kiln_dynamo.compile expects a function, a method or an nn.Module, not {type(fn).__name__}"
    )


def _make_function(f: types.FunctionType, code: types.CodeType) -> types.FunctionType:
    g = types.FunctionType(code, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    return g


def _pack(*values: Any) -> tuple[Any, ...]:
    return values


def _entry_values(
    f: types.FunctionType, cache: _CodeCache, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    if cache.binder is None:
        code = f.__code__
        cache.binder = _make_function(f, bytecode.build_trampoline(code, _pack, entry_names(code)))
    return cache.binder(*args, **kwargs)


def _run_compiled(
    f: types.FunctionType,
    bound_self: tuple[Any, ...],
    backend: Backend,
    key: CompileKey,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The hook-less path: `key` is computed once per compiled function (compile_key())."""
    code = f.__code__
    cache = _caches.get(code)
    if cache is None:
        cache = _caches[code] = _CodeCache()
    if cache.skip_reason is not None:
        return f(*bound_self, *args, **kwargs)
    previous_key, ACTIVE.key = ACTIVE.key, key
    try:
        return _run_cached(f, cache, bound_self, backend, key, args, kwargs)
    finally:
        ACTIVE.key = previous_key


def _run_cached(
    f: types.FunctionType,
    cache: _CodeCache,
    bound_self: tuple[Any, ...],
    backend: Backend,
    key: CompileKey,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    code = f.__code__
    call_args = (*bound_self, *args)
    values = _entry_values(f, cache, call_args, kwargs)
    for i, entry in enumerate(cache.entries):
        if entry.captured.guard(*values):
            if i:
                cache.entries.insert(0, cache.entries.pop(i))
            return entry.fn(*call_args, **kwargs)
    counters.frames_seen += 1
    if cache.entries:
        reason = cache.entries[0].captured.guard.failure_reason(values)
        counters.recompiles += 1
        counters.guard_failures.append(f"{code.co_name}: {reason}")
        recompiles_log.info(
            "recompiling %s (%s:%s): guard failed: %s",
            code.co_name,
            code.co_filename,
            code.co_firstlineno,
            reason,
        )
        if len(cache.entries) >= CACHE_LIMIT:
            msg = f"cache limit ({CACHE_LIMIT}) reached; last failure: {reason}"
            counters.fallbacks.append((code.co_name, msg))
            recompiles_log.warning("%s: %s", code.co_name, msg)
            return f(*bound_self, *args, **kwargs)
    names = entry_names(code)
    try:
        captured = capture(
            code,
            dict(zip(names, values, strict=True)),
            f.__globals__,
            _builtins_of(f),
            backend,
            key=key,
        )
    except Unsupported as e:
        if key.fullgraph:
            raise
        counters.fallbacks.append((code.co_name, str(e)))
        graph_breaks_log.info("%s runs as plain Python: %s", code.co_name, e)
        cache.skip_reason = str(e)
        return f(*bound_self, *args, **kwargs)
    counters.frames_captured += 1
    if captured.split is not None:  # its continuations run as plain Python on this path
        counters.graph_breaks += 1
        counters.break_reasons.append(captured.split)
    entry = _Entry(captured, _make_function(f, captured.code))
    cache.entries.insert(0, entry)
    if captured.guard.lock is not None and not captured.guard(*values):
        return f(*bound_self, *args, **kwargs)  # Note [Effects under a lock replayed under it]
    return entry.fn(*call_args, **kwargs)


def _builtins_of(f: types.FunctionType) -> dict[str, Any]:
    b = f.__globals__.get("__builtins__", __builtins__)
    return b if isinstance(b, dict) else vars(b)


def _global_hooks() -> bool:
    g = nn.modules.module
    return bool(
        g._global_forward_hooks
        or g._global_forward_pre_hooks
        or g._global_backward_hooks
        or g._global_backward_pre_hooks
    )


class CompiledModule(nn.Module):
    """Wraps a module: `forward` is captured; attributes, state_dict, train/eval go to the module."""

    def __init__(
        self, mod: nn.Module, backend: Backend, fullgraph: bool, dynamic: bool | None = None
    ) -> None:
        super().__init__()
        self._orig_mod = mod
        object.__setattr__(self, "_kiln_backend", backend)
        fwd = getattr(type(mod).forward, "__code__", None)
        targets = frozenset([fwd]) if fwd is not None else frozenset()
        cb = make_callback(backend, fullgraph, targets, dynamic) if HAVE_HOOK else None
        object.__setattr__(self, "_kiln_callback", cb)
        object.__setattr__(self, "_kiln_key", compile_key(backend, fullgraph, dynamic))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Note [Global module hooks and the wrapper]: torch's global module hooks
        # (`register_module_forward_hook`) fire for every module call, and the wrapped module's
        # call below fires them once; the wrapper's own Module.__call__ would fire them a second
        # time (a global forward hook adding 10 added 20; torch.compile's wrapper does so too,
        # with a warning). So the wrapper runs its forward directly unless it has hooks of its own.
        if self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks:
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._orig_mod
        if self._kiln_callback is not None:
            return _call_hooked(self._kiln_callback, self._kiln_key, mod, args, kwargs)
        if mod._forward_hooks or mod._forward_pre_hooks or _global_hooks():
            return mod(*args, **kwargs)
        f, bound = _as_function(mod.forward)
        return _run_compiled(f, bound, self._kiln_backend, self._kiln_key, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._orig_mod, name)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def train(self, mode: bool = True) -> CompiledModule:
        self._orig_mod.train(mode)
        self.training = mode
        return self


def compile(
    fn_or_module: Any,
    backend: str | Backend = "eager",
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
) -> Any:
    """Capture `fn_or_module` into FX graphs run by `backend` (PyTorch's backend protocol).
    `dynamic`: None = static first, then the dims that changed become symbolic (automatic
    dynamic); True = symbolic sizes from the first call; False = always static (shapes.py)."""
    if dynamic not in (None, True, False):
        raise TypeError(f"dynamic must be None, True or False, not {dynamic!r}")
    be = lookup_backend(backend)
    if isinstance(fn_or_module, nn.Module):
        return CompiledModule(fn_or_module, be, fullgraph, dynamic)
    if isinstance(fn_or_module, functools.partial):
        # Note [Compiling a partial]: a partial's __call__ is C (a method-wrapper), so no frame of
        # its own runs; what runs is the frame of the function it wraps. Compile that one and bind
        # the partial's arguments again around it (CPython flattens nested partials, so `func` is
        # not a partial). The arguments it binds reach the frame as any caller's would: tensors
        # are graph inputs, other values are guarded like the caller's.
        inner = compile(fn_or_module.func, be, fullgraph=fullgraph, dynamic=dynamic)
        return functools.partial(inner, *fn_or_module.args, **fn_or_module.keywords)
    if not isinstance(fn_or_module, (types.FunctionType, types.MethodType)) and callable(fn_or_module):
        # the class's own __call__, as Python would find it (not through the instance)
        call = next(
            (k.__dict__["__call__"] for k in type(fn_or_module).__mro__ if "__call__" in k.__dict__), None
        )
        if not isinstance(call, types.FunctionType):
            raise TypeError(
                f"kiln_dynamo.compile expects a function, a method, an nn.Module, a functools.partial or an "
                f"object whose class defines __call__ in Python; {type(fn_or_module).__name__} runs no Python "
                f"frame to capture"
            )
        fn_or_module = fn_or_module.__call__  # a callable object: its __call__, bound
    f, bound = _as_function(fn_or_module)
    code = f.__code__
    if code.co_flags & (0x20 | 0x200):
        # Its frame runs when the generator is iterated, after the call returned: never captured.
        line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
        convert_frame.record_plain(
            code,
            Unsupported(
                "generator function: kiln runs generators as plain Python",
                f"{code.co_filename}:{code.co_firstlineno}",
                advice="compile the function that consumes the generator instead",
                frames=(UserFrame(code.co_filename, code.co_firstlineno, code.co_name, line),),
            ),
        )
    key = compile_key(be, fullgraph, dynamic)
    if HAVE_HOOK:
        callback = make_callback(be, fullgraph, frozenset([f.__code__]), dynamic)

        @functools.wraps(fn_or_module)
        def compiled(*args: Any, **kwargs: Any) -> Any:
            return _call_hooked(callback, key, fn_or_module, args, kwargs)

    else:

        @functools.wraps(fn_or_module)
        def compiled(*args: Any, **kwargs: Any) -> Any:
            return _run_compiled(f, bound, be, key, args, kwargs)

    compiled._kiln_original = fn_or_module  # type: ignore[attr-defined]
    compiled._kiln_key = key  # type: ignore[attr-defined]  # what its entries' guards check first
    return compiled


_ = torch
