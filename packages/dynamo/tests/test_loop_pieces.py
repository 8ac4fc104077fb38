"""The body of a loop that holds a break, compiled in pieces the hook captures per iteration
(Note [Loop body pieces] in loop_pieces.py): results and gradients match eager, the graphs hold
the loop body's own tensor work, and where a piece is not sound its statements run as Python."""

from __future__ import annotations

import contextlib
import dis
import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import CountingBackend, assert_same
from torch import nn

import kiln_dynamo
from kiln_dynamo import convert_frame, loop_pieces, resume


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kiln_dynamo.reset()
    yield
    kiln_dynamo.reset()


def targets(gm: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def run(fn: Callable[..., Any], *args: Any, calls: int = 2) -> CountingBackend:
    """Compile `fn`, call it `calls` times (capture, then cache hits), compare each with eager."""
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for _ in range(calls):
        with contextlib.redirect_stdout(io.StringIO()) as got_out:
            got = compiled(*args)
        with contextlib.redirect_stdout(io.StringIO()) as want_out:
            want = fn(*args)
        assert_same(got, want)
        assert got_out.getvalue() == want_out.getvalue()
    return backend


class Block(nn.Module):
    """A decoder layer with a data-dependent branch: a break inside each layer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.sum() > 0:
            y = y * 2
        return y


class Stack(nn.Module):
    """The real-world shape: the loop body does its own tensor work around the layer call (a
    pre-norm residual block), and the break is inside the layer."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(8) for _ in range(3)])
        self.layers = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h * 2
        for norm, layer in zip(self.norms, self.layers, strict=True):
            residual = h
            h = torch.tanh(norm(h))  # before the break: a graph
            h = layer(h)  # the break is inside
            h = (h + residual) * 0.5  # after it: a graph
        return h


def test_the_statements_around_a_layer_call_are_graphs() -> None:
    torch.manual_seed(0)
    model = Stack().eval()
    with torch.no_grad():
        backend = run(model, torch.randn(2, 8))
    c = kiln_dynamo.counters
    assert c.loop_pieces == 1 and c.recompiles == 0, c.guard_failures
    found = [targets(gm) for gm in backend.gms]
    # the piece before the layer call (norm + tanh) and after it (add, mul): one graph each,
    # reused by all three iterations (modules are guarded by type)
    assert any(torch.tanh in t and torch.nn.functional.layer_norm in t for t in found), found
    assert any(len(t) == 2 and all(getattr(x, "__name__", "") in ("add", "mul") for x in t) for t in found)
    (plain,) = [r for r in c.break_reasons if not r.split]
    assert plain.not_split is not None
    assert "the loop body is captured in pieces called per iteration: piece_of_" in plain.not_split


def test_training_through_the_pieces_gives_eager_gradients() -> None:
    torch.manual_seed(0)
    model, ref = Stack().train(), Stack().train()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 8)
    compiled = kiln_dynamo.compile(model, backend=CountingBackend())
    for _ in range(2):
        compiled(x).square().sum().backward()
        ref(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert kiln_dynamo.counters.loop_pieces == 1


def around_a_print(x: torch.Tensor, ws: list[torch.Tensor]) -> torch.Tensor:
    h = x
    for w in ws:
        h = torch.relu(h @ w) * 2
        print("step")  # a break in the loop body itself
        h = h + 1
    return h


def test_a_break_in_the_loop_body_itself() -> None:
    backend = run(around_a_print, torch.randn(2, 4), [torch.randn(4, 4) for _ in range(3)])
    # the piece, split at the print: before it (matmul, relu, mul) and after it (add)
    assert backend.graphs == 2 and kiln_dynamo.counters.recompiles == 0
    assert [len(targets(gm)) for gm in backend.gms] == [3, 1]


def with_continue_and_a_conditional_write(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    acc = x.sin()
    last = x
    for _ in range(n):
        acc = acc * 1.5
        if acc.sum() > 1e9:  # a break; never true
            continue
        if n > 2:
            last = acc.cos()  # written on some paths only: the piece returns the old value otherwise
        acc = acc - 0.25
    return acc, last


@pytest.mark.parametrize("n", [2, 3])
def test_continue_and_a_local_written_on_some_paths(n: int) -> None:
    run(with_continue_and_a_conditional_write, torch.rand(4), n)
    assert kiln_dynamo.counters.loop_pieces == 1


def nested(x: torch.Tensor) -> torch.Tensor:
    for _ in range(2):
        x = x + 1
        for _ in range(2):
            x = x * 0.5
            if x.sum() > 100:  # the break is in the inner loop
                x = x - 1
        x = x.exp()
    return x


def test_a_break_in_an_inner_loop() -> None:
    run(nested, torch.rand(4), calls=3)
    c = kiln_dynamo.counters
    # the outer body is a piece; inside it, the inner loop's body is a piece of its own
    assert c.loop_pieces == 2, [str(r) for r in c.break_reasons]


def raising(x: torch.Tensor, table: dict[str, torch.Tensor], keys: list[str]) -> torch.Tensor:
    for k in keys:
        x = x + table[k]  # a missing key raises KeyError from the piece
        print(k)
    return x


def test_an_exception_from_a_piece_leaves_the_frame_as_in_eager() -> None:
    table = {"a": torch.ones(2)}
    compiled = kiln_dynamo.compile(raising, backend=CountingBackend())
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert_same(compiled(torch.zeros(2), table, ["a", "a"]), raising(torch.zeros(2), table, ["a", "a"]))
        with pytest.raises(KeyError, match="b"):
            compiled(torch.zeros(2), table, ["a", "b"])
    assert out.getvalue().count("a\n") == 5


def maybe_unbound_in_the_body(x: torch.Tensor, n: int) -> torch.Tensor:
    for i in range(n):
        if i > 0:
            x = x + prev  # noqa: F821 - bound by the previous iteration
        prev = x * 2  # noqa: F841 - read by the next iteration
        print(i)
    return x


def test_a_local_unbound_at_a_piece_start_refuses_that_piece() -> None:
    run(maybe_unbound_in_the_body, torch.rand(3), 3)
    c = kiln_dynamo.counters
    (plain,) = [r for r in c.break_reasons if not r.split]
    assert plain.not_split is not None and "prev may be unbound" in plain.not_split, plain.not_split


def test_switched_off_the_loop_body_runs_as_python() -> None:
    previous = convert_frame.set_loop_pieces(False)
    try:
        model = Stack().eval()
        with torch.no_grad():
            backend = run(model, torch.randn(2, 8))
    finally:
        convert_frame.set_loop_pieces(previous)
    assert kiln_dynamo.counters.loop_pieces == 0
    assert not any(torch.tanh in targets(gm) for gm in backend.gms)


def test_piece_code_is_a_function_of_the_range() -> None:
    code = around_a_print.__code__
    entry = next(ins.offset for ins in resume.facts(code).instrs if ins.opname == "GET_ITER")
    done = loop_pieces.loop_code(code, entry, after=True, pieces=True)
    assert isinstance(done, loop_pieces.LoopCode) and isinstance(done.pieces, loop_pieces.Pieces)
    (piece,) = done.pieces.codes
    assert loop_pieces.is_loop_piece(piece) and piece in done.code.co_consts  # type: ignore[union-attr]
    assert piece.co_varnames[: piece.co_argcount] == ("h", "w")
    fn = type(around_a_print)(piece, around_a_print.__globals__)
    h, w = torch.randn(2, 4), torch.randn(4, 4)
    with contextlib.redirect_stdout(io.StringIO()):
        (got,) = fn(h, w)
    torch.testing.assert_close(got, torch.relu(h @ w) * 2 + 1)


def comprehensions(xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[int, torch.Tensor], int]:
    listed = [print(i) or x * 2 for i, x in enumerate(xs)]  # LIST_APPEND reaches below the iterator
    mapped = {i: print(i) or x + 1 for i, x in enumerate(xs)}  # MAP_ADD
    return listed, mapped, len({print(i) or i for i in range(3)})  # SET_ADD


def test_comprehensions_with_a_break_keep_their_accumulator() -> None:
    run(comprehensions, [torch.rand(2) for _ in range(3)])


def counter_in_the_body(x: torch.Tensor, n: int) -> torch.Tensor:
    for i, scale in enumerate([0.5] * n):
        x = x * scale + i  # reads the loop counter
        print(i)
    return x


def test_the_loop_counter_is_symbolic_from_the_first_capture() -> None:
    """With a backend that takes symbolic sizes (dynamo's eager), `i` is a symbolic int in the
    piece from its first capture: one capture serves every iteration (no recompile per value)."""
    compiled = kiln_dynamo.compile(counter_in_the_body)
    x = torch.rand(3)
    with contextlib.redirect_stdout(io.StringIO()):
        for n in (4, 4):
            assert_same(compiled(x, n), counter_in_the_body(x, n))
    c = kiln_dynamo.counters
    assert c.loop_pieces == 1 and c.recompiles == 0, c.guard_failures


def branchy(x: torch.Tensor) -> torch.Tensor:
    """A callee that breaks (a data-dependent branch): it is captured on its own."""
    if x.sum() > 0:
        return x * 2
    return x - 1


def locals_after_pieces(x: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    for i in range(3):
        t = x + i
        x = branchy(t)
        u = x * 3  # dead after the piece that writes it: only locals() reads it
    return x, dict(locals())


def locals_after_a_split(x: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    u = x * 3  # noqa: F841 - read through vars()
    x = branchy(x)
    return x, vars()


def vars_of_an_object_still_splits(x: torch.Tensor, obj: Any) -> tuple[torch.Tensor, list[str]]:
    u = x * 3
    x = branchy(u)
    return x, sorted(vars(obj))


@pytest.mark.parametrize("fn", [locals_after_pieces, locals_after_a_split], ids=lambda f: f.__name__)
def test_a_frame_that_reads_its_locals_sees_eager_locals(fn: Callable[..., Any]) -> None:
    """Note [A frame that reads its own locals] (resume.py): `locals()` and `vars()` see every
    local eager sees, with eager's values (before: a KeyError for the dead `u`, and kiln's own
    `___r`); the frame runs as Python with the reason, and its callee is still captured."""
    backend = run(fn, torch.randn(4), calls=2)
    c = kiln_dynamo.counters
    assert c.loop_pieces == 0
    mine = [r for r in c.break_reasons if not r.split and r.not_split and "reads its locals" in r.not_split]
    assert mine, [str(r) for r in c.break_reasons]
    assert any("sum" in str(targets(gm)) for gm in backend.gms)  # branchy's graph


def test_vars_with_an_argument_does_not_stop_a_split() -> None:
    class Obj:
        def __init__(self) -> None:
            self.b, self.a = 1, 2

    run(vars_of_an_object_still_splits, torch.randn(4), Obj())
    assert any(r.split for r in kiln_dynamo.counters.break_reasons)
    assert resume.reads_own_locals(vars_of_an_object_still_splits.__code__) is None
    assert "locals()" in (resume.reads_own_locals(locals_after_pieces.__code__) or "")


def handler_ends_the_body(x: torch.Tensor, items: list[int]) -> tuple[torch.Tensor, str]:
    for i in items:
        x = x * 2 + i
        print(i)  # the break: the body is cut into pieces
        try:
            if i > 100:
                raise IndexError(i)
        except IndexError:
            x = x - 1  # 3.12 places this handler after the code that follows the loop
    joined = "-".join(str(v) for v in items)
    return x.sin(), joined


def make_closure() -> Callable[[torch.Tensor, list[int]], tuple[torch.Tensor, str, int]]:
    cell = 1

    def closes_over_a_cell(x: torch.Tensor, items: list[int]) -> tuple[torch.Tensor, str, int]:
        nonlocal cell
        for i in items:
            x = x * cell + i
            print(i)
            cell = cell % 3 + 1  # a write to the frame's free variable, from a piece
            try:
                if i > 100:
                    raise IndexError(i)
            except IndexError:
                x = x - 1
        joined = "-".join(str(v) for v in items)
        return x.sin(), joined, cell

    return closes_over_a_cell


def test_the_loop_body_leaves_out_the_code_after_the_loop() -> None:
    """Note [A loop body is not a range] (resume.py): under 3.12 the handler's jump back to the
    loop head comes after `joined = ...`; that statement is not in the body, the handler is."""
    code = handler_ends_the_body.__code__
    instrs = resume.facts(code).instrs
    entry = next(ins.offset for ins in instrs if ins.opname == "GET_ITER")
    shape = resume.loop_shape(list(instrs), code, entry)
    assert isinstance(shape, resume.LoopShape)
    first = code.co_firstlineno
    lines = {instrs[k].lineno for k in shape.body}
    assert first + 8 in lines  # x = x - 1
    assert first + 9 not in lines and first + 10 not in lines  # joined = ...; return
    f = resume.facts(code)
    assert all(not f.in_loop(ins.offset) for ins in instrs if ins.lineno in (first + 9, first + 10))


@pytest.mark.parametrize("fn", [handler_ends_the_body, make_closure()], ids=["plain", "closure"])
def test_pieces_of_a_body_that_ends_in_a_handler(fn: Callable[..., Any]) -> None:
    """The pieces are cut from the loop body only, and the code after the loop is continued
    as after any loop: before, under 3.12, a piece was cut from
    `"-".join(...)` after the loop, popped below its stack and read the frame's last local (the
    closure's cell: "'cell' object has no attribute 'join'"; without free variables, a crash).
    The frame with a closure gets its pieces too, under both Pythons."""
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    eager = make_closure() if fn.__name__ == "closes_over_a_cell" else fn
    for items in ([1, 2, 3], [4, 200, 5]):
        with contextlib.redirect_stdout(io.StringIO()) as got_out:
            got = compiled(torch.ones(3), items)
        with contextlib.redirect_stdout(io.StringIO()) as want_out:
            want = eager(torch.ones(3), items)
        assert_same(got, want)
        assert got_out.getvalue() == want_out.getvalue()
    c = kiln_dynamo.counters
    assert c.loop_pieces >= 1, [str(r) for r in c.break_reasons]
    assert c.after_loops >= 1, [str(r) for r in c.break_reasons]  # the code after the loop: a graph
    joined_line = fn.__code__.co_firstlineno + (9 if fn is handler_ends_the_body else 10)
    for piece in loop_pieces._pieces:
        if piece.co_name.startswith(f"piece_of_{fn.__name__}_"):
            assert all(
                ins.positions is None or ins.positions.lineno != joined_line
                for ins in dis.get_instructions(piece)
            )
