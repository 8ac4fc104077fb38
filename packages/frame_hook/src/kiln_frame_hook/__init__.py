"""kiln-frame-hook: the PEP 523 frame-evaluation hook through which kiln sees every Python frame.

The model. While a callback is set, every Python frame about to run (except generators,
coroutines, module and class bodies, the standard library and kiln's own code) passes through
the hook. Each code object carries a cache of entries, each a *guard* and a *transformed code
object*. On a call the guards of the entries made under the frame's globals are tried, most
recently hit first (functions sharing a code object may differ in their globals, Note [An entry
serves its frame's globals] in _C.c); the first that passes has its code run in place of the
original, and its result returned. If none passes, the callback is given
the frame (a `Frame`) and may answer with a `GuardedCode`, which is added to the cache and run
now, or with `RUN`, `SKIP` or `RUN_ONLY`. Frames started while a guard or the callback runs are
never intercepted. A per-code limit bounds the entries; at the limit the callback is told
(`Frame.limit_reached`) and a new entry replaces the least recently used.

Guards are called positionally with the frame's entry values, named by `entry_names(code)`.
Guards must not hold strong references to the function being compiled: the cache lives in the
code object's co_extra slot, which the garbage collector does not see, so such a reference would
keep the function alive forever.

A guard may be a `GuardTree`: a program of loads and checks over the entry values that the hook
evaluates in C, with no Python call when it passes (guard_tree.c; ops in `GuardOp`). Any other
callable is called.

Callbacks: `set_callback` / `callback(...)` set one for every thread of the interpreter;
`set_thread_callback` / `thread_callback(...)` set one for the calling thread only, which wins
over the interpreter-wide one (kiln_dynamo uses this: a compiled function captures only the
frames it started itself, whichever thread runs it). `run_only()` makes the calling thread run
cached entries without calling the callback. No torch here: this package needs CPython only
(3.11 and 3.12).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import CodeType

from kiln_frame_hook import _C
from kiln_frame_hook._C import CacheEntry, GuardTree
from kiln_frame_hook._dispatch import (
    UNBOUND,
    Action,
    Frame,
    GuardedCode,
    add_skip_prefix,
    entry_names,
    is_skipped,
    skip_code,
)
from kiln_frame_hook._dispatch import clear as _clear_code
from kiln_frame_hook._dispatch import reset as _reset_dispatch
from kiln_frame_hook._guard_ops import GuardOp, op

__version__ = "0.1.0"

__all__ = [
    "RUN",
    "RUN_ONLY",
    "SKIP",
    "UNBOUND",
    "Action",
    "CacheEntry",
    "Callback",
    "Frame",
    "GuardOp",
    "GuardTree",
    "GuardedCode",
    "add_skip_prefix",
    "cache_entries",
    "callback",
    "clear_cache",
    "entry_names",
    "get_cache_limit",
    "is_installed",
    "is_skipped",
    "op",
    "reset",
    "run_counts",
    "run_only",
    "set_cache_limit",
    "set_callback",
    "set_tensor_checker",
    "set_thread_callback",
    "skip_code",
    "thread_callback",
]

RUN = Action.RUN
SKIP = Action.SKIP
RUN_ONLY = Action.RUN_ONLY

Callback = Callable[[Frame], "GuardedCode | Action | None"]


def set_callback(cb: Callback | None) -> Callback | None:
    """Set the interpreter-wide callback (None: none); return the previous one."""
    previous: Callback | None = _C.set_callback(cb)
    return previous


# Set the calling thread's callback, which overrides the interpreter-wide one (None: use the
# interpreter-wide one); return the previous one. The C function itself, with no Python frame
# around it: kiln_dynamo sets and restores it twice on every compiled call (around the user's
# module, and around the backend's compiled code), host time per call (issue 14).
set_thread_callback: Callable[[Callback | None], Callback | None] = _C.set_thread_callback


@contextlib.contextmanager
def callback(cb: Callback | None) -> Iterator[None]:
    """Within the block, `cb` is the interpreter-wide callback; the previous one is restored after."""
    previous = set_callback(cb)
    try:
        yield
    finally:
        set_callback(previous)


@contextlib.contextmanager
def thread_callback(cb: Callback | None) -> Iterator[None]:
    """Within the block, `cb` is the calling thread's callback; the previous one is restored after."""
    previous = set_thread_callback(cb)
    try:
        yield
    finally:
        set_thread_callback(previous)


@contextlib.contextmanager
def run_only() -> Iterator[None]:
    """Within the block, on this thread, cached entries still run but the callback is not called."""
    previous = _C.set_thread_mode(_C.MODE_RUN_ONLY)
    try:
        yield
    finally:
        _C.set_thread_mode(previous)


def cache_entries(code: CodeType) -> list[CacheEntry]:
    """The code's cache entries, most recently hit first."""
    return _C.entries(code)


def clear_cache(code: CodeType) -> None:
    """Drop the code's entries and any SKIP / RUN_ONLY decision for it (skip_code's included)."""
    _clear_code(code)


def reset() -> None:
    """Drop every cache entry and strategy. Codes passed to skip_code stay skipped."""
    _reset_dispatch()


def set_cache_limit(limit: int) -> int:
    """Set the number of entries a code object may hold (default 8); return the previous limit."""
    return _C.set_cache_limit(limit)


def get_cache_limit() -> int:
    return _C.get_cache_limit()


def run_counts() -> dict[str, int]:
    """How many entries ran since import: `in_place` (in the original's frame), `reused_function`
    and `new_function` (through a function, when the transformed code's frame is larger)."""
    return _C.run_counts()


def is_installed() -> bool:
    """Whether the evaluator is installed now (while any callback is set)."""
    return _C.is_installed()


def set_tensor_checker(capsule: object) -> object:
    """Hand over a tensor checker linked against libtorch (a capsule: kiln_tensor_check.h), or
    None to go back to reading tensor metadata through attributes; returns the previous one. Guard
    tree rows marked `fast` are then checked by one call that reads the TensorImpl."""
    return _C.set_tensor_checker(capsule)
