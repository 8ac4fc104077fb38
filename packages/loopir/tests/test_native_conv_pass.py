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
