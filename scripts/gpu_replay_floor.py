"""The floor of a CUDA-graph call on this GPU: host µs of `graph.replay()` for graphs of N small
kernels, and the wall of replay + synchronize against the graph's GPU time (issue 14's
reduce-overhead target: wall within 1.15x of GPU busy time). A benchmark, run on a GPU machine:

    python scripts/gpu_replay_floor.py [--kernels 16,64,128,256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kernels", default="16,64,128,256")
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    x = torch.randn(1 << 12, device="cuda")
    for n in (int(k) for k in args.kernels.split(",")):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = x
            for _ in range(n):  # warm the allocator
                y = y + 1
            with torch.cuda.graph(g):
                y = x
                for _ in range(n):
                    y = y + 1
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        host, wall = [], []
        for _ in range(args.calls):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g.replay()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host.append(t1 - t0)
            wall.append(t2 - t0)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        gpu = []
        for _ in range(50):
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            gpu.append(e0.elapsed_time(e1))
        print(
            f"{n:4d} kernels: replay host {statistics.median(host) * 1e6:7.1f} us, replay+sync wall "
            f"{statistics.median(wall) * 1e6:7.1f} us, GPU (events) {statistics.median(gpu) * 1e3:7.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
