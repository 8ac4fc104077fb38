"""``libdevice`` for Triton's interpreter: the CUDA math library, emulated with torch.

Under ``TRITON_INTERPRET=1`` a kernel body runs as Python over numpy arrays, and calls into
extern libraries (``libdevice.tanh`` and friends) raise. Generated modules then bind the name
``libdevice`` to :data:`libdevice` below, whose functions unwrap the interpreter's tensors, apply
the torch function of the same meaning (so the CPU tests compare eager with eager's own math)
and wrap the result again. Only the interpreter ever calls these; on a GPU the same generated
source calls Triton's libdevice.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch


def interpreting() -> bool:
    """Is Triton running kernels through its interpreter (``TRITON_INTERPRET=1``)?"""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def fix_comparisons() -> None:
    """Make the interpreter's comparisons int1 (idempotent); see the Note below.

    Note [Comparisons in the interpreter]: Triton's interpreter (3.8) types the result of every
    comparison as its left operand's element type (``binary_op`` keeps ``lhs.dtype``): the data
    is a numpy bool array, the handle says float32. On a block nothing reads that type, but a
    comparison of 0-d values, as ``a != a`` of a constant in ``k_minimum(tl.full([], 0.0, ..), x)``
    (log-sigmoid's ``min(0, x)``), is later splatted to a block in the handle's type: a float32
    block of 0s and 1s, and ``(a < b) | (a != a)`` raises in numpy ("ufunc 'bitwise_or' not
    supported"). Compiled for a GPU the same kernel is right, so the emulator, not the generated
    code, is what is fixed: each comparison's handle is typed int1, as the compiler types it.
    """
    from triton.runtime import interpreter as interp

    builder: Any = interp.InterpreterBuilder
    if getattr(builder, "_kiln_int1_comparisons", False):
        return
    import triton.language as tl

    def typed(op: Callable[..., Any]) -> Callable[..., Any]:
        def compare(self: Any, lhs: Any, rhs: Any) -> Any:
            out = op(self, lhs, rhs)
            return interp.TensorHandle(out.data.astype(bool, copy=False), tl.int1)

        return compare

    for name in [n for n in dir(builder) if n.startswith(("create_icmp", "create_fcmp"))]:
        setattr(builder, name, typed(getattr(builder, name)))
    builder._kiln_int1_comparisons = True


def device_assert(cond: Any, msg: str) -> None:
    """``tl.device_assert`` for the interpreter, which ignores it (its builder is never in debug
    mode); raises ``IndexError`` like eager for an out-of-range index."""
    data = cond.handle.data if hasattr(cond, "handle") else cond
    if not bool(torch.as_tensor(data).all()):
        raise IndexError(msg)


_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "expm1": torch.expm1, "log1p": torch.log1p, "log10": torch.log10, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin,
    "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh,
    "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv, "floor": torch.floor,
    "ceil": torch.ceil, "nearbyint": torch.round, "trunc": torch.trunc, "lgamma": torch.lgamma,
    "signbit": lambda t: torch.signbit(t).to(torch.int32),
}  # fmt: skip
_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "fmod": torch.fmod, "pow": torch.pow, "atan2": torch.atan2, "copysign": torch.copysign,
    "hypot": torch.hypot, "nextafter": torch.nextafter,
}  # fmt: skip


# wrapper namespace slots that hand out tensors a GPU form's pointers may start
_HANDS_OUT_TENSORS = ("_alloc", "_empty", "_empty_strided", "_dense", "_conform", "_flat")


def replay_gpu_form(namespace: dict[str, Any], launchers: dict[str, Any]) -> Callable[[Any], Any]:
    """Rewire ``namespace``, a GPU-form wrapper's (Note [Kernel arguments are pointers] in
    wrapper.py) generated for CPU tensors, in place, so that its launches run their kernels under
    the interpreter; returns ``seen``, which the caller applies to the call's arguments.

    Note [A GPU form run under the interpreter]: a GPU form's launch passes pointers, and every
    pointer it passes starts a storage (buffers and extern results at offset 0, inputs shifted
    back by their offset). Each launch slot named in ``launchers`` (slot -> the kernel's
    Launcher) is replayed through that Launcher with the flat storage tensors its pointers start,
    found in a table of the storages the call has seen: the namespace's constants, what ``seen``
    is given, and what the allocation, copy and extern-op slots return. A pointer that starts no
    storage seen raises LookupError. Used by the wrapper tests and by
    ``scripts/triton_wrapper_overhead.py --check`` to check the GPU wrapper without a GPU."""
    storages: dict[int, torch.Tensor] = {}

    def seen(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.numel():
            storages[value.untyped_storage().data_ptr()] = value
        elif isinstance(value, list | tuple):
            for v in value:
                seen(v)
        return value

    def flat(pointer: int) -> torch.Tensor:
        t = storages.get(pointer)
        if t is None:
            raise LookupError(
                f"a kernel took a pointer that starts no storage the call has seen: {pointer:#x}"
            )
        n = t.untyped_storage().nbytes() // t.element_size()
        return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))

    def replay(launcher: Any) -> Callable[..., None]:
        n = len(launcher.spec.params)

        def launch(stream: Any, *args: Any) -> None:
            launcher(*(flat(p) for p in args[:n]), *args[n:])

        return launch

    def watching(f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return seen(f(*args, **kwargs))

        return call

    for value in list(namespace.values()):
        seen(value)  # constants
    for slot, launcher in launchers.items():
        namespace[slot] = replay(launcher)
    for slot in [s for s in namespace if s.startswith("_op_") or s in _HANDS_OUT_TENSORS]:
        namespace[slot] = watching(namespace[slot])
    return seen


def _wrap(name: str, fn: Callable[..., torch.Tensor], arity: int) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        assert len(args) == arity, name
        tensors = [a for a in args if isinstance(a, tl.tensor)]
        ref = tensors[0]
        # the interpreter holds numpy arrays; torch reads and writes them without a copy
        datas = [torch.as_tensor(a.handle.data if isinstance(a, tl.tensor) else a) for a in args]
        shape = torch.broadcast_shapes(*[d.shape for d in datas])
        dtype = torch.as_tensor(ref.handle.data).dtype
        inputs = [d.to(dtype).broadcast_to(shape).contiguous() for d in datas]
        out = fn(*inputs)
        result_type = tl.int32 if out.dtype == torch.int32 else ref.dtype
        blocks = [list(t.type.shape) for t in tensors if t.type.is_block()]
        ty = tl.block_type(result_type, list(torch.broadcast_shapes(*blocks))) if blocks else result_type
        return tl.tensor(TensorHandle(out.numpy(), result_type), ty)

    call.__name__ = name
    return call


class _Libdevice:
    """Attribute access gives the emulated function (``libdevice.tanh``)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in _UNARY:
            return _wrap(name, _UNARY[name], 1)
        if name in _BINARY:
            return _wrap(name, _BINARY[name], 2)
        raise AttributeError(f"libdevice.{name} has no interpreter emulation")


libdevice = _Libdevice()
