"""Dump what the Triton backend generates for static graphs, to diff before and after a change.

The lead measures GPU speed on static graphs; a change to codegen_triton that is meant for
symbolic graphs only must leave static graphs' code byte for byte as it was. This script
compiles a few models of the public suite (cpu size) and a few aten graphs through
``kiln.compile(..., options={"cpu_backend": "triton"})`` under Triton's interpreter and writes,
per compiled graph: the kernels module, the wrapper (interpreter variant), the wrapper as it would
be generated on a GPU (the pointer variant: Note [Kernel arguments are pointers]) and each
kernel's configs and grid. Run it on two commits and ``diff -r`` the folders::

    python scripts/triton_static_dump.py --out /tmp/before --models gpt2,mlp,bert
    git switch other && python scripts/triton_static_dump.py --out /tmp/after --models gpt2,mlp,bert
    diff -r /tmp/before /tmp/after && echo identical

Module paths (which hash the source) are left out: the source itself is compared.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-static-dump-"))

import torch

import kiln
import kiln_codegen_triton.backend as tb
from kiln_codegen_triton import wrapper as tw
from kiln_codegen_triton.heuristics import configs, grid

RECORDS: list[dict[str, str]] = []


def _pointer_variant(schedule: Any, graph: Any, groups: Any, launchers: Any, guarded_layouts: bool) -> str:
    """The wrapper source as it is generated on a GPU (source only: never called)."""
    gen = tw.WrapperCodegen(schedule, graph, groups, launchers, guarded_layouts)
    gen.pointers = True
    gen.flat_inputs = gen._inputs_needing_flat_views()
    saved = tw.Launcher.install
    tw.Launcher.install = lambda self, namespace, slot: namespace.__setitem__(slot, None)  # type: ignore[method-assign]
    try:
        return gen.generate()
    finally:
        tw.Launcher.install = saved  # type: ignore[method-assign]


_make_wrapper = tb.make_wrapper


def _recording_make_wrapper(
    schedule: Any, graph: Any, groups: Any, launchers: Any, guarded_layouts: bool = False
) -> Any:
    fn, source = _make_wrapper(schedule, graph, groups, launchers, guarded_layouts=guarded_layouts)
    specs = [s for g in groups.values() if g is not None for s in g.specs]
    lines = []
    for spec in specs:
        for autotune in (False, True):
            cands = configs(spec, autotune=autotune)
            lines.append(f"{spec.name} autotune={autotune}: {cands} grid={[grid(spec, c) for c in cands]}")
    RECORDS.append(
        {
            "wrapper": source,
            "wrapper_gpu": _pointer_variant(schedule, graph, groups, launchers, guarded_layouts),
            "configs": "\n".join(lines) + "\n",
        }
    )
    return fn, source


def _kernels_of_last(backend: Any) -> None:
    RECORDS[-1]["kernels"] = backend.last_source


_codegen_wrapper = tb.TritonBackend.codegen_wrapper


def _recording_codegen_wrapper(self: Any, schedule: Any, graph: Any, kernels: Any) -> Any:
    fn = _codegen_wrapper(self, schedule, graph, kernels)
    _kernels_of_last(self)
    return fn


def aten_cases() -> list[tuple[str, Any, list[torch.Tensor]]]:
    def pointwise(x: torch.Tensor, y: torch.Tensor) -> Any:
        return torch.nn.functional.gelu(x + y) * torch.sigmoid(y), torch.cat([x, y], 1)

    def reductions(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
        return (
            torch.softmax(x, -1),
            torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b),
            x.argmax(-1),
            x.sum(0),
            x.sum(),
            torch.softmax(x.repeat(1, 100), -1),
        )

    def transpose(x: torch.Tensor) -> Any:
        return x.t().contiguous() + 1

    x, y = torch.randn(64, 48), torch.randn(64, 48)
    return [
        ("pointwise", pointwise, [x, y]),
        ("reductions", reductions, [x, torch.randn(48), torch.randn(48)]),
        ("transpose", transpose, [torch.randn(96, 80)]),
        ("split", lambda t: t.sum(0), [torch.randn(5000, 8)]),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="gpt2,mlp")
    parser.add_argument("--train", default="gpt2,mlp", help="models also run for one training step")
    args = parser.parse_args()
    tb.make_wrapper = _recording_make_wrapper
    tb.TritonBackend.codegen_wrapper = _recording_codegen_wrapper  # type: ignore[method-assign]
    from kiln_bench.models import build, logits_of, loss_of

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    options = {"cpu_backend": "triton", "strict": True}
    jobs: list[tuple[str, Any]] = []
    for label, fn, inputs in aten_cases():
        jobs.append(
            (f"aten-{label}", lambda fn=fn, inputs=inputs: kiln.compile(fn, options=options)(*inputs))
        )
    for name in filter(None, args.models.split(",")):

        def infer(name: str = name) -> None:
            w = build(name, "cpu")
            w.model.eval()
            with torch.no_grad():
                logits_of(kiln.compile(w.model, options=options)(**w.inputs))

        jobs.append((f"{name}-infer", infer))
    for name in filter(None, args.train.split(",")):

        def train(name: str = name) -> None:
            w = build(name, "cpu")
            w.model.train()
            loss_of(w, kiln.compile(w.model, options=options)(**w.inputs)).backward()

        jobs.append((f"{name}-train", train))
    for label, job in jobs:
        kiln.reset()
        RECORDS.clear()
        job()
        for i, record in enumerate(RECORDS):
            for kind, text in record.items():
                (out / f"{label}.{i}.{kind}.txt").write_text(text)
        print(f"{label}: {len(RECORDS)} graphs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
