"""Kernel names that say what they fuse, the user's lines atop each kernel, and KILN_PROFILE."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch
import torch.fx
from cpp_check import aten, check, make

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import trace_with_user_lines

KERNEL = re.compile(r'^extern "C" int64_t (\w+)\(', re.MULTILINE)


def _names(source: str) -> list[str]:
    return KERNEL.findall(source)


def _heads(source: str) -> dict[str, list[str]]:
    """Each kernel's name -> the comment lines right above its definition."""
    lines = source.splitlines()
    out: dict[str, list[str]] = {}
    for i, line in enumerate(lines):
        match = KERNEL.match(line)
        if match is None:
            continue
        j = i
        while j > 0 and lines[j - 1].startswith("//"):
            j -= 1
        out[match.group(1)] = lines[j:i]
    return out


def _graph(x: Any, w: Any) -> Any:
    y = aten.mul.Tensor(aten.tanh.default(aten.mul.Tensor(x, 0.5)), w)
    s = aten.sum.dim_IntList(y, [1])
    return aten.exp.default(aten.view.default(s, [2, 4])), aten.cos.default(x)


def _compile(fn: Any, *inputs: Any, fusion: bool = True) -> CppBackend:
    backend = CppBackend()
    compile_graph(torch.fx.symbolic_trace(fn), list(inputs), backend=backend, fusion=fusion)
    return backend


def test_names_say_what_they_fuse_and_are_unique_identifiers() -> None:
    x, w = make((8, 32)), make((32,))
    check(_graph, x, w)
    names = _names(_compile(_graph, x, w).last_source)
    assert all(n.isidentifier() and re.fullmatch(r"cpp_fused_[a-z_]+_\d+", n) for n in names), names
    # one kernel: cos is fused horizontally (it reads x too); sorted and deduplicated ops
    assert names == ["cpp_fused_cos_exp_mul_sum_tanh_view_0"], names
    unfused = _names(_compile(_graph, x, w, fusion=False).last_source)
    assert len(set(unfused)) == len(unfused) > len(names)
    assert {n.rsplit("_", 1)[0] for n in unfused} >= {"cpp_fused_tanh", "cpp_fused_sum", "cpp_fused_cos"}


def test_each_kernel_opens_with_its_ops_and_nodes() -> None:
    source = _compile(_graph, make((8, 32)), make((32,)), fusion=False).last_source
    heads = _heads(source)
    assert heads and all(h and h[0].startswith(f"// {name} fuses ") for name, h in heads.items())
    [tanh] = [h for n, h in heads.items() if n.startswith("cpp_fused_tanh_")]
    assert tanh[0].endswith("(fx nodes tanh_default)")


def _user_fn(x: Any) -> Any:
    y = aten.sigmoid.default(x)
    return aten.mul.Tensor(y, x)


def test_kernel_comment_names_the_users_file_and_line() -> None:
    import inspect

    gm = trace_with_user_lines(_user_fn)
    backend = CppBackend()
    x = make((64,))
    torch.testing.assert_close(compile_graph(gm, [x], backend=backend)(x), _user_fn(x))
    [(name, head)] = _heads(backend.last_source).items()
    start = inspect.getsourcelines(_user_fn)[1]
    assert name.startswith("cpp_fused_mul_sigmoid_")
    assert head[1:] == [
        f"//   {__file__}:{start + 1}  y = aten.sigmoid.default(x)",
        f"//   {__file__}:{start + 2}  return aten.mul.Tensor(y, x)",
    ]


def test_kiln_profile_names_kernel_calls_in_profiler_tables(monkeypatch: Any) -> None:
    monkeypatch.setenv("KILN_PROFILE", "1")
    x, w = make((8, 32)), make((32,))
    backend = CppBackend()
    compiled = compile_graph(torch.fx.symbolic_trace(_graph), [x, w], backend=backend)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        compiled(x, w)
    keys = {e.key for e in prof.key_averages()}
    names = _names(backend.last_source)
    assert names and {f"kiln:{n}" for n in names} <= keys, sorted(keys)


def test_kiln_profile_ranges_cost_nothing_without_a_profiler(monkeypatch: Any) -> None:
    # Note [Kernel ranges cost nothing unprofiled]: no record_function is built unless a profiler
    # records; the results are the same either way
    monkeypatch.setenv("KILN_PROFILE", "1")
    built: list[str] = []
    real = torch.profiler.record_function

    def counting(name: str, *args: Any) -> Any:
        built.append(name)
        return real(name, *args)

    monkeypatch.setattr(torch.profiler, "record_function", counting)
    x, w = make((8, 32)), make((32,))
    backend = CppBackend()
    compiled = compile_graph(torch.fx.symbolic_trace(_graph), [x, w], backend=backend)
    names = _names(backend.last_source)
    assert names and "_range('kiln:" in backend.last_wrapper
    out = compiled(x, w)
    assert built == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        profiled = compiled(x, w)
    assert sorted(built) == sorted(f"kiln:{n}" for n in names)
    for a, b, ref in zip(out, profiled, _graph(x, w), strict=True):
        torch.testing.assert_close(a, ref)
        torch.testing.assert_close(b, ref)


CHILD = textwrap.dedent(
    """
    import json, re, torch, kiln_loopir
    from kiln_codegen_cpp import CppBackend, counters
    aten = torch.ops.aten
    def fn(x):
        return aten.sum.dim_IntList(aten.mul.Tensor(aten.sin.default(x), 1.75), [0]), aten.neg.default(x)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))  # a seed: allclose near 0
    backend = CppBackend()
    out = kiln_loopir.compile_graph(torch.fx.symbolic_trace(fn), [x], backend=backend, fusion=False)(x)
    ok = all(torch.allclose(a, b) for a, b in zip(out, fn(x)))
    names = re.findall(r'extern "C" int64_t (\\w+)\\(', backend.last_source)
    print(json.dumps({"names": names, "cache": backend.last_build().cache, "ok": ok}))
    """
)


def test_names_are_stable_across_processes_and_hit_the_disk_cache(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "KILN_CACHE_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }

    def run() -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD], check=False, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result

    first, second = run(), run()
    assert first["ok"] and second["ok"]
    assert first["cache"] == "compiled" and second["cache"] == "disk"
    assert first["names"] == second["names"]
    assert first["names"] == ["cpp_fused_sin_0", "cpp_fused_mul_1", "cpp_fused_sum_2", "cpp_fused_neg_3"]
