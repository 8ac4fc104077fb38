"""Global state a real program changes between calls (thirty-third session, fix33): autocast
regions entered around a compiled function and inside it, nested and split by a graph break,
default dtype with factory functions, grad modes, train/eval, `requires_grad_` on parameters,
buffers re-assigned, `torch.manual_seed` before dropout and random factories. Every call must
give eager's outputs and gradients, and leave the global state as eager leaves it.

Found here: a compiled graph run inside an autocast region had its matmuls cast again to the
region's dtype (Note [Compiled graphs run outside autocast] in kiln_aotgrad.runtime); a frame
split inside an autocast block left autocast enabled after it returned, from its second call on
(Note [Leaving a block entered before the frame] in kiln_dynamo.variables.opaque); torch's
global setters called in a frame (`torch.set_autocast_enabled`, `use_deterministic_algorithms`,
`set_num_threads`, ...; `@torch.autocast`'s `__exit__` is such calls) were graph nodes that an
aten backend dropped, so they ran on the first call only (Note [Global setters run as Python] in
kiln_dynamo.variables.torch); `@torch.autocast(...)` ran as Python with six graph breaks (Note
[An autocast object made outside the frame] in kiln_dynamo.variables.builder);
`torch.initial_seed()` was folded unguarded.
"""

# mypy: ignore-errors
from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    dtype = torch.get_default_dtype()
    autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(True)
    torch.set_autocast_enabled("cpu", autocast[0])  # a case that failed with it left on
    torch.set_autocast_dtype("cpu", autocast[1])
    while _nesting() > 0:
        torch.autocast_decrement_nesting()
    kiln.reset()


def _same(e: Any, c: Any, what: str, tol: float = 1e-4) -> None:
    if isinstance(e, (tuple, list)):
        assert len(e) == len(c), what
        for i, (a, b) in enumerate(zip(e, c, strict=True)):
            _same(a, b, f"{what}[{i}]", tol)
        return
    if not isinstance(e, torch.Tensor):
        assert e == c, f"{what}: {e!r} vs {c!r}"
        return
    assert (e.shape, e.dtype, e.requires_grad) == (c.shape, c.dtype, c.requires_grad), (
        f"{what}: {e.shape} {e.dtype} grad={e.requires_grad} vs {c.shape} {c.dtype} grad={c.requires_grad}"
    )
    torch.testing.assert_close(c.double(), e.double(), atol=tol, rtol=tol, equal_nan=True, msg=what)


def _nesting() -> int:
    depth = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return depth


def _autocast_state() -> tuple[Any, ...]:
    return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), _nesting()


def _split_in_block(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        print("", end="")  # a graph break inside the block
        z = y @ w
    return y, z, z.float() @ w


def _split_in_two_blocks(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            y = x @ w
            print("", end="")
        z = y @ w
        print("", end="")
    return y, z, z @ w.bfloat16()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
@pytest.mark.parametrize("fn", [_split_in_block, _split_in_two_blocks], ids=["one block", "two blocks"])
def test_a_split_inside_an_autocast_block_leaves_the_state_as_eager(backend: str, fn: Any) -> None:
    """Note [Leaving a block entered before the frame]: from the second call on, autocast stayed
    enabled after the function returned (and its nesting count grew by one a call)."""
    compiled = kiln.compile(fn, backend=backend)
    torch.manual_seed(0)
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    before = _autocast_state()
    for call in range(3):
        expected = fn(x, w)
        assert _autocast_state() == before
        got = compiled(x, w)
        assert _autocast_state() == before, f"call {call}: autocast left {_autocast_state()}"
        _same(expected, got, f"call {call}", tol=1e-2)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_autocast_blocks_inside_an_autocast_region(backend: str) -> None:
    """Note [Compiled graphs run outside autocast]: the program's bfloat16 block came back in the
    caller's float16, its `enabled=False` block's float32 matmul in bfloat16 (softmax off by
    0.98); first call outside any region, then inside two, then outside again."""
    w = torch.randn(8, 8, requires_grad=True)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
        with torch.autocast("cpu", enabled=False):
            z = x.float() @ w
        return y, z, z.softmax(-1)

    compiled = kiln.compile(f, backend=backend)
    torch.manual_seed(0)
    for step, region in enumerate([None, torch.float16, torch.bfloat16, None]):
        x = torch.randn(8, 8)
        ctx = torch.autocast("cpu", dtype=region) if region else contextlib.nullcontext()
        with ctx:
            expected, got = f(x), compiled(x)
        _same(expected, got, f"step {step} ({region})", tol=1e-2)
        ge = torch.autograd.grad(expected[2].sum() + expected[0].float().sum(), w)
        gg = torch.autograd.grad(got[2].sum() + got[0].float().sum(), w)
        _same(ge, gg, f"step {step} gradient", tol=1e-2)


def _factories(x: torch.Tensor) -> tuple[Any, ...]:
    return (
        x.sum() + torch.ones(3),
        torch.arange(4) * 1.5,
        torch.zeros(2, 2),
        torch.tensor(1.5),
        torch.arange(0.0, 2.0, 0.5),
        torch.full((2,), 2.5),
        torch.linspace(0, 1, 3),
        x.int() / 3,
        x.int().sqrt(),
    )


@pytest.mark.parametrize("dynamic", [False, None, True])
def test_default_dtype_changed_between_calls(dynamic: bool | None) -> None:
    compiled = kiln.compile(_factories, dynamic=dynamic)
    for step, dtype in enumerate([torch.float32, torch.float64, torch.float32, torch.float64]):
        torch.set_default_dtype(dtype)
        x = torch.arange(3.0 + step)
        _same(_factories(x), compiled(x), f"step {step} ({dtype})")


def test_grad_modes_toggled_with_gradients() -> None:
    w = torch.randn(4, 4, requires_grad=True)

    def f(x):
        y = (x @ w).tanh()
        print("", end="")  # a graph break between two graphs
        return y * 2, torch.is_grad_enabled()

    compiled = kiln.compile(f)
    modes = {"grad": contextlib.nullcontext, "no_grad": torch.no_grad, "inference": torch.inference_mode}
    for step, mode in enumerate(["grad", "no_grad", "inference", "grad", "inference", "no_grad", "grad"]):
        x = torch.randn(3, 4)
        with modes[mode]():
            expected, got = f(x), compiled(x)
        _same(expected, got, f"step {step} ({mode})")
        assert expected[0].is_inference() == got[0].is_inference()
        if expected[0].requires_grad:
            _same(torch.autograd.grad(expected[0].sum(), w), torch.autograd.grad(got[0].sum(), w), mode)


def test_train_eval_with_dropout_and_batchnorm_under_one_seed() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
    m2 = copy.deepcopy(m)
    compiled = kiln.compile(m2)
    for step, mode in enumerate(["eval", "train", "eval", "train"]):
        getattr(m, mode)()
        getattr(m2, mode)()
        x = torch.randn(6, 4)
        torch.manual_seed(step)
        expected = m(x)
        torch.manual_seed(step)
        got = compiled(x)
        _same(expected, got, f"step {step} ({mode})")  # random ops run in eager's order
        _same(list(m.buffers()), list(m2.buffers()), f"step {step} buffers")
        ge = torch.autograd.grad(expected.sum(), list(m.parameters()))
        gg = torch.autograd.grad(got.sum(), list(m2.parameters()))
        _same(ge, gg, f"step {step} gradients")


def test_requires_grad_flipped_on_parameters() -> None:
    class P(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x):
            y = self.a(x).relu()
            print("", end="")
            return self.b(y)

    torch.manual_seed(0)
    p1 = P()
    p2 = copy.deepcopy(p1)
    compiled = kiln.compile(p2)
    flips = [
        None,
        ("a.weight", False),
        ("b.bias", False),
        ("a.weight", True),
        ("a.bias", False),
        ("b.bias", True),
    ]
    for step, flip in enumerate(flips):
        if flip is not None:
            p1.get_parameter(flip[0]).requires_grad_(flip[1])
            p2.get_parameter(flip[0]).requires_grad_(flip[1])
        for p in [*p1.parameters(), *p2.parameters()]:
            p.grad = None
        x = torch.randn(3, 4)
        expected, got = p1(x), compiled(x)
        _same(expected, got, f"step {step}")
        expected.sum().backward()
        got.sum().backward()
        for (name, a), b in zip(p1.named_parameters(), p2.parameters(), strict=True):
            assert (a.grad is None) == (b.grad is None), f"step {step}: {name}"
            if a.grad is not None:
                _same(a.grad, b.grad, f"step {step}: {name}")


def test_buffer_reassigned_to_other_shapes_and_dtypes() -> None:
    class B(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.ones(4))

        def forward(self, x):
            out = x * self.b + self.b.sum()
            self.b = self.b * 0.5
            return out

    m1, m2 = B(), B()
    compiled = kiln.compile(m2)
    news = [
        None,
        torch.ones(4, dtype=torch.float64),
        torch.ones(1),
        torch.ones(3, 4),
        torch.ones(8)[::2],
        None,
    ]
    for step, new in enumerate(news):
        if new is not None:
            m1.b, m2.b = new.clone(), new.clone()
        x = torch.randn(3, 4)
        _same(m1(x), compiled(x), f"step {step}")
        _same(m1.b, m2.b, f"step {step} buffer")


def test_manual_seed_before_each_call() -> None:
    """torch.compile promises the same results for the same seed, not eager's numbers; kiln
    runs random operators as aten calls in the program's order, so it gives eager's."""

    def f(x):
        a = torch.rand(3)
        b = torch.randn_like(x)
        return (b + 1).sum() + a.sum(), a * 2, F.dropout(x, 0.5), torch.randint(0, 10, (4,))

    compiled = kiln.compile(f)
    x = torch.ones(4, 4)
    for seed in [0, 0, 1, 0]:
        torch.manual_seed(seed)
        expected, after_e = f(x), torch.rand(2)
        torch.manual_seed(seed)
        got, after_c = compiled(x), torch.rand(2)
        _same(expected, got, f"seed {seed}", tol=0)
        _same(after_e, after_c, f"seed {seed}: the generator after the call", tol=0)


def _state() -> tuple[Any, ...]:
    return (
        *_autocast_state(),
        torch.is_autocast_cache_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        torch.get_float32_matmul_precision(),
    )


_SETTERS = {
    "set_autocast_enabled": lambda: torch.set_autocast_enabled("cpu", True),
    "set_autocast_dtype": lambda: torch.set_autocast_dtype("cpu", torch.float16),
    "autocast_increment_nesting": torch.autocast_increment_nesting,
    "set_autocast_cache_enabled": lambda: torch.set_autocast_cache_enabled(False),
    "use_deterministic_algorithms": lambda: torch.use_deterministic_algorithms(True),
    "set_num_threads": lambda: torch.set_num_threads(1),
    "set_float32_matmul_precision": lambda: torch.set_float32_matmul_precision("medium"),
}


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("name", list(_SETTERS))
def test_a_global_setter_in_the_frame_runs_on_every_call(backend: str, name: str) -> None:
    """Note [Global setters run as Python]: as a graph node, the setter ran once, while the graph
    was traced; from the second call on the state stayed as the caller left it."""
    setter = _SETTERS[name]

    def f(x):
        y = x @ x
        setter()
        return y, y @ x

    compiled = kiln.compile(f, backend=backend)
    start = _state()
    threads = torch.get_num_threads()
    try:
        for call in range(3):
            x = torch.randn(4, 4)
            expected, after_eager = f(x), _state()
            _restore(start, threads)
            got, after = compiled(x), _state()
            _restore(start, threads)
            assert after == after_eager, f"call {call}: {after} vs eager's {after_eager}"
            _same(expected, got, f"call {call}", tol=1e-2)
    finally:
        _restore(start, threads)


def _restore(state: tuple[Any, ...], threads: int) -> None:
    torch.set_autocast_enabled("cpu", state[0])
    torch.set_autocast_dtype("cpu", state[1])
    while _nesting() > state[2]:
        torch.autocast_decrement_nesting()
    torch.set_autocast_cache_enabled(state[3])
    torch.use_deterministic_algorithms(state[4])
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(state[6])


@torch.autocast("cpu", dtype=torch.bfloat16)
def _decorated(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x @ w, (x @ w).float() + 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_a_function_decorated_with_autocast(backend: str) -> None:
    """Note [An autocast object made outside the frame]: the decorator's `with autocast_instance:`
    ran as Python (six graph breaks) and, through the aten backends, left the nesting count one
    higher a call and autocast enabled after a call made inside another region."""
    compiled = kiln.compile(_decorated, backend=backend)
    before = _autocast_state()
    for call, region in enumerate([None, torch.float16, None]):
        x, w = torch.randn(3, 3), torch.randn(3, 3)
        ctx = torch.autocast("cpu", dtype=region) if region else contextlib.nullcontext()
        with ctx:
            expected = _decorated(x, w)
            got = compiled(x, w)
        assert _autocast_state() == before, f"call {call}: autocast left {_autocast_state()}"
        _same(expected, got, f"call {call}", tol=1e-2)
    assert kiln.capture_stats().graph_breaks == 0


def test_initial_seed_read_in_the_frame() -> None:
    """`torch.initial_seed()` was folded unguarded: the first call's seed after manual_seed(2)."""

    def f(x):
        return x + torch.initial_seed()

    compiled = kiln.compile(f)
    for seed in [0, 1, 2, 0]:
        torch.manual_seed(seed)
        _same(f(torch.zeros(2)), compiled(torch.zeros(2)), f"seed {seed}")
