"""Kernel names that say their kind and what they fuse (``triton_poi_fused_mul_tanh_0``), and the
user's lines atop each kernel's source."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import torch
import torch.fx
from triton_check import DEVICES, check

from kiln_codegen_triton import TritonBackend, counters
from kiln_loopir.testing import trace_with_user_lines

aten = torch.ops.aten


def _graph(x: Any, w: Any, z: Any) -> Any:
    y = aten.mul.Tensor(aten.tanh.default(x), w)
    return aten.sum.dim_IntList(y, [1]), aten.cos.default(z)


@pytest.mark.parametrize("device", DEVICES)
def test_names_carry_kind_and_fused_ops(device: str) -> None:
    x, w, z = torch.randn(32, 48), torch.randn(48), torch.randn(20)
    persistent = check(_graph, x, w, z, device=device)
    names = [s.name for s in persistent.last_specs]
    assert all(n.isidentifier() for n in names) and len(set(names)) == len(names)
    assert {re.sub(r"_\d+$", "", n) for n in names} == {
        "triton_per_fused_mul_sum_tanh",
        "triton_poi_fused_cos",
    }
    looped = check(_graph, x, w, z, device=device, backend=TritonBackend(max_persistent_rblock=16))
    assert any(s.name.startswith("triton_red_fused_mul_sum_tanh_") for s in looped.last_specs)
    for spec in [*persistent.last_specs, *looped.last_specs]:
        assert f"def {spec.name}(" in spec.source


@pytest.mark.parametrize("device", DEVICES)
def test_split_reduction_kernels_are_named_apart(device: str) -> None:
    def fn(x: Any) -> Any:
        return aten.sum.dim_IntList(aten.exp.default(x), [0])

    backend = check(fn, torch.randn(512, 4), device=device, backend=TritonBackend(split_min_rnumel=64))
    names = [s.name for s in backend.last_specs]
    assert len(names) == 2 and len(set(names)) == 2 and all(n.isidentifier() for n in names)
    assert names[0].endswith("_partial") and names[0].startswith("triton_") and "_fused_exp_sum_" in names[0]


def _user_fn(x: Any) -> Any:
    y = aten.sigmoid.default(x)
    return aten.mul.Tensor(y, x)


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_source_opens_with_the_users_lines(device: str) -> None:
    gm = trace_with_user_lines(_user_fn)
    backend = check(gm, torch.randn(100), device=device)
    [spec] = backend.last_specs
    start = inspect.getsourcelines(_user_fn)[1]
    assert spec.name == "triton_poi_fused_mul_sigmoid_0"
    assert spec.source.splitlines()[:4] == [
        "# triton_poi_fused_mul_sigmoid_0 fuses mul, sigmoid (fx nodes sigmoid_default, mul_tensor)",
        f"#   {__file__}:{start + 1}  y = aten.sigmoid.default(x)",
        f"#   {__file__}:{start + 2}  return aten.mul.Tensor(y, x)",
        "@triton.jit",
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_same_graph_gives_same_names_and_reuses_the_module(device: str) -> None:
    x, w, z = torch.randn(8, 40), torch.randn(40), torch.randn(5)
    first = check(_graph, x, w, z, device=device)
    before = counters["modules_written"]
    second = check(_graph, x, w, z, device=device)
    assert [s.name for s in first.last_specs] == [s.name for s in second.last_specs]
    assert second.last_module_path == first.last_module_path
    assert counters["modules_written"] == before
