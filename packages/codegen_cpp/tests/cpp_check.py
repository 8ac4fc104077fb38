"""The one helper every codegen_cpp test compares with eager through.

``check(fn, *inputs)`` traces ``fn`` (a function calling ``torch.ops.aten.*``, or a ready
GraphModule), runs it eagerly (:func:`eager`: ATen's kernels, Note [oneDNN is not the reference])
and through ``compile_graph(..., backend="cpp")``, and compares
every output with tolerances chosen by dtype (integers and bools exactly). ``names`` labels the
outputs so a failure says which op differed. It returns the compiled graph.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from kiln_codegen_cpp import CppBackend
from kiln_loopir import CompiledGraph, compile_graph

aten = torch.ops.aten

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (2e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def trace(fn: Callable[..., Any] | torch.fx.GraphModule) -> torch.fx.GraphModule:
    return fn if isinstance(fn, torch.fx.GraphModule) else torch.fx.symbolic_trace(fn)


@dataclass(frozen=True)
class In:
    """Placeholder ``index`` of a graph built by :func:`graph_of`."""

    index: int


Call = tuple[Any, tuple[Any, ...], dict[str, Any]]


def graph_of(calls: Sequence[Call], n_inputs: int) -> torch.fx.GraphModule:
    """A graph of ``n_inputs`` placeholders and one output per ``(op, args, kwargs)`` call.

    In ``args`` an :class:`In` names a placeholder; anything else is passed as it is.
    """
    g = torch.fx.Graph()
    xs = [g.placeholder(f"in{i}") for i in range(n_inputs)]
    outs = []
    for op, positions, extra in calls:
        args = tuple(xs[p.index] if isinstance(p, In) else p for p in positions)
        outs.append(g.call_function(op, args, extra))
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def assert_same(actual: Any, expected: Any, label: str = "output", scale: float = 1.0) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{label}: got {type(actual)}"
        assert actual.dtype == expected.dtype, f"{label}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
        rtol, atol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
        torch.testing.assert_close(
            actual,
            expected,
            rtol=rtol * scale,
            atol=atol * scale,
            equal_nan=True,
            msg=lambda m: f"{label}: {m}",
        )
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple) and len(actual) == len(expected), label
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{label}[{i}]", scale)
    else:
        assert actual == expected, f"{label}: {actual!r} != {expected!r}"


def eager(fn: Callable[..., Any], *inputs: Any) -> Any:
    """``fn(*inputs)`` run eagerly by ATen's own CPU kernels, the reference every test uses.

    Note [oneDNN is not the reference]: for some ops on contiguous float32/bfloat16 tensors eager
    calls oneDNN, whose JIT kernels differ by CPU: on AVX-512 its gelu returns NaN for +inf
    (pytorch/pytorch#185770, open), on AVX2 +inf, while ATen's kernel gives +inf everywhere.
    That made a gelu(+inf) test fail on an AVX-512 Xeon and pass here although kiln computed
    the same +inf on both. With oneDNN off the reference no longer depends on the machine.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flags() also re-sets oneDNN's TF32 flag, with a warning
        with torch.backends.mkldnn.flags(enabled=False):
            return fn(*inputs)  # graphs are functional: inputs are not mutated


def check(
    fn: Callable[..., Any] | torch.fx.GraphModule,
    *inputs: Any,
    names: Sequence[str] | None = None,
    scale: float = 1.0,
    allow_interpreted: bool = False,
) -> CompiledGraph:
    """Compile ``fn`` for ``inputs`` with the cpp backend, run it, compare with eager."""
    gm = trace(fn)
    expected = eager(gm, *inputs)
    backend = CppBackend()
    compiled = compile_graph(gm, list(inputs), backend=backend)
    actual = compiled(*inputs)
    if names is not None and isinstance(expected, tuple):
        for name, a, e in zip(names, actual, expected, strict=True):
            assert_same(a, e, name, scale)
    else:
        assert_same(actual, expected, "output", scale)
    if not allow_interpreted:
        assert backend.last_declined == [], backend.last_declined
    compiled.backend = backend  # type: ignore[attr-defined]
    return compiled


def make(
    shape: tuple[int, ...], dtype: torch.dtype = torch.float32, *, low: float = -2, high: float = 2, **kw: Any
) -> torch.Tensor:
    return torch.testing.make_tensor(shape, dtype=dtype, device="cpu", low=low, high=high, **kw)


def eager_supports(op: Any, *args: Any) -> bool:
    try:
        op(*args)
    except Exception:
        return False
    return True
