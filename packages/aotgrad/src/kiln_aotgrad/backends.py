"""kiln_aotgrad as a dynamo backend.

`aot_backend(fw_compiler, ...)` returns `backend(gm, example_inputs) -> callable`, the protocol
kiln_dynamo (and torch.compile) use. Dynamo hands over a torch-level GraphModule whose
placeholders are the frame's tensors (parameters included); the backend wraps it with
`aot_module` (so any parameters or buffers the GraphModule holds itself become inputs too) and
traces it node by node through `OriginInterpreter`, which puts dynamo's `source_line` on every
aten node and into error messages. Compilation happens on the first call, with the real inputs.

`aot_eager` runs the produced aten graphs as they are (their GraphModules are the "compiled"
callables): for tests and debugging of everything above code generation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx
from kiln_symbolic import is_symbolic

from kiln_aotgrad.api import Compiler, aot_module
from kiln_aotgrad.decompositions import DecompTable
from kiln_aotgrad.logs import dynamic_log
from kiln_dynamo import DynamicShapesUnsupported, graph_unbacked_env


def nop_compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The identity compiler: the GraphModule is the compiled callable."""
    return gm


def aot_backend(
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    *,
    inference_compiler: Compiler | None = None,
    decompositions: DecompTable | None = None,
    partition: str = "min_cut",
    fusion_aware_saves: bool = True,
    materialized_saves: bool = True,
    recompute_sources: bool = True,
) -> Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]:
    """A dynamo backend that runs the captured graph through kiln_aotgrad and `fw_compiler`;
    `partition`, `fusion_aware_saves`, `materialized_saves` and `recompute_sources` as
    `AotOptions`'."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        fn = aot_module(
            gm,
            fw_compiler,
            bw_compiler,
            inference_compiler=inference_compiler,
            decompositions=decompositions,
            partition=partition,
            fusion_aware_saves=fusion_aware_saves,
            materialized_saves=materialized_saves,
            recompute_sources=recompute_sources,
            guarded=True,  # Note [Guarded callers]: a dynamo backend runs behind the frame's guards
        )
        fakes = symbolic_placeholders(gm)
        if fakes is not None:
            try:
                fn.compile_symbolic(fakes)  # Note [Symbolic signatures]
            except DynamicShapesUnsupported as e:
                dynamic_log.info("%s: symbolic sizes refused: %s", gm.meta.get("frame", "graph"), e)
                raise
            except Exception as e:
                # refused per graph: kiln_dynamo compiles this frame with static sizes instead; the
                # reason is the error's first line (torch.fx appends the node and a traceback to
                # errors raised while it interprets a graph: those are in the log)
                dynamic_log.info("%s: symbolic sizes refused: %s", gm.meta.get("frame", "graph"), e)
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise DynamicShapesUnsupported(f"kiln_aotgrad: {first}") from e
        return fn

    return backend


def symbolic_placeholders(gm: torch.fx.GraphModule) -> list[Any] | None:
    """The placeholders' values (fake tensors, SymInts) when some size or int is symbolic."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if (
        not any(is_symbolic(v) or getattr(v, "symbolic", False) for v in vals)
        and graph_unbacked_env(gm) is None
    ):
        return None  # a graph of static sizes (one with a data-dependent size is traced symbolically too)
    return vals


aot_eager = aot_backend(nop_compiler)
aot_eager.__kiln_dynamic_shapes__ = True  # type: ignore[attr-defined]
