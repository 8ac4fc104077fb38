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
  kiln_tensor_check.h. It is built once per torch version into the kiln cache (about 40 s of
  g++), loaded only when built for the torch that is running, and anything it cannot read the
  way the getters do (symbolic or custom sizes, a sparse layout) it leaves to the attribute
  path, which stays the fallback whenever the checker is absent. Rows use it only for types whose
  metadata getters are torch's own (`torch.Tensor`, `nn.Parameter`).
`KILN_TENSOR_CHECKER=0` never uses it, `=1` (the default) uses it when it is built, `=build`
also builds it when it is not; `python -m kiln_dynamo.tensor_check` builds it.

Dispatch keys: a tensor of the same type, dtype, device and layout can still dispatch
differently (an inference tensor, a lazily conjugated or negated view, a vmap-batched tensor);
every tensor guard compares `dispatch_keys(t)`, the raw bits of its DispatchKeySet.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

import kiln_frame_hook

log = logging.getLogger("kiln.dynamo.guards")

_state: dict[str, object] = {"tried": False, "module": None, "reason": "not tried"}


def dispatch_keys(t: torch.Tensor) -> int:
    """The raw bits of `t`'s dispatch key set (what the torch-linked checker compares)."""
    return int(torch._C._dispatch_keys(t).raw_repr())


def _build_dir() -> Path:
    root = Path(os.environ.get("KILN_CACHE_DIR", Path.home() / ".cache" / "kiln"))
    return root / "tensor_check" / torch.__version__.replace("+", "_")


def _load(build: bool) -> object | None:
    """The built extension module, building it when `build`; None (with the reason) otherwise."""
    from torch.utils import cpp_extension

    where = _build_dir()
    built = any(where.glob("kiln_tensor_check*.so"))
    if not built and not build:
        _state["reason"] = f"not built (python -m kiln_dynamo.tensor_check builds it into {where})"
        return None
    where.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).with_name("_tensor_check.cpp")
    return cpp_extension.load(
        name="kiln_tensor_check",
        sources=[str(source)],
        extra_include_paths=[str(Path(kiln_frame_hook.__file__).parent)],
        extra_cflags=["-O2"],
        build_directory=str(where),
        verbose=False,
    )


def install(build: bool | None = None) -> bool:
    """Hand the torch-linked checker to kiln_frame_hook if it can be had (once per process);
    whether it is in use. `build` overrides KILN_TENSOR_CHECKER=build."""
    setting = os.environ.get("KILN_TENSOR_CHECKER", "1")
    if setting == "0":
        _state["reason"] = "off (KILN_TENSOR_CHECKER=0)"
        return False
    if _state["module"] is not None:
        return True
    if _state["tried"] and not build:
        return False
    _state["tried"] = True
    try:
        module = _load(build if build is not None else setting == "build")
    except Exception as e:  # no compiler, no headers: the attribute path stays
        _state["reason"] = f"could not build it: {type(e).__name__}: {e}"
        module = None
    if module is None:
        log.debug("guard trees read tensor metadata through attributes: %s", _state["reason"])
        return False
    kiln_frame_hook.set_tensor_checker(module.checker)  # type: ignore[attr-defined]
    _state["module"], _state["reason"] = module, "in use"
    log.debug("guard trees check tensors with the torch-linked checker (%s)", module)
    return True


def uninstall() -> None:
    """Back to the attribute path (for tests and measurements)."""
    kiln_frame_hook.set_tensor_checker(None)
    _state["module"], _state["tried"], _state["reason"] = None, False, "uninstalled"


def status() -> str:
    return str(_state["reason"])


if __name__ == "__main__":
    print("in use" if install(build=True) else status())
