"""Two H200-only questions the CPU audit cannot answer (issue 15), for one device call.

1. T5 (gpu size, bf16 inference): 6 of its 18 attention blocks run as fused SDPA on the H200, the
   other 12 as a generated `_softmax_add_any_arange_eq_full_like` kernel (torch's math SDPA:
   `_safe_softmax`) moving ~198 MB at 58% of copy bandwidth, 1.05 ms a call. On CPU tensors all
   of them stay fused. Which SDPA calls did torch's dispatcher send to the math path, and why?
   This compiles T5 with kiln under `sdpa_kernel` without MATH: the trace then raises (or warns)
   with torch's reason for each fused backend it rejected, and the SDPA calls' argument shapes,
   strides and dtypes are printed from a dispatch log of the compiled call.
2. ConvNeXt (gpu size, bf16 inference): three stage-2 layer norms run at 28% of copy bandwidth,
   and their kernels carry a `clone` on the H200 only. Prints the source of every generated kernel
   whose name has `clone` and a `mean` (KILN_LOG=output_code goes to $OUT/convnext-code.log).

    python3 scripts/gpu_diag_kernels.py --out $OUT
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kiln
from kiln_bench.models import build


class SdpaLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if "scaled_dot_product" in str(func) or "_safe_softmax" in str(func) or "softmax" in str(func):
            desc = [
                f"{tuple(a.shape)}/{a.stride()}/{a.dtype}" if isinstance(a, torch.Tensor) else repr(a)[:40]
                for a in args
            ]
            self.seen.append(f"{func}: {', '.join(desc)} {kwargs or ''}")
        return func(*args, **(kwargs or {}))


def t5(out: Path, device: str, size: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    w = build("t5", size)
    model = w.model.to(device, torch.bfloat16).eval()
    inputs = {k: v.to(device) for k, v in w.inputs.items()}
    print("== T5: eager's own SDPA calls (first decoder layer's arguments)")
    with torch.no_grad(), SdpaLog() as log:
        model(**inputs)
    for line in dict.fromkeys(log.seen):
        print("  eager:", line[:400])
    print("== T5 compiled by kiln with MATH disabled")
    kiln.reset()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(
                [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
            ):
                kiln.compile(model, options={"strict": True})(**inputs)
            print("  compiled without the math path")
        except Exception as e:
            print("  raised:", type(e).__name__, " ".join(str(e).split())[:1500])
    for c in caught:
        text = " ".join(str(c.message).split())
        if "attention" in text.lower() or "sdp" in text.lower() or "kernel" in text.lower():
            print("  warning:", text[:600])


def convnext(out: Path, device: str, size: str) -> None:
    import logging

    path = out / "convnext-code.log"
    handler = logging.FileHandler(path)
    for name in ("kiln.codegen_triton.output_code", "kiln.codegen_cpp.output_code", "kiln.loopir.passes"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    w = build("convnext", size)
    model = w.model.to(device, torch.bfloat16).eval()
    inputs = {k: v.to(device, torch.bfloat16) for k, v in w.inputs.items()}
    kiln.reset()
    with torch.no_grad():
        kiln.compile(model)(**inputs)
    handler.flush()
    text = path.read_text()
    print("== ConvNeXt: kernels with clone and mean;", len(text), "bytes of log in", path.name)
    for m in re.finditer(r"(?ms)^# (triton_\w*clone\w*mean\w*) fuses.*?(?=^\n\n|\Z)", text):
        print(m.group(0)[:3000])
        print("--")
    for line in text.splitlines():
        if "passes]" in line or "layout" in line:
            print("  ", line[:300])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--only", default="t5,convnext")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script at --size cpu")
    parser.add_argument("--size", default="gpu")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        try:
            {"t5": t5, "convnext": convnext}[name](out, args.device, args.size)
        except Exception:
            traceback.print_exc(file=sys.stdout)


if __name__ == "__main__":
    main()
