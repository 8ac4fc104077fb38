"""kiln-codegen-cpp: not built yet.

It will own: the CPU code generator: C++/OpenMP kernels, compiler invocation, an on-disk cache, and
the wrapper that runs a scheduled graph.
"""

__version__ = "0.1.0"
