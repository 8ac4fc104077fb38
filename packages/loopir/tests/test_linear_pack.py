"""The linear_pack pass (Note [Packed linear layers]): large addmm / mm over a weight input run
through oneDNN with a packed weight, equal to eager at fp32 tolerance; the pack follows the
weight's version; small products, training graphs and the option keep aten's product."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import make

from kiln_loopir import compile_graph
from kiln_loopir.passes.linear_pack import MIN_MACS, MIN_MACS_BF16, PackedLinear
from kiln_loopir.testing import with_vals

aten = torch.ops.aten

TOL: dict[str, float] = {"rtol": 1e-5, "atol": 1e-4}  # fp32, other blocking of K than MKL's


def linear(x: Any, w: Any, b: Any) -> Any:  # nn.Linear as aotgrad traces it
    return aten.addmm.default(b, x, aten.permute.default(w, [1, 0]))


def conv1d(x: Any, w: Any) -> Any:  # transformers' Conv1D: weight [in, out], no bias here
    return aten.relu.default(aten.mm.default(x, w))


def packed_ops(compiled: Any) -> list[PackedLinear]:
    return [op.op for op in compiled.graph.operations if isinstance(getattr(op, "op", None), PackedLinear)]


def run(fn: Any, inputs: list[torch.Tensor], **options: Any) -> tuple[Any, Any]:
    options.setdefault("linear_pack", True)  # off by default (Note [Prepacked weights])
    gm = with_vals(fn, *inputs)
    with torch.no_grad():
        compiled = compile_graph(gm, inputs, options=options)
        return compiled, compiled(*inputs)


def test_large_linear_layers_are_packed_and_equal_eager() -> None:
    x, w, b = make((256, 256)), make((512, 256)), make((512,))
    compiled, out = run(linear, [x, w, b])
    assert len(packed_ops(compiled)) == 1
    torch.testing.assert_close(out, linear(x, w, b), **TOL)
    x2, w2 = make((256, 512)), make((512, 256))
    compiled, out = run(conv1d, [x2, w2])
    assert len(packed_ops(compiled)) == 1
    torch.testing.assert_close(out, conv1d(x2, w2), **TOL)


def test_the_pack_follows_the_weights_version() -> None:
    inputs = [make((256, 256)), make((512, 256)), make((512,))]
    compiled, _ = run(linear, inputs)
    (op,) = packed_ops(compiled)
    with torch.no_grad():
        compiled(*inputs)
        assert op.cache.packs == 1
        inputs[1].mul_(-1.5)
        torch.testing.assert_close(compiled(*inputs), linear(*inputs), **TOL)
        assert op.cache.packs == 2
        inputs[2].add_(1.0)  # the bias is read as it is, every call
        torch.testing.assert_close(compiled(*inputs), linear(*inputs), **TOL)
        assert op.cache.packs == 2


def test_small_products_training_graphs_and_the_option_keep_aten() -> None:
    small = [make((16, 32)), make((32, 32)), make((32,))]
    assert MIN_MACS > 16 * 32 * 32
    compiled, _ = run(linear, small)
    assert packed_ops(compiled) == []
    big = [make((256, 256)), make((512, 256)), make((512,))]
    assert packed_ops(compile_graph(with_vals(linear, *big), big)) == []  # grad mode on: training
    compiled, out = run(linear, big, linear_pack=False)
    assert packed_ops(compiled) == []
    torch.testing.assert_close(out, linear(*big), **TOL)


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no oneDNN bfloat16 kernels")
def test_bfloat16_linear_layers_are_packed_and_follow_versions() -> None:
    # Note [bfloat16 through oneDNN]
    inputs = [
        make((256, 256), torch.bfloat16),
        make((512, 256), torch.bfloat16),
        make((512,), torch.bfloat16),
    ]
    tol = {"rtol": 2e-2, "atol": 1e-1}  # sums of 256 products rounded to bfloat16, other orders
    assert packed_ops(run(linear, inputs)[0]) == []  # off by default: measured slower in graphs
    compiled, out = run(linear, inputs, linear_pack_bf16=True)
    (op,) = packed_ops(compiled)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, linear(*inputs), **tol)
    with torch.no_grad():
        inputs[1].mul_(-1.5)
        torch.testing.assert_close(compiled(*inputs), linear(*inputs), **tol)
    assert op.cache.packs == 2
    compiled, out = run(linear, inputs, linear_pack_bf16=True, onednn_bf16=False)
    assert packed_ops(compiled) == []
    torch.testing.assert_close(out, linear(*inputs), **tol)


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no oneDNN bfloat16 kernels")
def test_bfloat16_takes_smaller_products() -> None:
    inputs = [make((64, 128), torch.bfloat16), make((128, 128), torch.bfloat16), make((128,), torch.bfloat16)]
    assert MIN_MACS_BF16 <= 64 * 128 * 128 < MIN_MACS
    compiled, out = run(linear, inputs, linear_pack_bf16=True)
    assert len(packed_ops(compiled)) == 1
    torch.testing.assert_close(out, linear(*inputs), rtol=2e-2, atol=1e-1)
    tiny = [make((8, 32), torch.bfloat16), make((32, 32), torch.bfloat16), make((32,), torch.bfloat16)]
    assert packed_ops(run(linear, tiny, linear_pack_bf16=True)[0]) == []
