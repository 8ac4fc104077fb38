"""From a frame to a cache entry: trace, compile, generate guard and runner.

`capture(code, entry_values, f_globals, f_builtins, backend)` is the whole pipeline for one frame:
trace it symbolically (translator.py) into an OutputGraph, render the runner (codegen.py), close
the graph with the runner's outputs, hand the GraphModule and the real example inputs to the
backend, compile the guard (guards.py) and assemble the trampoline (bytecode.py). It returns a
`CapturedFrame` or raises `Unsupported`.

Global state that tracing touches (grad mode) is saved before and restored after, whatever
happens. Any exception other than `Unsupported` raised while tracing is a kiln bug: it is turned
into an `Unsupported` with the internal error named, so that the frame falls back instead of
crashing the user's program (Note [Never a crash]).
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from kiln_dynamo import bytecode
from kiln_dynamo.backends import Backend
from kiln_dynamo.codegen import build_runner, generate_runner
from kiln_dynamo.counters import counters
from kiln_dynamo.exc import Unsupported
from kiln_dynamo.guards import Guard, build_guard, readable_guards
from kiln_dynamo.logs import bytecode_log, graph_log, guards_log
from kiln_dynamo.output import OutputGraph
from kiln_dynamo.translator import run_root


def entry_names(code: types.CodeType) -> list[str]:
    """Argument slots (positional, keyword-only, *args, **kwargs) then free variables."""
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    return list(code.co_varnames[:n]) + list(code.co_freevars)


@dataclass(slots=True)
class CapturedFrame:
    graph_module: torch.fx.GraphModule | None
    guard: Guard
    code: types.CodeType  # the trampoline
    runner: Callable[..., Any]
    runner_source: str
    capture_seconds: float


def readable_graph(gm: torch.fx.GraphModule) -> str:
    lines = []
    for node in gm.graph.nodes:
        src = node.meta.get("source_line") or ""
        text = node.format_node() or ""
        lines.append(f"    {text:<90}  # {src}" if src else f"    {text}")
    return "\n".join(lines)


def capture(
    code: types.CodeType,
    entry_values: dict[str, Any],
    f_globals: dict[str, Any],
    f_builtins: dict[str, Any],
    backend: Backend,
) -> CapturedFrame:
    t0 = time.perf_counter()
    names = entry_names(code)
    assert list(entry_values) == names, (list(entry_values), names)
    output = OutputGraph(code, names, f_globals)
    grad = torch.is_grad_enabled()
    try:
        result = run_root(output, code, f_globals, f_builtins, entry_values)
        if torch.is_grad_enabled() != grad:
            raise Unsupported("the frame changes grad mode and does not restore it")
        spec, _ = generate_runner(output, result)
    except Unsupported:
        raise
    except Exception as e:  # Note [Never a crash]
        raise Unsupported(f"internal error while tracing: {type(e).__name__}: {e}") from e
    finally:
        torch._C._set_grad_enabled(grad)
    gm: torch.fx.GraphModule | None = None
    compiled: Callable[..., Any] | None = None
    if spec.needs_graph:
        output.graph.output(tuple(spec.outputs))
        gm = torch.fx.GraphModule(torch.nn.Module(), output.graph)
        example_inputs = [value for _, _, value in output.inputs]
        counters.graphs += 1
        counters.ops += output.op_count()
        if graph_log.isEnabledFor(20):
            graph_log.info(
                "graph for %s (%s:%s)\n%s",
                code.co_name,
                code.co_filename,
                code.co_firstlineno,
                readable_graph(gm),
            )
        compiled = backend(gm, example_inputs)
    runner = build_runner(spec, output.ctx.consts, compiled)
    guard = build_guard(output.guards, len(names), f_globals)
    if guards_log.isEnabledFor(20):
        guards_log.info("guards for %s:\n%s", code.co_name, readable_guards(guard))
    trampoline = bytecode.build_trampoline(code, runner, names)
    if bytecode_log.isEnabledFor(20):
        bytecode_log.info("runner for %s:\n%s", code.co_name, spec.source)
    output.builder.keepalive.clear()
    return CapturedFrame(gm, guard, trampoline, runner, spec.source, time.perf_counter() - t0)
