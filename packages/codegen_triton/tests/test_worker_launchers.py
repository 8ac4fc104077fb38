"""Note [Launchers built in the workers] (compile_worker.py): a worker builds the per-signature C
launcher of each kernel it compiled where Triton builds one per signature, and nothing where
Triton's launcher is generic or the build fails. No GPU and no C compiler run here: a stand-in for
Triton's NVIDIA driver module records what would be built."""

from __future__ import annotations

import types
from typing import Any

import pytest
import triton.backends.nvidia

from kiln_codegen_triton import compile_worker


class Kernel:
    def __init__(self, name: str, signature: str = "") -> None:
        self.src = types.SimpleNamespace(
            name=name, constants={"XBLOCK": 64}, signature={0: signature or name}
        )
        self.metadata = types.SimpleNamespace(name=name)


def _driver(monkeypatch: pytest.MonkeyPatch, *, per_signature: bool, fail: bool = False) -> list[Any]:
    built: list[Any] = []

    class CudaLauncher:
        def __init__(self, src: Any, metadata: Any) -> None:
            built.append(src.name)
            if fail:
                raise RuntimeError("no C compiler")

    fake = types.ModuleType("triton.backends.nvidia.driver")
    fake.CudaLauncher = CudaLauncher  # type: ignore[attr-defined]
    if per_signature:
        fake.make_launcher = lambda *a: ""  # type: ignore[attr-defined]
        fake.compile_module_from_src = lambda *a, **k: None  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "triton.backends.nvidia.driver", fake)
    monkeypatch.setattr(triton.backends.nvidia, "driver", fake, raising=False)
    monkeypatch.setattr(compile_worker, "_launcher_class", None)
    return built


def test_worker_builds_each_kernels_launcher_where_triton_builds_per_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _driver(monkeypatch, per_signature=True)
    compile_worker.build_launcher(Kernel("a"), "cuda")
    compile_worker.build_launcher(Kernel("b"), "cuda")
    compile_worker.build_launcher(None, "cuda")  # a preload that returned nothing
    assert built == ["a", "b"]


def test_worker_builds_nothing_for_a_generic_launcher_or_another_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _driver(monkeypatch, per_signature=False)
    compile_worker.build_launcher(Kernel("a"), "cuda")
    assert built == []
    built = _driver(monkeypatch, per_signature=True)
    compile_worker.build_launcher(Kernel("a"), "hip")
    assert built == []


def test_a_failed_build_stops_the_worker_building_and_raises_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    tried = _driver(monkeypatch, per_signature=True, fail=True)
    compile_worker.build_launcher(Kernel("a"), "cuda")
    compile_worker.build_launcher(Kernel("b"), "cuda")  # not tried again
    assert tried == ["a"]


def test_workers_build_each_shared_launcher_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Two kernels of one signature (two workers, one cache folder): the second is skipped."""
    built = _driver(monkeypatch, per_signature=True)
    compile_worker.build_launcher(Kernel("a", "*fp32"), "cuda", str(tmp_path))
    compile_worker.build_launcher(Kernel("b", "*fp32"), "cuda", str(tmp_path))
    compile_worker.build_launcher(Kernel("c", "*bf16"), "cuda", str(tmp_path))
    assert built == ["a", "c"]
