"""kiln-codegen-triton: not built yet.

It will own: the GPU code generator: Triton kernels, launch heuristics and autotuning, the GPU
wrapper, CUDA graphs.
"""

__version__ = "0.1.0"
