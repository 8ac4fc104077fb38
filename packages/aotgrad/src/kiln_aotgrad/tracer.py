"""The aten tracer: a dispatch mode that records what fake tensors go through.

The traced program runs on kiln_dynamo's fake tensors with `Tracer` pushed as a
TorchDispatchMode. Everything above the dispatcher's Python key (Python code, modules, autograd)
runs normally; every aten OpOverload that comes out at the bottom reaches `__torch_dispatch__`,
which does one of four things:

1. expand it: an entry of the decomposition table (decompositions.py), or a
   CompositeImplicitAutograd kernel, runs under this same mode, so its pieces come back here;
2. alias it: `detach`/`alias`/`lift_fresh` share their input's node (no graph node);
3. functionalize it: a mutating operator is recorded as its functional form and written back
   through the alias model (functionalize.py); an in-place view operator (`squeeze_`, `t_`) is
   recorded as its view, which the tensor becomes (Note [In-place view operators]);
4. record it: run the meta kernel (`kiln_dynamo.fake.run_fake`) for the output metadata, add a
   `call_function` node with `meta["val"]` set to that fake result, and remember which node holds
   each output tensor.

Tensors are matched to nodes by object identity (the tracer keeps every tensor it saw alive, so
ids are never reused). Real tensors that show up (constants made inside the program) become
`get_attr` nodes. Any failure is re-raised as `AotgradError` naming the operator and where in
the user's program it came from: the `source_line` that dynamo stored on the node being
interpreted, or else the innermost stack frame outside torch and kiln.
"""

from __future__ import annotations

import math
import operator
import traceback
from collections.abc import Set
from typing import Any

import torch
import torch.fx
from kiln_symbolic import UnfoldableExpr, expr_of, fold_expr, is_symbolic, symbol_of
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

from kiln_aotgrad.decompositions import DecompTable, eager_refuses, op_name
from kiln_aotgrad.functionalize import (
    SELF,
    Alias,
    Root,
    ViewStep,
    functional_variant,
    inverse_step,
    is_view_op,
    mutated_arg_names,
    replay_step,
)
from kiln_aotgrad.logs import fallbacks_log, graphs_log
from kiln_dynamo import graph_module
from kiln_dynamo.constants import drop_constants, set_constant
from kiln_dynamo.fake import FakeTensor, from_real, is_metadata_query, run_fake
from kiln_dynamo.meta_memo import DEVICE_HINT
from kiln_dynamo.trees import tree_leaves, tree_map

aten = torch.ops.aten

# In-place operators that replace a tensor's storage: not views (functionalize.py rejects them).
_SETS_STORAGE = frozenset({"aten::set_", "aten::resize_", "aten::resize_as_"})
_RESIZES = frozenset({"aten::resize_", "aten::resize_as_"})


def _resize_as_view(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """`resize_` of a contiguous tensor to no more elements keeps its storage and is `as_strided_`
    to contiguous strides at the same offset: the arguments of that, or None (a resize that may
    grow the storage has no such form, and stays an error: the graph runs as captured).

    Note [Metadata mutations of inputs]: an in-place view operator (`t_`, `squeeze_`,
    `as_strided_`, and `resize_` in this form) on a graph input changes the caller's tensor's
    sizes and strides, not its data. The tracer treats the input as its own view from there on
    (`_inplace_view`, as for any tensor), and records it (`metadata_mutated`); `joint.trace`
    stores the sizes, strides and offset the input ends with (`TraceMeta.metadata_mutations`), and
    the runtime (`runtime._restride`) gives them to the real input with `as_strided_` after any
    data write-back (which is in the input's old geometry). Only the input itself, not a view of
    it, and not one that requires grad (autograd would have to see the change)."""
    t = args[0]
    if str(func._schema.name) == "aten::resize_as_":
        size = list(args[1].shape)
        fmt = kwargs.get("memory_format", args[2] if len(args) > 2 else None)
    else:
        size = list(args[1])
        fmt = kwargs.get("memory_format", args[2] if len(args) > 2 else None)
    if fmt not in (None, torch.contiguous_format) or not isinstance(t, torch.Tensor):
        return None
    if any(is_symbolic(v) for v in (*size, *t.shape, *t.stride(), t.storage_offset())):
        return None
    if not t.is_contiguous() or math.prod(size) > t.numel():
        return None
    strides = [1] * len(size)
    for d in range(len(size) - 2, -1, -1):
        strides[d] = strides[d + 1] * max(size[d + 1], 1)
    return (t, size, strides, t.storage_offset())


_IDENTITY = frozenset({aten.detach.default, aten.alias.default, aten.lift_fresh.default})


# Note [Conjugate and negative views are traced as computations]: `_conj` (what `conj()` of a
# complex tensor calls) and `_neg_view` return a view with a lazy bit (`is_conj`, `is_neg`) that
# changes what the view's memory means. A fake tensor did not carry these bits: its wrapper
# reported `is_conj()` False while the meta tensor inside had it set (it carries them now: Note
# [Lazy bits of fake tensors] in kiln_dynamo; what follows still holds: a backend reads plain
# values, and a view rebuilt with `as_strided` loses the bit). Recorded as the view ops they
# are, the two disagreed: `resolve_conj` asked the wrapper, found nothing to resolve and
# returned the view, which the runtime rebuilt as an `as_strided` view of the input, without the
# bit: `view_as_real(z.conj().resolve_conj())` returned z's imaginary part unnegated (a wrong
# answer); `view_as_real` of a conjugate gradient (the backward of `fft.hfft` of a real input)
# asked the meta tensor and raised. So the tracer records them as the computations they stand
# for, `conj_physical` and `neg`, whose results carry no bit anywhere, and every tensor of the
# graph holds the values it shows. The result still joins its input's alias chain with the view
# op as its step: a mutation of the base regenerates it (replayed through `_emit`, which records
# the computation again), and a write into it goes back through the same involution
# (`inverse_step`). A returned tensor reached through one of them is an output of its own, its
# computed values (joint.py), not a view rebuilt on the input: the trace cannot tell eager's
# lazy view (`return z.conj()`) from its resolved copy (`z.conj().resolve_conj()`, which asks
# the wrapper and returns the same fake), and a rebuilt lazy view where eager returned a fresh
# tensor would share the input's memory (a write into it would reach the input) and keep the bit
# (`view_as_real` of it raises). The cost: an output that eager returned as a lazy conjugate view
# of an input is kiln's copy, without the bit and without the shared memory.
PHYSICAL_VIEWS = {aten._conj.default: aten.conj_physical.default, aten._neg_view.default: aten.neg.default}


# Note [Meta kernels that ask the device]: a fake tensor's meta kernel runs on `meta` tensors, and
# torch's Python meta registrations that depend on the device ask `device_hint` (about 25 places:
# `_embedding_bag`, the FFTs, `linalg_eig`, `_linalg_svd`, median/mode, scaled_mm, reflection
# padding ...). `device_hint` knows torch's own FakeTensor only and reads any `meta` tensor as
# CUDA. Off CUDA the answer is then another kernel's: CPU `_embedding_bag` in "sum" mode returns
# an empty `offset2bag` and a `max_indices` of one element per bag, where CUDA's are one per
# index and none (a planned buffer the real result cannot fill, and a backward compiled for a
# saved tensor of another shape); CPU `linalg_eig` and `_linalg_svd` return column-major
# eigenvectors and Vh, CUDA row-major (strides that are not eager's). So while a meta kernel runs
# for a tensor that lives elsewhere, `device_hint` answers that device, as it does for torch's
# FakeTensor: the wrapper installed once below consults `DEVICE_HINT` (kiln_dynamo's, whose memo
# of meta results keys on it: Note [Meta results are memoized]) and otherwise answers as torch's
# own (so other users of torch in the process see no change).


def _install_device_hint() -> None:
    import torch._meta_registrations as registrations

    original = registrations.device_hint
    if getattr(original, "__kiln_hint__", False):
        return

    def device_hint(tensor: Any) -> str:
        hinted = DEVICE_HINT.get()
        if hinted is not None and getattr(getattr(tensor, "device", None), "type", None) == "meta":
            return hinted
        return original(tensor)

    device_hint.__kiln_hint__ = True  # type: ignore[attr-defined]
    registrations.device_hint = device_hint


def fake_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`run_fake`, with meta kernels that ask the device answering for the tensors' real device
    (Note [Meta kernels that ask the device])."""
    leaves = tree_leaves((args, kwargs))
    device = next((a.fake_device for a in leaves if isinstance(a, FakeTensor)), None)
    if device is None or device.type in ("cuda", "meta"):
        return run_fake(func, args, kwargs)
    _install_device_hint()
    token = DEVICE_HINT.set(device.type)
    try:
        out = run_fake(func, args, kwargs)
    finally:
        DEVICE_HINT.reset(token)
    if func in _EMBEDDING_BAG and device.type == "cpu":
        out = _cpu_embedding_bag_fast_path(func, args, kwargs, out)
    return out


_EMBEDDING_BAG = frozenset({aten._embedding_bag.default, aten._embedding_bag_forward_only.default})


def _cpu_embedding_bag_fast_path(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    """Note [Meta kernels that ask the device], continued: torch's meta registration of
    `_embedding_bag` (2.13) knows the CPU kernel's "sum" fast path, which returns an empty
    `offset2bag`, for float32 and float16 weights only; the kernel takes it for bfloat16 too.
    Its other conditions are the meta's own (unit inner strides, no padding index)."""
    names = [a.name for a in func._schema.arguments]
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    weight, psw = bound["weight"], bound.get("per_sample_weights")
    padding_idx = bound.get("padding_idx")
    fast = (
        weight.dtype == torch.bfloat16
        and bound.get("mode", 0) == 0
        and weight.stride(-1) == 1
        and out[0].stride(-1) == 1
        and (padding_idx is None or padding_idx < 0)
        and (psw is None or psw.stride(0) == 1)
    )
    if not fast:
        return out
    return (out[0], run_fake(aten.new_empty.default, (bound["offsets"], [0]), {}), *out[2:])


def _bound(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``func``'s arguments after the first, by name, defaults filled in."""
    schema = func._schema.arguments
    vals: dict[str, Any] = {a.name: a.default_value for a in schema if a.has_default_value()}
    vals.update({a.name: v for a, v in zip(schema[1:], args[1:], strict=False)})
    vals.update(kwargs)
    return vals


def _explicit_offset(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _bound(func, args, kwargs).get("storage_offset")


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill one range of storage positions, each once (static sizes)."""
    expected = 1
    for n, st in sorted(
        ((int(n), int(st)) for n, st in zip(t.shape, t.stride(), strict=True) if n != 1), key=lambda p: p[1]
    ):
        if st != expected:
            return False
        expected *= n
    return True


def _addresses(t: torch.Tensor, limit: int = 1 << 16) -> set[int] | None:
    """The storage positions of ``t``'s elements (static sizes), or None past ``limit``."""
    if t.numel() > limit:
        return None
    out = {int(t.storage_offset())}
    for n, st in zip(t.shape, t.stride(), strict=True):
        out = {a + i * int(st) for a in out for i in range(int(n))}
    return out


# Note [Writes into a view that overlaps itself]: a view whose elements share storage positions
# (`t.as_strided((2, 2), (1, 1), 1)`: elements 1, 2, 2, 3) is written by eager one element after
# another, so a shared position takes every write in turn (`index_add_` of ones adds 2 there);
# eager refuses only where its check can tell (a stride 0: "more than one element of the
# written-to tensor refers to a single memory location"), not for such partial overlaps. A
# functional trace computes the view's new value once and scatters it back: the shared position
# took one write (1 where eager has 2: test_alias_fuzz.py seed 30060, a wrong answer). A write
# into a view that overlaps itself is refused (the graph runs eagerly, with this reason), and so
# is one into a view whose positions are too many to check; a whole input that overlaps itself
# (expanded) runs eagerly per call (Note [Mutated inputs that share memory] in api.py).
#
# Symbolic sizes and strides are decided at their hints, the sizes this trace was made for: an
# `unfold` of a symbolic dimension (`x.unfold(0, 4, 2).mul_(2)`) overlaps itself at every size the
# graph is reused for, and answering False for anything symbolic compiled it once the sizes became
# dynamic (the second size of a static start recompiled it symbolic: a wrong answer from that call
# on). Whether a view overlaps follows from its op's constant arguments (unfold's size against its
# step, a stride of 0), so the hint's answer holds for the other sizes, but for a view that
# changes its answer with them (an unfold with one window at the hint and more later; not
# guarded). A size without a hint (data-dependent) keeps the old answer, False.
def _overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share a storage position (symbolic geometry at its
    hints; False where a size or stride depends on tensor data)."""
    geometry = _hints(*t.shape, *t.stride())
    if geometry is None:
        return False
    sizes, strides = geometry[: t.dim()], geometry[t.dim() :]
    reach = 0  # the last position the dims of smaller strides reach from the first
    for n, st in sorted(
        ((n, abs(st)) for n, st in zip(sizes, strides, strict=True) if n != 1), key=lambda p: p[1]
    ):
        if st <= reach:
            break
        reach += (n - 1) * st
    else:
        return False
    if 0 in sizes:
        return False
    positions = _positions(sizes, strides, 0)
    return positions is None or len(positions) < math.prod(sizes)


def _positions(sizes: list[int], strides: list[int], offset: int) -> set[int] | None:
    """The storage positions of a view's elements, or None past 2 ** 16 elements."""
    if math.prod(sizes) > 1 << 16:
        return None
    out = {offset}
    for n, st in zip(sizes, strides, strict=True):
        out = {a + i * st for a in out for i in range(n)}
    return out


# Note [Writes that read the memory they write]: `x.add_(x[:, :1])`, `x.sub_(x.diagonal())`,
# `x[1:].copy_(x[:-1])`, `torch.sum(x, 1, out=x[:, 0])`: an operand of the write is a view of the
# written tensor's root over some of the positions written. Eager either refuses (its check finds a
# partial overlap of two dense operands: "some elements of the input tensor and the written-to
# tensor refer to a single memory location") or, where its check cannot tell (operands that are
# not dense), reads each operand element when it gets there, after the writes before it: `x[i, 1]`
# adds the new `x[i, 0]`. The functional trace reads every operand before any write, so it ran
# where eager raises and returned other values where eager runs (wrong answers, found by probing
# in-place ops over views of their own target). Such a write is refused, so the graph runs eagerly
# and does what eager does; an operand that is the written tensor itself or a view of the same
# positions in the same order (`x.mul_(x)`), or one over other positions only (`x[:, 2:] -=
# x[:, :2]`), is no such read. Positions are compared at the hints (Note [Writes into a view that
# overlaps itself]); a view past 2 ** 16 elements, or without hints, counts as overlapping.
def _reads_written_positions(target: torch.Tensor, operand: torch.Tensor) -> bool:
    geometry = []
    for t in (target, operand):
        g = _hints(*t.shape, *t.stride(), t.storage_offset())
        if g is None:
            return True
        geometry.append((g[: t.dim()], g[t.dim() : 2 * t.dim()], g[-1]))
    (ts, tst, to), (os_, ost, oo) = geometry
    if (ts, tst, to) == (os_, ost, oo):
        return False
    if 0 in ts or 0 in os_:
        return False
    mine, theirs = _positions(ts, tst, to), _positions(os_, ost, oo)
    return mine is None or theirs is None or not mine.isdisjoint(theirs)


def _hints(*values: int | torch.SymInt) -> list[int] | None:
    """Every value at its hint, or None if one has no hint."""
    out = []
    for v in values:
        h = _hint_of(v)
        if h is None:
            return None
        out.append(h)
    return out


def _hint_of(v: int | torch.SymInt) -> int | None:
    if not isinstance(v, torch.SymInt):
        return int(v)
    hint = v.node.hint
    return None if hint is None else int(hint)


class AotgradError(RuntimeError):
    """An operator kiln_aotgrad cannot trace; names the operator and the user's source line."""

    def __init__(self, msg: str, op: str | None = None, origin: str | None = None) -> None:
        text = msg
        if op is not None:
            text = f"{op}: {text}"
        if origin:
            text = f"{text} (from: {origin})"
        super().__init__(text)
        self.op = op
        self.origin = origin


def _user_frame() -> str | None:
    for frame in reversed(traceback.extract_stack()):
        f = frame.filename
        if "/torch/" in f or "kiln_aotgrad" in f or "kiln_dynamo" in f or f.startswith("<"):
            continue
        return f"{f}:{frame.lineno}: {(frame.line or '').strip()}"
    return None


_COMPOSITE: dict[Any, bool] = {}


def _is_composite(func: Any) -> bool:
    # asked once per operator (Note [Schema questions are asked once per operator])
    known = _COMPOSITE.get(func)
    if known is None:
        known = _COMPOSITE[func] = bool(
            torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
        )
    return known


def _at_most_one_element(t: torch.Tensor) -> bool:
    """`t.numel() <= 1`; False when that depends on tensor data (a data-dependent size)."""
    small = t.numel() <= 1
    if isinstance(small, torch.SymBool):
        return bool(small.node.guard_or_false("", 0))
    return bool(small)


class Tracer(TorchDispatchMode):
    """Records aten operators on fake tensors into `self.graph`, functionalized."""

    def __init__(self, decompositions: DecompTable) -> None:
        super().__init__()
        self.graph = torch.fx.Graph()
        self.decomps = decompositions
        self.nodes: dict[int, torch.fx.Node] = {}
        self.aliases: dict[int, Alias] = {}
        self.roots: dict[int, Root] = {}
        self.keep: list[Any] = []
        # id() of each view -> whether grad mode was on when the graph took it (Note [Views
        # taken in grad mode] in joint.py)
        self.view_grad_mode: dict[int, bool] = {}
        # id() of each view -> whether a step of its chain was taken with grad mode off (Note
        # [A view in grad mode of a view taken under no_grad] in joint.py)
        self.chain_no_grad: dict[int, bool] = {}
        self.computed_in_grad_mode = False  # an operator other than a view ran in grad mode
        self.root_tensors: dict[int, Any] = {}
        # an input traced through a clone (joint.py): the real input's storage offset, where
        # the clone starts at 0 (Note [as_strided within a tensor's own elements])
        self.input_offsets: dict[int, int | torch.SymInt] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self.origin: str | None = None
        self._expanding: list[Any] = []
        self._inputs: set[int] = set()
        # Note [Metadata mutations of inputs]: inputs whose sizes and strides the program changes
        self.metadata_mutated: set[int] = set()
        # Note [One op kept when its decomposition fails]
        self._kept: set[Any] = set()
        # Note [One op kept when its decomposition fails]: each root's birth number, and the
        # birth numbers of the roots written or re-viewed in place, in order
        self._births = 0
        self._written: list[int] = []
        self.kept_ops: list[tuple[str, str]] = []
        # Note [SymInts in the aten graph]
        self.sym_nodes: dict[Any, torch.fx.Node] = {}
        self._sym_sources: dict[Any, tuple[torch.fx.Node, str, int]] = {}
        # Note [A float of sizes keeps its Python operations]: id(SymNode) -> (value, fn, args)
        self._float_recipes: dict[int, tuple[Any, Any, tuple[Any, ...]]] = {}
        self._float_nodes: dict[int, torch.fx.Node] = {}
        self._float_keep: list[Any] = []

    # -- bookkeeping ---------------------------------------------------------------------------
    def placeholder(self, name: str, fake: Any) -> torch.fx.Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = fake
        if isinstance(fake, torch.SymInt):
            self._bind_symbol(fake, node, "", 0)
            return node
        self._new_root(fake, node)
        self._inputs.add(id(fake))
        if getattr(fake, "symbolic", False):
            for kind, values in (("size", fake.shape), ("stride", fake.stride())):
                for dim, v in enumerate(values):
                    self._bind_symbol(v, node, kind, dim)
        return node

    def _bind_symbol(self, value: Any, node: torch.fx.Node, kind: str, dim: int) -> None:
        """Note [SymInts in the aten graph]: every symbol of the graph comes from an input: an
        int placeholder (`Sym(s0)`), or a size or stride of a tensor placeholder, read there by
        `aten.sym_size.int` / `aten.sym_stride.int` when an operator first needs it. A SymInt
        argument of a recorded operator becomes the node of its expression (`sym_node_for`):
        the symbol's node, or `operator` nodes built from the sympy expression, cached per
        expression. The graph's placeholders stay those of the traced program."""
        if not is_symbolic(value):
            return
        expr = expr_of(value)
        if not expr.is_Symbol or expr in self._sym_sources or expr in self.sym_nodes:
            return
        if kind:
            self._sym_sources[expr] = (node, kind, dim)
        else:
            self.sym_nodes[expr] = node

    def sym_node_for(self, value: Any) -> Any:
        """The FX node (or int) computing SymInt `value` from the graph's inputs."""
        return self._expr_node(expr_of(value))

    def _expr_node(self, expr: Any) -> Any:
        def leaf(sym: Any) -> torch.fx.Node:
            source = self._sym_sources.get(sym)
            if source is None:
                raise AotgradError(f"symbol {sym} comes from no graph input", origin=self.where())
            tensor_node, kind, dim = source
            op = aten.sym_size.int if kind == "size" else aten.sym_stride.int
            return self._sym_call(op, (tensor_node, dim))

        try:
            return fold_expr(expr, leaf, self._sym_call, self.sym_nodes)
        except UnfoldableExpr as e:
            raise AotgradError(
                f"cannot compute a symbolic size in the graph: {e}", origin=self.where()
            ) from e

    def _sym_call(self, fn: Any, args: tuple[Any, ...]) -> torch.fx.Node:
        node = self.graph.call_function(fn, args)
        vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
        node.meta["val"] = fn(*vals)
        return node

    def _new_root(self, t: torch.Tensor, node: torch.fx.Node) -> None:
        self.root_tensors[id(t)] = t
        self.keep.append(t)
        self.nodes[id(t)] = node
        self._births += 1
        self.roots[id(t)] = Root(node, born=self._births)
        self.aliases[id(t)] = Alias(id(t), (), 0)

    def _constant(self, t: torch.Tensor) -> torch.fx.Node:
        if isinstance(t, FakeTensor):
            raise AotgradError(
                "a fake tensor that is neither an input nor computed inside the traced program "
                "(a tensor created by another fake trace?)",
                origin=self.where(),
            )
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = t
        node = self.graph.get_attr(name)
        node.meta["val"] = from_real(t)
        self._new_root(t, node)
        return node

    def node_for(self, t: torch.Tensor) -> torch.fx.Node:
        """The node holding `t`'s current contents (replaying its views after a mutation)."""
        a = self.aliases.get(id(t))
        if a is None:
            return self._constant(t)
        root = self.roots[a.root]
        if a.version != root.version:
            node = root.node
            for step in a.chain:
                node = self._replay(step, node, a.root)
            self.nodes[id(t)] = node
            a.version = root.version
        return self.nodes[id(t)]

    def root_of(self, t: torch.Tensor) -> int | None:
        a = self.aliases.get(id(t))
        return None if a is None else a.root

    def chain_of(self, t: torch.Tensor) -> tuple[ViewStep, ...]:
        return self.aliases[id(t)].chain

    def _to_node(self, x: Any, func: Any = None) -> Any:
        """`x` as the graph's argument: a tensor's node, a symbolic number's node, or itself.
        `func`: the operator it is an argument of, named in a refusal."""
        if isinstance(x, torch.Tensor):
            return self.node_for(x)
        if isinstance(x, torch.SymInt) and is_symbolic(x):
            return self.sym_node_for(x)
        if isinstance(x, torch.SymFloat) and is_symbolic(x) and id(x.node) in self._float_recipes:
            return self._sym_float_node(x)
        if isinstance(x, torch.SymFloat) and is_symbolic(x) and self._recipe_of(x.node) is not None:
            return self._sym_float_node(x)
        if isinstance(x, (torch.SymFloat, torch.SymBool)) and is_symbolic(x):
            op = func.name() if hasattr(func, "name") else None
            raise AotgradError(f"a symbolic {type(x).__name__} argument ({x})", op=op, origin=self.where())
        return x

    # Note [A float of sizes keeps its Python operations]: a SymFloat argument of an operator
    # (`torch.full(shape, n / 3)`, `x * (n / 2)`) is computed in the graph by the Python
    # operations that made it, in their order (the captured graph's `truediv(n, 3)`, replayed
    # here as the interpreter runs it), never rebuilt from its sympy expression, whose Add and
    # Mul reorder float operations (Note [Python float arithmetic on sizes, in its order] in
    # kiln_symbolic). Only the operations loopir computes as doubles are kept; a SymFloat made
    # any other way is refused as before (the graph compiles with static sizes).
    FLOAT_OPS = frozenset(
        {
            operator.truediv,
            operator.mul,
            operator.add,
            operator.sub,
            operator.neg,
            operator.pow,
            torch.sym_float,
            torch.sym_sqrt,
        }
    )

    def note_sym_float(self, value: torch.SymFloat, fn: Any, args: tuple[Any, ...]) -> None:
        """Remember how the captured graph computed SymFloat `value` (Note [A float of sizes
        keeps its Python operations])."""
        if fn not in self.FLOAT_OPS or not is_symbolic(value):
            return
        if all(
            isinstance(a, (int, float, torch.SymInt, torch.SymFloat)) and not isinstance(a, bool)
            for a in args
        ):
            self._float_recipes[id(value.node)] = (value, fn, tuple(args))

    def _recipe_of(self, node: Any) -> tuple[Any, tuple[Any, ...]] | None:
        """How a SymFloat's node was computed: from the captured graph, or (Note [Floats of
        sizes remember their operation] in kiln_symbolic) the node's own operation, its operands
        as SymInt / SymFloat / numbers; None if any operand float has no recipe either."""
        known = self._float_recipes.get(id(node))
        if known is not None:
            return known[1], known[2]
        recipe = getattr(node, "recipe", None)
        if recipe is None:
            return None
        fn, operands = recipe
        args: list[Any] = []
        for o in operands:
            if o.constant is not None:
                args.append(o.constant)
            elif o.pytype is int:
                args.append(torch.SymInt(o))
            elif o.pytype is float and self._recipe_of(o) is not None:
                args.append(torch.SymFloat(o))
            else:
                return None
        return fn, tuple(args)

    def _sym_float_node(self, value: torch.SymFloat) -> Any:
        key = id(value.node)
        node = self._float_nodes.get(key)
        if node is None:
            recipe = self._recipe_of(value.node)
            assert recipe is not None, value
            fn, args = recipe
            node = self._sym_call(fn, tuple(self._to_node(a) for a in args))
            self._float_nodes[key] = node
            self._float_keep.append(value)  # keeps id(value.node) from being reused
        return node

    def where(self) -> str | None:
        return self.origin or _user_frame()

    def _stamp(self, node: torch.fx.Node) -> None:
        if self.origin:
            node.meta["source_line"] = self.origin

    def _emit(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.fx.Node:
        """A node computed from other nodes (replays, scatters, casts): metadata from their vals."""

        def val(x: Any) -> Any:
            return x.meta["val"] if isinstance(x, torch.fx.Node) else x

        # Note [Conjugate and negative views are traced as computations]
        func = PHYSICAL_VIEWS.get(func, func)
        vargs = tree_map(val, args)
        vkwargs = tree_map(val, kwargs)
        out = fake_call(func, vargs, vkwargs) if func is not operator.getitem else vargs[0][vargs[1]]
        node = self.graph.call_function(func, tree_map(self._sym_arg, args), tree_map(self._sym_arg, kwargs))
        node.meta["val"] = out
        self._stamp(node)
        return node

    def _sym_arg(self, x: Any) -> Any:
        return self.sym_node_for(x) if isinstance(x, torch.SymInt) and is_symbolic(x) else x

    # -- dispatch --------------------------------------------------------------------------------
    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if not self.computed_in_grad_mode and torch.is_grad_enabled() and not is_view_op(func):
            self.computed_in_grad_mode = True  # Note [Graphs that turn grad mode on] (joint.py)
        try:
            return self._dispatch(func, args, kwargs)
        except AotgradError:
            raise
        except Exception as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AotgradError(f"cannot trace: {msg}", op=op_name(func), origin=self.where()) from e

    def _check_scatter_offset(self, args: tuple[Any, ...]) -> None:
        """Note [as_strided_scatter counts from the input's storage]: eager's `as_strided_scatter`
        places `src` at a storage offset that counts from the start of its input's *storage*
        (an input at offset 3 with offset 1 written through it gets `src`'s elements at its own
        positions -2.. 1, the ones before it dropped), and the code generators lower it from the
        traced input's offset. An input that requires grad is traced through a clone at offset 0
        (Note [Offsets of views of inputs that require grad]): there the positions shifted by
        the input's real offset, a wrong answer (the OpInfo sweep, --layout offset --grad). Such
        an input's scatter is refused (the graph runs eagerly, with this reason)."""
        x = args[0]
        alias = self.aliases.get(id(x)) if isinstance(x, torch.Tensor) else None
        if alias is None or alias.root not in self._inputs:
            return
        root = self.root_tensors.get(alias.root)
        real = self.input_offsets.get(alias.root)
        if (
            root is not None
            and real is not None
            and (isinstance(real, torch.SymInt) or real != root.storage_offset())
        ):
            raise AotgradError(
                "as_strided_scatter of an input that requires grad at a storage offset (traced through a clone)",
                op="aten::as_strided_scatter",
                origin=self.where(),
            )

    def _decompose(self, func: Any, impl: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Note [One op kept when its decomposition fails]: a decomposition that raises on these
        arguments (a table entry or a composite's own) must not fail the whole graph, which
        would then run eagerly: the operator is recorded as one aten call instead, which loopir
        lowers or runs as an extern call of eager's kernel. What the failed attempt recorded is
        dead and removed with the dead code. Only for an operator that neither mutates nor
        aliases its inputs, whose attempt cannot have changed the tracer's view of them. The
        schema is not proof of that: `native_batch_norm` writes its running statistics with no
        `(a!)` in its schema, and an attempt that had already written one of them was kept with
        the written value as its argument (the statistic moved twice; Note [Batch norm under
        symbolic sizes] in decompositions.py). So an attempt that wrote to a tensor that existed
        before it (or changed one's view in place) fails the trace instead of being kept."""
        if mutated_arg_names(func) or is_view_op(func) or torch.Tag.inplace_view in func.tags:
            return self._expand(func, impl, args, kwargs)
        if func is aten.as_strided_copy.default:
            # Note [as_strided_copy is a view, then a copy] in decompositions.py: kept whole it
            # would read the graph's copy of its input where eager reads the storage, so what
            # its view refuses is the trace's refusal
            return self._expand(func, impl, args, kwargs)
        mark, born_before = len(self._written), self._births
        try:
            return self._expand(func, impl, args, kwargs)
        except Exception as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            if any(b <= born_before for b in self._written[mark:]):
                raise AotgradError(
                    f"cannot trace: its decomposition failed ({reason}) after writing to one of "
                    "its inputs, so it cannot be kept as one call",
                    op=op_name(func),
                    origin=self.where(),
                ) from e
            self._kept.add(func)
            self.kept_ops.append((op_name(func), reason))
            fallbacks_log.info(
                "%s: its decomposition failed (%s); kept as one aten call%s",
                op_name(func),
                reason,
                f" at {self.where()}" if self.where() else "",
            )
            return NotImplemented

    def _expand(self, func: Any, impl: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._expanding.append(func)
        try:
            with self:
                return impl(*args, **kwargs)
        finally:
            self._expanding.pop()

    def _dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if is_metadata_query(func):  # Note [Metadata queries as operators] (kiln_dynamo.fake)
            return run_fake(func, args, kwargs)
        if func in _IDENTITY:
            out = run_fake(func, args, kwargs)
            src = args[0]
            node = self.node_for(src)
            a = self.aliases[id(src)]
            self.keep.append(out)
            self.nodes[id(out)] = node
            self.aliases[id(out)] = Alias(a.root, a.chain, a.version)
            return out
        if func is aten.as_strided_scatter.default:
            self._check_scatter_offset(args)
        decomposable = func not in self._expanding and func not in self._kept
        table_entry = self.decomps.get(func) if decomposable else None
        if (table_entry is not None or _is_composite(func)) and decomposable:
            # Note [Decompositions keep eager's errors]: an op eager refuses is recorded whole
            decomposable = not eager_refuses(func, args, kwargs)
        if decomposable:
            if (table_entry is not None or _is_composite(func)) and mutated_arg_names(func):
                # before a decomposition computes out of place and copies into the target
                self._refuse_reads_of_written(func, args, kwargs, mutated_arg_names(func))
            if table_entry is not None:
                r = self._decompose(func, table_entry, args, kwargs)
                if r is not NotImplemented:
                    return self._eager_layout(func, args, kwargs, r)
            if _is_composite(func) and func not in self._kept:
                r = self._decompose(func, func.decompose, args, kwargs)
                if r is not NotImplemented:
                    return r
        if torch.Tag.inplace_view in func.tags and str(func._schema.name) not in _SETS_STORAGE:
            return self._inplace_view(func, args, kwargs)
        if str(func._schema.name) in _RESIZES:
            as_view = _resize_as_view(func, args, kwargs)
            if as_view is not None:
                return self._inplace_view(aten.as_strided_.default, as_view, {})
        writes = mutated_arg_names(func)
        if writes:
            return self._mutation(func, args, kwargs, writes)
        if func in PHYSICAL_VIEWS:  # Note [Conjugate and negative views are traced as computations]
            computed = PHYSICAL_VIEWS[func]
            out = fake_call(computed, args, kwargs)
            node = self.graph.call_function(computed, (self.node_for(args[0]),))
            node.meta["val"] = out
            self._stamp(node)
            self._bind_view(func, args, kwargs, out, node)
            return out
        out = fake_call(func, args, kwargs)
        node = self.graph.call_function(
            func,
            tree_map(lambda a: self._to_node(a, func), args),
            tree_map(lambda a: self._to_node(a, func), kwargs),
        )
        node.meta["val"] = out
        self._stamp(node)
        if is_view_op(func):
            self._bind_view(func, args, kwargs, out, node)
        else:
            self._bind_fresh(out, node)
        self._bind_unbacked(out, node)
        return out

    def _bind_unbacked(self, out: Any, node: torch.fx.Node) -> None:
        """Note [SymInts in the aten graph]: a data-dependent size (Note [Unbacked sizes in
        capture]) first appears in the output of the operator that computes it: the int an
        `.item()` returns is that node; a row count is a size of the output tensor."""
        if isinstance(out, torch.SymInt):
            self._bind_symbol(out, node, "", 0)
            return
        outs = (
            [out]
            if isinstance(out, torch.Tensor)
            else [x for x in out if isinstance(x, torch.Tensor)]
            if isinstance(out, (tuple, list))
            else []
        )
        for t in outs:
            if not getattr(t, "symbolic", False):
                continue
            holder = self.nodes.get(id(t), node)
            for dim, v in enumerate(t.shape):
                self._bind_symbol(v, holder, "size", dim)

    def _eager_layout(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> Any:
        """Give a decomposition's fresh outputs the strides the operator itself would produce.

        Note [Eager strides after a decomposition]: a table entry may return the right values in a
        different memory layout. Layout is visible: user code can look at strides, and random
        operators fill memory in storage order, so `empty_like(x).bernoulli_(p)` on a transposed
        `x` would draw a different mask than eager. The meta kernel of the original operator knows
        eager's layout; where the two disagree, the value is copied into that layout.
        """
        if is_view_op(func) or mutated_arg_names(func):
            return result
        try:
            expected = fake_call(func, args, kwargs)
        except Exception:
            return result
        single = isinstance(result, torch.Tensor)
        got_list = [result] if single else result
        want_list = [expected] if single else expected
        if not isinstance(got_list, (tuple, list)) or not isinstance(want_list, (tuple, list)):
            return result
        if len(got_list) != len(want_list):
            return result
        out: list[Any] = []
        changed = False
        for got, want in zip(got_list, want_list, strict=True):
            a = self.aliases.get(id(got)) if isinstance(got, torch.Tensor) else None
            if (
                a is None
                or not isinstance(want, torch.Tensor)
                or a.chain
                or a.root in self._inputs
                or got.shape != want.shape
                or got.dtype != want.dtype
                or _at_most_one_element(got)
                or got.stride() == want.stride()
            ):
                out.append(got)
                continue
            empty = self._emit(
                aten.empty_strided.default,
                (list(want.shape), list(want.stride())),
                {"dtype": want.dtype, "device": want.device},
            )
            copied = self._emit(aten.copy.default, (empty, self.node_for(got)), {})
            self._new_root(want, copied)
            out.append(want)
            changed = True
        if not changed:
            return result
        return out[0] if single else type(result)(out)

    # Note [as_strided within a tensor's own elements]: eager's `as_strided` may reach any
    # element of the storage; a traced program holds only its inputs' own elements (a graph
    # input is a buffer of them: `x = base[2:6]` brings 4 elements, not `base`) and its
    # intermediates. A view reaching past the elements of the tensor it is traced from read
    # other memory: a wrong answer (test_alias_fuzz.py, found by its first session). The trace
    # refuses such a view of an input (kiln then runs the graph eagerly, with this reason) unless
    # every element it reaches is an element of the input, known statically (an input traced
    # through a clone at another offset is refused too). A view of an intermediate needs no
    # check: its storage is its own allocation in eager as in the graph.
    def _outside_elements(self, view: torch.Tensor, root_id: int) -> str | None:
        if root_id not in self._inputs:
            # an intermediate's storage is its own allocation, in eager as in the graph: the
            # fake `as_strided` already checked the view against it
            return None
        root = self.root_tensors.get(root_id)
        if root is None:
            return "of a tensor the trace does not know"
        geometry = (*view.shape, *view.stride(), view.storage_offset())
        geometry += (*root.shape, *root.stride(), root.storage_offset())
        if any(isinstance(v, torch.SymInt) for v in geometry):
            return "with symbolic sizes (whether it stays within its tensor's elements is unknown)"
        real_offset = self.input_offsets.get(root_id, root.storage_offset())
        if isinstance(real_offset, torch.SymInt) or real_offset != root.storage_offset():
            return "of an input that requires grad at a storage offset (traced through a clone)"
        if view.numel() == 0:
            return None
        if _dense(root):  # its elements are one range of positions: compare the ends
            lo = hi = int(view.storage_offset())
            for n, st in zip(view.shape, view.stride(), strict=True):
                reach = (int(n) - 1) * int(st)
                lo, hi = lo + min(0, reach), hi + max(0, reach)
            start = int(root.storage_offset())
            if start <= lo and hi < start + root.numel():
                return None
        mine = _addresses(view)
        if mine is None or (theirs := _addresses(root)) is None:
            return "over too many elements to check"
        if not mine <= theirs:
            return (
                "reaches memory outside the elements of the tensor it views (eager reads the "
                "storage there; a compiled graph holds only the tensor's own elements)"
            )
        return None

    # Note [as_strided reads its root's storage]: `as_strided` with an explicit offset addresses
    # the storage, whatever view it is applied to, so in the graph it views the root's value, not
    # the view it was called on: a code generator may hold a view's elements in a buffer of their
    # own (an extern `diagonal` of an input at offset 4 became an 11-element copy holding the
    # diagonal), and the absolute offset 12 then read past that copy's elements:
    # `x.diagonal(offset=1).as_strided((2, 2), (1, 1), 12)` read uninitialised memory (test_alias_fuzz.py
    # --pad-mm seed 22016, minimised). The offset counts from the storage's start, where the root
    # tensor (as the program holds it) begins at its own storage offset, its `origin`; the root's
    # value in the graph may begin elsewhere (a written input's value is a fresh tensor at 0), so
    # the step is taken on that value at `offset - origin + value's offset`. The same holds when
    # the view is read again after a write of its root (`_replay`): replayed on the rewritten
    # `diagonal` it read past that copy too (seed 22016 under --pad-mm, a wrong answer), and an
    # `as_strided` taken after its input was written counted its offset from the written value's
    # 0 instead of the input's 4. Only where the root's value keeps the root's positions: the
    # same dtype, sizes and strides (a written dense tensor's value has its layout); otherwise
    # the trace refuses.
    def _root_origin(self, root_id: int) -> Any:
        """The storage offset the root tensor starts at, as the traced program holds it."""
        return self.root_tensors[root_id].storage_offset()

    def _strided_on_root(self, step: ViewStep, root_id: int, view_dtype: torch.dtype) -> torch.fx.Node | None:
        """``step`` (an `as_strided` with an explicit offset) taken on ``root_id``'s current
        value (Note [as_strided reads its root's storage]); None where the root's value is of
        another dtype (the offset counts in the view's elements)."""
        root = self.roots[root_id]
        value = root.node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dtype != view_dtype:
            return None
        held = self.root_tensors[root_id]
        if (*value.shape, *value.stride()) != (*held.shape, *held.stride()):
            raise AotgradError(
                "as_strided of a tensor whose value in the graph has another layout",
                op="aten::as_strided",
                origin=self.where(),
            )
        vals = _bound(step.func, step.args, step.kwargs)
        node = root.node
        if node.op != "placeholder" and (
            isinstance(value.storage_offset(), torch.SymInt) or value.storage_offset() != 0
        ):
            # a computed value at an offset of its own storage (aten's `copy` keeps its input's):
            # a code generator holds it in a buffer of its own from 0, so the view is taken on a
            # copy, which starts at 0 in eager too (as `_strided_write` does)
            node = self._emit(aten.clone.default, (node,), {})
            value = node.meta["val"]
        offset = vals["storage_offset"] - step.root_offset + value.storage_offset()
        return self._emit(step.func, (node, list(vals["size"]), list(vals["stride"]), offset), {})

    def _bind_fresh(self, out: Any, node: torch.fx.Node) -> None:
        if isinstance(out, torch.Tensor):
            if id(out) not in self.aliases:
                self._new_root(out, node)
            return
        if isinstance(out, (tuple, list)):
            for i, el in enumerate(out):
                if isinstance(el, torch.Tensor) and id(el) not in self.aliases:
                    g = self.graph.call_function(operator.getitem, (node, i))
                    g.meta["val"] = el
                    self._stamp(g)
                    self._new_root(el, g)

    def _bind_view(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, node: torch.fx.Node
    ) -> None:
        parent = args[0]
        pa = self.aliases[id(parent)]
        if func is aten.as_strided.default and isinstance(out, torch.Tensor):
            why = self._outside_elements(out, pa.root)
            if why:
                raise AotgradError(f"as_strided {why}", op="aten::as_strided", origin=self.where())
        version = self.roots[pa.root].version
        rest = (SELF, *args[1:])
        below = self.chain_no_grad.get(id(parent), False) or not torch.is_grad_enabled()
        for v in [out] if isinstance(out, torch.Tensor) else out:
            self.view_grad_mode[id(v)] = torch.is_grad_enabled()
            self.chain_no_grad[id(v)] = below
        if isinstance(out, torch.Tensor):
            self.keep.append(out)
            self.nodes[id(out)] = node
            step = ViewStep(func, rest, kwargs, None)
            if func is aten.as_strided.default and _explicit_offset(func, rest, kwargs) is not None:
                # Notes [Writes through as_strided go into the root], [as_strided reads its root's storage]
                step.root_offset = self._root_origin(pa.root)
                on_root = self._strided_on_root(step, pa.root, out.dtype)
                if on_root is not None:
                    self.nodes[id(out)] = on_root  # `node` is left to dead-code elimination
            self.aliases[id(out)] = Alias(pa.root, (*pa.chain, step), version)
            return
        for i, el in enumerate(out):
            g = self.graph.call_function(operator.getitem, (node, i))
            g.meta["val"] = el
            self._stamp(g)
            self.keep.append(el)
            self.nodes[id(el)] = g
            self.aliases[id(el)] = Alias(pa.root, (*pa.chain, ViewStep(func, rest, kwargs, i)), version)

    def _inplace_view(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Note [In-place view operators]: `squeeze_`, `unsqueeze_`, `transpose_`, `t_`,
        `as_strided_` (tag `inplace_view`) change a tensor's sizes and strides, never its data.
        They are not mutations: the tensor becomes its own view, so it is traced as the
        functional view (`squeeze`, ...) whose node and alias chain the tensor takes over, and
        the fake tensor's own metadata is changed the way eager changes the real one (composite
        kernels such as `matmul` of a vector and `quantile` end with `squeeze_`: treating it as a
        data write kept the old shape)."""
        name = str(func._schema.name)
        t = args[0]
        self.node_for(t)
        self._written.append(self.roots[self.aliases[id(t)].root].born)
        a_t = self.aliases[id(t)]
        if a_t.root in self._inputs:
            if a_t.chain or id(t) != a_t.root or t.requires_grad:
                # Eager would change a view of the caller's tensor, or one autograd tracks
                raise AotgradError("in-place view of a graph input (a metadata mutation)", op=name)
            # Note [Metadata mutations of inputs]: the runtime gives the caller's tensor the
            # sizes and strides it ends with (kiln_aotgrad's runtime.py)
            self.metadata_mutated.add(id(t))
        view_fn = _view_variant(func)
        with self:
            view = view_fn(*args, **kwargs)
        node = self.node_for(view)
        a = self.aliases[id(view)]
        # Nodes that already hold `t` (its producer, a mutation's input) keep the metadata they had.
        snapshot = _snapshot(t)
        for n in self.graph.nodes:
            if n.meta.get("val") is t:
                n.meta["val"] = snapshot
        # The wrapper's metadata, set as eager sets it: by the operator's meta kernel.
        with no_dispatch():
            include = torch._C._meta_in_tls_dispatch_include()
            torch._C._set_meta_in_tls_dispatch_include(True)
            try:
                func(t, *args[1:], **kwargs)
            finally:
                torch._C._set_meta_in_tls_dispatch_include(include)
        if isinstance(t, FakeTensor):
            func(t.meta, *args[1:], **kwargs)
            if t.constant is not None:  # Note [Constant fakes]: the value changes as the metadata
                with no_dispatch():
                    func(t.constant, *args[1:], **kwargs)
        self.nodes[id(t)] = node
        self.aliases[id(t)] = Alias(a.root, a.chain, a.version)
        return t

    def _mutation(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], writes: list[str]) -> Any:
        fn = functional_variant(func)
        if fn is None:
            raise AotgradError("mutating operator without a functional form", op=op_name(func))
        args, kwargs = _with_defaults(func, args, kwargs)
        schema_args = func._schema.arguments
        bound: dict[str, Any] = {}
        for a, v in zip(schema_args, args, strict=False):
            bound[a.name] = v
        bound.update(kwargs)
        # a foreach op (`_foreach_mul_`) writes a list of tensors: each element is a target, and the
        # functional form returns one list with a result per element
        targets = [
            t for w in writes for t in (bound[w] if isinstance(bound[w], list | tuple) else [bound[w]])
        ]
        self._refuse_reads_of_written(func, args, kwargs, writes)
        if any(self._view_overlapping_itself(t) for t in targets):
            raise AotgradError(  # Note [Writes into a view that overlaps itself]
                "an in-place write into a view whose elements share memory (eager writes them one "
                "after another)",
                op=op_name(func),
                origin=self.where(),
            )
        inplace = str(func._schema.name).endswith("_")
        if inplace:
            f_args, f_kwargs = args, kwargs
        else:
            f_args = tuple(v for a, v in zip(schema_args, args, strict=False) if a.name not in writes)
            f_kwargs = {k: v for k, v in kwargs.items() if k not in writes}
        # The functional form goes through this mode again, so the table still applies to it.
        with self:
            out = fn(*f_args, **f_kwargs)
        if isinstance(out, torch.Tensor):
            outs = [out]
        else:
            outs = [t for o in out for t in (o if isinstance(o, list | tuple) else [o])][: len(targets)]
        results = [self.node_for(o) for o in outs]
        for target, result in zip(targets, results, strict=True):
            v = result.meta["val"]
            value = result
            if v.dtype != target.dtype:
                value = self._emit(aten._to_copy.default, (value,), {"dtype": target.dtype})
            if tuple(v.shape) != tuple(target.shape):
                value = self._emit(aten.expand.default, (value, list(target.shape)), {})
                value = self._emit(aten.clone.default, (value,), {})
            self._write(target, value)
        if inplace:
            return args[0] if func._schema.returns else None
        return targets[0] if len(targets) == 1 else tuple(targets)

    def _refuse_reads_of_written(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], writes: list[str]
    ) -> None:
        """Note [Writes that read the memory they write]."""
        bound = dict(zip((a.name for a in func._schema.arguments), args, strict=False))
        bound.update(kwargs)
        targets = [
            t
            for w in writes
            if w in bound
            for t in (bound[w] if isinstance(bound[w], list | tuple) else [bound[w]])
        ]
        if self._reads_what_it_writes(targets, args, kwargs):
            raise AotgradError(
                "an in-place write with an operand over some of the written memory (eager reads "
                "it while writing, or refuses)",
                op=op_name(func),
                origin=self.where(),
            )

    def _reads_what_it_writes(
        self, targets: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bool:
        by_root: dict[int, list[torch.Tensor]] = {}
        for t in targets:
            root = self.root_of(t) if isinstance(t, torch.Tensor) else None
            if root is not None:
                by_root.setdefault(root, []).append(t)
        if not by_root:
            return False
        operands = [v for v in (*args, *kwargs.values()) for v in (v if isinstance(v, list | tuple) else [v])]
        for r in operands:
            if not isinstance(r, torch.Tensor) or any(r is t for t in targets):
                continue
            for t in by_root.get(self.root_of(r), ()):  # type: ignore[arg-type]
                if _reads_written_positions(t, r):
                    return True
        return False

    def _view_overlapping_itself(self, t: Any) -> bool:
        """Note [Writes into a view that overlaps itself]; a whole input that overlaps itself
        is the runtime's to find (Note [Mutated inputs that share memory] in api.py)."""
        if not isinstance(t, torch.Tensor) or id(t) not in self.aliases or not self.aliases[id(t)].chain:
            return False
        return _overlaps_itself(t)

    def _write(self, t: torch.Tensor, new: torch.fx.Node) -> None:
        """`t` now holds `new`: update its root through the inverse of its view chain."""
        self.node_for(t)
        a = self.aliases[id(t)]
        root = self.roots[a.root]
        node = new
        if a.chain:
            parents = [root.node]
            for step in a.chain[:-1]:
                parents.append(self._replay(step, parents[-1], a.root))
            for step, parent in zip(reversed(a.chain), reversed(parents), strict=True):
                if step.func is aten.as_strided.default:
                    # Note [Writes through as_strided go into the root]
                    node = self._strided_write(step, parent, root.node, node)
                    break
                node = inverse_step(self._emit, step, parent, node)
        root.node = node
        root.version += 1
        root.mutated = True
        self._written.append(root.born)
        self.nodes[id(t)] = new
        a.version = root.version
        # Note [Constant fakes] (kiln_dynamo's constants.py): `t` and its aliases no longer hold
        # what they held; a write of a constant into a whole tensor keeps it constant
        value = new.meta.get("val")
        if isinstance(t, FakeTensor):
            drop_constants(t)
            fresh = getattr(value, "constant", None)
            if not a.chain and fresh is not None and fresh.shape == t.shape and fresh.dtype == t.dtype:
                set_constant(t, fresh.clone())

    # Note [Writes through as_strided go into the root]: `as_strided`'s offset is absolute in the
    # storage, whatever view it is applied to: `t.select(0, 38).unsqueeze(0).as_strided((1, 1),
    # (2, 1), 21)` views element 21 of `t`, outside the one-element view it was taken from. Its
    # write went back as `as_strided_scatter` into that parent, which clones the parent (one
    # element, at offset 0) and writes at 21 of the clone: out of its bounds, and the element of
    # `t` kept its old value (test_alias_fuzz.py seed 3476). The write goes into the root instead,
    # skipping the views between: `as_strided_scatter` of the root's value at the view's offset
    # relative to the root's, into a copy of the root where it is at a storage offset (Note
    # [Pieces written back as slices]); that copy has the root's positions for a dense root (a
    # root with gaps or overlaps would be compacted by it, and is refused). The same absolute
    # offset is why an `as_strided` step records the root's storage offset (`root_offset`): once
    # written, the root's value is a fresh tensor at offset 0, and the step replayed on it (to
    # read the view again, or to write through it a second time) moves its offset by as much;
    # replayed unmoved on an input at offset 6 it read 6 elements too far.
    def _strided_write(
        self, step: ViewStep, parent: torch.fx.Node, root: torch.fx.Node, new: torch.fx.Node
    ) -> torch.fx.Node:
        pv, rv = parent.meta["val"], root.meta["val"]
        vals = _bound(step.func, step.args, step.kwargs)
        start = vals["storage_offset"]
        geometry = (*rv.shape, *rv.stride())
        dense = rv.is_contiguous() if any(isinstance(v, torch.SymInt) for v in geometry) else _dense(rv)
        if not dense:
            raise AotgradError("a write through as_strided into a tensor with gaps or overlaps")
        offset = pv.storage_offset() - rv.storage_offset() if start is None else start - step.root_offset
        if isinstance(rv.storage_offset(), torch.SymInt) or rv.storage_offset() != 0:
            # Note [Pieces written back as slices] (functionalize.py): aten's as_strided_scatter
            # reads the offset in its input's storage; a copy starts at 0 with the root's strides
            root = self._emit(aten.clone.default, (root,), {})
        return self._emit(
            aten.as_strided_scatter.default, (root, new, list(vals["size"]), list(vals["stride"]), offset), {}
        )

    def _replay(self, step: ViewStep, parent: torch.fx.Node, root_id: int) -> torch.fx.Node:
        """``step`` replayed on ``parent``, a view of root ``root_id``'s current value: an
        explicit `as_strided` offset is taken on the root's value, where it moves with the value's
        storage offset (Notes [as_strided reads its root's storage], [Writes through as_strided go
        into the root]: a written root's new value is a fresh tensor, at offset 0)."""
        if step.root_offset is None:
            return replay_step(self._emit, step, parent)
        on_root = self._strided_on_root(step, root_id, parent.meta["val"].dtype)
        if on_root is not None:
            return on_root
        vals = _bound(step.func, step.args, step.kwargs)
        value = self.roots[root_id].node.meta["val"]
        offset = vals["storage_offset"] - step.root_offset + value.storage_offset()
        return self._emit(step.func, (parent, list(vals["size"]), list(vals["stride"]), offset), {})

    # -- result ----------------------------------------------------------------------------------
    def finish(self, outputs: list[torch.fx.Node | None]) -> torch.fx.GraphModule:
        """Close the graph with `outputs`, drop dead nodes (random ones stay) and build the module."""
        self.graph.output(tuple(outputs))
        checked = check_dead_gathers(self.graph)  # Note [Dead gathers keep their bounds check]
        if checked:
            graphs_log.info("kiln_aotgrad: gathers never read kept as bounds checks: %s", ", ".join(checked))
        eliminate_dead_code(self.graph)
        root = torch.nn.Module()
        for name, value in self.constants.items():
            setattr(root, name, value)
        # Note [Graph modules generated on demand]: its source forgotten with it (Note
        # [Generated FX source outlives its module])
        return graph_module(root, self.graph)


def _view_variant(func: Any) -> Any:
    """The view operator an in-place view operator stands for: `squeeze_.dims` -> `squeeze.dims`,
    `transpose_` -> `transpose.int` (same argument names)."""
    packet = getattr(aten, str(func._schema.name).split("::")[1][:-1])
    names = [a.name for a in func._schema.arguments]
    for ov_name in packet.overloads():
        ov = getattr(packet, ov_name)
        if is_view_op(ov) and [a.name for a in ov._schema.arguments] == names:
            return ov
    raise AotgradError("in-place view operator without a view form", op=op_name(func))


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    """A new fake tensor with `t`'s current metadata, over the same meta storage."""
    if not isinstance(t, FakeTensor):
        return t
    meta = t.meta.as_strided(t.shape, t.stride(), t.storage_offset())
    return FakeTensor(meta, t.fake_device, t.requires_grad, t.is_param)


def _with_defaults(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Python dispatch drops arguments equal to their defaults; the functional form may lack them."""
    args = tuple(args)
    kwargs = dict(kwargs)
    for i, a in enumerate(func._schema.arguments):
        if a.kwarg_only:
            if a.name not in kwargs and a.has_default_value() and a.alias_info is None:
                kwargs[a.name] = a.default_value
        elif i >= len(args) and a.name not in kwargs and a.has_default_value():
            args = (*args, a.default_value)
    return args, kwargs


# run-time assertions (and printing): no output, but their effect (raising) is the program's
_ASSERTS = frozenset(
    op
    for name, overload in (
        ("_assert_async", "default"),
        ("_assert_async", "msg"),
        ("_assert_scalar", "default"),
    )
    if (op := getattr(getattr(torch.ops.aten, name, None), overload, None)) is not None
)


def effectful(node: torch.fx.Node) -> bool:
    """A node kept for its effect although nothing reads it: a run-time assertion (dead-code
    elimination and the partitioner keep it; Note [Extern calls kept for their effect] in
    kiln_loopir's scheduler.py)."""
    return node.op == "call_function" and node.target in _ASSERTS


def _impure(node: torch.fx.Node) -> bool:
    t = node.target
    if effectful(node):
        return True
    return isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags


def _binds_checked_symbol(node: torch.fx.Node) -> bool:
    """`node` computes a data-dependent symbol a `torch._check` fact mentions: the wrapper checks
    the fact at run time with its value (Note [Checks of data-dependent sizes at run time] in
    kiln_loopir), so it stays even when nothing reads it."""
    value = node.meta.get("val")
    sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
    for size in sizes:
        sym = symbol_of(size)
        env = getattr(getattr(size, "node", None), "shape_env", None)
        if sym is not None and env is not None and sym in env.checked_unbacked():
            return True
    return False


# Note [Dead gathers keep their bounds check]: a gather nobody reads (`t = x[i]`, a
# `torch.gather` whose result is dropped) is dead code, and an index out of range that raises
# IndexError in eager passed silently in the compiled program (torch.compile drops it too).
# Silently accepting an out-of-range index is worse than raising, so before dead-code
# elimination each dead gather of the program (not one a backward formula made: its indices
# are the forward's, checked there) leaves a check behind: the same gather of a `full_like`
# of its source (its shape only, no data read; False, so that `logical_not(any(...))` holds
# also for no index at all, in core operators) under an `_assert_async`, which dead-code
# elimination and the partitioner keep for its effect. The code generators
# check the gather's indirect index and raise IndexError as for a live gather (on a GPU the
# Triton generator checks only in debug mode, for a live gather too); eager's kernel (a
# fallback) does too. One small kernel per dead gather, none where there is none (none in the
# model suite's 20 model-modes); logged under KILN_LOG=aot_graphs. Dead index *writes* keep their check in kiln_loopir (Note [Dead
# index writes keep their bounds check]); both are tested by kiln's test_alias_fuzz.py
# (`test_dead_index_ops`).
_GATHERS = frozenset(
    op
    for name, overload in (
        ("index", "Tensor"),
        ("gather", "default"),
        ("index_select", "default"),
        ("embedding", "default"),
    )
    if (op := getattr(getattr(torch.ops.aten, name, None), overload, None)) is not None
)


def _integer_indices(node: torch.fx.Node) -> bool:
    """Whether a gather's indices are all integer tensors (a boolean mask's size is checked
    while tracing; its result's size is data-dependent)."""
    indices: list[Any]
    if node.target is aten.index.Tensor:
        listed = node.args[1]
        indices = [i for i in listed if i is not None] if isinstance(listed, list | tuple) else []
    elif node.target is aten.embedding.default:
        indices = [node.args[1]]
    else:
        indices = [node.args[2]]
    vals = [i.meta.get("val") if isinstance(i, torch.fx.Node) else None for i in indices]
    return bool(vals) and all(
        isinstance(v, torch.Tensor)
        and not v.dtype.is_floating_point
        and v.dtype not in (torch.bool, torch.uint8)
        for v in vals
    )


def ancestors(roots: list[Any], stop: Set[torch.fx.Node] = frozenset()) -> set[torch.fx.Node]:
    """The nodes among ``roots`` and every node they read, directly or not; the walk does not go
    past a node in ``stop`` (which is included)."""
    seen: set[torch.fx.Node] = set()
    stack = [r for r in roots if isinstance(r, torch.fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in stop:
            stack.extend(n.all_input_nodes)
    return seen


def check_dead_gathers(graph: torch.fx.Graph) -> list[str]:
    """Note [Dead gathers keep their bounds check]: a check after each dead gather; returns the
    names of the gathers checked."""
    nodes = list(graph.nodes)
    live = ancestors([n for n in nodes if n.op == "output" or _impure(n) or _binds_checked_symbol(n)])
    backward: set[torch.fx.Node] = set()
    for n in nodes:
        if (n.op == "placeholder" and n.name.startswith("tangents")) or any(
            a in backward for a in n.all_input_nodes
        ):
            backward.add(n)
    checked = []
    for node in nodes:
        if node in live or node in backward or node.target not in _GATHERS or not _integer_indices(node):
            continue
        src = node.args[0]
        if not isinstance(src, torch.fx.Node) or not isinstance(src.meta.get("val"), torch.Tensor):
            continue
        vals = tree_map(lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a, node.args)
        try:
            false_val = run_fake(aten.full_like.default, (vals[0], False), {"dtype": torch.bool})
            hit_val = run_fake(node.target, (false_val, *vals[1:]), dict(node.kwargs))
            any_val = run_fake(aten.any.default, (hit_val,), {})
            ok_val = run_fake(aten.logical_not.default, (any_val,), {})
        except Exception:  # a gather fake tensors cannot take again: left unchecked
            continue
        with graph.inserting_after(node):
            false = graph.call_function(aten.full_like.default, (src, False), {"dtype": torch.bool})
        with graph.inserting_after(false):
            hit = graph.call_function(node.target, (false, *node.args[1:]), dict(node.kwargs))
        with graph.inserting_after(hit):
            found = graph.call_function(aten.any.default, (hit,))
        with graph.inserting_after(found):
            ok = graph.call_function(aten.logical_not.default, (found,))
        with graph.inserting_after(ok):
            check = graph.call_function(
                aten._assert_async.msg, (ok, f"index out of range in a gather never read ({node.name})")
            )
        for new, val in ((false, false_val), (hit, hit_val), (found, any_val), (ok, ok_val)):
            new.meta.update(node.meta)
            new.meta["val"] = val
        check.meta.update(node.meta)
        check.meta["val"] = None
        checked.append(node.name)
    return checked


def eliminate_dead_code(graph: torch.fx.Graph) -> None:
    for node in reversed(list(graph.nodes)):
        dead = node.op in ("call_function", "get_attr") and not node.users and not _impure(node)
        if dead and not _binds_checked_symbol(node):
            graph.erase_node(node)
