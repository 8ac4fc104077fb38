"""Kernels compiled by the worker pool are what the parent's own compile finds in Triton's cache.

Run as a script with ``TRITON_INTERPRET=0`` (like ``gpu_compile.py``; no GPU needed): a stand-in
driver makes Triton compile for an H100/H200 (sm_90). The graph's kernels are recorded and
compiled by two worker processes (Note [Compiling in worker processes]); then every
``JITFunction.warmup`` of the parent must be a hit in Triton's disk cache, and produce a cubin.
Prints ``pool ok: N kernels, N hits`` twice, then, for workers that file under other keys, that
the pool switched itself off, and exits 0; or says what went wrong and exits 1.
"""

from __future__ import annotations

import os
import sys
from typing import Any

assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run with TRITON_INTERPRET=0"
os.environ["KILN_COMPILE_WORKERS"] = "2"

import torch  # noqa: E402
import torch.fx  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from kiln_codegen_triton import TritonBackend, compile_pool, runtime  # noqa: E402
from kiln_codegen_triton.compile_worker import TargetOnlyDriver  # noqa: E402
from kiln_codegen_triton.runtime import _compile_in_pool, counters, precompile_start  # noqa: E402
from kiln_loopir import compile_graph  # noqa: E402

aten = torch.ops.aten


def graph(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    y = aten.gelu.default(aten.add.Tensor(x, 1.0))
    return (
        y,
        aten._softmax.default(x, 1, False),
        aten.native_layer_norm.default(x, [x.shape[1]], w, b, 1e-5)[0],
        aten.sum.dim_IntList(x, [0]),
        aten.clone.default(aten.permute.default(x, [1, 0]), memory_format=torch.contiguous_format),
    )


def _launchers(fn: Any, inputs: list[torch.Tensor]) -> list[Any]:
    backend = TritonBackend()
    compile_graph(torch.fx.symbolic_trace(fn), inputs, backend=backend)
    return list(backend.last_launchers.values())


def _hits(fn: Any, inputs: list[torch.Tensor]) -> tuple[int, int, int]:
    """Compile ``fn``'s kernels through the pool and load them here: (kernels, loads that hit
    Triton's disk cache, loads that compiled)."""
    launchers = _launchers(fn, inputs)
    before = dict(counters)
    _compile_in_pool(launchers, torch.device("cpu"))
    for launcher in launchers:
        config = launcher.configs_to_compile()[0]
        assert launcher.compiled[config].asm.get("cubin"), f"no cubin for {launcher.spec.name}"
    hits, misses = (counters[k] - before[k] for k in ("pool_hits", "pool_misses"))
    return len(launchers), hits, misses


def _another_ptxas(folder: str) -> str:
    """A ptxas that assembles as Triton's does but names another version, as torch's own ptxas
    would: what torch.compile points TRITON_PTXAS_PATH at in the middle of a process."""
    real = triton.knobs.nvidia.ptxas.path
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "ptxas")
    with open(path, "w") as f:
        f.write(
            f'#!/bin/sh\nif [ "$1" = "--version" ]; then {real} --version | sed "s/Built on/Rebuilt on/"; '
            f'exit 0; fi\nexec {real} "$@"\n'
        )
    os.chmod(path, 0o755)
    return path


def main() -> int:
    triton.runtime.driver.set_active(TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    # Note [The ptxas version in the cache key]: this process reads its ptxas version first, then
    # the variable moves; the workers, started after, must still file under this process's keys
    from triton.backends.nvidia.compiler import get_ptxas_version

    get_ptxas_version(90)
    os.environ["TRITON_PTXAS_PATH"] = _another_ptxas(os.environ["KILN_CACHE_DIR"])
    x, w, b = torch.randn(64, 48), torch.randn(48), torch.randn(48)
    first = _hits(graph, [x, w, b])
    # a new Triton cache folder between graphs (kiln_bench moves it per model): the running
    # workers must compile into the folder the parent reads now
    os.environ["TRITON_CACHE_DIR"] = os.environ["TRITON_CACHE_DIR"] + "-second"
    second = _hits(
        lambda t: (aten.amax.default(t, [1]), aten.sum.dim_IntList(aten.tanh.default(t), [0])), [x]
    )
    for n, hits, misses in (first, second):
        print(f"pool ok: {n} kernels, {hits} hits of {hits + misses}")
        if hits != n or misses:
            return 1
    # Note [Kernels compiled while the next graph is built]: a graph's kernels submitted, another
    # graph built meanwhile, then the wait loads them and rebinds each installed slot
    # (the stand-in driver cannot build Triton's C launcher: a stand-in fast launcher per kernel)
    runtime._fast_launcher = lambda compiled, spec, config, **options: lambda *args: None
    launchers = _launchers(
        lambda t: (aten.amax.default(aten.exp.default(t), [0]), aten.sigmoid.default(t)), [x]
    )
    namespace: dict[str, Any] = {}
    for i, launcher in enumerate(launchers):
        launcher.install(namespace, f"k{i}")
    pending = precompile_start(launchers, torch.device("cpu"))
    if not all(launcher.pending is pending for launcher in launchers) or pending.done:
        print("deferred: the launchers were not handed the pending compile")
        return 1
    _launchers(lambda t: aten.sum.dim_IntList(aten.cos.default(t), [1]), [x])  # the next graph
    pending.wait()
    pending.wait()  # once only
    for i, launcher in enumerate(launchers):
        config = launcher.configs_to_compile()[0]
        if not launcher.compiled[config].asm.get("cubin") or namespace[f"k{i}"] is not launcher.fast:
            print(f"deferred: {launcher.spec.name} not loaded or its slot not rebound")
            return 1
        if launcher.pending is not None:
            return 1
    print(f"deferred ok: {len(launchers)} kernels loaded after another graph was built")
    # Note [When the workers' binaries are not found]: workers not told this process's ptxas
    # version file under other keys; the loads miss, and the pool switches itself off
    compile_pool.shutdown()
    target = compile_pool._current_target()
    assert target is not None
    compile_pool._current_target = lambda: (*target[:3], "")
    launchers = _launchers(
        lambda t: (aten.amin.default(t, [1]), aten.sum.dim_IntList(aten.exp.default(t), [0])), [x]
    )
    before = counters["pool_misses"]
    _compile_in_pool(launchers, torch.device("cpu"))
    missed = counters["pool_misses"] - before
    print(f"pool off: {bool(compile_pool.disabled())} after {missed} of {len(launchers)} loads missed")
    return 0 if compile_pool.disabled() and compile_pool.warm() is None else 1


if __name__ == "__main__":
    sys.exit(main())
