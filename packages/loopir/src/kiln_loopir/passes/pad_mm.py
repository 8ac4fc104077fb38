"""The matmul padding pass: GEMMs with sizes tensor cores dislike run on zero-padded operands.

Note [Matmul padding]: cuBLAS picks its fast tensor-core kernels only when M, N and K (and the
leading dimensions) are multiples of 16 bytes: 8 elements in bfloat16/float16, 4 in float32. GPT-2's
tied LM head (vocab N = 50257) otherwise runs an sm75-era kernel on the H200 (3.37 ms) where the
same product with N padded to 50264 takes 0.45 ms. So an ``mm``, ``addmm`` or ``bmm`` (a ``linear``
is one of these in an aten graph) with a misaligned, static, non-1 M, N or K becomes:

    mm(constant_pad_nd(a), constant_pad_nd(b))[:M, :N]

Zeros added to K contribute nothing to the sums; rows and columns added to M and N are sliced off.
addmm's bias is padded along its non-broadcast dims. A transposed operand (a weight ``t(w)``) is
padded before the transpose, so the GEMM still sees a transposed operand with an aligned leading
dimension, and the pad is a plain row-major copy of the weight; the pad is a lazy pointwise in
loopir, so when the operand is itself computed (a cast of a parameter) the pad fuses into that
kernel. The slice is a view: readers index the padded result with its row stride. Where the
result leaves the graph (directly or through views) it stays that view, as torch.compile returns
it: GPT-2's logits come back with a row stride of 50264, not eager's 50257. Values, shape and
dtype are eager's; only the strides differ, and copying the logits to eager's strides would cost
more GPU time than the padding saves in part (0.22 ms of the 0.67 ms on the H200). Option
``pad_mm_output_copy=True`` copies such outputs to eager's contiguous strides instead (code that
calls ``.view`` in a way only a contiguous tensor allows needs it, as with torch.compile).

Note [Padding GEMMs of symbolic size]: under dynamic shapes (``dynamic=True``, or automatic
dynamic after a size change) a language model's tokens M = batch*length are symbolic while K and
N are weights' sizes. Such a GEMM is padded along its static misaligned dims only (symbolic ones
are left as they are, unpadded and unsliced): the LM head's N = 50257 is what sent cuBLAS to the
slow kernel, and it is static. Without this, GPT-2's dynamic graph ran 3x slower than its static one
at batch 32, length 512 on the H200 (17.5 ms against 5.8 ms; torch.compile's dynamic graph the
same 17.5 ms). The verdict is timed at the size hints (the sizes of the call that compiled) and
applies to every size; the pass reads hints, never ``int()`` of a symbolic size (that would add a
guard). The values of the nodes it inserts are computed from their operands' sizes and strides
(:func:`_symbolic_val`), not by torch's meta kernels on symbolic meta tensors: on the H200 machine's
torch 2.11 the first form of this pass, which ran those kernels, made every symbolic compile of
GPT-2 fall back to static graphs (9 compiles for 9 shapes; the likely cause is the failure of Note
[Metadata queries as operators] in kiln_dynamo, not confirmed there). A rewrite that fails anyway
leaves its GEMM unpadded, with the reason in ``KILN_LOG=passes``.

When it pays is decided per shape (:func:`should_pad`): ``pad_mm="force"`` pads every candidate on
any device (tests); otherwise only on CUDA, not for memory-bound shapes (arithmetic intensity
M*N*K / (M*K + K*N + M*N) below :data:`MIN_INTENSITY`: padding cannot speed up a GEMM that waits on
memory, and adds copies), and only where timing both versions once on the device, on random tensors
of the shapes (pad copies and the output copy counted), shows the padded one faster by
:data:`MIN_GAIN`. The verdict is cached on disk under ``$KILN_CACHE_DIR/pad_mm/`` by (op, shapes,
strides, dtype, device name, torch version), written atomically, so each shape is timed once per
machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx
from kiln_symbolic import hint_of
from torch._dispatch.python import enable_python_dispatcher

from ..diskcache import cache_root, write_atomic
from ..lowering import READS_STORAGE, VIEW_OPS, is_view_op
from ..sizevars import has_symbols
from . import PassContext, copy_graph

cache_log = logging.getLogger("kiln.loopir.cache")

aten = torch.ops.aten

MIN_INTENSITY = 32.0
MIN_GAIN = 1.1  # the padded GEMM must be this many times faster
GEMMS = (aten.mm.default, aten.addmm.default, aten.bmm.default)


def alignment(dtype: torch.dtype) -> int | None:
    """Elements per 16 bytes for the tensor-core dtypes, None for dtypes that are not padded."""
    if dtype in (torch.float16, torch.bfloat16):
        return 8
    if dtype == torch.float32:
        return 4
    return None


def padded_length(n: int, align: int) -> int:
    """``n`` rounded up to ``align`` (unchanged when 1 or aligned: a size-1 dim is a GEMV)."""
    if n <= 1 or n % align == 0:
        return n
    return (n + align - 1) // align * align


@dataclass(frozen=True, slots=True)
class Candidate:
    """A GEMM node and its sizes; ``pads`` = extra elements for (M, K, N)."""

    node: torch.fx.Node
    m: int
    k: int
    n: int
    pads: tuple[int, int, int]
    dtype: torch.dtype

    def describe(self) -> str:
        m, k, n = self.pads
        parts = [
            f"{name} {size}->{size + extra}"
            for name, size, extra in zip("MKN", (self.m, self.k, self.n), (m, k, n), strict=True)
            if extra
        ]
        return f"{self.node.name} ({self.node.target}, {self.dtype}): {', '.join(parts)}"


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _hint(size: Any) -> int | None:
    """A size's value in the call that compiled (Note [Padding GEMMs of symbolic size]); None for
    a data-dependent size."""
    value = hint_of(size)
    return None if value is None else int(value)


def _hints(sizes: Sequence[Any]) -> list[int]:
    out = []
    for s in sizes:
        h = _hint(s)
        assert h is not None, sizes
        out.append(h)
    return out


def _operands(node: torch.fx.Node) -> tuple[Any, Any, Any]:
    """(bias, a, b) of a GEMM node (bias None for mm and bmm)."""
    if node.target is aten.addmm.default:
        return node.args[0], node.args[1], node.args[2]
    return None, node.args[0], node.args[1]


def candidate(node: torch.fx.Node) -> Candidate | None:
    if node.op != "call_function" or node.target not in GEMMS:
        return None
    _, a, b = _operands(node)
    va, vb = _val(a), _val(b)
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)) or va.dtype != vb.dtype:
        return None
    align = alignment(va.dtype)
    if align is None or any(_hint(s) is None for s in (*va.shape, *vb.shape)):
        return None
    sizes = (va.shape[-2], va.shape[-1], vb.shape[-1])
    m, k, n = _hints(sizes)
    if 0 in (m, k, n):
        return None
    # a symbolic size is never padded (Note [Padding GEMMs of symbolic size])
    pads = tuple(
        padded_length(h, align) - h if isinstance(s, int) else 0
        for s, h in zip(sizes, (m, k, n), strict=True)
    )
    if not any(pads):
        return None
    return Candidate(node, m, k, n, (pads[0], pads[1], pads[2]), va.dtype)


def reaches_output(node: torch.fx.Node, skip: frozenset[int] = frozenset()) -> bool:
    """Whether ``node``'s value leaves the graph, directly or through views, at an output
    position not in ``skip``."""
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        for user in current.users:
            if user.op == "output":
                outs = user.args[0] if user.args else ()
                if not isinstance(outs, (tuple, list)):
                    return True
                if any(o is current and i not in skip for i, o in enumerate(outs)):
                    return True
                continue
            if user.target in VIEW_OPS and user not in seen:
                seen.add(user)
                pending.append(user)
    return False


# --------------------------------------------------------------------------------------------
# the decision


def cache_dir() -> Path:
    return cache_root() / "pad_mm"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def decision_key(c: Candidate, device: torch.device, copy_out: bool = False) -> str:
    bias, a, b = _operands(c.node)
    parts: list[Any] = [str(c.node.target)]
    for operand in (bias, a, b):
        v = _val(operand)
        parts.append(None if not isinstance(v, torch.Tensor) else (_hints(v.shape), _hints(v.stride())))
    # "v2": verdicts timed since the padded operand is timed in the rewrite's layout
    parts += [str(c.dtype), device_name(device), torch.__version__, copy_out, "v2"]
    return json.dumps(parts)


_MEMORY: dict[str, bool] = {}


def _path(key: str) -> Path:
    return cache_dir() / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")


def cached_decision(key: str) -> bool | None:
    """The verdict on disk, or None: none stored, or an entry that is not a whole verdict (a
    truncated or damaged file, reported, then decided afresh and written over: Note [Verified
    cache entries] in kiln_codegen_cpp's build.py)."""
    if key in _MEMORY:
        return _MEMORY[key]
    path = _path(key)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:  # no entry
        return None
    try:
        entry = json.loads(raw)
        sound = (
            isinstance(entry, dict)
            and isinstance(entry.get("pad"), bool)
            and isinstance(entry.get("key"), str)
        )
    except ValueError:
        sound = False
    if not sound:
        cache_log.warning(
            "kiln: corrupt pad_mm cache entry %s (%d bytes): timed again and rewritten", path, len(raw)
        )
        return None
    if entry["key"] != key:  # a hash collision: decide afresh
        return None
    _MEMORY[key] = entry["pad"]
    return _MEMORY[key]


def store_decision(key: str, pad: bool, original_ms: float, padded_ms: float) -> None:
    """Write the verdict atomically (a temporary file renamed over the entry)."""
    _MEMORY[key] = pad
    entry = {"key": key, "pad": pad, "original_ms": original_ms, "padded_ms": padded_ms}
    write_atomic(_path(key), json.dumps(entry))


Timer = Callable[[Callable[[], Any], torch.device], float]


def time_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Median milliseconds of ``fn`` on ``device`` (CUDA events; a few warm-up runs first)."""
    for _ in range(3):
        fn()
    if device.type != "cuda":
        import time

        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]
    torch.cuda.synchronize(device)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _random_like(val: torch.Tensor, device: torch.device) -> torch.Tensor:
    shape, stride = _hints(val.shape), _hints(val.stride())
    try:
        t = torch.empty_strided(shape, stride, dtype=val.dtype, device=device)
    except RuntimeError:
        t = torch.empty(shape, dtype=val.dtype, device=device)
    return t.normal_() if t.numel() else t


def _pad_spec(val_shape: Sequence[int], pads: dict[int, int]) -> list[int]:
    """constant_pad_nd's pad list (last dim first) adding ``pads[d]`` at the end of dim ``d``."""
    rank = len(val_shape)
    spec: list[int] = []
    for d in reversed(range(rank)):
        spec += [0, pads.get(d, 0)]
    while spec and spec[-1] == 0 and spec[-2] == 0:
        spec = spec[:-2]
    return spec


def _operand_pads(c: Candidate) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """Extra elements per dim of (bias, a, b)."""
    pm, pk, pn = c.pads
    bias, a, b = _operands(c.node)
    ra, rb = _val(a).dim(), _val(b).dim()
    pad_a = {d: p for d, p in ((ra - 2, pm), (ra - 1, pk)) if p}
    pad_b = {d: p for d, p in ((rb - 2, pk), (rb - 1, pn)) if p}
    pad_bias: dict[int, int] = {}
    vbias = _val(bias)
    if isinstance(vbias, torch.Tensor):
        rank = vbias.dim()
        for d, (size, extra) in zip((rank - 2, rank - 1), ((c.m, pm), (c.n, pn)), strict=True):
            if d >= 0 and extra and isinstance(vbias.shape[d], int) and vbias.shape[d] == size and size != 1:
                pad_bias[d] = extra
    return pad_bias, pad_a, pad_b


def _operand_versions(
    operand: Any, pads: dict[int, int], device: torch.device
) -> tuple[Any, Callable[[], Any]]:
    """A random tensor standing for ``operand`` and a function giving it padded exactly as
    :func:`_pad` rewrites it: a transposed operand is padded before its transpose, so the timed
    GEMM sees the same layout (transposed, aligned leading dimension) as the rewritten graph's.
    Padding the transposed view itself would time a row-major operand: another cuBLAS kernel
    (BERT's LM head on the H200: 0.79 ms there, against 0.27 ms for the layout the graph runs)."""
    if not isinstance(operand, torch.fx.Node):
        return operand, lambda: operand
    perm = _permutation(operand)
    if perm is not None:
        src, op = operand.args[0], operand.target
        assert callable(op)
        rest, kwargs = operand.args[1:], dict(operand.kwargs)
        t_src, padded_src = _operand_versions(src, {perm[d]: p for d, p in pads.items()}, device)
        t = op(t_src, *rest, **kwargs)
        if not pads:
            return t, lambda: t
        return t, lambda: op(padded_src(), *rest, **kwargs)
    t = _random_like(_val(operand), device)
    if not pads:
        return t, lambda: t
    return t, lambda: torch.constant_pad_nd(t, _pad_spec(t.shape, pads))


def _eager_versions(
    c: Candidate, device: torch.device, copy_out: bool = False
) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """The GEMM as the graph runs it and padded as the rewrite would, on random tensors."""
    bias, a, b = _operands(c.node)
    op = c.node.target
    assert callable(op)
    kwargs = dict(c.node.kwargs)
    pad_bias, pad_a, pad_b = _operand_pads(c)
    ta, padded_a = _operand_versions(a, pad_a, device)
    tb, padded_b = _operand_versions(b, pad_b, device)
    has_bias = isinstance(_val(bias), torch.Tensor)
    tbias, padded_bias = _operand_versions(bias, pad_bias, device) if has_bias else (bias, lambda: bias)
    args = (ta, tb) if tbias is None else (tbias, ta, tb)

    def original() -> Any:
        return op(*args, **kwargs)

    def padded() -> Any:
        pa, pb = padded_a(), padded_b()
        out = op(pa, pb, **kwargs) if tbias is None else op(padded_bias(), pa, pb, **kwargs)
        out = out[..., : c.m, : c.n]
        return out.contiguous() if copy_out else out

    return original, padded


# Note [Padded results the program sees]: a padded GEMM's result that leaves the graph as a view
# with the padded row stride has eager's values, shape and dtype, but not its strides, and code
# after the compiled call that relies on them raises where eager runs: `logits.view(-1, vocab)`
# of GPT-2's logits (row stride 50264, not 50257), the idiom of a training loop's loss, or a
# graph break's continuation (test_alias_fuzz.py --pad-mm seed 30151: `t1.view(25, 1)` after the
# break). torch.compile returns its outputs in eager's strides (inductor's `keep_output_stride`).
# So by default (`pad_mm_output_copy="user"`) such a result is copied to eager's strides where it
# leaves the graph as an output the program sees; an output only the backward reads (a saved
# activation, Note [Outputs only the backward reads] in graph.py) keeps the padded layout. The
# copy is part of what the pad is timed with (`should_pad`), so a GEMM whose padding no longer
# pays once its result is copied is left unpadded. `pad_mm_output_copy=False` keeps the view
# (faster where the program only reads values, as kiln did before), `True` copies every output.


# Note [Readers of a GEMM's strides]: the slice of the padded buffer is the GEMM's value with
# other strides, which no reader can tell apart, except one that addresses the storage itself:
# `as_strided` (and `as_strided_scatter`) of the result or of a view of it takes eager's
# contiguous strides and offset as given, and over the padded rows it read other elements
# (`(a @ b).as_strided((2, 2), (1, 1), 8)` of a (6, 5) product: row 1 of the padded buffer where
# eager reads row 1 col 3; test_alias_fuzz.py --pad-mm seed 20271, a wrong answer). A padded
# result such a reader reaches, through views, is copied to eager's contiguous strides (as option
# `pad_mm_output_copy` copies one), and timed with that copy.
def views_of(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``node`` and every node that views its value through view ops (and ``getitem``)."""
    found, pending, seen = [node], [node], {node}
    while pending:
        current = pending.pop()
        for user in current.users:
            view = user.target is operator.getitem or is_view_op(user.target)
            if view and user not in seen:
                seen.add(user)
                pending.append(user)
                found.append(user)
    return found


def reads_strides(node: torch.fx.Node) -> bool:
    """Whether an op that addresses storage reads ``node``'s value, directly or through views
    (Note [Readers of a GEMM's strides])."""
    return any(
        user.target in READS_STORAGE and user.args and user.args[0] is current
        for current in views_of(node)
        for user in current.users
    )


def _copies_out(c: Candidate, ctx: PassContext) -> bool:
    """Whether the padded result is copied to eager's strides: where it leaves the graph as an
    output the program sees and option ``pad_mm_output_copy`` asks for it (``"user"``, the
    default: every output but those only the backward reads; ``True``: every output; Note
    [Padded results the program sees]), and where a reader addresses its storage (Note [Readers
    of a GEMM's strides])."""
    from ..graph import free_layout_outputs  # graph.py runs the passes

    mode = ctx.options.pad_mm_output_copy
    if mode == "user":
        owner = c.node.graph.owning_module
        leaves = reaches_output(c.node, free_layout_outputs(owner) if owner is not None else frozenset())
    else:
        leaves = bool(mode) and reaches_output(c.node)
    return leaves or reads_strides(c.node)


def should_pad(c: Candidate, ctx: PassContext, timer: Timer = time_ms) -> tuple[bool, str]:
    """Whether to pad ``c``, and why (Note [Matmul padding])."""
    if ctx.options.pad_mm == "force":
        return True, "forced (pad_mm='force')"
    if ctx.device.type != "cuda":
        return False, f"not on CUDA ({ctx.device.type})"
    intensity = c.m * c.n * c.k / (c.m * c.k + c.k * c.n + c.m * c.n)
    if intensity < MIN_INTENSITY:
        return False, f"memory-bound (intensity {intensity:.1f} < {MIN_INTENSITY})"
    copy_out = _copies_out(c, ctx)
    key = decision_key(c, ctx.device, copy_out)
    known = cached_decision(key)
    if known is not None:
        return known, f"cached verdict ({'pad' if known else 'keep'})"
    original, padded = _eager_versions(c, ctx.device, copy_out)
    with torch.no_grad():
        original_ms, padded_ms = timer(original, ctx.device), timer(padded, ctx.device)
    pad = original_ms > MIN_GAIN * padded_ms
    store_decision(key, pad, original_ms, padded_ms)
    return pad, f"timed: original {original_ms:.3f} ms, padded {padded_ms:.3f} ms"


# --------------------------------------------------------------------------------------------
# the rewrite


# view ops a transposed operand may come through: (node) -> permutation out dim i = in dim perm[i]
def _permutation(node: torch.fx.Node) -> list[int] | None:
    src = node.args[0] if node.args else None
    vsrc = _val(src)
    if not isinstance(vsrc, torch.Tensor):
        return None
    rank = vsrc.dim()
    if node.target is aten.t.default and rank == 2:
        return [1, 0]
    if node.target is aten.transpose.int:
        pair: Any = node.args[1:3]
        d0, d1 = (int(d) % rank for d in pair)
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    if node.target is aten.permute.default:
        dims: Any = node.args[1]
        return [int(d) % rank for d in dims]
    return None


def _contiguous_strides(shape: Sequence[Any]) -> list[Any]:
    """Row-major strides of torch.SymInt sizes (``indexing.contiguous_strides`` takes sympy
    sizes and compares each with 0, which on a SymInt would add a guard)."""
    strides: list[Any] = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return strides


def _laid_out(shape: Sequence[Any], stride: Sequence[Any] | None, dtype: torch.dtype) -> torch.Tensor:
    strides = list(stride) if stride is not None else _contiguous_strides(shape)
    with enable_python_dispatcher():
        return torch.empty_strided(list(shape), strides, dtype=dtype, device="meta")


def _symbolic_val(node: torch.fx.Node) -> torch.Tensor:
    """The meta value of a node the pass inserted into a symbolic graph, from its operands' sizes
    and strides alone (Note [Padding GEMMs of symbolic size]): no meta kernel of torch runs on
    symbolic meta tensors here (torch 2.11 failed some of them inside its argument parser)."""
    target, args = node.target, node.args
    x = _val(args[1] if target is aten.addmm.default else args[0])
    assert isinstance(x, torch.Tensor)
    if target is aten.constant_pad_nd.default:
        spec: Any = args[1]
        shape = list(x.shape)
        for i in range(len(spec) // 2):
            shape[-1 - i] = shape[-1 - i] + spec[2 * i] + spec[2 * i + 1]
        return _laid_out(shape, None, x.dtype)
    perm = _permutation(node)
    if perm is not None:
        assert x.storage_offset() == 0  # a transposed pad: its source is a fresh pad
        return _laid_out([x.shape[p] for p in perm], [x.stride()[p] for p in perm], x.dtype)
    if target in GEMMS:
        other = _val(args[-1])
        return _laid_out([*x.shape[:-1], other.shape[-1]], None, x.dtype)
    if target is aten.slice.Tensor and args[2] == 0:
        dim: Any = args[1]
        sliced: list[Any] = list(x.shape)
        sliced[dim] = args[3]
        return _laid_out(sliced, x.stride(), x.dtype)
    if target is aten.clone.default:
        return _laid_out(x.shape, None, x.dtype)
    raise NotImplementedError(f"pad_mm: no symbolic value for {target}")


def _with_val(node: torch.fx.Node) -> torch.fx.Node:
    """Give a node the pass inserted its meta value (run on meta tensors; in a symbolic graph
    computed from the operands' layouts instead: :func:`_symbolic_val`)."""
    vals = [_val(a) for a in node.args if isinstance(a, torch.fx.Node)]
    if any(isinstance(v, torch.Tensor) and has_symbols(v) for v in vals):
        node.meta["val"] = _symbolic_val(node)
        return node

    def meta(v: Any) -> Any:
        if isinstance(v, torch.fx.Node):
            val = _val(v)
            if isinstance(val, torch.Tensor):
                return torch.empty_strided(
                    [int(s) for s in val.shape],
                    [int(s) for s in val.stride()],
                    dtype=val.dtype,
                    device="meta",
                )
            return val
        return v

    args, kwargs = torch.fx.node.map_aggregate((node.args, node.kwargs), meta)
    assert callable(node.target)
    node.meta["val"] = node.target(*args, **kwargs)
    return node


def _pad(graph: torch.fx.Graph, operand: Any, pads: dict[int, int]) -> Any:
    if not pads:
        return operand
    perm = _permutation(operand) if isinstance(operand, torch.fx.Node) else None
    if perm is not None:  # pad the source, then transpose it again (see the Note)
        src = operand.args[0]
        padded_src = _pad(graph, src, {perm[d]: p for d, p in pads.items()})
        return _with_val(
            graph.call_function(operand.target, (padded_src, *operand.args[1:]), dict(operand.kwargs))
        )
    spec = _pad_spec(_val(operand).shape, pads)
    return _with_val(graph.call_function(aten.constant_pad_nd.default, (operand, spec, 0.0)))


def _rewrite(gm: torch.fx.GraphModule, c: Candidate, copy_out: bool) -> None:
    node = c.node
    graph = gm.graph
    bias, a, b = _operands(node)
    pad_bias, pad_a, pad_b = _operand_pads(c)
    with graph.inserting_before(node):
        pa, pb = _pad(graph, a, pad_a), _pad(graph, b, pad_b)
        args: tuple[Any, ...] = (pa, pb) if bias is None else (_pad(graph, bias, pad_bias), pa, pb)
        target: Any = node.target
        out = _with_val(graph.call_function(target, args, dict(node.kwargs)))
        rank = _val(out).dim()
        for dim, size, extra in ((rank - 2, c.m, c.pads[0]), (rank - 1, c.n, c.pads[2])):
            if extra:
                out = _with_val(graph.call_function(aten.slice.Tensor, (out, dim, 0, size)))
        if copy_out:  # eager's (contiguous) strides: Notes [Matmul padding], [Readers of a GEMM's strides]
            out = _with_val(
                graph.call_function(aten.clone.default, (out,), {"memory_format": torch.contiguous_format})
            )
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def pad_mm_pass(gm: torch.fx.GraphModule, ctx: PassContext) -> torch.fx.GraphModule:
    """Pad the misaligned GEMMs that :func:`should_pad` accepts (Note [Matmul padding])."""
    candidates = [c for node in gm.graph.nodes if (c := candidate(node)) is not None]
    if candidates and ctx.device.type != "cuda" and ctx.options.pad_mm != "force":
        ctx.note("pad_mm", "keep %d misaligned GEMMs: not on CUDA (%s)", len(candidates), ctx.device.type)
        return gm
    chosen: list[torch.fx.Node] = []
    for c in candidates:
        node = c.node
        pad, why = should_pad(c, ctx)
        ctx.note("pad_mm", "%s %s: %s", "pad" if pad else "keep", c.describe(), why)
        if pad:
            chosen.append(node)
    if not chosen:
        return gm
    copied, env = copy_graph(gm)
    for node in chosen:
        c = candidate(env[node])
        assert c is not None
        before = set(copied.graph.nodes)
        try:
            _rewrite(copied, c, _copies_out(c, ctx))
        except Exception as e:  # a GEMM left unpadded is slower, never wrong: undo the inserts
            for inserted in reversed([n for n in copied.graph.nodes if n not in before]):
                copied.graph.erase_node(inserted)
            ctx.note("pad_mm", "keep %s: the rewrite failed (%s: %s)", c.describe(), type(e).__name__, e)
    copied.graph.lint()
    copied.recompile()
    return copied


__all__ = [
    "MIN_GAIN",
    "MIN_INTENSITY",
    "Candidate",
    "alignment",
    "cache_dir",
    "candidate",
    "decision_key",
    "pad_mm_pass",
    "should_pad",
    "time_ms",
]
