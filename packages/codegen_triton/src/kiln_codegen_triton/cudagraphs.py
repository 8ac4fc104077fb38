"""CUDA graphs for ``mode="reduce-overhead"``: record a wrapper's launches once, replay them.

A compiled graph launches one kernel per fused node and calls a few extern ops; at small sizes
the CPU cost of those launches is the run time. :class:`CudaGraphRunner` wraps the wrapper's
``call``:

* the first call for an input signature (shapes, strides, dtypes, devices) runs normally: it
  compiles every Triton kernel and, under max-autotune, tunes it (neither may happen while a
  graph is being captured);
* the second call copies the inputs into *static* buffers it owns, warms up on a side stream and
  captures one ``torch.cuda.CUDAGraph`` of ``call(*static_inputs)``; the buffers the wrapper
  allocates during capture come from one private memory pool, so they stay put;
* every later call copies the inputs into the static buffers and replays the graph.

Note [CUDA graph inputs and outputs]: inputs are *copied* into the static buffers on every call,
so the graph is right whatever address the caller's tensors have this time (a new batch, an
optimizer that replaced a parameter), at the cost of one device copy per input. Outputs are
static memory that the next replay overwrites, so they are cloned before being returned (with
``copy_outputs=False`` the caller gets the static tensors and must consume them before the next
call). A graph whose extern ops mutate their inputs (Note [Mutation] in loopir) would mutate the
static copies instead of the caller's tensors, so such graphs are never recorded
(:func:`cudagraph_blocker`); a capture that fails (an op that synchronizes, a data-dependent
shape) turns the runner off for good and the wrapper runs as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from kiln_loopir.scheduler import ExternKernelSchedulerNode, Scheduler

log = logging.getLogger("kiln.codegen_triton.output_code")


def cudagraph_blocker(schedule: Scheduler) -> str | None:
    """Why this schedule must not be recorded (None when it may)."""
    for node in schedule.nodes:
        if isinstance(node, ExternKernelSchedulerNode):
            schema = getattr(node.node.op, "_schema", None)
            if schema is not None and schema.is_mutable:
                return f"extern {node.node.op} mutates its inputs"
    return None


@dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]
    outputs: Any


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        (tuple(a.shape), tuple(a.stride()), a.dtype, a.device)
        if isinstance(a, torch.Tensor)
        else ("value", a)
        for a in args
    )


def _static_copy(t: torch.Tensor) -> torch.Tensor:
    """A buffer with ``t``'s shape and strides (contiguous when ``t`` overlaps itself)."""
    if _dense(t):
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    else:
        out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _dense(t: torch.Tensor) -> bool:
    pairs = sorted((s, n) for s, n in zip(t.stride(), t.shape, strict=True) if n != 1)
    expected = 1
    for stride, size in pairs:
        if stride != expected:
            return False
        expected *= size
    return True


class CudaGraphRunner:
    """Records and replays ``fn`` per input signature; see the module docstring."""

    def __init__(self, fn: Callable[..., Any], *, copy_outputs: bool = True) -> None:
        self.fn = fn
        self.copy_outputs = copy_outputs
        self.entries: dict[tuple[Any, ...], _Entry] = {}
        self.warmed: set[tuple[Any, ...]] = set()
        self.disabled: str | None = None
        self.replays = 0
        self.recordings = 0
        self._pool: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.disabled is not None:
            return self.fn(*args)
        key = _signature(args)
        entry = self.entries.get(key)
        if entry is None:
            if key not in self.warmed:
                self.warmed.add(key)
                return self.fn(*args)
            try:
                entry = self._record(args)
            except Exception as exc:  # capture is impossible for this graph: run it plainly
                self.disabled = f"{type(exc).__name__}: {exc}"
                log.warning("CUDA graph capture failed, running without: %s", self.disabled)
                return self.fn(*args)
            self.entries[key] = entry
        for static, arg in zip(entry.inputs, args, strict=True):
            if isinstance(arg, torch.Tensor) and static.data_ptr() != arg.data_ptr():
                static.copy_(arg)
        entry.graph.replay()
        self.replays += 1
        if not self.copy_outputs:
            return entry.outputs
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, entry.outputs)

    def _record(self, args: tuple[Any, ...]) -> _Entry:
        static = [_static_copy(a) if isinstance(a, torch.Tensor) else a for a in args]
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self.fn(*static)
        self.recordings += 1
        return _Entry(graph, static, outputs)
