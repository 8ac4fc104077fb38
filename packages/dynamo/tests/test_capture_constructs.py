"""Constructs model code writes, captured without a break (issue 16): `os.environ` reads (guarded
on their value), pure `os.path` functions, `torch.autograd.Function.apply` (forward in the
graph, the user's backward for gradients), dicts and sets keyed by modules, and nn.Module
traversal (`parameters()`, `named_modules()`, ...), which `nn.TransformerEncoder` relies on."""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Any

import pytest
import torch
from conftest import CountingBackend, check
from torch import nn

import kiln_dynamo

ENV = "KILN_TEST_CAPTURE_CONSTRUCTS"


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 * sum(shape) + 3)
    return torch.randn(*shape, generator=g)


@pytest.fixture
def env() -> Any:
    old = os.environ.pop(ENV, None)
    yield os.environ
    os.environ.pop(ENV, None)
    if old is not None:
        os.environ[ENV] = old


def _env_get(x: torch.Tensor) -> torch.Tensor:
    if os.environ.get(ENV, "0") == "1":
        return x + 1
    return x - 1


def _env_item(x: torch.Tensor) -> torch.Tensor:
    return x * int(os.environ[ENV])


def _env_in(x: torch.Tensor) -> torch.Tensor:
    return x + 1 if ENV in os.environ else x * 2


@pytest.mark.parametrize("fn", [_env_get, _env_in], ids=["get", "in"])
def test_environ_read_is_guarded_on_its_value(env: Any, fn: Any) -> None:
    x = t(3, 4)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    torch.testing.assert_close(compiled(x), fn(x))
    env[ENV] = "1"  # the variable appears: the guard fails, the new value is seen
    torch.testing.assert_close(compiled(x), fn(x))
    env[ENV] = "0"
    torch.testing.assert_close(compiled(x), fn(x))
    del env[ENV]
    torch.testing.assert_close(compiled(x), fn(x))  # back to the first entry
    assert kiln_dynamo.counters.graph_breaks == 0
    assert backend.graphs == (3 if fn is _env_get else 2)


def test_environ_subscript(env: Any) -> None:
    env[ENV] = "3"
    check(_env_item, t(2, 2))
    compiled = kiln_dynamo.compile(_env_item)
    env[ENV] = "5"
    torch.testing.assert_close(compiled(t(2, 2)), t(2, 2) * 5)


def _paths(x: torch.Tensor) -> torch.Tensor:
    p = os.path.join("models", "layer.bin")
    stem, ext = os.path.splitext(os.path.basename(p))
    return x * len(stem) + len(ext) + len(os.path.dirname(p)) + os.path.isabs(p)


def test_os_path_pure_functions_fold() -> None:
    check(_paths, t(2, 3))
    assert kiln_dynamo.counters.graph_breaks == 0


class ScaledGrad(torch.autograd.Function):
    """A forward whose backward is deliberately not its derivative (straight-through style)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return g * ctx.scale * torch.cos(x), None


def _apply(x: torch.Tensor) -> torch.Tensor:
    return ScaledGrad.apply(torch.tanh(x), 3.0).sum() * 2


def test_autograd_function_apply_is_one_node_with_its_backward() -> None:
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_apply, backend=backend)
    x = t(4, 5).requires_grad_()
    ref = _apply(x)
    (gref,) = torch.autograd.grad(ref, x)
    out = compiled(x)
    (got,) = torch.autograd.grad(out, x)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(got, gref)  # the user's backward, not autograd of the forward
    assert (backend.graphs, kiln_dynamo.counters.graph_breaks) == (1, 0)
    targets = [n.target.__name__ for n in backend.gms[0].graph.nodes if n.op == "call_function"]
    assert "ScaledGrad_apply" in targets
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), _apply(x))


_SEEN: list[Any] = []


class Leaky(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        _SEEN.append(x.shape)  # an effect outside forward: not run on fake tensors
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


def test_autograd_function_with_effects_is_one_clean_break() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return Leaky.apply(x + 1) - 1

    _SEEN.clear()
    x = t(3)
    report = kiln_dynamo.explain(f)(x)
    torch.testing.assert_close(report.result, f(x))
    assert report.graph_break_count == 1
    assert "Leaky" in str(report.break_reasons[0])
    assert [torch.Size([3])] * 2 == _SEEN  # once compiled (run for real), once eager


def test_dicts_and_sets_keyed_by_modules() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def f(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        scale = {model[0]: 2.0, model[2]: 0.5}
        seen = set()
        for m in model:
            if m in scale:
                x = m(x) * scale[m]
                seen.add(m)
            else:
                x = m(x)
        return x, len(seen | {model[0]})

    check(f, t(2, 4))


class Tree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
        self.shared = self.a  # the same module twice: traversals yield it once
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x: torch.Tensor) -> Any:
        names = [n for n, _ in self.named_parameters()]
        total = sum(p.sum() for p in self.parameters())
        kinds = [type(m).__name__ for m in self.modules()]
        kids = [n for n, _ in self.named_children()]
        bufs = [b for _, b in self.named_buffers()]
        first = next(self.parameters())
        return x * total + bufs[0] + first.sum(), names, kinds, kids, list(dict(self.named_modules()))


def test_module_traversal() -> None:
    check(Tree(), t(2, 3))


def test_module_traversal_guards_the_tree() -> None:
    model = Tree()

    def f(x: torch.Tensor) -> torch.Tensor:
        return sum((p.sum() for p in model.parameters()), x)

    compiled = kiln_dynamo.compile(f)
    x = t(3)
    torch.testing.assert_close(compiled(x), f(x))
    model.c = nn.Linear(3, 3)  # a new submodule: its parameters count too
    torch.testing.assert_close(compiled(x), f(x))
    assert kiln_dynamo.counters.recompiles == 1


def test_transformer_encoder_is_one_graph() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        check(enc, t(2, 5, 16))


_FUSED_OPS = ("_transformer_encoder_layer_fwd", "_native_multi_head_attention")


def _graph_targets(backend: CountingBackend) -> set[str]:
    return {getattr(n.target, "__name__", str(n.target)) for gm in backend.gms for n in gm.graph.nodes}


def _fast_path_cases() -> list[tuple[str, nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = mha

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mha(x, x, x, need_weights=False)[0]

    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
    return [
        ("layer", layer.eval(), t(2, 5, 16)),
        ("mha", SelfAttention().eval(), t(2, 5, 16)),
        ("encoder", encoder.eval(), t(2, 5, 16)),
    ]


@pytest.mark.parametrize("case", [c[0] for c in _fast_path_cases()])
def test_fused_inference_fast_paths_are_traced_decomposed(case: str) -> None:
    """Eval without grad: torch would run its fused kernels (no meta kernel for the encoder layer's
    before torch 2.13); kiln traces the decomposable path instead (Note [Fused inference fast
    paths]), so the graph holds ordinary ops and nothing falls back."""
    model, x = next((m, x) for name, m, x in _fast_path_cases() if name == case)
    with torch.no_grad():
        backend = check(model, x)
    targets = _graph_targets(backend)
    assert not targets & set(_FUSED_OPS), targets
    assert "layer_norm" in targets or "multi_head_attention_forward" in targets, targets
    assert kiln_dynamo.counters.fallbacks == []


def test_fused_fast_paths_kept_on_request() -> None:
    _, model, x = _fast_path_cases()[1]
    kiln_dynamo.set_torch_fast_paths(True)
    try:
        with torch.no_grad():
            backend = check(model, x)
    finally:
        kiln_dynamo.set_torch_fast_paths(False)
    assert "_native_multi_head_attention" in _graph_targets(backend)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + x


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.layers = nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x) * 2
        for i, layer in enumerate(self.layers):
            x = layer(x)
            _LOG.append(i)  # a break inside the loop (an effect kiln leaves to Python)
            print(end="")
        return x.sum(-1)


_LOG: list[int] = []


def test_break_inside_a_loop_keeps_the_prefix_and_the_layers_compiled() -> None:
    """A break inside a loop over layers: the frame splits before the loop (the iterator of
    `enumerate(self.layers)` crosses the split), the loop runs as plain Python, and each layer's
    own frame is captured (one graph, reused by the three layers); the loop's exit continues in a
    continuation that is captured too (Note [Compiling what follows a loop]). With loop body
    pieces on (Note [Loop body pieces]) the body `layer(x); _LOG.append(i)` is a piece: one graph
    per value of `i` it appends (the counting backend takes no symbolic sizes)."""
    torch.manual_seed(0)
    model = _Stack().eval()
    x = t(2, 8)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(model, backend=backend)
    _LOG.clear()
    with torch.no_grad():
        ref = model(x)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), ref)
    assert _LOG == [0, 1, 2] * 3
    # the part before the loop; the piece (_Block.forward inlined) for i = 0, 1, 2; `x.sum(-1)`
    assert backend.graphs == 5 and kiln_dynamo.counters.loop_pieces == 1
    assert kiln_dynamo.counters.graph_breaks == 4  # before the loop; the piece at print(), per i
    (plain,) = kiln_dynamo.counters.fallbacks  # only the continuation that holds the loop
    assert plain[0].startswith("resume_in_forward_at_")


def test_break_inside_a_loop_without_pieces() -> None:
    """The same, loop body pieces off: the loop body runs as Python, _Block.forward is one graph."""
    from kiln_dynamo import convert_frame

    model = _Stack().eval()
    x = t(2, 8)
    backend = CountingBackend()
    previous = convert_frame.set_loop_pieces(False)
    try:
        compiled = kiln_dynamo.compile(model, backend=backend)
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(compiled(x), model(x))
    finally:
        convert_frame.set_loop_pieces(previous)
    assert backend.graphs == 3  # the part before the loop; _Block.forward; `x.sum(-1)` after it
    assert kiln_dynamo.counters.graph_breaks == 1


def test_forward_hooks_and_pre_hooks_are_traced() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    model[0].register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    model[0].register_forward_hook(lambda mod, args, out: out + args[0].sum())
    model[2].register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] - 1,), kwargs), with_kwargs=True)
    model[2].register_forward_hook(lambda mod, args, kwargs, out: None, with_kwargs=True)  # keeps out
    check(model, t(3, 4))
    assert kiln_dynamo.counters.graph_breaks == 0


def test_forward_hook_added_or_removed_later_recompiles() -> None:
    model = nn.Linear(4, 4)
    compiled = kiln_dynamo.compile(lambda x: model(x) + 1)  # the call, hooks included, is traced
    x = t(2, 4)
    torch.testing.assert_close(compiled(x), model(x) + 1)
    handle = model.register_forward_hook(lambda mod, args, out: out * 3)
    torch.testing.assert_close(compiled(x), model(x) + 1)
    handle.remove()
    torch.testing.assert_close(compiled(x), model(x) + 1)
    assert kiln_dynamo.counters.recompiles == 1 and kiln_dynamo.counters.graph_breaks == 0


def test_forward_hook_that_mutates_state() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    seen: list[Any] = []

    def record(mod: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        seen.append(type(mod).__name__)  # a mutation the runner replays after the graph
        return out * 2

    model[0].register_forward_hook(record)
    compiled = kiln_dynamo.compile(model)
    x = t(2, 4)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), model(x))
    assert seen == ["Linear"] * 4
    assert kiln_dynamo.counters.graph_breaks == 0  # (the list's length is guarded: it recompiles)


def test_relative_import_of_a_loaded_module() -> None:
    from torch.nn.modules import activation

    src = "def f(x):\n    from .linear import Identity\n    return Identity()(x) * 2\n"
    scope: dict[str, Any] = {"__name__": activation.__name__, "__package__": "torch.nn.modules"}
    exec(compile(src, "<relative import>", "exec"), scope)
    check(scope["f"], t(3))


class _Scale:
    """A user context manager (Note [User context managers])."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __enter__(self) -> float:
        self.log.append("enter")
        return 3.0

    def __exit__(self, *exc: Any) -> bool:
        self.log.append("exit")
        return False


def test_user_and_stdlib_context_managers_are_inlined() -> None:
    import contextlib

    def f(x: torch.Tensor, log: list[str]) -> torch.Tensor:
        with contextlib.nullcontext(x * 2) as y, _Scale(log) as k:
            return y * k

    check(f, t(3), [], state=lambda x, log: log, calls=1)  # (the list grows: its length is guarded)
    assert kiln_dynamo.counters.graph_breaks == 0


def test_functools_reduce_and_parameter_dict() -> None:
    import functools
    import operator

    params = nn.ParameterDict({"a": nn.Parameter(t(3)), "b": nn.Parameter(t(3) + 1)})

    def f(x: torch.Tensor) -> torch.Tensor:
        total = functools.reduce(operator.add, [params["a"], params["b"], x])
        return functools.reduce(lambda u, v: u * v, [total, x], 2.0)

    check(f, t(3))


def test_defaultdict_built_in_the_frame_and_passed_in() -> None:
    import collections

    def f(x: torch.Tensor, counts: Any) -> Any:
        groups = collections.defaultdict(list)
        for i, row in enumerate(x):
            groups[i % 2].append(row * 2)
        counts["rows"] += len(x)
        return torch.stack(groups[0]) + torch.stack(groups[1]), groups, counts

    check(f, t(4, 3), collections.defaultdict(int), state=lambda x, c: dict(c), calls=1)


def test_numpy_on_constants_folds() -> None:
    np = pytest.importorskip("numpy")
    dim = 16

    def f(x: torch.Tensor) -> torch.Tensor:
        return x / float(np.sqrt(dim)) + np.pi + np.log(2.0)

    check(f, t(2, 3))
    assert kiln_dynamo.counters.graph_breaks == 0


class _Pieces(torch.autograd.Function):
    """A forward with a comprehension over a local (a nested code object on 3.11)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        k = 2.0
        parts = [x * k * i for i in range(3)]
        ctx.n = len(parts)
        return sum(parts)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * ctx.n


def test_autograd_function_whose_forward_has_a_comprehension() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return _Pieces.apply(x).sum()

    x = t(3).requires_grad_()
    report = kiln_dynamo.explain(f)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    (got,) = torch.autograd.grad(report.result, x)
    torch.testing.assert_close(got, torch.full((3,), 3.0))


_APPENDED: list[Any] = []


def _appends(x: torch.Tensor) -> torch.Tensor:
    _APPENDED.append(x * 2)
    _APPENDED.extend([1, x])
    return x + 1


def _appends_then_reads(x: torch.Tensor) -> torch.Tensor:
    _APPENDED.append(x)
    return x * len(_APPENDED)


def test_appending_to_an_outside_list_does_not_recompile() -> None:
    """Note [Lists read only when needed]: a list the frame only appends to is guarded on its
    type, not on its length, so the log growing each call does not fail the guard."""
    x = t(3)
    _APPENDED.clear()
    expected = [_appends(x) for _ in range(4)]
    eager_log = list(_APPENDED)
    _APPENDED.clear()
    compiled = kiln_dynamo.compile(_appends, backend=CountingBackend())
    for e in expected:
        torch.testing.assert_close(compiled(x), e)
    assert kiln_dynamo.counters.recompiles == 0
    assert len(_APPENDED) == len(eager_log) == 12
    for a, b in zip(_APPENDED, eager_log, strict=True):
        assert type(a) is type(b)
        torch.testing.assert_close(a, b)


def test_an_outside_list_read_after_appending_is_still_guarded_on_its_length() -> None:
    x = t(3)
    _APPENDED.clear()
    compiled = kiln_dynamo.compile(_appends_then_reads, backend=CountingBackend())
    for n in range(1, 4):
        torch.testing.assert_close(compiled(x), x * n)  # a stale length would give x * 1
    assert len(_APPENDED) == 3 and kiln_dynamo.counters.recompiles == 2


class _MyError(Exception):
    pass


class _SubError(_MyError):
    pass


def _raises(x: torch.Tensor, flag: bool) -> torch.Tensor:
    if flag:
        raise _SubError("deep", 3)
    return x


def _catches_a_user_exception(x: torch.Tensor) -> torch.Tensor:
    try:
        y = _raises(x, True)  # raised in an inlined call, caught by its caller
    except _MyError as e:
        y = x * e.args[1]
    else:
        y = y - 1
    finally:
        y = y + 0.5
    return y


def _catches_stop_iteration(x: torch.Tensor) -> torch.Tensor:
    it = iter([1, 2])
    while True:
        try:
            x = x + next(it)
        except StopIteration:
            break
    return x


def _reraises_another(x: torch.Tensor) -> torch.Tensor:
    try:
        try:
            {}["k"]
        except KeyError:
            raise _MyError("wrapped") from None
    except _MyError as e:
        return x + len(str(e))


@pytest.mark.parametrize("fn", [_catches_a_user_exception, _catches_stop_iteration, _reraises_another])
def test_exceptions_raised_and_caught_in_the_frame_are_traced(fn: Any) -> None:
    """Note [Exceptions the frame raises and catches]: the handler CPython would run is traced."""
    check(fn, t(3))
    assert kiln_dynamo.counters.graph_breaks == 0


def _raises_uncaught(x: torch.Tensor) -> torch.Tensor:
    y = x + 1
    try:
        raise ValueError("not a KeyError", y.shape[0])
    except KeyError:
        return y


def test_an_exception_no_handler_takes_is_raised_as_in_eager() -> None:
    compiled = kiln_dynamo.compile(_raises_uncaught)
    with pytest.raises(ValueError, match="not a KeyError"):
        compiled(t(3))


_EFFECTS: list[Any] = []


def _gen(x: torch.Tensor) -> Any:
    for i in range(3):
        _EFFECTS.append(("gen", i))
        yield x * i
    return "done"


def _consumes(x: torch.Tensor) -> torch.Tensor:
    out = x
    for v in _gen(x):
        _EFFECTS.append("use")  # interleaves with the generator's appends, as in eager
        out = out + v
    return out


def _delegates(x: torch.Tensor) -> Any:
    result = yield from _gen(x)
    _EFFECTS.append(result)
    yield x + 1


def _consumes_yield_from(x: torch.Tensor) -> torch.Tensor:
    return torch.stack(list(_delegates(x))).sum(0)


def _steps(x: torch.Tensor) -> torch.Tensor:
    g = _gen(x)
    return next(g) + next(g) * 2


@contextlib.contextmanager
def _scaled(k: int) -> Any:
    _EFFECTS.append("enter")
    try:
        yield k * 2
    finally:
        _EFFECTS.append("exit")


def _uses_a_context_manager(x: torch.Tensor) -> torch.Tensor:
    with _scaled(3) as s:
        y = x * s
    return y + 1


@pytest.mark.parametrize("fn", [_consumes, _consumes_yield_from, _steps, _uses_a_context_manager])
def test_generators_and_contextmanagers_are_traced_in_program_order(fn: Any) -> None:
    """Note [Generators traced step by step]: the generator's effects interleave with its
    consumer's exactly as in eager, with no break; `contextlib.contextmanager` is the same
    generator, stepped by the manager's `__enter__` and `__exit__`."""
    x = t(3)
    _EFFECTS.clear()
    expected = fn(x)
    eager_effects = list(_EFFECTS)
    _EFFECTS.clear()
    compiled = kiln_dynamo.compile(fn, backend=CountingBackend())
    torch.testing.assert_close(compiled(x), expected)
    assert eager_effects == _EFFECTS
    assert kiln_dynamo.counters.graph_breaks == 0 and kiln_dynamo.counters.graphs == 1


def _cleans_up(x: torch.Tensor) -> Any:
    try:
        yield x + 1
        yield x + 2
    finally:
        _EFFECTS.append("closed")


def _leaves_suspended(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + next(_cleans_up(x))


def _noisy_gen(x: torch.Tensor) -> Any:
    yield x + 1
    print(end="")  # a break inside the generator's body
    yield x + 2


def _consumes_noisy(x: torch.Tensor) -> torch.Tensor:
    return sum(_noisy_gen(x * 2))


@pytest.mark.parametrize("fn", [_leaves_suspended, _consumes_noisy])
def test_a_generator_kiln_cannot_finish_runs_as_python_from_its_creation(fn: Any) -> None:
    """A generator left suspended in a try block (CPython runs its `finally` when it is freed)
    or with a break in its body: the frame splits at the call that made it."""
    x = t(3)
    _EFFECTS.clear()
    expected = fn(x)
    gc.collect()  # a suspended generator in a reference cycle is closed when the collector runs
    eager_effects = list(_EFFECTS)
    _EFFECTS.clear()
    torch.testing.assert_close(kiln_dynamo.compile(fn)(x), expected)
    gc.collect()  # ... so both sides are compared after it has (its timing is not the frame's)
    assert eager_effects == _EFFECTS
    first = kiln_dynamo.counters.break_reasons[0]
    assert first.split and first.note is not None and "split at the call that made" in first.note


def _defines_a_function_class(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    def helper(v: torch.Tensor) -> torch.Tensor:
        return v if mask is None else torch.where(mask, v, 0.0)

    class Combine(torch.autograd.Function):  # torch.masked's pattern: defined on every call
        @staticmethod
        def forward(ctx: Any, v: torch.Tensor) -> torch.Tensor:
            return helper(v)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g

    return helper(x).sum(0) if not isinstance(x, Combine) else x


def _defines_and_uses_a_class(x: torch.Tensor) -> torch.Tensor:
    scale = 3

    class Scaler:
        k = 2

        def __init__(self, by: int) -> None:
            self.by = by

        def apply(self, v: torch.Tensor) -> torch.Tensor:
            return v * self.by * self.k + scale  # reads the frame's cell

    return Scaler(4).apply(x)


@pytest.mark.parametrize(
    ("fn", "args"),
    [(_defines_a_function_class, (t(3, 4), t(3, 4) > 0)), (_defines_and_uses_a_class, (t(3),))],
    ids=["autograd_function", "used"],
)
def test_a_class_defined_in_the_frame_is_traced(fn: Any, args: tuple[Any, ...]) -> None:
    """Note [Class definitions in the frame]: a class body that only binds names is built for
    real while tracing; its methods read the frame's own cells."""
    check(fn, *args)
    assert kiln_dynamo.counters.graph_breaks == 0


def _returns_its_class(x: torch.Tensor) -> Any:
    class Local:
        pass

    return x + 1, Local


def _body_with_effects(x: torch.Tensor) -> torch.Tensor:
    class Noisy:
        print(end="")  # the body calls something: not run at trace time

    return x + 1


@pytest.mark.parametrize("fn", [_returns_its_class, _body_with_effects])
def test_a_class_that_leaves_the_frame_or_acts_in_its_body_breaks(fn: Any) -> None:
    x = t(3)
    out = kiln_dynamo.compile(fn)(x)
    expected = fn(x)
    if isinstance(out, tuple):
        torch.testing.assert_close(out[0], expected[0])
        assert out[1] is not expected[1] and out[1].__qualname__ == expected[1].__qualname__
    else:
        torch.testing.assert_close(out, expected)
    assert kiln_dynamo.counters.graph_breaks + len(kiln_dynamo.counters.fallbacks) >= 1


def _new_leaf(x: torch.Tensor) -> torch.Tensor:
    w = torch.ones(3, requires_grad=True)
    return (x * w).sum()


def test_a_new_leaf_that_requires_grad_is_made_in_python() -> None:
    """A factory with requires_grad=True makes a leaf no graph can hold (the backend's autograd
    differentiates only with respect to graph inputs): one break, and the leaf enters the rest
    of the frame as an input that requires grad."""
    inputs: list[list[Any]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        inputs.append(example_inputs)
        return gm.forward

    x = t(3)
    out = kiln_dynamo.compile(_new_leaf, backend=backend)(x)
    expected = _new_leaf(x)
    torch.testing.assert_close(out, expected)
    assert out.requires_grad and out.grad_fn is not None
    (reason,) = kiln_dynamo.counters.break_reasons
    assert "requires_grad=True" in reason.reason and reason.split
    assert any(isinstance(a, torch.Tensor) and a.requires_grad for a in inputs[-1])


def _branches_on_inference_mode(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if torch.is_inference_mode_enabled() else x - 1


def test_reading_inference_mode_is_guarded() -> None:
    x = t(3)
    compiled = kiln_dynamo.compile(_branches_on_inference_mode, backend=CountingBackend())
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), x - 1)
    with torch.inference_mode():  # grad is off in both: only the inference-mode guard sees it
        torch.testing.assert_close(compiled(x), x * 2)
    assert kiln_dynamo.counters.recompiles == 1


def _inference_block(x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        y = x * 2
    return y + 1


def test_inference_mode_untraced_is_a_break_with_its_reason() -> None:
    """KILN_TRACE_INFERENCE_MODE=0 (traced blocks: tests/test_inference_mode.py)."""
    x = t(3)
    prev = kiln_dynamo.set_trace_inference_mode(False)
    try:
        out = kiln_dynamo.compile(_inference_block)(x)
    finally:
        kiln_dynamo.set_trace_inference_mode(prev)
    expected = _inference_block(x)
    torch.testing.assert_close(out, expected)
    assert out.is_inference() == expected.is_inference()
    first = kiln_dynamo.counters.break_reasons[0]
    assert "torch.inference_mode inside a compiled frame" in first.reason and first.advice


class _Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import functools

        from torch.utils import checkpoint

        run = functools.partial(checkpoint.checkpoint, use_reentrant=False)  # transformers' spelling
        return run(self.inner, x).sum()


def test_activation_checkpointing_is_traced_as_the_call() -> None:
    """Note [Activation checkpointing]: the values and gradients of `fn(*args)`, in one graph."""
    torch.manual_seed(0)
    model = _Checkpointed().train()
    x = t(2, 4).requires_grad_()
    model(x).backward()
    expected = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    backend = CountingBackend()
    kiln_dynamo.compile(model, backend=backend)(x).backward()
    for e, p in zip(expected, [*model.parameters(), x], strict=True):
        torch.testing.assert_close(p.grad, e)
    assert backend.graphs == 1 and kiln_dynamo.counters.graph_breaks == 0


def _reentrant(x: torch.Tensor) -> torch.Tensor:
    from torch.utils import checkpoint

    return checkpoint.checkpoint(torch.sin, x * 2, use_reentrant=True)


def test_reentrant_checkpointing_is_one_break_with_advice() -> None:
    x = t(3).requires_grad_()
    torch.testing.assert_close(kiln_dynamo.compile(_reentrant)(x), _reentrant(x))
    first = kiln_dynamo.counters.break_reasons[0]
    assert "use_reentrant=True" in first.reason and first.advice is not None


def _branches_on_a_constant_mask(x: torch.Tensor) -> torch.Tensor:
    n = x.size(0)  # a constant under static shapes (guarded)
    mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
    causal = nn.Transformer.generate_square_subsequent_mask(n)
    if bool((mask == causal).all()):  # nn.Transformer's _detect_is_causal_mask
        return x + mask.sum(0).clamp(min=-1)
    return x - 1


def _branches_on_random(x: torch.Tensor) -> torch.Tensor:
    return x + 1 if torch.rand(()) > 2 else x - 1


def _branches_after_a_mutation(x: torch.Tensor) -> torch.Tensor:
    m = torch.zeros(3)
    m.add_(1)
    return x + 1 if bool(m.sum() > 2) else x - 1


def test_a_branch_on_a_tensor_made_of_constants_is_decided_while_tracing() -> None:
    """Note [Tensors computed from constants]: nothing depends on the inputs' data, so kiln
    computes the condition once while tracing; a new size recompiles (the size is guarded)."""
    compiled = kiln_dynamo.compile(_branches_on_a_constant_mask, backend=CountingBackend())
    for n in (4, 4, 5):
        x = t(n, n)
        torch.testing.assert_close(compiled(x), _branches_on_a_constant_mask(x))
    assert kiln_dynamo.counters.graph_breaks == 0 and kiln_dynamo.counters.recompiles == 1


@pytest.mark.parametrize("fn", [_branches_on_random, _branches_after_a_mutation])
def test_a_branch_on_random_or_mutated_tensors_still_breaks(fn: Any) -> None:
    x = t(3)
    torch.testing.assert_close(kiln_dynamo.compile(fn)(x), fn(x))
    assert "data-dependent branch" in kiln_dynamo.counters.break_reasons[0].reason


def _reads_the_fast_path_flag(x: torch.Tensor) -> Any:
    return x + 1, torch.backends.mha.get_fastpath_enabled()


def test_the_users_own_read_of_the_fast_path_flag_sees_its_value() -> None:
    """Only torch.nn's fast-path checks get the False answer (Note [Fused inference fast paths])."""
    x = t(3)
    check(_reads_the_fast_path_flag, x)


def test_heapq_and_bisect_on_lists_of_constants() -> None:
    # Note [Heaps of constants]: run on the constant items; an outside list is rewritten after the graph
    import bisect
    import heapq

    milestones = [30, 10, 20]

    def f(x: torch.Tensor) -> torch.Tensor:
        heapq.heapify(milestones)
        beam: list[tuple[float, int]] = []
        for i, s in enumerate((0.5, 0.1, 0.9)):
            heapq.heappush(beam, (s, i))
        best = heapq.heappop(beam)
        bisect.insort(milestones, 25)
        return x * best[1] + bisect.bisect_right([1, 3, 5], 4) + heapq.nsmallest(1, milestones)[0]

    x = torch.ones(2)
    kept = list(milestones)
    expected = f(x)
    eager_state = list(milestones)
    milestones[:] = kept
    backend = CountingBackend()
    torch.testing.assert_close(kiln_dynamo.compile(f, backend=backend)(x), expected)
    assert milestones == eager_state  # heapified, then 25 inserted, as eager left it
    assert backend.graphs == 1 and kiln_dynamo.counters.break_reasons == []


# --- torch.no_grad() / enable_grad() applied as decorators inside the frame -----------------------


def _decorated_in_frame(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    @torch.no_grad()
    def frozen(y: torch.Tensor) -> torch.Tensor:
        return y * 2

    @torch.enable_grad()
    def tracked(y: torch.Tensor) -> torch.Tensor:
        return y + 1

    a = frozen(x)
    b = tracked(x)
    return a, b, torch.is_grad_enabled()


def test_grad_mode_decorators_in_the_frame_are_one_graph() -> None:
    x = torch.randn(3, requires_grad=True)
    check(_decorated_in_frame, x)
    with torch.no_grad():  # enable_grad() inside a no_grad caller
        expected = _decorated_in_frame(x)
        got = kiln_dynamo.compile(_decorated_in_frame)(x)
    for e, g in zip(expected[:2], got[:2], strict=True):
        assert e.requires_grad == g.requires_grad
        torch.testing.assert_close(e, g)
    assert expected[2] == got[2] is False


def _decorated_raises(x: torch.Tensor) -> torch.Tensor:
    @torch.no_grad()
    def failing(y: torch.Tensor) -> torch.Tensor:
        raise KeyError("inside")

    try:
        return failing(x)
    except KeyError:
        return x * torch.is_grad_enabled()  # the decorator restored grad mode before the handler


def test_grad_mode_decorator_restores_the_mode_when_the_function_raises() -> None:
    x = torch.randn(3, requires_grad=True)
    expected = _decorated_raises(x)
    got = kiln_dynamo.compile(_decorated_raises)(x)
    torch.testing.assert_close(expected, got)
    assert expected.requires_grad == got.requires_grad and torch.is_grad_enabled()


def _returns_decorated(x: torch.Tensor) -> Any:
    @torch.no_grad()
    def frozen(y: torch.Tensor) -> torch.Tensor:
        return y * 3

    return frozen(x), frozen


def test_a_decorated_function_leaving_the_frame_behaves_as_eager() -> None:
    x = torch.randn(2, requires_grad=True)
    expected = _returns_decorated(x)
    got = kiln_dynamo.compile(_returns_decorated)(x)
    torch.testing.assert_close(expected[0], got[0])
    assert callable(got[1]) and type(got[1]) is type(expected[1])
    out = got[1](x)
    torch.testing.assert_close(out, expected[1](x))
    assert not out.requires_grad and torch.is_grad_enabled()


# --- id() and class attributes set in the frame (Note [id() in the frame], Note [Setting a class
# attribute]) --------------------------------------------------------------------------------------


class _Tagged:
    pass


_TAG = _Tagged()
_LIN = nn.Linear(3, 3)


def _ids(x: torch.Tensor, m: nn.Module, tag: object) -> tuple[torch.Tensor, bool, bool, int]:
    same = id(m) == id(_LIN)  # a module from outside: a constant, guarded on the object
    return m(x) * 2, same, id(tag) == id(_TAG), id(len)


def test_id_of_objects_from_outside_is_a_guarded_constant() -> None:
    x = t(2, 3)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_ids, backend=backend)
    other = nn.Linear(3, 3)
    for m, tag in ((_LIN, _TAG), (other, _TAG), (_LIN, _Tagged()), (_LIN, _TAG)):
        got, expected = compiled(x, m, tag), _ids(x, m, tag)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:]  # a new object fails the identity guard: recompiled
    assert backend.graphs == 3


def _tensor_ids(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, bool]:
    return x * 2 + y, id(x) == id(y)


def _id_of_computed_tensor(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    y = x + 1
    return y, id(y) > 0


def test_id_of_a_tensor_input_is_guarded_and_of_a_computed_one_a_break() -> None:
    x, y = t(3), t(4)[:3].clone()
    compiled = kiln_dynamo.compile(_tensor_ids)
    for a, b in ((x, x), (x, y), (y, y), (x, x)):
        got, expected = compiled(a, b), _tensor_ids(a, b)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] is expected[1]
    explanation = kiln_dynamo.explain(_id_of_computed_tensor)(x)
    assert any("id() of tensor" in str(b.reason) for b in explanation.break_reasons)


def _id_of_new_list(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    items = [1]
    return x * 2, id(items) > 0


def test_id_of_an_object_made_in_the_frame_is_a_break_with_its_reason() -> None:
    x = t(3)
    explanation = kiln_dynamo.explain(_id_of_new_list)(x)
    assert any("id() of list" in str(b.reason) for b in explanation.break_reasons)
    assert kiln_dynamo.compile(_id_of_new_list)(x)[1] is True


class _Counted:
    calls = 0
    mode = "a"


class _CountedChild(_Counted):
    pass


class _CountedObj(_CountedChild):
    def __init__(self) -> None:
        self.w = 2.0


_COUNTED = _CountedObj()


def _bump(x: torch.Tensor) -> tuple[torch.Tensor, str, int]:
    _Counted.calls += 1
    _Counted.mode = "b"
    made = _CountedObj()  # reads through new and old instances and a subclass see the store
    return x * _Counted.calls + _CountedChild.calls + _COUNTED.calls + made.calls, _COUNTED.mode, made.calls


def test_a_class_attribute_set_in_the_frame_is_seen_after_and_replayed() -> None:
    x = t(3)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_bump, backend=backend)
    results = []
    for fn in (_bump, compiled):
        _Counted.calls, _Counted.mode = 0, "a"
        results.append([fn(x) for _ in range(3)] + [(_Counted.calls, _Counted.mode)])
    eager, got = results
    assert got[-1] == eager[-1] == (3, "b")
    for e, g in zip(eager[:-1], got[:-1], strict=True):
        torch.testing.assert_close(g[0], e[0])
        assert g[1:] == e[1:]
    assert not kiln_dynamo.counters.break_reasons  # a graph per value of the counter, no break


def _set_on_module_class(x: torch.Tensor) -> torch.Tensor:
    nn.Linear.kiln_test_flag = True  # type: ignore[attr-defined]  # a module class: its lookups are kiln's own, a break
    return x + 1


def test_a_class_attribute_on_a_module_class_is_a_break() -> None:
    x = t(3)
    try:
        explanation = kiln_dynamo.explain(_set_on_module_class)(x)
        assert any("module or autograd.Function class" in str(b.reason) for b in explanation.break_reasons)
        assert getattr(nn.Linear, "kiln_test_flag", None) is True
    finally:
        if hasattr(nn.Linear, "kiln_test_flag"):
            delattr(nn.Linear, "kiln_test_flag")


def _set_on_immutable_type(x: torch.Tensor) -> torch.Tensor:
    y = x + 1
    torch.Size.kiln_x = 1  # type: ignore[attr-defined]  # an immutable type: TypeError, as in eager
    return y


def test_a_class_attribute_on_an_immutable_type_raises_as_in_eager() -> None:
    x = t(3)
    for fn in (_set_on_immutable_type, kiln_dynamo.compile(_set_on_immutable_type)):
        with pytest.raises(TypeError, match="immutable type"):
            fn(x)
    assert not hasattr(torch.Size, "kiln_x")
