"""A Triton compile worker process (Note [Compiling in worker processes] in compile_pool.py).

Run as a script, never imported by the package: ``python compile_worker.py``. It imports Triton
and nothing of kiln or torch, reads jobs from stdin and writes replies to stdout, each a pickle
behind a 4-byte little-endian length:

  ("target", backend, arch, warp_size, ptxas_version) -> ("ok", 0.0)
                                                           the GPU every later job compiles for
  ("compile", cache_dir, module_name, path, fn_name, specialization)
                                                           -> ("ok", seconds) | ("error", text)

A compile job imports the generated module file under the parent's module name (Triton's cache
key includes the function's full name and line) and hands the specialization the parent recorded
to ``JITFunction.preload``, Triton's own way to compile a kernel from serialized specialization
data: the same ``_do_compile`` call the parent's ``warmup`` makes, so the binary lands in
Triton's disk cache under the key the parent will look up. There is no GPU context here: a
stand-in driver answers device 0, stream 0 and the parent's target. End of input ends the worker.

Note [Launchers built in the workers]: before Triton 3.7 or so, NVIDIA's launcher was C source
generated per kernel signature (``make_launcher``) and built with the system's C compiler
(``compile_module_from_src``, cached on disk by the source's hash) when the parent first loaded
the kernel. Measured on an H100 with Triton 3.6 (GPT-2 training, a fresh cache, cProfile): the
parent's loads of the workers' binaries took all the time it waited (GPT-2: 103 configs, 1.37 s;
ResNet-50: 235, 3.79 s), nearly all of it in about fourteen C builds of launchers, one after
another. So a worker that compiled a kernel also builds its launcher through the backend's own
``CudaLauncher`` (which needs no device: the source, the build and the disk cache only): the
parent's build is then a hit in the same cache, and the builds run sixteen at a time. Where
Triton's launcher is one generic C function (later versions: no ``make_launcher``), or anything
here fails, nothing is built, and the parent builds what it needs as before (slower, never wrong).
Many kernels share a launcher (one per signature and constants), and sixteen workers starting
together would each build the same ones (measured: worker time 2-3x, the wait no shorter): the
first worker to claim a launcher, by creating a marker file named by what the launcher's source is
made from in the cache folder (``O_EXCL``), builds it; the others skip it.
"""

from __future__ import annotations

import importlib.util
import pickle
import struct
import sys
import time
import traceback
from types import ModuleType
from typing import Any, BinaryIO


class TargetOnlyDriver:
    """What Triton's JIT asks the active driver while compiling (no launch, no device)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def is_active(self) -> bool:
        return True

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


def prepare(target: Any) -> None:
    """Triton's one-time work before a first compile (the backend, and the hash of Triton's own
    files and library that every cache key includes), done while the parent still lowers."""
    import triton

    triton.compiler.make_backend(target)
    key = getattr(getattr(triton.runtime, "cache", None), "triton_key", None)
    if key is not None:
        key()


_launcher_class: Any = None  # None: not looked up yet; False: nothing to build here


def build_launcher(kernel: Any, backend: str, cache_dir: str | None = None) -> None:
    """Note [Launchers built in the workers]: build (into Triton's disk cache) the C launcher
    that the parent's load of ``kernel`` would build, where Triton builds one per signature."""
    global _launcher_class
    if _launcher_class is None:
        _launcher_class = False
        try:
            from triton.backends.nvidia import driver

            if (
                backend == "cuda"
                and hasattr(driver, "make_launcher")
                and hasattr(driver, "compile_module_from_src")
            ):
                _launcher_class = driver.CudaLauncher
        except Exception:
            pass
    if _launcher_class is False or kernel is None:
        return
    try:
        if _claim(kernel, cache_dir):
            _launcher_class(kernel.src, kernel.metadata)
    except Exception:
        _launcher_class = False  # the parent builds its own, as before


def _claim(kernel: Any, cache_dir: str | None) -> bool:
    """Whether this worker is the first to build ``kernel``'s launcher (Note [Launchers built in
    the workers]); always where there is no cache folder to mark it in."""
    if not cache_dir:
        return True
    import hashlib
    import os

    src = kernel.src
    made_of = repr(
        (
            sorted(map(repr, getattr(src, "constants", {}).items())),
            sorted(map(repr, src.signature.items())),
            repr(getattr(kernel.metadata, "tensordesc_meta", None)),
        )
    )
    folder = os.path.join(cache_dir, "kiln-launchers")
    os.makedirs(folder, exist_ok=True)
    try:
        fd = os.open(
            os.path.join(folder, hashlib.sha256(made_of.encode()).hexdigest()), os.O_CREAT | os.O_EXCL
        )
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _read(stream: BinaryIO) -> Any:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack("<I", header)
    return pickle.loads(stream.read(size))


def _write(stream: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _module(modules: dict[str, ModuleType], name: str, path: str) -> ModuleType:
    if name not in modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return modules[name]


def main() -> int:
    jobs, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything Triton prints must not reach the reply stream
    import triton
    from triton.backends.compiler import GPUTarget

    modules: dict[str, ModuleType] = {}
    backend = ""
    while (job := _read(jobs)) is not None:
        start = time.perf_counter()
        try:
            if job[0] == "target":
                target = GPUTarget(*job[1:4])
                backend = target.backend
                if job[4]:  # Note [The ptxas version in the cache key] in compile_pool.py
                    triton.knobs.nvidia.mock_ptx_version = job[4]
                triton.runtime.driver.set_active(TargetOnlyDriver(target))
                prepare(target)
            elif job[0] == "compile":
                _, cache_dir, name, path, fn_name, specialization = job
                triton.knobs.cache.dir = cache_dir
                kernel = getattr(_module(modules, name, path), fn_name).preload(specialization)
                build_launcher(kernel, backend, cache_dir)
            else:
                raise ValueError(f"unknown job {job[0]!r}")
            reply: tuple[str, Any] = ("ok", time.perf_counter() - start)
        except Exception:
            reply = ("error", traceback.format_exc(limit=6))
        _write(replies, reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
