"""The one comparison helper every test uses: compiled vs eager, outputs, gradients, state."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten, tree_map

import kiln_aotgrad
from kiln_aotgrad import surviving_ops_ok


@dataclass
class Recorder:
    """A compiler that runs graphs as they are and keeps them for inspection."""

    graphs: list[torch.fx.GraphModule] = field(default_factory=list)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs.append(gm)
        return gm


def assert_functional(gm: torch.fx.GraphModule) -> None:
    """No mutating or out= operator, every node carries metadata, every op in the core set."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            assert not node.target._schema.is_mutable, f"mutating op in graph: {node.format_node()}"
        if node.op not in ("output",):
            assert "val" in node.meta, f"node without meta['val']: {node.format_node()}"
    assert surviving_ops_ok(gm) == [], surviving_ops_ok(gm)


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        c = x.detach().clone()
        return c.requires_grad_(x.requires_grad)
    return x


@dataclass
class Result:
    compiled: Any
    recorder: Recorder


def check(
    target: torch.nn.Module | Callable[..., Any],
    *args: Any,
    partition: str = "min_cut",
    seed: int = 0,
    atol: float = 1e-5,
    rtol: float = 1.3e-6,
    no_grad: bool = False,
) -> Result:
    """Run `target(*args)` eagerly and through aot, compare outputs, gradients and state."""
    rec = Recorder()
    if isinstance(target, torch.nn.Module):
        eager: Any = copy.deepcopy(target)
        mine = copy.deepcopy(target)
        compiled: Any = kiln_aotgrad.aot_module(mine, rec, partition=partition)
    else:
        eager = target
        mine = None
        compiled = kiln_aotgrad.aot_function(target, rec, partition=partition)
    args_e = tree_map(_clone, args)
    args_c = tree_map(_clone, args)
    ctx = torch.no_grad() if no_grad else torch.enable_grad()
    with ctx:
        torch.manual_seed(seed)
        out_e = eager(*args_e)
        torch.manual_seed(seed)
        out_c = compiled(*args_c)
    flat_e, spec_e = tree_flatten(out_e)
    flat_c, spec_c = tree_flatten(out_c)
    assert spec_e == spec_c, (spec_e, spec_c)
    for e, c in zip(flat_e, flat_c, strict=True):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(c, e, atol=atol, rtol=rtol)
            assert c.requires_grad == e.requires_grad
            assert c.shape == e.shape and c.stride() == e.stride()
        else:
            assert c == e
    for gm in rec.graphs:
        assert_functional(gm)
    # Gradients: the same random cotangent for every differentiable output.
    gen = torch.Generator().manual_seed(1234)
    loss_e: Any = 0
    loss_c: Any = 0
    for e, c in zip(flat_e, flat_c, strict=True):
        if isinstance(e, torch.Tensor) and e.requires_grad and e.is_floating_point():
            cot = torch.randn(e.shape, generator=gen, dtype=e.dtype)
            loss_e = loss_e + (e * cot).sum()
            loss_c = loss_c + (c * cot).sum()
    if isinstance(loss_e, torch.Tensor):
        loss_e.backward()
        loss_c.backward()
    for a_e, a_c in zip(tree_flatten(args_e)[0], tree_flatten(args_c)[0], strict=True):
        if isinstance(a_e, torch.Tensor):
            torch.testing.assert_close(a_c, a_e, atol=atol, rtol=rtol)  # mutated inputs
            if a_e.grad is None:
                assert a_c.grad is None
            else:
                torch.testing.assert_close(a_c.grad, a_e.grad, atol=atol, rtol=rtol)
    if mine is not None:
        pe = dict(eager.named_parameters())
        for name, p in mine.named_parameters():
            if pe[name].grad is None:
                assert p.grad is None, name
            else:
                assert p.grad is not None, name
                torch.testing.assert_close(p.grad, pe[name].grad, atol=atol, rtol=rtol)
        be = dict(eager.named_buffers())
        for name, b in mine.named_buffers():
            torch.testing.assert_close(b, be[name], atol=atol, rtol=rtol)
    return Result(compiled, rec)
