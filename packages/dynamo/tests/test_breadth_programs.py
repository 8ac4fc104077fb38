"""The breadth suite's hand-written programs (`bench/breadth_programs.py`) are portable, as a
model author writes them: they run eagerly in float32 and bfloat16, and every tensor created
inside a forward is given a device (the input's). On the GPU the suite moves each model and its
inputs to the device and the dtype; a program that creates a CPU or a float32 tensor inside its
forward failed there in eager, so no compiler was measured on it (session 30, H100 bf16)."""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import breadth_programs  # type: ignore[import-not-found]  # noqa: E402

NAMES = sorted(breadth_programs.PROGRAMS)
SOURCE = str(Path(breadth_programs.__file__).resolve())

# Outputs kept in float32 on purpose whatever the model's dtype: the MoE router runs in float32
# (`softmax(dtype=torch.float32)`), and its load-balancing statistics come from it.
FLOAT32_BY_DESIGN = {"moe_topk"}

FACTORIES = {
    torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor, torch.as_tensor,
    torch.randn, torch.rand, torch.randint, torch.linspace, torch.eye,
}  # fmt: skip


def _cast(inputs: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """What the suite's harness does to the inputs: floating tensors to the dtype."""

    def cast(t: Any) -> Any:
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    return pytree.tree_map(cast, inputs)


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        out = [getattr(out, f.name) for f in dataclasses.fields(out)]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _tensors(v)]
    return []


def _run(name: str, dtype: torch.dtype) -> Any:
    model, inputs, _ = breadth_programs.PROGRAMS[name]()
    model = model.to(dtype)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(**_cast(inputs, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_program_runs_eagerly_in_the_dtype(name: str, dtype: torch.dtype) -> None:
    """Each program runs in the dtype it is cast to, and its floating outputs are in that dtype
    (a float32 tensor made inside the forward would promote them, or fail: `scatter`,
    `index_add_`, a Linear, LayerNorm's mixed-dtype check)."""
    out = _run(name, dtype)
    floating = {t.dtype for t in _tensors(out) if t.is_floating_point()}
    assert floating, f"{name}: no floating output"
    allowed = {dtype, torch.float32} if name in FLOAT32_BY_DESIGN else {dtype}
    if name == "autocast_mlp":
        allowed.add(torch.bfloat16)  # the value computed under autocast
    assert floating <= allowed, f"{name} in {dtype}: outputs in {floating}"


class _Factories(TorchFunctionMode):
    """Records the factory calls made from the programs' file without a `device=`."""

    def __init__(self) -> None:
        super().__init__()
        self.missing: list[str] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs:
            frame: FrameType | None = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back  # torch's own Python (a functional, a module's forward)
            if frame is not None and frame.f_code.co_filename == SOURCE:
                self.missing.append(f"torch.{func.__name__} at line {frame.f_lineno}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_no_tensor_is_created_in_forward_without_a_device(name: str) -> None:
    """A stand-in for another device: every `torch.<factory>(...)` the forward calls from the
    programs' file passes `device=` (building the model and its inputs is not checked: the
    harness moves those)."""
    model, inputs, _ = breadth_programs.PROGRAMS[name]()
    mode = _Factories()
    with torch.no_grad(), warnings.catch_warnings(), mode:
        warnings.simplefilter("ignore")
        model(**inputs)
    assert mode.missing == [], f"{name}: {mode.missing}"


def test_the_device_check_sees_a_factory_without_a_device() -> None:
    """The check above is not vacuous: a factory called from the programs' file without a device
    is recorded, and one with a device is not."""
    x = torch.randn(2, 5, 16)
    mode = _Factories()
    with mode:
        breadth_programs.timestep_embedding(torch.tensor([1, 2]), 8)
    assert mode.missing == []
    code = compile("torch.zeros(3)\ntorch.zeros(3, device=x.device)\n", SOURCE, "exec")
    with mode:
        exec(code, {"torch": torch, "x": x})
    assert mode.missing == ["torch.zeros at line 1"]


# ops torch runs only with some argument on the CPU: the op's name, the argument's position
CPU_ONLY = {"_pack_padded_sequence": 1}


class _OnDevice(TorchFunctionMode):
    """A stand-in for another device: the inputs are marked as living on it, and so is every
    result of an op given a marked tensor, except `.cpu()` and `.to("cpu")`; an op that torch
    runs only on CPU arguments (`CPU_ONLY`) records a marked argument."""

    def __init__(self, inputs: list[torch.Tensor]) -> None:
        super().__init__()
        self.marked = {id(t): t for t in inputs}  # kept alive: ids are not reused
        self.wrong: list[str] = []

    def _to_cpu(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if name == "cpu":
            return True
        if name != "to":
            return False
        device = kwargs.get("device", args[1] if len(args) > 1 else None)
        return isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu"

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        given = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if name in CPU_ONLY and id(args[CPU_ONLY[name]]) in self.marked:
            self.wrong.append(f"{name} is given argument {CPU_ONLY[name]} on the device")
        out = func(*args, **kwargs)
        if self._to_cpu(name, args, kwargs):
            # on the CPU `.cpu()` returns its tensor itself: a new tensor stands for the copy
            return out.view_as(out) if any(out is t for t in given) else out
        if any(id(t) in self.marked for t in given):
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.marked[id(t)] = t
        return out


@pytest.mark.parametrize("name", NAMES)
def test_cpu_only_arguments_are_moved_to_the_cpu(name: str) -> None:
    """`pack_padded_sequence` wants its lengths on the CPU whatever the device of the sequence:
    a program moves them there (`lengths.cpu()`) rather than relying on the harness."""
    model, inputs, _ = breadth_programs.PROGRAMS[name]()
    tensors = [t for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    mode = _OnDevice(tensors + list(model.parameters()) + list(model.buffers()))
    with torch.no_grad(), warnings.catch_warnings(), mode:
        warnings.simplefilter("ignore")
        model(**inputs)
    assert mode.wrong == [], f"{name}: {mode.wrong}"
