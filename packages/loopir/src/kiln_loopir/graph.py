"""GraphLowering: walks an aten-level FX graph and builds the IR, node by node.

Placeholders become :class:`~kiln_loopir.ir.InputBuffer`, ``get_attr`` tensors become
:class:`~kiln_loopir.ir.ConstantBuffer`, and each ``call_function`` node goes through its lowering
(``lowering.find_lowering``) or, when there is none or it declines, the extern fallback. The
result of a node is a TensorBox (or a tuple of them); buffers are registered in creation order in
``operations``, which is the order the scheduler starts from.

Every node also gets a meta value (shape, dtype, strides): from ``node.meta["val"]`` when the
graph carries one, otherwise by running the op on ``device="meta"`` tensors, and, for ops whose
meta kernel cannot say (data-dependent shapes), by running the graph once on the example
inputs. A lowering whose result disagrees with the meta value is discarded in favour of the
fallback, and the disagreement is recorded in ``fallbacks``.

Note [Complex values run as extern kernels]: no code generator has complex arithmetic (Triton
has no complex type; the C++ backend declines it too), and a kernel that reads or writes a
complex buffer would run in the reference interpreter. So a node with a complex input or output
is not lowered: it runs as the aten op itself, an extern kernel (torch.compile's inductor also
falls back for complex ops), and complex values never reach a kernel. ``KILN_LOG=ir`` says
which nodes.

Note [Mutation]: in-place and ``out=`` aten ops have no lowering; they run as extern kernels on
realized buffers (so a mutated input is mutated for the caller, as eagerly). Before such a node,
every pending lazy value is realized, and the scheduler orders the mutation after every earlier
reader of the buffers it is given and before every later one.

Note [Why a value is realized] (the realize heuristic, ``mark_reuse``): pointwise values stay
lazy and are inlined into each reader, except a value that (a) is a graph output (when it is
computed, where other nodes read it and it loads more than one buffer: Note [Outputs read back],
else at the graph's end), (b) feeds an
extern kernel, (c) has more than one reader (not counting ``SHAPE_ONLY_READERS``) and a large body (> ``MAX_INLINE_OPS`` ops) or many
loads (> ``MAX_REUSE_LOADS``), (d) reads more than ``MAX_LOADS`` buffers, or (e) has a body of more
than ``MAX_CHAIN_OPS`` ops (a long chain of single-reader ops would otherwise inline into one
deeply recursive function), or (f) calls a transcendental function (``TRANSCENDENTAL``) and has a
reader that broadcasts it over more elements: LLaMA's rotary cos/sin, [seq, dim], inlined into
q and k, [batch, heads, seq, dim], computed each sine batch x heads times. A reader whose output
is larger but that loads each input element at most once (``SINGLE_READ_OPS``: ``cat``, padding)
does not broadcast while its output has at most ``MASKED_READ_FACTOR`` times the value's elements
and no view on the way (``expand``) grew them: ``cat([x.sin(), x.cos()])`` is one kernel, not a
kernel for sin and cos and one for the cat. Reductions are always realized. With
``fusion=False`` every node's value is realized, so each op is its own kernel.
"""

from __future__ import annotations

import logging
import operator
import os
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx
from kiln_symbolic import FLOAT_OF_CALL, INT_OF_FLOAT_CALL, expr_of

from . import origins
from .indexing import FloorDiv, contiguous_strides
from .ir import (
    Buffer,
    ConstantBuffer,
    ExternKernel,
    InputBuffer,
    Operation,
    Pointwise,
    ReinterpretView,
    StorageBox,
    TensorBox,
    carried,
    realize_strided,
)
from .layout import FixedLayout, fixed_from_tensor, symbolic
from .lowering import (
    READS_STORAGE,
    VIEW_OPS,
    Unsupported,
    copy_with_strides,
    eager_refuses,
    fallback,
    find_lowering,
    is_view_op,
)
from .sizevars import SizeVars, SymbolSource, has_symbols, to_loopir, using
from .sizevars import hint as sizevars_hint
from .virtualized import count_ops, op_names, set_graph
from .wrapper_support import dense_tensor

log = logging.getLogger("kiln.loopir.ir")
fallbacks_log = logging.getLogger("kiln.loopir.fallbacks")

MAX_INLINE_OPS = 30
TRANSCENDENTAL = frozenset(
    {
        "exp",
        "exp2",
        "expm1",
        "log",
        "log1p",
        "log2",
        "log10",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "atan2",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "erf",
        "erfc",
        "erfinv",
        "pow",
        "sigmoid",
        "gelu",
        "silu",
        "lgamma",
        "digamma",
    }
)
# Note [Why a value is realized] (f): readers whose output outsizes an input without reading any
# of its elements twice (each output element loads at most one element of one input). Their
# kernels still evaluate an inlined input on every output element (a masked load, then ``where``),
# so the excuse holds only while the output has at most ``MASKED_READ_FACTOR`` times the input's
# elements: a cat of two halves computes each sine at most twice; a cat of eight does not inline.
SINGLE_READ_OPS = frozenset({torch.ops.aten.cat.default, torch.ops.aten.constant_pad_nd.default})
MASKED_READ_FACTOR = 2
MAX_REUSE_LOADS = 4
MAX_LOADS = 8
# Note [Outputs read back]: a graph output is written whatever its readers do, and was realized at
# the graph's end only, after every reader in the graph had inlined its body: each recomputed it
# from everything it loads. A training forward returns the residual stream's sums for the
# backward (aotgrad's Note [Recomputing from many values]) and reads each one again for the next
# layer: LLaMA's forward recomputed `h_3 = emb[ids] + a_0 + m_0 + a_1` (the gather again, four
# loads) in the third norm's kernel though `h_2` was written, and wrote `h_1`, `h_2` there too
# (the scheduler's Note [Outputs fused across the graph] put their writes where their loads
# were). So an output that other nodes read and whose body loads more than one buffer is realized
# when it is computed, and its readers load it: one load instead of its loads, no recomputation.
# An output of a single load (a scaled input, say) stays inlined: reading it back would cost what
# recomputing it costs. Option ``outputs_read_back`` (PassOptions); off: outputs are realized at
# the graph's end only.
# Note [Why a value is realized] (c): readers that take a value's size, dtype and device and never
# an element. ``_safe_softmax`` decomposes to ``where(no_row_all_masked, softmax(x),
# full_like(softmax(x), 0))``: the softmax has two fx readers but one that loads it, so it can
# inline into the ``where`` instead of being stored and read back (Swin's window attention: 4 of
# its forward's kernels). Option ``shape_only_readers`` (PassOptions), OFF by default: on that
# graph the one kernel gets slower, not faster (rows of 16, 1024 rows, one thread: 400 against
# 300 us, three interleaved rounds; Swin's 4 kernels 0.31 -> 0.41 ms a step in a profile), although
# it stores one buffer fewer and every loop is still vectorized (-fopt-info-vec); the `any`
# reduction then joins the sum's blocked loop instead of the softmax's store loop. Not diagnosed.
SHAPE_ONLY_READERS = frozenset(
    {
        torch.ops.aten.full_like.default,
        torch.ops.aten.zeros_like.default,
        torch.ops.aten.ones_like.default,
        torch.ops.aten.empty_like.default,
        torch.ops.aten.new_zeros.default,
        torch.ops.aten.new_ones.default,
        torch.ops.aten.new_full.default,
        torch.ops.aten.new_empty.default,
        torch.ops.aten.new_empty_strided.default,
    }
)
MAX_CHAIN_OPS = 200


# Note [The device of a graph of meta inputs]: a graph compiled from meta example inputs (symbolic
# sizes traced on meta tensors, as the code generators' tests do) says nothing of where it will
# run; ``gm.meta[GRAPH_DEVICE]`` names it (a graph with real or fake inputs is where they are).
GRAPH_DEVICE = "graph_device"


def graph_device(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.device:
    """Where the graph computes: its first tensor input's device; for a graph without tensor
    inputs (it only creates tensors), the first device a creation op asks for; else the CPU. A
    graph of meta (or no) inputs that names a device in ``gm.meta[GRAPH_DEVICE]`` computes there
    (Note [The device of a graph of meta inputs]).
    The code generator is chosen by this device (Note [One device per graph])."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    device = tensors[0].device if tensors else None
    asked_for = getattr(gm, "meta", {}).get(GRAPH_DEVICE)
    if asked_for is not None and (device is None or device.type == "meta"):
        return torch.device(asked_for)
    if device is None:
        for node in gm.graph.nodes:
            asked = node.kwargs.get("device") if node.op == "call_function" else None
            if isinstance(asked, torch.device | str):
                device = torch.device(asked)
                break
    if device is None or device.type == "meta":
        return torch.device("cpu")
    return device


class DeviceMismatch(NotImplementedError):
    """A graph returns a tensor of another device than its own (Note [One device per graph])."""


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def check_output_devices(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], device: torch.device
) -> None:
    """Note [One device per graph]: the code generator is chosen for the graph's device
    (:func:`graph_device`), and its wrapper allocates every buffer there, so a value created for
    another device (``torch.arange(n)`` without a device in a CUDA graph, a CUDA ``full`` in a
    graph of CPU inputs) is computed on the graph's device: the same values, read by the graph's
    kernels where they live. What must not happen is that such a value leaves the graph on the
    wrong device: an output whose eager value lives elsewhere makes the graph refused with this
    error, and the backend runs it eagerly (the umbrella's fallback). "meta" values are not
    checked (loopir's tests use them for a device this machine lacks), nor are values traced on
    another device than the inputs now given (a graph traced on the CPU and compiled for CUDA
    inputs: its placeholders' values say where it was traced, not where it runs)."""
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if output is None:
        return
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, given in zip(placeholders, example_inputs, strict=False):
        traced = node.meta.get("val")
        tensors = isinstance(traced, torch.Tensor) and isinstance(given, torch.Tensor)
        if tensors and not _same_device(traced.device, given.device):
            return
    for node in output.all_input_nodes:
        val = node.meta.get("val")
        for leaf in val if isinstance(val, list | tuple) else (val,):
            if (
                isinstance(leaf, torch.Tensor)
                and leaf.device.type != "meta"
                and not _same_device(leaf.device, device)
            ):
                raise DeviceMismatch(
                    f"output {node.name} ({node.format_node()}) lives on {leaf.device} in eager, the graph "
                    f"computes on {device}: kiln compiles graphs whose outputs live on the graph's device"
                )


# Note [Outputs only the backward reads]: a training forward graph returns the user's outputs and
# then the activations it saves for the backward graph. Only the first are seen by the user, so
# only they must have eager's strides; a saved activation may leave in the layout the graph
# computed it in (channels-last around convolutions), if the backward graph is compiled for that
# layout. The caller that compiles both graphs (kiln_aotgrad through kiln's backend) lists those
# outputs' positions under this key of the forward GraphModule's ``meta``, and reads the strides
# each output got from ``CompiledGraph.output_strides`` to restride the backward's example inputs
# (as torch.compile's AOTAutograd does with inductor's forward output strides).
FREE_LAYOUT_OUTPUTS = "free_layout_outputs"


def free_layout_outputs(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Positions of ``gm``'s outputs whose strides are the compiler's choice (Note [Outputs only
    the backward reads])."""
    return frozenset(getattr(gm, "meta", {}).get(FREE_LAYOUT_OUTPUTS, ()))


# Note [Backward inputs laid out by their forward]: the other half of the contract above. A
# backward graph's input that the caller lists under this key of the graph's ``meta`` is a saved
# value the compiled forward returned in exactly the shape, strides and dtype the backward is
# compiled for (kiln_aotgrad: Note [Backward inputs the forward laid out]), so a wrapper need
# check only its storage offset, which nothing else fixes. ``KILN_LAID_OUT_INPUTS=0`` (read when a
# wrapper is generated, as when aotgrad compiles) makes the list empty: every input checked in full.
LAID_OUT_INPUTS = "laid_out_inputs"


def laid_out_inputs(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Positions of ``gm``'s inputs laid out by the compiled forward (Note [Backward inputs laid
    out by their forward]); empty under ``KILN_LAID_OUT_INPUTS=0``."""
    if os.environ.get("KILN_LAID_OUT_INPUTS", "1") == "0":
        return frozenset()
    return frozenset(getattr(gm, "meta", {}).get(LAID_OUT_INPUTS, ()))


class GraphLowering:
    """Lowers one FX graph; see the module docstring."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        fusion: bool = True,
        channels_last: set[torch.fx.Node] | None = None,
        extern_ops: set[Any] | None = None,
        shape_only_readers: bool = False,
        outputs_read_back: bool = True,
        pool_values_max: bool = True,
        conv_grad_formats: dict[torch.fx.Node, torch.memory_format] | None = None,
        nchw_conv_backwards: set[torch.fx.Node] | None = None,
        native_convs: set[torch.fx.Node] | None = None,
        nhwc_weights: bool | None = None,
    ) -> None:
        self.gm = gm
        self.shape_only_readers = shape_only_readers  # Note [Why a value is realized] (c)
        self.outputs_read_back = outputs_read_back  # Note [Outputs read back]
        # Note [Max pooling values without their indices] (lowerings/pooling.py)
        self.pool_values_max = pool_values_max
        self.example_inputs = list(example_inputs)
        self.fusion = fusion
        self.device = graph_device(gm, self.example_inputs)
        check_output_devices(gm, self.example_inputs, self.device)
        self.operations: list[Operation] = []
        self.name_to_buffer: dict[str, Buffer] = {}
        self.graph_inputs: list[InputBuffer | None] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.outputs: Any = None
        self.fallbacks: list[tuple[str, str]] = []
        self.current_meta: Any = None
        self.current_node: torch.fx.Node | None = None
        # Note [Symbolic refusals name the op] (compile.py): the ShapeEnv whose guards lowering
        # must not add, and the first node that added one
        self.shape_env: Any = None
        self.specialized_by: torch.fx.Node | None = None
        # Note [Channels-last for convolutions] (passes/channels_last.py): decided by the layout
        # pass; a GraphLowering built directly applies its device's rule with default options
        if channels_last is None:
            from .passes import PassContext, PassOptions
            from .passes.channels_last import channels_last_nodes

            ctx = PassContext(self.device, PassOptions(), self.example_inputs, not torch.is_grad_enabled())
            channels_last = channels_last_nodes(gm, ctx)
            if nhwc_weights is None:
                from .passes.channels_last import nhwc_weights as weights_rule

                nhwc_weights = weights_rule(ctx, channels_last)
        self.channels_last: set[torch.fx.Node] = channels_last
        # Note [Convolution weights in NHWC] (passes/channels_last.py)
        self.nhwc_weights = bool(nhwc_weights)
        # Note [A convolution backward's gradient in oneDNN's format] (passes/channels_last.py)
        self.conv_grad_formats = conv_grad_formats or {}
        # Note [Depthwise convolution backwards on small maps] (passes/channels_last.py)
        self.nchw_conv_backwards = nchw_conv_backwards or set()
        self.native_convs = native_convs or set()  # Note [Small convolutions outside oneDNN]
        # aten ops (or single fx nodes) an option sends to eager's kernels (PassContext.extern_ops)
        self.extern_ops: set[Any] = extern_ops or set()
        self._counter = 0
        self._real_env: dict[torch.fx.Node, Any] | None = None
        self._eager_layouts: frozenset[torch.fx.Node] | None = None  # keeps_eager_layout
        # Note [Symbolic sizes in loopir]
        self.sizevars = SizeVars()

    def keeps_eager_layout(self, node: Any) -> bool:
        """Whether fx node ``node``'s value must be laid out as eager lays it, not as a lowering
        that reads it would like (Note [A layout only lowerings read] in lowerings/linalg.py): its
        storage leaves the graph as a user's output, or is read by a ``READS_STORAGE`` op."""
        if not isinstance(node, torch.fx.Node):
            return False
        if self._eager_layouts is None:
            self._eager_layouts = eager_layout_roots(self.gm)
        return view_root(node) in self._eager_layouts

    # names and registration -----------------------------------------------------------------

    def new_buffer_name(self, prefix: str = "buf") -> str:
        name = f"{prefix}{self._counter}"
        self._counter += 1
        return name

    def register_operation(self, op: Operation) -> None:
        self.operations.append(op)
        if isinstance(op, ExternKernel):
            for out in op.outputs:
                self.name_to_buffer[out.name] = out
        else:
            self.name_to_buffer[op.name] = op

    # the walk -------------------------------------------------------------------------------

    def run(self) -> GraphLowering:
        env: dict[torch.fx.Node, Any] = {}
        metas: dict[torch.fx.Node, Any] = {}
        inputs = iter(enumerate(self.example_inputs))
        with set_graph(self), using(self.sizevars):
            for order, node in enumerate(self.gm.graph.nodes):
                if node.op == "placeholder":
                    position, value = next(inputs)
                    metas[node] = _to_meta(value)
                    env[node] = self._placeholder(node, value, position)
                elif node.op == "get_attr":
                    value = _fetch_attr(self.gm, node.target)
                    metas[node] = _to_meta(value)
                    env[node] = self._constant(node, value)
                elif node.op == "call_function":
                    self.current_node = node
                    guards = len(self.shape_env.guards) if self.shape_env is not None else 0
                    metas[node] = self._meta(node, metas)
                    own = frozenset({origins.origin_of(node, order)})
                    # Note [Complex values run as extern kernels]
                    complex_ = any(_is_complex(metas.get(n)) for n in (node, *node.all_input_nodes))
                    with origins.attributed(own, own | _carried_by_args(node, env)):
                        env[node] = self._call(node, env, metas[node], extern=complex_)
                    specialized = self.shape_env is not None and len(self.shape_env.guards) != guards
                    if specialized and self.specialized_by is None:
                        self.specialized_by = node
                elif node.op == "output":
                    self.current_node = node
                    free = free_layout_outputs(self.gm)

                    def value_of(n: torch.fx.Node, env: dict[torch.fx.Node, Any] = env) -> Any:
                        if not self.channels_last:  # a view of an NHWC value needs eager's strides too
                            return env[n]
                        with origins.attributed(origins.NO_ORIGINS, carried(env[n])):
                            return self._eager_strides(n, env[n])

                    out = node.args[0]
                    if free and isinstance(out, list | tuple):  # Note [Outputs only the backward reads]
                        self.outputs = self._outputs(
                            type(out)(
                                env[o]
                                if i in free and isinstance(o, torch.fx.Node)
                                else torch.fx.node.map_arg(o, value_of)
                                for i, o in enumerate(out)
                            )
                        )
                    else:
                        self.outputs = self._outputs(torch.fx.node.map_arg(out, value_of))
                else:
                    raise NotImplementedError(f"fx node kind {node.op} ({node.format_node()})")
        return self

    def _placeholder(self, node: torch.fx.Node, value: Any, position: int) -> Any:
        if not isinstance(value, torch.Tensor):
            self.graph_inputs.append(None)
            if isinstance(value, torch.SymInt):  # Note [Symbolic sizes in loopir]
                return self.sizevars.add(value, SymbolSource(position, "int"))
            return value
        if has_symbols(value):
            layout = FixedLayout(
                self.device,
                value.dtype,
                tuple(
                    self.sizevars.add(n, SymbolSource(position, "size", d)) for d, n in enumerate(value.shape)
                ),
                tuple(
                    self.sizevars.add(n, SymbolSource(position, "stride", d))
                    for d, n in enumerate(value.stride())
                ),
                self.sizevars.add(value.storage_offset(), SymbolSource(position, "offset")),
            )
        else:
            layout = fixed_from_tensor(value, self.device)
        buffer = InputBuffer(node.name, layout)
        self.graph_inputs.append(buffer)
        self.name_to_buffer[buffer.name] = buffer
        return TensorBox.create(buffer)

    def _constant(self, node: torch.fx.Node, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        buffer = ConstantBuffer(f"const_{node.name}", fixed_from_tensor(value), value=value)
        self.constants[buffer.name] = value
        self.name_to_buffer[buffer.name] = buffer
        return TensorBox.create(buffer)

    def _call(
        self, node: torch.fx.Node, env: dict[torch.fx.Node, Any], meta: Any, extern: bool = False
    ) -> Any:
        mapped: Any = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
        args, kwargs = mapped
        target = node.target
        if self.channels_last and target in READS_STORAGE and isinstance(node.args[0], torch.fx.Node):
            eager = self._in_eager_storage(node.args[0], env)  # Note [Storage readers of NHWC values]
            if eager is not None:
                args = (eager, *args[1:])
        if target is operator.getitem:
            return args[0][args[1]]
        float_fn = FLOAT_FUNCTIONS.get(target)
        if (
            float_fn is not None
            and isinstance(meta, torch.SymFloat)
            and _size_arithmetic(target, args, floats=True)
        ):
            # Note [A float of sizes keeps its Python operations] (kiln_aotgrad)
            return float_fn(*[sympy.Float(a, 53) if isinstance(a, float) else sympy.sympify(a) for a in args])
        size_fn = SIZE_FUNCTIONS.get(target)
        if size_fn is not None and _size_arithmetic(target, args):
            return size_fn(*args)  # Note [Symbolic sizes in loopir]: computed here, not in a kernel
        self.current_meta = meta
        self.current_node = node
        if _mutates(target):
            # Note [Mutation]: values computed so far from the buffer about to change must be
            # computed now, not inlined into later readers that would see the new contents
            for value in env.values():
                for box in value if isinstance(value, list | tuple) else [value]:
                    storage = box.storage() if isinstance(box, TensorBox) else None
                    if storage is not None and not storage.is_realized():
                        storage.realize()
        lowering = find_lowering(target)
        if lowering is not None and extern:
            log.debug("%s runs as an extern kernel: complex values", node.name)
            lowering = None
        if lowering is not None and (target in self.extern_ops or node in self.extern_ops):
            log.debug("%s runs as an extern kernel: its lowering is switched off", node.name)
            lowering = None
        refused = eager_refuses(target, node.args, dict(node.kwargs)) if lowering is not None else None
        if refused is not None:
            # Note [Dtypes eager's kernel does not take]
            self.fallbacks.append((str(target), f"eager's kernel refuses: {refused}"))
            fallbacks_log.info(
                "%s (%s): eager's kernel refuses: %s; an extern call", target, node.name, refused
            )
            lowering = None
        result: Any = None
        if lowering is not None:
            try:
                result = lowering(*args, **kwargs)
                problem = _mismatch(result, meta)
            except Unsupported as exc:
                problem = str(exc)
            except Exception as exc:  # a lowering bug must not break compilation: fall back
                problem = f"lowering raised {type(exc).__name__}: {exc}"
            if problem is not None:
                # operations the lowering registered stay; nothing reads them, DCE drops them
                self.fallbacks.append((str(target), problem))
                fallbacks_log.info(
                    "%s (%s): %s; runs eager's kernel as an extern call", target, node.name, problem
                )
                result = None
        if result is None:
            assert callable(target)
            if (
                self.channels_last
                and is_view_op(target)
                and node not in self.channels_last
                and isinstance(node.args[0], torch.fx.Node)
            ):
                # Note [Extern views of NHWC values]: eager's view kernel needs eager's strides
                eager = self._in_eager_storage(node.args[0], env)
                if eager is not None:
                    args = (eager, *args[1:])
            result = fallback(target, args, kwargs, meta)
        hint_eager_strides(result, meta)
        self._after(node, result)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s -> %s", node.format_node(), _describe(result))
        return result

    def _after(self, node: torch.fx.Node, result: Any) -> None:
        """Apply the realize heuristic (Note [Why a value is realized]) to a node's result."""
        boxes = [
            r for r in (result if isinstance(result, list | tuple) else [result]) if isinstance(r, TensorBox)
        ]
        for box in boxes:
            storage = box.storage()
            if storage is None or not isinstance(storage.data, Pointwise):
                continue
            if not self.fusion:
                storage.realize()
                continue
            ops_count, loads = count_ops(storage.data.inner_fn, _zeros(storage.data.ranges))
            users = len(node.users)
            if self.shape_only_readers:
                shape_only = [u.name for u in node.users if u.target in SHAPE_ONLY_READERS]
                if shape_only and users > 1:
                    log.debug(
                        "%s: %s read only its shape, not counted as readers", node.name, ", ".join(shape_only)
                    )
                users -= len(shape_only)
            reader = _broadcast_reader(node)
            transcendental: set[str] = set()
            if reader is not None:
                transcendental = op_names(storage.data.inner_fn, _zeros(storage.data.ranges)) & TRANSCENDENTAL
            if reader is not None and transcendental:
                log.debug(
                    "%s realized: rule (f), %s read with broadcasting by %s",
                    node.name,
                    "/".join(sorted(transcendental)),
                    reader.name,
                )
                storage.realize()
                continue
            if (
                loads > MAX_LOADS
                or ops_count > MAX_CHAIN_OPS
                or (users > 1 and (ops_count > MAX_INLINE_OPS or loads > MAX_REUSE_LOADS))
            ):
                storage.realize()
            elif self.outputs_read_back and users > 1 and loads > 1 and self._read_back(node):
                log.debug("%s realized: a graph output that %d other nodes read", node.name, users - 1)
                storage.realize()  # Note [Outputs read back]

    def _read_back(self, node: torch.fx.Node) -> bool:
        """Is ``node``'s value a graph output that leaves in the layout it is computed in (Note
        [Outputs read back]; one kept NHWC leaves through a copy, which can inline it)?"""
        return node not in self.channels_last and any(u.op == "output" for u in node.users)

    def _outputs(self, value: Any) -> Any:
        if isinstance(value, TensorBox):
            return realize_strided(value)
        if isinstance(value, list | tuple):
            return type(value)(self._outputs(v) for v in value)
        return value

    # metadata -------------------------------------------------------------------------------

    def _eager_strides(self, node: torch.fx.Node, value: Any) -> Any:
        """A graph output of a graph that runs channels-last, copied into the strides eager gives
        it where they differ: the value kept NHWC itself, or a view of one (a permute of an NHWC
        buffer has other strides than the permute of eager's NCHW one)."""
        val = node.meta.get("val")
        if not (isinstance(value, TensorBox) and isinstance(val, torch.Tensor)) or not dense_tensor(val):
            return value
        if node not in self.channels_last:
            if isinstance(value.data, StorageBox) and not value.data.is_realized():
                return value  # computed here, in the layout its meta (eager's strides) gives it
            layout = realize_strided(value).layout
            same = all(
                int(got) == want
                for got, want, n in zip(layout.stride, val.stride(), val.shape, strict=True)
                if n != 1
            )
            if same and int(layout.offset) == val.storage_offset():
                return value
        return copy_with_strides(value, val.stride())

    # Note [Extern views of NHWC values]: a view op whose lowering declines runs eager's view
    # kernel as an extern call, and `view` there asks its input's strides for the new shape: over
    # a value the graph computed NHWC it raised "view size is not compatible with input tensor's
    # size and stride" at the first call, and the graph ran eagerly (MobileViT's unfold of a
    # convolution, `reshape(b * c * nh, 2, nw, 2)`, under dynamic=True, where the reshape's
    # lowering could not match its symbolic groups; the breadth suite, twenty-third session). Such
    # an extern view reads the value in eager's storage, as the storage readers below do.
    #
    # Note [Storage readers of NHWC values]: `as_strided` (and its copy and scatter) addresses
    # its input's storage with eager's strides and offset, so it must see eager's layout of the
    # value it views, where a graph that runs channels-last computed the value NHWC (the CPU
    # rule's default for a convolution: `conv2d(x, w).as_strided((2, 3), (1, 2), 5)` read other
    # elements than eager's, a wrong answer in inference). The value at the root of the view
    # chain is copied into eager's strides (as a graph output is: `_eager_strides`) and the
    # chain's views are lowered again over the copy.
    def _in_eager_storage(self, node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
        """``node``'s value over its view chain's root laid out as eager lays it, or None where
        nothing on the chain runs channels-last (Note [Storage readers of NHWC values])."""
        chain: list[torch.fx.Node] = []
        root = node
        while root.op == "call_function" and root.args and isinstance(root.args[0], torch.fx.Node):
            target, source = root.target, root.args[0]
            # an item of a split is a view; an item of another op's results (a norm's) is a root
            item_of_a_view = target is operator.getitem and is_view_op(source.target)
            if not (item_of_a_view or is_view_op(target)):
                break
            chain.append(root)
            root = root.args[0]
        if root not in self.channels_last and not any(n in self.channels_last for n in chain):
            return None
        value = self._eager_strides(root, env[root])
        for view in reversed(chain):
            base = view.args[0]
            if view.target is operator.getitem:
                value = value[view.args[1]]
                continue
            lowering = find_lowering(view.target)
            if lowering is None:
                raise Unsupported(
                    f"{view.target} (a view before as_strided of an NHWC value) has no lowering"
                )

            def arg(n: torch.fx.Node, base: Any = base, value: Any = value) -> Any:
                return value if n is base else env[n]

            vargs, vkwargs = torch.fx.node.map_arg((view.args, view.kwargs), arg)
            value = lowering(*vargs, **vkwargs)
        return value

    def _meta(self, node: torch.fx.Node, metas: dict[torch.fx.Node, Any]) -> Any:
        meta = self._meta_eager(node, metas)
        if node in self.channels_last:
            return _nhwc(meta, integers=node.target in _NHWC_INTEGER_RESULTS)
        return meta

    def _meta_eager(self, node: torch.fx.Node, metas: dict[torch.fx.Node, Any]) -> Any:
        val = node.meta.get("val")
        if val is not None:
            return _to_meta(val)
        if node.target is operator.getitem:
            parent, i = node.args
            assert isinstance(parent, torch.fx.Node)
            return metas[parent][i]
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: metas[n])
        kwargs = _meta_device(kwargs)
        try:
            assert callable(node.target)
            value = node.target(*args, **kwargs)
        except Exception:  # data-dependent or missing meta kernel: ask the real graph
            return _to_meta(self._real_value(node))
        fix = META_FIXES.get((node.target, self.device.type))
        return fix(value, args) if fix is not None else value

    def _real_value(self, node: torch.fx.Node) -> Any:
        if self._real_env is None:
            env: dict[torch.fx.Node, Any] = {}

            class Recorder(torch.fx.Interpreter):
                def run_node(self, n: torch.fx.Node) -> Any:
                    env[n] = super().run_node(n)
                    return env[n]

            Recorder(self.gm).run(*self.example_inputs)
            self._real_env = env
        return self._real_env[node]


def _carried_by_args(node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> frozenset[origins.Origin]:
    """The origins that ``node``'s lowering inlines from its arguments (Note [Origins])."""
    out: set[origins.Origin] = set()
    for arg in node.all_input_nodes:
        value = env.get(arg)
        for item in value if isinstance(value, list | tuple) else [value]:
            out |= carried(item)
    return frozenset(out)


def _layer_norm_cpu(value: Any, args: Any) -> Any:
    out, mean, rstd = value
    return out, mean.to(args[0].dtype), rstd.to(args[0].dtype)


# (op, device type) -> fix of the meta kernel's answer where the device kernel differs
META_FIXES: dict[tuple[Any, str], Any] = {
    (torch.ops.aten.native_layer_norm.default, "cpu"): _layer_norm_cpu,
}


# ops whose integer 4-D results walk the same (N, C, H, W) as their values: max pooling's indices
# are written by the same kernel as the values and read by the backward next to the gradient, so
# they take the values' layout (an NCHW index store beside an NHWC value store is uncoalesced, and
# eager's NHWC backward kernel copied NCHW indices before reading them)
_NHWC_INTEGER_RESULTS = frozenset({torch.ops.aten.max_pool2d_with_indices.default})


def _nhwc(meta: Any, integers: bool = False) -> Any:
    """A meta value with its 4-D tensors channels-last (Note [Channels-last for convolutions]):
    the floating ones, and with ``integers`` the integer ones too."""
    if isinstance(meta, torch.Tensor) and meta.dim() == 4 and (integers or meta.is_floating_point()):
        if has_symbols(meta):
            return _nhwc_symbolic(meta)
        return meta.to(memory_format=torch.channels_last)
    if isinstance(meta, list | tuple):
        return type(meta)(_nhwc(m, integers) for m in meta)
    return meta


def _nhwc_symbolic(meta: torch.Tensor) -> torch.Tensor:
    """Note [Channels-last values of symbolic size]: ``meta.to(memory_format=channels_last)``
    asks whether each spatial size is 1 (torch's contiguity checks), a guard that made loopir
    refuse every NHWC graph whose image size is symbolic (ConvNeXt's last stage, ``s // 32``), so
    the strides are written out, ``(C*H*W, 1, W*C, C)``: torch's own for every size but 0, and a
    size-1 dim's stride is never used to index."""
    _, c, h, w = meta.shape
    return torch.empty_strided(meta.shape, (c * h * w, 1, w * c, c), dtype=meta.dtype, device="meta")


def _numel(node: torch.fx.Node) -> int | None:
    """Elements of ``node``'s value (at the size hints when symbolic: for the heuristic only)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    return sizevars_hint(to_loopir(expr_of(val.numel()))) if has_symbols(val) else val.numel()


def _broadcast_reader(node: torch.fx.Node) -> torch.fx.Node | None:
    """A reader of ``node`` (through views) that computes it more than once per element: one
    that computes over more elements than ``node`` has, except a ``SINGLE_READ_OPS`` reader at
    most ``MASKED_READ_FACTOR`` times larger that no view on the way grew (Note [Why a value is
    realized] (f)). None when there is none."""
    own = _numel(node)
    if own is None:
        return None
    pending, seen = [(user, False) for user in node.users], 0
    while pending and seen < 64:
        user, grown = pending.pop()
        seen += 1
        numel = _numel(user)
        larger = numel is not None and numel > own
        if user.target in VIEW_OPS:
            pending.extend((u, grown or larger) for u in user.users)
            continue
        if not larger:
            continue
        assert numel is not None
        if grown or user.target not in SINGLE_READ_OPS or numel > MASKED_READ_FACTOR * own:
            return user
    return None


def view_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` views: up its chain of view ops (an item of a split
    included) to the first node that is not one."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node):
        source = node.args[0]
        item_of_a_view = node.target is operator.getitem and is_view_op(source.target)
        if not (item_of_a_view or is_view_op(node.target)):
            break
        node = source
    return node


def eager_layout_roots(gm: torch.fx.GraphModule) -> frozenset[torch.fx.Node]:
    """The nodes whose storage the user's outputs or a ``READS_STORAGE`` op see, so whose layout
    is eager's (Note [A layout only lowerings read] in lowerings/linalg.py); outputs only the
    backward reads aside (Note [Outputs only the backward reads])."""
    roots: set[torch.fx.Node] = set()

    def add(n: torch.fx.Node) -> torch.fx.Node:
        roots.add(view_root(n))
        return n

    free = free_layout_outputs(gm)
    for node in gm.graph.nodes:
        if node.target in READS_STORAGE and node.args and isinstance(node.args[0], torch.fx.Node):
            add(node.args[0])
        elif node.op == "output":
            out = node.args[0]
            items = list(enumerate(out)) if isinstance(out, list | tuple) else [(None, out)]
            for i, item in items:
                if i not in free:
                    torch.fx.node.map_arg(item, add)
    return frozenset(roots)


def hint_eager_strides(result: Any, meta: Any) -> None:
    """Give unrealized results the dense strides eager produces (see StorageBox.stride_hint)."""
    if isinstance(result, list | tuple) and isinstance(meta, list | tuple):
        for r, m in zip(result, meta, strict=False):
            hint_eager_strides(r, m)
        return
    if not (isinstance(result, TensorBox) and isinstance(meta, torch.Tensor)):
        return
    storage = result.data
    if not isinstance(storage, StorageBox) or storage.is_realized():
        return
    if has_symbols(meta):  # Note [Symbolic sizes in loopir]: decided on expressions, no guards
        size, stride = symbolic(meta.shape), symbolic(meta.stride())
        expected = contiguous_strides(size)
        if all(n == 1 or sympy.expand(a - b) == 0 for n, a, b in zip(size, stride, expected, strict=True)):
            return
        if not _dense_exprs(size, stride):
            return
        storage.stride_hint = tuple(stride)
        return
    if meta.is_contiguous() or not dense_tensor(meta):
        return
    storage.stride_hint = tuple(sympy.Integer(s) for s in meta.stride())


def _dense_exprs(size: Sequence[Any], stride: Sequence[Any]) -> bool:
    """`dense_tensor` for symbolic layouts: a permutation of a contiguous layout, provably."""
    pairs = sorted(
        ((st, n) for st, n in zip(stride, size, strict=True) if n != 1), key=lambda p: sizevars_hint(p[0])
    )
    expected: Any = sympy.Integer(1)
    for st, n in pairs:
        if sympy.expand(st - expected) != 0:
            return False
        expected = expected * n
    return True


def _mutates(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def _zeros(ranges: Sequence[Any]) -> list[Any]:
    return [sympy.Integer(0)] * len(ranges)


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and has_symbols(value):
        # the fake tensor itself: a new meta tensor of symbolic sizes would guard on them
        return value
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(
            [int(s) for s in value.shape], [int(s) for s in value.stride()], dtype=value.dtype, device="meta"
        )
    if isinstance(value, list | tuple):
        return type(value)(_to_meta(v) for v in value)
    return value


def _is_complex(meta: Any) -> bool:
    """Whether a node's meta value holds a complex tensor (Note [Complex values run as extern kernels])."""
    if isinstance(meta, torch.Tensor):
        return meta.dtype.is_complex
    if isinstance(meta, list | tuple):
        return any(_is_complex(m) for m in meta)
    return False


def _meta_device(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Creation ops name their device: run them on meta as well."""
    if "device" in kwargs:
        kwargs = {**kwargs, "device": torch.device("meta")}
    return kwargs


def _fetch_attr(gm: torch.fx.GraphModule, target: Any) -> Any:
    value: Any = gm
    for part in str(target).split("."):
        value = getattr(value, part)
    return value


def _mismatch(result: Any, meta: Any) -> str | None:
    """Why a lowering's result disagrees with the meta value (None when it agrees)."""
    if isinstance(meta, torch.Tensor):
        if not isinstance(result, TensorBox):
            return f"lowering returned {type(result).__name__} for a tensor"
        size = list(result.get_size())
        want = [to_loopir(expr_of(n)) for n in meta.shape]
        same = len(size) == len(want) and all(
            a == b or sympy.expand(a - b) == 0 for a, b in zip(size, want, strict=True)
        )
        if not same or result.get_dtype() != meta.dtype:
            return f"lowering gave {size} {result.get_dtype()}, eager gives {want} {meta.dtype}"
        return None
    if isinstance(meta, list | tuple):
        if not isinstance(result, list | tuple) or len(result) != len(meta):
            return "lowering returned a different structure"
        for r, m in zip(result, meta, strict=True):
            problem = _mismatch(r, m)
            if problem is not None:
                return problem
    return None


def _describe(result: Any) -> str:
    if isinstance(result, TensorBox):
        node = result.storage()
        kind = type(node.data).__name__ if node is not None else type(result.data).__name__
        return f"{kind}{list(result.get_size())}:{result.get_dtype()}"
    if isinstance(result, list | tuple):
        return ", ".join(_describe(r) for r in result)
    if isinstance(result, Buffer | ReinterpretView):
        return repr(result)
    return repr(result)


def _sym_size(x: Any, dim: int) -> Any:
    return x.get_size()[dim]


def _sym_stride(x: Any, dim: int) -> Any:
    return realize_strided(x).layout.stride[dim] if isinstance(x, TensorBox) else x.get_stride()[dim]


def _sym_numel(x: Any) -> Any:
    return sympy.Mul(*x.get_size())


def _size_arithmetic(target: Any, args: Sequence[Any], floats: bool = False) -> bool:
    """`sym_size`-like calls always; `operator` calls only on sizes (a traced `x * 2` on a
    tensor has its own lowering), and on Python floats when `floats`."""
    if isinstance(target, torch._ops.OpOverload):
        return True
    kinds = int | float | sympy.Expr if floats else int | sympy.Expr
    return all(isinstance(a, kinds) and not isinstance(a, bool) for a in args)


# Note [A float of sizes keeps its Python operations] (kiln_aotgrad): a SymFloat the graph
# computes from sizes becomes an ordered float expression (Note [Python float arithmetic on
# sizes, in its order] in kiln_symbolic), which a kernel reads with `ops.index_expr` in double
# (Note [The Python calls of the float functions] in kiln_symbolic)
FLOAT_FUNCTIONS: dict[Any, Any] = FLOAT_OF_CALL


# Note [Symbolic sizes in loopir]: the size arithmetic aotgrad leaves in the graph (Note [SymInts
# in the aten graph]) evaluates to loopir expressions at lowering time
SIZE_FUNCTIONS: dict[Any, Any] = {
    torch.ops.aten.sym_size.int: _sym_size,
    torch.ops.aten.sym_stride.int: _sym_stride,
    torch.ops.aten.sym_numel.default: _sym_numel,
    operator.add: operator.add,
    operator.sub: operator.sub,
    operator.mul: operator.mul,
    operator.neg: operator.neg,
    operator.floordiv: lambda a, b: FloorDiv(sympy.sympify(a), sympy.sympify(b)),
    operator.mod: sympy.Mod,
    operator.pow: operator.pow,
    torch.sym_max: sympy.Max,
    torch.sym_min: sympy.Min,
    # Note [Integers of floats of sizes] in kiln_symbolic: `int(n * 1.5)`, interpolate's sizes
    **INT_OF_FLOAT_CALL,
}
