"""Kiln's Python-side compile time of a kiln_bench model for the GPU, measured on the CPU, and a
fingerprint of what it generated.

Why: capture, aotgrad, loopir's lowering and scheduling and the Triton generator's source
generation are pure Python and cost the same without a GPU. This compiles a model (gpu size)
through the Triton generator on CPU tensors as ``triton_kernel_audit.py`` does (the CUDA layout
rule, T5's mask made dense), skips the generated kernels, and answers the heavy extern calls
(GEMMs, convolutions, attention, max pooling) with uninitialised tensors of their meta shapes, so
one training step compiles in seconds. It prints one JSON line: each phase's time
(``kiln.compile_log()``), the first call's wall time, and the cyclic collector's collections and
time inside it. ``--cpu`` times phases in process CPU time (the machine is shared).
``--dump FILE`` writes the sha256 of every generated module and wrapper source: compare two
trees' dumps to show a change left the generated code byte-identical (the code does not depend
on ``PYTHONHASHSEED``: Note [Deterministic schedules] in kiln_loopir's scheduler.py).

    PYTHONHASHSEED=0 python scripts/compile_time_probe.py --model resnet --mode train --cpu \\
        --dump /tmp/resnet_train.json
"""

from __future__ import annotations

import argparse
import builtins
import gc
import hashlib
import json
import os
import sys
import tempfile
import time
import warnings
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")
CACHE = tempfile.mkdtemp(prefix="kiln-compile-probe-")
os.environ["KILN_CACHE_DIR"] = CACHE
if "--cpu" in sys.argv:
    time.perf_counter = time.process_time  # kiln's phase clocks count CPU time

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402

WRAPPERS: list[str] = []
_compile = builtins.compile


def _recording_compile(source: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
    if filename == "<kiln-triton-wrapper>":  # wrapper.py compiles its source under this name
        WRAPPERS.append(source if isinstance(source, str) else repr(source))
    return _compile(source, filename, *args, **kwargs)


builtins.compile = _recording_compile

import kiln  # noqa: E402
from kiln_codegen_triton import runtime as triton_runtime  # noqa: E402

HEAVY = (
    "mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
)  # fmt: skip
_LIB = torch.library.Library("aten", "IMPL")


def _shaped_like_meta(op: Any) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        def to_meta(x: Any) -> Any:
            return x.to("meta") if isinstance(x, torch.Tensor) else x

        def back(m: Any) -> Any:
            if not isinstance(m, torch.Tensor):
                return m
            r = torch.empty_strided(m.shape, m.stride(), dtype=m.dtype)
            return r if r.is_floating_point() else r.zero_()  # indices stay in bounds

        return pytree.tree_map(back, op(*pytree.tree_map(to_meta, args), **pytree.tree_map(to_meta, kwargs)))

    return kernel


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
    for name in HEAVY:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            _LIB.impl(name, _shaped_like_meta(packet.default), "CPU")

GC = {"start": 0.0, "full": 0, "full_s": 0.0, "all_s": 0.0}


def _collector(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        GC["start"] = time.process_time()
        return
    spent = time.process_time() - GC["start"]
    GC["all_s"] += spent
    if info["generation"] == 2:
        GC["full"] += 1
        GC["full_s"] += spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet")
    parser.add_argument("--mode", default="train", choices=["train", "infer"])
    parser.add_argument("--cpu", action="store_true", help="phases in process CPU time")
    parser.add_argument("--dump", default=None, help="write the generated sources' sha256 here")
    args = parser.parse_args()
    from kiln_bench.models import build, logits_of, loss_of

    triton_runtime.Launcher.__call__ = lambda self, *a: None  # type: ignore[method-assign]
    w = build(args.model, "gpu").to("cpu")
    options = {
        "cpu_backend": "triton",
        "layout_policy": "cuda",
        "attention_dense_mask": "force",
        "strict": True,
    }
    compiled = kiln.compile(w.model, options=options)
    w.model.train(args.mode == "train")
    gc.callbacks.append(_collector)
    start = time.perf_counter()
    with torch.set_grad_enabled(args.mode == "train"):
        out = compiled(**w.inputs)
        if args.mode == "train":
            loss_of(w, out).backward()
        else:
            logits_of(out)
    first_call = time.perf_counter() - start
    gc.callbacks.remove(_collector)
    phases: dict[str, float] = {}
    for g in kiln.compile_log():
        for k, v in g.phases.items():
            phases[k] = phases.get(k, 0.0) + v
    row = {"model": args.model, "mode": args.mode, "first call": first_call, **phases}
    row |= {"gc full": GC["full"], "gc full s": GC["full_s"], "gc s": GC["all_s"]}
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    if args.dump:
        digests = {}
        for root, _, files in os.walk(CACHE):
            for f in files:
                if f.endswith(".py"):
                    with open(os.path.join(root, f), "rb") as fh:
                        digests[os.path.relpath(os.path.join(root, f), CACHE)] = hashlib.sha256(
                            fh.read()
                        ).hexdigest()
        for i, source in enumerate(WRAPPERS):
            digests[f"wrapper{i}"] = hashlib.sha256(source.encode()).hexdigest()
        with open(args.dump, "w") as fh:
            json.dump(digests, fh, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
