"""Backends: `backend(gm, example_inputs) -> callable`, PyTorch's protocol.

A backend is given the captured torch.fx.GraphModule and the real example inputs (one per
placeholder) and returns what the runner calls with the inputs. Names registered here can be
passed as strings; `"eager"` runs the GraphModule as is. Any callable with the same signature
(PyTorch's own backends included) can be passed directly. Which backend (and which of its modes
or options) made a cache entry is part of the entry's guard (Note [The compile key in every
guard]).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.fx

Backend = Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]

_REGISTRY: dict[str, Backend] = {}


def register_backend(name: str, fn: Backend) -> Backend:
    _REGISTRY[name] = fn
    return fn


def eager(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm.forward


register_backend("eager", eager)


def lookup_backend(backend: str | Backend) -> Backend:
    if isinstance(backend, str):
        if backend not in _REGISTRY:
            raise ValueError(f"unknown kiln_dynamo backend {backend!r}; known: {sorted(_REGISTRY)}")
        return _REGISTRY[backend]
    if not callable(backend):
        raise TypeError(f"backend must be a name or a callable, not {type(backend).__name__}")
    return backend


# Note [The compile key in every guard]: the frame hook's cache is per code object, shared by
# every `compile(...)` of that code (a module compiled twice, once with another backend or mode;
# a helper called from two compiled functions). So each entry's guard starts by checking that
# the compile now running is the one that made it: its `CompileKey` (the backend, or the
# `__kiln_cache_key__` a backend declares for itself, e.g. kiln's ("kiln", mode, options), and
# fullgraph) is interned, the compiled wrapper puts it in the thread-local `ACTIVE.key` while
# it runs, and the guard tests `ACTIVE.key is <key>` — one attribute read and one identity test.
# Two compiles with equal keys share entries; any difference recompiles.


@dataclass(frozen=True, slots=True)
class CompileKey:
    backend: object  # the declared key, or a weak reference to the backend (or the backend itself)
    fullgraph: bool
    label: str
    dynamic: bool | None = None  # torch.compile's `dynamic=` (kiln_dynamo.shapes)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CompileKey)
            and self.backend == other.backend
            and self.fullgraph == other.fullgraph
            and self.dynamic is other.dynamic
        )

    def __hash__(self) -> int:
        return hash((self.backend, self.fullgraph, self.dynamic))


class _Active(threading.local):
    key: CompileKey | None = None


class _ByIdentity:
    """A backend that is neither weakly referenceable nor hashable: compared by identity (and
    kept alive by its key)."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByIdentity) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


ACTIVE = _Active()
_interned: dict[CompileKey, CompileKey] = {}


def compile_key(backend: Backend, fullgraph: bool, dynamic: bool | None = None) -> CompileKey:
    """The interned key of a compile with `backend` (Note [The compile key in every guard])."""
    declared = getattr(backend, "__kiln_cache_key__", None)
    label = getattr(backend, "__name__", type(backend).__name__)
    ident: object
    if declared is not None:
        ident = ("declared", declared)
        label = f"{label} {declared!r}"
    else:
        try:
            ident = weakref.ref(backend)  # equal while alive and equal; a dead one equals nothing
            hash(ident)
        except TypeError:
            ident = _ByIdentity(backend)
    extra = (", fullgraph" if fullgraph else "") + (f", dynamic={dynamic}" if dynamic is not None else "")
    key = CompileKey(ident, fullgraph, f"{label}{extra}", dynamic)
    return _interned.setdefault(key, key)
