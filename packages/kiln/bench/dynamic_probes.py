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

The twentieth session added `interpolate_by_scale` and `roots_and_powers_of_sizes` (floats and
ints of sizes that used to compile static per size).

The seventeenth session added two families over a varying batch / row count: max pooling
(values only, with indices, ties, NaN and -inf; training through a conv/BN/ReLU stem with
overlapping and 2x2 windows) on [n, 3, h, h], and layer norm / var_mean / group, batch and
instance norm on [n, 40], values far from zero (the shifted Welford sums). A `train_*` probe is
compared on its outputs, the gradients of its input and of the modules' parameters (a fixed
random weighting of the outputs), and the modules' state after the call (running statistics).
`--counts` also prints how many graphs kiln and torch.compile (backend "eager") capture for the
same calls; that found Note [Guards on NaN and signed zeros] (a `torch.nan` read from a global
recompiled on every call).

    python packages/kiln/bench/dynamic_probes.py [--backends cpp,triton] [--only NAME,...] [--counts]

`triton` runs under Triton's interpreter (the script sets TRITON_INTERPRET=1). Some probes are
numerically ill-conditioned on purpose (a division by a row sum near zero): a mismatch there is
judged against float64 (the same call with float64 inputs and modules) before it is reported
as wrong: an error over four times eager's is.
"""

from __future__ import annotations

import argparse
import contextlib
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
def interpolate_by_scale(x: torch.Tensor) -> Any:
    # Note [Integers of floats of sizes] (kiln_symbolic): the output size trunc(float(n) * 1.5)
    y = x[None, None]
    return (
        F.interpolate(y, scale_factor=1.5, mode="nearest"),
        F.interpolate(y, scale_factor=(1.5, 0.7), mode="bilinear", align_corners=True),
        F.interpolate(y, scale_factor=1 / 3, mode="bilinear"),
        int(x.shape[0] * 1.5),
    )


@probe
def roots_and_powers_of_sizes(x: torch.Tensor) -> Any:
    # Note [Floats of sizes remember their operation] (kiln_symbolic): C's sqrt / pow of doubles
    e = x.shape[-1]
    q = x[None, None]
    return (
        x / math.sqrt(e) + x * e**-0.5 + torch.sym_sqrt(e),
        F.scaled_dot_product_attention(q, q * 2, q + 1),
    )


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
        x.narrow(0, n // 2, n - n // 2).sum(0)
        + x[::2].sum(0)
        + x[-2:].sum(0)
        + x.unfold(1, 2, 2).sum(-1)[0].repeat(2)
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
    y[1:] += y[:-1].clone()  # eager refuses the overlapping in-place add (kiln and torch.compile run it)
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


# --- what the seventeenth session touched, under a symbolic batch / row count ------------------
# Max pooling (Note [Max pooling values without their indices], Note [Overlapping max pooling
# backward on the CPU]), the var/mean merge (Note [One Welford for a variance and its mean]) and
# the shifted Welford sums of the C++ generator. `image` probes take [n, 3, 9, 9] (n varies),
# `row` probes [n, 40] (n varies; 40 is not a multiple of the vector width). `train_*` probes
# also compare the gradients of the input and of the parameters, and the modules' buffers.
IMAGE_PROBES: list[Probe] = []
ROW_PROBES: list[Probe] = []
TRAIN_MODULES: list[torch.nn.Module] = []
TRITON_JUDGE = False  # set while the triton backend runs (see `same`)


def image_probe(fn: Probe) -> Probe:
    IMAGE_PROBES.append(fn)
    return fn


def row_probe(fn: Probe) -> Probe:
    ROW_PROBES.append(fn)
    return fn


def _module(m: torch.nn.Module) -> torch.nn.Module:
    TRAIN_MODULES.append(m)
    return m


torch.manual_seed(0)
_STEM = _module(
    torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
)
_LN = torch.nn.LayerNorm(40)
with torch.no_grad():
    _LN.weight.normal_()
    _LN.bias.normal_()
_module(_LN)


@image_probe
def max_pool_values(x: torch.Tensor) -> Any:
    # inference: only the values are read (the plain-maximum form), fused with a ReLU and a mean
    return F.max_pool2d(x.relu(), 3, 2, 1).mean((2, 3)), F.max_pool2d(x, 2), F.max_pool2d(x, 3, 2, 0, 2)


@image_probe
def max_pool_ties_and_nan(x: torch.Tensor) -> Any:
    # ties (first maximum), -0.0 against 0.0, a NaN that wins, a window of all -inf
    y = (x * 2).round() * 0.0 + (x * 2).round()
    y = torch.where(x > 1.5, torch.nan, y)
    y = torch.where(x < -1.8, -torch.inf, y)
    return F.max_pool2d(y, 3, 2, 1), F.max_pool2d(-(y.clamp(-1, 0)), 2, 2, ceil_mode=True)


@image_probe
def max_pool_indices(x: torch.Tensor) -> Any:
    v, i = F.max_pool2d((x * 2).round(), 3, 2, 1, return_indices=True)
    w, j = F.max_pool2d(x, 2, return_indices=True)
    return v, i, w, j


@image_probe
def train_max_pool(x: torch.Tensor) -> Any:
    # the ResNet stem: overlapping windows (the CPU's extern backward) and 2x2 ones (a gather)
    h = _STEM(x)
    return F.max_pool2d(h, 3, 2, 1).sum((2, 3)) + F.max_pool2d(h, 2).amax((2, 3))


@image_probe
def train_max_pool_ties(x: torch.Tensor) -> Any:
    # ties in the input: the gradient goes to eager's first maximum
    return F.max_pool2d((x * 2).round() * x.new_ones(()), 3, 2, 1, dilation=1), F.max_pool2d(
        x.relu(), 3, 1, 1
    )


@row_probe
def layer_norm_rows(x: torch.Tensor) -> Any:
    return F.layer_norm(x, (40,)), _LN(x * 3 + 1000.0), F.layer_norm(x[:, :33], (33,), eps=1e-3)


@row_probe
def var_mean_rows(x: torch.Tensor) -> Any:
    y = x * 5 + 300.0  # far from zero: the shifted sums
    v, m = torch.var_mean(y, dim=1, correction=0)
    return (
        v,
        m,
        y.var(0),
        y.mean(0),
        torch.var_mean(x, dim=0, keepdim=True),
        x.std(1, correction=1) + x.mean(1),
    )


@row_probe
def var_mean_whole(x: torch.Tensor) -> Any:
    # over every element (the reduction's length is symbolic) and over the symbolic dim
    return torch.var_mean(x + 50.0), x.var(), (x - x.mean(0)).pow(2).mean(0)


@row_probe
def norms_over_rows(x: torch.Tensor) -> Any:
    g = x.reshape(x.shape[0], 4, 10)
    return (
        F.group_norm(g, 2),
        F.batch_norm(x, None, None, training=True),
        F.instance_norm(g),
    )


@row_probe
def train_layer_norm(x: torch.Tensor) -> Any:
    return _LN(x * 2 + 100.0) * x.var(1, keepdim=True) + x.mean(1, keepdim=True)


@row_probe
def train_batch_norm(x: torch.Tensor) -> Any:
    # the mean and variance over the symbolic dim
    return F.batch_norm(x, None, None, training=True) + F.group_norm(x.view(x.shape[0], 4, 10), 2).flatten(1)


TENSOR_SIZES = ((4, 6), (5, 6), (7, 8), (6, 10))
INT_SIZES = ((8, 2), (8, 3), (12, 4), (10, 5), (6, 3))
IMAGE_SIZES = ((2, 9), (3, 9), (5, 9), (4, 11))  # batch, height and width
ROW_SIZES = ((4, 40), (6, 40), (13, 40), (7, 40))


def same(got: Any, want: Any, truth: Callable[[], Any], path: tuple[int, ...] = ()) -> None:
    """Raise unless ``got`` is eager's ``want``: types, shapes, dtypes and values (a tensor that is
    not close is judged against ``truth()``, the same call in float64, at the same ``path``)."""
    assert type(got) is type(want), f"type {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.shape == want.shape and got.dtype == want.dtype, f"{got.shape}/{got.dtype} != {want.shape}"
        try:
            torch.testing.assert_close(got, want, equal_nan=True)
        except AssertionError as e:
            exact = str(e).splitlines()[-2:]
            t = truth()
            for i in path:
                t = t[i]
            if not isinstance(t, torch.Tensor) or t.shape != want.shape or not want.is_floating_point():
                raise
            eager_err = (want.double() - t).abs().nan_to_num().max().item()
            kiln_err = (got.double() - t).abs().nan_to_num().max().item()
            # Triton kernels accumulate float32 reductions in float32, as eager does on a GPU; eager
            # on the CPU accumulates them in double: allow the Triton generator 64 float32 ulps of
            # the largest true value (a Welford variance of 40 values around 300 is 26 ulps off)
            ulps = 64 * torch.finfo(torch.float32).eps * t.abs().nan_to_num(0, 0, 0).max().item()
            if kiln_err > 4 * eager_err + 1e-6 + (ulps if TRITON_JUDGE else 0.0):
                raise AssertionError(
                    f"at {path}: error {kiln_err:.3g} against float64, eager's {eager_err:.3g}; {exact}"
                ) from None
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want), f"length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same(g, w, truth, (*path, i))
    else:
        assert got == want, f"{got!r} != {want!r}"


def _float64(fn: Probe, args: tuple[Any, ...], train: bool) -> Callable[[], Any]:
    """The eager call in float64 (inputs and modules), computed once when first asked for."""
    memo: list[Any] = []

    def truth() -> Any:
        if not memo:
            saved = _state()
            for m in TRAIN_MODULES:
                m.double()
            try:
                wide = [a.double() if isinstance(a, torch.Tensor) else a for a in args]
                memo.append(_train_step(fn, wide[0]) if train else fn(*wide))
            finally:
                for m in TRAIN_MODULES:
                    m.float()
                _restore(saved)
        return memo[0]

    return truth


def _train_step(call: Probe, x: torch.Tensor) -> tuple[Any, list[torch.Tensor], list[torch.Tensor]]:
    """``call(x)`` with ``x`` and every parameter requiring grad, then the gradients of a fixed
    random weighting of its float outputs, and the modules' state after the call (BatchNorm's
    running statistics). The modules' state is restored before, so eager and the compiled
    function start from the same one."""
    x = x.clone().requires_grad_()
    out = call(x)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(7)
    loss = torch.zeros((), dtype=x.dtype)
    for o in outs:
        if isinstance(o, torch.Tensor) and o.requires_grad:
            loss = loss + (o * torch.randn(o.shape, generator=gen)).sum()
    params = [p for m in TRAIN_MODULES for p in m.parameters()]
    grads = torch.autograd.grad(loss, [x, *params], allow_unused=True)
    return out, [g if g is not None else torch.zeros(()) for g in grads], _state()


def _torch_compiles(
    fn: Probe, dynamic: bool | None, inputs: list[tuple[Any, ...]], train: bool
) -> tuple[int, int]:
    """How many graphs torch.compile captures for the same calls (its `eager` backend: the count
    is the capture layer's, nothing is compiled), and how many frames it gave up on and ran
    eagerly (a frame skipped on an error Dynamo cannot trace captures no graph at all, so its
    count is lower than a compiler that captures the frame: `size_builtins`' `divmod` of a size)."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(fn, dynamic=dynamic, backend="eager")
    for args in inputs:
        with contextlib.suppress(Exception):
            if train:
                _train_step(compiled, args[0])
            else:
                compiled(*args)
    frames = torch._dynamo.utils.counters["frames"]
    skipped = int(frames["total"]) - int(frames["ok"])
    graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    return graphs, skipped


def run(backends: list[str], only: set[str] | None, counts: bool = False) -> int:
    wrong = 0
    families: list[tuple[list[Probe], tuple[tuple[int, int], ...], Callable[[int, int], tuple[Any, ...]]]] = [
        (TENSOR_PROBES, TENSOR_SIZES, lambda a, b: (torch.randn(a, b),)),
        (INT_PROBES, INT_SIZES, lambda a, b: (torch.randn(a, 6), b)),
        (IMAGE_PROBES, IMAGE_SIZES, lambda a, b: (torch.randn(a, 3, b, b),)),
        (ROW_PROBES, ROW_SIZES, lambda a, b: (torch.randn(a, b),)),
    ]
    count = 0
    global TRITON_JUDGE
    for backend in backends:
        TRITON_JUDGE = backend == "triton"
        for probes, sizes, make in families:
            for fn in probes:
                if only and fn.__name__ not in only:
                    continue
                count += 1
                train = fn.__name__.startswith("train_")
                for dynamic in (None, True):
                    kiln.reset()
                    compiled = kiln.compile(fn, dynamic=dynamic, options={"cpu_backend": backend})
                    inputs = []
                    for a, b in sizes:
                        torch.manual_seed(a * 31 + b)
                        args = make(a, b)
                        inputs.append(args)
                        saved = _state()
                        try:
                            if train:
                                want = _train_step(fn, args[0])
                            else:
                                want = fn(*[t.clone() if isinstance(t, torch.Tensor) else t for t in args])
                        except Exception:
                            continue  # eager rejects this size
                        finally:
                            _restore(saved)
                        try:
                            got = _train_step(compiled, args[0]) if train else compiled(*args)
                            same(got, want, _float64(fn, args, train))
                        except Exception as e:
                            wrong += 1
                            first = str(e).splitlines()[0][:200] if str(e) else ""
                            print(f"MISMATCH {backend} {fn.__name__} dynamic={dynamic} sizes={(a, b)}: "
                                  f"{type(e).__name__}: {first}", flush=True)  # fmt: skip
                            break
                        finally:
                            _restore(saved)
                    if counts:
                        ours = kiln.capture_stats().graphs
                        theirs, skipped = _torch_compiles(fn, dynamic, inputs, train)
                        flag = "  <-- more than torch" if ours > theirs and not skipped else ""
                        if skipped:
                            flag = f"  (torch ran {skipped} frame(s) eagerly: its count is not comparable)"
                        print(
                            f"compiles {backend} {fn.__name__} dynamic={dynamic}: kiln {ours}, torch {theirs}{flag}"
                        )
    print(f"{count} probe runs over {', '.join(backends)}: {wrong} mismatches")
    return wrong


def _state() -> list[torch.Tensor]:
    return [t.clone() for m in TRAIN_MODULES for t in m.state_dict().values()]


def _restore(saved: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for t, s in zip([t for m in TRAIN_MODULES for t in m.state_dict().values()], saved, strict=True):
            t.copy_(s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="cpp,triton")
    parser.add_argument("--only", default="", help="comma-separated probe names")
    parser.add_argument("--counts", action="store_true", help="compare compile counts with torch.compile's")
    args = parser.parse_args()
    only = {s for s in args.only.split(",") if s} or None
    raise SystemExit(1 if run(args.backends.split(","), only, args.counts) else 0)


if __name__ == "__main__":
    main()
