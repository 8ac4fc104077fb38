"""Small programs under symbolic sizes, compiled and compared with eager: a sweep for wrong answers.

Each probe is a function of a tensor (and, for the `int` family, a Python int) that uses sizes the
way real code does: as slice bounds, view shapes, scalars in arithmetic (`x + (-n) // 4`), in
comparisons (`x.shape == (b, t)`, `n in (2, 4)`), in `arange`/`pad`/`roll`/`narrow`, and in
Python logic (`max`, `divmod`, f-strings, `sorted`, `enumerate`). Every probe runs under
`dynamic=None` (static first, then automatic dynamic) and `dynamic=True`, at several sizes, on the
chosen code generators, and its result (tensors, Python values and their types) is compared with
eager's. A mismatch is printed with the size and the first line of the difference.

The eleventh session's sweep found three wrong answers this way (Note [The bounds of arange],
Note [Equality of sizes and sequences], Note [Floor division of values that may be negative]),
each now a test in packages/kiln/tests/test_dynamic.py.

    python packages/kiln/bench/dynamic_probes.py [--backends cpp,triton] [--only NAME,...]

`triton` runs under Triton's interpreter (the script sets TRITON_INTERPRET=1). Some probes are
numerically ill-conditioned on purpose (a division by a row sum near zero): a mismatch there is
judged against float64 before it is reported as wrong.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

import kiln

Probe = Callable[..., Any]
TENSOR_PROBES: list[Probe] = []
INT_PROBES: list[Probe] = []


def probe(fn: Probe) -> Probe:
    TENSOR_PROBES.append(fn)
    return fn


def int_probe(fn: Probe) -> Probe:
    INT_PROBES.append(fn)
    return fn


# --- operators over symbolic sizes -----------------------------------------------------------
@probe
def pad_reflect(x: torch.Tensor) -> Any:
    return F.pad(x.unsqueeze(0), (2, 3), mode="reflect").squeeze(0)


@probe
def pad_modes(x: torch.Tensor) -> Any:
    y = x.unsqueeze(0)
    return torch.cat([F.pad(y, (1, 2), mode=m) for m in ("replicate", "circular")], -1)


@probe
def cumsum_topk_sort(x: torch.Tensor) -> Any:
    return x.cumsum(1) + x.topk(2, dim=-1).values.sum(-1, keepdim=True) + x.sort(dim=0).values[0]


@probe
def roll_flip_repeat(x: torch.Tensor) -> Any:
    return torch.roll(x, shifts=1, dims=0) + x.flip(0) + x.repeat(2, 1)[: x.shape[0]]


@probe
def index_gather_scatter(x: torch.Tensor) -> Any:
    rev = x.index_select(0, torch.arange(x.shape[0] - 1, -1, -1))
    g = x.gather(1, (x.abs() * 3).long().clamp(max=x.shape[1] - 1))
    s = torch.zeros(1, x.shape[1]).scatter_add(0, torch.zeros_like(x, dtype=torch.long), x)
    return rev + g + s


@probe
def norms_and_softmax(x: torch.Tensor) -> Any:
    return F.normalize(x, dim=0) + F.layer_norm(x, x.shape[1:]) + x.softmax(0) * x.log_softmax(1)


@probe
def interpolate_and_pool(x: torch.Tensor) -> Any:
    up = F.interpolate(x[None, None], scale_factor=2, mode="bilinear", align_corners=False)[0, 0]
    return up.sum() + F.avg_pool1d(x[None], 2, ceil_mode=True).sum() + F.max_pool1d(x[None], 3, 2, 1).sum()


@probe
def arange_bounds(x: torch.Tensor) -> Any:
    n = x.shape[0]
    return (
        x[:, 0] * torch.arange(n, dtype=x.dtype)
        + torch.arange(n, 3 * n + 1, 2)[:n]
        + torch.arange(-3, n)[-n:]
    )


@probe
def scalar_floor_division(x: torch.Tensor) -> Any:
    n = x.shape[0]
    return x + (-n) // 4 + (n - 7) // 3 + (1 - n) % 3


@probe
def views_and_slices(x: torch.Tensor) -> Any:
    n = x.shape[0]
    return (
        x.narrow(0, n // 2, n - n // 2).sum(0) + x[::2].sum(0) + x[-2:].sum(0) + x.unfold(1, 2, 1).sum(-1)[0]
    )


@probe
def losses(x: torch.Tensor) -> Any:
    t = torch.arange(x.shape[0]) % x.shape[1]
    return (
        F.cross_entropy(x, t)
        + F.mse_loss(x, x.flip(0))
        + F.binary_cross_entropy_with_logits(x, (x > 0).float())
    )


@probe
def inplace_and_new(x: torch.Tensor) -> Any:
    y = x.clone()
    y[1:] += y[:-1]
    z = x.new_zeros(x.shape[0] * 2, 3)
    z[::2] = x[:, :3]
    return y.sum(0), z


# --- Python logic over sizes ------------------------------------------------------------------
@probe
def size_comparisons(x: torch.Tensor) -> Any:
    n = x.size(0)
    h = torch.zeros(1, n, 8)
    return x + 1, (
        h.size() == (1, n, 8),
        x.shape[:1] == (n,),
        [n] == [x.shape[0]],
        n in (4, 7),
        [n, 1].count(n),
    )


@probe
def size_builtins(x: torch.Tensor) -> Any:
    n = x.shape[0]
    q, r = divmod(n, 3)
    return x * max(n, 4) + min(n, 3), (q, r, math.ceil(n / 2), int(n * 0.5), round(n / 3), sum(x.shape))


@probe
def size_text_and_order(x: torch.Tensor) -> Any:
    return x + 1, (
        f"n={x.shape[0]}",
        str(x.shape),
        sorted([x.shape[1], x.shape[0], 5]),
        list(reversed(x.shape)),
    )


@probe
def size_branches(x: torch.Tensor) -> Any:
    y = x * 2 if x.shape[0] % 2 == 0 else x * 3
    return y, (2 < x.shape[0] <= 5, any(s > 5 for s in x.shape), len(x), x.numel())


# --- Python ints as inputs --------------------------------------------------------------------
@int_probe
def int_slices(x: torch.Tensor, n: int) -> Any:
    return x[:n] * 2 + x.narrow(0, n - 1, 1) - x[:1].repeat(n, 1)


@int_probe
def int_arithmetic(x: torch.Tensor, n: int) -> Any:
    return x + (3 - n) // 2 + (n - 10) % 4 + torch.full((1, x.shape[1]), n / 3)


@int_probe
def int_shapes(x: torch.Tensor, n: int) -> Any:
    return F.pad(x, (n, n - 1)), torch.roll(x, -n, 0), x.reshape(n, -1).sum(0), x.split(n, 0)[0]


@int_probe
def int_logic(x: torch.Tensor, n: int) -> Any:
    return (x * 2 if n > 3 else x * 3), x.shape[:1] == (n * 2,), n in (2, 4)


TENSOR_SIZES = ((4, 6), (5, 6), (7, 8), (6, 10))
INT_SIZES = ((8, 2), (8, 3), (12, 4), (10, 5), (6, 3))


def same(got: Any, want: Any, fn: Probe, args: tuple[Any, ...]) -> None:
    """Raise unless ``got`` is eager's ``want``: types, shapes, dtypes and values (a tensor that is
    not close is judged against float64 before it counts as wrong)."""
    assert type(got) is type(want), f"type {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.shape == want.shape and got.dtype == want.dtype, f"{got.shape}/{got.dtype} != {want.shape}"
        try:
            torch.testing.assert_close(got, want, equal_nan=True)
        except AssertionError:
            truth = fn(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])
            truth = truth[0] if isinstance(truth, tuple) else truth
            if not isinstance(truth, torch.Tensor) or truth.shape != want.shape:
                raise
            eager_err = (want.double() - truth).abs().max().item()
            kiln_err = (got.double() - truth).abs().max().item()
            if kiln_err > 4 * eager_err + 1e-6:
                raise
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want), f"length {len(got)} != {len(want)}"
        for g, w in zip(got, want, strict=True):
            same(g, w, fn, args)
    else:
        assert got == want, f"{got!r} != {want!r}"


def run(backends: list[str], only: set[str] | None) -> int:
    wrong = 0
    families: list[tuple[list[Probe], tuple[tuple[int, int], ...], bool]] = [
        (TENSOR_PROBES, TENSOR_SIZES, False),
        (INT_PROBES, INT_SIZES, True),
    ]
    count = 0
    for backend in backends:
        for probes, sizes, with_int in families:
            for fn in probes:
                if only and fn.__name__ not in only:
                    continue
                count += 1
                for dynamic in (None, True):
                    kiln.reset()
                    compiled = kiln.compile(fn, dynamic=dynamic, options={"cpu_backend": backend})
                    for a, b in sizes:
                        torch.manual_seed(a * 31 + b)
                        args: tuple[Any, ...] = (torch.randn(a, 6), b) if with_int else (torch.randn(a, b),)
                        try:
                            want = fn(*[t.clone() if isinstance(t, torch.Tensor) else t for t in args])
                        except Exception:
                            continue  # eager rejects this size
                        try:
                            same(compiled(*args), want, fn, args)
                        except Exception as e:
                            wrong += 1
                            first = str(e).splitlines()[0][:160] if str(e) else ""
                            print(f"MISMATCH {backend} {fn.__name__} dynamic={dynamic} sizes={(a, b)}: "
                                  f"{type(e).__name__}: {first}", flush=True)  # fmt: skip
                            break
    print(f"{count} probe runs over {', '.join(backends)}: {wrong} mismatches")
    return wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="cpp,triton")
    parser.add_argument("--only", default="", help="comma-separated probe names")
    args = parser.parse_args()
    only = {s for s in args.only.split(",") if s} or None
    raise SystemExit(1 if run(args.backends.split(","), only) else 0)


if __name__ == "__main__":
    main()
