"""kiln.compile(dynamic=...) end to end on the CPU: every result equals eager's, and the
number of compiles follows torch.compile's contract."""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import kiln
import kiln_dynamo


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)).eval()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_batch_sizes_2_to_64(backend: str) -> None:
    model = _mlp()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for b in [2, 3, 4, 8, 17, 64]:
            x = torch.randn(b, 8)
            torch.testing.assert_close(compiled(x), model(x))
    # static, then one dynamic graph for every later size (for kiln: one compiled .so)
    assert kiln_dynamo.counters.graphs == 2
    assert kiln_dynamo.counters.dynamic_fallbacks == []
    if backend == "kiln":
        log = kiln.compile_log()
        assert len(log) == 2 and all(r.fell_back is None and not r.declined for r in log)
        assert [r.symbolic for r in log] == [False, True]  # static first, then symbolic sizes


def test_dynamic_true_and_mark_dynamic_are_accepted() -> None:
    model = _mlp()
    compiled = kiln.compile(model, backend="eager", dynamic=True)
    with torch.no_grad():
        for b in [3, 5, 9]:
            x = torch.randn(b, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert kiln_dynamo.counters.graphs == 1
    kiln.reset()
    x = torch.randn(6, 8)
    kiln.mark_dynamic(x, 0, min=2, max=32)
    compiled = kiln.compile(model, backend="eager", dynamic=False)  # an explicit mark still counts
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        y = torch.randn(20, 8)
        torch.testing.assert_close(compiled(y), model(y))
    assert kiln_dynamo.counters.graphs == 1


def test_aot_eager_training_with_a_smaller_last_batch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, backend="aot_eager")
    _train_against_eager(compiled, model, ref, [torch.randn(b, 6) for b in [16, 16, 10, 16, 7, 3]])
    assert kiln_dynamo.counters.graphs == 2 and kiln_dynamo.counters.dynamic_fallbacks == []


def _sweep(fn: Callable[..., Any], argsets: list[tuple[Any, ...]], **compile_kw: Any) -> None:
    """Every call compared with eager; a failed compile would show in the compile log."""
    compiled = kiln.compile(fn, **compile_kw)
    with torch.no_grad():
        for args in argsets:
            torch.testing.assert_close(compiled(*args), fn(*args))
    assert all(r.fell_back is None for r in kiln.compile_log())


def test_kiln_dynamic_true_compiles_once() -> None:
    model = _mlp()
    _sweep(model, [(torch.randn(b, 8),) for b in (2, 5, 17, 64, 3)], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []


def test_zero_one_specialization_gives_size_one_its_own_graph() -> None:
    model = _mlp()
    _sweep(model, [(torch.randn(b, 8),) for b in (4, 6, 9, 1, 1, 12)])
    # static 4, dynamic for 6..; batch 1 is never symbolic: a static graph of its own
    assert kiln_dynamo.counters.graphs == 3 and kiln_dynamo.counters.dynamic_fallbacks == []


def test_views_reshapes_and_strided_slices_with_symbolic_sizes() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = x.shape[0]
        return (
            x.view(b, -1, 2).transpose(1, 2).reshape(-1),
            x.t() + 1,
            x[:, ::2] * 2,
            x.narrow(0, 1, b - 1).cos(),
        )

    _sweep(f, [(torch.randn(b, 8),) for b in (3, 5, 9, 33)], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []


def test_reductions_softmax_and_layer_norm_over_a_symbolic_dim() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.sum(0),
            x.mean(-1),
            x.amax(-1),
            x.softmax(0),
            x.softmax(-1),
            nn.functional.layer_norm(x, (x.shape[-1],)),
        )

    # last dims 17, 31, 1000: not multiples of the 8 lanes (the scalar tail runs)
    _sweep(f, [(torch.randn(b, n),) for b, n in ((3, 17), (5, 31), (9, 1000), (2, 8))], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []


def test_outputs_viewing_an_input_stay_views_with_symbolic_sizes() -> None:
    """kiln_aotgrad's Note [Symbolic views among the outputs] under the C++ backend: one
    symbolic graph, and each view output is a view of the caller's tensor, as in eager."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.view(-1), x[1:].t(), x.relu() + 1

    compiled = kiln.compile(f, dynamic=True)
    storage = torch.randn(100)
    for b, start in ((3, 0), (5, 0), (7, 11)):
        x = storage[start : start + 4 * b].view(b, 4)
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got, want)
        for g, w in zip(got[:2], want[:2], strict=True):
            assert g._base is storage and (g.stride(), g.storage_offset()) == (w.stride(), w.storage_offset())
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_views_of_symbolic_gemm_results_are_views_not_copies(cpu_backend: str) -> None:
    """Note [Views with symbolic strides] (loopir indexing.py): a ``(b*s, n)`` GEMM result seen
    as ``(b, s, n)``, and the heads of a fused QKV projection handed to attention, are strided
    views in a symbolic graph as in a static one: no copy kernel (the Triton graph has no kernel
    at all), the output a view of the GEMM's result, equal to eager at sizes 0, 1, 2, 7."""
    from kiln_codegen_triton import runtime

    torch.manual_seed(0)
    w, w3 = torch.randn(16, 24), torch.randn(16, 48)

    def proj(x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return (x.view(-1, 16) @ w).view(b, s, 24)

    def heads(x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (x.view(-1, 16) @ w3).view(b, s, 48).split(16, dim=2)
        q, k, v = (t.view(b, s, 2, 8).transpose(1, 2) for t in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    options = {"cpu_backend": cpu_backend, "layout_policy": "cuda"}
    modules = runtime.counters["modules_written"] + runtime.counters["modules_reused"]
    compiled = kiln.compile(proj, dynamic=True, options=options)
    for b, s in ((2, 5), (3, 7), (2, 0), (1, 2), (7, 1)):
        x = torch.randn(b, s, 16)
        got = compiled(x)
        torch.testing.assert_close(got, proj(x))
        if b > 1 and s > 1:  # the 0/1-specialized graphs are static ones
            assert got._base is not None and got.stride() == (24 * s, 24, 1)
    kiln.reset()
    compiled = kiln.compile(heads, dynamic=True, options=options)
    for b, s in ((2, 5), (3, 7), (2, 2)):
        x = torch.randn(b, s, 16)
        torch.testing.assert_close(compiled(x), heads(x))
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    if cpu_backend == "triton":
        assert runtime.counters["modules_written"] + runtime.counters["modules_reused"] == modules


def test_a_layer_norm_over_symbolic_rows_keeps_its_statistics_in_registers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note [Symbolic divisors] (loopir indexing.py): the fused layer norm over ``(b, s, 64)``
    with symbolic ``b, s`` reads its mean and variance from registers as the static kernel does,
    not through scratch buffers and a barrier; equal to eager at several sizes (1 and 0 too)."""
    import kiln_codegen_triton.backend as tb

    specs: list[Any] = []
    make_wrapper = tb.make_wrapper

    def recording(schedule: Any, graph: Any, groups: Any, launchers: Any, **kw: Any) -> Any:
        specs.extend(s for g in groups.values() if g is not None for s in g.specs)
        return make_wrapper(schedule, graph, groups, launchers, **kw)

    monkeypatch.setattr(tb, "make_wrapper", recording)
    torch.manual_seed(0)
    ln = nn.LayerNorm(64).eval()

    def f(x: torch.Tensor) -> torch.Tensor:
        return ln(x) * 2

    compiled = kiln.compile(f, dynamic=True, options={"cpu_backend": "triton"})
    with torch.no_grad():
        for b, s in ((3, 5), (2, 9), (4, 2), (1, 3), (2, 0)):
            x = torch.randn(b, s, 64)
            torch.testing.assert_close(compiled(x), f(x))
    symbolic = [s for s in specs if s.symbolic]
    assert symbolic and all(not s.scratch and "debug_barrier" not in s.source for s in symbolic)


def test_backward_inside_the_compiled_function() -> None:
    """`loss.backward()` in the compiled function: a graph break; the graph before it trains
    with symbolic sizes (kiln_aotgrad's Note [Saved sizes]) and the compiled backward's wrapper
    is not captured as user code (Note [Generated code is not captured])."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())

    def make_step(m: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        def step(x: torch.Tensor) -> torch.Tensor:
            loss = m(x).pow(2).mean()
            loss.backward()
            return loss.detach()

        return step

    compiled = kiln.compile(make_step(model), dynamic=True)
    for b in (4, 7, 9, 3):
        x = torch.randn(b, 6)
        torch.testing.assert_close(compiled(x), make_step(ref)(x))
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    # the graph before the break and the one after it; the backward break is the only one
    assert kiln_dynamo.counters.graphs == 2 and kiln_dynamo.counters.graph_breaks == 1
    assert kiln_dynamo.counters.dynamic_fallbacks == []
    assert all(r.fell_back is None for r in kiln.compile_log())


def _mean_var_norms(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n = x.shape[-1]
    return (
        x.mean(-1),
        x.mean(),
        x.var(-1),
        x.std(0),
        *torch.var_mean(x, -1, correction=0),
        x.var(-1, correction=0.0),
        nn.functional.layer_norm(x, (n,)),
        nn.functional.rms_norm(x, (n,)),
        x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),  # LLaMA's RMS norm
    )


def _op_fallbacks() -> list[tuple[str, str]]:
    return [f for r in kiln.compile_log() for f in r.op_fallbacks]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mean_var_and_norms_over_a_symbolic_dim_are_kernels(dtype: torch.dtype) -> None:
    """Note [Element counts over symbolic dims]: the divisor is computed in the kernel from the
    size symbols; no reduction runs as an extern aten call."""
    shapes = ((3, 17), (5, 31), (9, 100), (2, 8))
    _sweep(_mean_var_norms, [(torch.randn(b, n, dtype=dtype),) for b, n in shapes], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert _op_fallbacks() == []


def test_var_with_a_correction_that_may_exceed_the_symbolic_count_is_extern() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.var(-1, correction=2) + x.std(-1, correction=0.5)

    # n = 2 with correction 2 divides by zero (inf/nan, as eager)
    _sweep(f, [(torch.randn(b, n),) for b, n in ((3, 17), (5, 2), (4, 9))], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1
    reasons = [why for op, why in _op_fallbacks()]
    assert len(reasons) == 2 and all("over the symbolic element count s1" in why for why in reasons)


def _cats_and_slices(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n = x.shape[1]
    padded = torch.cat([torch.zeros(x.shape[0], 1), x], 1)  # GPT-2's position ids do this
    return (
        torch.cat([x, y, x * 2], 0),
        torch.cat([x, x.cos()], 1).sin(),
        padded[:, 1:] * 2,
        x[:, 1:],
        x[:, n // 2 :] + 1,
    )


CAT_SHAPES = ((3, 4, 5), (5, 2, 7), (2, 9, 3), (6, 6, 6))


def test_cat_and_slices_at_symbolic_offsets_are_kernels() -> None:
    """loopir's cat at offsets in size symbols, and a slice whose start is provably inside the
    dim (Note [Symbolic sizes in loopir]): no extern call, one graph."""
    args = [(torch.randn(a, n), torch.randn(b, n)) for a, b, n in CAT_SHAPES]
    _sweep(_cats_and_slices, args, dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert _op_fallbacks() == []


def test_a_slice_that_needs_the_size_range_is_a_view() -> None:
    """`x[:, 1:n-1]` has length `n - 2`, which needs `n >= 2`: the ShapeEnv's range says so
    (Note [Slice lengths decided at capture]); it was eager's slice kernel before. `x[:, 3:]`
    may be empty (`Max(0, n - 3)`): a view of that length."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x[:, 1 : x.shape[1] - 1] + 1, x[:, 3:] * 2

    _sweep(f, [(torch.randn(a, n),) for a, n in ((3, 5), (4, 2), (2, 9), (2, 3))], dynamic=True)
    # (the slices' `n - 2 != 1` contiguity guards recompile n = 3 and n = 2: capture's, as before)
    assert kiln_dynamo.counters.dynamic_fallbacks == [] and _op_fallbacks() == []


def test_broadcasting_against_a_size_one_dim() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y + x.shape[0]

    _sweep(f, [(torch.randn(b, 3), torch.randn(1, 3)) for b in (4, 5, 9, 40)])
    assert kiln_dynamo.counters.graphs == 2 and kiln_dynamo.counters.dynamic_fallbacks == []


class Block(nn.Module):
    """A small pre-norm transformer block: attention with a causal mask and an MLP."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.ff(self.ln2(x))


def test_sequence_length_change_on_a_transformer_block(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    torch.manual_seed(0)
    block = Block().eval()
    with caplog.at_level(logging.INFO, logger="kiln.symbolic.dynamic"):
        _sweep(block, [(torch.randn(2, t, 16),) for t in (8, 12, 16, 33, 5, 64)])
    assert kiln_dynamo.counters.graphs == 2 and kiln_dynamo.counters.dynamic_fallbacks == []
    # the meta kernels' questions about the sequence length (`Ne(2*Mod(1, s0), 0)`,
    # `Ne(s0, s0**2)`) are settled by its range s0 >= 2: no guard beyond that range
    guards = [r.getMessage() for r in caplog.records if "[guard added]" in r.getMessage()]
    assert guards == []


def _train_against_eager(compiled: Any, model: nn.Module, ref: nn.Module, inputs: list[torch.Tensor]) -> None:
    """One forward and backward per input, compiled and eager: outputs and every gradient equal."""
    for x in inputs:
        out, expected = compiled(x), ref(x)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)


def test_kiln_training_with_a_smaller_last_batch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    _train_against_eager(compiled, model, ref, [torch.randn(b, 6) for b in [16, 16, 10, 16, 7, 3]])
    assert kiln_dynamo.counters.graphs == 2 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert all(r.fell_back is None for r in kiln.compile_log())


def test_what_cannot_take_symbolic_sizes_is_compiled_static_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    def scatter(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        # a float computed from a size by a float `max` as a tensor's fill value: aotgrad
        # refuses a SymFloat made by an operation loopir does not compute in double (an
        # accumulating scatter was the example until the C++ generator took it symbolically,
        # then `n / 3` until Note [A float of sizes keeps its Python operations], then `n ** 0.5`
        # until Note [Floats of sizes remember their operation] kept `**`)
        return torch.full((x.shape[0], 4), max(x.shape[0] / 2, 2.0)).index_add_(0, idx, x)

    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.relu() * 2

    with caplog.at_level(logging.INFO, logger="kiln.aotgrad.dynamic"):
        _sweep(scatter, [(torch.randn(b, 4), torch.randint(0, b, (b,))) for b in (3, 5, 9)])
        graphs = kiln_dynamo.counters.graphs
        # the refusal is per graph: another function still compiles with symbolic sizes
        _sweep(plain, [(torch.randn(b, 4),) for b in (3, 5, 9)])
    assert graphs == 4  # static 3, refused dynamic capture, static 5, static 9
    assert kiln_dynamo.counters.graphs - graphs == 2
    assert [f for f, _ in kiln_dynamo.counters.dynamic_fallbacks] == ["scatter"]
    assert any("symbolic sizes refused" in r.getMessage() for r in caplog.records)


class _Positions(nn.Module):
    """BERT's pattern: a buffer of positions sliced to the sequence length."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pos", torch.arange(64).unsqueeze(0), persistent=False)
        self.emb = nn.Embedding(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.emb(self.pos[:, : x.size(1)]) + x[:, 2:].sum() + x[:, 1::3].sum()


def test_slices_whose_length_the_capture_decided_are_views() -> None:
    """Note [Slice lengths decided at capture]: `x[:, 2:]` needs `s1 >= 2` (the range says so),
    `pos[:, :s1]` of a 64-position buffer needs `s1 <= 64` (a guard); both lower as views of
    the length capture computed, not as eager's slice kernel."""
    torch.manual_seed(0)
    model = _Positions().eval()
    with torch.no_grad():
        _sweep(model, [(torch.randn(2, t, 4),) for t in (5, 9, 33, 64)], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    fallbacks = [op for r in kiln.compile_log() for op, _ in r.op_fallbacks]
    assert not [op for op in fallbacks if "slice" in op], fallbacks


def test_convolutions_with_a_dynamic_batch_stay_symbolic() -> None:
    """The CPU layout policy weighs conv inputs against weights at the size hints: an `int()`
    of a symbolic numel there guarded on the batch, and loopir refused the graph (ResNet in the
    dynamic sweep compiled static per batch size)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.Flatten(),
        nn.LazyLinear(4),
    )
    with torch.no_grad():
        model(torch.randn(2, 3, 16, 16))
        model.eval()
        _sweep(model, [(torch.randn(b, 3, 16, 16),) for b in (2, 8, 5, 32)])
    assert kiln_dynamo.counters.graphs == 2 and kiln_dynamo.counters.dynamic_fallbacks == []
    # the CPU's channels-last input of each convolution is laid out with symbolic strides (its
    # `int()` of a symbolic size sent every convolution of a symbolic graph to a plain extern)
    assert _op_fallbacks() == []


def test_a_symbolic_size_that_a_guard_made_equal_to_a_static_one_broadcasts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Note [Equalities of one symbol of higher degree] (kiln_symbolic): a valid 3x3 convolution
    over an `s x s` image flattened into `BatchNorm1d(64)` guards `Eq(4*(s - 2)**2, 64)`; loopir
    saw two different sizes and sent each broadcast of the batch norm to an extern call, and the
    guard was asked again by every operator. Now `s` is pinned to 6 and every op is a kernel."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(1), nn.BatchNorm1d(64), nn.ReLU()).eval()
    with caplog.at_level(logging.INFO, logger="kiln.symbolic.dynamic"):
        _sweep(model, [(torch.randn(b, 3, 6, 6),) for b in (2, 3, 7)], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert _op_fallbacks() == []
    asked = [r.getMessage() for r in caplog.records if "[guard added]" in r.getMessage()]
    assert sum("64" in m and "(s2 - 2)**2" in m for m in asked) == 1, asked
    assert any(m.startswith("pin s2 = 6") for m in (r.getMessage() for r in caplog.records))


def test_a_pooled_image_of_symbolic_size_is_indexed_without_max_or_digits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A CNN over `s x s` images under `dynamic=True`: torch's strides of each pooled stage are
    `max(1, s // 2**k)` products. The pooling checks bound `s` from below (Note [Lower bounds
    through floor divisions], kiln_symbolic), which settles each `max` (Note [Max and Min settled
    by ranges]); and the mean over the last stage reads its flat positions' digits over the size
    expression `s // 8` (Note [Digits under symbolic sizes], loopir). Before, the convolutions'
    results took the wrappers' flat path and the last kernel kept `std::max`, three divisions and
    moduli per element: 40x slower than the static kernel. Equal to eager at every size."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    channels = 3
    for out in (8, 16, 16):
        layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
        channels = out
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4)).eval()
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code"):
        _sweep(model, [(torch.randn(b, 3, n, n),) for b, n in ((2, 32), (3, 24), (2, 40))], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and _op_fallbacks() == []
    wrapper = "\n".join(r.getMessage() for r in caplog.records)
    paths = re.findall(r"kernels: (\S+)", wrapper)
    assert paths and "_flat(" not in wrapper
    kernels = "".join(Path(p).read_text() for p in paths)
    assert "cpp_fused" in kernels
    # the loop bodies (the thread count, computed once per call, may keep a `max`)
    kernels = "\n".join(line for line in kernels.splitlines() if "ntk" not in line)
    assert not re.search(r"std::max<int64_t>\(INT64_C\(1\), \(+s\d", kernels)
    assert not re.search(r"% \(+s\d", kernels)


def test_scratch_buffers_of_symbolic_size_are_kept_for_the_last_size(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Note [Scratch buffers of symbolic size] (codegen_cpp wrapper.py): a symbolic graph keeps
    its scratch buffers between calls at one size and makes them again when the size changes;
    results equal eager's and an output is never overwritten by a later call, also from several
    threads at once; `symbolic_scratch=0` allocates at every call as before."""
    import kiln_codegen_cpp.wrapper as cpp_wrapper

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.Softmax(-1), nn.Linear(64, 8)
    ).eval()
    made: list[tuple[int, ...]] = []
    fresh = cpp_wrapper.SizedBufferPool.fresh

    def counting(pool: Any, key: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        made.append(key)
        return fresh(pool, key)

    monkeypatch.setattr(cpp_wrapper.SizedBufferPool, "fresh", counting)
    compiled = kiln.compile(model, dynamic=True)
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code"), torch.no_grad():
        compiled(torch.randn(4, 16))
        assert "_P = _take(s0)" in "\n".join(r.getMessage() for r in caplog.records)
        kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for b in (8, 8, 8, 3, 3, 8, 17):
            x = torch.randn(b, 16)
            before = len(made)
            out = compiled(x)
            kept.append((x, out, out.clone()))
            torch.testing.assert_close(out, model(x))
            changed = len(kept) == 1 or kept[-2][0].size(0) != b
            assert (len(made) > before) == changed, (b, made[before:])
        for _x, out, copy in kept:  # later calls left every output alone
            torch.testing.assert_close(out, copy, rtol=0, atol=0)
        results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def worker(i: int) -> None:
            with torch.no_grad():  # grad mode is per thread
                for _ in range(20):
                    x = torch.randn(2 + i % 3, 16)
                    results[i] = (x, compiled(x))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for x, out in results.values():
            torch.testing.assert_close(out, model(x))
    assert kiln_dynamo.counters.graphs == 1 and _op_fallbacks() == []
    kiln.reset()
    caplog.clear()
    monkeypatch.setenv("KILN_CPP_OPTIONS", "symbolic_scratch=0")
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code"), torch.no_grad():
        x = torch.randn(5, 16)
        torch.testing.assert_close(kiln.compile(model, dynamic=True)(x), model(x))
    source = "\n".join(r.getMessage() for r in caplog.records)
    assert "def call(" in source and "_take(" not in source


@pytest.mark.parametrize("reduce", ["sum", "mean", "var", "amax"])
def test_column_reductions_over_symbolic_lengths(reduce: str, caplog: pytest.LogCaptureFixture) -> None:
    """Note [Column reductions over symbolic lengths] (codegen_cpp kernel.py): a reduction over
    the positions of a channels-last image of any size, 128 channels, blocks its static channel
    loop as the static kernel does (before: the reduced loop vectorized, its elements a channel
    apart, 8x slower); equal to eager at lengths around the 8-lane width and odd ones."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return getattr(x.relu(), reduce)((1, 2)) * 2

    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code"):
        # automatic dynamic: batch, height and width become symbolic, the 128 channels stay
        _sweep(f, [(torch.randn(b, n, n + 1, 128),) for b, n in ((2, 3), (3, 8), (2, 9), (5, 4), (4, 7))])
    assert kiln_dynamo.counters.graphs == 2 and _op_fallbacks() == []
    paths = re.findall(r"kernels: (\S+)", "\n".join(r.getMessage() for r in caplog.records))
    assert len(paths) == 2 and "int64_t s0" in Path(paths[-1]).read_text()
    assert all("xblk" in Path(p).read_text() for p in paths)


# Note [Guards from slices and views of symbolic sizes] (`python packages/kiln/bench/slice_guards.py`
# prints the whole table, 24 cases): which shape guards a slice, view or
# reshape of a symbolic dim costs, against torch.compile 2.13 on the same code. Each case runs
# with `dynamic=True` at sizes 9, 8, 7, 5, 4, 3, 2, 1, 0 of dim 1; the counts are kiln's compiles
# and, in the comment, torch.compile's (aot_eager and inductor counted the same where both were
# run). kiln never compiles more often. The guards that remain are torch's too, and needed:
# - `n - k != 1` for a slice of length n - k (`x[:, 1:n-1]`, `x[:, :-1]`, `x[:, 2:]`): broadcasting
#   and contiguity branch on "is this dim 1"; a length-1 slice broadcasts against a longer dim
#   where a longer one raises or must equal it, and a size-1 dim makes any stride contiguous
#   (eager returns other strides for `.contiguous()`/`.view`). The general path would be wrong.
# - `n - k != 0` / `numel >= 2` for an empty slice where the result is computed (functional views,
#   `contiguous`): an empty tensor's strides and the view/copy choice differ from a non-empty one's.
# - `n // 2 != 2`, `n * ((n // 2) % 2) != 0` for `view`/`reshape` into derived sizes: the view
#   algorithm needs those products exactly (torch's `_reshape_view_helper` asks the same).
# - `n <= 64` for `pos[:, :n]` of a 64-row buffer (BERT's position ids): a longer slice is clamped,
#   so a graph computing length n would read past the buffer.
# Fewer than torch.compile where a view output needs no functional copy (`x[:, 1:n-1]` alone,
# `softmax` over it: no `!= 0` guard) and where `chunk`/`split`/`unfold`/`flip` lower without
# per-size specialization. Sizes 0 and 1 of the input's dim compile static graphs of their own
# (Note [0/1 specialization]).
SLICE_CASES: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], int]] = [
    ("inner", lambda x: x[:, 1 : x.size(1) - 1] * 2, 5),  # torch.compile 5
    ("inner_view", lambda x: x[:, 1 : x.size(1) - 1], 4),  # torch.compile 5
    ("inner_softmax", lambda x: x[:, 1 : x.size(1) - 1].softmax(-1), 4),  # torch.compile 5
    ("shift", lambda x: x[:, :-1] + x[:, 1:], 4),  # torch.compile 4
    (
        "rotate_half",
        lambda x: torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1),
        4,
    ),  # 5
    ("narrow", lambda x: x.narrow(1, 1, x.size(1) - 1) * 2, 3),  # torch.compile 3
    ("chunk", lambda x: sum(c.sum() for c in x.chunk(2, dim=1)), 3),  # torch.compile 5
    ("expand", lambda x: x[:, None, :, None].expand(x.size(0), 2, x.size(1), x.size(1)).sum(), 3),  # 3
]


@pytest.mark.parametrize(("fn", "compiles"), [c[1:] for c in SLICE_CASES], ids=[c[0] for c in SLICE_CASES])
def test_slices_of_symbolic_sizes_compile_no_more_often_than_torch(
    fn: Callable[[torch.Tensor], torch.Tensor], compiles: int
) -> None:
    """Note [Guards from slices and views of symbolic sizes]: results, shapes and dtypes equal
    eager's at every size down to 0 (strides too, for non-empty results; an error where eager
    raises), with the compile count of the Note's table."""
    compiled = kiln.compile(fn, dynamic=True)
    with torch.no_grad():
        for n in (9, 8, 7, 5, 4, 3, 2, 1, 0):
            x = torch.randn(4 if n != 4 else 6, n)
            try:
                expected = fn(x)
            except RuntimeError as error:  # `narrow` to length -1: kiln raises as eager does
                with pytest.raises(type(error)):
                    compiled(x)
                continue
            out = compiled(x)
            torch.testing.assert_close(out, expected)
            if expected.numel():
                assert out.stride() == expected.stride(), (n, out.stride(), expected.stride())
    assert all(r.fell_back is None for r in kiln.compile_log())
    assert kiln_dynamo.counters.dynamic_fallbacks == []
    assert kiln_dynamo.counters.graphs == compiles


POOLS: list[Callable[[torch.Tensor], torch.Tensor]] = [
    lambda x: nn.functional.max_pool2d(x.relu(), 2) * 2,
    lambda x: nn.functional.max_pool2d(x, 3, 2, 1).sum((2, 3)),
    lambda x: nn.functional.max_pool2d(x, 3, 2, 0, ceil_mode=True) + 1,
    lambda x: nn.functional.max_pool2d(x, 2, 1, 0, 2),
]
POOL_SHAPES = [(2, 9, 8), (3, 12, 7), (4, 16, 16), (2, 5, 6), (3, 11, 13)]


def _pool_inputs() -> list[tuple[torch.Tensor]]:
    torch.manual_seed(0)
    xs = [torch.randn(n, 3, h, w) for n, h, w in POOL_SHAPES]
    xs[0][0, 0, 0, :] = float("nan")  # a NaN wins its window, as in eager
    return [(x,) for x in xs]


@pytest.mark.parametrize("pool", POOLS, ids=["k2", "k3s2p1", "ceil_mode", "dilation"])
def test_max_pool_over_symbolic_sizes_is_a_kernel(pool: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Note [Max pooling over symbolic sizes]: batch, height and width symbolic, one graph, every
    result (NaNs, padding, ceil_mode's last window) equal to eager, no extern max_pool2d."""
    compiled = kiln.compile(pool, dynamic=True)
    with torch.no_grad():
        for (x,) in _pool_inputs():
            out, expected = compiled(x), pool(x)
            torch.testing.assert_close(out, expected, equal_nan=True)
            assert out.stride() == expected.stride()
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert all(r.fell_back is None for r in kiln.compile_log())
    assert [op for r in kiln.compile_log() for op, _ in r.op_fallbacks] == []


def test_max_pool_over_symbolic_sizes_trains() -> None:
    """The indices the pooling kernel computes (flat positions over a symbolic width) feed the
    backward's gather kernel (Note [Max pooling backward as a gather]: candidate windows masked by
    symbolic output sizes): gradients equal eager's at every size, one graph per direction."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    ref = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    ref.load_state_dict(model.state_dict())
    # the gather on the CPU too (Note [Overlapping max pooling backward on the CPU])
    compiled = kiln.compile(model, dynamic=True, options={"pool_backward": "force"})
    sizes = [(2, 9, 8), (4, 16, 16), (5, 11, 13), (6, 7, 10)]
    _train_against_eager(compiled, model, ref, [torch.randn(n, 3, h, w) for n, h, w in sizes])
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert all(r.fell_back is None for r in kiln.compile_log())
    assert [op for r in kiln.compile_log() for op, _ in r.op_fallbacks] == []  # the backward too


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_batch_norm_training_updates_its_running_statistics_once(
    dynamic: bool | None, cpu_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Note [Batch norm under symbolic sizes] (aotgrad): under symbolic sizes torch's batch-norm
    entry failed half-way and the operator was kept with the running mean it had already
    updated, so the running mean moved twice a step (outputs and gradients were right). Every
    buffer, output and gradient equals eager's at each batch size, and nothing falls back."""
    if cpu_backend == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)

    def net() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(3, 4, 3),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(1),
            nn.BatchNorm1d(4),
        )

    model, ref = net(), net()
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, dynamic=dynamic, options={"cpu_backend": cpu_backend})
    for b in [2, 3, 5, 8]:
        x = torch.randn(b, 3, 6, 6)
        out, expected = compiled(x), ref(x)
        torch.testing.assert_close(out, expected)
        # a squared loss: the gradient of a plain sum through a batch norm is ~0, all rounding
        (out**2).sum().backward()
        (expected**2).sum().backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
            p.grad = q.grad = None
        for (name, mine), theirs in zip(model.named_buffers(), ref.buffers(), strict=True):
            torch.testing.assert_close(
                mine, theirs, msg=lambda m, name=name, b=b: f"{name} at batch {b}: {m}"
            )
    assert _op_fallbacks() == []
    assert all(r.fell_back is None for r in kiln.compile_log())
    assert kiln_dynamo.counters.graphs == (1 if dynamic else 2)


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_a_gemm_of_symbolic_tokens_is_padded_along_its_static_dims(
    cpu_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Note [Padding GEMMs of symbolic size] (loopir pad_mm.py): a tied LM head whose vocabulary
    is misaligned is padded along N in the symbolic graph too (its tokens M = batch*length stay
    unpadded), compiled once, equal to eager at every size, the logits a view of the padded GEMM."""
    torch.manual_seed(0)
    emb, ln = nn.Embedding(1001, 16), nn.LayerNorm(16)

    def lm(ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(ln(emb(ids)), emb.weight)

    compiled = kiln.compile(lm, dynamic=True, options={"cpu_backend": cpu_backend, "pad_mm": "force"})
    with caplog.at_level("DEBUG", logger="kiln.loopir.passes"), torch.no_grad():
        for b, t in ((2, 5), (3, 7), (4, 16)):
            ids = torch.randint(0, 1001, (b, t))
            got = compiled(ids)
            torch.testing.assert_close(got, lm(ids))
            # copied to eager's strides where the program sees it (Note [Padded results the
            # program sees]); the GEMM itself ran padded (the log below)
            assert got.shape == (b, t, 1001) and got.stride() == (t * 1001, 1001, 1)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert "pad_mm: pad mm_default (aten.mm.default, torch.float32): N 1001->1004" in caplog.text


def test_a_padding_rewrite_that_fails_leaves_the_gemm_unpadded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A GEMM whose padding cannot be written into the symbolic graph stays as it was: the graph
    still compiles once with symbolic sizes, equal to eager, and the log says why."""
    from kiln_loopir.passes import pad_mm

    def fail(node: Any) -> Any:
        raise NotImplementedError("no value")

    monkeypatch.setattr(pad_mm, "_symbolic_val", fail)
    lin = nn.Linear(16, 1001, bias=False)  # a parameter: its sizes stay static

    def head(x: torch.Tensor) -> torch.Tensor:
        return lin(torch.relu(x))

    compiled = kiln.compile(head, dynamic=True, options={"pad_mm": "force"})
    with caplog.at_level("DEBUG", logger="kiln.loopir.passes"):
        for b in (2, 3, 5):
            x = torch.randn(b, 4, 16)
            with torch.no_grad():
                got = compiled(x)
                torch.testing.assert_close(got, head(x))
            assert got.stride() == (4 * 1001, 1001, 1)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert "the rewrite failed (NotImplementedError: no value)" in caplog.text


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_arange_keeps_its_start_and_step_with_a_symbolic_end(cpu_backend: str) -> None:
    """Note [The bounds of arange] (loopir creation.py): ``arange(-2, s + 2)`` (reflection padding's
    index) counted from 0 under symbolic sizes, a wrong answer; reflection, replication and circular
    padding, and aranges whose start, end or step are sizes, equal eager at every size."""

    def pads(x: torch.Tensor) -> torch.Tensor:
        y = x.unsqueeze(0)
        return torch.cat(
            [torch.nn.functional.pad(y, (2, 3), mode=m) for m in ("reflect", "replicate", "circular")], -1
        )

    def ranges(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        a = torch.arange(n, 3 * n + 1, 2)
        c = torch.arange(-3, n, n - 1)
        return a.sum() + c.sum() + x.sum()

    def float_range(x: torch.Tensor) -> torch.Tensor:  # its length is a ceiling: compiled static
        return torch.arange(-1.5, x.shape[0], 0.5).sum() + x.sum()

    for fn in (pads, ranges, float_range):
        kiln.reset()
        compiled = kiln.compile(fn, dynamic=True, options={"cpu_backend": cpu_backend})
        for n in (4, 5, 9):
            x = torch.randn(n, 6)
            torch.testing.assert_close(compiled(x), fn(x))
        assert fn is float_range or kiln_dynamo.counters.dynamic_fallbacks == []


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_recurrent_layers_under_symbolic_sizes_run_as_eager(cpu_backend: str) -> None:
    """nn.LSTM/nn.GRU check their hidden state's size against a tuple; under symbolic sizes that
    comparison was False (Note [Equality of sizes and sequences] in kiln_dynamo's translator), so
    the compiled layer raised "Expected hidden[0] size (1, 2, 8), got [1, 2, 8]" where eager ran."""
    torch.manual_seed(0)
    for layer in (nn.LSTM(8, 8, batch_first=True), nn.GRU(8, 8, batch_first=True)):
        kiln.reset()
        compiled = kiln.compile(layer, dynamic=True, options={"cpu_backend": cpu_backend})
        for b, t in ((2, 5), (3, 7)):
            x = torch.randn(b, t, 8)
            with torch.no_grad():
                torch.testing.assert_close(compiled(x)[0], layer(x)[0])


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_floor_division_of_negative_size_expressions(cpu_backend: str) -> None:
    """Note [Floor division of values that may be negative] (loopir indexing.py): a size used as a
    scalar divides by floor as in Python; C++'s ``/`` and Triton's ``//`` truncate, and gave -1
    where Python gives -2 (``(-5) // 4``), a wrong answer in both code generators."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        cols = [x[:, 0] + (-n) // 4, x[:, 0] + (n - 7) // 3, x[:, 0] + (1 - n) % 3, x[:, 0] + (-n) % 4]
        return torch.stack(cols), x + (-n) // 4

    for dynamic in (None, True):
        kiln.reset()
        compiled = kiln.compile(f, dynamic=dynamic, options={"cpu_backend": cpu_backend})
        for n in (4, 5, 6, 7, 9):
            x = torch.randn(n, 3)
            torch.testing.assert_close(compiled(x), f(x))


class _ChannelsFirstNorm(nn.Module):
    """ConvNeXt's LayerNorm over the channels of an [N, C, H, W] image (as transformers writes it)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.randn(c) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + 1e-6)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class _ConvNeXtBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.up, self.act, self.down = nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        y = self.down(self.act(self.up(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class _ConvNeXt(nn.Module):
    """A tiny ConvNeXt as transformers builds it: a 4x4 patch convolution, channels-first
    LayerNorms, 7x7 depthwise convolutions and Linear layers over a permute to [N, H, W, C] and back,
    2x2 downsampling convolutions, a pooled head."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 256)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 4, stride=4), _ChannelsFirstNorm(widths[0])]
        for i, c in enumerate(widths):
            if i:
                layers += [_ChannelsFirstNorm(widths[i - 1]), nn.Conv2d(widths[i - 1], c, 2, stride=2)]
            layers.append(_ConvNeXtBlock(c))
        self.features = nn.Sequential(*layers)
        self.norm, self.head = nn.LayerNorm(widths[-1]), nn.Linear(widths[-1], 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(x).mean([-2, -1])))


def _convnext() -> nn.Module:
    torch.manual_seed(0)
    return _ConvNeXt().eval()


def test_views_over_a_pooled_image_of_symbolic_size_are_not_copies(caplog: pytest.LogCaptureFixture) -> None:
    """A ConvNeXt block under `dynamic=True` (batch and image size symbolic): the permutes around
    its LayerNorms and the `[N*H*W, C]` views its Linear layers read are strides over `s // 4`,
    a size expression (Note [Views with symbolic strides], Note [Symbolic divisors], loopir).
    Before, `s // 4` counted as a digit of a loop variable, and each view became a copy kernel
    (issue 17: ConvNeXt 1.14x slower than its static compiles). Equal to eager at every size."""
    torch.manual_seed(0)
    model = _convnext()
    sizes = ((2, 64), (8, 64), (3, 96), (2, 64))
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code"):
        _sweep(model, [(torch.randn(b, 3, n, n),) for b, n in sizes], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and _op_fallbacks() == []
    wrapper = "\n".join(r.getMessage() for r in caplog.records)
    kernels = re.findall(r"k_(cpp_fused_\w+?)_\d+\(", wrapper)
    assert kernels and not [k for k in kernels if k.endswith(("_view", "_permute"))], kernels


@pytest.mark.parametrize("model_kind", ["resnet_block", "convnext_block"])
def test_the_cpu_layout_rule_does_not_depend_on_the_first_batch(
    model_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Note [The CPU rule under a symbolic batch] (loopir): a graph with a symbolic batch counts
    the convolutions' inputs at the smallest batch, so its layouts are the same whichever batch
    it is first called with; equal to eager at every batch."""
    torch.manual_seed(0)
    if model_kind == "resnet_block":
        model: nn.Module = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4),
        ).eval()  # fmt: skip
    else:
        model = _convnext()
    verdicts = []
    for first in (2, 16):
        kiln.reset()
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"):
            image = 64 if model_kind == "convnext_block" else 8  # the ResNet block: 2432 < 2736 < 19456
            _sweep(model, [(torch.randn(b, 3, image, image),) for b in (first, 5, 18 - first)], dynamic=True)
        assert kiln_dynamo.counters.graphs == 1
        verdicts += [r.getMessage() for r in caplog.records if r.getMessage().startswith("layout:")]
    assert len(verdicts) == 2 and verdicts[0] == verdicts[1], verdicts
    # ConvNeXt's depthwise convolutions choose NHWC at any batch (Note [Depthwise convolutions on
    # the CPU]); the ResNet block's inputs weigh more than its weights from batch 3 on: both
    # layouts are compiled, and the sweep's batches (2, 5, 16) run both (Note [Both layouts under
    # a symbolic batch])
    want = "channels-last" if model_kind == "convnext_block" else "NHWC from batch 3, eager layouts below"
    assert want in verdicts[0], verdicts


def test_stride_4_patchify_stem_compiles_once_under_dynamic_true() -> None:
    """A ConvNeXt/Swin-style stem (a 4x4 convolution of stride 4) under ``dynamic=True``: its
    NHWC result is copied back to eager's symbolic strides without guarding on them (Note
    [Symbolic sizes in loopir]: ``copy_with_strides``, ``dense_tensor``); before, loopir
    specialized the image side and dynamo fell back to a static graph per size."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 4, stride=4), nn.GELU(), nn.Conv2d(16, 8, 1)).eval()
    _sweep(model, [(torch.randn(b, 3, s, s),) for b, s in ((2, 32), (3, 64), (5, 40))], dynamic=True)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert all(r.fell_back is None for r in kiln.compile_log())


# --- sizes at the edges: a hint of 1, a size of 0, dims equal on the first call -----------------
class _PoolNet(nn.Module):
    """Convolution, BatchNorm, max-pool: a 3-channel input, so a batch of 3 equals the channels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.head = (
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.Conv2d(8, 8, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return nn.functional.adaptive_avg_pool2d(self.head(y), 1).flatten(1)


class _Attention(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.qkv, self.out, self.norm, self.heads = (
            nn.Linear(d, 3 * d),
            nn.Linear(d, d),
            nn.LayerNorm(d),
            heads,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            y.view(b, t, self.heads, c // self.heads).transpose(1, 2)
            for y in self.qkv(self.norm(x)).split(c, -1)
        )
        a = ((q @ k.transpose(-1, -2)) * (c // self.heads) ** -0.5).softmax(-1)
        return x + self.out((a @ v).transpose(1, 2).reshape(b, t, c))


def _edge_model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    return (_PoolNet() if kind == "cnn" else _Attention()).eval()


_EDGE_INPUTS: dict[str, Callable[[int], torch.Tensor]] = {
    "mlp": lambda b: torch.randn(b, 32),
    "cnn": lambda b: torch.randn(b, 3, 16, 16),
    "attention": lambda b: torch.randn(b, 8, 32),
}


# (batches, dynamic, graphs per model) with torch.compile 2.13's count (backend="eager") in the
# comment where it differs. Every call is compared with eager, empty outputs included.
@pytest.mark.parametrize(
    ("batches", "dynamic", "graphs"),
    [
        ((1, 4, 7), True, {"mlp": 2, "cnn": 2, "attention": 2}),  # 1 is static, then one dynamic graph
        ((4, 8, 1, 16), None, {"mlp": 3, "cnn": 3, "attention": 3}),  # torch: cnn 4
        ((4, 8, 0, 5), None, {"mlp": 3, "cnn": 3, "attention": 3}),
        # batch 3 after batch 0: the changed batch gets a symbol of its own, not the channels'
        # duck-sized one (Note [Automatic dynamic under dynamic=True]); the CNN compiled 3 before
        ((0, 3, 5), True, {"mlp": 2, "cnn": 2, "attention": 2}),
        # batch 3 first: duck-sized with the channels, which the convolution pins; 3 as torch
        ((3, 0, 5), True, {"mlp": 2, "cnn": 3, "attention": 2}),
    ],
)
@pytest.mark.parametrize("kind", ["mlp", "cnn", "attention"])
def test_batches_of_one_and_zero_compile_as_often_as_torch(
    kind: str, batches: tuple[int, ...], dynamic: bool | None, graphs: dict[str, int]
) -> None:
    _sweep(_edge_model(kind), [(_EDGE_INPUTS[kind](b),) for b in batches], dynamic=dynamic)
    assert kiln_dynamo.counters.graphs == graphs[kind] and kiln_dynamo.counters.dynamic_fallbacks == []


class _SquareUse(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x @ x.t()).relu().sum(1) + x.sum(1), x.softmax(-1), x.mean(0, keepdim=True) - x


@pytest.mark.parametrize(
    ("kind", "shapes", "graphs"),
    [
        # a square matrix, then rows and columns apart
        ("square", [(16, 16), (16, 8), (8, 16), (5, 5)], {None: 3, True: 2}),
        # sequence length == hidden size on the first call
        ("attention", [(2, 32, 32), (2, 16, 32), (4, 8, 32)], {None: 3, True: 2}),
        # batch 32 of 32x32 images; torch: 3 under dynamic=True
        ("cnn", [(32, 3, 32, 32), (8, 3, 32, 32), (16, 3, 24, 24), (32, 3, 32, 32)], {None: 3, True: 2}),
    ],
)
@pytest.mark.parametrize("dynamic", [None, True])
def test_dims_equal_on_the_first_call_then_apart(
    kind: str, shapes: list[tuple[int, ...]], graphs: dict[bool | None, int], dynamic: bool | None
) -> None:
    model = _SquareUse() if kind == "square" else _edge_model(kind)
    _sweep(model, [(torch.randn(*s),) for s in shapes], dynamic=dynamic)
    assert kiln_dynamo.counters.graphs == graphs[dynamic] and kiln_dynamo.counters.dynamic_fallbacks == []


def _size_builtins(x: torch.Tensor) -> Any:
    n = x.shape[0]
    q, r = divmod(n, 3)
    return x * max(n, 4) + min(n, x.shape[1]) + x[: max(n - 3, 2)].sum(), (
        q,
        r,
        math.ceil(n / 2),
        int(n * 0.5),
        round(n / 3),
        abs(3 - n),
        float(n),
        bool(n),
        n / 2,
        pow(n, 2),
        math.floor(n / 4),
    )


def test_builtins_on_sizes_stay_symbolic() -> None:
    """Note [Builtins on symbolic numbers] and Note [Symbolic numbers stay out of the graph until a
    tensor needs them] (kiln_dynamo): `max`, `min`, `divmod`, `round`, `math.ceil`, `int`, `abs`,
    `float`, `bool` on sizes no longer specialize them: one graph for every size under
    `dynamic=True`, `max`/`min` computed in the kernels, the Python results (ints and floats of
    eager's types) computed from the sizes when the frame returns."""
    compiled = kiln.compile(_size_builtins, dynamic=True)
    for rows, cols in ((4, 6), (5, 6), (7, 8), (6, 10), (2, 3), (3, 9)):
        x = torch.randn(rows, cols)
        got, want = compiled(x), _size_builtins(x)
        torch.testing.assert_close(got, want)
        assert [type(v) for v in got[1]] == [type(v) for v in want[1]]
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []


def _size_comparisons(x: torch.Tensor, n: int) -> Any:
    m = x.shape[0]
    return x * 2, (
        m in (4, 7),
        m not in (4, 7),
        x.shape[:1] == (n * 2,),
        x.shape[:1] != (n * 2,),
        [m, n] == [8, 2],
        n in (2, 4, "four"),  # a string among the items: Python's one-by-one answer
        (m, "a") == (m, "a"),
    )


def _branch_on_membership(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if x.shape[0] in (4, 7) else x - 1


def test_comparisons_of_sizes_stay_symbolic() -> None:
    """Note [Comparisons of sizes stay symbolic] (kiln_dynamo): `in` and sequence equality over
    size symbols are SymBools computed when the frame returns, not guards that pin the size:
    one graph under `dynamic=True`, as torch.compile; a branch on one is one guard."""
    compiled = kiln.compile(_size_comparisons, dynamic=True)
    for rows, n in ((4, 2), (8, 2), (7, 3), (10, 5), (6, 4), (12, 6)):
        x = torch.randn(rows, 3)
        got, want = compiled(x, n), _size_comparisons(x, n)
        torch.testing.assert_close(got, want)
        assert [type(v) for v in got[1]] == [type(v) for v in want[1]]
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    kiln.reset()
    branch = kiln.compile(_branch_on_membership, dynamic=True)
    for rows in (4, 5, 7, 6, 4):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(branch(x), _branch_on_membership(x))
    # one graph for the sizes in (4, 7) and one for the others: the guard is the `Or`, not `== 4`
    assert kiln_dynamo.counters.graphs == 2


def _floats_of_sizes(x: torch.Tensor, n: int) -> Any:
    m = x.shape[0]
    return (
        torch.full((2, x.shape[1]), n / 3),
        x + (m / 7 + 1) + 2,
        x * (float(m) * 0.1 * 3),
        torch.full((3,), (n - m) / 3, dtype=torch.int64),
        torch.full((2,), -(n / 3.0), dtype=torch.float64),
    )


def test_floats_of_sizes_are_computed_in_the_kernel() -> None:
    """Note [A float of sizes keeps its Python operations] (kiln_aotgrad) and Note [Floats of
    sizes in C++]: a Python float computed from sizes (`n / 3`) as a fill value or a scalar
    operand no longer compiles the graph static per size: one graph under `dynamic=True`, and
    bit-for-bit eager's values (double arithmetic in Python's order, then eager's conversion)."""
    compiled = kiln.compile(_floats_of_sizes, dynamic=True, options={"cpu_backend": "cpp"})
    for rows, n in ((8, 2), (8, 3), (12, 4), (10, 5), (6, 3), (13, 7)):
        x = torch.randn(rows, 5)
        for got, want in zip(compiled(x, n), _floats_of_sizes(x, n), strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want)
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []


def _size_text_and_order(x: torch.Tensor) -> Any:
    return x + 1, (
        f"n={x.shape[0]}",
        str(x.shape),
        sorted([x.shape[1], x.shape[0], 5]),
        list(reversed(x.shape)),
    )


def test_strings_and_order_of_sizes_stay_symbolic() -> None:
    """Note [Strings formatted from symbolic sizes] (kiln_dynamo): `f"n={n}"` and `str(x.shape)`
    are built by the runner, `sorted` of sizes guards the order: no break, a graph per order of
    the sizes (torch.compile: a graph per size and frame, 12 for these sizes)."""
    compiled = kiln.compile(_size_text_and_order, dynamic=True, options={"cpu_backend": "cpp"})
    for a, b in ((4, 6), (5, 6), (7, 8), (6, 10), (3, 9)):
        x = torch.randn(a, b)
        got, want = compiled(x), _size_text_and_order(x)
        torch.testing.assert_close(got[0], want[0])
        assert repr(got[1]) == repr(want[1]) and [type(v) for v in got[1]] == [type(v) for v in want[1]]
    # a < 5 < b (4x6, 5x6, 3x9), then 5 < a < b (7x8, 6x10)
    assert kiln_dynamo.counters.graphs == 2 and kiln_dynamo.counters.dynamic_fallbacks == []


def _grads_against_eager(
    fn: Callable[..., Any], argsets: Sequence[tuple[torch.Tensor, ...]], **compile_kw: Any
) -> None:
    """Each call's output and every input's gradient (a random output weighting) as eager's."""
    compiled = kiln.compile(fn, **compile_kw)
    for args in argsets:
        mine = [a.detach().clone().requires_grad_() for a in args]
        ref = [a.detach().clone().requires_grad_() for a in args]
        out, want = compiled(*mine), fn(*ref)
        torch.testing.assert_close(out, want)
        weight = torch.randn_like(want)
        (out * weight).sum().backward()
        (want * weight).sum().backward()
        for a, b in zip(mine, ref, strict=True):
            torch.testing.assert_close(a.grad, b.grad)
    assert all(r.fell_back is None for r in kiln.compile_log())


def _kv_cat(k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([k, x], 1) * 2


def _rotary_half_swap(k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    half = x.shape[1] // 2
    return torch.cat([-x[:, half:], x[:, :half]], 1) * k.sum()


def _constant_pad(k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(k, (0, 0, 1, 2), value=0.5) * 2 + x.sum()


def _reflect_and_replicate_pads(k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    reflected = torch.nn.functional.pad(k.unsqueeze(0), (0, 0, 2, 1), mode="reflect").squeeze(0)
    replicated = torch.nn.functional.pad(x.unsqueeze(0), (0, 0, 1, 1), mode="replicate").squeeze(0)
    return reflected[:, 2:-1] * 3 + replicated[:, 1:-2]


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
@pytest.mark.parametrize(
    "fn",
    [_kv_cat, _rotary_half_swap, _constant_pad, _reflect_and_replicate_pads],
    ids=["kv_cat", "rotary", "constant_pad", "reflect_replicate"],
)
def test_cat_and_pad_backwards_compile_once_for_every_length(
    cpu_backend: str, fn: Callable[..., Any]
) -> None:
    """kiln_aotgrad's Note [Symbols the backward binds]: the backward of `cat` and `pad` slices
    a tangent of size `s1 + s2` (or `s1 + 3`); the symbols reach it as saved ints, so one
    forward and one backward serve every length (before: the KV concat and the constant pad
    compiled static per length)."""
    lengths = (5, 7, 10, 17)  # no length equal to another size (duck sizing would guard it)
    argsets = [(torch.randn(2, n, 4), torch.randn(2, n + 1, 4)) for n in lengths]
    _grads_against_eager(fn, argsets, dynamic=True, options={"cpu_backend": cpu_backend})
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert [r.symbolic for r in kiln.compile_log()] == [True]


def _interpolate_align_corners(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    up = torch.nn.functional.interpolate(x, size=(2 * x.shape[-1] + 1,), mode="linear", align_corners=True)
    return (
        up.sum(-1)
        + torch.nn.functional.interpolate(y, size=(7, 9), mode="bilinear", align_corners=True).sum()
    )


def _sdpa_default_scale(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, k * 2)


def _var_backward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.var(-1) * 2 + x.std(-1) + y.var(1, correction=0).sum()


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
@pytest.mark.parametrize(
    ("fn", "shapes"),
    [
        (_interpolate_align_corners, lambda n: [(1, 3, n), (1, 2, n + 1, n + 3)]),
        (_sdpa_default_scale, lambda n: [(1, 2, 6, n), (1, 2, 9, n)]),
        (_var_backward, lambda n: [(6, n), (9, n + 2)]),
    ],
    ids=["interpolate", "sdpa", "var"],
)
def test_floats_of_sizes_inside_decompositions_stay_symbolic(
    cpu_backend: str, fn: Callable[..., Any], shapes: Callable[[int], list[tuple[int, ...]]]
) -> None:
    """kiln_symbolic's Note [Floats of sizes remember their operation]: align_corners' scale
    `(n - 1) / (m - 1)` and var's backward `2.0 / (n - 1)` are computed from sizes inside
    decompositions; the trace replays their operations in the graph, so one compile serves every
    size (before: refused, a static compile per size). SDPA's `1 / sqrt(E)` compiled symbolically
    before too: its case guards that it stays so."""
    argsets = [tuple(torch.randn(s) for s in shapes(n)) for n in (5, 7, 11, 16)]
    _grads_against_eager(fn, argsets, dynamic=True, options={"cpu_backend": cpu_backend})
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert [r.symbolic for r in kiln.compile_log()] == [True]


def _scales_of_the_head_dim(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    e = q.shape[-1]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(e) + q.sum(-1, keepdim=True) * e**-0.5
    return scores.softmax(-1) @ k * torch.sym_sqrt(e) + torch.nn.functional.scaled_dot_product_attention(
        q, k, k * 2
    )


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_square_roots_and_powers_of_sizes_stay_symbolic(cpu_backend: str) -> None:
    """kiln_symbolic's Note [Floats of sizes remember their operation]: `x / math.sqrt(E)`
    (dynamo's `torch.sym_sqrt`), `E ** -0.5` and SDPA's default scale over a symbolic head dim
    are one C `sqrt`/`pow` of doubles in the kernels (the wrapper's Python under Triton), so
    one compile serves every head dim (before: `**` and `sym_sqrt` were refused, a static
    compile per size, and `math.sqrt` specialized the size in capture)."""
    argsets = [(torch.randn(1, 2, 6, e), torch.randn(1, 2, 9, e)) for e in (5, 7, 11, 16)]
    _grads_against_eager(_scales_of_the_head_dim, argsets, dynamic=True, options={"cpu_backend": cpu_backend})
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert [r.symbolic for r in kiln.compile_log()] == [True]


def _interpolate_by_scale(x: torch.Tensor) -> torch.Tensor:
    f = torch.nn.functional.interpolate
    outs = [
        f(x, scale_factor=1.5, mode="nearest"),
        f(x, scale_factor=1.5, mode="bilinear", align_corners=False),
        f(x, scale_factor=1.5, mode="bilinear", align_corners=True),
        f(x, scale_factor=(0.7, 1 / 3), mode="bilinear"),
        f(x, size=(x.shape[-2] + 3, 2 * x.shape[-1] - 1), mode="nearest"),
        f(x, size=(x.shape[-2] + 3, 2 * x.shape[-1] - 1), mode="bilinear", align_corners=True),
    ]
    return torch.cat([o.flatten(1) for o in outs], 1)


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_interpolate_by_a_non_integer_scale_stays_symbolic(cpu_backend: str) -> None:
    """kiln_symbolic's Note [Integers of floats of sizes]: the output size of
    `interpolate(scale_factor=1.5)` is `trunc(float(n) * 1.5)`, the integer part of Python's
    double (printed as `std::trunc` of the double in C++, computed by the wrapper under Triton),
    so one forward and one backward serve every size, odd ones included (before: refused, a
    static compile per size)."""
    argsets = [(torch.randn(1, 2, h, h + 2),) for h in (5, 7, 10, 13)]
    _grads_against_eager(_interpolate_by_scale, argsets, dynamic=True, options={"cpu_backend": cpu_backend})
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert [r.symbolic for r in kiln.compile_log()] == [True]


def _long_reductions(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x * w
    return h.sum() * 0.5 + h.amax(0).sum() + h.sum(0).sum()


def test_a_long_reduction_over_symbolic_rows_splits_under_triton(caplog: pytest.LogCaptureFixture) -> None:
    """kiln_codegen_triton's Note [Split reductions under symbolic sizes]: `h.sum()` and the
    column reductions of a [n, 24] activation over n rows split in chunks counted at the n of
    the symbolic compile (the second call's) and of length ceil(n / S) after; forward and
    backward are one compile for every later n, odd and far below the hint included (before:
    one looped kernel of a few programs)."""
    argsets = [
        (torch.randn(n, 24, dtype=torch.float64), torch.randn(24, dtype=torch.float64))
        for n in (2500, 3100, 7, 1031, 3)
    ]
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_triton.output_code"):
        _grads_against_eager(_long_reductions, argsets, options={"cpu_backend": "triton"})
    assert kiln_dynamo.counters.graphs == 2 and kiln_dynamo.counters.dynamic_fallbacks == []
    assert [r.symbolic for r in kiln.compile_log()] == [False, True]
    assert any("chunks over the symbolic row" in r.getMessage() for r in caplog.records)


def test_a_training_graph_that_returns_a_symbolic_size() -> None:
    # the autograd Function marked every output that needs no gradient non-differentiable, the
    # size among them: "mark_non_differentiable only accepts variable arguments", and the
    # graph ran eagerly (four graphs of pyfuzz --dynamic true --backend kiln over seeds 400:800)
    def f(x: torch.Tensor) -> Any:
        return x * 2, x.shape[0] * 2

    compiled = kiln.compile(f, dynamic=True)
    for n in (5, 7):
        x = torch.randn(n, 3, requires_grad=True)
        got, size = compiled(x)
        assert size == 2 * n and type(size) is int
        torch.testing.assert_close(got, x * 2)
        got.sum().backward()
        torch.testing.assert_close(x.grad, torch.full((n, 3), 2.0))
    assert all(r.fell_back is None for r in kiln.compile_log())


def _copy_of_a_chunk(x0: torch.Tensor, x1: torch.Tensor) -> None:
    x1.copy_(x0.chunk(3, 0)[2])  # one element, stretched over x1


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_an_expand_of_a_size_the_trace_proved_1(cpu_backend: str) -> None:
    # Note [Stretched sizes the trace proved 1] (kiln_loopir lowering.py): the chunk's length is
    # `s0 - 2*((s0 + 2)//3)`, 1 by a guard, and the expand read past its one element
    x0, x1 = torch.randn(3), torch.randn(5)
    want = x1.clone()
    _copy_of_a_chunk(x0, want)
    kiln.compile(_copy_of_a_chunk, dynamic=True, options={"cpu_backend": cpu_backend})(x0, x1)
    torch.testing.assert_close(x1, want)


def _unfold_patches(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # MobileViT's unfold: a convolution (NHWC under the CPU layout rule) reshaped into 2x2 patches
    y = torch.nn.functional.conv2d(x, w)
    b, c, h, wd = y.shape
    nh, nw = math.ceil(h / 2), math.ceil(wd / 2)
    return y.reshape(b * c * nh, 2, nw, 2).transpose(1, 2) + 1


def test_an_extern_view_of_a_channels_last_value_reads_eager_storage() -> None:
    """Note [Extern views of NHWC values] (kiln_loopir graph.py): the reshape's lowering declines
    under symbolic sizes, and eager's view kernel, handed the NHWC convolution, raised at the first
    call: the graph ran eagerly (the breadth suite's MobileViT under dynamic=True)."""
    w = torch.randn(4, 3, 1, 1)
    compiled = kiln.compile(_unfold_patches, dynamic=True, options={"strict": True})
    with torch.no_grad():
        for s in (8, 12):
            x = torch.randn(2, 3, s, s)
            torch.testing.assert_close(compiled(x, w), _unfold_patches(x, w))
    assert len(kiln.compile_log()) == 1 and not [r for r in kiln.compile_log() if r.fell_back]


def _doubled_in_inference_mode(x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return x * 2 + 1


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_a_graph_run_under_inference_mode_serves_every_size(cpu_backend: str) -> None:
    """Note [A symbolic graph called in another grad mode] (kiln_aotgrad api.py): the runner calls
    a graph traced whole in an inference_mode block with grad off, and the one-size compile that
    call made served every later size: an input of 5, 7 and 3 rows answered 6."""
    compiled = kiln.compile(_doubled_in_inference_mode, options={"cpu_backend": cpu_backend})
    for b in (4, 6, 5, 7, 3):
        x = torch.randn(b, 4)
        got = compiled(x)
        torch.testing.assert_close(got, _doubled_in_inference_mode(x))
        assert got.is_inference()
    log = kiln.compile_log()
    assert [r.symbolic for r in log] == [False, True], log
