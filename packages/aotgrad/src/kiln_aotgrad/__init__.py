"""kiln-aotgrad: ahead-of-time autograd.

Traces torch-level programs (plain functions, modules, or dynamo's FX graphs) into aten-level FX
graphs over kiln_dynamo's fake tensors (tracer.py), decomposes them to a documented core operator
set (decompositions.py), removes mutation and aliasing (functionalize.py), traces forward and
backward jointly (joint.py), splits the joint graph by min-cut (partition.py) and runs the result
inside an autograd.Function that restores eager semantics (runtime.py). Entry points: api.py,
backends.py.
"""

from kiln_aotgrad import logs as _logs
from kiln_aotgrad.api import AotFunction, CompiledArtifacts, aot_function, aot_module, compile_flat
from kiln_aotgrad.backends import aot_backend, aot_eager, nop_compiler
from kiln_aotgrad.decompositions import KEPT_NON_CORE, default_decompositions, surviving_ops_ok
from kiln_aotgrad.partition import Partition, partition
from kiln_aotgrad.runtime import InputsWrittenError, inputs_written
from kiln_aotgrad.tracer import AotgradError

__version__ = "0.1.0"

__all__ = [
    "KEPT_NON_CORE",
    "AotFunction",
    "AotgradError",
    "CompiledArtifacts",
    "InputsWrittenError",
    "Partition",
    "aot_backend",
    "aot_eager",
    "aot_function",
    "aot_module",
    "compile_flat",
    "default_decompositions",
    "inputs_written",
    "nop_compiler",
    "partition",
    "surviving_ops_ok",
]

_logs.configure()
