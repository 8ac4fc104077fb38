"""kiln-loopir: the define-by-run loop-level IR, its lowerings, scheduler and reference interpreter.

``compile_graph(gm, example_inputs, backend="interpret", fusion=True)`` takes an aten-level
``torch.fx.GraphModule`` and returns a callable with ``.stats``. Inside:

* ``virtualized``: the thread-local ``ops.*`` namespace loop bodies are written against;
* ``ir`` / ``layout`` / ``indexing``: TensorBox/StorageBox, Pointwise/Reduction, buffers, views,
  extern kernels, layouts with sympy sizes and strides, index simplification;
* ``lowering`` + ``lowerings/``: aten ops to IR (pointwise, views, reductions, cat/pad/indexing/
  scatter, creation), with an extern-kernel fallback for every other op;
* ``passes``: graph passes over the aten graph before lowering (matmul padding, the channels-last
  decision), each switched by name through ``compile_graph(..., options=...)`` (``PassOptions``);
* ``graph``: GraphLowering, the fx walk and the realize heuristic;
* ``scheduler``: dependencies, greedy score-based fusion, topological order, DCE, buffer reuse;
* ``origins``: which fx nodes (and user lines) each buffer computes, and the kernel names and
  source comments both code generators make from them (Note [Origins]);
* ``backend``: the interface code generators implement and the entry-point registry
  (group ``kiln_loopir.backends``); ``interpret``: the reference backend over torch tensors;
* ``testing``: OpInfo samples recorded as aten graphs, for loopir's and backends' op sweeps.
"""

from .backend import Backend, BuildReport, available_backends, get_backend, register_backend
from .compile import CompiledGraph, CompileStats, SymbolicSizesUnsupported, compile_graph
from .graph import DeviceMismatch, GraphLowering, graph_device
from .ir import TensorBox
from .logs import configure_artifacts
from .lowering import register_lowering
from .origins import kernel_name, source_comment
from .passes import PassOptions
from .scheduler import Scheduler
from .virtualized import ops, set_ops_handler

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BuildReport",
    "CompileStats",
    "CompiledGraph",
    "DeviceMismatch",
    "GraphLowering",
    "PassOptions",
    "Scheduler",
    "SymbolicSizesUnsupported",
    "TensorBox",
    "available_backends",
    "compile_graph",
    "configure_artifacts",
    "get_backend",
    "graph_device",
    "kernel_name",
    "ops",
    "register_backend",
    "register_lowering",
    "set_ops_handler",
    "source_comment",
]
