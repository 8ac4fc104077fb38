"""The public entry points: `aot_function` and `aot_module`.

A call of the returned function flattens its arguments with pytree. Tensor leaves become graph
inputs (for a module: its parameters and buffers first, then the tensor arguments); other leaves
are baked into the trace as constants. The first call with a given *signature* (every tensor's
shape, strides, dtype, device and requires_grad, the non-tensor leaves, the grad mode) traces,
partitions and compiles; later calls with the same signature reuse the compiled runner.

Per signature (`compile_flat`):
- inference (grad mode off, or nothing requires grad, or no output is differentiable): one
  functional aten graph -> `inference_compiler` (default: `fw_compiler`);
- training: the joint graph -> `partition` -> forward to `fw_compiler`, backward to
  `bw_compiler` (default: `fw_compiler`), both wrapped by runtime.training_runner.

Compilers follow the backend protocol `compiler(gm, example_inputs) -> callable`; the example
inputs are the fake tensors of the graph's placeholders.

Note [The call fast path]: kiln_dynamo calls one AotFunction per captured graph on every call of
the user's code, always with positional tensors only, on a GraphModule that holds no parameters,
buffers or submodules. For that case the call skips pytree (the leaves are the arguments), the
module state (there is none) and the modules' training flags (no submodule reads them): what is
left is the signature lookup, which correctness needs. Any other call takes the general path.

Note [Guarded callers]: as a dynamo backend (`aot_backend`) an AotFunction is called only when the
frame's guards passed, and those check every tensor input's type, shape, strides, dtype, device
and requires_grad. After its first compile such a function (`guarded=True`) skips the signature
(ResNet-50 has 269 inputs: half a millisecond per call on a GPU host) and checks only what the
guards leave out and the compiled code relies on: the grad mode, and the storage offset of an
input that an output is rebuilt as a view of (`_assemble` uses absolute offsets). Anything else
that differs falls back to the signature lookup.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from kiln_aotgrad.decompositions import DecompTable, default_decompositions
from kiln_aotgrad.joint import OriginInterpreter, Traced, trace
from kiln_aotgrad.logs import fallbacks_log, graphs_log, partition_log
from kiln_aotgrad.partition import Partition, partition, split_backward
from kiln_aotgrad.runtime import inference_runner, training_runner
from kiln_aotgrad.tracer import Tracer, _overlaps_itself
from kiln_dynamo import graph_unbacked_env, unbacked_sizes

Compiler = Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]


@dataclass(slots=True)
class CompiledArtifacts:
    """What one signature compiled to (kept for tests, the benchmark and debugging)."""

    traced: Traced
    partition: Partition | None
    runner: Callable[..., Any]


@dataclass(slots=True)
class AotOptions:
    fw_compiler: Compiler
    bw_compiler: Compiler | None = None
    inference_compiler: Compiler | None = None
    decompositions: DecompTable | None = None
    partition: str = "min_cut"
    table: DecompTable = field(default_factory=dict)
    # the min-cut weighs a value the forward would fuse away at twice its bytes (Note [What
    # saving a value costs] in partition.py)
    fusion_aware_saves: bool = True
    # a value the backward would have to write is saved, not recomputed (Note [Values the
    # backward would write] in partition.py)
    materialized_saves: bool = True
    # the fusion-aware cut does not recompute a value that reads more bytes than it has (Note
    # [Recomputing from many values] in partition.py)
    recompute_sources: bool = True

    def __post_init__(self) -> None:
        if self.partition not in ("default", "min_cut"):
            raise ValueError(f"partition must be 'default' or 'min_cut', not {self.partition!r}")
        self.table = default_decompositions()
        if self.decompositions:
            self.table.update(self.decompositions)


def _example_inputs(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def compile_flat(
    fn: Callable[[Tracer, list[torch.Tensor]], Any], inputs: list[torch.Tensor], opts: AotOptions
) -> CompiledArtifacts:
    """Trace `fn` on `inputs`' metadata and compile it into a runner of flat real tensors."""
    want_training = torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in inputs)
    traced = trace(fn, inputs, opts.table, want_training)
    meta = traced.meta
    if not meta.training:
        if graphs_log.isEnabledFor(logging.INFO):  # Note [Graph modules generated on demand]
            graphs_log.info("inference graph:%s", traced.gm.code)
        compiler = opts.inference_compiler or opts.fw_compiler
        # grad mode off while it compiles: a compiler that asks torch.is_grad_enabled() (loopir's
        # passes) sees an inference graph also when grad mode is on but nothing requires grad
        with torch.no_grad():
            compiled = compiler(traced.gm, _example_inputs(traced.gm))
        return CompiledArtifacts(traced, None, inference_runner(compiled, meta))
    part = partition(
        traced.gm,
        meta.num_graph_outputs,
        opts.partition,
        opts.fusion_aware_saves,
        opts.materialized_saves,
        opts.recompute_sources,
    )
    if graphs_log.isEnabledFor(logging.INFO):  # Note [Graph modules generated on demand]
        graphs_log.info("forward graph:%s\nbackward graph:%s", part.fw.code, part.bw.code)
    partition_log.info(
        "%s: saved %d bytes (%d of activations, %d written only to be saved): %s; recomputed in backward: %s",
        opts.partition,
        part.saved_bytes,
        part.activation_bytes,
        part.forward_writes,
        ", ".join(part.saved),
        ", ".join(part.recomputed) or "nothing",
    )
    if part.cost_note:
        partition_log.info("%s", part.cost_note)
    n_out = meta.num_graph_outputs
    part.fw.meta[FREE_LAYOUT_OUTPUTS] = tuple(range(n_out, n_out + len(part.saved)))
    fw = opts.fw_compiler(part.fw, _example_inputs(part.fw))
    bw_inputs = _saved_as_the_forward_left_them(part, _example_inputs(part.bw), fw, n_out)
    laid_out = _laid_out_by_the_forward(part, fw, n_out, bw_inputs)
    if laid_out:  # Note [Backward inputs the forward laid out]
        part.bw.meta[LAID_OUT_INPUTS] = laid_out
        partition_log.info(
            "backward inputs laid out by the compiled forward (checked for their storage offset "
            "only): %d of %d",
            len(laid_out),
            len(bw_inputs),
        )
    bw_compiler = opts.bw_compiler or opts.fw_compiler
    if meta.new_value_grads is None:
        bw = bw_compiler(part.bw, bw_inputs)
        return CompiledArtifacts(traced, part, training_runner(fw, bw, meta, part.saved_sizes))
    # Note [New values differentiated on their own] (joint.py): the backward in two halves
    diff = [i for i, r in enumerate(meta.graph_out_requires_grad) if r]
    m = len(meta.mutated_inputs)
    user_tangents = {k for k, i in enumerate(diff) if i >= m}
    halves = []
    for gm, keep in split_backward(part.bw, len(part.saved), len(meta.grad_inputs), user_tangents):
        if laid_out:
            gm.meta[LAID_OUT_INPUTS] = tuple(j for j, i in enumerate(keep) if i in laid_out)
        halves.append((bw_compiler(gm, [bw_inputs[i] for i in keep]), keep))
    run = training_runner(fw, halves[0], meta, part.saved_sizes, new_value_backward=halves[1])
    return CompiledArtifacts(traced, part, run)


# Note [Saved activations in the forward's layout]: the forward graph's outputs after the user's
# are the activations saved for the backward; nothing else sees them, so a compiler may leave them
# in whatever layout it computed them in (channels-last around convolutions) instead of copying
# each into eager's strides. aotgrad lists their positions under this key of the forward graph's
# ``meta`` (kiln_loopir reads the same key: Note [Outputs only the backward reads]); a compiled
# forward that says the strides it gave each output (``output_strides``: one tuple or None per
# output) then gets a backward compiled for exactly those strides: its example inputs are
# restrided to match, so the backward reads the saved values where they lie, without a copy.
# A compiler that says nothing (``output_strides`` absent, an eager fallback) keeps eager's strides.
FREE_LAYOUT_OUTPUTS = "free_layout_outputs"


def _saved_as_the_forward_left_them(
    part: Partition, bw_inputs: list[Any], fw: Callable[..., Any], n_out: int
) -> list[Any]:
    strides = getattr(fw, "output_strides", None)
    if not isinstance(strides, list):
        return bw_inputs
    out = list(bw_inputs)
    placeholders = [n for n in part.bw.graph.nodes if n.op == "placeholder"]
    for i in range(len(part.saved)):
        got = strides[n_out + i] if n_out + i < len(strides) else None
        val = out[i]
        if got is None or not isinstance(val, torch.Tensor) or len(got) != val.dim():
            continue
        if any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
            continue
        shape = tuple(int(n) for n in val.shape)
        if all(a == b for a, b, n in zip(val.stride(), got, shape, strict=True) if n != 1):
            continue  # the same layout (a size-1 dim's stride is never read)
        if not (_dense(shape, tuple(val.stride())) and _dense(shape, got)):
            continue  # only a permutation of one dense block of memory is restrided
        out[i] = val.as_strided(val.shape, got, val.storage_offset())
        placeholders[i].meta["val"] = out[i]
        partition_log.info(
            "saved %s reaches the backward with the forward's strides %s (eager's %s)",
            part.saved[i],
            got,
            tuple(val.stride()),
        )
    return out


# Note [Backward inputs the forward laid out]: a backward graph's inputs are the saved values and
# the incoming gradients. A saved value that the compiled forward computed (not one of its inputs,
# not a user output, which the user could restride in place, not a size) reaches the backward as
# the forward returned it: ``save_for_backward`` keeps the tensor, and the training runner's one
# copy (a saved value sharing memory with a mutated input) keeps its strides (runtime.py). Its
# shape, strides and dtype are then those the forward reported (``output_strides``), for which
# the backward was compiled, so a compiler's input check need not read them on every backward
# call (ResNet-50: 267 of its backward's 304 inputs; a full check is four reads, the storage
# offset one). aotgrad lists those positions under this key of the backward GraphModule's
# ``meta`` (kiln_codegen_triton's wrapper reads the same key, Note [Inputs the forward laid out]
# there); only for a forward that reports its strides (a compiled graph, not an eager fallback),
# and only for static strides. ``KILN_LAID_OUT_INPUTS=0`` (read at compile time) turns it off.
LAID_OUT_INPUTS = "laid_out_inputs"


def _laid_out_by_the_forward(
    part: Partition, fw: Callable[..., Any], n_out: int, bw_inputs: Sequence[Any]
) -> tuple[int, ...]:
    """Positions of the backward's inputs that the compiled forward laid out (Note [Backward
    inputs the forward laid out]) in the strides the backward is compiled for (``bw_inputs``,
    its example inputs).

    Note [Only the strides the backward was compiled for are laid out]: the backward is compiled
    for the forward's strides only where ``_saved_as_the_forward_left_them`` restrides its example
    input, a permutation of one dense block; a saved value the forward leaves in other strides (a
    padded GEMM's result, a slice of its padded rows: (4, 1) for a (2, 3) value) keeps eager's in
    the backward, and must be checked in full on entry (copied into them). Listed, the GPU wrapper
    checked its offset alone and its kernels read the padded rows as dense ones: wrong gradients."""
    strides = getattr(fw, "output_strides", None)
    if not isinstance(strides, list) or os.environ.get("KILN_LAID_OUT_INPUTS", "1") == "0":
        return ()
    output = next(n for n in reversed(part.fw.graph.nodes) if n.op == "output")
    values = list(output.args[0])
    user = {id(v) for v in values[:n_out]}
    out = []
    for i in range(len(part.saved)):
        node = values[n_out + i] if n_out + i < len(values) else None
        if (
            i in part.saved_sizes
            or not isinstance(node, torch.fx.Node)
            or node.op == "placeholder"
            or id(node) in user
            or n_out + i >= len(strides)
            or strides[n_out + i] is None
            or not isinstance(node.meta.get("val"), torch.Tensor)
            or not _compiled_for(bw_inputs[i] if i < len(bw_inputs) else None, strides[n_out + i])
        ):
            continue
        out.append(i)
    return tuple(out)


def _compiled_for(example: Any, strides: Sequence[int]) -> bool:
    """Whether the backward's example input ``example`` has the static ``strides`` (a size-1 dim's
    aside): Note [Only the strides the backward was compiled for are laid out]."""
    if not isinstance(example, torch.Tensor) or example.dim() != len(strides):
        return False
    if any(isinstance(st, torch.SymInt) for st in example.stride()):
        return False
    return all(
        int(a) == int(b)
        for a, b, n in zip(example.stride(), strides, example.shape, strict=True)
        if isinstance(n, torch.SymInt) or n != 1
    )


def _dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether these strides lay ``shape`` over exactly its elements, no gap and no overlap."""
    expected = 1
    for n, st in sorted(((n, st) for n, st in zip(shape, stride, strict=True) if n != 1), key=lambda p: p[1]):
        if st != expected:
            return False
        expected *= n
    return True


def _viewed_offsets(art: CompiledArtifacts, args: Sequence[torch.Tensor]) -> list[tuple[int, int]]:
    """(input, storage offset) of every input an output is rebuilt as a view of."""
    viewed = sorted({o.index for o in art.traced.meta.outputs if o.kind == "input_view"})
    return [(i, int(args[i].storage_offset())) for i in viewed]


# Note [A symbolic graph called in another grad mode]: the artifacts `compile_symbolic` made
# serve every call the frame's guards let through, but only in the grad mode they were traced in
# (Note [Guarded callers]); a call in another mode took the signature path, and that path made its
# first compile the unchecked fast path (`_only`). A frame's runner may call its graph in another
# grad mode than the frame's: kiln_dynamo runs a graph traced whole inside a
# `torch.inference_mode()` block under the mode (`call_in_mode`), grad off, in a frame entered
# with grad on. So `with torch.inference_mode(): return x * 2` under automatic dynamic compiled a
# symbolic graph at the second size, was called with grad off, compiled that one size by its
# signature, and from then on ran the one-size artifacts for every size the symbolic guards
# passed (an input of 7 rows answered 6). Two rules: a signature compile of a symbolic frame never
# becomes the fast path (the signature lookup checks its sizes at each call), and an inference
# graph none of whose inputs requires grad serves both grad modes (no autograd history either
# way; compile_flat compiles it with grad off in both), so the symbolic artifacts serve the
# inference-mode calls without a compile per size.
def _signature(leaves: Sequence[Any]) -> tuple[Any, ...]:
    key: list[Any] = [torch.is_grad_enabled(), torch.get_default_dtype(), _autocast_key()]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            key.append(
                (
                    "T",
                    tuple(x.shape),
                    tuple(x.stride()),
                    x.dtype,
                    x.device,
                    x.requires_grad,
                    x.storage_offset(),
                )
            )
        else:
            try:
                hash(x)
                key.append(("C", type(x), x))
            except TypeError:
                key.append(("C", type(x), id(x)))
    return tuple(key)


# Note [Global state in the signature]: a trace bakes in the default dtype (`torch.ones(2)`,
# `x.sum() * 1.5` of an int tensor) and the autocast region it ran in (the casts are graph
# nodes, and the compiled graph runs outside autocast: Note [Compiled graphs run outside
# autocast] in runtime.py). A caller without guards (`aot_function(f)` called in and out of an
# autocast region, or after `torch.set_default_dtype`) got the first trace's dtypes: float32
# where eager computed bfloat16 or float64. Both are part of the signature; behind kiln_dynamo
# its guards already tell these states apart.
def _autocast_key() -> tuple[Any, ...] | None:
    if not torch._C._is_any_autocast_enabled():
        return None
    return tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda"))


_USE_COUNT: Callable[[int], int] = torch._C._storage_Use_Count


# Note [Mutated inputs that share memory]: a graph is traced with every input its own root
# (functionalize.py), so a write into one input is invisible to another that shares its memory;
# `f(buf[:4], buf[2:])` with `a.add_(1); b.mul_(2)` returned 4 where eager returns 6, and wrote
# the buffer wrong. torch.compile traces such inputs as views of one synthetic base. kiln does not
# build that: a call whose mutated input shares a storage with another input runs the captured
# program eagerly (logged under KILN_LOG=fallbacks), every such call, compiled or not; others run
# compiled. The check costs a pass over the inputs only for graphs that mutate an input, and the
# storage comparison only when one tensor is passed twice or some mutated input's storage has
# another owner than that input (its storage's use count above the one input plus the temporary
# storage object asking): a view, but also `x.detach()` or `x.data`, which are no views
# (`_is_view()` is False) yet share the storage. A continuation after a graph break on
# `t = x.data` receives `x` and `t` as two inputs of that kind (test_alias_fuzz.py seed 563: `t`
# read stale values after `x.fill_()`); checking `_is_view` alone missed it. A count above two
# only means the storage comparison runs (a saved tensor of autograd, a view held outside the
# call); the comparison itself is exact up to `data_ptr` of the storage.
#
# A mutated input whose own elements overlap (an `expand`ed tensor: a stride 0 over a size above
# 1) is run eagerly too: eager writes it through a view without overlap (`x[1] *= 2` writes one
# row of the expanded rows' shared memory), while the write-back copies the whole functional value
# into it, which `copy_` refuses ("more than one element of the written-to tensor refers to a
# single memory location"), after earlier write-backs had run: the run-time fallback then ran the
# program a second time over inputs already written (found by test_alias_fuzz.py).
#
# So is one whose elements overlap partially (`b.as_strided((4, 6), (1, 1))`, `b.unfold(0, 4, 2)`):
# eager refuses no such write (its check sees only strides of 0) and writes the shared positions
# once per element over them, in turn (`x.add_(1)` adds 3 where three elements meet), while the
# compiled graph computes each element's new value once from the old ones (a wrong answer, found
# by probing the call with inputs of every layout). The tracer's test (Note [Writes into a view
# that overlaps itself]) decides, after `is_contiguous`, the cheap common answer.
def _shares_memory(inputs: Sequence[Any], mutated: Sequence[int]) -> bool:
    for i in mutated:
        t = inputs[i]
        if not t.is_contiguous() and _overlaps_itself(t):
            return True
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    # on every call of such a graph (ResNet's BatchNorm layers: 321 inputs a training step): one
    # use count a mutated input, and ids mapped in C
    if all(_USE_COUNT(inputs[i].untyped_storage()._cdata) <= 2 for i in mutated) and len(
        set(map(id, tensors))
    ) == len(tensors):
        return False
    count: dict[int, int] = {}
    for t in tensors:
        p = t.untyped_storage().data_ptr()
        count[p] = count.get(p, 0) + 1
    return any(count[inputs[i].untyped_storage().data_ptr()] > 1 for i in mutated)


class AotFunction:
    """The callable `aot_function` returns; `.compiled` maps signatures to their artifacts."""

    def __init__(
        self,
        fn: Callable[..., Any],
        opts: AotOptions,
        module: torch.nn.Module | None = None,
        *,
        guarded: bool = False,
    ) -> None:
        self.fn = fn
        self.opts = opts
        self.module = module
        self.compiled: dict[tuple[Any, ...], CompiledArtifacts] = {}
        # Note [Guarded callers]: (artifacts, grad mode (None: either), [(input index, storage
        # offset)]) ...
        self.guarded = guarded
        # ... and whether the graph writes an input (Note [Mutated inputs that share memory])
        self._only: tuple[CompiledArtifacts, bool | None, list[tuple[int, int]], bool] | None = None
        self._symbolic = False  # compiled by `compile_symbolic` (Note [Symbolic signatures])
        self._warned_shared = False
        # Note [The call fast path]: a module with nothing but its own forward code.
        self._stateless = module is None or (
            isinstance(module, torch.fx.GraphModule)
            and next(iter(module.children()), None) is None
            and next(iter(module.parameters()), None) is None
            and next(iter(module.buffers()), None) is None
        )

    def compile_symbolic(self, fakes: list[Any]) -> CompiledArtifacts:
        """Note [Symbolic signatures]: compile now, from the captured graph's placeholders
        (fake tensors with SymInt sizes, SymInt ints), while the capture's ShapeEnv still
        records guards; the artifacts then serve every call the frame's guards let through,
        whatever its sizes. Only for a stateless GraphModule called with positional tensors
        and ints (what kiln_dynamo hands a backend). A call in another grad mode, or whose
        viewed inputs moved, takes the signature path and compiles for its own sizes."""
        if not self._stateless or not self.guarded:
            raise ValueError("compile_symbolic needs a guarded, stateless GraphModule")

        def flat_fn(tracer: Tracer, traced: list[Any]) -> Any:
            assert isinstance(self.module, torch.fx.GraphModule)
            return OriginInterpreter(self.module, tracer).run(*traced)

        # Note [Unbacked sizes in capture]: data-dependent operators traced again get symbols
        # of the capture's env (no other fake trace would answer them)
        assert isinstance(self.module, torch.fx.GraphModule)
        with unbacked_sizes(graph_unbacked_env(self.module)):
            art = compile_flat(flat_fn, list(fakes), self.opts)
        # an output viewing an input rebuilds its layout from the inputs at each call, offset
        # included (Note [Symbolic views among the outputs]): no storage offset to check
        grad: bool | None = torch.is_grad_enabled()
        if art.partition is None and not any(getattr(f, "requires_grad", False) for f in fakes):
            grad = None  # Note [A symbolic graph called in another grad mode]
        self._symbolic = True
        self._only = (art, grad, [], bool(art.traced.meta.mutated_inputs))
        return art

    def _state(self) -> tuple[list[str], list[torch.Tensor]]:
        if self.module is None:
            return [], []
        names: list[str] = []
        values: list[torch.Tensor] = []
        for n, p in self.module.named_parameters(remove_duplicate=False):
            names.append(n)
            values.append(p)
        for n, b in self.module.named_buffers(remove_duplicate=False):
            names.append(n)
            values.append(b)
        return names, values

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        only = self._only
        if (
            only is not None
            and (only[1] is None or torch.is_grad_enabled() is only[1])
            and not kwargs
            and (not only[2] or all(args[i].storage_offset() == off for i, off in only[2]))
        ):
            if only[3]:  # Note [Mutated inputs that share memory]
                return self._run(only[0], args, args, kwargs)
            return only[0].runner(*args)  # Note [Guarded callers]
        if self._stateless and not kwargs and all(isinstance(a, torch.Tensor) for a in args):
            key = _signature(args)  # Note [The call fast path]
            art = self.compiled.get(key)
            if art is None:
                leaves, spec = tree_flatten((args, kwargs))
                art = self._compile(leaves, spec, list(range(len(args))), [], list(args))
                self.compiled[key] = art
                # Note [A symbolic graph called in another grad mode]: never the artifacts of
                # one size where the frame's guards let every size through
                if self.guarded and len(self.compiled) == 1 and not self._symbolic:
                    mutates = bool(art.traced.meta.mutated_inputs)
                    self._only = (art, torch.is_grad_enabled(), _viewed_offsets(art, args), mutates)
            return self._run(art, args, args, kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        state_names, state = self._state()
        tensor_pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        flat_inputs = [*state, *[leaves[i] for i in tensor_pos]]
        key = _signature([*state, *leaves])
        if self.module is not None:
            key = (*key, tuple(m.training for m in self.module.modules()))
        art = self.compiled.get(key)
        if art is None:
            art = self._compile(leaves, spec, tensor_pos, state_names, flat_inputs)
            self.compiled[key] = art
        return self._run(art, flat_inputs, args, kwargs)

    def _run(self, art: CompiledArtifacts, flat: Sequence[Any], args: Any, kwargs: Any) -> Any:
        mutated = art.traced.meta.mutated_inputs
        if mutated and _shares_memory(flat, mutated):  # Note [Mutated inputs that share memory]
            if not self._warned_shared:
                self._warned_shared = True
                fallbacks_log.warning(
                    "kiln_aotgrad: an input the graph writes in place shares memory with another "
                    "input or overlaps itself; running the program eagerly for such calls (inputs %s)",
                    ", ".join(str(i) for i in mutated),
                )
            target = self.module if self.module is not None else self.fn
            try:
                return target(*args, **kwargs)
            except Exception as exc:
                # eager's own error, after some of the program's in-place writes ran: not to be
                # run again (Note [Failures after the write-back] in runtime.py)
                exc.kiln_inputs_written = True  # type: ignore[attr-defined]
                raise
        return art.runner(*flat)

    def _compile(
        self,
        leaves: list[Any],
        spec: Any,
        tensor_pos: list[int],
        state_names: list[str],
        flat_inputs: list[torch.Tensor],
    ) -> CompiledArtifacts:
        n_state = len(state_names)

        def flat_fn(tracer: Tracer, fakes: list[torch.Tensor]) -> Any:
            new_leaves = list(leaves)
            for pos, f in zip(tensor_pos, fakes[n_state:], strict=True):
                new_leaves[pos] = f
            args, kwargs = tree_unflatten(new_leaves, spec)
            with _swap_state(self.module, state_names, fakes[:n_state]):
                target = self.module if self.module is not None else self.fn
                if isinstance(target, torch.fx.GraphModule):
                    return OriginInterpreter(target, tracer).run(*args, **kwargs)
                return target(*args, **kwargs)

        return compile_flat(flat_fn, flat_inputs, self.opts)


@contextlib.contextmanager
def _swap_state(
    module: torch.nn.Module | None, names: list[str], values: list[torch.Tensor]
) -> Iterator[None]:
    """Temporarily replace the module's parameters and buffers (by qualified name) with `values`."""
    if module is None:
        yield
        return
    saved: list[tuple[dict[str, Any], str, Any]] = []
    try:
        for name, v in zip(names, values, strict=True):
            owner_name, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            store: dict[str, Any] = owner._parameters if attr in owner._parameters else owner._buffers
            saved.append((store, attr, store[attr]))
            store[attr] = v
        yield
    finally:
        for store, attr, old in reversed(saved):
            store[attr] = old


def aot_function(
    fn: Callable[..., Any],
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    *,
    inference_compiler: Compiler | None = None,
    decompositions: DecompTable | None = None,
    partition: str = "min_cut",
    fusion_aware_saves: bool = True,
    materialized_saves: bool = True,
    recompute_sources: bool = True,
) -> AotFunction:
    """Compile `fn` ahead of time through aten graphs; `decompositions` extend kiln's table;
    `fusion_aware_saves`: Note [What saving a value costs] in partition.py; `materialized_saves`:
    Note [Values the backward would write] there; `recompute_sources`: Note [Recomputing from many
    values] there."""
    opts = AotOptions(
        fw_compiler,
        bw_compiler,
        inference_compiler,
        decompositions,
        partition,
        fusion_aware_saves=fusion_aware_saves,
        materialized_saves=materialized_saves,
        recompute_sources=recompute_sources,
    )
    return AotFunction(fn, opts)


def aot_module(
    module: torch.nn.Module,
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    *,
    inference_compiler: Compiler | None = None,
    decompositions: DecompTable | None = None,
    partition: str = "min_cut",
    guarded: bool = False,
    fusion_aware_saves: bool = True,
    materialized_saves: bool = True,
    recompute_sources: bool = True,
) -> AotFunction:
    """Like `aot_function` for `module(*args)`, with its parameters and buffers as graph inputs;
    `guarded`: every call passes guards on its tensors' metadata (Note [Guarded callers])."""
    opts = AotOptions(
        fw_compiler,
        bw_compiler,
        inference_compiler,
        decompositions,
        partition,
        fusion_aware_saves=fusion_aware_saves,
        materialized_saves=materialized_saves,
        recompute_sources=recompute_sources,
    )
    return AotFunction(module.forward, opts, module, guarded=guarded)
