"""Note [Precompiled headers]: the prelude's system headers precompiled once, the same libraries."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cpp_check import aten, make, trace

from kiln_codegen_cpp import CppBackend, pch, prepare_headers
from kiln_codegen_cpp import build as cpp_build
from kiln_codegen_cpp.prelude import PRELUDE
from kiln_loopir import compile_graph

SRC = Path(cpp_build.__file__).resolve().parents[1]


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache of its own and no header known to this process (as a new program starts)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    saved = (dict(pch._ready), dict(pch._waiting), set(pch._tried), pch._off[0])
    pch._ready.clear(), pch._waiting.clear(), pch._tried.clear()
    pch._off[0] = False
    yield tmp_path
    pch._ready.clear(), pch._waiting.clear(), pch._tried.clear()
    pch._ready.update(saved[0]), pch._waiting.update(saved[1]), pch._tried.update(saved[2])
    pch._off[0] = saved[3]


def _unit(tag: float) -> str:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return aten.mul.Tensor(aten.exp.default(x), tag)

    backend = CppBackend({"overlap_builds": False, "precompiled_headers": False})
    compile_graph(trace(fn), [make((64,))], backend=backend)
    return backend.last_source


def _flags() -> tuple[str, list[str], str]:
    cxx = cpp_build.compiler()
    return cxx, cpp_build._object_flags(()), cpp_build.compiler_identity(cxx) + cpp_build.cpu_identity()


def test_the_header_is_the_preludes_leading_includes() -> None:
    text = pch.header_text()
    assert text.splitlines()[0] == "#define PY_SSIZE_T_CLEAN"
    assert "#include <Python.h>" in text and "#include <omp.h>" in text
    start = PRELUDE.index("#define PY_SSIZE_T_CLEAN")
    assert PRELUDE[start:].startswith(text), "the same lines, in the prelude's order"


def test_a_build_with_the_header_makes_the_same_library(fresh: Path) -> None:
    assert prepare_headers()
    include = pch.include_flags(*_flags(), start=False)
    assert include and include[0] == "-include" and Path(include[1] + ".gch").stat().st_size > 1_000_000
    source = _unit(0.8125)
    libs = []
    for headers in (True, False):
        src, lib = fresh / "unit.cpp", fresh / f"unit_{headers}.so"  # the file's name is in the object
        cpp_build._compile(source, src, lib, (), headers)
        libs.append(lib.read_bytes())
    assert libs[0] == libs[1]
    # GCC read the .gch: with -H it marks a precompiled header it used with "!"
    cxx, flags, _ = _flags()
    out = subprocess.run(
        [cxx, *flags, "-H", *include, "-fsyntax-only", str(fresh / "unit.cpp")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert any(line.startswith("!") and line.endswith(".gch") for line in out.stderr.splitlines())


def test_a_damaged_header_is_never_used(fresh: Path) -> None:
    assert prepare_headers()
    header = Path(pch.include_flags(*_flags(), start=False)[1])
    gch = Path(str(header) + ".gch")
    gch.write_bytes(gch.read_bytes()[:100_000])  # truncated: GCC would stop on it
    pch._ready.clear()  # a new process: the manifest is checked again
    assert pch.include_flags(*_flags()) == []
    source = _unit(0.9375)
    cpp_build._compile(source, fresh / "u.cpp", fresh / "u.so", (), True)
    assert (fresh / "u.so").exists()


def test_a_build_the_header_breaks_is_retried_without_it(
    fresh: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A header that went bad after it was checked: the build fails with it, succeeds without,
    and the header stays off for the process, with a warning."""
    assert prepare_headers()
    header = Path(pch.include_flags(*_flags(), start=False)[1])
    gch = Path(str(header) + ".gch")
    gch.write_bytes(gch.read_bytes()[:100_000])
    with caplog.at_level(logging.WARNING, logger="kiln.codegen_cpp.cache"):
        cpp_build._compile(_unit(1.0625), fresh / "u.cpp", fresh / "u.so", (), True)
    assert (fresh / "u.so").exists()
    assert pch._off[0] and "precompiled header" in caplog.text
    assert pch.include_flags(*_flags()) == []


def test_a_source_error_is_reported_once_and_keeps_the_header(fresh: Path) -> None:
    assert prepare_headers()
    with pytest.raises(cpp_build.CppCompileError, match="kiln_no_such_name"):
        cpp_build._compile(
            PRELUDE + "\nint f() { return kiln_no_such_name; }\n", fresh / "e.cpp", fresh / "e.so", (), True
        )
    assert not pch._off[0] and pch.include_flags(*_flags(), start=False)


CHILD = """
import sys
from kiln_codegen_cpp import build, pch
cxx = build.compiler()
flags = build._object_flags(())
print(pch.include_flags(cxx, flags, build.compiler_identity(cxx) + build.cpu_identity()))
"""


def test_the_background_builder_outlives_the_program(fresh: Path) -> None:
    """A program that ends right after its first build leaves a builder that finishes the header,
    and the next program finds it."""
    env = {"KILN_CACHE_DIR": str(fresh), "PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    first = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.strip() == "[]"  # not ready: being built
    deadline = time.monotonic() + 120
    while not list(fresh.rglob(pch.MANIFEST)) and time.monotonic() < deadline:
        time.sleep(0.2)
    second = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True
    )
    assert "-include" in second.stdout, second
    assert not [p for p in fresh.rglob("*") if p.name.endswith(".tmp") or p.name == pch.BUILDING]
