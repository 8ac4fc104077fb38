"""Pointwise lowerings x dtypes through Triton against eager, and how pointwise kernels are blocked.

Each sweep builds one graph holding every op that eager supports for a dtype (one module per
dtype), with outputs named so a failure says which op and dtype differed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx
from triton_check import (
    DEVICES,
    In,
    aten,
    check,
    eager_supports,
    graph_of,
    kinds,
    make,
    to_device,
)

from kiln_codegen_triton import TritonBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import SWEEP_BINARY, SWEEP_DTYPES, SWEEP_UNARY, aten_op

# the sweeps' ops and dtypes, the same for every code generator (kiln_loopir.testing)
DTYPES, UNARY, BINARY, _op = SWEEP_DTYPES, SWEEP_UNARY, SWEEP_BINARY, aten_op


def _sweep(
    ops: list[str], inputs: list[torch.Tensor], dtype: torch.dtype, device: str, special: int = 0
) -> None:
    """``special``: how many leading elements of row 0 hold special values (NaN, infinities),
    where eager also answers element by element (Note [Eager disagrees with itself] in
    triton_check.py: gelu(+inf) is NaN in oneDNN's vectorized kernel, +inf alone)."""
    picked = [name for name in ops if eager_supports(_op(name), *inputs)]
    assert picked, f"no op runs eagerly on {dtype}"
    args = tuple(In(i) for i in range(len(inputs)))
    gm = graph_of([(_op(name), args, {}) for name in picked], len(inputs))
    at = [(0, i) for i in range(special)]
    check(gm, *inputs, device=device, names=[f"{name}/{dtype}" for name in picked], elementwise_at=at)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unary_ops(dtype: torch.dtype, device: str) -> None:
    x = make((7, 37), dtype, low=-3, high=3)
    if dtype.is_floating_point:
        x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5])
    _sweep(UNARY, [x], dtype, device, special=4 if dtype.is_floating_point else 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_binary_ops(dtype: torch.dtype, device: str) -> None:
    a = make((5, 33), dtype, low=-4, high=4)
    b = make((5, 33), dtype, low=-4, high=4, exclude_zero=True)
    if dtype.is_floating_point:
        a[0, :3] = torch.tensor([float("nan"), 1.0, float("inf")])
        b[0, :3] = torch.tensor([1.0, float("nan"), 2.0])
    _sweep(BINARY, [a, b], dtype, device, special=3 if dtype.is_floating_point else 0)


@pytest.mark.parametrize("device", DEVICES)
def test_declined_kernel_runs_in_the_interpreter(device: str) -> None:
    """A kernel without a Triton spelling (an int8 atomic add) is declined by name and still
    computed right, by loopir's interpreter on CPU copies of its buffers."""
    x, rows, vals = make((6, 5), torch.int8), torch.tensor([1, 4, 1]), make((3, 5), torch.int8)
    gm = graph_of([(aten.index_put.default, (In(0), [In(1)], In(2), True), {})], 3)
    backend = check(gm, x, rows, vals, device=device, allow_declined=True)
    assert len(backend.last_declined) == 1 and "atomic add" in backend.last_declined[0][1]


def _many_adds_into_few_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return make((3, 37), torch.bfloat16), torch.randint(0, 3, (150,)), make((150, 37), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_accumulating_index_put_is_a_cas_loop_kernel(device: str) -> None:
    """Note [16-bit atomic adds]: bfloat16 accumulates in a compare-and-swap loop, each add
    rounded to bfloat16 as eager's index_put rounds it: with 50 adds per element (lanes of one
    block on the same element retry) bit for bit eager's answer, which summing in float32 and
    rounding once is not."""
    x, rows, vals = _many_adds_into_few_rows()
    gm = graph_of([(aten.index_put.default, (In(0), [In(1)], In(2), True), {})], 3)
    inputs = to_device([x, rows, vals], device)
    backend = TritonBackend()
    (got,) = compile_graph(gm, inputs, backend=backend)(*inputs)
    assert not backend.last_declined and "k_bf16_atomic_add(p_" in backend.last_source
    (want,) = gm(x, rows, vals)
    rounded_once = x.float().index_put((rows,), vals.float(), accumulate=True).bfloat16()
    assert not torch.equal(want, rounded_once)
    if device == "cpu":  # the interpreter runs the lanes in order, as eager's CPU loop adds
        assert torch.equal(got.cpu(), want)
    else:
        # on a GPU the atomic adds land in whatever order the lanes win (CUDA eager's own
        # index_put is no more ordered), and each order rounds differently: ~50 adds per element,
        # each within half a bfloat16 step of values up to ~100, bound the difference
        exact = x.double().index_put((rows,), vals.double(), accumulate=True)
        bound = 50 * 0.5 * 2.0**-7 * exact.abs().max().item()
        assert (got.cpu().double() - exact).abs().max().item() <= bound
        assert (want.double() - exact).abs().max().item() <= bound


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_scatter_add_sums_in_float32(device: str) -> None:
    """Note [Accumulating scatters in low precision]: eager's scatter_add sums in float32 and
    rounds once; so does kiln's (float32 atomic adds into a float32 copy), bit for bit, where
    rounding each add is far off."""
    x, rows, vals = _many_adds_into_few_rows()
    index = rows[:, None].expand(150, 37).contiguous()
    gm = graph_of([(aten.scatter_add.default, (In(0), 0, In(1), In(2)), {})], 3)
    inputs = to_device([x, index, vals], device)
    backend = TritonBackend()
    (got,) = compile_graph(gm, inputs, backend=backend)(*inputs)
    assert not backend.last_declined and "k_bf16_atomic_add(p_" not in backend.last_source
    assert "tl.atomic_add(" in backend.last_source
    (want,) = gm(x, index, vals)
    add_by_add = x.index_put((rows,), vals, accumulate=True)
    assert torch.equal(got.cpu(), want) and not torch.equal(want, add_by_add)


@pytest.mark.parametrize("device", DEVICES)
def test_float16_accumulating_scatter_is_an_atomic_add_kernel(device: str) -> None:
    """Note [16-bit atomic adds]: float16 accumulates with tl.atomic_add, repeated rows included."""
    x, rows, vals = make((6, 5), torch.float16), torch.tensor([1, 4, 1, 1]), make((4, 5), torch.float16)
    gm = graph_of([(aten.index_put.default, (In(0), [In(1)], In(2), True), {})], 3)
    backend = check(gm, x, rows, vals, device=device)
    assert not backend.last_declined and "tl.atomic_add(" in backend.last_source


@pytest.mark.parametrize("device", DEVICES)
def test_fused_chain_is_one_1d_kernel(device: str) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor, b: torch.Tensor) -> Any:
        a = aten.add.Tensor(aten.mul.Tensor(x, y), b)  # b broadcasts along rows
        g = aten.gelu.default(a)
        return aten.where.self(aten.gt.Scalar(g, 0.1), g, aten.tanh.default(a))

    backend = check(fn, make((16, 40)), make((16, 40)), make((40,)), device=device)
    assert kinds(backend) == ["pointwise"]
    assert "libdevice.tanh" in backend.last_source


@pytest.mark.parametrize("device", DEVICES)
def test_the_build_report_gives_each_kernel_the_bytes_of_its_buffers(device: str) -> None:
    # what a profile divides by a kernel's time (Note [Bandwidth of generated kernels] in
    # kiln_bench): x, y and the result (16 x 40) and the broadcast row b (40), float32
    def fn(x: torch.Tensor, y: torch.Tensor, b: torch.Tensor) -> Any:
        return aten.relu.default(aten.add.Tensor(aten.mul.Tensor(x, y), b))

    inputs = [make((16, 40)), make((16, 40)), make((40,))]
    backend = check(fn, *inputs, device=device)
    (spec,) = backend.last_specs
    assert dict(backend.last_build().kernel_bytes) == {spec.name: (3 * 16 * 40 + 40) * 4}
    # a split sum: both kernels, the first charged for the input and its partial sums
    x = make((1 << 16,))
    backend = check(graph_of([(aten.sum.default, (In(0),), {})], 1), x, device=device)
    first, second = backend.last_specs
    report = dict(backend.last_build().kernel_bytes)
    assert set(report) == {first.name, second.name}
    assert report[first.name] > x.numel() * 4 > report[second.name] > 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_transpose_is_tiled(dtype: torch.dtype, device: str) -> None:
    def fn(x: torch.Tensor) -> Any:
        t = aten.permute.default(x, [0, 2, 1])
        return aten.add.Tensor(aten.clone.default(t, memory_format=torch.contiguous_format), 1.0)

    backend = check(fn, make((3, 40, 24), dtype), device=device)
    assert kinds(backend) == ["tiled"]
    untiled = check(fn, make((3, 40, 24), dtype), device=device, backend=TritonBackend(allow_tiling=False))
    assert kinds(untiled) == ["pointwise"]


@pytest.mark.parametrize("device", DEVICES)
def test_half_types_compute_in_float32(device: str) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        return aten.mul.Tensor(aten.exp.default(x), y), aten.add.Tensor(aten.to.dtype(x, torch.float16), 1)

    backend = check(fn, make((8, 8), torch.bfloat16), make((8, 8), torch.bfloat16), device=device)
    # loads widen to float32, results are rounded to the half type where eager rounds
    # (under the interpreter bfloat16 is converted by bit operations: Note [bfloat16 in the interpreter])
    assert ".to(tl.float32)" in backend.last_source or "k_bf16_widen(" in backend.last_source
    assert ".to(tl.bfloat16).to(tl.float32)" in backend.last_source or "k_bf16_round(" in backend.last_source


@pytest.mark.parametrize("device", DEVICES)
def test_scalars_broadcast_and_constants(device: str) -> None:
    def fn(x: torch.Tensor, s: torch.Tensor, col: torch.Tensor) -> Any:
        a = aten.mul.Tensor(x, s)  # 0-dim tensor: an index without loop variables
        b = aten.add.Tensor(x, col)  # (n, 1) broadcast along columns
        c = aten.full.default([3, 5], 2.5, dtype=torch.float32, device=x.device)
        d = aten.arange.start_step(0, 12, 3, dtype=torch.int64, device=x.device)
        e = aten.clamp.default(x, -0.5, 0.5)
        return a, b, c, d, e, aten.masked_fill.Scalar(x, aten.gt.Scalar(x, 1.0), float("-inf"))

    check(fn, make((6, 11)), make(()), make((6, 1)), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_comparisons_of_constants_combine_with_blocks(device: str) -> None:
    """Note [Comparisons in the interpreter]: ``min(0, x)`` (log-sigmoid's) tests the constant
    for NaN, a comparison of 0-d values, then ORs it with a block; so do a logical or/and/xor of
    a constant test with a block. Under the interpreter these raised before the fix."""

    def fn(x: torch.Tensor) -> Any:
        zero = aten.full.default([], 0.0, dtype=torch.float32, device=x.device)
        one = aten.full.default([], 1.0, dtype=torch.float32, device=x.device)
        pos = aten.gt.Scalar(x, 0.0)
        return (
            aten.minimum.default(zero, x),
            aten.maximum.default(zero, x),
            aten.fmax.default(x, one),
            aten.logical_or.default(aten.ne.Tensor(zero, zero), pos),
            aten.logical_and.default(aten.eq.Tensor(one, one), pos),
            aten.logical_xor.default(aten.lt.Tensor(zero, one), pos),
        )

    check(fn, make((37,)), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_and_offset_inputs(device: str) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        return aten.add.Tensor(x, y)

    base = make((10, 24))
    x = base[2:8, ::2]  # storage offset and a stride of 2
    y = make((12, 6)).t()
    gm = graph_of([(aten.add.Tensor, (In(0), In(1)), {})], 2)
    check(gm, x, y, device=device)
    check(fn, x.contiguous(), y.contiguous(), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_int32_indexing_unless_large(device: str) -> None:
    gm = graph_of([(aten.relu.default, (In(0),), {})], 1)
    backend = check(gm, make((64,)), device=device)
    assert "tl.program_id(0) * XBLOCK" in backend.last_source  # int32 block index
    # a graph with 2**31 elements of storage indexes in int64; compiled only (not run: 8 GB)
    from kiln_codegen_triton.backend import _index_dtype
    from kiln_loopir.graph import GraphLowering

    big = torch.empty_strided((2**31,), (1,), device="meta")
    assert _index_dtype(GraphLowering(gm, [big]).run()) == "tl.int64"


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_pointwise_walks_memory_order(device: str) -> None:
    """Note [Pointwise kernels walk memory order]: a kernel over NHWC buffers takes its lanes in
    NHWC order, so loads and stores are contiguous (the channel operand is read per lane mod C)."""

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
        return aten.relu.default(aten.add.Tensor(aten.mul.Tensor(x, w), b))

    x = make((2, 8, 4, 4)).to(memory_format=torch.channels_last)
    backend = check(fn, x, make((8, 1, 1)), make((8, 1, 1)), device=device)
    assert kinds(backend) == ["pointwise"]
    source = backend.last_source
    loads = [line for line in source.splitlines() if "tl.load(" in line]
    assert any(line.endswith("+ (xindex), xmask, other=0)") for line in loads)  # x: lane by lane
    assert "(xindex % 8)" in source and "tl.store(p_buf0 + (xindex)" in source


def _edge_values() -> torch.Tensor:
    torch.manual_seed(0)
    special = [float("nan"), float("inf"), -float("inf"), 3.3895e38, -3.3895e38, 1e-40, -1e-40, 0.0, -0.0]
    ties = [1.00390625, 1.01171875, -1.00390625]  # exactly halfway between two bfloat16 values
    return torch.cat([torch.randn(500) * 10, torch.tensor(special + ties)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_explicit_downcast_rounds_as_eager(dtype: torch.dtype, device: str) -> None:
    """Issue 19, Note [bfloat16 in the interpreter]: `.to(half type)` inside a float32 kernel
    rounds to nearest even, bit for bit as eager, and a stored half value is eager's too."""
    from kiln_loopir import compile_graph

    def f(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        down = aten._to_copy.default(a, dtype=dtype)
        return aten._to_copy.default(down, dtype=torch.float32) * 1.0, aten.mul.Tensor(down, 1.0)

    x = _edge_values().to(device)
    gm = torch.fx.symbolic_trace(f)
    got = compile_graph(gm, [x], backend=TritonBackend())(x)
    want = f(x)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_integers_and_bools_convert_to_half_types(dtype: torch.dtype, device: str) -> None:
    """An int64 count (cross-entropy's mean divides by one), int32 values and bools to a half
    type go through float32 as eager's conversions do (the interpreter's bfloat16 rounding
    bit-cast an int64 before)."""

    def f(n: torch.Tensor, i: torch.Tensor) -> Any:
        count = aten._to_copy.default(aten.sum.default(n), dtype=dtype)
        return (
            aten.div.Tensor(aten._to_copy.default(i, dtype=dtype), count),
            aten._to_copy.default(aten.gt.Scalar(i, 0), dtype=dtype),
            aten._to_copy.default(n, dtype=dtype),
        )

    n = torch.tensor([1, 0, 1, 1, 300_001, -7], dtype=torch.int64)
    i = torch.tensor([3, -5, 1 << 20, (1 << 24) + 1, 77, 0], dtype=torch.int32)
    check(f, n, i, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_downcast_then_sum_in_float32_matches_eager(device: str) -> None:
    """`(a.to(bf16) * b.to(bf16)).float().sum(0)`: one fused float32 kernel, eager's rounding."""

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = aten._to_copy.default(a, dtype=torch.bfloat16)
        y = aten._to_copy.default(b, dtype=torch.bfloat16)
        m = aten._to_copy.default(aten.mul.Tensor(x, y), dtype=torch.float32)
        return aten.sum.dim_IntList(m, [0])

    torch.manual_seed(0)
    check(f, torch.randn(256, 8), torch.randn(256, 8), device=device)


def test_index_expressions_with_a_python_modulus() -> None:
    """sympy's Mod (Python's modulus) in an index expression of symbolic sizes — CUDA attention
    pads its mask to a multiple of 8, ``Mod(-s0, 8)``, which the H200 found declined — is spelled
    with Triton's truncating ``%`` so that it equals Python's for every sign of the dividend."""
    import ast
    import math

    import sympy

    from kiln_codegen_triton.triton_ops import index_to_triton

    class Truncating(ast.NodeTransformer):  # evaluate % as Triton (and C) do: toward zero
        def visit_BinOp(self, node: ast.BinOp) -> Any:
            self.generic_visit(node)
            if isinstance(node.op, ast.Mod):
                return ast.Call(ast.Name("tmod", ast.Load()), [node.left, node.right], [])
            return node

    def run(text: str, env: dict[str, int]) -> int:
        tree = ast.fix_missing_locations(Truncating().visit(ast.parse(text, mode="eval")))
        return int(eval(compile(tree, "<index>", "eval"), {"tmod": lambda a, b: int(math.fmod(a, b)), **env}))

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    i = sympy.Symbol("i", integer=True)  # sign unknown
    for expr in (sympy.Mod(-s0, 8), sympy.Mod(s0, 8), sympy.Mod(i - s0, 8), 8 - sympy.Mod(s0 + 3, 8)):
        text = index_to_triton(expr)
        for v0 in range(1, 20):
            for vi in (-9, -1, 0, 5):
                assert run(text, {"s0": v0, "i": vi}) == int(expr.subs({s0: v0, i: vi})), (expr, v0, vi, text)
    with pytest.raises(NotImplementedError, match="not known positive"):
        index_to_triton(sympy.Mod(s0, i))


@pytest.mark.parametrize("device", DEVICES)
def test_bitwise_not_of_uint8(device: str) -> None:
    """Triton's interpreter cannot build `~`'s all-ones constant for uint8 (a run-time error)."""
    x = torch.tensor([0, 1, 9, 128, 254, 255], dtype=torch.uint8)

    def fn(a: torch.Tensor) -> torch.Tensor:
        return aten.bitwise_not.default(a)

    check(fn, x, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_negative_zero_constant(device: str, dtype: torch.dtype) -> None:
    """Note [Negative zero constants]: Triton builds a constant equal to 0 as +0.0, and Triton
    3.6 a negated one too; a -0.0 constant is its sign bit reinterpreted (the binary keeps it:
    gpu_compile.py's "negative zero" case)."""
    x = torch.tensor([-0.0, 0.0, 1.5, -2.0], dtype=dtype)

    def fn(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return aten.add.Tensor(a, -0.0), aten.mul.Tensor(aten.mul.Tensor(a, 0.0), -0.0)

    got = compile_graph(torch.fx.symbolic_trace(fn), [x.to(device)], backend=TritonBackend())(x.to(device))
    for g, w in zip(got, fn(x), strict=True):
        assert torch.equal(torch.signbit(g.cpu()), torch.signbit(w)), (g, w)
