"""A tiny HuggingFace LM through the Triton code generator at 3 batch sizes x 5 sequence lengths
(`kiln.compile(..., options={"cpu_backend": "triton"})`, kernels run by Triton's interpreter on
CPU tensors): every result equals eager; automatic dynamic compiles twice, `dynamic=True` once.

Run as a script (`python hf_dynamic_triton.py gpt2`): `TRITON_INTERPRET=1` must be set before
anything imports triton (Note [Triton's interpreter is process-wide] in packages/kiln/tests), so
test_hf_dynamic.py runs it in a process of its own. Prints one line per mode; exits non-zero on
the first mismatch or wrong compile count.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import tiny_hf
import torch
from test_hf_dynamic import SHAPES

import kiln
import kiln_dynamo


def main(name: str) -> int:
    make = {"gpt2": tiny_hf.gpt2, "llama": tiny_hf.llama}[name]
    for dynamic in (None, True):
        kiln.reset()
        torch.manual_seed(0)
        model = make().eval()
        compiled = kiln.compile(model, dynamic=dynamic, options={"cpu_backend": "triton"})
        with torch.no_grad():
            for b, t in SHAPES:
                ids = torch.randint(0, 64, (b, t))
                torch.testing.assert_close(compiled(ids).logits, model(ids).logits)
        counters = kiln_dynamo.counters
        assert counters.fallbacks == [] and counters.dynamic_fallbacks == [], counters.dynamic_fallbacks
        assert all(r.fell_back is None and not r.declined for r in kiln.compile_log())
        expected = 2 if dynamic is None else 1
        assert counters.graphs == expected, (dynamic, counters.graphs)
        print(f"{name} dynamic={dynamic}: {len(SHAPES)} shapes equal eager, {counters.graphs} compiles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
