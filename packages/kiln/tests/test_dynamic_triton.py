"""Dynamic shapes through the Triton code generator (`options={"cpu_backend": "triton"}`; every
kernel run by Triton's interpreter on CPU tensors, conftest.py): the same contract as on the C++
side (test_dynamic.py) — every result equals eager's, and one symbolic graph serves every later
size (Note [Symbolic sizes in Triton kernels], [Symbolic sizes in the Triton wrapper]). A graph
the Triton generator could not take symbolic would show in `dynamic_fallbacks` (it would then be
compiled static per size, and the compile counts below would grow)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_dynamic import (
    CAT_SHAPES,
    POOLS,
    Block,
    _cats_and_slices,
    _floats_of_sizes,
    _mean_var_norms,
    _mlp,
    _pool_inputs,
    _sweep,
)
from torch import nn

import kiln
import kiln_dynamo
from kiln_codegen_triton import interpreting

TRITON = {"cpu_backend": "triton"}

pytestmark = pytest.mark.skipif(not interpreting(), reason="the Triton interpreter runs these on CPU tensors")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()


def _graphs() -> int:
    assert kiln_dynamo.counters.dynamic_fallbacks == []
    assert all(r.fell_back is None and not r.declined for r in kiln.compile_log())
    return kiln_dynamo.counters.graphs


def test_a_dim_that_varies_compiles_once_more_then_never() -> None:
    with torch.no_grad():
        _sweep(_mlp(), [(torch.randn(b, 8),) for b in (2, 3, 4, 8, 17, 64)], options=TRITON)
    assert _graphs() == 2  # static, then one symbolic graph for every later size


def test_dynamic_true_compiles_once_and_sizes_0_and_1_get_their_own_graphs() -> None:
    model = _mlp()
    _sweep(model, [(torch.randn(b, 8),) for b in (5, 2, 17, 64, 3)], dynamic=True, options=TRITON)
    assert _graphs() == 1
    kiln.reset()
    _sweep(model, [(torch.randn(b, 8),) for b in (4, 6, 9, 1, 0, 1, 12)], options=TRITON)
    assert _graphs() == 4  # static 4, symbolic from 6 on; 1 and 0 are never symbolic


def test_two_inputs_whose_dims_must_be_equal() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * y).sum(1), x + y.flip(0)

    _sweep(f, [(torch.randn(b, 3), torch.randn(b, 3)) for b in (4, 5, 9, 40)], options=TRITON)
    assert _graphs() == 2
    kiln.reset()

    def g(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum(0) + y.sum(0)

    # duck sizing: equal sizes share one symbol, so (5, 6) fails that graph's guard and compiles a
    # graph with two symbols, which then serves every pair
    pairs = [(5, 5), (7, 7), (5, 6), (8, 3), (9, 9)]
    _sweep(g, [(torch.randn(a, 3), torch.randn(b, 3)) for a, b in pairs], dynamic=True, options=TRITON)
    assert _graphs() == 2


def test_views_reshapes_and_strided_slices_with_symbolic_sizes() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = x.shape[0]
        return (
            x.view(b, -1, 2).transpose(1, 2).reshape(-1),
            x.t() + 1,
            x[:, ::2] * 2,
            x.narrow(0, 1, b - 1).cos(),
            x.reshape(b // 2 if b % 2 == 0 else b, -1).exp(),
        )

    _sweep(f, [(torch.randn(b, 8),) for b in (3, 5, 9, 33)], dynamic=True, options=TRITON)
    assert _graphs() == 1


def test_reductions_softmax_and_layer_norm_over_a_symbolic_dim() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.sum(0),
            x.mean(-1),
            x.amax(-1),
            x.argmax(-1),
            x.var(-1),
            x.softmax(0),
            x.softmax(-1),
            nn.functional.layer_norm(x, (x.shape[-1],)),
        )

    # rows of 17, 31 and 1000: ragged ends of every block size the kernels use
    shapes = ((3, 17), (5, 31), (9, 1000), (2, 8))
    _sweep(f, [(torch.randn(b, n),) for b, n in shapes], dynamic=True, options=TRITON)
    assert _graphs() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mean_var_and_norms_over_a_symbolic_dim_are_kernels(dtype: torch.dtype) -> None:
    """Note [Element counts over symbolic dims], as test_dynamic.py checks it for C++."""
    shapes = ((3, 17), (5, 31), (9, 100), (2, 8))
    _sweep(
        _mean_var_norms, [(torch.randn(b, n, dtype=dtype),) for b, n in shapes], dynamic=True, options=TRITON
    )
    assert _graphs() == 1
    assert [f for r in kiln.compile_log() for f in r.op_fallbacks] == []


def test_cat_and_slices_at_symbolic_offsets_are_kernels() -> None:
    args = [(torch.randn(a, n), torch.randn(b, n)) for a, b, n in CAT_SHAPES]
    _sweep(_cats_and_slices, args, dynamic=True, options=TRITON)
    assert _graphs() == 1
    assert [f for r in kiln.compile_log() for f in r.op_fallbacks] == []


@pytest.mark.parametrize("pool", POOLS, ids=["k2", "k3s2p1", "ceil_mode", "dilation"])
def test_max_pool_over_symbolic_sizes_is_a_kernel(pool: Any) -> None:
    """Note [Max pooling over symbolic sizes] through the Triton generator: no extern call."""
    compiled = kiln.compile(pool, dynamic=True, options=TRITON)
    with torch.no_grad():
        for (x,) in _pool_inputs():
            torch.testing.assert_close(compiled(x), pool(x), equal_nan=True)  # a NaN wins its window
    assert _graphs() == 1
    assert [op for r in kiln.compile_log() for op, _ in r.op_fallbacks] == []


def test_row_kernels_of_symbolic_sizes_index_without_dividing(caplog: pytest.LogCaptureFixture) -> None:
    """Note [Symbolic divisors]: a row-wise looped softmax over [s0, s1] reads ``x[row, col]`` at
    ``rindex + s1*xindex`` and the row's max at ``xindex``: no division or modulus by a size
    symbol is left in its index math (each would cost an int64 division per element on a GPU)."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.softmax(-1) * 2

    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_triton.output_code"):
        _sweep(f, [(torch.randn(b, n),) for b, n in ((3, 17), (5, 300))], dynamic=True, options=TRITON)
    assert _graphs() == 1
    kernels = "\n".join(r.getMessage() for r in caplog.records if r.getMessage().startswith("kernels:"))
    assert "def triton_red_fused" in kernels and ", s0, s1, XBLOCK: tl.constexpr" in kernels
    body = kernels[kernels.index("def triton_red_fused") :]
    assert "//" not in body and "%" not in body, body


def test_broadcasting_against_a_size_one_dim() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y + x.shape[0]

    _sweep(f, [(torch.randn(b, 3), torch.randn(1, 3)) for b in (4, 5, 9, 40)], options=TRITON)
    assert _graphs() == 2


def test_sequence_length_change_on_a_transformer_block() -> None:
    torch.manual_seed(0)
    _sweep(Block().eval(), [(torch.randn(2, t, 16),) for t in (8, 12, 16, 33, 5, 64)], options=TRITON)
    assert _graphs() == 2


def test_training_with_a_smaller_last_batch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, options=TRITON)
    for b in [16, 16, 10, 16, 7, 3]:
        x = torch.randn(b, 6)
        out, expected = compiled(x), ref(x)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    assert _graphs() == 2  # no recompile after the first symbolic one (forward and backward)


def test_a_kernel_the_generator_declines_makes_the_graph_static_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def scatter(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        # an 8-bit atomic add: declined by the Triton generator (bfloat16 ones are a CAS loop now,
        # Note [16-bit atomic adds])
        return torch.zeros(x.shape[0], 4, dtype=torch.int8).index_add_(0, idx, x)

    with caplog.at_level(logging.INFO, logger="kiln.dynamic"):
        _sweep(
            scatter,
            [(torch.randint(-3, 3, (b, 4), dtype=torch.int8), torch.randint(0, b, (b,))) for b in (3, 5, 9)],
            options=TRITON,
        )
    assert [f for f, _ in kiln_dynamo.counters.dynamic_fallbacks] == ["scatter"]
    assert any("declined it with symbolic sizes" in r.getMessage() for r in caplog.records)


def test_floats_of_sizes_are_float64_arguments(caplog: pytest.LogCaptureFixture) -> None:
    """Note [Floats of sizes in Triton] (kiln_codegen_triton's kernel.py): a Python float computed
    from sizes (`n / 3`, `float(m) * 0.1 * 3`) keeps the graph symbolic on the Triton side too: the
    wrapper computes it as Python does and the kernel takes it as a float64 argument; one graph,
    bit-for-bit eager's values in every dtype (a float32 computation would differ at n / 3)."""

    def doubles(x: torch.Tensor, n: int) -> Any:
        m = x.shape[0]
        return x.double() * (float(m) * 0.1 * 3) + n / 3, torch.full((2,), m / 7 + 1e-17, dtype=torch.float64)

    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_triton.output_code"):
        for fn in (_floats_of_sizes, doubles):
            kiln.reset()
            compiled = kiln.compile(fn, dynamic=True, options=TRITON)
            for rows, n in ((8, 2), (8, 3), (12, 4), (10, 5), (6, 3), (13, 7)):
                x = torch.randn(rows, 5)
                for got, want in zip(compiled(x, n), fn(x, n), strict=True):
                    assert got.dtype == want.dtype and torch.equal(got, want)
            assert _graphs() == 1
    kernels = "\n".join(r.getMessage() for r in caplog.records if r.getMessage().startswith("kernels:"))
    assert "kf0: tl.float64" in kernels and "tl.full([], kf0, tl.float64)" in kernels


def test_symbolic_sizes_in_triton_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_TRITON_SYMBOLIC", "0")
    with torch.no_grad():
        _sweep(_mlp(), [(torch.randn(b, 8),) for b in (2, 3, 4)], options=TRITON)
    # the symbolic capture of the second call is refused: the frame compiles static per size
    assert [f for f, _ in kiln_dynamo.counters.dynamic_fallbacks] == ["forward"]
    assert kiln_dynamo.counters.graphs == 4


def test_symbolic_kernels_compile_for_sm90(tmp_path: Path) -> None:
    """The interpreter accepts programs the real compiler would reject: the kernels of symbolic
    graphs, their size arguments typed as the launcher compiles them, compile for an H100/H200."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "KILN_CACHE_DIR": str(tmp_path)}
    script = Path(__file__).with_name("triton_dynamic_sm90.py")
    done = subprocess.run(
        [sys.executable, str(script)], check=False, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.endswith(" failed") and " 0 failed" in last, last


@pytest.mark.parametrize("lean", ["1", "0"])
def test_the_gpu_wrapper_of_symbolic_sizes_takes_a_result_differing_only_in_size_one_strides(
    monkeypatch: pytest.MonkeyPatch, lean: str
) -> None:
    """Note [A lean wrapper] (kiln_codegen_triton's wrapper.py), in the wrapper a GPU gets for a
    graph of symbolic sizes: an attention result of shape (1, H, s0, D) returned with a batch
    stride of 1 where (H * s0 * D) was planned is taken as it is (the symbolic GPT-2 copied six a
    call); ``KILN_LEAN_SYMBOLIC_RESULTS=0`` copies it; strides that differ on a dim of more than
    one element are copied either way. The graph has no kernels (the GPU form launches none) and
    its externs run, so every result equals eager's."""
    import kiln_codegen_triton.backend as tb
    from kiln_codegen_triton import wrapper as wrapper_module

    class GpuForm(wrapper_module.WrapperCodegen):  # scripts/triton_wrapper_overhead.py's
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.pointers = True
            self.flat_inputs = self._inputs_needing_flat_views()
            self.namespace["_get_stream"] = lambda index: 0

    forms: list[dict[str, Any]] = []

    def make_wrapper(schedule: Any, graph: Any, groups: Any, launchers: Any, *a: Any, **k: Any) -> Any:
        gen = GpuForm(schedule, graph, groups, launchers, *a, **k)
        source = gen.generate()
        exec(compile(source, "<gpu form>", "exec"), gen.namespace)
        gen.namespace["__source__"] = source
        forms.append(gen.namespace)
        return gen.namespace["call"], source

    monkeypatch.setenv("KILN_LEAN_SYMBOLIC_RESULTS", lean)
    monkeypatch.setattr(tb, "make_wrapper", make_wrapper)
    w = torch.randn(16, 5)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v, scale=0.25) @ w

    compiled = kiln.compile(f, dynamic=True, options=TRITON)
    copies: list[Any] = []
    for s in (8, 11):
        q, k, v = (torch.randn(1, 2, s, 16) for _ in range(3))
        with torch.no_grad():
            want = f(q, k, v)
            torch.testing.assert_close(compiled(q, k, v), want)
        (namespace,) = forms
        source = namespace["__source__"]
        assert "s0" in source and "_k" not in source.replace("_ks", ""), source
        dense = namespace.setdefault("__dense__", namespace["_dense"])

        def counting(t: Any, *args: Any, dense: Any = dense) -> Any:
            out = dense(t, *args)
            if out is not None and out.data_ptr() != t.data_ptr():  # a copy
                copies.append(args)
            return out

        namespace["_dense"] = counting
        (op,) = (n for n in namespace if n.startswith("_op_") and "attention" in str(namespace[n]))
        real = namespace.setdefault("__real__", namespace[op])
        got = real(q, k, v, scale=0.25)[0]
        planned = (2 * s * 16, s * 16, 16, 1)
        for stride in ((1, s * 16, 16, 1), planned, (s * 32, 16, 32, 1)):
            odd = torch.empty_strided(got.shape, stride).copy_(got)
            namespace[op] = lambda *a, odd=odd, real=real, **kw: (odd, *real(*a, **kw)[1:])
            copies.clear()
            with torch.no_grad():
                torch.testing.assert_close(compiled(q, k, v), want)
            copied = stride[1:] != planned[1:] or (lean == "0" and stride != planned)
            assert len(copies) == int(copied), (stride, source)
        namespace[op] = real
    assert _graphs() == 1
