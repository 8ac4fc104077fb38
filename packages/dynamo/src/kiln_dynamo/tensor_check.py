"""The optional torch-linked tensor checker of guard trees, and the dispatch keys of a tensor.

Note [The torch-linked tensor checker]
A guard tree's tensor rows (type, dtype, device, requires_grad, sizes, strides, dispatch keys of
every tensor the graph reads) are most of a warm guard's cost once the guard memo skips the
module walk (Note [Skipping what did not change] in kiln_frame_hook's guard_memo.c): read
through the attribute protocol, each property is a call into torch's getters (`t.stride()`
goes through torch's argument parser), about 0.3 µs per tensor, and the dispatch keys another
0.4 (`torch._C._dispatch_keys`). kiln_frame_hook has no torch dependency, so it cannot read the
TensorImpl itself. The options, measured on this machine (ResNet at cpu size, 63 tensors):
- read the attributes (the pure path, always there): ~0.3 µs per tensor, ~0.7 with the keys;
- find the TensorImpl's field offsets at run time and read memory without torch's headers:
  fast, but it depends on a private C++ layout that no header pins, so a torch upgrade could
  turn a guard silently wrong; rejected;
- a checker compiled against the running torch's headers (this module): it reads sizes,
  strides, dtype, device, requires_grad and the dispatch key set off the TensorImpl in tens of
  nanoseconds and hands itself to kiln_frame_hook as a capsule through the C ABI of
  kiln_tensor_check.h. It is built once per torch version (and source) into the kiln cache (one g++ call,
  10-40 s), loaded only when built for the torch that is running, and anything it cannot read the
  way the getters do (symbolic or custom sizes, a sparse layout) it leaves to the attribute
  path, which stays the fallback whenever the checker is absent. Rows use it only for types whose
  metadata getters are torch's own (`torch.Tensor`, `nn.Parameter`).
`KILN_TENSOR_CHECKER=0` never uses it, `=1` uses it when it is built, `=build` also builds it
when it is not (before the first guard runs), and `=auto` (the default) uses it when built and
otherwise builds it in a background thread, handing it over when done: the first compiles of a
fresh cache are not delayed by the build, and guards already built switch to it (the checker is
read per evaluation). The build goes to a private temporary folder and its library is moved into
the cache atomically, so an interrupted build leaves no lock or half-written file behind for the
next process; two processes may both build, and one file wins. `python -m kiln_dynamo.tensor_check`
builds it in the foreground.

Dispatch keys: a tensor of the same type, dtype, device and layout can still dispatch
differently (an inference tensor, a lazily conjugated or negated view, a vmap-batched tensor);
every tensor guard compares `dispatch_keys(t)`, the raw bits of its DispatchKeySet.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import kiln_frame_hook

log = logging.getLogger("kiln.dynamo.guards")


@dataclass
class _Checker:
    """This process's checker: whether install was tried, the module handed over, why not, the
    background build, and a generation that an uninstall moves on (a build under way then
    hands nothing over)."""

    tried: bool = False
    module: Any = None
    reason: str = "not tried"
    thread: threading.Thread | None = None
    generation: int = 0


_state = _Checker()


def dispatch_keys(t: torch.Tensor) -> int:
    """The raw bits of `t`'s dispatch key set (what the torch-linked checker compares)."""
    return int(torch._C._dispatch_keys(t).raw_repr())


def _build_dir() -> Path:
    """Per torch version and per source of the checker: a library built from an older source
    (without `data_ptrs_equal`) is not loaded for a newer one."""
    import hashlib

    root = Path(os.environ.get("KILN_CACHE_DIR", Path.home() / ".cache" / "kiln"))
    source = hashlib.sha256(Path(__file__).with_name("_tensor_check.cpp").read_bytes()).hexdigest()[:12]
    return root / "tensor_check" / f"{torch.__version__.replace('+', '_')}-{source}"


def data_ptrs_equal() -> Callable[[tuple[Any, ...], tuple[int | None, ...]], bool] | None:
    """The checker's `data_ptrs_equal(tensors, pointers)` (whether each tensor's `data_ptr()` is
    its pointer, None: not checked, in one C loop; see _tensor_check.cpp), or None while the
    checker is not in use.
    kiln hands it to kiln_codegen_triton's CUDA-graph runner (Note [The runner's per-call path])."""
    module = _state.module
    return getattr(module, "data_ptrs_equal", None) if module is not None else None


def _library(where: Path) -> Path | None:
    found = sorted(where.glob("kiln_tensor_check*.so"))
    return found[0] if found else None


def _import(path: Path) -> Any:
    """The built extension from its library file (torch is imported: its symbols resolve)."""
    import importlib.machinery
    import importlib.util

    name = path.name.split(".")[0]  # the module's name is its file's (TORCH_EXTENSION_NAME)
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


# Note [The background build yields the cores]: the build in the background runs beside the
# user's first calls, which at a thread count equal to the machine's cores keep every core in an
# OpenMP team: a compiler holding one core makes each parallel region wait a scheduler slice for
# the thread it displaced. On the 16-core H100 host, GPT-2's eager and compiled calls at 16 threads
# measured 100x and 40x slower while a fresh cache built the checker (`scripts/omp_probe.py`). The
# background compiler runs at the lowest CPU priority (`nice -n 19`), so it takes only what the
# program leaves idle; a foreground build (`kiln.prepare()`, `KILN_TENSOR_CHECKER=build`) runs at
# normal priority, as the caller waits for it.
def _compile(source: Path, library: Path, name: str, background: bool = False) -> None:
    """One compiler call: `source` against the running torch's headers into `library`
    (no ninja, which torch's extension loader needs and a machine may lack)."""
    import shutil
    import subprocess
    import sysconfig

    from torch.utils import cpp_extension

    libs = cpp_extension.library_paths()
    command = [
        os.environ.get("CXX", "g++"), "-O2", "-std=c++17", "-fPIC", "-shared",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-DTORCH_EXTENSION_NAME={name}",
        *(f"-I{p}" for p in cpp_extension.include_paths()),
        f"-I{sysconfig.get_paths()['include']}", f"-I{Path(kiln_frame_hook.__file__).parent}",
        str(source), "-o", str(library),
        *(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs),
        "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
    ]  # fmt: skip
    nice = shutil.which("nice") if background else None  # Note [The background build yields the cores]
    if nice:
        command = [nice, "-n", "19", *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def _build(where: Path | None = None, background: bool = False) -> Any:
    """Build into a private folder of `where` (the cache's), move the library into it atomically,
    load it."""
    import shutil
    import tempfile

    where = where or _build_dir()
    where.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=where))
    try:
        # a name of its own per build: a process may load more than one (tests do)
        name = f"kiln_tensor_check_{os.getpid()}_{scratch.name.removeprefix('.build-')}"
        built = scratch / f"{name}.so"
        _compile(Path(__file__).with_name("_tensor_check.cpp"), built, name, background)
        final = where / built.name
        staged = where / f".{built.name}.{os.getpid()}"
        shutil.copyfile(built, staged)
        os.replace(staged, final)
        return _import(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _hand_over(module: Any) -> None:
    kiln_frame_hook.set_tensor_checker(module.checker)
    _state.module, _state.reason = module, "in use"
    log.debug("guard trees check tensors with the torch-linked checker (%s)", module)


def _build_in_background() -> threading.Thread:
    generation, where = _state.generation, _build_dir()

    def run() -> None:
        try:
            module = _build(where, background=True)
        except Exception as e:  # no compiler, no headers: the attribute path stays
            _state.reason = f"could not build it: {type(e).__name__}: {e}"
            log.debug("guard trees read tensor metadata through attributes: %s", _state.reason)
            return
        # handed over only if nothing changed meanwhile (an uninstall, another cache folder)
        current = _state.generation == generation and _build_dir() == where
        if current and _state.module is None and os.environ.get("KILN_TENSOR_CHECKER", "auto") != "0":
            _hand_over(module)

    _state.reason = "building in the background"
    log.info("kiln: building the torch-linked guard checker in the background (once per torch version)")
    _state.thread = threading.Thread(target=run, name="kiln-tensor-check-build", daemon=True)
    _state.thread.start()
    return _state.thread


def install(build: bool | None = None) -> bool:
    """Hand the torch-linked checker to kiln_frame_hook if it can be had (once per process);
    whether it is in use now. `build` overrides KILN_TENSOR_CHECKER=build (True: build now if
    not built; False: never build)."""
    setting = os.environ.get("KILN_TENSOR_CHECKER", "auto")
    if setting == "0":
        _state.reason = "off (KILN_TENSOR_CHECKER=0)"
        return False
    if _state.module is not None:
        return True
    if _state.tried and not build:
        return False
    _state.tried = True
    built = _library(_build_dir())
    foreground = build if build is not None else setting == "build"
    if built is None and not foreground:
        _state.reason = f"not built (python -m kiln_dynamo.tensor_check builds it into {_build_dir()})"
        if build is None and setting == "auto":
            _build_in_background()
        log.debug("guard trees read tensor metadata through attributes: %s", _state.reason)
        return False
    try:
        module = _import(built) if built is not None else _build()
    except Exception as e:  # no compiler, no headers: the attribute path stays
        _state.reason = f"could not build it: {type(e).__name__}: {e}"
        log.debug("guard trees read tensor metadata through attributes: %s", _state.reason)
        return False
    _hand_over(module)
    return True


def background_build() -> threading.Thread | None:
    """The thread building the checker in the background, if one was started."""
    return _state.thread


def uninstall() -> None:
    """Back to the attribute path (for tests and measurements)."""
    kiln_frame_hook.set_tensor_checker(None)
    _state.module, _state.tried, _state.reason = None, False, "uninstalled"
    _state.generation += 1  # a build under way is not handed over


def status() -> str:
    return _state.reason


if __name__ == "__main__":
    print("in use" if install(build=True) else status())
