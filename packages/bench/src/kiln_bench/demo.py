"""`nox -s demo` / `python -m kiln_bench.demo`: the first thing a new user runs.

Compiles a small GPT-2-style model (the suite's `gpt2` at the cpu size) with kiln, checks it
against eager, times eager, kiln and torch.compile side by side (interleaved, medians, one
thread), and says where kiln put the generated code.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from kiln_bench import accuracy
from kiln_bench.models import build, logits_of


def _call(fn: Callable[..., Any], inputs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return logits_of(fn(**inputs))


def main(repeats: int = 20) -> int:
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    cache = os.environ.setdefault("KILN_CACHE_DIR", os.path.join(tempfile.gettempdir(), "kiln-demo-cache"))
    torch.set_num_threads(1)
    import kiln

    workload = build("gpt2", "cpu")
    model = workload.model.eval()
    inputs = workload.inputs
    print(f"model: GPT-2 style, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"input {tuple(inputs['input_ids'].shape)}")  # fmt: skip
    reference = _call(model, inputs)
    exact = _call(build("gpt2", "cpu").model.eval().double(), inputs)

    compiled: dict[str, Callable[..., Any]] = {}
    makers: list[tuple[str, Callable[[torch.nn.Module], Any]]] = [
        ("kiln", kiln.compile),
        ("torch.compile", torch.compile),
    ]
    for name, make in makers:
        start = time.perf_counter()
        fn: Callable[..., Any] = make(model)
        out = _call(fn, inputs)
        elapsed = time.perf_counter() - start
        verdict = accuracy.check_tensor("logits", reference, out, exact, 1e-3)
        print(
            f"{name:<14} compile {elapsed:6.2f} s   matches eager: {'yes' if verdict.ok else 'NO: ' + verdict.reason}"
        )
        if verdict.ok:
            compiled[name] = fn
    kiln_graphs = kiln.compile_log()
    fell_back = [g for g in kiln_graphs if g.fell_back]
    print(f"kiln captured {len(kiln_graphs)} graph(s); {len(fell_back)} fell back to eager")
    for g in fell_back:
        print(f"  {g.graph}: {g.fell_back}")

    times: dict[str, list[float]] = {"eager": [], **{k: [] for k in compiled}}
    fns: dict[str, Callable[..., Any]] = {"eager": model, **compiled}
    for _ in range(3):
        for fn in fns.values():
            _call(fn, inputs)
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            _call(fn, inputs)
            times[name].append(time.perf_counter() - start)
    eager = statistics.median(times["eager"])
    print(f"\nmedian of {repeats} interleaved calls, 1 thread:")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"  {name:<14} {med * 1e3:8.2f} ms   speedup over eager {eager / med:5.2f}x")
    print(f"\nkiln's generated code and its compile cache: {cache}")
    print("print it as it is generated with KILN_LOG=output_code; graphs with KILN_LOG=graph")
    return 0 if len(compiled) == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
