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
from typing import Any

import torch
import torch.fx

from kiln_codegen_cpp import CppBackend
from kiln_loopir import CompiledGraph, testing
from kiln_loopir.testing import TOLERANCES, Call, In, assert_same, eager_supports, graph_of, make, trace

aten = torch.ops.aten

# one floor down (kiln_loopir.testing), re-exported for the tests that import them from here
__all__ = [
    "TOLERANCES",
    "Call",
    "In",
    "assert_same",
    "aten",
    "check",
    "eager",
    "eager_supports",
    "graph_of",
    "make",
    "trace",
]


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
    options: dict[str, Any] | None = None,
) -> CompiledGraph:
    """Compile ``fn`` for ``inputs`` with the cpp backend (and loopir pass ``options``), run it,
    compare with eager."""
    gm = trace(fn)
    expected = eager(gm, *inputs)
    backend = CppBackend()
    compiled: CompiledGraph = testing.check_compiled(
        gm,
        inputs,
        expected,
        backend,
        names=names,
        scale=scale,
        allow_declined=allow_interpreted,
        options=options,
    )
    compiled.backend = backend  # type: ignore[attr-defined]
    return compiled
