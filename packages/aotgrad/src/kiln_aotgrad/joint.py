"""One trace, two shapes of graph: the inference graph and the joint forward+backward graph.

`trace` runs a function of a flat list of tensors on fake copies of its inputs under the Tracer
(tracer.py) and reads the result through the alias model (functionalize.py):

- graph outputs, in order: the new values of mutated inputs, then the user's outputs that are
  not aliases (`TraceMeta.outputs` says how every user output is rebuilt at run time: from a
  graph output, as the input itself or a view of it, as a view of an earlier output, or as a
  constant);
- training (grad mode on, some input requires grad, some output is differentiable): the forward
  is traced with autograd running above the tracer, then `torch.autograd.grad` runs the backward
  through the autograd engine on the same fake tensors, with one `tangents_<i>` placeholder per
  differentiable graph output as grad_outputs. The backward's aten ops are recorded into the
  same graph, so the graph is `(primals..., tangents...) -> (forward outputs..., grads...)`,
  one grad (or None) per input that requires grad. partition.py splits it.

Every input is a graph input (`primals_<i>`); an input that requires grad is seen by the traced
function as a non-leaf clone of a fake leaf, so in-place updates of it trace as they run in
eager for non-leaf tensors, and gradients are taken with respect to the leaf.

Note [A clone with its input's strides]: the placeholder of a graph input carries the layout the
code generators compile its loads for, and a static forward graph's wrapper trusts the frame's
guard for it (it checks only storage offsets, Note [Inputs the frame guard checks] in kiln's
backends.py). `clone()` keeps the strides of a dense input (a transpose) but makes a strided
slice (`w[::2]`) or an expanded one (stride 0) contiguous, and the kernel then read such an input
at contiguous offsets: a wrong answer for a parameter whose `.data` became a slice, out-of-bounds
reads for an expanded input (found by the fourteenth session's staleness sweep). Those inputs are
cloned into a fake tensor of the leaf's own strides instead (`new_empty_strided(...).copy_`,
differentiable as the clone is).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from kiln_symbolic import expr_of, is_symbolic, pexpr
from torch.utils._pytree import TreeSpec, tree_flatten

from kiln_aotgrad.decompositions import DecompTable
from kiln_aotgrad.functionalize import SELF, ViewStep
from kiln_aotgrad.logs import graphs_log
from kiln_aotgrad.tracer import PHYSICAL_VIEWS, AotgradError, Tracer, _addresses, ancestors
from kiln_dynamo import same_unbacked
from kiln_dynamo.fake import FakeTensor, any_symbolic, dispatch_for, from_real


@dataclass(frozen=True, slots=True)
class OutputInfo:
    """How one flat user output is produced at run time.

    kind: "graph" (graph output `index`), "input" (input `index` itself), "input_view" (view of
    input `index`), "output" (the same object as user output `index`), "output_view" (view of
    user output `index`), "graph_view" (view of graph output `index`, an intermediate no user
    output is: Note [Views sharing an intermediate that is no output]; `offset` relative to
    its), "const" (`value`).

    Note [Views that change dtype]: `as_strided` keeps its base's dtype, so a view of an input
    with another dtype (`view_as_complex`, `view_as_real`, `view(dtype)`) is rebuilt by replaying
    its view operators (`views`) on the real input instead; a view of an output with another
    dtype is a graph output of its own.

    Note [Static views of inputs start at the input's offset]: an "input_view"'s `offset` is
    relative to the real input's storage offset, as a symbolic view's is (Note [Symbolic views
    among the outputs]). A fake input with symbolic sizes was built at storage offset 0
    (kiln_dynamo's `from_real` with a layout), so where its view's sizes all specialized to
    constants (`x.expand(5, 5, 5)` of an `(s0, 1, 1)` input: s0 == 5) the fake view's absolute
    offset 0 was rebuilt on an input that starts at 3: every element wrong (the OpInfo sweep's
    `--layout mixed --dynamic true`, `expand`). The fake now starts where the real input does
    (`as_strided` with an explicit, absolute offset needs that), and the relative offset keeps
    the rebuilt view right for any input offset either way.
    Not yet right: a view through `as_strided` with an explicit (absolute) offset, called again
    with the input at another offset that the frame's guards let through, is rebuilt relative
    to the new offset (eager's stays absolute); such views need a guard on the input's offset.
    """

    kind: str
    index: int = -1
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0  # "input_view": relative to the input's storage offset
    value: Any = None
    views: tuple[ViewStep, ...] = ()  # "input_view" of another dtype: the view ops to replay
    # "input_view" with symbolic sizes: (flat inputs) -> (size, stride, offset) at run time
    # (Note [Symbolic views among the outputs])
    layout: Callable[[Any], tuple[tuple[int, ...], tuple[int, ...], int]] | None = None
    # "input_view" through which no gradient reaches an input (taken under `torch.no_grad()`):
    # rebuilt under no_grad; "input_view" of a detached alias: rebuilt on `input.detach()`
    # (Note [Views taken under no_grad]); "output_view" that does not require grad: rebuilt on
    # its output detached, one taken under no_grad: rebuilt under no_grad (Note [Detached views
    # of outputs])
    no_grad: bool = False
    detach: bool = False
    # "input_view" the graph took in grad mode, of an input that requires grad: rebuilt in grad
    # mode (Note [Views taken in grad mode])
    grad: bool = False
    # "graph_view" / "output_view": the base's strides as traced (`base_stride_of`, a function
    # of the flat inputs, where one is symbolic), and its storage offset; a base a code
    # generator returns in another layout is copied into this one before the view is laid over
    # it (Note [Bases returned in another layout])
    base_stride: tuple[int, ...] | None = None
    # a view ("input_view", "graph_view", "output_view") that eager took in grad mode of a view
    # taken under no_grad: its base is viewed under no_grad first, then it is taken in grad mode
    # (Note [Views of a view taken under no_grad])
    grad_stops: bool = False
    base_stride_of: Callable[[Any], tuple[int, ...]] | None = None
    base_offset: int | None = None


@dataclass(slots=True)
class TraceMeta:
    num_inputs: int
    mutated_inputs: list[int]
    outputs: list[OutputInfo]
    out_spec: TreeSpec
    num_graph_outputs: int  # mutations + user graph outputs
    graph_out_requires_grad: list[bool]
    input_requires_grad: list[bool]
    training: bool
    num_tangents: int = 0
    grad_inputs: list[int] = field(default_factory=list)  # inputs that receive a gradient
    # Note [Gradients that no read output reaches]: per grad input, the tangents (indices into
    # the differentiable outputs) its gradient depends on
    grad_tangents: list[frozenset[int]] = field(default_factory=list)
    # inputs that require grad and whose traced gradient is None (Note [Inputs whose gradient
    # comes only through their new values] in runtime.py)
    no_gradient: frozenset[int] = frozenset()
    # Note [New values differentiated on their own]: set where the new values' gradients are the
    # backward's second half (one gradient per grad input after the user outputs' ones)
    new_value_grads: NewValueGrads | None = None
    # Note [Metadata mutations of inputs]: (input, sizes, strides, offset) it ends with
    metadata_mutations: list[tuple[int, tuple[int, ...], tuple[int, ...], int]] = field(default_factory=list)


@dataclass(slots=True)
class Traced:
    gm: torch.fx.GraphModule
    meta: TraceMeta


class OriginInterpreter(torch.fx.Interpreter):
    """Runs a dynamo GraphModule node by node, telling the tracer which user line is running."""

    def __init__(self, gm: torch.fx.GraphModule, tracer: Tracer) -> None:
        super().__init__(gm)
        self.tracer = tracer

    def run_node(self, n: torch.fx.Node) -> Any:
        origin = n.meta.get("source_line")
        if not origin and n.meta.get("stack_trace"):
            origin = str(n.meta["stack_trace"]).strip().splitlines()[-1].strip()
        self.tracer.origin = origin or None
        try:
            with same_unbacked(n.meta.get("val")):  # Note [Tracing a captured graph again]
                out = super().run_node(n)
            if n.op == "call_function" and isinstance(out, torch.SymFloat) and not n.kwargs:
                # Note [A float of sizes keeps its Python operations] (tracer.py)
                self.tracer.note_sym_float(out, n.target, self.fetch_args_kwargs_from_env(n)[0])
            return out
        finally:
            self.tracer.origin = None


def _symbol_names(visible: list[Any]) -> dict[Any, str]:
    """Where each size symbol is read from the flat inputs `a` at run time: an int input, or a
    size, stride or storage offset of a tensor input (the first one that is the bare symbol)."""
    names: dict[Any, str] = {}  # sympy symbol -> Python source

    def note(value: Any, text: str) -> None:
        e = expr_of(value)
        if e.is_Symbol:
            names.setdefault(e, text)

    for i, v in enumerate(visible):
        if isinstance(v, torch.SymInt):
            note(v, f"a[{i}]")
        elif isinstance(v, torch.Tensor):
            for d, n in enumerate(v.shape):
                note(n, f"a[{i}].size({d})")
            for d, n in enumerate(v.stride()):
                note(n, f"a[{i}].stride({d})")
            note(v.storage_offset(), f"a[{i}].storage_offset()")
    return names


def _reaches_a_leaf(t: torch.Tensor, leaf_ids: set[int]) -> bool:
    """Whether `t`'s autograd graph leads to one of these leaves (a gradient of `t` reaches it)."""
    stack, seen = [t.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if id(getattr(fn, "variable", None)) in leaf_ids:
            return True
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return False


def _grad_goes_nowhere(t: torch.Tensor) -> bool:
    """Whether no gradient of `t` reaches any tensor: every path of its autograd graph ends in
    a missing edge (a view taken under no_grad has none) before any leaf."""
    stack, seen = [t.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if getattr(fn, "variable", None) is not None:
            return False
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return True


def _grad_reaches(t: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether `t`'s autograd graph leads to `base`'s node (`t` is a differentiable view of it)."""
    target = base.grad_fn
    stack, seen = [t.grad_fn], set()
    while target is not None and stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        if fn is target:
            return True
        seen.add(id(fn))
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return False


# Note [Views of intermediates leave the Function as views of its outputs]: a training graph's
# outputs leave one autograd Function, and autograd forbids in-place writes into an output that
# is a view made inside a custom Function ("Output 0 of CompiledFunction is a view and is being
# modified inplace"). A graph output that views an intermediate (`t2 = x.t().flatten(); t3 =
# t2[8]; return t3`, a graph break before `t3.copy_(2.0)`: test_alias_fuzz.py seed 3212) came
# back as such a view, and the resume function's write into it raised where eager's works. So
# in training, as in inference, a view of an intermediate leaves the Function through its base:
# the intermediate is a graph output (a user output, or one no user sees: "graph_view") and the
# view is laid over it after the Function returned, an ordinary differentiable view whose
# in-place writes reach the base's history as eager's do. Its gradient goes through the base's
# geometry (`as_strided` backward), which covers it: only the root intermediate serves as a
# base, never another output that views part of it (Note [Outputs sharing an intermediate]),
# The base is the view's autograd base (`_base`), not the tracer's root of its memory: a
# decomposed `reshape` returns an `_unsafe_view` of a clone, an alias for the tracer and no view
# for autograd, and the clone's autograd history misses writes through it (seed 3575: a
# gradient where eager's `fill_` leaves none). Only for a view autograd links to its base
# (not one taken under no_grad) through no
# `as_strided` after another view, whose eager gradient covers only the earlier view's elements
# (Note [as_strided after a view is replayed]; test_alias_fuzz.py seed 3218).


def symbolic_view_layout(
    t: torch.Tensor, visible: list[Any], j: int | None, base: torch.Tensor | None = None
) -> Callable[[Any], tuple[tuple[int, ...], tuple[int, ...], int]]:
    """Note [Symbolic views among the outputs]: an output that is a view of input `j` stays a
    view of the real input, as in eager (`_base`, strides, shared storage). Its sizes, strides
    and storage offset are expressions in the size symbols; they become one Python function of
    the flat inputs `a`, which reads each symbol where an input holds it (`_symbol_names`) and
    computes the view's layout once per call. The offset is taken relative to the input's own
    (`a[j].storage_offset() + ...`), so an input that starts elsewhere in its storage (which the
    frame's guards let through) still gets the right view. A symbol no input holds is refused
    (the caller compiles the graph with static sizes). With `base` (another output, a view of
    whose memory `t` is), the third item is the offset relative to `base`'s, which the runtime
    adds to the real output's own."""
    names = _symbol_names(visible)
    sizes = [expr_of(n) for n in t.shape]
    strides = [expr_of(n) for n in t.stride()]
    start = ""  # with `base`: the offset relative to it
    if base is None:
        assert j is not None, "a view of an input names the input"
        base, start = visible[j], f"a[{j}].storage_offset() + "
    rel = expr_of(t.storage_offset()) - expr_of(base.storage_offset())
    missing = set().union(*(e.free_symbols for e in (*sizes, *strides, rel))) - names.keys()
    if missing:
        raise AotgradError(f"an output is a view of an input with sizes no input holds ({missing})")

    def py(e: Any) -> str:
        return f"int({pexpr(e, names)})" if e.free_symbols else str(int(e))

    size_src = "".join(f"{py(e)}, " for e in sizes)
    stride_src = "".join(f"{py(e)}, " for e in strides)
    src = f"lambda a: (({size_src}), ({stride_src}), {start}{py(rel)})"
    fn: Callable[[Any], tuple[tuple[int, ...], tuple[int, ...], int]] = eval(src, {"math": math})
    return fn


# Note [as_strided after a view is replayed]: a returned view of an input is rebuilt at run
# time as one `as_strided` of the real input, whose backward sends the gradient to every element
# it covers. Eager's `x.narrow(1, 3, 1).as_strided((2, 2), (2, 1), 22)` covers the same four
# elements, but its backward goes through the narrow view's: only the one element of the narrow
# view gets a gradient (test_alias_fuzz.py seed 391: gradient 1 where eager gives 0). The one
# `as_strided` gives eager's gradient for a chain of other views, whose backward scatters into
# the elements it covers; a chain with `as_strided` after another view is rebuilt by replaying
# its view operators on the real input instead, as a view of another dtype is (Note [Views that
# change dtype]); the as_strided's offset is absolute, and the static signature holds the input
# at the offset it was traced at.
#
# Under symbolic sizes (dynamic=True, or a recompile that made another input's sizes dynamic)
# the view was rebuilt from its symbolic layout as one `as_strided` too, with the same wrong
# gradient (`w.narrow(1, 3, 1).as_strided(...)` of a static `w` beside a dynamic `x`). The views
# are replayed there as well when every argument of the chain is a constant (the chain then
# reads nothing of the sizes that vary, so replaying it is eager's view for every call the
# graph serves); a chain with a symbolic argument is refused (static sizes instead).
# Note [Bases returned in another layout]: an output rebuilt as a view of a graph output
# ("graph_view", "output_view") is laid over it with the strides it was traced with, which holds
# only if the code generator returns that base in its traced layout. loopir's matmul padding
# (Note [Matmul padding]) returns a padded GEMM's result as a slice of the padded buffer (row
# stride 30528 for BERT's vocabulary of 30522), so the logits `view`ed to (batch, length, vocab)
# over it read every row but the first from the wrong place: a training step's loss and every
# gradient wrong on the H200 (BERT in bfloat16, gradients 10-100x eager's error; `(logits,
# logits[:, -1])` in inference too). Each such output records its base's traced strides (dims of
# size 1 aside, where strides mean nothing) and storage offset; at run time a base that comes
# back in another layout is copied into the traced one first, once per call for all views over
# it, and an "output_view" base that is a user output is replaced by that copy too, so the user
# outputs alias each other as eager's do. A "graph_view" that reshapes its whole base (the
# logits' `view` to (batch, length, vocab)) is taken with `view` on the base as it came, where
# its strides allow (the padded rows do), with no copy. A static view's offset is taken relative to its base's
# (the copy starts at 0). A static view over a base at a symbolic offset keeps its absolute offset.
#
# A base with a symbolic stride is checked too, against its traced strides computed from the
# inputs' sizes at run time (`base_stride_of`, as Note [Symbolic views among the outputs] computes
# a view's layout). Until the twenty-second session it was not checked at all: under dynamic=True
# a linear layer of static, misaligned sizes over an input of symbolic (batch, length) returned
# its padded result with strides (40, 8, 1) where the trace had (s1*7, 7, 1), and `(y[:, -1],
# y.view(-1, 7))` read both outputs from the wrong rows (test_views.py, the fuzzer's `--pad-mm`).
# A base whose strides name a symbol no input holds is refused (static sizes instead).
def _base_geometry(b: torch.Tensor, visible: list[Any]) -> dict[str, Any]:
    """``base_stride`` (or ``base_stride_of``) / ``base_offset`` of an OutputInfo over base ``b``
    (Note [Bases returned in another layout])."""
    stride, offset = tuple(b.stride()), b.storage_offset()
    geometry: dict[str, Any] = {}
    if not any(is_symbolic(s) for s in stride):
        geometry["base_stride"] = tuple(int(s) for s in stride)
    else:
        names = _symbol_names(visible)
        exprs = [expr_of(s) for s in stride]
        missing = set().union(*(e.free_symbols for e in exprs)) - names.keys()
        if missing:
            raise AotgradError(f"an output is a view of an output with strides no input holds ({missing})")
        src = "".join(f"int({pexpr(e, names)}), " if e.free_symbols else f"{int(e)}, " for e in exprs)
        geometry["base_stride_of"] = eval(f"lambda a: ({src})", {"math": math})
    if not is_symbolic(offset):
        geometry["base_offset"] = int(offset)
    return geometry


# Note [A view laid over an output that does not hold it]: a view of an intermediate rebuilt over
# the first output of that intermediate ("output_view", Note [Outputs sharing an intermediate])
# reads that output's storage, which holds the whole intermediate only while the code generator
# returns the output in its traced place. Where it returns it in another layout (a padded GEMM,
# Note [Bases returned in another layout]) the runtime copies the output's own elements, and a
# view reaching past them read outside the copy: `t9 = t6.permute(1, 0)` under no_grad and
# `t19 = t9[1:1]` returned as `(t19, t9)` laid t9 over t19's empty copy, "invalid storage offset
# -1" (test_alias_fuzz.py seed 22364 under --pad-mm). Such a view is laid over the intermediate
# itself, a graph output no user sees ("graph_view", Note [Views sharing an intermediate that is
# no output]), taken as eager took it (under no_grad, or of the output detached); an output holds
# the view where it is the intermediate itself or all of it rearranged (`view`, `permute`, ...),
# or (static sizes) where the view's storage positions are among its own.
#
# Note [Views of intermediates taken under no_grad]: a view taken under `torch.no_grad()` of an
# intermediate that requires grad requires grad and has no grad_fn. Unless another output holds
# it, it was a graph output of its own, and the backward trace refused it ("element 0 of tensors
# does not require grad and does not have a grad_fn": `with torch.no_grad(): a = t.permute(1,
# 0); b = a[1:3]` / `return b, a`, or `return a` alone, ran eagerly). It is laid over the
# intermediate as a hidden graph output ("graph_view") under no_grad, as eager took it, and so is
# a view eager detached (`t.detach().permute(1, 0)` returned with a view of it: the view of it,
# a graph output the code generator returned as a view of the hidden intermediate's buffer,
# came back requiring grad through that base).
#
# Note [Views of a view taken under no_grad]: a view taken in grad mode of such a view (`b =
# a[1:3]` after the block) requires grad and has a grad_fn, but its gradient goes nowhere: the
# no_grad view gives it no edge. As a graph output of its own it was a copy when the base came
# back padded (Note [Bases returned in another layout]), and writing it no longer showed in `a`
# (test_alias_fuzz.py seed 22364's program with `t9[1:3]` under --pad-mm). It is laid over the
# same base as the other views of the intermediate (`grad_stops`): the runtime views the base
# whole under no_grad, then takes the view in grad mode, so it has eager's autograd state. Such
# a view of an input is rebuilt the same way (it was rebuilt under no_grad: no grad_fn, a leaf,
# where eager's has a grad_fn that leads nowhere).
#
# Note [A view in grad mode of a view taken under no_grad]: a continuation entered inside a
# `with torch.no_grad():` block that the graph leaves is traced for inference (Note [Graphs that
# turn grad mode on]), its inputs made not to require grad, so the autograd state of its fakes
# tells nothing of the views above. `t2 = x.diagonal()` in the block, `t7 = t2.split(3)[1]`
# after it: eager's `t7` requires grad through SplitBackward0 and no gradient reaches `x`; the
# last view being taken in grad mode, it was rebuilt on `x` in grad mode (Note [Views taken in
# grad mode]), and `x` got a gradient of 1 at the diagonal element (test_alias_fuzz.py seed 1306,
# `dynamic=None` after its first call's `x0.t_()` changed the input's sizes). The tracer marks
# each view whose chain has a step taken with grad mode off; such a view of an input that
# requires grad, itself taken in grad mode, is rebuilt as Note [Views of a view taken under
# no_grad] rebuilds one: the input viewed whole under no_grad, the view taken in grad mode.
#
# Note [Detached aliases as roots]: `t.detach()` shares `t`'s node and alias chain (tracer.py),
# so a returned detached alias holds every element of the intermediate as `t` itself would; where
# `t` is not returned it is the base of the views that do not require grad (`d = t.detach();
# return d[1:3], d`: the view was laid over a hidden graph output for `t`, and `d` was a second
# graph output over the same buffer, which came back requiring grad: Note [Outputs without grad
# over the memory of outputs with it] in runtime.py).
_aten = torch.ops.aten
# view operators whose result holds every element of their input
_WHOLE_VIEWS = frozenset(
    {
        _aten.view.default,
        _aten._unsafe_view.default,
        _aten.reshape.default,
        _aten.permute.default,
        _aten.transpose.int,
        _aten.t.default,
        _aten.unsqueeze.default,
        _aten.squeeze.default,
        _aten.squeeze.dim,
        _aten.squeeze.dims,
        _aten.expand.default,
        _aten.alias.default,
        _aten.detach.default,
    }
)


def _holds(base: torch.Tensor, t: torch.Tensor, tracer: Tracer) -> bool:
    """Whether output ``base``'s elements include every element of ``t``, a view of the same
    intermediate (Note [A view laid over an output that does not hold it])."""
    if all(step.func in _WHOLE_VIEWS for step in tracer.chain_of(base)):
        return True  # the intermediate itself, or all of it rearranged (symbolic sizes too)
    geometry = (*base.shape, *base.stride(), base.storage_offset(), *t.shape, *t.stride(), t.storage_offset())
    if any(is_symbolic(v) for v in geometry):
        return False
    if t.numel() == 0:
        return True
    mine, theirs = _addresses(t), _addresses(base)
    return mine is not None and theirs is not None and mine <= theirs


def _as_strided_after_a_view(chain: tuple[ViewStep, ...]) -> bool:
    return any(step.func is torch.ops.aten.as_strided.default for step in chain[1:])


class _Symbolic(Exception):
    """A view argument that depends on a size symbol."""


def _constant(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return type(v)(_constant(x) for x in v)
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        e = expr_of(v)
        if e.free_symbols:
            raise _Symbolic(v)
        return (
            int(e) if isinstance(v, torch.SymInt) else float(e) if isinstance(v, torch.SymFloat) else bool(e)
        )
    if isinstance(v, torch.Tensor):
        raise _Symbolic(v)
    return v


def _constant_chain(chain: tuple[ViewStep, ...]) -> tuple[ViewStep, ...] | None:
    """``chain`` with its SymInt arguments of constant value as ints; None if one is symbolic."""
    try:
        return tuple(
            ViewStep(
                step.func,
                tuple(a if a is SELF else _constant(a) for a in step.args),
                {k: _constant(v) for k, v in step.kwargs.items()},
                step.index,
                step.root_offset,
            )
            for step in chain
        )
    except _Symbolic:
        return None


def _fake_like(t: torch.Tensor) -> FakeTensor:
    device = t.fake_device if isinstance(t, FakeTensor) else t.device
    return FakeTensor(torch.empty(t.shape, dtype=t.dtype, device="meta"), device)


# Note [Recurrent layers traced for training]: under symbolic sizes the trace runs torch's Python
# decompositions (Note [Composite operators under symbolic sizes] in kiln_dynamo.fake), and the one
# of `aten::lstm` on the CPU calls oneDNN's `mkldnn_rnn_layer` with `train=False`
# whenever the input does not require grad, even where the weights do: that layer returns no
# workspace, and its backward, which needs one, raised "Expected a proper Tensor but got None ...
# 'workspace'" (the breadth suite's nn_lstm training under dynamic=True, twenty-third session; the
# C++ composite of static sizes passes the module's training flag and is right). A training trace
# under symbolic sizes therefore runs with oneDNN switched off, which is the decomposition's own
# path for an input that requires grad: the layer unrolled into matrix products and pointwise
# cells, every one differentiable. Only the trace sees the switch (torch's Python decompositions
# are its only reader there); the compiled code runs later, under the caller's setting.
@contextmanager
def _trainable_recurrent_layers(want_training: bool, leaves: list[Any]) -> Iterator[None]:
    if not want_training or not any_symbolic(leaves):  # the same test as dispatch_for's
        yield
        return
    before = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)


def trace(
    fn: Callable[[Tracer, list[torch.Tensor]], Any],
    inputs: list[torch.Tensor],
    decompositions: DecompTable,
    want_training: bool,
) -> Traced:
    """Trace `fn(tracer, fake_inputs)`; joint forward+backward when `want_training`."""
    tracer = Tracer(decompositions)
    leaves: list[Any] = []  # fake tensors, and SymInts for int inputs
    visible: list[Any] = []
    for i, x in enumerate(inputs):
        if isinstance(x, torch.SymInt):  # Note [SymInts in the aten graph]: an int input
            leaves.append(x)
            visible.append(x)
            tracer.placeholder(f"primals_{i + 1}", x)
            continue
        leaf = from_real(x)
        if not want_training and leaf.requires_grad:
            leaf = FakeTensor(leaf.meta, leaf.fake_device, False, leaf.is_param)
        seen = leaf.clone() if leaf.requires_grad else leaf
        if seen is not leaf and not leaf.symbolic and seen.stride() != leaf.stride():
            # Note [A clone with its input's strides]
            seen = leaf.new_empty_strided(leaf.shape, leaf.stride()).copy_(leaf)
        elif seen is not leaf and [expr_of(n) for n in seen.stride()] != [expr_of(n) for n in leaf.stride()]:
            # Note [A clone with its input's strides], symbolic: the placeholder kept the
            # clone's contiguous layout and the kernel read a `w[::2]` input that requires grad
            # at contiguous offsets (test_alias_fuzz.py, seed 147 under dynamic=True)
            raise AotgradError(
                "an input that requires grad is strided unlike its traced clone, with symbolic sizes"
            )
        leaves.append(leaf)
        visible.append(seen)
        tracer.placeholder(f"primals_{i + 1}", seen)
        if seen is not leaf:  # Note [as_strided within a tensor's own elements] (tracer.py)
            tracer.input_offsets[id(seen)] = leaf.storage_offset()
    last_primal = list(tracer.graph.nodes)[-1] if inputs else None

    grad_ctx = torch.enable_grad() if want_training else torch.no_grad()
    # Note [Composite operators under symbolic sizes] (kiln_dynamo.fake): with a symbolic size
    # among the inputs, composites decompose through torch's Python decompositions, which keep it
    # symbolic (torch 2.11's C++ matmul specialized it here, as in capture)
    with grad_ctx, tracer, dispatch_for(leaves), _trainable_recurrent_layers(want_training, leaves):
        out = fn(tracer, visible)
    # Note [Graphs that turn grad mode on]: a graph entered with grad mode off is traced for
    # inference, its inputs made not to require grad; a graph that turns grad mode on itself (a
    # resume function entered inside a `with torch.no_grad():` block that the graph leaves)
    # computed results that require grad in eager from inputs that do, and the inference graph
    # returned them without (test_alias_fuzz.py seed 3500: `torch.where(m, a, t4)` of a `t4`
    # that requires grad). Refused (the graph runs eagerly) when an operator other than a view
    # ran in grad mode; a view alone is rebuilt in grad mode (Note [Views taken in grad mode]).
    if (
        not want_training
        and tracer.computed_in_grad_mode
        and any(getattr(x, "requires_grad", False) for x in inputs)
    ):
        raise AotgradError(
            "the graph turns grad mode on, entered with it off, over inputs that require grad "
            "(an inference trace would drop their gradients)"
        )
    flat_out, spec = tree_flatten(out)

    graph_nodes: list[torch.fx.Node] = []
    graph_vals: list[Any] = []
    mutated: list[int] = []
    for i, v in enumerate(visible):
        if not isinstance(v, torch.Tensor):
            continue
        root = tracer.roots[id(v)]
        if root.mutated:
            mutated.append(i)
            graph_nodes.append(root.node)
            graph_vals.append(v)

    input_roots = {id(v): i for i, v in enumerate(visible)}
    symbolic_trace = any(getattr(x, "symbolic", False) or is_symbolic(x) for x in leaves)
    # Note [The root among the outputs first]: outputs that view one intermediate are rebuilt as
    # views of one graph output. When the intermediate itself is among the outputs it is that
    # graph output, even behind a view of it (`return t.diagonal(), t`): a code generator may
    # return a graph output that is a view as a copy of its elements (an extern view op whose
    # offset it did not plan), and the intermediate rebuilt over such a copy read out of its
    # bounds; the run-time fallback then ran the program again over inputs already written.
    # A detached alias of the intermediate (`t.detach()`, no view step) holds all of it too, and
    # serves as the base of views that do not require grad where the intermediate itself is not
    # returned (Note [Detached aliases as roots]).
    root_output: dict[int, int] = {}
    alias_output: dict[int, int] = {}
    for k, t in enumerate(flat_out):
        rid = tracer.root_of(t) if isinstance(t, torch.Tensor) else None
        if rid is not None and not tracer.chain_of(t):
            (root_output if rid == id(t) else alias_output).setdefault(rid, k)
    leaf_ids = {id(x) for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad}
    # Note [Views sharing an intermediate that is no output]: outputs that view one intermediate
    # the program does not return (`t2 = t1[:, 3]; return t2.view_as(t2), t2`) were rebuilt as
    # views of the first of them, a graph output that is itself a view; a code generator may
    # return such an output as a compact copy of its elements (Note [The root among the outputs
    # first]), and the second was laid over the copy with the intermediate's strides: out of its
    # bounds (test_alias_fuzz.py, seed 190). The intermediate itself becomes a graph output no
    # user sees ("graph_view": its views are laid over it as eager lays them), only where two
    # outputs share it, so a program returning one view of a result keeps the plain outputs.
    kept = {id(x): x for x in tracer.keep}
    sharing: dict[int, set[int]] = {}
    for t in flat_out:
        if isinstance(t, torch.Tensor) and tracer.root_of(t) is not None:
            sharing.setdefault(tracer.root_of(t), set()).add(id(t))  # type: ignore[arg-type]
    hidden_roots: dict[int, int] = {}
    infos: list[OutputInfo] = []
    first_by_root: dict[int, int] = {}
    first_by_obj: dict[int, int] = {}
    for k, t in enumerate(flat_out):
        if isinstance(t, torch.SymInt) and is_symbolic(t):
            node = tracer.sym_node_for(t)
            if not isinstance(node, torch.fx.Node):
                infos.append(OutputInfo("const", value=node))
                continue
            infos.append(OutputInfo("graph", len(graph_nodes) - len(mutated)))
            graph_nodes.append(node)
            graph_vals.append(t)
            continue
        if isinstance(t, (torch.SymFloat, torch.SymBool)) and is_symbolic(t):
            raise AotgradError(f"a symbolic {type(t).__name__} output ({t})")
        if not isinstance(t, torch.Tensor):
            infos.append(OutputInfo("const", value=t))
            continue
        if id(t) in first_by_obj:
            infos.append(OutputInfo("output", first_by_obj[id(t)]))
            continue
        first_by_obj[id(t)] = k
        rid = tracer.root_of(t)
        if rid is None:
            tracer.node_for(t)  # a real tensor returned as is: becomes a constant
            rid = tracer.root_of(t)
        assert rid is not None
        size, stride, raw_offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
        symbolic_layout = any(is_symbolic(v) for v in (*size, *stride, raw_offset))
        offset = 0 if symbolic_layout else int(raw_offset)  # a symbolic layout is never rebuilt
        # Note [Conjugate and negative views are traced as computations] (tracer.py): a tensor
        # reached through `_conj` or `_neg_view` is an output of its own, holding the computed
        # values, never rebuilt as a view (`as_strided` drops the lazy bit)
        lazy = any(step.func in PHYSICAL_VIEWS for step in tracer.chain_of(t))
        if rid in input_roots and not lazy:
            j = input_roots[rid]
            # Note [Views taken under no_grad]: eager's view of an input that requires grad,
            # taken under `torch.no_grad()`, requires grad but has no grad_fn, and a view of it
            # taken later in grad mode has a grad_fn that stops there: no gradient flows through
            # either to the input. The traced fake views have the same autograd graphs; when no
            # path leads from one to an input's leaf, the runtime rebuilds it under no_grad (it
            # rebuilt it in grad mode: `x` got the gradient of `with torch.no_grad(): v =
            # x.view(-1)` / `return v` that eager does not give). A view that does not require
            # grad of an input that does (`x.detach()`, `.data`) is rebuilt on `x.detach()`.
            ng = bool(t.requires_grad and t is not visible[j] and not _reaches_a_leaf(t, leaf_ids))
            # ... and a view of such a view taken in grad mode has a grad_fn that leads nowhere
            # (Note [Views of a view taken under no_grad])
            ng_stops = bool(ng and want_training and t.grad_fn is not None and _grad_goes_nowhere(t))
            if (
                not want_training
                and getattr(inputs[j], "requires_grad", False)
                and tracer.view_grad_mode.get(id(t), False)
                and tracer.chain_no_grad.get(id(t), False)
            ):
                # Note [A view in grad mode of a view taken under no_grad]: an inference trace
                # made the input not require grad, so its autograd state cannot say this
                ng = ng_stops = True
            # (an inference trace made its leaves not require grad: there the chain says detach)
            dt = bool(
                getattr(inputs[j], "requires_grad", False)
                and (
                    not t.requires_grad
                    if want_training
                    else any(step.func is torch.ops.aten.detach.default for step in tracer.chain_of(t))
                )
            )
            if (
                t is not visible[j]
                and visible[j] is not leaves[j]
                and [expr_of(n) for n in visible[j].stride()] != [expr_of(n) for n in leaves[j].stride()]
            ):
                # an input that requires grad is traced through a clone, which has its
                # strides only with static sizes (Note [A clone with its input's strides]):
                # the view's layout, read off the clone, would not be the input's
                raise AotgradError(
                    "an output is a view of an input that requires grad, strided unlike its "
                    "traced clone, with symbolic sizes"
                )
            chain = tracer.chain_of(t)
            # Note [Views taken in grad mode]: the runtime rebuilds a view of an input after
            # the compiled call, in the caller's grad mode, which is not the one the graph took
            # the view in where the graph turns grad mode on (a resume function entered inside a
            # `with torch.no_grad():` block that the graph leaves: the view came back with
            # requires_grad and no grad_fn, and no gradient reached the input; test_alias_fuzz.py
            # seed 3252). A view taken in grad mode, of an input that requires grad, with a
            # gradient path to it, is rebuilt in grad mode.
            chain_grad = bool(
                tracer.view_grad_mode.get(id(t), False)
                and getattr(inputs[j], "requires_grad", False)
                and not ng
                and not dt
            )
            # every way of rebuilding this view shares its grad-mode flags
            input_view = functools.partial(
                OutputInfo, "input_view", j, no_grad=ng, detach=dt, grad=chain_grad, grad_stops=ng_stops
            )
            if t is visible[j]:
                infos.append(OutputInfo("input", j))
            elif _as_strided_after_a_view(chain) and (symbolic_layout or symbolic_trace):
                # Note [as_strided after a view is replayed], under symbolic sizes
                views = _constant_chain(chain)
                if views is None:
                    raise AotgradError(
                        "an output is as_strided after another view of an input, with symbolic view arguments"
                    )
                graphs_log.info(
                    "kiln_aotgrad: output %d, as_strided after a view of input %d, replays its views", k, j
                )
                infos.append(input_view(views=views))
            elif symbolic_layout:  # Note [Symbolic views among the outputs]
                if t.dtype != visible[j].dtype:
                    raise AotgradError(
                        "an output is a view of an input of another dtype, with symbolic sizes"
                    )
                layout = symbolic_view_layout(t, visible, j)
                infos.append(input_view(layout=layout))
            else:
                # Notes [Offsets of views of inputs that require grad], [Static views of inputs
                # start at the input's offset]: the view's offset is kept relative to the traced
                # input's (a clone at offset 0 for an input that requires grad, a fake at the real
                # input's offset otherwise) and added to the real input's offset at run time, else
                # `x[1:].requires_grad_().view(-1)` viewed the storage's start.
                rel = offset - visible[j].storage_offset()
                # Note [Static views of inputs in a symbolic trace]: a graph compiled from its
                # placeholders serves every storage offset the frame's guards let through (no
                # offset is checked, Note [Symbolic signatures] in api.py), so a view whose
                # sizes came out static (`t.unflatten(0, (2, 1))` pinned the symbol) takes the
                # symbolic view's run-time layout too (test_alias_fuzz.py, seed 165)
                if is_symbolic(rel) or (symbolic_trace and t.dtype == visible[j].dtype):
                    layout = symbolic_view_layout(t, visible, j)
                    infos.append(input_view(layout=layout))
                    continue
                replay = t.dtype != visible[j].dtype
                if not replay and _as_strided_after_a_view(chain):
                    replay = True  # Note [as_strided after a view is replayed]
                    graphs_log.info(
                        "kiln_aotgrad: output %d, as_strided after a view of input %d, replays its views",
                        k,
                        j,
                    )
                views = chain if replay else ()
                infos.append(input_view(size, stride, int(rel), views=views))
            continue
        later = root_output.get(rid, alias_output.get(rid, k))
        root_t = kept.get(rid)
        # Note [Views of intermediates leave the Function as views of its outputs]
        ag_base = t._base if want_training and t.requires_grad else None
        train_view = bool(
            not lazy
            and tracer.chain_of(t)
            and not _as_strided_after_a_view(tracer.chain_of(t))
            and isinstance(ag_base, torch.Tensor)
            and ag_base.requires_grad
            and ag_base.dtype == t.dtype
            and _grad_reaches(t, ag_base)
        )
        if train_view:
            root_t = ag_base
        untracked = not (want_training and t.requires_grad)  # no autograd to keep
        # Note [Detached views of outputs]: a view rebuilt over another output that requires
        # grad requires grad itself; one that eager detached (`t.detach()`, `t.detach()[1:]` of
        # a returned `t`) is rebuilt over the output detached (it came back requiring grad, with
        # an AsStridedBackward: test_alias_fuzz.py seed 4832)
        off_graph = bool(want_training and not t.requires_grad)
        # ... and one taken under `torch.no_grad()` requires grad with no grad_fn: it is
        # rebuilt over a returned base that requires grad under no_grad, as eager took it (as a
        # graph output of its own it failed the backward trace, "element 1 of tensors does not
        # require grad and does not have a grad_fn", and the graph ran eagerly)
        ng_view = bool(
            want_training
            and t.requires_grad
            and t.grad_fn is None
            and isinstance(t._base, torch.Tensor)
            and t._base.requires_grad
        )
        # Note [Views of a view taken under no_grad]
        stops = bool(
            want_training
            and t.requires_grad
            and t.grad_fn is not None
            and isinstance(t._base, torch.Tensor)
            and t._base.requires_grad
            and tracer.chain_of(t)
            and not train_view  # its gradient reaches its base
            and _grad_goes_nowhere(t)
        )
        ng_view = ng_view or stops
        over_later = untracked or (ng_view and bool(flat_out[later].requires_grad))

        if (
            later > k
            and not lazy
            and flat_out[later].dtype == t.dtype
            and not symbolic_layout
            and (over_later or (train_view and flat_out[later] is ag_base))
        ):  # Note [The root among the outputs first]: `_assemble` builds it after its base
            infos.append(
                OutputInfo(
                    "output_view",
                    later,
                    size,
                    stride,
                    offset,
                    no_grad=ng_view,
                    grad_stops=stops,
                    detach=off_graph,
                    **_base_geometry(flat_out[later], visible),
                )
            )
            continue
        if (
            later > k
            and not lazy
            and flat_out[later].dtype == t.dtype
            and symbolic_layout
            and (over_later or (train_view and flat_out[later] is ag_base))
        ):  # the same, with symbolic sizes: laid out relative to the root (a view of a view that
            # a code generator returned compact read out of its bounds: test_alias_fuzz.py seed 50)
            try:
                later_layout = symbolic_view_layout(t, visible, None, base=flat_out[later])
            except AotgradError:
                later_layout = None
            if later_layout is not None:
                infos.append(
                    OutputInfo(
                        "output_view",
                        later,
                        layout=later_layout,
                        no_grad=ng_view,
                        grad_stops=stops,
                        detach=off_graph,
                        **_base_geometry(flat_out[later], visible),
                    )
                )
                continue
        same_dtype = not lazy and rid in first_by_root and flat_out[first_by_root[rid]].dtype == t.dtype
        # in training, a view of the root output itself (never of another view of it: Note
        # [Outputs sharing an intermediate])
        of_root = (
            same_dtype and (untracked or (ng_view and bool(flat_out[first_by_root[rid]].requires_grad)))
        ) or (train_view and same_dtype and flat_out[first_by_root[rid]] is ag_base)
        # Note [A view laid over an output that does not hold it]
        uncovered = of_root and not _holds(flat_out[first_by_root[rid]], t, tracer)
        of_root = of_root and not uncovered
        if same_dtype and symbolic_layout and of_root:
            # Note [Symbolic views among the outputs]: a view of another output stays its view
            # (until the ninth session it became an output of its own: a copy, so writing one
            # output no longer changed the other as in eager); sizes no input holds keep the copy
            relative: Callable[[Any], tuple[tuple[int, ...], tuple[int, ...], int]] | None
            try:
                relative = symbolic_view_layout(t, visible, None, base=flat_out[first_by_root[rid]])
            except AotgradError:
                relative = None
            if relative is not None:
                infos.append(
                    OutputInfo(
                        "output_view",
                        first_by_root[rid],
                        layout=relative,
                        no_grad=ng_view,
                        grad_stops=stops,
                        detach=off_graph,
                        **_base_geometry(flat_out[first_by_root[rid]], visible),
                    )
                )
                continue
        if same_dtype and not symbolic_layout and of_root:
            # Note [Outputs sharing an intermediate]: rebuilding one output as a strided view of
            # another is right for values, but autograd then routes its gradient through the
            # other output's geometry, which need not cover it (q, k, v split from one matmul):
            # outputs that take part in autograd are graph outputs of their own.
            infos.append(
                OutputInfo(
                    "output_view",
                    first_by_root[rid],
                    size,
                    stride,
                    offset,
                    no_grad=ng_view,
                    grad_stops=stops,
                    detach=off_graph,
                    **_base_geometry(flat_out[first_by_root[rid]], visible),
                )
            )
            continue
        if (
            not lazy
            and (
                (rid not in first_by_root and rid not in root_output)
                or (train_view and id(root_t) in hidden_roots)
                or uncovered
            )
            and (len(sharing.get(rid, ())) > 1 or train_view or ng_view)
            and tracer.chain_of(t)
            and isinstance(root_t, torch.Tensor)
            and root_t.dtype == t.dtype
            and (
                not (want_training and root_t.requires_grad)
                or train_view
                or uncovered
                or ng_view
                or off_graph
            )
        ):  # Notes [Views sharing an intermediate that is no output], [Views of intermediates
            # taken under no_grad]
            rel_layout = None
            if symbolic_layout or is_symbolic(root_t.storage_offset()):
                try:
                    rel_layout = symbolic_view_layout(t, visible, None, base=root_t)
                except AotgradError:
                    rel_layout = None
            if rel_layout is not None or not (symbolic_layout or is_symbolic(root_t.storage_offset())):
                hidden = id(root_t) if train_view else rid  # training: the autograd base
                g = hidden_roots.get(hidden)
                if g is None:
                    g = hidden_roots[hidden] = len(graph_nodes) - len(mutated)
                    graph_nodes.append(tracer.node_for(root_t))
                    graph_vals.append(root_t)
                # an uncovered view keeps how eager's was taken (Notes [Detached views of
                # outputs], [A view laid over an output that does not hold it])
                no_grad, detach = (
                    (ng_view, off_graph) if uncovered or ng_view or off_graph else (False, False)
                )
                grad_stops = stops and no_grad
                if rel_layout is not None:
                    infos.append(
                        OutputInfo(
                            "graph_view",
                            g,
                            layout=rel_layout,
                            no_grad=no_grad,
                            detach=detach,
                            grad_stops=grad_stops,
                            **_base_geometry(root_t, visible),
                        )
                    )
                else:
                    rel = offset - int(root_t.storage_offset())
                    infos.append(
                        OutputInfo(
                            "graph_view",
                            g,
                            size,
                            stride,
                            rel,
                            no_grad=no_grad,
                            detach=detach,
                            grad_stops=grad_stops,
                            **_base_geometry(root_t, visible),
                        )
                    )
                if not uncovered:
                    first_by_root[rid] = k
                continue
        if not lazy:
            first_by_root.setdefault(rid, k)
        # Note [A returned tensor that is already a hidden base]: an earlier output's view made
        # `t` a graph output no user sees ("graph_view", Note [Views of intermediates leave the
        # Function as views of its outputs]); `t` itself is that graph output, not a second
        # one. Returned twice, the Function's two outputs shared their memory, so under
        # symbolic sizes, where the C++ wrapper returns the buffer as a view (Note [Outputs the
        # code generator returns as views] in runtime.py), both stayed views made inside the
        # Function, and an in-place write into the view laid over one of them raised where
        # eager's runs (`t6 = x.reshape(-1); t7 = t6.view(-1); t7.unsqueeze_(1)` under
        # dynamic=True, a graph break at `unsqueeze_`: test_alias_fuzz.py seed 20240).
        base_index = hidden_roots.get(id(t))
        if base_index is not None and graph_vals[base_index + len(mutated)] is t:
            infos.append(OutputInfo("graph", base_index))
            continue
        infos.append(OutputInfo("graph", len(graph_nodes) - len(mutated)))
        graph_nodes.append(tracer.node_for(t))
        graph_vals.append(t)

    requires = [bool(getattr(v, "requires_grad", False)) for v in graph_vals]
    input_rg = [bool(getattr(x, "requires_grad", False)) for x in leaves]
    training = want_training and any(requires) and any(input_rg)
    meta = TraceMeta(
        num_inputs=len(inputs),
        mutated_inputs=mutated,
        outputs=infos,
        out_spec=spec,
        num_graph_outputs=len(graph_nodes),
        graph_out_requires_grad=requires if training else [False] * len(graph_nodes),
        input_requires_grad=input_rg,
        training=training,
        metadata_mutations=[
            (i, tuple(v.shape), tuple(v.stride()), int(v.storage_offset()))
            for i, v in enumerate(visible)
            if id(v) in tracer.metadata_mutated
        ],
    )
    if not training:
        return Traced(tracer.finish(list(graph_nodes)), meta)

    diff_vals = [v for v, r in zip(graph_vals, requires, strict=True) if r]
    if any(v.grad_fn is None and not any(v is x for x in leaves) for v in diff_vals):
        # Note [Views of intermediates taken under no_grad]: those not laid over their base
        # (a view of another dtype) have no graph output that autograd can differentiate
        raise AotgradError("an output is a view taken under no_grad of an intermediate that requires grad")
    tangents: list[FakeTensor] = []
    anchor = last_primal
    for k, v in enumerate(diff_vals):
        tv = _fake_like(v)
        if anchor is None:
            node = tracer.placeholder(f"tangents_{k + 1}", tv)
        else:
            with tracer.graph.inserting_after(anchor):
                node = tracer.placeholder(f"tangents_{k + 1}", tv)
        anchor = node
        tangents.append(tv)
    grad_inputs = [i for i, r in enumerate(input_rg) if r]
    wrt = [leaves[i] for i in grad_inputs]
    diff_index = [i for i, r in enumerate(requires) if r]
    new_values = [k for k, i in enumerate(diff_index) if i < len(mutated)]
    user = [k for k, i in enumerate(diff_index) if i >= len(mutated)]
    # Note [New values differentiated on their own]
    split = bool(new_values and user and not meta.metadata_mutations)
    with torch.enable_grad(), tracer:
        if not split:
            grads = torch.autograd.grad(diff_vals, wrt, grad_outputs=tangents, allow_unused=True)
        else:
            user_grads = torch.autograd.grad(
                [diff_vals[k] for k in user],
                wrt,
                grad_outputs=[tangents[k] for k in user],
                allow_unused=True,
                retain_graph=True,
            )
            new_grads = torch.autograd.grad(
                [diff_vals[k] for k in new_values],
                wrt,
                grad_outputs=[tangents[k] for k in new_values],
                allow_unused=True,
            )
            grads = (*user_grads, *new_grads)
    grad_nodes: list[torch.fx.Node | None] = [None if g is None else tracer.node_for(g) for g in grads]
    meta.num_tangents = len(tangents)
    meta.grad_inputs = grad_inputs
    reaching = _tangents_reaching(grad_nodes, tracer.graph)
    n = len(grad_inputs)
    meta.grad_tangents = reaching[:n]
    meta.no_gradient = frozenset(i for i, g in zip(grad_inputs, grads[:n], strict=True) if g is None)
    if split:
        value_nodes = {tracer.node_for(diff_vals[k]) for k in new_values}
        read = ancestors([tracer.node_for(diff_vals[k]) for k in user]) & value_nodes
        meta.new_value_grads = NewValueGrads(
            tangents=reaching[n:],
            no_gradient=frozenset(i for i, g in zip(grad_inputs, grads[n:], strict=True) if g is None),
            read=bool(read),
        )
    return Traced(tracer.finish([*graph_nodes, *grad_nodes]), meta)


# Note [New values differentiated on their own]: eager records an in-place write into an input
# (`b.add_(t)`, `t` requiring grad) as a node of its own on the input's history, and that node
# frees only the tensors it saved. A module buffer written so carries the call's node into the
# next call, whose backward runs it again: eager's add saved nothing and runs again; a multiply
# saved its operands and raises "Trying to backward through the graph a second time". One
# autograd Function for the whole graph had saved what the user outputs' gradients read too (a
# `where`'s mask), freed by the first backward, so the second one raised where eager's ran
# (test_alias_fuzz.py seed 30344). So where the graph has both user outputs and new values of
# mutated inputs that require grad, the trace differentiates them apart: the user outputs'
# gradients (`TraceMeta.grad_tangents`, `no_gradient`), then the new values' (`new_value_grads`),
# as two lists of gradient outputs of the one joint graph. The partition saves what either reads;
# aotgrad's compile cuts the backward in two by those outputs (api.py), and the runtime runs the
# first from the Function and the second from the mutation node on the new values' history, each
# saving only what its own half reads (Note [Inputs whose gradient comes only through their new
# values] in runtime.py). A write whose backward reads nothing then runs again as eager's does.
# One whose backward reads saved tensors raises as eager's does where eager's backward had run
# that node already: where a user output reads a new value (`NewValueGrads.read`), eager's first
# backward from the output ran the write's node and freed it, while kiln's ran only the
# Function, whose backward computed that path itself; so the mutation node then asks the
# Function's context for its saved tensors, which raises eager's error once they were freed.
@dataclass(frozen=True, slots=True)
class NewValueGrads:
    tangents: list[frozenset[int]]  # per grad input, the new values' tangents its gradient reads
    no_gradient: frozenset[int]  # grad inputs the new values give no gradient
    read: bool = False  # whether a user output that requires grad reads a new value


# Note [Gradients that no read output reaches]: autograd hands a compiled function's backward a
# zero tensor for each output the loss never read (a hidden state a graph break returned, then
# dropped), and the compiled backward turns those zeros into zero gradients. Eager leaves such a
# parameter's `.grad` as None, and optimizers act on the difference: AdamW applies weight decay and
# momentum to a zero gradient, and skips a None one (dpt's final layer norm, llava's vision
# post-layer-norm moved under kiln where eager left them, found by
# `packages/kiln/bench/breadth_compile.py`). So the trace records which tangents each gradient
# depends on (`TraceMeta.grad_tangents`), the runtime asks autograd for None in place of unread
# outputs' gradients (`set_materialize_grads(False)`), feeds zeros to the compiled backward and
# returns None for a gradient whose tangents were all absent.
def _tangents_reaching(grad_nodes: list[torch.fx.Node | None], graph: torch.fx.Graph) -> list[frozenset[int]]:
    index = {
        n: int(n.name.removeprefix("tangents_")) - 1
        for n in graph.nodes
        if n.op == "placeholder" and n.name.startswith("tangents_") and n.name[9:].isdigit()
    }
    memo: dict[torch.fx.Node, frozenset[int]] = {}
    for node in graph.nodes:  # topological: a node's inputs come first
        if node in index:
            memo[node] = frozenset({index[node]})
        else:
            deps: set[int] = set()
            for a in node.all_input_nodes:
                deps |= memo.get(a, frozenset())
            memo[node] = frozenset(deps)
    return [frozenset() if g is None else memo.get(g, frozenset()) for g in grad_nodes]
