"""Note [Native launches] (native_launch.py): the C launch object, built here with the system
compiler. Without a GPU its ``dry`` form returns the parameter bytes it would pass to
``cuLaunchKernel``; on a GPU the codegen suite launches every kernel kind through it, and
``gpu_compile.py`` checks the plans against the PTX's parameter lists (CI, no GPU needed)."""

from __future__ import annotations

import struct
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from kiln_codegen_triton import native_launch, runtime
from kiln_codegen_triton.heuristics import Config
from kiln_codegen_triton.kernel import KernelSpec


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache folder and no module loaded yet."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native_launch, "_module", None)
    monkeypatch.setattr(native_launch, "_failed", False)
    return tmp_path


@pytest.fixture
def dry_driver(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch objects built in their dry form, standing in for a driver."""
    module = native_launch.module()
    assert module is not None

    def dry_launch(*args: Any, **kwargs: Any) -> Any:
        return module.Launch(*args, **kwargs, dry=True)

    monkeypatch.setattr(native_launch, "for_launches", lambda: types.SimpleNamespace(Launch=dry_launch))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def _bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def test_a_dry_launch_returns_the_parameters_it_would_pass(fresh: Path) -> None:
    module = native_launch.module()
    assert module is not None
    plan = [("q", 2), ("p", 0), ("i", 1), ("f", 3), ("d", 3), ("k", -7), ("c", 0), ("c", 0)]
    launch = module.Launch("k", 0, (4, 2, 1), 128, 0, plan, 4, 0, dry=True)
    assert "grid=(4, 2, 1) block=128" in repr(launch) and launch.name == "k"
    got = launch(77, 2**63 + 5, -3, -(2**40), 0.1)
    assert got == (
        77,  # the stream
        4,
        2,  # the grid's x and y, as built
        2**64 - 2**40,  # int64, two's complement
        2**63 + 5,  # the pointer, all 64 bits
        2**32 - 3,  # int32
        _bits(0.1),  # float32: 0.1 rounded to float
        int(struct.unpack("<Q", struct.pack("<d", 0.1))[0]),  # float64
        2**32 - 7,  # a 4-byte constant
        0,
        0,  # Triton's two scratch pointers
    )
    assert launch(0, 16, 2**31 - 1, 2**63 - 1, 3)[5:7] == (2**31 - 1, _bits(3.0))
    import copy

    assert copy.copy(launch) is launch and copy.deepcopy({"k": launch})["k"] is launch


def test_a_dry_launch_rejects_bad_arguments_with_the_kernel_named(fresh: Path) -> None:
    module = native_launch.module()
    assert module is not None
    launch = module.Launch(
        "triton_poi_fused_add_0", 0, (1, 1, 1), 32, 0, [("p", 0), ("i", 1)], 2, 0, dry=True
    )
    with pytest.raises(TypeError, match="triton_poi_fused_add_0 takes 3 arguments"):
        launch(0, 16)
    with pytest.raises(TypeError, match="argument 0 of kind 'p'"):
        launch(0, torch.zeros(1), 1)  # a tensor where its pointer belongs
    with pytest.raises(TypeError, match="argument 0 of kind 'p'"):
        launch(0, -16, 1)
    with pytest.raises(OverflowError, match="does not fit int32"):
        launch(0, 16, 2**31)
    with pytest.raises(TypeError, match="no keyword"):
        launch(0, 16, x=1)
    with pytest.raises(ValueError, match="reads argument 2 of 2"):
        module.Launch("k", 0, (1, 1, 1), 32, 0, [("p", 2)], 2, 0, dry=True)
    with pytest.raises(ValueError, match="unknown kind"):
        module.Launch("k", 0, (1, 1, 1), 32, 0, [("x", 0)], 1, 0, dry=True)


def test_a_launch_of_symbolic_sizes_takes_its_grid_after_the_stream(fresh: Path) -> None:
    module = native_launch.module()
    assert module is not None
    plan = [("p", 0), ("q", 1), ("c", 0), ("c", 0)]
    launch = module.Launch("k", 0, (1, 1, 1), 128, 0, plan, 2, 0, dry=True, grid_args=True)
    assert launch(5, 30, 2, 16, 3000) == (5, 30, 2, 16, 3000, 0, 0)
    with pytest.raises(TypeError, match="a stream, the grid's x and y and 2"):
        launch(5, 16, 3000)
    with pytest.raises(ValueError, match="grid y of 65536 is outside CUDA's limits"):
        launch(5, 1, 65536, 16, 3000)
    with pytest.raises(ValueError, match="grid x of -1"):
        launch(5, -1, 1, 16, 3000)


def test_the_module_is_built_once_and_reused_from_disk(fresh: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = dict(native_launch.counters)
    # a damaged file (what a crash or a hand left) is built again, never trusted
    path = native_launch._path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared object")
    assert native_launch.module() is not None
    assert "does not load" in caplog.text
    assert native_launch.counters["native_built"] == before["native_built"] + 1
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no build folder left over
    native_launch._module = None
    assert native_launch.module() is not None
    assert native_launch.counters["native_reused"] == before["native_reused"] + 1
    assert native_launch.counters["native_built"] == before["native_built"] + 1


def test_prepare_builds_in_the_background_once(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_launch, "_preparing", None)
    built = native_launch.counters["native_built"]
    native_launch.prepare()
    thread = native_launch._preparing
    assert thread is not None and thread.name == "kiln-native-launch-build"
    native_launch.prepare()
    assert native_launch._preparing is thread  # one build per process
    assert native_launch.module() is not None  # waits for the thread's build, does not start another
    thread.join()
    assert native_launch.counters["native_built"] == built + 1


def test_without_a_compiler_kernels_keep_the_python_launcher(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", "kiln-no-such-compiler")
    monkeypatch.setattr(native_launch, "_compiler", lambda: None)
    assert native_launch.module() is None
    assert "native kernel launches unavailable" in caplog.text
    assert native_launch.for_launches() is None
    calls: list[tuple[Any, ...]] = []
    launch = runtime._fast_launcher(_compiled(Launcher(calls)), SPEC, Config(XBLOCK=256))
    launch(7, 100, 200)
    assert calls and calls[0][:4] == (4, 1, 1, 7)  # through Triton's C launch, as before


class Launcher:
    """Triton 3.6's CudaLauncher as runtime._direct_call recognizes it, with none of the flags
    a native launch declines."""

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.launch = lambda *a: calls.append(a)
        self.global_scratch_size = self.profile_scratch_size = 0
        self.launch_cooperative_grid = self.launch_pdl = False

    def __call__(self, gridX: int, gridY: int, gridZ: int, stream: int, function: Any, *args: Any) -> None:
        raise AssertionError("not called: the direct path calls launch")


Launcher.__name__ = "CudaLauncher"


def _compiled(run: Any, signature: dict[str, str] | None = None, packed: Any = (4, 1, 0)) -> Any:
    fn = types.SimpleNamespace(arg_names=["p_out", "p_x", "XBLOCK", "n_unused"])
    sig = signature or {"p_x": "*fp32", "p_out": "*fp32", "XBLOCK": "constexpr"}
    src = types.SimpleNamespace(signature=sig, fn=fn)
    return types.SimpleNamespace(src=src, run=run, function=0xF00, packed_metadata=packed)


SPEC = KernelSpec(
    name="k", source="", params=("x", "out"), param_dtypes=(torch.float32, torch.float32), kind="pointwise",
    xnumel=1000, ynumel=1, rnumel=1, scratch=(), members=(), atomic=False, outer=False,
)  # fmt: skip


def test_a_symbolic_kernels_launcher_computes_its_grid_and_calls_the_native_launch(dry_driver: None) -> None:
    """Note [Symbolic sizes in Triton kernels]: sizes after the pointers (int64), the grid from
    them at each call; here 1500 elements in blocks of 256."""
    from test_launcher import symbolic_spec

    spec = symbolic_spec()
    fn = types.SimpleNamespace(arg_names=["p_x", "p_out", "s0", "s1", "XBLOCK"])
    signature = {"p_x": "*fp32", "p_out": "*fp32", "s0": "i64", "s1": "i64", "XBLOCK": "constexpr"}
    compiled = types.SimpleNamespace(
        src=types.SimpleNamespace(signature=signature, fn=fn),
        run=Launcher([]),
        function=0xF00,
        packed_metadata=(4, 1, 0),
    )
    launch = runtime._fast_launcher(compiled, spec, Config(XBLOCK=256))
    assert launch(7, 100, 200, 5, 300) == (7, 6, 1, 100, 200, 5, 300, 0, 0)  # type: ignore[func-returns-value]
    assert launch(7, 100, 200, 0, 300)[1] == 0  # type: ignore[index]  # no elements: a grid of 0


def test_the_plan_follows_the_kernels_parameters_not_the_wrappers_order() -> None:
    # the kernel declares out before x; the wrapper passes (stream, x, out)
    assert runtime.native_plan(_compiled(None), ["p_x", "p_out"]) == [("p", 1), ("p", 0), ("c", 0), ("c", 0)]
    # a runtime parameter the wrapper does not pass as a pointer: no plan
    odd = {"p_x": "*fp32", "p_out": "*fp32", "XBLOCK": "i32"}
    assert runtime.native_plan(_compiled(None, odd), ["p_x", "p_out"]) is None


def test_a_fast_launcher_is_a_native_launch_with_the_grid_block_and_plan(
    dry_driver: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a driver (here: the dry form standing in for it), the wrapper's slot is the C object."""
    calls: list[tuple[Any, ...]] = []
    launch = runtime._fast_launcher(_compiled(Launcher(calls)), SPEC, Config(XBLOCK=256))
    assert "grid=(4, 1, 1) block=128 shared=0" in repr(launch)  # 1000 in blocks of 256; 4 warps
    assert launch(7, 100, 200) == (7, 4, 1, 200, 100, 0, 0)  # type: ignore[func-returns-value]
    assert calls == []
    # switched off, or a kernel with flags it does not handle: the Python launcher
    monkeypatch.setenv("KILN_TRITON_NATIVE_LAUNCH", "0")
    assert isinstance(
        runtime._fast_launcher(_compiled(Launcher(calls)), SPEC, Config(XBLOCK=256)), types.FunctionType
    )
    monkeypatch.delenv("KILN_TRITON_NATIVE_LAUNCH")
    pdl = Launcher(calls)
    pdl.launch_pdl = True
    assert isinstance(runtime._fast_launcher(_compiled(pdl), SPEC, Config(XBLOCK=256)), types.FunctionType)
    clusters = _compiled(Launcher(calls), packed=(4, 2, 0))
    assert isinstance(runtime._fast_launcher(clusters, SPEC, Config(XBLOCK=256)), types.FunctionType)
    oversized = _compiled(Launcher(calls), packed=(4, 1, 229 * 1024))
    assert isinstance(runtime._fast_launcher(oversized, SPEC, Config(XBLOCK=256)), types.FunctionType)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="launches on a GPU")
def test_on_a_gpu_every_static_kernel_is_launched_natively_and_agrees_with_eager() -> None:
    """The wrapper's slots are Launch objects, the results eager's, including a kernel whose
    parameters the wrapper passes in another order than it declares them."""
    from kiln_codegen_triton import TritonBackend
    from kiln_loopir import compile_graph

    aten = torch.ops.aten

    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        y = aten.relu.default(aten.add.Tensor(x, w))
        return aten._softmax.default(y, 1, False), aten.sum.dim_IntList(y, [0]), aten.mul.Tensor(y, 3.0)

    x, w = torch.randn(64, 300, device="cuda"), torch.randn(300, device="cuda")
    backend = TritonBackend()
    compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, w], backend=backend)
    for _ in range(2):
        for got, want in zip(compiled(x, w), fn(x, w), strict=True):
            torch.testing.assert_close(got, want)
    kinds = {type(launcher.fast).__name__ for launcher in backend.last_launchers.values()}
    assert kinds == {"Launch"}, kinds


def test_the_backend_option_reaches_every_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """``options={"triton.native_launch": False}`` (kiln_bench's ablation) or the environment."""
    from kiln_codegen_triton import TritonBackend
    from kiln_loopir import compile_graph

    def fn(x: torch.Tensor) -> Any:
        return torch.ops.aten.relu.default(x), torch.ops.aten.sum.default(x)

    x = torch.randn(8, 8)
    for kwargs, env, want in [({}, None, True), ({"native_launch": False}, None, False), ({}, "0", False)]:
        if env is not None:
            monkeypatch.setenv("KILN_TRITON_NATIVE_LAUNCH", env)
        backend = TritonBackend(**kwargs)
        compile_graph(torch.fx.symbolic_trace(fn), [x], backend=backend)
        assert backend.last_launchers and {lz.native for lz in backend.last_launchers.values()} == {want}
