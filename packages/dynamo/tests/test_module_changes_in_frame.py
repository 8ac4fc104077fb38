"""Module walks after the frame changed the module (Note [The frame's view of a module's
registries] in variables/module_state.py): `parameters()`, `children()`, a container's len and
iteration, `hasattr`, `apply` and `train()` see the frame's attribute stores (`m.bias = None`,
`m.w = param`, `m.sub = other`) and its writes into the registries (`register_buffer`,
`add_module`, `m._parameters[k] = ...`, `ModuleList.append`) in eager's order; what the view
cannot follow exactly is one break with a reason, never a stale walk."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import CountingBackend, assert_same
from torch import nn

import kiln_dynamo
from kiln_dynamo import counters


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.other = nn.Linear(3, 3, bias=False)
        self.register_buffer("buf", torch.ones(3))
        self.layers = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])
        self.scale = 2.0


def total(it: Any) -> torch.Tensor:
    return sum((p.sum() for p in it), torch.zeros(()))


def names(it: Any) -> list[str]:
    return [n for n, _ in it]


def bias_none_parameters(m: Net, x: torch.Tensor) -> Any:
    m.lin.bias = None  # the key stays, with None, and parameters() skips it
    return total(m.parameters()), names(m.named_parameters()), len(list(m.lin.parameters()))


def bias_none_then_forward(m: Net, x: torch.Tensor) -> Any:
    m.lin.bias = None
    return m.lin(x), total(m.parameters())


def parameter_from_outside_replaces(m: Net, x: torch.Tensor) -> Any:
    m.lin.weight = m.other.weight  # a replaced key keeps its place; the shared one is walked once
    return (
        total(m.parameters()),
        names(m.named_parameters()),
        names(m.named_parameters(remove_duplicate=False)),
    )


def parameter_made_in_frame(m: Net, x: torch.Tensor) -> Any:
    m.lin.w2 = nn.Parameter(torch.ones(3))  # breaks; the walk after the split sees it
    return total(m.parameters()), names(m.named_parameters())


def none_then_parameter(m: Net, x: torch.Tensor) -> Any:
    m.lin.bias = None
    m.lin.bias = nn.Parameter(torch.ones(3))
    return total(m.parameters()), names(m.named_parameters())


def submodule_replaced(m: Net, x: torch.Tensor) -> Any:
    m.lin = m.other
    return names(m.named_modules()), names(m.named_parameters()), len(list(m.children())), x + 1


def submodule_none(m: Net, x: torch.Tensor) -> Any:
    m.lin = None
    return names(m.named_modules()), names(m.named_children()), len(list(m.children())), total(m.parameters())


def submodule_added(m: Net, x: torch.Tensor) -> Any:
    m.extra = m.other
    return names(m.named_modules(remove_duplicate=False)), names(m.named_children()), x + 1


def parameter_replaces_submodule(m: Net, x: torch.Tensor) -> Any:
    m.other = m.lin.weight
    return names(m.named_parameters()), names(m.named_children()), x + 1


def buffer_reassigned(m: Net, x: torch.Tensor) -> Any:
    m.buf = x + 1
    return total(m.buffers()), names(m.named_buffers())


def register_buffer(m: Net, x: torch.Tensor) -> Any:
    m.register_buffer("b2", x * 2)
    return total(m.buffers()), names(m.named_buffers()), hasattr(m, "b2"), m.b2 + 1


def register_buffer_none(m: Net, x: torch.Tensor) -> Any:
    m.register_buffer("buf", None)
    return total(m.buffers()), names(m.named_buffers())


def register_parameter_none(m: Net, x: torch.Tensor) -> Any:
    m.lin.register_parameter("bias", None)
    return total(m.parameters()), names(m.named_parameters())


def add_module(m: Net, x: torch.Tensor) -> Any:
    m.add_module("extra", m.lin)
    return names(m.named_modules(remove_duplicate=False)), len(list(m.children())), total(m.parameters())


def parameters_dict_write(m: Net, x: torch.Tensor) -> Any:
    m.lin._parameters["bias"] = None
    m.other._parameters["w3"] = m.lin.weight
    return total(m.parameters()), names(m.named_parameters(remove_duplicate=False))


def buffers_dict_delete(m: Net, x: torch.Tensor) -> Any:
    del m._buffers["buf"]
    return names(m.named_buffers()), hasattr(m, "buf"), x + 1


def modules_dict_write(m: Net, x: torch.Tensor) -> Any:
    m._modules["lin"] = None
    return names(m.named_modules()), total(m.parameters())


def module_list_append(m: Net, x: torch.Tensor) -> Any:
    m.layers.append(m.other)
    for layer in m.layers:
        x = layer(x)
    return x, len(m.layers), total(m.parameters())


def apply_after_change(m: Net, x: torch.Tensor) -> Any:
    m.layers = None
    seen: list[str] = []
    m.apply(lambda mod: seen.append(type(mod).__name__))
    return seen, x + 1


def train_after_new_child(m: Net, x: torch.Tensor) -> Any:
    m.eval()
    m.extra = nn.Identity()
    m.train()
    return [mm.training for mm in m.modules()], m.training, x + 1


def plain_attributes(m: Net, x: torch.Tensor) -> Any:
    m.flag = 3
    m.lin.weight = None
    return total(m.parameters()), m.flag, getattr(m.lin, "weight", 5), hasattr(m.lin, "weight")


def tensor_to_parameter_name(m: Net, x: torch.Tensor) -> Any:
    try:
        m.lin.bias = torch.ones(3)  # eager raises TypeError
    except TypeError:
        return total(m.parameters())
    return x


def int_to_submodule_name(m: Net, x: torch.Tensor) -> Any:
    try:
        m.other = 3  # eager raises TypeError
    except TypeError:
        return total(m.parameters())
    return x


def registries_read_after_store(m: Net, x: torch.Tensor) -> Any:
    m.lin.bias = None
    return list(m.lin._parameters), x + 1


def store_after_registries_read(m: Net, x: torch.Tensor) -> Any:
    held = m.lin._parameters
    m.lin.bias = None
    return list(held), total(m.parameters())


def registry_write_then_store(m: Net, x: torch.Tensor) -> Any:
    m._buffers["zz"] = x  # the stores are replayed before the dict rewrites: this pair breaks
    m.q = 4
    return names(m.named_buffers()), m.q


# name: (frame, whether it is one graph with no break, a substring of the expected break reason)
CASES: dict[str, tuple[Callable[..., Any], bool, str | None]] = {
    "bias_none_parameters": (bias_none_parameters, True, None),
    "bias_none_then_forward": (bias_none_then_forward, True, None),
    "parameter_from_outside_replaces": (parameter_from_outside_replaces, True, None),
    "parameter_made_in_frame": (parameter_made_in_frame, False, "nn.Parameter(...) made inside"),
    "none_then_parameter": (none_then_parameter, False, "nn.Parameter(...) made inside"),
    "submodule_replaced": (submodule_replaced, True, None),
    "submodule_none": (submodule_none, True, None),
    "submodule_added": (submodule_added, True, None),
    "parameter_replaces_submodule": (parameter_replaces_submodule, True, None),
    "buffer_reassigned": (buffer_reassigned, True, None),
    "register_buffer": (register_buffer, True, None),
    "register_buffer_none": (register_buffer_none, True, None),
    "register_parameter_none": (register_parameter_none, True, None),
    "add_module": (add_module, True, None),
    "parameters_dict_write": (parameters_dict_write, True, None),
    "buffers_dict_delete": (buffers_dict_delete, True, None),
    "modules_dict_write": (modules_dict_write, True, None),
    "module_list_append": (module_list_append, True, None),
    "apply_after_change": (apply_after_change, True, None),
    "train_after_new_child": (train_after_new_child, False, "made in the frame"),
    "plain_attributes": (plain_attributes, True, None),
    "tensor_to_parameter_name": (tensor_to_parameter_name, False, "eager raises TypeError"),
    "int_to_submodule_name": (int_to_submodule_name, False, "eager raises TypeError"),
    "registries_read_after_store": (registries_read_after_store, False, "after an attribute store"),
    "store_after_registries_read": (store_after_registries_read, False, "after its registries were read"),
    "registry_write_then_store": (registry_write_then_store, False, "after its registries were read"),
}


def _state(m: nn.Module) -> Any:
    return (
        [(n, p.detach()) for n, p in m.named_parameters(remove_duplicate=False)],
        [(n, b) for n, b in m.named_buffers(remove_duplicate=False)],
        names(m.named_modules(remove_duplicate=False)),
        [mm.training for mm in m.modules()],
    )


@pytest.mark.parametrize("name", list(CASES))
def test_walks_see_the_frames_module_changes(name: str) -> None:
    fn, one_graph, reason = CASES[name]
    torch.manual_seed(0)
    base, x = Net(), torch.randn(3)
    mine, ref = copy.deepcopy(base), copy.deepcopy(base)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for call in range(2):  # the second call sees the module the first one changed
        try:
            expected = fn(ref, x)
        except Exception as e:  # e.g. a key deleted by the first call: compiled raises it too
            with pytest.raises(type(e)):
                compiled(mine, x)
            assert_same(_state(ref), _state(mine), f"state after call {call}")
            continue
        actual = compiled(mine, x)
        assert_same(expected, actual, f"call {call}")
        assert_same(_state(ref), _state(mine), f"state after call {call}")
        if call == 0:
            reasons = [r.reason for r in counters.break_reasons]
            if one_graph:
                assert reasons == [] and counters.fallbacks == []
                assert backend.graphs == 1
            if reason is not None:
                assert any(reason in r for r in reasons), reasons


def test_a_walk_after_a_store_guards_the_registries_it_started_from() -> None:
    """The view starts from the real registries' key lists, guarded: a module that gains a
    parameter between calls recompiles rather than walking the old list."""

    def fn(m: Net, x: torch.Tensor) -> Any:
        m.lin.bias = None
        return total(m.parameters()) + x

    torch.manual_seed(0)
    mine, x = Net(), torch.randn(3)
    ref = copy.deepcopy(mine)
    compiled = kiln_dynamo.compile(fn, backend=CountingBackend())
    assert_same(fn(ref, x), compiled(mine, x))
    for m in (ref, mine):
        m.lin.bias = nn.Parameter(torch.ones(3))
        m.lin.extra = nn.Parameter(torch.full((2,), 3.0))
    assert_same(fn(ref, x), compiled(mine, x))
    assert counters.recompiles == 1
