"""The GPU path without a GPU: every kind of kernel compiles with Triton's compiler for sm_90.

Under the interpreter (CI) kernels run as numpy code, which accepts programs the real compiler
would reject; ``gpu_compile.py`` compiles representative graphs' kernels down to a cubin for an
H100/H200 in a separate process (Triton cannot compile for a GPU in a process that imported it
in interpreter mode).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_kernels_compile_for_sm90(cache_root: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "0", "KILN_CACHE_DIR": os.path.join(cache_root, "gpu-compile")}
    script = Path(__file__).with_name("gpu_compile.py")
    done = subprocess.run(
        [sys.executable, str(script)], check=False, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    compiled = [line for line in done.stdout.splitlines() if line.startswith("ok ")]
    kinds = {line.rsplit("(", 1)[1].rstrip(")") for line in compiled}
    assert kinds == {"pointwise", "tiled", "persistent", "looped"}, done.stdout


def test_kernels_compiled_by_the_worker_pool_are_cache_hits_for_the_parent(cache_root: str) -> None:
    """Note [Compiling in worker processes]: what the workers compile, the parent finds, also
    after TRITON_PTXAS_PATH moved (Note [The ptxas version in the cache key]); workers whose
    binaries are not found switch the pool off."""
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "KILN_CACHE_DIR": os.path.join(cache_root, "pool-compile"),
        "TRITON_CACHE_DIR": os.path.join(cache_root, "pool-compile-triton"),
    }
    script = Path(__file__).with_name("pool_compile.py")
    done = subprocess.run(
        [sys.executable, str(script)], check=False, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert done.stdout.count("pool ok: 2 kernels, 2 hits of 2") == 2, done.stdout
    # Note [Kernels compiled while the next graph is built]
    assert re.search(r"deferred ok: [1-9]\d* kernels loaded after another graph was built", done.stdout), (
        done.stdout
    )
    # Note [When the workers' binaries are not found]
    assert "pool off: True after 2 of 2 loads missed" in done.stdout, done.stdout
