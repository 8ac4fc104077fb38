"""OpenMP parallel regions on their own, without torch or kiln: is a 16-thread team slow on this host
whatever runs in it, or only with some loop bodies (the vector tanh, 512-bit vectors), or only after a
pause long enough for the workers to sleep? (Issue 20: GPT-2 at 16 threads on the H100 host, each of
kiln's parallel kernels ~7.9 ms where 4 threads took 0.06 ms; eager and inductor were not slow.)

A small C++ program, compiled here the way kiln compiles its kernels (``-O3 -march=native -fopenmp``,
libmvec's vector math declared ``omp declare simd``, as in kiln_codegen_cpp's prelude), runs regions
over a (256, 1024) float32 activation, GPT-2's MLP width at kiln_bench's cpu size, one region at a
time as kiln's wrapper calls its kernels: ``empty`` (the fork and join alone), ``mul``, ``tanh``,
``gelu_tanh`` (GPT-2's ``gelu_new``, as kiln fuses it), ``erf`` and ``layernorm`` (a row mean and
variance in double, no vector math), round-robin, at each thread count and at each gap between regions
(a busy wait on the calling thread: kiln's wrapper spends ~5-20 us of Python between kernels; 2 ms
lets libgomp's workers stop spinning and sleep). Each line gives a body's median and largest region
and how many of its regions took over 1 ms, at 512- and 256-bit vectors:

    python scripts/omp_regions.py --threads 4,16 --gaps-us 0,20,2000 [--out regions.jsonl]

It links whichever ``libgomp.so.1`` the compiler finds first; ``--torch-gomp`` runs it with torch's
(``LD_LIBRARY_PATH`` set to torch/lib), the one kiln's kernels use inside a torch process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

SOURCE = r"""
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <omp.h>
extern "C" {
#pragma omp declare simd notinbranch
float tanhf(float) noexcept;
#pragma omp declare simd notinbranch
float erff(float) noexcept;
}
static const int R = 256, C = 1024;
static float* x;
static float* y;
static void body(int kind, int nt) {
  switch (kind) {
  case 0:
    #pragma omp parallel num_threads(nt)
    { asm volatile("" ::: "memory"); }
    break;
  case 1:
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < R; ++r) {
      #pragma omp simd
      for (int c = 0; c < C; ++c) y[r * C + c] = x[r * C + c] * 0.5f;
    }
    break;
  case 2:
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < R; ++r) {
      #pragma omp simd
      for (int c = 0; c < C; ++c) y[r * C + c] = std::tanh(x[r * C + c]);
    }
    break;
  case 3:
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < R; ++r) {
      #pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float v = x[r * C + c];
        y[r * C + c] = v * 0.5f * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
      }
    }
    break;
  case 4:
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < R; ++r) {
      #pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float v = x[r * C + c];
        y[r * C + c] = v * 0.5f * (1.0f + std::erf(v * 0.7071067812f));
      }
    }
    break;
  case 5:
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < R; ++r) {
      double s = 0, s2 = 0;
      #pragma omp simd reduction(+:s, s2)
      for (int c = 0; c < C; ++c) { const double v = x[r * C + c]; s += v; s2 += v * v; }
      const double mean = s / C, rstd = 1.0 / std::sqrt(s2 / C - mean * mean + 1e-5);
      #pragma omp simd
      for (int c = 0; c < C; ++c) y[r * C + c] = static_cast<float>((x[r * C + c] - mean) * rstd);
    }
    break;
  }
}
static const char* NAMES[] = {"empty", "mul", "tanh", "gelu_tanh", "erf", "layernorm"};
int main(int argc, char** argv) {
  const int nt = std::atoi(argv[1]), reps = std::atoi(argv[2]);
  const double gap = std::atof(argv[3]) * 1e-6;
  x = static_cast<float*>(std::aligned_alloc(64, sizeof(float) * R * C));
  y = static_cast<float*>(std::aligned_alloc(64, sizeof(float) * R * C));
  unsigned s = 12345;
  for (int i = 0; i < R * C; ++i) { s = s * 1103515245u + 12345u; x[i] = ((s >> 8) % 20000) / 5000.0f - 2.0f; }
  const int kinds = 6;
  std::vector<std::vector<double>> t(kinds);
  for (int i = 0; i < 20; ++i) for (int k = 0; k < kinds; ++k) body(k, nt);
  for (int i = 0; i < reps; ++i) {
    for (int k = 0; k < kinds; ++k) {
      const double w = omp_get_wtime() + gap;
      while (omp_get_wtime() < w) {}
      const double a = omp_get_wtime();
      body(k, nt);
      t[k].push_back((omp_get_wtime() - a) * 1e3);
    }
  }
  for (int k = 0; k < kinds; ++k) {
    std::vector<double> v = t[k];
    std::sort(v.begin(), v.end());
    int over = 0;
    for (double d : v) over += d > 1.0;
    std::printf("{\"body\": \"%s\", \"median_ms\": %.4f, \"max_ms\": %.4f, \"over_1ms\": %d, \"n\": %zu}\n",
                NAMES[k], v[v.size() / 2], v.back(), over, v.size());
  }
  return 0;
}
"""


def build(where: Path, width: int) -> Path:
    src = where / "regions.cpp"
    src.write_text(SOURCE)
    exe = where / f"regions{width}"
    flags = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]
    cmd = ["g++", *flags, f"-mprefer-vector-width={width}", str(src), "-o", str(exe), "-lmvec", "-lm"]
    subprocess.run(cmd, check=True)
    return exe


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="4,16")
    p.add_argument("--gaps-us", default="0,20,2000")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--widths", default="512,256")
    p.add_argument("--torch-gomp", action="store_true", help="run with torch's libgomp.so.1")
    p.add_argument("--out", default=None, help="append each line to this file as JSON")
    args = p.parse_args()
    env = dict(os.environ)
    if args.torch_gomp:
        import torch

        lib = str(Path(torch.__file__).parent / "lib")
        env["LD_LIBRARY_PATH"] = lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    with tempfile.TemporaryDirectory(prefix="kiln-omp-regions-") as tmp:
        exes = {int(w): build(Path(tmp), int(w)) for w in args.widths.split(",")}
        print(
            f"{'threads':>7} {'gap us':>7} {'width':>5} {'body':10s} {'median ms':>10} {'max ms':>8} {'>1 ms':>6}"
        )
        for nt in (int(t) for t in args.threads.split(",")):
            for gap in (float(g) for g in args.gaps_us.split(",")):
                for width, exe in exes.items():
                    run = subprocess.run(
                        [str(exe), str(nt), str(args.reps), str(gap)],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    for line in run.stdout.splitlines():
                        row = json.loads(line)
                        print(
                            f"{nt:7d} {gap:7g} {width:5d} {row['body']:10s} {row['median_ms']:10.4f} "
                            f"{row['max_ms']:8.3f} {row['over_1ms']:6d}"
                        )
                        if args.out:
                            with open(args.out, "a") as f:
                                f.write(
                                    json.dumps({"threads": nt, "gap_us": gap, "width": width, **row}) + "\n"
                                )


if __name__ == "__main__":
    main()
