"""The conv_fusion pass (Note [Convolutions through oneDNN]): folded BatchNorm and post-ops equal
eager at fp32 tolerance; the prepacked weight follows parameter versions; where the pass is off.

BatchNorm is written as aotgrad decomposes eval-mode ``_native_batch_norm_legit_no_training``
(the graphs loopir receives from kiln): ``(x - mean) * rsqrt(var + eps) * gamma + beta`` over
``[C, 1, 1]`` views of the parameters.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from helpers import make

from kiln_loopir import compile_graph
from kiln_loopir.passes.conv_fusion import FusedConv
from kiln_loopir.testing import with_vals

aten = torch.ops.aten

# fp32: a folded weight rounds w * g once, eager rounds conv(x, w) and then its scaled value
TOL: dict[str, float] = {"rtol": 1e-5, "atol": 5e-5}


def _chan(v: Any) -> Any:
    return aten.unsqueeze.default(aten.unsqueeze.default(v, -1), -1)


def bn(y: Any, gamma: Any, beta: Any, mean: Any, var: Any) -> Any:
    invstd = aten.reciprocal.default(aten.sqrt.default(aten.add.Tensor(var, 1e-5)))
    centered = aten.sub.Tensor(y, _chan(mean))
    return aten.add.Tensor(
        aten.mul.Tensor(aten.mul.Tensor(centered, _chan(invstd)), _chan(gamma)), _chan(beta)
    )


def conv(x: Any, w: Any, b: Any, stride: int = 1, groups: int = 1) -> Any:
    return aten.convolution.default(x, w, b, [stride, stride], [1, 1], [1, 1], False, [0, 0], groups)


def conv_bn_relu(x: Any, w: Any, b: Any, gamma: Any, beta: Any, mean: Any, var: Any) -> Any:
    return aten.relu.default(bn(conv(x, w, b), gamma, beta, mean, var))


def residual(x: Any, w: Any, gamma: Any, beta: Any, mean: Any, var: Any) -> Any:
    y = bn(conv(x, w, None), gamma, beta, mean, var)
    return aten.relu.default(aten.add.Tensor(y, x))


def other_affine(x: Any, w: Any, b: Any, s: Any) -> Any:
    # param - conv, then a scale: the chain's sign and order cases
    return aten.mul.Tensor(aten.sub.Tensor(_chan(s), conv(x, w, b, stride=2)), _chan(s))


def bn_inputs(c_in: int = 8, c_out: int = 16) -> list[torch.Tensor]:
    return [
        make((2, c_in, 12, 12)),
        make((c_out, c_in, 3, 3)),
        make((c_out,)),
        make((c_out,), low=0.5, high=2.0),
        make((c_out,)),
        make((c_out,)),
        make((c_out,), low=0.5, high=2.0),
    ]


def fused_ops(compiled: Any) -> list[FusedConv]:
    return [op.op for op in compiled.graph.operations if isinstance(getattr(op, "op", None), FusedConv)]


def run(fn: Any, inputs: list[torch.Tensor], **options: Any) -> tuple[Any, Any]:
    options.setdefault("conv_prepack", True)  # the pass runs only with prepacked weights
    gm = with_vals(fn, *inputs)  # shape metadata on every node, as aotgrad's graphs carry it
    with torch.no_grad():
        compiled = compile_graph(gm, inputs, options=options)
        return compiled, compiled(*inputs)


@pytest.mark.parametrize(
    ("fn", "inputs", "kind"),
    [
        (conv_bn_relu, bn_inputs(), "affine+relu"),
        (residual, [bn_inputs(16)[0], *bn_inputs(16)[1:2], *bn_inputs(16)[3:]], "affine+add+relu"),
        (other_affine, [make((2, 8, 12, 12)), make((16, 8, 3, 3)), make((16,)), make((16,))], "affine"),
    ],
)
def test_folded_equals_eager(fn: Any, inputs: list[torch.Tensor], kind: str) -> None:
    compiled, out = run(fn, inputs)
    (op,) = fused_ops(compiled)
    assert kind in repr(op)
    eager = fn(*inputs)
    torch.testing.assert_close(out, eager, **TOL)
    assert out.stride() == eager.stride()
    _, unfused = run(fn, inputs, conv_fusion=False)
    torch.testing.assert_close(out, unfused, **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_residual_add_without_relu(dtype: torch.dtype) -> None:
    # MobileNetV2's inverted residual: conv, BatchNorm, add; no ReLU after the add (the binary
    # post-op without a unary one failed at run time, and kiln ran the graph eagerly)
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("no oneDNN bfloat16 kernels")
    x, w, y = make((2, 16, 10, 10), dtype), make((16, 16, 1, 1), dtype), make((2, 16, 10, 10), dtype)

    def fn(x: Any, w: Any, y: Any) -> Any:
        return aten.add.Tensor(
            aten.convolution.default(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), y
        )

    compiled, out = run(fn, [x, w, y])
    (op,) = fused_ops(compiled)
    assert op.spec.binary and op.spec.unary == "none"
    tol = TOL if dtype == torch.float32 else TOL_BF16
    torch.testing.assert_close(out, fn(x, w, y), **tol)


def test_depthwise_conv_without_post_ops() -> None:
    x, w = make((2, 16, 10, 10)), make((16, 1, 3, 3))

    def fn(x: Any, w: Any) -> Any:
        return conv(x, w, None, groups=16)

    compiled, out = run(fn, [x, w])
    assert len(fused_ops(compiled)) == 1
    torch.testing.assert_close(out, fn(x, w), **TOL)


def test_prepacked_weight_follows_parameter_versions() -> None:
    inputs = bn_inputs()
    compiled, _ = run(conv_bn_relu, inputs, conv_prepack=True)
    (op,) = fused_ops(compiled)
    with torch.no_grad():
        compiled(*inputs)
        assert op.cache.packs == 1  # packed once, reused
        for i, change in ((1, 2.0), (5, 0.5), (6, 3.0)):  # weight, running mean, running var
            inputs[i].mul_(change)  # in place: the version moves
            torch.testing.assert_close(compiled(*inputs), conv_bn_relu(*inputs), **TOL)
        assert op.cache.packs == 4
        inputs[3] = inputs[3] * 2  # another tensor for gamma, version 0 again
        torch.testing.assert_close(compiled(*inputs), conv_bn_relu(*inputs), **TOL)
        assert op.cache.packs == 5
        compiled(*inputs)
        assert op.cache.packs == 5


def test_running_statistics_eager_batch_norm_updates_reach_the_fold() -> None:
    # Note [Running statistics move without a version]: eager's training-mode BatchNorm writes its
    # running statistics in place without moving their versions; the fold must see the new values
    inputs = bn_inputs()
    compiled, _ = run(conv_bn_relu, inputs, conv_prepack=True)
    (op,) = fused_ops(compiled)
    mean, var = inputs[5], inputs[6]
    with torch.no_grad():
        compiled(*inputs)
        versions = mean._version, var._version
        batch = make((4, 16, 5, 5)) * 3 + 1
        torch.batch_norm(batch, None, None, mean, var, True, 0.5, 1e-5, False)
        assert (mean._version, var._version) == versions  # what the Note is about
        torch.testing.assert_close(compiled(*inputs), conv_bn_relu(*inputs), **TOL)
        assert op.cache.packs == 2
        compiled(*inputs)
        assert op.cache.packs == 2  # the same values: the pack is reused


def test_writes_that_keep_the_version_reach_the_pack_through_its_sample() -> None:
    # Note [Writes that do not move a version]: a write through ``.data`` (as a fused optimizer's
    # step) keeps the version; the key's sample of the weight's bytes sees it
    inputs = bn_inputs()
    compiled, _ = run(conv_bn_relu, inputs, conv_prepack=True)
    (op,) = fused_ops(compiled)
    weight = inputs[1]
    with torch.no_grad():
        compiled(*inputs)
        version = weight._version
        weight.data.mul_(-2.0)
        assert weight._version == version
        torch.testing.assert_close(compiled(*inputs), conv_bn_relu(*inputs), **TOL)
        assert op.cache.packs == 2


def test_training_graphs_and_options_keep_aten_convolutions(caplog: pytest.LogCaptureFixture) -> None:
    inputs = bn_inputs()
    gm = with_vals(conv_bn_relu, *inputs)
    caplog.set_level(logging.DEBUG, logger="kiln.loopir.passes")
    training = compile_graph(gm, inputs, options={"conv_prepack": True})  # grad mode on: a training graph
    assert fused_ops(training) == []
    assert "conv_fusion: training graph" in caplog.text
    for options in ({"conv_fusion": False}, {"layout": False}, {"layout_policy": "cuda"}):
        compiled, out = run(conv_bn_relu, inputs, **options)
        assert fused_ops(compiled) == [], options
        torch.testing.assert_close(out, conv_bn_relu(*inputs), **TOL)
    run(conv_bn_relu, inputs)
    assert "1 of 1 convolutions through oneDNN" in caplog.text


def test_a_conv_read_twice_keeps_its_bn_separate() -> None:
    inputs = bn_inputs()

    def fn(x: Any, w: Any, b: Any, gamma: Any, beta: Any, mean: Any, var: Any) -> Any:
        y = conv(x, w, b)
        return aten.relu.default(bn(y, gamma, beta, mean, var)), aten.mean.dim(y, [2, 3])

    compiled, out = run(fn, inputs)
    (op,) = fused_ops(compiled)
    assert op.spec.affine == () and op.spec.unary == "none"
    for got, want in zip(out, fn(*inputs), strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_a_strided_residual_is_added_by_loopir() -> None:
    x, w, y = make((2, 16, 10, 10)), make((16, 16, 3, 3)), make((2, 32, 10, 10))

    def fn(x: Any, w: Any, y: Any) -> Any:
        other = aten.slice.Tensor(y, 1, 0, 32, 2)  # every other channel: not dense
        return aten.relu.default(aten.add.Tensor(conv(x, w, None), other))

    compiled, out = run(fn, [x, w, y])
    (op,) = fused_ops(compiled)
    assert not op.spec.binary
    torch.testing.assert_close(out, fn(x, w, y), **TOL)


def test_inference_tensors_are_packed_every_call() -> None:
    with torch.inference_mode():  # no version counters: nothing may be reused
        inputs = [t.clone() for t in bn_inputs()]
    compiled, _ = run(conv_bn_relu, inputs, conv_prepack=True)
    (op,) = fused_ops(compiled)
    with torch.inference_mode():
        compiled(*inputs)
        inputs[1].mul_(2.0)
        torch.testing.assert_close(compiled(*inputs), conv_bn_relu(*inputs), **TOL)
    assert op.cache.packs == 3


def test_by_default_convolutions_stay_eagers_and_see_writes_through_data() -> None:
    # Note [Prepacked weights]: prepacking is opt-in, as torch.compile's freezing is, and the pass
    # runs only with it (a per-call fold and reorder is slower than eager's convolution), so by
    # default nothing is cached and a write through `p.data` counts
    inputs = bn_inputs()
    compiled, _ = run(conv_bn_relu, inputs, conv_prepack=False)
    assert fused_ops(compiled) == []
    with torch.no_grad():
        inputs[1].data.mul_(2.0)  # the version does not move
        torch.testing.assert_close(compiled(*inputs), conv_bn_relu(*inputs), **TOL)


# --- bfloat16 (Note [bfloat16 through oneDNN], Note [BatchNorm of a bfloat16 convolution folds in
# float32]) ---

BF16 = torch.bfloat16
# bfloat16: the folded weight rounds w * g to 8 bits once, eager rounds conv(x, w) and then its
# normalized value; a few units of 2**-8 relative (assert_bf16_close where results cancel)
TOL_BF16: dict[str, float] = {"rtol": 2e-2, "atol": 5e-2}
needs_bf16 = pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no oneDNN bfloat16 kernels on this CPU"
)


def _up(v: Any) -> Any:
    return aten._to_copy.default(v, dtype=torch.float32)


def bn_bf16(y: Any, gamma: Any, beta: Any, mean: Any, var: Any, out: torch.dtype = BF16) -> Any:
    # as aotgrad decomposes eval-mode BatchNorm of a bfloat16 tensor: statistics in float32, the
    # chain promoted to float32 by them, one conversion back at its end
    invstd = aten.reciprocal.default(aten.sqrt.default(aten.add.Tensor(_up(var), 1e-5)))
    centered = aten.sub.Tensor(y, _chan(_up(mean)))
    scaled = aten.add.Tensor(
        aten.mul.Tensor(aten.mul.Tensor(centered, _chan(invstd)), _chan(gamma)), _chan(beta)
    )
    return aten._to_copy.default(scaled, dtype=out)


def conv_bn_relu_of(dtype: torch.dtype) -> Any:
    def conv_bn_relu_bf16(x: Any, w: Any, b: Any, gamma: Any, beta: Any, mean: Any, var: Any) -> Any:
        return aten.relu.default(bn_bf16(conv(x, w, b), gamma, beta, mean, var, dtype))

    return conv_bn_relu_bf16


def residual_of(dtype: torch.dtype) -> Any:
    def residual_bf16(x: Any, w: Any, gamma: Any, beta: Any, mean: Any, var: Any) -> Any:
        return aten.relu.default(aten.add.Tensor(bn_bf16(conv(x, w, None), gamma, beta, mean, var, dtype), x))

    return residual_bf16


conv_bn_relu_bf16 = conv_bn_relu_of(BF16)


def bf16(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.to(BF16) for t in inputs]


def assert_bf16_close(out: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor) -> None:
    """``out`` within bfloat16 roundings of ``eager``, and no farther from the exact result than
    eager's bfloat16 result is, but for a rounding (where the convolution's large result cancels
    with the residual, eager's own error is several units of the result's last place)."""
    ulp = exact.abs().max().item() * 2**-8
    torch.testing.assert_close(out.double(), eager.double(), rtol=2e-2, atol=2 * ulp)
    assert (out.double() - exact).abs().max() <= (eager.double() - exact).abs().max() + ulp


@needs_bf16
@pytest.mark.parametrize(
    ("fn_of", "inputs", "kind"),
    [
        (conv_bn_relu_of, bn_inputs(), "affine+relu"),
        (residual_of, [bn_inputs(16)[0], *bn_inputs(16)[1:2], *bn_inputs(16)[3:]], "affine+add+relu"),
    ],
)
def test_bfloat16_batchnorm_folds_in_float32(fn_of: Any, inputs: list[torch.Tensor], kind: str) -> None:
    fn, inputs = fn_of(BF16), bf16(inputs)
    compiled, out = run(fn, inputs)
    (op,) = fused_ops(compiled)
    assert kind in repr(op) and len(op.spec.affine) == 4
    eager = fn(*inputs)
    exact = fn_of(torch.float64)(*[t.double() for t in inputs])
    assert out.dtype == BF16 and out.shape == eager.shape and out.stride() == eager.stride()
    assert_bf16_close(out, eager, exact)
    for options in ({"conv_fusion": False}, {"onednn_bf16": False}):
        compiled_off, off = run(fn, inputs, **options)
        assert fused_ops(compiled_off) == [], options
        assert_bf16_close(out, off, exact)


@needs_bf16
def test_a_float32_chain_leaving_the_graph_is_cut_where_it_turns_float32() -> None:
    x, w, b, _, beta, mean, _ = bf16(bn_inputs())

    def fn(x: Any, w: Any, b: Any, mean: Any, beta: Any) -> Any:
        y = aten.add.Tensor(conv(x, w, b), _chan(beta))  # bfloat16, folds
        return aten.sub.Tensor(y, _chan(_up(mean)))  # float32 from here, a graph output

    inputs = [x, w, b, mean, beta]
    compiled, out = run(fn, inputs)
    (op,) = fused_ops(compiled)
    assert op.spec.affine == (("add", True),)
    eager = fn(*inputs)
    assert out.dtype == eager.dtype == torch.float32
    torch.testing.assert_close(out, eager, **TOL_BF16)


@needs_bf16
def test_bfloat16_prepacked_weight_follows_parameter_versions() -> None:
    inputs = bf16(bn_inputs())
    compiled, _ = run(conv_bn_relu_bf16, inputs)
    (op,) = fused_ops(compiled)
    with torch.no_grad():
        compiled(*inputs)
        assert op.cache.packs == 1
        for i, change in ((1, -2.0), (6, 3.0)):  # the weight, the running variance, in place
            inputs[i].mul_(change)  # a stale pack is off by far more than roundings
            exact = conv_bn_relu_of(torch.float64)(*[t.double() for t in inputs])
            assert_bf16_close(compiled(*inputs), conv_bn_relu_bf16(*inputs), exact)
        assert op.cache.packs == 3
        compiled(*inputs)
        assert op.cache.packs == 3


@needs_bf16
def test_the_cpu_rule_counts_convolutions_the_pass_leaves(caplog: pytest.LogCaptureFixture) -> None:
    # with bfloat16 off the pass leaves the convolutions to aten, so the layout rule must not
    # choose NHWC for their sake (plain weights copied and reordered in every call)
    caplog.set_level(logging.DEBUG, logger="kiln.loopir.passes")
    inputs = bf16(bn_inputs())
    compiled, out = run(conv_bn_relu_bf16, inputs, onednn_bf16=False)
    assert fused_ops(compiled) == []
    assert "(conv_fusion)" not in caplog.text
    assert "dtype torch.bfloat16 (onednn_bf16=False)" in caplog.text
    torch.testing.assert_close(out, conv_bn_relu_bf16(*inputs), **TOL_BF16)
    caplog.clear()
    run(conv_bn_relu_bf16, inputs)
    assert "1 convs through oneDNN (conv_fusion)" in caplog.text


@needs_bf16
@pytest.mark.parametrize("groups", [4, 2])
def test_a_grouped_convolutions_add_and_relu_in_bfloat16(groups: int) -> None:
    """Note [A grouped convolution's add and ReLU in bfloat16]: oneDNN runs a grouped
    convolution's add + ReLU through add_relu_, which has no bfloat16 kernel: the graph failed at
    run time (CPU convolution fuzzer seed 1196). The add fuses, the ReLU stays loopir's."""
    x, w = (
        make((2, 4, 5, 5), BF16).contiguous(memory_format=torch.channels_last),
        make((4, 4 // groups, 3, 3), BF16),
    )

    def fn(x: Any, w: Any) -> Any:
        x2 = aten.mul.Tensor(x, 2.0)
        y = aten.convolution.default(x2, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], groups)
        return aten.relu.default(aten.add.Tensor(y, x2))

    compiled, out = run(fn, [x, w])
    (op,) = fused_ops(compiled)
    assert op.spec.binary and op.spec.unary == "none"
    torch.testing.assert_close(out, fn(x, w), **TOL_BF16)
