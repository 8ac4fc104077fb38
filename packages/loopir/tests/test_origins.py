"""Note [Origins]: which fx nodes each buffer computes, and the kernel names and comments from them."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
import torch.fx
from helpers import aten, check, make

from kiln_loopir import kernel_name, source_comment
from kiln_loopir.ir import ComputedBuffer
from kiln_loopir.origins import KIND, Origin, op_name, where


def _kernels(compiled: Any) -> list[list[ComputedBuffer]]:
    """The ComputedBuffer members of each kernel of the schedule, in order."""
    out = []
    for node in compiled.schedule.nodes:
        members = [b for m in node.get_nodes() if isinstance(b := getattr(m, "node", None), ComputedBuffer)]
        if members:
            out.append(members)
    return out


def _ops(members: list[ComputedBuffer]) -> set[str]:
    return {o.op for m in members for o in m.data.origins}


def test_inlined_pointwise_ops_are_origins_of_the_buffer_they_end_in() -> None:
    def fn(x: Any, y: Any) -> Any:
        return aten.relu.default(aten.add.Tensor(aten.sin.default(x), y))

    [members] = _kernels(check(fn, make((8, 16)), make((16,))))
    assert _ops(members) == {"sin", "add", "relu"}
    assert {o.node for m in members for o in m.data.origins} == {"sin_default", "add_tensor", "relu_default"}


def test_views_are_origins_and_a_realized_input_carries_nothing() -> None:
    def fn(x: Any) -> Any:
        s = aten.sum.dim_IntList(aten.exp.default(x), [1])  # realized: a reduction
        return aten.mul.Tensor(aten.view.default(s, [2, 4]), 2.0)

    kernels = _kernels(check(fn, make((8, 32)), fusion=False))
    assert [_ops(k) for k in kernels] == [{"exp"}, {"sum"}, {"view", "mul"}]
    [fused] = _kernels(check(fn, make((8, 32))))
    assert _ops(fused) == {"exp", "sum", "view", "mul"}


def test_fused_kernel_name_lists_sorted_deduplicated_ops_then_step() -> None:
    def fn(x: Any) -> Any:
        y = aten.mul.Tensor(aten.mul.Tensor(x, 2.0), x)
        return aten.sum.dim_IntList(aten.exp.default(y), [1])

    compiled = check(fn, make((8, 32)))
    [members] = _kernels(compiled)
    assert kernel_name("cpp", members, 3) == "cpp_fused_exp_mul_sum_3"
    assert kernel_name(f"triton_{KIND}", members, 0) == "triton_{kind}_fused_exp_mul_sum_0"


def test_names_are_identifiers_unique_and_stable() -> None:
    def fn(x: Any, y: Any) -> Any:
        a = aten.sum.dim_IntList(aten._to_copy.default(x, dtype=torch.float64), [1])
        b = aten.amax.default(aten.sub.Tensor(x, y), [0])
        return a, aten.mul.Tensor(b, 3.0), aten.cos.default(x)

    def names() -> list[str]:
        compiled = check(fn, make((8, 32)), make((8, 32)), fusion=False)
        return [kernel_name("cpp", k, step) for step, k in enumerate(_kernels(compiled))]

    first = names()
    assert all(n.isidentifier() for n in first), first
    assert len(set(first)) == len(first) > 1
    assert any("_to_copy" in n for n in first)
    assert names() == first


def test_long_fusions_cap_the_ops_in_the_name() -> None:
    def fn(x: Any) -> Any:
        y = aten.sin.default(x)
        for op in (aten.cos, aten.exp, aten.abs, aten.neg, aten.relu, aten.sigmoid, aten.tanh):
            y = op.default(y)
        return y

    [members] = _kernels(check(fn, make((4, 8))))
    name = kernel_name("cpp", members, 0)
    assert name == "cpp_fused_abs_cos_exp_neg_relu_sigmoid_0"
    # the comment lists them all
    assert "tanh" in source_comment(name, members, "//")[0]


def test_views_give_way_first_when_the_name_is_full() -> None:
    def fn(x: Any) -> Any:
        y = aten.view.default(aten.sin.default(x), [8, 4])
        y = aten.permute.default(aten.cos.default(y), [1, 0])
        for op in (aten.exp, aten.abs, aten.neg, aten.relu):
            y = op.default(y)
        return y

    [members] = _kernels(check(fn, make((4, 8))))
    assert kernel_name("cpp", members, 2) == "cpp_fused_abs_cos_exp_neg_relu_sin_2"


def test_kernel_without_origins_is_named_by_step() -> None:
    assert kernel_name("cpp", [], 7) == "cpp_7"
    assert source_comment("cpp_7", [], "//") == ["// cpp_7: no fx node recorded"]


class _StackTracer(torch.fx.Tracer):
    """Stamps each node with the traced function's frame, in dynamo's ``stack_trace`` format."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.code = fn.__code__

    def create_node(self, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = super().create_node(*args, **kwargs)
        frame = sys._getframe()
        while frame is not None and frame.f_code is not self.code:
            frame = frame.f_back  # type: ignore[assignment]
        if frame is not None:
            code = frame.f_code
            node.meta["stack_trace"] = (
                f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}'
            )
        return node


def _traced_with_stack(fn: Any) -> torch.fx.GraphModule:
    return torch.fx.GraphModule(torch.nn.Module(), _StackTracer(fn).trace(fn))


def _user_gelu(x: Any) -> Any:
    y = aten.mul.Tensor(x, 0.5)
    return aten.tanh.default(y)


def test_source_comment_names_the_users_file_and_line() -> None:
    gm = _traced_with_stack(_user_gelu)
    [members] = _kernels(check(gm, make((4, 8))))
    name = kernel_name("cpp", members, 0)
    comment = source_comment(name, members, "//")
    start = inspect.getsourcelines(_user_gelu)[1]
    assert comment[0].startswith(f"// {name} fuses mul, tanh (fx nodes ")
    assert comment[1:] == [
        f"//   {__file__}:{start + 1}  y = aten.mul.Tensor(x, 0.5)",
        f"//   {__file__}:{start + 2}  return aten.tanh.default(y)",
    ]


def test_where_reads_aotgrads_source_line_then_stack_trace() -> None:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    node = g.call_function(aten.relu.default, (x,))
    assert where(node) == ""
    node.meta["stack_trace"] = (
        '  File "/a/m.py", line 3, in f\n    y = g(x)\n  File "/a/n.py", line 9, in g\n'
    )
    assert where(node) == "/a/n.py:9"
    node.meta["source_line"] = "/a/model.py:12"
    assert where(node) == "/a/model.py:12"
    node.meta["source_line"] = "/a/model.py:13: y = relu(x[:, 3:4])"  # aotgrad's own frame format
    assert where(node) == "/a/model.py:13"
    node.meta["source_line"] = "/a:1/model.py:14"
    assert where(node) == "/a:1/model.py:14"
    assert op_name(aten.add.Tensor) == "add" and op_name(aten._to_copy.default) == "_to_copy"
    assert op_name(torch.ops.prims.convert_element_type.default) == "convert_element_type"


def test_comment_text_is_safe_in_a_one_line_comment(tmp_path: Any) -> None:
    src = tmp_path / "user.py"
    src.write_text("a = 1\nb = 'x' + \\\n")
    member = ComputedBuffer.__new__(ComputedBuffer)

    class Data:
        origins = frozenset({Origin(0, "n0", "add", f"{src}:2")})

    object.__setattr__(member, "data", Data())
    assert source_comment("k", [member], "//")[1] == f"//   {src}:2  b = 'x' +"
