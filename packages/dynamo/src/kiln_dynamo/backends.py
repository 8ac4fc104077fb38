"""Backends: `backend(gm, example_inputs) -> callable`, PyTorch's protocol.

A backend is given the captured torch.fx.GraphModule and the real example inputs (one per
placeholder) and returns what the runner calls with the inputs. Names registered here can be
passed as strings; `"eager"` runs the GraphModule as is. Any callable with the same signature
(PyTorch's own backends included) can be passed directly.
"""

from __future__ import annotations

from collections.abc import Callable
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
