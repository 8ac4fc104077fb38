"""Compile cache, concurrent compilation, compiler errors, logging, and the backend's registration."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from cpp_check import aten, check, make, trace

import kiln_codegen_cpp
from kiln_codegen_cpp import CppBackend, CppCompileError, counters
from kiln_loopir import compile_graph, get_backend

SRC = Path(kiln_codegen_cpp.__file__).resolve().parents[1]

# a child process compiles one graph and prints the counters and a checksum of the result
CHILD = textwrap.dedent(
    """
    import json, sys, torch, kiln_loopir
    from kiln_codegen_cpp import CppBackend, counters
    kiln_loopir.register_backend("cpp", CppBackend)
    aten = torch.ops.aten
    def fn(x):
        return aten.add.Tensor(aten.mul.Tensor(aten.tanh.default(x), 3.0), float(sys.argv[1]))
    x = torch.arange(1000, dtype=torch.float32) / 100
    gm = torch.fx.symbolic_trace(fn)
    compiled = kiln_loopir.compile_graph(gm, [x], backend="cpp")
    ok = torch.allclose(compiled(x), fn(x))
    print(json.dumps({**counters, "ok": ok}))
    """
)


def _child(cache: Path, tag: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "KILN_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, tag], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_cache_entries_get_the_users_umask(tmp_path: Path) -> None:
    """Note [Cache file modes] (kiln_loopir.diskcache): source, object, manifest and wrapper are
    created as the user's other files are (here under umask 027), not 0600."""
    env = {
        **os.environ,
        "KILN_CACHE_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "7.25"],
        env=env,
        capture_output=True,
        text=True,
        umask=0o027,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (lib,) = tmp_path.rglob("kernels.so")
    modes = {p.name.split("_")[0]: stat.S_IMODE(p.stat().st_mode) for p in lib.parent.iterdir()}
    assert modes == {"kernels.so": 0o750, "kernels.cpp": 0o640, "kernels.json": 0o640, "wrapper": 0o640}


def test_two_processes_compiling_at_once(tmp_path: Path) -> None:
    procs = [_child(tmp_path, "2.5"), _child(tmp_path, "2.5")]
    results = [_result(p) for p in procs]
    assert all(r["ok"] for r in results)
    assert sum(r["compiles"] + r["disk_hits"] for r in results) == 2
    assert len(list(tmp_path.rglob("*.so"))) == 1 and not [
        p for p in tmp_path.rglob("*.tmp") if "cpp-pch" not in p.parts
    ]
    # a later process finds the object on disk: no compile, asserted by its counters
    third = _result(_child(tmp_path, "2.5"))
    assert third == {"compiles": 0, "disk_hits": 1, "memory_hits": 0, "corrupt": 0, "ok": True}
    assert list(tmp_path.rglob("wrapper_*.py")), "the wrapper is kept beside the kernels"


def test_same_graph_twice_in_process_compiles_once() -> None:
    def fn(x: torch.Tensor) -> Any:
        return aten.sub.Tensor(aten.cos.default(x), 0.125)

    x = make((33,))
    before = dict(counters)
    check(fn, x)
    check(fn, x)
    assert counters["compiles"] - before["compiles"] <= 1
    assert counters["memory_hits"] - before["memory_hits"] >= 1


def _unique_graph(tag: float) -> Any:
    def fn(x: torch.Tensor) -> Any:
        return aten.mul.Tensor(aten.sin.default(x), tag)

    return trace(fn)


@pytest.mark.parametrize("overlap", [True, False])
def test_missing_compiler_gives_a_clean_error(monkeypatch: pytest.MonkeyPatch, overlap: bool) -> None:
    monkeypatch.setenv("KILN_CXX", "/nonexistent/bin/g++")
    backend = CppBackend({"overlap_builds": overlap})
    with pytest.raises(CppCompileError, match=r"'/nonexistent/bin/g\+\+' could not be run .*kernels\.cpp"):
        # Note [Builds that overlap]: the build's error reaches the first call, or the compile
        # when the builds do not overlap
        compiled = compile_graph(_unique_graph(0.375 + overlap / 16), [make((8,))], backend=backend)
        assert overlap, "without overlap the compile raises"
        compiled(make((8,)))


@pytest.mark.parametrize("overlap", [True, False])
def test_failing_compiler_names_the_file_and_its_message(
    monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    monkeypatch.setenv("KILN_CPP_FLAGS", "-O2 --no-such-flag-for-kiln")
    backend = CppBackend({"overlap_builds": overlap})
    with pytest.raises(CppCompileError) as info:
        compiled = compile_graph(_unique_graph(0.625 + overlap / 16), [make((8,))], backend=backend)
        assert overlap, "without overlap the compile raises"
        compiled(make((8,)))
    text = str(info.value)
    assert "kernels.cpp" in text and "no-such-flag-for-kiln" in text


def _slow_compiler(tmp_path: Path, seconds: float) -> str:
    """A ``g++`` that sleeps first, so a build is still running when the compile returns."""
    script = tmp_path / "slow-g++"
    script.write_text(f'#!/bin/sh\nsleep {seconds}\nexec g++ "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_a_graph_is_ready_to_call_before_its_build_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Note [Builds that overlap]: the wrapper is made while g++ runs; its first kernel call waits
    for the library and binds it, and the results are the same as without overlap."""
    monkeypatch.setenv("KILN_CXX", _slow_compiler(tmp_path, 0.5))
    x = make((8,))
    backend = CppBackend({"overlap_builds": True})
    compiled = compile_graph(_unique_graph(1.375), [x], backend=backend)
    pending = backend._last_build
    assert pending is not None and pending.cache == "compiled" and not pending.done()
    out = compiled(x)
    assert pending.done() and pending.waited > 0
    torch.testing.assert_close(out, torch.sin(x) * 1.375)
    again = compiled(x)  # bound: no stand-in left
    torch.testing.assert_close(again, out)
    # the same kernels again while that build is the one in memory: no second compile
    before = dict(counters)
    compile_graph(_unique_graph(1.375), [x], backend=CppBackend({"overlap_builds": True}))
    assert counters["compiles"] == before["compiles"]


def test_two_builds_run_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two graphs compiled one after the other build side by side (a forward and its backward):
    both are still compiling when the second compile returns, and both give eager's results."""
    monkeypatch.setenv("KILN_CXX", _slow_compiler(tmp_path, 1.0))
    x = make((8,))
    first = CppBackend({"overlap_builds": True})
    second = CppBackend({"overlap_builds": True})
    a = compile_graph(_unique_graph(1.625), [x], backend=first)
    b = compile_graph(_unique_graph(1.875), [x], backend=second)
    assert first._last_build is not None and second._last_build is not None
    assert not first._last_build.done() and not second._last_build.done()
    torch.testing.assert_close(a(x), torch.sin(x) * 1.625)
    torch.testing.assert_close(b(x), torch.sin(x) * 1.875)
    # the second waited less than a whole build: it ran beside the first
    assert second._last_build.waited < 0.9


def test_output_code_is_logged(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("KILN_LOG", "output_code")
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code"):
        compile_graph(_unique_graph(0.875), [make((8,))], backend=CppBackend())
    text = caplog.text
    assert "def call(" in text and "wrapper_" in text and "kernels.cpp" in text
    assert "options: CppOptions(" in text and "cse_indirect=True" in text
    logging.getLogger("kiln.codegen_cpp.output_code").setLevel(logging.NOTSET)


def test_backend_is_found_by_name() -> None:
    assert isinstance(get_backend("cpp"), CppBackend)


def test_entry_point_is_declared() -> None:
    import importlib.metadata
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert (
        pyproject["project"]["entry-points"]["kiln_loopir.backends"]["cpp"] == "kiln_codegen_cpp:CppBackend"
    )
    installed = [
        ep for ep in importlib.metadata.entry_points(group="kiln_loopir.backends") if ep.name == "cpp"
    ]
    if installed:  # run against an installed distribution (nox): the entry point resolves
        assert installed[0].load() is CppBackend


def test_threads_follow_torch() -> None:
    source = CppBackend()
    compile_graph(_unique_graph(0.0625), [make((8,))], backend=source)
    assert "_get_threads()" in source.last_wrapper
    assert source.last_wrapper.count("_get_threads()") == 1


def test_cache_folder_removed_while_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels stay loaded in memory; a cache folder deleted under them is recreated on the next
    write (kiln_bench gives every model a temporary cache folder and deletes it afterwards)."""
    import shutil

    def f(x: torch.Tensor) -> torch.Tensor:
        return aten.add.Tensor(aten.mul.Tensor(aten.sigmoid.default(x), 5.0), 0.25)

    gm = torch.fx.symbolic_trace(f)
    args = [torch.randn(300)]
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("KILN_CACHE_DIR", str(first))
    fn = compile_graph(gm, args, backend="cpp")
    torch.testing.assert_close(fn(*args), gm(*args))
    shutil.rmtree(first)
    monkeypatch.setenv("KILN_CACHE_DIR", str(second))
    fn = compile_graph(gm, args, backend="cpp")  # memory hit for the kernels; the wrapper is written anew
    torch.testing.assert_close(fn(*args), gm(*args))
    shutil.rmtree(second)
    fn = compile_graph(gm, args, backend="cpp")
    torch.testing.assert_close(fn(*args), gm(*args))


def _scratch_graph() -> torch.fx.GraphModule:
    # the softmax's exp is a scratch buffer between two kernels; the mm makes the exp's reader
    # a separate kernel, so `e` is a real intermediate that no output aliases
    def fn(x: Any, w: Any) -> Any:
        e = aten.exp.default(aten.mm.default(x, w))
        s = aten.sum.dim_IntList(e, [1], True)
        return aten.mm.default(aten.div.Tensor(e, s), w)

    return trace(fn)


def test_scratch_buffers_persist_and_outputs_stay_fresh() -> None:
    # Note [Scratch buffers that persist]
    gm = _scratch_graph()
    x, w = make((16, 16)), make((16, 16))
    backend = CppBackend()
    compiled = compile_graph(gm, [x, w], backend=backend)
    assert "_P[" in backend.last_wrapper  # a buffer persists between calls
    first = compiled(x, w)
    kept = first.clone()
    x2 = make((16, 16))
    second = compiled(x2, w)
    torch.testing.assert_close(first, kept, rtol=0, atol=0)  # the second call left it alone
    torch.testing.assert_close(second, gm(x2, w))
    torch.testing.assert_close(compiled(x, w), gm(x, w))


def test_persistent_buffers_are_not_shared_between_threads() -> None:
    import threading

    gm = _scratch_graph()
    w = make((16, 16))
    inputs = [make((16, 16)) for _ in range(8)]
    compiled = compile_graph(gm, [inputs[0], w], backend="cpp")
    results: dict[int, torch.Tensor] = {}

    def worker(i: int) -> None:
        for _ in range(50):
            results[i] = compiled(inputs[i], w)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(inputs):
        torch.testing.assert_close(results[i], gm(x, w))


def test_a_call_that_raises_leaves_later_calls_right() -> None:
    def fn(x: Any, w: Any, idx: Any) -> Any:
        e = aten.exp.default(aten.mm.default(x, w))
        g = aten.index.Tensor(e, [idx])
        return aten.mm.default(aten.div.Tensor(e, aten.sum.dim_IntList(e, [1], True)), w), g

    gm = trace(fn)
    x, w = make((16, 16)), make((16, 16))
    good, bad = torch.tensor([0, 3]), torch.tensor([0, 99])
    compiled = compile_graph(gm, [x, w, good], backend="cpp")
    with pytest.raises(IndexError):
        compiled(x, w, bad)
    for _ in range(2):
        out = compiled(x, w, good)
        torch.testing.assert_close(out[0], gm(x, w, good)[0])
        torch.testing.assert_close(out[1], gm(x, w, good)[1])


def test_gemm_writes_into_a_kept_buffer() -> None:
    # the first GEMM's result is read by a kernel only: it is computed with mm.out into a
    # buffer kept between calls; the last GEMM's result is an output and stays fresh
    def fn(x: Any, w: Any) -> Any:
        h = aten.mm.default(x, w)
        return aten.mm.default(aten.relu.default(h), w)

    gm = trace(fn)
    x, w = make((32, 32)), make((32, 32))
    backend = CppBackend()
    compiled = compile_graph(gm, [x, w], backend=backend)
    assert backend.last_wrapper.count("out=") == 1
    first = compiled(x, w)
    kept = first.clone()
    x2 = make((32, 32))
    torch.testing.assert_close(compiled(x2, w), gm(x2, w))
    torch.testing.assert_close(first, kept, rtol=0, atol=0)
    torch.testing.assert_close(compiled(x, w), gm(x, w))
