"""Comparing a compiled call with eager's when programs mutate and alias: the helpers that
test_mutation_sweep.py and test_alias_fuzz.py share.

A call is compared on what a caller can observe: the outputs' Python types (tuple, list, int,
torch.Size), their values, shapes, dtypes and requires_grad, their strides where eager's output
shares memory with an input or another output (a fresh output's layout is the compiler's
choice, a view's is not), the inputs after
the call (values, shapes and strides: in-place geometry changes them), and the aliasing between
outputs and inputs (`aliasing`: which are the same object, which share storage). Gradients are
compared by `grads`, which backpropagates the sum of the outputs that require grad.
"""

# mypy: ignore-errors
from __future__ import annotations

from collections.abc import Sequence

import torch


def flat_tensors(x) -> list[torch.Tensor]:
    """The tensors inside nested tuples/lists, in order (non-tensors dropped)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for e in x for t in flat_tensors(e)]
    return []


def aliasing(outs, args: Sequence[torch.Tensor]) -> list[tuple[int, int, bool, bool]]:
    """For each pair among (tensors of outs) + args: (i, j, same object, same storage)."""
    tens = flat_tensors(outs) + list(args)
    rel = []
    for i, a in enumerate(tens):
        for j, b in enumerate(tens):
            if i < j:
                same_storage = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                rel.append((i, j, a is b, same_storage and a.numel() > 0 and b.numel() > 0))
    return rel


def _views_another(t: torch.Tensor, others: Sequence[torch.Tensor]) -> bool:
    """Whether `t` shares memory with an input or another output: then its layout is observable
    (writes through one show in the other), where a view of an intermediate nobody else holds is
    as good as a fresh tensor."""
    ptr = t.untyped_storage().data_ptr()
    return t.numel() > 0 and any(
        o is not t and o.numel() > 0 and o.untyped_storage().data_ptr() == ptr for o in others
    )


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    """Strides of the dims of size above 1 (a size-1 dim's stride addresses nothing)."""
    return tuple(st for n, st in zip(t.shape, t.stride(), strict=True) if n > 1)


def compare_outputs(
    eager, compiled, eager_args: Sequence[torch.Tensor], where: str = "out", inputs_only: bool = False
) -> None:
    """Eager's and the compiled call's outputs: same structure, types, values, metadata.
    `inputs_only`: strides are compared only where an output shares memory with an input (a
    compiler that returns results in its own layouts, as padded GEMMs are returned, Note [Matmul
    padding] in kiln_loopir: outputs that share one such result have its layout)."""
    assert type(compiled) is type(eager), f"{where}: type {type(compiled).__name__} != {type(eager).__name__}"
    if isinstance(eager, (tuple, list)) and not isinstance(eager, torch.Size):
        assert len(compiled) == len(eager), f"{where}: length {len(compiled)} != {len(eager)}"
        everything = list(eager_args) if inputs_only else flat_tensors(eager) + list(eager_args)
        for i, (e, c) in enumerate(zip(eager, compiled, strict=True)):
            compare_outputs(e, c, everything, f"{where}[{i}]", inputs_only)
        return
    if isinstance(eager, torch.Tensor):
        meta_e = (eager.shape, eager.dtype, eager.requires_grad)
        meta_c = (compiled.shape, compiled.dtype, compiled.requires_grad)
        assert meta_c == meta_e, f"{where}: (shape, dtype, requires_grad) {meta_c} != {meta_e}"
        if _views_another(eager, eager_args):
            assert _strides(compiled) == _strides(eager), (
                f"{where}: stride {compiled.stride()} != {eager.stride()}"
            )
        torch.testing.assert_close(
            compiled.detach(), eager.detach(), equal_nan=True, msg=lambda m: f"{where}: {m}"
        )
        return
    assert compiled == eager, f"{where}: {compiled!r} != {eager!r}"


def compare_inputs(
    eager_args: Sequence[torch.Tensor], compiled_args: Sequence[torch.Tensor], names=None
) -> None:
    """The inputs after the call: shape, stride, values (mutations and in-place geometry)."""
    for i, (e, c) in enumerate(zip(eager_args, compiled_args, strict=True)):
        name = names[i] if names else f"arg{i}"
        assert (c.shape, c.stride()) == (e.shape, e.stride()), (
            f"input {name}: (shape, stride) {(c.shape, c.stride())} != {(e.shape, e.stride())}"
        )
        torch.testing.assert_close(
            c.detach(), e.detach(), equal_nan=True, msg=lambda m, name=name: f"input {name}: {m}"
        )


def grad_outputs_sum(outs):
    ts = [t for t in flat_tensors(outs) if t.requires_grad and t.is_floating_point()]
    return sum(t.sum() for t in ts) if ts else None


def grads(outs, wrt: Sequence[torch.Tensor]):
    """Gradients of the sum of the float outputs that require grad w.r.t. `wrt` (None if none)."""
    loss = grad_outputs_sum(outs)
    if loss is None or not wrt:
        return None
    return torch.autograd.grad(loss, list(wrt), allow_unused=True)
