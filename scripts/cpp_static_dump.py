"""Dump what the C++ backend generates for a few graphs, to diff before and after a change.

The counterpart of ``triton_static_dump.py`` for codegen_cpp: a change meant to move code (issue
15, "one floor down") or to touch another path must leave the generated C++ and wrappers byte for
byte as they were. This compiles a few models of the public suite (cpu size; inference and one
training step) and a few aten graphs through ``kiln.compile`` with the default CPU backend, and
writes per compiled graph its translation unit, its wrapper (the cache path replaced by
``$CACHE``) and the kernels it declined. ``--decline OPS`` makes the generator decline every kernel
whose name holds one of those aten ops (``abs,sum``), so the wrappers' interpreter path is dumped
too. Run it on two commits from the same checkout (kernels open with the user's source lines,
which name their files) and ``diff -r`` the folders::

    python scripts/cpp_static_dump.py --out /tmp/before
    git switch other && python scripts/cpp_static_dump.py --out /tmp/after
    diff -r /tmp/before /tmp/after && echo identical
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-cpp-dump-"))

import torch

import kiln
import kiln_codegen_cpp.backend as cb
from kiln_codegen_cpp.cpp_ops import UnsupportedDtype

RECORDS: list[tuple[str, str, str]] = []
_codegen_wrapper = cb.CppBackend.codegen_wrapper


def _recording(self: Any, schedule: Any, graph: Any, kernels: Any) -> Any:
    fn = _codegen_wrapper(self, schedule, graph, kernels)
    wrapper = self.last_wrapper.replace(os.environ["KILN_CACHE_DIR"], "$CACHE")
    RECORDS.append((self.last_source, wrapper, repr(self.last_declined)))
    return fn


def _declining(ops: list[str]) -> type:
    class Declining(cb.KernelBuilder):
        def build(self) -> Any:
            if any(op in self.name for op in ops):
                raise UnsupportedDtype(f"declined by cpp_static_dump.py --decline {','.join(ops)}")
            return super().build()

    return Declining


def aten_cases() -> list[tuple[str, Any, list[torch.Tensor]]]:
    def pointwise(x: torch.Tensor, y: torch.Tensor) -> Any:
        return torch.nn.functional.gelu(x + y) * torch.sigmoid(y), torch.cat([x, y], 1), x.abs() + 1

    def reductions(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
        ln = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)
        return torch.softmax(x, -1), ln, x.argmax(-1), x.sum(0), x.sum()

    def scatter(x: torch.Tensor, rows: torch.Tensor, v: torch.Tensor) -> Any:
        return x.sin().index_put((rows,), v, accumulate=True) * 2

    x, y = torch.randn(64, 48), torch.randn(64, 48)
    return [
        ("pointwise", pointwise, [x, y]),
        ("reductions", reductions, [x, torch.randn(48), torch.randn(48)]),
        ("transpose", lambda t: t.t().contiguous() + 1, [torch.randn(96, 80)]),
        ("scatter", scatter, [torch.randn(16, 8), torch.tensor([0, 3, 3, 7]), torch.randn(4, 8)]),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="mlp,gpt2,bert,resnet")
    parser.add_argument("--decline", default="", help="aten ops whose kernels are declined (abs,sum)")
    args = parser.parse_args()
    from kiln_bench.models import build, logits_of, loss_of

    cb.CppBackend.codegen_wrapper = _recording  # type: ignore[method-assign]
    if args.decline:
        cb.KernelBuilder = _declining(args.decline.split(","))  # type: ignore[misc,assignment]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    options = {"strict": True}
    jobs: list[tuple[str, Any]] = []
    for label, fn, inputs in aten_cases():
        jobs.append(
            (f"aten-{label}", lambda fn=fn, inputs=inputs: kiln.compile(fn, options=options)(*inputs))
        )
    for name in filter(None, args.models.split(",")):

        def run(name: str = name, train: bool = False) -> None:
            w = build(name, "cpu")
            w.model.train(train)
            with torch.set_grad_enabled(train):
                result = kiln.compile(w.model, options=options)(**w.inputs)
                if train:
                    loss_of(w, result).backward()
                else:
                    logits_of(result)

        jobs.append((f"{name}-infer", run))
        jobs.append((f"{name}-train", lambda run=run: run(train=True)))
    for label, job in jobs:
        torch.manual_seed(0)
        RECORDS.clear()
        job()
        for i, (source, wrapper, declined) in enumerate(RECORDS):
            (out / f"{label}.{i}.kernels.cpp").write_text(source)
            (out / f"{label}.{i}.wrapper.py").write_text(wrapper)
            (out / f"{label}.{i}.declined.txt").write_text(declined + "\n")
        print(f"{label}: {len(RECORDS)} graphs", flush=True)
        kiln.reset()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
