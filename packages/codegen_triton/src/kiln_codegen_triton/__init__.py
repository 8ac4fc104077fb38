"""kiln-codegen-triton: the GPU code generator, a loopir backend named ``"triton"``.

``kiln_loopir.compile_graph(gm, inputs, backend="triton")`` lowers and schedules an aten graph
with loopir, then this package turns the schedule into Triton and runs it:

* ``kernel``: one ``@triton.jit`` function per fused node: pointwise (1-D, or 2-D tiles for
  transposes), reductions persistent (the whole row in registers) or looped, Welford, argmax,
  fused prologues and epilogues, masks, broadcasts, indirect indexing, int32 indexing;
* ``triton_ops``: Triton spellings of dtypes, constants, index math and the ``ops.*`` set;
  ``interp``: libdevice emulated for ``TRITON_INTERPRET=1``, so every kernel runs on CPU tensors;
* ``heuristics``: block sizes and warps; ``runtime``: the generated module in the on-disk cache
  under ``KILN_CACHE_DIR``, launchers, max-autotune with a disk cache of its choices;
* ``wrapper``: the generated Python that allocates buffers on the graph's device (loopir's reuse
  plan), launches kernels and extern aten ops in schedule order and returns strided outputs;
  ``cudagraphs``: record-and-replay for ``mode="reduce-overhead"``; ``compile_pool``: kernels
  compiled in worker processes (``warm_compile_pool()`` starts them early);
* ``templates``: under max-autotune, Triton GEMM templates with the following pointwise kernel
  fused into their store, timed against the extern call + that kernel at the first call;
* ``backend``: :class:`TritonBackend`, registered through the ``kiln_loopir.backends`` entry point.
"""

from . import compile_pool
from .backend import MODES, TRITON_OPTIONS, TritonBackend, check_triton_options
from .cudagraphs import CudaGraphRunner
from .interp import interpreting
from .kernel import CodegenUnsupported, KernelSpec
from .runtime import cache_dir, counters


def warm_compile_pool() -> None:
    """Start the Triton compile workers now, if they will be used (Note [Compiling in worker
    processes]): a caller about to compile a CUDA graph calls this first, so the workers start
    while the graph is traced and lowered."""
    if not interpreting():
        compile_pool.warm()


__version__ = "0.1.0"

__all__ = [
    "MODES",
    "TRITON_OPTIONS",
    "CodegenUnsupported",
    "CudaGraphRunner",
    "KernelSpec",
    "TritonBackend",
    "cache_dir",
    "check_triton_options",
    "compile_pool",
    "counters",
    "interpreting",
    "warm_compile_pool",
]
