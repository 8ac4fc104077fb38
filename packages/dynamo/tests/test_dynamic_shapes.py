"""Dynamic shapes in capture: symbolic sizes, shape guards and the automatic-dynamic lifecycle,
with a graph-only backend; every result is compared with eager."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import CountingBackend, assert_same
from torch import nn

import kiln_dynamo
from kiln_dynamo import counters


class DynamicBackend(CountingBackend):
    """A counting backend that takes graphs with symbolic sizes (it runs them eagerly)."""

    __kiln_dynamic_shapes__ = True

    def placeholder_sizes(self, i: int = -1) -> list[tuple[str, ...]]:
        return [
            tuple(str(s) for s in n.meta["val"].shape)
            for n in self.gms[i].graph.nodes
            if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
        ]


def guard_texts(fn: Callable[..., Any]) -> list[str]:
    """Readable guard parts of the newest cache entry of the last captured frame."""
    return [p.readable for p in _last_captured[-1].guard.parts]


_last_captured: list[Any] = []


@pytest.fixture(autouse=True)
def _listen() -> Any:
    from kiln_dynamo.convert_frame import capture_listeners

    def listen(name: str, captured: Any) -> None:
        _last_captured.append(captured)

    capture_listeners.append(listen)
    yield
    capture_listeners.remove(listen)
    _last_captured.clear()


def run_sizes(
    fn: Callable[..., Any], make_args: Callable[[int], tuple[Any, ...]], sizes: list[int], **compile_kw: Any
) -> DynamicBackend:
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend, **compile_kw)
    for n in sizes:
        args = make_args(n)
        assert_same(fn(*args), compiled(*args))
    assert counters.fallbacks == [], counters.fallbacks
    return backend


def _mlp_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w).sum(-1) + x.size(0)


def test_automatic_dynamic_one_recompile_for_batch_2_to_64() -> None:
    w = torch.randn(8, 4)
    backend = run_sizes(_mlp_fn, lambda b: (torch.randn(b, 8), w), list(range(2, 65)))
    assert backend.graphs == 2 and counters.recompiles == 1
    assert backend.placeholder_sizes(0) == [("2", "8"), ("8", "4")]
    assert backend.placeholder_sizes(1) == [("s0", "8"), ("8", "4")]
    assert "2 <= L['x'].size(0)" in guard_texts(_mlp_fn)


def test_dynamic_false_recompiles_per_size() -> None:
    backend = run_sizes(_mlp_fn, lambda b: (torch.randn(b, 8), torch.randn(8, 4)), [2, 3, 4], dynamic=False)
    assert backend.graphs == 3


def test_dynamic_true_is_symbolic_from_the_first_call_with_duck_sizing() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    backend = run_sizes(f, lambda n: (torch.randn(5, n),), [5], dynamic=True)
    assert backend.placeholder_sizes(0) == [("s0", "s0")]
    assert "L['x'].size(1) == L['x'].size(0)" in guard_texts(f)
    compiled_sizes = [7, 6]  # [5, 7]: the duck guard fails; one more compile serves both
    backend2 = run_sizes(f, lambda n: (torch.randn(5, n),), compiled_sizes, dynamic=True)
    assert backend2.graphs == 1  # a fresh compile: [5, 7] is not duck-sized


def test_zero_one_specialization() -> None:
    backend = run_sizes(_mlp_fn, lambda b: (torch.randn(b, 8), torch.ones(8, 4)), [4, 8, 16, 1, 0, 1, 12])
    # 4 static, 8 dynamic, 16 hit, 1 and 0 each their own static graph, then hits
    assert backend.graphs == 4
    assert backend.placeholder_sizes(2)[0] == ("1", "8")


def test_mark_dynamic_on_size_one_stays_static_without_error() -> None:
    x = torch.randn(1, 3)
    kiln_dynamo.mark_dynamic(x, 0)
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(lambda t: t + 1, backend=backend)
    assert_same(compiled(x), x + 1)
    assert backend.placeholder_sizes(0) == [("1", "3")]


def test_mark_dynamic_with_range_and_mark_static() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    x = torch.randn(8, 3)
    kiln_dynamo.mark_dynamic(x, 0, min=2, max=64)
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(f, backend=backend)
    assert_same(compiled(x), f(x))
    assert backend.placeholder_sizes(0) == [("s0", "3")]
    assert "2 <= L['x'].size(0) <= 64" in guard_texts(f)
    y = torch.randn(65, 3)
    assert_same(compiled(y), f(y))  # outside the range: another entry
    assert backend.graphs == 2

    z = torch.randn(6, 6)
    kiln_dynamo.mark_static(z, 1)
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(f, backend=backend, dynamic=True)
    assert_same(compiled(z), f(z))
    assert backend.placeholder_sizes(0) == [("s0", "6")]


def test_maybe_mark_dynamic_may_be_specialized() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        if x.size(0) == 8:
            return x + 1
        return x - 1

    x = torch.randn(8, 2)
    kiln_dynamo.maybe_mark_dynamic(x, 0)
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(f, backend=backend)
    assert_same(compiled(x), f(x))
    assert "L['x'].size(0) == 8" in " ".join(guard_texts(f))


def test_branch_on_a_size_is_guarded_and_recompiles_on_the_other_side() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        if x.size(0) > 16:
            return x * 2
        return x + 1

    backend = run_sizes(f, lambda b: (torch.randn(b, 3),), [4, 8, 12, 16, 32, 64, 10])
    # 4 static; 8 dynamic (guards s0 <= 16); 32 the other side (s0 > 16); 12, 16, 64, 10 hit
    assert backend.graphs == 3
    texts = guard_texts(f)
    assert "L['x'].size(0) > 16" in texts
    assert "17 <= L['x'].size(0)" in texts  # the range the branch left
    (part,) = [p for p in _last_captured[-1].guard.parts if p.readable == "L['x'].size(0) > 16"]
    assert "test_dynamic_shapes.py:" in part.where  # the user's line of the `if`


def test_views_and_reshapes_with_symbolic_sizes() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n, m = x.shape
        return (
            x.t().contiguous(),
            x[:, ::2],
            x.view(-1),
            x.reshape(n, m // 2, 2),
            x.narrow(0, 1, 1),
            torch.cat([x, x]).chunk(2)[0],
            x.flatten(),
            x.unsqueeze(1).expand(n, 3, m).sum(1),
        )

    backend = run_sizes(f, lambda b: (torch.randn(b, 6),), [4, 6, 9, 17, 30])
    assert backend.graphs == 2


def test_reductions_over_a_symbolic_dim() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.sum(-1),
            x.softmax(-1),
            x.mean(-1),
            torch.nn.functional.layer_norm(x, x.shape[-1:]),
            x.amax(0),
        )

    backend = run_sizes(f, lambda n: (torch.randn(3, n),), [4, 5, 16, 33])
    assert backend.graphs == 2
    assert backend.placeholder_sizes(1) == [("3", "s0")]


def test_factories_and_size_arithmetic() -> None:
    def f(x: torch.Tensor) -> tuple[Any, ...]:
        n = x.size(0)
        return torch.zeros(n, 4) + x[:, :1], torch.arange(n) * 2, torch.full((n, n), 3.0), n * 2 + 1, x.shape

    backend = run_sizes(f, lambda b: (torch.randn(b, 5),), [3, 4, 7, 12])
    assert backend.graphs == 2


class Block(nn.Module):
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


def test_sequence_length_change_on_a_transformer_block() -> None:
    torch.manual_seed(0)
    block = Block().eval()
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(block, backend=backend)
    with torch.no_grad():
        for t in [8, 12, 16, 33, 5, 64]:
            x = torch.randn(2, t, 16)
            assert_same(block(x), compiled(x))
    assert backend.graphs == 2 and counters.fallbacks == []
    assert backend.placeholder_sizes(1)[0] == ("2", "s0", "16")


# composite operators (their kernels decompose before a fake tensor sees them) under a symbolic
# length, every dim of the arguments that has it marked dynamic: Note [Composite operators under symbolic sizes].
# On torch 2.11 (the H200 machine's) `a @ w` and `F.linear` of a 3-d input broke the graph and a
# 4-d `q @ k^T` specialized the length, without the Python dispatcher.
_COMPOSITES: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[torch.Tensor, ...]]]] = {
    "matmul_4d": (
        lambda q, k: q @ k.transpose(-2, -1),
        lambda t: (torch.randn(2, t, 2, 8), torch.randn(2, t, 2, 8)),
    ),
    "matmul_3d_2d": (lambda a, w: a @ w, lambda t: (torch.randn(2, t, 8), torch.randn(8, 4))),
    "linear_3d": (
        lambda a, w: torch.nn.functional.linear(a, w),  # noqa: PLW0108 - a frame to capture
        lambda t: (torch.randn(2, t, 8), torch.randn(4, 8)),
    ),
    "einsum": (
        lambda a, b: torch.einsum("btd,bsd->bts", a, b),
        lambda t: (torch.randn(2, t, 8), torch.randn(2, t, 8)),
    ),
    "tensordot": (
        lambda a, w: torch.tensordot(a, w, dims=([2], [0])),
        lambda t: (torch.randn(2, t, 8), torch.randn(8, 4)),
    ),
    "baddbmm": (
        lambda c, a, b: torch.baddbmm(c, a, b.transpose(1, 2)),
        lambda t: (torch.randn(2, t, t), torch.randn(2, t, 4), torch.randn(2, t, 4)),
    ),
}


@pytest.mark.parametrize("name", sorted(_COMPOSITES))
def test_composite_operators_keep_a_marked_length_symbolic(name: str) -> None:
    fn, make = _COMPOSITES[name]
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for t in (6, 9, 13):
        args = make(t)
        for a in args:
            for d in range(a.dim()):
                if a.shape[d] == t:
                    kiln_dynamo.mark_dynamic(a, d)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "you marked ... as dynamic but the code specialized it"
            assert_same(fn(*args), compiled(*args))
    assert backend.graphs == 1 and counters.fallbacks == [], (backend.graphs, counters.fallbacks)
    assert "s0" in backend.placeholder_sizes(0)[0]


def test_training_with_a_smaller_last_batch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(model, backend=backend)
    for b in [16, 16, 16, 10, 16, 7]:
        x = torch.randn(b, 6)
        out, expected = compiled(x), ref(x)
        assert_same(out, expected)
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    assert backend.graphs == 2  # 16 static, 10 dynamic; 7 and 16 hit it


class _Refuses(DynamicBackend):
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if any(
            isinstance(s, torch.SymInt)
            for n in gm.graph.nodes
            if n.op == "placeholder"
            for s in n.meta["val"].shape
        ):
            raise kiln_dynamo.DynamicShapesUnsupported("symbolic sizes are not built here")
        return super().__call__(gm, example_inputs)


def test_a_backend_that_refuses_symbolic_sizes_gets_static_graphs() -> None:
    backend = _Refuses()
    compiled = kiln_dynamo.compile(_mlp_fn, backend=backend)
    w = torch.randn(8, 4)
    for b in [2, 3, 4, 5]:
        x = torch.randn(b, 8)
        assert_same(_mlp_fn(x, w), compiled(x, w))
    assert backend.graphs == 4
    assert counters.dynamic_fallbacks == [("_mlp_fn", "symbolic sizes are not built here")]


def test_a_backend_without_the_declaration_stays_static() -> None:
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_mlp_fn, backend=backend, dynamic=True)
    w = torch.randn(8, 4)
    for b in [2, 3]:
        x = torch.randn(b, 8)
        assert_same(_mlp_fn(x, w), compiled(x, w))
    assert backend.graphs == 2


def test_recompile_log_says_which_dim_went_dynamic(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.INFO, logger="kiln.dynamo.recompiles"):
        run_sizes(_mlp_fn, lambda b: (torch.randn(b, 8), torch.randn(8, 4)), [2, 3])
    lines = [r.getMessage() for r in caplog.records if r.name == "kiln.dynamo.recompiles"]
    assert any("guard failed: L['x'].size(0) == 2" in m for m in lines), lines
    assert any("marking L['x'].size(0) dynamic: 2 != 3" in m for m in lines), lines


def test_recompile_log_names_an_int_argument_by_itself(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n

    with caplog.at_level(logging.INFO, logger="kiln.dynamo.recompiles"):
        run_sizes(f, lambda n: (torch.randn(4), n), [2, 3])
    lines = [r.getMessage() for r in caplog.records if r.name == "kiln.dynamo.recompiles"]
    assert any("marking L['n'] dynamic: 2 != 3" in m for m in lines), lines
    assert not any("L['n'].size" in m for m in lines), lines


def test_guard_soundness_fuzz() -> None:
    """Random sizes around 0, 1, 2 and equal/unequal pairs: a compiled answer is always eager's."""

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = x.sum(0, keepdim=True) + y
        if x.size(0) > 3:
            out = out * x.size(0)
        if x.size(1) == y.size(1):
            out = out - 1
        return out.expand(x.size(0), -1) - x

    rng = random.Random(0)
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(f, backend=backend)
    for _ in range(60):
        n, m = rng.choice([1, 2, 3, 4, 5, 8]), rng.choice([1, 2, 3, 6])
        ym = rng.choice([1, m])
        x, y = torch.randn(n, m), torch.randn(1, ym)
        assert_same(f(x, y), compiled(x, y))


def test_int_inputs_become_symbolic_after_they_change() -> None:
    def f(x: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
        y = x * n + torch.arange(n).sum()
        for i in range(2):
            y = y + i
        return y[:n], n + 1

    x = torch.randn(10, 3)
    backend = run_sizes(f, lambda n: (x, n), [2, 3, 4, 5, 7, 10])
    assert backend.graphs == 2
    sym = [n for n in backend.gms[1].graph.nodes if n.op == "placeholder"][1]
    assert isinstance(sym.meta["val"], torch.SymInt)
    texts = guard_texts(f)
    assert "type(L['n']) is int" in texts and "L['n'] <= 10" in texts  # `y[:n]` on 10 rows
    assert not any("L['n'] ==" in t for t in texts)


def test_int_that_a_builtin_needs_is_specialized() -> None:
    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        for _ in range(n):
            x = x + 1
        return x

    backend = run_sizes(f, lambda n: (torch.zeros(2), n), [2, 3, 3, 4])
    assert backend.graphs == 3  # every value is its own graph: range() needs the number
    assert "L['n'] == 4" in guard_texts(f)


GLOBAL_K = 3


def test_global_ints_stay_constants() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * GLOBAL_K

    global GLOBAL_K
    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(f, backend=backend)
    for k in [3, 4]:
        GLOBAL_K = k
        x = torch.randn(2)
        assert_same(compiled(x), f(x))
    assert backend.graphs == 2
    assert all(
        n.op != "placeholder" or isinstance(n.meta["val"], torch.Tensor) for n in backend.gms[1].graph.nodes
    )
    GLOBAL_K = 3


def test_mark_dynamic_then_specialized_warns_and_fullgraph_raises() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        if x.size(0) == 8:
            return x + 1
        return x - 1

    x = torch.randn(8, 2)
    kiln_dynamo.mark_dynamic(x, 0)
    compiled = kiln_dynamo.compile(f, backend=DynamicBackend())
    with pytest.warns(UserWarning, match=r"marked L\['x'\].size\(0\) as dynamic but the code specialized it"):
        assert_same(compiled(x), f(x))
    kiln_dynamo.reset()
    strict = kiln_dynamo.compile(f, backend=DynamicBackend(), fullgraph=True)
    with pytest.raises(kiln_dynamo.Unsupported, match=r"test_dynamic_shapes\.py"):
        strict(x)


def test_graph_break_with_a_dynamic_dim_used_after_it() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
        n = x.size(0)
        z = x * 2
        print("", end="")  # a graph break: the rest is a continuation with its own frame state
        w = z.view(n, -1) + y[:1]
        return w.sum(0) + n, n * 2

    backend = run_sizes(f, lambda n: (torch.randn(n, 3), torch.randn(n, 3)), [4, 8, 16, 32, 5])
    assert counters.graph_breaks >= 1
    assert backend.graphs == 4  # each of the two frames: static, then dynamic; no more after


def test_equal_sizes_by_use_share_one_symbol_and_broadcast_against_one_stays_static() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y

    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(f, backend=backend, dynamic=True)
    for xs, ys in [((4, 3), (4, 3)), ((5, 3), (5, 3)), ((5, 3), (1, 3)), ((6, 3), (6, 3)), ((6, 3), (1, 3))]:
        x, y = torch.randn(*xs), torch.randn(*ys)
        assert_same(f(x, y), compiled(x, y))
    assert backend.graphs == 2  # duck-sized [s0, s1] * [s0, s1]; then [s0, s1] * [1, s1]
    assert backend.placeholder_sizes(0) == [("s0", "s1"), ("s0", "s1")]
    assert backend.placeholder_sizes(1)[1] == ("1", "s1")


def test_a_compiled_entry_does_not_keep_the_frame_objects_alive() -> None:
    import gc
    import weakref

    class Holder:
        pass

    def f(x: torch.Tensor, h: Holder) -> torch.Tensor:
        return x * 2

    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(f, backend=backend, dynamic=True)
    h = Holder()
    ref = weakref.ref(h)
    compiled(torch.randn(3, 2), h)
    del h
    gc.collect()
    assert ref() is None
    assert backend.placeholder_sizes(0) == [("s0", "s1")]


def test_len_of_a_tensor_stays_symbolic_and_dynamic_true_makes_ints_symbolic_at_once() -> None:
    def f(x: torch.Tensor, k: int) -> torch.Tensor:
        n = len(x)
        return x.view(n, -1) * k

    backend = run_sizes(f, lambda b: (torch.randn(b, 4), b + 1), [3, 5, 9], dynamic=True)
    assert backend.graphs == 1
    vals = [n.meta["val"] for n in backend.gms[0].graph.nodes if n.op == "placeholder"]
    assert isinstance(vals[1], torch.SymInt)  # k: symbolic from the first call
    assert not any("L['x'].size(0) ==" in t for t in guard_texts(f))


def _size_comparisons(x: torch.Tensor) -> tuple[Any, ...]:
    n = x.size(0)
    h = torch.zeros(1, n, 8)
    return (
        x + 1,
        h.size() != (1, n, 8),
        h.size() == (1, x.size(0), 8),
        h.shape == (1, x.shape[0], 8),
        x.shape[:1] == (n,),
        [n] == [x.shape[0]],
        (n, 8) == [n, 8],  # a tuple never equals a list
        h.size() == x.size(),
        n in [x.size(0), 7],
        [x.size(1), n].count(n),
        n in (2, 3, 5),
    )


@pytest.mark.parametrize("dynamic", [None, True])
def test_sizes_and_sequences_compare_as_python_does(dynamic: bool | None) -> None:
    """Note [Equality of sizes and sequences]: under symbolic sizes a torch.Size compared to a
    tuple answered by type, and a size `in` a tuple of ints by identity: both False (wrong
    answers; `nn.LSTM` raised its hidden-size check where eager ran). Every comparison equals
    eager's at every size, with no break."""
    run_sizes(_size_comparisons, lambda n: (torch.randn(n, 8),), [2, 3, 4, 5, 6], dynamic=dynamic)
    assert counters.graph_breaks == 0  # (`n in (2, 3, 5)` specializes n where it holds, as in eager's branch)


class _WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(8), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # `view(2, 4)` of the buffer asks its size to be 8: a guard on the buffer's size
        return x.sum(1, keepdim=True) + self.table.view(2, 4).sum(0).repeat(2)[: x.shape[0]].unsqueeze(1)


def test_a_module_buffer_stays_static_and_never_pins_an_input_size() -> None:
    # a buffer read as `self.table` comes through the module's `_buffers` (its source's name
    # reads as the attribute): static, as Parameters are. Duck-sized with an input dim of the
    # same size, its own guard (size 8) pinned that dim: one compile per length under dynamic=True
    backend = run_sizes(_WithBuffer(), lambda n: (torch.randn(4, n),), [8, 5, 11, 8], dynamic=True)
    assert backend.graphs == 1
    sizes = backend.placeholder_sizes(0)
    assert sizes[0][1].startswith("s") and ("8",) in sizes, sizes


def _written_from_a_sum(x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    x1.add_(x0.sum())  # x1 now requires grad, with history
    return x1 * 2


def test_placeholders_reach_the_backend_with_their_entry_autograd_state() -> None:
    # Note [Placeholders keep their entry autograd state] (fake.py): the capture's `add_` left
    # x1's fake requiring grad with its own history, and a backend tracing from the placeholders
    # (kiln_aotgrad under dynamic=True) counted x0's sum twice in its gradient
    seen: list[list[Any]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append([n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward

    x0, x1 = torch.randn(5, requires_grad=True), torch.randn(2, 6)
    kiln_dynamo.compile(_written_from_a_sum, backend=backend, dynamic=True)(x0, x1)
    (vals,) = seen
    assert [(v.requires_grad, v.is_leaf) for v in vals] == [(True, True), (False, True)]


def test_math_prod_of_symbolic_sizes_stays_symbolic() -> None:
    """Hiera's `x.reshape(-1, math.prod(size), c)` under dynamic=True: math.prod of a list of
    symbolic sizes broke the graph (builtins.py's _prod); now one graph for every size, eager's
    values and a Python int where eager returns one."""
    import math

    def fn(x: torch.Tensor) -> Any:
        size = [x.shape[1], x.shape[2]]
        return x.reshape(-1, math.prod(size), x.shape[3]) * 2, math.prod(size, start=2)

    backend = DynamicBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend, dynamic=True)
    for shape in ((2, 3, 4, 5), (3, 5, 2, 4)):
        x = torch.randn(*shape)
        got, want = compiled(x), fn(x)
        assert torch.equal(got[0], want[0]) and got[1] == want[1] and type(got[1]) is int
    assert backend.graphs == 1 and counters.graph_breaks == 0
