"""Which generated C++ loops the compiler left scalar (issue 20: "no kernel left scalar where a
vector form exists").

codegen_cpp vectorizes through the compiler: the innermost loop of a kernel carries ``#pragma
omp simd`` (reductions: Note [Lane accumulators] in kernel.py), and GCC either turns it into
vector instructions or does not, silently. This compiles translation units written by
``scripts/cpp_static_dump.py`` with the generator's own compiler and flags plus
``-fopt-info-vec-all`` and reports, per kernel, every innermost loop of a static trip count of at
least ``--min-trip`` that GCC did not vectorize, with GCC's reason (the last "not vectorized" or
"no vectype" line it gave for that loop's lines). Loops of a handful of iterations (a window of
2-4 taps, the lanes combined after a row) are not worth vectors and are left out by the trip
count; a loop whose bound is not a constant is listed with trip "?".

    python scripts/cpp_static_dump.py --out /tmp/dump --models gpt2,resnet,bert,mlp,cnn,convnext
    python scripts/cpp_vector_audit.py --dump /tmp/dump [--min-trip 16] [--only resnet]

The target is this machine's (``-march=native``): run it where the question is asked (AVX2 here,
AVX-512 on the GPU machine's host). A static audit, not a profile: a scalar loop in a kernel that
runs once on 300 elements costs nothing; `KILN_PROFILE=1` says which kernels take the time.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import re
import subprocess
import sys
from pathlib import Path

from kiln_codegen_cpp.build import compiler, flags

FOR = re.compile(r"\s*for \((?:int64_t|int) (\w+) = [^;]*; \1 < (?:INT64_C\()?(\w+)\)?;")
KERNEL = re.compile(r'extern "C" int64_t (\w+)\(')
INFO = re.compile(r".*?:(\d+):\d+: (optimized|missed): (.*)")


def innermost_loops(lines: list[str], start: int, end: int) -> list[tuple[int, int, str]]:
    """(first line, last line, trip) of each ``for`` in lines[start:end] (1-based) with no ``for``
    in its body."""
    found = []
    for i in range(start, end):
        m = FOR.match(lines[i - 1])
        if m is None or not lines[i - 1].rstrip().endswith("{"):
            continue
        indent = len(lines[i - 1]) - len(lines[i - 1].lstrip())
        last, nested = end - 1, False
        for j in range(i + 1, end):
            text = lines[j - 1]
            if text.strip() == "}" and len(text) - len(text.lstrip()) == indent:
                last = j
                break
            nested = nested or FOR.match(text) is not None
        if not nested:
            found.append((i, last, m.group(2)))
    return found


def audit(unit: Path, min_trip: int, show_all: bool = False) -> list[tuple[str, int, str, str]]:
    """(kernel, line, trip, reason) of each scalar innermost loop of ``unit``: where GCC said why
    (``show_all``: also loops it reported nothing about, which are mostly vectorized loops it
    reported at lines outside their bodies, e.g. a tail's)."""
    lines = unit.read_text().splitlines()
    cmd = [compiler(), *(f for f in flags() if f != "-shared"), "-c", str(unit), "-o", "/dev/null"]
    report = subprocess.run(
        [*cmd, "-fopt-info-vec-all=/dev/stdout"], capture_output=True, text=True, check=True
    )
    vectorized: set[int] = set()
    reasons: dict[int, list[str]] = collections.defaultdict(list)
    for text in report.stdout.splitlines():
        m = INFO.match(text)
        if m is None:
            continue
        line, kind, what = int(m.group(1)), m.group(2), m.group(3)
        if kind == "optimized" and "loop vectorized" in what:
            vectorized.add(line)
        elif kind == "missed" and ("not vectorized" in what or "no vectype" in what):
            reasons[line].append(what)
    kernels = [
        (i + 1, m.group(1)) for i, t in enumerate(lines) if (m := KERNEL.match(t)) and "alias(" not in t
    ]
    kernels.append((len(lines) + 1, ""))
    rows = []
    for (start, name), (end, _) in itertools.pairwise(kernels):
        for line, last, trip in innermost_loops(lines, start, end):
            if trip.isdigit() and int(trip) < min_trip:
                continue
            # GCC reports a loop at one of its statements' lines, not at the `for`
            body = range(line, last + 1)
            if any(k in vectorized for k in body):
                continue
            said = [r for k in body for r in reasons.get(k, [])]
            if not said and not show_all:
                continue  # GCC said nothing about these lines: often a loop it reported elsewhere
            reason = said[-1] if said else "(no reason given)"
            rows.append((name, line, trip if trip.isdigit() else "?", re.sub(r"_\d+\b", "", reason)[:140]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", required=True, help="a folder written by scripts/cpp_static_dump.py")
    parser.add_argument("--min-trip", type=int, default=8)
    parser.add_argument("--all", action="store_true", help="also loops GCC gave no reason for")
    parser.add_argument("--only", default="", help="units whose name starts with one of these (gpt2,resnet)")
    args = parser.parse_args()
    units = sorted(Path(args.dump).glob("*.kernels.cpp"))
    if args.only:
        units = [u for u in units if u.name.startswith(tuple(args.only.split(",")))]
    by_reason: collections.Counter[str] = collections.Counter()
    total = 0
    for unit in units:
        rows = audit(unit, args.min_trip, args.all)
        kernels = sum(1 for t in unit.read_text().splitlines() if KERNEL.match(t) and "alias(" not in t)
        print(
            f"== {unit.name.removesuffix('.kernels.cpp')}: {len({r[0] for r in rows})} of {kernels} kernels with a scalar loop"
        )
        for name, line, trip, reason in rows:
            print(f"   {name} line {line} trip {trip}: {reason}")
            by_reason[reason.split(":")[0] if "vectype" not in reason else "no vectype"] += 1
        total += len(rows)
    print(f"{total} scalar innermost loops (trip >= {args.min_trip} or unknown); by GCC's reason:")
    for reason, n in by_reason.most_common():
        print(f"   {n:4d}  {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
