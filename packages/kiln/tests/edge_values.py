"""Programs of one or two ops over values at the edges of each op's semantics, through
`kiln.compile` (both code generators) and eager, compared exactly where eager is exact.

Each seed builds one small program (`make_case`): an op drawn from `OPS`, a dtype it takes, and
tensor inputs whose elements are drawn from pools of edge values (NaN, +-inf, -0.0, halves that
round to even, the integer dtypes' extremes, shift widths), of small shapes with size-0 and
size-1 dims among them, sometimes with a pointwise neighbour before or after the op so that it is
fused into a generated kernel rather than called alone. The program runs under eager and under
`kiln.compile` with the C++ generator and with the Triton one (Triton's interpreter on CPU
tensors), and, for ops with a gradient, the gradients of a float input too. It is judged by
`compare`: Python types and structure, dtypes and shapes always; values bit for bit (NaN where
NaN) for ops eager computes exactly (selection, rounding, integer arithmetic, comparisons),
within the dtype's tolerance for the rest (transcendental math, sums in another order). An eager
error must be an error in kiln too.

Note [What eager leaves undefined]: some results are not compared, because eager's own are
platform- or position-dependent, not semantics:
  - the sign of a zero that `maximum`/`minimum`/`max`/`amax`/`clamp` pick from a -0.0/0.0 tie
    (eager's vectorized kernels keep one operand, its scalar tail the other: kiln_codegen_cpp's
    Note [Maximum and minimum as two selects]); zeros compare equal, signs are not checked for
    those ops;
  - float -> integer casts of NaN, infinities and values out of the target's range (C's
    undefined behaviour; eager gives what the vector instruction gives): the pools feed casts
    only values in range;
  - integer division and remainder by zero (eager raises ZeroDivisionError from a data-dependent
    check inside its kernel, which compiled code does not make, as torch.compile does not): the
    divisors of integer divisions are drawn without 0;
  - the index eager's `sort`/`topk` give to one of several NaNs or equal values when not stable
    (only `sort(stable=True)` indices and the values are compared);
  - a float product whose partial products overflow: inf * 0 is NaN in one order of the
    factors and 0 in another (eager's own order depends on its vector lanes), as a float sum's
    rounding depends on its order: products are drawn from values that do not overflow;
  - the gradient of `hardtanh` at NaN: 0 in eager's vectorized `hardtanh_backward`, the
    incoming gradient in its scalar tail (and in torch's decomposition), by position;
  - `gelu(+inf)`: NaN in eager's vectorized kernel (and oneDNN's on AVX-512), +inf in its scalar
    tail, by the element's position (kiln_codegen_cpp's Note [oneDNN is not the reference]);
  - an out-of-range Python number given to an op that converts it to the tensor's dtype with a
    check (`clamp(int8, min=300)`, `masked_fill`, `fill_`, `threshold`: eager raises "value
    cannot be converted to type int8_t without overflow"): not drawn (pools keep such bounds in
    range; see the report of fuzz27).

The differences fuzz27 left, all where eager raises and kiln returned a value, were closed in the
twenty-eighth session (fix28): `threshold(x, t, v)` of an integer x
with a `v` that does not fit its dtype, `frac` of integers and a float16 `masked_fill` with a
number beyond its range (torch's decompositions compute them from ops eager takes: kiln_aotgrad's
Note [Decompositions keep eager's errors]), `relu` of bools (a RuntimeError, not a
NotImplementedError: Note [Dtypes eager's kernel does not take] in kiln_loopir), `argmax`/`argmin`
of bools (the meta kernel takes them) and a half-type fill of two elements or more beyond the
type's range (Note [Python numbers that do not fit the dtype] in kiln_loopir). The pools draw
bools for `relu` and `argmax` and integers for `frac` again; out-of-range numbers are still not
drawn (above).

Run as a script for more seeds:

    python packages/kiln/tests/edge_values.py [--seeds 0-500] [--backends cpp,triton] [--grad]
        [--ops name,name] [--verbose]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# before triton is imported (Note [Triton's interpreter is process-wide] in conftest.py)
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import kiln

NAN, INF = math.nan, math.inf
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
SIGNED = (torch.int8, torch.int16, torch.int32, torch.int64)
INTS = (*SIGNED, torch.uint8)

FLOAT_POOL = (
    NAN, INF, -INF, -0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.0, -3.0, 7.0, -7.0,
    0.1, 1e30, -1e30, 1e-40, 65504.0, 70000.0, 2.0**24 + 2, 0.49999997,
)  # fmt: skip
FINITE_POOL = tuple(v for v in FLOAT_POOL if math.isfinite(v))


def int_pool(dtype: torch.dtype) -> tuple[int, ...]:
    info = torch.iinfo(dtype)
    bits = info.bits
    base = {0, 1, 2, 3, 7, bits - 1, bits, bits + 1, info.max, info.max - 1, info.min, info.min + 1}
    if info.min < 0:
        base |= {-1, -2, -3, -7, -bits}
    else:
        base |= {128, 200}
    return tuple(sorted(v for v in base if info.min <= v <= info.max))


def float_pool(dtype: torch.dtype) -> tuple[float, ...]:
    return FLOAT_POOL


def pool(dtype: torch.dtype) -> tuple[Any, ...]:
    if dtype == torch.bool:
        return (False, True)
    if dtype.is_floating_point:
        return float_pool(dtype)
    return int_pool(dtype)


SHAPES = ((5,), (2, 3), (3, 4), (1, 4), (4, 1), (2, 1, 3), (), (0,), (0, 3), (3, 0), (1,), (7, 2))


def make_tensor(
    rng: random.Random, dtype: torch.dtype, shape: tuple[int, ...], values: Any = None
) -> torch.Tensor:
    values = values if values is not None else pool(dtype)
    n = math.prod(shape)
    # a few distinct values per tensor, so that ties are common
    few = [rng.choice(values) for _ in range(rng.choice((1, 2, 3, 5)))]
    data = [rng.choice(few) for _ in range(n)]
    return (
        torch.tensor(data, dtype=torch.float64 if dtype.is_floating_point else None).to(dtype).reshape(shape)
    )


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    args: list[Any]
    exact: bool = True  # values bit for bit (NaN where NaN)
    signed_zeros: bool = True  # compare the signs of zeros
    grad: bool = False  # gradients of the float tensor inputs too
    notes: list[str] = field(default_factory=list)


# -------------------------------------------------------------------------------------------
# the ops: name -> builder(rng) -> Case


def _dtype(rng: random.Random, choices: tuple[torch.dtype, ...]) -> torch.dtype:
    return rng.choice(choices)


def _shape(rng: random.Random, nonempty: bool = False, min_rank: int = 0) -> tuple[int, ...]:
    shapes = [s for s in SHAPES if len(s) >= min_rank and (not nonempty or math.prod(s) > 0)]
    return rng.choice(shapes)


def _neighbour_before(rng: random.Random, dtype: torch.dtype) -> tuple[str, Callable[[Any], Any]]:
    """A pointwise op fused before the op under test (exact for every value of its dtype)."""
    if dtype == torch.bool:
        return rng.choice((("id", lambda x: x), ("not", lambda x: ~x)))
    if dtype == torch.uint8:
        return rng.choice((("id", lambda x: x), ("xor", lambda x: x ^ 1)))
    return rng.choice((("id", lambda x: x), ("neg", lambda x: -x), ("id", lambda x: x)))


def _neighbour_after(rng: random.Random, dtype: torch.dtype) -> tuple[str, Callable[[Any], Any]]:
    if dtype == torch.bool:
        return rng.choice((("id", lambda x: x), ("not", lambda x: ~x)))
    if dtype.is_floating_point:
        return rng.choice((("id", lambda x: x), ("neg", lambda x: -x), ("x2", lambda x: x * 2)))
    if dtype == torch.uint8:
        return rng.choice((("id", lambda x: x), ("xor", lambda x: x ^ 1)))
    return rng.choice((("id", lambda x: x), ("neg", lambda x: -x), ("xor", lambda x: x ^ 1)))


def unary(
    op: Callable[[Any], Any],
    dtypes: tuple[torch.dtype, ...],
    exact: bool = True,
    grad: bool = False,
    signed_zeros: bool = True,
    values: Callable[[torch.dtype], tuple[Any, ...]] | None = None,
    fuse: bool = True,
) -> Callable[[random.Random, str], Case]:
    def build(rng: random.Random, name: str) -> Case:
        dtype = _dtype(rng, dtypes)
        x = make_tensor(rng, dtype, _shape(rng), values(dtype) if values else None)
        bname, before = _neighbour_before(rng, dtype) if fuse else ("id", lambda v: v)

        def fn(x: torch.Tensor) -> Any:
            return op(before(x))

        return Case(f"{name}[{bname}]", fn, [x], exact, signed_zeros, grad and dtype.is_floating_point)

    return build


def binary(
    op: Callable[[Any, Any], Any],
    dtypes: tuple[torch.dtype, ...],
    exact: bool = True,
    grad: bool = False,
    signed_zeros: bool = True,
    rhs_values: Callable[[torch.dtype], tuple[Any, ...]] | None = None,
    rhs_dtypes: tuple[torch.dtype, ...] | None = None,
    scalar_rhs: bool = True,
) -> Callable[[random.Random, str], Case]:
    def build(rng: random.Random, name: str) -> Case:
        dtype = _dtype(rng, dtypes)
        rdtype = _dtype(rng, rhs_dtypes) if rhs_dtypes else dtype
        shape = _shape(rng)
        x = make_tensor(rng, dtype, shape)
        rvals = rhs_values(rdtype) if rhs_values else pool(rdtype)
        kind = rng.choice(
            ("tensor", "tensor", "broadcast", "scalar") if scalar_rhs else ("tensor", "broadcast")
        )
        if kind == "scalar":
            s = rng.choice(rvals)
            s = bool(s) if rdtype == torch.bool else (float(s) if rdtype.is_floating_point else int(s))
            bname, before = _neighbour_before(rng, dtype)

            def fn1(x: torch.Tensor) -> Any:
                return op(before(x), s)

            return Case(
                f"{name}[scalar {s!r}, {bname}]",
                fn1,
                [x],
                exact,
                signed_zeros,
                grad and dtype.is_floating_point,
            )
        yshape = shape if kind == "tensor" else shape[-1:]
        y = make_tensor(rng, rdtype, yshape, rvals)
        bname, before = _neighbour_before(rng, dtype)
        try:  # the op's own result dtype (a true division of integers is float)
            out_dtype = op(x, y).dtype
        except Exception:
            out_dtype = torch.result_type(x, y)
        aname, after = _neighbour_after(rng, out_dtype)

        def fn2(x: torch.Tensor, y: torch.Tensor) -> Any:
            return after(op(before(x), y))

        return Case(
            f"{name}[{kind}, {bname}, {aname}]",
            fn2,
            [x, y],
            exact,
            signed_zeros,
            grad and dtype.is_floating_point,
        )

    return build


CMP = {"eq", "ne", "lt", "le", "gt", "ge", "isclose"}


def _nonzero_ints(dtype: torch.dtype) -> tuple[Any, ...]:
    # Note [What eager leaves undefined]: integer division by zero raises in eager's kernel
    if dtype.is_floating_point:
        return pool(dtype)
    return tuple(v for v in pool(dtype) if v != 0)


def _safe_divisors(dtype: torch.dtype) -> tuple[Any, ...]:
    # and INT_MIN / -1 overflows (SIGFPE on x86 in eager's own kernel)
    return tuple(v for v in _nonzero_ints(dtype) if dtype.is_floating_point or v != -1)


def _finite_in(dtype: torch.dtype) -> tuple[Any, ...]:
    """The pool's values that stay finite in ``dtype``."""
    return tuple(v for v in FINITE_POOL if abs(v) <= torch.finfo(dtype).max)


def _no_overflow(dtype: torch.dtype) -> tuple[Any, ...]:
    """No large finite floats (a product of them overflows in an order-dependent way)."""
    if not dtype.is_floating_point:
        return pool(dtype)
    return tuple(v for v in FLOAT_POOL if not math.isfinite(v) or abs(v) < 100)


def _in_range_for(target: torch.dtype) -> Callable[[torch.dtype], tuple[Any, ...]]:
    """Float values whose cast to `target` eager defines (Note [What eager leaves undefined])."""

    def values(dtype: torch.dtype) -> tuple[Any, ...]:
        if target == torch.bool:
            return FLOAT_POOL
        info = torch.iinfo(target)
        return tuple(v for v in FINITE_POOL if info.min <= math.trunc(v) <= info.max)

    return values


def reduction(
    op: Callable[..., Any],
    dtypes: tuple[torch.dtype, ...],
    exact: bool = True,
    grad: bool = False,
    dims: bool = True,
    signed_zeros: bool = True,
    keepdim: bool = True,
    empty: bool = True,
    values: Callable[[torch.dtype], tuple[Any, ...]] | None = None,
) -> Callable[[random.Random, str], Case]:
    def build(rng: random.Random, name: str) -> Case:
        dtype = _dtype(rng, dtypes)
        shape = _shape(rng, nonempty=not empty)
        x = make_tensor(rng, dtype, shape, values(dtype) if values else None)
        kw: dict[str, Any] = {}
        label = "all"
        if dims and shape and rng.random() < 0.7:
            kw["dim"] = rng.randrange(-len(shape), len(shape))
            label = f"dim={kw['dim']}"
            if keepdim and rng.random() < 0.4:
                kw["keepdim"] = True
                label += " keepdim"
        bname, before = _neighbour_before(rng, dtype)

        def fn(x: torch.Tensor) -> Any:
            return op(before(x), **kw)

        return Case(
            f"{name}[{label}, {bname}]", fn, [x], exact, signed_zeros, grad and dtype.is_floating_point
        )

    return build


ALL = (*FLOATS, *INTS, torch.bool)
NUM = (*FLOATS, *INTS)
F32 = (torch.float32, torch.float64)


def _round_decimals(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, F32)
    d = rng.choice((-1, 1, 2, 3))
    x = make_tensor(rng, dtype, _shape(rng), (*FLOAT_POOL, 0.125, 0.375, 2.675, 1.005, 25.0, 35.0, -15.0))
    return Case(f"{name}[decimals={d}]", lambda x: torch.round(x, decimals=d), [x], exact=False)


def _half_chain(rng: random.Random, name: str) -> Case:
    """Note [What a half-precision chain rounds]: eager rounds every op's result to the half
    type; kiln must round at the same points."""
    half = rng.choice((torch.float16, torch.bfloat16))
    k = rng.choice((3, 0.1, 1 / 3, 7.0, 1e-3, 300.0))
    x = make_tensor(
        rng, torch.float32, _shape(rng), (*FINITE_POOL, 1.0009765625, 0.333, 1000.7, 3.14159, 2049.0)
    )
    form = rng.randrange(6)
    if form == 0:

        def fn(x: torch.Tensor) -> Any:
            return (x.to(half) * k).float()
    elif form == 1:

        def fn(x: torch.Tensor) -> Any:
            return (x.to(half) * k + 1).float()
    elif form == 2:

        def fn(x: torch.Tensor) -> Any:
            h = x.to(half)
            return ((h + h) * k - h).float()
    elif form == 3:

        def fn(x: torch.Tensor) -> Any:
            return x.to(half).sum(-1) if x.dim() else x.to(half).sum()
    elif form == 4:

        def fn(x: torch.Tensor) -> Any:
            return (x.to(half) / k).to(torch.float64)
    else:

        def fn(x: torch.Tensor) -> Any:
            h = x.to(half)
            return torch.exp(h * k).float()

    return Case(f"{name}[{half}, form {form}, k={k!r}]", fn, [x], exact=form in (0, 1, 2, 4))


def _scalar_promotion(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, ALL)
    x = make_tensor(rng, dtype, _shape(rng))
    s = rng.choice((2, -1, 300, 2.5, -0.5, True, False, 1e10, 2**40, 1j + 1))
    opname, op = rng.choice(
        (
            ("add", lambda a, b: a + b),
            ("mul", lambda a, b: a * b),
            ("sub", lambda a, b: a - b),
            ("rsub", lambda a, b: b - a),
            ("div", lambda a, b: a / b),
            ("pow", lambda a, b: a**b),
            ("rpow", lambda a, b: b**a),
            ("floordiv", lambda a, b: a // b),
            ("eq", lambda a, b: a == b),
            ("lt", lambda a, b: a < b),
            ("max", lambda a, b: torch.clamp(a, min=b)),
            ("where", lambda a, b: torch.where(a != 0, a, b)),
        )
    )
    # Note [What eager leaves undefined]: no integer division by zero
    if opname in ("floordiv",) and not isinstance(s, float) and s in (0, False):
        s = 2
    if opname in ("rpow",) and isinstance(s, complex):
        s = 2

    def fn(x: torch.Tensor) -> Any:
        return op(x, s)

    return Case(f"{name}[{opname}, {s!r}]", fn, [x], exact=opname not in ("pow", "rpow", "div"))


def _zero_dim(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, ALL)
    x = make_tensor(rng, dtype, _shape(rng))
    zdt = _dtype(rng, ALL)
    z = make_tensor(rng, zdt, ())
    if not zdt.is_floating_point and zdt != torch.bool and z.item() == 0:
        z = torch.ones((), dtype=zdt)
    opname, op = rng.choice(
        (
            ("add", torch.add),
            ("mul", torch.mul),
            ("maximum", torch.maximum),
            ("where", None),
            ("lt", torch.lt),
        )
    )
    if opname == "where":

        def fn(x: torch.Tensor, z: torch.Tensor) -> Any:
            return torch.where(x != 0, x, z)
    else:

        def fn(x: torch.Tensor, z: torch.Tensor) -> Any:
            return op(x, z)

    return Case(f"{name}[{opname} {zdt}]", fn, [x, z])


def _python_numbers(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, ALL)
    x = make_tensor(rng, dtype, _shape(rng, nonempty=True))
    form = rng.randrange(6)
    if form == 0:

        def fn(x: torch.Tensor) -> Any:
            return x.sum().item()
    elif form == 1:

        def fn(x: torch.Tensor) -> Any:
            return len(x) if x.dim() else x.numel(), x.shape[-1] * 2 if x.dim() else 0
    elif form == 2:

        def fn(x: torch.Tensor) -> Any:
            return x.amax().item() if dtype != torch.bool else x.any().item()
    elif form == 3:

        def fn(x: torch.Tensor) -> Any:
            return x.to(torch.float64).mean().item()
    elif form == 4:

        def fn(x: torch.Tensor) -> Any:
            return x.argmax().item() if dtype != torch.bool else x.int().argmax().item()
    else:

        def fn(x: torch.Tensor) -> Any:
            return x.numel() / 2, x.dim() // 2, x.sum(), x.size()

    # a float sum's rounding depends on its order
    return Case(f"{name}[form {form}]", fn, [x], exact=form not in (0, 3) or not dtype.is_floating_point)


def _sort(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, (*NUM,))
    shape = _shape(rng, min_rank=1)
    x = make_tensor(rng, dtype, shape)
    dim = rng.randrange(-len(shape), len(shape))
    desc = rng.random() < 0.5

    def fn(x: torch.Tensor) -> Any:
        return torch.sort(-x if dtype != torch.uint8 else x, dim=dim, descending=desc, stable=True)

    return Case(f"{name}[dim={dim} desc={desc}]", fn, [x], grad=dtype.is_floating_point)


def _topk(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, NUM)
    shape = _shape(rng, min_rank=1, nonempty=True)
    x = make_tensor(rng, dtype, shape)
    dim = rng.randrange(-len(shape), len(shape))
    k = rng.randrange(0, shape[dim] + 1)
    largest = rng.random() < 0.5

    def fn(x: torch.Tensor) -> Any:
        return torch.topk(x, k, dim=dim, largest=largest, sorted=True).values

    return Case(f"{name}[k={k} dim={dim} largest={largest}]", fn, [x])


def _var(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, F32)
    shape = _shape(rng)
    # Note [What eager leaves undefined]: no 1e30 (x - mean(x) of equal huge values is 0 or an
    # ulp of 1e30 by the order of the mean's sum, and the gradient 2 (x - mean) / n with it)
    x = make_tensor(rng, dtype, shape, rng.choice((FLOAT_POOL, FINITE_POOL)))
    x = torch.where(x.abs() > 1e20, torch.full_like(x, 3.0), x)
    corr = rng.choice((0, 1, 2, 5))
    std = rng.random() < 0.5
    dim = rng.randrange(-len(shape), len(shape)) if shape and rng.random() < 0.7 else None

    def fn(x: torch.Tensor) -> Any:
        return (torch.std if std else torch.var)(x * 1, dim=dim, correction=corr)

    return Case(f"{name}[{'std' if std else 'var'} dim={dim} c={corr}]", fn, [x], exact=False, grad=True)


def _where(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, ALL)
    shape = _shape(rng)
    x = make_tensor(rng, dtype, shape)
    y = make_tensor(rng, dtype, shape)
    form = rng.randrange(3)

    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        if form == 0:
            return torch.where(x > y, x, y)
        if form == 1:
            return torch.where(torch.isnan(x), y, x)
        return torch.where(x == y, x, 0)

    return Case(f"{name}[form {form}]", fn, [x, y], grad=dtype.is_floating_point)


def _cast(rng: random.Random, name: str) -> Case:
    target = _dtype(rng, (*INTS, torch.bool))
    src = _dtype(rng, F32)
    x = make_tensor(rng, src, _shape(rng), _in_range_for(target)(src))
    bname, before = ("id", lambda v: v) if target == torch.uint8 else _neighbour_before(rng, src)

    def fn(x: torch.Tensor) -> Any:
        return before(x).to(target) ^ (True if target == torch.bool else 1)

    return Case(f"{name}[{src}->{target}, {bname}]", fn, [x])


def _int_cast(rng: random.Random, name: str) -> Case:
    src = _dtype(rng, (*INTS, torch.bool))
    target = _dtype(rng, (*INTS, *FLOATS, torch.bool))
    x = make_tensor(rng, src, _shape(rng))

    def fn(x: torch.Tensor) -> Any:
        return (x.to(target) * 1) if target != torch.bool else ~x.to(target)

    return Case(f"{name}[{src}->{target}]", fn, [x])


def _lerp(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, F32)
    shape = _shape(rng)
    x = make_tensor(rng, dtype, shape)
    y = make_tensor(rng, dtype, shape)
    w = rng.choice((0.0, 1.0, 0.5, 0.25, 0.75, -1.0, 2.0))

    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        return torch.lerp(x, y, w)

    return Case(f"{name}[w={w}]", fn, [x, y], exact=False, grad=True)


def _softmax(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, F32)
    shape = _shape(rng, min_rank=1)
    x = make_tensor(rng, dtype, shape, rng.choice((FLOAT_POOL, (-INF, 0.0, 1.0, -1.0, 1e30))))
    dim = rng.randrange(-len(shape), len(shape))
    which = rng.choice(("softmax", "log_softmax", "logsumexp"))

    def fn(x: torch.Tensor) -> Any:
        if which == "logsumexp":
            return torch.logsumexp(x, dim)
        return getattr(torch, which)(x, dim)

    return Case(f"{name}[{which} dim={dim}]", fn, [x], exact=False, grad=True)


def _norm(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, F32)
    shape = _shape(rng)
    x = make_tensor(rng, dtype, shape, rng.choice((FINITE_POOL, (0.0, -0.0), (0.0, 1.0, -2.0))))
    p = rng.choice((2, 1, INF, 3))

    def fn(x: torch.Tensor) -> Any:
        return torch.linalg.vector_norm(x, p)

    return Case(f"{name}[p={p}]", fn, [x], exact=False, grad=True)


def _cum(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, (*NUM, torch.bool))
    shape = _shape(rng, min_rank=1)
    x = make_tensor(rng, dtype, shape)
    dim = rng.randrange(-len(shape), len(shape))
    which = rng.choice(("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"))
    if which == "logcumsumexp" and not dtype.is_floating_point:
        which = "cumsum"

    def fn(x: torch.Tensor) -> Any:
        return getattr(torch, which)(x, dim)

    exact = which in ("cummax", "cummin") or not dtype.is_floating_point
    return Case(
        f"{name}[{which} dim={dim}]",
        fn,
        [x],
        exact=exact,
        grad=dtype.is_floating_point and which != "cumprod",
    )


def _int_pow(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, INTS)
    shape = _shape(rng)
    x = make_tensor(rng, dtype, shape)
    e = make_tensor(
        rng,
        dtype,
        shape,
        tuple(
            v
            for v in (0, 1, 2, 3, 7, -1, -2, 31, 63)
            if v >= torch.iinfo(dtype).min and v <= torch.iinfo(dtype).max
        ),
    )

    def fn(x: torch.Tensor, e: torch.Tensor) -> Any:
        return torch.pow(x, e)

    return Case(name, fn, [x, e])


def _mean_int(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, (*INTS, torch.bool))
    x = make_tensor(rng, dtype, _shape(rng))
    return Case(name, lambda x: x.mean(), [x])


def _empty_reductions(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, (*F32, *INTS, torch.bool))
    shape = rng.choice(((0,), (0, 3), (3, 0), (2, 0, 1)))
    x = torch.zeros(shape, dtype=dtype)
    dim = rng.randrange(-len(shape), len(shape))
    which = rng.choice(
        ("sum", "prod", "mean", "amax", "amin", "argmax", "max", "nansum", "all", "any", "logsumexp")
    )

    if which == "logsumexp" and dtype == torch.bool:
        which = "any"  # eager refuses bools

    def fn(x: torch.Tensor) -> Any:
        return getattr(torch, which)(x * 1 if dtype != torch.bool else x, dim)

    return Case(f"{name}[{which} dim={dim}]", fn, [x])


def _int_edge(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, INTS)
    x = make_tensor(rng, dtype, _shape(rng))
    opname, op = rng.choice(
        (
            ("abs", torch.abs),
            ("neg", torch.neg),
            ("square", torch.square),
            ("x*x", lambda v: v * v),
            ("x+x", lambda v: v + v),
            ("x*3", lambda v: v * 3),
            ("x+127", lambda v: v + 127),
            ("x-1", lambda v: v - 1),
            ("abs<0", lambda v: v.abs() < 0),
            ("-x<0", lambda v: -v < 0),
            ("x+1>x", lambda v: (v + 1) > v),
            ("sign", torch.sign),
            ("~x", torch.bitwise_not),
            ("relu", torch.relu),
            ("clamp", lambda v: torch.clamp(v, -100, 100)),
        )
    )

    def fn(x: torch.Tensor) -> Any:
        return op(x)

    return Case(f"{name}[{opname}]", fn, [x])


MIXED_OPS: tuple[tuple[str, Callable[[Any, Any], Any], bool], ...] = (
    ("add", torch.add, True),
    ("sub", lambda a, b: a - b, True),
    ("mul", torch.mul, True),
    ("maximum", torch.maximum, True),
    ("minimum", torch.minimum, True),
    ("eq", torch.eq, True),
    ("lt", torch.lt, True),
    ("div", torch.div, False),
    ("floor_divide", torch.floor_divide, True),
    ("remainder", torch.remainder, True),
    ("fmod", torch.fmod, True),
    ("pow", torch.pow, False),
    ("copysign", torch.copysign, True),
    ("where", lambda a, b: torch.where(a > 0, a, b), True),
    ("bitwise_or", torch.bitwise_or, True),
    ("atan2", torch.atan2, False),
)


def _mixed(rng: random.Random, name: str) -> Case:
    """Two tensors of different dtypes (type promotion inside the kernel)."""
    opname, op, exact = rng.choice(MIXED_OPS)
    da, db = _dtype(rng, ALL), _dtype(rng, ALL)
    shape = _shape(rng)
    a = make_tensor(rng, da, shape)
    divides = opname in ("div", "floor_divide", "remainder", "fmod")
    b = make_tensor(rng, db, shape, _safe_divisors(db) if divides else None)
    if divides and db == torch.bool:
        b = torch.ones_like(b)
    if opname == "pow" and not da.is_floating_point and not db.is_floating_point:
        b = b.to(torch.int64).abs().remainder(5).to(db)  # negative powers: an error in eager
    bname, before = _neighbour_before(rng, da)

    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:
        return op(before(a), b)

    return Case(f"{name}[{opname} {da}, {db}, {bname}]", fn, [a, b], exact=exact)


def _cast_chain(rng: random.Random, name: str) -> Case:
    """Casts in a row inside one kernel: each rounds or wraps where eager's does."""
    chain = [_dtype(rng, ALL) for _ in range(rng.choice((2, 3)))]
    src = _dtype(rng, (*INTS, torch.bool, torch.float16, torch.bfloat16))
    x = make_tensor(rng, src, _shape(rng))

    def fn(x: torch.Tensor) -> Any:
        for dt in chain:
            x = x.to(dt)
        return x

    return Case(f"{name}[{src} -> {' -> '.join(str(d)[6:] for d in chain)}]", fn, [x])


def _sum_dtype(rng: random.Random, name: str) -> Case:
    dtype = _dtype(rng, (*INTS, torch.bool, torch.float16, torch.bfloat16))
    x = make_tensor(rng, dtype, _shape(rng, min_rank=1))
    which = rng.choice(("sum", "cumsum", "prod", "cumprod", "mean"))
    out = rng.choice((None, torch.int32, torch.float32, torch.float64, torch.int8))
    if which == "mean" and (out is None or not out.is_floating_point):
        out = torch.float32

    def fn(x: torch.Tensor) -> Any:
        if which.startswith("cum"):
            return getattr(torch, which)(x, -1, dtype=out)
        return getattr(torch, which)(x, -1, dtype=out)

    return Case(f"{name}[{which} dtype={out}]", fn, [x], exact=out is None or not out.is_floating_point)


OPS: dict[str, Callable[[random.Random, str], Case]] = {
    # selection, NaN and signed zeros
    "maximum": binary(torch.maximum, NUM, grad=True, signed_zeros=False, scalar_rhs=False),
    "minimum": binary(torch.minimum, NUM, grad=True, signed_zeros=False, scalar_rhs=False),
    "fmax": binary(torch.fmax, NUM, signed_zeros=False, scalar_rhs=False),
    "fmin": binary(torch.fmin, NUM, signed_zeros=False, scalar_rhs=False),
    "clamp": binary(
        lambda x, b: torch.clamp(x, min=b, max=b + 2 if isinstance(b, torch.Tensor) else None),
        NUM,
        grad=True,
        signed_zeros=False,
    ),
    "clamp_max": binary(lambda x, b: torch.clamp(x, max=b), NUM, grad=True, signed_zeros=False),
    "relu": unary(torch.relu, ALL, grad=True, signed_zeros=False),
    # Note [What eager leaves undefined]: hardtanh's gradient at NaN
    "hardtanh": unary(
        lambda x: torch.nn.functional.hardtanh(x, -1.0, 2.5),
        FLOATS,
        grad=True,
        signed_zeros=False,
        values=lambda d: tuple(v for v in FLOAT_POOL if not math.isnan(v)),
    ),
    "leaky_relu": unary(lambda x: torch.nn.functional.leaky_relu(x, 0.1), FLOATS, grad=True),
    "nan_to_num": unary(torch.nan_to_num, ALL),
    "nan_to_num_v": unary(lambda x: torch.nan_to_num(x, nan=1.5, posinf=2.0, neginf=-3.0), FLOATS),
    "abs": unary(torch.abs, ALL[:-1], grad=True),
    "sign": unary(torch.sign, ALL, grad=True),
    "sgn": unary(torch.sgn, NUM),
    "signbit": unary(torch.signbit, NUM),
    "isnan": unary(torch.isnan, ALL),
    "isinf": unary(torch.isinf, ALL),
    "isfinite": unary(torch.isfinite, ALL),
    "isposinf": unary(torch.isposinf, NUM),
    "isneginf": unary(torch.isneginf, NUM),
    "where": _where,
    "amax": reduction(torch.amax, NUM, grad=True, signed_zeros=False, empty=False),
    "amin": reduction(torch.amin, NUM, grad=True, signed_zeros=False, empty=False),
    "max": reduction(
        lambda x, **k: torch.max(x, **k) if k else torch.max(x),
        NUM,
        grad=True,
        signed_zeros=False,
        empty=False,
    ),
    "min": reduction(
        lambda x, **k: torch.min(x, **k) if k else torch.min(x),
        NUM,
        grad=True,
        signed_zeros=False,
        empty=False,
    ),
    "argmax": reduction(torch.argmax, ALL, empty=False),
    "argmin": reduction(torch.argmin, NUM, empty=False),
    "sort": _sort,
    "topk": _topk,
    "cum": _cum,
    "softmax": _softmax,
    "eq": binary(torch.eq, ALL),
    "ne": binary(torch.ne, ALL),
    "lt": binary(torch.lt, NUM),
    "le": binary(torch.le, NUM),
    "gt": binary(torch.gt, NUM),
    "ge": binary(torch.ge, NUM),
    # integer arithmetic
    "floor_divide": binary(torch.floor_divide, NUM, rhs_values=_safe_divisors),
    "div_floor": binary(lambda a, b: torch.div(a, b, rounding_mode="floor"), NUM, rhs_values=_safe_divisors),
    "div_trunc": binary(lambda a, b: torch.div(a, b, rounding_mode="trunc"), NUM, rhs_values=_safe_divisors),
    "div": binary(torch.div, NUM, exact=False, rhs_values=_nonzero_ints),
    "remainder": binary(torch.remainder, NUM, rhs_values=_safe_divisors),
    "fmod": binary(torch.fmod, NUM, rhs_values=_safe_divisors),
    "add": binary(torch.add, ALL),
    "sub": binary(torch.sub, NUM),
    "mul": binary(torch.mul, ALL),
    "shl": binary(torch.bitwise_left_shift, INTS),
    "shr": binary(torch.bitwise_right_shift, INTS),
    "bitwise_and": binary(torch.bitwise_and, (*INTS, torch.bool)),
    "bitwise_or": binary(torch.bitwise_or, (*INTS, torch.bool)),
    "bitwise_xor": binary(torch.bitwise_xor, (*INTS, torch.bool)),
    "logical_and": binary(torch.logical_and, ALL),
    "logical_xor": binary(torch.logical_xor, ALL),
    "int_edge": _int_edge,
    "int_pow": _int_pow,
    "sum": reduction(torch.sum, ALL, exact=False),
    # Note [What eager leaves undefined]: a product whose partial products overflow
    "prod": reduction(torch.prod, ALL, exact=False, keepdim=True, values=_no_overflow),
    "mean_int": _mean_int,
    "empty_reduction": _empty_reductions,
    "all": reduction(torch.all, ALL),
    "any": reduction(torch.any, ALL),
    "count_nonzero": reduction(torch.count_nonzero, ALL, keepdim=False),
    # rounding
    "round": unary(torch.round, NUM),
    "round_decimals": _round_decimals,
    "floor": unary(torch.floor, NUM, grad=True),
    "ceil": unary(torch.ceil, NUM, grad=True),
    "trunc": unary(torch.trunc, NUM),
    "frac": unary(torch.frac, NUM),
    "cast": _cast,
    "int_cast": _int_cast,
    "half_chain": _half_chain,
    # float math at the edges (tolerance)
    "sqrt": unary(torch.sqrt, NUM, exact=False, grad=True),
    "rsqrt": unary(torch.rsqrt, FLOATS, exact=False, grad=True),
    "reciprocal": unary(torch.reciprocal, NUM, exact=False, grad=True),
    "sigmoid": unary(torch.sigmoid, FLOATS, exact=False, grad=True),
    "tanh": unary(torch.tanh, FLOATS, exact=False, grad=True),
    "exp": unary(torch.exp, NUM, exact=False, grad=True),
    "log": unary(torch.log, NUM, exact=False, grad=True),
    "log1p": unary(torch.log1p, FLOATS, exact=False),
    "expm1": unary(torch.expm1, FLOATS, exact=False),
    "softplus": unary(torch.nn.functional.softplus, FLOATS, exact=False, grad=True),
    # Note [What eager leaves undefined]: gelu(+inf)
    "gelu": unary(torch.nn.functional.gelu, FLOATS, exact=False, grad=True, values=_finite_in),
    "silu": unary(torch.nn.functional.silu, FLOATS, exact=False, grad=True),
    "elu": unary(torch.nn.functional.elu, FLOATS, exact=False, grad=True),
    "mish": unary(torch.nn.functional.mish, FLOATS, exact=False),
    "hardswish": unary(torch.nn.functional.hardswish, FLOATS, exact=False, grad=True),
    "hardsigmoid": unary(torch.nn.functional.hardsigmoid, FLOATS, exact=False, grad=True),
    "logit": unary(torch.logit, FLOATS, exact=False),
    "pow": binary(torch.pow, FLOATS, exact=False, grad=True),
    "atan2": binary(torch.atan2, FLOATS, exact=False),
    "copysign": binary(torch.copysign, FLOATS),
    "hypot": binary(torch.hypot, F32, exact=False, scalar_rhs=False),
    "logaddexp": binary(torch.logaddexp, F32, exact=False, scalar_rhs=False),
    "xlogy": binary(torch.xlogy, F32, exact=False),
    "lerp": _lerp,
    "var": _var,
    "norm": _norm,
    # Python numbers and type promotion
    "scalar_promotion": _scalar_promotion,
    "zero_dim": _zero_dim,
    "mixed": _mixed,
    "mixed2": _mixed,
    "cast_chain": _cast_chain,
    "sum_dtype": _sum_dtype,
    "exp2": unary(torch.exp2, NUM, exact=False),
    "log2": unary(torch.log2, NUM, exact=False),
    "bitwise_not": unary(torch.bitwise_not, (*INTS, torch.bool)),
    "logical_not": unary(torch.logical_not, ALL),
    "square": unary(torch.square, ALL[:-1], grad=True),
    "python_numbers": _python_numbers,
}


# -------------------------------------------------------------------------------------------
# judging


TOL = {
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}


def compare(got: Any, want: Any, exact: bool, signed_zeros: bool, where: str = "out") -> str | None:
    """What differs between kiln's result and eager's, or None."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{where}: {type(got).__name__} where eager gives a tensor"
        if got.dtype != want.dtype:
            return f"{where}: dtype {got.dtype} != {want.dtype}"
        if got.shape != want.shape:
            return f"{where}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        if want.is_complex():
            return compare(torch.view_as_real(got), torch.view_as_real(want), exact, signed_zeros, where)
        if want.dtype.is_floating_point:
            g, w = got.double(), want.double()
            gn, wn = torch.isnan(g), torch.isnan(w)
            if not torch.equal(gn, wn):
                return f"{where}: NaN at {_pos(gn != wn)}: {_show(got, want, gn != wn)}"
            g, w = g.masked_fill(gn, 0), w.masked_fill(wn, 0)
            if exact:
                bad = g != w
                if signed_zeros:
                    bad |= (w == 0) & (torch.signbit(g) != torch.signbit(w))
            else:
                rtol, atol = TOL[want.dtype]
                inf = torch.isinf(w) | torch.isinf(g)
                bad = (inf & (g != w)) | (~inf & ((g - w).abs() > atol + rtol * w.abs()))
            if bad.any():
                return f"{where}: values at {_pos(bad)}: {_show(got, want, bad)}"
            return None
        if not torch.equal(got, want):
            return f"{where}: values at {_pos(got != want)}: {_show(got, want, got != want)}"
        return None
    if type(got) is not type(want):
        return f"{where}: type {type(got).__name__} != {type(want).__name__} ({got!r} vs {want!r})"
    if isinstance(want, (tuple, list)):
        if len(got) != len(want):
            return f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            problem = compare(g, w, exact, signed_zeros, f"{where}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(want, float):
        if math.isnan(want) and math.isnan(got):
            return None
        if exact and got != want:
            return f"{where}: {got!r} != {want!r}"
        if not exact and not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6):
            return f"{where}: {got!r} != {want!r}"
        return None
    if got != want:
        return f"{where}: {got!r} != {want!r}"
    return None


def _pos(mask: torch.Tensor) -> list[Any]:
    return mask.nonzero().tolist()[:3]


def _show(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> str:
    return f"kiln {got[mask][:4].tolist()} eager {want[mask][:4].tolist()}"


def _leaf(x: Any, grad: bool) -> Any:
    if isinstance(x, torch.Tensor):
        y = x.clone()
        if grad and y.dtype.is_floating_point:
            y.requires_grad_(True)
        return y
    return x


def _grads(out: Any, inputs: list[Any], seed: int) -> list[Any] | None:
    outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
    outs = [t for t in outs if t.requires_grad]
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not leaves:
        return None
    gen = torch.Generator().manual_seed(seed)
    gouts = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype) for t in outs]
    return list(torch.autograd.grad(outs, leaves, gouts, allow_unused=True))


@dataclass
class Result:
    seed: int
    case: str
    backend: str
    kind: str  # pass / mismatch / error / fallback
    detail: str = ""


def run_case(case: Case, seed: int, backend: str, grad: bool = False) -> Result:
    grad = grad and case.grad
    e_args = [_leaf(a, grad) for a in case.args]
    c_args = [_leaf(a, grad) for a in case.args]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = case.fn(*e_args)
        eager_error = None
    except Exception as exc:
        want, eager_error = None, exc
    kiln.reset()
    compiled = kiln.compile(case.fn, options={"cpu_backend": backend})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got = compiled(*c_args)
        except Exception as exc:
            if eager_error is not None:
                return Result(seed, case.name, backend, "pass", "both raise")
            return Result(seed, case.name, backend, "error", f"{type(exc).__name__}: {str(exc)[:300]}")
    if eager_error is not None:
        return Result(
            seed,
            case.name,
            backend,
            "mismatch",
            f"eager raises {type(eager_error).__name__}: {str(eager_error)[:200]}, kiln returns {got!r:.200}",
        )
    problem = compare(got, want, case.exact, case.signed_zeros)
    if problem:
        return Result(seed, case.name, backend, "mismatch", problem)
    if grad:
        try:
            want_g = _grads(want, e_args, seed)
        except Exception:
            want_g = None
        if want_g is not None:
            try:
                got_g = _grads(got, c_args, seed)
            except Exception as exc:
                return Result(
                    seed, case.name, backend, "error", f"backward: {type(exc).__name__}: {str(exc)[:300]}"
                )
            problem = compare(tuple(got_g), tuple(want_g), False, False, "grad")
            if problem:
                return Result(seed, case.name, backend, "mismatch", problem)
    fell = [r.fell_back for r in kiln.compile_log() if r.fell_back]
    declined = [d for r in kiln.compile_log() for d in r.declined]
    backend_warn = [str(w.message) for w in caught if "kiln backend" in str(w.message)]
    if fell or backend_warn:
        return Result(seed, case.name, backend, "fallback", (fell or backend_warn)[0].splitlines()[0][:200])
    if declined:
        return Result(
            seed, case.name, backend, "fallback", f"declined {declined[0][0]}: {declined[0][1][:150]}"
        )
    return Result(seed, case.name, backend, "pass")


def make_case(seed: int, ops: list[str] | None = None) -> tuple[str, Case]:
    rng = random.Random(seed)
    names = ops or sorted(OPS)
    name = rng.choice(names)
    return name, OPS[name](rng, name)


def run_seed(
    seed: int, backends: tuple[str, ...] = ("cpp", "triton"), grad: bool = True, ops: list[str] | None = None
) -> list[Result]:
    _, case = make_case(seed, ops)
    return [run_case(case, seed, b, grad) for b in backends]


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="0-99")
    p.add_argument("--backends", default="cpp,triton")
    p.add_argument("--ops", default="")
    p.add_argument("--no-grad", action="store_true")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    backends = tuple(a.backends.split(","))
    ops = a.ops.split(",") if a.ops else None
    counts: dict[str, int] = {}
    for seed in _seeds(a.seeds):
        try:
            results = run_seed(seed, backends, not a.no_grad, ops)
        except Exception:
            print(f"seed {seed}: harness error\n{traceback.format_exc()}", flush=True)
            continue
        for r in results:
            counts[r.kind] = counts.get(r.kind, 0) + 1
            if r.kind != "pass" or a.verbose:
                print(f"seed {seed} {r.backend} {r.kind}: {r.case}: {r.detail}", flush=True)
    print(counts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
