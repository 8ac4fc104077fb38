"""GraphLowering on graphs built by hand: constants, metadata, output structures."""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
import torch.fx
from helpers import assert_same, aten, check, make

from kiln_loopir import compile_graph
from kiln_loopir.graph import GraphLowering
from kiln_loopir.ir import ComputedBuffer


def _graph_module(graph: torch.fx.Graph, **attrs: torch.Tensor) -> torch.fx.GraphModule:
    root = torch.nn.Module()
    for name, value in attrs.items():
        root.register_buffer(name, value)
    return torch.fx.GraphModule(root, graph)


def test_hand_built_graph_with_constant_and_multi_output_op() -> None:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("weight")
    h = g.call_function(aten.add.Tensor, (x, w))
    mx = g.call_function(aten.max.dim, (h, 1))
    values = g.call_function(operator.getitem, (mx, 0))
    indices = g.call_function(operator.getitem, (mx, 1))
    g.output([values, indices, x])
    gm = _graph_module(g, weight=make((4, 6)))
    inp = make((4, 6))
    compiled = check(gm, inp)
    out = compiled(inp)
    assert isinstance(out, list) and out[2] is not None
    assert out[2].data_ptr() == inp.data_ptr()  # an input returned as is: no copy


def test_meta_val_on_nodes_is_used() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return aten.exp.default(aten.neg.default(x))

    gm = torch.fx.symbolic_trace(fn)
    example = make((3, 5))
    for node in gm.graph.nodes:
        if node.op in {"placeholder", "call_function"}:
            node.meta["val"] = torch.empty(3, 5, device="meta")
    assert check(gm, example).stats.kernels == 1


def test_same_value_returned_twice_and_tuple_structure() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        y = aten.sigmoid.default(x)
        return y, (y, aten.sum.default(y))

    compiled = check(fn, make((5, 5)))
    out = compiled(make((5, 5)))
    assert isinstance(out, tuple) and isinstance(out[1], tuple)
    assert compiled.stats.buffers == 2


def test_data_dependent_extern_output_shape_from_example() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return aten.nonzero.default(aten.gt.Scalar(x, 0))

    x = torch.tensor([[1.0, -1.0], [2.0, 3.0]])
    compiled = compile_graph(torch.fx.symbolic_trace(fn), [x])
    assert_same(compiled(x), fn(x))
    assert compiled.stats.extern_calls == 1
    with pytest.raises(RuntimeError, match="depends on the data"):
        compiled(torch.tensor([[1.0, -1.0], [-2.0, 3.0]]))


def test_created_tensors_live_on_the_device_they_ask_for() -> None:
    # A creation op's device argument wins over the graph's device (the device of its inputs);
    # "meta" stands in here for a CUDA tensor created in a graph whose inputs are on the CPU.
    def f(x: torch.Tensor) -> Any:
        meta = torch.device("meta")
        return (
            aten.add.Tensor(x, 1),
            aten.arange.default(6, dtype=torch.float32, device=meta),
            aten.full.default([2, 3], 1.5, device=meta, dtype=torch.float32),
            aten.zeros_like.default(x, device=meta),
            aten.ones_like.default(x),
        )

    graph = GraphLowering(torch.fx.symbolic_trace(f), [torch.randn(3)]).run()
    assert [o.get_device().type for o in graph.outputs] == ["cpu", "meta", "meta", "meta", "cpu"]


def test_a_graph_without_inputs_computes_where_its_creation_ops_ask() -> None:
    from kiln_loopir import graph_device as _graph_device

    def creating(device: torch.device) -> torch.fx.GraphModule:
        g = torch.fx.Graph()
        made = g.call_function(aten.arange.start_step, (0, 5, 1), {"dtype": torch.float32, "device": device})
        g.output(g.call_function(aten.mul.Tensor, (made, 2)))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    # A CUDA arange in a graph without inputs must not be computed (and allocated) on the CPU.
    assert _graph_device(creating(torch.device("cuda", 0)), []) == torch.device("cuda", 0)
    assert _graph_device(creating(torch.device("meta")), []) == torch.device("cpu")
    assert _graph_device(creating(torch.device("cuda", 0)), [torch.zeros(1)]) == torch.device("cpu")


def test_an_output_on_another_device_than_the_graph_is_refused() -> None:
    # Note [One device per graph]: a CUDA value returned by a graph of CPU inputs would come back
    # on the CPU; the graph is refused (the umbrella then runs it eagerly)
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln_loopir import DeviceMismatch

    g = torch.fx.Graph()
    x = g.placeholder("x")
    on_cpu = g.call_function(aten.add.Tensor, (x, 1))
    moved = g.call_function(aten._to_copy.default, (on_cpu,), {"device": torch.device("cuda", 0)})
    x.meta["val"], on_cpu.meta["val"] = torch.zeros(3), torch.zeros(3)
    with FakeTensorMode():
        moved.meta["val"] = torch.empty(3, device="cuda")
    g.output((on_cpu, moved))
    with pytest.raises(DeviceMismatch, match="lives on cuda:0 in eager, the graph computes on cpu"):
        compile_graph(torch.fx.GraphModule(torch.nn.Module(), g), [torch.zeros(3)])
    # values traced on another device than the inputs given say nothing of where the graph runs
    with FakeTensorMode():
        x.meta["val"], on_cpu.meta["val"] = torch.empty(3, device="cuda"), torch.empty(3, device="cuda")
    traced_elsewhere = compile_graph(torch.fx.GraphModule(torch.nn.Module(), g), [torch.zeros(3)])
    assert [t.device.type for t in traced_elsewhere(torch.ones(3))] == ["cpu", "cpu"]
    # the same value used inside the graph only is computed on the graph's device
    g2 = torch.fx.Graph()
    x2 = g2.placeholder("x")
    made = g2.call_function(aten.full.default, ([3], 2.0), {"device": torch.device("cuda", 0)})
    with FakeTensorMode():
        made.meta["val"] = torch.empty(3, device="cuda")
    total = g2.call_function(aten.add.Tensor, (x2, made))
    x2.meta["val"], total.meta["val"] = torch.zeros(3), torch.zeros(3)
    g2.output((total,))
    compiled = compile_graph(torch.fx.GraphModule(torch.nn.Module(), g2), [torch.zeros(3)])
    assert_same(compiled(torch.ones(3)), (torch.full((3,), 3.0),))


def test_complex_values_run_as_extern_kernels() -> None:
    """Note [Complex values run as extern kernels]: no kernel reads or writes a complex buffer;
    real values around them are still lowered and fused."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        z = aten._to_copy.default(aten.sin.default(x), dtype=torch.complex64)
        w = aten.mul.Tensor(aten.view_as_complex.default(y), z)
        return aten.add.Tensor(aten.abs.default(w), 1.0), aten.slice.Tensor(w, 0, 1, 3)

    compiled = check(fn, make((4,)), make((4, 2)))
    ops = compiled.graph.operations
    kernels = [op for op in ops if isinstance(op, ComputedBuffer)]
    assert kernels and all(not op.get_dtype().is_complex for op in kernels)  # sin, then abs + 1
    assert "abs.default" in " ".join(compiled.stats.extern_ops)


def test_a_graph_of_meta_inputs_computes_where_its_meta_says() -> None:
    """Note [The device of a graph of meta inputs]: the key names the device of a graph traced on
    meta tensors; inputs on a real device decide for themselves."""
    from kiln_loopir.graph import GRAPH_DEVICE, graph_device

    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.relu.default(x) * 2)
    meta = [torch.empty(3, device="meta")]
    assert graph_device(gm, meta) == torch.device("cpu")
    gm.meta[GRAPH_DEVICE] = "cuda:1"
    assert graph_device(gm, meta) == torch.device("cuda:1")
    assert graph_device(gm, []) == torch.device("cuda:1")
    assert graph_device(gm, [torch.empty(3)]) == torch.device("cpu")
