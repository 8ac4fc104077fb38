"""Note [Outer products are multiplications]: the outer_product pass over aten graphs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import check, make

from kiln_loopir.passes import run_passes
from kiln_loopir.testing import with_vals

aten = torch.ops.aten


def products(a: Any, b: Any, c: Any, d: Any, e: Any) -> Any:
    outer = aten.bmm.default(a, b)  # [B, M, 1] @ [B, 1, N]
    flat = aten.mm.default(c, d)  # [M, 1] @ [1, N]
    kept = aten.bmm.default(aten.transpose.int(b, 1, 2), e)  # [B, N, 1] @ [B, 1, 4]: also outer
    vector = aten.bmm.default(outer, aten.transpose.int(b, 1, 2))  # reduction length N: a GEMM
    return aten.add.Tensor(aten.relu.default(outer), 1), aten.mul.Tensor(flat, 2), kept, vector


def _inputs(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [
        make((2, 5, 1), dtype),
        make((2, 1, 7), dtype),
        make((6, 1), dtype),
        make((1, 3), dtype),
        make((2, 1, 4), dtype),
    ]


def _records(compiled: Any) -> list[str]:
    return [text for name, text in compiled.passes.record if name == "outer_product"]


def _targets(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_products_of_reduction_length_one_are_multiplications() -> None:
    xs = _inputs()
    on = check(with_vals(products, *xs), *xs)
    off = check(with_vals(products, *xs), *xs, options={"outer_product": False})
    lines = _records(on)
    assert len(lines) == 3 and all("reduction length 1" in line for line in lines)
    assert _records(off) == ["off (option outer_product=False)"]
    rewritten, _ = run_passes(with_vals(products, *xs), xs, torch.device("cpu"))
    targets = _targets(rewritten)
    assert targets.count(aten.bmm.default) == 1 and aten.mm.default not in targets  # the one of length N
    unchanged, _ = run_passes(with_vals(products, *xs), xs, torch.device("cpu"), {"outer_product": False})
    assert _targets(unchanged).count(aten.bmm.default) == 3 and aten.mm.default in _targets(unchanged)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_multiplication_is_the_gemms_value(dtype: torch.dtype) -> None:
    xs = _inputs(dtype)
    assert len(_records(check(with_vals(products, *xs), *xs))) == 3


def test_other_devices_are_left_alone() -> None:
    xs = _inputs()
    rewritten, ctx = run_passes(with_vals(products, *xs), xs, torch.device("cuda"), {"layout": False})
    assert _targets(rewritten).count(aten.bmm.default) == 3
    assert not [t for n, t in ctx.record if n == "outer_product"]
