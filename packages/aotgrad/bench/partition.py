"""Benchmark (not a test): what the min-cut partitioner saves compared with the default one.

For the training step of three models (an MLP with GELU+LayerNorm, a pre-norm transformer
block, a small convnet with BatchNorm) this traces the joint graph once per strategy and reports:

- saved: bytes the forward hands to the backward (all of them; `act` excludes graph inputs and
  views of them, i.e. the extra memory that activations cost);
- peak: the peak of live tensor bytes over one forward+backward, simulated on the two graphs
  from their fake-tensor metadata (every non-view node allocates its output, frees it after its
  last use; inputs and parameters are not counted; saved tensors live until the backward is
  done with them);
- recompute: forward nodes the backward recomputes, as an op count and as elementwise FLOPs
  (one per output element, one per input element for reductions);
- step: wall time of a real forward+backward through aot_eager (median of a few runs; CPU,
  noisy on a shared machine; the eager time of the same step is printed for reference).

Run: PYTHONPATH=packages/aotgrad/src:packages/dynamo/src:packages/frame_hook/src \
     python packages/aotgrad/bench/partition.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

import kiln_aotgrad
from kiln_aotgrad.partition import Partition, nbytes


class MLP(nn.Module):
    def __init__(self, d: int = 256, h: int = 1024) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.LayerNorm(h), nn.Linear(h, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Block(nn.Module):
    def __init__(self, d: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.h = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.h, d // self.h).transpose(1, 2) for y in (q, k, v))
        s = (q @ k.transpose(-2, -1)) * (d // self.h) ** -0.5
        o = s.softmax(-1) @ v
        x = x + self.proj(o.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.b1 = nn.BatchNorm2d(32)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.b2 = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "mlp_gelu_ln": lambda: (MLP(), torch.randn(512, 256)),
    "transformer_block": lambda: (Block(), torch.randn(8, 128, 256)),
    "convnet": lambda: (ConvNet(), torch.randn(16, 3, 32, 32)),
}


def _is_view(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and bool(getattr(n.target, "is_view", False))


def _simulate(
    gm: torch.fx.GraphModule, live: int, keep: set[str], owned_inputs: frozenset[str] = frozenset()
) -> tuple[int, int]:
    """(peak, bytes still live at the end) running `gm` with `live` bytes already allocated."""
    nodes = list(gm.graph.nodes)
    last_use: dict[torch.fx.Node, int] = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last_use[a] = i
    peak = live
    for i, n in enumerate(nodes):
        if n.op == "call_function" and not _is_view(n):
            live += nbytes(n.meta.get("val"))
            peak = max(peak, live)
        for a in n.all_input_nodes:
            owned = (a.op == "call_function" and not _is_view(a)) or (
                a.op == "placeholder" and a.name in owned_inputs
            )
            if last_use.get(a) == i and owned and a.name not in keep:
                live -= nbytes(a.meta.get("val"))
    return peak, live


def peak_bytes(p: Partition) -> int:
    fw_out = p.fw.graph.output_node().args[0]
    keep = {o.name for o in fw_out if isinstance(o, torch.fx.Node)}  # type: ignore[union-attr]
    fw_peak, after_fw = _simulate(p.fw, 0, keep)
    allocated = frozenset(n.name for n in p.fw.graph.nodes if n.op == "call_function" and not _is_view(n))
    bw_peak, _ = _simulate(p.bw, after_fw, set(), allocated)
    return max(fw_peak, bw_peak)


def recompute_flops(p: Partition) -> int:
    by_name = {n.name: n for n in p.bw.graph.nodes}
    total = 0
    for name in p.recomputed:
        n = by_name[name]
        if _is_view(n):
            continue
        val = n.meta.get("val")
        inp = n.all_input_nodes[0].meta.get("val") if n.all_input_nodes else None
        numel = val.numel() if isinstance(val, torch.Tensor) else 0
        if isinstance(inp, torch.Tensor) and inp.numel() > numel:
            numel = inp.numel()  # reductions read their whole input
        total += numel
    return total


def step_time(compiled: Any, x: torch.Tensor, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        compiled(x).sum().backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    header = (
        f"{'model':<18} {'strategy':<8} {'saved KiB':>10} {'act KiB':>9} {'peak KiB':>9} "
        f"{'recompute ops':>13} {'recompute MFLOP':>15} {'bw ops':>7} {'step ms':>8}"
    )
    print(header)
    print("-" * len(header))
    ratios = {}
    for name, make in MODELS.items():
        model, x = make()
        x.requires_grad_(True)
        acts = {}
        for strategy in ("default", "min_cut"):
            compiled = kiln_aotgrad.aot_module(model, kiln_aotgrad.nop_compiler, partition=strategy)
            compiled(x).sum().backward()
            (art,) = compiled.compiled.values()
            p = art.partition
            assert p is not None
            n_recompute = sum(
                1 for r in p.recomputed if not _is_view(next(n for n in p.bw.graph.nodes if n.name == r))
            )
            bw_ops = sum(1 for n in p.bw.graph.nodes if n.op == "call_function" and not _is_view(n))
            ms = step_time(compiled, x) * 1e3
            acts[strategy] = p.activation_bytes
            print(
                f"{name:<18} {strategy:<8} {p.saved_bytes / 1024:>10.1f} {p.activation_bytes / 1024:>9.1f} "
                f"{peak_bytes(p) / 1024:>9.1f} {n_recompute:>13} {recompute_flops(p) / 1e6:>15.3f} "
                f"{bw_ops:>7} {ms:>8.2f}"
            )
        print(
            f"{name:<18} {'eager':<8} {'':>10} {'':>9} {'':>9} {'':>13} {'':>15} {'':>7} {step_time(model, x) * 1e3:>8.2f}"
        )
        ratios[name] = acts["min_cut"] / acts["default"]
    print()
    for name, r in ratios.items():
        print(f"{name}: min_cut activation bytes = {r:.2f} x default")


if __name__ == "__main__":
    main()
