"""The reference interpreter: runs a schedule with torch, a whole index grid at a time.

A kernel's body is called once, not once per element. Loop variable ``x_i`` is bound to an
``arange`` shaped to broadcast along grid dimension ``i`` (reduction variables take the trailing
grid dimensions), so every ``ops.*`` value is a tensor that broadcasts against the grid: an index
expression evaluates (:func:`evaluate`) to a tensor of offsets, a ``load`` gathers from the
buffer's flat storage at those offsets, a ``store`` scatters into it, a ``reduction`` reduces the
trailing (reduction) dimensions. Loads clamp their offsets into the storage, because a masked
body (padding, cat) is evaluated everywhere and its out-of-range results are discarded by the
mask. The interpreter follows the schedule's order and buffer plan exactly (kernel-internal
buffers are temporaries dropped after their kernel; reused buffers share memory), so it checks
fusion order and reuse as well as lowerings; it does not check what only a code generator could
get wrong (e.g. that a fused loop nest is nested correctly).

Conventions every backend follows: ``mod`` and ``fmod`` truncate (C), ``remainder`` and
``floordiv`` floor (Python); ``maximum``/``minimum`` propagate NaN; ``round`` is half-to-even.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy
import torch

from .backend import Backend
from .graph import GraphLowering
from .indexing import FloorDiv, ModularIndexing, loop_vars
from .ir import Buffer, ComputedBuffer, ExternKernel, ReinterpretView, Scatter
from .layout import Layout
from .scheduler import BaseSchedulerNode, ExternKernelSchedulerNode, Scheduler
from .virtualized import set_ops_handler

Value = torch.Tensor


def evaluate(expr: sympy.Expr, env: Mapping[sympy.Symbol, Any]) -> Any:
    """A sympy index expression as a tensor (or int), variables taken from ``env``."""
    if expr.is_Integer:
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return env[expr]
    args = [evaluate(a, env) for a in expr.args]
    if isinstance(expr, sympy.Add):
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if isinstance(expr, sympy.Mul):
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if isinstance(expr, FloorDiv):
        return args[0] // args[1]
    if isinstance(expr, ModularIndexing):
        return (args[0] // args[1]) % args[2]
    if isinstance(expr, sympy.Mod):  # Python's modulus, as torch's % on tensors and ints
        return args[0] % args[1]
    if isinstance(expr, sympy.Min):
        return _fold(torch.minimum, args)
    if isinstance(expr, sympy.Max):
        return _fold(torch.maximum, args)
    if isinstance(expr, sympy.Pow) and expr.args[1].is_Integer and int(expr.args[1]) > 0:
        return args[0] ** int(expr.args[1])
    raise NotImplementedError(f"index expression {expr} ({type(expr).__name__})")


def _fold(fn: Callable[[Any, Any], Any], args: list[Any]) -> Any:
    out = torch.as_tensor(args[0])
    for a in args[1:]:
        out = fn(out, torch.as_tensor(a))
    return out


MATH: dict[str, Callable[..., Value]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "mod": torch.fmod, "fmod": torch.fmod, "remainder": torch.remainder, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "logical_not": torch.logical_not, "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "bitwise_not": torch.bitwise_not,
    "bitwise_left_shift": torch.bitwise_left_shift, "bitwise_right_shift": torch.bitwise_right_shift,
    "atan2": torch.atan2, "copysign": torch.copysign, "hypot": torch.hypot, "nextafter": torch.nextafter,
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "log": torch.log, "log1p": torch.log1p, "log2": torch.log2, "log10": torch.log10,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh,
    "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "sign": torch.sign, "isnan": torch.isnan, "isinf": torch.isinf, "relu": torch.relu,
    "reciprocal": torch.reciprocal, "square": torch.square, "lgamma": torch.lgamma,
    "signbit": torch.signbit, "frac": torch.frac,
}  # fmt: skip


class GridHandler:
    """``ops`` handler over tensors; one instance runs one node's body once."""

    def __init__(
        self, storage: dict[str, Value], env: dict[sympy.Symbol, Any], grid: Sequence[int], nx: int
    ) -> None:
        self.storage = storage
        self.env = env
        self.grid = list(grid)
        self.nx = nx
        self._indirect = 0

    def __getattr__(self, name: str) -> Callable[..., Value]:
        fn = MATH.get(name)
        if fn is None:
            raise AttributeError(f"interpreter has no op {name!r}")
        return fn

    def _index(self, index: sympy.Expr) -> Any:
        return evaluate(sympy.sympify(index), self.env)

    def load(self, name: str, index: sympy.Expr) -> Value:
        flat = self.storage[name]
        offsets = torch.as_tensor(self._index(index))
        if flat.numel() == 0:
            return torch.zeros(offsets.shape, dtype=flat.dtype)
        return flat[offsets.clamp(0, flat.numel() - 1)]

    def _scatter(
        self, name: str, index: sympy.Expr, value: Value, mode: str | None, shape: Sequence[int]
    ) -> None:
        flat = self.storage[name]
        offsets = torch.as_tensor(self._index(index))
        value = torch.as_tensor(value).to(flat.dtype)
        offsets, value = torch.broadcast_tensors(offsets, value)
        offsets, value = offsets.broadcast_to(shape).reshape(-1), value.broadcast_to(shape).reshape(-1)
        flat.index_put_((offsets,), value, accumulate=mode == "atomic_add")

    def store(self, name: str, index: sympy.Expr, value: Value, mode: str | None = None) -> None:
        self._scatter(name, index, value, mode, self.grid[: self.nx] + [1] * (len(self.grid) - self.nx))

    def store_reduction(self, name: str, index: sympy.Expr, value: Value) -> None:
        self._scatter(name, index, value, None, self.grid[: self.nx] + [1] * (len(self.grid) - self.nx))

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Value) -> Any:
        xshape = self.grid[: self.nx]
        nr = len(self.grid) - self.nx
        keep = [*xshape, *([1] * nr)]
        if reduction_type == "welford_combine":  # Chan's formula over the partial triples
            means, m2s, weights = (
                torch.as_tensor(t).to(dtype).broadcast_to(self.grid).reshape(*xshape, -1) for t in value
            )
            weight = weights.sum(-1)
            mean = (means * weights).sum(-1) / weight
            m2 = m2s.sum(-1) + (weights * (means - mean.unsqueeze(-1)) ** 2).sum(-1)
            return tuple(t.reshape(keep) for t in (mean, m2, weight))
        v = torch.as_tensor(value).broadcast_to(self.grid).reshape(*xshape, -1)
        if reduction_type == "welford_reduce":
            v = v.to(dtype)
            mean = v.mean(-1) if v.shape[-1] else torch.full(xshape, math.nan, dtype=dtype)
            m2 = ((v - mean.unsqueeze(-1)) ** 2).sum(-1)
            weight = torch.full(xshape, v.shape[-1], dtype=dtype)
            return tuple(t.reshape(keep) for t in (mean, m2, weight))
        reduce = REDUCTIONS[reduction_type]
        return reduce(v).to(dtype).reshape(keep)

    def getitem(self, value: tuple[Value, ...], index: int) -> Value:
        return value[index]

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> Value:
        return torch.as_tensor(self._index(expr)).to(dtype)

    def indirect_indexing(self, value: Value, size: Any, check: bool = True) -> sympy.Symbol:
        self._indirect += 1
        symbol = sympy.Symbol(f"indirect{self._indirect}", integer=True)
        v = torch.as_tensor(value).long()
        self.env[symbol] = torch.where(v < 0, v + int(size), v)
        return symbol

    def masked(self, mask: Value, body: Callable[[], Value], other: Any) -> Value:
        value = torch.as_tensor(body())
        return torch.where(torch.as_tensor(mask).bool(), value, torch.as_tensor(other, dtype=value.dtype))

    def where(self, cond: Value, a: Value, b: Value) -> Value:
        return torch.where(torch.as_tensor(cond).bool(), a, b)

    def constant(self, value: Any, dtype: torch.dtype) -> Value:
        return torch.tensor(value, dtype=dtype)

    def to_dtype(self, value: Value, dtype: torch.dtype) -> Value:
        return torch.as_tensor(value).to(dtype)


REDUCTIONS: dict[str, Callable[[Value], Value]] = {
    "sum": lambda v: v.sum(-1),
    "prod": lambda v: v.prod(-1),
    "max": lambda v: v.amax(-1),
    "min": lambda v: v.amin(-1),
    "argmax": lambda v: (v.to(torch.uint8) if v.dtype == torch.bool else v).argmax(-1),
    "argmin": lambda v: (v.to(torch.uint8) if v.dtype == torch.bool else v).argmin(-1),
    "any": lambda v: v.bool().any(-1),
}


def run_computed(buffer: ComputedBuffer, storage: dict[str, Value]) -> None:
    """Run one computed buffer's body over its whole grid."""
    ranges, rranges = buffer.iteration()
    grid = [int(s) for s in (*ranges, *rranges)]
    if math.prod(int(s) for s in ranges) == 0:
        return
    xs, rs = loop_vars("x", len(ranges)), loop_vars("r", len(rranges))
    env: dict[sympy.Symbol, Any] = {}
    for i, var in enumerate([*xs, *rs]):
        shape = [1] * len(grid)
        shape[i] = grid[i]
        env[var] = torch.arange(grid[i]).reshape(shape)
    with set_ops_handler(GridHandler(storage, env, grid, len(ranges))):
        buffer.body()(xs, rs)


def run_members(members: Sequence[ComputedBuffer], storage: dict[str, Value]) -> None:
    """Run a kernel's members in order over ``storage`` (flat storages by buffer name): how a
    code generator's wrapper runs a kernel it declined. A scatter's name is first bound to the
    buffer it writes into (Scatter's docstring), since later members read the scattered result
    by the scatter's name."""
    for buffer in members:
        if isinstance(buffer, Scatter):
            storage[buffer.name] = storage[buffer.mutates]
        run_computed(buffer, storage)


def members_runner(members: Sequence[ComputedBuffer]) -> Callable[[dict[str, torch.Tensor]], None]:
    """What a wrapper binds to run a kernel it declined (Note [A kernel step in a wrapper] in
    wrapper_support.py): :func:`run_members` over the storage it is given, on CPU copies of what
    lives on another device (a GPU's buffers), copied back after; CPU storage is run in place."""

    def run(storage: dict[str, torch.Tensor]) -> None:
        local = {k: v.cpu() for k, v in storage.items()}
        run_members(members, local)
        for k, v in storage.items():
            if v.data_ptr() != local[k].data_ptr():
                v.copy_(local[k])

    return run


def flat_storage(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The 1-D storage a tensor with ``layout`` lives in (from storage offset 0)."""
    return t.as_strided((int(layout.storage_size()),), (1,), 0)


def as_view(flat: torch.Tensor, layout: Layout) -> torch.Tensor:
    return flat.as_strided(layout.int_size(), layout.int_stride(), int(layout.offset))


def conform(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``t`` if it has ``layout``'s strides and offset, else a copy that has them."""
    if list(t.stride()) == layout.int_stride() and t.storage_offset() == int(layout.offset):
        return t
    out = torch.empty(int(layout.storage_size()), dtype=t.dtype, device=t.device)
    view = as_view(out, layout)
    view.copy_(t)
    return view


class InterpretBackend(Backend):
    """The ``"interpret"`` backend; see the module docstring."""

    name = "interpret"
    inplace_buffers = True  # each member's loads are evaluated before its store
    checks_indices = True  # Note [Dead index writes keep their bounds check] (scheduler.py)

    def codegen_kernel(self, node: BaseSchedulerNode, graph: GraphLowering) -> Any:
        members = node.members()

        def kernel(storage: dict[str, Value]) -> None:
            run_members(members, storage)  # a scatter's name is bound already: bound again

        return kernel

    def codegen_wrapper(
        self, schedule: Scheduler, graph: GraphLowering, kernels: dict[str, Any]
    ) -> Callable[..., Any]:
        plan = schedule.plan
        steps = list(enumerate(schedule.nodes))

        def run(*args: Any) -> Any:
            storage: dict[str, Value] = {}
            check_inputs(graph, args)
            for spec, arg in zip(graph.graph_inputs, args, strict=True):
                if spec is not None:
                    storage[spec.name] = flat_storage(conform(arg, spec.layout), spec.layout)
            for name, value in graph.constants.items():
                storage[name] = flat_storage(value, graph.name_to_buffer[name].layout)
            for step, node in steps:
                if isinstance(node, ExternKernelSchedulerNode):
                    _run_extern(node.node, storage, graph)
                else:
                    for m in node.get_nodes():
                        buffer = getattr(m, "node", None)
                        if isinstance(buffer, Scatter):
                            storage[buffer.name] = storage[buffer.mutates]
                        elif isinstance(buffer, ComputedBuffer):
                            reuse = plan.allocate.get(buffer.name)
                            size = int(buffer.layout.storage_size())
                            storage[buffer.name] = (
                                storage[reuse] if reuse else torch.empty(size, dtype=buffer.layout.dtype)
                            )
                    if node.name in kernels:  # a no-op node (no elements) only needs its buffer
                        kernels[node.name](storage)
                for name in plan.internal.get(step, ()):
                    storage.pop(name, None)
            return _outputs(graph.outputs, storage)

        return run


def check_inputs(graph: GraphLowering, args: Sequence[Any]) -> None:
    """Refuse inputs the graph was not compiled for (a different shape would read out of place;
    a different non-tensor input was baked in as a constant)."""
    if len(args) != len(graph.graph_inputs):
        raise TypeError(f"compiled graph takes {len(graph.graph_inputs)} inputs, got {len(args)}")
    specs = zip(graph.graph_inputs, args, graph.example_inputs, strict=True)
    for i, (spec, arg, example) in enumerate(specs):
        if spec is None:
            if arg != example:
                raise ValueError(f"input {i} was compiled as the constant {example!r}, got {arg!r}")
            continue
        if not isinstance(arg, torch.Tensor):
            raise TypeError(f"input {i} must be a tensor, got {type(arg).__name__}")
        if list(arg.shape) != spec.layout.int_size() or arg.dtype != spec.layout.dtype:
            raise ValueError(
                f"input {i} ({spec.name}) was compiled for {spec.layout.int_size()} {spec.layout.dtype}, "
                f"got {list(arg.shape)} {arg.dtype}"
            )


def _to_tensor(value: Any, storage: dict[str, Value]) -> Any:
    if isinstance(value, ReinterpretView):
        return as_view(storage[value.buffer.name], value.layout)
    if isinstance(value, Buffer):
        return as_view(storage[value.name], value.layout)
    if isinstance(value, list | tuple):
        return type(value)(_to_tensor(v, storage) for v in value)
    return value


def _run_extern(kernel: ExternKernel, storage: dict[str, Value], graph: GraphLowering) -> None:
    args = _to_tensor(kernel.args, storage)
    kwargs = {k: _to_tensor(v, storage) for k, v in kernel.kwargs.items()}
    if "device" in kwargs:
        kwargs["device"] = graph.device
    result = kernel.op(*args, **kwargs)
    for out in kernel.outputs:
        value = result
        for i in out.path:
            value = value[i]
        if list(value.shape) != out.layout.int_size():
            # a data-dependent shape (nonzero, masked_select) was fixed from the example inputs
            raise RuntimeError(
                f"{kernel.op} returned shape {list(value.shape)}, compiled for {out.layout.int_size()}: "
                "its output shape depends on the data; compile again for these inputs"
            )
        storage[out.name] = flat_storage(conform(value, out.layout), out.layout)


def _outputs(value: Any, storage: dict[str, Value]) -> Any:
    return _to_tensor(value, storage)
