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

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from kiln_aotgrad.functionalize import SELF, ViewStep
from kiln_aotgrad.joint import OutputInfo, TraceMeta
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
# `KILN_BATCHED_WRITE_BACK=0` turns it off. Storing the new value from the kernel that computes it
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
                torch._foreach_copy_(targets, list(new_values))  # Note [Write-backs in one call]
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
    if info.views:  # Note [Views that change dtype]
        return _replay(info.views, base)
    if info.layout is not None:  # symbolic sizes (joint.py)
        return base.as_strided(*info.layout(inputs))
    # Note [Static views of inputs start at the input's offset] in joint.py: the offset is relative
    return base.as_strided(info.size, info.stride, base.storage_offset() + info.offset)


def _assemble(meta: TraceMeta, inputs: Sequence[torch.Tensor], graph_outs: Sequence[Any]) -> Any:
    flat: list[Any] = [None] * len(meta.outputs)
    # outputs that are other outputs or their views come second: a view's base may follow it
    # (Note [The root among the outputs first] in joint.py)
    second: list[int] = []
    for k, info in enumerate(meta.outputs):
        if info.kind == "graph":
            flat[k] = graph_outs[info.index]
        elif info.kind == "graph_view":  # Note [Views sharing an intermediate that is no output]
            g = graph_outs[info.index]
            if info.layout is not None:  # symbolic sizes: the offset is relative to the base's
                size, stride, rel = info.layout(inputs)
                flat[k] = g.as_strided(size, stride, g.storage_offset() + rel)
            else:
                flat[k] = g.as_strided(info.size, info.stride, g.storage_offset() + info.offset)
        elif info.kind == "input":
            flat[k] = inputs[info.index]
        elif info.kind == "input_view" and info.no_grad:  # Note [Views taken under no_grad]
            with torch.no_grad():
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
    for k in second:
        info = meta.outputs[k]
        if info.kind == "output":
            flat[k] = flat[info.index]
        elif info.layout is not None:  # symbolic sizes (joint.py)
            base = flat[info.index]
            size, stride, rel = info.layout(inputs)
            flat[k] = base.as_strided(size, stride, base.storage_offset() + rel)
        else:
            flat[k] = flat[info.index].as_strided(info.size, info.stride, info.offset)
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
    if any(meta.input_requires_grad):  # Note [Inference graphs of inputs that require grad]
        compiled = _without_grad(compiled)
    if m == 0 and _plain_outputs(meta) and not meta.metadata_mutations:

        def run_plain(*inputs: torch.Tensor) -> Any:
            return tuple(_as_list(compiled(*inputs)))

        return run_plain

    def run(*inputs: torch.Tensor) -> Any:
        outs = _as_list(compiled(*inputs))
        return _after_call(meta, inputs, outs, m)  # Note [Failures after the write-back]

    return run


def _without_grad(compiled: Compiled) -> Compiled:
    def call(*inputs: torch.Tensor) -> Any:
        if not torch.is_grad_enabled():  # the common case (inference under no_grad): no context
            return compiled(*inputs)
        with torch.no_grad():
            return compiled(*inputs)

    return call


def training_runner(
    compiled_fw: Compiled, compiled_bw: Compiled, meta: TraceMeta, saved_sizes: Sequence[int] = ()
) -> Callable[..., Any]:
    """`run(*flat_inputs)` that records one autograd node for the whole compiled graph.
    `saved_sizes`: positions of the saved values that are ints (Note [Saved sizes] in
    partition.py), kept on the autograd context beside the saved tensors."""
    n_out = meta.num_graph_outputs
    m = len(meta.mutated_inputs)
    diff = [i for i, r in enumerate(meta.graph_out_requires_grad) if r]
    non_diff = [i for i, r in enumerate(meta.graph_out_requires_grad) if not r]
    grad_inputs = meta.grad_inputs
    num_inputs = meta.num_inputs

    reachable = list(getattr(meta, "grad_tangents", []) or [])
    if len(reachable) != len(grad_inputs):
        reachable = []

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: torch.Tensor) -> Any:
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
            if saved_sizes:
                ctx.kiln_sizes = [(i, saved[i]) for i in saved_sizes]
                saved = [None if i in saved_sizes else s for i, s in enumerate(saved)]
            ctx.save_for_backward(*saved)
            result = tuple(outs[:n_out])
            if reachable:  # Note [Gradients that no read output reaches] in joint.py
                ctx.set_materialize_grads(False)
                ctx.kiln_zeros = [(result[i].shape, result[i].dtype, result[i].device) for i in diff]
            ctx.mark_non_differentiable(*[result[i] for i in non_diff])
            return result

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            if torch.is_grad_enabled():
                raise AotgradError(
                    "double backward (create_graph=True) through a kiln_aotgrad compiled graph is not "
                    "supported: its backward graph is compiled for first-order gradients only"
                )
            tangents = []
            absent: set[int] = set()
            for k, i in enumerate(diff):
                g = grads[i]
                if g is None and reachable:
                    absent.add(k)
                    shape, dtype, device = ctx.kiln_zeros[k]
                    g = torch.zeros(shape, dtype=dtype, device=device)
                tangents.append(g.contiguous() if g is not None else None)
            saved = ctx.saved_tensors
            if saved_sizes:
                saved = list(saved)
                for i, v in ctx.kiln_sizes:
                    saved[i] = v
            out = _as_list(compiled_bw(*saved, *tangents))
            result: list[Any] = [None] * num_inputs
            for k, (i, g) in enumerate(zip(grad_inputs, out, strict=True)):
                # a gradient reached only through outputs the loss never read is eager's None
                result[i] = None if absent and reachable[k] and reachable[k] <= absent else g
            return tuple(result)

    if m == 0 and _plain_outputs(meta) and not meta.metadata_mutations:

        def run_plain(*inputs: torch.Tensor) -> Any:
            return tuple(_as_list(CompiledFunction.apply(*inputs)))

        return run_plain

    def run(*inputs: torch.Tensor) -> Any:
        outs = CompiledFunction.apply(*inputs)
        outs = _as_list(outs)
        return _after_call(meta, inputs, outs, m)  # Note [Failures after the write-back]

    return run
