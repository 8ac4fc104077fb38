"""kiln's backends by name, each a function with PyTorch's backend protocol:
`backend(gm, example_inputs) -> callable`.

  eager      capture only: dynamo's graph runs as it is;
  aot_eager  capture + kiln_aotgrad: aten graphs, forward and backward, run unfused;
  kiln       capture + aotgrad + loopir + the code generator for the graph's device (cpp on the
             CPU; triton on CUDA, when kiln_codegen_triton provides it).

`kiln_backend` is the default and is also exported as `kiln.backend`, so it plugs into
`torch.compile(model, backend=kiln.backend)` as well.

Note [Backend failure]: kiln_aotgrad compiles a graph on its first call (per input signature), so
failures surface at two points, both turned into a fallback with a warning naming the exception
and, where the failing node is known, the user's source line (`options={"strict": True}` raises
`BackendFailed` instead):
  - loopir or a code generator fails on an aten graph: that aten graph runs unfused instead;
  - aotgrad fails while tracing (the call added no compiled signature): the graph runs as dynamo
    captured it, eagerly, from then on.
Re-running eagerly is safe: compiling touches no real tensor, and an error that is the user's own
is raised again by eager. A wrong answer is never an option: a failure is a fallback or an error.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.logs import perf_log as log


class BackendFailed(RuntimeError):
    """A backend failed on a graph and `strict` was set."""


@dataclass(slots=True)
class GraphCompile:
    """What one compiled graph cost, by phase (seconds), and how it ended."""

    graph: str
    nodes: int
    phases: dict[str, float] = field(default_factory=dict)
    fell_back: str | None = None


# Every graph compiled in this process, in order (kiln.compile_log()).
COMPILE_LOG: list[GraphCompile] = []


def _device_of(example_inputs: Sequence[Any]) -> torch.device:
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _codegen_for(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpp"
    if device.type == "cuda":
        return "triton"
    raise BackendFailed(f"kiln has no code generator for device {device}")


def _origin(exc: BaseException) -> str:
    """The user's source line of the node an exception names, when it names one."""
    node = getattr(exc, "node", None)
    meta = getattr(node, "meta", None) or {}
    where = meta.get("stack_trace") or meta.get("source_line") or ""
    return f" (at {str(where).strip().splitlines()[-1]})" if where else ""


def _fallback(
    gm: torch.fx.GraphModule, record: GraphCompile, exc: BaseException, strict: bool, backend: str, what: str
) -> Callable[..., Any]:
    message = (
        f"kiln backend {backend!r} failed on graph {record.graph}: {type(exc).__name__}: {exc}{_origin(exc)}"
    )
    if strict:
        raise BackendFailed(message) from exc
    record.fell_back = message
    warnings.warn(f"{message}; running {what} eagerly instead", RuntimeWarning, stacklevel=2)
    return gm.forward


class _FirstCallFallback:
    """Runs aotgrad's callable; if a call fails while aotgrad compiles (no compiled signature was
    added), runs dynamo's graph eagerly from then on (Note [Backend failure])."""

    def __init__(
        self, gm: torch.fx.GraphModule, compiled: Any, record: GraphCompile, strict: bool, backend: str
    ) -> None:
        self.gm, self.compiled, self.record, self.strict, self.backend = gm, compiled, record, strict, backend
        self.fallback: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self.fallback is not None:
            return self.fallback(*args)
        signatures = getattr(self.compiled, "compiled", None)
        before = len(signatures) if signatures is not None else None
        inner_before = self.record.phases.get("loopir+codegen", 0.0)
        start = time.perf_counter()
        try:
            result = self.compiled(*args)
            if before is not None and len(signatures or ()) != before:  # this call compiled
                inner = self.record.phases.get("loopir+codegen", 0.0) - inner_before
                phases = self.record.phases
                phases["aotgrad"] = phases.get("aotgrad", 0.0) + time.perf_counter() - start - inner
            return result
        except Exception as exc:
            if isinstance(exc, BackendFailed) or before is None or len(signatures or ()) != before:
                raise  # strict mode, or the compiled code itself failed at run time: not ours to hide
            self.fallback = _fallback(
                self.gm, self.record, exc, self.strict, self.backend, "the captured graph"
            )
            return self.fallback(*args)


def _record(gm: torch.fx.GraphModule) -> GraphCompile:
    record = GraphCompile(graph=f"graph_{len(COMPILE_LOG)}", nodes=len(gm.graph.nodes))
    COMPILE_LOG.append(record)
    return record


def eager_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    _record(gm)
    return gm.forward


def _timed(record: GraphCompile, phase: str, fn: Callable[..., Any], *args: Any) -> Any:
    start = time.perf_counter()
    try:
        return fn(*args)
    finally:
        record.phases[phase] = record.phases.get(phase, 0.0) + time.perf_counter() - start


def make_backend(
    name: str, *, strict: bool = False
) -> Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]:
    """The backend called `name` ("eager", "aot_eager" or "kiln")."""
    if name == "eager":
        return eager_backend

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        import kiln_aotgrad

        record = _record(gm)

        def inner(inner_gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
            if name == "aot_eager":
                return inner_gm
            import kiln_loopir

            try:
                codegen = _codegen_for(_device_of(inputs))
                compiled: Callable[..., Any] = _timed(
                    record,
                    "loopir+codegen",
                    lambda: kiln_loopir.compile_graph(inner_gm, inputs, backend=codegen),
                )
            except Exception as exc:  # Note [Backend failure]
                return _fallback(inner_gm, record, exc, strict, name, "its aten graph")
            log.info("%s: %d nodes, %s", record.graph, record.nodes,
                     ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in record.phases.items()))  # fmt: skip
            return compiled

        try:
            compiled = kiln_aotgrad.aot_backend(inner, inner)(gm, example_inputs)
        except Exception as exc:  # Note [Backend failure]
            return _fallback(gm, record, exc, strict, name, "the captured graph")
        return _FirstCallFallback(gm, compiled, record, strict, name)

    backend.__name__ = f"kiln_{name}_backend"
    return backend


BACKENDS = ("eager", "aot_eager", "kiln")

kiln_backend = make_backend("kiln")
