"""Scheduler units: groups, can_fuse, cycles, vetoes, the greedy order, DCE and the buffer plan."""

from __future__ import annotations

from typing import Any

import pytest
import sympy
import torch
from helpers import aten, check, make, trace

from kiln_loopir import GraphLowering, Scheduler
from kiln_loopir.interpret import InterpretBackend
from kiln_loopir.scheduler import (
    BaseSchedulerNode,
    ExternKernelSchedulerNode,
    FusedSchedulerNode,
    SchedulerNode,
    groups_compatible,
    output_buffer_names,
)

Int = sympy.Integer


def schedule(fn: Any, *inputs: Any, fusion: bool = True, veto: Any = None) -> Scheduler:
    graph = GraphLowering(trace(fn), list(inputs), fusion=fusion).run()
    return Scheduler(
        graph.operations,
        graph.name_to_buffer,
        output_buffer_names(graph.outputs),
        fusion=fusion,
        can_fuse_hook=veto,
    )


def by_name(s: Scheduler) -> dict[str, BaseSchedulerNode]:
    return {m.name: m for n in s.nodes for m in n.get_nodes()}


def test_groups_compatible() -> None:
    assert groups_compatible((Int(64), Int(1)), (Int(64), Int(1)))
    assert not groups_compatible((Int(64), Int(1)), (Int(32), Int(1)))
    assert groups_compatible((Int(8), Int(8)), (Int(64), Int(1)))  # pointwise inside the reduction loop
    assert groups_compatible((Int(8), Int(8)), (Int(8), Int(1)))  # epilogue
    assert not groups_compatible((Int(8), Int(8)), (Int(16), Int(1)))
    assert groups_compatible((Int(8), Int(8)), (Int(8), Int(8)))
    assert not groups_compatible((Int(8), Int(8)), (Int(4), Int(16)))


def _two_outputs(x: Any) -> Any:
    y = aten.sin.default(x)
    return y, aten.add.Tensor(y, 1)


def _transposed_read(x: Any) -> Any:
    y = aten.sin.default(x)
    return y, aten.add.Tensor(aten.t.default(y), 1)


def test_can_fuse_aligned_producer_consumer() -> None:
    s = schedule(_two_outputs, make((8, 8)), fusion=False)
    a, b = s.nodes
    assert s.can_fuse(a, b)
    assert not s.can_fuse(b, a)  # b is not an ancestor of a... but a is b's producer: order matters
    assert not s.can_fuse(a, a)


def test_cannot_fuse_transposed_read() -> None:
    s = schedule(_transposed_read, make((8, 8)), fusion=False)
    a, b = s.nodes
    assert not s.can_fuse(a, b)
    # fused, sin(x) inlines into both outputs, which then share only the input: horizontal fusion
    assert check(_transposed_read, make((8, 8))).stats.kernels == 1


def test_reduction_then_broadcast_read_fuses() -> None:
    def fn(x: Any) -> Any:
        m = aten.amax.default(x, [1], True)
        return aten.sub.Tensor(x, m)

    s = schedule(fn, make((8, 16)), fusion=False)
    red, point = s.nodes
    assert isinstance(red, SchedulerNode) and red.is_reduction()
    assert s.can_fuse(red, point)


def test_reduction_read_along_reduced_dim_does_not_fuse() -> None:
    def fn(x: Any) -> Any:
        m = aten.amax.default(x, [0], True)  # reduced over rows, read per column
        return aten.sub.Tensor(x, m)

    s = schedule(fn, make((8, 16)), fusion=False)
    red, point = s.nodes
    assert not s.can_fuse(red, point)


def test_fusion_through_extern_would_create_cycle() -> None:
    def fn(x: Any, w: Any) -> Any:
        a = aten.sin.default(x)
        m = aten.mm.default(a, w)
        return a, aten.add.Tensor(aten.cos.default(x), m)

    s = schedule(fn, make((8, 8)), make((8, 8)))
    a, extern, c = s.nodes  # sin(x) -> mm -> cos(x) + mm: a and c share x, but not a kernel
    assert isinstance(extern, ExternKernelSchedulerNode)
    assert s.will_fusion_create_cycle(a, c)
    assert check(fn, make((8, 8)), make((8, 8))).stats.kernels == 2


def test_backend_veto_blocks_fusion() -> None:
    class NoReductionFusion(InterpretBackend):
        def can_fuse(self, node1: BaseSchedulerNode, node2: BaseSchedulerNode) -> bool:
            return not (node1.is_reduction() or node2.is_reduction())

    def fn(x: Any) -> Any:
        return aten.sum.dim_IntList(aten.exp.default(x), [1], True), aten.sin.default(aten.exp.default(x))

    from kiln_loopir import compile_graph

    x = make((8, 16))
    vetoed = compile_graph(trace(fn), [x], backend=NoReductionFusion())
    assert vetoed.stats.kernels == 2
    assert compile_graph(trace(fn), [x]).stats.kernels == 1  # exp(x) feeds both: one loop nest
    veto_all = compile_graph(trace(_two_outputs), [x], backend=NoReductionFusion())
    assert veto_all.stats.kernels == 1


def test_greedy_prefers_more_bytes_saved() -> None:
    # b can join a (sharing a 64x64 buffer) or c (sharing a 64-element one), not both
    def fn(x: Any, v: Any) -> Any:
        a = aten.sin.default(x)
        b = aten.add.Tensor(a, v)
        return a, b, aten.mul.Tensor(v, 2)

    s = schedule(fn, make((64, 64)), make((64,)), fusion=False)
    a, b, c = s.nodes
    assert s.score_fusion(a, b) > s.score_fusion(b, c)
    fused = schedule(fn, make((64, 64)), make((64,)))
    groups = [sorted(m.name for m in n.get_nodes()) for n in fused.nodes]
    assert sorted([a.name, b.name]) in groups


def test_score_prefers_proximity_on_ties() -> None:
    def fn(x: Any) -> Any:
        return aten.sin.default(x), aten.cos.default(x), aten.tan.default(x)

    s = schedule(fn, make((8, 8)), fusion=False)
    a, b, c = s.nodes
    assert s.score_fusion(a, b) > s.score_fusion(a, c)


def test_dead_code_is_removed() -> None:
    def fn(x: Any) -> Any:
        aten.cumsum.default(x, 0)  # unused extern
        aten.sum.dim_IntList(x, [0])  # unused reduction
        return aten.sin.default(x)

    s = schedule(fn, make((8, 8)))
    assert len(s.nodes) == 1


def test_topological_order_and_fused_members() -> None:
    def fn(x: Any, w: Any) -> Any:
        a = aten.relu.default(aten.mm.default(aten.sin.default(x), w))
        return aten.mm.default(a, w)

    s = schedule(fn, make((8, 8)), make((8, 8)))
    seen: set[str] = set()
    for node in s.nodes:
        for r in node.read_names():
            writer = s.writer.get(r)
            assert writer is None or writer is node or writer.names() <= seen
        seen |= node.names()
    assert all(not isinstance(n, FusedSchedulerNode) or len(n.snodes) > 1 for n in s.nodes)


def test_members_are_the_computed_buffers_of_a_node() -> None:
    """What both code generators build a kernel from: a kernel node's ComputedBuffers in run
    order and what each reads; an extern node has none."""

    def fn(x: Any, w: Any, v: Any) -> Any:
        a = aten.mm.default(aten.sin.default(x), w)
        return aten.mm.default(aten.exp.default(a), v), aten.relu.default(a)

    s = schedule(fn, make((8, 8)), make((8, 4)), make((4, 2)))
    fused = [n for n in s.nodes if isinstance(n, FusedSchedulerNode)]
    externs = [n for n in s.nodes if isinstance(n, ExternKernelSchedulerNode)]
    assert fused and externs
    for node in fused:
        assert node.members() == [m.node for m in node.snodes]  # type: ignore[attr-defined]
        assert node.member_reads() == [m.read_names() for m in node.snodes]
    for node in s.nodes:
        if isinstance(node, SchedulerNode):
            assert node.members() == [node.node] and node.member_reads() == [node.read_names()]
    assert all(e.members() == [] and e.member_reads() == [] for e in externs)


def test_internal_buffers_are_not_allocated() -> None:
    def fn(x: Any) -> Any:
        return aten._softmax.default(x, 1, False)

    s = schedule(fn, make((8, 16)))
    internal = [name for names in s.plan.internal.values() for name in names]
    assert len(internal) == 2  # the row max and the row sum
    assert set(internal).isdisjoint(s.plan.allocate)
    assert torch.is_tensor(check(fn, make((8, 16)))(make((8, 16))))


def test_loop_ranges_merge_contiguous_dims() -> None:
    def contiguous(x: Any) -> Any:
        return aten.sin.default(x)

    def reduction(x: Any) -> Any:
        return aten.sum.dim_IntList(x, [2, 3])

    (node,) = schedule(contiguous, make((4, 8, 2))).nodes
    assert isinstance(node, SchedulerNode)
    assert node.loop_ranges()[:2] == ((Int(64),), ())
    (node,) = schedule(contiguous, make((8, 4)).t()).nodes  # reads transposed, writes contiguous
    assert node.loop_ranges()[:2] == ((Int(4), Int(8)), ())
    (red,) = schedule(reduction, make((2, 3, 4, 5))).nodes
    assert isinstance(red, SchedulerNode)
    assert red.loop_ranges()[:2] == ((Int(6),), (Int(20),))


def _mm_epilogue(x: Any, w: Any, b: Any) -> Any:
    # the GEMM's inputs die at the GEMM unless the template node keeps them; relu(x) is computed
    # after the GEMM in the original order and could take x's memory otherwise
    y = aten.mm.default(aten.sin.default(x), w)
    return aten.relu.default(aten.add.Tensor(y, b))


def _mm_two_readers(x: Any, w: Any, b: Any) -> Any:
    y = aten.mm.default(x, w)  # read by a kernel and by another GEMM
    return aten.relu.default(y), aten.mm.default(y, aten.t.default(y))


def _template_schedule(fn: Any, accept: Any) -> Scheduler:
    inputs = [torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)]
    graph = GraphLowering(trace(fn), inputs).run()
    return Scheduler(
        graph.operations, graph.name_to_buffer, output_buffer_names(graph.outputs), template_hook=accept
    )


def test_template_nodes() -> None:
    from kiln_loopir.scheduler import TemplateSchedulerNode

    offered: list[tuple[str, str]] = []

    def accept(extern: ExternKernelSchedulerNode, kernel: BaseSchedulerNode) -> bool:
        offered.append((extern.name, kernel.name))
        return True

    s = _template_schedule(_mm_epilogue, accept)
    templates = [n for n in s.nodes if isinstance(n, TemplateSchedulerNode)]
    assert len(offered) == 1 and len(templates) == 1
    node = templates[0]
    assert node.get_nodes()[0] is node.extern and isinstance(node.extern, ExternKernelSchedulerNode)
    assert [m.name for m in node.get_nodes()[1:]] == [m.name for m in node.epilogue.get_nodes()]
    # the product is the extern's result: never allocated, and nothing reads it outside the node
    product = node.extern.node.outputs[0].name
    assert product not in s.plan.allocate
    # sin(x), the GEMM's input, lives until the template node ran
    step = s.nodes.index(node)
    sin = next(n for n in s.nodes if not isinstance(n, TemplateSchedulerNode))
    assert all(sin.name not in s.plan.free_after.get(i, []) for i in range(step))
    # a backend that declines, a product with two readers: the plain schedule
    assert not any(
        isinstance(n, TemplateSchedulerNode)
        for n in _template_schedule(_mm_epilogue, lambda e, k: False).nodes
    )
    offered.clear()
    two = _template_schedule(_mm_two_readers, accept)
    assert offered == [] and not any(isinstance(n, TemplateSchedulerNode) for n in two.nodes)


def test_a_run_time_assertion_is_kept_although_nothing_reads_it() -> None:
    # Note [Extern calls kept for their effect]: dead-code elimination dropped it before
    def fn(x: torch.Tensor) -> Any:
        aten._assert_async.msg(aten.all.default(aten.gt.Scalar(x, -100)), "x below -100")
        return (aten.mul.Tensor(x, 2),)

    compiled = check(fn, make((4,)))
    assert compiled.stats.extern_ops == ("_assert_async.msg",)
    with pytest.raises(RuntimeError, match="x below -100"):
        compiled(torch.full((4,), -200.0))


def _far_output(x: Any, w: Any) -> Any:
    # a row reduction of x + 1 first, a chain of 70 GEMMs, then x + 1 again as a graph output
    # only (a training forward's saved residual sum): the two kernels share x, 71 nodes apart
    s = aten.sum.dim_IntList(aten.add.Tensor(x, 1.0), [1])
    h = w
    for _ in range(70):
        h = aten.mm.default(h, w)
    return s, h, aten.add.Tensor(x, 1.0)


@pytest.mark.parametrize("far", [True, False])
def test_far_output_fuses_with_distant_reader_of_its_inputs(far: bool) -> None:
    # Note [Outputs fused across the graph]: beyond MAX_HORIZONTAL_DISTANCE a kernel that writes
    # graph outputs only still fuses with the kernel that reads the same inputs
    x, w = make((8, 16)), make((4, 4), low=-0.5, high=0.5)
    compiled = check(_far_output, x, w, options={"far_output_fusion": far, "cse": False})
    assert compiled.stats.kernels == (1 if far else 2)


def test_far_fusion_not_for_a_kernel_others_read() -> None:
    # the late kernel's result feeds another kernel: hoisting it would lengthen that buffer's
    # life, so the distance limit holds
    def fn(x: Any, w: Any) -> Any:
        s = aten.sum.dim_IntList(aten.add.Tensor(x, 1.0), [1])
        h = w
        for _ in range(70):
            h = aten.mm.default(h, w)
        late = aten.add.Tensor(x, 1.0)
        return s, h, late, aten.mm.default(late, aten.t.default(late))

    s = schedule(fn, make((8, 16)), make((4, 4)))
    assert len(s.kernels()) == 2


def _read_late(x: Any, w: Any) -> Any:
    # a value computed from the inputs at the graph's start (a backward's recomputed forward
    # value; a reduction, so it is realized where the graph computes it) that only the last
    # GEMM reads, after a chain of GEMMs that do not need it
    a = aten.sum.dim_IntList(aten.sin.default(x), [1], True)
    h = w
    for _ in range(4):
        h = aten.mm.default(h, w)
    return (aten.mm.default(h, a),)


@pytest.mark.parametrize("late", [True, False])
def test_late_placement_runs_a_kernel_before_its_first_reader(late: bool) -> None:
    # Note [Kernels placed where they are first needed]
    x, w = make((4, 4)), make((4, 4), low=-0.5, high=0.5)
    compiled = check(_read_late, x, w, options={"late_placement": late})
    kinds = [type(n) for n in compiled.schedule.nodes]
    kernel = next(i for i, k in enumerate(kinds) if k is not ExternKernelSchedulerNode)
    # late: the sum runs between the chain and the GEMM that reads it; else first
    assert kernel == (len(kinds) - 2 if late else 0)


def test_late_placement_keeps_outputs_and_externs_in_the_graph_order() -> None:
    # a kernel writing a graph output stays where the graph computes it; extern calls keep
    # their order although none of them waits for the others
    def fn(x: Any, w: Any) -> Any:
        s = aten.sum.dim_IntList(x, [1])  # a reduction: realized where the graph computes it
        m1 = aten.mm.default(w, w)
        m2 = aten.mm.default(x, w)
        return m2, s, m1

    s = schedule(fn, make((4, 4)), make((4, 4)))
    names = [type(n).__name__ for n in s.nodes]
    assert names == ["SchedulerNode", "ExternKernelSchedulerNode", "ExternKernelSchedulerNode"]
    assert len(set(s.nodes[1].node.input_names())) == 1  # w @ w first, then x @ w


def test_a_dead_index_write_keeps_its_bounds_check() -> None:
    # Note [Dead index writes keep their bounds check]: `x.index_put_(i, v)` then `x.zero_()`
    # (functionalized: the copy reads only the index_put's shape); eager raises IndexError for
    # an index out of range, and the dropped scatter returned a value (test_alias_fuzz.py seed
    # 30289). Kept, its buffer freed once: two later buffers had taken over its memory
    def fn(x: torch.Tensor, i: torch.Tensor) -> Any:
        put = aten.index_put.default(x, [i], aten.full.default([1, 5], 4.0))
        zeros = aten.copy.default(put, aten.full_like.default(put, 0))
        return zeros, aten.add.Tensor(zeros, 1)

    x = torch.randn(5, 5)
    compiled = check(fn, x, torch.tensor([4]))
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([7]))


def _counters(a: Any, b: Any, c: Any, x: Any) -> Any:
    # three BatchNorm-style step counters (one element each, no buffer in common) and a large
    # kernel of its own
    return aten.add.Tensor(a, 1), aten.add.Tensor(b, 1), aten.add.Tensor(c, 1), aten.relu.default(x)


@pytest.mark.parametrize("tiny", [True, False])
def test_tiny_kernels_fuse_without_a_shared_buffer(tiny: bool) -> None:
    # Note [Tiny kernels fuse without a shared buffer]: the three counters are one kernel; the
    # large kernel stays apart (another iteration space)
    counters = [torch.tensor(n) for n in (3, 5, 7)]
    compiled = check(_counters, *counters, make((256,)), options={"tiny_fusion": tiny})
    assert compiled.stats.kernels == (2 if tiny else 4)


def test_tiny_fusion_keeps_dependent_and_larger_kernels_apart() -> None:
    def fn(a: Any, b: Any) -> Any:
        first = aten.add.Tensor(a, 1)
        # reads first: legal only vertically, and aligned, so it fuses anyway
        second = aten.mul.Tensor(first, 2)
        return second, aten.add.Tensor(b, 1)

    compiled = check(fn, make((8,)), make((128,)))
    assert compiled.stats.kernels == 2  # 128 elements is no tiny kernel
