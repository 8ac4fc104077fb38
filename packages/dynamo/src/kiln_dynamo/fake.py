"""Fake tensors: tensors that carry metadata only.

A `FakeTensor` is a wrapper subclass (`torch.Tensor._make_wrapper_subclass`) around a tensor on
the `meta` device. The wrapper reports the *real* device, dtype, sizes, strides and
requires_grad; every operator that reaches `__torch_dispatch__` is re-run on the inner meta
tensors (meta kernels compute output metadata without touching data) and the outputs are wrapped
again with the device the real operator would have produced. Autograd sits above the wrapper,
so `requires_grad` and `grad_fn` of results follow eager exactly.

`FakeMode` is a dispatch mode that does the same for operators with no tensor argument
(factories such as `torch.zeros(3)`): the device they ask for is swapped for `meta` and
reported back on the result. Real tensors that meet fake ones inside the mode (constants) are
converted on the fly.

An operator without a meta kernel, or one that needs data (`.item()`, `nonzero`), raises
`FakeUnsupported` naming the operator; the capture records that reason and the frame falls back
-- unless a capture allows data-dependent sizes (Note [Unbacked sizes in capture], unbacked.py).
A few operators torch has no meta kernel for get kiln's own (meta.py) instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, ClassVar

import torch
from kiln_symbolic import GuardOnDataDependent
from torch._dispatch.python import enable_python_dispatcher
from torch._prims_common import suggest_memory_format
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from kiln_dynamo.constants import CONSTANT_LIMIT, computable, drop_constants, run_on_constants, set_constant
from kiln_dynamo.exc import FakeUnsupported
from kiln_dynamo.meta import DATA_META_FUNCTIONS, META_CORRECTIONS, META_FUNCTIONS
from kiln_dynamo.meta_memo import meta_call
from kiln_dynamo.trees import tree_leaves, tree_map
from kiln_dynamo.unbacked import NEEDS_DATA, UNBACKED_META_FUNCTIONS, current_env

_META = torch.device("meta")

# Operators whose result depends on tensor data: a meta kernel cannot answer them.
_DATA_DEPENDENT = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::nonzero",
        "aten::masked_select",
        "aten::unique",
        "aten::_unique2",
        "aten::equal",
        "aten::is_nonzero",
    }
)


# Note [Lazy bits of fake tensors]: `z.conj()` of a complex tensor and `torch._neg_view(x)` are
# views whose memory means its conjugate or its negation: a bit on the tensor (`is_conj()`,
# `is_neg()`, and the Conjugate / Negative dispatch keys, whose fallbacks materialize the values
# before an operator that cannot read the view). A fake carries both bits as the real tensor
# does, on its meta tensor and on its wrapper: meta kernels set them on the meta result of
# `_conj` / `_neg_view`, `FakeTensor` copies them onto the wrapper it builds, and `from_real`
# copies a real tensor's bits (a conjugate view passed in) onto the meta tensor. So a program's
# `is_conj()` reads the wrapper and gives eager's answer, and `resolve_conj()` / `resolve_neg()`,
# which ask the wrapper, resolve where eager does. Before, the wrapper was built from sizes,
# strides and dtype only: its `is_conj()` was False for `z.conj()` (a branch took eager's other
# side), `z.conj().resolve_conj()` returned the view itself (its `is_conj()` read from the meta
# tensor stayed True where eager's is False), and a conjugate view passed in read as plain.
class FakeTensor(torch.Tensor):
    """Metadata of a tensor on `fake_device`, computed by meta kernels on `meta`."""

    meta: torch.Tensor
    fake_device: torch.device
    is_param: bool
    symbolic: bool  # some size or stride is a SymInt
    constant: torch.Tensor | None  # its value, when built from constants (Note [Constant fakes])
    from_real: bool  # made for a real tensor (an input, a parameter), not by an operator
    __slots__ = ("constant", "fake_device", "from_real", "is_param", "meta", "symbolic")

    @staticmethod
    def __new__(
        cls, meta: torch.Tensor, device: torch.device, requires_grad: bool = False, is_param: bool = False
    ) -> FakeTensor:
        assert meta.device.type == "meta", meta.device
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            meta.size(),
            strides=meta.stride(),
            storage_offset=meta.storage_offset(),
            dtype=meta.dtype,
            layout=meta.layout,
            device=device,
            requires_grad=requires_grad,
        )
        if meta.is_conj():  # Note [Lazy bits of fake tensors]
            torch._C._set_conj(r, True)
        if meta.is_neg():
            torch._C._set_neg(r, True)
        r.meta = meta
        r.fake_device = device
        r.is_param = is_param
        r.symbolic = any(isinstance(x, torch.SymInt) for x in (*meta.size(), *meta.stride()))
        r.constant = None
        r.from_real = False
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return (
            f"FakeTensor(size={tuple(self.shape)}, dtype={self.dtype}, device={self.fake_device}"
            f"{', requires_grad=True' if self.requires_grad else ''})"
        )

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return run_fake(func, args, kwargs or {})


def from_real(t: torch.Tensor, layout: tuple[list[Any], list[Any]] | None = None) -> FakeTensor:
    """A fake tensor with `t`'s metadata (never its data); with `layout`, these (symbolic)
    sizes and strides instead of `t`'s (kiln_dynamo.shapes decides them)."""
    if isinstance(t, FakeTensor):
        return t
    with _disable_current_modes(), torch._C.DisableTorchFunctionSubclass():
        if layout is not None:
            with enable_python_dispatcher():
                meta = torch.empty_strided(layout[0], layout[1], dtype=t.dtype, device=_META)
                if t.storage_offset():  # Note [Static views of inputs start at the input's offset]
                    meta = meta.as_strided(layout[0], layout[1], t.storage_offset())
            _copy_lazy_bits(t, meta)
            fake = FakeTensor(meta, t.device, t.requires_grad, isinstance(t, torch.nn.Parameter))
            fake.from_real = True
            return fake
        meta = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=_META)
        if t.storage_offset():
            meta = torch.empty(
                t.untyped_storage().nbytes() // max(t.element_size(), 1) + 1, dtype=t.dtype, device=_META
            ).as_strided(t.size(), t.stride(), t.storage_offset())
        _copy_lazy_bits(t, meta)
    fake = FakeTensor(meta, t.device, t.requires_grad, isinstance(t, torch.nn.Parameter))
    fake.from_real = True
    return fake


def _copy_lazy_bits(t: torch.Tensor, meta: torch.Tensor) -> None:
    """`t`'s conjugate and negative bits on `meta` (Note [Lazy bits of fake tensors])."""
    if t.is_conj():
        torch._C._set_conj(meta, True)
    if t.is_neg():
        torch._C._set_neg(meta, True)


# Note [Operators on two devices]: eager refuses most operators whose tensor arguments live on two
# devices ("Expected all tensors to be on the same device"), and a meta kernel never does: it
# sees meta tensors only. A traced `cuda_x * torch.arange(n)` (a CPU tensor made in the frame)
# would then compile and run where eager raises, hiding the user's bug. So an operator whose
# tensors are on two devices is not traced (FakeUnsupported: a graph break), and eager runs it,
# raising its own error or, for an operator that takes two devices, its result. Two exceptions
# stay traced, as eager takes them: a 0-dim CPU tensor (a scalar) beside any device, and the
# operators of `_TWO_DEVICES`, which take their index or length tensors on the CPU, or copy
# between devices.
_TWO_DEVICES = frozenset(
    {
        "aten::copy_", "aten::copy", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::_to_copy",
        "aten::index", "aten::_unsafe_index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
        "aten::_unsafe_index_put", "aten::_pack_padded_sequence", "aten::_pad_packed_sequence",
        "aten::tensor_split", "aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu",
        "aten::ctc_loss", "aten::_ctc_loss", "aten::_use_cudnn_ctc_loss", "aten::_cudnn_ctc_loss",
        "aten::set_", "prims::device_put",
    }
)  # fmt: skip


def _common_device(args: list[Any], kwargs: dict[str, Any], name: str = "") -> torch.device:
    if "device" in kwargs and kwargs["device"] is not None:
        return torch.device(kwargs["device"])
    found: torch.device | None = None
    scalar_only = True  # `found` came from 0-dim CPU tensors only
    for a in args:
        if not isinstance(a, FakeTensor):
            continue
        device = a.fake_device
        scalar = device.type == "cpu" and a.dim() == 0
        if found is None:
            found, scalar_only = device, scalar
        elif device != found:
            if scalar:  # a 0-dim CPU tensor mixes with tensors on any device
                continue
            if not scalar_only and name not in _TWO_DEVICES and not name.startswith("aten::_foreach_"):
                raise FakeUnsupported(  # Note [Operators on two devices]
                    f"operator {name} takes tensors on {found} and {device}: eager runs it "
                    "(and refuses it, unless the operator takes two devices)"
                )
            if scalar_only or found.type == "cpu":  # another device wins over the CPU
                found, scalar_only = device, scalar
        elif not scalar:
            scalar_only = False
    return found if found is not None else torch.device("cpu")


def _flat(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    out: list[Any] = []

    def visit(x: Any) -> Any:
        out.append(x)
        return x

    tree_map(visit, (args, kwargs))
    return out


def _is_channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and suggest_memory_format(t) == torch.channels_last


def _convolution_layout(out: Any, args: tuple[Any, ...]) -> Any:
    """Note [CPU convolution strides]: the meta kernel of aten.convolution answers contiguous
    strides when its input or weight is channels-last, but the CPU kernels (mkldnn and the slow
    path alike) answer channels-last then, and eager code downstream sees those strides (views,
    extern kernels, and the cost of every copy that would conform them). Fake results must be
    what the device gives, so a channels-last input or weight gives a channels-last output.

    In full: an output with a dim of one element ([N, C, 1, 1] from a 1x1 input) is channels-last
    contiguous with row-major strides too, and the meta kernel (on CUDA as well: its `.to()` of a
    tensor already "channels-last" keeps the strides) leaves (C, 1, 1, 1) where the device's
    kernel allocates the channels-last strides (C, 1, C, C); a pooling or convolution after it
    decides its own output's format from those (layout fuzz seed 1033: a 1x1 convolution after a
    max pooling to one pixel, then an average pooling: the output came back row-major where
    eager's is channels-last). So the output takes the channels-last strides themselves, on
    either device."""
    x, weight = args[0], args[1]
    if (
        isinstance(out, torch.Tensor)
        and out.dim() == 4
        and (_is_channels_last(x) or _is_channels_last(weight))
    ):
        laid = torch.empty_like(out, memory_format=torch.channels_last)
        if laid.stride() != out.stride():
            return laid
    return out


# Note [Operators that ask the device]: a few operators answer a question about the device
# rather than compute a tensor. `_fused_sdp_choice` picks the attention kernel that
# scaled_dot_product_attention's composite decomposes into (math, flash, memory-efficient, cuDNN):
# its meta kernel answers "math" for any tensor on `meta`, so every attention traced on fake
# tensors became the math decomposition (on CUDA in bf16 that upcasts to float32: two fp32 GEMMs
# and a softmax per layer where eager runs one fused kernel). The device's own kernel reads only
# metadata (sizes, strides, dtype, device properties), so it is asked directly, with the fake
# tensors themselves (they report the real device): the traced graph then holds the fused
# kernel eager would run, whose meta kernel gives its real outputs' shapes and strides.
_ASKS_THE_DEVICE = frozenset({"aten::_fused_sdp_choice"})
_DEVICE_KEYS = {"cpu": torch._C.DispatchKey.CPU, "cuda": torch._C.DispatchKey.CUDA}


def _device_answer(func: Any, device: torch.device, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The device kernel's answer for an operator of `_ASKS_THE_DEVICE` (None: ask the meta kernel)."""
    key = _DEVICE_KEYS.get(device.type)
    if key is None or not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key):
        return None
    if device.type == "cuda" and not torch.cuda.is_available():
        return None
    with _disable_current_modes():
        return func.redispatch(torch._C.DispatchKeySet(key), *args, **kwargs)


def _symbolic(x: Any) -> bool:
    if isinstance(x, FakeTensor):
        return x.symbolic
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


# Note [In-place changes of a tensor's shape]: a FakeTensor is a wrapper whose sizes and strides
# are set when it is made, and operators run on its inner meta tensor; an operator that changes
# its tensor's geometry in place (`t_`, `unsqueeze_`, `resize_`...) changed only the meta tensor,
# so Python reading `x.shape` afterwards saw the old shape (`x.unsqueeze_(0); return x.shape[0]`
# returned 4 where eager returns 1; found in the ninth session). After such an operator the
# wrapper is restrided to its meta tensor's geometry (through the Meta kernel of `as_strided_`,
# which moves no data). What that cannot express breaks the graph before the operator runs: a
# resize beyond the tensor's storage (the wrapper's storage cannot grow), `set_` (a fake does not
# share another's storage), and symbolic sizes of a fake made for a real tensor (an input: Note
# [Placeholders keep their entry geometry] restores only static ones) or of a resize (its
# storage check needs numbers).
#
# Note [Geometry changes of symbolic intermediates]: a tensor an operator made in the graph
# follows an in-place change under symbolic sizes too (the wrapper restrides to SymInts as to
# ints). torch's composite `adaptive_avg_pool2d` to 1x1 ends, for a channels-last input, with
# `out.as_strided_(...)` over its mean (and `adaptive_avg_pool1d` goes through it): under
# dynamic=True every Swin/ViT-style pooler over `hidden.transpose(1, 2)` broke the graph there
# (the breadth suite's swin training, twenty-third session), which torch.compile does not.
_METADATA_IN_PLACE = frozenset(
    f"aten::{op}"
    for op in (
        "t_",
        "transpose_",
        "swapaxes_",
        "swapdims_",
        "unsqueeze_",
        "squeeze_",
        "resize_",
        "resize_as_",
        "as_strided_",
    )
)
_META_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _numel(size: Any) -> int:
    n = 1
    for d in size:
        n *= int(d)
    return n


def _geometry_unsupported(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why the in-place geometry change `name` cannot be followed (Note [In-place changes of a
    tensor's shape]), or None."""
    if name == "aten::set_":
        return "it makes the tensor view another storage"
    if name not in _METADATA_IN_PLACE:
        return None
    self = args[0] if args else kwargs.get("self")
    if not isinstance(self, FakeTensor):
        return None
    flat = _flat(args, kwargs)
    if any(_symbolic(x) for x in flat) and (self.from_real or name in ("aten::resize_", "aten::resize_as_")):
        return "its sizes are symbolic"
    if name in ("aten::resize_", "aten::resize_as_"):
        other = args[1] if len(args) > 1 else kwargs.get("size", kwargs.get("the_template"))
        numel = other.numel() if isinstance(other, torch.Tensor) else _numel(other)
        need = (self.storage_offset() + numel) * self.element_size()
        if numel and need > self.untyped_storage().nbytes():
            return "it grows the tensor's storage"
    return None


def _follow_geometry(fake: FakeTensor) -> None:
    m = fake.meta
    if (fake.shape, fake.stride(), fake.storage_offset()) != (m.shape, m.stride(), m.storage_offset()):
        torch.ops.aten.as_strided_.default.redispatch(
            _META_KEYS, fake, m.size(), m.stride(), m.storage_offset()
        )


def restore_geometry(fake: FakeTensor, real: torch.Tensor) -> bool:
    """Give an input's fake the geometry of its real tensor again, when an in-place geometry
    change (Note [In-place changes of a tensor's shape]) moved it during capture; whether it did.

    Note [Placeholders keep their entry geometry]: a placeholder's `meta["val"]` is the fake the
    capture ran on, so after `b.unsqueeze_(2)` it had the shape the frame ends with. A backend
    that traces from the placeholders (kiln_aotgrad's symbolic signatures under dynamic=True)
    then applied the change to an input that already had it: the buffer came out [7, 2, 1, 1]
    where eager's is [7, 2, 1] (found by test_alias_fuzz.py, seed 1026). Before the graph goes
    to the backend, each such fake is restrided back to its input's geometry. Only fakes of
    static sizes can have moved (a symbolic one made for a real tensor breaks the graph first:
    Note [Geometry changes of symbolic intermediates]), so the comparison adds no guard."""
    if fake.symbolic:
        return False
    geometry = (tuple(real.shape), real.stride(), real.storage_offset())
    if (tuple(fake.shape), fake.stride(), fake.storage_offset()) == geometry:
        return False
    with torch.no_grad():
        torch.ops.aten.as_strided_.default.redispatch(_META_KEYS, fake.meta, *geometry)
    _follow_geometry(fake)
    return True


def restore_autograd(fake: FakeTensor, real: torch.Tensor) -> bool:
    """Make an input's fake a leaf with its real tensor's `requires_grad` again, when an in-place
    op of the capture gave it autograd history; whether it did.

    Note [Placeholders keep their entry autograd state]: as with their geometry (Note
    [Placeholders keep their entry geometry]), the capture's in-place ops leave their mark on a
    placeholder's fake: `x1.add_(x0.sum())` of an `x1` that does not require grad made its fake
    require grad, with the capture's AddBackward and SumBackward behind it. kiln_aotgrad traced
    its symbolic signature from that fake (dynamic=True): the input counted as requiring grad,
    and the joint trace's backward ran through the capture's history too, so `x0`'s gradient
    came out with the sum counted twice: a wrong answer (test_alias_fuzz.py seed 22171 under
    --dynamic true). Before the graph goes to the backend each such fake is detached in place
    and given its input's `requires_grad`."""
    if fake.grad_fn is None and fake.requires_grad == real.requires_grad:
        return False
    with torch.no_grad():
        fake.detach_()
    fake.requires_grad_(real.requires_grad)
    return True


# Note [Metadata queries as operators]: a composite can ask a tensor's geometry through the
# dispatcher (`aten::size`, `aten::sym_stride`...); torch 2.11's batched matmul does so. Re-running
# such a query on the inner meta tensor with symbolic sizes failed inside torch there (an internal
# assert in its argument parser: "dispatch_on_subclass called with NO overloaded args"), so every
# batched `@` under dynamic shapes broke the graph on the H200 machine (torch 2.13 answers). The
# answer is the wrapper's own metadata, which equals the meta tensor's: it is read, never
# dispatched. aotgrad's tracer meets the same queries when it re-traces the graph
# (:func:`is_metadata_query`): it answers them from the fake tensor and records no node; asking
# the dispatcher whether `aten::size` has a composite kernel raised "operator aten::size does not
# exist" on torch 2.11, and the symbolic graph was refused. The later failure of a 4-d
# `q @ k.transpose` on torch 2.11 was a specialization in C++: Note [Composite operators under
# symbolic sizes].
def _size(t: torch.Tensor, *dim: Any) -> Any:
    return t.size(*dim) if dim else list(t.size())


def _stride(t: torch.Tensor, *dim: Any) -> Any:
    return t.stride(*dim) if dim else list(t.stride())


_METADATA_QUERIES: dict[str, Callable[..., Any]] = {
    "aten::size": _size,
    "aten::sym_size": _size,
    "aten::stride": _stride,
    "aten::sym_stride": _stride,
    "aten::numel": lambda t: t.numel(),
    "aten::sym_numel": lambda t: t.numel(),
    "aten::dim": lambda t: t.dim(),
    "aten::storage_offset": lambda t: t.storage_offset(),
    "aten::sym_storage_offset": lambda t: t.storage_offset(),
}


_NO_ANSWER = object()


def is_metadata_query(func: Any) -> bool:
    """Whether operator `func` only reads a tensor's geometry (Note [Metadata queries as
    operators]): a tracer answers it from the fake tensor and records nothing."""
    name = func._schema.name if hasattr(func, "_schema") else None
    return name in _METADATA_QUERIES


def _metadata_answer(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The answer of a metadata query (Note [Metadata queries as operators]), or _NO_ANSWER."""
    query = _METADATA_QUERIES.get(name)
    if query is None or kwargs or not args or not isinstance(args[0], FakeTensor):
        return _NO_ANSWER
    dims = args[1:]
    if any(not isinstance(d, int) for d in dims):
        return _NO_ANSWER  # a named dimension: the meta kernel answers
    return query(args[0].meta, *dims)


def run_fake(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run `func` on meta tensors and wrap the results as fake tensors on the right device."""
    name = func._schema.name if hasattr(func, "_schema") else str(func)
    answer = _metadata_answer(name, args, kwargs)
    if answer is not _NO_ANSWER:
        return answer
    flat = _flat(args, kwargs)
    device = _common_device(flat, kwargs, name)
    needs_data = NEEDS_DATA.get(name)
    if name in _DATA_DEPENDENT or (needs_data is not None and needs_data(args, kwargs)):
        if computable(func, flat, device):  # Note [Constant fakes]
            real = run_on_constants(func, args, kwargs, device)
            if real is not None:
                return tree_map(lambda x: _from_constant(x, device), real)
        answer = DATA_META_FUNCTIONS.get(name, _no_answer)(device, *args, **kwargs)
        env = current_env()
        if answer is None and env is not None and name in UNBACKED_META_FUNCTIONS:
            answer = UNBACKED_META_FUNCTIONS[name](
                env, device, *args, **kwargs
            )  # Note [Unbacked sizes in capture]
        if answer is not None:
            return tree_map(lambda m: FakeTensor(m, device) if isinstance(m, torch.Tensor) else m, answer)
        raise FakeUnsupported(f"operator {name} needs tensor data (not available while tracing)")
    why = _geometry_unsupported(name, args, kwargs)  # Note [In-place changes of a tensor's shape]
    if why is not None:
        raise FakeUnsupported(f"operator {name} changes a tensor's shape in place and {why}")
    if name in _ASKS_THE_DEVICE:
        answer = _device_answer(func, device, args, kwargs)
        if answer is not None:
            return answer
    by_meta: dict[int, FakeTensor] = {}

    def to_meta(x: Any) -> Any:
        if isinstance(x, FakeTensor):
            by_meta[id(x.meta)] = x
            return x.meta
        if isinstance(x, torch.Tensor):
            return from_real(x).meta
        if isinstance(x, torch.device):
            return _META
        return x

    m_args = tree_map(to_meta, args)
    m_kwargs = tree_map(to_meta, kwargs)
    if "device" in m_kwargs and m_kwargs["device"] is not None:
        m_kwargs["device"] = _META
    correction = META_CORRECTIONS.get(name)  # Note [view_copy of a tensor no view can describe]
    out = correction(device, *m_args, **m_kwargs) if correction is not None else None
    try:
        if out is not None:
            pass
        elif any(_symbolic(x) for x in flat):
            # Note [Symbolic fakes]: Python meta kernels and decompositions (torch._decomp,
            # torch._refs) handle SymInt sizes where some C++ meta kernels call sizes()
            with enable_python_dispatcher():
                out = func(*m_args, **m_kwargs)
        else:
            out = meta_call(func, m_args, m_kwargs)  # Note [Meta results are memoized]
    except GuardOnDataDependent as e:
        raise FakeUnsupported(f"operator {name} branches on a data-dependent size: {e}") from e
    except NotImplementedError as e:
        own = META_FUNCTIONS.get(name)  # kiln's own (meta.py), when torch has none
        if own is None:
            raise FakeUnsupported(f"operator {name} has no meta kernel ({str(e).splitlines()[0]})") from e
        out = own(device, *m_args, **m_kwargs)
    except RuntimeError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "meta" in msg.lower() or "data-dependent" in msg.lower():
            raise FakeUnsupported(f"operator {name} cannot run on fake tensors: {msg}") from e
        raise
    if name == "aten::convolution" and device.type in ("cpu", "cuda"):
        out = _convolution_layout(out, m_args)
    real = _constant_results(func, flat, device, out, args, kwargs)

    from_numbers = not any(isinstance(x, torch.Tensor) for x in flat)

    def wrap(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
            if x.device.type != "meta":
                # an operator of Python numbers only (`torch.div(n, 4, rounding_mode="trunc")`,
                # Longformer's window count) runs for real on the CPU: a constant fake of its
                # value (Note [Constant fakes]); it was returned as a real tensor, which broke
                return _from_constant(x, device) if from_numbers else x
            hit = by_meta.get(id(x))
            if hit is not None:
                return hit  # in-place op or alias returning an input
            return FakeTensor(x, device)
        return x

    result = tree_map(wrap, out)
    if real is None and name in _LIFTS and isinstance(result, FakeTensor):
        real = _lifted_constant(args[0], device)  # Note [Tensors made from Python numbers]
    if name in _METADATA_IN_PLACE and args and isinstance(args[0], FakeTensor):
        _follow_geometry(args[0])  # Note [In-place changes of a tensor's shape]
    if real is not None:
        for fake, value in zip(tree_leaves(result), tree_leaves(real), strict=False):
            if isinstance(fake, FakeTensor) and isinstance(value, torch.Tensor):
                # only a value laid out as the fake says (a later as_strided reads it so)
                same = (value.shape, value.stride(), value.storage_offset()) == (
                    fake.shape,
                    fake.stride(),
                    fake.storage_offset(),
                )
                set_constant(fake, value if same else None)
    return result


# Note [Tensors made from Python numbers]: `torch.tensor(8)`, `torch.tensor([0, 2, 5])` build a
# real CPU tensor from the numbers and hand it to `lift_fresh`, so the fake that comes back is
# the first thing tracing sees of it. Those numbers are constants of the trace (literals, static
# sizes, guarded values), so the fake carries them (Note [Constant fakes]), with the same rules
# as any constant: small, and on a device other than the CPU integers and bools only. Without it
# `torch.tensor(min(q.size(-2), k.size(-2)))` used as a slice bound (DeBERTa's
# `compute_attention_span`) or in `int()` became a data-dependent size and broke the graph.
_LIFTS = frozenset({"aten::lift_fresh", "aten::lift_fresh_copy", "aten::lift"})


def _lifted_constant(x: Any, device: torch.device) -> torch.Tensor | None:
    if not isinstance(x, torch.Tensor) or isinstance(x, FakeTensor) or x.device.type != "cpu":
        return None
    if x.numel() > CONSTANT_LIMIT or (device.type != "cpu" and (x.is_floating_point() or x.is_complex())):
        return None
    return x.detach().clone()


def _no_answer(device: torch.device, *args: Any, **kwargs: Any) -> None:
    return None


def _from_constant(x: Any, device: torch.device) -> Any:
    """A real result computed on constants as a fake tensor carrying it (Note [Constant fakes])."""
    if not isinstance(x, torch.Tensor):
        return x
    meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_META)
    fake = FakeTensor(meta, device)
    set_constant(fake, x)
    return fake


def _constant_results(
    func: Any, flat: list[Any], device: torch.device, out: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """`func`'s real results when its arguments are constants and its results small (Note
    [Constant fakes]), else None; a write into a constant that is not computed drops it."""
    metas = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if computable(func, flat, device) and all(t.numel() <= CONSTANT_LIMIT for t in metas):
        real = run_on_constants(func, args, kwargs, device)
        if real is not None:
            return real
    if any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
        for x in flat:
            if isinstance(x, FakeTensor):
                drop_constants(x)
    return None


class FakeMode(TorchDispatchMode):
    """Every operator, factories included, runs on meta tensors while this mode is active."""

    active: ClassVar[int] = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return run_fake(func, args, kwargs or {})


@contextmanager
def fake_mode() -> Iterator[None]:
    with FakeMode():
        yield


# Note [Composite operators under symbolic sizes]: an operator whose kernel is composite
# (CompositeImplicitAutograd: `matmul`, `linear`, `einsum`...) is decomposed by torch before a fake
# tensor sees any of it, and how it is decomposed depends on the torch version. Torch 2.11's C++
# `matmul` of two batched 4-d tensors reads a size as a plain int, so a symbolic length was
# specialized to its hint through `SymInt.__index__` (the H200 machine's torch: every hand-written
# attention recompiled per length; torch 2.13's C++ keeps it symbolic). Torch registers Python
# decompositions of these operators for symbolic sizes (`py_impl` kernels of
# CompositeImplicitAutograd), which run only under the Python dispatcher; torch.compile's capture
# runs every fake operation under it. kiln turns it on for a call that has a symbolic size among
# its arguments (:func:`dispatch_for`), and only then: the Python dispatcher costs time on every
# operator, and static sizes have nothing to lose in C++.
def dispatch_for(values: Iterable[Any]) -> AbstractContextManager[Any]:
    """The dispatcher context for a fake call on `values` (flattened arguments): the Python
    dispatcher when one of them has a symbolic size, Note [Composite operators under symbolic sizes]."""
    if any_symbolic(values):
        return enable_python_dispatcher()
    return nullcontext()


def any_symbolic(values: Iterable[Any]) -> bool:
    """Whether one of `values` (flattened arguments) has a symbolic size or is a symbolic number:
    the test of `dispatch_for`."""
    return any(_symbolic(x) for x in values)


def call_fake(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` with every tensor operation faked."""
    with FakeMode():
        return fn(*args, **kwargs)


def metadata(t: torch.Tensor) -> tuple[Any, ...]:
    """What a fake tensor must share with the real result: device, dtype, shape, strides, grad."""
    dev = t.fake_device if isinstance(t, FakeTensor) else t.device
    return (dev, t.dtype, tuple(t.shape), tuple(t.stride()), t.requires_grad, t.layout)
