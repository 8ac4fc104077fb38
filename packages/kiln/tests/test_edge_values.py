"""Values at the edges of each op's semantics through `kiln.compile`, both code generators, against
eager: seeds of the harness in edge_values.py (`python packages/kiln/tests/edge_values.py --seeds
0-999` for more), and the wrong answers it found, one test each."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from edge_values import compare, run_seed

import kiln

BACKENDS = ("cpp", "triton")
# every 5th of the first 400 seeds (80 programs, ~40 s on the 2-core CI machine)
SEEDS = range(0, 400, 5)


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    kiln.reset()
    yield
    kiln.reset()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("seed", SEEDS)
def test_edge_value_programs(seed: int) -> None:
    bad = [r for r in run_seed(seed, BACKENDS) if r.kind in ("mismatch", "error")]
    assert not bad, "\n".join(f"{r.backend}: {r.case}: {r.kind}: {r.detail}" for r in bad)


def _same_as_eager(fn: Callable[..., Any], *args: Any, exact: bool = True) -> None:
    want = fn(*args)
    for backend in BACKENDS:
        kiln.reset()
        got = kiln.compile(fn, options={"cpu_backend": backend, "strict": True})(*args)
        problem = compare(got, want, exact, True)
        assert problem is None, f"{backend}: {problem}"


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_overflow_wraps(dtype: torch.dtype) -> None:
    """Note [Integer arithmetic wraps] (kiln_codegen_cpp): GCC folded `(x + 1) > x` to true and
    `-x < 0` to `x > 0` through undefined signed overflow; eager wraps."""
    info = torch.iinfo(dtype)
    x = torch.tensor([info.max, info.min, 0, -1, 5], dtype=dtype)

    def fn(x: torch.Tensor) -> Any:
        return (x + 1) > x, -x < 0, x.abs() < 0, (x * 2) // 2 == x

    _same_as_eager(fn, x)


@pytest.mark.parametrize("shape", [(3, 0), (0, 2), (2, 0, 3)], ids=str)
def test_reductions_over_no_element(shape: tuple[int, ...]) -> None:
    """Note [Reductions over no element] (kiln_loopir): the Triton generator fell back (a modulus
    by zero); the results are eager's identities and NaNs."""
    x = torch.zeros(shape)
    d = shape.index(0)

    def fn(x: torch.Tensor) -> Any:
        return (x * 2).prod(), x.sum(d), x.mean(d), torch.var_mean(x, d), torch.linalg.vector_norm(x, dim=d)

    _same_as_eager(fn, x, exact=False)


def _raises_as_eager(fn: Callable[..., Any], x: torch.Tensor) -> None:
    with pytest.raises(RuntimeError) as eager_error:
        fn(x)
    for backend in BACKENDS:
        kiln.reset()
        with pytest.raises(RuntimeError, match="without overflow") as kiln_error:
            kiln.compile(fn, options={"cpu_backend": backend})(x)
        assert str(kiln_error.value) == str(eager_error.value)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("name", "fn", "dtype"),
    [
        ("clamp min", lambda x: x.clamp(min=300), torch.int8),
        ("clamp max", lambda x: x.clamp(max=-300) * 2, torch.int8),
        ("clamp float", lambda x: x.clamp(max=1e300), torch.float32),
        ("clamp half", lambda x: x.clamp(max=1e6), torch.float16),
        ("hardtanh", lambda x: torch.nn.functional.hardtanh(x, -300.0, 300.0), torch.int8),
        ("masked_fill", lambda x: x.masked_fill(x > 1, 300), torch.int8),
        ("fill_", lambda x: x.clone().fill_(2**40), torch.int32),
        ("where", lambda x: torch.where(x > 1, 256, x), torch.uint8),
        ("pow half", lambda x: x**1e30, torch.float16),
        ("pow int", lambda x: x**300, torch.int8),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_numbers_that_do_not_fit_raise(name: str, fn: Callable[..., Any], dtype: torch.dtype) -> None:
    """Note [Python numbers that do not fit the dtype] (kiln_loopir): eager raises; kiln gave
    `x.clamp(min=300)` of int8 as 44 (300 wrapped)."""
    _raises_as_eager(fn, torch.tensor([1, 2, 3], dtype=dtype))


def test_numbers_that_fit_after_wrapping_do_not_raise() -> None:
    """An unsigned dtype takes a negative number down to minus its maximum (eager wraps it)."""
    x = torch.tensor([1, 2, 200], dtype=torch.uint8)

    def fn(x: torch.Tensor) -> Any:
        return x.clamp(min=-1), x.masked_fill(x > 1, -255), x + 300, x.float() ** 1e300, 300**x

    _same_as_eager(fn, x)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("name", "fn", "message"),
    [
        ("int pow", lambda x: x.int() ** -1, "negative integer powers"),
        ("int pow_", lambda x: torch.pow(x.long() + 1, -2), "negative integer powers"),
        ("bool sub", lambda x: (x > 1) - True, "Subtraction"),
        ("bool rsub", lambda x: 1 - (x > 1), "Subtraction"),
        ("bool sub tensors", lambda x: torch.sub(x > 1, x > 2), "Subtraction"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else None,
)
def test_arguments_eager_refuses_raise(name: str, fn: Callable[..., Any], message: str) -> None:
    """Note [Errors eager raises from its arguments] (kiln_loopir): kiln computed `x ** -1` of
    ints (0 or 1) and `mask - True` where eager raises."""
    x = torch.arange(6.0)
    with pytest.raises(RuntimeError, match=message):
        fn(x)
    for backend in BACKENDS:
        kiln.reset()
        with pytest.raises(RuntimeError, match=message):
            kiln.compile(fn, options={"cpu_backend": backend})(x)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int8], ids=str)
@pytest.mark.parametrize(
    "fn",
    [lambda x: torch.max(x, 0), lambda x: torch.min(x, 0), lambda x: x.max(), lambda x: x.t().min(1)],
    ids=["max.dim", "min.dim", "max", "min.dim1"],
)
def test_max_over_no_element_raises(fn: Callable[..., Any], dtype: torch.dtype) -> None:
    """Note [Reductions over no element] (kiln_loopir): `max.dim`/`min.dim`/`max()` over a size-0
    dim raise in eager; kiln returned -inf (the lowest integer) and index 0."""
    x = torch.zeros(0, 3, dtype=dtype)
    with pytest.raises((IndexError, RuntimeError)) as eager_error:
        fn(x)
    for backend in BACKENDS:
        kiln.reset()
        with pytest.raises(type(eager_error.value)):
            kiln.compile(fn, options={"cpu_backend": backend})(x)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("fn", "x"),
    [
        (lambda x: x.abs(), torch.ones(3, dtype=torch.bool)),
        (lambda x: x % x, torch.ones(3, dtype=torch.bool)),
        (lambda x: False**x, torch.ones(3, dtype=torch.bool)),
        (lambda x: x.clamp(min=True), torch.ones(3, dtype=torch.bool)),
        (lambda x: (x * 2) ^ 1, torch.ones(0, 3)),
    ],
    ids=["abs bool", "remainder bool", "pow bool", "clamp bool", "xor empty float"],
)
def test_dtypes_eager_refuses_raise(fn: Callable[..., Any], x: torch.Tensor) -> None:
    """Note [Dtypes eager's kernel does not take] (kiln_loopir): kiln computed these where
    eager's kernel raises NotImplementedError for the dtype."""
    with pytest.raises(NotImplementedError):
        fn(x)
    for backend in BACKENDS:
        kiln.reset()
        with pytest.raises(NotImplementedError):
            kiln.compile(fn, options={"cpu_backend": backend})(x)


def test_statistics_of_one_element() -> None:
    """The m2 of a one-element row is (x - x)^2 (kiln_loopir's codegen_common): NaN for an
    infinity or NaN, as eager's std/var; kiln gave 0."""
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 2.0, -0.0]).reshape(5, 1)

    def fn(x: torch.Tensor) -> Any:
        return x.std(1, correction=0), x.var(1, correction=0), torch.var_mean(x, 1, correction=0)

    _same_as_eager(fn, x)


def test_sub_with_alpha_keeps_eager_zero_sign() -> None:
    """eager subtracts `a + (-alpha) * b`: with alpha 0, -0.0 stays -0.0 (kiln's `a - 0 * b`
    gave 0.0)."""
    x = torch.tensor([-0.0, 0.0, 1.5, float("inf")])

    def fn(x: torch.Tensor) -> Any:
        return torch.sub(x, x, alpha=0), torch.sub(x, x * 2, alpha=-1.5)

    _same_as_eager(fn, x)


def test_operands_rounded_to_a_half_common_dtype() -> None:
    """Note [Operands rounded to a half common dtype] (kiln_loopir): an int32 operand of a
    float16 division is rounded to float16 first (65536 is inf), as eager's; kiln gave 7.6e-06
    where eager gives 0."""
    a = torch.tensor([1.0, 0.5, 3.0, -2.0], dtype=torch.float16)
    b = torch.tensor([32768, 65536, 2049, -(2**31)], dtype=torch.int32)

    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:
        return a / b, a.bfloat16() / b, a - b.float()

    _same_as_eager(fn, a, b)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("fn", "x"),
    [
        (lambda x: torch.nn.functional.threshold(x, 1, 300.5) + 1, torch.arange(3, dtype=torch.int8)),
        (lambda x: x.argmax(1), torch.zeros(0, 3, dtype=torch.bool)),
        (lambda x: (x > 0).argmin(), torch.ones(3)),
        (lambda x: torch.frac(x * 2), torch.arange(4)),
        (lambda x: torch.relu(x > 1), torch.arange(4.0)),
        (lambda x: x.masked_fill(x > 0, 1e6), torch.ones(1, dtype=torch.float16)),
        (lambda x: x.clone().fill_(1e6), torch.ones(2, dtype=torch.float16)),
    ],
    ids=[
        "threshold int8",
        "argmax empty bool",
        "argmin bool",
        "frac int",
        "relu bool",
        "masked_fill half",
        "fill_ half",
    ],
)
def test_what_fuzz27_left_raises_as_eager(fn: Callable[..., Any], x: torch.Tensor) -> None:
    """The differences fuzz27 left, where eager raises and kiln returned a value (kiln_aotgrad's
    Note [Decompositions keep eager's errors]; kiln_loopir's Notes [Dtypes eager's kernel does
    not take] and [Python numbers that do not fit the dtype], argmax/argmin of bools)."""
    with pytest.raises((RuntimeError, NotImplementedError)) as eager_error:
        fn(x)
    for backend in BACKENDS:
        kiln.reset()
        with pytest.raises(type(eager_error.value)) as got:
            kiln.compile(fn, options={"cpu_backend": backend})(x.clone())
        assert str(got.value) == str(eager_error.value), backend
