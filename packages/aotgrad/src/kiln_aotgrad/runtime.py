"""Running compiled graphs with eager semantics.

A compiled graph knows nothing of aliasing, mutation or autograd; this module puts them back.
Both paths take the flat list of real input tensors and return the flat user outputs:

- inference: call the compiled graph, copy the new values of mutated inputs back into the real
  inputs (`Tensor.copy_`), then assemble the outputs (`_assemble`);
- training: the compiled forward and backward run inside one `torch.autograd.Function`. Its
  forward returns `(mutated-input values..., user graph outputs..., saved...)`, keeps `saved` in
  `ctx.save_for_backward`, and marks outputs that the trace found not to require grad
  non-differentiable. Its backward passes `saved + tangents` (contiguous, zeros for outputs
  that received no gradient) to the compiled backward and hands out one gradient per input that
  requires grad (None for the others). The backward is first-order only: running it with grad
  mode on (double backward, `create_graph=True`) raises `AotgradError`.

`_assemble` rebuilds user outputs that alias: an output that *is* an input returns the real
input object, a view of an input or of an earlier output is regenerated with `as_strided` on
the real tensor (outside the autograd.Function, so autograd sees an ordinary view), which
makes user-visible aliasing match eager. Mutated inputs are written back before that, with
autograd recording the copy when the input requires grad; a saved tensor sharing storage with a
mutated input is cloned first, so the backward reads the value the forward saw.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from kiln_aotgrad.functionalize import SELF, ViewStep
from kiln_aotgrad.joint import OutputInfo, TraceMeta
from kiln_aotgrad.logs import graphs_log
from kiln_aotgrad.tracer import AotgradError

Compiled = Callable[..., Any]


def _as_list(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


# Note [Write-backs in one call]: a training step of a network with BatchNorm mutates three buffers
# per layer (running mean, running variance, batches tracked): ResNet-50 wrote back 159 inputs a
# step, each `copy_` one dispatch on the host and, on CUDA, one memcpy launch (the H200 profile
# counted 233 copies a step against torch.compile's 24). Copies no autograd records go through one
# `torch._foreach_copy_` (one dispatch; on CUDA a few multi-tensor kernels), in the same order.
# Only where no target is a view: inputs viewing one storage could overlap, and a multi-tensor
# kernel writes them in no defined order where sequential copies write the last one last.
# CUDA's multi-tensor kernels take a list only when all its tensors share one dtype; a mixed list
# (bf16 running statistics beside int64 batch counters) falls back to one copy per tensor inside
# `_foreach_copy_` (H100, ResNet-50 bf16 training: 183 memcpy a step against torch.compile's 24),
# so the copies go in one call per (device, dtype) group: targets are distinct tensors, none a view,
# so the groups' order does not matter. `KILN_BATCHED_WRITE_BACK=0` turns it off. Storing the new value from the kernel that computes it
# straight into the input's buffer (no copy at all, as torch.compile does) is not built.
BATCHED_WRITE_BACK = os.environ.get("KILN_BATCHED_WRITE_BACK", "1") != "0"


def _write_back(meta: TraceMeta, inputs: Sequence[torch.Tensor], new_values: Sequence[torch.Tensor]) -> None:
    # one no_grad block for all the copies (an optimizer step writes back every parameter and
    # state tensor: a context per copy cost more than the copies of small tensors); a copy that
    # autograd must record runs with grad mode back on
    recording = torch.is_grad_enabled()
    batch = BATCHED_WRITE_BACK and len(new_values) > 1
    with torch.no_grad():
        if batch:
            targets = [inputs[i] for i in meta.mutated_inputs]
            if not any(
                t._base is not None or (recording and t.requires_grad and not t.is_leaf) for t in targets
            ) and not (
                recording
                and any(
                    v.requires_grad and not t.requires_grad for t, v in zip(targets, new_values, strict=True)
                )
            ):
                # Note [Write-backs in one call]: one call per (device, dtypes) group
                groups: dict[tuple[Any, ...], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
                for t, v in zip(targets, new_values, strict=True):
                    dst, src = groups.setdefault((t.device, t.dtype, v.device, v.dtype), ([], []))
                    dst.append(t)
                    src.append(v)
                for dst, src in groups.values():
                    torch._foreach_copy_(dst, src)
                return
        for i, v in zip(meta.mutated_inputs, new_values, strict=True):
            target = inputs[i]
            # a leaf that requires grad can only have been mutated under no_grad (eager raises
            # otherwise): an optimizer step updating parameters (Note [Tracing an optimizer step])
            # Note [Writing a value that requires grad into an input that does not]: eager's
            # `x.mul_(w)` (`w` requiring grad, `x` not) leaves `x` requiring grad, and a later
            # `x.zero_()` keeps it so; the copy under no_grad left it not requiring grad
            # (test_alias_fuzz.py seed 158). Autograd records the copy of such a value too (not
            # into a leaf that requires grad: its new value was computed under no_grad).
            if recording and (
                (target.requires_grad and not target.is_leaf)
                or (v.requires_grad and not target.requires_grad)
            ):
                with torch.enable_grad():
                    target.copy_(v)
            else:
                target.copy_(v)


class InputsWrittenError(AotgradError):
    """A compiled call failed after it began to write its inputs back (Note [Failures after
    the write-back]): the inputs hold part of the call's effect, so it must not be run again."""


# Note [Failures after the write-back]: a compiled graph is functional, so a call that fails
# inside it (a kernel, a run-time check) left its inputs as they were, and the caller may run the
# captured program again eagerly on them (kiln's Note [Run-time fallback]). Everything after it
# is not: the write-back of mutated inputs, their restriding, and the outputs rebuilt as views
# (`_assemble`), which can fail too (a view laid over a graph output a code generator returned
# compact: `as_strided` out of bounds). An eager re-run then applied the program's in-place writes
# a second time (`x.mul_(-1)` left `x` unchanged: test_alias_fuzz.py, seed 190 under
# dynamic=True). So a failure from the write-back on, in a program that writes or restrides an
# input, is raised as `InputsWrittenError` (chained to the cause), which callers do not re-run.
def inputs_written(exc: BaseException) -> bool:
    """Whether a failed call left its inputs written (Note [Failures after the write-back]): the
    caller must not run the program again on them."""
    return isinstance(exc, InputsWrittenError) or getattr(exc, "kiln_inputs_written", False)


def _after_call(meta: TraceMeta, inputs: Sequence[torch.Tensor], outs: list[Any], m: int) -> Any:
    try:
        _write_back(meta, inputs, outs[:m])
        _restride(meta, inputs)
        return _assemble(meta, inputs, outs[m:])
    except Exception as exc:
        if not (m or meta.metadata_mutations):
            raise
        raise InputsWrittenError(
            f"the compiled program failed after writing its inputs back ({type(exc).__name__}: {exc}); "
            "it is not run again, which would apply its in-place writes twice"
        ) from exc


def _restride(meta: TraceMeta, inputs: Sequence[torch.Tensor]) -> None:
    """Note [Metadata mutations of inputs]: an input the program resized or viewed in place
    (`resize_` within its storage, `t_`, `squeeze_`...) gets the sizes and strides it ends with,
    after its data was written back (in its old geometry)."""
    for i, size, stride, offset in meta.metadata_mutations:
        with torch.no_grad():
            inputs[i].as_strided_(size, stride, offset)


def _copy_strided(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its strides, whatever they are (``clone`` makes a tensor that is not
    dense contiguous): the backward reads a saved value in the layout the forward gave it (Note
    [Backward inputs the forward laid out] in api.py). Its storage offset becomes 0."""
    with torch.no_grad():
        if t.numel() == 0:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        region = t.detach().as_strided((span,), (1,), t.storage_offset()).clone()
        return region.as_strided(t.shape, t.stride(), 0)


def _plain_outputs(meta: TraceMeta) -> bool:
    """Whether the user outputs are exactly the graph outputs, in order, in one flat tuple: then
    `_assemble` is the identity and is skipped (Note [The call fast path] in api.py)."""
    n = len(meta.outputs)
    return meta.out_spec == tree_flatten(tuple(range(n)))[1] and [
        (o.kind, o.index) for o in meta.outputs
    ] == [("graph", i) for i in range(n)]


def _replay(views: Sequence[ViewStep], base: torch.Tensor) -> torch.Tensor:
    x: Any = base
    for step in views:
        x = step.func(*(x if a is SELF else a for a in step.args), **step.kwargs)
        if step.index is not None:
            x = x[step.index]
    return x


def _input_view(info: OutputInfo, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    base = (
        inputs[info.index].detach() if info.detach else inputs[info.index]
    )  # Note [Views taken under no_grad]
    if info.grad_stops:  # Note [Views of a view taken under no_grad] (joint.py)
        base = _no_grad_alias(base)
    if info.views:  # Note [Views that change dtype]
        return _replay(info.views, base)
    if info.layout is not None:  # symbolic sizes (joint.py)
        return base.as_strided(*info.layout(inputs))
    # Note [Static views of inputs start at the input's offset] in joint.py: the offset is relative
    return base.as_strided(info.size, info.stride, base.storage_offset() + info.offset)


def _in_layout(t: torch.Tensor, stride: tuple[int, ...] | None) -> bool:
    """Whether ``t`` has the traced ``stride`` (dims of size 1 aside): Note [Bases returned in
    another layout] in joint.py."""
    if stride is None:
        return True
    got = t.stride()
    return got == stride or all(n == 1 or a == b for n, a, b in zip(t.shape, got, stride, strict=True))


def _to_layout(t: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """``t`` copied into the traced ``stride`` (differentiable: the gradient goes back to ``t``)."""
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _row_major(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether ``stride`` lays ``shape`` out contiguously, last dim fastest (dims of size 1 aside)."""
    expected = 1
    for n, s in reversed(list(zip(shape, stride, strict=True))):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _traced_base_stride(info: OutputInfo, inputs: Sequence[Any]) -> tuple[int, ...] | None:
    """The strides the base of a "graph_view" / "output_view" was traced with, computed from the
    inputs where they are symbolic (Note [Bases returned in another layout] in joint.py)."""
    if info.base_stride_of is not None:
        return info.base_stride_of(inputs)
    return info.base_stride


def _reshaped(g: torch.Tensor, info: OutputInfo, base_stride: tuple[int, ...] | None) -> torch.Tensor | None:
    """A view that is a reshape of its whole base (both traced row-major, offset 0) taken with
    ``view`` on a base in another layout, where ``view`` can (no copy: the padded logits split
    into (batch, length, vocab)); None where it cannot (Note [Bases returned in another layout])."""
    if info.offset != 0 or base_stride is None or math.prod(info.size) != g.numel():
        return None
    if not (_row_major(info.size, info.stride) and _row_major(g.shape, base_stride)):
        return None
    try:
        return g.view(info.size)
    except RuntimeError:
        return None


def _view_grad_mode(info: Any) -> Any:
    """The grad mode an output view is rebuilt under: grad mode where its gradient stops at a
    no_grad view (Note [Views of a view taken under no_grad] in joint.py), no_grad where it was
    taken under no_grad, else the caller's."""
    if info.grad_stops:
        return torch.enable_grad()
    return torch.no_grad() if info.no_grad else contextlib.nullcontext()


def _no_grad_alias(t: torch.Tensor) -> torch.Tensor:
    """`t` whole, viewed under no_grad: its views taken in grad mode require grad and lead no
    gradient anywhere, as eager's views of a view taken under no_grad."""
    with torch.no_grad():
        return t.as_strided(t.shape, t.stride(), t.storage_offset())


def _assemble(meta: TraceMeta, inputs: Sequence[torch.Tensor], graph_outs: Sequence[Any]) -> Any:
    flat: list[Any] = [None] * len(meta.outputs)
    # outputs that are other outputs or their views come second: a view's base may follow it
    # (Note [The root among the outputs first] in joint.py)
    second: list[int] = []
    conformed: dict[int, torch.Tensor | None] = {}  # Note [Bases returned in another layout] (joint.py)
    for k, info in enumerate(meta.outputs):
        if info.kind == "graph":
            flat[k] = graph_outs[info.index]
        elif info.kind == "graph_view":  # Note [Views sharing an intermediate that is no output]
            g = graph_outs[info.index]
            traced = _traced_base_stride(info, inputs)
            if not _in_layout(g, traced):
                assert traced is not None
                if info.index not in conformed:  # views of one base alias as eager's: all or none copied
                    views = [o for o in meta.outputs if o.kind == "graph_view" and o.index == info.index]
                    reshaped = all(o.layout is None and _reshaped(g, o, traced) is not None for o in views)
                    conformed[info.index] = None if reshaped else _to_layout(g, traced)
                base = conformed[info.index]
                if base is None:
                    flat[k] = _reshaped(g, info, traced)
                    continue
                g = base
            if info.detach:  # Note [A view laid over an output that does not hold it] (joint.py)
                g = g.detach()
            if info.grad_stops:  # Note [Views of a view taken under no_grad] (joint.py)
                g = _no_grad_alias(g)
            with _view_grad_mode(info):
                if info.layout is not None:  # symbolic sizes: the offset is relative to the base's
                    size, stride, rel = info.layout(inputs)
                    flat[k] = g.as_strided(size, stride, g.storage_offset() + rel)
                else:
                    flat[k] = g.as_strided(info.size, info.stride, g.storage_offset() + info.offset)
        elif info.kind == "input":
            flat[k] = inputs[info.index]
        elif info.kind == "input_view" and info.no_grad:  # Note [Views taken under no_grad]
            with torch.enable_grad() if info.grad_stops else torch.no_grad():
                flat[k] = _input_view(info, inputs)
        elif info.kind == "input_view" and info.grad:  # Note [Views taken in grad mode] (joint.py)
            with torch.enable_grad():
                flat[k] = _input_view(info, inputs)
        elif info.kind == "input_view":
            flat[k] = _input_view(info, inputs)
        elif info.kind in ("output", "output_view"):
            second.append(k)
        else:
            flat[k] = info.value
    for k in second:  # bases in another layout first: every output that is or views one sees the copy
        info = meta.outputs[k]
        if info.kind != "output_view":
            continue
        traced = _traced_base_stride(info, inputs)
        if not _in_layout(flat[info.index], traced):
            assert traced is not None
            flat[info.index] = _to_layout(flat[info.index], traced)
    for k in second:
        info = meta.outputs[k]
        if info.kind == "output":
            flat[k] = flat[info.index]
            continue
        base = flat[info.index]
        if info.detach:  # Note [Detached views of outputs] in joint.py
            base = base.detach()
        if info.grad_stops:  # Note [Views of a view taken under no_grad] (joint.py)
            base = _no_grad_alias(base)
        with _view_grad_mode(info):
            if info.layout is not None:  # symbolic sizes (joint.py)
                size, stride, rel = info.layout(inputs)
                flat[k] = base.as_strided(size, stride, base.storage_offset() + rel)
            elif info.base_offset is None or math.prod(info.size) == 0:  # an empty view addresses nothing
                flat[k] = base.as_strided(info.size, info.stride, info.offset)
            else:  # the offset relative to the base's as traced (Note [Bases returned in another layout])
                flat[k] = base.as_strided(
                    info.size, info.stride, base.storage_offset() + info.offset - info.base_offset
                )
    return tree_unflatten(flat, meta.out_spec)


# Note [Inference graphs of inputs that require grad]: a graph traced in grad mode whose inputs
# require grad is still an inference graph when none of its outputs does (the program computed
# them under `torch.no_grad()`, or from detached values): it has no backward. Its compiled code
# then runs with grad mode off, as the trace did. In grad mode the compiled code's torch calls
# would see inputs that require grad: an extern op written through its out= overload raised
# ("mm(): functions with out=... arguments don't support automatic differentiation", a run-time
# fallback), and one called as a function recorded autograd history on an output that eager
# computed without (its requires_grad True where eager's was False: a wrong answer).
# Write-backs and the rebuilt views of inputs run after it in the caller's grad mode, as before.


def inference_runner(compiled: Compiled, meta: TraceMeta) -> Callable[..., Any]:
    """`run(*flat_inputs)` for a graph without backward."""
    m = len(meta.mutated_inputs)
    compiled = outside_autocast(compiled)  # Note [Compiled graphs run outside autocast]
    if any(meta.input_requires_grad):  # Note [Inference graphs of inputs that require grad]
        compiled = _without_grad(compiled)
    if m == 0 and _plain_outputs(meta) and not meta.metadata_mutations:

        def run_plain(*inputs: torch.Tensor) -> Any:
            out = compiled(*inputs)
            # a tuple (what code generators return) is handed on as it is: no list, no new tuple
            return out if type(out) is tuple else tuple(_as_list(out))

        return run_plain

    def run(*inputs: torch.Tensor) -> Any:
        outs = _as_list(compiled(*inputs))
        return _after_call(meta, inputs, outs, m)  # Note [Failures after the write-back]

    return run


# Note [Outputs the code generator returns as views]: autograd marks every output of a custom
# Function that is a view (of anything, even a tensor made inside it) as "created inside a custom
# Function" and forbids in-place writes into it and its views. A code generator may return a
# graph output as a view of a buffer allocated in another shape (the C++ wrapper's
# `buf0.as_strided((s0 * s1,), (1,), 0)` for `x.t().flatten()` under symbolic sizes, where
# Note [Buffers allocated as their readers view them] does not apply), though the traced value
# is no view: eager's reshape copy is a fresh tensor, and the user's `out.add_(1)` or a resume
# function's write into a view of it (test_alias_fuzz.py seed 3212 under --dynamic true) raised
# "Output 0 of CompiledFunction is a view and is being modified inplace". A user output that
# views an intermediate is no graph output (Note [Views of intermediates leave the Function as
# views of its outputs] in joint.py), so such a view only ever stands for a fresh tensor. The
# Function returns in its place a tensor that is no view, over the same memory (`set_`, no
# copy), when the memory is its alone among the outputs, inputs and saved values; a tensor of
# its own has its own version counter, so where a saved value shares the memory the output is a
# copy instead (a write into it then leaves the value the backward reads alone, as eager's
# saved copy would be). Memory shared with another output or an input stays a view, its
# aliasing kept.
def _own_tensor(t: torch.Tensor, saved: Sequence[Any]) -> torch.Tensor:
    """Note [Outputs the code generator returns as views]: ``t`` as a tensor that is no view."""
    with torch.no_grad():
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and any(isinstance(s, torch.Tensor) and s.untyped_storage().data_ptr() == ptr for s in saved):
            t = _copy_strided(t)  # itself a view (`as_strided` of the copied region): set_ below
            storage = t.untyped_storage()
        own = torch.empty((0,), dtype=t.dtype, device=t.device)
        return own.set_(storage, t.storage_offset(), t.shape, t.stride())


def _views_to_own(result: Sequence[Any], inputs: Sequence[Any], diff: Sequence[int], m: int) -> list[int]:
    """The positions of the user graph outputs that need `_own_tensor` (Note [Outputs the code
    generator returns as views]): differentiable views whose memory no other output or input
    shares."""
    views = [i for i in diff if i >= m and isinstance(result[i], torch.Tensor) and result[i]._is_view()]
    if not views:
        return []
    count: dict[int, int] = {}
    for t in (*result, *inputs):
        if isinstance(t, torch.Tensor):
            ptr = t.untyped_storage().data_ptr()
            count[ptr] = count.get(ptr, 0) + 1
    return [i for i in views if (p := result[i].untyped_storage().data_ptr()) == 0 or count[p] == 1]


# Note [Outputs without grad over the memory of outputs with it]: a code generator may return a
# graph output that does not require grad as the very tensor of one that does, or as a view of
# its buffer (`d = t.detach()` returned beside views of `t`, whose hidden base `t` is a graph
# output: both came back as the wrapper's `buf0`). `mark_non_differentiable` cannot make such a
# tensor stop requiring grad: a view's requires_grad is its base's, and one object is one tensor.
# `d` came back requiring grad where eager's does not. Such an output leaves the Function as a
# detached alias of the same memory.
def _detach_non_diff(
    result: tuple[Any, ...], diff: Sequence[int], non_diff: Sequence[int]
) -> tuple[Any, ...]:
    differentiable = {id(result[j]) for j in diff}
    listed = list(result)
    for i in non_diff:
        t = result[i]
        if isinstance(t, torch.Tensor) and (id(t) in differentiable or t._is_view()):
            listed[i] = t.detach()
    return tuple(listed)


# Note [Compiled graphs run outside autocast]: the trace ran under the caller's autocast state
# (the blocks the program enters are graph nodes, entered for real while tracing), so the aten
# graph already holds every cast autocast made, in explicit dtypes. Run under an active autocast
# region, the compiled code's aten calls (extern matmuls, convolutions, an eager fallback of the
# aten graph) went through the Autocast dispatch keys again, which cast them to the *outer*
# region's dtype: a program entering `torch.autocast("cpu", dtype=torch.bfloat16)` called inside
# a float16 region got float16 results, and an `autocast(enabled=False)` block's float32 matmul
# came back in bfloat16 (its softmax off by 0.98). torch's AOTAutograd runs its compiled code
# with the autocast keys excluded too. Forward, backward and inference graphs run with them
# excluded (`torch._C._DisableAutocast`, which leaves `torch.is_autocast_enabled()` as it was);
# the check costs one C call when no region is active.
def outside_autocast(compiled: Compiled) -> Compiled:
    """`compiled`, called with the autocast dispatch keys excluded while a region is active."""
    any_on = torch._C._is_any_autocast_enabled
    disable = torch._C._DisableAutocast

    def call(*inputs: Any) -> Any:
        if not any_on():
            return compiled(*inputs)
        with disable():
            return compiled(*inputs)

    return call


def _without_grad(compiled: Compiled) -> Compiled:
    def call(*inputs: torch.Tensor) -> Any:
        if not torch.is_grad_enabled():  # the common case (inference under no_grad): no context
            return compiled(*inputs)
        with torch.no_grad():
            return compiled(*inputs)

    return call


# Note [Inputs whose gradient comes only through their new values]: one autograd Function for a
# whole graph has an edge to every input that requires grad, so a backward from any of its
# outputs reaches every input's history, where eager's graph reaches only the inputs that output
# depends on. The autograd engine calls a node it reaches even when every gradient it gets is
# None, and a node whose saved tensors were freed then raises. A module buffer that `b.add_(t)`
# (t requiring grad) left with history requires grad on the next call; that call's outputs read
# nothing of `b`'s old value, but its Function linked to the previous call's graph, whose saved
# tensors the previous backward had freed: "Trying to backward through the graph a second time"
# (test_alias_fuzz.py seed 3127; torch.compile's aot_eager raises the same). So the trace's
# `grad_tangents` (which tangents each input's gradient depends on) sort the inputs:
# - no tangent: the gradient is structurally None; the input is passed detached (no edge), as
#   torch's AOTAutograd detaches inputs whose backward output is None;
# - only tangents of mutated inputs' new values (one at least: a gradient that reads no tangent
#   is a constant and keeps its edge, eager's zeros for `nextafter`'s `other` came back None
#   through a mutation node that had no new value to carry): the Function takes the input detached, and a
#   second node (`MutationNode`) between the Function and the write-back holds its edge: it
#   passes the new values through, and its backward runs the compiled backward with their
#   gradients (zeros for the other outputs) for those inputs' gradients, then hands the new
#   values' gradients on to the Function. The old value's history is then reached only through
#   the input's new value, as in eager; the backward runs twice only when both are reached;
# - a tangent of a user output: an edge on the Function, and a backward from that output
#   reaches the input's history as eager's does (raising where eager raises).
# A graph with both user outputs and new values that require grad has its backward cut in two
# instead (Note [New values differentiated on their own] in joint.py): the Function holds the
# edges the user outputs' gradients need, the mutation node those the new values' need, and
# this plan is not used (it still serves a graph that also changes an input's metadata).
@dataclass(frozen=True, slots=True)
class _EdgePlan:
    none: tuple[int, ...] = ()  # inputs whose gradient is structurally None
    new_value_only: tuple[int, ...] = ()  # inputs reached only through mutated inputs' new values


def _edge_plan(meta: TraceMeta, diff: Sequence[int], reachable: Sequence[frozenset[int]]) -> _EdgePlan:
    """Note [Inputs whose gradient comes only through their new values]."""
    if not reachable:
        return _EdgePlan()
    m = len(meta.mutated_inputs)
    new_values = {k for k, i in enumerate(diff) if i < m}
    metadata = {i for i, *_ in meta.metadata_mutations}
    none: list[int] = []
    new_value_only: list[int] = []
    for i, tangents in zip(meta.grad_inputs, reachable, strict=True):
        if i in metadata:
            continue
        if i in meta.no_gradient:
            none.append(i)
        elif tangents and tangents <= new_values:
            # (a gradient that reads no tangent is a constant, `nextafter`'s zeros for `other`:
            # its edge stays on the Function, as eager's node keeps its edge to the input)
            new_value_only.append(i)
    if len(none) + len(new_value_only) == len(meta.grad_inputs):
        # the Function needs one edge for its outputs to require grad, as eager's do (`x.angle()`
        # of a real `x` requires grad with a zero gradient, traced as None)
        return _EdgePlan()
    if none or new_value_only:
        graphs_log.info(
            "kiln_aotgrad: inputs %s passed detached (no gradient), %s linked through their new values only",
            none,
            new_value_only,
        )
    return _EdgePlan(tuple(none), tuple(new_value_only))


def _first_order_only() -> None:
    if torch.is_grad_enabled():
        raise AotgradError(
            "double backward (create_graph=True) through a kiln_aotgrad compiled graph is not "
            "supported: its backward graph is compiled for first-order gradients only"
        )


# Note [A backward that saved no tensors runs again]: eager's autograd graph frees only saved
# tensors, so a second backward through nodes that saved none (`x1.add_(x0.sum())`: a sum and an
# add) runs, and one through a node whose tensors were freed raises "Trying to backward through
# the graph a second time". A compiled call that saved nothing called `save_for_backward()` all
# the same, and reading `ctx.saved_tensors` after the first backward raised where eager's ran (a
# module buffer written from an input that requires grad carries the call's node into the next
# call's graph: test_alias_fuzz.py seed 22171). Such a call keeps its non-tensor saved values
# on the context instead; one that saved tensors raises eager's error, as eager's would where
# it saved them too (kiln's saved values are chosen by the partition, not eager's).
def _save(ctx: Any, saved: Sequence[Any]) -> None:
    if any(isinstance(s, torch.Tensor) for s in saved):
        ctx.kiln_plain = None
        ctx.save_for_backward(*saved)
    else:
        ctx.kiln_plain = tuple(saved)


def _saved(ctx: Any) -> Sequence[Any]:
    """The saved values of a compiled call, its saved sizes put back (Note [Saved sizes])."""
    saved: Sequence[Any] = ctx.saved_tensors if ctx.kiln_plain is None else ctx.kiln_plain
    if ctx.kiln_sizes:
        saved = list(saved)
        for i, v in ctx.kiln_sizes:
            saved[i] = v
    return saved


@dataclass(frozen=True, slots=True)
class _Half:
    """A compiled backward and the inputs it takes: positions in the forward's saved values,
    then among the tangents (all of both for a backward that is not cut in two: Note [New
    values differentiated on their own] in joint.py)."""

    compiled: Compiled
    saved: tuple[int, ...] | None  # None: all of them, in order
    tangents: tuple[int, ...] | None  # None: all of them
    sizes: tuple[int, ...]  # positions among its saved values of the ints (Note [Saved sizes])

    def keep(self, ctx: Any, saved: list[Any]) -> None:
        """Keep on `ctx` the saved values this half reads, its sizes beside them (Note [A
        backward that saved no tensors runs again])."""
        mine = saved if self.saved is None else [saved[i] for i in self.saved]
        if not self.sizes:
            ctx.kiln_sizes = ()
            _save(ctx, mine)
            return
        ctx.kiln_sizes = [(j, mine[j]) for j in self.sizes]
        mine = list(mine)
        for j in self.sizes:
            mine[j] = None
        _save(ctx, mine)

    def __call__(self, ctx: Any, tangents: list[Any]) -> list[Any]:
        if self.tangents is not None:
            tangents = [tangents[k] for k in self.tangents]
        return _as_list(self.compiled(*_saved(ctx), *tangents))


def _half(
    backward: Compiled | tuple[Compiled, tuple[int, ...]], n_saved: int, saved_sizes: Sequence[int]
) -> _Half:
    if not isinstance(backward, tuple):  # Note [Compiled graphs run outside autocast]
        return _Half(outside_autocast(backward), None, None, tuple(saved_sizes))
    compiled, keep = backward
    saved = tuple(i for i in keep if i < n_saved)
    sizes = tuple(j for j, i in enumerate(saved) if i in saved_sizes)
    return _Half(outside_autocast(compiled), saved, tuple(i - n_saved for i in keep if i >= n_saved), sizes)


def training_runner(
    compiled_fw: Compiled,
    compiled_bw: Compiled | tuple[Compiled, tuple[int, ...]],
    meta: TraceMeta,
    saved_sizes: Sequence[int] = (),
    new_value_backward: tuple[Compiled, tuple[int, ...]] | None = None,
) -> Callable[..., Any]:
    """`run(*flat_inputs)` that records one autograd node for the whole compiled graph.
    `saved_sizes`: positions of the saved values that are ints (Note [Saved sizes] in
    partition.py), kept on the autograd context beside the saved tensors. Where the trace cut
    the backward in two (Note [New values differentiated on their own] in joint.py), each half
    comes with the positions of the backward's inputs it takes (saved values, then tangents):
    `compiled_bw` the user outputs', `new_value_backward` the new values'."""
    n_out = meta.num_graph_outputs
    m = len(meta.mutated_inputs)
    compiled_fw = outside_autocast(compiled_fw)  # Note [Compiled graphs run outside autocast]
    diff = [i for i, r in enumerate(meta.graph_out_requires_grad) if r]
    non_diff = [i for i, r in enumerate(meta.graph_out_requires_grad) if not r]
    grad_inputs = meta.grad_inputs
    num_inputs = meta.num_inputs

    reachable = list(getattr(meta, "grad_tangents", []) or [])
    if len(reachable) != len(grad_inputs):
        reachable = []
    # positions in `diff` (tangents) of the mutated inputs' new values that require grad
    new_value_tangents = [k for k, i in enumerate(diff) if i < m]
    split = meta.new_value_grads is not None and new_value_backward is not None
    read = split and meta.new_value_grads is not None and meta.new_value_grads.read
    if split:
        # Note [New values differentiated on their own]: the Function holds the edges of the
        # inputs the user outputs' gradients reach, the mutation node those the new values'
        # reach (each all of them where it would hold none: its outputs must require grad)
        assert meta.new_value_grads is not None
        user_edges = [i for i in grad_inputs if i not in meta.no_gradient] or list(grad_inputs)
        value_edges = [i for i in grad_inputs if i not in meta.new_value_grads.no_gradient] or list(
            grad_inputs
        )
        plan = _EdgePlan()
        detached = set(grad_inputs) - set(user_edges)
    else:
        # Note [Inputs whose gradient comes only through their new values]: which inputs the
        # Function takes with their autograd edge, and which go to the mutation node instead
        plan = _edge_plan(meta, diff, reachable)
        detached = set(plan.none) | set(plan.new_value_only)
        value_edges = list(plan.new_value_only)
    logged: list[bool] = []  # Note [Outputs the code generator returns as views], logged once
    halves: list[_Half] = []  # built at the first call, which knows how many values are saved

    def backwards(n_saved: int) -> list[_Half]:
        if not halves:
            halves.append(_half(compiled_bw, n_saved, saved_sizes))
            if split:
                assert new_value_backward is not None
                halves.append(_half(new_value_backward, n_saved, saved_sizes))
            else:
                halves.append(halves[0])
        return halves

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            stash, inputs = args[0], args[1:]
            outs = _as_list(compiled_fw(*inputs))
            saved = outs[n_out:]
            if meta.mutated_inputs:
                # A saved input that the write-back will overwrite: keep its pre-mutation value.
                written = {inputs[i].untyped_storage().data_ptr() for i in meta.mutated_inputs}
                saved = [
                    _copy_strided(s)
                    if isinstance(s, torch.Tensor) and s.untyped_storage().data_ptr() in written
                    else s
                    for s in saved
                ]
            user = halves[0] if halves else backwards(len(saved))[0]
            user.keep(ctx, saved)  # Note [A backward that saved no tensors runs again]
            result = tuple(outs[:n_out])
            own = _views_to_own(result, inputs, diff, m)
            if own:  # Note [Outputs the code generator returns as views]
                if not logged:
                    logged.append(True)
                    graphs_log.info(
                        "kiln_aotgrad: graph outputs %s came back as views; returned as tensors of their own",
                        own,
                    )
                listed = list(result)
                for i in own:
                    listed[i] = _own_tensor(listed[i], saved)
                result = tuple(listed)
            if diff and non_diff:  # Note [Outputs without grad over the memory of outputs with it]
                result = _detach_non_diff(result, diff, non_diff)
            if reachable or stash is not None:
                ctx.kiln_zeros = [(result[i].shape, result[i].dtype, result[i].device) for i in diff]
            if stash is not None:  # for the mutation node, which runs the backward again
                stash.extend((saved, ctx.kiln_zeros, ctx if read else None))
            if reachable:  # Note [Gradients that no read output reaches] in joint.py
                ctx.set_materialize_grads(False)
            # a symbolic size among the outputs (`x.shape[0] * 2` under dynamic shapes) is an int,
            # which mark_non_differentiable refuses ("only accepts variable arguments")
            ctx.mark_non_differentiable(*[result[i] for i in non_diff if isinstance(result[i], torch.Tensor)])
            return result

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            _first_order_only()
            if read:  # Note [New values differentiated on their own] in joint.py
                ctx.kiln_ran = True
            user = halves[0]
            tangents: list[Any] = [None] * len(diff)
            absent: set[int] = set()
            for k in range(len(diff)) if user.tangents is None else user.tangents:
                g = grads[diff[k]]
                if g is None and reachable:
                    absent.add(k)
                    shape, dtype, device = ctx.kiln_zeros[k]
                    g = torch.zeros(shape, dtype=dtype, device=device)
                tangents[k] = g.contiguous() if g is not None else None
            out = user(ctx, tangents)
            result: list[Any] = [None] * num_inputs
            for k, (i, g) in enumerate(zip(grad_inputs, out, strict=True)):
                if i in detached:
                    continue  # no edge (the mutation node hands out a new-value-only gradient)
                # a gradient reached only through outputs the loss never read is eager's None
                result[i] = None if absent and reachable[k] and reachable[k] <= absent else g
            return (None, *result)

    class MutationNode(torch.autograd.Function):
        """Note [Inputs whose gradient comes only through their new values]: the new values of
        mutated inputs, passed through, with the autograd edges of the inputs whose gradient
        only they carry (of all the inputs they reach where the backward is cut in two: Note
        [New values differentiated on their own] in joint.py)."""

        @staticmethod
        def forward(ctx: Any, stash: list[Any], *args: Any) -> Any:
            saved, zeros, user = stash
            ctx.kiln_zeros = zeros
            halves[1].keep(ctx, saved)
            # the Function whose backward computed a user output's gradient through the new
            # values (Note [New values differentiated on their own] in joint.py); only while
            # this node keeps saved tensors of its own
            ctx.kiln_user = user if ctx.kiln_plain is None else None
            values = args[len(value_edges) :]
            return tuple(values)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            _first_order_only()
            user = ctx.kiln_user
            if user is not None and getattr(user, "kiln_ran", False) and user.kiln_plain is None:
                # eager's first backward ran the write's node already: raises eager's error
                # where it freed the node's tensors (where it retained them, this reads them)
                _ = user.saved_tensors
            half = halves[1]
            tangents: list[Any] = [None] * len(diff)
            for k in range(len(diff)) if half.tangents is None else half.tangents:
                shape, dtype, device = ctx.kiln_zeros[k]
                tangents[k] = torch.zeros(shape, dtype=dtype, device=device)
            for k, g in zip(new_value_tangents, grads, strict=True):
                if g is not None:
                    tangents[k] = g.contiguous()
            out = half(ctx, tangents)
            by_input = dict(zip(grad_inputs, out, strict=True))
            # where the backward is cut in two, the values came in detached (apply)
            passed = [None] * len(grads) if split else list(grads)
            return (None, *[by_input[i] for i in value_edges], *passed)

    def apply(inputs: Sequence[torch.Tensor]) -> list[Any]:
        if not detached and not split:
            return _as_list(CompiledFunction.apply(None, *inputs))
        args = [x.detach() if i in detached else x for i, x in enumerate(inputs)]
        if not value_edges:
            return _as_list(CompiledFunction.apply(None, *args))
        stash: list[Any] = []
        outs = _as_list(CompiledFunction.apply(stash, *args))
        values = [outs[diff[k]] for k in new_value_tangents]
        if torch.is_grad_enabled():
            # where the backward is cut in two, the mutation node holds no edge to the Function:
            # the engine calls every node it reaches, with None gradients too, and the Function's
            # freed saved tensors would raise
            passed = [v.detach() for v in values] if split else values
            values = list(MutationNode.apply(stash, *[inputs[i] for i in value_edges], *passed))
        for k, v in zip(new_value_tangents, values, strict=True):
            outs[diff[k]] = v
        return outs

    if m == 0 and _plain_outputs(meta) and not meta.metadata_mutations:

        def run_plain(*inputs: torch.Tensor) -> Any:
            return tuple(apply(inputs))

        return run_plain

    def run(*inputs: torch.Tensor) -> Any:
        outs = apply(inputs)
        return _after_call(meta, inputs, outs, m)  # Note [Failures after the write-back]

    return run
