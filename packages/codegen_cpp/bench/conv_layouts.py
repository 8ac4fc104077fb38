"""Each 2-D convolution of a model, forward + backward alone, in NCHW and in NHWC at one thread.

Note [Depthwise convolution backwards on small maps] (kiln_loopir's passes/channels_last.py): which
layout oneDNN runs a convolution's backward fastest in depends on the convolution (depthwise or
not, kernel size, padding) and its map size, and the layout rules weigh that per graph or per
call. This lists a model's convolutions as its forward calls them (``nn.Conv2d`` forward hooks:
input, weight, groups, stride, padding, output), with the elements the CPU training rule counts
(Note [Channels-last in CPU training]), and with ``--time`` times each one's forward + backward
(``autograd.grad`` of input and weight) on random operands, the input NCHW and then NHWC, the
weight contiguous as kiln leaves it on the CPU: the median process CPU time of ``--steps`` calls
and the NHWC / NCHW ratio. ``ONEDNN_VERBOSE=1`` in the environment prints which oneDNN kernel ran
each (``jit_dw`` is its depthwise kernel). Models: ``train1.py``'s names, or ``b.<name>`` for the
breadth suite's (``packages/dynamo/bench/breadth_models.py``). A benchmark, not a test.

    python packages/codegen_cpp/bench/conv_layouts.py --models convnext_v2,b.efficientnet --time
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "dynamo", "bench"))

Conv = tuple[tuple[int, ...], tuple[int, ...], int, Any, Any, tuple[int, ...]]


def _model(name: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    if name.startswith("b."):
        import breadth_models

        model, inputs, _ = breadth_models.MODELS[name[2:]]()
        return model.train(), inputs
    import train1

    w = train1.MODELS[name]()
    return w.model.train(), w.inputs


def convolutions(name: str) -> list[Conv]:
    """(input shape, weight shape, groups, stride, padding, output shape) of each call."""
    model, inputs = _model(name)
    found: list[Conv] = []

    def hook(mod: Any, args: Any, out: torch.Tensor) -> None:
        found.append(
            (
                tuple(args[0].shape),
                tuple(mod.weight.shape),
                mod.groups,
                mod.stride,
                mod.padding,
                tuple(out.shape),
            )
        )

    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    model(**inputs)
    for h in hooks:
        h.remove()
    return found


def time_conv(conv: Conv, channels_last: bool, steps: int) -> float:
    """Median CPU seconds of one forward + backward."""
    x_shape, w_shape, groups, stride, padding, _ = conv
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(x_shape).contiguous(memory_format=fmt).requires_grad_()
    w = torch.randn(w_shape, requires_grad=True)

    def call() -> None:
        y = torch.nn.functional.conv2d(x, w, None, stride, padding, 1, groups)
        torch.autograd.grad(y, (x, w), torch.ones_like(y))

    for _ in range(3):
        call()
    times = []
    for _ in range(steps):
        t0 = time.process_time()
        call()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="convnext_v2")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.models.split(","):
        convs = convolutions(name)
        inputs = sum(torch.Size(c[0]).numel() for c in convs)
        weights = sum(torch.Size(c[1]).numel() for c in convs)
        print(f"== {name}: {len(convs)} convs, inputs {inputs} / weights {weights} = {inputs / weights:.2f}")
        totals = [0.0, 0.0]
        for conv in convs:
            x, w, groups, stride, padding, out = conv
            kind = "dw " if groups > 1 and w[1] == 1 else ("grp" if groups > 1 else "   ")
            line = f"  {kind} x{list(x)} w{list(w)} s{tuple(stride)} p{tuple(padding)} -> {list(out)}"
            if args.time:
                a, b = time_conv(conv, False, args.steps), time_conv(conv, True, args.steps)
                totals[0] += a
                totals[1] += b
                line += f"  nchw {a * 1e6:6.0f} us  nhwc {b * 1e6:6.0f} us  {b / a:.2f}x"
            print(line)
        if args.time:
            print(f"  sum: nchw {totals[0] * 1e3:.2f} ms, nhwc {totals[1] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
