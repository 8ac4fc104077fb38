"""Fusion and buffer planning, observed through ``.stats``; extern fallbacks."""

from __future__ import annotations

from typing import Any

import torch
from helpers import assert_same, aten, check, make, trace

from kiln_loopir import compile_graph
from kiln_loopir.ir import ComputedBuffer
from kiln_loopir.passes import run_passes
from kiln_loopir.testing import downcast_mul_sum, mul_sum, with_vals


def test_pointwise_chain_is_one_kernel() -> None:
    def fn(x: Any, y: Any) -> Any:
        return aten.relu.default(aten.add.Tensor(aten.sin.default(x), y))

    compiled = check(fn, make((8, 16)), make((16,)))
    assert compiled.stats.kernels == 1
    assert compiled.stats.buffers == 1
    unfused = check(fn, make((8, 16)), make((16,)), fusion=False)
    assert unfused.stats.kernels == 3
    assert compiled.stats.bytes_moved < unfused.stats.bytes_moved


def test_pointwise_feeding_row_reduction_is_one_kernel() -> None:
    def fn(x: Any) -> Any:
        return aten.sum.dim_IntList(aten.exp.default(aten.mul.Tensor(x, 2.0)), [1])

    assert check(fn, make((8, 32))).stats.kernels == 1


def test_realized_pointwise_fuses_into_reduction() -> None:
    # the pointwise value is an output (realized), and also feeds a row reduction
    def fn(x: Any) -> Any:
        y = aten.cos.default(x)
        return y, aten.amax.default(y, [1])

    compiled = check(fn, make((8, 32)))
    assert compiled.stats.kernels == 1
    assert check(fn, make((8, 32)), fusion=False).stats.kernels == 2


def test_softmax_at_most_two_kernels() -> None:
    def fn(x: Any) -> Any:
        return aten._softmax.default(x, -1, False)

    compiled = check(fn, make((16, 64)))
    assert compiled.stats.kernels <= 2
    unfused = check(fn, make((16, 64)), fusion=False)
    assert compiled.stats.bytes_moved * 2 < unfused.stats.bytes_moved


def test_decomposed_softmax_at_most_two_kernels() -> None:
    def fn(x: Any) -> Any:
        m = aten.amax.default(x, [1], True)
        e = aten.exp.default(aten.sub.Tensor(x, m))
        return aten.div.Tensor(e, aten.sum.dim_IntList(e, [1], True))

    assert check(fn, make((16, 64))).stats.kernels <= 2


def test_layer_norm_at_most_two_kernels() -> None:
    def fused(x: Any, w: Any, b: Any) -> Any:
        return aten.native_layer_norm.default(x, [64], w, b, 1e-5)[0]

    def decomposed(x: Any, w: Any, b: Any) -> Any:
        var, mean = aten.var_mean.correction(x, [1], correction=0, keepdim=True)
        rstd = aten.rsqrt.default(aten.add.Tensor(var, 1e-5))
        return aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd), w), b)

    args = (make((16, 64)), make((64,)), make((64,)))
    assert check(fused, *args).stats.kernels <= 2
    assert check(decomposed, *args).stats.kernels <= 2


def test_views_produce_no_copies() -> None:
    def fn(x: Any) -> Any:
        t = aten.permute.default(aten.view.default(x, [4, 8, 2]), [2, 0, 1])
        return aten.select.int(aten.slice.Tensor(t, 2, 1, 7), 0, 1)

    compiled = check(fn, make((8, 8)))
    assert compiled.stats.kernels == 0
    assert compiled.stats.buffers == 0
    out = compiled(x := make((8, 8)))
    assert out.data_ptr() != 0 and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_view_between_pointwise_ops_stays_fused() -> None:
    def fn(x: Any) -> Any:
        y = aten.view.default(aten.sin.default(x), [4, 16])
        return aten.mul.Tensor(aten.permute.default(y, [1, 0]), 3)

    assert check(fn, make((8, 8))).stats.kernels == 1


def test_buffer_is_reused() -> None:
    def fn(x: Any, w: Any) -> Any:
        a = aten.mm.default(aten.sin.default(x), w)
        b = aten.mm.default(aten.cos.default(a), w)
        return aten.mm.default(aten.tanh.default(b), w)

    compiled = check(fn, make((8, 8)), make((8, 8)))
    assert compiled.stats.extern_calls == 3
    assert compiled.stats.kernels == 3
    assert compiled.stats.reused >= 1
    assert compiled.stats.buffers == 3


def test_op_without_lowering_becomes_extern_call() -> None:
    def fn(x: Any) -> Any:
        c = aten.cumsum.default(aten.relu.default(x), 1)
        values, indices = aten.sort.default(c, -1, True)
        return aten.add.Tensor(values, 1), indices

    compiled = check(fn, make((4, 6)))
    assert compiled.stats.extern_calls == 2
    assert compiled.stats.kernels == 2
    assert set(compiled.stats.extern_ops) == {"cumsum.default", "sort.default"}


def test_failing_lowering_is_one_extern_call_and_is_logged(caplog: Any, monkeypatch: Any) -> None:
    """A lowering that raises (a bug, or arguments it does not handle) costs only that op: it
    runs eager's kernel, its neighbours are still fused, and KILN_LOG=fallbacks names it."""
    from kiln_loopir import lowering

    lowering._ensure_registered()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("no lowering for these arguments")

    monkeypatch.setitem(lowering.LOWERINGS, aten.tanh.default, broken)

    def fn(x: Any) -> Any:
        return aten.mul.Tensor(aten.tanh.default(aten.add.Tensor(x, 1)), 2)

    with caplog.at_level("INFO", logger="kiln.loopir.fallbacks"):
        compiled = check(fn, make((4, 6)), allow_fallback=True)
    assert set(compiled.stats.extern_ops) == {"tanh.default"}
    assert compiled.stats.kernels == 2  # add before it, mul after it
    assert [op for op, _ in compiled.stats.fallbacks] == ["aten.tanh.default"]
    assert any(
        "aten.tanh.default" in r.getMessage() and "ValueError" in r.getMessage() for r in caplog.records
    )


def test_matmul_conv_and_attention_are_extern_calls() -> None:
    def fn(x: Any, w: Any, img: Any, k: Any) -> Any:
        a = aten.addmm.default(x, x, w)
        c = aten.convolution.default(img, k, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        q = aten.view.default(a, [1, 1, 4, 4])
        s = aten._scaled_dot_product_flash_attention_for_cpu.default(q, q, q)[0]
        return aten.gelu.default(a), aten.relu.default(c), s

    compiled = check(fn, make((4, 4)), make((4, 4)), make((1, 2, 5, 5)), make((3, 2, 3, 3)))
    assert compiled.stats.extern_calls == 3


def test_lowering_that_declines_falls_back() -> None:
    def fn(x: Any, m: Any) -> Any:
        return aten.index.Tensor(x, [m])  # boolean mask: data-dependent shape

    compiled = check(fn, make((5, 3)), torch.tensor([True, False, True, True, False]), allow_fallback=True)
    assert compiled.stats.extern_calls == 1
    assert compiled.stats.fallbacks[0][0] == "aten.index.Tensor"


def test_memory_viewed_by_an_extern_result_is_not_reused() -> None:
    def fn(x: Any, w: Any) -> Any:
        s = aten.sin.default(aten.mm.default(x, w))
        d = aten.diagonal.default(s)  # an extern view of the computed buffer s
        b = aten.mm.default(s, w)  # s's last reader: without the pin, tanh(b) would reuse s
        c = aten.mm.default(aten.tanh.default(b), w)
        return aten.add.Tensor(c, d)

    check(fn, make((8, 8)), make((8, 8)))


def test_in_place_ops_run_as_extern_calls_in_order() -> None:
    def fn(x: Any, y: Any) -> Any:
        before = aten.sin.default(x)  # lazy: must read x before the mutation
        aten.add_.Tensor(x, y)
        after = aten.mul.Tensor(x, 2)
        aten.copy_.default(y, aten.cos.default(before))
        return aten.add.Tensor(before, after), aten.relu.default(y)

    x, y = make((4, 5)), make((4, 5))
    ex, ey = x.clone(), y.clone()
    expected = fn(ex, ey)
    compiled = compile_graph(trace(fn), [x.clone(), y.clone()])
    ax, ay = x.clone(), y.clone()
    actual = compiled(ax, ay)
    assert_same(actual, expected)
    assert_same((ax, ay), (ex, ey))  # the inputs are mutated as eagerly
    assert compiled.stats.extern_calls == 2


def test_addmm_bias_joins_pointwise_readers() -> None:
    # Note [Bias after the GEMM]: every reader is pointwise, so the GEMM runs as mm and the bias
    # add is fused into the GELU kernel (through a view, as a 3-D linear lowers)
    def fn(x: Any, w: Any, b: Any) -> Any:
        a = aten.addmm.default(b, x, w)
        return aten.gelu.default(aten.view.default(a, [2, 3, 5]))

    compiled = check(fn, make((6, 4)), make((4, 5)), make((5,)))
    assert compiled.stats.extern_ops == ("mm.default",)
    assert compiled.stats.kernels == 1


def test_addmm_stays_whole_when_a_reader_is_not_pointwise() -> None:
    def fn(x: Any, w: Any, b: Any) -> Any:
        a = aten.addmm.default(b, x, w)
        return aten.relu.default(a), aten.mm.default(a, aten.t.default(w))

    compiled = check(fn, make((6, 4)), make((4, 5)), make((5,)))
    assert sorted(compiled.stats.extern_ops) == ["addmm.default", "mm.default"]


def test_addmm_with_beta_or_a_matrix_bias_is_still_right() -> None:
    def fn(x: Any, w: Any, b: Any) -> Any:
        scaled = aten.addmm.default(b, x, w, beta=0.5)
        return aten.relu.default(scaled), aten.tanh.default(aten.addmm.default(b, x, w))

    compiled = check(fn, make((6, 4)), make((4, 5)), make((6, 5)))
    assert sorted(compiled.stats.extern_ops) == ["addmm.default", "mm.default"]


def test_transcendental_read_with_broadcast_is_computed_once() -> None:
    # Note [Why a value is realized] (f): cos of a [seq, dim] table read by [batch, heads, seq,
    # dim] is its own kernel, not recomputed per head; a cheap value read the same way is inlined
    def fn(x: Any, f: Any) -> Any:
        c = aten.cos.default(f)
        y = aten.mul.Tensor(x, aten.unsqueeze.default(c, 0))
        s = aten.mul.Tensor(f, 2.0)
        return aten.add.Tensor(y, aten.unsqueeze.default(s, 0))

    gm = trace(fn)
    x, f = make((4, 8, 16)), make((8, 16))

    class Record(torch.fx.Interpreter):  # node.meta["val"], as aotgrad's graphs carry it
        def run_node(self, n: torch.fx.Node) -> Any:
            n.meta["val"] = super().run_node(n)
            return n.meta["val"]

    Record(gm).run(x, f)
    compiled = check(gm, x, f)
    assert compiled.stats.kernels == 2


def _conv_net(x: Any, w1: Any, w2: Any) -> Any:
    a = aten.relu.default(aten.convolution.default(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    b = aten.convolution.default(a, w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return aten.relu.default(b), aten.sum.dim_IntList(b, [2, 3])


def _sin_cos_cat(x: Any) -> Any:
    return aten.cat.default([aten.sin.default(x), aten.cos.default(x)], -1)


def _sin_cos_stack(x: Any) -> Any:
    return aten.cat.default([aten.sin.default(x), aten.cos.default(x)], 0)


def test_cat_of_transcendentals_of_one_input_is_one_kernel() -> None:
    # Note [Why a value is realized] (f): the cat's output is larger than sin's, but reads each
    # element of it once: sin and cos are computed in the cat's kernel, not realized first
    for fn in (_sin_cos_cat, _sin_cos_stack):
        x = make((8, 16))
        compiled = check(with_vals(fn, x), x)
        assert compiled.stats.kernels == 1, fn.__name__
        assert compiled.stats.buffers == 1, fn.__name__
    x = make((8, 16))
    assert check(with_vals(_sin_cos_cat, x), x, fusion=False).stats.kernels == 3

    def pad(x: Any) -> Any:  # padding reads each element once too
        return aten.constant_pad_nd.default(aten.sin.default(x), [2, 6])

    assert check(with_vals(pad, x), x).stats.buffers == 1


def test_transcendental_expanded_into_a_cat_is_still_computed_once() -> None:
    # a view that grows the element count on the way to a cat is a broadcast: rule (f) holds
    def fn(x: Any, f: Any) -> Any:
        c = aten.expand.default(aten.unsqueeze.default(aten.cos.default(f), 0), [4, 8, 16])
        return aten.cat.default([x, c], 0)

    x, f = make((4, 8, 16)), make((8, 16))
    compiled = check(with_vals(fn, x, f), x, f)
    assert compiled.stats.kernels == 2
    sizes = [
        [int(n) for n in op.get_size()] for op in compiled.graph.operations if isinstance(op, ComputedBuffer)
    ]
    assert sizes == [[8, 16], [8, 8, 16]]  # cos, realized, then the cat


def test_cat_of_many_transcendentals_realizes_them() -> None:
    # a cat's kernel evaluates each inlined input on every output element: four exps inlined
    # would be four per element, beyond MASKED_READ_FACTOR; realized, each is computed once
    def fn(x: Any, y: Any) -> Any:
        return aten.cat.default([aten.exp.default(x), aten.exp.default(y), x, y], 0)

    def pad(x: Any) -> Any:
        return aten.constant_pad_nd.default(aten.sin.default(x), [0, 48])

    x, y = make((8, 16)), make((8, 16))
    compiled = check(with_vals(fn, x, y), x, y)
    assert compiled.stats.buffers == 3
    assert check(with_vals(pad, x), x).stats.buffers == 2


def test_cat_and_a_broadcasting_reader_realize_the_transcendental() -> None:
    # one reader that broadcasts is enough: the cat's reading does not excuse it
    def fn(x: Any, f: Any) -> Any:
        c = aten.cos.default(f)
        return aten.cat.default([c, f], 0), aten.mul.Tensor(x, aten.unsqueeze.default(c, 0))

    x, f = make((4, 8, 16)), make((8, 16))
    compiled = check(with_vals(fn, x, f), x, f)
    assert compiled.stats.kernels == 3


def test_bfloat16_mul_then_sum_is_one_kernel() -> None:

    a, b = make((8, 64), torch.bfloat16), make((8, 64), torch.bfloat16)
    assert check(with_vals(mul_sum, a, b), a, b).stats.kernels == 1
    a, b = make((256, 8)), make((256, 8))
    assert check(with_vals(downcast_mul_sum, a, b), a, b).stats.kernels == 1


def test_inference_convolutions_run_channels_last() -> None:
    # Note [Channels-last for convolutions]: activations outweigh the weights, grad mode is off
    inputs = (make((4, 3, 16, 16)), make((8, 3, 3, 3)), make((8, 8, 3, 3)))
    gm = with_vals(_conv_net, *inputs)
    with torch.no_grad():
        compiled = check(gm, *inputs)
        assert compiled.graph.channels_last
        out = compiled(*inputs)
    assert out[0].stride() == gm(*inputs)[0].stride()  # outputs keep eager's strides
    second_conv = [n for n in compiled.graph.operations if "convolution" in str(getattr(n, "op", ""))][1]
    assert second_conv.args[0].layout.stride[1] == 1  # its input is NHWC


def test_channels_last_is_not_chosen_for_training_or_heavy_weights() -> None:
    inputs = (make((4, 3, 16, 16)), make((8, 3, 3, 3)), make((8, 8, 3, 3)))
    gm = with_vals(_conv_net, *inputs)
    # grad mode on: a training graph; Note [Channels-last in CPU training] takes it channels-last
    # (its inputs outweigh its weights) unless switched off, or unless its convolutions are small
    # enough for PyTorch's native kernel (Note [Small convolutions keep eager's layouts in CPU
    # training]), which these are
    count_only = {"native_small_conv": False}
    assert not check(gm, *inputs, options={**count_only, "cpu_layout_training": False}).graph.channels_last
    assert check(gm, *inputs, options=count_only).graph.channels_last
    native = check(gm, *inputs, tolerances={torch.float32: (1e-4, 2e-4)})  # an im2col GEMM's sums
    assert not native.graph.channels_last and native.graph.native_convs
    heavy = (make((1, 3, 4, 4)), make((64, 3, 3, 3)), make((64, 64, 3, 3)))
    gm = with_vals(_conv_net, *heavy)
    with torch.no_grad():
        # the weight rule holds for weights reordered every call (the default: prepacking is
        # opt-in, Note [Prepacked weights]); prepacked ones (conv_fusion with conv_prepack, Note
        # [Convolutions through oneDNN]) are not, so with them the graph goes NHWC
        assert not check(gm, *heavy, options={"conv_fusion": False}).graph.channels_last
        expected = gm(*heavy)
        for prepack, why in ((False, "weigh less than weights"), (True, "through oneDNN")):
            _, ctx = run_passes(gm, list(heavy), torch.device("cpu"), {"conv_prepack": prepack})
            (decision,) = [text for name, text in ctx.record if name == "layout"]
            assert why in decision, decision
            compiled = compile_graph(gm, list(heavy), options={"conv_prepack": prepack})
            # oneDNN's convolution sums its 576 products in another order than eager's
            for got, want in zip(compiled(*heavy), expected, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-4)
