"""The one helper every loopir test compares with eager through.

``check(fn, *inputs)`` traces ``fn`` (a function calling ``torch.ops.aten.*`` directly) with
``torch.fx.symbolic_trace`` (or takes a GraphModule), runs it eagerly and through
``compile_graph`` with the reference interpreter, and asserts the results are close with
tolerances chosen by dtype. It returns the compiled graph so tests can assert on ``.stats``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from kiln_loopir import CompiledGraph, compile_graph

aten = torch.ops.aten

# (rtol, atol) per dtype: float32 math may be composed differently from eager's kernels (a
# fused gelu, a softmax in two passes); bfloat16 rounds once per op like eager but the math
# library differs in the last bit.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def trace(fn: Callable[..., Any] | torch.fx.GraphModule) -> torch.fx.GraphModule:
    return fn if isinstance(fn, torch.fx.GraphModule) else torch.fx.symbolic_trace(fn)


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def assert_same(
    actual: Any, expected: Any, tolerances: dict[torch.dtype, tuple[float, float]] | None = None
) -> None:
    """``tolerances``: (rtol, atol) per dtype in place of TOLERANCES' (a product summed in another
    order than eager's kernel: its error grows with the reduction's length)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), type(actual)
        rtol, atol = {**TOLERANCES, **(tolerances or {})}.get(expected.dtype, (0.0, 0.0))
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e, tolerances)
    else:
        assert actual == expected


def check(
    fn: Callable[..., Any] | torch.fx.GraphModule,
    *inputs: Any,
    fusion: bool = True,
    allow_fallback: bool = False,
    options: dict[str, Any] | None = None,
    backend: Any = "interpret",
    tolerances: dict[torch.dtype, tuple[float, float]] | None = None,
) -> CompiledGraph:
    """Compile ``fn`` for ``inputs``, run it, compare with eager; return the compiled graph."""
    gm = trace(fn)
    expected = gm(*[_clone(x) for x in inputs])
    compiled = compile_graph(gm, list(inputs), backend=backend, fusion=fusion, options=options)
    actual = compiled(*[_clone(x) for x in inputs])
    assert_same(actual, expected, tolerances)
    if not allow_fallback:
        assert compiled.stats.fallbacks == (), compiled.stats.fallbacks
    return compiled


def make(
    shape: tuple[int, ...], dtype: torch.dtype = torch.float32, *, low: float = -2, high: float = 2
) -> torch.Tensor:
    """A random tensor of ``dtype`` (bool and integer dtypes included)."""
    return torch.testing.make_tensor(shape, dtype=dtype, device="cpu", low=low, high=high)


def unary(op: Callable[..., Any]) -> Callable[[Any], Any]:
    """``op`` wrapped in a plain function that symbolic_trace can trace."""

    def fn(a: Any) -> Any:
        return op(a)

    return fn


def binary(op: Callable[..., Any]) -> Callable[[Any, Any], Any]:
    """``op`` of two inputs wrapped for symbolic_trace."""

    def fn(a: Any, b: Any) -> Any:
        return op(a, b)

    return fn
