"""A graph's kernels compiled in several translation units at once (Note [Parallel C++ builds] in
units.py): results, the part count, compiler errors, the cache entry across processes and kills,
and each kernel's machine code against the one-unit build."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from cpp_check import aten, check, make, trace

from kiln_codegen_cpp import CppBackend, CppCompileError, CppOptions, counters
from kiln_codegen_cpp.prelude import ERR_VALUE_DEFINITION
from kiln_codegen_cpp.units import MIN_PART_CHARS, UnitKernel, assign, part_count, split, translation_units
from kiln_loopir import compile_graph


def _many_kernels(tag: float) -> Any:
    """A graph of four kernels (GEMMs between them keep them apart), one with an index check."""

    def fn(x: Any, w: Any, idx: Any) -> Any:
        e = aten.exp.default(aten.mm.default(x, w))
        s = aten.sum.dim_IntList(e, [1], True)
        y = aten.mm.default(aten.div.Tensor(e, s), w)
        z = aten.mm.default(aten.tanh.default(aten.mul.Tensor(y, tag)), w)
        g = aten.index.Tensor(aten.relu.default(z), [idx])
        return aten.amax.default(z, [0], True), aten.sigmoid.default(g), aten.var.correction(y, [1])

    return trace(fn)


def _inputs() -> list[torch.Tensor]:
    return [make((16, 24)), make((24, 24)), torch.tensor([0, 5, 15, 3])]


@pytest.mark.parametrize("parts", [2, 3, 64])
def test_several_parts_equal_eager(
    parts: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KILN_CPP_OPTIONS", f"build_parts={parts}")
    monkeypatch.setenv("KILN_LOG", "cache")
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.cache"):
        compiled = check(_many_kernels(0.5 + parts), *_inputs())
    logging.getLogger("kiln.codegen_cpp.cache").setLevel(logging.NOTSET)
    assert re.search(r"compiled: \S+kernels\.so in \d parts \(kernels_p0\.cpp \d+\.\d\d s, ", caplog.text)
    built = compiled.backend.last_built  # type: ignore[attr-defined]
    kernels = compiled.backend.last_source.count('extern "C" int64_t cpp_')  # type: ignore[attr-defined]
    assert kernels >= 4
    assert [p.name for p in built.sources] == [f"kernels_p{j}.cpp" for j in range(min(parts, kernels))]
    assert len(built.part_seconds) == len(built.sources)
    texts = [p.read_text() for p in built.sources]
    assert sum("PyInit_" in t for t in texts) == 1 and "PyInit_" in texts[0]
    assert sum(ERR_VALUE_DEFINITION in t for t in texts) == 1 and ERR_VALUE_DEFINITION in texts[0]


def test_a_kernel_error_from_another_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """An index out of bounds in a kernel outside part 0 is reported with its value, read through
    the module's ``err_value`` in part 0 (Note [The parts share one prelude])."""
    monkeypatch.setenv("KILN_CPP_OPTIONS", "build_parts=6")
    gm = _many_kernels(0.75)
    x, w, idx = _inputs()
    compiled = compile_graph(gm, [x, w, idx], backend=CppBackend())
    with pytest.raises(IndexError, match="99"):
        compiled(x, w, torch.tensor([0, 99, 1, 2]))
    for actual, expected in zip(compiled(x, w, idx), gm(x, w, idx), strict=True):
        torch.testing.assert_close(actual, expected)


def test_symbolic_kernels_in_parts() -> None:
    """Kernels that take size symbols as arguments (Note [Symbolic sizes in C++ kernels]) are
    declared in part 0 with them: one build in parts serves every size."""
    from kiln_symbolic import DimDynamic, ShapeEnv, make_symint

    from kiln_loopir.testing import with_vals

    env = ShapeEnv()
    n, m = (
        make_symint(env, env.create_symbol(h, f"x{k}", DimDynamic.DYNAMIC), h) for k, h in enumerate((5, 7))
    )

    def fn(x: Any, y: Any) -> Any:
        s = aten.sum.dim_IntList(aten.exp.default(x), [1], False)
        t = aten.amax.default(aten.mul.Tensor(y, 2.0), [0], False)
        return s, t, aten.sigmoid.default(aten.add.Tensor(x, aten.tanh.default(y)))

    meta = (torch.empty(n, m, device="meta"), torch.empty(n, m, device="meta"))
    backend = CppBackend({"build_parts": 3})
    compiled = compile_graph(with_vals(fn, *meta), list(meta), backend=backend)
    assert backend.last_declined == [] and backend.last_built is not None
    assert len(backend.last_built.sources) >= 2
    assert "int64_t, int64_t);" in backend.last_built.sources[0].read_text()  # a size argument, then nt
    for rows, cols in ((5, 7), (2, 3), (9, 40)):
        x, y = make((rows, cols)), make((rows, cols))
        for actual, expected in zip(compiled(x, y), fn(x, y), strict=True):
            torch.testing.assert_close(actual, expected)


def test_one_part_is_the_one_unit_build() -> None:
    """build_parts=1 (and a small graph under 0) compiles exactly the text and cache entry of
    before: one ``kernels.cpp``."""
    gm, inputs = _many_kernels(1.25), _inputs()
    one, auto = CppBackend({"build_parts": 1}), CppBackend({"build_parts": 0})
    compile_graph(gm, inputs, backend=one)
    compile_graph(gm, inputs, backend=auto)
    assert one.last_built is not None and auto.last_built is not None
    assert one.last_built.key == auto.last_built.key
    assert [p.name for p in one.last_built.sources] == ["kernels.cpp"]
    assert one.last_built.source_path.read_text().replace(
        f"kiln_{one.last_built.key[:24]}", "KILN_MODULE_NAME"
    ) == (one.last_source)


def test_the_part_count() -> None:
    big = [MIN_PART_CHARS] * 10
    assert part_count([], 0, 16) == 1
    assert part_count([100, 200, 300], 0, 16) == 1  # a few small kernels: one unit
    assert part_count(big, 0, 1) == 1  # one core: one unit
    assert part_count(big, 0, 4) == 4
    assert part_count(big, 0, 64) == 10  # never more parts than kernels
    assert part_count([5 * MIN_PART_CHARS, 100, 100], 0, 16) == 1  # one kernel holds it all
    assert part_count([2 * MIN_PART_CHARS, MIN_PART_CHARS // 2], 0, 16) == 1  # fewer than two parts' worth
    assert part_count([2 * MIN_PART_CHARS, 2 * MIN_PART_CHARS, MIN_PART_CHARS], 0, 16) == 2
    assert part_count(big, 3, 1) == 3 and part_count([1, 2], 5, 16) == 2  # asked for: at most one a kernel
    with pytest.raises(ValueError, match="build_parts"):
        CppOptions(build_parts=-1)
    assert CppOptions.from_mapping({"build_parts": 4}).build_parts == 4


def _kernel(name: str, buffer: str, body: str) -> UnitKernel:
    source = f'// {name}: from fn\nextern "C" int64_t {name}(float* p_{buffer}, int64_t nt) {{\n{body}\n}}'
    return UnitKernel(name, source, ("float*",))


def test_the_split_balances_keeps_the_order_and_twins_together() -> None:
    assert assign([10, 50, 20, 40, 30], 2) == [[0, 1, 2], [3, 4]]  # 50 + 20 + 10 against 40 + 30
    kernels = [
        _kernel("k0", "x", "  p_x[0] = 1.0f;"),
        _kernel("k1", "y", "  p_y[0] = 2.0f;" * 40),
        _kernel("k2", "z", "  p_z[0] = 1.0f;"),  # k0's twin: the same code but for names
        _kernel("k3", "w", "  p_w[1] = 3.0f;" * 30),
    ]
    assert kernels[0].code() == kernels[2].code() != kernels[3].code()
    parts = split(kernels, 2)
    assert parts == [[1], [0, 2, 3]]  # k1 alone; the twins beside k3, in the kernels' order
    assert split(kernels, 8) == [[1], [3], [0, 2]]  # at most a part a distinct kernel
    units = translation_units(kernels, "MODULE", parts, share_twins=False)
    assert len(units) == 2 and units[0].endswith("MODULE\n") and "MODULE" not in units[1]
    assert [k.name for k in kernels if k.declaration() in units[0]] == ["k0", "k2", "k3"]
    assert all(kernels[i].source in units[1] for i in (0, 2, 3)) and kernels[1].source in units[0]
    assert kernels[1].declaration() == 'extern "C" int64_t k1(float*, int64_t);'
    assert translation_units(kernels, "MODULE", []) == translation_units(kernels, "MODULE", [[0, 1, 2, 3]])
    # Note [Twins share one body]: k2 is k0's alias, in k0's part
    shared = translation_units(kernels, "MODULE", parts)
    assert kernels[0].source in shared[1] and kernels[2].source not in shared[1]
    assert 'int64_t k2(float*, int64_t) __attribute__((alias("k0")));' in shared[1]
    assert "// k2: from fn" in shared[1]  # its own comments stay


def _fake_compiler(tmp_path: Path, action: str) -> str:
    """A ``KILN_CXX`` that runs g++, except for the part ``kernels_p1.cpp``: it fails with a
    message (``fail``) or writes garbage where the object goes (``garbage``)."""
    real = shutil.which("g++")
    assert real is not None
    script = tmp_path / "fake-g++"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import subprocess, sys
            args = sys.argv[1:]
            if any(a.endswith("kernels_p1.cpp") for a in args):
                if {action!r} == "fail":
                    sys.stderr.write("kernels_p1.cpp:1:1: error: kiln test: this part does not compile\\n")
                    sys.exit(1)
                code = subprocess.call([{real!r}, *args])
                with open(args[args.index("-o") + 1], "wb") as f:
                    f.write(b"\\x7fELF" + b"\\x13" * 3000)
                sys.exit(code)
            sys.exit(subprocess.call([{real!r}, *args]))
            """
        )
    )
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("action", ["fail", "garbage"])
def test_a_part_that_fails_names_its_file_and_leaves_no_entry(
    action: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part that does not compile, or whose object is damaged (the link rejects it), raises
    CppCompileError naming the part's file (or the link of the parts); nothing is left that a
    later build could load, and the next build with a sound compiler compiles and is right."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))
    monkeypatch.setenv("KILN_CXX", _fake_compiler(tmp_path, action))
    gm, inputs = _many_kernels(2.25 if action == "fail" else 3.25), _inputs()
    with pytest.raises(CppCompileError) as info:
        compile_graph(gm, inputs, backend=CppBackend({"build_parts": 3, "overlap_builds": False}))
    text = str(info.value)
    if action == "fail":
        assert "compiling " in text and "kernels_p1.cpp:\n" in text and "this part does not compile" in text
    else:
        assert "the link of 3 parts (kernels_p0.cpp, kernels_p1.cpp, kernels_p2.cpp)" in text
    assert not list(cache.rglob("kernels.so")) and not list(cache.rglob("kernels.json"))
    assert not [p for p in cache.rglob("*.tmp") if "cpp-pch" not in p.parts], "the parts' objects are removed"
    monkeypatch.delenv("KILN_CXX")
    before = dict(counters)
    compiled = compile_graph(gm, inputs, backend=CppBackend({"build_parts": 3}))
    assert counters["compiles"] - before["compiles"] == 1 and counters["corrupt"] == before["corrupt"]
    for actual, expected in zip(compiled(*inputs), gm(*inputs), strict=True):
        torch.testing.assert_close(actual, expected)


# a child compiles a graph of several kernels in 3 parts and prints its counters and whether it matched
CHILD = textwrap.dedent(
    """
    import json, sys, torch, kiln_loopir
    from kiln_codegen_cpp import CppBackend, counters
    aten = torch.ops.aten
    def fn(x, w):
        e = aten.exp.default(aten.mm.default(x, w))
        y = aten.mm.default(aten.div.Tensor(e, aten.sum.dim_IntList(e, [1], True)), w)
        z = aten.mm.default(aten.tanh.default(y), w)
        return aten.amax.default(z, [0], True), aten.sigmoid.default(z), aten.var.correction(y, [1])
    x = torch.arange(384, dtype=torch.float32).reshape(16, 24) / 400
    w = torch.arange(576, dtype=torch.float32).reshape(24, 24) / 600 - 0.5
    gm = torch.fx.symbolic_trace(fn)
    backend = CppBackend({"build_parts": 3})
    compiled = kiln_loopir.compile_graph(gm, [x, w], backend=backend)
    ok = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(compiled(x, w), fn(x, w)))
    print(json.dumps({**counters, "ok": bool(ok), "parts": len(backend.last_built.sources)}))
    """
)


def _spawn(cache: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "KILN_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so a kill reaches the g++ of every part
    )


def _run(cache: Path) -> tuple[dict[str, Any], str]:
    proc = _spawn(cache)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"child died with {proc.returncode}:\n{err}"
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result, err


def test_a_split_entry_loads_in_a_second_process_and_is_verified(tmp_path: Path) -> None:
    first, _ = _run(tmp_path)
    assert (first["compiles"], first["parts"], first["ok"]) == (1, 3, True)
    (lib,) = tmp_path.rglob("kernels.so")
    assert json.loads((lib.parent / "kernels.json").read_text())["parts"] == 3
    second, _ = _run(tmp_path)
    assert (second["compiles"], second["disk_hits"], second["corrupt"], second["ok"]) == (0, 1, 0, True)
    # the linked object of a split entry is vouched for by its manifest as a one-unit one is
    lib.write_bytes(lib.read_bytes()[:2000])
    third, err = _run(tmp_path)
    assert (third["compiles"], third["disk_hits"], third["corrupt"], third["ok"]) == (1, 0, 1, True)
    assert "corrupt C++ cache entry" in err


def test_a_process_killed_while_its_parts_compile(tmp_path: Path) -> None:
    """SIGKILL a process (and its g++ processes) while the parts' objects are being written: no
    loadable half entry is left; the next process compiles, right, and leaves a sound entry."""
    victim = _spawn(tmp_path)
    # wait (on the file system, not a clock) for the parts' temporary objects
    while victim.poll() is None and not list(tmp_path.rglob(".kernels_p*.o.*.tmp")):
        time.sleep(0.005)
    assert victim.poll() is None, "the child finished before its parts were seen"
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=60)
    assert not list(tmp_path.rglob("kernels.json"))
    survivor, err = _run(tmp_path)
    assert (survivor["compiles"], survivor["corrupt"], survivor["ok"]) == (1, 0, True), err
    third, _ = _run(tmp_path)
    assert (third["compiles"], third["disk_hits"], third["ok"]) == (0, 1, True)


def _disassembly(obj: Path) -> dict[str, str]:
    """Each cpp_fused_ function of ``obj`` (and its OpenMP outlined bodies), its instructions
    with addresses and padding left out (jumps and calls by their target's name)."""
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True, check=True
    )
    functions: dict[str, str] = {}
    name = ""
    for line in out.stdout.splitlines():
        if m := re.match(r"^[0-9a-f]+ <(.+)>:$", line):
            name = m.group(1)
            functions[name] = ""
        elif name and "\t" in line:
            insn = line.split("\t", 1)[1]
            if "nop" in insn or re.fullmatch(r"xchg\s+%ax,%ax\s*", insn):
                continue  # padding (also the two-byte `xchg %ax,%ax`), which follows where the function lies
            insn = re.sub(r"#.*", "", insn)  # the comment: an address
            insn = re.sub(r"\b[0-9a-f]+ <([^>]*)>", r"<\1>", insn)  # jumps and calls: by name
            functions[name] += re.sub(r"-?0x[0-9a-f]+\(%rip\)", "(%rip)", insn).strip() + "\n"
    return {k: v for k, v in functions.items() if k.startswith("cpp_fused_")}


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
def test_each_kernel_compiles_to_the_same_code_in_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Note [Parallel C++ builds]: a kernel's machine code does not depend on the part it is in."""
    gm, inputs = _many_kernels(4.5), _inputs()
    code = []
    for parts in (1, 3):
        monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / str(parts)))
        backend = CppBackend({"build_parts": parts})
        compile_graph(gm, inputs, backend=backend)
        assert backend.last_built is not None
        code.append(_disassembly(backend.last_built.directory / "kernels.so"))
    assert len(code[0]) >= 4 and code[0] == code[1]


def test_twins_written_once_give_the_same_results_and_less_source() -> None:
    """Note [Twins share one body]: a graph of repeated blocks compiles its twin kernels once, the
    others as aliases, and computes what it computed with every kernel in full."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        for _ in range(3):  # three blocks of the same shape: twin kernels
            x = aten.add.Tensor(aten.mul.Tensor(aten.tanh.default(x), w), 0.5)
            x = aten.mm.default(x, w)
        return (x,)

    gm = torch.fx.symbolic_trace(fn)
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    results, sources = [], []
    for share in (True, False):
        backend = CppBackend({"share_twins": share, "build_parts": 1})
        compiled = compile_graph(gm, [x, w], backend=backend)
        results.append(compiled(x, w))
        sources.append(backend.last_source)
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    torch.testing.assert_close(results[0], gm(x, w))
    assert sources[0].count("__attribute__((alias(") >= 1 and "__attribute__((alias(" not in sources[1]
    assert len(sources[0]) < len(sources[1])
