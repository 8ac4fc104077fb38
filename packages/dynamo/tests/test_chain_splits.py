"""Breaks deep in a call chain: every frame of the chain split at once (Note [Resuming a chain of
frames] in breaks.py), compared with eager in values, types, printed text, exceptions and grad
mode, with the counts of graphs and splits; chains through a try block or a with-block around a
call (Note [A chain through try and with blocks]): handlers and exits run exactly once, in eager's
order, whether the break instruction or a continuation raises; and the frames a chain must not pass
through (a generator, a hooked module, a call through a builtin) behave as eager too."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import kiln_dynamo
from kiln_dynamo import convert_frame
from kiln_dynamo.counters import counters


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln_dynamo.reset()
    yield
    kiln_dynamo.reset()


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.requires_grad == b.requires_grad and a.shape == b.shape
        torch.testing.assert_close(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def _run(fn: Callable[..., Any], *args: Any) -> tuple[int, int, int]:
    """fn compiled against eager on two calls; the counts of the first call (graphs, splits,
    frames left to Python); the second call captures nothing new."""
    expected = fn(*args)
    compiled = kiln_dynamo.compile(fn)
    _same(expected, compiled(*args))
    first = (counters.graphs, counters.graph_breaks, len(counters.fallbacks))
    seen = counters.frames_seen
    _same(fn(*args), compiled(*args))
    assert counters.frames_seen == seen and counters.recompiles == 0
    return first


# --- a break three frames down ------------------------------------------------------------------


def leaf(y: torch.Tensor, k: int) -> tuple[torch.Tensor, float]:
    z = y * 2
    v = z.sum().item()  # the break: a Python float from a tensor
    return z + v + k, v


def mid(x: torch.Tensor) -> torch.Tensor:
    a = x + 1
    b, v = leaf(a, 3)
    return b * a - v


def top(x: torch.Tensor) -> tuple[torch.Tensor, str, torch.Size]:
    t = x.cos()
    u = mid(t)
    return u - t, "s", u.shape


def test_a_break_two_calls_down_is_one_split() -> None:
    # one graph before the break (top, mid and leaf up to .item()), one after it: top's
    # continuation calls mid's, which calls leaf's, and the capture inlines them
    assert _run(top, torch.randn(4)) == (2, 1, 0)
    [reason] = counters.break_reasons
    assert reason.split and reason.note is not None and "3 frames resumed at once" in reason.note
    assert [f.name for f in reason.frames] == ["top", "mid", "leaf"]


def test_the_switch_restores_one_split_per_frame() -> None:
    previous = convert_frame.set_chain_splits(False)
    try:
        assert _run(top, torch.randn(4)) == (6, 3, 0)
    finally:
        convert_frame.set_chain_splits(previous)


def branchy_leaf(y: torch.Tensor) -> torch.Tensor:
    y = y + 1
    if y.sum() > 0:  # a jump on a tensor: one continuation per path, each followed by the chain's
        return y * 2
    return y - 3


def branchy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x.sin()
    z = branchy_leaf(y)
    return z.exp(), y


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_tensor_branch_deep_in_the_chain(sign: float) -> None:
    x = torch.full((3,), 2.0) * sign
    assert _run(branchy, x) == (2, 1, 0)


def printing_leaf(y: torch.Tensor, log: list[str]) -> torch.Tensor:
    log.append("before")
    print("leaf", y.shape)  # the break: runs as Python, between the two appends
    log.append("after")
    return y + len(log)


def printing(x: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    log: list[str] = []
    y = printing_leaf(x * 2, log)
    return y, log


def test_side_effects_and_printed_text_in_eager_order(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(2)
    expected = printing(x)
    eager_out = capsys.readouterr().out
    got = kiln_dynamo.compile(printing)(x)
    assert capsys.readouterr().out == eager_out
    _same(expected, got)
    assert counters.graph_breaks == 1


# --- exceptions -----------------------------------------------------------------------------------


def raising_leaf(y: torch.Tensor, n: int) -> torch.Tensor:
    y = y + 1
    os.getpid()  # the break: a C function kiln does not trace
    if n > 2:
        raise ValueError(f"n is {n}")  # raised in the leaf's continuation
    return y


def raising_top(x: torch.Tensor, n: int) -> torch.Tensor:
    y = x * 3
    return raising_leaf(y, n) - 1


def bad_call_leaf(y: torch.Tensor) -> torch.Tensor:
    y = y * 2
    int(os.environ.get("KILN_TEST_NOT_A_NUMBER", "x1"))  # the break instruction itself raises
    return y


def bad_call_top(x: torch.Tensor) -> torch.Tensor:
    return bad_call_leaf(x + 1) + 1


def test_exceptions_leave_the_chain_as_in_eager() -> None:
    x = torch.randn(3)
    compiled = kiln_dynamo.compile(raising_top)
    _same(raising_top(x, 1), compiled(x, 1))
    with pytest.raises(ValueError, match="n is 5"):
        raising_top(x, 5)
    with pytest.raises(ValueError, match="n is 5"):
        compiled(x, 5)
    with pytest.raises(ValueError, match="invalid literal"):
        bad_call_top(x)
    with pytest.raises(ValueError, match="invalid literal"):
        kiln_dynamo.compile(bad_call_top)(x)
    assert torch.is_grad_enabled()


# --- chains through try and with blocks (Note [A chain through try and with blocks]) ----------

LOG: list[str] = []


def log_leaf(y: torch.Tensor, n: int) -> torch.Tensor:
    y = y * 2
    LOG.append("leaf")
    v = y.sum().item()  # the break
    LOG.append(f"after {n}")
    if n > 2:
        raise ValueError(f"n is {n}")  # raised in the leaf's continuation
    return y + v


def log_bad_leaf(y: torch.Tensor, n: int) -> torch.Tensor:
    y = y * 2
    LOG.append("leaf")
    if n > 2:
        os.getpid(n)  # type: ignore[call-arg]  # the break instruction raises (a TypeError: getpid takes no arguments)
    os.getpid()  # the break: a C function kiln does not trace
    return y + 1


def capture_outputs(f: Callable[..., torch.Tensor], x: torch.Tensor, n: int) -> torch.Tensor:
    """Shaped as transformers' `capture_outputs` wrapper: the model called in a try/finally."""
    LOG.append("enter")
    try:
        return f(x, n)
    finally:
        LOG.append("exit")


def finally_top(x: torch.Tensor, n: int) -> torch.Tensor:
    t = x.cos()
    return capture_outputs(log_leaf, t, n) - t


def finally_bad_top(x: torch.Tensor, n: int) -> torch.Tensor:
    return capture_outputs(log_bad_leaf, x.sin(), n) * 2


def except_mid(x: torch.Tensor, n: int) -> torch.Tensor:
    try:
        return log_leaf(x + 1, n) * 3
    except ValueError as e:
        LOG.append(f"caught {e}")
        return x - 100


def except_top(x: torch.Tensor, n: int) -> torch.Tensor:
    return except_mid(x * 2, n) + 1


def nested_with_top(x: torch.Tensor, n: int) -> torch.Tensor:
    with torch.no_grad():
        y = capture_outputs(log_leaf, x.exp(), n)
    return y * x


def nested_with_bad_top(x: torch.Tensor, n: int) -> torch.Tensor:
    with torch.enable_grad():
        with torch.no_grad():
            y = capture_outputs(log_bad_leaf, x.exp(), n)  # the break instruction raises in here
        z = y * x
    return z + 1


def _outcome(fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str], bool]:
    LOG.clear()
    try:
        out: Any = fn(*args)
    except Exception as e:  # compared with eager's
        out = e
    return out, list(LOG), torch.is_grad_enabled()


@pytest.mark.parametrize(
    "fn", [finally_top, finally_bad_top, except_top, nested_with_top, nested_with_bad_top]
)
def test_a_chain_through_try_and_with_blocks(fn: Callable[..., torch.Tensor]) -> None:
    x = torch.randn(3, requires_grad=True)
    compiled = kiln_dynamo.compile(fn)
    for n in (1, 5, 1, 5):  # normal, raising after (or at) the break, and again from the cache
        expected, eager_log, eager_grad = _outcome(fn, x, n)
        got, log, grad = _outcome(compiled, x, n)
        assert log == eager_log and grad == eager_grad is True
        if isinstance(expected, Exception):
            assert type(got) is type(expected) and str(got) == str(expected)
        else:
            _same(expected, got)
        if n == 1 and counters.recompiles == 0:
            # one split for the whole chain: the try/with frames take part
            assert (counters.graphs, counters.graph_breaks, len(counters.fallbacks)) == (2, 1, 0)
            [reason] = counters.break_reasons
            assert reason.split and reason.note is not None and "frames resumed at once" in reason.note


def test_a_finally_runs_once_when_the_continuation_raises() -> None:
    compiled = kiln_dynamo.compile(finally_top)
    LOG.clear()
    with pytest.raises(ValueError, match="n is 7"):
        compiled(torch.randn(3), 7)
    assert LOG == ["enter", "leaf", "after 7", "exit"]


def test_the_switch_keeps_the_split_before_the_try_block() -> None:
    previous = convert_frame.set_chain_splits(False)
    try:
        splits = _run(finally_top, torch.randn(3), 1)[1]
        assert splits > 1
    finally:
        convert_frame.set_chain_splits(previous)


# --- frames a chain does not pass through ---------------------------------------------------------


def no_grad_mid(x: torch.Tensor, fail: bool) -> torch.Tensor:
    with torch.no_grad():
        y = leaf_that_may_fail(x, fail)  # a with-block around the call: its exit is in the chain
    return y + x


def leaf_that_may_fail(y: torch.Tensor, fail: bool) -> torch.Tensor:
    y = y * 2
    print("grad", torch.is_grad_enabled())
    if fail:
        raise KeyError("fail")
    return y


def no_grad_top(x: torch.Tensor, fail: bool) -> torch.Tensor:
    return no_grad_mid(x.exp(), fail) * 2


def test_with_block_around_a_call_in_the_chain(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(3, requires_grad=True)
    expected = no_grad_top(x, False)
    eager_out = capsys.readouterr().out
    compiled = kiln_dynamo.compile(no_grad_top)
    _same(expected, compiled(x, False))
    assert capsys.readouterr().out == eager_out
    for fn in (no_grad_top, compiled):
        with pytest.raises(KeyError):
            fn(x, True)
        assert torch.is_grad_enabled()


def try_mid(x: torch.Tensor) -> torch.Tensor:
    try:
        return bad_call_leaf(x)
    except ValueError:
        return x - 100


def try_top(x: torch.Tensor) -> torch.Tensor:
    return try_mid(x * 2) + 1


def test_try_block_around_a_call_in_the_chain_still_catches() -> None:
    _run(try_top, torch.randn(3))


def gen_leaf(y: torch.Tensor) -> Iterator[torch.Tensor]:
    yield y + 1
    print("in the generator")
    yield y + 2


def gen_top(x: torch.Tensor) -> torch.Tensor:
    return sum(gen_leaf(x * 2), torch.zeros(3))


def test_generator_in_the_chain(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(3)
    expected = gen_top(x)
    eager_out = capsys.readouterr().out
    _same(expected, kiln_dynamo.compile(gen_top)(x))
    assert capsys.readouterr().out == eager_out


def map_top(x: torch.Tensor) -> list[torch.Tensor]:
    return list(map(branchy_leaf, [x, -x]))  # called by a builtin: its result is not the call's


def test_a_call_through_a_builtin_is_not_resumed_as_a_chain() -> None:
    _run(map_top, torch.full((2,), 3.0))


# --- closures and modules -------------------------------------------------------------------------


def scaled(k: float) -> Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]]:
    """One decorator code, a closure per use: the chain's continuation of `wrapper` must run
    with the closure of the wrapper being called."""

    def deco(func: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
            out = func(*args, **kwargs)
            return out * k

        return wrapper

    return deco


class Leaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if h.sum() > 0:  # the break
            h = h.relu()
        return h + 1


class Wrapped(nn.Module):
    def __init__(self, deco: Callable[..., Any]) -> None:
        super().__init__()
        self.leaf = Leaf()
        self.run_leaf = deco(self.leaf.forward)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_leaf(x.tanh()) - x


def test_decorated_frames_in_the_chain_keep_their_closure() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    a, b = Wrapped(scaled(2.0)), Wrapped(scaled(3.0))
    b.leaf.load_state_dict(a.leaf.state_dict())
    ca, cb = kiln_dynamo.compile(a), kiln_dynamo.compile(b)
    for _ in range(2):
        _same(a(x), ca(x))
        _same(b(x), cb(x))
    assert all(r.split for r in counters.break_reasons)
    notes = [r.note or "" for r in counters.break_reasons]
    assert any("3 frames resumed at once" in n for n in notes), notes


class Outer(nn.Module):
    def __init__(self, hooked: bool) -> None:
        super().__init__()
        self.leaf = Leaf()
        if hooked:
            self.leaf.register_forward_hook(lambda m, args, out: out * 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.leaf(x + 1) * 2


@pytest.mark.parametrize("hooked", [False, True])
def test_modules_in_the_chain(hooked: bool) -> None:
    torch.manual_seed(0)
    m = Outer(hooked)
    x = torch.randn(3, 4)
    graphs, splits, plain = _run(m, x)
    if not hooked:  # one split through Outer.forward and Leaf.forward
        assert (graphs, splits, plain) == (2, 1, 0)
    else:  # a hooked module's forward is not resumed on its own: the hook must see its result
        assert splits == 2
    assert all(r.split for r in counters.break_reasons)


# --- a second break in the continuation, super() in the chain ----------------------------------------


def two_breaks_leaf(y: torch.Tensor) -> tuple[torch.Tensor, float]:
    y = y + 1
    print("first")  # the first break: splits the chain
    y = y * 2
    v = y.sum().item()  # the second: inside the continuations, which split as a chain again
    return y - v, v


def two_breaks_mid(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    a, v = two_breaks_leaf(x.cos())
    return a * 3, v


def two_breaks(x: torch.Tensor) -> tuple[torch.Tensor, float, torch.Tensor]:
    b, v = two_breaks_mid(x)
    return b.exp(), v, x


def test_a_second_break_inside_the_continuations(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(two_breaks, torch.randn(3)) == (3, 2, 0)
    assert capsys.readouterr().out == "first\n" * 4


class Base(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("base")  # the break
        return x * 2


class Child(Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x + 1)  # zero-argument super(): the continuation keeps `self` first
        return y + self.bias

    bias = 5.0


def test_zero_argument_super_in_the_chain(capsys: pytest.CaptureFixture[str]) -> None:
    m = Child()
    assert _run(lambda x: m(x) - 1, torch.randn(3)) == (2, 1, 0)


# --- break instructions that carry names and constants ---------------------------------------------


def kw_leaf(y: torch.Tensor) -> torch.Tensor:
    y = y + 1
    print("kw", end="|")  # CALL with keyword names: their constant moves into the split code
    return y * 2


def store_attr_leaf(y: torch.Tensor) -> torch.Tensor:
    t = y.detach() * 2
    t.requires_grad = True  # STORE_ATTR: its name moves into the split code
    return t


def named_top(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = kw_leaf(x.sin())
    b = store_attr_leaf(a)
    return a, b


def test_keyword_names_and_attribute_names_of_the_break_instruction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    x = torch.randn(3)
    expected = named_top(x)
    eager_out = capsys.readouterr().out
    got = kiln_dynamo.compile(named_top)(x)
    assert capsys.readouterr().out == eager_out == "kw|"
    _same(expected, got)
    assert got[1].is_leaf and got[1].requires_grad


# --- frames of the chain with cell variables (Note [Cells of a chain's frames] in breaks.py) -------


def cell_leaf(y: torch.Tensor) -> torch.Tensor:
    v = y.sum().item()  # the break
    return y + v


def comprehensions_around(x: torch.Tensor, ks: tuple[int, ...]) -> torch.Tensor:
    # x and ks are cells (read by the comprehensions); `late` is one bound after the break only
    by_k = {k: x * k for k in ks}
    firsts = [x + k for k in ks]
    total = sum(k for k in ks if (n := k) > 0) + n  # the walrus writes the frame's cell n
    y = cell_leaf(by_k[ks[0]] + firsts[-1])
    late = y.mean()
    return y * total + sum(x * k - late for k in ks)  # a generator expression after the break


def cells_top(x: torch.Tensor) -> torch.Tensor:
    t = x.cos()
    return comprehensions_around(t, (1, 2, 3)) - t


def test_cells_of_inlined_frames_resume_in_one_split() -> None:
    # one split through cells_top, comprehensions_around and cell_leaf, as without the cells
    assert _run(cells_top, torch.randn(5)) == (2, 1, 0)


def counts_calls(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    n = 0

    def bump() -> None:  # made and called before the break only
        nonlocal n
        n += 1

    bump()
    y = cell_leaf(x * n)

    def bump_twice() -> None:
        nonlocal n
        n += 2

    bump_twice()
    return y * n, n


def counts_top(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    y, n = counts_calls(x.sin())
    return y + 1, n


def test_writes_through_closures_on_both_sides_of_the_break() -> None:
    # bump writes the traced cell before the break; after it, bump_twice writes the
    # continuation's cell, which the return reads
    assert _run(counts_top, torch.randn(4)) == (2, 1, 0)


def closure_across(x: torch.Tensor, k: int) -> torch.Tensor:
    g = lambda: x * k  # noqa: E731  # made before the break, called after it
    y = cell_leaf(g())
    k = 3  # eager's g sees this write: its cell is the frame's
    return y + g()


def closure_top(x: torch.Tensor) -> torch.Tensor:
    return closure_across(x.sin(), 2) - 1


def test_a_closure_made_before_the_break_is_not_resumed_with_a_new_cell() -> None:
    # a continuation has cells of its own: a closure made before the break that lives on would
    # keep the old one and miss k = 3. kiln refuses that chain (the rebuilt closure's cell would
    # belong to a frame still running) and closure_across runs as Python: eager's answer.
    # (g runs twice for real, with k = 2 then k = 3: a recompile of g, so no `_run` here)
    x = torch.randn(4)
    compiled = kiln_dynamo.compile(closure_top)
    for _ in range(2):
        _same(closure_top(x), compiled(x))
    assert [code for code, _ in counters.fallbacks] == ["closure_across"]
    reasons = [str(r) for r in counters.break_reasons if not r.split]
    assert any("belongs to a function still running" in r for r in reasons), reasons


def test_a_cell_index_that_reaches_a_plain_local_is_refused() -> None:
    # Note [Cell slots of rewritten code] (resume.py): CPython would read the local as a cell
    from kiln_dynamo import resume

    def made(a: int) -> Callable[[], int]:
        b = a + 1
        return lambda: b

    code = made.__code__
    assert resume.check_cell_slots(code) is code
    plain = code.replace(co_varnames=("a", "b"), co_nlocals=2, co_cellvars=())
    with pytest.raises(ValueError, match="not a cell"):
        resume.check_cell_slots(plain)


# --- a break inside a try block of the chain's innermost frame ----------------------------------
# (Note [A break inside a try block of the innermost frame] in breaks.py)


def looped_layer(h: torch.Tensor, n: int) -> torch.Tensor:
    h = h * 2
    if h.sum() > 0:  # the break: data-dependent, as a LayerDrop test or an isfinite check
        h = h - 1
    if n > 2:
        raise ValueError(f"n is {n}")
    return h + 1


def looped_encoder(h: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(2):  # the chain is cut here: the call is inside a loop
        h = looped_layer(h, n)
    return h


def caught_merge(f: Callable[..., torch.Tensor], h: torch.Tensor, n: int) -> torch.Tensor:
    """Shaped as transformers' `merge_with_config_defaults` over `capture_outputs`: two wrappers
    whose calls sit in try blocks, above a model whose layers run in a loop."""
    try:
        return capture_outputs(f, h, n) * 3
    except ValueError as e:
        LOG.append(f"caught {e}")
        return h - 100


def wrapped_encoder_top(x: torch.Tensor, n: int) -> torch.Tensor:
    t = x.cos()
    return caught_merge(looped_encoder, t, n) + t


def test_a_chain_cut_at_a_call_inside_a_try_block() -> None:
    # the chain is cut at the loop: its innermost frame is `capture_outputs`, whose break
    # instruction (the call into the encoder) sits in a try/finally; the frames above still split
    # as one chain (before: that wrapper cut the chain again, and `caught_merge` split before its
    # try block with nothing to compile before it, leaving its continuation to Python)
    x = torch.randn(3)
    assert _run(wrapped_encoder_top, x, 1) == (4, 2, 1)  # the encoder's loop runs as Python
    reasons = [r for r in counters.break_reasons if r.note is not None and "3 frames resumed" in r.note]
    assert len(reasons) == 1
    compiled = kiln_dynamo.compile(wrapped_encoder_top)
    for n in (1, 5, 1, 7):  # raised by the break instruction: reaches the finally, then the except
        expected, eager_log, _ = _outcome(wrapped_encoder_top, x, n)
        got, log, _ = _outcome(compiled, x, n)
        assert log == eager_log
        _same(expected, got)


def getpid_in_try(y: torch.Tensor, n: int) -> torch.Tensor:
    y = y + 1
    try:
        LOG.append("try")
        os.getpid(*range(n))  # the break instruction, inside the try: raises a TypeError for n > 0
        LOG.append("after")
        if n < 0:
            raise KeyError(n)  # raised in the continuation, inside the try
    except TypeError as e:
        LOG.append(f"caught {type(e).__name__}")
        y = y * 10
    except KeyError:
        LOG.append("key")
        return y - 1
    finally:
        LOG.append("finally")
    return y * 2


def getpid_top(x: torch.Tensor, n: int) -> torch.Tensor:
    return getpid_in_try(x.sin(), n) + 1


def branch_in_try(y: torch.Tensor) -> torch.Tensor:
    y = y * 3
    try:
        if y:  # the break: a jump on a tensor; a RuntimeError for more than one element
            LOG.append("true")
            y = y + 1
        LOG.append("after")
    except RuntimeError:
        LOG.append("ambiguous")
        y = y - 1
    return y


def branch_top(x: torch.Tensor) -> torch.Tensor:
    return branch_in_try(x.exp()) * 2


def no_grad_leaf(y: torch.Tensor, n: int) -> torch.Tensor:
    y = y * 2
    with torch.no_grad():
        os.getpid(*range(n))  # the break instruction, inside a grad-mode block
        z = y + 1
    return z * y


def no_grad_leaf_top(x: torch.Tensor, n: int) -> torch.Tensor:
    return no_grad_leaf(x.exp(), n) - x


@pytest.mark.parametrize(
    ("fn", "cases"),
    [
        (getpid_top, ((0,), (1,), (-1,), (0,))),
        (branch_top, ((),)),
        (no_grad_leaf_top, ((0,), (2,), (0,))),
    ],
)
def test_the_break_instruction_inside_a_try_or_with_block(
    fn: Callable[..., torch.Tensor], cases: tuple[tuple[int, ...], ...]
) -> None:
    for shape in ((), (3,)):  # one element, and an ambiguous truth value
        kiln_dynamo.reset()
        x = torch.randn(shape, requires_grad=True)
        compiled = kiln_dynamo.compile(fn)
        for i, extra in enumerate(cases):
            expected, eager_log, eager_grad = _outcome(fn, x, *extra)
            got, log, grad = _outcome(compiled, x, *extra)
            assert log == eager_log and grad == eager_grad is True
            if isinstance(expected, Exception):
                assert type(got) is type(expected) and str(got) == str(expected)
            else:
                _same(expected, got)
            if i == 0 and shape == ():  # one split, through the innermost frame's try or with block
                assert (counters.graphs, counters.graph_breaks, len(counters.fallbacks)) == (2, 1, 0)
                [reason] = counters.break_reasons
                assert reason.note is not None and "2 frames resumed at once" in reason.note


# --- a display built across a chain split (Note [Displays built across a break]) ----------------


class _Peeker:
    def __init__(self) -> None:
        self.items = [3, 1, 2]
        self.flag = True

    def peek(self, t: torch.Tensor) -> int:
        self.items.append(len(t.tolist()))  # breaks here, then again at list.append
        return 5


def dict_display(x: torch.Tensor, lst: list[int], obj: _Peeker, d: dict[str, int]) -> Any:
    v = {**d, "z": obj.peek(x), "w": 1}
    for _ in lst:  # a side effect after the breaks: the last continuation gets a runner
        obj.flag = hasattr(obj, "nope")
    return v


def list_display(x: torch.Tensor, lst: list[int], obj: _Peeker, d: dict[str, int]) -> Any:
    v = [*lst, obj.peek(x), *d]
    for _ in lst:
        obj.flag = hasattr(obj, "nope")
    return v


def set_display(x: torch.Tensor, lst: list[int], obj: _Peeker, d: dict[str, int]) -> Any:
    v = {*lst, obj.peek(x), *d}
    for _ in lst:
        obj.flag = hasattr(obj, "nope")
    return v


@pytest.mark.parametrize("fn", [dict_display, list_display, set_display])
def test_a_display_half_built_at_a_chain_split_is_finished(fn: Callable[..., Any]) -> None:
    # pyfuzz seed 5714: the half-built dict reached the continuation as an argument and the
    # keys added after the break were dropped from the returned dict
    compiled = kiln_dynamo.compile(fn)
    for _ in range(2):
        eager_obj, comp_obj = _Peeker(), _Peeker()
        args = (torch.ones(3), [1, 2], {"a": 1, "k1": 2})
        expected = fn(args[0], args[1], eager_obj, args[2])
        got = compiled(args[0], args[1], comp_obj, args[2])
        assert type(got) is type(expected) and got == expected
        if isinstance(got, dict):
            assert list(got) == list(expected)
        assert comp_obj.__dict__ == eager_obj.__dict__
    assert counters.graph_breaks >= 1
