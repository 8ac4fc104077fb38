"""Guards from slices, views and reshapes of symbolic sizes: kiln's compiles against torch.compile's.

Each case (the patterns of transformers code, Note [Guards from slices and views of symbolic
sizes] in packages/kiln/tests/test_dynamic.py) is compiled with `dynamic=True` and called at the
sizes of dim 1 given by `--sizes` (default 9, 8, 7, 5, 4, 3, 2, 1, 0); a size where eager raises is
skipped for both. Counted: kiln's graphs (kiln_dynamo's counter) and torch.compile's frames (its
`CompileCounterWithBackend`, `--torch-backend`, default aot_eager). Every kiln result is compared
with eager (values, shapes; strides where the result is not empty). `KILN_LOG=recompiles` and
`TORCH_LOGS=recompiles` print the guard that failed at each recompile.

    python packages/kiln/bench/slice_guards.py [--cases inner,shift] [--sizes 9,8,7,5,4,3,2] [--no-torch]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

import kiln
import kiln_dynamo

F = torch.nn.functional
CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "inner": lambda x: x[:, 1 : x.size(1) - 1] * 2,
    "inner_view": lambda x: x[:, 1 : x.size(1) - 1],
    "inner_sum": lambda x: x[:, 1 : x.size(1) - 1].sum(1),
    "inner_contiguous": lambda x: x[:, 1 : x.size(1) - 1].contiguous(),
    "inner_softmax": lambda x: x[:, 1 : x.size(1) - 1].softmax(-1),
    "inner_times_tail": lambda x: x[:, 1 : x.size(1) - 1] * x[:, 2:],
    "shift": lambda x: x[:, :-1] + x[:, 1:],
    "rotate_half": lambda x: torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1),
    "last": lambda x: x[:, -1] * 2,
    "last_two": lambda x: x[:, -2:] * 2,
    "narrow": lambda x: x.narrow(1, 1, x.size(1) - 1) * 2,
    "step2": lambda x: x[:, ::2] * 2,
    "from2": lambda x: x[:, 2:] * 2,
    "upto3": lambda x: x[:, :3] * 2,
    "view_heads": lambda x: x.view(x.size(0), 2, -1).transpose(1, 2).reshape(x.size(0) * 2, -1),
    "expand": lambda x: x[:, None, :, None].expand(x.size(0), 2, x.size(1), x.size(1)).sum(),
    "chunk": lambda x: sum(c.sum() for c in x.chunk(2, dim=1)),
    "split": lambda x: sum(c.sum() for c in x.split(2, dim=1)),
    "causal_mask": lambda x: torch.tril(torch.ones(x.size(1), x.size(1))) @ x.T,
    "unfold": lambda x: x.unfold(1, 2, 1).sum(-1),
    "pad": lambda x: F.pad(x, (0, 1))[:, 1:],
    "negative_start": lambda x: x[:, -(x.size(1) - 1) :] * 2,
    "roll": lambda x: x.roll(1, 1),
    "flip": lambda x: x.flip(1)[:, 1:],
}
EVEN = {"view_heads"}  # dim 1 is 2 * size


def _inputs(name: str, sizes: list[int]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(4 if n != 4 else 6, 2 * n if name in EVEN else n, generator=gen) for n in sizes]


def _eager_ok(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor | None:
    try:
        return fn(x)
    except RuntimeError:
        return None


def kiln_compiles(name: str, sizes: list[int]) -> int:
    fn = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    with torch.no_grad():
        for x in _inputs(name, sizes):
            expected = _eager_ok(fn, x)
            if expected is None:
                continue
            out = compiled(x)
            torch.testing.assert_close(out, expected)
            if expected.numel() and out.stride() != expected.stride():
                raise AssertionError(
                    f"{name} at {tuple(x.shape)}: strides {out.stride()} != {expected.stride()}"
                )
    return kiln_dynamo.counters.graphs


def torch_compiles(name: str, sizes: list[int], backend: str) -> int:
    import torch._dynamo  # the baseline only (DESIGN.md: benches may call torch.compile)
    import torch._dynamo.testing

    fn = CASES[name]
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, dynamic=True, backend=counter)
    with torch.no_grad():
        for x in _inputs(name, sizes):
            if _eager_ok(fn, x) is not None:
                compiled(x)
    return int(counter.frame_count)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--sizes", default="9,8,7,5,4,3,2,1,0")
    parser.add_argument("--torch-backend", default="aot_eager")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'case':18s} {'kiln':>5s} {'torch':>6s}")
    for name in args.cases.split(","):
        k = kiln_compiles(name, sizes)
        t = "-" if args.no_torch else str(torch_compiles(name, sizes, args.torch_backend))
        print(f"{name:18s} {k:5d} {t:>6s}", flush=True)


if __name__ == "__main__":
    main()
