"""Graph-pass ablation: each pass of ``kiln_loopir.passes`` on and off, on the cases issue 15 names.

Not a test. For hand-built aten graphs (as kiln-aotgrad hands them over, with ``meta["val"]``):
GPT-2's tied LM head (mm with N = 50257), a ConvNeXt block (7x7 depthwise conv, permute,
LayerNorm, MLP, permute back, residual), a ResNet bottleneck (1x1/3x3/1x1 convs with BatchNorm
and ReLU) and a hand-written attention layer, it compiles the graph with all passes on and with
the relevant pass off, checks both against eager, and prints the median time per call of each
and what the passes decided. On CUDA (the default when available) the layout rule and the timed
pad decision are the real ones and the Triton backend runs the graph; on the CPU the CUDA rule
and the padding are forced (``--force``) so the rewrites can at least be seen, and the C++
backend runs it.

    PYTHONPATH=packages/loopir/src python packages/loopir/bench/passes.py [--device cuda] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from kiln_loopir import compile_graph

aten = torch.ops.aten


def with_vals(fn: Callable[..., Any], *inputs: Any) -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(fn)

    class Record(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            n.meta["val"] = super().run_node(n)
            return n.meta["val"]

    with torch.no_grad():
        Record(gm).run(*inputs)
    return gm


def conv(x: Any, w: Any, padding: int = 0, groups: int = 1) -> Any:
    return aten.convolution.default(x, w, None, [1, 1], [padding, padding], [1, 1], False, [0, 0], groups)


def bn_relu(x: Any, mean: Any, var: Any, relu: bool = True) -> Any:
    y = aten._native_batch_norm_legit_no_training.default(x, None, None, mean, var, 0.1, 1e-5)[0]
    return aten.relu.default(y) if relu else y


def lm_head_case(dev: str, dt: torch.dtype, small: bool) -> tuple[Callable[..., Any], list[Any]]:
    tokens, hidden, vocab = (64, 64, 1001) if small else (1024, 768, 50257)

    def fn(x: Any, w: Any) -> Any:
        return aten.view.default(aten.mm.default(x, aten.t.default(w)), [1, tokens, vocab])

    return fn, [
        torch.randn(tokens, hidden, device=dev, dtype=dt),
        torch.randn(vocab, hidden, device=dev, dtype=dt) * 0.02,
    ]


def convnext_case(dev: str, dt: torch.dtype, small: bool) -> tuple[Callable[..., Any], list[Any]]:
    n, c, hw = (2, 32, 14) if small else (32, 192, 28)

    def fn(x: Any, dw: Any, g: Any, b: Any, w1: Any, w2: Any) -> Any:
        y = aten.permute.default(conv(x, dw, 3, c), [0, 2, 3, 1])
        y = aten.native_layer_norm.default(y, [c], g, b, 1e-6)[0]
        y = aten.view.default(y, [n * hw * hw, c])
        y = aten.gelu.default(aten.mm.default(y, w1))
        y = aten.view.default(aten.mm.default(y, w2), [n, hw, hw, c])
        return aten.add.Tensor(x, aten.permute.default(y, [0, 3, 1, 2]))

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, device=dev, dtype=dt) * 0.1

    return fn, [r(n, c, hw, hw), r(c, 1, 7, 7), r(c) + 1, r(c), r(c, 4 * c), r(4 * c, c)]


def resnet_case(dev: str, dt: torch.dtype, small: bool) -> tuple[Callable[..., Any], list[Any]]:
    n, c, mid, hw = (2, 64, 16, 8) if small else (32, 256, 64, 56)

    def fn(x: Any, w1: Any, w2: Any, w3: Any, m1: Any, v1: Any, m2: Any, v2: Any, m3: Any, v3: Any) -> Any:
        y = bn_relu(conv(x, w1), m1, v1)
        y = bn_relu(conv(y, w2, 1), m2, v2)
        y = bn_relu(conv(y, w3), m3, v3, relu=False)
        return aten.relu.default(aten.add.Tensor(y, x))

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, device=dev, dtype=dt) * 0.1

    def var(s: int) -> torch.Tensor:
        return torch.rand(s, device=dev, dtype=dt) + 0.5

    return fn, [
        r(n, c, hw, hw),
        r(mid, c, 1, 1),
        r(mid, mid, 3, 3),
        r(c, mid, 1, 1),
        r(mid),
        var(mid),
        r(mid),
        var(mid),
        r(c),
        var(c),
    ]


def attention_case(dev: str, dt: torch.dtype, small: bool) -> tuple[Callable[..., Any], list[Any]]:
    b, h, n, e = (2, 2, 16, 8) if small else (8, 12, 1024, 64)

    def to3(x: Any, shape: list[int]) -> Any:
        y = aten.clone.default(aten.expand.default(x, shape), memory_format=torch.contiguous_format)
        return aten.view.default(y, [shape[0] * shape[1], shape[2], shape[3]])

    def fn(q: Any, k: Any, v: Any, mask: Any) -> Any:
        kt = aten.permute.default(k, [0, 1, 3, 2])
        s = aten.view.default(aten.bmm.default(to3(q, [b, h, n, e]), to3(kt, [b, h, e, n])), [b, h, n, n])
        p = aten._softmax.default(aten.add.Tensor(aten.mul.Tensor(s, e**-0.5), mask), -1, False)
        return aten.view.default(aten.bmm.default(to3(p, [b, h, n, n]), to3(v, [b, h, n, e])), [b, h, n, e])

    mask = torch.triu(torch.full((n, n), float("-inf"), device=dev, dtype=dt), 1)[None, None]
    return fn, [*(torch.randn(b, h, n, e, device=dev, dtype=dt) for _ in range(3)), mask]


CASES = {
    "lm_head": (lm_head_case, "pad_mm"),
    "convnext_block": (convnext_case, "layout"),
    "resnet_bottleneck": (resnet_case, "layout"),
    "attention": (attention_case, "attention"),
}


def median_ms(fn: Callable[[], Any], device: str, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--small", action="store_true", help="small shapes (a quick check on the CPU)")
    args = parser.parse_args()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    backend = "triton" if args.device == "cuda" else "cpp"
    forced = {"layout_policy": "cuda", "pad_mm": "force"} if args.device == "cpu" else {}
    tol = {"rtol": 3e-2, "atol": 3e-2} if dt != torch.float32 else {"rtol": 1e-3, "atol": 1e-3}
    print(f"device {args.device}, dtype {args.dtype}, backend {backend}")
    print(f"{'case':<20} {'pass':<10} {'on ms':>9} {'off ms':>9} {'off/on':>7}  decisions")
    for name, (make, switch) in CASES.items():
        fn, inputs = make(args.device, dt, args.small)
        gm = with_vals(fn, *inputs)
        with torch.no_grad():
            expected = gm(*inputs)
            on = compile_graph(gm, inputs, backend=backend, options=forced)
            off = compile_graph(gm, inputs, backend=backend, options={**forced, switch: False})
            for compiled in (on, off):
                torch.testing.assert_close(compiled(*inputs), expected, **tol)
            t_on = median_ms(lambda on=on, inputs=inputs: on(*inputs), args.device)
            t_off = median_ms(lambda off=off, inputs=inputs: off(*inputs), args.device)
        decided = "; ".join(t for _, t in on.passes.record if not t.startswith("off"))
        print(f"{name:<20} {switch:<10} {t_on:9.3f} {t_off:9.3f} {t_off / t_on:7.2f}  {decided}")


if __name__ == "__main__":
    main()
