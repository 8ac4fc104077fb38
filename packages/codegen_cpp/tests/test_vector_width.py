"""Note [Vector width] (build.py): the width of the kernels' vectors is the build target's.

The generated C++ names no width, so the same translation unit is compiled here for an Intel
AVX-512 server core (``-march=skylake-avx512``, to assembly only: it need not run here) with
GCC's own preference and with ``CppOptions.vector_width=512``; and the option reaches the
compiler, the cache key and the results at 1 and 2 threads. Note [512-bit vectors on AVX-512
targets] (options.py): the default's decision, with the target's features injected.
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
from kiln_codegen_cpp import build as cpp_build
from kiln_codegen_cpp.build import cache_key, compiler, target_has_avx512, target_macros
from kiln_loopir import compile_graph

NATIVE_TUNE = cpp_build.native_tune  # the real one, before the fixture below replaces it


@pytest.fixture(autouse=True)
def native_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags asserted here are the width's alone, whatever tuning this machine's -march=native
    implies (Note [Tunings that are slow to compile] adds an -mtune on some)."""
    monkeypatch.setattr(cpp_build, "native_tune", lambda cxx: "")


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


@pytest.mark.parametrize("avx512", [True, False])
def test_wide_vectors_decision(avx512: bool) -> None:
    """Note [512-bit vectors on AVX-512 targets]: with the target's features injected, 0 takes
    512 on an AVX-512 target and leaves an AVX2 one to the compiler; an explicit width and
    ``wide_vectors=0`` override; the lanes' vector follows."""
    auto = CppOptions()
    assert auto.compiler_flags(avx512) == (("-mprefer-vector-width=512",) if avx512 else ())
    assert auto.vector_bits(avx512) == (512 if avx512 else 256)
    assert CppOptions(wide_vectors=False).compiler_flags(avx512) == ()
    assert CppOptions(wide_vectors=False).vector_bits(avx512) == 256
    for width in (128, 256, 512):
        assert CppOptions(vector_width=width).compiler_flags(avx512) == (f"-mprefer-vector-width={width}",)
        assert CppOptions(vector_width=width).vector_bits(avx512) == width


@pytest.mark.parametrize(
    ("march", "avx512"),
    [("skylake-avx512", True), ("haswell", False), ("x86-64-v4", True), ("x86-64-v3", False)],
)
def test_target_features_from_the_compiler(march: str, avx512: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build target's AVX-512 comes from the compiler's predefined macros for its flags
    (``KILN_CPP_FLAGS`` replaces ``-march=native``), not from this machine's CPU."""
    monkeypatch.setenv("KILN_CPP_FLAGS", f"-O3 -march={march}")
    assert target_has_avx512() is avx512
    assert ("__AVX2__" in target_macros(compiler(), ("-O3", f"-march={march}"))) is True
    assert CppOptions().compiler_flags() == (("-mprefer-vector-width=512",) if avx512 else ())


def test_vector_width_option(threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert CppOptions(wide_vectors=False).compiler_flags() == ()
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


@pytest.mark.parametrize("width", [256, 512])
def test_a_rows_pointwise_pass_takes_two_vectors(width: int) -> None:
    """Note [A row's pointwise pass takes two vectors]: layer norm's normalisation after its
    statistics (a kernel of 8 lanes, Note [More lanes on long rows]) runs two vectors of float32
    lanes at the kernels' width; with the switch off the kernel's 8; both are eager's, bitwise
    equal to each other; rows shorter than two vectors, a softmax's sums and the lanes of the
    statistics themselves keep theirs."""

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
        return aten.native_layer_norm.default(x, [x.shape[-1]], w, b, 1e-5)

    wide = 2 * width // 32
    for n, widened in ((768, True), (wide - 1, False)):
        x, w, b = make((6, n)), make((n,)), make((n,))
        outs = []
        for on in (True, False):
            backend = CppBackend({"vector_width": width, "wide_pointwise_passes": on})
            compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, w, b], backend=backend)
            source = backend.last_source
            assert ("l < 8;" in source) == (n >= 8)  # the statistics' lanes
            assert (f"l < {wide}; ++l) {{" in source) == (on and widened), (n, on)
            outs.append(compiled(x, w, b))
        check(fn, x, w, b)
        for a, c in zip(*outs, strict=True):
            assert torch.equal(a, c)


@pytest.mark.parametrize("tune", ["sapphirerapids", "graniterapids", "znver4", "rocketlake", ""])
def test_tunings_slow_to_compile_are_replaced(tune: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Tunings that are slow to compile]: a native tuning whose instruction scheduler takes
    most of a large unit's compile time is replaced by -mtune=skylake-avx512, the instruction set
    left native; the switch turns it off, and flags given through KILN_CPP_FLAGS are kept as given."""
    monkeypatch.setattr(cpp_build, "native_tune", lambda cxx: tune)
    slow = tune in cpp_build.SLOW_SCHEDULING_TUNES
    replaced = ("-mtune=skylake-avx512",)
    assert CppOptions(wide_vectors=False).compiler_flags() == (replaced if slow else ())
    assert CppOptions(wide_vectors=False, compile_time_tune=False).compiler_flags() == ()
    monkeypatch.setenv("KILN_CPP_FLAGS", "-O3 -march=native")
    assert CppOptions(wide_vectors=False).compiler_flags() == ()


def test_a_replaced_tuning_compiles_and_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replacement flag beside -march=native is accepted by the compiler on any x86 target and
    gives eager's results (its own cache entry: the flag is in the key)."""
    monkeypatch.setattr(cpp_build, "native_tune", lambda cxx: "sapphirerapids")
    x, y = make((64, 300)), make((2, 8, 32, 32))
    expected = check(_kernels, x, y)(x, y)
    backend = CppBackend(CppOptions())
    assert "-mtune=skylake-avx512" in backend.options.compiler_flags()
    fn = compile_graph(torch.fx.symbolic_trace(_kernels), [x, y], backend=backend)
    assert backend.last_built is not None
    for got, want in zip(fn(x, y), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-5)


def test_native_tune_is_read_from_the_compiler() -> None:
    """-march=native's tuning as the compiler reports it: a known model name on x86 hosts."""
    NATIVE_TUNE.cache_clear()
    tune = NATIVE_TUNE(compiler())
    assert tune and re.fullmatch(r"[a-z0-9-]+", tune), tune
