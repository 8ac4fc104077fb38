"""Matmul templates: a Triton GEMM with the pointwise kernel after it fused into its store.

Note [Matmul templates]: in the default mode a matmul is an extern call (cuBLAS on a GPU) and the
pointwise code that reads its result (the bias add that loopir left lazy, Note [Bias after the
GEMM]; a GELU; a residual add) is a kernel of its own, which reads the product back from memory.
Under ``mode="max-autotune"`` loopir's scheduler asks the backend (``Backend.template_epilogue``)
whether such a pair (an extern ``mm``/``addmm``/``bmm`` whose only reader is one pointwise kernel)
should become one :class:`~kiln_loopir.scheduler.TemplateSchedulerNode`; the Triton backend says
yes for static float GEMMs (symbolic sizes stay extern, with the reason logged). For that node it
generates both ways of running it:

* the extern call and the epilogue kernel, as the default mode runs them;
* a template kernel (:func:`build_template`): a blocked GEMM (``BLOCK_M x BLOCK_N`` tile per
  program, ``BLOCK_K`` steps of ``tl.dot`` in float32, programs grouped by ``GROUP_M`` rows of
  tiles so that neighbours share A's rows in L2), whose accumulator, rounded to the product's
  dtype as the extern's result would be, is the value the epilogue's loads of the product see.
  The epilogue's body is the very code the epilogue kernel has (kernel.py's generator on a
  2-D tiled plan, ``yindex`` = the product's rows, ``xindex`` its columns), so both ways compute
  the same expressions; only the product's store and load disappear.

A GEMM that no epilogue joins (its result is a graph output, feeds another extern such as
attention, or a reduction such as a layer norm reads it) stays a plain extern node, and the
backend gives it a template too (``TemplateSpec.lone``): the template stores the product where the
extern's result would be, into a buffer its choice allocates in the layout the wrapper holds
that result in, and it is timed against the extern call alone.

Which one runs is decided at the node's first call (:class:`MatmulChoice`): on a GPU every
candidate (the extern call plus its epilogue kernel, and each template config of
:func:`gemm_configs`) is timed on the real arguments with ``triton.testing.do_bench`` (as
runtime.py's max-autotune times kernel configs), the fastest kept (a template only when it is
faster than the extern path by more than the timing noise, ``TEMPLATE_MARGIN``), and the choice written to
``$KILN_CACHE_DIR/triton/autotune/<key>.json`` (keyed by both kernels' sources, which hold the
shapes, strides and dtypes, the device, the Triton version, the candidates and the TF32 setting),
so a later process skips the timing. ``KILN_LOG=autotune`` prints each choice with its timings.
Under Triton's interpreter nothing is timed: the extern runs, unless a test forces the template
(``TritonBackend(matmul_templates="force")``). ``triton_options={"matmul_templates": False}``
turns the whole feature off; the default mode never forms template nodes, so its code is what it
was (``scripts/triton_static_dump.py``).

Precision: float32 inputs use TF32 in ``tl.dot`` exactly when
``torch.backends.cuda.matmul.allow_tf32`` is set at compile time (as cuBLAS would at that time);
bfloat16/float16 accumulate in float32, and the product is rounded to its dtype before the
epilogue reads it, as eager's separate kernels round it. An ``addmm`` template adds the bias to
the float32 accumulator before that rounding (``beta = alpha = 1`` only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from kiln_loopir.diskcache import write_atomic
from kiln_loopir.ir import Buffer, ComputedBuffer, ExternKernel, ReinterpretView

from .interp import interpreting
from .kernel import CodegenUnsupported, Plan, TValue, _Generator, simplify
from .runtime import Launcher, cache_dir, counters
from .triton_ops import HALF, convert_expr, load_expr, store_expr

log = logging.getLogger("kiln.codegen_triton.autotune")
cache_log = logging.getLogger("kiln.codegen_triton.cache")

aten = torch.ops.aten

# the extern ops a template replaces, by the name a template kernel carries
TEMPLATE_OPS: dict[Any, str] = {aten.mm.default: "mm", aten.addmm.default: "addmm", aten.bmm.default: "bmm"}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_BATCH = 65535  # CUDA's grid y limit: one batch per y program
# a template is chosen only when it takes less than this fraction of the extern path's time:
# do_bench's means move by a percent or so between runs, and cuBLAS is the known quantity
TEMPLATE_MARGIN = 0.97


class TemplateUnsupported(CodegenUnsupported):
    """A matmul the template does not take; it stays an extern call (the message says why)."""


@dataclass(frozen=True, slots=True)
class GemmConfig:
    """One template config: tile sizes (``tl.constexpr``), programs grouped by ``GROUP_M``."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 8
    num_stages: int = 3
    num_warps: int = 4

    def label(self) -> str:
        return (
            f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K}"
            f"/g{self.GROUP_M}/s{self.num_stages}/w{self.num_warps}"
        )


# Candidates on a GPU (H100/H200 class), before they are shrunk to the problem: a few tile
# shapes known to do well for bf16 GEMMs of transformer sizes; not tuned on the H200 yet.
GPU_CONFIGS = (
    GemmConfig(128, 128, 64, 8, 3, 8),
    GemmConfig(128, 256, 64, 8, 3, 8),
    GemmConfig(64, 128, 64, 8, 4, 4),
    GemmConfig(128, 64, 64, 8, 4, 4),
    GemmConfig(64, 64, 32, 8, 4, 4),
)
# Triton's interpreter: small tiles, so small test shapes still span several programs and masks
INTERPRETER_CONFIGS = (GemmConfig(16, 16, 16, 2, 1, 4),)


def _pow2_at_least(n: int, low: int = 16) -> int:
    return max(low, 1 << max(0, (n - 1).bit_length()))


def gemm_configs(m: int, n: int, k: int, dtype: torch.dtype, *, interpreter: bool) -> list[GemmConfig]:
    """The template configs worth timing for an ``m x k @ k x n`` product: each candidate's tiles
    shrunk to the problem (no tile wider than the next power of two of its extent), float32's
    ``BLOCK_K`` halved (twice the bytes per element in shared memory), duplicates dropped."""
    base = INTERPRETER_CONFIGS if interpreter else GPU_CONFIGS
    out: list[GemmConfig] = []
    for c in base:
        bk = c.BLOCK_K // 2 if dtype == torch.float32 and not interpreter else c.BLOCK_K
        shrunk = GemmConfig(
            min(c.BLOCK_M, _pow2_at_least(m)),
            min(c.BLOCK_N, _pow2_at_least(n)),
            min(bk, _pow2_at_least(k)),
            c.GROUP_M,
            c.num_stages,
            c.num_warps,
        )
        if shrunk not in out:
            out.append(shrunk)
    return out


# ------------------------------------------------------------------------------------------
# the problem


@dataclass(frozen=True, slots=True)
class Operand:
    """A tensor argument of the GEMM: its buffer, and (batch, row, column) strides + offset of
    the view the op takes, in elements of that buffer's storage."""

    name: str
    dtype: torch.dtype
    strides: tuple[int, int, int]
    offset: int


@dataclass(frozen=True, slots=True)
class MatmulProblem:
    """``out[b, m, n] = sum_k a[b, m, k] * b[b, k, n] (+ bias[m, n])`` with static sizes."""

    op: str
    batch: int
    m: int
    n: int
    k: int
    a: Operand
    b: Operand
    bias: Operand | None
    out: str  # the extern's result buffer: what the epilogue reads
    dtype: torch.dtype
    out_strides: tuple[int, int, int] = (0, 0, 0)  # its (batch, row, column) strides


def _static(values: Sequence[Any], what: str) -> list[int]:
    out = []
    for v in values:
        e = sympy.sympify(v)
        if not e.is_Integer:
            raise TemplateUnsupported(f"symbolic {what} ({e}): the template takes static shapes")
        out.append(int(e))
    return out


def _operand(value: Any, rank: int, broadcast_to: Sequence[int] | None = None) -> Operand:
    layout: Any
    if isinstance(value, ReinterpretView):
        name, layout = value.buffer.name, value.layout
    elif isinstance(value, Buffer):
        name, layout = value.name, value.layout
    else:
        raise TemplateUnsupported(f"argument {type(value).__name__} is not a buffer")
    size = _static(layout.size, "size")
    stride = _static(layout.stride, "stride")
    (offset,) = _static([layout.offset], "offset")
    if broadcast_to is not None:  # addmm's bias: broadcast as torch broadcasts, size 1 -> stride 0
        if len(size) > len(broadcast_to):
            raise TemplateUnsupported("bias of higher rank than the product")
        pad = len(broadcast_to) - len(size)
        size, stride = [1] * pad + size, [0] * pad + stride
        for s, t in zip(size, broadcast_to, strict=True):
            if s not in (1, t):
                raise TemplateUnsupported("bias does not broadcast to the product")
    elif len(size) != rank:
        raise TemplateUnsupported(f"operand of rank {len(size)}, expected {rank}")
    stride = [0 if s == 1 else st for s, st in zip(size, stride, strict=True)]
    if len(stride) == 2:
        stride = [0, *stride]
    return Operand(name, layout.dtype, (stride[0], stride[1], stride[2]), offset)


def problem_of(kernel: ExternKernel) -> MatmulProblem:
    """The GEMM an extern ``mm``/``addmm``/``bmm`` computes, or TemplateUnsupported with why."""
    op = TEMPLATE_OPS.get(kernel.op)
    if op is None:
        raise TemplateUnsupported(f"{kernel.op} is not a matmul the template takes")
    if len(kernel.outputs) != 1:
        raise TemplateUnsupported("more than one result")
    out = kernel.outputs[0]
    dtype = out.layout.dtype
    if dtype not in DTYPES:
        raise TemplateUnsupported(f"dtype {dtype}")
    kwargs = dict(kernel.kwargs)
    if op == "addmm":
        if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
            raise TemplateUnsupported("addmm with beta or alpha other than 1")
        bias_arg, a_arg, b_arg = kernel.args
    else:
        if kwargs:
            raise TemplateUnsupported(f"keyword arguments {sorted(kwargs)}")
        a_arg, b_arg = kernel.args
        bias_arg = None
    rank = 3 if op == "bmm" else 2
    osize = _static(out.layout.size, "size")
    a, b = _operand(a_arg, rank), _operand(b_arg, rank)
    if a.dtype != dtype or b.dtype != dtype:
        raise TemplateUnsupported("operands of another dtype than the result")
    batch = osize[0] if rank == 3 else 1
    m, n = osize[-2], osize[-1]
    asize, bsize = _static(a_arg.layout.size, "size"), _static(b_arg.layout.size, "size")
    k = asize[-1]
    if (
        asize[-2] != m
        or bsize[-2] != k
        or bsize[-1] != n
        or (rank == 3 and not asize[0] == bsize[0] == batch)
    ):
        raise TemplateUnsupported(f"operand sizes {asize} x {bsize} do not make {osize}")
    bias = _operand(bias_arg, 2, broadcast_to=[m, n]) if bias_arg is not None else None
    if bias is not None and bias.dtype != dtype:
        raise TemplateUnsupported("bias of another dtype than the result")
    if min(m, n, k, batch) < 1:
        raise TemplateUnsupported("an empty product")
    if batch > MAX_BATCH:
        raise TemplateUnsupported(f"batch {batch} above the grid's y limit")
    if max(batch * m * n, batch * m * k, batch * k * n) >= 2**31:
        raise TemplateUnsupported("operands of 2**31 elements or more (int32 index math)")
    ostride = _static(out.layout.stride, "stride")
    ostride = ostride if rank == 3 else [0, *ostride]
    if _static([out.layout.offset], "offset") != [0]:
        raise TemplateUnsupported("a result at a storage offset")
    return MatmulProblem(
        op, batch, m, n, k, a, b, bias, out.name, dtype, (ostride[0], ostride[1], ostride[2])
    )


# ------------------------------------------------------------------------------------------
# the template kernel


class _EpilogueGenerator(_Generator):
    """kernel.py's generator on a 2-D tiled plan over the product, where a load of the
    product at the position this lane computes is the accumulator itself (``acc_out``)."""

    def __init__(self, product: str, dtype: torch.dtype, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.product = product
        self.product_dtype = dtype

    def load(self, name: str, index: Any) -> TValue:
        if name != self.product:
            return super().load(name, index)
        expr, _ = self._index(index)
        if simplify(expr - self.flat_x, self.ranges) != 0:
            raise TemplateUnsupported(f"the epilogue reads the product at {expr}, not where it is computed")
        return TValue("acc_out", self.product_dtype, frozenset({"y", "x"}))


@dataclass(frozen=True)
class TemplateSpec:
    """A generated template kernel: the GEMM of ``problem`` with ``epilogue`` fused in."""

    name: str
    source: str
    params: tuple[str, ...]
    param_dtypes: tuple[torch.dtype, ...]
    problem: MatmulProblem
    configs: tuple[GemmConfig, ...]
    tf32: bool
    # no epilogue: the template stores the product itself, into a buffer the choice allocates
    # and passes last (``params[-1]`` is the product)
    lone: bool = False

    def grid(self, config: GemmConfig) -> tuple[int, int]:
        p = self.problem
        tiles = -(-p.m // config.BLOCK_M) * -(-p.n // config.BLOCK_N)
        return tiles, p.batch

    def constexprs(self, config: GemmConfig) -> dict[str, Any]:
        return {
            "BLOCK_M": config.BLOCK_M,
            "BLOCK_N": config.BLOCK_N,
            "BLOCK_K": config.BLOCK_K,
            "GROUP_M": config.GROUP_M,
            "EVEN_K": self.problem.k % config.BLOCK_K == 0,
        }


def _epilogue_body(
    problem: MatmulProblem,
    name: str,
    members: Sequence[ComputedBuffer],
    reads: Sequence[Set[str]],
    dtypes: dict[str, torch.dtype],
    internal: set[str],
    index_dtype: str,
) -> tuple[list[str], list[str]]:
    """(body lines, pointer params) of the epilogue, in the template's names."""
    if not members:
        raise TemplateUnsupported("no epilogue")
    plan = Plan("tiled", problem.n, problem.batch * problem.m)
    gen = _EpilogueGenerator(
        problem.out,
        problem.dtype,
        name,
        members,
        reads,
        dtypes,
        internal,
        plan,
        index_dtype=index_dtype,
        debug=False,
    )
    spec = gen.generate()
    if spec.atomic:
        raise TemplateUnsupported("an epilogue that writes with atomics")
    lines = spec.source.splitlines()
    head_end = lines.index("    xmask = xindex < xnumel")
    body = [
        re.sub(r"\bXBLOCK\b", "BLOCK_N", re.sub(r"\bYBLOCK\b", "BLOCK_M", line))
        for line in lines[head_end + 1 :]
    ]
    if "acc_out" not in "\n".join(body):
        raise TemplateUnsupported("the epilogue does not read the product")
    return body, list(spec.params)


def _operand_load(op: Operand, index: str, mask: str | None) -> str:
    load = f"tl.load(p_{op.name} + ({index}){', mask=' + mask + ', other=0.0' if mask else ''})"
    if op.dtype == torch.bfloat16 and interpreting():
        # Note [bfloat16 in the interpreter]: its tl.dot of bfloat16 is wrong; exact in float32
        return f"k_bf16_widen({load})"
    return load


def build_template(
    name: str,
    problem: MatmulProblem,
    members: Sequence[ComputedBuffer],
    reads: Sequence[Set[str]],
    dtypes: dict[str, torch.dtype],
    internal: set[str],
    *,
    index_dtype: str = "tl.int32",
) -> TemplateSpec:
    """The template kernel for ``problem`` with the pointwise ``members`` fused into its store
    (TemplateUnsupported when the epilogue cannot be fused; the node then runs as extern)."""
    if index_dtype != "tl.int32":
        raise TemplateUnsupported("int64 index math")
    p = problem
    lone = not members
    if lone:  # the product itself, stored where the extern's result would be
        sb, sm, sn = p.out_strides
        where = f"rm[:, None] * {sm} + rn[None, :] * {sn}"
        where = f"bid * {sb} + {where}" if p.batch > 1 else where
        body = [f"    tl.store(p_{p.out} + ({where}), {store_expr(p.dtype, 'acc_out')}, ymask & xmask)"]
        epilogue_params = [p.out]
    else:
        body, epilogue_params = _epilogue_body(problem, name, members, reads, dtypes, internal, index_dtype)
    a, b = p.a, p.b
    params: list[str] = []
    for n in [a.name, b.name, *([p.bias.name] if p.bias else []), *epilogue_params]:
        if n not in params:
            params.append(n)
    tf32 = p.dtype == torch.float32 and bool(torch.backends.cuda.matmul.allow_tf32) and not interpreting()
    precision = ""
    if p.dtype == torch.float32 or (p.dtype == torch.bfloat16 and interpreting()):
        precision = f', input_precision="{"tf32" if tf32 else "ieee"}"'
    batched = p.batch > 1
    a_base = f"{a.offset} + bid * {a.strides[0]}" if batched else f"{a.offset}"
    b_base = f"{b.offset} + bid * {b.strides[0]}" if batched else f"{b.offset}"
    k_left = "K - k * BLOCK_K"
    lines = [
        f"# {name}: {p.op} [{p.batch}, {p.m}, {p.k}] x [{p.batch}, {p.k}, {p.n}] {p.dtype}, "
        + (
            f"epilogue {', '.join(m.name for m in members)} fused into the store (Note [Matmul templates])"
            if members
            else "the product stored as the extern would return it (Note [Matmul templates])"
        ),
        "@triton.jit",
        f"def {name}({', '.join(f'p_{n}' for n in params)}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, "
        "BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):",
        f"    M = {p.m}",
        f"    N = {p.n}",
        f"    K = {p.k}",
        "    pid = tl.program_id(0)",
        "    bid = tl.program_id(1)" if batched else "    bid = 0",
        "    grid_m = (M + BLOCK_M - 1) // BLOCK_M",
        "    grid_n = (N + BLOCK_N - 1) // BLOCK_N",
        "    width = GROUP_M * grid_n",
        "    group_id = pid // width",
        "    group_size = tl.minimum(grid_m - group_id * GROUP_M, GROUP_M)",
        "    pid_m = group_id * GROUP_M + (pid % group_size)",
        "    pid_n = (pid % width) // group_size",
        "    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        # rows and columns past the end read a valid row instead (their results are masked at
        # the store), so the loads need no mask along M and N
        "    ram = rm % M",
        "    rbn = rn % N",
        "    rk = tl.arange(0, BLOCK_K)",
        f"    a_idx = ({a_base}) + ram[:, None] * {a.strides[1]} + rk[None, :] * {a.strides[2]}",
        f"    b_idx = ({b_base}) + rk[:, None] * {b.strides[1]} + rbn[None, :] * {b.strides[2]}",
        "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "    for k in range(0, tl.cdiv(K, BLOCK_K)):",
        "        if EVEN_K:",
        f"            a = {_operand_load(a, 'a_idx', None)}",
        f"            b = {_operand_load(b, 'b_idx', None)}",
        "        else:",
        f"            a = {_operand_load(a, 'a_idx', f'rk[None, :] < {k_left}')}",
        f"            b = {_operand_load(b, 'b_idx', f'rk[:, None] < {k_left}')}",
        f"        acc += tl.dot(a, b{precision})",
        f"        a_idx += BLOCK_K * {a.strides[2]}",
        f"        b_idx += BLOCK_K * {b.strides[1]}",
    ]
    if p.bias is not None:
        c = p.bias
        bias = f"tl.load(p_{c.name} + ({c.offset} + ram[:, None] * {c.strides[1]} + rbn[None, :] * {c.strides[2]}))"
        lines.append(f"    acc = acc + {load_expr(c.dtype, bias)}")
    # the product as the extern's result holds it: rounded to its dtype (compute type float32)
    rounded = convert_expr("acc", torch.float32, p.dtype) if p.dtype in HALF else "acc"
    lines += [
        f"    acc_out = {rounded}",
        "    yindex = (bid * M + rm)[:, None]" if batched else "    yindex = rm[:, None]",
        "    ymask = (rm < M)[:, None]",
        f"    ynumel = {p.batch * p.m}",
        "    xnumel = N",
        "    xindex = rn[None, :]",
        "    xmask = xindex < N",
        *body,
    ]
    configs = tuple(gemm_configs(p.m, p.n, p.k, p.dtype, interpreter=interpreting()))
    return TemplateSpec(
        name=name,
        source="\n".join(lines) + "\n",
        params=tuple(params),
        param_dtypes=tuple(dtypes[n] for n in params),
        problem=p,
        configs=configs,
        tf32=tf32,
        lone=lone,
    )


# ------------------------------------------------------------------------------------------
# the choice at run time


class MatmulChoice:
    """Runs one GEMM node: the extern call (+ the epilogue kernel), or the template, whichever
    the first call found fastest (Note [Matmul templates]).

    The wrapper calls ``choice(stream, views, template_args, epilogue_args)``: the extern op's
    arguments (tensors), the template's parameters and the epilogue kernel's parameters as the
    wrapper passes kernels their buffers (pointers on a GPU, flat storages under the
    interpreter), the product's slot in the latter left ``None``. A lone GEMM (no epilogue: a
    plain extern node) has no epilogue arguments, its template parameters stop before the
    product, and the call returns the product as the wrapper holds an extern's result
    (``allocate`` makes that buffer for the template)."""

    def __init__(
        self,
        kernel: ExternKernel,
        epilogue: Launcher | None,
        template: TemplateSpec | None,
        fn: Any,
        *,
        force: str | None,
        pointers: bool,
        conform: Callable[[torch.Tensor], Any],
        allocate: Callable[[], torch.Tensor] | None = None,
    ) -> None:
        self.kernel = kernel
        self.op = kernel.op
        self.kwargs = dict(kernel.kwargs)
        self.epilogue = epilogue
        self.template = template
        self.fn = fn
        self.slot = epilogue.spec.params.index(kernel.outputs[0].name) if epilogue is not None else -1
        self.force = force
        self.pointers = pointers
        self.conform = conform
        self.allocate = allocate
        self.chosen: GemmConfig | str | None = None
        self.timings_ms: dict[str, float] = {}
        self._run: Callable[[Any, tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]], Any] | None = None
        self._compiled: dict[GemmConfig, Callable[..., None]] = {}

    @property
    def name(self) -> str:
        if self.template is not None:
            return self.template.name
        return self.epilogue.spec.name if self.epilogue is not None else self.kernel.name

    def __call__(
        self, stream: Any, views: tuple[Any, ...], targs: tuple[Any, ...], eargs: tuple[Any, ...] = ()
    ) -> Any:
        if self._run is None:
            self._run = self._decide(stream, views, targs, eargs)
        return self._run(stream, views, targs, eargs)

    # the two ways ----------------------------------------------------------------------

    def run_extern(
        self, stream: Any, views: tuple[Any, ...], targs: tuple[Any, ...], eargs: tuple[Any, ...]
    ) -> Any:
        result = self.conform(self.op(*views, **self.kwargs))
        if self.epilogue is None:
            return result
        args = list(eargs)
        if self.pointers:
            args[self.slot] = result.data_ptr()
            self.epilogue.launch(stream, *args)
        else:
            args[self.slot] = result
            self.epilogue(*args)
        return None

    def template_runner(self, config: GemmConfig) -> Callable[..., Any]:
        """``run(stream, views, targs, eargs)`` launching the template with ``config``."""
        assert self.template is not None
        spec = self.template
        grid = spec.grid(config)
        constexprs = spec.constexprs(config)
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        allocate = self.allocate if spec.lone else None
        if spec.lone and allocate is None:
            raise ValueError("a lone GEMM's template needs allocate")
        if not self.pointers:
            runner = self.fn[grid]

            def run_interpreted(stream: Any, views: Any, targs: Any, eargs: Any) -> Any:
                if allocate is None:
                    runner(*targs, **constexprs, **options)
                    return None
                out = allocate()
                runner(*targs, out, **constexprs, **options)
                return out

            return run_interpreted
        if config not in self._compiled:
            # a GPU: compiled once, launched through Triton's launcher with the grid bound
            # (the fallback form of runtime.py's Note [The launch path])
            compiled = self.fn.warmup(*spec.param_dtypes, grid=(1,), **constexprs, **options)
            signature = compiled.src.signature
            pointers = {f"p_{n}": i for i, n in enumerate(spec.params)}
            order: list[tuple[str, Any]] = []
            for arg in compiled.src.fn.arg_names:
                if arg in pointers:
                    order.append(("ptr", pointers[arg]))
                elif arg in signature:
                    order.append(("const", constexprs[arg]))
            run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
            gx, gy = grid

            def launch(stream: int, targs: tuple[Any, ...]) -> None:
                args = [targs[v] if kind == "ptr" else v for kind, v in order]
                run(gx, gy, 1, stream, function, metadata, None, None, None, *args)

            self._compiled[config] = launch
        launch = self._compiled[config]

        def run_compiled(stream: Any, views: Any, targs: Any, eargs: Any) -> Any:
            if allocate is None:
                launch(stream, targs)
                return None
            out = allocate()
            launch(stream, (*targs, out.data_ptr()))
            return out

        return run_compiled

    # the decision ----------------------------------------------------------------------

    def _key(self, device: str) -> str:
        import triton

        assert self.template is not None
        text = json.dumps(
            [
                self.template.source,
                self.epilogue.spec.source if self.epilogue is not None else "",
                str(self.op),
                device,
                triton.__version__,
                [c.label() for c in self.template.configs],
                self.template.tf32,
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def _decide(self, stream: Any, views: Any, targs: Any, eargs: Any) -> Callable[..., Any]:
        if self.template is None:
            self.chosen = "extern"
            return self.run_extern
        if self.force == "template":
            self.chosen = self.template.configs[0]
            return self.template_runner(self.chosen)
        if self.force == "extern" or not self.pointers:
            self.chosen = "extern"  # nothing to time under the interpreter
            return self.run_extern
        device = torch.cuda.get_device_name()
        path = cache_dir() / "autotune" / f"{self._key(device)}.json"
        by_label = {c.label(): c for c in self.template.configs}
        if path.exists():
            try:
                record = json.loads(path.read_bytes())
                label = record["choice"]
                if label != "extern" and label not in by_label:
                    raise KeyError(label)
            except (ValueError, KeyError, TypeError) as exc:
                counters["corrupt"] += 1
                cache_log.warning(
                    "kiln: corrupt template record %s (%r); timing %s again", path, exc, self.name
                )
            else:
                counters["autotune_hits"] += 1
                self.chosen = "extern" if label == "extern" else by_label[label]
                self.timings_ms = dict(record.get("timings_ms", {}))
                return self.run_extern if label == "extern" else self.template_runner(by_label[label])
        import triton.testing

        candidates: dict[str, Callable[..., Any]] = {"extern": self.run_extern}
        for config in self.template.configs:
            try:
                candidates[config.label()] = self.template_runner(config)
            except Exception as exc:  # a config the compiler rejects (shared memory, registers)
                log.debug("%s: %s does not compile: %s", self.name, config.label(), exc)
        timings: dict[str, float] = {}
        for label, run in candidates.items():
            try:
                # one call first: the epilogue kernel's own first call may tune its config, a
                # template's loads its binary; neither belongs in the timing
                run(stream, views, targs, eargs)
                timings[label] = float(
                    triton.testing.do_bench(
                        lambda run=run: run(stream, views, targs, eargs), warmup=5, rep=25
                    )
                )
            except Exception as exc:
                log.debug("%s: %s failed: %s", self.name, label, exc)
                timings[label] = math.inf
        best = min(timings, key=lambda label: (timings[label], label != "extern"))
        if best != "extern" and not timings[best] < TEMPLATE_MARGIN * timings["extern"]:
            best = "extern"  # within the timing's noise of the extern call: keep cuBLAS
        self.timings_ms = timings
        self.chosen = "extern" if best == "extern" else by_label[best]
        log.debug(
            "%s: %s chosen (%s)",
            self.name,
            best,
            ", ".join(f"{label} {t:.4f}ms" for label, t in timings.items()),
        )
        record = {"kernel": self.name, "choice": best, "timings_ms": timings}
        write_atomic(path, json.dumps(record, indent=1))
        counters["autotuned"] += 1
        return candidates[best]
