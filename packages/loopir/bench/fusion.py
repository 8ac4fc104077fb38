"""Fusion benchmark: kernels and estimated bytes moved, fused vs one kernel per op.

Not a test. For hand-built aten graphs of a transformer block, an MLP with GELU + LayerNorm and
a conv block, prints the kernels, extern calls and estimated bytes moved by the kernels (the
pointwise / normalization parts: extern matmuls and convolutions are the same either way) with
fusion and with ``fusion=False``, and the time spent lowering and scheduling. Then it times
lowering and scheduling of a 1,000-node graph. Each compiled graph is also run once through the
interpreter and compared with eager, so the figures are for schedules that compute the right
thing.

    PYTHONPATH=packages/loopir/src python packages/loopir/bench/fusion.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from kiln_loopir import compile_graph
from kiln_loopir.graph import GraphLowering
from kiln_loopir.scheduler import Scheduler, output_buffer_names

aten = torch.ops.aten


# The graphs are written the way core-aten decompositions (what kiln-aotgrad hands loopir) spell
# layer norm, softmax and GELU: as reductions and pointwise ops, not as single fused aten ops.


def layer_norm(x: Any, w: Any, b: Any, d: int) -> Any:
    var, mean = aten.var_mean.correction(x, [-1], correction=0, keepdim=True)
    rstd = aten.rsqrt.default(aten.add.Tensor(var, 1e-5))
    return aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd), w), b)


def softmax(x: Any) -> Any:
    shifted = aten.sub.Tensor(x, aten.amax.default(x, [-1], True))
    e = aten.exp.default(shifted)
    return aten.div.Tensor(e, aten.sum.dim_IntList(e, [-1], True))


def gelu(x: Any) -> Any:
    cdf = aten.add.Tensor(aten.erf.default(aten.mul.Tensor(x, 0.7071067811865476)), 1)
    return aten.mul.Tensor(aten.mul.Tensor(x, 0.5), cdf)


def transformer_block(
    x: Any, wqkv: Any, wo: Any, w1: Any, w2: Any, g1: Any, b1: Any, g2: Any, b2: Any
) -> Any:
    batch, seq, dim, heads = 4, 128, 256, 4
    hd = dim // heads
    h = layer_norm(x, g1, b1, dim)
    qkv = aten.mm.default(aten.view.default(h, [batch * seq, dim]), wqkv)
    q, k, v = aten.split.Tensor(aten.view.default(qkv, [batch, seq, 3 * dim]), dim, 2)

    def heads_first(t: Any) -> Any:
        t = aten.permute.default(aten.view.default(t, [batch, seq, heads, hd]), [0, 2, 1, 3])
        return aten.reshape.default(
            aten.clone.default(t, memory_format=torch.contiguous_format), [-1, seq, hd]
        )

    q, k, v = heads_first(q), heads_first(k), heads_first(v)
    scores = aten.mul.Tensor(aten.bmm.default(q, aten.transpose.int(k, 1, 2)), hd**-0.5)
    probs = softmax(scores)
    ctx = aten.bmm.default(probs, v)
    ctx = aten.permute.default(aten.view.default(ctx, [batch, heads, seq, hd]), [0, 2, 1, 3])
    ctx = aten.reshape.default(
        aten.clone.default(ctx, memory_format=torch.contiguous_format), [batch * seq, dim]
    )
    x = aten.add.Tensor(x, aten.view.default(aten.mm.default(ctx, wo), [batch, seq, dim]))
    h = aten.view.default(layer_norm(x, g2, b2, dim), [batch * seq, dim])
    h = gelu(aten.mm.default(h, w1))
    return aten.add.Tensor(x, aten.view.default(aten.mm.default(h, w2), [batch, seq, dim]))


def transformer_inputs() -> list[torch.Tensor]:
    d = 256
    return [
        torch.randn(4, 128, d),
        torch.randn(d, 3 * d) * 0.05,
        torch.randn(d, d) * 0.05,
        torch.randn(d, 4 * d) * 0.05,
        torch.randn(4 * d, d) * 0.05,
        torch.ones(d),
        torch.zeros(d),
        torch.ones(d),
        torch.zeros(d),
    ]


def mlp(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, g: Any, beta: Any) -> Any:
    h = gelu(aten.addmm.default(b1, x, w1))
    h = layer_norm(h, g, beta, 1024)
    h = aten.addmm.default(b2, h, w2)
    return aten.relu.default(aten.add.Tensor(h, x))


def mlp_inputs() -> list[torch.Tensor]:
    return [
        torch.randn(512, 256),
        torch.randn(256, 1024) * 0.05,
        torch.randn(1024),
        torch.randn(1024, 256) * 0.05,
        torch.randn(256),
        torch.ones(1024),
        torch.zeros(1024),
    ]


def batch_norm_relu(x: Any, mean: Any, var: Any, w: Any, b: Any) -> Any:
    def c(t: Any) -> Any:
        return aten.view.default(t, [1, -1, 1, 1])

    inv = aten.rsqrt.default(aten.add.Tensor(c(var), 1e-5))
    y = aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(x, c(mean)), inv), c(w)), c(b))
    return aten.relu.default(y)


def conv_block(x: Any, k1: Any, k2: Any, mean: Any, var: Any, w: Any, b: Any) -> Any:
    h = aten.convolution.default(x, k1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    h = batch_norm_relu(h, mean, var, w, b)
    h = aten.convolution.default(h, k2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    h = aten.relu.default(aten.add.Tensor(batch_norm_relu(h, mean, var, w, b), x))
    return aten.mean.dim(h, [2, 3])


def conv_inputs() -> list[torch.Tensor]:
    ch = 32
    return [
        torch.randn(8, ch, 32, 32),
        torch.randn(ch, ch, 3, 3) * 0.05,
        torch.randn(ch, ch, 3, 3) * 0.05,
        torch.randn(ch),
        torch.rand(ch) + 0.5,
        torch.randn(ch),
        torch.randn(ch),
    ]


def big_graph(x: Any, y: Any) -> Any:
    """About 1,000 aten nodes: pointwise chains, row reductions, views and broadcasts."""
    h = x
    for i in range(125):
        a = aten.add.Tensor(h, y)
        m = aten.mul.Tensor(a, 0.5)
        s = aten.sin.default(m)
        r = aten.sum.dim_IntList(s, [1], True)
        d = aten.sub.Tensor(s, r)
        t = aten.reshape.default(aten.permute.default(d, [1, 0]), [-1])
        u = aten.view.default(t, [64, 64])
        h = aten.relu.default(u) if i % 2 else aten.tanh.default(u)
    return h


def report(name: str, fn: Callable[..., Any], inputs: list[torch.Tensor]) -> None:
    gm = torch.fx.symbolic_trace(fn)
    expected = gm(*inputs)
    rows = []
    for fusion in (True, False):
        compiled = compile_graph(gm, inputs, fusion=fusion)
        torch.testing.assert_close(compiled(*inputs), expected, rtol=1e-3, atol=1e-3)
        s = compiled.stats
        rows.append((fusion, s))
        ms = (s.lower_seconds + s.schedule_seconds) * 1000
        print(
            f"  fusion={fusion!s:5}  kernels={s.kernels:3d}  extern_calls={s.extern_calls:2d}  "
            f"buffers={s.buffers:3d} reused={s.reused:2d}  bytes_moved={s.bytes_moved / 1e6:8.2f} MB  "
            f"lower+schedule={ms:7.1f} ms"
        )
    fused, unfused = rows[0][1], rows[1][1]
    print(
        f"  {name}: {unfused.kernels / max(fused.kernels, 1):.1f}x fewer kernels, "
        f"{unfused.bytes_moved / max(fused.bytes_moved, 1):.2f}x fewer bytes moved by kernels "
        f"(extern calls move {fused.extern_bytes / 1e6:.2f} MB either way)"
    )


def time_big_graph() -> None:
    gm = torch.fx.symbolic_trace(big_graph)
    inputs = [torch.randn(64, 64), torch.randn(64)]
    nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    t0 = time.perf_counter()
    graph = GraphLowering(gm, inputs).run()
    t1 = time.perf_counter()
    sched = Scheduler(graph.operations, graph.name_to_buffer, output_buffer_names(graph.outputs))
    t2 = time.perf_counter()
    print(
        f"  {nodes} aten nodes -> {len(graph.operations)} IR buffers -> {len(sched.kernels())} kernels; "
        f"lowering {t1 - t0:.2f} s, scheduling {t2 - t1:.2f} s (target < 2 s)"
    )


def main() -> None:
    torch.manual_seed(0)
    compile_graph(torch.fx.symbolic_trace(gelu), [torch.randn(4)])  # warm-up: imports, registries
    for name, fn, inputs in (
        ("transformer block", transformer_block, transformer_inputs()),
        ("MLP with GELU + LayerNorm", mlp, mlp_inputs()),
        ("conv block", conv_block, conv_inputs()),
    ):
        print(name)
        report(name, fn, inputs)
    print("1,000-node graph")
    time_big_graph()


if __name__ == "__main__":
    main()
