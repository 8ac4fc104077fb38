"""Dynamic shapes on a GPU: tiny HuggingFace LMs (tests/e2e/tiny_hf.py) compiled by kiln for CUDA at
3 batch sizes x 5 sequence lengths, in the default mode and under reduce-overhead, float32 and
bfloat16: every result is compared with eager, and the number of compiles is checked (automatic
dynamic: 2, `dynamic=True`: 1). The issue-17 check of the Triton generator's symbolic sizes on real
hardware (CI runs the same models under Triton's interpreter, test_hf_dynamic.py).

    python scripts/gpu_dynamic_check.py            # exits non-zero on the first mismatch
    python scripts/gpu_dynamic_check.py --quick --models gpt2 --modes default   # a few seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

import tiny_hf
import torch
from test_hf_dynamic import SHAPES

import kiln
import kiln_dynamo

# --quick: lengths that are and are not multiples of 8 (Note [Aligned attention biases])
QUICK_SHAPES = [(2, 5), (3, 8), (3, 33), (2, 16), (4, 13)]
MODELS = {"gpt2": tiny_hf.gpt2, "llama": tiny_hf.llama}
MODES = {"default": None, "reduce-overhead": "reduce-overhead"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--modes", default="default,reduce-overhead")
    parser.add_argument("--quick", action="store_true", help="5 shapes instead of 15")
    args = parser.parse_args()
    shapes = QUICK_SHAPES if args.quick else SHAPES
    failures = 0
    for name in args.models.split(","):
        make = MODELS[name]
        for dtype in (torch.float32, torch.bfloat16):
            for mode in (MODES[m] for m in args.modes.split(",")):
                for dynamic in (None, True):
                    kiln.reset()
                    torch.manual_seed(0)
                    model = make().eval().to("cuda", dtype)
                    compiled = kiln.compile(model, dynamic=dynamic, mode=mode)
                    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
                    start = time.perf_counter()
                    try:
                        with torch.no_grad():
                            for b, t in shapes:
                                ids = torch.randint(0, 64, (b, t), device="cuda")
                                for _ in range(2):  # reduce-overhead records on the second call
                                    got = compiled(ids).logits
                                torch.testing.assert_close(got, model(ids).logits, **tol)
                        c = kiln_dynamo.counters
                        declined = [r for r in kiln.compile_log() if r.fell_back is not None or r.declined]
                        ok = c.fallbacks == [] and c.dynamic_fallbacks == [] and not declined
                        expected = 2 if dynamic is None else 1
                        verdict = "ok" if ok and c.graphs == expected else "WRONG COUNT"
                        failures += verdict != "ok"
                        print(
                            f"{verdict:11} {name} {str(dtype)[6:]:8} mode={mode} dynamic={dynamic}: "
                            f"{len(shapes)} shapes equal eager, {c.graphs} compiles (expected {expected}), "
                            f"dynamic fallbacks {c.dynamic_fallbacks}, {time.perf_counter() - start:.1f} s"
                        )
                    except Exception as exc:  # report and go on
                        failures += 1
                        print(
                            f"FAIL        {name} {dtype} mode={mode} dynamic={dynamic}: {type(exc).__name__}: {exc}"[
                                :600
                            ]
                        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
