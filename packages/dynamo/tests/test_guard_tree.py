"""C guard trees (issue 18): every guard kind gives the same verdict in the tree and in the Python
guard it was compiled from, on passing and on failing inputs; the hook holds trees; the option
that turns them off; KILN_LOG=guards prints the tree; recompile reasons read as before."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import CountingBackend
from torch import nn

import kiln_dynamo
import kiln_frame_hook as hook
from kiln_dynamo import guard_tree
from kiln_dynamo.backends import ACTIVE
from kiln_dynamo.guards import GuardBuilder, build_guard
from kiln_dynamo.source import AttrSource, CodeContext, LocalSource

SCALE = 3


def helper(x):
    return x + 1


class Config:
    def __init__(self) -> None:
        self.alpha = 0.5
        self.mode = "relu"
        self.rate = 0.0  # a signed zero: the same_float kind (Note [Same floats in C])

    def factor(self) -> float:
        return 2.0


def everything(x, n, flag, none, s, shape, items, table, cfg, f, same_a, same_b):
    y = x * n * SCALE + helper(x) + math.sqrt(4.0) + len(items)
    if flag:
        y = y + 1
    if none is None:
        y = y * 2
    if s == "a":
        y = y - 1
    y = y.reshape(shape)
    for v in items:
        y = y + v
    y = y + table["k"] + cfg.alpha * cfg.factor() + f + cfg.rate
    if same_a is same_b:
        y = y + same_a[0]
    with torch.no_grad():
        y = y * 1
    return y


def closure_maker():
    k = 4

    def inner(x):
        return x * k

    return inner


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.blocks = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("offset", torch.ones(4))
        self.gain = 1.5

    def scaled(self, y):
        return y * self.gain

    def forward(self, x, extra=None):
        y = self.scaled(self.blocks(self.lin(x))) + self.offset
        if self.training:
            y = y * 2
        return self.norm(y)


def entry_values(code: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, ...]:
    bound = inspect.signature(fn).bind(*args)
    bound.apply_defaults()
    values = [bound.arguments[n] for n in hook.entry_names(code)[: len(bound.arguments)]]
    for cell in getattr(fn, "__closure__", None) or ():
        values.append(cell.cell_contents)
    return tuple(values)


@contextlib.contextmanager
def running(compiled: Any) -> Iterator[None]:
    previous, ACTIVE.key = ACTIVE.key, compiled._kiln_key
    try:
        yield
    finally:
        ACTIVE.key = previous


def trees_of(code: Any) -> list[hook.GuardTree]:
    entries = hook.cache_entries(code)
    assert entries
    assert all(isinstance(e.guard, hook.GuardTree) for e in entries)
    return [e.guard for e in entries]


def verdicts(code: Any, values: tuple[Any, ...]) -> list[tuple[bool, bool]]:
    return [(bool(t(*values)), bool(t.reference.fn(*values))) for t in trees_of(code)]


def assert_agree(code: Any, values: tuple[Any, ...], expect: bool | None = None) -> None:
    for c, py in verdicts(code, values):
        assert c == py
        if expect is not None:
            assert c == expect


KINDS_SEEN: set[str] = set()


def record_kinds(code: Any) -> None:
    for t in trees_of(code):
        KINDS_SEEN.update(c.kind for p in t.reference.parts for c in (p.c or ()))
        assert t.reference.residual_parts == 0
        assert t.residual is None


def base_args() -> tuple[Any, ...]:
    items = [1, 2]
    return (torch.randn(2, 3), 2, True, None, "a", (3, 2), items, {"k": 1.0}, Config(), 0.25, items, items)


def test_every_kind_of_a_function_agrees_on_passing_and_failing_inputs() -> None:
    compiled = kiln_dynamo.compile(everything, backend=CountingBackend())
    args = base_args()
    torch.testing.assert_close(compiled(*args), everything(*args))
    code = everything.__code__
    record_kinds(code)
    values = entry_values(code, everything, args)
    with running(compiled):
        assert_agree(code, values, expect=True)
        x, n, flag, none, s, shape, items, table, cfg, f, _, _ = args
        variants = {
            "dtype": (x.double(),),
            "shape": (torch.randn(3, 2),),
            "strides": (torch.randn(3, 2).t(),),
            "requires_grad": (x.clone().requires_grad_(),),
            "int": (x, 3),
            "int to bool": (x, True),
            "bool": (x, n, False),
            "None": (x, n, flag, 0),
            "str": (x, n, flag, none, "b"),
            "tuple": (x, n, flag, none, s, (2, 3)),
            "tuple item type": (x, n, flag, none, s, (3.0, 2)),
            "list length": (x, n, flag, none, s, shape, [1, 2, 3]),
            "dict keys": (x, n, flag, none, s, shape, items, {"k": 1.0, "j": 2.0}),
            "object type": (x, n, flag, none, s, shape, items, table, object()),
            "float": (x, n, flag, none, s, shape, items, table, cfg, 0.5),
            "not the same": (x, n, flag, none, s, shape, items, table, cfg, f, [1, 2], items),
        }
        for what, head in variants.items():
            v = entry_values(code, everything, head + args[len(head) :])
            assert verdicts(code, v) == [(False, False)], what
        for what, mutate in state_changes(cfg).items():
            with mutate():
                assert verdicts(code, values) == [(False, False)], what
            assert_agree(code, values, expect=True)


def state_changes(cfg: Config) -> dict[str, Callable[[], contextlib.AbstractContextManager[Any]]]:
    @contextlib.contextmanager
    def setattr_on(obj: Any, name: str, value: Any) -> Iterator[None]:
        had = name in vars(obj)
        old = vars(obj).get(name)
        setattr(obj, name, value)
        try:
            yield
        finally:
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)

    @contextlib.contextmanager
    def grad(on: bool) -> Iterator[None]:
        with torch.set_grad_enabled(on):
            yield

    @contextlib.contextmanager
    def default_dtype() -> Iterator[None]:
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            yield
        finally:
            torch.set_default_dtype(old)

    @contextlib.contextmanager
    def shadow_len() -> Iterator[None]:
        globals()["len"] = lambda v: 7
        try:
            yield
        finally:
            del globals()["len"]

    @contextlib.contextmanager
    def new_code() -> Iterator[None]:
        old = helper.__code__
        helper.__code__ = (lambda x: x + 2).__code__
        try:
            yield
        finally:
            helper.__code__ = old

    return {
        "global constant": lambda: setattr_on(__import__(__name__), "SCALE", 4),
        "global function": lambda: setattr_on(__import__(__name__), "helper", lambda x: x + 2),
        "function code": new_code,
        "math.sqrt": lambda: setattr_on(math, "sqrt", lambda v: 3.0),
        "object attribute": lambda: setattr_on(cfg, "alpha", 0.75),
        "negative zero": lambda: setattr_on(cfg, "rate", -0.0),
        "nan": lambda: setattr_on(cfg, "rate", math.nan),
        "instance shadows a method": lambda: setattr_on(cfg, "factor", lambda: 3.0),
        "class method": lambda: setattr_on(Config, "factor", lambda self: 3.0),
        "grad mode": lambda: grad(False),
        "default dtype": default_dtype,
        "shadowed builtin": shadow_len,
    }


def compile_net() -> tuple[Net, Any, Any]:
    net = Net().eval()
    compiled = kiln_dynamo.compile(net, backend=CountingBackend())
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x))
    return net, compiled, x


MODULE_CHANGES: dict[str, Callable[[Net], Any]] = {
    "train mode": lambda m: m.train(),
    "a parameter's requires_grad": lambda m: m.lin.weight.requires_grad_(False),
    "a parameter's .data replaced": lambda m: setattr(m.lin.weight, "data", torch.randn(4, 4).double()),
    "a buffer resized": lambda m: m.offset.resize_(5),
    "a buffer unsqueezed in place": lambda m: m.norm.running_mean.unsqueeze_(0),
    "a submodule of another type": lambda m: setattr(m.blocks, "0", nn.Tanh()),
    "a submodule added": lambda m: m.blocks.append(nn.ReLU()),
    "a forward hook": lambda m: m.lin.register_forward_hook(lambda *a: None),
    "a forward of the instance": lambda m: setattr(m.lin, "forward", lambda y: y),
    "a plain attribute": lambda m: setattr(m, "gain", 2.5),
    "a method patched on the class": lambda m: setattr(Net, "scaled", lambda self, y: y),
    "a global module hook": lambda m: nn.modules.module.register_module_forward_hook(lambda *a: None),
}


def test_a_module_agrees_on_its_tree_of_submodules_parameters_and_buffers() -> None:
    net, compiled, x = compile_net()
    code = Net.forward.__code__
    record_kinds(code)
    (tree,) = trees_of(code)
    assert tree.ntensors == 1 + 2 + 2 + 4 + 1  # x; lin; blocks.0; norm (w, b, mean, var); offset
    # shared prefixes are loaded once: one `_modules` load for each module with submodules read
    # (net, net.blocks), however many checks read below them
    loads = [o[5] for o in tree.ops if o[0] == hook.GuardOp.LOAD_ATTR]
    assert loads.count("_modules") == 2
    assert loads.count("_parameters") == 3  # lin, blocks[0], norm
    with running(compiled), torch.no_grad():
        assert_agree(code, (net, x, None), expect=True)
        for what, change in MODULE_CHANGES.items():
            m = Net().eval()  # another instance, same state: the same entry serves it
            assert verdicts(code, (m, x, None)) == [(True, True)], what
            saved = Net.__dict__["scaled"]
            handle = change(m)
            try:
                assert verdicts(code, (m, x, None)) == [(False, False)], what
            finally:
                Net.scaled = saved
                if hasattr(handle, "remove"):
                    handle.remove()
        assert_agree(code, (net, x, None), expect=True)


def test_closures_and_the_compile_key_agree() -> None:
    inner = closure_maker()
    compiled = kiln_dynamo.compile(inner, backend=CountingBackend())
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), inner(x))
    code = inner.__code__
    record_kinds(code)
    values = entry_values(code, inner, (x,))
    with running(compiled):
        assert_agree(code, values, expect=True)
        assert verdicts(code, (x, 5)) == [(False, False)]  # the closure's k
    other = kiln_dynamo.compile(inner, backend=CountingBackend())
    with running(other):
        assert verdicts(code, values) == [(False, False)]  # another compile() of the same code
    assert verdicts(code, values) == [(False, False)]  # no compile() running


def test_every_check_kind_is_exercised_above() -> None:
    kiln_dynamo.reset()
    kiln_dynamo.compile(everything, backend=CountingBackend())(*base_args())
    record_kinds(everything.__code__)
    compile_net()
    record_kinds(Net.forward.__code__)
    inner = closure_maker()
    kiln_dynamo.compile(inner, backend=CountingBackend())(torch.randn(3))
    record_kinds(inner.__code__)
    # id_eq pins objects without weak references (a GradModeExit crossing a split): the frame
    # hook's tests run it, and the fuzz reaches it through its graph-break cases
    assert set(guard_tree.CHECK_KINDS) - {"id_eq"} == KINDS_SEEN


def test_a_check_the_tree_cannot_express_goes_to_the_residual_guard() -> None:
    class Unusual(AttrSource):
        """A source kind the tree compiler does not know (an exact-type table miss)."""

    ctx = CodeContext(["x"])
    builder = GuardBuilder(ctx)
    builder.type_match(LocalSource("x"), Config())
    builder.constant(Unusual(LocalSource("x"), "alpha"), 0.5)
    guard = build_guard(builder, 1, {}, "test")
    assert guard.residual_parts == 1
    tree = guard.tree
    assert tree.residual is not None
    cfg = Config()
    assert tree(cfg) is True and guard.fn(cfg) is True
    cfg.alpha = 0.25
    assert tree(cfg) is False and guard.fn(cfg) is False
    assert tree(3) is False and guard.fn(3) is False


def test_the_residual_guard_binds_only_what_its_checks_read() -> None:
    # Note [The residual guard's bindings]: the residual evaluates the bindings its own checks
    # read (transitively), not every binding of the frame's guard; the tree loads the others
    from kiln_dynamo.guards import GuardPart, _needed_bindings

    part = GuardPart("2 <= v4.size(1)", (("2 <= v4.size(1)", "2 <= x.size(1)"),), "here")
    items: list[Any] = ["v0 = L0[0]", "v1 = v0.model", "v2 = L1['ids']", "v4 = v2.t()", "v5 = v1.w", part]
    assert _needed_bindings(items) == ["v2 = L1['ids']", "v4 = v2.t()", part]
    assert _needed_bindings(["if x: pass", part]) == ["if x: pass", part]  # not a plain binding: all kept

    class Unusual(AttrSource):
        """A source kind the tree compiler does not know."""

    ctx = CodeContext(["x"])
    builder = GuardBuilder(ctx)
    for i in range(20):
        builder.constant(AttrSource(LocalSource("x"), f"p{i}"), i)
    builder.constant(Unusual(LocalSource("x"), "alpha"), 0.5)
    guard = build_guard(builder, 1, {}, "test")
    assert guard.residual_parts == 1
    cfg = types.SimpleNamespace(alpha=0.5, **{f"p{i}": i for i in range(20)})
    assert guard.tree(cfg) is True
    cfg.alpha = 0.25
    assert guard.tree(cfg) is False
    cfg.alpha, cfg.p3 = 0.5, 7
    assert guard.tree(cfg) is False  # a check the tree runs
    del cfg.p5
    assert guard.tree(cfg) is False  # a binding that raises still fails the guard


def test_c_guards_can_be_switched_off_and_recompile_reasons_read_the_same() -> None:
    reasons = {}
    for on in (True, False):
        previous = guard_tree.set_c_guards(on)
        try:
            kiln_dynamo.reset()
            compiled = kiln_dynamo.compile(everything, backend=CountingBackend())
            args = base_args()
            compiled(*args)
            (entry,) = hook.cache_entries(everything.__code__)
            assert isinstance(entry.guard, hook.GuardTree) is on
            compiled(torch.randn(2, 3, dtype=torch.float64), *args[1:])
            compiled(args[0], 5, *args[2:])
            reasons[on] = list(kiln_dynamo.counters.guard_failures)
        finally:
            guard_tree.set_c_guards(previous)
    assert reasons[True] == reasons[False]
    assert len(reasons[True]) == 2 and "L['x'].dtype == torch.float32" in reasons[True][0]


def test_kiln_log_guards_prints_the_tree(caplog: pytest.LogCaptureFixture) -> None:
    compiled = kiln_dynamo.compile(Net().eval(), backend=CountingBackend())
    with caplog.at_level(logging.INFO, logger="kiln.dynamo.guards"), torch.no_grad():
        compiled(torch.randn(2, 4))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "guard tree for forward:" in text and "0 residual Python checks" in text
    assert "tensors (others; 9 in one loop):" in text and "L['self'].lin.weight" in text


def add_weight(x: torch.Tensor, lin: nn.Linear) -> torch.Tensor:
    return x + lin.weight


TENSOR_CHANGES: dict[str, Callable[[torch.Tensor, nn.Parameter], tuple[torch.Tensor, nn.Parameter]]] = {
    "same": lambda x, w: (x, w),
    "inference tensor": lambda x, w: (torch.inference_mode()(x.clone)(), w),
    "conjugated view": lambda x, w: (torch.randn(2, 3, dtype=torch.cfloat).conj(), w),
    "negative view": lambda x, w: (torch._neg_view(torch.randn(2, 3, dtype=torch.cfloat)), w),
    "dtype": lambda x, w: (x.double(), w),
    "strides": lambda x, w: (x.t().contiguous().t(), w),
    "sizes": lambda x, w: (torch.randn(3, 3), w),
    "requires_grad": lambda x, w: (x.requires_grad_(), w),
    "param .data = double": lambda x, w: (x, setattr(w, "data", w.data.double()) or w),
    "param .data = transposed": lambda x, w: (x, setattr(w, "data", w.data.t().contiguous().t()) or w),
    "param requires_grad_()": lambda x, w: (x, w.requires_grad_(True)),
    "param resize_": lambda x, w: (x, w.requires_grad_(False).resize_(7)),
}


@pytest.mark.parametrize("checker", [True, False], ids=["torch-linked checker", "attributes"])
@pytest.mark.parametrize("what", list(TENSOR_CHANGES))
def test_tensor_changes_and_dispatch_keys_agree(what: str, checker: bool) -> None:
    """Every tensor property a row checks, each changed on an entry value or in place on a
    parameter, read by the torch-linked checker (Note [The torch-linked tensor checker]; built
    here if it is not yet) and through attributes: the tree and the Python guard agree."""
    from kiln_dynamo import tensor_check

    assert tensor_check.install(build=True), tensor_check.status()
    if not checker:
        tensor_check.uninstall()
    try:
        kiln_dynamo.reset()
        lin = nn.Linear(3, 2).requires_grad_(False)
        lin.weight.data = torch.randn(2, 3)
        compiled = kiln_dynamo.compile(add_weight, backend=CountingBackend())
        x = torch.randn(2, 3)
        with running(compiled):
            compiled(x, lin)
            code = add_weight.__code__
            (tree,) = trees_of(code)
            assert all(row[9] for o in tree.ops if o[0] == hook.GuardOp.TENSORS for row in o[5])  # fast rows
            assert_agree(code, (x, lin), expect=True)
            assert_agree(code, (x, lin), expect=True)  # warm: the memo
            saved = lin.weight.data
            x2, _ = TENSOR_CHANGES[what](x.clone(), lin.weight)
            try:
                assert_agree(code, (x2, lin), expect=what == "same")
            finally:
                lin.weight.data = saved
                lin.weight.requires_grad_(False)
            assert_agree(code, (x, lin), expect=True)
    finally:
        tensor_check.install()


def test_the_memo_report_says_what_a_warm_call_skips() -> None:
    net, compiled, x = compile_net()
    (tree,) = trees_of(Net.forward.__code__)
    with running(compiled), torch.no_grad():
        assert tree(net, x, None) and tree(net, x, None)
    report = guard_tree.memo_report(tree)
    assert report.startswith("guard memo: ") and "ops skipped on a warm call" in report
    assert "TENSORS" in report  # tensor rows always run
    assert tree.memo["hits"] >= 1 and tree.memo["run_ops"] < tree.nops // 2


def test_the_checker_is_built_in_the_background_and_loaded_from_the_cache(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KILN_TENSOR_CHECKER=auto (the default): with no checker built, the first install starts a
    background build and guards read attributes meanwhile; when the build is done the checker is
    in use, and a later process (here: the same after uninstall) loads the library from the cache
    without building (Note [The torch-linked tensor checker])."""
    from kiln_dynamo import tensor_check

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KILN_TENSOR_CHECKER", raising=False)
    tensor_check.uninstall()
    try:
        assert not tensor_check.install()  # not built yet: the attribute path, a build started
        thread = tensor_check.background_build()
        assert thread is not None
        thread.join(timeout=900)
        assert tensor_check.status() == "in use", tensor_check.status()
        net, compiled, x = compile_net()
        torch.testing.assert_close(compiled(x), net(x))
        libraries = list(tmp_path.rglob("kiln_tensor_check*.so"))
        assert len(libraries) == 1 and not list(tmp_path.rglob(".build-*")), libraries  # no scratch left
        tensor_check.uninstall()
        assert tensor_check.install(build=False)  # from the cache, no build
    finally:
        tensor_check.uninstall()
        monkeypatch.undo()
        tensor_check.install()


def test_the_background_build_runs_at_the_lowest_priority(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Note [The background build yields the cores]: the background compiler runs under `nice -n
    19`; a foreground build (the caller waits) at normal priority."""
    import shutil
    import subprocess

    from kiln_dynamo import tensor_check

    commands: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    source, library = tmp_path / "x.cpp", tmp_path / "x.so"
    tensor_check._compile(source, library, "x", background=True)
    tensor_check._compile(source, library, "x")
    background, foreground = commands
    nice = shutil.which("nice")
    assert nice is not None  # coreutils: present wherever kiln builds C++
    assert background[:3] == [nice, "-n", "19"] and background[3:] == foreground
    assert str(source) in foreground and "nice" not in foreground[0]


def test_the_checker_compares_data_pointers_in_one_call() -> None:
    """`tensor_check.data_ptrs_equal()`: each tensor's `data_ptr()` against its pointer (None: not
    checked), in C (kiln's CUDA-graph runner checks its static inputs with it: Note [The runner's
    per-call path] in kiln_codegen_triton); False for what it cannot read, never an error but for
    the wrong arguments."""
    from kiln_dynamo import tensor_check

    assert tensor_check.install(build=True), tensor_check.status()
    equal = tensor_check.data_ptrs_equal()
    assert equal is not None
    p = torch.nn.Parameter(torch.randn(4, 4))
    ts = (p, torch.randn(3), torch.randn(6)[2:])  # a parameter, a tensor, a view at an offset
    ptrs = tuple(t.data_ptr() for t in ts)
    assert equal(ts, ptrs) and equal((), ())
    with torch.no_grad():
        p.data = torch.randn(4, 4)  # `param.data = ...`: same object, new memory
    assert not equal(ts, ptrs)
    assert equal(ts, tuple(t.data_ptr() for t in ts))
    assert not equal(ts[:2], ptrs)  # lengths differ
    assert not equal((ts[0], 3), (ptrs[0], 3))  # not a tensor
    assert not equal(ts[:1], ("0",))  # not an int
    assert equal((ts[0], 3, ts[2]), (None, None, ptrs[2]))  # None: not checked (anything there)
    assert not equal((ts[0], ts[2]), (None, ptrs[1]))
    with pytest.raises(TypeError):
        equal(list(ts), ptrs)
