"""Splitting the joint graph into a forward and a backward graph.

The joint graph is `(primals..., tangents...) -> (forward outputs..., grads...)`. A node that
depends on a tangent can only run in the backward; every other node *could* run in the forward.
The question is which forward values cross over: the forward returns `outputs + saved`, the
backward takes `saved + tangents`, and any other forward value the backward needs is recomputed
there from the saved ones.

- `default`: every non-tangent node runs in the forward; saved = the forward nodes that a
  tangent-dependent node reads.
- `min_cut`: a minimum s-t cut in a flow graph (networkx), after the anchor's min-cut
  rematerialization (ANCHORS §1.3). Each candidate forward node `n` becomes an edge
  `n_in -> n_out` whose capacity is the bytes of its value (saving it costs that much);
  `n_out -> user_in` edges are infinite; primals, and nodes that must not be recomputed, hang off
  the source with infinite edges; nodes the backward needs (tangent-dependent) feed the sink.
  The cut edges are the values to save; everything between the cut and the backward is
  recomputed. Recomputable: pointwise operators, views, and cheap data movement (`clone`,
  `_to_copy`, `expand`, factories, `where`...), and reductions whose output is at most 4x
  smaller than their input. Never recomputed: matmul, convolution, softmax, embedding and
  gathers, larger reductions, and random operators (`nondeterministic_seeded`; see
  Note [RNG in compiled graphs] in decompositions.py). A weight is the value's bytes, twice
  that for a value the forward would otherwise fuse away (Note [What saving a value costs]), so
  a cut can still be checked by hand.

`Partition` carries both graphs and what was saved; `saved_bytes` is what the benchmark reports.

Note [What saving a value costs]: saving a value costs the backward one read of it and keeps its
bytes alive until the backward runs. A value the forward writes anyway (a graph input, a forward
output, the result of an op no fused kernel computes: a matmul, a convolution, an attention, a
reduction's few values, and anything such an op reads) costs nothing more in the forward; one the
forward's kernels would keep in registers (a pointwise or view chain read only by fusible ops)
must now also be written there: a full pass over its bytes in a kernel that otherwise writes
less. With bytes alone the cut cannot tell them apart, and a tie goes either way: LayerNorm's
backward reads `xhat = (x - mean) * rstd`, and saving xhat (N bytes) beat saving x, mean and rstd
(N + 2 rows of floats) by 2 KB, so the forward wrote xhat besides y (at 256 x 768, a 786 KB
write) and the backward read it where it could read x. So a fused-away value weighs twice its
bytes (its write and its read), a materialized one its bytes (as torch's min-cut partitioner
weighs them); LayerNorm, RMSNorm and the like then save their row statistics and the backward's
kernels recompute the normalized value from x, which they read anyway.
What is materialized is decided here from op kinds alone (aotgrad knows nothing of loopir's
scheduler): fusible are pointwise ops, views, the cheap data movement of `_RECOMPUTABLE_NAMES`
and reductions (as readers); a reduction's own output counts as written. Where the guess is
wrong the value weighs its bytes, the old weight, never less.
Twice the bytes can move the cut towards saving more bytes: training memory is a real cost.
So the bytes-only cut is computed too, and the fusion-aware one is taken only when it saves at
most `_MEMORY_SLACK` more bytes than that (LayerNorm: 0.13%); otherwise the bytes-only cut
stands (both figures in `KILN_LOG=partition`). `AotOptions.fusion_aware_saves` (kiln.compile's
`fusion_aware_saves` option) switches it off.

Note [Recomputing from many values]: the cut's weights price a saved value by one read in the
backward, as if recomputing a value from saved ones cost their reads once. But each backward
kernel that reads a recomputed value loads every saved value it is computed from: a residual
stream `h_k = h_(k-1) + x_k` (`x_k` an attention's or MLP's projection, written by its matmul),
recomputed for each norm's backward from the embedding and every projection before it, costs
the k-th norm's backward k + 1 loads of a [tokens, hidden] tensor in each of its kernels (the row
pass and the weight gradient's column sums), where the saved `h_k` costs one, and one write in
the forward. The fusion-aware weights made that cut: each `h_k` fused away (twice its bytes)
against the projections the forward writes anyway (their bytes), the same bytes saved, and
LLaMA's backward recomputed the residual sums from 2 to 5 tensors per norm, one fused column
reduction of four norms' weight gradients reading 15 of them (the public suite's `llama`, CPU,
one thread, its saved bytes equal either way). With the rule and loopir's Note [Outputs read
back], the generated kernels' fastest calls a step (`codegen_cpp/bench/kernel_time.py
--ab-options recompute_sources=false,outputs_read_back=false`, interleaved, a loaded machine):
LLaMA 3.34 -> 2.79 ms, Qwen2 3.67 -> 3.17, GPT-2 3.87 -> 3.44, T5 10.32 -> 9.83, ViT 1.37 -> 1.15.
So, in the fusion-aware cut, a recomputable value computed from more than one written value whose
recomputation reads more than twice its bytes (`_READ_FACTOR`: its write and its read, against
the reads of one backward kernel that recomputes it) is not recomputed: it hangs off the source,
so the cut saves it or a value after it. Counted are the written values it is computed from
through recomputable ops (`_recompute_sources`), each at its bytes, where it has at least half
as many elements as the value: row statistics, per-channel weights and broadcast biases are small
beside it and read from cache. A view reads its base's sources, and a view that narrows its base
(a slice, a `select`) is a source of its own bytes. So `h_2 = emb + x_0 + x_1` (three sources)
is saved and `h_1 = emb + x_0` (two) stays recomputed; LayerNorm's normalized rows,
`(x - mean) * rstd`, read x alone (its statistics are small); a comparison or a cast of one value
(ReLU's `x <= 0`, a bool of 4-byte floats) is not a sum of values: saving T5's four ReLU masks
instead of recomputing them had the backward's `where` run as kernels of their own (+3.5 ms of
generated kernels a step). The cut may save more bytes; the memory check above bounds that.
Option `recompute_sources` (kiln.compile's, `AotOptions.recompute_sources`) switches it off.

Note [Values the backward would write]: recomputing a value is cheap only where the backward's
kernels read it through fusion, from values they load anyway. A value that a backward op no kernel
fuses (a convolution's or a matmul's backward, an attention's) reads must be in memory there: its
recomputation is a kernel of its own that reads the saved inputs and writes it, a full pass over
its bytes, where saving it costs nothing more in the forward when the forward writes it anyway
(the same operator reads it there: BatchNorm -> ReLU -> convolution). With bytes alone the cut
saved BatchNorm's input and statistics and recomputed `relu(bn(x))` in the backward for the
convolution's weight gradient: in ResNet-50's bfloat16 training on an H100 those recomputing
kernels took ~0.5 ms of 5.1 ms of generated kernels a step (twenty-sixth session,
`scripts/gpu_kernel_table.py`), where torch.compile's step, whose partitioner refuses such a
recomputation (its `ban_recompute_materialized_backward`), had none. So a value that a
tangent-dependent non-fusible op reads (directly or through views) is not recomputed: it hangs off
the source, as a matmul does, and the cut saves it or a value after it. Views stay recomputable
(their base is what is written), and so do fills (`full`, `zeros_like`, `arange`...: an
embedding gradient's zero table, a mask's constant): the backward writes them as cheaply as the
forward did, and saving them held their bytes (RoBERTa's training graph saved three such tables). More bytes are saved (ResNet-50: each such ReLU output besides
its BatchNorm input). A reader that takes the value for its shape alone does not count (a pooling
backward's `self`, `_METADATA_ARGS`: its kernel reads the gradient and the saved indices): on the
H100 the rule had the CNN's forward write its ReLU outputs before each max-pool, only for the
pool's backward to take their shapes, and its bfloat16 training step took 3.66 ms of GPU time
against 3.48 with the rule off, while ResNet-50's dropped 8.22 -> 7.69 ms, ConvNeXt's 9.89 ->
9.39, ViT's 5.51 -> 5.34 (twenty-seventh session, `call26s`). `AotOptions.materialized_saves` (kiln.compile's `materialized_saves` option)
switches it off.

Note [Saved sizes]: with symbolic sizes the backward reads sizes the forward computed
(`sym_size(x, 0)` to expand a tangent, `2 * s0` as a mean's divisor). A SymInt node is a
candidate like a tensor, at 8 bytes (an int64): without a capacity its edge was infinite, and
a size the backward needs but cannot recompute (`sym_size` of a primal that is not saved) left
no finite cut ("Infinite capacity path"). A saved size is an int at run time; the training
runner keeps it beside `save_for_backward`, which takes tensors only (`saved_sizes`). Python
arithmetic on sizes (`operator.add` of SymInts, a float of sizes such as var's `2.0 / (n - 1)`:
Note [Floats of sizes remember their operation] in kiln_symbolic) is recomputable; a float is
never saved (its edge stays infinite), the ints it is computed from are.

Note [Symbols the backward binds]: the backward's code generator reads every size symbol from
its own inputs: a saved SymInt that is a plain symbol, or a plain-symbol size or stride of a
saved tensor or a tangent (kiln_loopir's Note [Symbolic sizes in the wrapper]). A cut chooses
values, not symbols: `cat([x, y], 1)`'s backward slices the tangent of size `s1 + s2` at `s1`
and saves `s1` and `s1 + s2`, so `s2` alone reaches it nowhere and the backward was refused
("no input holds size symbols [s2]"), the frame compiled static per size. After the cut, every
symbol a backward value mentions that its inputs do not bind is saved too: the forward node
that is that symbol (`sym_size(y, 1)`), or a new `sym_size`/`sym_stride` of the primal whose
size or stride it is (`_bind_backward_symbols`). One int64 each; data-dependent symbols are
left to loopir (an extern's result binds them).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
import torch.fx
from kiln_symbolic import expr_of, hint_of, is_symbolic

from kiln_aotgrad.tracer import ancestors, effectful
from kiln_dynamo import graph_module

aten = torch.ops.aten

# backward ops that read an argument for its sizes and strides alone: the pooling backwards' `self`
# (eager's CPU and CUDA kernels and kiln's gather read the gradient and the saved indices, and take
# the input's shape and memory format; Note [Values the backward would write])
_METADATA_ARGS: dict[str, frozenset[int]] = {
    "aten::max_pool2d_with_indices_backward": frozenset({1}),
    "aten::max_pool3d_with_indices_backward": frozenset({1}),
    "aten::avg_pool2d_backward": frozenset({1}),
    "aten::avg_pool3d_backward": frozenset({1}),
    "aten::_adaptive_avg_pool2d_backward": frozenset({1}),
    "aten::_adaptive_avg_pool3d_backward": frozenset({1}),
}

# ops that make a tensor from sizes and a value alone (Note [Values the backward would write])
_FACTORIES = frozenset(
    {
        "aten::full",
        "aten::full_like",
        "aten::zeros",
        "aten::zeros_like",
        "aten::ones",
        "aten::ones_like",
        "aten::empty",
        "aten::empty_like",
        "aten::scalar_tensor",
        "aten::arange",
    }
)
_RECOMPUTABLE_NAMES = _FACTORIES | frozenset(
    {
        "aten::clone",
        "aten::_to_copy",
        "aten::expand",
        "aten::where",
        "aten::copy",
        "aten::cat",
        "aten::constant_pad_nd",
        "aten::squeeze",
        "aten::unsqueeze",
        "aten::slice_scatter",
        "aten::select_scatter",
    }
)
_REDUCTIONS = frozenset(
    {
        "aten::sum",
        "aten::mean",
        "aten::amax",
        "aten::amin",
        "aten::var",
        "aten::prod",
        "aten::any",
        "aten::all",
    }
)


@dataclass(slots=True)
class Partition:
    fw: torch.fx.GraphModule  # primals -> (forward outputs..., saved...)
    bw: torch.fx.GraphModule  # (saved..., tangents...) -> grads
    saved: list[str]  # joint-graph node names saved for the backward
    saved_bytes: int
    recomputed: list[str]  # forward nodes that the backward recomputes
    activation_bytes: int  # saved bytes that are not inputs or views of inputs (extra memory)
    saved_sizes: tuple[int, ...] = ()  # positions in `saved` of SymInts (Note [Saved sizes])
    # bytes of saved values the forward would not write otherwise (Note [What saving a value costs])
    forward_writes: int = 0
    # what the cost model decided, for KILN_LOG=partition ("" with bytes-only weights)
    cost_note: str = ""


def nbytes(val: Any) -> int:
    """Bytes of a tensor; of a symbolic one at its size hint (a weight, never a guard), or
    for a data-dependent size the ShapeEnv's optimization hint (Note [Unbacked sizes])."""
    if isinstance(val, torch.Tensor):
        numel: Any = val.numel()
        hint = hint_of(numel)
        if hint is None:
            hint = numel.node.optimization_hint()
        return int(hint) * val.element_size()
    if isinstance(val, torch.SymInt):
        return 8  # a saved size: one int64
    return 0


def _name(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    return str(schema.name) if schema is not None else ""


def recomputable(node: torch.fx.Node) -> bool:
    """May the backward recompute `node` instead of loading it?"""
    if node.op == "placeholder":
        return False
    if node.op == "get_attr":
        return True
    if node.op != "call_function":
        return False
    t = node.target
    if t is operator.getitem:
        return recomputable(node.args[0])  # type: ignore[arg-type]
    if isinstance(node.meta.get("val"), torch.SymInt | torch.SymFloat) and not isinstance(
        t, torch._ops.OpOverload
    ):
        return True  # Note [Saved sizes]: arithmetic on sizes, recomputed from the saved ints
    if not isinstance(t, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in t.tags:
        return False
    if not node.all_input_nodes:
        return True  # a factory of constants: free to make again
    name = _name(t)
    if name in _REDUCTIONS:
        inp = node.args[0]
        if isinstance(inp, torch.fx.Node):
            return nbytes(inp.meta.get("val")) <= 4 * max(nbytes(node.meta.get("val")), 1)
        return True
    return _cheap(t)


def _cheap(t: torch._ops.OpOverload) -> bool:
    """A pointwise op, a view or cheap data movement: recomputable, and fused by its readers."""
    return bool(torch.Tag.pointwise in t.tags or t.is_view or _name(t) in _RECOMPUTABLE_NAMES)


def _split(joint: torch.fx.GraphModule, num_fw_outputs: int) -> tuple[Any, ...]:
    nodes = list(joint.graph.nodes)
    out_node = nodes[-1]
    outs = list(out_node.args[0])
    fw_outs = outs[:num_fw_outputs]
    bw_outs = outs[num_fw_outputs:]
    primals = [n for n in nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    tangents = [n for n in nodes if n.op == "placeholder" and n.name.startswith("tangents")]
    tangent_dep: set[torch.fx.Node] = set(tangents)
    for n in nodes:
        if n.op == "output":
            continue
        if any(i in tangent_dep for i in n.all_input_nodes):
            tangent_dep.add(n)
    return nodes, fw_outs, bw_outs, primals, tangents, tangent_dep


def _saved_default(
    nodes: list[torch.fx.Node], tangent_dep: set[torch.fx.Node], bw_need: set[Any], bw_outs: set[Any]
) -> list[Any]:
    saved = []
    for n in nodes:
        if n.op == "output" or n in tangent_dep or n.op == "get_attr":
            continue
        if n in bw_outs or any(u in tangent_dep and u in bw_need for u in n.users):
            saved.append(n)
    return saved


# Note [What saving a value costs]: how many more bytes than the bytes-only cut a fusion-aware
# cut may save (a fraction of the bytes-only cut's saved bytes)
_MEMORY_SLACK = 1 / 32


def _fusible_reader(node: torch.fx.Node) -> bool:
    """Can `node` read its tensor inputs inside a fused kernel (so they need not be written)?"""
    if node.op != "call_function":
        return node.op == "output"  # the forward's outputs are handled apart
    t = node.target
    if t is operator.getitem:
        return _fusible_reader(node.args[0])  # type: ignore[arg-type]
    if not isinstance(t, torch._ops.OpOverload):
        return True  # arithmetic on sizes; reads no tensor data
    if t in (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default):
        return True
    return _cheap(t) or _name(t) in _REDUCTIONS


def _writes_its_output(node: torch.fx.Node) -> bool:
    """Does the forward write `node`'s value whatever is saved (an extern op, a reduction)?"""
    if node.op != "call_function":
        return node.op == "placeholder"
    t = node.target
    if t is operator.getitem:
        return _writes_its_output(node.args[0])  # type: ignore[arg-type]
    if not isinstance(t, torch._ops.OpOverload):
        return False
    return _name(t) in _REDUCTIONS or not _cheap(t)


def _forward_materialized(
    nodes: list[torch.fx.Node], tangent_dep: set[torch.fx.Node], fw_outs: list[Any]
) -> set[torch.fx.Node]:
    """The forward values the forward writes to memory whatever the cut saves (Note [What saving
    a value costs]); a view is materialized with its base, a base with a view of it."""
    out: set[torch.fx.Node] = {o for o in fw_outs if isinstance(o, torch.fx.Node)}
    for n in nodes:
        if n in tangent_dep or n.op == "output":
            continue
        if _writes_its_output(n):
            out.add(n)
        if any(u not in tangent_dep and not _fusible_reader(u) for u in n.users):
            out.add(n)
    views = [
        n
        for n in nodes
        if n.op == "call_function" and getattr(n.target, "is_view", False) and n not in tangent_dep
    ]
    changed = True
    while changed:
        changed = False
        for v in views:
            base = v.args[0]
            if not isinstance(base, torch.fx.Node):
                continue
            if (v in out) != (base in out):
                out |= {v, base}
                changed = True
    return out


def _written_in_backward(node: torch.fx.Node, tangent_dep: set[torch.fx.Node]) -> bool:
    """Would the backward have to write `node` to memory if it recomputed it (Note [Values the
    backward would write])? True when a tangent-dependent reader no fused kernel can read it
    through reads it, directly or through views of it."""
    if node.op != "call_function" or getattr(node.target, "is_view", False):
        return False
    if not node.all_input_nodes or _name(node.target) in _FACTORIES:
        return False  # a fill: the backward writes it as cheaply as the forward did
    todo, seen = [node], {node}
    while todo:
        cur = todo.pop()
        for u in cur.users:
            if u in tangent_dep and not _fusible_reader(u) and not _reads_only_metadata(u, cur):
                return True
            if u not in seen and u.op == "call_function" and getattr(u.target, "is_view", False):
                seen.add(u)
                todo.append(u)
    return False


def _reads_only_metadata(user: torch.fx.Node, value: torch.fx.Node) -> bool:
    """Does `user` take `value` only in argument positions whose data it never reads (Note
    [Values the backward would write]: a pooling backward's `self`)?"""
    target = user.target
    positions = _METADATA_ARGS.get(_name(target)) if isinstance(target, torch._ops.OpOverload) else None
    if positions is None or value in user.kwargs.values():
        return False
    found = [i for i, a in enumerate(user.args) if a is value]
    return bool(found) and all(i in positions for i in found)


def _save_weight(node: torch.fx.Node, materialized: set[torch.fx.Node] | None) -> float:
    """The capacity of `node`'s edge: its bytes, twice them if the forward would fuse it away."""
    val = node.meta.get("val")
    size = float(nbytes(val))
    if materialized is None or node in materialized or not isinstance(val, torch.Tensor):
        return size
    return 2 * size


# Note [Recomputing from many values]: a value computed from several values is not recomputed where
# that reads more than this many times its bytes (its write and its read, against the reads of
# one backward kernel that recomputes it)
_READ_FACTOR = 2


def _numel(val: Any) -> int:
    return nbytes(val) // max(val.element_size(), 1) if isinstance(val, torch.Tensor) else 0


def _recompute_sources(
    nodes: list[torch.fx.Node], tangent_dep: set[torch.fx.Node], forced: frozenset[torch.fx.Node]
) -> frozenset[torch.fx.Node]:
    """The forward values too costly to recompute (Note [Recomputing from many values]): those
    computed from more than one written value of their size, whose recomputation reads more than
    `_READ_FACTOR` times their bytes. `forced`: values the cut never recomputes anyway."""
    sources: dict[torch.fx.Node, dict[torch.fx.Node, int]] = {}
    banned: set[torch.fx.Node] = set()
    for n in nodes:
        if n in tangent_dep or n.op in ("output", "get_attr"):
            continue
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            sources[n] = {}  # sizes, tuples: a getitem of a written tuple is its own source
            continue
        if n.op == "placeholder" or not recomputable(n) or n in forced:
            sources[n] = {n: nbytes(val)}
            continue
        if getattr(n.target, "is_view", False):
            base = n.args[0]
            if isinstance(base, torch.fx.Node) and _numel(val) >= _numel(base.meta.get("val")):
                sources[n] = sources.get(base, {})  # the whole base seen again (reshape, expand)
            else:
                sources[n] = {n: nbytes(val)}  # a part of its base (slice, select)
            continue
        merged: dict[torch.fx.Node, int] = {}
        for i in n.all_input_nodes:
            merged.update(sources.get(i, {}))
        numel = _numel(val)
        full = [b for s, b in merged.items() if 2 * _numel(s.meta.get("val")) >= numel]
        if len(full) > 1 and sum(full) > _READ_FACTOR * nbytes(val):
            banned.add(n)
            sources[n] = {n: nbytes(val)}
        else:
            sources[n] = merged
    return frozenset(banned)


def _saved_min_cut(
    nodes: list[torch.fx.Node],
    tangent_dep: set[torch.fx.Node],
    bw_need: set[Any],
    bw_outs: set[Any],
    materialized: set[torch.fx.Node] | None = None,
    written: frozenset[torch.fx.Node] = frozenset(),
) -> list[Any]:
    bw_nodes = {n for n in bw_need if n in tangent_dep}
    # A gradient that depends on no tangent (zeros, say) is still needed by the backward.
    fw_grads = {n for n in bw_outs if n not in tangent_dep}
    # Candidates: forward nodes the backward may need (directly or through recompute).
    cand = {n for n in ancestors([*bw_nodes, *fw_grads]) if n not in tangent_dep and n.op != "output"}
    g = nx.DiGraph()
    for n in cand:
        if n.op == "get_attr":
            continue  # constants are available to both graphs for free
        val = n.meta.get("val")
        if isinstance(val, (torch.Tensor, torch.SymInt)):  # Note [Saved sizes]
            g.add_edge(f"{n.name}_in", f"{n.name}_out", capacity=_save_weight(n, materialized))
        else:
            g.add_edge(f"{n.name}_in", f"{n.name}_out")  # a tuple cannot be saved: infinite
        # Note [Values the backward would write]: `written` are not recomputed either
        if n.op == "placeholder" or not recomputable(n) or n in written:
            g.add_edge("source", f"{n.name}_in")
        if n in fw_grads:
            g.add_edge(f"{n.name}_out", "sink")
        for u in n.users:
            if u in bw_nodes:
                g.add_edge(f"{n.name}_out", "sink")
            elif u in cand and u.op != "get_attr":
                g.add_edge(f"{n.name}_out", f"{u.name}_in")
    if "sink" not in g or "source" not in g:
        return []
    _, (reachable, _) = nx.minimum_cut(g, "source", "sink")
    return [
        n for n in nodes if n in cand and f"{n.name}_in" in reachable and f"{n.name}_out" not in reachable
    ]


def _copy_graph(
    order: list[torch.fx.Node],
    keep: set[torch.fx.Node],
    inputs: list[torch.fx.Node],
    outputs: list[Any],
    owner: torch.fx.GraphModule,
) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in inputs:
        p = g.placeholder(n.name)
        p.meta = dict(n.meta)
        env[n] = p
    for n in order:
        if n in keep and n not in env and n.op not in ("placeholder", "output"):
            env[n] = g.node_copy(n, lambda x: env[x])
    g.output(tuple(env[o] if isinstance(o, torch.fx.Node) else o for o in outputs))
    # Note [Graph modules generated on demand]: its source forgotten with it (Note [Generated FX
    # source outlives its module])
    return graph_module(owner, g)


def _bytes(saved: list[Any]) -> int:
    return sum(nbytes(n.meta.get("val")) for n in saved)


def _fused_bytes(saved: list[Any], materialized: set[torch.fx.Node]) -> int:
    return sum(
        nbytes(n.meta.get("val"))
        for n in saved
        if n not in materialized and isinstance(n.meta.get("val"), torch.Tensor)
    )


def partition(
    joint: torch.fx.GraphModule,
    num_fw_outputs: int,
    strategy: str = "min_cut",
    fusion_aware: bool = True,
    keep_written: bool = True,
    recompute_sources: bool = True,
) -> Partition:
    """Split `joint` with `strategy` ("default" or "min_cut"); `fusion_aware`: the min-cut weighs
    a value the forward would fuse away at twice its bytes (Note [What saving a value costs]);
    `keep_written`: a value the backward would have to write is saved, not recomputed (Note
    [Values the backward would write]); `recompute_sources`: in the fusion-aware cut, a value
    whose recomputation reads more bytes than it has is not recomputed (Note [Recomputing from
    many values])."""
    if strategy not in ("default", "min_cut"):
        raise ValueError(f"unknown partition strategy {strategy!r}; use 'default' or 'min_cut'")
    nodes, fw_outs, bw_outs, primals, tangents, tangent_dep = _split(joint, num_fw_outputs)
    bw_need = ancestors(bw_outs)
    outs = {o for o in bw_outs if isinstance(o, torch.fx.Node)}
    materialized = _forward_materialized(nodes, tangent_dep, fw_outs)
    cost_note = ""
    if strategy == "default":
        saved = _saved_default(nodes, tangent_dep, bw_need, outs)
    else:
        kept = frozenset(
            n for n in nodes if keep_written and n not in tangent_dep and _written_in_backward(n, tangent_dep)
        )
        saved = _saved_min_cut(nodes, tangent_dep, bw_need, outs, written=kept)
        if fusion_aware:
            wide = _recompute_sources(nodes, tangent_dep, kept) if recompute_sources else frozenset()
            aware = _saved_min_cut(nodes, tangent_dep, bw_need, outs, materialized, kept | wide)
            plain, mine = _bytes(saved), _bytes(aware)
            written = (_fused_bytes(saved, materialized), _fused_bytes(aware, materialized))
            took = mine <= plain * (1 + _MEMORY_SLACK)
            cost_note = (
                f"fusion-aware cut {'taken' if took else 'refused (memory)'}: saved bytes "
                f"{plain} -> {mine}, forward writes for the backward {written[0]} -> {written[1]}"
            )
            if wide:  # Note [Recomputing from many values]
                cost_note += f"; not recomputed (read several values, more than twice their bytes): {', '.join(n.name for n in nodes if n in wide)}"
            if took:
                saved = aware
    saved = _bind_backward_symbols(joint, nodes, saved, tangents, tangent_dep, bw_outs)
    nodes = list(joint.graph.nodes)  # with the sizes read for the backward, if any
    saved_set = set(saved)
    # run-time assertions read by nothing run where their inputs are: the forward's, unless they
    # check a gradient (Note [Extern calls kept for their effect] in kiln_loopir's scheduler.py)
    checks = [n for n in nodes if effectful(n)]
    fw_checks = [n for n in checks if n not in tangent_dep]
    fw_keep = ancestors([*fw_outs, *saved, *fw_checks])
    fw = _copy_graph(nodes, fw_keep, primals, [*fw_outs, *saved], joint)
    bw_keep = ancestors([*bw_outs, *(n for n in checks if n in tangent_dep)], saved_set | set(tangents))
    bw = _copy_graph(nodes, bw_keep - saved_set, [*saved, *tangents], bw_outs, joint)
    recomputed_nodes = [
        n
        for n in nodes
        if n in bw_keep and n not in tangent_dep and n not in saved_set and n.op == "call_function"
    ]
    for node in recomputed_nodes:
        assert recomputable(node), f"partitioner would recompute {node.format_node()}"
    recomputed = [n.name for n in recomputed_nodes]
    total = sum(nbytes(n.meta.get("val")) for n in saved)
    activations = sum(nbytes(n.meta.get("val")) for n in saved if not _is_input_view(n))
    sizes = tuple(i for i, n in enumerate(saved) if isinstance(n.meta.get("val"), torch.SymInt))
    writes = _fused_bytes(saved, materialized)
    return Partition(
        fw, bw, [n.name for n in saved], total, recomputed, activations, sizes, writes, cost_note
    )


def split_backward(
    bw: torch.fx.GraphModule, n_saved: int, n_first: int, first_tangents: set[int]
) -> list[tuple[torch.fx.GraphModule, tuple[int, ...]]]:
    """`bw`'s gradient outputs cut in two, its first `n_first` and the rest (Note [New values
    differentiated on their own] in joint.py): per half, a backward graph and the positions of
    `bw`'s inputs (saved values, then tangents) it takes. A half takes the inputs it reads, and
    an input it does not read only where that binds a size symbol no read input binds (Note
    [Symbols the backward binds]). `first_tangents`: positions among the tangents of those
    that only the first half's gradients read (a gradient's run-time check goes with its half)."""
    nodes = list(bw.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    outs = list(nodes[-1].args[0])
    tangent_of = {p: k - n_saved for k, p in enumerate(placeholders) if k >= n_saved}
    reads: dict[torch.fx.Node, set[int]] = {}
    for n in nodes:
        reads[n] = {tangent_of[n]} if n in tangent_of else set().union(*(reads[a] for a in n.all_input_nodes))
    checks = [n for n in nodes if effectful(n)]
    halves = []
    for first in (True, False):
        grads = outs[:n_first] if first else outs[n_first:]
        mine = [c for c in checks if bool(reads[c] & first_tangents) == first]
        keep = ancestors([*grads, *mine], set(placeholders))
        needed: set[Any] = set()
        for n in keep:
            if n.op != "placeholder":
                needed |= _symbols(n.meta.get("val"))
        inputs = [p for p in placeholders if p in keep]
        bound: set[Any] = set()
        for p in inputs:
            bound |= _binds(p.meta.get("val"))
        for p in placeholders:
            if p not in keep and _binds(p.meta.get("val")) & (needed - bound):
                inputs.append(p)
                bound |= _binds(p.meta.get("val"))
        inputs.sort(key=placeholders.index)
        gm = _copy_graph(nodes, keep, inputs, grads, bw)
        gm.meta.update(bw.meta)
        halves.append((gm, tuple(placeholders.index(p) for p in inputs)))
    return halves


def _symbols(val: Any) -> set[Any]:
    """The size symbols of a value: a SymInt/SymFloat/SymBool's, a tensor's sizes, strides and
    storage offset's."""
    if isinstance(val, torch.Tensor):
        parts: list[Any] = [*val.shape, *val.stride(), val.storage_offset()]
    else:
        parts = [val]
    out: set[Any] = set()
    for p in parts:
        if is_symbolic(p):
            out |= expr_of(p).free_symbols
    return out


def _binds(val: Any) -> set[Any]:
    """The symbols an input of this value gives the backward: itself if a plain-symbol SymInt,
    its plain-symbol sizes and strides if a tensor (Note [Symbols the backward binds])."""
    parts = [*val.shape, *val.stride()] if isinstance(val, torch.Tensor) else [val]
    found = set()
    for p in parts:
        if isinstance(p, torch.SymInt) and expr_of(p).is_Symbol:
            found.add(expr_of(p))
    return found


def _shape_env(val: Any) -> Any:
    parts = [*val.shape, *val.stride()] if isinstance(val, torch.Tensor) else [val]
    for p in parts:
        if is_symbolic(p):
            return p.node.shape_env
    return None


def _bind_backward_symbols(
    joint: torch.fx.GraphModule,
    nodes: list[torch.fx.Node],
    saved: list[Any],
    tangents: list[torch.fx.Node],
    tangent_dep: set[torch.fx.Node],
    bw_outs: list[Any],
) -> list[Any]:
    """`saved` plus a node for each symbol the backward needs and its inputs do not bind
    (Note [Symbols the backward binds]); may add `sym_size` nodes to `joint`."""
    saved_set = set(saved)
    bw_nodes = ancestors(
        [*bw_outs, *(n for n in nodes if effectful(n) and n in tangent_dep)], saved_set | set(tangents)
    )
    needed: set[Any] = set()
    env = None
    for n in bw_nodes:
        val = n.meta.get("val")
        syms = _symbols(val)
        if syms:
            needed |= syms
            env = env or _shape_env(val)
    if not needed:
        return saved
    bound: set[Any] = set()
    for n in [*saved, *tangents]:
        bound |= _binds(n.meta.get("val"))
    missing = sorted((s for s in needed - bound if env is None or not env.is_unbacked(s)), key=str)
    if not missing:
        return saved
    providers: dict[Any, torch.fx.Node] = {}
    for n in nodes:
        val = n.meta.get("val")
        if n in tangent_dep or not isinstance(val, torch.SymInt):
            continue
        expr = expr_of(val)
        if expr.is_Symbol and expr in missing and expr not in providers:
            providers[expr] = n
    first_op = next(n for n in nodes if n.op != "placeholder")
    for p in (n for n in nodes if n.op == "placeholder" and n not in tangent_dep):
        val = p.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for op, values in ((aten.sym_size.int, val.shape), (aten.sym_stride.int, val.stride())):
            for dim, v in enumerate(values):
                expr = expr_of(v) if isinstance(v, torch.SymInt) else None
                if expr is None or not expr.is_Symbol or expr not in missing or expr in providers:
                    continue
                with joint.graph.inserting_before(first_op):
                    read = joint.graph.call_function(op, (p, dim))
                read.meta["val"] = v
                providers[expr] = read
    extra = [providers[s] for s in missing if s in providers]
    return [*saved, *(n for n in dict.fromkeys(extra) if n not in saved_set)]


def _is_input_view(node: torch.fx.Node) -> bool:
    while node.op == "call_function" and getattr(node.target, "is_view", False):
        node = node.args[0]  # type: ignore[assignment]
    return node.op in ("placeholder", "get_attr")


def saved_bytes_of(names: list[str], joint: torch.fx.GraphModule) -> int:
    by_name = {n.name: n for n in joint.graph.nodes}
    return sum(nbytes(by_name[s].meta.get("val")) for s in names)


def count_ops(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function")
