"""kiln-dynamo: graph capture from Python bytecode.

`compile(fn_or_module, backend="eager", fullgraph=False)` traces a function's bytecode
symbolically (translator.py, variables/) into a torch.fx graph of the tensor operations it
performs, with fake tensors (fake.py) standing in for data and guards (guards.py) recording every
assumption; the frame then runs as a trampoline that calls the backend's compiled graph
(codegen.py). Code that no graph can hold is a graph break: the frame is split there, the
unsupported instruction runs in CPython and capture resumes in a continuation function
(breaks.py, resume.py); a frame that cannot be split runs as plain Python. Reasons are in
`counters.break_reasons`; `explain(fn)(*args)` reports graphs, breaks and guards of one call.
`reset()` drops every cache. Guards run in C as guard trees (guard_tree.py); `set_c_guards(False)`
or `KILN_C_GUARDS=0` keeps the Python guards; `set_guard_memo(False)` or `KILN_GUARD_MEMO=0` makes
the trees run every check on every call.
"""

from kiln_dynamo import logs as _logs
from kiln_dynamo.backends import lookup_backend, register_backend
from kiln_dynamo.convert_frame import CapturedFrame, capture, entry_names
from kiln_dynamo.counters import Counters, counters
from kiln_dynamo.eval_frame import CompiledModule, compile, reset
from kiln_dynamo.exc import BreakReason, DynamicShapesUnsupported, Unsupported, UserFrame
from kiln_dynamo.explain import ExplainOutput, explain
from kiln_dynamo.fx_source import forget_source_when_freed, graph_module
from kiln_dynamo.guard_tree import c_guards_enabled, guard_memo_enabled, set_c_guards, set_guard_memo
from kiln_dynamo.inference import set_trace_inference_mode
from kiln_dynamo.logs import configure_artifacts
from kiln_dynamo.shapes import mark_dynamic, mark_static, maybe_mark_dynamic
from kiln_dynamo.unbacked import graph_unbacked_env, same_unbacked, unbacked_sizes
from kiln_dynamo.variables.locks import set_replay_under_locks
from kiln_dynamo.variables.torch import set_torch_fast_paths

__version__ = "0.1.0"

__all__ = [
    "BreakReason",
    "CapturedFrame",
    "CompiledModule",
    "Counters",
    "DynamicShapesUnsupported",
    "ExplainOutput",
    "Unsupported",
    "UserFrame",
    "c_guards_enabled",
    "capture",
    "compile",
    "configure_artifacts",
    "counters",
    "entry_names",
    "explain",
    "forget_source_when_freed",
    "graph_module",
    "graph_unbacked_env",
    "guard_memo_enabled",
    "lookup_backend",
    "mark_dynamic",
    "mark_static",
    "maybe_mark_dynamic",
    "register_backend",
    "reset",
    "same_unbacked",
    "set_c_guards",
    "set_guard_memo",
    "set_replay_under_locks",
    "set_torch_fast_paths",
    "set_trace_inference_mode",
    "unbacked_sizes",
]

_logs.configure()
