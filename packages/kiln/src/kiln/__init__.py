"""kiln: a just-in-time compiler for unmodified PyTorch programs.

    import kiln
    model = kiln.compile(model)     # same contract as torch.compile
    y = model(x)                    # the first call captures and compiles; later calls reuse

The umbrella wires the layers: kiln_dynamo captures FX graphs from bytecode (with guards),
kiln_aotgrad traces them to aten (forward and backward), kiln_loopir lowers, fuses and schedules,
and a code generator (kiln_codegen_cpp on the CPU) emits the kernels. `kiln.backend` is the
default backend as a plain callable, so `torch.compile(model, backend=kiln.backend)` works too.
"""

from kiln import logs as _logs
from kiln.api import CaptureStats, capture_stats, compile, compile_log, explain, prepare, reset
from kiln.backends import BACKENDS, BackendFailed, GraphCompile, kiln_backend, make_backend
from kiln_dynamo import mark_dynamic, mark_static, maybe_mark_dynamic

backend = kiln_backend
_logs.configure()

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "BackendFailed",
    "CaptureStats",
    "GraphCompile",
    "backend",
    "capture_stats",
    "compile",
    "compile_log",
    "explain",
    "make_backend",
    "mark_dynamic",
    "mark_static",
    "maybe_mark_dynamic",
    "prepare",
    "reset",
]
