"""Which of kiln's C++ kernels GCC left scalar: a vectorization audit of the public suite (CPU size).

Each model is compiled with kiln into a fresh cache; every translation unit is compiled again
with the same flags plus ``-fopt-info-vec-optimized -fopt-info-vec-missed`` (``--march`` picks
another target, e.g. ``skylake-avx512``: assembly only, so any target works here), and each
kernel's ``#pragma omp simd`` loops are matched with GCC's report: a loop is vectorized when GCC
says "loop vectorized" at its line. A kernel none of whose simd loops is vectorized is listed
with GCC's first reason at its loops. Lane loops of reductions (``for (int l = 0; l < 8; ...)``)
count like any other; a kernel identical to an earlier one is folded into it by GCC (-fipa-icf)
and takes its verdict. This is a benchmark, not a test.

    python packages/codegen_cpp/bench/vector_audit.py --models resnet,gpt2,bert,mlp,cnn,convnext,t5,llama
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_tmp = tempfile.mkdtemp(prefix="kiln-vector-audit-")
os.environ["KILN_CACHE_DIR"] = _tmp

import torch  # noqa: E402

import kiln  # noqa: E402
from kiln_bench.models import build, logits_of  # noqa: E402
from kiln_codegen_cpp import CppOptions  # noqa: E402
from kiln_codegen_cpp.build import BASE_FLAGS, compiler, flags  # noqa: E402

_KERNEL = re.compile(r'^extern "C" int64_t (\w+)\(')
_REPORT = re.compile(r":(\d+):\d+: (optimized|missed): (.*)$")


def _audit(source: Path, march: str | None) -> list[dict[str, Any]]:
    lines = source.read_text().splitlines()
    opt = [f for f in flags() if f not in BASE_FLAGS and f != "-shared"]
    opt += CppOptions.from_env().compiler_flags()  # KILN_CPP_OPTIONS, as the kernels were built
    if march:
        opt = [f for f in opt if not f.startswith("-march=")] + [f"-march={march}"]
    base = [f for f in BASE_FLAGS if f not in ("-shared", "-fPIC")]
    cmd = [compiler(), *opt, *base, "-S", "-o", os.devnull, str(source)]
    cmd += ["-fopt-info-vec-optimized", "-fopt-info-vec-missed"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)}: {proc.stderr[-1000:]}")
    vectorized: set[int] = set()
    missed: dict[int, str] = {}
    for line in proc.stderr.splitlines():
        m = _REPORT.search(line)
        if not m:
            continue
        number, kind, text = int(m.group(1)), m.group(2), m.group(3)
        if kind == "optimized" and "loop vectorized" in text:
            vectorized.add(number)
        elif kind == "missed" and "not vectorized:" in text and number not in missed:
            missed[number] = text.split("not vectorized:", 1)[1].strip()
    kernels: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for number, text in enumerate(lines, start=1):
        m = _KERNEL.match(text)
        if m:
            current = {"kernel": m.group(1), "simd_loops": 0, "vectorized": 0, "reason": ""}
            kernels.append(current)
        elif current is not None and text.strip().startswith("#pragma omp simd"):
            first, last = _extent(lines, number)  # the loop under the pragma (1-based lines)
            current["simd_loops"] += 1
            if any(first <= n <= last for n in vectorized):
                current["vectorized"] += 1
            elif not current["reason"]:
                reasons = [missed[n] for n in sorted(missed) if first <= n <= last]
                # the outer loops' "loop nest containing ..." says nothing about the simd loop
                reasons.sort(key=lambda r: r.startswith("loop nest"))
                current["reason"] = reasons[0] if reasons else "no report inside the loop"
    # GCC folds a kernel identical to an earlier one (-fipa-icf) and reports only the earlier
    bodies: dict[str, dict[str, Any]] = {}
    for kernel in kernels:
        body = _body(lines, kernel["kernel"])
        same = bodies.setdefault(body, kernel)
        if same is not kernel and not kernel["vectorized"]:
            kernel.update(vectorized=same["vectorized"], reason=same["reason"], folded_into=same["kernel"])
    return kernels


def _body(lines: list[str], name: str) -> str:
    start = next(i for i, t in enumerate(lines) if t.startswith(f'extern "C" int64_t {name}('))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    text = "\n".join(lines[start + 1 : end])
    order: dict[str, str] = {}  # parameters renamed by first use: same code, other buffers
    for param in re.findall(r"\bp_\w+", lines[start]):
        order.setdefault(param, f"p{len(order)}")
    return re.sub(r"\bp_\w+", lambda m: order.get(m.group(0), m.group(0)), text)


def _extent(lines: list[str], pragma: int) -> tuple[int, int]:
    """First and last line of the loop after the pragma on (1-based) line ``pragma``: GCC
    reports a loop at a line of its body or header, so the whole extent is matched."""
    depth = 0
    for number in range(pragma + 1, len(lines) + 1):
        text = lines[number - 1]
        depth += text.count("{") - text.count("}")
        if depth <= 0 and ("{" in text or "}" in text or text.rstrip().endswith(";")):
            return pragma + 1, number
    return pragma + 1, len(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet,gpt2,bert,mlp,cnn,convnext,t5,llama")
    parser.add_argument("--march", default=None, help="another -march to audit (assembly only)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    for name in filter(None, args.models.split(",")):
        before = set(Path(_tmp).rglob("kernels*.cpp"))
        workload = build(name, "cpu")
        workload.model.eval()
        kiln.reset()
        with torch.no_grad():
            logits_of(kiln.compile(workload.model)(**workload.inputs))
        units = sorted(set(Path(_tmp).rglob("kernels*.cpp")) - before)
        kernels = [k for unit in units for k in _audit(unit, args.march)]
        scalar = [k for k in kernels if k["simd_loops"] and not k["vectorized"]]
        results.append({"model": name, "kernels": len(kernels), "scalar": scalar})
        print(f"{name:10s} {len(kernels):3d} kernels, {len(scalar)} left scalar", flush=True)
        for k in scalar:
            print(f"    {k['kernel'][:70]:70s} {k['reason'][:90]}", flush=True)
    if args.out is not None:
        args.out.write_text(
            json.dumps({"march": args.march or "native", "results": results}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
