"""PyTorch's OpInfo database through `kiln.compile` on the CPU: every sample compared with eager.

Each sample `op(input, *args, **kwargs)` is called through a compiled frame (dynamo -> aotgrad ->
loopir -> C++) and through eager, on separate clones of the sample, and sorted into one outcome:

  pass      compiled (no fallback anywhere) and the same as eager;
  mismatch  kiln returned something else than eager: values (assert_close), shape, dtype, Python
            types and structure of the result, the strides and storage of an output that is a
            view of an input in eager, memory an output shares with an input or another output
            where eager's does not, or the inputs after the call (mutations);
  error     kiln raised where eager ran (or raised another exception type than eager);
  fallback  the result was right but some of it ran eagerly: a frame not captured, or a backend
            fallback with a warning, or a kernel the code generator declined and loopir's
            reference interpreter ran (the reason is recorded).

Samples that eager itself rejects, that return nothing tensor-like, or whose op is random or reads
uninitialized memory are not compared. Run as a script for the whole table:

    python packages/kiln/tests/opinfo_sweep.py [--samples 3] [--shard I/N] [--ops a,b] [--json F]
        [--dtype float32|bfloat16|float16] [--cpu-backend cpp|triton] [--grad] [--dynamic none|true|auto]
        [--grow] [--layout contiguous|transposed|strided|offset|channels_last|mixed]

Note [The test harness's RNG wrapper runs outside the frame]: some OpInfos (scaled_dot_product_attention,
multi_head_attention_forward, svd_lowrank, pca_lowrank) call their op through the test suite's
``wrapper_set_seed``, which saves the RNG state, seeds 42, calls the op and restores the state
(``freeze_rng_state``: ``no_dispatch``, ``get_rng_state``). That is harness hygiene, not the op:
inside a compiled frame it is a graph break, so the op ran eagerly. The sweep does the same
save/seed/restore itself around each call, outside the frame (``seeded_calls``), and the lambda's
``wrapper_set_seed`` only calls the op while the sweep runs; eager and the compiled frame then see
the same seed, and the op itself is what kiln compiles.

`--cpu-backend triton` compiles through the Triton code generator instead of the C++ one
(`kiln.compile(options={"cpu_backend": "triton"})`), its kernels run by Triton's interpreter
(the script sets `TRITON_INTERPRET=1`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import os
import random
import sys
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

import kiln
import kiln_dynamo

# Random results or uninitialized memory: nothing to compare.
NONDETERMINISTIC = (
    "rand", "normal", "bernoulli", "multinomial", "uniform", "empty", "cauchy", "exponential",
    "geometric", "log_normal", "dropout", "rrelu", "fractional_max_pool", "new_empty",
)  # fmt: skip

# (rtol, atol) by dtype, after a different summation order (C++ vectorized reductions)
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}
RTOL, ATOL = TOLERANCES[torch.float32]


# op -> why (some of) it runs eagerly. None of these is kiln_aotgrad's, loopir's or codegen's to
# compile: each is a graph break or a frame kiln_dynamo does not capture. (nonzero, argwhere and
# masked_select compile whole with unbacked sizes on the C++ generator since the seventh session.)
_DATA = "graph break: needs tensor data while tracing"
_NO_META = "graph break: the op has no meta kernel (no fake tensor can describe its result)"
KNOWN_FALLBACKS: dict[str, str] = {
    "cov": f"{_DATA} (aten::equal on a norm factor computed from input weights)",
    "narrow": f"{_DATA} (a tensor start is read as an int)",
    "nn.functional.gaussian_nll_loss": f"{_DATA} (an input check reads a value)",
    "tensor_split": "graph break: tensor_split with tensor indices reads their data",
    "nn.functional.ctc_loss": f"{_NO_META}: _ctc_loss.Tensor's log_alpha is sized by max(target_lengths)",
    "sparse.sampled_addmm": "not captured: sparse (non-strided) tensor input",
    "nn.functional.linear_cross_entropy.chunked": "not captured: a LinearCrossEntropyOptions argument",
    "nn.functional.linear_cross_entropy.chunked_none": "not captured: a LinearCrossEntropyOptions argument",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    op: str
    sample: int
    kind: str  # pass / mismatch / error / fallback
    detail: str = ""


def eligible(info: Any, dtype: torch.dtype = torch.float32, device: str = "cpu") -> bool:
    return not any(s in info.name for s in NONDETERMINISTIC) and dtype in info.supported_dtypes(device)


def key(info: Any) -> str:
    return f"{info.name}.{info.variant_test_name}".rstrip(".")


def _clone(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


LAYOUTS = ("contiguous", "transposed", "strided", "offset", "channels_last", "mixed")


def _relaid_one(t: torch.Tensor, layout: str) -> torch.Tensor:
    """`t`'s values, dtype and shape stored in `layout` (Note [Layouts in the sweep]); a
    detached tensor, contiguous where the layout does not apply to `t`'s rank."""
    t = t.detach()
    shape = t.shape
    if layout == "transposed" and t.dim() >= 2:
        rev = tuple(range(t.dim() - 1, -1, -1))
        return t.permute(rev).contiguous().permute(rev)
    if layout == "strided" and t.dim() >= 1:
        buf = torch.zeros((*shape[:-1], 2 * shape[-1]), dtype=t.dtype, device=t.device)
        out = buf[..., ::2]
        out.copy_(t)
        return out
    if layout == "offset":
        offset = 3
        buf = torch.zeros(t.numel() + offset + 2, dtype=t.dtype, device=t.device)
        out = buf.as_strided(shape, t.contiguous().stride(), offset)
        out.copy_(t)
        return out
    if layout == "channels_last" and t.dim() in (4, 5):
        fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        return t.contiguous(memory_format=fmt)
    return t.clone(memory_format=torch.contiguous_format)


class Relayout:
    """Note [Layouts in the sweep]: OpInfo samples are almost all contiguous, but programs hand
    compiled code transposed, sliced, strided, offset and channels-last tensors, and both code
    generators index them by strides. `--layout L` replaces every tensor argument of a sample
    (the input, tensors in args, kwargs and lists) before the call by one with the same values,
    dtype, shape and requires_grad stored another way: `transposed` dims reversed in memory
    (ndim >= 2), `strided` every element at step 2 of a buffer twice as long in the last dim,
    `offset` a contiguous view at storage offset 3 of a larger buffer, `channels_last`
    channels-last (channels-last-3d for 5-d), `mixed` a choice among all of these per argument,
    seeded by the sample's index so eager's and kiln's clones agree. A layout that does not fit
    a tensor's rank leaves it contiguous. The relaid tensor is itself the leaf (a view of a
    buffer that does not require grad), so `--grad` compares its `.grad`."""

    def __init__(self, layout: str, seed: int) -> None:
        self.layout = layout
        self.rng = random.Random(seed)

    def __call__(self, x: Any, leaf: bool = False) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if x.layout != torch.strided or self.layout == "contiguous":
            return x.detach().clone().requires_grad_(x.requires_grad and leaf)
        layout = self.layout
        if layout == "mixed":
            layout = self.rng.choice(LAYOUTS[:-1])
        out = _relaid_one(x, layout)
        return out.requires_grad_(x.requires_grad and leaf)


def _relaid(sample_args: Any, layout: str, seed: int, leaf: bool) -> Any:
    """Clones of (input, args, kwargs) in `layout` (Note [Layouts in the sweep])."""
    relay = Relayout(layout, seed)
    return tree_map(lambda x: relay(x, leaf), sample_args)


def _eager_as_sampled(frame: Any, sample: Any, index: int, grad: bool) -> tuple[Any, list[Any]] | None:
    """Eager's answer and tensor arguments on clones of the sample as OpInfo stored it (Note
    [Eager that reads a layout wrong]); None where that run raises.

    Note [Eager that reads a layout wrong]: the layout sweep hands an op the same values stored
    another way, so eager's answer must not move. Where it does, one of eager's two runs read
    its arguments by a layout they do not have: ``torch.native_group_norm`` reads its weight and
    bias as if contiguous (``F.group_norm`` makes them contiguous before calling it), so with a
    weight at stride 2 eager scales channel ``c`` by the ``c``-th element of the weight's memory:
    ``weight[0]``, the gap after it, ``weight[1]``, ... That answer is no contract for kiln to
    keep (kiln's is ``F.group_norm``'s, and the contiguous weight's); the sample as OpInfo wrote
    it, the layout its authors ran, is. Where kiln differs from eager on the relaid arguments
    and eager on the sample's own differs too (outputs, or gradients), kiln is judged against
    the latter, and the sample passes with a detail that says so (printed by the run)."""
    args = _relaid((sample.input, sample.args, sample.kwargs), "contiguous", index, grad)
    try:
        plain = _seeded(frame, *args)
    except Exception:
        return None
    return plain, [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]


def _eager_gradients_as_sampled(frame: Any, sample: Any, index: int) -> list[Any] | None:
    """The gradients of eager's run on the sample as OpInfo stored it (Note [Eager that reads a
    layout wrong]); None where that run or its backward raises."""
    as_sampled = _eager_as_sampled(frame, sample, index, True)
    try:
        return None if as_sampled is None else _gradients(*as_sampled)
    except Exception:
        return None


def _view_problem(
    c: torch.Tensor, e: torch.Tensor, c_in: list[torch.Tensor], e_in: list[torch.Tensor]
) -> str:
    """An eager output that is a view of input i must be a view of kiln's input i, same geometry."""
    for i, (ci, ei) in enumerate(zip(c_in, e_in, strict=True)):
        if e.numel() and ei.numel() and e.untyped_storage().data_ptr() == ei.untyped_storage().data_ptr():
            if c.untyped_storage().data_ptr() != ci.untyped_storage().data_ptr():
                return f"eager returns a view of input {i}, kiln a new tensor"
            if (c.stride(), c.storage_offset()) != (e.stride(), e.storage_offset()):
                return (
                    f"view of input {i}: strides/offset {c.stride()}/{c.storage_offset()}, "
                    f"eager {e.stride()}/{e.storage_offset()}"
                )
    return ""


def _storage(t: torch.Tensor) -> int | None:
    return t.untyped_storage().data_ptr() if t.numel() else None


def _sharing_problem(
    got: list[Any], want: list[Any], c_in: list[torch.Tensor], e_in: list[torch.Tensor]
) -> str:
    """Note [Memory kiln shares where eager does not]: an output of kiln's that shares memory with
    an input, or with another output, where eager's does not is a wrong answer waiting for an
    in-place update (``permute_copy(x)`` returned a view of ``x`` until the fifteenth session);
    `_view_problem` checks the other direction."""
    pairs = [(g, w) for g, w in zip(got, want, strict=True) if isinstance(g, torch.Tensor)]
    for k, (g, w) in enumerate(pairs):
        ptr = _storage(g)
        if ptr is None:
            continue
        for i, (ci, ei) in enumerate(zip(c_in, e_in, strict=True)):
            if ptr == _storage(ci) and _storage(w) != _storage(ei):
                return f"output {k} shares memory with input {i}, eager's does not"
        for j, (g2, w2) in enumerate(pairs[:k]):
            if ptr == _storage(g2) and _storage(w) != _storage(w2):
                return f"outputs {j} and {k} share memory, eager's do not"
    return ""


def _upcast(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16):
        return x.detach().to(torch.float64)
    return _clone(x)


def _close(a: torch.Tensor, b: torch.Tensor, tol: tuple[float, float]) -> torch.Tensor:
    return torch.isclose(a, b, rtol=tol[0], atol=tol[1], equal_nan=True)


def no_less_accurate(got: torch.Tensor, want: torch.Tensor, exact: Any, tol: tuple[float, float]) -> bool:
    """Note [Low-precision results]: kiln computes bfloat16/float16 math in float32 and rounds
    where eager's ops store, so where eager rounds an intermediate (or overflows it: float16
    `exp` to inf) the two can differ beyond the dtype's tolerance with kiln the nearer to the
    true value. So where an element of kiln's `got` is not close to eager's `want`, it passes
    if it is at least as close as eager's to the float64 answer `exact` (the sample run in
    float64) and within four times the dtype's tolerance of it (a sum that cancels loses a few
    of its summands' ulps whoever rounds: hinge-embedding loss, bfloat16, eager -0.734, kiln
    -0.609, float64 -0.651). Element by element: one wrong element is never averaged away, and
    a value near nothing true never passes because eager's is worse (float16 overflow to inf)."""
    if not isinstance(exact, torch.Tensor) or exact.shape != want.shape or not want.dtype.is_floating_point:
        return False
    g, w, r = got.double(), want.double(), exact.double()
    nearer = (g - r).abs().nan_to_num(nan=math.inf) <= (w - r).abs().nan_to_num(nan=math.inf)
    near_exact = _close(g, r, (4 * tol[0], 4 * tol[1]))
    return bool((_close(g, w, tol) | (near_exact & nearer)).all())


# op -> the positions of its flattened outputs whose values eager leaves undefined (memory from
# `empty`): they are compared by type, shape and dtype only
_UNSET_RNG = frozenset({2, 3})  # the philox seed and offset: `empty` when dropout_p is 0
UNDEFINED_OUTPUTS: dict[str, frozenset[int]] = {
    "torch.ops.aten._efficient_attention_forward": _UNSET_RNG,
    "torch.ops.aten._flash_attention_forward": _UNSET_RNG,
}


def compare(
    got: Any,
    want: Any,
    c_in: list[torch.Tensor],
    e_in: list[torch.Tensor],
    tol: tuple[float, float] = (RTOL, ATOL),
    exact: Any = None,
    undefined: frozenset[int] = frozenset(),
) -> str:
    """Empty when `got` is what eager returned (values, shapes, dtypes, types, views); else why not.
    `exact`: the float64 answer of a low-precision sample (Note [Low-precision results]);
    `undefined`: output positions whose values eager does not define (UNDEFINED_OUTPUTS)."""
    g_leaves, g_spec = tree_flatten(got)
    w_leaves, w_spec = tree_flatten(want)
    r_leaves, r_spec = tree_flatten(exact)
    if r_spec != w_spec:
        r_leaves = [None] * len(w_leaves)
    if g_spec != w_spec:
        return f"structure {g_spec} != eager {w_spec}"
    for i, (g, w, r) in enumerate(zip(g_leaves, w_leaves, r_leaves, strict=True)):
        if type(g) is not type(w) and not (isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor)):
            return f"output {i}: type {type(g).__name__} != eager {type(w).__name__}"
        if isinstance(w, torch.Tensor):
            if (g.shape, g.dtype, g.device) != (w.shape, w.dtype, w.device):
                return f"output {i}: {tuple(g.shape)} {g.dtype} {g.device} != eager {tuple(w.shape)} {w.dtype} {w.device}"
            if i in undefined:
                continue
            try:
                torch.testing.assert_close(g, w, rtol=tol[0], atol=tol[1], equal_nan=True, check_stride=False)
            except AssertionError as exc:
                if not no_less_accurate(g, w, r, tol):
                    return f"output {i}: {str(exc).splitlines()[0]} {' '.join(str(exc).splitlines()[1:3])}"
            problem = _view_problem(g, w, c_in, e_in)
            if problem:
                return f"output {i}: {problem}"
        elif (
            i not in undefined
            and g != w
            and not (isinstance(w, float) and isinstance(g, float) and math.isnan(w) and math.isnan(g))
        ):
            return f"output {i}: {g!r} != eager {w!r}"
    problem = _sharing_problem(g_leaves, w_leaves, c_in, e_in) if c_in else ""
    if problem:
        return problem
    for i, (ci, ei) in enumerate(zip(c_in, e_in, strict=True)):
        try:
            torch.testing.assert_close(ci, ei, rtol=tol[0], atol=tol[1], equal_nan=True, check_stride=False)
        except AssertionError as exc:
            return f"input {i} after the call: {str(exc).splitlines()[0]}"
    return ""


SEED = 42  # wrapper_set_seed's


def _call_op(op: Any, *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


@contextlib.contextmanager
def seeded_calls() -> Any:
    """While the sweep runs an op: the OpInfos' ``wrapper_set_seed`` only calls the op (Note [The
    test harness's RNG wrapper runs outside the frame]); `_seeded` does its seeding instead."""
    from torch.testing._internal import common_methods_invocations as cmi

    saved = cmi.wrapper_set_seed
    cmi.wrapper_set_seed = _call_op
    try:
        yield
    finally:
        cmi.wrapper_set_seed = saved


def _seeded(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` from the RNG state ``wrapper_set_seed`` gives, the caller's state restored."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return fn(*args)


def _clone_leaf(x: Any) -> Any:
    """A clone that is a leaf requiring grad where `x` requires grad (Note [Gradients in the sweep])."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


def _gradients(out: Any, inputs: list[torch.Tensor]) -> list[torch.Tensor | None] | None:
    """Note [Gradients in the sweep]: with `--grad` the samples require grad (ops that support
    autograd), and after the forward is compared, the same random cotangent for every
    differentiable output is pulled back through eager's and kiln's results; the gradients of
    the inputs must match. None when no output is differentiable."""
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    outs = [t for t in outs if t.dtype.is_floating_point or t.dtype.is_complex]
    wrt = [t for t in inputs if t.requires_grad]
    if not outs or not wrt:
        return None
    gen = torch.Generator().manual_seed(1234)
    cots = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype) for t in outs]
    grads = torch.autograd.grad(outs, wrt, cots, allow_unused=True)
    return [g.detach() if g is not None else None for g in grads]


def _frame(op: Any) -> Any:
    def frame(inp: Any, args: Any, kwargs: Any, op: Any = op) -> Any:
        return op(inp, *args, **kwargs)

    return frame


def run_sample(
    info: Any,
    index: int,
    sample: Any,
    dtype: torch.dtype = torch.float32,
    cpu_backend: str = "cpp",
    grad: bool = False,
    compiled: Any = None,
    layout: str = "contiguous",
) -> Outcome | None:
    """One sample's outcome, or None when eager rejects it or it returns nothing comparable.
    `compiled`: the op's compiled frame that earlier samples ran through (Note [Dynamic shapes in
    the sweep]); without it, a fresh compile of this sample alone. `layout`: how its tensor
    arguments are stored (Note [Layouts in the sweep])."""
    op, name = info.op, key(info)
    frame = _frame(op)
    if layout == "contiguous":
        clone = _clone_leaf if grad else _clone
        e_args = tree_map(clone, (sample.input, sample.args, sample.kwargs))
        c_args = tree_map(clone, (sample.input, sample.args, sample.kwargs))
    else:  # Note [Layouts in the sweep]
        e_args = _relaid((sample.input, sample.args, sample.kwargs), layout, index, grad)
        c_args = _relaid((sample.input, sample.args, sample.kwargs), layout, index, grad)
    try:
        want = _seeded(frame, *e_args)
    except Exception:
        return None
    if not any(isinstance(t, torch.Tensor) for t in tree_flatten(want)[0]):
        return None
    if compiled is None:
        kiln.reset()
        compiled = kiln.compile(frame, options={"cpu_backend": cpu_backend})
    compiled_before = len(kiln.compile_log())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got = _seeded(compiled, *c_args)
        except Exception as exc:
            return Outcome(name, index, "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    e_in = [t for t in tree_flatten(e_args)[0] if isinstance(t, torch.Tensor)]
    c_in = [t for t in tree_flatten(c_args)[0] if isinstance(t, torch.Tensor)]
    exact = None
    if dtype in (torch.bfloat16, torch.float16):  # Note [Low-precision results]
        try:
            exact = _seeded(frame, *tree_map(_upcast, (sample.input, sample.args, sample.kwargs)))
        except Exception:
            exact = None
    undefined = UNDEFINED_OUTPUTS.get(name, frozenset())
    problem = compare(got, want, c_in, e_in, TOLERANCES[dtype], exact, undefined)
    eager_note = ""
    if problem and layout != "contiguous":  # Note [Eager that reads a layout wrong]
        as_sampled = _eager_as_sampled(frame, sample, index, grad)
        if as_sampled is not None and compare(as_sampled[0], want, [], [], TOLERANCES[dtype]):
            want, e_in = as_sampled
            problem = compare(got, want, c_in, e_in, TOLERANCES[dtype], exact, undefined)
            eager_note = f"eager's answer moves with the layout ({layout}): judged by the sample as stored"
    if problem:
        return Outcome(name, index, "mismatch", problem[:400])
    if grad:  # Note [Gradients in the sweep]
        try:
            want_grads = _gradients(want, e_in)
        except Exception:
            want_grads = None
        if want_grads is not None:
            try:
                got_grads = _gradients(got, c_in)
            except Exception as exc:
                msg = f"backward: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                return Outcome(name, index, "error", msg)
            grad_tol = TOLERANCES[dtype] if dtype != torch.float32 else (1e-3, 1e-4)
            problem = compare(got_grads, want_grads, [], [], grad_tol)
            # Note [Eager that reads a layout wrong]
            if problem and layout != "contiguous" and not eager_note:
                plain_grads = _eager_gradients_as_sampled(frame, sample, index)
                if plain_grads is not None and compare(plain_grads, want_grads, [], [], grad_tol):
                    problem = compare(got_grads, plain_grads, [], [], grad_tol)
                    eager_note = f"eager's gradients move with the layout ({layout}): judged by the sample's"
            if problem:
                return Outcome(name, index, "mismatch", f"gradients: {problem}"[:400])
    stats = kiln.capture_stats()
    judged = kiln.compile_log()
    if len(judged) > compiled_before and not stats.break_reasons:  # Note [Dynamic shapes in the sweep]
        judged = judged[compiled_before:]
    fell_back = [r.fell_back for r in judged if r.fell_back]
    # a graph the backend refused (symbolic sizes it cannot take) was captured again: not compiled
    compiled_graphs = stats.graphs - len(kiln_dynamo.counters.dynamic_fallbacks)
    if stats.frames_not_captured or compiled_graphs == 0:
        if stats.frames_not_captured:
            reason = stats.frames_not_captured[0][1]
        elif stats.break_reasons:
            reason = f"graph break: {str(stats.break_reasons[0]).splitlines()[0]}"
        else:
            reason = "no graph"
        return Outcome(name, index, "fallback", f"not captured: {reason[:300]}")
    if fell_back:
        return Outcome(name, index, "fallback", f"backend: {fell_back[0].splitlines()[0][:300]}")
    backend_warnings = [str(w.message) for w in caught if "kiln backend" in str(w.message)]
    if backend_warnings:
        return Outcome(name, index, "fallback", backend_warnings[0].splitlines()[0][:300])
    declined = [d for r in judged for d in r.declined]
    if declined:
        return Outcome(
            name, index, "fallback", f"kernel {declined[0][0]} interpreted: {declined[0][1][:250]}"
        )
    return Outcome(name, index, "pass", eager_note)


def _grown(x: Any) -> Any:
    """`x` with every dim of size two or more one longer, its values wrapped around (index i of a
    grown dim of size n reads i % n): sizes equal before stay equal, ones and zeros stay, and an
    index tensor keeps values in range (Note [Grown samples])."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
        return x
    out = x.detach()
    for d, n in enumerate(x.shape):
        if n >= 2:
            out = out.index_select(d, torch.arange(n + 1) % n)
    return out.contiguous().requires_grad_(x.requires_grad)


def grow(sample: Any) -> Any:
    """Note [Grown samples]: OpInfo samples of one op mostly differ in rank or arguments, so a
    dynamic frame recompiles for most of them and few calls reuse a symbolic graph at a new
    size; `--grow` follows each sample with a copy whose every dim of size two or more is one
    longer (`_grown`), through the same frame. Relations between sizes (equal dims, broadcast
    ones, empty dims) hold in the copy, so an op that took the sample takes the copy (where
    eager rejects it, the copy is not compared), and a symbolic graph's guards and kernels meet
    another size."""
    return types.SimpleNamespace(
        input=tree_map(_grown, sample.input),
        args=tree_map(_grown, sample.args),
        kwargs=tree_map(_grown, sample.kwargs),
    )


GROWN = 100  # a grown sample's index: its sample's plus this


@dataclass(slots=True)
class Compiles:
    """Note [Dynamic shapes in the sweep]: with `--dynamic`, one compiled frame per op serves all
    its samples, in order (`dynamic="true"`: `kiln.compile(dynamic=True)`, every size symbolic
    from the first call; `"auto"`: the default, static first, and the sizes that changed become
    symbolic when a later sample's guard fails). A later sample then runs through a symbolic
    graph's kernels, or through a static recompile where the backend refused symbolic sizes
    (kiln_dynamo's `dynamic_fallbacks`, with their reasons). What the op's samples compiled:
    `graphs` compiles in all, `symbolic` of them with symbolic sizes, `refused` the reasons of
    symbolic graphs compiled static instead. An op whose graphs are all static although it
    recompiled never reached the symbolic code: `never_symbolic`.
    Each sample is judged as in the static sweep. A sample that compiled a graph of its own (the
    frame has no graph break, so its call ran that graph alone) is judged by what it compiled; one
    that reused an earlier graph, or ran several frames, by everything the op compiled so far
    (which entry it ran is not known). Before, every sample after a fallback was a fallback:
    `index_fill`'s samples 2-3 under `--dynamic auto --grad` were blamed for sample 1's static
    graph, whose backward needs `_unique` (no meta kernel), though they compiled and passed."""

    graphs: int = 0
    symbolic: int = 0
    refused: list[str] = dataclasses.field(default_factory=list)

    def never_symbolic(self, dynamic: str) -> bool:
        return self.symbolic == 0 and self.graphs > (0 if dynamic == "true" else 1)


def sweep_op(
    info: Any,
    samples: int,
    dtype: torch.dtype = torch.float32,
    cpu_backend: str = "cpp",
    device: str = "cpu",
    grad: bool = False,
    dynamic: str = "none",
    compiles: Compiles | None = None,
    grown: bool = False,
    layout: str = "contiguous",
) -> list[Outcome]:
    """The outcome of each of `info`'s first `samples` samples on `device` (kiln compiles CUDA
    tensors with Triton, CPU tensors with `cpu_backend`); with `grad`, of forward and backward
    (Note [Gradients in the sweep]). `dynamic` "true" or "auto": one compiled frame for all the
    samples (Note [Dynamic shapes in the sweep]), what it compiled counted in `compiles`; with
    `grown`, each sample followed by its grown copy (Note [Grown samples]); `layout`: how the
    samples' tensors are stored (Note [Layouts in the sweep])."""
    out: list[Outcome] = []
    compiled = None
    if dynamic != "none":
        kiln.reset()
        compiled = kiln.compile(
            _frame(info.op), dynamic=True if dynamic == "true" else None, options={"cpu_backend": cpu_backend}
        )
    with warnings.catch_warnings(), seeded_calls():
        warnings.simplefilter("ignore")
        try:
            torch.manual_seed(0)  # the same samples on every run
            requires_grad = grad and info.supports_autograd
            generator = iter(info.sample_inputs(device, dtype, requires_grad=requires_grad))
            for index in range(samples):
                sample = next(generator, None)
                if sample is None:
                    break
                outcome = run_sample(info, index, sample, dtype, cpu_backend, grad, compiled, layout)
                if outcome is not None:
                    out.append(outcome)
                if grown and compiled is not None:  # Note [Grown samples]
                    outcome = run_sample(
                        info, GROWN + index, grow(sample), dtype, cpu_backend, grad, compiled, layout
                    )
                    if outcome is not None:
                        out.append(outcome)
        except Exception as exc:  # a sample generator that fails is not kiln's to test
            out.append(Outcome(key(info), -1, "skipped", f"sample generation: {type(exc).__name__}"))
    if compiles is not None and dynamic != "none":
        log = kiln.compile_log()
        compiles.graphs = len(log)
        compiles.symbolic = sum(r.symbolic for r in log)
        compiles.refused = [reason[:300] for _, reason in kiln_dynamo.counters.dynamic_fallbacks]
    return out


def op_outcome(outcomes: list[Outcome]) -> str:
    """An op's outcome: its worst sample's (mismatch > error > fallback > pass)."""
    kinds = {o.kind for o in outcomes}
    for kind in ("mismatch", "error", "fallback", "pass"):
        if kind in kinds:
            return kind
    return "skipped"


def assert_passes(info: Any, outcomes: list[Outcome]) -> None:
    """The CI slices' verdict on one op: skipped when no sample was comparable, else every sample
    passes, or falls back where the op is one of KNOWN_FALLBACKS."""
    import pytest

    kind = op_outcome(outcomes)
    if kind == "skipped":
        pytest.skip(f"no float32 CPU sample of {key(info)} that eager runs returns a tensor")
    details = "\n".join(f"sample {o.sample}: {o.kind}: {o.detail}" for o in outcomes if o.kind != "pass")
    assert kind in ("pass", "fallback"), details
    if key(info) not in KNOWN_FALLBACKS:
        assert kind == "pass", details


def select(
    shard: str | None = None, ops: str | None = None, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    infos = [info for info in op_db if eligible(info, dtype, device)]
    if ops:
        wanted = set(ops.split(","))
        infos = [i for i in infos if i.name in wanted or key(i) in wanted]
    if shard:
        i, n = (int(p) for p in shard.split("/"))
        infos = infos[i::n]
    return infos


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--shard", default=None)
    parser.add_argument("--ops", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--cpu-backend", default="cpp", choices=["cpp", "triton"])
    parser.add_argument("--grad", action="store_true", help="compare gradients too")
    parser.add_argument(
        "--dynamic",
        default="none",
        choices=["none", "true", "auto"],
        help="one compiled frame per op for all its samples (Note [Dynamic shapes in the sweep])",
    )
    parser.add_argument("--grow", action="store_true", help="with --dynamic: Note [Grown samples]")
    parser.add_argument("--layout", default="contiguous", choices=LAYOUTS, help="Note [Layouts in the sweep]")
    a = parser.parse_args(argv)
    if a.cpu_backend == "triton":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: kernels run on CPU tensors
    start = time.perf_counter()
    rows: dict[str, list[Outcome]] = {}
    compiles: dict[str, Compiles] = {}
    dtype = getattr(torch, a.dtype)
    for info in select(a.shard, a.ops, dtype):
        compiles[key(info)] = Compiles()
        rows[key(info)] = sweep_op(
            info,
            a.samples,
            dtype,
            a.cpu_backend,
            grad=a.grad,
            dynamic=a.dynamic,
            compiles=compiles[key(info)],
            grown=a.grow,
            layout=a.layout,
        )
        kind = op_outcome(rows[key(info)])
        if kind not in ("pass", "skipped"):
            detail = next(o.detail for o in rows[key(info)] if o.kind == kind)
            print(f"{kind:9} {key(info)}: {detail}", flush=True)
        moved = [o for o in rows[key(info)] if o.kind == "pass" and o.detail]
        if moved:  # Note [Eager that reads a layout wrong]
            samples = ", ".join(str(o.sample) for o in moved)
            print(f"{'eager':9} {key(info)}: samples {samples}: {moved[0].detail}", flush=True)
    table = collections.Counter(op_outcome(v) for v in rows.values())
    print(
        f"{len(rows)} ops, {sum(len(v) for v in rows.values())} samples, {time.perf_counter() - start:.0f} s"
    )
    print("  ".join(f"{k} {table[k]}" for k in ("pass", "mismatch", "error", "fallback", "skipped")))
    never = [
        k for k, c in compiles.items() if c.never_symbolic(a.dynamic) and op_outcome(rows[k]) != "skipped"
    ]
    if a.dynamic != "none":
        graphs = sum(c.graphs for c in compiles.values())
        symbolic = sum(c.symbolic for c in compiles.values())
        print(
            f"dynamic={a.dynamic}: {graphs} graphs compiled, {symbolic} symbolic; never symbolic: {len(never)} ops"
        )
        for k in never:
            print(
                f"  never symbolic {k}: {compiles[k].graphs} static graphs; {'; '.join(compiles[k].refused)[:300]}"
            )
    if a.json:
        results: dict[str, Any] = {k: [dataclasses.asdict(o) for o in v] for k, v in rows.items()}
        if a.dynamic != "none":  # Note [Dynamic shapes in the sweep]
            results = {
                "dynamic": a.dynamic,
                "layout": a.layout,
                "ops": results,
                "compiles": {k: dataclasses.asdict(c) for k, c in compiles.items()},
                "never_symbolic": never,
            }
        elif a.layout != "contiguous":  # Note [Layouts in the sweep]
            results = {"layout": a.layout, "ops": results}
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
