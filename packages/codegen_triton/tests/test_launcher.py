"""The fast launcher's direct call of Triton's C launch function (Note [Calling the C launch
directly] in runtime.py), against launchers shaped like Triton 3.6's and 3.8's ``CudaLauncher``:
what reaches the C function must be what their ``__call__`` would pass. On a GPU the codegen
suite (every kernel kind, compared with eager) runs the real launcher through this path."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from kiln_codegen_triton import runtime
from kiln_codegen_triton.heuristics import Config
from kiln_codegen_triton.kernel import KernelSpec

SCRATCH: list[Any] = []


def _allocate(size: int) -> Any:
    SCRATCH.append(size)
    return f"scratch{size}" if size else None


class Launcher36:
    """The calling convention of Triton 3.6's CudaLauncher: grid, stream, function, *args."""

    def __init__(self, calls: list[tuple[Any, ...]], scratch: int = 0) -> None:
        self.launch = lambda *a: calls.append(a)
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True

    def __call__(self, gridX: int, gridY: int, gridZ: int, stream: int, function: Any, *args: Any) -> None:
        g, p = _allocate(self.global_scratch_size), _allocate(self.profile_scratch_size)
        self.launch(
            gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl, g, p, *args
        )


class Launcher38:
    """Triton 3.8's: the launch metadata and hooks named, argument annotations passed along."""

    def __init__(self, calls: list[tuple[Any, ...]], scratch: int = 0) -> None:
        self.launch = lambda *a: calls.append(a)
        self.global_scratch_size, self.profile_scratch_size = 0, scratch
        self.launch_cooperative_grid, self.launch_pdl = True, False
        self.arg_annotations, self.kernel_signature, self.gsan_enabled = ("ann",), b"sig", False

    def __call__(
        self,
        gridX: int,
        gridY: int,
        gridZ: int,
        stream: int,
        function: Any,
        kernel_metadata: Any,
        launch_metadata: Any,
        launch_enter_hook: Any,
        launch_exit_hook: Any,
        *args: Any,
    ) -> None:
        g, p = _allocate(self.global_scratch_size), _allocate(self.profile_scratch_size)
        self.launch(
            gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
            kernel_metadata, launch_metadata, launch_enter_hook, launch_exit_hook, g, p,
            self.arg_annotations, self.kernel_signature, args,
        )  # fmt: skip


for cls in (Launcher36, Launcher38):
    cls.__name__ = "CudaLauncher"  # what the direct path recognizes, with the parameter names


def _compiled(run: Any) -> Any:
    fn = types.SimpleNamespace(arg_names=["p_x", "p_out", "XBLOCK", "n_unused"])
    src = types.SimpleNamespace(signature={"p_x": "*fp32", "p_out": "*fp32", "XBLOCK": "constexpr"}, fn=fn)
    return types.SimpleNamespace(src=src, run=run, function="cufunction", packed_metadata=("meta",))


SPEC = KernelSpec(
    name="k", source="", params=("x", "out"), param_dtypes=(torch.float32, torch.float32), kind="pointwise",
    xnumel=1000, ynumel=1, rnumel=1, scratch=(), members=(), atomic=False, outer=False,
)  # fmt: skip


@pytest.mark.parametrize("cls", [Launcher36, Launcher38], ids=["triton-3.6", "triton-3.8"])
@pytest.mark.parametrize("scratch", [0, 64])
def test_direct_launch_passes_what_the_launcher_would(cls: Any, scratch: int) -> None:
    config = Config(XBLOCK=256)
    via_run: list[tuple[Any, ...]] = []
    runtime._fast_launcher(_compiled(cls(via_run, scratch)), SPEC, config, direct=False)(7, 100, 200)
    direct: list[tuple[Any, ...]] = []
    launch = runtime._fast_launcher(_compiled(cls(direct, scratch)), SPEC, config)
    SCRATCH.clear()
    launch(7, 100, 200)
    assert direct == via_run and len(direct) == 1
    assert direct[0][:4] == (4, 1, 1, 7)  # the grid for 1000 elements in blocks of 256, the stream
    # no scratch: the C function is called directly (nothing allocated); with scratch, through run
    allocated = [] if scratch == 0 else [scratch, 0] if cls is Launcher36 else [0, scratch]
    assert allocated == SCRATCH


def test_an_unknown_launcher_goes_through_run(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    class CudaLauncher:  # another version's signature: never called directly
        launch = None
        global_scratch_size = profile_scratch_size = 0

        def __call__(self, *args: Any) -> None:
            calls.append(args)

    assert runtime._direct_call(CudaLauncher()) is None
    runtime._fast_launcher(_compiled(CudaLauncher()), SPEC, Config(XBLOCK=1024))(3, 1, 2)
    assert calls == [(1, 1, 1, 3, "cufunction", ("meta",), None, None, None, 1, 2, 1024)]  # XBLOCK last
    monkeypatch.setenv("KILN_TRITON_DIRECT_LAUNCH", "0")
    off: list[tuple[Any, ...]] = []
    runtime._fast_launcher(_compiled(Launcher36(off)), SPEC, Config(XBLOCK=1024))(3, 1, 2)
    assert off[0][5:9] == (False, True, None, None) and SCRATCH[-2:] == [0, 0]  # through __call__


def symbolic_spec() -> KernelSpec:
    """A pointwise kernel over ``s0 * s1`` elements (sizes ``s0``, ``s1``; hint 12)."""
    import sympy

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    return KernelSpec(
        name="k", source="", params=("x", "out"), param_dtypes=(torch.float32, torch.float32),
        kind="pointwise", xnumel=s0 * s1, ynumel=1, rnumel=1, scratch=(), members=(), atomic=False,
        outer=False, size_params=("s0", "s1"), numel_hints=(12, 1, 1),
    )  # fmt: skip


def test_a_kernel_of_symbolic_sizes_takes_them_after_its_pointers_and_computes_its_grid() -> None:
    """Note [Symbolic sizes in Triton kernels]: the size arguments follow the pointers and the
    grid is computed from them at each launch (both paths pass the same)."""
    spec = symbolic_spec()

    def compiled(run: Any) -> Any:
        fn = types.SimpleNamespace(arg_names=["p_x", "p_out", "s0", "s1", "XBLOCK"])
        signature = {"p_x": "*fp32", "p_out": "*fp32", "s0": "i64", "s1": "i64", "XBLOCK": "constexpr"}
        return types.SimpleNamespace(
            src=types.SimpleNamespace(signature=signature, fn=fn),
            run=run,
            function="cufunction",
            packed_metadata=("meta",),
        )

    for cls in (Launcher36, Launcher38):
        via_run: list[tuple[Any, ...]] = []
        direct: list[tuple[Any, ...]] = []
        runtime._fast_launcher(compiled(cls(via_run)), spec, Config(XBLOCK=256), direct=False)(
            7, 100, 200, 5, 300
        )
        runtime._fast_launcher(compiled(cls(direct)), spec, Config(XBLOCK=256))(7, 100, 200, 5, 300)
        assert direct == via_run and direct[0][:4] == (6, 1, 1, 7)  # 1500 elements in blocks of 256
        assert runtime.warmup_args(spec)[2:] == [runtime.GENERIC_SIZE] * 2
    assert direct[0][-1] == (100, 200, 5, 300, 256)  # Triton 3.8's argument tuple: pointers, sizes, XBLOCK
