"""kiln-codegen-cpp: the CPU code generator, a loopir backend named ``"cpp"``.

``kiln_loopir.compile_graph(gm, inputs, backend="cpp")`` lowers and schedules an aten graph with
loopir, then this package turns the schedule into C++ and runs it:

* ``kernel``: one C++ function per fused node: OpenMP-parallel loops (``parallel``: which, and on
  how many threads, from the sizes and the run-time thread count), an innermost loop
  the compiler vectorizes (``#pragma omp simd`` + libmvec), reductions with lane accumulators,
  masked loads, bounds-checked indirect indexing and integer division (a zero divisor raises
  :class:`KernelZeroDivisionError`, as eager raises);
* ``cpp_ops`` / ``prelude``: C++ spellings of dtypes, constants, index math and the ``ops.*`` set;
* ``build``: one shared object per graph, ``g++`` with an atomic on-disk cache under
  ``KILN_CACHE_DIR``, loaded as a tiny CPython extension; ``counters`` says what was compiled or reused;
* ``units``: how many translation units a graph's kernels are compiled in at the same time, and
  which kernels go in each (Note [Parallel C++ builds]);
* ``wrapper``: the generated Python that allocates buffers (loopir's reuse plan), calls kernels
  and extern ops in schedule order and returns strided outputs;
* ``backend``: :class:`CppBackend`, registered through the ``kiln_loopir.backends`` entry point.
"""

from .backend import CppBackend
from .build import CppCompileError, build_wait_seconds, cache_dir, counters, forget_loaded, prepare_headers
from .kernel import CodegenUnsupported
from .options import CppOptions
from .wrapper import KernelZeroDivisionError

__version__ = "0.1.0"

__all__ = [
    "CodegenUnsupported",
    "CppBackend",
    "CppCompileError",
    "CppOptions",
    "KernelZeroDivisionError",
    "build_wait_seconds",
    "cache_dir",
    "counters",
    "forget_loaded",
    "prepare_headers",
]
