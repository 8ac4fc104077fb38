"""Tensors in the graph: `TensorVariable` is an FX node plus the fake tensor it would produce.

Every operation on a tensor tracker becomes a node (`OutputGraph.create_call`) whose fake result
is computed first, so a failing meta kernel leaves no dangling node. Metadata queries (`shape`,
`dtype`, `dim()`, `is_contiguous()`) are answered from the fake tensor at capture time: the
input guards pin that metadata (static shapes, shapes.py), so folding them is sound.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.source import AttrSource
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker
from kiln_dynamo.variables.symbolic import SymNodeVariable, is_symbolic_value, set_where, sym_result

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

# Methods whose answer is metadata only: folded to constants on the fake tensor.
_METADATA_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "stride",
        "is_contiguous",
        "element_size",
        "is_floating_point",
        "is_complex",
        "get_device",
        "storage_offset",
        "__len__",
        "is_conj",  # Note [Lazy bits of fake tensors] (fake.py)
        "is_neg",
    }
)
_METADATA_ATTRS = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "requires_grad",
        "is_cuda",
        "is_cpu",
        "is_meta",
        "is_sparse",
        "is_quantized",
        "layout",
        "is_leaf",
        "itemsize",
        "nbytes",
        "is_nested",
        "is_mkldnn",
        "is_mps",
        "is_xpu",
        "is_sparse_csr",
    }
)
_TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag"})
_PYTHON_NUMBER_ADVICE = "keep the value as a 0-d tensor so that the arithmetic stays in the graph"
# Methods that leave the graph: (reason, advice). The attribute loads fine; calling it breaks.
_NOT_TRACEABLE: dict[str, tuple[str, str | None]] = {
    "item": (
        "Tensor.item() used in Python arithmetic: it turns tensor data into a Python number",
        "keep the value as a 0-d tensor (drop .item()) so that the arithmetic stays in the graph",
    ),
    "tolist": (
        "Tensor.tolist() turns tensor data into Python values",
        "keep the values in a tensor, or call .tolist() outside the compiled function",
    ),
    "numpy": ("Tensor.numpy() leaves the graph", None),
    "backward": (
        "Tensor.backward() inside a compiled frame",
        "call backward() outside the compiled function",
    ),
    "data_ptr": ("Tensor.data_ptr() depends on storage", None),
    "register_hook": ("tensor hooks", None),
    "__bool__": ("data-dependent branch on a tensor value", None),
    "__int__": ("int() of a tensor turns tensor data into a Python number", _PYTHON_NUMBER_ADVICE),
    "__float__": ("float() of a tensor turns tensor data into a Python number", _PYTHON_NUMBER_ADVICE),
    "__complex__": ("complex() of a tensor turns tensor data into a Python number", _PYTHON_NUMBER_ADVICE),
    "__index__": ("a tensor used as a Python index turns tensor data into a Python number", None),
}
# The reads of a tensor's value as Python values, folded when the tensor is a constant of the
# trace (Note [Tensors computed from constants]): `bool(t)`, `int(t)`, `float(t)` (the builtins
# call these, builtins.py), `t.item()`, `t.tolist()`.
_FOLDED_READS = frozenset({"__bool__", "__int__", "__float__", "__complex__", "__index__", "item", "tolist"})
_BRANCH_ADVICE = "compute both branches and pick with torch.where(cond, a, b), or move the branch outside the compiled function"


class TensorVariable(VariableTracker):
    __slots__ = ("cls", "fake", "node", "source")

    def __init__(
        self, node: torch.fx.Node, fake: torch.Tensor, cls: type = torch.Tensor, source: Any = None
    ) -> None:
        self.node = node
        self.fake = fake
        self.cls = cls
        self.source = source

    def describe(self) -> str:
        return f"tensor {self.node.name} {tuple(self.fake.shape)} {self.fake.dtype}"

    def python_type(self) -> type:
        return self.cls

    def identity(self) -> object:
        # In-place ops and aliases return the same fake tensor, so `y is x` after `y = x.add_(1)`.
        return self.fake

    def truth(self, tx: Tx) -> bool:
        value = constant_value(self)
        if value is not None:
            return bool(value)  # Note [Tensors computed from constants]
        raise Unsupported("data-dependent branch on a tensor value", advice=_BRANCH_ADVICE)

    def length(self, tx: Tx) -> int:
        if self.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return int(self.fake.shape[0])

    def iterate(self, tx: Tx) -> list[VariableTracker]:
        n = self.length(tx)
        return [self.getitem(tx, ConstantVariable(i)) for i in range(n)]

    def getattr(self, tx: Tx, name: str) -> VariableTracker:
        if name == "shape" and is_symbolic_value(self.fake.shape):
            return self.sizes(tx, "size")
        if name == "is_leaf" and self.fake.requires_grad and self.fake.is_leaf:
            leaf = self.input_is_leaf(tx)  # Note [is_leaf of an input]
            if leaf is not None:
                return ConstantVariable(leaf)
        if name in _METADATA_ATTRS:
            value = getattr(self.fake, name)
            if name == "device":
                value = self.fake.fake_device  # type: ignore[attr-defined]
            return tx.wrap_constant(value)
        if name in _TENSOR_ATTRS:
            return tx.output.create_call(tx, "call_function", getattr, [self, ConstantVariable(name)], {})
        if name == "grad":
            return self._input_grad(tx)
        if name in ("data", "grad_fn", "_version"):
            raise Unsupported(f"Tensor.{name} inside a compiled frame")
        if not hasattr(self.cls, name):
            return self._missing_attr(tx, name)
        return TensorMethodVariable(self, name)

    def _input_grad(self, tx: Tx) -> VariableTracker:
        """Note [Gradients read in the frame]: the ``.grad`` of a tensor that comes from outside
        the frame (a parameter, an input) is read where it lives: ``None`` guarded as ``None``, a
        tensor as one more graph input under the source ``<tensor>.grad`` with the tensor guards
        (a training step's ``clip_grad_norm_`` after ``backward()``: the gradients a continuation
        reads). The gradient of a tensor the graph computes exists only after a backward the graph
        cannot run: still a break."""
        for node, source, value in tx.output.inputs:
            if node.meta.get("val") is self.fake and source is not None and isinstance(value, torch.Tensor):
                pending = tx.output.side_effects.pending_attr(value, "grad")  # after zero_grad()
                if pending is not None:
                    return pending
                return tx.wrap(value.grad, AttrSource(source, "grad"))
        raise Unsupported("Tensor.grad of a tensor computed inside the compiled frame")

    # Note [requires_grad set in the frame]: `t.requires_grad = flag` (wav2vec2-family feature
    # encoders set it on a view of their input in training, "for gradient checkpointing") is
    # traced only where eager does nothing: `t` is a leaf whose flag already has that value. On a
    # leaf it changes, it makes a new leaf tensor in the middle of the graph (its gradient lands
    # in that object's `.grad`, and a graph makes no leaves: Note [Parameters made in the frame]
    # in user_defined.py), and on a non-leaf eager raises RuntimeError; both are one break with
    # that reason, as torch.compile breaks there too.
    def setattr(self, tx: Tx, name: str, value: VariableTracker) -> None:
        if name != "requires_grad":
            super().setattr(tx, name, value)
            return
        if not (value.is_constant() and type(value.as_constant()) is bool):
            raise Unsupported(f"setting requires_grad on {self.describe()} to {value.describe()}, not a bool")
        want = bool(value.as_constant())
        fake = self.fake
        leaf = fake.is_leaf
        if fake.requires_grad and leaf:
            leaf = self.input_is_leaf(tx) is not False  # Note [is_leaf of an input]
        if leaf and fake.requires_grad == want:
            return
        if not leaf:
            raise Unsupported(
                f"setting requires_grad on {self.describe()}, which autograd computed (eager raises "
                "RuntimeError: only a leaf tensor's flag can change)"
            )
        raise Unsupported(
            f"setting requires_grad = {want} on {self.describe()} inside the compiled frame: it makes a "
            "new leaf tensor in the middle of the graph",
            advice="set requires_grad outside the compiled function (before the call)",
        )

    # Note [is_leaf of an input]: a fake made from a real tensor is a leaf whatever the real one
    # is, so `x.is_leaf` of an input computed by autograd outside the frame (`f(a.exp())`, `a`
    # requiring grad) answered True where eager answers False. A fake that requires grad and is
    # still a leaf (no operation of the frame made it a non-leaf) answers what the real input was
    # when the frame started, guarded (`L['x'].is_leaf is False`). A tensor that does not require
    # grad is a leaf in eager too.
    def input_is_leaf(self, tx: Tx) -> bool | None:
        for node, source, value in tx.output.inputs:
            if node.meta.get("val") is self.fake and source is not None and isinstance(value, torch.Tensor):
                tx.output.guards.constant(AttrSource(source, "is_leaf"), value.is_leaf)
                return bool(value.is_leaf)
        return None

    def _missing_attr(self, tx: Tx, name: str) -> VariableTracker:
        """Note [Tensor attributes that do not exist]: `hasattr(x, "jax")` (transformers' duck
        typing) must answer False without a break. The class is guarded with the tensor; an input
        tensor may still carry the attribute in its own `__dict__`, which is guarded absent (or the
        lookup stays unsupported when present). Tensors the graph makes are new objects with an
        empty `__dict__` (an in-place op returns its input's fake, so it is found as that input)."""
        for node, source, value in tx.output.inputs:
            if node.meta.get("val") is self.fake:
                if name in getattr(value, "__dict__", {}):
                    raise Unsupported(f"tensor attribute {name!r} set on the tensor itself")
                tx.output.guards.no_instance_attr(source, name)
                break
        raise AttributeError(f"{self.cls.__name__!r} object has no attribute {name!r}")

    def call_method(
        self, tx: Tx, name: str, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> VariableTracker:
        return TensorMethodVariable(self, name).call(tx, args, kwargs)

    def sizes(self, tx: Tx, name: str) -> VariableTracker:
        """`x.size()` / `x.stride()` with symbolic items: one `x.size(i)` node per symbolic dim."""
        from kiln_dynamo.variables.lists import SizeVariable, TupleVariable

        values = getattr(self.fake, name)()
        items = [self.dim_value(tx, name, i, v) for i, v in enumerate(values)]
        return SizeVariable(items) if name == "size" else TupleVariable(items)

    def dim_value(self, tx: Tx, name: str, dim: int, value: Any) -> VariableTracker:
        graph = tx.output.graph
        return sym_result(tx, value, lambda: graph.create_node("call_method", name, (self.node, dim), {}))

    def getitem(self, tx: Tx, key: VariableTracker) -> VariableTracker:
        return tx.output.create_call(tx, "call_function", operator.getitem, [self, key], {})

    def setitem(self, tx: Tx, key: VariableTracker, value: VariableTracker) -> None:
        tx.output.create_call(tx, "call_function", operator.setitem, [self, key, value], {})

    def reconstruct(self, cg: Reconstructor) -> str:
        if self.node.op == "placeholder" and self.source is not None:
            return cg.source(self.source)
        return cg.graph_output(self.node)


# Note [Hooks on input tensors]
# `x.register_hook(fn)` on a tensor the frame received (a graph input, so the real tensor exists
# before the graph runs) is a side effect: the runner registers `fn` on the real tensor after the
# graph, in call order, as torch.compile does. A tensor hook fires during backward, which no
# compiled graph runs (`backward()` is a break), so registering it after the forward graph
# rather than before changes nothing a program can see; the frame's code after a split runs after
# the runner, so it sees the hook registered. Only where eager would succeed and the replay can
# name everything: the tensor requires grad (else eager raises), `fn` is read from somewhere
# the runner can read it again (a global, an attribute, a closure cell), no keyword arguments.
# The handle it returns exists only after the replay: it may be dropped, not used or kept (a
# frame that keeps it runs as plain Python). A hook on a tensor the graph computes stays a break
# (its grad is computed inside the compiled backward).


def _hook_on_input(
    t: TensorVariable, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
) -> bool:
    return (
        len(args) == 1
        and not kwargs
        and t.node.op == "placeholder"
        and t.source is not None
        and bool(t.fake.requires_grad)
        and args[0].source is not None
    )


class TensorHookHandleVariable(VariableTracker):
    """The RemovableHandle of a hook the runner registers (Note [Hooks on input tensors])."""

    def __init__(self, tensor: TensorVariable) -> None:
        self.tensor = tensor

    def describe(self) -> str:
        return "the handle of a tensor hook registered in the frame"


class TensorMethodVariable(VariableTracker):
    def __init__(self, tensor: TensorVariable, name: str) -> None:
        self.tensor = tensor
        self.name = name

    def describe(self) -> str:
        return f"Tensor.{self.name}"

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{self.tensor.reconstruct(cg)}.{self.name}"

    def call(
        self, tx: Tx, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
    ) -> VariableTracker:
        name = self.name
        fake = self.tensor.fake
        if name in _FOLDED_READS and not args and not kwargs:
            value = constant_value(self.tensor)
            if value is not None:  # Note [Tensors computed from constants]
                try:
                    return tx.wrap_constant(getattr(value, name)())
                except (RuntimeError, TypeError, ValueError) as e:  # eager raises the same
                    raise Unsupported(f"Tensor.{name}() raised {type(e).__name__}: {e}") from e
        if name == "register_hook" and _hook_on_input(self.tensor, args, kwargs):
            if tx.output.side_effects.module_hooks:  # Note [Module hooks registered in the frame]
                raise Unsupported("a tensor hook registered after a module hook in the frame")
            tx.output.side_effects.tensor_hooks.append((self.tensor, args[0]))
            return TensorHookHandleVariable(self.tensor)
        if name == "numpy" and not args and not kwargs:
            from kiln_dynamo.variables.ndarray import NdarrayVariable

            return NdarrayVariable.of_tensor(tx, self.tensor)  # Note [NumPy round trips]
        if name == "item" and not args and not kwargs and _item_stays(tx, fake):
            # Note [Unbacked sizes in capture]: an int from data, a symbol of the graph
            return tx.output.create_call(tx, "call_method", "item", [self.tensor], {})
        if name in _NOT_TRACEABLE:
            reason, advice = _NOT_TRACEABLE[name]
            raise Unsupported(reason, advice=advice)
        if name == "is_inference" and not args and not kwargs:  # Note [inference_mode traced]
            from kiln_dynamo import inference

            tx.output.guards.inference_mode()
            return ConstantVariable(inference.is_inference(fake))
        if name in _METADATA_METHODS or (name == "type" and not args and not kwargs):
            if not all(a.is_constant() for a in [*args, *kwargs.values()]):
                raise Unsupported(f"Tensor.{name} with non-constant arguments")
            if name == "get_device":
                dev = fake.fake_device  # type: ignore[attr-defined]
                return ConstantVariable(-1 if dev.type == "cpu" else dev.index)
            set_where(tx)
            cargs = [a.as_constant() for a in args]
            ckwargs = {k: v.as_constant() for k, v in kwargs.items()}
            value = getattr(fake, name)(*cargs, **ckwargs)
            if is_symbolic_value(value):
                if name in ("size", "stride") and not cargs and not ckwargs:
                    return self.tensor.sizes(tx, name)
                graph = tx.output.graph
                node_args = (self.tensor.node, *cargs)
                return sym_result(
                    tx, value, lambda: graph.create_node("call_method", name, node_args, ckwargs)
                )
            # a size a guard has fixed (`n in (2, 3)` answered True: s0 == 3) is still a SymInt
            return tx.wrap_constant(_concrete(value))
        if name in ("requires_grad_", "retain_grad", "share_memory_", "pin_memory"):
            raise Unsupported(f"Tensor.{name}() inside a compiled frame")
        if name in _ADD_PRODUCTS and _add_product_by_tensor_applies(self.tensor, args, kwargs):
            return _add_product_by_tensor(tx, self.tensor, name, args, kwargs)
        return tx.output.create_call(tx, "call_method", name, [self.tensor, *args], kwargs)


# Note [A tensor as the value of addcdiv]: `x.addcdiv_(a, b, value=s)` takes `s` as a number;
# eager turns a 0-d tensor there into one with `.item()`, which a graph cannot do (Adam's step
# size is such a tensor while compiling: `step` stays a tensor). The call is rewritten into the
# tensor ops of its definition, in the order the CPU kernel computes it (`x + s * a / b`,
# `x + s * a * b`), as torch.compile rewrites it.
_ADD_PRODUCTS = {
    "addcdiv": operator.truediv,
    "addcdiv_": operator.truediv,
    "addcmul": operator.mul,
    "addcmul_": operator.mul,
}


def _add_product_by_tensor_applies(
    x: TensorVariable, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
) -> bool:
    """Floating tensors only (integer addcdiv raises in eager, and must still raise), and a value
    that does not require grad (eager's `.item()` cuts it out of autograd; a product would not)."""
    value = kwargs.get("value")
    tensors = [x, *args, value]
    return (
        len(args) == 2
        and isinstance(value, TensorVariable)
        and value.fake.dim() == 0
        and not value.fake.requires_grad
        and all(isinstance(t, TensorVariable) and t.fake.dtype.is_floating_point for t in tensors)
    )


def _add_product_by_tensor(
    tx: Tx, x: TensorVariable, name: str, args: list[VariableTracker], kwargs: dict[str, VariableTracker]
) -> VariableTracker:
    if set(kwargs) != {"value"}:
        raise Unsupported(f"Tensor.{name} with a tensor value and other keyword arguments")
    scaled = tx.output.create_call(tx, "call_function", operator.mul, [kwargs["value"], args[0]], {})
    term = tx.output.create_call(tx, "call_function", _ADD_PRODUCTS[name], [scaled, args[1]], {})
    add = "add_" if name.endswith("_") else "add"
    return tx.output.create_call(tx, "call_method", add, [x, term], {})


def _item_stays(tx: Tx, fake: torch.Tensor) -> bool:
    """`.item()` of an integer tensor stays in the graph as an unbacked int when the capture
    allows data-dependent sizes; a float or bool `.item()` still breaks (it feeds Python
    arithmetic or a branch)."""
    dtype = fake.dtype
    integral = not (dtype.is_floating_point or dtype.is_complex or dtype is torch.bool)
    return integral and fake.dim() == 0 and tx.output.shapes.unbacked_env is not None


def graph_arg(vt: VariableTracker) -> Any:
    """The FX argument for a tracker: a node for tensors, plain values for constants."""
    from kiln_dynamo.variables.base import SliceVariable
    from kiln_dynamo.variables.lists import BaseListVariable

    if isinstance(vt, TensorVariable):
        return vt.node
    if isinstance(vt, SymNodeVariable):
        node = vt.graph_node()
        if node is None:
            raise Unsupported(f"{vt.describe()} cannot be passed to a tensor operation")
        return node
    if isinstance(vt, SliceVariable):
        return vt.as_graph_arg()
    if isinstance(vt, BaseListVariable):
        items = [graph_arg(i) for i in vt.items]
        return list(items) if vt.python_type() is list else tuple(items)
    if vt.is_constant():
        value = vt.as_constant()
        if type(value).__module__ == "numpy" and hasattr(value, "item"):
            return value.item()  # a NumPy scalar (np.sqrt(d)): the graph holds the Python number
        return value
    raise Unsupported(f"{vt.describe()} cannot be passed to a tensor operation")


def fake_arg(vt: VariableTracker) -> Any:
    from kiln_dynamo.variables.base import SliceVariable
    from kiln_dynamo.variables.lists import BaseListVariable

    if isinstance(vt, TensorVariable):
        return vt.fake
    if isinstance(vt, SymNodeVariable):
        return vt.value
    if isinstance(vt, SliceVariable):
        return vt.as_fake_arg()
    if isinstance(vt, BaseListVariable):
        items = [fake_arg(i) for i in vt.items]
        if vt.python_type() is torch.Size:
            return torch.Size(items)
        return list(items) if vt.python_type() is list else tuple(items)
    if vt.is_constant():
        return vt.as_constant()
    raise Unsupported(f"{vt.describe()} cannot be passed to a tensor operation")


# Note [Tensors computed from constants]: a tensor whose every ancestor in the graph is a factory
# or an operator over constants (no graph input, no random op, no in-place op anywhere in the graph
# so far) has the same value on every call that passes the guards: its inputs are constants, each
# guarded where it came from (a size under static shapes, say). When the frame branches on it or
# reads it as a Python value (`bool((mask == causal).all())` in nn.Transformer's causal-mask check),
# kiln computes it for real, once, while tracing, instead of breaking (never through random ops
# or uninitialized memory, `empty`). Small tensors only (the cost is paid at capture), never under
# autocast; a symbolic size is a graph input's, so dynamic shapes keep the break.
_CONSTANT_EVAL_NUMEL = 1 << 16
_CONSTANT_EVAL_NODES = 64
_RANDOM_WORDS = (
    "rand",
    "normal",
    "bernoulli",
    "multinomial",
    "dropout",
    "uniform",
    "exponential",
    "poisson",
    "rrelu",
    "empty",
)


class _NotConstant(Exception):
    pass


def _target_name(node: torch.fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))


def _mutates(node: torch.fx.Node) -> bool:
    name = _target_name(node)
    return (
        (name.endswith("_") and not name.endswith("__"))
        or name in ("__setitem__", "copy_")
        or "out" in node.kwargs
    )


def constant_value(vt: TensorVariable) -> torch.Tensor | None:
    """The real value of a tensor computed only from constants, or None (Note [Tensors computed
    from constants])."""
    if vt.fake.numel() > _CONSTANT_EVAL_NUMEL or torch._C._is_any_autocast_enabled():
        return None
    graph = vt.node.graph
    if any(n.op in ("call_function", "call_method") and _mutates(n) for n in graph.nodes):
        return None
    memo: dict[torch.fx.Node, Any] = {}

    def run(node: torch.fx.Node) -> Any:
        if node in memo:
            return memo[node]
        if node.op not in ("call_function", "call_method") or len(memo) >= _CONSTANT_EVAL_NODES:
            raise _NotConstant
        name = _target_name(node).lower()
        if any(word in name for word in _RANDOM_WORDS):
            raise _NotConstant
        args = torch.fx.node.map_arg(node.args, run)
        kwargs = torch.fx.node.map_arg(node.kwargs, run)
        target: Any = node.target
        out = (
            getattr(args[0], target)(*args[1:], **kwargs)
            if node.op == "call_method"
            else target(*args, **kwargs)
        )
        memo[node] = out
        return out

    try:
        with torch.no_grad():
            value = run(vt.node)
    except _NotConstant:
        return None
    except Exception as e:
        raise Unsupported(f"computing a tensor made of constants raised {type(e).__name__}: {e}") from e
    return value if isinstance(value, torch.Tensor) else None


def _concrete(value: Any) -> Any:
    """`value` with every SymInt/SymFloat/SymBool whose expression a guard made a constant
    replaced by that constant (a `torch.Size` stays one)."""
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.Size):
        return torch.Size([_concrete(v) for v in value])
    if type(value) is tuple:
        return tuple(_concrete(v) for v in value)
    return value
