"""Test support for loopir and its backends: OpInfo samples as aten-level FX graphs.

Every backend's suite sweeps PyTorch's OpInfo database through its lowerings, so the recorder
lives here, one floor below the backends, rather than in each package's tests.

An OpInfo sample becomes an aten-level FX graph by recording the aten calls it makes
(:func:`record`; :func:`recorded_samples` gives the first few of an op's samples so, the second
non-contiguous, as every sweep takes them; :func:`lowered_op_infos` the OpInfos a sweep runs).

The torch-level op is run under a dispatch mode that records each aten overload call with its
arguments; the calls become ``call_function`` nodes in order, tensors produced by earlier calls
become edges, and every other tensor becomes a placeholder. This gives the graphs loopir
consumes (aten ops, no fake tensors) for PyTorch's own sample inputs, without a tracer.

Graphs written by hand for tests get their ``node.meta["val"]`` from :func:`with_vals`, as aotgrad's
graphs carry it (the realize rules and the graph passes read sizes from it); ``mm``, ``bmm``,
``addmm`` and ``conv`` spell the aten calls the pass tests of every package build graphs from;
``mul_sum`` and ``downcast_mul_sum`` are the fusion-bound graphs every backend counts kernels of.

What every code generator's tests compare with eager through is here too (each package's
``*_check.py`` adds only its backend and its reference): :data:`TOLERANCES` by dtype (integers
and bools exactly), :func:`assert_same` (type, dtype, shape, device and values, recursively, with
a label that says which output differed), :func:`trace`, and :func:`graph_of` with :class:`In`
for graphs written as a list of aten calls; :func:`assert_outputs` compares a graph's outputs,
labelled by name; :func:`check_compiled` compiles, runs and compares once the reference ran.
The pointwise sweeps of both code generators run the same ops on the same dtypes
(:data:`SWEEP_DTYPES`, :data:`SWEEP_UNARY`, :data:`SWEEP_BINARY`, by aten name through
:func:`aten_op`). Every package's tests seed their random inputs per test through
:func:`seed_generators` (Note [Seeded tests]); each code generator's session gets its private
compile cache and its backend by name from :func:`backend_test_session`.
"""

from __future__ import annotations

import importlib.metadata
import operator
import os
import random
import tempfile
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map


# Note [Seeded tests]: every test of loopir and its backends draws its random inputs from
# generators seeded for it (an autouse fixture in each package's conftest.py calls this), so a
# test's data does not depend on which tests ran before it (a tight tolerance once passed or
# failed with the test order). The seed is the test's id hashed with a base, so no two tests share
# data; ``KILN_TEST_SEED`` changes the base (default 0), to check that no tolerance holds for one
# seed only.
def seed_generators(test_id: str) -> int:
    """Seed Python's and torch's generators for the test ``test_id``; returns the seed."""
    seed = zlib.crc32(f"{os.environ.get('KILN_TEST_SEED', '0')}:{test_id}".encode())
    random.seed(seed)
    torch.manual_seed(seed)
    return seed


# Note [A code generator's test session]: every code generator's tests run under a compile cache
# of their own, a temporary directory for the whole session (kernels compiled by one test are
# reused by the next, which keeps a suite fast, and ~/.cache/kiln is never touched: the cache
# root is read at each compile, so setting it before the first compile is enough), and find their
# backend by name: when the package is installed its entry point makes the name visible, when
# the tests run from a source tree (PYTHONPATH) it is registered in process instead. Each
# package's conftest.py calls this once; its pytest fixtures stay there (this package does not
# depend on pytest).
def backend_test_session(name: str, factory: Callable[[], Any], cache_prefix: str) -> str:
    """Set up a code generator's test session (Note [A code generator's test session]): a
    private ``KILN_CACHE_DIR`` and the backend ``name``; returns the cache directory."""
    from .backend import ENTRY_POINT_GROUP, register_backend

    cache = tempfile.mkdtemp(prefix=cache_prefix)
    os.environ["KILN_CACHE_DIR"] = cache
    if not any(ep.name == name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)):
        register_backend(name, factory)
    return cache


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo database (it needs expecttest, which the test environments install)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def lowered_packets() -> set[str]:
    """Names of the aten overload packets that have a loopir lowering."""
    from .lowering import LOWERINGS, _ensure_registered

    _ensure_registered()
    names = set()
    for key in LOWERINGS:
        packet = key.overloadpacket if isinstance(key, torch._ops.OpOverload) else key
        names.add(packet.__name__.split(".")[-1])
    return names


def lowered_op_infos(extra: Collection[str] = ()) -> list[Any]:
    """The OpInfos whose aten op has a lowering, plus those named in ``extra``."""
    lowered = lowered_packets()
    chosen = []
    for op in load_op_db():
        aten_name = (op.aten_name or op.name).replace("nn.functional.", "")
        if aten_name in lowered or op.name in lowered or op.name in extra:
            chosen.append(op)
    return chosen


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, Any, Any, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, out))
        return out


class NotRecordable(Exception):
    """The sample mutates, is random, or returns something that is not a tensor structure."""


def record(
    fn: Any, args: list[Any], kwargs: dict[str, Any]
) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """An aten graph equivalent to ``fn(*args, **kwargs)`` and its inputs."""
    recorder = _Recorder()
    with recorder:
        result = fn(*args, **kwargs)
    graph = torch.fx.Graph()
    env: dict[int, torch.fx.Node] = {}
    inputs: list[torch.Tensor] = []

    def to_node(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in env:
                env[id(value)] = graph.placeholder(f"in{len(inputs)}")
                inputs.append(value)
            return env[id(value)]
        return value

    for func, cargs, ckwargs, out in recorder.calls:
        if func._schema.is_mutable or torch.Tag.nondeterministic_seeded in func.tags:
            raise NotRecordable(f"{func} mutates or is random")
        node = graph.call_function(func, tree_map(to_node, cargs), tree_map(to_node, ckwargs))
        if isinstance(out, torch.Tensor):
            env[id(out)] = node
        elif isinstance(out, list | tuple):
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    env[id(o)] = graph.call_function(operator.getitem, (node, i))
    leaves, _ = tree_flatten(result)
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        raise NotRecordable("output is not a tensor structure")
    if not recorder.calls:
        raise NotRecordable("no aten calls")
    graph.output(tree_map(to_node, result) if not isinstance(result, torch.Tensor) else to_node(result))
    return torch.fx.GraphModule(torch.nn.Module(), graph), inputs


def recorded_samples(
    op: Any, dtype: torch.dtype, count: int, skip: tuple[type[Exception], ...] = (NotRecordable,)
) -> Iterator[tuple[int, Any, torch.fx.GraphModule, list[torch.Tensor]]]:
    """``(index, sample, graph, inputs)`` of the first ``count`` CPU samples of OpInfo ``op`` at
    ``dtype``, each recorded as an aten graph (:func:`record`); the second one (index 1) is made
    non-contiguous. A sample whose recording raises one of ``skip`` is passed over (it still
    counts); an error of the sample generator itself propagates."""
    for i, original in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
        if i >= count:
            break
        sample = original.noncontiguous() if i == 1 else original
        try:
            gm, inputs = record(op.op, [sample.input, *sample.args], dict(sample.kwargs))
        except skip:
            continue
        yield i, sample, gm, inputs


# ------------------------------------------------------------------ hand-written test graphs

aten = torch.ops.aten


def max_pool_backward_inputs(x: torch.Tensor, case: Any, channels_last: bool) -> list[torch.Tensor]:
    """``[grad, x, indices]`` as autograd passes them to ``max_pool2d_with_indices_backward`` for
    ``case = (shape, kernel, stride, padding, dilation, ceil_mode)``: ``x`` channels-last when asked
    (4-d), the indices from eager's forward, a seeded gradient of the output's shape and layout."""
    _, k, s, p, d, ceil = case
    cl = channels_last and x.dim() == 4
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    out, indices = aten.max_pool2d_with_indices.default(x, k, s, p, d, ceil)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(x.dtype)
    if cl:
        grad = grad.contiguous(memory_format=torch.channels_last)
    return [grad, x, indices]


def with_vals(fn: Any, *inputs: Any) -> torch.fx.GraphModule:
    """``fn`` traced (or ``fn`` itself, a GraphModule), with ``node.meta["val"]`` on every node as
    aotgrad's graphs carry it, from one eager run on ``inputs``."""
    gm = fn if isinstance(fn, torch.fx.GraphModule) else torch.fx.symbolic_trace(fn)

    class Record(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            n.meta["val"] = super().run_node(n)
            return n.meta["val"]

    Record(gm).run(*inputs)
    return gm


def trace_with_user_lines(fn: Any) -> torch.fx.GraphModule:
    """``fn`` symbolically traced, each node stamped with the ``source_line`` (``file:line`` of
    ``fn``'s line that made it) that aotgrad stamps on aten nodes: for the kernel-origin tests."""
    import sys

    code = fn.__code__

    class Tracer(torch.fx.Tracer):
        def create_node(self, *args: Any, **kwargs: Any) -> torch.fx.Node:
            node = super().create_node(*args, **kwargs)
            frame: Any = sys._getframe()
            while frame is not None and frame.f_code is not code:
                frame = frame.f_back
            if frame is not None:
                node.meta["source_line"] = f"{frame.f_code.co_filename}:{frame.f_lineno}"
            return node

    return torch.fx.GraphModule(torch.nn.Module(), Tracer().trace(fn))


def mm(a: Any, b: Any) -> Any:
    return aten.mm.default(a, b)


def bmm(a: Any, b: Any) -> Any:
    return aten.bmm.default(a, b)


def addmm(c: Any, a: Any, b: Any) -> Any:
    return aten.addmm.default(c, a, b)


def conv(x: Any, w: Any, groups: int = 1) -> Any:
    """A 2-D convolution, stride 1, padding 1, no bias."""
    return aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], groups)


def mul_sum(a: Any, b: Any) -> Any:
    """``(a * b).sum(-1)``: one kernel (the product inlines into the reduction)."""
    return aten.sum.dim_IntList(aten.mul.Tensor(a, b), [-1])


def downcast_mul_sum(a: Any, b: Any) -> Any:
    """``(a.to(bf16) * b.to(bf16)).float().sum(0)``: one kernel, eager's roundings inside it."""
    x = aten._to_copy.default(a, dtype=torch.bfloat16)
    y = aten._to_copy.default(b, dtype=torch.bfloat16)
    return aten.sum.dim_IntList(aten._to_copy.default(aten.mul.Tensor(x, y), dtype=torch.float32), [0])


# ------------------------------------------------------------------ comparing with eager

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (2e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def trace(fn: Callable[..., Any] | torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``fn`` itself if it is a GraphModule, else its ``torch.fx.symbolic_trace``."""
    return fn if isinstance(fn, torch.fx.GraphModule) else torch.fx.symbolic_trace(fn)


@dataclass(frozen=True)
class In:
    """Placeholder ``index`` of a graph built by :func:`graph_of`."""

    index: int


Call = tuple[Any, tuple[Any, ...], dict[str, Any]]


def graph_of(calls: Sequence[Call], n_inputs: int) -> torch.fx.GraphModule:
    """A graph of ``n_inputs`` placeholders and one output per ``(op, args, kwargs)`` call.

    In ``args`` an :class:`In` (also inside a list) names a placeholder; anything else is passed
    as it is."""
    g = torch.fx.Graph()
    xs = [g.placeholder(f"in{i}") for i in range(n_inputs)]
    outs = []

    def arg(p: Any) -> Any:
        if isinstance(p, In):
            return xs[p.index]
        return [arg(q) for q in p] if isinstance(p, list) else p

    for op, positions, extra in calls:
        args = tuple(arg(p) for p in positions)
        outs.append(g.call_function(op, args, extra))
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def assert_same(actual: Any, expected: Any, label: str = "output", scale: float = 1.0) -> None:
    """``actual`` is ``expected``: same type, dtype, shape and device, values within
    :data:`TOLERANCES` of the dtype times ``scale`` (NaN where NaN); lists and tuples item by
    item; anything else equal."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{label}: got {type(actual)}"
        assert actual.dtype == expected.dtype, f"{label}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
        assert actual.device == expected.device, f"{label}: device {actual.device} != {expected.device}"
        rtol, atol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
        torch.testing.assert_close(
            actual,
            expected,
            rtol=rtol * scale,
            atol=atol * scale,
            equal_nan=True,
            msg=lambda m: f"{label}: {m}",
        )
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple) and len(actual) == len(expected), label
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{label}[{i}]", scale)
    else:
        assert actual == expected, f"{label}: {actual!r} != {expected!r}"


def assert_outputs(
    actual: Any, expected: Any, names: Sequence[str] | None = None, scale: float = 1.0
) -> None:
    """A compiled graph's outputs are eager's (:func:`assert_same`): with ``names``, each output of
    a tuple is labelled by its name, so a failure says which op differed."""
    if names is not None and isinstance(expected, tuple):
        for name, a, e in zip(names, actual, expected, strict=True):
            assert_same(a, e, name, scale)
    else:
        assert_same(actual, expected, "output", scale)


def check_compiled(
    gm: torch.fx.GraphModule,
    inputs: Sequence[Any],
    expected: Any,
    backend: Any,
    *,
    names: Sequence[str] | None = None,
    scale: float = 1.0,
    allow_declined: bool = False,
    options: dict[str, Any] | None = None,
    calls: int = 1,
    reconcile: Callable[[Any, Any], Any] | None = None,
) -> Any:
    """The part of every code generator's ``check`` after its reference ran: compile ``gm`` for
    ``inputs`` with ``backend`` (and loopir pass ``options``), run it ``calls`` times, compare
    each result with ``expected`` (:func:`assert_outputs`; ``reconcile(expected, actual)`` may
    first adjust what counts as expected), and, unless ``allow_declined``, assert the backend
    declined no kernel (Note [Declined kernels] in backend.py). Returns the compiled graph."""
    from .compile import compile_graph

    compiled = compile_graph(gm, list(inputs), backend=backend, options=options)
    for _ in range(calls):
        actual = compiled(*inputs)
        if reconcile is not None:
            expected = reconcile(expected, actual)
        assert_outputs(actual, expected, names, scale)
    if not allow_declined:
        assert backend.last_declined == [], backend.last_declined
    return compiled


# the pointwise sweeps every code generator's tests run (one graph per dtype holding every op
# eager supports on it): dtypes, unary ops by aten packet, binary ops by aten overload
SWEEP_DTYPES = [
    torch.float32, torch.float64, torch.bfloat16, torch.float16,
    torch.int8, torch.int32, torch.int64, torch.bool,
]  # fmt: skip

SWEEP_UNARY = [
    "abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "sin",
    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "sigmoid", "erf", "erfc", "erfinv", "floor", "ceil", "round", "trunc", "sign", "frac",
    "isnan", "isinf", "logical_not", "relu", "reciprocal", "bitwise_not", "signbit", "square",
    "lgamma", "gelu", "silu", "hardtanh", "leaky_relu", "elu", "softplus", "hardsigmoid",
    "hardswish", "mish",
]  # fmt: skip

SWEEP_BINARY = [
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "maximum.default", "minimum.default",
    "fmax.default", "fmin.default", "eq.Tensor", "ne.Tensor", "lt.Tensor", "le.Tensor", "gt.Tensor",
    "ge.Tensor", "logical_and.default", "logical_or.default", "logical_xor.default",
    "bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor", "pow.Tensor_Tensor",
    "atan2.default", "fmod.Tensor", "remainder.Tensor", "floor_divide.default", "copysign.Tensor",
    "hypot.default", "nextafter.default",
]  # fmt: skip


def aten_op(name: str) -> Any:
    """The aten overload ``packet.overload`` names (``"add.Tensor"``; a bare packet: its default)."""
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def make(
    shape: tuple[int, ...], dtype: torch.dtype = torch.float32, *, low: float = -2, high: float = 2, **kw: Any
) -> torch.Tensor:
    """A CPU test tensor of ``shape`` and ``dtype`` with values in [low, high)."""
    return torch.testing.make_tensor(shape, dtype=dtype, device="cpu", low=low, high=high, **kw)


def eager_supports(op: Any, *args: Any) -> bool:
    """Whether eager runs ``op(*args)`` without raising (a sweep skips what eager refuses)."""
    try:
        op(*args)
    except Exception:
        return False
    return True


def safe_softmax(s: torch.Tensor, table: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor) -> Any:
    """Swin's window attention scores: a gathered bias, a mask (rows all -inf), ``_safe_softmax``
    as aotgrad decomposes it (Note [Why a value is realized] (c) in graph.py); shared by the
    tests of loopir and of both code generators."""
    b = aten.permute.default(aten.view.default(aten.index.Tensor(table, [idx]), [4, 4, 2]), [2, 0, 1])
    x = aten.add.Tensor(aten.add.Tensor(s, aten.unsqueeze.default(b, 0)), mask)
    sm = aten._softmax.default(x, -1, False)
    masked = aten.logical_not.default(
        aten.any.dim(aten.logical_not.default(aten.eq.Scalar(x, float("-inf"))), -1, True)
    )
    return aten.where.self(masked, aten.full_like.default(sm, 0), sm)


def scatter_of_no_elements(x: torch.Tensor, rows: torch.Tensor) -> Any:
    """An in-place ``index_add_`` into a zero-size ``narrow`` of ``x`` as aotgrad functionalizes
    it (alias fuzzer seed 881): an ``index_put`` of no elements whose result a ``slice_scatter``
    reads by name (Note [Scatters with no elements] in codegen_cpp's wrapper); shared by the
    tests of loopir and of both code generators. ``x``: 6 columns; ``rows``: 3 row indices."""
    cut = aten.slice.Tensor(x, 1, 6, 6)
    values = aten.mul.Tensor(aten.full.default([3, 0], 1.0, dtype=torch.float32), 2)
    added = aten.copy.default(cut, aten.index_put.default(cut, [rows], values, True))
    return aten.mul.Tensor(aten.slice_scatter.default(x, added, 1, 6, 6), 3)


def safe_softmax_inputs() -> list[torch.Tensor]:
    """Inputs of :func:`safe_softmax`: one row of the mask all -inf (eager's softmax: NaN, the safe one: 0)."""
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(3, 2, 4, 4)
    mask[1, :, 2, :] = float("-inf")  # a row with nothing to attend to: 0 where eager's softmax is NaN
    mask[2, 0, :, 1] = float("-inf")
    return [
        torch.randn(3, 2, 4, 4, generator=g),
        torch.randn(9, 2, generator=g),
        torch.randint(0, 9, (16,), generator=g),
        mask,
    ]
