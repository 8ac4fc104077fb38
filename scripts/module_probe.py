"""Which module of a breadth-suite model makes kiln's output differ from eager's: every submodule
of the chosen kinds is compiled alone and called with the very inputs eager gave it.

    python scripts/module_probe.py --model deepseek_v3 --device cuda --dtype bfloat16
        [--kinds Attention,MoE,TopkRouter,Experts,MLP,RMSNorm,DecoderLayer] [--option attention=false]

A whole-model mismatch (breadth_speed.py's "mismatch") says that kiln differs, not where. Here eager
runs the model once with forward pre-hooks that record each chosen submodule's arguments and
outputs; then each submodule (a deep copy) is compiled with kiln on its own and called with the
recorded arguments, and its outputs are compared with eager's: floating outputs by their largest
absolute difference, integer outputs (a router's expert indices) by the rows whose sorted values
differ (`topk(sorted=False)` may order them either way). A module that differs alone holds the
cause; one that matches alone but differs inside the model differs only by what it was given.

Each line: module name, class, output index, dtype, shape, and the difference. `--option k=v`
passes kiln.compile options (repeatable); `--whole` also compares the whole model, per token;
`--variant "cse=false,KILN_DIRECT_CALLS=0"` (repeatable) compares the whole model once more under
those options and environment switches (names starting with KILN_; set while it compiles and runs),
each in the same process after `kiln.reset()`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

BENCH = Path(__file__).resolve().parents[1] / "packages" / "dynamo" / "bench"
sys.path.insert(0, str(BENCH))
from breadth_models import MODELS, first_tensor  # type: ignore[import-not-found]  # noqa: E402

import kiln  # noqa: E402


def _option(text: str) -> tuple[str, Any]:
    key, _, raw = text.partition("=")
    value: Any = {"true": True, "false": False}.get(raw.lower(), raw)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = int(value)
    return key, value


def _move(x: Any, device: str, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.to(device)
        return x.to(dtype) if x.is_floating_point() else x
    return x


def _cloned(tree: Any) -> Any:
    return pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _difference(got: torch.Tensor, ref: torch.Tensor) -> str:
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"MISMATCH {tuple(got.shape)} {got.dtype} != {tuple(ref.shape)} {ref.dtype}"
    if ref.is_floating_point():
        d = (got.float() - ref.float()).abs()
        worst = d.max().item() if d.numel() else 0.0
        where = tuple(int(i) for i in torch.unravel_index(d.argmax(), d.shape)) if d.numel() else ()
        return f"max |diff| {worst:.4g} at {where}, ref magnitude {ref.float().abs().max().item():.3g}"
    a, b = (
        got.reshape(-1, got.shape[-1] if got.dim() else 1),
        ref.reshape(-1, ref.shape[-1] if ref.dim() else 1),
    )
    rows = (a.sort(-1).values != b.sort(-1).values).any(-1)
    flag = "MISMATCH " if rows.any() else ""
    return f"{flag}{int(rows.sum())} of {rows.numel()} rows differ (as sets): {rows.nonzero().flatten().tolist()[:16]}"


def _sdpa_backends(i: int, a: tuple[Any, ...], kw: dict[str, Any]) -> None:
    """One SDPA call of eager's, as given and with dense copies of q, k, v, under each backend,
    against the math backend in float32 (what kiln's aligned operand copies and its trace-time
    kernel choice may change: Note [Aligned attention operands] in kiln_loopir)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    f = torch.nn.functional.scaled_dot_product_attention
    shapes = [(tuple(t.shape), t.stride(), t.storage_offset()) for t in a[:3] if isinstance(t, torch.Tensor)]
    print(f"sdpa call {i}: q/k/v (shape, stride, offset) {shapes} kwargs { {k: v for k, v in kw.items()} }")
    with torch.no_grad():
        with sdpa_kernel([SDPBackend.MATH]):
            ref = f(
                *[t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in a], **kw
            )
        for dense in (False, True):
            args = [t.contiguous() if dense and isinstance(t, torch.Tensor) else t for t in a]
            try:  # the kernel eager picks for these tensors (kiln asks the same with its fakes)
                choice = torch._fused_sdp_choice(*args[:3], **kw)
                print(f"  {'dense ' if dense else 'as given'} eager's choice: {SDPBackend(choice).name}")
            except Exception as e:
                print(
                    f"  {'dense ' if dense else 'as given'} eager's choice: ? ({str(e).splitlines()[0][:80]})"
                )
            for backend in (
                SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.CUDNN_ATTENTION,
                SDPBackend.MATH,
            ):
                try:
                    with sdpa_kernel([backend]):
                        got = f(*args, **kw)
                    d = (got.float() - ref).abs().max().item()
                    print(
                        f"  {'dense ' if dense else 'as given'} {backend.name}: max |diff| vs fp32 math {d:.4g}"
                    )
                except Exception as e:
                    print(
                        f"  {'dense ' if dense else 'as given'} {backend.name}: refused ({str(e).splitlines()[0][:80]})"
                    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="deepseek_v3")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--kinds", default="Attention,MoE,TopkRouter,Experts,MLP,RMSNorm,DecoderLayer")
    p.add_argument("--option", action="append", default=[], help="a kiln.compile option k=v (repeatable)")
    p.add_argument("--whole", action="store_true", help="also compare the whole model, per token")
    p.add_argument("--variant", action="append", default=[], help="options/KILN_ switches, comma-separated")
    p.add_argument("--sdpa", action="store_true", help="each SDPA call eager made, under every backend")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    options = dict(_option(o) for o in args.option)
    kinds = tuple(k for k in args.kinds.split(",") if k)

    model, inputs, _ = MODELS[args.model]()
    model = model.to(args.device).to(dtype).eval()
    inputs = {k: _move(v, args.device, dtype) for k, v in inputs.items()}
    chosen = {
        name: m
        for name, m in model.named_modules()
        if name and any(type(m).__name__.endswith(k) for k in kinds)
    }
    recorded: dict[str, tuple[tuple[Any, ...], dict[str, Any], Any]] = {}

    def pre(name: str) -> Any:
        def hook(module: torch.nn.Module, a: tuple[Any, ...], kw: dict[str, Any]) -> None:
            if name not in recorded:  # the first call (a module called twice keeps its first)
                recorded[name] = (_cloned(a), _cloned(kw), None)  # later code may write them in place

        return hook

    def post(name: str) -> Any:
        def hook(module: torch.nn.Module, a: tuple[Any, ...], kw: dict[str, Any], out: Any) -> None:
            a0, kw0, seen = recorded[name]
            if seen is None:
                clone = _cloned(out)
                recorded[name] = (a0, kw0, clone)

        return hook

    handles = []
    for name, m in chosen.items():
        handles.append(m.register_forward_pre_hook(pre(name), with_kwargs=True))
        handles.append(m.register_forward_hook(post(name), with_kwargs=True))
    sdpa_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if args.sdpa:

        def recording(*a: Any, **kw: Any) -> Any:
            sdpa_calls.append((a, kw))
            return sdpa(*a, **kw)

        torch.nn.functional.scaled_dot_product_attention = recording
    try:
        with torch.no_grad():
            ref_whole = first_tensor(model(**inputs))
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
    for h in handles:
        h.remove()
    for i, (a, kw) in enumerate(sdpa_calls):
        _sdpa_backends(i, a, kw)

    print(f"model {args.model} device {args.device} dtype {args.dtype} options {options}")
    for name, (a, kw, ref) in recorded.items():
        module = copy.deepcopy(chosen[name])
        kiln.reset()
        try:
            with torch.no_grad():
                compiled = kiln.compile(module, options=options)
                got = compiled(*a, **kw)
                got = compiled(*a, **kw)  # the second call: what a warm model returns
        except Exception as e:
            print(f"{name} {type(chosen[name]).__name__}: ERROR {type(e).__name__}: {str(e)[:160]}")
            continue
        for i, (g, r) in enumerate(zip(_tensors(got), _tensors(ref), strict=False)):
            print(
                f"{name} {type(chosen[name]).__name__} out{i} {r.dtype} {tuple(r.shape)}: {_difference(g, r)}"
            )
    variants = [("", {}, {})] if args.whole else []
    for text in args.variant:
        pairs = [_option(t) for t in text.split(",") if t]
        env = {k: str(v) for k, v in pairs if k.startswith("KILN_")}
        variants.append((text, {**options, **{k: v for k, v in pairs if not k.startswith("KILN_")}}, env))
    for label, opts, env in variants:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        kiln.reset()
        try:
            with torch.no_grad():
                compiled = kiln.compile(copy.deepcopy(model), options=opts)
                compiled(**inputs)
                got = first_tensor(compiled(**inputs))
        except Exception as e:
            print(f"whole model [{label or 'default'}]: ERROR {type(e).__name__}: {str(e)[:160]}")
            continue
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        d = (got.float() - ref_whole.float()).abs()
        per_token = d.reshape(-1, d.shape[-1]).max(-1).values
        print(
            f"whole model [{label or 'default'}]: max |diff| {d.max().item():.4g}, {int((d > 0.05).sum())} "
            f"over 0.05; per token: {[round(x, 3) for x in per_token.tolist()]}"
        )


if __name__ == "__main__":
    main()
