"""The C++ build of a model's graphs in one translation unit against several (Note [Parallel C++
builds] in units.py): wall and CPU time of each graph's build, and each kernel's machine code.

The model (a kiln_bench model at CPU size, inference or a training step) is compiled once with
kiln, recording each graph's kernels as the backend hands them to the split. Then, in rounds that
interleave the variants (the machine is shared: compare within a round), every graph is built
again into a fresh cache for each part count: ``1`` is the one-unit build, ``0`` the automatic
choice. Each build is what ``CppBackend`` runs: sources written, ``g++`` (one or one per part and a
link), the manifest, the load. Printed per variant: the graphs' summed wall time (median over
rounds) and the CPU time of the compilers (user + sys of the child processes). ``--estimate 16``
compiles each graph's units one after another, split as on 16 cores, and sums each graph's
longest part: the C++ phase a machine with idle cores would see, measured on a busy one
(``--rounds 0`` for that alone). ``--disasm``
compares each kernel's disassembly (``objdump -d``, addresses and padding left out) between the
one-unit build and each split, ``--vec`` each kernel's vectorized loops in GCC's report
(``-fopt-info-vec-optimized``, over each graph): the same distinct loops must be vectorized the
same way (there are more copies in parts, which one unit folds before vectorizing); the disassembly of a few kernels
differs where, in one unit, GCC folded identical code of two kernels into one function
(``-fipa-icf``, e.g. the serial path a kernel's ``.part`` clone holds) that split parts each keep.

    python packages/codegen_cpp/bench/parallel_build.py --model gpt2 --mode training --parts 1,0,2,3 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-parallel-build-"))

import torch

import kiln
from kiln_bench.harness import step
from kiln_bench.models import build as build_model
from kiln_codegen_cpp import backend as cpp_backend
from kiln_codegen_cpp import build as cpp_build
from kiln_codegen_cpp.options import CppOptions
from kiln_codegen_cpp.units import UnitKernel, cores, split, translation_units, twins

Graph = tuple[list[UnitKernel], str]


def record(model: str, mode: str) -> list[Graph]:
    """Compile ``model`` in ``mode`` with kiln; the kernels and module of each C++ graph."""
    graphs: list[Graph] = []
    split = cpp_backend.translation_units

    def recording(kernels: list[UnitKernel], module: str, parts: list[list[int]]) -> list[str]:
        if len(parts) <= 1 and graphs and graphs[-1][0] is kernels:
            return split(kernels, module, parts)  # the backend's one-unit copy for last_source
        graphs.append((kernels, module))
        return split(kernels, module, parts)

    cpp_backend.translation_units = recording  # type: ignore[assignment]
    try:
        torch.set_num_threads(1)
        workload = build_model(model, "cpu")
        if mode == "inference":
            workload.model.eval()
        step(workload, kiln.compile(workload.model), mode)
    finally:
        cpp_backend.translation_units = split
    return graphs


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build_all(graphs: list[Graph], parts: int, flags: tuple[str, ...]) -> tuple[float, float, list[Path]]:
    """Build every graph with ``parts`` (0: automatic) into a fresh cache: wall s, compilers' CPU s,
    the objects."""
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-parallel-build-")
    cpp_build._loaded.clear()
    cpu0, t0 = children_cpu(), time.perf_counter()
    libs = []
    for kernels, module in graphs:
        built = cpp_build.build(translation_units(kernels, module, split(kernels, parts)), flags)
        libs.append(built.directory / "kernels.so")
    return time.perf_counter() - t0, children_cpu() - cpu0, libs


def disassembly(obj: Path) -> dict[str, str]:
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
            insn = re.sub(r"#.*", "", line.split("\t", 1)[1])
            if "nop" in insn or re.fullmatch(r"xchg\s+%ax,%ax\s*", insn):
                continue  # padding (the two-byte `xchg %ax,%ax` too)
            insn = re.sub(r"\b[0-9a-f]+ <([^>]*)>", r"<\1>", insn)
            functions[name] += re.sub(r"-?0x[0-9a-f]+\(%rip\)", "(%rip)", insn).strip() + "\n"
    return {k: v for k, v in functions.items() if k.startswith("cpp_fused_")}


def critical_path(
    graphs: list[Graph], parts: int, available: int, flags: tuple[str, ...]
) -> list[list[float]]:
    """Each graph's units (split as on ``available`` cores) compiled one after another, alone:
    the compiler's CPU time of each. On idle cores the parts run at once, so a graph's build
    takes about its longest part plus the link: an estimate for a machine with cores to spare,
    measured on a busy one."""
    opt = [f for f in cpp_build.flags() if f != "-shared"] + list(flags)
    out = []
    with tempfile.TemporaryDirectory(prefix="kiln-parallel-build-") as tmp:
        for g, (kernels, module) in enumerate(graphs):
            times = []
            # the automatic rule's cores on such a machine: all but one (Note [Parallel C++ builds])
            units = translation_units(kernels, module, split(kernels, parts, max(1, available - 1)))
            for j, unit in enumerate(units):
                src = Path(tmp) / f"g{g}_p{j}.cpp"
                src.write_text(unit.replace("KILN_MODULE_NAME", f"kiln_g{g}"))
                before = children_cpu()
                cmd = [cpp_build.compiler(), *opt, "-c", str(src), "-o", str(src.with_suffix(".o"))]
                subprocess.run(cmd, check=True)
                times.append(children_cpu() - before)
            out.append(times)
    return out


def vector_reports(units: list[Path]) -> Counter[tuple[str, str]]:
    """The loops GCC vectorized (``-fopt-info-vec-optimized``) in a graph's units, each as (the
    source line it reports, buffer names left out; its message). Counted over the whole graph, not
    per kernel: where two kernels share identical code, one unit's GCC folds it into one function
    (-fipa-icf) and reports both loops at the first kernel's line, split parts each at their own."""
    opt = [f for f in cpp_build.flags() if f != "-shared"] + list(CppOptions.from_env().compiler_flags())
    loops: Counter[tuple[str, str]] = Counter()
    for unit in units:
        cmd = [cpp_build.compiler(), *opt, "-S", "-o", os.devnull, str(unit), "-fopt-info-vec-optimized"]
        report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        lines = unit.read_text().splitlines()
        for line in report.splitlines():
            if (m := re.search(r":(\d+):\d+: optimized: (loop vectorized.*)$", line)) is not None:
                text = re.sub(r"\bp_\w+", "p", lines[int(m.group(1)) - 1].strip())
                loops[text, m.group(2)] += 1
    return loops


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--mode", default="training", choices=["training", "inference"])
    parser.add_argument("--parts", default="1,0", help="part counts to compare (0: automatic)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--disasm", action="store_true", help="compare each kernel's machine code")
    parser.add_argument(
        "--vec", action="store_true", help="compare each kernel's vectorized loops (GCC's report)"
    )
    parser.add_argument(
        "--estimate",
        type=int,
        default=0,
        metavar="CORES",
        help="each part's CPU time alone, split as on CORES cores: the build's critical path there",
    )
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    variants = [int(p) for p in args.parts.split(",")]
    graphs = record(args.model, args.mode)
    flags = CppOptions.from_env().compiler_flags()
    for j, (kernels, _) in enumerate(graphs):
        sizes = [len(k.source) for k in kernels]
        print(
            f"graph {j}: {len(kernels)} kernels, {sum(sizes)} chars (largest {max(sizes)}), "
            f"{len(twins(kernels))} distinct, automatic parts {len(split(kernels))} on {cores()} cores"
        )
    if args.estimate:
        result_estimate = {}
        for p in variants:
            times = critical_path(graphs, p, args.estimate, flags)
            result_estimate[p] = times
            path = sum(max(t) for t in times)
            print(
                f"estimate on {args.estimate} idle cores, parts={p}: "
                + "; ".join(f"graph {g}: " + " ".join(f"{t:.2f}" for t in ts) for g, ts in enumerate(times))
                + f" (CPU s a part): critical path {path:.2f} s, CPU {sum(map(sum, times)):.2f} s"
            )
        Path(args.out or os.devnull).with_suffix(".estimate.json").write_text(json.dumps(result_estimate))
        if not args.rounds:
            return
    wall: dict[int, list[float]] = {p: [] for p in variants}
    cpu: dict[int, list[float]] = {p: [] for p in variants}
    libs: dict[int, list[Path]] = {}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for p in order:
            w, c, libs[p] = build_all(graphs, p, flags)
            wall[p].append(w)
            cpu[p].append(c)
        print(
            f"round {r}: "
            + ", ".join(f"parts={p} {wall[p][-1]:.2f} s ({cpu[p][-1]:.2f} s CPU)" for p in variants)
        )
    result: dict[str, Any] = {
        "model": args.model,
        "mode": args.mode,
        "cores": cores(),
        "loadavg": os.getloadavg(),
        "graphs": [{"kernels": len(k), "chars": sum(len(x.source) for x in k)} for k, _ in graphs],
        "wall_s": wall,
        "cpu_s": cpu,
    }
    for p in variants:
        print(
            f"parts={p}: wall median {statistics.median(wall[p]):.2f} s (min {min(wall[p]):.2f}), "
            f"compilers' CPU median {statistics.median(cpu[p]):.2f} s"
        )
    if args.disasm and 1 in libs:
        same = True
        for p in variants:
            if p == 1:
                continue
            for a, b in zip(libs[1], libs[p], strict=True):
                da, db = disassembly(a), disassembly(b)
                unequal = sorted(k for k in da if da[k] != db.get(k))
                same = same and not unequal and da.keys() == db.keys()
                print(f"disasm parts=1 vs parts={p}: {len(da)} functions, differ: {unequal or 'none'}")
        result["same_code"] = same
    if args.vec and 1 in libs:
        same_vec = True
        for p in variants:
            if p == 1:
                continue
            for a, b in zip(libs[1], libs[p], strict=True):
                ra = vector_reports(sorted(a.parent.glob("kernels*.cpp")))
                rb = vector_reports(sorted(b.parent.glob("kernels*.cpp")))
                # Note [Parallel C++ builds]: one unit folds identical code of two kernels before it
                # vectorizes (-fipa-icf), parts in which the twins lie apart vectorize each copy
                differ = set(ra) ^ set(rb)
                same_vec = same_vec and not differ
                print(
                    f"vectorized loops parts=1 vs parts={p}: {ra.total()} against {rb.total()} (copies folded "
                    f"in one unit), {len(ra)} against {len(rb)} distinct, {len(differ)} differ"
                )
                for text, message in sorted(differ)[:5]:
                    print(
                        f"    {'one unit' if (text, message) in ra else 'parts'} only: {message}: {text[:100]}"
                    )
        result["same_vectorization"] = same_vec
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
