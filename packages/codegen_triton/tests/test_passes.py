"""loopir's graph passes through the Triton backend: the channels-last decision (Note
[Channels-last for convolutions]) and matmul padding (Note [Matmul padding]).

Under Triton's interpreter (CI) the CUDA layout rule and the padding are forced on CPU tensors
(``layout_policy="cuda"``, ``pad_mm="force"``); on a GPU machine the same tests run on CUDA
tensors with the default options, so the layout rule and the timed padding decision are the
real ones."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx
from triton_check import DEVICES, assert_same, make, to_device

from kiln_codegen_triton import TritonBackend
from kiln_loopir import compile_graph
from kiln_loopir.graph import FREE_LAYOUT_OUTPUTS
from kiln_loopir.testing import conv, mm, with_vals

aten = torch.ops.aten


def convnext_like(x: Any, w1: Any, w2: Any, mean: Any, var: Any) -> Any:
    # a depthwise conv, BatchNorm + ReLU + residual in between, a 1x1 conv, a pooled head
    a = conv(x, w1, 16)
    bn = aten._native_batch_norm_legit_no_training.default(a, None, None, mean, var, 0.1, 1e-5)[0]
    b = conv(aten.add.Tensor(aten.relu.default(bn), x), w2)
    return aten.relu.default(b), aten.mean.dim(b, [2, 3])


def same_strides(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Eager's strides, size-1 dims aside (their stride means nothing)."""
    return all(g == w for g, w, n in zip(got.stride(), want.stride(), want.shape, strict=True) if n != 1)


def forced(device: str) -> dict[str, Any]:
    if device != "cpu":
        return {}
    return {"layout_policy": "cuda", "pad_mm": "force", "conv_bias": "force", "conv_bias_grad": "force"}


def depthwise_bias_norm(x: Any, w: Any, b: Any) -> Any:
    """ConvNeXt's block start: a depthwise convolution with a bias, then a norm over channels."""
    y = aten.convolution.default(x, w, b, [1, 1], [3, 3], [1, 1], False, [0, 0], 8)
    mean = aten.mean.dim(y, [1], True)
    return aten.relu.default(aten.sub.Tensor(y, mean))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_bias_rides_in_the_next_kernel(device: str, dtype: torch.dtype) -> None:
    """Note [Convolution bias after the convolution]: on CUDA (forced on CPU tensors) the
    convolution runs without its bias and the add joins the norm's kernel."""
    if device == "cpu" and dtype == torch.bfloat16:
        dtype = torch.float32  # CPU convolutions in bfloat16 are eager-only territory
    x, w, b = to_device([make((2, 8, 10, 10), dtype), make((8, 1, 7, 7), dtype), make((8,), dtype)], device)
    gm = with_vals(depthwise_bias_norm, x, w, b)
    with torch.no_grad():
        compiled = compile_graph(gm, [x, w, b], backend=TritonBackend(), options=forced(device))
        kept = compile_graph(
            gm, [x, w, b], backend=TritonBackend(), options={**forced(device), "conv_bias": False}
        )
        got, want = compiled(x, w, b), gm(x, w, b)
        if dtype == torch.float32:
            assert_same(got, want)
        else:
            # one more rounding than eager, as torch.compile's: the convolution's output is
            # rounded to bfloat16 before the bias is added (cuDNN adds it before rounding); per
            # element that and the final rounding are within two bfloat16 steps of the values involved
            conv = aten.convolution.default(x, w, None, [1, 1], [3, 3], [1, 1], False, [0, 0], 8).float()
            step = 2.0**-6 * (conv.abs() + conv.mean(1, keepdim=True).abs() + want.float().abs()) + 1e-2
            assert got.dtype == want.dtype and got.shape == want.shape
            assert bool(((got.float() - want.float()).abs() <= step).all())
    convs = [n for n in compiled.graph.gm.graph.nodes if n.target is aten.convolution.default]
    assert [n.args[2] for n in convs] == [None]
    assert compiled.stats.kernels <= kept.stats.kernels


def convnext_norm(x: Any, w: Any, b: Any, lw: Any, lb: Any) -> Any:
    """ConvNeXt's block start: a depthwise convolution with a bias, read through ``permute(0, 2,
    3, 1)`` by a layer norm over the channels; the permuted value is an output whose layout is
    free (as a training forward's saved values are)."""
    y = aten.convolution.default(x, w, b, [1, 1], [3, 3], [1, 1], False, [0, 0], 8)
    p = aten.permute.default(y, [0, 2, 3, 1])
    out, mean, rstd = aten.native_layer_norm.default(p, [8], lw, lb, 1e-6)
    return out, mean, rstd, p


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory_order", [True, False])
def test_a_value_read_through_a_channels_last_permute_is_computed_channels_last(
    device: str, memory_order: bool
) -> None:
    """Note [Values read through a channels-last permute]: the bias add between the depthwise
    convolution and the permute is computed NHWC, so the saved permuted value is a contiguous
    (N, H, W, C) tensor; Note [Pointwise nodes walk their memory order]: the add, fused with
    the norm's kernel, walks memory order (it is listed in ``schedule.memory_ordered``) and is
    computed from the norm's own load of the convolution's result."""
    x, w, b = make((2, 8, 10, 10)), make((8, 1, 7, 7), low=-0.2, high=0.2), make((8,))
    lw, lb = make((8,)), make((8,))
    inputs = to_device([x, w, b, lw, lb], device)
    gm = with_vals(convnext_norm, *inputs)
    gm.meta[FREE_LAYOUT_OUTPUTS] = (3,)  # kiln_loopir's Note [Outputs only the backward reads]
    backend = TritonBackend(memory_order_pointwise=memory_order)
    with torch.no_grad():  # a float32 depthwise convolution keeps a training graph in eager's layouts
        compiled = compile_graph(gm, inputs, backend=backend, options=forced(device))
        got, want = compiled(*inputs), gm(*inputs)
    assert_same(list(got), list(want))
    assert got[3].is_contiguous()  # NHWC storage: the permute is a contiguous view
    added = [n for n in compiled.graph.channels_last if n.target is aten.add.Tensor]
    assert added, "the bias add is computed channels-last"
    if memory_order:
        assert compiled.schedule.memory_ordered
        assert compiled.stats.kernels == 2  # the weight's NHWC copy; the add rides in the norm's kernel
    else:
        assert not compiled.schedule.memory_ordered


def conv_backward_with_bias(x: Any, w: Any, up: Any, g: Any) -> Any:
    """A training step's convolution backward asked for the bias gradient, its gradient out of a
    pointwise kernel."""
    grad = aten.mul.Tensor(g, aten.sigmoid.default(up))
    gx, gw, gb = aten.convolution_backward.default(
        grad, x, w, [16], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]
    )
    return gx, gw, gb


@pytest.mark.parametrize("device", DEVICES)
def test_conv_bias_gradient_is_a_generated_sum(device: str) -> None:
    """Note [Convolution bias gradients in generated code]: on CUDA (forced on CPU tensors, the
    training graph channels-last) the bias gradient is a generated column sum, eager's values."""
    x, w = make((4, 8, 12, 12)), make((16, 8, 3, 3), low=-0.2, high=0.2)
    up, g = make((4, 16, 12, 12)), make((4, 16, 12, 12))
    inputs = to_device([x, w, up, g], device)
    gm = with_vals(conv_backward_with_bias, *inputs)
    compiled = compile_graph(gm, inputs, backend=TritonBackend(), options=forced(device))
    # the weight gradient sums 576 products in NHWC's order, eager's in NCHW's
    assert_same(compiled(*inputs), gm(*inputs), scale=8)
    assert compiled.graph.channels_last
    assert ("conv_bias_grad", "1 convolution bias gradients computed as sums") in compiled.passes.record
    assert compiled.stats.extern_ops == ("convolution_backward.default",)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_conv_graph_runs_channels_last(device: str, dtype: torch.dtype) -> None:
    inputs = to_device(
        [
            make((2, 16, 8, 8), dtype),
            make((16, 1, 3, 3), dtype),
            make((16, 16, 1, 1), dtype),
            make((16,), dtype),
            make((16,), dtype, low=0.5, high=2.0),
        ],
        device,
    )
    if device == "cpu" and dtype == torch.float16:
        inputs = [t.float() for t in inputs]  # CPU convolutions in float16 are eager-only territory
    gm = with_vals(convnext_like, *inputs)
    with torch.no_grad():
        expected = gm(*inputs)
        compiled = compile_graph(gm, list(inputs), backend=TritonBackend(), options=forced(device))
        actual = compiled(*inputs)
    assert compiled.graph.channels_last
    assert_same(actual, expected)
    for got, want in zip(actual, expected, strict=True):
        assert same_strides(got, want)  # outputs keep eager's strides
    convs = [op for op in compiled.graph.operations if "convolution" in str(getattr(op, "op", ""))]
    assert all(c.args[0].layout.stride[1] == 1 for c in convs[1:])  # NHWC between the convs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_lm_head_equals_eager(device: str, dtype: torch.dtype) -> None:
    # a tied LM head: linear with weight [V, H], V misaligned (GPT-2's 50257 on the GPU)
    vocab, hidden, tokens = (50257, 768, 512) if device == "cuda" else (37, 10, 6)

    def head(x: Any, w: Any) -> Any:
        return aten.view.default(aten.mm.default(x, aten.t.default(w)), [1, tokens, vocab])

    x, w = to_device(
        [make((tokens, hidden), dtype, low=-1, high=1), make((vocab, hidden), dtype, low=-1, high=1)], device
    )
    gm = with_vals(head, x, w)
    compiled = compile_graph(
        gm, [x, w], backend=TritonBackend(), options={**forced(device), "pad_mm_output_copy": False}
    )
    out, expected = compiled(x, w), gm(x, w)
    assert_same(out, expected, "logits", scale=float(hidden) ** 0.5)
    record = [text for name, text in compiled.passes.record if name == "pad_mm"]
    assert record
    if record[0].startswith("pad"):  # on request, the logits leave as a view of the padded product
        align = 4 if dtype == torch.float32 else 8
        assert out.stride(-2) % align == 0 and out.stride(-2) > vocab
        copied = compile_graph(gm, [x, w], backend=TritonBackend(), options=forced(device))
        assert same_strides(copied(x, w), expected)  # eager's strides by default
    else:
        assert same_strides(out, expected)
    if device == "cuda":  # the decision was timed on the device (or read from the disk cache)
        assert "timed" in record[0] or "cached" in record[0]
        # padded only where the device measured it faster: on the H200 this head (x @ w.t())
        # already gets a fast cuBLAS kernel unpadded (bf16 0.44 ms either way; fp32 0.82 against
        # 1.26 ms padded), so it is kept; either way the result is eager's
        assert record[0].startswith(("pad", "keep"))
    else:
        assert record[0].startswith("pad")


@pytest.mark.parametrize("device", DEVICES)
def test_pad_mm_off_leaves_the_matmul(device: str) -> None:
    x, w = to_device([make((6, 10)), make((10, 37))], device)
    gm = with_vals(mm, x, w)
    compiled = compile_graph(gm, [x, w], backend=TritonBackend(), options={"pad_mm": False})
    assert_same(compiled(x, w), gm(x, w))
    assert compiled.stats.kernels == 0 and compiled.stats.extern_ops == ("mm.default",)


def attention_of(b: int, h: int, n: int, e: int) -> Any:
    """An explicit attention as aotgrad hands it over: expand/clone/view to 3-D, bmm, scale, mask."""

    def to3(x: Any, shape: list[int]) -> Any:
        return aten.view.default(
            aten.clone.default(aten.expand.default(x, shape), memory_format=torch.contiguous_format),
            [shape[0] * shape[1], shape[2], shape[3]],
        )

    def attention(q: Any, k: Any, v: Any, mask: Any) -> Any:
        kt = aten.permute.default(k, [0, 1, 3, 2])
        s = aten.view.default(aten.bmm.default(to3(q, [b, h, n, e]), to3(kt, [b, h, e, n])), [b, h, n, n])
        p = aten._softmax.default(aten.add.Tensor(aten.mul.Tensor(s, e**-0.5), mask), -1, False)
        return aten.view.default(aten.bmm.default(to3(p, [b, h, n, n]), to3(v, [b, h, n, e])), [b, h, n, e])

    return attention


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_explicit_attention_runs_as_sdpa(device: str, dtype: torch.dtype) -> None:
    shape = (2, 4, 64, 32) if device == "cuda" else (2, 2, 8, 4)
    q, k, v = (make(shape, dtype, low=-1, high=1) for _ in range(3))
    mask = torch.triu(torch.full((shape[2], shape[2]), float("-inf"), dtype=dtype), 1)[None, None]
    q, k, v, mask = to_device([q, k, v, mask], device)
    gm = with_vals(attention_of(*shape), q, k, v, mask)
    compiled = compile_graph(gm, [q, k, v, mask], backend=TritonBackend())
    assert_same(compiled(q, k, v, mask), gm(q, k, v, mask))
    assert any("scaled_dot_product_attention" in op for op in compiled.stats.extern_ops)
    assert not any("bmm" in op for op in compiled.stats.extern_ops)
