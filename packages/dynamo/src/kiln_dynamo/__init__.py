"""kiln-dynamo: whole-graph capture from Python bytecode.

`compile(fn_or_module, backend="eager", fullgraph=False)` traces a function's bytecode
symbolically (translator.py, variables/) into one torch.fx graph of the tensor operations it
performs, with fake tensors (fake.py) standing in for data and guards (guards.py) recording every
assumption; the frame then runs as a trampoline that calls the backend's compiled graph
(codegen.py). A frame that cannot be captured runs as plain Python with the reason in
`counters.fallbacks`. `reset()` drops every cache.
"""

from kiln_dynamo import logs as _logs
from kiln_dynamo.backends import lookup_backend, register_backend
from kiln_dynamo.convert_frame import CapturedFrame, capture, entry_names
from kiln_dynamo.counters import Counters, counters
from kiln_dynamo.eval_frame import CompiledModule, compile, reset
from kiln_dynamo.exc import Unsupported
from kiln_dynamo.logs import configure_artifacts

__version__ = "0.1.0"

__all__ = [
    "CapturedFrame",
    "CompiledModule",
    "Counters",
    "Unsupported",
    "capture",
    "compile",
    "configure_artifacts",
    "counters",
    "entry_names",
    "lookup_backend",
    "register_backend",
    "reset",
]

_logs.configure()
