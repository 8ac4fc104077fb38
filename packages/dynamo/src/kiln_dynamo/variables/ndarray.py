"""NumPy arrays made from tensors inside a compiled frame, traced as tensor operations.

Note [NumPy round trips]: `torch.from_numpy(np.exp(x.numpy()) * 2)` is a tensor computation
written in NumPy. `x.numpy()` gives an `NdarrayVariable` over the tensor (eager's array shares
x's memory; the tracker holds x's node, so it sees what x sees), and what the frame does with it
becomes tensor operations in the graph: arithmetic with numbers and other arrays (`+ - * / **`,
unary minus, comparisons), the ufuncs of `_UFUNCS`, `astype`, `copy`, `shape`/`ndim`/`dtype`/
`size`, then `torch.from_numpy` / `torch.as_tensor` (the same memory: an `aten.alias` of an
input's tensor) or `torch.tensor` (a copy). An array that leaves the frame is rebuilt as
`<tensor>.numpy()`. torch.compile traces NumPy the same way (as tensor ops).

NumPy and torch disagree on some result dtypes (`int_array / 2` is float64 in NumPy and float32
in torch): every operation computes NumPy's result dtype on empty arrays of the operands' dtypes
and breaks when torch's differs, so an array never carries torch's answer where NumPy's would be
another. Only arrays of at least one dimension are modelled (NumPy turns 0-d results into NumPy
scalars, a different type); in-place array operations (`a += 1` writes through to the tensor),
reductions (NumPy scalars) and everything else break, and the array is made for real there.
"""

from __future__ import annotations

import operator
import sys
from typing import TYPE_CHECKING, Any

import torch

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker
from kiln_dynamo.variables.tensor import TensorVariable

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker

_DTYPES = (torch.float16, torch.float32, torch.float64, torch.int32, torch.int64, torch.bool)

_BINARY = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.pow,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
    operator.eq,
    operator.ne,
}


def _np() -> Any:
    """NumPy, looked up only once the program loaded it (kiln_dynamo does not depend on it)."""
    np = sys.modules.get("numpy")
    if np is None:
        raise Unsupported("a numpy array before NumPy is loaded")
    return np


def _ufuncs() -> dict[Any, Any]:
    np = _np()
    return {
        np.exp: torch.exp,
        np.log: torch.log,
        np.sqrt: torch.sqrt,
        np.tanh: torch.tanh,
        np.sin: torch.sin,
        np.cos: torch.cos,
        np.abs: torch.abs,
        np.absolute: torch.abs,
        np.negative: torch.neg,
        np.square: torch.square,
        np.maximum: torch.maximum,
        np.minimum: torch.minimum,
        np.add: torch.add,
        np.subtract: torch.sub,
        np.multiply: torch.mul,
        np.divide: torch.div,
    }


def numpy_dtype(dtype: torch.dtype) -> Any:
    return _np().dtype(str(dtype).removeprefix("torch."))


class NdarrayVariable(VariableTracker):
    """A NumPy array whose data is `tensor` (Note [NumPy round trips])."""

    def __init__(self, tensor: TensorVariable) -> None:
        self.tensor = tensor

    @staticmethod
    def of_tensor(tx: Tx, t: TensorVariable) -> NdarrayVariable:
        _np()
        fake = t.fake
        if fake.requires_grad:
            raise Unsupported("Tensor.numpy() of a tensor that requires grad (eager raises)")
        if fake.fake_device.type != "cpu":  # type: ignore[attr-defined]
            raise Unsupported("Tensor.numpy() of a tensor that is not on the CPU (eager raises)")
        if fake.dim() == 0 or fake.dtype not in _DTYPES:
            raise Unsupported(f"Tensor.numpy() of a {fake.dim()}-d {fake.dtype} tensor")
        return NdarrayVariable(t)

    def describe(self) -> str:
        return f"numpy array of {self.tensor.describe()}"

    def python_type(self) -> type:
        return type(_np().empty(0))

    def getattr(self, tx: Tx, name: str) -> VT:
        fake = self.tensor.fake
        if name == "shape":
            return tx.wrap_constant(tuple(int(s) for s in fake.shape))
        if name == "ndim":
            return ConstantVariable(fake.dim())
        if name == "size":
            return ConstantVariable(int(fake.numel()))
        if name == "dtype":
            return ConstantVariable(numpy_dtype(fake.dtype))
        if name in ("astype", "copy"):
            from kiln_dynamo.variables.base import MethodVariable

            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a numpy array made in the frame")

    def call_method(self, tx: Tx, name: str, args: list[VT], kwargs: dict[str, VT]) -> VT:
        if name == "copy" and not args and not kwargs:
            return NdarrayVariable(_tensor_call(tx, "clone", self.tensor))
        if name == "astype" and len(args) == 1 and not kwargs and args[0].is_constant():
            target = _np().dtype(args[0].as_constant())
            dtype = getattr(torch, str(target), None)
            if not isinstance(dtype, torch.dtype) or dtype not in _DTYPES:
                raise Unsupported(f"numpy astype to {target}")
            return NdarrayVariable(_tensor_call(tx, "to", self.tensor, ConstantVariable(dtype), copy=True))
        raise Unsupported(f"method {name} of a numpy array made in the frame")

    def length(self, tx: Tx) -> int:
        return int(self.tensor.fake.shape[0])

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{self.tensor.reconstruct(cg)}.numpy()"


def _tensor_call(tx: Tx, name: str, t: TensorVariable, *args: VT, **kwargs: Any) -> TensorVariable:
    kw: dict[str, VT] = {k: ConstantVariable(v) for k, v in kwargs.items()}
    out = tx.output.create_call(tx, "call_method", name, [t, *args], kw)
    assert isinstance(out, TensorVariable)
    return out


def _operand(v: VT) -> tuple[VT, Any]:
    """The graph operand for `v` and what NumPy sees for it when computing the result dtype."""
    if isinstance(v, NdarrayVariable):
        return v.tensor, _np().empty(0, numpy_dtype(v.tensor.fake.dtype))
    if v.is_constant() and isinstance(v.as_constant(), (bool, int, float)):
        return v, v.as_constant()
    raise Unsupported(f"{v.describe()} in an operation on a numpy array")


def _checked(tx: Tx, out: VT, np_result: Any, what: str) -> NdarrayVariable:
    if not isinstance(out, TensorVariable):
        raise Unsupported(f"{what} on numpy arrays did not give an array")
    want = numpy_dtype(out.fake.dtype)
    if np_result.dtype != want:
        raise Unsupported(f"{what} on numpy arrays: NumPy's result is {np_result.dtype}, torch's {want}")
    if out.fake.dim() == 0:
        raise Unsupported(f"{what} on numpy arrays gives a 0-d result (a NumPy scalar)")
    return NdarrayVariable(out)


_COMPARISONS = {operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne}


def _in_numpy_dtype(tx: Tx, fn: Any, graph_operands: list[VT], np_result: Any) -> list[VT]:
    """NumPy computes an arithmetic ufunc in its result dtype (`int_array / 2` casts to float64
    first): tensor operands are cast to it likewise, so the graph computes what NumPy does."""
    if fn in _COMPARISONS:
        return graph_operands
    target = getattr(torch, str(np_result.dtype), None)
    if not isinstance(target, torch.dtype) or target not in _DTYPES:
        raise Unsupported(f"a numpy result of dtype {np_result.dtype}")
    if fn is operator.pow and not target.is_floating_point:
        raise Unsupported("integer powers of a numpy array (NumPy raises on negative exponents)")
    return [
        _tensor_call(tx, "to", g, ConstantVariable(target))
        if isinstance(g, TensorVariable) and g.fake.dtype != target
        else g
        for g in graph_operands
    ]


def ndarray_binary(tx: Tx, fn: Any, a: VT, b: VT) -> VT:
    if fn not in _BINARY:
        raise Unsupported(
            f"operator {getattr(fn, '__name__', fn)} on a numpy array (in place or not modelled)"
        )
    (ga, na), (gb, nb) = _operand(a), _operand(b)
    np_result = fn(na, nb)
    operands = _in_numpy_dtype(tx, fn, [ga, gb], np_result)
    out = tx.output.create_call(tx, "call_function", fn, operands, {})
    return _checked(tx, out, np_result, getattr(fn, "__name__", "operator"))


def ndarray_unary(tx: Tx, fn: Any, a: VT) -> VT:
    if fn not in (operator.neg, operator.pos, operator.abs):
        raise Unsupported(f"unary {fn.__name__} on a numpy array")
    ga, na = _operand(a)
    np_result = fn(na)
    out = tx.output.create_call(tx, "call_function", fn, _in_numpy_dtype(tx, fn, [ga], np_result), {})
    return _checked(tx, out, np_result, fn.__name__)


def ndarray_ufunc(tx: Tx, fn: Any, args: list[VT], kwargs: dict[str, VT]) -> VT:
    target = _ufuncs().get(fn)
    if target is None or kwargs:
        raise Unsupported(f"numpy.{getattr(fn, '__name__', fn)} on a numpy array made in the frame")
    operands = [_operand(a) for a in args]
    np_result = fn(*[n for _, n in operands])
    if target in (torch.maximum, torch.minimum) and not all(
        isinstance(g, TensorVariable) for g, _ in operands
    ):
        raise Unsupported(f"numpy.{fn.__name__} of an array and a number")
    graph_operands = _in_numpy_dtype(tx, fn, [g for g, _ in operands], np_result)
    out = tx.output.create_call(tx, "call_function", target, graph_operands, {})
    return _checked(tx, out, np_result, f"numpy.{fn.__name__}")


def tensor_from_ndarray(tx: Tx, fn: Any, args: list[VT], kwargs: dict[str, VT]) -> VT | None:
    """`torch.from_numpy(a)` / `torch.as_tensor(a)` (a's memory) / `torch.tensor(a)` (a copy) of
    a modelled array; None when the call is not one of those."""
    if len(args) != 1 or kwargs or not isinstance(args[0], NdarrayVariable):
        return None
    t = args[0].tensor
    if fn is torch.tensor:
        return _tensor_call(tx, "clone", t)
    if fn in (torch.from_numpy, torch.as_tensor):
        # a new tensor object over the array's memory, as eager's
        return tx.output.create_call(tx, "call_function", torch.ops.aten.alias.default, [t], {})
    return None
