"""loopir's graph passes through the C++ backend: the CUDA channels-last rule forced on CPU tensors
(Note [Channels-last for convolutions]) and forced matmul padding (Note [Matmul padding]).

Convolutions are compared with a wider tolerance: eager's reference runs ATen's own NCHW kernel
(Note [oneDNN is not the reference]), the compiled graph oneDNN's NHWC one, which sums the 144
products of a 3x3x16 window in another order."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx
from cpp_check import assert_same, eager, make

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import bmm, conv, with_vals

aten = torch.ops.aten


def resnet_block(x: Any, w1: Any, w2: Any, mean: Any, var: Any) -> Any:
    a = aten.relu.default(conv(x, w1))
    bn = aten._native_batch_norm_legit_no_training.default(a, None, None, mean, var, 0.1, 1e-5)[0]
    b = conv(aten.max_pool2d_with_indices.default(bn, [3, 3], [1, 1], [1, 1])[0], w2)
    y = aten.relu.default(aten.add.Tensor(b, a))
    return y, aten.mean.dim(y, [2, 3])


def compile_and_check(
    gm: torch.fx.GraphModule, inputs: list[Any], options: dict[str, Any], scale: float = 1.0
) -> Any:
    backend = CppBackend()
    compiled = compile_graph(gm, inputs, backend=backend, options=options)
    actual, expected = compiled(*inputs), eager(gm, *inputs)
    assert_same(actual, expected, "output", scale)
    assert backend.last_declined == [], backend.last_declined
    return compiled, actual, expected


@pytest.mark.parametrize("policy", ["cuda", "cpu"])
def test_resnet_block_channels_last_under_each_rule(policy: str) -> None:
    # activations outweigh weights, so the CPU rule chooses NHWC too
    torch.manual_seed(0)
    inputs = [
        make((2, 16, 16, 16)),
        make((16, 16, 3, 3)),
        make((16, 16, 3, 3)),
        make((16,)),
        make((16,), low=0.5, high=2),
    ]
    gm = with_vals(resnet_block, *inputs)
    with torch.no_grad():
        compiled, actual, expected = compile_and_check(gm, inputs, {"layout_policy": policy}, scale=50.0)
    assert compiled.graph.channels_last
    for got, want in zip(actual, expected, strict=True):
        assert all(g == w for g, w, n in zip(got.stride(), want.stride(), want.shape, strict=True) if n != 1)
    convs = [op for op in compiled.graph.operations if "convolution" in str(getattr(op, "op", ""))]
    assert convs[1].args[0].layout.stride[1] == 1


def test_grouped_convs_keep_nchw_under_the_cuda_rule() -> None:
    torch.manual_seed(0)
    inputs = [make((2, 32, 8, 8)), make((32, 8, 3, 3))]
    gm = with_vals(lambda x, w: aten.relu.default(conv(x, w, 4)), *inputs)
    with torch.no_grad():
        compiled, _, _ = compile_and_check(gm, inputs, {"layout_policy": "cuda"}, scale=50.0)
    assert not compiled.graph.channels_last


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forced_padding_matches_eager(dtype: torch.dtype) -> None:
    bias, a, b = make((13,), dtype), make((5, 7), dtype), make((7, 13), dtype)
    gm = with_vals(lambda c, x, y: aten.gelu.default(aten.addmm.default(c, x, y)), bias, a, b)
    compiled, _, _ = compile_and_check(gm, [bias, a, b], {"pad_mm": "force"})
    assert any(name == "pad_mm" and text.startswith("pad") for name, text in compiled.passes.record)
    x, y = make((3, 5, 7), dtype), make((3, 7, 9), dtype)
    gm = with_vals(bmm, x, y)
    compiled, actual, expected = compile_and_check(
        gm, [x, y], {"pad_mm": "force", "pad_mm_output_copy": False}
    )
    align = 4 if dtype == torch.float32 else 8  # on request, a view of the padded product
    padded_n = 16 if align == 8 else 12
    assert actual.stride() == (8 * padded_n, padded_n, 1), actual.stride()
    _, actual, expected = compile_and_check(gm, [x, y], {"pad_mm": "force"})
    assert actual.stride() == expected.stride()  # by default (Note [Padded results the program sees])
