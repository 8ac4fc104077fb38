"""A break inside a loop: the loop runs as Python, the code after it is captured (Note [Compiling
what follows a loop] in resume.py), where that is sound; elsewhere the frame runs as plain Python
with the reason, as before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import CountingBackend, assert_same
from torch import nn

import kiln_dynamo
from kiln_dynamo import convert_frame


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kiln_dynamo.reset()
    yield
    kiln_dynamo.reset()


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.lin(x))
        if y.sum() > 0:  # data-dependent: a break inside each decoder layer
            y = y * 2
        return x + y


class Decoder(nn.Module):
    """The common real-world case: a break inside the decoder-layer loop, work before and after."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(8, 8)
        self.layers = nn.ModuleList([Layer() for _ in range(3)])
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        h = self.emb(x) * 2
        hidden: tuple[torch.Tensor, ...] = ()
        for layer in self.layers:
            hidden = (*hidden, h)
            h = layer(h)
        h = torch.tanh(self.norm(h)) + 1  # after the loop: captured now
        return self.head(h).softmax(-1), hidden


def run_twice(fn: Callable[..., Any], *args: Any) -> tuple[CountingBackend, Any]:
    """Compile `fn`, call it twice (capture, then cache hits) and compare both with eager."""
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for _ in range(2):
        assert_same(compiled(*args), fn(*args))
    return backend, compiled


def test_the_code_after_a_decoder_loop_is_a_graph() -> None:
    torch.manual_seed(0)
    model = Decoder().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        backend, _ = run_twice(model, x)
    c = kiln_dynamo.counters
    # before the loop; each layer's forward split at its branch (two graphs, reused by all three
    # layers); the code after the loop (norm, tanh, head, softmax)
    # (the loop body is a piece, Note [Loop body pieces]: nothing to compile before the layer
    # call nor after it, so it runs as Python and makes no graph)
    assert backend.graphs == 4 and c.after_loops == 1 and c.recompiles == 0
    after = backend.gms[-1]
    targets = {n.target for n in after.graph.nodes if n.op == "call_function"}
    assert torch.tanh in targets and torch.nn.functional.layer_norm in targets
    (plain,) = [r for r in c.break_reasons if not r.split and "loop piece" not in str(r.not_split)]
    assert plain.not_split is not None and "the code after the loop is captured" in plain.not_split
    assert "resume_in_forward_at_" in plain.not_split


def test_switched_off_the_code_after_the_loop_runs_as_python() -> None:
    model = Decoder().eval()
    x = torch.randn(2, 8)
    previous = convert_frame.set_after_loops(False)
    try:
        with torch.no_grad():
            backend, _ = run_twice(model, x)
    finally:
        convert_frame.set_after_loops(previous)
    assert backend.graphs == 3 and kiln_dynamo.counters.after_loops == 0


def test_training_through_the_continuation_after_the_loop() -> None:
    torch.manual_seed(0)
    model = Decoder().train()
    ref = Decoder().train()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 8)
    compiled = kiln_dynamo.compile(model, backend=CountingBackend())
    out, _ = compiled(x)
    out.square().sum().backward()
    want, _ = ref(x)
    want.square().sum().backward()
    assert_same(out, want)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert kiln_dynamo.counters.after_loops == 1


def loop_with_break_statement(x: torch.Tensor, n: int) -> torch.Tensor:
    y = x.cos()
    for i in range(n):
        if y.sum() > 100:  # never true here: a break all the same
            break
        y = y + i
        if i == 2:
            break  # a `break` jumps to the loop's exit too
    return y.sin() * 2


def loop_with_return_inside(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    for i in range(4):
        y = y + 1
        if y.sum() > 1e6 or i == 10:
            return y  # never taken
    z = y.exp()
    return z + y


@pytest.mark.parametrize("n", [1, 5])
def test_break_statements_in_the_loop(n: int) -> None:
    backend, _ = run_twice(loop_with_break_statement, torch.rand(4), n)
    assert kiln_dynamo.counters.after_loops == 1 and kiln_dynamo.counters.loop_pieces == 1
    # before the loop, after it, and the piece `y = y + i` once per value of i it ran with (the
    # counting backend takes no symbolic sizes): i stops at 2
    assert backend.graphs == 2 + min(n, 3)
    # another count of iterations: the same rewritten code, a new graph only where guards differ
    x = torch.rand(4)
    assert_same(
        kiln_dynamo.compile(loop_with_break_statement, backend=backend)(x, 0), loop_with_break_statement(x, 0)
    )


def test_a_return_inside_the_loop() -> None:
    backend, _ = run_twice(loop_with_return_inside, torch.rand(4))
    assert kiln_dynamo.counters.after_loops == 1 and backend.graphs == 3  # before, `y + 1`, after


def maybe_unbound(x: torch.Tensor, n: int) -> torch.Tensor:
    y = x.cos()
    for i in range(n):
        last = y * i
        if last.sum() > 0:
            y = y + 1
    return last + y  # unbound when the loop ran no iteration


def in_a_try(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    try:
        for _ in range(2):
            if y.sum() > 0:
                y = y + 1
        y = y.sin()
    except RuntimeError:
        y = y * 0
    return y


def with_a_closure(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    scale = 2.0

    def f(t: torch.Tensor) -> torch.Tensor:
        return t * scale

    for _ in range(2):
        if y.sum() > 0:
            y = f(y)
        scale = scale + 1  # the closure must see this write
    return f(y)


@pytest.mark.parametrize(
    ("fn", "args", "why"),
    [
        (maybe_unbound, (torch.rand(4), 2), "last may be unbound at the loop's exit"),
        (in_a_try, (torch.rand(4),), "split before the try block"),
        (with_a_closure, (torch.rand(4),), "the frame has cell variables"),
    ],
    ids=["maybe-unbound", "try", "closure"],
)
def test_where_it_is_not_sound_the_frame_runs_as_python(
    fn: Callable[..., Any], args: tuple[Any, ...], why: str
) -> None:
    run_twice(fn, *args)
    c = kiln_dynamo.counters
    assert c.after_loops == 0
    assert any(why in str(r) for r in c.break_reasons), [str(r) for r in c.break_reasons]


def test_the_rewrite_refuses_an_exit_inside_a_try_block() -> None:
    from kiln_dynamo import resume

    code = in_a_try.__code__
    entry = next(ins.offset for ins in resume.facts(code).instrs if ins.opname == "GET_ITER")
    assert resume.after_loop_code(code, entry) == "a try or with block covers the loop's exit"
    code = loop_with_return_inside.__code__
    entry = next(ins.offset for ins in resume.facts(code).instrs if ins.opname == "GET_ITER")
    new, after = resume.after_loop_code(code, entry)  # type: ignore[misc]
    assert after.co_name.startswith("resume_in_loop_with_return_inside_at_")
    assert after in new.co_consts


def test_an_unbound_local_after_an_empty_loop_raises_as_in_eager() -> None:
    compiled = kiln_dynamo.compile(maybe_unbound, backend=CountingBackend())
    x = torch.rand(4)
    assert_same(compiled(x, 2), maybe_unbound(x, 2))
    with pytest.raises(UnboundLocalError):
        maybe_unbound(x, 0)
    with pytest.raises(UnboundLocalError):
        compiled(x, 0)


def two_loops_and_a_while(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    for i in range(3):
        if y.sum() > 0:
            y = y + i
    y = y * 3
    for j in range(2):
        for k in range(2):  # nested: the outer loop is the one split around
            if y.mean() > 0:
                y = y - j * k
    z = y.sin()
    n = 0
    while n < 2:
        n += 1
        if z.sum() > 0:
            z = z * 0.5
    return z.exp() + n


@pytest.mark.parametrize("pieces", [False, True])
def test_consecutive_nested_and_while_loops(pieces: bool) -> None:
    previous = convert_frame.set_loop_pieces(pieces)
    try:
        backend, compiled = run_twice(two_loops_and_a_while, torch.rand(4))
    finally:
        convert_frame.set_loop_pieces(previous)
    c = kiln_dynamo.counters
    if pieces:
        # one piece per loop body, and one for the inner loop's body inside the nested one's
        assert c.loop_pieces == 4, [str(r) for r in c.break_reasons]
        return
    # each loop's exit continues in a continuation: before the first loop, between the loops,
    # after the second, after the while loop
    assert c.after_loops == 3 and backend.graphs == 4, [str(r) for r in c.break_reasons]
    x = -torch.rand(4)  # the branches go the other way: the same code, no new capture
    assert_same(compiled(x), two_loops_and_a_while(x))


class _Base(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3


class _WithSuper(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # the frame has a __class__ cell
        for i in range(2):
            if x.sum() > 0:
                x = x + i
        return super().forward(x).cos()  # after the loop: super() needs `self` in the continuation


def test_zero_argument_super_after_the_loop() -> None:
    backend, _ = run_twice(_WithSuper(), torch.rand(4))
    c = kiln_dynamo.counters
    # the loop body is a piece split at its branch: `x.sum() > 0`, and `x + i` per value of i
    assert c.after_loops == 1 and backend.graphs == 5, [str(r) for r in c.break_reasons]
    after = backend.gms[-1]
    assert {n.target for n in after.graph.nodes if n.op in ("call_function", "call_method")} >= {"cos"}


class _SuperInTheLoop(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            x = super().forward(x) - 1  # in the loop body: the piece needs `self` and __class__
            print("x")
            x = super().forward(x).sin()
        return x


def test_zero_argument_super_in_a_loop_piece(capsys: pytest.CaptureFixture[str]) -> None:
    backend, _ = run_twice(_SuperInTheLoop(), torch.rand(4))
    assert kiln_dynamo.counters.loop_pieces == 1
    assert backend.graphs == 2  # the piece before the print and after it, reused by both iterations
