"""Triton kernels compiled in a pool of worker processes.

Note [Compiling in worker processes]: Triton's compiler holds the GIL for most of a kernel's
compile (its MLIR pass manager, libdevice linking and LLVM's optimizer are bound without
releasing it; only the LLVM-to-PTX step and ptxas, a subprocess, let other threads run), so a
graph's kernels compiled in threads take about as long as one after another. They are compiled
in worker processes instead, as torch.compile's subprocess pool does:

- Workers are plain subprocesses running ``compile_worker.py`` (fork and exec: nothing of the
  parent's CUDA context or threads is inherited, and no ``multiprocessing`` re-import of the
  user's ``__main__``). They import Triton only, are started once per process on the first CUDA
  graph (``warm()``, called by the umbrella as soon as a CUDA graph reaches the backend, so they
  start while the graph is traced and lowered), are reused for every graph after, and exit when
  the parent closes their stdin (at exit, or when the parent dies).
- The parent records, per kernel and config, what ``JITFunction.warmup`` would hand Triton's
  compiler: a ``jit_cache_hook`` that, while this module records on the calling thread, takes the
  specialization data Triton serializes for the call and answers "skip". A worker compiles from
  that data with ``JITFunction.preload`` (the same ``_do_compile`` path), which writes the binary
  into Triton's disk cache; the parent's own ``warmup`` afterwards is a cache hit that only reads
  the files and loads the module. Recording and preloading are Triton's own APIs, so parent and
  worker agree on the cache key by construction; if they ever did not, the parent would simply
  compile again (slow, never wrong).
- A job that fails in a worker, or a worker that dies, costs nothing but time: the parent
  compiles that kernel itself, and a real compile error surfaces there as before.

Note [When the workers' binaries are not found]: the parent counts, through Triton's compilation
listener, how many of its loads were disk-cache hits. A miss means a worker filed its binary
under another key than this process computes (some state of this process's Triton the workers
do not share; the one known case is Note [The ptxas version in the cache key]): the kernel is
simply compiled here, and if most loads of a graph miss, the pool is switched off for the rest
of the process with a warning, so kernels are never compiled twice for nothing.

``KILN_COMPILE_WORKERS`` sets the pool's size (default: one per CPU core, at most 16; 0 or 1 turns
the pool off and kernels compile in the parent's threads, Note [The launch path]).
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("kiln.codegen_triton.compile")

WORKER = Path(__file__).with_name("compile_worker.py")


def pool_size() -> int:
    """Workers in the pool (Note [Compiling in worker processes])."""
    configured = os.environ.get("KILN_COMPILE_WORKERS", "")
    if configured:
        return max(0, int(configured))
    return min(16, os.cpu_count() or 1)


# ---------------------------------------------------------------------------------- recording

# Lists that Triton's hooks fill on this thread while a `record` or `count_hits` runs on it
_local = threading.local()
_hooks_lock = threading.Lock()
_hooks_installed: bool | None = None  # None: not tried yet


def _install_hooks() -> bool:
    """Chain kiln's recorder in front of Triton's ``jit_cache_hook`` and its counter in front of
    the compilation listener, once per process; False where this Triton lacks either (the pool
    is then not used). Both defer to whatever was installed before on every other call."""
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed is not None:
            return _hooks_installed
        _hooks_installed = False
        try:
            from triton import knobs

            runtime, compilation = knobs.runtime, knobs.compilation
            previous_hook, previous_listener = runtime.jit_cache_hook, compilation.listener
        except (ImportError, AttributeError):
            return False

        def hook(**kwargs: Any) -> Any:
            box = getattr(_local, "recording", None)
            if box is None:  # not ours: whoever hooked before us decides
                return previous_hook(**kwargs) if previous_hook is not None else None
            box.append(kwargs["compile"]["specialization_data"])
            return True  # skip the compile: a worker does it

        def listener(**kwargs: Any) -> None:
            seen = getattr(_local, "counting", None)
            if seen is not None:
                seen.append(bool(kwargs.get("cache_hit")))
            if previous_listener is not None:
                previous_listener(**kwargs)

        runtime.jit_cache_hook, compilation.listener = hook, listener
        _hooks_installed = True
        return True


def _collect(box: str, run: Callable[[], Any]) -> list[Any]:
    """What Triton's hooks put in this thread's list ``box`` while ``run()`` runs."""
    found: list[Any] = []
    setattr(_local, box, found)
    try:
        run()
    finally:
        setattr(_local, box, None)
    return found


def record(warmup: Callable[[], Any]) -> str | None:
    """The specialization data Triton would compile for ``warmup()`` (a ``JITFunction.warmup``
    call), without compiling; None where nothing was recorded (already compiled in this
    process, or a Triton without the hook)."""
    if not _install_hooks():
        return None
    found = _collect("recording", warmup)
    return found[0] if found else None


def count_hits(load: Callable[[], Any]) -> tuple[int, int]:
    """Run ``load()`` (this process's own ``warmup`` calls after the workers' compiles) and
    count Triton's compiles in it on this thread: (cache hits, compiles); (0, 0) where this
    Triton reports none. A compile that misses means the workers filed their binaries under other
    keys (Note [When the workers' binaries are not found])."""
    if not _install_hooks():
        load()
        return (0, 0)
    seen = _collect("counting", load)
    return (sum(seen), len(seen))


_disabled = ""


def disabled() -> str:
    """Why the pool is switched off for this process ("" while it is not)."""
    return _disabled


def disable(reason: str) -> None:
    """Compile in this process from now on (Note [When the workers' binaries are not found])."""
    global _disabled
    if not _disabled:
        _disabled = reason
        log.warning("kiln: Triton compile workers switched off for this process: %s", reason)
    shutdown()


# -------------------------------------------------------------------------------------- pool


class _Worker:
    """One worker process and its pipes; used by one thread at a time."""

    def __init__(self, target: tuple[str, int, int, str]) -> None:
        env = dict(os.environ)
        # the worker finds Triton where this process found it
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self.call(("target", *target))

    def call(self, job: tuple[Any, ...]) -> tuple[str, Any]:
        stdin: IO[bytes] | None = self.proc.stdin
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdin is not None and stdout is not None
        data = pickle.dumps(job)
        stdin.write(struct.pack("<I", len(data)) + data)
        stdin.flush()
        header = stdout.read(4)
        if len(header) < 4:
            raise RuntimeError(f"compile worker {self.proc.pid} exited ({self.proc.poll()})")
        (size,) = struct.unpack("<I", header)
        reply: tuple[str, Any] = pickle.loads(stdout.read(size))
        return reply

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except Exception:
            self.proc.kill()


class CompilePool:
    """``size`` worker processes compiling for one GPU target (Note [Compiling in worker
    processes]). Workers start in the background; ``submit`` queues a job for the next free one."""

    def __init__(self, size: int, target: tuple[str, int, int, str]) -> None:
        self.size, self.target = size, target
        self.pid = os.getpid()  # a forked child never talks to its parent's workers
        # free workers; None once no worker is left (every job then falls back to the parent)
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        self._workers: list[_Worker] = []
        self._starting = size
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="kiln-compile")
        for _ in range(size):
            self._threads.submit(self._start_one)

    def _retire(self, worker: _Worker | None) -> None:
        """A worker that did not start (None) or died: when none is left, say so to waiters."""
        with self._lock:
            if worker is None:
                self._starting -= 1
            else:
                self._workers.remove(worker)
            none_left = not self._workers and self._starting == 0
        if worker is not None:
            worker.close()
        if none_left:
            self._idle.put(None)

    def _start_one(self) -> None:
        try:
            worker = _Worker(self.target)
        except Exception as exc:  # no worker: its jobs go to the others, or to the parent
            log.warning("kiln: a Triton compile worker did not start: %s", exc)
            self._retire(None)
            return
        with self._lock:
            self._starting -= 1
            self._workers.append(worker)
        self._idle.put(worker)

    def _run(self, job: tuple[Any, ...]) -> tuple[str, Any]:
        worker = self._idle.get()
        if worker is None:
            self._idle.put(None)
            return ("error", "no compile worker")
        try:
            reply = worker.call(job)
        except Exception as exc:  # the worker died: retire it, the parent compiles this job
            self._retire(worker)
            return ("error", f"{type(exc).__name__}: {exc}")
        self._idle.put(worker)
        return reply

    def compile(
        self, module_name: str, path: str, fn_name: str, specialization: str
    ) -> Future[tuple[str, Any]]:
        """Compile one recorded kernel into Triton's disk cache (the folder this process's Triton
        uses now); the future's reply is ("ok", seconds) or ("error", text)."""
        from triton import knobs

        job = ("compile", str(knobs.cache.dir), module_name, path, fn_name, specialization)
        return self._threads.submit(self._run, job)

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.close()


_POOL: CompilePool | None = None
_POOL_LOCK = threading.Lock()


def _current_target() -> tuple[str, int, int, str] | None:
    """The GPU target of this process's Triton, and the ptxas version its cache keys carry."""
    try:
        import triton

        target = triton.runtime.driver.active.get_current_target()
    except Exception:
        return None
    return (target.backend, int(target.arch), int(target.warp_size), _ptxas_version(int(target.arch)))


def _ptxas_version(arch: int) -> str:
    """Note [The ptxas version in the cache key]: an NVIDIA kernel's cache key holds the ptxas
    version, which Triton reads once per process (``get_ptxas_version`` is cached) from the ptxas
    that ``TRITON_PTXAS_PATH`` named at that moment. Another library in the process may change
    that variable later (torch.compile points it at torch's own ptxas when it first compiles): a
    worker started after that would read another version and file its binaries under keys this
    process never looks up. So the workers are told this process's version, through Triton's
    ``mock_ptx_version`` knob (which stands in for exactly that reading, and is not itself part
    of any key). "" where the backend is not NVIDIA's or this Triton has no such function."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version

        return str(get_ptxas_version(arch))
    except Exception:
        return ""


def _prepare_here(target: tuple[str, int, int, str]) -> None:
    """This process's share of Triton's one-time work (Note [Compiling in worker processes]): the
    workers' results are loaded here, and the first load would otherwise pay for it."""
    try:
        from triton.backends.compiler import GPUTarget

        from .compile_worker import prepare

        prepare(GPUTarget(*target[:3]))
    except Exception as exc:  # only a head start: the first load does it otherwise
        log.debug("Triton's setup ahead of time failed: %s", exc)


def warm() -> CompilePool | None:
    """The process's pool for the current GPU, started on first use; None where it is switched
    off, or Triton lacks what it needs."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and _POOL.pid == os.getpid():
            return _POOL
        if _disabled:
            return None
        size = pool_size()
        if size <= 1 or not WORKER.exists() or not _install_hooks():
            return None
        target = _current_target()
        if target is None:
            return None
        _POOL = CompilePool(size, target)
        atexit.register(shutdown)
        threading.Thread(target=_prepare_here, args=(target,), daemon=True).start()
        log.info("started %d Triton compile workers for %s", size, target[:3])
        return _POOL


def shutdown() -> None:
    """Stop the pool's workers (at exit; a later compile starts a new pool)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == os.getpid():  # a forked child leaves its parent's alone
        pool.close()
