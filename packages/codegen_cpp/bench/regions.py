"""What merging adjacent OpenMP parallel regions could save: a ceiling, measured two ways.

1. The price of a region: a C++ micro-benchmark (compiled here with the kernels' flags) runs
   ``--kernels`` tiny parallel loops (64 rows of 64 floats) as one ``#pragma omp parallel for``
   each, and the same loops as ``#pragma omp for`` inside one region (a barrier each), at
   ``--threads``; medians of 2000 interleaved rounds.
2. How many regions merging would remove: each model of the public suite (CPU size, inference)
   is compiled with kiln, and its wrappers are read for runs of adjacent C++ kernel calls (no
   extern op between them); a run with ``k`` parallel kernels could share one region, saving
   ``k - 1`` forks.

    python packages/codegen_cpp/bench/regions.py --threads 2 --models resnet,gpt2,bert,mlp,cnn,convnext,t5,llama

This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_tmp = tempfile.mkdtemp(prefix="kiln-regions-")
os.environ["KILN_CACHE_DIR"] = _tmp

import torch  # noqa: E402

import kiln  # noqa: E402
from kiln_bench.models import build, logits_of  # noqa: E402
from kiln_codegen_cpp.build import compiler  # noqa: E402

MICRO = r"""#include <omp.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
static float a[1<<16], b[1<<16], c[1<<16];
__attribute__((noinline)) void sep(int n, int nt) {
  for (int k = 0; k < n; ++k) {
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < 64; ++i) for (int j = 0; j < 64; ++j) b[i*64+j] = a[i*64+j] * 2.0f + k;
  }
}
__attribute__((noinline)) void merged(int n, int nt) {
  #pragma omp parallel num_threads(nt)
  for (int k = 0; k < n; ++k) {
    #pragma omp for schedule(static)
    for (int i = 0; i < 64; ++i) for (int j = 0; j < 64; ++j) b[i*64+j] = a[i*64+j] * 2.0f + k;
  }
}
int main(int argc, char** argv) {
  int nt = argc > 1 ? atoi(argv[1]) : 2;
  for (int n : {2, 8}) {
    double bs = 1e9, bm = 1e9;
    std::vector<double> ss, ms;
    for (int r = 0; r < 2000; ++r) {
      auto t0 = std::chrono::steady_clock::now(); sep(n, nt);
      auto t1 = std::chrono::steady_clock::now(); merged(n, nt);
      auto t2 = std::chrono::steady_clock::now();
      ss.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      ms.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
    std::sort(ss.begin(), ss.end()); std::sort(ms.begin(), ms.end());
    printf("nt %d kernels %d: separate median %.2f us (min %.2f), merged median %.2f us (min %.2f)\n", nt, n, ss[1000], ss[0], ms[1000], ms[0]);
  }
}
"""


def micro(threads: int) -> str:
    src = os.path.join(_tmp, "regions.cpp")
    exe = os.path.join(_tmp, "regions")
    with open(src, "w") as f:
        f.write(MICRO)
    subprocess.run([compiler(), "-O3", "-march=native", "-fopenmp", src, "-o", exe], check=True)
    return subprocess.run([exe, str(threads)], capture_output=True, text=True, check=True).stdout


def adjacent(name: str) -> str:
    before = set(glob.glob(f"{_tmp}/cpp/*/*/wrapper_*.py"))
    workload = build(name, "cpu")
    workload.model.eval()
    kiln.reset()
    with torch.no_grad():
        logits_of(kiln.compile(workload.model)(**workload.inputs))
    runs: list[list[bool]] = []
    total = par = 0
    for wrapper in sorted(set(glob.glob(f"{_tmp}/cpp/*/*/wrapper_*.py")) - before):
        src = "\n".join(  # kernels.cpp, or kernels_p<j>.cpp for a graph built in parts
            Path(path).read_text()
            for path in sorted(glob.glob(os.path.join(os.path.dirname(wrapper), "kernels*.cpp")))
        )
        parallel = {
            m.group(1)
            for m in re.finditer(r'extern "C" int64_t (\w+)\(', src)
            if "omp parallel" in src[m.end() : src.find("\n}\n", m.end())]
        }
        run: list[bool] = []
        with open(wrapper) as f:
            for line in f:
                m = re.search(r"k_(cpp_\w+)\(", line)
                if m:
                    total += 1
                    par += m.group(1) in parallel
                    run.append(m.group(1) in parallel)
                elif "# extern" in line or "_interp" in line:
                    if len(run) > 1:
                        runs.append(run)
                    run = []
        if len(run) > 1:
            runs.append(run)
    saved = sum(max(0, sum(r) - 1) for r in runs)
    return (
        f"{name:9s} kernels {total:3d}, parallel {par:3d}, runs of adjacent kernels {len(runs)}, "
        f"forks merging would save {saved}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default="resnet,gpt2,bert,mlp,cnn,convnext,t5,llama")
    args = parser.parse_args()
    print(micro(args.threads), end="", flush=True)
    torch.set_num_threads(1)
    for name in filter(None, args.models.split(",")):
        print(adjacent(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
