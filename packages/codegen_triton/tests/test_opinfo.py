"""Every loopir lowering through Triton against eager, driven by PyTorch's OpInfo samples.

Each OpInfo whose aten op has a loopir lowering runs on a few samples per dtype (the second
float32 one non-contiguous); the sample is recorded as an aten graph (:func:`record`), compiled
with the triton backend, run and compared with running the recorded graph eagerly. Every kernel
must be generated as Triton (no kernel may fall back to the interpreter) unless the op is listed
in ``DECLINED`` with the reason. Ops loopir itself does not lower run as extern calls.
"""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from triton_check import DEVICES, assert_same, graph_to_device, to_device

from kiln_codegen_triton import TritonBackend
from kiln_loopir import compile_graph
from kiln_loopir.lowering import LOWERINGS, _ensure_registered

# dtype -> samples (kept small: the interpreter runs every kernel in numpy; integer and bool
# spellings are swept op by op in test_pointwise.py and test_reductions.py)
DTYPES = {torch.float32: 2, torch.bfloat16: 1, torch.int64: 1}

# OpInfo name -> why some of its kernels run in loopir's interpreter (correct, only slower);
# bfloat16 atomic adds are generated (Note [16-bit atomic adds] in kernel.py)
DECLINED: dict[str, str] = {}

# ops whose values are unspecified (uninitialized memory): only shape and dtype are compared
UNSPECIFIED_VALUES = {"empty", "empty_like", "new_empty", "empty_strided"}


class NotRecordable(Exception):
    """The sample mutates, is random, or returns something that is not a tensor structure."""


class _Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, Any, Any, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.calls.append((func, args, kwargs or {}, out))
        return out


def record(
    fn: Any, args: list[Any], kwargs: dict[str, Any]
) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """The aten calls ``fn(*args, **kwargs)`` makes, as a graph whose placeholders are the
    tensors no recorded call produced."""
    with _Calls() as mode:
        result = fn(*args, **kwargs)
    graph = torch.fx.Graph()
    nodes: dict[int, torch.fx.Node] = {}
    inputs: list[torch.Tensor] = []

    def node_of(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) not in nodes:
            nodes[id(value)] = graph.placeholder(f"in{len(inputs)}")
            inputs.append(value)
        return nodes[id(value)]

    for func, cargs, ckwargs, out in mode.calls:
        if func._schema.is_mutable or torch.Tag.nondeterministic_seeded in func.tags:
            raise NotRecordable(str(func))
        call = graph.call_function(func, tree_map(node_of, cargs), tree_map(node_of, ckwargs))
        for i, o in enumerate(out if isinstance(out, list | tuple) else [out]):
            if isinstance(o, torch.Tensor):
                nodes[id(o)] = (
                    call
                    if not isinstance(out, list | tuple)
                    else graph.call_function(operator.getitem, (call, i))
                )
    leaves, _ = tree_flatten(result)
    if not mode.calls or not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        raise NotRecordable("no aten calls, or a non-tensor result")
    graph.output(tree_map(node_of, result))
    return torch.fx.GraphModule(torch.nn.Module(), graph), inputs


def _selected() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    _ensure_registered()
    lowered = {
        (k.overloadpacket if isinstance(k, torch._ops.OpOverload) else k).__name__.split(".")[-1]
        for k in LOWERINGS
    }
    extra = {
        "softmax",
        "log_softmax",
        "nn.functional.layer_norm",
        "__getitem__",
        "take_along_dim",
        "index_select",
    }
    return [
        op
        for op in op_db
        if (op.aten_name or op.name).replace("nn.functional.", "") in lowered or op.name in lowered | extra
    ]


OPS = _selected()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS, ids=[f"{op.name}.{op.variant_test_name}".rstrip(".") for op in OPS])
def test_opinfo(op: Any, device: str) -> None:
    checked = 0
    supported = op.supported_dtypes(device)  # CUDA lacks some (addmm on int64)
    for dtype, count in DTYPES.items():
        if dtype not in supported:
            continue
        for i, original in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
            if i >= count:
                break
            sample = original.noncontiguous() if i == 1 else original
            try:
                gm, inputs = record(op.op, [sample.input, *sample.args], dict(sample.kwargs))
            except NotRecordable:
                continue
            inputs = to_device(inputs, device)
            gm = graph_to_device(gm, device)
            expected = gm(*inputs)
            backend = TritonBackend()
            actual = compile_graph(gm, inputs, backend=backend)(*inputs)
            if op.name in UNSPECIFIED_VALUES:
                assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype)
            else:
                try:
                    assert_same(actual, expected)
                except AssertionError as exc:
                    raise AssertionError(f"{op.name} {dtype} sample {i}: {sample}\n{gm.code}\n{exc}") from exc
            if op.name not in DECLINED:
                assert backend.last_declined == [], (op.name, dtype, backend.last_declined)
            checked += 1
    assert checked > 0 or not any(d in supported for d in DTYPES)
