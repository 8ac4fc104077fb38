"""Test session setup: a private compile cache, and Triton's interpreter when there is no GPU.

The session's kiln cache (C++ builds, Triton modules and autotune choices, pad_mm verdicts:
`kiln_loopir.diskcache.cache_root`) is a temporary directory of its own, set before anything
compiles: kernels built by one test are reused by the next, and nothing is read from or written
to the user's ~/.cache/kiln (or a `KILN_CACHE_DIR` the caller had set), so no test passes or
fails by what an earlier run left there. Subprocesses the tests start inherit it.

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
import tempfile

import torch

os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-tests-")

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
