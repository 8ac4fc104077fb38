"""torch functions, Python modules (torch, torch.nn.functional, math, ...) and grad-mode contexts.

A call to a torch function with tensor arguments becomes one `call_function` node whose target is
the function itself (`torch.relu`, `F.linear`, `torch.Tensor.add`); the fake run decides the
output metadata. Functions that only answer questions about Python values (`torch.is_tensor`,
`torch.finfo`, `torch.is_grad_enabled`) are folded, with a guard when they read global state.
`torch.no_grad()`, `torch.enable_grad()` and `torch.set_grad_enabled(b)` are modelled as context
managers: entering and leaving emit `torch._C._set_grad_enabled` nodes, so the graph carries the
same grad mode regions as the frame, and the real grad mode follows during tracing so that fake
results get eager's `requires_grad`.
"""

from __future__ import annotations

import math
import os
import types
from typing import TYPE_CHECKING, Any

import sympy
import torch
from kiln_symbolic import ConstraintViolation

from kiln_dynamo.exc import Unsupported
from kiln_dynamo.logs import decisions_log
from kiln_dynamo.source import AttrSource, ConstSource, Source
from kiln_dynamo.variables.base import ConstantVariable, VariableTracker
from kiln_dynamo.variables.symbolic import SymNodeVariable, set_where

if TYPE_CHECKING:
    from kiln_dynamo.codegen import Reconstructor
    from kiln_dynamo.variables.base import Tx

VT = VariableTracker

_FOLD_ON_CONSTANTS: frozenset[Any] = frozenset(
    {
        torch.finfo,
        torch.iinfo,
        torch.device,
        torch.Size,
        torch.is_tensor,
        torch.is_floating_point,
        torch.is_complex,
        torch.promote_types,
        torch.can_cast,
        torch.result_type,
    }
)
_UNSUPPORTED: dict[Any, str] = {
    torch.manual_seed: "torch.manual_seed changes global RNG state",
    torch.set_default_dtype: "torch.set_default_dtype changes global state",
    torch.autograd.grad: "torch.autograd.grad inside a compiled frame",
    torch.autograd.backward: "torch.autograd.backward inside a compiled frame",
}
# Note [Global setters run as Python]: a torch function that only changes thread or process
# state (autocast's flags, dtype, nesting and cache; deterministic algorithms; thread counts;
# matmul precision; the default device; reseeding) became a graph node. A node changes the state
# while the graph is traced, once; a backend that compiles to aten operators keeps no Python
# call, so from the second call on the state was never changed: a function ending in
# `torch.set_autocast_enabled("cpu", True)` (or `@torch.autocast(...)`, whose `__exit__` is such
# calls) left autocast as the first call found it, and its nesting count grew by one a call. Each
# is a graph break instead: the call runs as Python, as in eager, and what follows is traced in
# the state it made. (Autocast blocks and grad mode are traced as graph state: their own Notes.)
_GLOBAL_SETTERS = (
    "set_autocast_enabled",
    "set_autocast_dtype",
    "set_autocast_cpu_enabled",
    "set_autocast_cpu_dtype",
    "set_autocast_gpu_dtype",
    "set_autocast_ipu_enabled",
    "set_autocast_ipu_dtype",
    "set_autocast_xla_enabled",
    "set_autocast_xla_dtype",
    "autocast_increment_nesting",
    "autocast_decrement_nesting",
    "set_autocast_cache_enabled",
    "clear_autocast_cache",
    "use_deterministic_algorithms",
    "set_deterministic_debug_mode",
    "set_num_threads",
    "set_num_interop_threads",
    "set_float32_matmul_precision",
    "set_default_device",
    "set_default_tensor_type",
    "set_flush_denormal",
    "set_warn_always",
    "seed",
)
_UNSUPPORTED.update(
    {
        getattr(torch, name): f"torch.{name} changes global state"
        for name in _GLOBAL_SETTERS
        if getattr(torch, name, None) is not None
    }
)
# Python modules whose attributes are trusted (read without a guard).
TRUSTED_MODULE_PREFIXES = (
    "torch",
    "math",
    "operator",
    "functools",
    "itertools",
    "collections",
    "builtins",
    "typing",
    "dataclasses",
    "enum",
)


_GRAPH_FUNCTION_MODULES = frozenset(
    {
        "torch",
        "torch.functional",
        "torch.nn.functional",
        "torch._tensor",
        "torch.nn.init",
        "torch.fft",
        "torch.linalg",
        "torch.special",
        "torch.random",
        "torch._VF",
        "torch.nn.modules.utils",
    }
)


# Note [Answering is_compiling]: torch's "am I being compiled?" flags are plain Python functions
# that read a module global torch.compile sets; inlined, they would answer False. While kiln
# traces they answer True (TorchFunctionVariable.call), so that libraries such as transformers
# take their compile-friendly paths; at run time the graph does not call them.
IS_COMPILING_FUNCTIONS = frozenset(
    {
        ("torch.compiler", "is_compiling"),
        ("torch.compiler", "is_dynamo_compiling"),
        ("torch._dynamo.external_utils", "is_compiling"),
        ("torch._utils", "is_compiling"),
    }
)

# Note [Fused inference fast paths]: nn.MultiheadAttention, nn.TransformerEncoderLayer and
# nn.TransformerEncoder pick a fused C++ kernel (`_native_multi_head_attention`,
# `_transformer_encoder_layer_fwd`, nested-tensor conversion) in eval mode without grad, after
# checks that all start with `torch.backends.mha.get_fastpath_enabled()`. The fused kernels are one
# opaque op for a compiler (an extern call that nothing fuses with; on torch < 2.13
# `_transformer_encoder_layer_fwd` has no meta kernel at all, so fake tensors cannot run it and
# the graph would fall back), while the other branch is the same computation in decomposable ops
# (linear, softmax, layer_norm). So while kiln traces, that flag answers False to torch.nn's own
# code (a user's function reading it gets its value), and the modules take the decomposable path
# on every torch version. The answer is not guarded: both branches
# compute the same function, so `set_fastpath_enabled()` later needs no recompile.
# `KILN_TORCH_FAST_PATHS=1` (or `set_torch_fast_paths(True)`) keeps torch's own answer.
#
# Note [Fast paths on two devices]: the two branches compute the same function only where both
# run. The fused kernels refuse tensors on two devices ("Expected all tensors to be on the same
# device ... wrapper_CUDA___transformer_encoder_layer_fwd"), where the decomposable branch may not
# even read the odd one: a CUDA encoder layer given a causal mask made on the CPU with
# `is_causal=True` drops the mask before attention, so kiln answered where eager raised (breadth
# program greedy_decode on an H100). So where the asking frame holds tensors on two devices (a
# 0-dim CPU tensor aside, which mixes with any device), torch's own answer is given, not guarded
# either: the fused kernel is then traced, and Note [Operators on two devices] in fake.py breaks
# the graph there, so eager runs it and raises its own error.
FAST_PATH_FLAGS = frozenset({("torch.backends.mha", "get_fastpath_enabled")})
# only torch.nn's own checks get the False answer; a user's code reading the flag sees its value
_TORCH_NN_DIR = os.path.join(os.path.dirname(os.path.realpath(torch.nn.__file__)), "")
_keep_torch_fast_paths = os.environ.get("KILN_TORCH_FAST_PATHS", "0") == "1"


def set_torch_fast_paths(enabled: bool) -> None:
    """Let torch's fused inference kernels be traced as they are (Note [Fused inference fast paths])."""
    global _keep_torch_fast_paths
    _keep_torch_fast_paths = enabled


def _qualified(value: Any) -> tuple[str, str] | None:
    if not isinstance(value, types.FunctionType):
        return None
    return (value.__module__, value.__qualname__)


def is_compiling_function(value: Any) -> bool:
    return _qualified(value) in IS_COMPILING_FUNCTIONS


def trace_time_answer(value: Any) -> bool | None:
    """The constant a torch flag function answers while kiln traces, or None to treat it as usual."""
    name = _qualified(value)
    if name in IS_COMPILING_FUNCTIONS:
        return True
    if name in FAST_PATH_FLAGS and not _keep_torch_fast_paths:
        return False
    return None


def is_torch_callable(value: Any) -> bool:
    """Should a call to `value` become a graph node (rather than be inlined or folded)?"""
    if isinstance(value, type):
        return False
    if trace_time_answer(value) is not None:
        return True  # answered at trace time (Notes [Answering is_compiling], [Fused inference fast paths])
    mod = getattr(value, "__module__", None) or ""
    if isinstance(value, types.FunctionType):
        # Only torch's operator namespaces: anything else from torch (decorators such as
        # torch.no_grad()'s wrapper, nn.Module methods, utilities) is Python to inline.
        return mod in _GRAPH_FUNCTION_MODULES
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        self_obj = getattr(value, "__self__", None)
        return mod.startswith("torch") or (
            isinstance(self_obj, types.ModuleType) and self_obj.__name__.startswith("torch")
        )
    if type(value).__name__ in ("method_descriptor", "wrapper_descriptor", "getset_descriptor"):
        return getattr(value, "__objclass__", None) in (torch.Tensor, torch._C.TensorBase)
    return isinstance(value, torch._ops.OpOverloadPacket | torch._ops.OpOverload)


class TorchFunctionVariable(VariableTracker):
    def __init__(self, fn: Any, source: Source | None = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        name = getattr(self.fn, "__qualname__", None) or getattr(self.fn, "__name__", self.fn)
        return f"torch function {name}"

    def python_type(self) -> type:
        return type(self.fn)

    def identity(self) -> object:
        return self.fn

    def getattr(self, tx: Tx, name: str) -> VT:
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.fn, name))
        return tx.wrap(getattr(self.fn, name), None)

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.source) if self.source is not None else cg.const(self.fn)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        fn = self.fn
        if fn in _UNSUPPORTED:
            raise Unsupported(_UNSUPPORTED[fn])
        if fn is torch.is_grad_enabled:
            tx.output.guards.global_state()
            return ConstantVariable(torch.is_grad_enabled())
        if fn is torch.get_default_dtype:
            tx.output.guards.global_state()
            return ConstantVariable(torch.get_default_dtype())
        if fn is torch.is_inference_mode_enabled:
            tx.output.guards.inference_mode()
            # a traced block's mode is on (Note [inference_mode traced] in inference.py)
            return ConstantVariable(tx.output.inference_depth > 0 or torch.is_inference_mode_enabled())
        if fn in SETTING_READERS and not args and not kwargs:  # Note [Settings read through torch functions]
            value = fn()
            tx.output.guards.setting(fn, value)
            return ConstantVariable(value)
        if fn in (torch.jit.is_scripting, torch.jit.is_tracing, torch._C._get_tracing_state):
            return ConstantVariable(fn())
        if fn is torch._C._group_tensors_by_device_and_dtype:
            return _group_by_device_and_dtype(tx, args, kwargs)
        if fn in (torch.from_numpy, torch.as_tensor, torch.tensor):
            from kiln_dynamo.variables.ndarray import tensor_from_ndarray

            made = tensor_from_ndarray(tx, fn, args, kwargs)  # Note [NumPy round trips]
            if made is not None:
                return made
        if (
            fn in (torch.addcdiv, torch.addcmul)
            and len(args) == 3
            and set(kwargs) == {"value"}
            and _is_tensor(args[0])
        ):
            return args[0].call_method(
                tx, fn.__name__, args[1:], kwargs
            )  # Note [A tensor as the value of addcdiv]
        if fn in _FOREACH_ADD_PRODUCTS and len(args) == 4 and not kwargs and _is_tensor(args[3]):
            return _foreach_add_product_by_tensor(tx, fn, args)
        if fn in (torch._check, torch._check_is_size) and args and isinstance(args[0], SymNodeVariable):
            return _symbolic_check(tx, fn, args[0])
        if fn in _TENSOR_CHECKS:
            checked = _tensor_check(tx, fn, args, kwargs)
            if checked is not None:
                return checked
        answer = trace_time_answer(fn)
        if answer is False and not tx.code.co_filename.startswith(_TORCH_NN_DIR):
            answer = fn()  # the user's own code asking: torch's real answer (a torch global)
            tx.output.guards.setting(fn, answer)  # Note [Settings read through torch functions]
        elif answer is False and _locals_on_two_devices(tx):
            answer = fn()  # Note [Fast paths on two devices]
            decisions_log.info(
                "%s() keeps torch's answer (%s): %s holds tensors on two devices, which the fused "
                "kernel refuses (Note [Fast paths on two devices])",
                fn.__qualname__,
                answer,
                tx.code.co_name,
            )
        elif answer is False:
            decisions_log.info(
                "%s() answers False while tracing: torch's fused inference kernels are not taken "
                "(Note [Fused inference fast paths]; KILN_TORCH_FAST_PATHS=1 keeps them)",
                fn.__qualname__,
            )
        if answer is not None:
            return ConstantVariable(answer)
        if getattr(fn, "__name__", "") == "is_compiling":
            return ConstantVariable(True)
        if fn is torch._C._len_torch_dispatch_stack:
            # Note [kiln's own FakeMode]: while tracing, kiln's FakeMode sits on the dispatch-mode
            # stack, but the program at run time never sees it. Code that inspects the stack (e.g.
            # torch's MultiheadAttention asking whether make_fx is tracing) must see the stack as it
            # will be at run time: empty, guarded; a user's own mode makes the frame fall back.
            from kiln_dynamo.fake import FakeMode

            stack = [torch._C._get_dispatch_stack_at(i) for i in range(fn())]
            if any(not isinstance(mode, FakeMode) for mode in stack):
                raise Unsupported(
                    "a TorchDispatchMode is active around the compiled code; kiln does not trace under it"
                )
            tx.output.guards.no_dispatch_modes()
            return ConstantVariable(0)
        consts = all(a.is_constant() for a in [*args, *kwargs.values()])
        if consts and fn in _FOLD_ON_CONSTANTS:
            out = fn(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
            return tx.wrap_constant(out)
        if isinstance(fn, types.FunctionType) and any(
            _is_callable_argument(a) for a in [*args, *kwargs.values()]
        ):
            # Note [torch functions that take a callable]: a graph node cannot hold a module or a
            # function (`F.triplet_margin_with_distance_loss(..., distance_function=nn.PairwiseDistance())`);
            # torch's Python function is inlined instead, so the callable is traced where it is called
            from kiln_dynamo.variables.functions import UserFunctionVariable

            return UserFunctionVariable(fn, self.source).call(tx, args, kwargs)
        return tx.output.create_call(tx, "call_function", fn, args, kwargs)


_FOREACH_ADD_PRODUCTS = {torch._foreach_addcdiv_: "addcdiv_", torch._foreach_addcmul_: "addcmul_"}


def _locals_on_two_devices(tx: Tx) -> bool:
    """Whether the frame's tensor locals live on two devices, 0-dim CPU tensors aside (Note [Fast
    paths on two devices])."""
    devices: set[torch.device] = set()
    for vt in tx.locals.values():
        if not _is_tensor(vt):
            continue
        fake = vt.fake  # type: ignore[attr-defined]
        device = getattr(fake, "fake_device", fake.device)
        if device.type == "cpu" and fake.dim() == 0:
            continue
        devices.add(device)
    return len(devices) > 1


def _is_tensor(vt: VT) -> bool:
    from kiln_dynamo.variables.tensor import TensorVariable

    return isinstance(vt, TensorVariable)


def _foreach_add_product_by_tensor(tx: Tx, fn: Any, args: list[VT]) -> VT:
    """`torch._foreach_addcdiv_(xs, as_, bs, scalars)` with the scalars as one tensor (the foreach
    Adam's stacked step sizes while compiling): one `x.addcdiv_(a, b, value=scalars[i])` per tensor
    (Note [A tensor as the value of addcdiv]; the fake kernel of the Tensor overload insists on
    real CPU scalars)."""
    xs, as_, bs = (a.iterate(tx) for a in args[:3])
    scalars = args[3]
    if not len(xs) == len(as_) == len(bs):
        raise Unsupported(f"{fn.__name__} over lists of different lengths")
    for i, (x, a, b) in enumerate(zip(xs, as_, bs, strict=True)):
        value = scalars.getitem(tx, ConstantVariable(i))
        x.call_method(tx, _FOREACH_ADD_PRODUCTS[fn], [a, b], {"value": value})
    return ConstantVariable(None)


def _symbolic_check(tx: Tx, fn: Any, cond: SymNodeVariable) -> VT:
    """`torch._check(cond)` / `torch._check_is_size(n)` on a symbolic value: a fact for the
    ShapeEnv (Note [Unbacked sizes] in kiln_symbolic): a guard when the sizes are backed, a
    narrower range for a data-dependent one (`torch._check(n >= 0)` makes `n` size-like),
    which the compiled graph's wrapper checks at run time (Note [Checks of data-dependent sizes
    at run time] in kiln_loopir)."""
    set_where(tx)
    node = cond.value.node
    expr = node.expr if fn is torch._check else sympy.Ge(node.expr, 0)
    try:
        node.shape_env.expect_true(expr)
    except ConstraintViolation as e:
        raise Unsupported(f"{fn.__name__}({expr}) fails for every value: {e}") from e
    return ConstantVariable(None)


# Note [A check of a whole tensor as an assertion in the graph]: `torch._check_tensor_all(cond)`
# (transformers' `torch_compilable_check` while compiling: llava's image-token count) raises
# RuntimeError unless every element of the bool tensor `cond` is true. Eager reads the answer with
# `.item()`, which a trace cannot; the graph gets `torch._assert_async(cond.all(), msg)` instead,
# which raises RuntimeError at run time on the same condition and which aotgrad and the scheduler
# keep for its effect (Note [Extern calls kept for their effect] in kiln_loopir). Its message is
# eager's default text: a callable message (which may read tensor data) is not called, so only
# the text differs from eager's, not the error type. `_check_tensor_all_with` is taken only with
# RuntimeError as its error type (another type would change what is raised); anything else, a
# message that is not callable (eager raises TypeError on failure) or a `cond` that is not a bool
# tensor (eager raises TypeError), is traced as before and breaks.
_TENSOR_CHECKS = {torch._check_tensor_all: ("cond", "message"),
                  torch._check_tensor_all_with: ("error_type", "cond", "message")}  # fmt: skip


def _tensor_check(tx: Tx, fn: Any, args: list[VT], kwargs: dict[str, VT]) -> VT | None:
    """`torch._check_tensor_all[_with]` as an in-graph assertion, or None when it is not one."""
    names = _TENSOR_CHECKS[fn]
    if len(args) > len(names) or any(k not in names for k in kwargs):
        return None
    bound = dict(zip(names, args, strict=False)) | kwargs
    cond = bound.get("cond")
    if "error_type" in bound and not (
        bound["error_type"].is_constant() and bound["error_type"].as_constant() is RuntimeError
    ):
        return None
    if cond is None or not _is_tensor(cond) or cond.fake.dtype != torch.bool:  # type: ignore[attr-defined]
        return None
    message = bound.get("message")
    if message is not None and message.is_constant() and message.as_constant() is not None:
        return None  # a message that is not callable: eager raises TypeError when cond fails
    text = "Expected cond to be True, but got False"
    every = cond.call_method(tx, "all", [], {})
    tx.output.create_call(tx, "call_function", torch._assert_async, [every, ConstantVariable(text)], {})
    decisions_log.info(
        "%s(%s) becomes torch._assert_async in the graph (Note [A check of a whole tensor as an "
        "assertion in the graph])",
        fn.__name__,
        cond.describe(),
    )
    return ConstantVariable(None)


def _group_by_device_and_dtype(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    """Note [Grouping tensors at trace time]: `torch._C._group_tensors_by_device_and_dtype`
    (how `clip_grad_norm_` and the foreach optimizers batch their tensors) groups by metadata the
    guards already fix, so it is answered while tracing: {(device, dtype): ([[tensors of each list
    at the group's indices]], [indices])}, in eager's order of first appearance."""
    from kiln_dynamo.variables.dicts import DictVariable
    from kiln_dynamo.variables.lists import ListVariable, TupleVariable
    from kiln_dynamo.variables.tensor import TensorVariable

    bound = dict(zip(("tensorlistlist", "with_indices"), args, strict=False)) | kwargs
    lists = [list(inner.iterate(tx)) for inner in bound["tensorlistlist"].iterate(tx)]
    with_indices = bool(bound["with_indices"].as_constant()) if "with_indices" in bound else False
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, first in enumerate(lists[0] if lists else []):
        if not isinstance(first, TensorVariable):
            raise Unsupported("_group_tensors_by_device_and_dtype over a list that holds a non-tensor")
        key = (first.fake.fake_device, first.fake.dtype)  # type: ignore[attr-defined]
        groups.setdefault(key, []).append(i)
    out: dict[Any, VT] = {}
    for key, idx in groups.items():
        # an empty list (Adam's max_exp_avg_sqs without amsgrad) stays empty in every group
        per_list = ListVariable([ListVariable([inner[i] for i in idx] if inner else []) for inner in lists])
        indices = ListVariable([ConstantVariable(i) for i in idx]) if with_indices else ListVariable([])
        out[key] = TupleVariable([per_list, indices])
    return DictVariable(out)


def _is_callable_argument(vt: VT) -> bool:
    from kiln_dynamo.variables.functions import BaseFunctionVariable
    from kiln_dynamo.variables.nn_module import NNModuleVariable

    return isinstance(vt, NNModuleVariable | BaseFunctionVariable)


# Note [Settings read through torch functions]: a torch function of no arguments that reads a
# process-wide setting is answered while tracing (its answer is no tensor) and the answer is
# guarded, `fn() == answer`, as grad mode and the default dtype are: a branch on
# `torch.are_deterministic_algorithms_enabled()` kept its first answer after the setting changed
# until the fourteenth session. (torch.backends' flags read as attributes: Note [Flags in torch's
# namespace].)
SETTING_READERS = frozenset(
    {
        torch.are_deterministic_algorithms_enabled,
        torch.is_deterministic_algorithms_warn_only_enabled,
        torch.get_float32_matmul_precision,
        torch.get_num_threads,
        torch._C._get_deterministic_algorithms,
        torch._C._get_deterministic_algorithms_warn_only,
        torch._C._get_cudnn_enabled,
        torch._C._get_mkldnn_enabled,
        torch._C._get_cudnn_deterministic,
        torch._C._get_cudnn_benchmark,
        torch._C._get_cudnn_allow_tf32,
        torch._C._get_cublas_allow_tf32,
        # fix33: folded unguarded, `x + torch.initial_seed()` kept the first call's seed after
        # `torch.manual_seed(2)`
        torch.initial_seed,
        torch.get_num_interop_threads,
        torch.is_autocast_cache_enabled,
        torch.is_warn_always_enabled,
        torch.get_deterministic_debug_mode,
    }
)

# Note [Flags in torch's namespace]: torch's modules are trusted, their functions and classes
# read without a guard, but a module attribute that is a plain value is a setting the program can
# change between calls: `torch.backends.mkldnn.enabled`, `torch.backends.cudnn.benchmark`
# (properties of the module that read torch's global state), `torch.backends.mha`'s flags. Such a
# value is guarded where it is read, through the module object itself (a trusted module may be
# reached without a source). Until the fourteenth session it was a constant of the graph: a
# branch on `torch.backends.mkldnn.enabled` kept its first answer after the flag was flipped.
_FLAG_TYPES = (bool, int, float, str, type(None))


class PythonModuleVariable(VariableTracker):
    def __init__(self, module: types.ModuleType, source: Source | None) -> None:
        self.module = module
        self.source = source

    def describe(self) -> str:
        return f"module {self.module.__name__}"

    def python_type(self) -> type:
        return types.ModuleType

    def identity(self) -> object:
        return self.module

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.source(self.source) if self.source is not None else cg.const(self.module)

    def getattr(self, tx: Tx, name: str) -> VT:
        value = getattr(self.module, name)
        # torch's own namespace is trusted (not guarded: a model reads hundreds of its names);
        # the standard library's modules are not (`math.sqrt = ...` recompiles).
        trusted = self.module.__name__.split(".")[0] == "torch"
        src = None if trusted or self.source is None else AttrSource(self.source, name)
        if trusted and type(value) in _FLAG_TYPES:  # Note [Flags in torch's namespace]
            src = AttrSource(ConstSource(self.module, self.module.__name__), name)
        vt = tx.wrap(value, src)
        from kiln_dynamo.variables.opaque import OpaqueCallableVariable

        if isinstance(vt, OpaqueCallableVariable):
            vt.label = f"{self.module.__name__}.{name}"  # os.getpid, not posix.getpid
        return vt


class GradModeVariable(VariableTracker):
    """torch.no_grad() / enable_grad() / set_grad_enabled(b), as a context manager."""

    def __init__(
        self,
        target: bool,
        applied_on_create: bool,
        cls: type = torch.set_grad_enabled,
        prev: bool | None = None,
    ) -> None:
        self.target = target
        self.prev = torch.is_grad_enabled() if prev is None else prev
        self.applied = applied_on_create
        self.cls = cls
        self.outside = False  # a block entered before the frame split (Note [Grad mode when a graph raises] in codegen.py)

    def getattr(self, tx: Tx, name: str) -> VT:
        if name == "__class__":
            return GradModeFactoryVariable(self.cls)
        if name == "mode":
            return ConstantVariable(self.target)
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    @staticmethod
    def create(tx: Tx, fn: Any, args: list[VT]) -> GradModeVariable:
        tx.output.guards.global_state()
        if fn is torch.no_grad:
            return GradModeVariable(False, False, fn)
        if fn is torch.enable_grad:
            return GradModeVariable(True, False, fn)
        target = bool(args[0].as_constant())
        v = GradModeVariable(target, True, fn)
        v.set(tx, target)
        return v

    def describe(self) -> str:
        return f"grad mode context ({self.target})"

    def python_type(self) -> type:
        return torch.set_grad_enabled

    def set(self, tx: Tx, mode: bool) -> None:
        tx.output.set_grad_mode(mode)

    def enter(self, tx: Tx) -> VT:
        if not self.applied:
            self.prev = torch.is_grad_enabled()
            self.set(tx, self.target)
        return ConstantVariable(None)

    def exit(self, tx: Tx) -> VT:
        self.set(tx, self.prev)
        if self.outside:  # Note [Grad mode when a graph raises] (codegen.py)
            tx.output.unwind_grad_mode = self.prev
        return ConstantVariable(None)

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        """`torch.no_grad()(f)` / `enable_grad()(f)`: the decorator, applied in the frame
        (`@torch.no_grad()` over a nested def). `set_grad_enabled(b)` changes grad mode when it is
        made, which a decorator does not undo: not modelled."""
        if self.cls not in (torch.no_grad, torch.enable_grad) or kwargs or len(args) != 1:
            raise Unsupported(f"calling {self.describe()}")
        from kiln_dynamo.variables.functions import BaseFunctionVariable

        if not isinstance(args[0], BaseFunctionVariable):
            raise Unsupported(f"{self.describe()} decorating {args[0].describe()}")
        return GradModeFunctionVariable(args[0], self.target, self.cls)


class GradModeFunctionVariable(VariableTracker):
    """A function decorated in the frame with `torch.no_grad()` or `torch.enable_grad()`: a
    call runs it with grad mode set, and restores the caller's mode after it returns or raises,
    as the decorator's wrapper does."""

    def __init__(self, fn: VT, target: bool, cls: type) -> None:
        self.fn = fn
        self.target = target
        self.cls = cls

    def describe(self) -> str:
        return f"{self.fn.describe()} decorated with torch.{self.cls.__name__}()"

    def python_type(self) -> type:
        return types.FunctionType

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        prev = torch.is_grad_enabled()
        tx.output.set_grad_mode(self.target)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:
            tx.output.set_grad_mode(prev)

    def reconstruct(self, cg: Reconstructor) -> str:
        return f"{cg.const(self.cls)}()({self.fn.reconstruct(cg)})"


class GradModeFactoryVariable(VariableTracker):
    """torch.no_grad, torch.enable_grad or torch.set_grad_enabled, the classes."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def describe(self) -> str:
        return f"torch.{self.fn.__name__}"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return GradModeVariable.create(tx, self.fn, args)

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.const(self.fn)


class AutocastVariable(VariableTracker):
    """`torch.autocast(device_type, dtype, enabled, cache_enabled)` as a context manager.

    Note [Autocast as graph state]: entering and leaving become graph nodes
    (`torch.amp._enter_autocast` / `_exit_autocast`, the pair torch's own tracers use), so the graph
    runs its ops under the same autocast region as eager. While tracing, a real autocast context
    is entered too: autocast sits above the Python dispatch key, so the fake tensors then see the
    casts and the graph's metadata matches what eager computes. Contexts still open when tracing
    stops are closed by capture (`OutputGraph.open_contexts`). A frame is not split inside an
    autocast block (breaks.py); the block then runs as plain Python, correctly.
    """

    def __init__(self, args: tuple[Any, ...], prev: tuple[bool, Any, bool] | None = None) -> None:
        self.args = args  # (device_type, dtype, enabled, cache_enabled)
        self.node: Any = None
        self.real: Any = None
        # the state its exit restores: (enabled, dtype, cache_enabled) of the device before entry;
        # given when the block was entered before this frame (a continuation: already entered)
        self.prev = prev
        self.entered_before = prev is not None

    def describe(self) -> str:
        return f"torch.autocast{self.args}"

    def python_type(self) -> type:
        return torch.autocast

    @staticmethod
    def create(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> AutocastVariable:
        names = ("device_type", "dtype", "enabled", "cache_enabled")
        values: dict[str, Any] = {"dtype": None, "enabled": True, "cache_enabled": None}
        for name, vt in [*zip(names, args, strict=False), *kwargs.items()]:
            if name not in names or not vt.is_constant():
                raise Unsupported(f"torch.autocast with argument {name}={vt.describe()}")
            values[name] = vt.as_constant()
        if "device_type" not in values:
            raise Unsupported("torch.autocast without a device_type")
        tx.output.guards.global_state()
        return AutocastVariable(tuple(values[n] for n in names))

    def enter(self, tx: Tx) -> VT:
        from torch.amp.autocast_mode import _enter_autocast

        device = self.args[0]
        self.prev = (
            torch.is_autocast_enabled(device),
            torch.get_autocast_dtype(device),
            torch.is_autocast_cache_enabled(),
        )
        self.real = torch.autocast(*self.args)
        self.real.__enter__()
        tx.output.open_contexts.append(self.real)
        self.node = tx.output.graph.create_node("call_function", _enter_autocast, self.args, {})
        self.node.meta["source_line"] = tx.where()
        return self

    def exit(self, tx: Tx) -> VT:
        from torch.amp.autocast_mode import _exit_autocast

        from kiln_dynamo.variables.opaque import restore_autocast, set_autocast_state

        if self.entered_before:  # entered by the runner of the split frame: restore explicitly
            assert self.prev is not None
            # Note [Leaving a block entered before the frame]: the runner restores it too
            node = tx.output.graph.create_node(
                "call_function", set_autocast_state, (self.args[0], *self.prev), {}
            )
            node.meta["source_line"] = tx.where()
            restore_autocast(self.args[0], *self.prev)
            return ConstantVariable(None)
        node = tx.output.graph.create_node("call_function", _exit_autocast, (self.node,), {})
        node.meta["source_line"] = tx.where()
        tx.output.open_contexts.remove(self.real)
        self.real.__exit__(None, None, None)
        return ConstantVariable(None)


class AutocastFactoryVariable(VariableTracker):
    """The class torch.autocast (torch.amp.autocast)."""

    def describe(self) -> str:
        return "torch.autocast"

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return AutocastVariable.create(tx, args, kwargs)

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.const(torch.autocast)


class WithExitVariable(VariableTracker):
    """The bound `__exit__` that BEFORE_WITH leaves on the stack."""

    def __init__(self, ctx: GradModeVariable | AutocastVariable) -> None:
        self.ctx = ctx

    def describe(self) -> str:
        return "__exit__ of " + self.ctx.describe()

    def call(self, tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return self.ctx.exit(tx)

    def real_exit(self) -> object:
        """The object that stands for this exit in real code (Note [Grad mode across a split])."""
        from kiln_dynamo.variables.opaque import GRAD_MODE_EXITS, autocast_exit

        if isinstance(self.ctx, GradModeVariable):
            return GRAD_MODE_EXITS[self.ctx.prev]
        return autocast_exit(self.ctx.args[0], self.ctx.prev)

    def reconstruct(self, cg: Reconstructor) -> str:
        return cg.const(self.real_exit())


GRAD_MODE_FACTORIES: tuple[Any, ...] = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)
MATH = math


# Note [Activation checkpointing]: `torch.utils.checkpoint.checkpoint(fn, *args,
# use_reentrant=False)` runs `fn` without keeping its activations and runs it again in the
# backward; its values and gradients are those of `fn(*args)`. kiln traces the call as `fn(*args)`
# inlined: what to save and what to recompute is the backend's partitioner's choice (kiln_aotgrad's
# min-cut), as torch.compile leaves it to its own. The reentrant variant (use_reentrant=True, the
# old default) is a break: it gives no gradient to parameters when no input requires grad, which an
# inlined call would. Non-default options (context_fn, debug, determinism_check) break too.
_CHECKPOINT_DEFAULTS = {"preserve_rng_state": None, "determinism_check": "default", "debug": False}


def trace_checkpoint(tx: Tx, args: list[VT], kwargs: dict[str, VT]) -> VT:
    from torch.utils import checkpoint

    kwargs = dict(kwargs)
    reentrant = kwargs.pop("use_reentrant", None)
    if reentrant is None or not reentrant.is_constant() or reentrant.as_constant() is not False:
        raise Unsupported(
            "torch.utils.checkpoint with use_reentrant=True (or unset): kiln traces only use_reentrant=False",
            advice="pass use_reentrant=False (torch's recommended variant)",
        )
    for name, default in _CHECKPOINT_DEFAULTS.items():
        vt = kwargs.pop(name, None)
        if vt is not None and not (vt.is_constant() and (default is None or vt.as_constant() == default)):
            raise Unsupported(f"torch.utils.checkpoint with {name}={vt.describe()}")
    context_fn = kwargs.pop("context_fn", None)
    if context_fn is not None and context_fn.identity() is not checkpoint.noop_context_fn:
        raise Unsupported("torch.utils.checkpoint with a context_fn")
    if not args:
        raise Unsupported("torch.utils.checkpoint without a function")
    return tx.call(args[0], args[1:], kwargs)  # Note [Activation checkpointing]
