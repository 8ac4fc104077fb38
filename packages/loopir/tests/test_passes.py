"""Graph passes before lowering: the framework (options, log), the layout decision (Note
[Channels-last for convolutions]) under the CUDA rule forced on CPU tensors, and matmul padding
(Note [Matmul padding]) forced on the CPU, with its on-disk decision cache."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest
import torch
import torch.fx
from helpers import check, make

from kiln_loopir import compile_graph
from kiln_loopir.graph import FREE_LAYOUT_OUTPUTS
from kiln_loopir.ir import ComputedBuffer
from kiln_loopir.passes import PassContext, PassOptions, run_passes
from kiln_loopir.passes import pad_mm as pad_mm_module
from kiln_loopir.passes.channels_last import conv_class, cpu_policy, cuda_policy
from kiln_loopir.testing import addmm, conv, mm, with_vals
from kiln_loopir.virtualized import format_body

aten = torch.ops.aten


CUDA_RULE = {"layout_policy": "cuda"}
CUDA_TRAINING = {"layout_policy": "cuda", "layout_training": True}
# training graphs in eager's layouts, every convolution through oneDNN (Note [Small convolutions
# outside oneDNN] would take these tests' small ones to PyTorch's native kernel)
EAGER_LAYOUT_TRAINING = {"cpu_layout_training": False, "native_small_conv": False}


def resnet_block(x: Any, w1: Any, w2: Any, mean: Any, var: Any) -> Any:
    a = aten.relu.default(conv(x, w1))
    bn = aten._native_batch_norm_legit_no_training.default(a, None, None, mean, var, 0.1, 1e-5)
    b = conv(bn[0], w2)
    y = aten.relu.default(aten.add.Tensor(b, a))
    return y, aten.mean.dim(y, [2, 3])


def block_inputs() -> tuple[torch.Tensor, ...]:
    return (
        make((2, 16, 8, 8)),
        # weights at the scale of an initialized conv (fan-in 144): unscaled ones gave outputs in
        # the hundreds, where fp32 sums in another layout's order differ by more than atol
        make((16, 16, 3, 3), low=-0.1, high=0.1),
        make((16, 16, 3, 3), low=-0.1, high=0.1),
        make((16,)),
        make((16,), low=0.5, high=2.0),
    )


def conv_ops(compiled: Any) -> list[Any]:
    return [op for op in compiled.graph.operations if "convolution" in str(getattr(op, "op", ""))]


def is_plain_copy(buffer: Any) -> bool:
    """A computed buffer whose body only loads one value and stores it (a layout conversion)."""
    if not isinstance(buffer, ComputedBuffer):
        return False
    ranges, rranges = buffer.iteration()
    from kiln_loopir.indexing import loop_vars

    lines = format_body(buffer.body(), loop_vars("x", len(ranges)), loop_vars("r", len(rranges)))
    return sum("load" in line for line in lines) == 1 and not any(
        op in " ".join(lines) for op in ("relu", "maximum", "add", "mul", "sub")
    )


# -- the framework ------------------------------------------------------------------------------


def test_unknown_or_malformed_options_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown loopir pass options"):
        PassOptions.from_mapping({"pad_matmul": True})
    with pytest.raises(ValueError, match="layout_policy"):
        PassOptions.from_mapping({"layout_policy": "tpu"})
    with pytest.raises(ValueError, match="pad_mm"):
        PassOptions.from_mapping({"pad_mm": "sometimes"})
    with pytest.raises(ValueError, match="cpu_layout_training"):
        PassOptions.from_mapping({"cpu_layout_training": "sometimes"})
    assert PassOptions.from_mapping({"cpu_layout_training": "force"}).cpu_layout_training == "force"


def test_passes_log_what_they_decide(caplog: pytest.LogCaptureFixture) -> None:
    inputs = block_inputs()
    gm = with_vals(resnet_block, *inputs)
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"), torch.no_grad():
        compiled = compile_graph(gm, list(inputs), options={**CUDA_RULE, "pad_mm": False})
    assert "layout: cuda rule chooses channels-last" in caplog.text
    assert "pad_mm: off" in caplog.text
    assert ("pad_mm", "off (option pad_mm=False)") in compiled.passes.record


def test_a_pass_does_not_edit_the_callers_graph() -> None:
    x, w = make((6, 10)), make((10, 37))
    gm = with_vals(mm, x, w)
    before = gm.graph.python_code("self").src
    rewritten, _ = run_passes(gm, [x, w], torch.device("cpu"), {"pad_mm": "force"})
    assert rewritten is not gm
    assert gm.graph.python_code("self").src == before
    assert any(n.target is aten.constant_pad_nd.default for n in rewritten.graph.nodes)


# -- layout ---------------------------------------------------------------------------------------


def test_cuda_rule_runs_a_resnet_block_channels_last() -> None:
    inputs = block_inputs()
    gm = with_vals(resnet_block, *inputs)
    with torch.no_grad():
        compiled = check(gm, *inputs, options=CUDA_RULE)
        out = compiled(*inputs)
    eager = gm(*inputs)
    assert compiled.graph.channels_last
    for got, want in zip(out, eager, strict=True):  # outputs keep eager's strides
        assert got.stride() == want.stride()
    first, second = conv_ops(compiled)
    assert second.args[0].layout.stride[1] == 1  # the second conv reads NHWC ...
    producer = compiled.graph.name_to_buffer[second.args[0].name]
    assert not is_plain_copy(producer)  # ... written by the BN/ReLU kernel, not a conversion copy
    assert first.outputs[0].layout.stride[1] == 1


def _weight_arg(op: Any) -> Any:
    """The buffer an extern convolution (forward or backward) reads as its weight."""
    return op.args[1] if "convolution_backward" not in str(op.op) else op.args[2]


def test_cuda_rule_takes_convolution_weights_nhwc_unless_switched_off() -> None:
    """Note [Convolution weights in NHWC]: under the CUDA rule both 3x3 weights reach their
    convolution NHWC, each through a copy in the graph; with ``nhwc_weights=False`` as they came."""
    inputs = block_inputs()
    gm = with_vals(resnet_block, *inputs)
    with torch.no_grad():
        compiled = check(gm, *inputs, options=CUDA_RULE)
        off = check(gm, *inputs, options={**CUDA_RULE, "nhwc_weights": False})
    assert ("layout", "convolution weights NHWC (copied in the graph)") in compiled.passes.record
    for op in conv_ops(compiled):
        weight = _weight_arg(op)
        assert weight.layout.stride[1] == 1
        assert is_plain_copy(compiled.graph.name_to_buffer[weight.name])
    for op in conv_ops(off):
        assert _weight_arg(op).layout.stride[-1] == 1  # the input's NCHW strides
    assert off.graph.channels_last and not off.graph.nhwc_weights


def test_nhwc_weights_only_under_the_cuda_rule_and_where_grad_input_is_wanted() -> None:
    """A 1x1 weight is both layouts (no copy); the CPU rule leaves weights to oneDNN; a
    convolution backward that computes only the weight's gradient reads the weight for its shape
    and keeps it as it came."""

    def one_by_one(x: Any, w: Any) -> Any:
        return aten.relu.default(conv(x, w))

    x, w = make((2, 16, 8, 8)), make((16, 16, 1, 1), low=-0.1, high=0.1)
    with torch.no_grad():
        compiled = check(with_vals(one_by_one, x, w), x, w, options=CUDA_RULE)
    assert compiled.graph.nhwc_weights
    (op,) = conv_ops(compiled)
    assert not isinstance(
        compiled.graph.name_to_buffer.get(_weight_arg(op).name), ComputedBuffer
    )  # the input itself

    gx, gw = make((2, 16, 8, 8)), make((16, 16, 3, 3), low=-0.1, high=0.1)
    grad = make((2, 16, 8, 8))

    def weight_grad_only(x: Any, w: Any, g: Any) -> Any:
        return aten.convolution_backward.default(
            g, x, w, [16], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, True]
        )[1:]

    compiled = check(with_vals(weight_grad_only, gx, gw, grad), gx, gw, grad, options=CUDA_TRAINING)
    assert compiled.graph.channels_last and compiled.graph.nhwc_weights
    (op,) = conv_ops(compiled)
    assert _weight_arg(op).layout.stride[-1] == 1  # left as it came

    inputs = block_inputs()
    with torch.no_grad():
        cpu = compile_graph(with_vals(resnet_block, *inputs), list(inputs), options={"layout_policy": "cpu"})
    assert not cpu.graph.nhwc_weights


def test_layout_option_off_keeps_eager_layouts() -> None:
    inputs = block_inputs()
    gm = with_vals(resnet_block, *inputs)
    with torch.no_grad():
        compiled = check(gm, *inputs, options={**CUDA_RULE, "layout": False})
    assert not compiled.graph.channels_last
    assert conv_ops(compiled)[1].args[0].layout.stride[-1] == 1  # NCHW


def test_a_random_op_reads_eager_layouts_inside_a_channels_last_graph() -> None:
    """Note [Random ops read eager's layouts]: a VAE's reparameterisation between convolutions run
    NHWC; at one seed the noise (and so the result) is eager's, the NHWC ``std`` being copied to
    eager's strides for ``randn_like``; dropout's mask likewise."""

    def vae(x: Any, w1: Any, w2: Any) -> Any:
        std = aten.exp.default(conv(x, w1))
        z = aten.add.Tensor(std, aten.mul.Tensor(std, aten.randn_like.default(std)))
        return conv(z, w2), aten.native_dropout.default(std, 0.5, True)[0]

    inputs = (
        make((2, 8, 6, 6)),
        make((8, 8, 3, 3), low=-0.1, high=0.1),
        make((8, 8, 3, 3), low=-0.1, high=0.1),
    )
    gm = with_vals(vae, *inputs)
    with torch.no_grad():
        compiled = compile_graph(gm, list(inputs), backend="interpret", options=CUDA_RULE)
        assert compiled.graph.channels_last
        assert conv_ops(compiled)[1].args[0].layout.stride[1] == 1  # z (and std) are NHWC
        torch.manual_seed(5)
        got = compiled(*inputs)
        torch.manual_seed(5)
        want = gm(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_only_elementwise_random_ops_take_eager_layouts() -> None:
    """Note [Random ops read eager's layouts]: attention and RNN operators carry the seeded tag
    for their dropout but draw nothing in their operands' memory order; their strided operands
    must not be copied (that added a copy before every attention)."""
    from kiln_loopir.lowering import _draws_per_element

    aten = torch.ops.aten
    for op in (aten.randn_like.default, aten.bernoulli.p, aten.native_dropout.default, aten.uniform_.default):
        assert _draws_per_element(op), op
    for op in (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten.lstm.input,
        aten.add.Tensor,
        aten.randperm.default,
    ):
        assert not _draws_per_element(op), op


def test_cuda_rule_runs_training_graphs_channels_last_by_default_unless_switched_off() -> None:
    inputs = block_inputs()
    gm = with_vals(resnet_block, *inputs)
    compiled = check(gm, *inputs, options=CUDA_RULE)  # grad mode on: a training graph
    assert compiled.graph.channels_last
    compiled = check(gm, *inputs, options={**CUDA_RULE, "layout_training": False})
    assert not compiled.graph.channels_last
    assert any("layout_training=False" in text for _, text in compiled.passes.record)


def test_cuda_rule_runs_training_graphs_channels_last_but_their_outputs_keep_eager_strides() -> None:
    inputs = block_inputs()
    gm = with_vals(resnet_block, *inputs)
    compiled = check(gm, *inputs, options=CUDA_TRAINING)  # grad mode on: a training graph
    assert compiled.graph.channels_last
    assert any("training graph, 2 convs, none grouped" in text for _, text in compiled.passes.record)
    for got, want in zip(compiled(*inputs), gm(*inputs), strict=True):
        assert got.stride() == want.stride()  # no output is declared free: all keep eager's strides


def test_outputs_only_the_backward_reads_keep_the_layout_they_were_computed_in() -> None:
    def two_convs(x: Any, w1: Any, w2: Any) -> Any:
        a = aten.relu.default(conv(x, w1))  # leads into the second conv: computed NHWC
        return a, aten.relu.default(conv(a, w2))

    inputs = block_inputs()[:3]
    gm = with_vals(two_convs, *inputs)
    gm.meta[FREE_LAYOUT_OUTPUTS] = (0,)  # Note [Outputs only the backward reads]
    compiled = compile_graph(gm, list(inputs), options=CUDA_TRAINING)
    got, want = compiled(*inputs), gm(*inputs)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert got[0].stride()[1] == 1 != want[0].stride()[1]  # left NHWC: no copy back to eager's strides
    assert got[1].stride() == want[1].stride()  # not declared free: eager's strides
    assert compiled.output_strides == [tuple(got[0].stride()), tuple(got[1].stride())]


def _mixed_backward(
    depthwise: bool, grad_out: bool = False
) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """A convolution backward whose gradient eager computes NCHW (the sum of an NCHW and an NHWC
    gradient takes its first operand's format) beside an NHWC input, as at ConvNeXt's
    downsampling convolutions."""
    cin, cout, k, stride, pad, groups = (8, 8, 3, 1, 1, 8) if depthwise else (8, 16, 2, 2, 0, 1)
    x = make((2, cin, 6, 6)).contiguous(memory_format=torch.channels_last)
    w = make((cout, cin // groups, k, k))
    side = 6 // stride
    g1 = make((2, cout, side, side))
    g2 = make((2, cout, side, side)).contiguous(memory_format=torch.channels_last)

    def backward(x: Any, w: Any, g1: Any, g2: Any) -> Any:
        grad = aten.mul.Tensor(aten.add.Tensor(g1, g2), 0.5)
        gx, gw, gb = aten.convolution_backward.default(
            grad,
            x,
            w,
            [cout],
            [stride, stride],
            [pad, pad],
            [1, 1],
            False,
            [0, 0],
            groups,
            [True, True, True],
        )
        return (gx, gw, gb, grad) if grad_out else (gx, gw, gb)

    return with_vals(backward, x, w, g1, g2), [x, w, g1, g2]


@pytest.mark.parametrize("depthwise", [False, True])
def test_a_convolution_backward_gets_its_gradient_in_onednns_format(depthwise: bool) -> None:
    """Note [A convolution backward's gradient in oneDNN's format]: on the CPU the gradient is
    computed NHWC, the input's format (by the kernel that computes it: no conversion copy), and
    the gradients match eager's; ``conv_grad_format=False`` keeps eager's NCHW gradient. The graph
    is kept in eager's layouts (``cpu_layout_training=False``): channels-last would take every
    operand NHWC (Note [Channels-last in CPU training])."""
    gm, inputs = _mixed_backward(depthwise)
    grad_node = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    assert grad_node.meta["val"].is_contiguous()  # eager's gradient: NCHW
    compiled = check(gm, *inputs, options=EAGER_LAYOUT_TRAINING)
    (op,) = conv_ops(compiled)
    assert op.args[0].layout.stride[1] == 1  # NHWC
    producer = compiled.graph.name_to_buffer[op.args[0].name]
    assert not is_plain_copy(producer)  # written so by the add/mul kernel
    assert any("gradient NCHW -> NHWC" in text for _, text in compiled.passes.record)
    off = check(gm, *inputs, options={**EAGER_LAYOUT_TRAINING, "conv_grad_format": False})
    (op,) = conv_ops(off)
    assert op.args[0].layout.stride[-1] == 1  # NCHW, as eager's
    assert not any("gradient NCHW" in text for _, text in off.passes.record)


def test_a_gradient_that_leaves_the_graph_keeps_eager_strides() -> None:
    gm, inputs = _mixed_backward(False, grad_out=True)
    grad_node = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    compiled = check(gm, *inputs, options=EAGER_LAYOUT_TRAINING)
    assert not any("gradient NCHW" in text for _, text in compiled.passes.record)
    assert compiled(*inputs)[-1].stride() == grad_node.meta["val"].stride()


def test_cuda_rule_keeps_training_graphs_with_grouped_convolutions_in_eager_layouts() -> None:
    x, w = make((2, 8, 8, 8)), make((8, 2, 3, 3))  # 4 groups of 2 input channels each
    gm = with_vals(
        lambda x, w: torch.relu(
            aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 4)
        ),
        x,
        w,
    )
    compiled = check(gm, x, w, options=CUDA_TRAINING)
    assert not compiled.graph.channels_last
    assert any("1 grouped convs" in text for _, text in compiled.passes.record)


def _policy(gm: torch.fx.GraphModule, inference: bool = True) -> Any:
    ctx = PassContext(torch.device("cuda"), PassOptions(layout_training=True), [], inference)
    return cuda_policy(gm, ctx)


def test_cuda_rule_weighs_conv_classes() -> None:
    # depthwise (ConvNeXt): channels-last; grouped with several channels per group: kept NCHW
    x = make((2, 32, 16, 16))
    depthwise = with_vals(lambda a, w: conv(a, w, 32), x, make((32, 1, 3, 3)))
    grouped = with_vals(lambda a, w: conv(a, w, 4), x, make((32, 8, 3, 3)))
    assert (
        conv_class(next(n for n in depthwise.graph.nodes if n.target is aten.convolution.default))
        == "depthwise"
    )
    assert _policy(depthwise).channels_last
    decision = _policy(grouped)
    assert not decision.channels_last and "grouped x1" in decision.reason
    # training: float32 depthwise convs keep eager's layouts too (their NHWC weight gradient is
    # slower); bfloat16/float16 ones go NHWC (Note [Depthwise convolutions in half-precision training])
    decision = _policy(depthwise, inference=False)
    assert not decision.channels_last and "depthwise" in decision.reason
    assert not _policy(grouped, inference=False).channels_last
    for dtype in (torch.bfloat16, torch.float16):
        half = with_vals(lambda a, w: conv(a, w, 32), x.to(dtype), make((32, 1, 3, 3)).to(dtype))
        decision = _policy(half, inference=False)
        assert decision.channels_last and "1 depthwise in 16-bit floats" in decision.reason
    grouped_half = with_vals(lambda a, w: conv(a, w, 4), x.half(), make((32, 8, 3, 3)).half())
    assert not _policy(grouped_half, inference=False).channels_last


def _cpu_policy(gm: torch.fx.GraphModule, **options: Any) -> Any:
    """The CPU rule for a training graph; the element count alone unless ``native_small_conv``
    is asked for (Note [Small convolutions keep eager's layouts in CPU training])."""
    options = {"native_small_conv": False, **options}
    ctx = PassContext(torch.device("cpu"), PassOptions(**options), [], False)  # a training graph
    return cpu_policy(gm, ctx)


def _dense_conv(x: Any, w: Any) -> Any:
    return conv(x, w)


def test_cpu_training_rule_counts_inputs_against_weights() -> None:
    """Note [Channels-last in CPU training]: NHWC for convolution inputs at least as large as the
    weights, eager's layouts for small inputs beside large weights, a depthwise convolution's
    included (its NHWC backward is the slower one on small maps), and with
    ``cpu_layout_training=False``."""
    small = make((2, 32, 4, 4))  # 1,024 elements
    heavy = with_vals(_dense_conv, small, make((32, 32, 3, 3)))  # 9,216 weights
    decision = _cpu_policy(heavy)
    assert not decision.channels_last and "weigh less than weights" in decision.reason
    large = with_vals(_dense_conv, make((2, 32, 16, 16)), make((32, 32, 3, 3)))
    decision = _cpu_policy(large)
    assert decision.channels_last and "inputs 16384 >= weights 9216" in decision.reason
    depthwise = with_vals(lambda a, w: conv(a, w, 32), make((2, 32, 2, 2)), make((32, 1, 3, 3)))
    decision = _cpu_policy(depthwise)  # 256 input elements, 288 weights
    assert not decision.channels_last and "weigh less than weights" in decision.reason
    decision = _cpu_policy(large, cpu_layout_training=False)
    assert not decision.channels_last and "cpu_layout_training=False" in decision.reason


def test_cpu_training_rule_counts_a_backward_graphs_convolutions() -> None:
    """The backward graph decides from its ``convolution_backward`` nodes (input and weight are
    its second and third arguments) as the forward does from its convolutions."""
    for depthwise, weights in ((False, 512), (True, 72)):
        gm, _ = _mixed_backward(depthwise)
        decision = _cpu_policy(gm)
        assert decision.channels_last and f"inputs 576 >= weights {weights}" in decision.reason


def test_cpu_training_graphs_run_channels_last_with_eagers_results() -> None:
    """A training graph (grad mode on) with convolutions on the CPU, through the
    reference interpreter: channels-last inside, eager's results and strides outside (C++ in
    kiln's tests/test_layout_training.py)."""
    x, w1, w2 = make((2, 8, 6, 6)), make((8, 1, 3, 3)), make((4, 8, 3, 3))

    def block(x: Any, w1: Any, w2: Any) -> Any:
        y = aten.relu.default(conv(x, w1, 8))
        return aten.add.Tensor(conv(y, w2), 1.0), y

    gm = with_vals(block, x, w1, w2)
    compiled = check(gm, x, w1, w2)
    assert compiled.graph.channels_last
    assert any("training graph, 2 convs, inputs 1152" in text for _, text in compiled.passes.record)
    out, y = compiled(x, w1, w2)
    assert out.is_contiguous() and y.is_contiguous()  # outputs in eager's strides
    off = check(gm, x, w1, w2, options=EAGER_LAYOUT_TRAINING)
    assert not off.graph.channels_last


def test_cuda_rule_skips_graphs_where_convs_are_a_small_part() -> None:
    def stem_then_many(x: Any, w: Any) -> Any:
        y = conv(x, w)
        for _ in range(320):
            y = aten.relu.default(y)
        return y

    gm = with_vals(stem_then_many, make((1, 4, 8, 8)), make((4, 4, 3, 3)))
    decision = _policy(gm)
    assert not decision.channels_last and "small part" in decision.reason


def test_a_value_read_through_an_nhwc_permute_is_computed_channels_last() -> None:
    """Note [Values read through a channels-last permute]: the bias add that the conv-bias pass
    puts between a convolution and ``permute(0, 2, 3, 1)`` is in the NHWC set, so the permuted
    value is a contiguous (N, H, W, C) tensor."""

    def block(x: Any, w: Any, b: Any) -> Any:
        y = aten.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return (aten.permute.default(y, [0, 2, 3, 1]),)

    x, w, b = make((2, 16, 8, 8)), make((16, 16, 3, 3), low=-0.1, high=0.1), make((16,))
    gm = with_vals(block, x, w, b)
    gm.meta[FREE_LAYOUT_OUTPUTS] = (0,)
    with torch.no_grad():
        compiled = check(gm, x, w, b, options={**CUDA_RULE, "conv_bias": "force"})
        off = check(gm, x, w, b, options={**CUDA_RULE, "conv_bias": False})
    assert any(n.target is aten.add.Tensor for n in compiled.graph.channels_last)
    assert compiled(x, w, b)[0].is_contiguous()
    assert off(x, w, b)[0].is_contiguous()  # the convolution's own result: NHWC as before


def test_spread_stops_at_a_permute() -> None:
    # ConvNeXt: depthwise conv -> permute to NHWC -> layer norm -> permute back -> conv. The
    # permuted [N, H, W, C] values are not channels-last values and must not be marked as such.
    def block(x: Any, w1: Any, w2: Any, g: Any, b: Any) -> Any:
        y = aten.permute.default(conv(x, w1, 8), [0, 2, 3, 1])
        y = aten.native_layer_norm.default(y, [8], g, b, 1e-6)[0]
        return conv(aten.permute.default(y, [0, 3, 1, 2]), w2)

    inputs = (make((2, 8, 8, 8)), make((8, 1, 3, 3)), make((8, 8, 1, 1)), make((8,)), make((8,)))
    gm = with_vals(block, *inputs)
    with torch.no_grad():
        compiled = check(gm, *inputs, options=CUDA_RULE)
    marked = {str(n.target) for n in compiled.graph.channels_last}
    assert "aten.convolution.default" in marked
    assert not any("permute" in t or "layer_norm" in t for t in marked)


# -- matmul padding -------------------------------------------------------------------------------


def lm_head(x: Any, w: Any) -> Any:
    flat = aten.view.default(x, [6, 10])
    return aten.view.default(aten.mm.default(flat, aten.t.default(w)), [2, 3, 37])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forced_padding_equals_unpadded(dtype: torch.dtype) -> None:
    x, w = make((2, 3, 10), dtype), make((37, 10), dtype)  # N = 37 and K = 10 misaligned
    gm = with_vals(lm_head, x, w)
    compiled = check(gm, x, w, options={"pad_mm": "force", "pad_mm_output_copy": False})
    # on request, the output leaves as a view of the padded product, with its row stride
    assert compiled(x, w).stride() == (120, 40, 1) and gm(x, w).stride() == (111, 37, 1)
    # Note [Padded results the program sees]: by default it is copied to eager's strides, so
    # that `.view()` after the call works as in eager
    copied = check(gm, x, w, options={"pad_mm": "force"})
    assert copied(x, w).stride() == gm(x, w).stride()
    assert copied(x, w).view(-1).shape == (2 * 3 * 37,)
    mm = next(op for op in compiled.graph.operations if "mm" in str(getattr(op, "op", "")))
    align = 4 if dtype == torch.float32 else 8
    size = [int(s) for s in mm.outputs[0].layout.size]
    assert size == [8, 40] and all(s % align == 0 for s in size)
    # the weight is padded before its transpose: the GEMM reads a transposed operand
    assert mm.args[1].layout.stride[0] == 1


def test_padded_result_only_the_backward_reads_keeps_the_padded_layout() -> None:
    # Note [Padded results the program sees]: an output listed as free-layout (a saved
    # activation, Note [Outputs only the backward reads]) is not copied; one the program sees is
    x, w = make((2, 3, 10), torch.float32), make((37, 10), torch.float32)

    def two(x: Any, w: Any) -> Any:
        out = lm_head(x, w)
        return out, aten.mul.Tensor(out, 2.0)

    gm = with_vals(two, x, w)
    gm.meta[FREE_LAYOUT_OUTPUTS] = (0,)
    compiled = check(gm, x, w, options={"pad_mm": "force"})
    saved, _ = compiled(x, w)
    assert saved.stride() == (120, 40, 1)  # the padded product's view, not copied
    gm.meta[FREE_LAYOUT_OUTPUTS] = ()
    copied = check(gm, x, w, options={"pad_mm": "force"})
    assert copied(x, w)[0].stride() == (111, 37, 1)


def test_padded_addmm_and_bmm_equal_unpadded() -> None:
    bias, a, b = make((13,)), make((5, 7)), make((7, 13))
    check(
        with_vals(addmm, bias, a, b),
        bias,
        a,
        b,
        options={"pad_mm": "force"},
    )
    x, y = make((3, 5, 7)), make((3, 7, 9))
    compiled = check(
        with_vals(lambda p, q: aten.relu.default(aten.bmm.default(p, q)), x, y),
        x,
        y,
        options={"pad_mm": "force"},
    )
    assert any("bmm" in text for _, text in compiled.passes.record)


def _strided_reads(a: Any, b: Any) -> Any:
    # as_strided over a view of the product: it addresses eager's contiguous (6, 5) storage
    rows = aten.slice.Tensor(aten.mm.default(a, b), 0, 1, 6)
    return aten.add.Tensor(aten.as_strided.default(rows, [2, 2], [1, 1], 8), 0)


def test_a_padded_product_that_as_strided_reads_has_eager_strides() -> None:
    # Note [Readers of a GEMM's strides]: the padded buffer's rows are 8 wide, not 5
    a, b = make((6, 3)), make((3, 5))
    compiled = check(with_vals(_strided_reads, a, b), a, b, options={"pad_mm": "force"})
    assert any(n == "pad_mm" and text.startswith("pad ") for n, text in compiled.passes.record)


def _conv_read_strided(x: Any, w: Any) -> Any:
    y = conv(x, w)  # (2, 4, 8, 8), eager's strides contiguous
    inner = aten.slice.Tensor(aten.select.int(y, 0, 1), 0, 1, 4)  # as_strided's offset is the storage's
    return (
        aten.add.Tensor(aten.as_strided.default(y, [2, 3], [1, 2], 5), 0),
        aten.add.Tensor(aten.as_strided.default(inner, [3, 2], [64, 9], 300), 0),
    )


@pytest.mark.parametrize("options", [CUDA_RULE, {"layout_policy": "cpu"}], ids=["cuda_rule", "cpu_rule"])
def test_as_strided_of_a_channels_last_value_reads_eager_storage(options: dict[str, Any]) -> None:
    # Note [Storage readers of NHWC values] (graph.py): the convolution computed NHWC, and
    # as_strided addressed its storage with eager's strides
    x, w = make((2, 3, 8, 8)), make((4, 3, 3, 3))
    with torch.no_grad():
        compiled = check(with_vals(_conv_read_strided, x, w), x, w, options=options)
    assert compiled.graph.channels_last


def _patch_conv_read_strided(x: Any, w: Any) -> Any:
    y = aten.convolution.default(x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
    return aten.add.Tensor(aten.as_strided.default(y, [2, 3], [1, 2], 5), 0)


def test_as_strided_of_a_patch_convolution_reads_eager_storage() -> None:
    # Note [Readers of a GEMM's strides] (pad_mm.py): the patch GEMM's result is channels-last
    x, w = make((2, 3, 8, 8)), make((4, 3, 2, 2))
    compiled = check(
        with_vals(_patch_conv_read_strided, x, w),
        x,
        w,
        options={"patch_conv": "force", "layout": False},
    )
    assert ("patch_conv", "1 patch convolutions computed as GEMMs") in compiled.passes.record


def _patch_conv_viewed_output(x: Any, w: Any) -> Any:
    y = aten.convolution.default(x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
    return (aten.view.default(aten.view.default(y, [3, 3, 9]), [3, 3, 3, 3]),)


def test_a_view_of_a_patch_convolution_returned_has_eagers_strides() -> None:
    # layout fuzz seed 1130: `conv(x).flatten(2).reshape(...)` returned the view of the NHWC GEMM
    # result, strides (27, 1, 9, 3) where eager's are (27, 9, 3, 1)
    x, w = make((3, 3, 6, 7)), make((3, 3, 2, 2))
    gm = with_vals(_patch_conv_viewed_output, x, w)
    compiled = check(gm, x, w, options={"patch_conv": "force", "layout": False})
    assert ("patch_conv", "1 patch convolutions computed as GEMMs") in compiled.passes.record
    (out,) = compiled(x, w)
    assert out.stride() == gm(x, w)[0].stride() == (27, 9, 3, 1)


def test_aligned_or_integer_matmuls_are_left_alone() -> None:
    a, b = make((8, 16)), make((16, 8))
    compiled = check(with_vals(mm, a, b), a, b, options={"pad_mm": "force"})
    assert not any(n == "pad_mm" for n, _ in compiled.passes.record)


def test_padding_is_off_on_the_cpu_by_default_and_by_option() -> None:
    x, w = make((2, 3, 10)), make((37, 10))
    gm = with_vals(lm_head, x, w)
    default = check(gm, x, w)
    assert ("pad_mm", next(t for n, t in default.passes.record if n == "pad_mm")) and not any(
        n.target is aten.constant_pad_nd.default for n in default.graph.gm.graph.nodes
    )
    assert any("not on CUDA" in t for _, t in default.passes.record)
    off = check(gm, x, w, options={"pad_mm": False})
    assert off.stats.kernels == 0 and off.stats.extern_calls == 1


def test_padding_decision_is_timed_once_and_cached_on_disk(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pad_mm_module, "_MEMORY", {})
    gm = with_vals(mm, make((64, 100)), make((100, 50257 % 97 + 64)))
    node = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    c = pad_mm_module.candidate(node)
    assert c is not None
    # the CUDA branch of the decision, with a fake timer (nothing here depends on real timing)
    ctx = PassContext(torch.device("cpu"), PassOptions(), [], True)
    monkeypatch.setattr(pad_mm_module, "MIN_INTENSITY", 0.0)
    calls: list[str] = []

    def timer(fn: Any, device: Any) -> float:
        fn()
        calls.append("timed")
        return 3.0 if len(calls) == 1 else 1.0  # original 3 ms, padded 1 ms

    monkeypatch.setattr(ctx, "device", torch.device("cuda"))
    monkeypatch.setattr(pad_mm_module, "device_name", lambda device: "fake-gpu")
    monkeypatch.setattr(
        pad_mm_module, "_random_like", lambda val, device: torch.randn(list(val.shape), dtype=val.dtype)
    )
    pad, why = pad_mm_module.should_pad(c, ctx, timer)
    assert pad and "timed" in why and calls == ["timed", "timed"]
    files = os.listdir(tmp_path / "pad_mm")
    assert len(files) == 1 and files[0].endswith(".json")
    entry = json.loads((tmp_path / "pad_mm" / files[0]).read_text())
    assert entry["pad"] is True and "fake-gpu" in entry["key"] and torch.__version__ in entry["key"]
    monkeypatch.setattr(pad_mm_module, "_MEMORY", {})  # a fresh process: the disk answers
    pad, why = pad_mm_module.should_pad(c, ctx, timer)
    assert pad and why.startswith("cached") and calls == ["timed", "timed"]


def _lm_head(x: Any, w: Any, bias: Any) -> Any:
    return aten.addmm.default(bias, x, aten.t.default(w))  # a linear layer: the weight transposed


def test_the_timed_padded_gemm_has_the_rewrites_operand_layout() -> None:
    # Note [Matmul padding]: a transposed weight is padded before its transpose, in the rewrite and
    # in the timing alike; padding the transposed view would time a row-major operand instead
    gm = with_vals(_lm_head, make((16, 64)), make((50257 % 97 + 60, 64)), make((50257 % 97 + 60,)))
    node = next(n for n in gm.graph.nodes if n.target is aten.addmm.default)
    c = pad_mm_module.candidate(node)
    assert c is not None and c.pads == (0, 0, 8 - (50257 % 97 + 60) % 8)
    _, _, b = pad_mm_module._operands(node)
    _, _, pad_b = pad_mm_module._operand_pads(c)
    tb, padded_b = pad_mm_module._operand_versions(b, pad_b, torch.device("cpu"))
    pb = padded_b()
    n = c.n + c.pads[2]
    assert tb.stride() == (1, 64) and pb.shape == (64, n) and pb.stride() == (1, 64)  # still transposed
    assert torch.equal(pb[:, : c.n], tb) and not pb[:, c.n :].any()
    rewritten, _ = run_passes(gm, [], torch.device("cpu"), {"pad_mm": "force"})
    padded_nodes = [m for m in rewritten.graph.nodes if m.target is aten.addmm.default]
    assert len(padded_nodes) == 1 and padded_nodes[0].args[2].meta["val"].stride() == pb.stride()
    original, padded = pad_mm_module._eager_versions(c, torch.device("cpu"))
    assert original().shape == padded().shape == (16, c.n)


# -- attention ------------------------------------------------------------------------------------
B, H, L, E = 2, 3, 5, 4


def qk(q: Any, k: Any) -> Any:
    a = aten.view.default(
        aten.clone.default(aten.expand.default(q, [B, H, L, E]), memory_format=torch.contiguous_format),
        [B * H, L, E],
    )
    kt = aten.permute.default(k, [0, 1, 3, 2])
    b = aten.view.default(
        aten.clone.default(aten.expand.default(kt, [B, H, E, L]), memory_format=torch.contiguous_format),
        [B * H, E, L],
    )
    return aten.view.default(aten.bmm.default(a, b), [B, H, L, L])


def pv(p: Any, v: Any) -> Any:
    a = aten.view.default(aten.expand.default(p, [B, H, L, L]), [B * H, L, L])
    b = aten.view.default(
        aten.clone.default(aten.expand.default(v, [B, H, L, E]), memory_format=torch.contiguous_format),
        [B * H, L, E],
    )
    return aten.view.default(aten.bmm.default(a, b), [B, H, L, E])


def attention_masked(q: Any, k: Any, v: Any, mask: Any) -> Any:
    s = aten.add.Tensor(aten.mul.Tensor(qk(q, k), 0.5), mask)
    return pv(aten._softmax.default(s, -1, False), v)


def attention_div(q: Any, k: Any, v: Any, mask: Any) -> Any:
    return pv(aten._softmax.default(aten.div.Tensor(qk(q, k), 2.0), -1, False), v)


def qkv_inputs(mask_shape: tuple[int, ...] = (1, 1, L, L)) -> tuple[torch.Tensor, ...]:
    return make((B, H, L, E)), make((B, H, L, E)), make((B, H, L, E)), make(mask_shape)


def sdpa_calls(compiled: Any) -> int:
    return sum(
        "scaled_dot_product_attention" in str(getattr(op, "op", "")) for op in compiled.graph.operations
    )


@pytest.mark.parametrize("fn", [attention_masked, attention_div])
def test_explicit_attention_becomes_sdpa(fn: Any) -> None:
    inputs = qkv_inputs()
    gm = with_vals(fn, *inputs)
    compiled = check(gm, *inputs)
    assert sdpa_calls(compiled) == 1
    assert not any("bmm" in str(getattr(op, "op", "")) for op in compiled.graph.operations)
    assert any(
        name == "attention" and "scaled_dot_product_attention" in t for name, t in compiled.passes.record
    )
    off = check(gm, *inputs, options={"attention": False})
    assert sdpa_calls(off) == 0


def test_rows_masked_everywhere_stay_nan_as_in_eager() -> None:
    q, k, v, mask = qkv_inputs((B, 1, L, L))
    mask[0, 0, 2, :] = float("-inf")
    gm = with_vals(attention_masked, q, k, v, mask)
    compiled = check(gm, q, k, v, mask)  # compares with eager, NaN for NaN
    assert sdpa_calls(compiled) == 1
    assert torch.isnan(compiled(q, k, v, mask)[0, :, 2]).all()


def _mask_after_scale_swapped(q: Any, k: Any, v: Any, mask: Any) -> Any:
    s = aten.mul.Tensor(aten.add.Tensor(qk(q, k), mask), 0.5)  # mask added before the scale
    return pv(aten._softmax.default(s, -1, False), v)


def _softmax_over_queries(q: Any, k: Any, v: Any, mask: Any) -> Any:
    return pv(aten._softmax.default(aten.add.Tensor(qk(q, k), mask), -2, False), v)


def _multiplicative_mask(q: Any, k: Any, v: Any, mask: Any) -> Any:
    return pv(aten._softmax.default(aten.mul.Tensor(qk(q, k), mask), -1, False), v)


def _fill_not_minus_inf(q: Any, k: Any, v: Any, mask: Any) -> Any:
    s = aten.masked_fill.Scalar(aten.mul.Tensor(qk(q, k), 0.5), aten.gt.Scalar(mask, 0.0), -1e9)
    return pv(aten._softmax.default(s, -1, False), v)


def _boolean_mask(q: Any, k: Any, v: Any, mask: Any) -> Any:
    s = aten.where.self(
        aten.gt.Scalar(mask, 0.0), aten.mul.Tensor(qk(q, k), 0.5), aten.full_like.default(mask, float("-inf"))
    )
    return pv(aten._softmax.default(s, -1, False), v)


def _probabilities_also_returned(q: Any, k: Any, v: Any, mask: Any) -> Any:
    p = aten._softmax.default(aten.add.Tensor(qk(q, k), mask), -1, False)
    return pv(p, v), p


def _tensor_scale(q: Any, k: Any, v: Any, mask: Any) -> Any:
    return pv(aten._softmax.default(aten.mul.Tensor(qk(q, k), aten.sum.default(mask)), -1, False), v)


@pytest.mark.parametrize(
    ("fn", "mask_shape"),
    [
        (_mask_after_scale_swapped, (1, 1, L, L)),
        (_softmax_over_queries, (1, 1, L, L)),
        (_multiplicative_mask, (1, 1, L, L)),
        (_boolean_mask, (B, H, L, L)),  # keeps where the condition holds: not an exclusion
        (_fill_not_minus_inf, (1, 1, L, L)),
        (_probabilities_also_returned, (1, 1, L, L)),
        (_tensor_scale, (1, 1, L, L)),
    ],
)
def test_attention_look_alikes_are_left_alone(fn: Any, mask_shape: tuple[int, ...]) -> None:
    inputs = qkv_inputs(mask_shape)
    gm = with_vals(fn, *inputs)
    compiled = check(gm, *inputs, allow_fallback=True)
    assert sdpa_calls(compiled) == 0
    assert not any(name == "attention" for name, _ in compiled.passes.record)


def test_a_view_of_an_nhwc_value_leaves_with_eager_strides() -> None:
    # the permuted conv output is not itself marked; its NHWC storage would give it other strides
    def fn(x: Any, w1: Any, w2: Any) -> Any:
        a = aten.relu.default(conv(x, w1))
        return conv(a, w2), aten.permute.default(a, [0, 2, 3, 1])

    inputs = (make((2, 8, 8, 8)), make((8, 8, 3, 3)), make((8, 8, 3, 3)))
    gm = with_vals(fn, *inputs)
    with torch.no_grad():
        compiled = check(gm, *inputs, options=CUDA_RULE)
        out = compiled(*inputs)
    assert compiled.graph.channels_last
    for got, want in zip(out, gm(*inputs), strict=True):
        assert got.stride() == want.stride()


def attention_where(q: Any, k: Any, v: Any, mask: Any) -> Any:
    # minGPT: att.masked_fill(mask == 0, float("-inf")), as aotgrad spells it
    minus_inf = aten.scalar_tensor.default(float("-inf"), dtype=torch.float32, device=q.device)
    s = aten.where.self(aten.eq.Scalar(mask, 0), minus_inf, aten.mul.Tensor(qk(q, k), 0.5))
    return pv(aten._softmax.default(s, -1, False), v)


def attention_masked_fill(q: Any, k: Any, v: Any, mask: Any) -> Any:
    s = aten.masked_fill.Scalar(aten.mul.Tensor(qk(q, k), 0.5), aten.eq.Scalar(mask, 0), float("-inf"))
    return pv(aten._softmax.default(s, -1, False), v)


@pytest.mark.parametrize("fn", [attention_where, attention_masked_fill])
def test_excluding_boolean_mask_becomes_sdpa(fn: Any) -> None:
    q, k, v, _ = qkv_inputs()
    mask = torch.tril(torch.ones(L, L))[None, None].repeat(B, 1, 1, 1)
    mask[1, 0, 3, :] = 0  # a row excluded everywhere: NaN in eager, and in the rewrite
    gm = with_vals(fn, q, k, v, mask)
    compiled = check(gm, q, k, v, mask)
    assert sdpa_calls(compiled) == 1
    assert any("excluding" in t for name, t in compiled.passes.record if name == "attention")
    assert torch.isnan(compiled(q, k, v, mask)[1, :, 3]).all()


# Note [Attention masks that are constant along a row]


class _OnCuda(torch.Tensor):
    """Metadata of a CUDA tensor (what dynamo's fake tensors put in ``meta['val']``), no data."""

    @staticmethod
    def __new__(cls, t: torch.Tensor) -> _OnCuda:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, t.size(), strides=t.stride(), dtype=t.dtype, device=torch.device("cuda")
        )

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise AssertionError(f"the pass computed on a value: {func}")


def _example_values(gm: torch.fx.GraphModule, inputs: dict[str, torch.Tensor], on_cuda: bool) -> None:
    """Each node's example value in ``meta["val"]``, as dynamo leaves them (on CUDA: ``_OnCuda``)."""
    env: dict[str, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = inputs[node.name]
        elif node.op in ("call_function", "call_method"):
            args = torch.fx.node.map_arg(node.args, lambda n: env[n.name])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n.name])
            if node.op == "call_method":
                env[node.name] = getattr(args[0], node.target)(*args[1:], **kwargs)
            else:
                env[node.name] = node.target(*args, **kwargs)
        if node.op != "output":
            v = env[node.name]
            node.meta["val"] = _OnCuda(v) if on_cuda and isinstance(v, torch.Tensor) else v


def _row_mask_graph(
    on_cuda: bool, mask_kind: str, **sdpa_kwargs: Any
) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    import torch.nn.functional as F

    def fn(q: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        mask = m[:, None, :, None].expand(2, 1, 16, 16)  # constant along each row, as transformers' masks
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask, scale=0.25, **sdpa_kwargs)

    gm = torch.fx.symbolic_trace(fn)
    q = torch.randn(2, 3, 16, 8)
    keep = torch.rand(2, 16) > 0.3
    m: torch.Tensor = keep
    if mask_kind == "float":  # finite shifts, excluded rows, and one NaN row
        m = torch.where(keep, torch.randn(2, 16), float("-inf"))
        m[1, 5] = float("nan")
    _example_values(gm, {"q": q, "m": m}, on_cuda)
    return gm, [q, m]


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_row_constant_attention_masks_are_applied_after_an_unmasked_attention(mask_kind: str) -> None:
    from kiln_loopir.passes import prepare_torch_graph

    gm, (q, m) = _row_mask_graph(True, mask_kind)
    before = str(gm.graph)
    record: list[str] = []
    out = prepare_torch_graph(gm, None, record)
    assert str(gm.graph) == before  # the caller's graph is not edited
    assert out is not gm and len(record) == 1 and "strides [16, 16, 1, 0]" in record[0]
    sdpa = [n for n in out.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert len(sdpa) == 1 and sdpa[0].args[3:4] in ((), (None,)) and "attn_mask" not in sdpa[0].kwargs
    # the values are eager's math path's: a kept row is unmasked attention, an excluded row 0, NaN stays NaN
    got = out(q, m)
    ref = gm(q.double(), m.double() if m.is_floating_point() else m)  # eager, in float64
    torch.testing.assert_close(got, ref.float(), equal_nan=True)
    row = m if m.dtype == torch.bool else torch.isfinite(m)
    assert (got.transpose(1, 2)[~row & ~m.isnan() if m.is_floating_point() else ~row] == 0).all()


def test_attention_masks_are_left_alone_off_cuda_with_dropout_or_switched_off() -> None:
    from kiln_loopir.passes import prepare_torch_graph

    gm, _ = _row_mask_graph(False, "bool")
    assert prepare_torch_graph(gm) is gm  # the CPU kernels take any mask stride
    gm, _ = _row_mask_graph(True, "bool", dropout_p=0.1)
    assert prepare_torch_graph(gm) is gm
    gm, _ = _row_mask_graph(True, "bool")
    assert prepare_torch_graph(gm, {"attention_mask": False}) is gm


def _strided_mask_graph(
    on_cuda: bool, mask_kind: str, **sdpa_kwargs: Any
) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """T5's mask: a ``[L, S, H]`` lookup permuted to ``[1, H, L, S]`` (its last stride H)."""
    import torch.nn.functional as F

    def fn(q: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        mask = m.permute(2, 0, 1).unsqueeze(0)
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask, scale=0.25, **sdpa_kwargs)

    gm = torch.fx.symbolic_trace(fn)
    q = torch.randn(2, 3, 16, 8)
    keep = torch.rand(16, 16, 3) > 0.3
    keep[4, :, 1] = False  # a row excluded everywhere, in one head
    m: torch.Tensor = keep
    if mask_kind == "float":
        m = torch.where(keep, torch.randn(16, 16, 3), float("-inf"))
    _example_values(gm, {"q": q, "m": m}, on_cuda)
    return gm, [q, m]


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_attention_masks_strided_along_rows_are_made_dense(mask_kind: str) -> None:
    """Note [Attention masks read across their rows]: the mask reaches SDPA dense, and a row
    excluded everywhere is 0, as eager's math path answers."""
    from kiln_loopir.passes import prepare_torch_graph

    gm, (q, m) = _strided_mask_graph(True, mask_kind)
    record: list[str] = []
    out = prepare_torch_graph(gm, None, record)
    assert out is not gm and len(record) == 1 and "strides [3, 1, 48, 3]" in record[0], record
    sdpa = [n for n in out.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert len(sdpa) == 1
    dense = sdpa[0].args[3] if len(sdpa[0].args) > 3 else sdpa[0].kwargs.get("attn_mask")
    assert isinstance(dense, torch.fx.Node) and dense.target == "contiguous"
    got = out(q, m)
    ref = gm(q.double(), m.double() if m.is_floating_point() else m)
    torch.testing.assert_close(got, ref.float())
    assert (got[0, 1, 4] == 0).all() and (got[:, [0, 2], 4] != 0).any()
    assert prepare_torch_graph(gm, {"attention_dense_mask": False}) is gm
    cpu_gm = _strided_mask_graph(False, mask_kind)[0]
    assert prepare_torch_graph(cpu_gm) is cpu_gm  # the CPU kernels read any mask stride
    forced = prepare_torch_graph(cpu_gm, {"attention_dense_mask": "force"})  # the audit's CPU run
    assert forced is not cpu_gm
    torch.testing.assert_close(forced(q, m), ref.float())
    with pytest.raises(ValueError, match="attention_dense_mask"):
        prepare_torch_graph(cpu_gm, {"attention_dense_mask": "yes"})
    with_dropout = _strided_mask_graph(True, mask_kind, dropout_p=0.1)[0]
    assert prepare_torch_graph(with_dropout) is with_dropout


# -- convolution bias (Note [Convolution bias after the convolution]) ---------------------------


def conv_bias_relu(x: Any, w: Any, b: Any) -> Any:
    y = aten.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return aten.relu.default(y)


def depthwise_bias_norm(x: Any, w: Any, b: Any) -> Any:
    """ConvNeXt's pattern: a depthwise convolution with a bias, then a norm over channels."""
    y = aten.convolution.default(x, w, b, [1, 1], [3, 3], [1, 1], False, [0, 0], 8)
    mean = aten.mean.dim(y, [1], True)
    return aten.sub.Tensor(y, mean)


def _conv_nodes(compiled: Any) -> list[torch.fx.Node]:
    return [n for n in compiled.graph.gm.graph.nodes if n.target is aten.convolution.default]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_bias_is_added_in_the_readers_kernel(dtype: torch.dtype) -> None:
    x, w, b = make((2, 8, 6, 6), dtype), make((16, 8, 3, 3), dtype), make((16,), dtype)
    gm = with_vals(conv_bias_relu, x, w, b)
    peeled = check(gm, x, w, b, options={"conv_bias": "force"})
    assert [n.args[2] for n in _conv_nodes(peeled)] == [None]
    assert any(n == "conv_bias" for n, _ in peeled.passes.record)
    kept = check(gm, x, w, b, options={"conv_bias": False})
    assert _conv_nodes(kept)[0].args[2] is not None
    # the bias rides in the ReLU's kernel: no kernel more than with the bias in the convolution
    assert peeled.stats.kernels == kept.stats.kernels == 1


def test_conv_bias_before_a_reduction_and_channels_last() -> None:
    x, w, b = make((2, 8, 10, 10)), make((8, 1, 7, 7)), make((8,))
    gm = with_vals(depthwise_bias_norm, x, w, b)
    peeled = check(gm, x, w, b, options={"conv_bias": "force", **CUDA_RULE})
    kept = check(gm, x, w, b, options={"conv_bias": False, **CUDA_RULE})
    assert [n.args[2] for n in _conv_nodes(peeled)] == [None]
    assert peeled.stats.kernels <= kept.stats.kernels


def conv_bias_alone(x: Any, w: Any, b: Any) -> Any:
    return aten.convolution.default(x, w, b, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)


@pytest.mark.parametrize("options", [{}, CUDA_RULE], ids=["eager_layout", "cuda_rule"])
def test_a_peeled_convolution_returns_eagers_strides(options: dict[str, Any]) -> None:
    """Note [A peeled convolution keeps its layout]: a channels-last input's convolution, its bias
    peeled, leaves channels-last as eager's does (it left NCHW: the meta device's convolution)."""
    x = make((3, 4, 8, 8)).contiguous(memory_format=torch.channels_last)
    w, b = make((2, 4, 3, 3)), make((2,))
    gm = with_vals(conv_bias_alone, x, w, b)
    compiled = check(gm, x, w, b, options={"conv_bias": "force", **options})
    assert [n.args[2] for n in _conv_nodes(compiled)] == [None]
    assert compiled(x, w, b).stride() == conv_bias_alone(x, w, b).stride() == (32, 1, 8, 2)


def test_conv_bias_stays_in_the_convolution_on_the_cpu() -> None:
    x, w, b = make((2, 8, 6, 6)), make((16, 8, 3, 3)), make((16,))
    compiled = check(with_vals(conv_bias_relu, x, w, b), x, w, b)
    assert _conv_nodes(compiled)[0].args[2] is not None
    assert any(n == "conv_bias" and "not on CUDA" in t for n, t in compiled.passes.record)
    with pytest.raises(ValueError, match="conv_bias"):
        PassOptions.from_mapping({"conv_bias": "sometimes"})


def _backward_with_bias(
    transposed: bool = False, mask: tuple[bool, bool, bool] = (True, True, True)
) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """A convolution backward whose gradient comes out of a pointwise kernel (the producer the bias
    sum fuses with), asked for the bias gradient, as in a ConvNeXt block's training step."""
    x, w = make((2, 8, 6, 6)), make((8, 1, 3, 3), low=-0.3, high=0.3)
    up, g = make((2, 8, 6, 6)), make((2, 8, 6, 6))

    def backward(x: Any, w: Any, up: Any, g: Any) -> Any:
        grad = aten.mul.Tensor(g, aten.sigmoid.default(up))
        gx, gw, gb = aten.convolution_backward.default(
            grad, x, w, [8], [1, 1], [1, 1], [1, 1], transposed, [0, 0], 8, list(mask)
        )
        return gx, gw, gb

    return with_vals(backward, x, w, up, g), [x, w, up, g]


@pytest.mark.parametrize("transposed", [False, True])
def test_a_convolution_bias_gradient_is_a_generated_sum(transposed: bool) -> None:
    """Note [Convolution bias gradients in generated code]: the backward is asked for the input's
    and weight's gradients only and the bias's is a generated sum, eager's values."""
    gm, inputs = _backward_with_bias(transposed)
    moved = check(gm, *inputs, options={"conv_bias_grad": "force"})
    kept = check(gm, *inputs, options={"conv_bias_grad": False})
    (node,) = [n for n in moved.graph.gm.graph.nodes if n.target is aten.convolution_backward.default]
    assert list(node.args[10]) == [True, True, False]
    assert any(n.target is aten.sum.dim_IntList for n in moved.graph.gm.graph.nodes)
    assert ("conv_bias_grad", "1 convolution bias gradients computed as sums") in moved.passes.record
    (node,) = [n for n in kept.graph.gm.graph.nodes if n.target is aten.convolution_backward.default]
    assert list(node.args[10]) == [True, True, True]
    # the sum is generated code: the convolution backward stays the only extern call
    assert moved.stats.extern_ops == kept.stats.extern_ops == ("convolution_backward.default",)


def test_convolution_bias_gradients_stay_on_the_cpu_or_where_not_asked() -> None:
    gm, inputs = _backward_with_bias()
    compiled = check(gm, *inputs)
    assert any(n == "conv_bias_grad" and "not on CUDA" in t for n, t in compiled.passes.record)
    gm, inputs = _backward_with_bias(mask=(True, True, False))
    compiled = check(gm, *inputs, options={"conv_bias_grad": "force"})
    assert not any(n == "conv_bias_grad" for n, _ in compiled.passes.record)
    with pytest.raises(ValueError, match="conv_bias_grad"):
        PassOptions.from_mapping({"conv_bias_grad": "sometimes"})


@pytest.mark.parametrize(
    "damage",
    [b'{"key": "trunc', b"\x00\xff garbage", b"null", b'{"key": "k"}', b'{"key": 1, "pad": "yes"}'],
    ids=["truncated", "garbage", "not-an-object", "no-verdict", "wrong-types"],
)
def test_a_corrupt_padding_verdict_is_reported_and_decided_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, damage: bytes
) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pad_mm_module, "_MEMORY", {})
    key = "mm|64x100|100x64|fake-gpu"
    pad_mm_module.store_decision(key, True, 3.0, 1.0)
    path = pad_mm_module._path(key)
    path.write_bytes(damage)
    monkeypatch.setattr(pad_mm_module, "_MEMORY", {})  # a fresh process
    with caplog.at_level("WARNING", logger="kiln.loopir.cache"):
        assert pad_mm_module.cached_decision(key) is None  # never trusted
    assert "corrupt pad_mm cache entry" in caplog.text and str(path) in caplog.text
    pad_mm_module.store_decision(key, False, 1.0, 2.0)  # decided again, written over
    monkeypatch.setattr(pad_mm_module, "_MEMORY", {})
    caplog.clear()
    assert pad_mm_module.cached_decision(key) is False and "corrupt" not in caplog.text


# -- patch convolutions (Note [Patch convolutions as GEMMs]) ------------------------------------


def patch_embed(n: int, kh: int, kw: int) -> Any:
    """A vision transformer's patch embedding: conv(stride = kernel), flatten, tokens first."""

    def fn(x: Any, w: Any, b: Any) -> Any:
        y = aten.convolution.default(x, w, b, [kh, kw], [0, 0], [1, 1], False, [0, 0], 1)
        tokens = aten.permute.default(aten.view.default(y, [n, 16, -1]), [0, 2, 1])
        return aten.add.Tensor(tokens, 1.0), y

    return fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("image", "kernel"), [((2, 3, 32, 32), 8), ((2, 3, 30, 35), 4), ((1, 5, 16, 48), (4, 16))]
)
def test_a_patch_convolution_is_a_gemm(dtype: torch.dtype, image: tuple[int, ...], kernel: Any) -> None:
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    x, w, b = make(image, dtype), make((16, image[1], kh, kw), dtype), make((16,), dtype)
    embed = patch_embed(image[0], kh, kw)
    gm = with_vals(embed, x, w, b)
    # a GEMM sums the patch's C*kh*kw products in another order than the convolution: float32
    # results of magnitude ~sqrt(K) differ by a few of their ulps (K = 320: 1.4e-5 seen)
    rewritten = check(gm, x, w, b, options={"patch_conv": "force"}, tolerances={torch.float32: (1e-4, 1e-4)})
    assert _conv_nodes(rewritten) == []
    targets = {n.target for n in rewritten.graph.gm.graph.nodes}
    assert aten.addmm.default in targets
    assert any(n == "patch_conv" and "1 patch convolutions" in t for n, t in rewritten.passes.record)
    # the convolution's result is channels-last: the tokens' (N, HW, C) view reads it densely
    (tokens, y) = rewritten(x, w, b)
    assert y.stride() == embed(x, w, b)[1].stride()  # a graph output leaves with eager's strides
    assert tokens.shape == embed(x, w, b)[0].shape
    # kept, a small float32 training convolution runs PyTorch's native im2col GEMM (Note [Small
    # convolutions outside oneDNN]): the same few ulps against eager's oneDNN kernel
    kept = check(gm, x, w, b, options={"patch_conv": False}, tolerances={torch.float32: (1e-4, 1e-4)})
    assert len(_conv_nodes(kept)) == 1


def test_only_convolutions_that_tile_their_input_are_patches() -> None:
    x = make((2, 3, 16, 16))
    for stride, padding, groups, w in (
        ([2, 2], [0, 0], 1, make((8, 3, 4, 4))),  # overlapping windows
        ([4, 4], [1, 1], 1, make((8, 3, 4, 4))),  # padded
        ([4, 4], [0, 0], 3, make((6, 1, 4, 4))),  # grouped
    ):
        compiled = check(
            with_vals(_conv_of(stride, padding, groups), x, w), x, w, options={"patch_conv": "force"}
        )
        assert len(_conv_nodes(compiled)) == 1


def test_short_patches_of_many_channels_stay_convolutions() -> None:
    # ConvNeXt's 2x2 downsampling: rows of 2 elements, 16 channels (float32: 8 bytes a row)
    x, w = make((2, 16, 8, 8)), make((32, 16, 2, 2))
    compiled = check(with_vals(_conv_of([2, 2], [0, 0], 1), x, w), x, w, options={"patch_conv": "force"})
    assert len(_conv_nodes(compiled)) == 1
    # an image's 3 channels with the same short rows: a GEMM (Swin's and ConvNeXt's stems)
    x, w = make((2, 3, 8, 8)), make((32, 3, 2, 2))
    compiled = check(with_vals(_conv_of([2, 2], [0, 0], 1), x, w), x, w, options={"patch_conv": "force"})
    assert _conv_nodes(compiled) == []


def _conv_of(stride: list[int], padding: list[int], groups: int) -> Any:
    def fn(x: Any, w: Any) -> Any:
        return aten.convolution.default(x, w, None, stride, padding, [1, 1], False, [0, 0], groups)

    return fn


def test_patch_convolutions_stay_convolutions_on_the_cpu() -> None:
    x, w, b = make((2, 3, 32, 32)), make((16, 3, 8, 8)), make((16,))
    compiled = check(with_vals(patch_embed(2, 8, 8), x, w, b), x, w, b)
    assert len(_conv_nodes(compiled)) == 1
    assert any(n == "patch_conv" and "not on CUDA" in t for n, t in compiled.passes.record)
    with pytest.raises(ValueError, match="patch_conv"):
        PassOptions.from_mapping({"patch_conv": "sometimes"})


# -- the CPU rule under a symbolic batch -----------------------------------------------------------
def _two_convs_of_symbolic_batch(
    min_batch: int | None = None, max_batch: int | None = None
) -> tuple[Any, list[Any]]:
    """Two 3x3 convolutions (3 -> 16 -> 16 channels) of an 8x8 image whose batch is a size symbol
    (meta tensors): inputs 192 + 1024 elements a sample, weights 432 + 2304 elements."""
    from kiln_symbolic import DimDynamic, ShapeEnv, make_symint

    env = ShapeEnv()
    hint = min(4, max_batch or 4)
    batch = make_symint(
        env, env.create_symbol(hint, "x", DimDynamic.DYNAMIC, min=min_batch, max=max_batch), hint
    )
    inputs = [torch.empty(batch, 3, 8, 8, device="meta"), torch.empty(16, 3, 3, 3), torch.empty(16, 16, 3, 3)]
    inputs[1:] = [w.to("meta") for w in inputs[1:]]
    return with_vals(lambda x, w1, w2: conv(conv(x, w1), w2), *inputs), inputs


@pytest.mark.parametrize(
    ("min_batch", "max_batch", "per_batch", "want"),
    [
        (None, None, True, "NHWC from batch 3, eager layouts below"),  # ceil(2736 / 1216) = 3
        (3, None, True, "NHWC at every batch from 3"),
        (None, None, False, "conv inputs (2432 elements at the smallest batch)"),
    ],
)
def test_cpu_rule_under_a_symbolic_batch_picks_the_layout_per_batch(
    min_batch: int | None, max_batch: int | None, per_batch: bool, want: str
) -> None:
    """Note [Both layouts under a symbolic batch]: the element-count rule, linear in the batch,
    gives the batch from which NHWC pays; inside the symbol's range both layouts are compiled and
    the call's batch is read from input 0's size 0; outside it one layout is chosen;
    ``layout_per_batch=False`` counts at the smallest batch (Note [The CPU rule under a symbolic
    batch])."""
    from kiln_loopir.passes.channels_last import channels_last_nodes

    gm, inputs = _two_convs_of_symbolic_batch(min_batch, max_batch)
    ctx = PassContext(torch.device("cpu"), PassOptions(layout_per_batch=per_batch), inputs, True)
    chosen = channels_last_nodes(gm, ctx)
    (text,) = [t for name, t in ctx.record if name == "layout"]
    assert want in text, text
    split = ctx.channels_last_from
    if want.startswith("NHWC from"):
        assert split is not None and (split.input, split.dim, split.start) == (0, 0, 3)
        assert split.batch_of([torch.empty(7, 3, 8, 8)]) == 7
        assert len([n for n in chosen if n.target is aten.convolution.default]) == 2
    else:
        assert split is None
        assert bool(chosen) == want.startswith("NHWC")


def test_cpu_rule_reads_symbolic_channels_at_their_hints_without_guarding() -> None:
    """A convolution whose channel counts are symbolic (``dynamic=True``) is classed at their
    hints: an ``int()`` of the SymInt guarded ``Eq(s0, 3)`` and the graph compiled static."""
    from kiln_symbolic import DimDynamic, ShapeEnv, make_symint

    from kiln_loopir.passes.channels_last import channels_last_nodes, conv_class

    env = ShapeEnv()
    c_in, c_out = (make_symint(env, env.create_symbol(h, f"c{h}", DimDynamic.DYNAMIC), h) for h in (3, 80))
    x, w = torch.empty(2, c_in, 8, 8, device="meta"), torch.empty(c_out, c_in, 3, 3, device="meta")
    gm = with_vals(_conv_of([1, 1], [1, 1], 1), x, w)
    (conv,) = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert conv_class(conv) == "default"  # 80 out, 3 in, at their hints
    ctx = PassContext(torch.device("cpu"), PassOptions(), [x, w], True)
    channels_last_nodes(gm, ctx)
    assert env.guards == [], [str(g.expr) for g in env.guards]


def _depthwise_backward(
    side: int, k: int, pad: int | None = None, dtype: torch.dtype = torch.float32
) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """A depthwise convolution backward (16 channels, ``k`` x ``k`` kernel, stride 1, same
    padding unless ``pad`` says) onto a ``side`` x ``side`` map whose gradient a kernel computes
    (a scale) and whose input comes NHWC, as ConvNeXt's."""
    pad = k // 2 if pad is None else pad
    x = make((2, 16, side + 2 * (k // 2 - pad), side + 2 * (k // 2 - pad)), dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    w = make((16, 1, k, k), dtype)
    g = make((2, 16, side, side), dtype).contiguous(memory_format=torch.channels_last)

    def backward(x: Any, w: Any, g: Any) -> Any:
        grad = aten.mul.Tensor(g, 0.5)
        return aten.convolution_backward.default(
            grad, x, w, [16], [1, 1], [pad, pad], [1, 1], False, [0, 0], 16, [True, True, True]
        )

    return with_vals(backward, x, w, g), [x, w, g]


@pytest.mark.parametrize(
    ("options", "dtype"),
    [
        (EAGER_LAYOUT_TRAINING, torch.float32),
        ({"cpu_layout_training": "force"}, torch.float32),
        (EAGER_LAYOUT_TRAINING, torch.bfloat16),
    ],
)
def test_a_depthwise_backward_on_a_small_map_runs_nchw(options: dict[str, Any], dtype: torch.dtype) -> None:
    """Note [Depthwise convolution backwards on small maps]: a padded 3x3 depthwise backward on a
    2x2 map gets its gradient and input NCHW (oneDNN's NHWC kernel is the slow one there), in
    eager's layouts and in a graph forced channels-last alike, in bfloat16 too; gradients and
    strides as eager's."""
    gm, inputs = _depthwise_backward(2, 3, dtype=dtype)
    compiled = check(gm, *inputs, options=options)
    (op,) = conv_ops(compiled)
    for arg in op.args[:2]:
        assert arg.layout.stride[-1] == 1 and arg.layout.stride[1] == 4  # NCHW
    assert not is_plain_copy(compiled.graph.name_to_buffer[op.args[0].name])  # the scale writes it
    assert any("depthwise backward NCHW (3x3 kernel, 2x2 map)" in text for _, text in compiled.passes.record)
    expected = gm(*inputs)
    for got, want in zip(compiled(*inputs), expected, strict=True):
        assert got.stride() == want.stride()
    off = check(gm, *inputs, options={**options, "depthwise_backward_nchw": False})
    (op,) = conv_ops(off)
    assert op.args[1].layout.stride[1] == 1  # the input as it came: NHWC
    assert not any("depthwise backward NCHW" in text for _, text in off.passes.record)


@pytest.mark.parametrize(("side", "k", "pad"), [(8, 3, 1), (8, 7, 3), (2, 3, 0)])
def test_depthwise_backwards_where_nhwc_is_faster_keep_their_layout(side: int, k: int, pad: int) -> None:
    """Depthwise backwards whose kernel does not cover the map (3x3 and 7x7 on 8x8), or that are
    3x3 and unpadded (MobileNetV2's explicitly padded blocks: oneDNN's depthwise kernel in either
    format), are left as they come."""
    gm, inputs = _depthwise_backward(side, k, pad)
    compiled = check(gm, *inputs, options=EAGER_LAYOUT_TRAINING)
    (op,) = conv_ops(compiled)
    assert op.args[1].layout.stride[1] == 1
    assert not any("depthwise backward NCHW" in text for _, text in compiled.passes.record)
