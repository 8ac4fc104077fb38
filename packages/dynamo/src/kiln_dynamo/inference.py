"""`torch.inference_mode()` blocks traced into the graph, and the inference tensors they make.

Note [inference_mode traced]: eager runs a `with torch.inference_mode():` block with grad mode
off, and every tensor an operator *makes* inside it is an *inference tensor* (`is_inference()`
True, `requires_grad` False, no version counter): a new result, a view of one, a factory's
output. A view of a normal tensor taken in the block stays a normal tensor, and an in-place op
on a normal tensor leaves it normal. Outside the block an inference tensor still is one (and so
is any view of it), but an operator's *new* result from it is normal.

kiln traces the block as a grad-mode block (`_set_grad_enabled(False)` / back, graph nodes) and
keeps the inference part as a mark on the fake tensors (`mark_results`): a fresh result made
inside a traced block is marked, a view takes its base's mark, an in-place result is its input.
`Tensor.is_inference()` answers the mark while tracing. No graph makes inference tensors, so the
runner calls a graph whose every operator was traced inside a block under the mode itself
(`call_in_mode`: what it makes is made inference, no copy); any other graph has each output
whose fake is marked turned into one after the graph returns
(`to_inference`: one copy of its storage under `torch.inference_mode()`, shared by the outputs
that share a storage, so aliases among them stay aliases); an output already an inference tensor
(the whole call made under `torch.inference_mode()`) is passed as it is. That copy is the price
of a block traced whole; the other way, two breaks around the block (the block's body a graph
run under the real mode), costs a guard and a Python call per break and compiles three graphs.

What eager refuses stays refused: outside a traced block, an operator that writes to an
inference tensor (`t.add_(1)`, `t[0] = 1`, `out=t`) or that may save one for backward (grad on,
an argument requires grad) raises in eager, so it is a break here (`check_use`), and CPython
runs it on the real inference tensor. A break inside a traced block moves to the `with` line
(`before_block`): CPython enters the mode there and the body is captured on its own, under
the mode, as before this note. `KILN_TRACE_INFERENCE_MODE=0` (`set_trace_inference_mode(False)`)
keeps that older way for every block. The decorator (`@torch.inference_mode()`, torch's
`decorate_context`) is the same with-block inside torch's wrapper, inlined.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten

_trace = os.environ.get("KILN_TRACE_INFERENCE_MODE", "1") != "0"

_MARK = "kiln_inference"


def trace_enabled() -> bool:
    return _trace


def set_trace_inference_mode(on: bool) -> bool:
    """Trace `torch.inference_mode()` blocks into the graph (Note [inference_mode traced]);
    returns the previous setting."""
    global _trace
    prev, _trace = _trace, on
    return prev


def is_inference(fake: Any) -> bool:
    """Whether eager's tensor for this fake is an inference tensor (Note [inference_mode traced])."""
    return bool(getattr(fake, _MARK, False))


def mark_input(fake: Any, value: torch.Tensor) -> None:
    if value.is_inference():
        setattr(fake, _MARK, True)


def mark_results(out: Sequence[Any], inputs: Sequence[Any], in_block: bool) -> None:
    """Mark the fakes an operator returned (Note [inference_mode traced])."""
    if not in_block and not any(is_inference(a) for a in inputs):
        return  # nothing to mark: the common case, outside every block
    seen = {id(a) for a in inputs}
    # A view shares its base's storage. Views are found by storage, not `_is_view()`, which an
    # inference tensor (a fake made while tracing under the mode) does not track.
    storages: dict[int, bool] = {}
    for a in inputs:
        key = _storage_key(a)
        if key is not None:
            storages[key] = storages.get(key, False) or is_inference(a)
    for t in out:
        if not isinstance(t, torch.Tensor) or id(t) in seen:
            continue  # an in-place result is its input, already marked or not
        key = _storage_key(t)
        mark = storages.get(key, in_block) if key is not None else in_block
        if mark:
            setattr(t, _MARK, True)


def _storage_key(t: Any) -> int | None:
    meta = getattr(t, "meta", None)  # a fake's meta tensor; real constants have none
    if not isinstance(meta, torch.Tensor):
        return None
    return int(meta.untyped_storage()._cdata)


def _writes(kind: str, target: Any, kwargs: dict[str, Any]) -> bool:
    import operator

    if target is operator.setitem or "out" in kwargs:
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return isinstance(name, str) and name.endswith("_") and not name.endswith("__")


def check_use(kind: str, target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Why eager may refuse this operator on an inference tensor outside a traced block (a write
    to one, or a call that may save one for backward), or None (Note [inference_mode traced])."""
    flat = [a for a in tree_flatten((list(args), kwargs))[0] if isinstance(a, torch.Tensor)]
    marked = [t for t in flat if is_inference(t)]
    if not marked:
        return None
    first = args[0] if args else None
    out = kwargs.get("out")
    if _writes(kind, target, kwargs) and (
        (isinstance(first, torch.Tensor) and is_inference(first)) or is_inference(out)
    ):
        return "an in-place write to an inference tensor outside torch.inference_mode()"
    if torch.is_grad_enabled() and any(t.requires_grad for t in flat):
        return (
            "an inference tensor meets a tensor that requires grad outside torch.inference_mode() "
            "(eager refuses to save it for backward)"
        )
    return None


IN_BLOCK = "kiln_in_inference_block"  # node.meta key: traced inside a block (or under the mode)


def whole_graph_in_block(nodes: Iterable[torch.fx.Node]) -> bool:
    """Every operator of the graph was traced inside an inference block: the runner may call
    the graph under the mode, and its new results are inference tensors as they are made."""
    import operator

    ops = [n for n in nodes if n.op in ("call_function", "call_method", "call_module")]
    ops = [n for n in ops if n.target not in (torch._C._set_grad_enabled, operator.getitem)]
    return bool(ops) and all(n.meta.get(IN_BLOCK, False) for n in ops)


def call_in_mode(compiled: Callable[..., Any], *args: Any) -> Any:
    with torch.inference_mode():
        return compiled(*args)


def to_inference(outs: Sequence[Any], indices: tuple[int, ...]) -> list[Any]:
    """The graph's outputs with those at `indices` made inference tensors (Note [inference_mode
    traced]): one copy per storage, so outputs that share a storage still share one."""
    result = list(outs)
    copies: dict[tuple[int, int], torch.UntypedStorage] = {}
    with torch.inference_mode():
        for i in indices:
            t = result[i]
            if t.is_inference():
                continue
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            new = copies.get(key) if key[0] else None
            if new is None:
                new = copies[key] = storage.clone()
            made = torch.empty(0, dtype=t.dtype, device=t.device)
            result[i] = made.set_(new, t.storage_offset(), t.size(), t.stride())
    return result
