"""C++ kernels that write an output over an input dying in them (Note [A kernel's output in
place of an input that dies in it] in kiln_loopir's scheduler.py): the values equal eager's, the
two pointers of one memory lose ``__restrict__`` (the others keep it), and the wrapper passes one
address for both."""

from __future__ import annotations

import re
from typing import Any

import torch
from cpp_check import aten, check, make

from kiln_loopir import CompiledGraph


def _signature(source: str, kernel: str) -> str:
    match = re.search(rf'extern "C" int64_t {kernel}\(([^)]*)\)', source)
    assert match is not None, kernel
    return match.group(1)


def _inplace_kernel(compiled: CompiledGraph) -> tuple[str, str, str]:
    """(kernel signature, new buffer, buffer it takes over) of the graph's one in-place kernel."""
    (name, source), *rest = compiled.schedule.plan.inplace.items()
    assert not rest
    text: str = compiled.backend.last_source  # type: ignore[attr-defined]
    sigs = re.findall(r'extern "C" int64_t (\w+)\(([^)]*)\)', text)
    (sig,) = [s for _, s in sigs if f"p_{name}" in s]
    return sig, name, source


def _restricted(sig: str) -> dict[str, bool]:
    """Each pointer parameter of a kernel signature -> whether it is ``__restrict__``."""
    params = [p.strip() for p in sig.split(",") if "*" in p]
    return {p.split()[-1][2:]: "__restrict__" in p for p in params}


def _mm_relu_mm(a: Any, b: Any, c: Any) -> Any:
    h = aten.mm.default(a, b)
    return aten.mm.default(aten.relu.default(h), c)


def test_gemm_result_in_place() -> None:
    compiled = check(_mm_relu_mm, make((64, 96)), make((96, 256)), make((256, 8)))
    sig, name, source = _inplace_kernel(compiled)
    assert _restricted(sig) == {source: False, name: False}
    wrapper: str = compiled.backend.last_wrapper  # type: ignore[attr-defined]
    assert f"{name} = {source}  # reuses {source}" in wrapper


def _two_readers(a: Any, b: Any, c: Any, d: Any) -> Any:
    h = aten.mm.default(a, b)
    r = aten.relu.default(aten.add.Tensor(h, d))  # d: a graph input, keeps __restrict__
    s = aten.sigmoid.default(h)
    return aten.mm.default(r, c), aten.mm.default(s, c)


def test_fused_readers_before_the_write() -> None:
    """Two members read the GEMM's result; the later one writes over it, after the first one's
    read of the same element in the same iteration."""
    a, b, c, d = make((64, 96)), make((96, 256)), make((256, 8)), make((64, 256))
    compiled = check(_two_readers, a, b, c, d)
    sig, name, source = _inplace_kernel(compiled)
    restricted = _restricted(sig)
    assert restricted.pop(name) is False and restricted.pop(source) is False
    assert restricted and all(restricted.values()), sig  # the other buffers keep it


def _kernel_result(a: Any, b: Any) -> Any:
    y = aten.sin.default(a)
    p = aten.mm.default(y, b)
    return aten.mul.Tensor(aten.cos.default(y), aten.slice.Tensor(p, 1, 0, 1))


def test_kernel_result_in_place() -> None:
    compiled = check(_kernel_result, make((128, 256)), make((256, 8)))
    sig, name, source = _inplace_kernel(compiled)
    restricted = _restricted(sig)
    assert restricted.pop(name) is False and restricted.pop(source) is False
    assert all(restricted.values()), sig
    out = compiled(*(t := (make((128, 256)), make((256, 8)))))
    torch.testing.assert_close(out, _kernel_result(*t))  # a second call: buffers planned again


def test_option_off_keeps_restrict() -> None:
    compiled = check(
        _mm_relu_mm, make((64, 96)), make((96, 256)), make((256, 8)), options={"inplace_reuse": False}
    )
    assert compiled.schedule.plan.inplace == {}
    assert "__restrict__" in compiled.backend.last_source  # type: ignore[attr-defined]
