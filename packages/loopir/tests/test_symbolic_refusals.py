"""Refusals of symbolic sizes say where and what (Note [Symbolic refusals name the op] in
compile.py): an error that escapes lowering or code generation of a graph with size symbols, and
a guard added meanwhile, are reported with the fx node or kernel, its aten ops and its symbolic
inputs, never as a bare library error."""

from __future__ import annotations

from typing import Any

import pytest
import sympy
import torch
from kiln_symbolic import DimDynamic, ShapeEnv, make_symint

from kiln_loopir import compile_graph
from kiln_loopir.backend import Backend
from kiln_loopir.compile import SymbolicSizesUnsupported
from kiln_loopir.lowering import LOWERINGS, find_lowering
from kiln_loopir.scheduler import BaseSchedulerNode
from kiln_loopir.testing import with_vals

aten = torch.ops.aten


def _symbolic_graph() -> tuple[torch.fx.GraphModule, list[Any], Any]:
    env = ShapeEnv()
    n = make_symint(env, env.create_symbol(6, "x0", DimDynamic.DYNAMIC), 6)
    x = torch.empty(n, 3, device="meta")
    gm = with_vals(lambda x: aten.add.Tensor(aten.cos.default(x), 1.0), x)
    return gm, [x], n


class _SympyIntBackend(Backend):
    """A generator that takes symbolic sizes and asks sympy for an int of one while it generates."""

    symbolic_sizes = True

    def codegen_kernel(self, node: BaseSchedulerNode, graph: Any) -> Any:
        return int(sympy.Symbol("s0"))  # TypeError: Cannot convert symbols to int


def test_a_library_error_in_code_generation_names_the_kernel_and_its_ops() -> None:
    gm, inputs, _ = _symbolic_graph()
    with pytest.raises(SymbolicSizesUnsupported) as info:
        compile_graph(gm, inputs, backend=_SympyIntBackend())
    msg = str(info.value)
    assert msg.startswith("generating kernel buf"), msg
    assert "(cos at node cos_default, add at node add_tensor)" in msg, msg
    assert msg.endswith("TypeError: Cannot convert symbols to int"), msg


def test_a_guard_added_by_a_lowering_names_the_node_and_its_symbolic_input(monkeypatch: Any) -> None:
    gm, inputs, n = _symbolic_graph()
    cos = find_lowering(aten.cos.default)
    assert cos is not None

    def guarding_cos(*args: Any, **kwargs: Any) -> Any:
        assert n == 6  # a lowering that decides on a symbolic size: guards Eq(s0, 6)
        return cos(*args, **kwargs)

    monkeypatch.setitem(LOWERINGS, aten.cos.default, guarding_cos)
    with pytest.raises(SymbolicSizesUnsupported) as info:
        compile_graph(gm, inputs, backend=_SympyIntBackend())
    msg = str(info.value)
    assert msg.startswith("lowering specialized a symbolic size (Eq(s0, 6))"), msg
    assert "at aten.cos.default at node cos_default; symbolic: x of size [s0, 3]" in msg, msg
