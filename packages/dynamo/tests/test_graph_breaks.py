"""Graph breaks: a matrix of break kinds x positions, each compared with eager.

Every function of the matrix is generated from two templates: a *kind* (a few lines that kiln
cannot put in a graph, operating on a tensor `y`, with `# BREAK` on the line that breaks) and a
*position* (where those lines sit: the compiled function itself, one or three inlined calls down,
a for loop, a `with torch.no_grad()` block, a try block). The generated module is written to a
real file so that break reasons can be checked against its file and line.

Each case asserts: outputs (values, dtypes, requires_grad) and printed text equal eager's; the
number of graphs, of splits (frames split at a break) and of frames left to plain Python are the
expected ones; the second call captures nothing new (every frame hits its cache); and the
recorded reason names the generated file, the marked line and the kind's words.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import tempfile
import textwrap
import types
from typing import Any

import pytest
import torch

import kiln_dynamo
from kiln_dynamo import convert_frame, resume

# --- the generated matrix -----------------------------------------------------------------------

# kind -> (lines, words expected in the reason, (graphs, splits, plain-Python frames) at top level)
KINDS: dict[str, tuple[str, str, tuple[int, int, int]]] = {
    "branch": (
        """\
        if y.sum() > 0:  # BREAK
            y = y * 2
        else:
            y = y - 1
        """,
        "data-dependent branch on a tensor value",
        (2, 1, 0),
    ),
    "item": ("y = y * y.sum().item()  # BREAK\n", "Tensor.item() used in Python arithmetic", (2, 1, 0)),
    "tolist": ("y = y + sum(y.tolist())  # BREAK\n", "Tensor.tolist()", (2, 1, 0)),
    "print": ('print("value", y.shape, y.dtype)  # BREAK\n', "print()", (2, 1, 0)),
    "c_call": (
        "y = y + os.getpid() * 0  # BREAK\n",
        "call to a C function os.getpid that kiln cannot trace",
        (2, 1, 0),
    ),
    # a generator function is traced step by step (Note [Generators traced step by step]): no break
    "generator": ("y = torch.stack(list(halves(y))).sum(0)  # BREAK\n", "", (1, 0, 0)),
    # nothing in the try block breaks: it is traced like straight-line code (no break at all)
    "try_catch": (
        """\
        try:
            y = y + 1  # BREAK
        except ValueError:
            y = y - 1
        """,
        "",
        (1, 0, 0),
    ),
    "builtin": ('y = y * len(ascii("ab"))  # BREAK\n', "call to the builtin ascii()", (2, 1, 0)),
}

POSITIONS: dict[str, str] = {
    "top": """\
        def {name}(x):
            y = x.cos()
        {kind:4}
            return y.sin()
        """,
    "inline1": """\
        def {name}_inner(y):
            y = y + 1
        {kind:4}
            return y * 2

        def {name}(x):
            y = x.cos()
            y = {name}_inner(y)
            return y.sin()
        """,
    "inline3": """\
        def {name}_c(y):
            y = y + 1
        {kind:4}
            return y * 2

        def {name}_b(y):
            y = y - 1
            y = {name}_c(y)
            return y * 3

        def {name}_a(y):
            y = y * 0.5
            y = {name}_b(y)
            return y + 4

        def {name}(x):
            y = x.cos()
            y = {name}_a(y)
            return y.sin()
        """,
    "loop": """\
        def {name}(x):
            y = x.cos()
            for i in range(2):
                y = y + i
        {kind:8}
            return y.sin()
        """,
    "no_grad": """\
        def {name}(x):
            y = x.cos()
            with torch.no_grad():
                y = y + 1
        {kind:8}
                z = y * 2
            return y.sin() + z, z
        """,
    "try": """\
        def {name}(x):
            y = x.cos()
            try:
                y = y + 1
        {kind:8}
            except ValueError:
                y = y - 1
            return y.sin()
        """,
}

_HEADER = """\
import os

import torch


def halves(t):
    yield t * 0.5
    yield t * 0.5

"""


def _render(kind: str, position: str) -> str:
    lines, _, _ = KINDS[kind]
    template = textwrap.dedent(POSITIONS[position])
    name = f"{kind}_at_{position}"
    out = []
    for line in template.splitlines():
        if line.startswith("{kind:"):
            indent = int(line[len("{kind:") : -1])
            out += [" " * indent + k for k in textwrap.dedent(lines).splitlines()]
        else:
            out.append(line.replace("{name}", name))
    return "\n".join(out) + "\n\n"


def _load_matrix() -> tuple[types.ModuleType, dict[str, int]]:
    source = _HEADER + "".join(_render(k, p) for k in KINDS for p in POSITIONS)
    folder = tempfile.mkdtemp(prefix="kiln_breaks_")
    path = os.path.join(folder, "break_matrix.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("break_matrix", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    marks: dict[str, int] = {}  # function name (kind_at_position) -> line of its BREAK mark
    tries: dict[str, int] = {}  # function name -> first line inside its first try block
    current = ""
    lines = source.splitlines()
    for lineno, line in enumerate(lines, start=1):
        if line.startswith("def "):
            current = line[4:].split("(")[0]
        if "# BREAK" in line:
            marks[current] = lineno
        if line.strip() == "try:" and current not in tries:
            tries[current] = lineno + 1
    return module, marks, tries


MATRIX, MARKS, TRY_MARKS = _load_matrix()


TRACED_WHOLE = ("try_catch", "generator")  # kinds that no longer break anywhere


def expected(kind: str, position: str) -> tuple[int, int, int]:
    """(graphs, splits, plain-Python frames) for one case.

    A break in an inlined call splits the whole chain of frames at once (Note [Resuming a chain
    of frames]): one split, one graph before it holding every frame's code up to the break, and
    after it the outer frame's continuation, which calls the inner ones: the same counts as at
    top level. A frame is not split inside a loop: it splits before the loop, and the
    continuation (the loop on) runs as plain Python, but its loop's exit calls a continuation
    that is captured: the code after the loop is one more graph (Note [Compiling what follows a
    loop]). A break inside a try block splits the frame
    before the block (Note [Tracing try blocks]), which runs as plain Python too. A try block
    without a break inside is traced whole, wherever it is."""
    graphs, splits, plain = KINDS[kind][2]
    if kind in TRACED_WHOLE:
        return graphs, splits, plain
    if position == "loop":
        return 2, 1, 1
    if position == "try":
        return 1, 1, 1
    return graphs, splits, plain


def _same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.requires_grad == b.requires_grad and a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b, (a, b)


CASES = [(k, p) for k in KINDS for p in POSITIONS]


@pytest.mark.parametrize(("kind", "position"), CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_break_matrix(
    kind: str, position: str, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    name = f"{kind}_at_{position}"
    fn = getattr(MATRIX, name)
    x = torch.rand(4) + 0.5
    if position == "no_grad":
        x.requires_grad_(True)
    compiled = kiln_dynamo.compile(fn)
    counters = kiln_dynamo.counters
    if position == "loop":  # the counts as before loop body pieces: test_break_matrix_loop_pieces
        previous = convert_frame.set_loop_pieces(False)
        request.addfinalizer(lambda: convert_frame.set_loop_pieces(previous))
    seen_after_first = graphs_after_first = -1
    for call in range(2):
        expected_out = fn(x)
        printed_eager = capsys.readouterr().out
        actual = compiled(x)
        printed = capsys.readouterr().out
        _same(expected_out, actual)
        assert printed == printed_eager
        assert torch.is_grad_enabled()
        if call == 0:
            seen_after_first, graphs_after_first = counters.frames_seen, counters.graphs
    # the second call hit every cache: no frame reached the callback again
    assert counters.frames_seen == seen_after_first and counters.graphs == graphs_after_first
    assert counters.recompiles == 0
    graphs, splits, plain = expected(kind, position)
    assert (counters.graphs, counters.graph_breaks, len(counters.fallbacks)) == (graphs, splits, plain), [
        str(r) for r in counters.break_reasons
    ]
    if kind in TRACED_WHOLE:
        assert counters.break_reasons == []
        return
    # the reason: the kind's words at the marked line of the generated file
    first = counters.break_reasons[0]
    assert KINDS[kind][1] in first.reason, first
    assert first.filename == MATRIX.__file__
    innermost = {"inline1": f"{name}_inner", "inline3": f"{name}_c"}.get(position, name)
    assert first.lineno == MARKS[innermost], first
    assert first.frames[-1].name == innermost
    if position == "try":
        assert first.note is not None and "split before the try block" in first.note
        assert TRY_MARKS[name] <= first.lineno
    if position == "inline3":
        assert [f.name for f in first.frames] == [name, f"{name}_a", f"{name}_b", f"{name}_c"]
    assert first.split
    if position == "loop":
        assert first.note is not None and "split before the loop" in first.note
        last = counters.break_reasons[-1]
        assert not last.split and last.not_split is not None and "inside a loop" in last.not_split
        assert "the code after the loop is captured" in last.not_split
        assert counters.after_loops == 1


# (graphs, splits, plain-Python frames, recompiles) with the loop body in pieces (Note [Loop body
# pieces]): the graph before the loop and the one after it, as before; the piece (`y = y + i`, then
# the kind) split at the break, captured once with the loop counter i symbolic from the start (the
# eager backend takes symbolic sizes): one graph before the break and one split; what follows the
# break in the piece is one more graph where it does tensor work (both branches, `y * <item>`); a
# Python number read from a tensor (`item`, `tolist`) is guarded by value in that continuation, so
# its second value recompiles it.
LOOP_PIECES: dict[str, tuple[int, int, int, int]] = {
    "branch": (4, 2, 1, 0),
    "item": (5, 2, 1, 1),
    "tolist": (5, 2, 1, 1),
    "print": (3, 2, 1, 0),
    "c_call": (4, 2, 1, 0),
    "builtin": (4, 2, 1, 0),
}


@pytest.mark.parametrize("kind", list(LOOP_PIECES))
def test_break_matrix_loop_pieces(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    fn = getattr(MATRIX, f"{kind}_at_loop")
    x = torch.rand(4) + 0.5
    compiled = kiln_dynamo.compile(fn)
    for _ in range(3):
        expected_out = fn(x)
        printed_eager = capsys.readouterr().out
        _same(expected_out, compiled(x))
        assert capsys.readouterr().out == printed_eager
    c = kiln_dynamo.counters
    assert c.loop_pieces == 1 and c.after_loops == 1
    assert (c.graphs, c.graph_breaks, len(c.fallbacks), c.recompiles) == LOOP_PIECES[kind], [
        str(r) for r in c.break_reasons
    ]
    last = [r for r in c.break_reasons if not r.split][-1]
    assert last.not_split is not None and "the loop body is captured in pieces" in last.not_split


def test_matrix_reasons_are_readable() -> None:
    fn = MATRIX.item_at_inline1
    kiln_dynamo.compile(fn)(torch.rand(4))
    text = str(kiln_dynamo.counters.break_reasons[0])
    assert "Tensor.item() used in Python arithmetic" in text
    assert f"break_matrix.py:{MARKS['item_at_inline1_inner']}" in text
    assert "y = y * y.sum().item()" in text  # the user's source line
    assert "advice:" in text and "item_at_inline1_inner" in text  # advice, and the inlined call


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in TRACED_WHOLE])
def test_fullgraph_raises_with_the_same_text(kind: str) -> None:
    fn = getattr(MATRIX, f"{kind}_at_inline1")
    with pytest.raises(kiln_dynamo.Unsupported) as info:
        kiln_dynamo.compile(fn, fullgraph=True)(torch.rand(4) + 0.5)
    text = str(info.value)
    assert KINDS[kind][1] in text
    assert f"break_matrix.py:{MARKS[f'{kind}_at_inline1_inner']}" in text
    assert kiln_dynamo.counters.graph_breaks == 0


# --- both branches, continuation reuse --------------------------------------------------------


def branchy(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def test_both_branches_get_their_own_continuation() -> None:
    compiled = kiln_dynamo.compile(branchy)
    pos, neg = torch.ones(3), -torch.ones(3)
    for x in (pos, neg, pos, neg):
        torch.testing.assert_close(compiled(x), branchy(x))
    c = kiln_dynamo.counters
    assert (c.graphs, c.graph_breaks, c.recompiles) == (3, 1, 0)  # before the branch, then one per branch


def test_continuations_are_reused_across_recompiles() -> None:
    compiled = kiln_dynamo.compile(branchy)
    codes = []
    for n in (3, 5):
        x = torch.ones(n)
        torch.testing.assert_close(compiled(x), branchy(x))
        codes.append(set(resume._resume_cache[branchy.__code__].values()))
    # the new shape recompiled branchy and its continuation, but made no new continuation code:
    # one per branch target, shared by both entries of branchy
    assert kiln_dynamo.counters.recompiles == 2 and kiln_dynamo.counters.graph_breaks == 2
    assert codes[0] == codes[1] and len(codes[0]) == 2
    assert sorted(c.co_name for c in codes[0])[0].startswith("resume_in_branchy_at_")


# --- side effects across a break ------------------------------------------------------------

COUNTER = 0


class Box:
    def __init__(self) -> None:
        self.flag = 0
        self.saved: Any = None


def mutates_then_prints(x: torch.Tensor, items: list[Any], table: dict[str, Any], box: Box) -> Any:
    global COUNTER
    y = x + 1
    items.append(y)
    table["y"] = y * 2
    box.flag = 7
    box.saved = [y, 3]  # a new list escapes through an attribute
    COUNTER = COUNTER + 1
    print("state:", len(items), sorted(table), box.flag, COUNTER)
    items.append(4)
    return {"out": y * 3, "items": items}


def test_side_effects_happen_before_the_break_in_program_order(capsys: pytest.CaptureFixture[str]) -> None:
    global COUNTER
    args = (torch.randn(3), [1], {"a": 0}, Box())
    eager_args, comp_args = copy.deepcopy(args), copy.deepcopy(args)
    compiled = kiln_dynamo.compile(mutates_then_prints)
    COUNTER = 0
    expected = [mutates_then_prints(*eager_args) for _ in range(2)]
    eager_printed = capsys.readouterr().out
    COUNTER = 0
    actual = [compiled(*comp_args) for _ in range(2)]
    assert capsys.readouterr().out == eager_printed == "state: 2 ['a', 'y'] 7 1\nstate: 4 ['a', 'y'] 7 2\n"
    for e, a in zip(expected, actual, strict=True):
        _same(e["out"], a["out"])
        assert a["items"] is comp_args[1]  # the input list itself, not a copy
    _same(eager_args[1], comp_args[1])
    _same(eager_args[2]["y"], comp_args[2]["y"])
    assert comp_args[3].flag == 7 and type(comp_args[3].saved) is list
    _same(eager_args[3].saved, comp_args[3].saved)
    # the second call recompiles (COUNTER and the list's length are guarded), splitting again
    assert kiln_dynamo.counters.fallbacks == []
    assert {r.reason for r in kiln_dynamo.counters.break_reasons} == {
        "print() is a side effect that kiln runs as plain Python"
    }


def make_counter() -> Any:
    calls = 0

    def step(x: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        y = x * 2
        calls += 1  # a closure cell: written by CPython at the split, in order
        print("calls", calls)
        return y + calls

    return step, lambda: calls


def test_closure_cell_written_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    step, read = make_counter()
    compiled = kiln_dynamo.compile(step)
    outs = [compiled(torch.ones(2)) for _ in range(3)]
    assert capsys.readouterr().out == "calls 1\ncalls 2\ncalls 3\n"
    assert read() == 3
    for i, out in enumerate(outs, start=1):
        torch.testing.assert_close(out, torch.full((2,), 2.0 + i))


def opaque_append(lst: list[Any]) -> None:
    lst.append("seen")


def aliasing(x: torch.Tensor) -> Any:
    acc = [x + 1]
    same = acc
    os.getpid()  # break: acc crosses the split once, as one list
    opaque_append(same)
    return acc, same is acc


def test_one_object_stays_one_object_across_a_break() -> None:
    (acc, same), expected = kiln_dynamo.compile(aliasing)(torch.ones(2)), aliasing(torch.ones(2))
    assert same is True and acc[1] == "seen" and len(acc) == len(expected[0]) == 2


# --- grad mode and exceptions across a split ---------------------------------------------------


def raises_inside_no_grad(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        y = x + 1
        os.getpid()
        raise ValueError(f"boom {y.shape[0]}")


def test_exception_in_a_split_no_grad_block_restores_grad_mode() -> None:
    compiled = kiln_dynamo.compile(raises_inside_no_grad)
    for _ in range(2):
        with pytest.raises(ValueError, match="boom 3"):
            compiled(torch.ones(3, requires_grad=True))
        assert torch.is_grad_enabled()


def raises_after_a_split_no_grad_block(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        y = x * 2
        os.getpid()  # the continuation begins inside the block and leaves it
    return y.index_select(0, i).sum() + x  # raises after the block: grad mode is back on in eager


def _restoring_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A backend that puts back the grad mode it was called in when its graph raises, as kiln's
    does (Note [Grad mode after an exception] in kiln's backends.py)."""

    def run(*args: Any) -> Any:
        grad = torch.is_grad_enabled()
        try:
            return gm(*args)
        except BaseException:
            torch._C._set_grad_enabled(grad)
            raise

    return run


def test_an_exception_after_a_split_no_grad_block_leaves_grad_mode_on() -> None:
    # Note [Grad mode when a graph raises] (codegen.py): the continuation's graph raised after
    # leaving the block, and grad mode stayed the one it was entered in (off) for good
    compiled = kiln_dynamo.compile(raises_after_a_split_no_grad_block, _restoring_backend)
    x = torch.ones(3, requires_grad=True)
    assert compiled(x, torch.tensor([0, 2])).requires_grad
    for _ in range(2):
        with pytest.raises(IndexError):
            compiled(x, torch.tensor([0, 5]))
        assert torch.is_grad_enabled()


def grad_modes(x: torch.Tensor) -> Any:
    with torch.enable_grad():
        a = x * 2
    with torch.no_grad():
        b = x * 3
        print("inside")
        c = x * 4
    with torch.set_grad_enabled(False):
        d = x * 5
    return a, b, c, d, x * 6


def test_grad_mode_blocks_around_and_across_a_split(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.ones(2, requires_grad=True)
    for _ in range(2):
        _same(grad_modes(x), kiln_dynamo.compile(grad_modes)(x))
    assert [str(r.reason) for r in kiln_dynamo.counters.break_reasons] == [
        "print() is a side effect that kiln runs as plain Python"
    ]


# --- explain and logging -------------------------------------------------------------------------


def test_graph_breaks_log_once_per_site(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kiln.dynamo.graph_breaks"):
        compiled = kiln_dynamo.compile(MATRIX.print_at_inline1)
        for n in (2, 3, 4):  # three shapes: three captures of the same break site
            compiled(torch.rand(n))
    records = [r for r in caplog.records if r.name == "kiln.dynamo.graph_breaks"]
    sites = [r.getMessage() for r in records]
    # one site: the print in the callee splits both frames at once (Note [Resuming a chain of frames])
    assert len(sites) == 1, sites
    assert any(f"break_matrix.py:{MARKS['print_at_inline1_inner']}" in s for s in sites)


def explained(x: torch.Tensor, n: int) -> torch.Tensor:
    y = x.relu() + n
    z = MATRIX.print_at_inline1(y)  # the print two calls down splits all three frames at once
    if z.sum() > 0:
        z = z * 2
    return z.cos()


def test_explain_reports_graphs_breaks_ops_and_guards(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.rand(4) + 0.5
    report = kiln_dynamo.explain(explained)(x, 3)
    _same(report.result, explained(x, 3))
    # one graph up to the print (all three frames); explained's continuation, which calls those
    # of print_at_inline1 and print_at_inline1_inner, splits again at its branch: before and after
    assert report.graph_count == 3 and len(report.graphs) == 3
    assert report.graph_break_count == 2
    assert [r.reason for r in report.break_reasons].count("data-dependent branch on a tensor value") == 1
    calls = ("call_function", "call_method", "call_module")
    assert report.op_count == [len([n for n in g.graph.nodes if n.op in calls]) for g in report.graphs]
    assert all(n > 0 for n in report.op_count)
    assert any("L['n'] == 3" in g for g in report.guards)
    text = str(report)
    assert "3 graph(s), 2 graph break(s)" in text
    assert f"test_graph_breaks.py:{explained.__code__.co_firstlineno + 3}" in text  # the branch's line
    assert "if z.sum() > 0:" in text and "guards of explained" in text


# --- autocast as graph state ---------------------------------------------------------------------

WA = torch.randn(8, 8)


def autocast_block(x: torch.Tensor) -> Any:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ WA
        z = torch.relu(y)
    return z.float() + 1, y.dtype, z.dtype


def autocast_outside(x: torch.Tensor) -> Any:
    y = x @ WA
    return y, y.dtype


def test_autocast_block_is_captured_as_graph_state() -> None:
    x = torch.randn(4, 8)
    compiled = kiln_dynamo.compile(autocast_block, backend=(backend := _Recorder()))
    for _ in range(2):
        _same(compiled(x), autocast_block(x))
        assert not torch.is_autocast_enabled("cpu")
    assert kiln_dynamo.counters.graphs == 1 and kiln_dynamo.counters.graph_breaks == 0
    targets = [n.target for n in backend.graphs[0].graph.nodes if n.op == "call_function"]
    assert [t.__name__ for t in targets if "autocast" in getattr(t, "__name__", "")] == [
        "_enter_autocast",
        "_exit_autocast",
    ]


def test_autocast_state_at_entry_is_guarded() -> None:
    x = torch.randn(4, 8)
    compiled = kiln_dynamo.compile(autocast_outside)
    _same(compiled(x), autocast_outside(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _same(compiled(x), autocast_outside(x))  # a new entry: bfloat16 results
    _same(compiled(x), autocast_outside(x))
    assert kiln_dynamo.counters.recompiles == 1 and kiln_dynamo.counters.graphs == 2


class _Recorder:
    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs.append(gm)
        return gm.forward


def autocast_split(x: torch.Tensor) -> Any:
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ WA
            print("inside", y.dtype)
            z = y @ WA
        w = x @ WA
    return z, w, y.dtype, z.dtype, w.dtype, (x @ WA).requires_grad


def autocast_raises(x: torch.Tensor) -> Any:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ WA
        os.getpid()
        raise ValueError(str(y.dtype))


def test_autocast_is_restored_across_a_split(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(4, 8, requires_grad=True)
    compiled = kiln_dynamo.compile(autocast_split)
    for _ in range(2):
        expected = autocast_split(x)
        _same(compiled(x), expected)
        assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()
    assert capsys.readouterr().out == "inside torch.bfloat16\n" * 4
    c = kiln_dynamo.counters
    assert (c.graphs, c.graph_breaks, c.fallbacks, c.recompiles) == (2, 1, [], 0)


def test_exception_in_a_split_autocast_block_leaves_autocast() -> None:
    compiled = kiln_dynamo.compile(autocast_raises)
    for _ in range(2):
        with pytest.raises(ValueError, match="bfloat16"):
            compiled(torch.randn(4, 8))
        assert not torch.is_autocast_enabled("cpu")
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    assert nesting == 0


def counts_up(x: torch.Tensor) -> Any:
    for i in range(2):
        yield x + i


def test_a_compiled_generator_function_runs_as_python_with_the_reason() -> None:
    x = torch.ones(2)
    out = list(kiln_dynamo.compile(counts_up)(x))
    _same(out, list(counts_up(x)))
    (reason,) = kiln_dynamo.counters.break_reasons
    assert not reason.split and "generator function" in reason.reason
    assert reason.filename == __file__ and reason.lineno == counts_up.__code__.co_firstlineno


class _Base(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _UsesSuper(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        if y.sum() > 0:
            y = super().forward(y)
        print("between")
        return super().forward(y) + 1  # zero-argument super() inside a continuation


def test_zero_argument_super_works_in_continuations(capsys: pytest.CaptureFixture[str]) -> None:
    m = _UsesSuper()
    compiled = kiln_dynamo.compile(m)
    for x in (torch.ones(3), -torch.ones(3), torch.ones(3)):
        _same(compiled(x), m(x))
    assert kiln_dynamo.counters.graph_breaks == 3 and kiln_dynamo.counters.fallbacks == []
    cont = [c for c in resume._resume_cache[_UsesSuper.forward.__code__].values()]
    assert cont and all(c.co_varnames[0] == "self" for c in cont)


def test_without_the_frame_hook_a_split_frame_runs_its_continuations_as_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kiln_dynamo import eval_frame

    monkeypatch.setattr(eval_frame, "HAVE_HOOK", False)  # Note [Dispatch without the frame hook]
    compiled = kiln_dynamo.compile(branchy)
    for x in (torch.ones(3), -torch.ones(3), torch.ones(3)):
        torch.testing.assert_close(compiled(x), branchy(x))
    c = kiln_dynamo.counters
    assert (c.graphs, c.graph_breaks, c.recompiles) == (1, 1, 0)  # only the part before the branch


# --- a sweep: every capture case split at each of its first instructions -------------------------


def _sweep_cases() -> list[tuple[str, Any, tuple[Any, ...]]]:
    import test_capture_functions

    return list(test_capture_functions.CASES)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_forced_breaks_anywhere_match_eager(k: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Split every whole-capture case at its k-th splittable instruction (translator's
    FORCED_BREAK seam): outputs must still equal eager's, on the first call and on a cached one."""
    from conftest import assert_same

    from kiln_dynamo import translator

    split = 0
    for name, fn, args in _sweep_cases():
        kiln_dynamo.reset()
        eager_args, comp_args = copy.deepcopy(args), copy.deepcopy(args)
        compiled = kiln_dynamo.compile(fn)
        for call in range(2):
            torch.manual_seed(0)
            expected = fn(*eager_args)
            translator.FORCED_BREAK.at, translator.FORCED_BREAK.seen = (k if call == 0 else None), 0
            try:
                torch.manual_seed(0)
                actual = compiled(*comp_args)
            finally:
                translator.FORCED_BREAK.at = None
            assert_same(expected, actual, f"{name} split at {k}")
            assert torch.is_grad_enabled(), f"{name} split at {k} left grad mode off"
            assert_same(eager_args, comp_args, f"{name} arguments")
        split += kiln_dynamo.counters.graph_breaks > 0
    assert split >= 25  # many cases have a k-th splittable instruction (fewer on 3.12)


def method_of_a_new_set(x: torch.Tensor) -> Any:
    s = {1, 2}
    add = s.add  # the set behind the bound method is the local `s`
    os.getpid()
    add(3)
    return x * len(s), s


def same_new_list_twice(x: torch.Tensor) -> Any:
    acc = [x + 1]
    return acc, acc  # whole capture: one list, returned twice


def test_one_new_object_is_rebuilt_once() -> None:
    x = torch.ones(2)
    out, s = kiln_dynamo.compile(method_of_a_new_set)(x)
    assert s == {1, 2, 3} and out.tolist() == [3.0, 3.0]
    a, b = kiln_dynamo.compile(same_new_list_twice)(x)
    assert a is b
