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
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from kiln_codegen_triton import TritonBackend, interpreting
from kiln_loopir import compile_graph

aten = torch.ops.aten

DEVICES = ["cpu"] if interpreting() else ["cuda"]

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
    """A graph of ``n_inputs`` placeholders and one output per ``(op, args, kwargs)`` call."""
    g = torch.fx.Graph()
    xs = [g.placeholder(f"in{i}") for i in range(n_inputs)]
    outs = []

    def arg(p: Any) -> Any:
        if isinstance(p, In):
            return xs[p.index]
        return [arg(q) for q in p] if isinstance(p, list) else p

    for op, positions, extra in calls:
        args = tuple(arg(p) for p in positions)
        outs.append(g.call_function(op, args, extra))
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def assert_same(actual: Any, expected: Any, label: str = "output", scale: float = 1.0) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{label}: got {type(actual)}"
        assert actual.dtype == expected.dtype, f"{label}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
        assert actual.device == expected.device, f"{label}: device {actual.device} != {expected.device}"
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
    gm = trace(fn)
    inputs = tuple(to_device(list(inputs), device))
    expected = gm(*inputs)  # graphs are functional: inputs are not mutated
    backend = backend or TritonBackend()
    compiled = compile_graph(gm, list(inputs), backend=backend)
    for _ in range(calls):
        actual = compiled(*inputs)
        if elementwise_at:
            assert isinstance(expected, tuple), "elementwise_at needs a graph of several outputs"
            expected = tuple(reconcile_elementwise(gm, inputs, expected, actual, elementwise_at))
        if names is not None and isinstance(expected, tuple):
            for name, a, e in zip(names, actual, expected, strict=True):
                assert_same(a, e, name, scale)
        else:
            assert_same(actual, expected, "output", scale)
    if not allow_declined:
        assert backend.last_declined == [], backend.last_declined
    return backend


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


def kinds(backend: TritonBackend) -> list[str]:
    """How each kernel of the last compilation was blocked."""
    return [s.kind for s in backend.last_specs]
