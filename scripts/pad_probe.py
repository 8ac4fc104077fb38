"""Does padding GPT-2's LM head pay on this GPU? (loopir Note [Matmul padding], Note [Padded results
the program sees].) Times the head's GEMM (tokens x hidden @ t(weight), vocab 50257) unpadded and
padded, with kiln's own timer (`kiln_loopir.passes.pad_mm.time_ms`), with and without the copy of the
result to eager's strides; then compiles GPT-2 (kiln_bench, gpu size) with kiln and with
torch.compile and prints the logits' strides each returns and kiln's pad_mm verdicts.

    KILN_LOG=passes python scripts/pad_probe.py [--dtype bfloat16] [--tokens 4096] [--no-models]
"""

from __future__ import annotations

import argparse

import torch

from kiln_loopir.passes.pad_mm import time_ms


def _gemms(tokens: int, hidden: int, vocab: int, dtype: torch.dtype) -> None:
    dev = torch.device("cuda")
    a = torch.randn(tokens, hidden, device=dev, dtype=dtype)
    w = torch.randn(vocab, hidden, device=dev, dtype=dtype)
    pad = (-vocab) % (8 if dtype != torch.float32 else 4)
    wp = torch.nn.functional.pad(w, [0, 0, 0, pad])
    out = torch.empty(tokens, vocab, device=dev, dtype=dtype)

    def padded_copied() -> torch.Tensor:
        return torch.mm(a, wp.t())[:, :vocab].contiguous()

    def pad_each_call() -> torch.Tensor:  # kiln's timed form
        return torch.mm(a, torch.constant_pad_nd(w, [0, 0, 0, pad]).t())[:, :vocab].contiguous()

    def copy_alone() -> torch.Tensor:
        return out.clone()

    cases = {
        "unpadded mm(a, t(w))": lambda: torch.mm(a, w.t()),
        "unpadded, out= (eager's strides)": lambda: torch.mm(a, w.t(), out=out),
        "padded weight ready, result a view": lambda: torch.mm(a, wp.t())[:, :vocab],
        "padded weight ready + copy out": padded_copied,
        "pad each call + copy out (kiln's timed form)": pad_each_call,
        "copy of the result alone": copy_alone,
    }
    print(f"{dtype} GEMM ({tokens} x {hidden}) @ ({hidden} x {vocab}), N padded by {pad}: median ms")
    for _ in range(2):  # twice: the second pass is what counts (clocks settled)
        rows = [(name, time_ms(fn, dev)) for name, fn in cases.items()]
    for name, ms in rows:
        print(f"  {name:48s} {ms:7.3f}")


def _models(dtype: torch.dtype) -> None:
    import kiln
    from kiln_bench import models

    w = models.build("gpt2", "gpu").to("cuda", dtype)
    model = w.model.eval()
    with torch.no_grad():
        ref = models.logits_of(model(**w.inputs))
        print(f"eager logits {tuple(ref.shape)} stride {ref.stride()}")
        got = models.logits_of(kiln.compile(model)(**w.inputs))
        print(
            f"kiln logits stride {got.stride()}, max |diff| {(got.float() - ref.float()).abs().max().item():.3g}"
        )
        tc = models.logits_of(torch.compile(model)(**w.inputs))
        print(f"torch.compile logits stride {tc.stride()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--no-models", action="store_true")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    _gemms(a.tokens, 768, 50257, dtype)
    _gemms(a.tokens, 768, 50257, torch.float32)
    if not a.no_models:
        _models(dtype)


if __name__ == "__main__":
    main()
