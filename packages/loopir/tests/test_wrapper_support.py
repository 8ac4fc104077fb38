"""extern_callable: a wrapper calls torch's Python binding of an extern op where it is the same
operator (Note [Extern calls through torch's Python bindings]); the parts of a wrapper generator
every backend shares (constants, the namespace, the walk over the schedule)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kiln_loopir import GraphLowering, Scheduler
from kiln_loopir.interpret import run_members
from kiln_loopir.ir import Scatter
from kiln_loopir.scheduler import (
    BaseSchedulerNode,
    ExternKernelSchedulerNode,
    NopKernelSchedulerNode,
    TemplateSchedulerNode,
    output_buffer_names,
)
from kiln_loopir.testing import scatter_of_no_elements
from kiln_loopir.wrapper_support import (
    BOUND_OPS,
    NN_BOUND_OPS,
    WrapperConstants,
    WrapperSteps,
    aliases_nothing,
    extern_callable,
)

aten = torch.ops.aten


def _samples() -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    q = k = v = torch.randn(1, 2, 4, 8)
    x = torch.randn(2, 2, 7, 6).to(memory_format=torch.channels_last)
    return [
        (aten.mm.default, (a, b), {}),
        (aten.addmm.default, (torch.randn(5), a, b), {"beta": 0.5, "alpha": 2.0}),
        (aten.bmm.default, (torch.randn(2, 3, 4), torch.randn(2, 4, 5)), {}),
        (aten.baddbmm.default, (torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)), {}),
        (aten.addmv.default, (torch.randn(3), a, torch.randn(4)), {}),
        (aten.mv.default, (a, torch.randn(4)), {}),
        (aten.dot.default, (torch.randn(4), torch.randn(4)), {}),
        (
            aten.convolution.default,
            (
                torch.randn(1, 2, 5, 5),
                torch.randn(3, 2, 3, 3),
                None,
                [1, 1],
                [1, 1],
                [1, 1],
                False,
                [0, 0],
                1,
            ),
            {},
        ),
        (aten.embedding.default, (torch.randn(10, 3), torch.tensor([[1, 2], [3, 9]])), {}),
        (aten.native_layer_norm.default, (torch.randn(2, 6), [6], torch.randn(6), torch.randn(6), 1e-5), {}),
        (aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v), {"scale": 0.5}),
        (aten.max_pool2d_with_indices.default, (x, [3, 3], [2, 2], [1, 1], [1, 1], False), {}),
        (aten.max_pool2d_with_indices.default, (x, (2, 2)), {"stride": (1, 1), "ceil_mode": True}),
        (aten.max_pool3d_with_indices.default, (x.unsqueeze(2), [1, 2, 2]), {}),
        (aten.avg_pool2d.default, (x, [3, 3], [2, 2], [1, 1], True, False, None), {}),
        (aten.adaptive_max_pool2d.default, (x, [2, 3]), {}),
        (aten._adaptive_avg_pool2d.default, (x, [1, 1]), {}),
        (
            aten._native_batch_norm_legit_no_training.default,
            (x, torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2) + 0.5, 0.1, 1e-5),
            {},
        ),
    ]


@pytest.mark.parametrize("case", range(len(_samples())))
def test_a_bound_op_gives_the_operators_result(case: int) -> None:
    op, args, kwargs = _samples()[case]
    bound = extern_callable(op)
    assert bound is not op and not isinstance(bound, torch._ops.OpOverload)
    torch.testing.assert_close(bound(*args, **kwargs), op(*args, **kwargs), rtol=0, atol=0)


def test_every_bound_op_has_a_binding_or_stays_an_overload() -> None:
    for name in BOUND_OPS:
        op = getattr(aten, name).default
        assert extern_callable(op) is getattr(torch._C._VariableFunctions, name, op)


def test_every_nn_bound_op_has_its_binding_in_torch_nn() -> None:
    for name in NN_BOUND_OPS:
        op = getattr(aten, name).default
        assert extern_callable(op) is getattr(torch._C._nn, name)


def test_the_out_overload_writes_into_out() -> None:
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    out = torch.empty(3, 5)
    extern_callable(aten.mm.out)(a, b, out=out)
    torch.testing.assert_close(out, a @ b)


def test_other_ops_and_overloads_are_called_as_they_are() -> None:
    for op in (
        aten.add.Tensor,
        aten.add.Scalar,
        aten.sum.dim_IntList,
        aten.mm.dtype,
        aten.var_mean.correction,
    ):
        assert extern_callable(op) is op
    f = lambda x: x  # noqa: E731  any callable that is not an OpOverload
    assert extern_callable(f) is f


def test_the_switch_calls_every_op_as_its_overload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_EXTERN_BINDINGS", "0")
    assert extern_callable(aten.mm.default) is aten.mm.default


def test_wrapper_constants_name_what_has_no_literal() -> None:
    class Wrapper(WrapperConstants):
        def __init__(self) -> None:
            self.consts = 0
            self.namespace: dict[str, Any] = {}

    w = Wrapper()
    t = torch.ones(2)
    literals = [w.const(v) for v in (None, True, 3, "a", 0.5, torch.float16)]
    assert literals == ["None", "True", "3", "'a'", "0.5", "_torch.float16"]
    assert (w.const(float("inf")), w.const(t)) == ("_c0", "_c1")
    assert w.namespace["_c0"] == float("inf") and w.namespace["_c1"] is t and w.consts == 2


def test_wrapper_namespace_holds_the_shared_names() -> None:
    from kiln_loopir.wrapper_support import (
        DataDependentCheckFailed,
        conform_input,
        dense_storage,
        flat_storage,
        wrapper_namespace,
    )

    ns = wrapper_namespace()
    assert (ns["_flat"], ns["_dense"], ns["_conform"]) == (flat_storage, dense_storage, conform_input)
    assert ns["_CheckFailed"] is DataDependentCheckFailed and ns["_torch"] is torch
    assert wrapper_namespace() is not ns  # each wrapper adds its own names to a fresh dict


def test_seed_generators_seeds_per_test_and_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Seeded tests]: the same test id draws the same data; another id or base, other data."""
    import random

    from kiln_loopir.testing import seed_generators

    def draw(test_id: str) -> tuple[float, list[float]]:
        seed_generators(test_id)
        return random.random(), torch.randn(4).tolist()

    monkeypatch.delenv("KILN_TEST_SEED", raising=False)
    first = draw("tests/a.py::test_x")
    assert draw("tests/a.py::test_x") == first and draw("tests/a.py::test_y") != first
    monkeypatch.setenv("KILN_TEST_SEED", "1")
    assert draw("tests/a.py::test_x") != first


class _Steps(WrapperSteps):
    """A wrapper generator that writes one line per node kind (Note [A wrapper's walk over the
    schedule])."""

    def __init__(self, schedule: Scheduler) -> None:
        self.schedule = schedule
        self.lines: list[str] = []

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def extern(self, kernel: Any) -> None:
        self.emit(f"extern {kernel.name}")

    def alias_scatter(self, buffer: Scatter) -> None:
        self.emit(f"{buffer.name} = {buffer.mutates}")

    def allocate(self, buffer: Any) -> None:
        self.emit(f"allocate {buffer.name}")

    def kernel(self, node: BaseSchedulerNode, step: int) -> None:
        self.emit(f"kernel {node.name} at {step}")


def _schedule(fn: Any, inputs: list[Any], template_hook: Any = None) -> Scheduler:
    from kiln_loopir.testing import trace

    graph = GraphLowering(trace(fn), inputs).run()
    return Scheduler(
        graph.operations,
        graph.name_to_buffer,
        output_buffer_names(graph.outputs),
        template_hook=template_hook,
    )


def test_wrapper_steps_walk_the_schedule_in_order() -> None:
    """Every node once, in order, by its kind; after each step the buffers the plan frees then,
    but never a graph output or a buffer whose memory another took over."""

    def fn(x: Any, w: Any, v: Any) -> Any:
        a = aten.mm.default(aten.sin.default(x), w)
        b = aten.mm.default(aten.exp.default(a), v)
        return aten.cos.default(b), aten.relu.default(a)

    s = _schedule(fn, [torch.randn(8, 8), torch.randn(8, 4), torch.randn(4, 2)])
    steps = _Steps(s)
    steps.emit_steps()
    n = s.nodes
    assert [isinstance(node, ExternKernelSchedulerNode) for node in n] == [False, True, False, True, False]
    sin, exp_relu = n[0].members()[0].name, n[2].members()[0].name  # sin(x), exp(a) (relu(a) fused)
    assert steps.lines == [
        f"kernel {n[0].name} at 0",
        f"extern {n[1].name}",
        f"del {sin}",  # read by the first GEMM only
        f"kernel {n[2].name} at 2",
        f"extern {n[3].name}",
        f"del {exp_relu}",  # read by the second GEMM only; relu(a) is an output: kept
        f"kernel {n[4].name} at 4",
    ]

    def chain(x: Any, w: Any) -> Any:
        a = aten.mm.default(aten.sin.default(x), w)
        return aten.cos.default(aten.mm.default(aten.exp.default(a), w))

    s = _schedule(chain, [torch.randn(8, 8), torch.randn(8, 8)])
    assert any(s.plan.free_after.values()) and all(v is not None for v in list(s.plan.allocate.values())[1:])
    steps = _Steps(s)
    steps.emit_steps()
    assert not any(line.startswith("del") for line in steps.lines)  # each freed buffer is reused


def test_wrapper_steps_bind_a_scatter_of_no_elements() -> None:
    """Note [Scatters with no elements]: the no-op node still binds the scatter's name."""
    s = _schedule(scatter_of_no_elements, [torch.randn(4, 6), torch.tensor([0, 2, 3])])
    nops = [n for n in s.nodes if isinstance(n, NopKernelSchedulerNode)]
    scatters = [n.node for n in nops if isinstance(n.node, Scatter)]
    assert scatters, s.describe()
    steps = _Steps(s)
    steps.emit_steps()
    for scatter in scatters:
        at = steps.lines.index(f"# {scatter.name}: no elements")
        assert steps.lines[at + 1] == f"{scatter.name} = {scatter.mutates}"


def test_wrapper_steps_hand_template_nodes_to_the_generator() -> None:
    def fn(x: Any, w: Any, b: Any) -> Any:
        return aten.relu.default(aten.add.Tensor(aten.mm.default(aten.sin.default(x), w), b))

    s = _schedule(fn, [torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)], lambda e, k: True)
    (template,) = [n for n in s.nodes if isinstance(n, TemplateSchedulerNode)]
    with pytest.raises(NotImplementedError, match="_Steps makes no templates"):
        _Steps(s).emit_steps()

    class WithTemplates(_Steps):
        def template(self, node: TemplateSchedulerNode, step: int) -> None:
            self.emit(f"template {node.name} at {step}")

    steps = WithTemplates(s)
    steps.emit_steps()
    assert f"template {template.name} at {s.nodes.index(template)}" in steps.lines


def test_run_members_binds_a_scatters_name_before_running_it() -> None:
    """A declined kernel's members run in order; a later member reads the scatter by its name."""

    def fn(x: Any, rows: Any, v: Any) -> Any:
        return aten.mul.Tensor(aten.index_put.default(aten.sin.default(x), [rows], v, True), 2)

    from kiln_loopir.testing import trace

    x, rows, v = torch.randn(4, 3), torch.tensor([0, 2, 2]), torch.randn(3, 3)
    graph = GraphLowering(trace(fn), [x, rows, v]).run()
    s = Scheduler(graph.operations, graph.name_to_buffer, output_buffer_names(graph.outputs), fusion=False)
    storage = {
        spec.name: t.reshape(-1).clone() for spec, t in zip(graph.graph_inputs, (x, rows, v), strict=True)
    }
    scatters = 0
    for node in s.nodes:
        members = node.members()
        for m in members:
            if not isinstance(m, Scatter):
                storage[m.name] = torch.empty(int(m.layout.storage_size()), dtype=m.layout.dtype)
        run_members(members, storage)
        for m in members:
            if isinstance(m, Scatter):
                assert storage[m.name] is storage[m.mutates]
                scatters += 1
    assert scatters == 1
    (out,) = s.output_names
    torch.testing.assert_close(storage[out].view(4, 3), fn(x, rows, v))


def test_aliases_nothing_reads_the_schema() -> None:
    """What both wrappers ask of an extern op: its result is memory of its own, and views passed
    to it are not seen after the call."""
    assert aliases_nothing(aten.mm.default) and aliases_nothing(aten.convolution.default)
    assert not aliases_nothing(aten.add_.Tensor)  # writes its first argument
    assert not aliases_nothing(aten.view.default)  # returns its argument's memory
    assert not aliases_nothing(aten.mm.out)  # writes out=
    assert not aliases_nothing(torch.mm)  # no aten overload: may alias, as far as a wrapper knows


class _KernelSteps(_Steps):
    """Kernel nodes through WrapperSteps' own step (Note [A kernel step in a wrapper]): the nodes
    named in ``declined`` were declined, every other kernel keeps ``scratch`` to itself."""

    def __init__(
        self, schedule: Scheduler, graph: GraphLowering, declined: set[str], scratch: set[str]
    ) -> None:
        super().__init__(schedule)
        self.graph = graph
        self.declined, self.scratch = declined, scratch

    kernel = WrapperSteps.kernel

    def kernel_scratch(self, node: BaseSchedulerNode) -> set[str] | None:
        return None if node.name in self.declined else self.scratch

    def place_member(self, buffer: Any, scratch: Any) -> list[str]:
        self.emit(f"place {buffer.name}")
        return [buffer.name] if buffer.name in scratch else []

    def call_kernel(self, node: BaseSchedulerNode, step: int) -> list[str]:
        self.emit(f"call {node.name} at {step}")
        return [f"tmp_{step}"]

    def fallback(self, node: BaseSchedulerNode, members: list[Any]) -> None:
        self.emit(f"interpret {[m.name for m in members]} on {list(self.touched_buffers(node))}")


def test_wrapper_steps_kernel_step_places_calls_or_interprets() -> None:
    """Note [A kernel step in a wrapper]: members placed (a scatter's name bound, not placed),
    then the call or, for a declined node, the interpreter over every buffer its members read or
    write; the temporaries deleted after: the kernel's scratch, or every member of a declined one."""

    def fn(x: Any, rows: Any, v: Any) -> Any:
        return aten.mul.Tensor(aten.index_put.default(aten.sin.default(x), [rows], v, True), 2)

    from kiln_loopir.testing import trace

    x, rows, v = torch.randn(4, 3), torch.tensor([0, 2, 2]), torch.randn(3, 3)
    graph = GraphLowering(trace(fn), [x, rows, v]).run()
    s = Scheduler(graph.operations, graph.name_to_buffer, output_buffer_names(graph.outputs), fusion=False)
    kernels = [(i, n) for i, n in enumerate(s.nodes) if not isinstance(n, ExternKernelSchedulerNode)]
    (with_scatter,) = [n for _, n in kernels if any(isinstance(m, Scatter) for m in n.members())]
    scatter = next(m for m in with_scatter.members() if isinstance(m, Scatter))
    reads = sorted(with_scatter.read_names() | with_scatter.write_names())
    (first_step, first), *_ = kernels  # sin(x), before the scatter
    assert first is not with_scatter
    first_members = [m.name for m in first.members()]

    steps = _KernelSteps(s, graph, declined={with_scatter.name}, scratch=set(first_members))
    steps.emit_steps()
    lines = steps.lines
    at = lines.index(f"{scatter.name} = {scatter.mutates}")
    others = [m.name for m in with_scatter.members() if m is not scatter]
    assert lines[at + 1 : at + 1 + len(others)] == [f"place {n}" for n in others]
    run = f"interpret {[m.name for m in with_scatter.members()]} on {[n for n in reads if n in graph.name_to_buffer]}"
    assert lines[at + 1 + len(others)] == run
    assert lines[at + 2 + len(others) : at + 2 + 2 * len(others)] == [f"del {n}" for n in others]
    assert f"place {scatter.name}" not in lines
    at = lines.index(f"call {first.name} at {first_step}")
    assert lines[at - len(first_members) : at] == [f"place {n}" for n in first_members]
    assert lines[at + 1 : at + 2 + len(first_members)] == [
        *(f"del {n}" for n in first_members),
        f"del tmp_{first_step}",
    ]


def test_members_runner_runs_a_declined_kernel_in_the_storage_it_is_given() -> None:
    """What both wrappers bind for a declined kernel: CPU storage is written in place (the
    wrapper's variables see the result), and a scatter's name is bound as in run_members."""
    from kiln_loopir.interpret import members_runner
    from kiln_loopir.testing import trace

    def fn(x: Any, rows: Any, v: Any) -> Any:
        return aten.mul.Tensor(aten.index_put.default(aten.sin.default(x), [rows], v, True), 2)

    x, rows, v = torch.randn(4, 3), torch.tensor([0, 2, 2]), torch.randn(3, 3)
    graph = GraphLowering(trace(fn), [x, rows, v]).run()
    s = Scheduler(graph.operations, graph.name_to_buffer, output_buffer_names(graph.outputs))
    storage = {
        spec.name: t.reshape(-1).clone() for spec, t in zip(graph.graph_inputs, (x, rows, v), strict=True)
    }
    for node in s.nodes:
        members = node.members()
        given = {
            m.name: torch.empty(int(m.layout.storage_size()), dtype=m.layout.dtype)
            for m in members
            if not isinstance(m, Scatter)
        }
        storage |= given
        members_runner(members)(dict(storage))  # a fresh dict, as the wrapper builds one per call
        assert all(storage[k] is t for k, t in given.items())  # written in place, not replaced
        for m in members:
            if isinstance(m, Scatter):  # the wrapper's alias_scatter
                storage[m.name] = storage[m.mutates]
    (out,) = s.output_names
    torch.testing.assert_close(storage[out].view(4, 3), fn(x, rows, v))


def test_input_checks_compare_strides_of_dims_of_more_than_one_element() -> None:
    """Note [Strides of size-one dims of inputs]: a (1, C, 1, 1) input is checked on its one
    dim of C elements; every stride when ``lean`` is off; the frame guard's inputs on their
    storage offset only."""
    from kiln_loopir.layout import FixedLayout

    class Checks(_Steps):
        def __init__(self, lean: bool) -> None:
            self.lean, self.consts, self.namespace = lean, 0, {}

    layout = FixedLayout(torch.device("cpu"), torch.float32, [1, 8, 1, 1], [8, 1, 1, 1], 0)
    conform = "x = _conform(x, (1, 8, 1, 1), (8, 1, 1, 1), 0, dtype=_torch.float32, name='x')"
    lean = Checks(lean=True)
    assert lean.static_input_check("x", layout, guarded=False) == (
        f"if x.stride(1) != 1 or x.storage_offset() != 0 or x.shape != (1, 8, 1, 1) "
        f"or x.dtype is not _torch.float32: {conform}"
    )
    assert lean.static_input_check("x", layout, guarded=True) == f"if x.storage_offset() != 0: {conform}"
    full = Checks(lean=False)
    assert full.static_input_check("x", layout, guarded=False).startswith("if x.stride() != (8, 1, 1, 1) or ")
    assert lean.stride_check("t", (1, 1), (2, 1)) == ""
    assert lean.stride_check("t", (4, 1, 3), (3, 3, 1), differ=False) == "_c0(t.stride()) == (3, 1) and "
    assert lean.namespace["_c0"]((7, 8, 9)) == (7, 9)
