"""A/B of ResNet's first max-pool kernel (3x3, stride 2, pad 1, [2, 32, 32, 32]): weighted_work on vs off.

Note [Work of a kernel]: with the body weighed the kernel gets a team, without it it runs serial
(16384 outputs, below PARALLEL_GRAIN). Both builds are called through ctypes with the thread
count as the wrapper passes it, the two interleaved call by call (4000 rounds) at 1 thread,
then at 2; medians and minima in microseconds. On a shared machine the minima are the
robust figure. This is a benchmark, not a test.

    python packages/codegen_cpp/bench/pool_ab.py
"""

from __future__ import annotations

import ctypes
import os
import re
import statistics
import tempfile
import time
from typing import Any

os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp()
import torch

from kiln_codegen_cpp import CppBackend, CppOptions
from kiln_loopir import compile_graph

aten = torch.ops.aten


def pool(x: torch.Tensor) -> Any:
    return aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])[0]


x = torch.randn(2, 32, 32, 32)
gm = torch.fx.symbolic_trace(pool)
fns = {}
for label, opt in (("weighted", CppOptions()), ("elements", CppOptions(weighted_work=False))):
    b = CppBackend(opt)
    compile_graph(gm, [x], backend=b)
    name = re.search(r'extern "C" int64_t (cpp_\w+)\(', b.last_source).group(1)
    lib = ctypes.CDLL(str(b.last_built.directory / "kernels.so"))
    f = getattr(lib, name)
    f.restype = ctypes.c_int64
    fns[label] = f
out = torch.empty(2, 32, 16, 16)
ref = pool(x)


def args(nt: int) -> tuple[Any, ...]:
    return (ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()), ctypes.c_int64(nt))


times: dict[tuple[str, int], list[float]] = {}
for nt in (1, 2):
    # one thread count at a time: right after a 2-thread call the team's spinning thread would
    # take a core from a 1-thread call on a 2-core machine
    torch.set_num_threads(nt)
    for _ in range(4000):
        for k, fn in fns.items():
            a = args(nt)
            t = time.perf_counter()
            fn(*a)
            times.setdefault((k, nt), []).append(time.perf_counter() - t)
    assert torch.equal(out, ref)
for (k, nt), v in times.items():
    print(f"{k:9s} {nt} threads: median {statistics.median(v) * 1e6:6.1f} us  min {min(v) * 1e6:6.1f} us")
