"""A kernel's output in place of an input that dies in it (Note [A kernel's output in place of an
input that dies in it] in scheduler.py): values equal eager's, and the buffer is taken over only
where the rule allows."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from helpers import aten, check, make

from kiln_loopir import CompiledGraph
from kiln_loopir.interpret import InterpretBackend
from kiln_loopir.scheduler import ExternKernelSchedulerNode, MemoryDep


def _taken(compiled: CompiledGraph) -> dict[str, str]:
    return dict(compiled.schedule.plan.inplace)


def _mm_relu_mm(a: Any, b: Any, c: Any) -> Any:
    h = aten.mm.default(a, b)
    return aten.mm.default(aten.relu.default(h), c)


def _args() -> list[Any]:
    return [make((16, 32)), make((32, 32)), make((32, 8))]


def test_extern_result_taken_over() -> None:
    compiled = check(_mm_relu_mm, *_args())
    taken = _taken(compiled)
    assert len(taken) == 1
    gemm = compiled.schedule.nodes[0]
    assert isinstance(gemm, ExternKernelSchedulerNode)
    assert list(taken.values()) == [gemm.node.outputs[0].name]


def test_option_off() -> None:
    compiled = check(_mm_relu_mm, *_args(), options={"inplace_reuse": False})
    assert _taken(compiled) == {}


def _kernel_result_taken_over(a: Any, b: Any) -> Any:
    y = aten.sin.default(a)  # read by the GEMM, then by the kernel after it: a buffer of its own
    p = aten.mm.default(y, b)  # [16, 8]: not y's size
    return aten.mul.Tensor(aten.cos.default(y), aten.slice.Tensor(p, 1, 0, 1))


def test_kernel_result_taken_over() -> None:
    compiled = check(_kernel_result_taken_over, make((16, 16)), make((16, 8)))
    sin = compiled.schedule.nodes[0]  # the sine's kernel, before the GEMM
    assert not isinstance(sin, ExternKernelSchedulerNode)
    assert list(_taken(compiled).values()) == [sin.name]


def _graph_input(x: Any, b: Any) -> Any:
    return aten.mm.default(aten.relu.default(x), b)


def test_not_a_graph_input() -> None:
    assert _taken(check(_graph_input, make((16, 16)), make((16, 16)))) == {}


def _read_again_later(a: Any, b: Any, c: Any) -> Any:
    h = aten.mm.default(a, b)
    r = aten.mm.default(aten.relu.default(h), c)
    return aten.add.Tensor(r, aten.mm.default(h, c))  # h read by a GEMM after the ReLU


def _first_gemm(compiled: CompiledGraph) -> str:
    gemm = compiled.schedule.nodes[0]
    assert isinstance(gemm, ExternKernelSchedulerNode)
    return gemm.node.outputs[0].name


def test_not_read_again_later() -> None:
    compiled = check(_read_again_later, *_args())
    assert _first_gemm(compiled) not in _taken(compiled).values()  # the final add takes another


def _source_is_output(a: Any, b: Any, c: Any) -> Any:
    h = aten.mm.default(a, b)
    return h, aten.mm.default(aten.relu.default(h), c)


def test_not_a_graph_output() -> None:
    assert _taken(check(_source_is_output, *_args())) == {}


def _source_is_view_base(a: Any, b: Any, c: Any) -> Any:
    h = aten.mm.default(a, b)
    return aten.t.default(h), aten.mm.default(aten.relu.default(h), c)


def test_not_a_view_base_of_an_output() -> None:
    assert _taken(check(_source_is_view_base, *_args())) == {}


def _transposed(a: Any, b: Any, c: Any) -> Any:
    h = aten.mm.default(a, b)
    # the sum is laid out as ``a`` (rows), so it reads ``h`` down its columns
    return aten.mm.default(aten.add.Tensor(a, aten.relu.default(aten.t.default(h))), c)


def _shifted(a: Any, b: Any, c: Any) -> Any:
    h = aten.mm.default(a, b)
    below = aten.constant_pad_nd.default(aten.slice.Tensor(h, 0, 1, 32), [0, 0, 0, 1])  # row i+1
    return aten.mm.default(aten.relu.default(below), c)


@pytest.mark.parametrize("fn", [_transposed, _shifted], ids=["transposed", "shifted"])
def test_not_read_elsewhere(fn: Any) -> None:
    a, b = make((32, 32)), make((32, 32))
    compiled = check(fn, a, b, make((32, 8)))
    gemm = _first_gemm(compiled)
    (kernel,) = [n for n in compiled.schedule.nodes if gemm in n.read_names()]
    assert all(isinstance(d, MemoryDep) for d in kernel.reads)  # a kernel, not an extern call
    assert gemm not in _taken(compiled).values()


def _two_readers(a: Any, b: Any, c: Any) -> Any:
    h = aten.mm.default(a, b)
    r = aten.relu.default(h)
    s = aten.sigmoid.default(h)
    return aten.mm.default(r, c), aten.mm.default(s, c)


def test_read_by_another_kernel_after() -> None:
    """Unfused, the second reader takes the GEMM's result over and the first does not; fused,
    the member that reads it last does, after the other member's read of the same element."""
    compiled = check(_two_readers, *_args(), fusion=False)
    taken = _taken(compiled)
    assert len(taken) == 1
    steps = {m.name: i for i, n in enumerate(compiled.schedule.nodes) for m in n.get_nodes()}
    (name,) = taken
    readers = [m for n in compiled.schedule.nodes for m in n.get_nodes() if taken[name] in m.read_names()]
    assert steps[name] == max(steps[m.name] for m in readers)
    fused = check(_two_readers, *_args())
    assert len(_taken(fused)) == 1


def _reduction(a: Any, b: Any, c: Any) -> Any:
    h = aten.mm.default(a, b)
    shifted = aten.sub.Tensor(h, aten.amax.default(h, [1], True))
    return aten.mm.default(aten.exp.default(shifted), c)


def test_not_in_a_reduction_kernel() -> None:
    compiled = check(_reduction, make((32, 32)), make((32, 32)), make((32, 8)))
    assert _taken(compiled) == {}


def test_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.schedule"):
        compiled = check(_mm_relu_mm, *_args())
    ((name, source),) = _taken(compiled).items()
    assert f"in place: {name} takes over {source}" in caplog.text


class _NoInplace(InterpretBackend):
    inplace_buffers = False


def test_backend_without_the_capability() -> None:
    assert _taken(check(_mm_relu_mm, *_args(), backend=_NoInplace())) == {}
