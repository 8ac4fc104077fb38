"""Strides of a model's outputs under eager, kiln and torch.compile (bf16 inference, gpu size, CUDA).

Padded GEMMs (Note [Padded results the program sees]) make a result that the program sees
non-contiguous unless it is copied back to eager's strides; this prints what each backend hands the
program, so kiln's choice can be set beside torch.compile's.

    python scripts/output_strides.py --models gpt2 [--options pad_mm_output_copy=False]
"""

from __future__ import annotations

import argparse

import torch

import kiln
from kiln_bench.models import build, logits_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="gpt2")
    ap.add_argument("--size", default="gpu")
    args = ap.parse_args()
    for name in args.models.split(","):
        w = build(name, args.size).to("cuda", torch.bfloat16)
        w.model.eval()
        runs = {
            "eager": w.model,
            "kiln": kiln.compile(w.model),
            "kiln pad_mm_output_copy=False": kiln.compile(w.model, options={"pad_mm_output_copy": False}),
            "torch.compile": torch.compile(w.model),
        }
        with torch.no_grad():
            for label, fn in runs.items():
                out = logits_of(fn(**w.inputs))
                out = logits_of(fn(**w.inputs))
                try:
                    out.view(-1, out.shape[-1])
                    view = "view ok"
                except RuntimeError as e:
                    view = f"view raises: {str(e)[:60]}"
                print(
                    f"{name:10s} {label:32s} shape {tuple(out.shape)} stride {out.stride()} {view}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
