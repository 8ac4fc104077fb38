"""Single convolutions, forward and backward, through oneDNN and through PyTorch's native kernel.

Note [Small convolutions outside oneDNN] (kiln_loopir's passes/native_conv.py): eager's CPU
``convolution`` goes through oneDNN, whose per-call cost dominates convolutions of a few thousand
outputs; ``torch.backends.mkldnn.flags(enabled=False)`` sends the same call to PyTorch's own
im2col-and-GEMM kernel (``_slow_conv2d_forward`` / ``_slow_conv2d_backward``), which kiln calls
for such convolutions. This prints, per shape (batch 2, float32), the median time of each path's
forward and backward (all three gradients) and the native / oneDNN ratio, with the shape's
multiply-adds, so the pass's threshold (``NATIVE_CONV_MAX_MACS``) can be checked on a machine.
A benchmark, not a test.

    python packages/codegen_cpp/bench/small_conv.py --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch

aten = torch.ops.aten

# (in channels, out channels, kernel, stride, padding, map size): PVT v2's patch embeddings and
# spatial reductions at 32 px first, then larger ones around the crossover
SHAPES = [
    (3, 8, 7, 4, 3, 32),
    (8, 16, 3, 2, 1, 8),
    (16, 32, 3, 2, 1, 4),
    (32, 64, 3, 2, 1, 2),
    (8, 8, 8, 8, 0, 8),
    (16, 16, 4, 4, 0, 4),
    (3, 16, 4, 4, 0, 64),
    (16, 32, 3, 2, 1, 16),
    (8, 8, 3, 1, 1, 32),
    (32, 32, 3, 1, 1, 8),
    (64, 128, 3, 2, 1, 8),
    (64, 64, 1, 1, 0, 16),
    (16, 16, 3, 1, 1, 32),
    (64, 64, 3, 1, 1, 8),
    (64, 64, 3, 1, 1, 16),
]


def _time(fn: Callable[[], object], calls: int, rounds: int, clock: Callable[[], float]) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(rounds):
        start = clock()
        for _ in range(calls):
            fn()
        samples.append((clock() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"{args.threads} thread(s), {args.clock} clock, us a call (median), batch 2, float32")
    for cin, cout, k, s, p, hw in SHAPES:
        x, w, b = torch.randn(2, cin, hw, hw), torch.randn(cout, cin, k, k), torch.randn(cout)
        conv_args = ([s, s], [p, p], [1, 1], False, [0, 0], 1)
        times = []
        for onednn in (True, False):
            with torch.backends.mkldnn.flags(enabled=onednn):
                y = aten.convolution(x, w, b, *conv_args)
                gy = torch.randn_like(y)
                fwd = _time(
                    functools.partial(aten.convolution, x, w, b, *conv_args), args.calls, args.rounds, clock
                )
                backward = functools.partial(
                    aten.convolution_backward, gy, x, w, [cout], *conv_args, [True] * 3
                )
                times.append((fwd, _time(backward, args.calls, args.rounds, clock)))
        macs = y.numel() * cin * k * k
        (of, ob), (nf, nb) = times
        print(
            f"{cin:>3}->{cout:<3} {k}x{k}/{s} on {hw:>2} px  {macs / 1e6:6.3f}M MACs  "
            f"oneDNN {of:6.0f} + {ob:6.0f}  native {nf:6.0f} + {nb:6.0f}  "
            f"native/oneDNN {(nf + nb) / (of + ob):.2f}"
        )


if __name__ == "__main__":
    main()
