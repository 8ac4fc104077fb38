"""Test session setup: Triton's interpreter when there is no GPU.

Note [Triton's interpreter is process-wide]: `TRITON_INTERPRET=1` must be set before triton is
imported: triton's own `@triton.jit` helpers (the combine functions of `tl.sum`, `tl.reduce`)
are built as interpreted or compiled functions at import, and an interpreted kernel cannot call
a compiled one. Without CUDA the session turns the interpreter on before anything imports
triton (torch's OpInfo database may), so `options={"cpu_backend": "triton"}` runs Triton kernels
on CPU tensors (test_opinfo_triton.py); with CUDA Triton compiles for the GPU and the Triton
sweep runs on CUDA tensors instead.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
