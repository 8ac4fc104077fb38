"""Note [Vector width] (build.py): the width of the kernels' vectors is the build target's.

The generated C++ names no width, so the same translation unit is compiled here for an Intel
AVX-512 server core (``-march=skylake-avx512``, to assembly only: it need not run here) with
GCC's own preference and with ``CppOptions.vector_width=512``; and the option reaches the
compiler, the cache key and the results at 1 and 2 threads.
"""

from __future__ import annotations

import re
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cpp_check import aten, check, make

from kiln_codegen_cpp import CppBackend, CppOptions
from kiln_codegen_cpp.build import cache_key, compiler
from kiln_loopir import compile_graph


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _kernels(x: torch.Tensor, y: torch.Tensor) -> Any:
    """A pointwise chain through libmvec (exp, tanh), a row and a column reduction, a max-pool."""
    pointwise = aten.mul.Tensor(aten.exp.default(x), aten.tanh.default(x))
    rows = aten.sum.dim_IntList(aten.exp.default(x), [1])
    cols = aten.amax.default(x, [0])
    pool = aten.max_pool2d_with_indices.default(y, [3, 3], [2, 2], [1, 1])[0]
    return pointwise, rows, cols, pool


def _assembly(source: str, tmp: Path, *flags: str) -> str:
    src = tmp / "kernels.cpp"
    src.write_text(source)
    out = tmp / "kernels.s"
    include = sysconfig.get_paths()["include"]
    cmd = [compiler(), "-std=c++17", "-O3", *flags, "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]
    cmd += ["-DKILN_LIBMVEC", "-w", f"-I{include}", "-S", str(src), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out.read_text()


def _registers(asm: str, kind: str) -> int:
    return len(re.findall(rf"%{kind}\d+", asm))


def test_kernels_compile_for_avx512_at_either_width(tmp_path: Path) -> None:
    x, y = make((64, 300)), make((2, 8, 32, 32))
    compiled = check(_kernels, x, y)
    source = compiled.backend.last_source  # type: ignore[attr-defined]
    # Intel's AVX-512 tuning prefers 256-bit vectors: ymm and libmvec's AVX2 variants
    preferred = _assembly(source, tmp_path, "-march=skylake-avx512")
    assert _registers(preferred, "ymm") > 0 and _registers(preferred, "zmm") == 0
    assert "_ZGVdN8v_expf" in preferred
    # -mprefer-vector-width=512 (vector_width=512): zmm registers; exp and tanh still vector
    # calls into libmvec (GCC 12 keeps their loops at 8 lanes: the AVX2 variants)
    wide = _assembly(
        source, tmp_path, "-march=skylake-avx512", *CppOptions(vector_width=512).compiler_flags()
    )
    assert _registers(wide, "zmm") > 0
    assert re.search(r"_ZGV\w*N(8|16)v_expf", wide) and re.search(r"_ZGV\w*N(8|16)v_tanhf", wide)


def test_vector_width_option(threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert CppOptions().compiler_flags() == ()
    assert CppOptions(vector_width=256).compiler_flags() == ("-mprefer-vector-width=256",)
    with pytest.raises(ValueError, match="vector_width"):
        CppOptions(vector_width=384)
    monkeypatch.setenv("KILN_CPP_OPTIONS", "vector_width=512,weighted_work=0")
    assert CppBackend().options == CppOptions(vector_width=512, weighted_work=False)
    monkeypatch.delenv("KILN_CPP_OPTIONS")
    # the flags are part of the cache key: a width is never served another width's object
    assert cache_key("int x;") != cache_key("int x;", ("-mprefer-vector-width=512",))
    x, y = make((64, 300)), make((2, 8, 32, 32))
    expected = check(_kernels, x, y)(x, y)
    gm = torch.fx.symbolic_trace(_kernels)
    for width in (256, 512):
        backend = CppBackend(CppOptions(vector_width=width))
        fn = compile_graph(gm, [x, y], backend=backend)
        assert backend.last_built is not None
        for n in (1, 2):
            torch.set_num_threads(n)
            for got, want in zip(fn(x, y), expected, strict=True):
                torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-5)
