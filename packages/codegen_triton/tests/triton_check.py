"""The one helper every codegen_triton test compares with eager through, and the device list.

``check(fn, *inputs, device=...)`` traces ``fn`` (a function calling ``torch.ops.aten.*``, or a
ready GraphModule), moves the inputs to ``device``, runs the graph eagerly and through
``compile_graph(..., backend=TritonBackend(...))``, and compares every output with tolerances
chosen by dtype (integers and bools exactly). ``names`` labels the outputs so a failure says
which op differed. It returns the backend, whose ``last_specs`` say how each kernel was built.

Note [Eager disagrees with itself]: eager CPU kernels may compute an element differently in their
vectorized body and in their scalar tail. With oneDNN on an AVX-512 CPU, ``gelu`` of +inf is NaN
in a vectorized run (``gelu(torch.full((64,), inf))``) and +inf alone (``gelu(torch.tensor([inf]))``),
which is also the limit the math gives (pytorch/pytorch#185770; codegen_cpp's tests answer the same
trap by turning oneDNN off). So at the positions a test names (``elementwise_at``: the special
values of a pointwise sweep) eager also runs on each element alone; where the two eager answers
differ beyond tolerance, the compiled value may be either, and must still be one of them. Where
eager agrees with itself nothing changes. Among the pointwise sweeps' ops and dtypes only gelu(+inf)
in float32 and bfloat16 disagreed on this AVX-512 machine (the rest differ only by rounding,
within tolerance, on finite values).

``DEVICES`` is ``["cpu"]`` under Triton's interpreter (CI) and ``["cuda"]`` on a GPU machine, so
every test runs on whatever can execute Triton kernels here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from kiln_codegen_triton import TritonBackend, interpreting
from kiln_loopir import testing
from kiln_loopir.testing import TOLERANCES, Call, In, assert_same, eager_supports, graph_of, make, trace

aten = torch.ops.aten

DEVICES = ["cpu"] if interpreting() else ["cuda"]

# one floor down (kiln_loopir.testing), re-exported for the tests that import them from here
__all__ = [
    "DEVICES",
    "TOLERANCES",
    "Call",
    "In",
    "assert_same",
    "aten",
    "check",
    "constants_to_device",
    "eager_supports",
    "graph_of",
    "graph_to_device",
    "kinds",
    "make",
    "reconcile_elementwise",
    "to_device",
    "trace",
]


def graph_to_device(gm: torch.fx.GraphModule, device: str) -> torch.fx.GraphModule:
    """Point the ``device`` arguments of a recorded graph's creation ops (recorded from CPU
    samples, or left to the default device) at ``device``, so the graph computes where its inputs
    are moved: a graph without tensor inputs would otherwise create, and compute, on the CPU."""
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        takes_device = schema is not None and any(a.name == "device" for a in schema.arguments)
        if takes_device and (
            node.kwargs.get("device") is None or isinstance(node.kwargs["device"], torch.device | str)
        ):
            node.kwargs = {**node.kwargs, "device": torch.device(device)}
    gm.recompile()
    return gm


def constants_to_device(gm: torch.fx.GraphModule, device: str) -> torch.fx.GraphModule:
    """Move the tensors a traced graph holds as constants (what ``symbolic_trace`` made of a
    creation op without inputs, ``_tensor_constant0``) to ``device``, where its inputs go."""
    for node in gm.graph.nodes:
        if node.op == "get_attr" and "." not in str(node.target):
            value = getattr(gm, str(node.target))
            if isinstance(value, torch.Tensor) and value.device != torch.device(device):
                setattr(gm, str(node.target), value.to(device))
    return gm


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.dtype.is_floating_point:
        return bool(a == b)
    rtol, atol = TOLERANCES.get(a.dtype, (0.0, 0.0))
    return bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


def reconcile_elementwise(
    gm: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    actual: Sequence[torch.Tensor],
    positions: Sequence[tuple[int, ...]],
) -> list[torch.Tensor]:
    """``expected``, where eager on one element alone disagrees with eager on the whole tensor
    and ``actual`` matches the former, holding the former (Note [Eager disagrees with itself]).
    For pointwise graphs whose inputs and outputs all have one shape."""
    out = list(expected)
    for pos in positions:
        alone = gm(*[t[pos].reshape(1) for t in inputs])
        for i, (e, a, one) in enumerate(zip(expected, actual, alone, strict=True)):
            if not _close(e[pos], one[0]) and _close(a[pos], one[0]):
                if out[i] is e:
                    out[i] = e.clone()
                out[i][pos] = one[0]
    return out


def to_device(value: Any, device: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return value


def check(
    fn: Callable[..., Any] | torch.fx.GraphModule,
    *inputs: Any,
    device: str,
    names: Sequence[str] | None = None,
    scale: float = 1.0,
    allow_declined: bool = False,
    backend: TritonBackend | None = None,
    calls: int = 1,
    elementwise_at: Sequence[tuple[int, ...]] = (),
) -> TritonBackend:
    """Compile ``fn`` for ``inputs`` on ``device`` with the triton backend, compare with eager.

    ``elementwise_at``: positions where eager is also asked about each element alone, and either
    answer counts (Note [Eager disagrees with itself]); ``fn`` must then be pointwise."""
    gm = constants_to_device(trace(fn), device)
    inputs = tuple(to_device(list(inputs), device))
    expected = gm(*inputs)  # graphs are functional: inputs are not mutated
    backend = backend or TritonBackend()

    def reconcile(expected: Any, actual: Any) -> Any:
        assert isinstance(expected, tuple), "elementwise_at needs a graph of several outputs"
        return tuple(reconcile_elementwise(gm, inputs, expected, actual, elementwise_at))

    testing.check_compiled(
        gm,
        inputs,
        expected,
        backend,
        names=names,
        scale=scale,
        allow_declined=allow_declined,
        calls=calls,
        reconcile=reconcile if elementwise_at else None,
    )
    return backend


def kinds(backend: TritonBackend) -> list[str]:
    """How each kernel of the last compilation was blocked."""
    return [s.kind for s in backend.last_specs]
