"""Note [Small convolutions outside oneDNN]: which convolutions of a CPU training graph the
native_small_conv pass hands to PyTorch's native kernel, and their values against eager."""

from __future__ import annotations

from typing import Any

import torch
from helpers import check, make

from kiln_loopir.passes import run_passes
from kiln_loopir.testing import with_vals

aten = torch.ops.aten


def convs(x: Any, w: Any, b: Any, grad: Any, dw: Any, big_x: Any, big_w: Any) -> Any:
    # a small convolution of x read as (N, H, W, C), through channels-last strides as PVT's are
    xt = aten.permute.default(x, [0, 3, 1, 2])
    small = aten.convolution.default(aten.mul.Tensor(xt, 2.0), w, b, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    gi, gw, gb = aten.convolution_backward.default(
        grad, x, w, [16], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]
    )
    _, only_gw, _ = aten.convolution_backward.default(
        grad, x, w, [16], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]
    )
    depthwise = aten.convolution.default(x, dw, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 8)
    big = aten.convolution.default(big_x, big_w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return aten.relu.default(small), gi, gw, gb, only_gw, depthwise, big


def _inputs() -> list[torch.Tensor]:
    return [
        make((2, 8, 8, 8)),
        make((16, 8, 3, 3)),
        make((16,)),
        make((2, 16, 4, 4)),
        make((8, 1, 3, 3)),
        make((2, 64, 16, 16)),
        make((64, 64, 3, 3)),
    ]


def _records(compiled: Any) -> list[str]:
    return [text for name, text in compiled.passes.record if name == "native_small_conv"]


def test_small_convolutions_and_backwards_run_natively_with_eagers_values() -> None:
    xs = _inputs()
    on = check(with_vals(convs, *xs), *xs, tolerances={torch.float32: (1e-4, 1e-4)})
    lines = _records(on)
    assert len(lines) == 3 and all("native kernel" in line for line in lines), lines
    assert not any("[2, 64, 16, 16]" in line or "[8, 1, 3, 3]" in line for line in lines), lines
    _, ctx = run_passes(with_vals(convs, *xs), xs, torch.device("cpu"), inference=False)
    assert sorted(n.name for n in ctx.native_convs) == [
        "convolution_backward_default",
        "convolution_backward_default_1",
        "convolution_default",
    ]


def test_switched_off_inference_and_channels_last_keep_onednn() -> None:
    xs = _inputs()
    off = check(with_vals(convs, *xs), *xs, options={"native_small_conv": False})
    assert _records(off) == ["off (option native_small_conv=False)"]
    _, inference = run_passes(with_vals(convs, *xs), xs, torch.device("cpu"), inference=True)
    assert not inference.native_convs
    _, forced = run_passes(
        with_vals(convs, *xs), xs, torch.device("cpu"), {"cpu_layout_training": "force"}, inference=False
    )
    assert forced.channels_last and not forced.native_convs & forced.channels_last


def _stem(x: Any, w: Any, dw: Any) -> Any:
    """A small convolution, then a depthwise one."""
    y = aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return aten.convolution.default(y, dw, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 16)


def _stem_and_two(x: Any, w: Any, dw: Any, m1: Any, m2: Any) -> Any:
    """The stem, then two small 1x1 convolutions."""
    y = _stem(x, w, dw)
    y = aten.convolution.default(y, m1, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    return aten.convolution.default(y, m2, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)


def test_graphs_mostly_of_small_convolutions_keep_eagers_layouts() -> None:
    """Note [Small convolutions keep eager's layouts in CPU training]: the element count alone
    picks NHWC for both graphs (inputs of 16 x 16 maps outweigh the weights); with three in four
    convolutions small enough for the native kernel the graph keeps eager's layouts, with one in
    two it does not."""

    def decide(fn: Any, n_more: int, native: bool) -> Any:
        xs = [make((2, 8, 16, 16)), make((16, 8, 3, 3)), make((16, 1, 3, 3))]
        xs += [make((16, 16, 1, 1)) for _ in range(n_more)]
        options = {"native_small_conv": native}
        _, ctx = run_passes(with_vals(fn, *xs), xs, torch.device("cpu"), options, inference=False)
        return ctx

    half, most = decide(_stem, 0, True), decide(_stem_and_two, 2, True)
    off = decide(_stem_and_two, 2, False)
    assert half.channels_last and not half.native_convs  # 1 small of 2: the count's NHWC
    assert off.channels_last and not off.native_convs
    assert not most.channels_last and len(most.native_convs) == 3  # 3 small of 4


def _scaled_and_convolved(x: Any, w: Any) -> Any:
    """A pointwise value of a channels-last input, returned and read by a small convolution."""
    t = aten.mul.Tensor(x, 2.0)
    return aten.convolution.default(t, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), t


def _scaled_read_through_storage(x: Any, w: Any) -> Any:
    """The same value read by as_strided (through its storage, with eager's strides) after the
    convolution."""
    t = aten.mul.Tensor(x, 2.0)
    y = aten.convolution.default(t, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return y, aten.mul.Tensor(aten.as_strided.default(t, [3, 4], [1, 3], 2), 1.0)


def test_a_value_eager_lays_out_keeps_its_layout_beside_a_native_convolution() -> None:
    """Note [A layout only lowerings read]: the native kernel wants its input NCHW and the
    lowering computed a lazy input so; a value that also leaves the graph came out NCHW where
    eager's is channels-last (layout fuzzer seed 1404), and one as_strided reads through its
    storage was read in the wrong order (a wrong answer). Both now keep eager's layout, and the
    convolution reads a copy."""
    xs = [make((2, 4, 8, 5)).contiguous(memory_format=torch.channels_last), make((16, 4, 3, 3))]
    for fn in (_scaled_and_convolved, _scaled_read_through_storage):
        gm = with_vals(fn, *xs)
        _, ctx = run_passes(gm, xs, torch.device("cpu"), inference=False)
        assert len(ctx.native_convs) == 1 and not ctx.channels_last
        compiled = check(gm, *xs)
        out = compiled(*xs)
        assert out[1].stride() == fn(*xs)[1].stride()


def _backward_on_a_point(grad: Any, x: Any, w: Any) -> Any:
    """A convolution backward over a 1x1 map (a 3x3 kernel, padded)."""
    gi, gw, _ = aten.convolution_backward.default(
        grad, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]
    )
    return gi, gw


def test_a_native_backward_gets_exactly_contiguous_strides_on_a_one_pixel_map() -> None:
    """Note [Size-1 dims and the native kernels' layouts]: the saved input of a convolution over
    a 1x1 map came with eager's channels-last strides (6, 1, 6, 6), the same memory as NCHW's
    but what torch's native backward takes for channels-last, whereupon it refused its own weight
    gradient ("slow_conv2d: grad_weight must be contiguous"; CPU convolution fuzzer seed 1043)."""
    xs = [
        make((3, 6, 1, 1)),
        torch.empty_strided((3, 6, 1, 1), (6, 1, 6, 6)).copy_(make((3, 6, 1, 1))),
        make((6, 6, 3, 3)),
    ]
    gm = with_vals(_backward_on_a_point, *xs)
    _, ctx = run_passes(gm, xs, torch.device("cpu"), inference=False)
    assert len(ctx.native_convs) == 1
    check(gm, *xs)
