"""Generated modules on disk, kernel launchers and the autotuning cache.

A graph's kernels are one Python module: imports, the helper functions of
``triton_ops.PRELUDE`` and one ``@triton.jit`` function per kernel. Triton reads a kernel's source
with ``inspect``, so the module must be a real file: it is written under
``$KILN_CACHE_DIR/triton/<key[:2]>/<key>.py`` (default ``~/.cache/kiln``), where ``key`` hashes the
source, and imported from there. Triton keeps its own cache of compiled binaries.

A :class:`Launcher` calls one kernel with its launch config and grid. Under
``mode="max-autotune"`` the first call times each candidate config on the real arguments and
keeps the fastest; the choice is written to ``$KILN_CACHE_DIR/triton/autotune/<key>.json`` (keyed
by kernel source, sizes, device and Triton version), so later processes skip the timing.

Note [Atomic cache writes]: every file is written under a unique temporary name in its final
directory and renamed into place; a reader sees either no file or a complete one, and two
processes racing on the same key both write complete, identical files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .heuristics import Config, grid
from .interp import interpreting
from .kernel import KernelSpec
from .triton_ops import PRELUDE

log = logging.getLogger("kiln.codegen_triton.autotune")

counters: dict[str, int] = {"modules_written": 0, "modules_reused": 0, "autotuned": 0, "autotune_hits": 0}


def cache_dir() -> Path:
    root = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    return Path(root) / "triton"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename (Note [Atomic cache writes])."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def module_source(kernels: Sequence[KernelSpec]) -> str:
    """The whole generated module for ``kernels``."""
    if interpreting():
        libdevice = "from kiln_codegen_triton.interp import device_assert as k_device_assert, libdevice"
    else:
        libdevice = "from triton.language.extra import libdevice"
    header = [
        "# kiln codegen_triton kernels",
        "import triton",
        "import triton.language as tl",
        libdevice,
    ]
    return "\n".join(header) + "\n\n" + PRELUDE + "\n\n" + "\n\n".join(k.source for k in kernels)


_MODULES: dict[str, ModuleType] = {}


def load_module(source: str) -> tuple[ModuleType, Path]:
    """Write ``source`` into the cache (if not there yet) and import it."""
    key = hashlib.sha256(source.encode()).hexdigest()
    path = cache_dir() / key[:2] / f"{key}.py"
    if key in _MODULES:
        return _MODULES[key], path
    if path.exists() and path.read_text() == source:
        counters["modules_reused"] += 1
    else:
        write_atomic(path, source)
        counters["modules_written"] += 1
    name = f"kiln_triton_{key[:24]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _MODULES[key] = module
    return module, path


def _device_name(args: Sequence[Any]) -> str:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "cuda":
                return torch.cuda.get_device_name(a.device)
            return f"{a.device.type}-interpreter"
    return "none"


class Launcher:
    """Calls one kernel: ``launcher(*tensors)``; see the module docstring."""

    def __init__(self, fn: Any, spec: KernelSpec, candidates: list[Config], *, autotune: bool) -> None:
        self.fn = fn
        self.spec = spec
        self.candidates = candidates
        # running a kernel twice must give the same memory for timing to be harmless
        self.autotune = autotune and len(candidates) > 1 and not spec.atomic
        self.config: Config | None = None if self.autotune else candidates[0]
        self._launch: Callable[..., Any] | None = None if self.config is None else self._bind(self.config)

    def _bind(self, config: Config) -> Callable[..., Any]:
        runner = self.fn[grid(self.spec, config)]
        kwargs = config.kwargs(self.spec.kind)

        def launch(*args: Any) -> Any:
            return runner(*args, **kwargs)

        return launch

    def __call__(self, *args: Any) -> None:
        if self._launch is None:
            self.config = self._tune(args)
            self._launch = self._bind(self.config)
        self._launch(*args)

    def _key(self, args: Sequence[Any]) -> str:
        import triton

        text = json.dumps(
            [self.spec.source, _device_name(args), triton.__version__, [repr(c) for c in self.candidates]]
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def _tune(self, args: Sequence[Any]) -> Config:
        key = self._key(args)
        path = cache_dir() / "autotune" / f"{key}.json"
        if path.exists():
            try:
                chosen = Config(**json.loads(path.read_text())["config"])
                if chosen in self.candidates:
                    counters["autotune_hits"] += 1
                    return chosen
            except (ValueError, KeyError, TypeError):
                pass  # a stale or foreign file: time again
        timings = []
        for i, c in enumerate(self.candidates):
            try:
                timings.append((self._time(c, args), i))
            except Exception as exc:  # a config the compiler rejects (registers, shared memory)
                log.debug("%s: %s failed: %s", self.spec.name, c, exc)
                timings.append((float("inf"), i))
        best = self.candidates[min(timings)[1]]
        log.debug("%s: %s (%s)", self.spec.name, best, ", ".join(f"{t * 1e3:.3f}ms" for t, _ in timings))
        record = {
            "kernel": self.spec.name,
            "config": {
                f: getattr(best, f) for f in ("XBLOCK", "YBLOCK", "RBLOCK", "num_warps", "num_stages")
            },
            "timings_ms": [t * 1e3 for t, _ in timings],
        }
        write_atomic(path, json.dumps(record, indent=1))
        counters["autotuned"] += 1
        return best

    def _time(self, config: Config, args: Sequence[Any]) -> float:
        launch = self._bind(config)
        on_gpu = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args)
        if on_gpu:
            import triton.testing

            return float(triton.testing.do_bench(lambda: launch(*args), warmup=5, rep=25)) / 1e3
        start = time.perf_counter()
        launch(*args)
        return time.perf_counter() - start
