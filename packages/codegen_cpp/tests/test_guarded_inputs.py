"""Note [Inputs the frame guard checks in the C++ wrapper]: with ``guarded_layouts`` the wrapper
checks only each input's storage offset; an input at another offset is still copied into the
compiled layout, and without it every input is checked in full."""

from __future__ import annotations

from typing import Any

import torch

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph

aten = torch.ops.aten


def f(x: Any, y: Any) -> Any:
    return aten.mul.Tensor(aten.add.Tensor(x, y), 2.0)


def test_guarded_inputs_are_checked_for_their_storage_offset_only() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    backend = CppBackend(guarded_layouts=True)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, y], backend=backend)
    wrapper = backend.last_wrapper
    assert "x.stride()" not in wrapper and "x.shape" not in wrapper, wrapper
    assert "x.storage_offset() != 0" in wrapper, wrapper
    shifted = torch.cat([torch.zeros(1, 8), x])[1:]  # the same layout at offset 8
    assert shifted.storage_offset() == 8 and shifted.stride() == x.stride()
    torch.testing.assert_close(compiled(shifted, y), f(shifted, y))
    torch.testing.assert_close(compiled(x, y), f(x, y))


def test_unguarded_inputs_are_checked_in_full() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    backend = CppBackend()
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, y], backend=backend)
    assert "x.stride() != (8, 1)" in backend.last_wrapper, backend.last_wrapper
    transposed = x.t().contiguous().t()  # other strides: conformed by the wrapper
    torch.testing.assert_close(compiled(transposed, y), f(transposed, y))


def scale(stat: Any, x: Any) -> Any:
    return aten.mul.Tensor(aten.add.Tensor(x, stat), stat)


def test_strides_of_size_one_dims_are_not_compared(monkeypatch: Any) -> None:
    # Note [Strides of size-one dims of inputs]: a saved BatchNorm statistic (1, C, 1, 1) that
    # arrives with strides (1, 1, 1, 1), compiled as (C, 1, 1, 1), is read in place (it was copied
    # on every backward call); its channel stride is still compared
    from kiln_loopir import wrapper_support

    copies = []
    conform = wrapper_support.conform_input

    def counting(t: Any, *args: Any, **kwargs: Any) -> Any:
        copies.append(tuple(t.stride()))
        return conform(t, *args, **kwargs)

    stat, x = torch.randn(1, 4, 1, 1), torch.randn(2, 4, 3, 3)
    backend = CppBackend()
    compiled = compile_graph(torch.fx.symbolic_trace(scale), [stat, x], backend=backend)
    assert "stat.stride(1) != 1" in backend.last_wrapper, backend.last_wrapper
    monkeypatch.setitem(compiled._fn.__globals__, "_conform", counting)
    flat = torch.randn(4).as_strided((1, 4, 1, 1), (1, 1, 1, 1))
    torch.testing.assert_close(compiled(flat, x), scale(flat, x))
    assert copies == []
    spread = torch.randn(8)[::2].view(1, 4, 1, 1)  # the channel stride differs: copied
    assert spread.stride() == (8, 2, 2, 2)
    torch.testing.assert_close(compiled(spread, x), scale(spread, x))
    assert copies == [(8, 2, 2, 2)]


def relu_mm(x: Any, y: Any) -> Any:
    return aten.mm.default(aten.relu.default(x), y)


def _laid_out_wrapper(monkeypatch: Any, env: str, **options: Any) -> tuple[Any, str]:
    monkeypatch.setenv("KILN_LAID_OUT_INPUTS", env)
    gm = torch.fx.symbolic_trace(relu_mm)
    gm.meta["laid_out_inputs"] = (0,)  # as kiln_aotgrad marks a backward's saved value
    backend = CppBackend(options or None)
    compiled = compile_graph(gm, [torch.randn(4, 6), torch.randn(6, 3)], backend=backend)
    return compiled, backend.last_wrapper


def test_inputs_the_forward_laid_out_are_checked_for_their_offset_only(monkeypatch: Any) -> None:
    """Note [Saved values the forward laid out, checked by offset]: a backward's input listed as
    laid out by the compiled forward is checked for its storage offset alone (one at another
    offset is still copied into place); the other inputs in full."""
    from kiln_loopir import wrapper_support

    compiled, wrapper = _laid_out_wrapper(monkeypatch, "1")
    assert "if x.storage_offset() != 0: x = _conform(" in wrapper and "x.stride()" not in wrapper, wrapper
    assert "y.stride() != (3, 1)" in wrapper, wrapper
    copies: list[tuple[int, ...]] = []
    conform = wrapper_support.conform_input

    def counting(t: Any, *args: Any, **kwargs: Any) -> Any:
        copies.append(tuple(t.stride()))
        return conform(t, *args, **kwargs)

    monkeypatch.setitem(compiled._fn.__globals__, "_conform", counting)
    x, y = torch.randn(4, 6), torch.randn(6, 3)
    torch.testing.assert_close(compiled(x, y), relu_mm(x, y))
    assert copies == []
    shifted = torch.cat([torch.zeros(1, 6), x])[1:]  # the same layout at offset 6: copied
    torch.testing.assert_close(compiled(shifted, y), relu_mm(shifted, y))
    assert copies == [(6, 1)]


def test_inputs_the_forward_laid_out_are_checked_in_full_when_switched_off(monkeypatch: Any) -> None:
    _, by_env = _laid_out_wrapper(monkeypatch, "0")
    _, by_option = _laid_out_wrapper(monkeypatch, "1", laid_out_inputs=False)
    for wrapper in (by_env, by_option):
        assert "x.stride() != (6, 1)" in wrapper and "x.shape != (4, 6)" in wrapper, wrapper
