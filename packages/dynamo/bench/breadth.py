"""Breadth of capture: graphs / breaks / frames left to Python per model and mode, kiln vs torch.compile.

Run: PYTHONPATH=packages/dynamo/src:packages/frame_hook/src python packages/dynamo/bench/breaks.py --models
     [--only gpt2,bert] [--modes eval,train,cache] [--no-torch] [--json out.json]

For each model of `breadth_models.MODELS` and each mode: `eval` (eval mode, no_grad), `train`
(train mode, forward + a loss on the main output + backward, gradients compared with eager),
`cache` (decoder LMs and encoder-decoders: a prefill with `use_cache=True`, then one decoding
step with the returned cache, which is what is counted: the KV-cache path of generation), kiln's counts come
from `kiln_dynamo.explain` (capture with the eager backend), its result is compared with eager,
and torch.compile's counts from `torch._dynamo.explain` (the baseline; bench code only).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import io
import json
import sys
import time
import traceback
from typing import Any

import torch

import kiln_dynamo

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from breadth_models import MODELS, WIDER, first_tensor

MODES = ("eval", "train", "cache")  # and "kiln": eval through kiln.compile (the whole pipeline)


def run_kiln(name: str) -> dict[str, Any]:
    """Eval through `kiln.compile` (dynamo, aotgrad, loopir, C++/Triton): does any graph fall back
    to eager as a whole, and which ops did loopir run as extern fallbacks?"""
    import warnings

    import kiln

    row: dict[str, Any] = {"model": name, "mode": "kiln"}
    model, inputs, _ = build(name, "eval")
    ref_model = copy.deepcopy(model)
    kiln.reset()
    t0 = time.perf_counter()
    try:
        with (
            torch.no_grad(),
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(io.StringIO()),
        ):
            warnings.simplefilter("always")
            got = kiln.compile(model)(**inputs)
            ref = ref_model(**inputs)
        log = kiln.compile_log()
        whole = [g.fell_back for g in log if g.fell_back]
        row.update(
            graphs=len(log), breaks=kiln_dynamo.counters.graph_breaks, plain=len(kiln_dynamo.counters.fallbacks),
            match=_close(got, ref), whole_graph_fallbacks=len(whole),
            reasons=sorted({str(w)[:200] for w in whole} | {str(c.message)[:200] for c in caught
                           if "eagerly" in str(c.message) or "extern" in str(c.message)}),
        )  # fmt: skip
    except Exception as e:
        row.update(
            graphs=-1, breaks=-1, plain=-1, match=False, reasons=[f"CRASH {type(e).__name__}: {e}"[:300]]
        )
        traceback.print_exc(file=sys.stderr)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def _close(a: Any, b: Any, whole: bool = False) -> bool:
    """The main outputs agree; with `whole` (the hand-written programs), every value of the
    output does, with eager's Python types."""
    try:
        if whole:
            _same_structure(a, b)
        else:
            torch.testing.assert_close(first_tensor(a), first_tensor(b), rtol=1e-4, atol=1e-4)
        return True
    except (AssertionError, TypeError):
        return False


def _same_structure(a: Any, b: Any) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.requires_grad == b.requires_grad
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            _same_structure(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same_structure(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same_structure(a[k], b[k])
    else:
        assert a == b, (a, b)


def _loss(out: Any) -> torch.Tensor:
    return first_tensor(out).float().pow(2).mean()


def _step_inputs(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """One decoding step after a prefill: a decoder LM's next token with its KV cache; an
    encoder-decoder's next decoder token with the encoder's output and the decoder's cache (what
    `generate` runs per token)."""
    with torch.no_grad():
        pre = model(**inputs, use_cache=True)
    batch = next(iter(inputs.values())).shape[0]
    nxt = torch.randint(0, 64, (batch, 1), generator=torch.Generator().manual_seed(5))
    # the cache under the name the forward takes: transformers 5 renamed `past_key_values` to
    # `cache`, and not every model maps the old name (mamba ignored it and started a new cache)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    if "decoder_input_ids" in inputs:
        encoded = (pre.encoder_last_hidden_state,)
        return {
            "decoder_input_ids": nxt,
            "encoder_outputs": encoded,
            name: pre.past_key_values,
            "use_cache": True,
        }
    return {"input_ids": nxt, name: pre.past_key_values, "use_cache": True}


CACHED = ("decoder", "seq2seq")  # the kinds with a `cache` mode


def build(name: str, mode: str) -> tuple[Any, dict[str, Any], str]:
    model, inputs, kind = (MODELS[name] if name in MODELS else WIDER[name])()
    for m in model.modules():  # T5's stacks hold copies of the config
        config = getattr(m, "config", None)
        if config is not None and "use_cache" in vars(config):
            # eval and train without the KV cache; an encoder-decoder's step asks for it by
            # argument (T5's encoder stack refuses a config that sets it)
            config.use_cache = mode == "cache" and kind == "decoder"
    if mode == "train":
        model.train()
    return model, inputs, kind


def run_mode(name: str, mode: str, with_torch: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name, "mode": mode}
    try:
        model, inputs, kind = build(name, mode)
    except Exception as e:
        return {**row, "graphs": -1, "breaks": -1, "plain": -1, "match": False, "seconds": 0.0,
                "reasons": [f"BUILD {type(e).__name__}: {e}"[:300]]}  # fmt: skip
    if mode == "cache" and kind not in CACHED:
        return {}
    ref_model = copy.deepcopy(model)
    if mode == "cache":
        try:
            step = _step_inputs(model, inputs)
            ref_step = _step_inputs(ref_model, inputs)
        except Exception as e:  # the eager prefill itself (a model that returns no cache)
            return {**row, "graphs": -1, "breaks": -1, "plain": -1, "match": False, "seconds": 0.0,
                    "reasons": [f"PREFILL {type(e).__name__}: {e}"[:300]]}  # fmt: skip
    t0 = time.perf_counter()
    try:
        kiln_dynamo.reset()
        with contextlib.redirect_stdout(io.StringIO()):
            if mode == "eval":
                with torch.no_grad():  # seeded: vit_mae draws its patch mask in eval too
                    torch.manual_seed(3)
                    report = kiln_dynamo.explain(model)(**inputs)
                    torch.manual_seed(3)
                    ref = ref_model(**inputs)
                ok = _close(report.result, ref, kind == "program")
            elif mode == "train":
                torch.manual_seed(3)
                report = kiln_dynamo.explain(model)(**inputs)
                _loss(report.result).backward()
                torch.manual_seed(3)
                ref = ref_model(**inputs)
                _loss(ref).backward()
                ok = _close(report.result, ref, kind == "program") and all(
                    (p.grad is None and q.grad is None)
                    or (
                        p.grad is not None
                        and q.grad is not None
                        and torch.allclose(p.grad, q.grad, 1e-4, 1e-5)
                    )
                    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True)
                )
            else:
                with torch.no_grad():
                    report = kiln_dynamo.explain(model)(**step)
                    ref = ref_model(**ref_step)
                ok = _close(report.result, ref)
        plain = [c for c, _ in kiln_dynamo.counters.fallbacks]
        row.update(
            graphs=report.graph_count,
            breaks=sum(1 for r in report.break_reasons if r.split),
            plain=len(plain),
            match=ok,
            reasons=sorted({str(r).splitlines()[0][:160] for r in report.break_reasons}),
        )
    except Exception as e:  # a crash is a result too
        row.update(
            graphs=-1, breaks=-1, plain=-1, match=False, reasons=[f"CRASH {type(e).__name__}: {e}"[:300]]
        )
        traceback.print_exc(file=sys.stderr)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    if with_torch:
        row["torch"] = _torch_counts(name, mode)
    return row


def _torch_counts(name: str, mode: str) -> tuple[int, int]:
    import torch._dynamo

    model, inputs, _ = build(name, mode)
    if mode == "cache":
        inputs = _step_inputs(model, inputs)
    torch._dynamo.reset()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ctx = torch.no_grad() if mode != "train" else contextlib.nullcontext()
            with ctx:
                tex = torch._dynamo.explain(model)(**inputs)
        return tex.graph_count, tex.graph_break_count
    except Exception:
        return -1, -1
    finally:
        torch._dynamo.reset()


def _option(argv: list[str], name: str) -> str | None:
    """`--name=value` or `--name value` (the last one given); None when absent."""
    found = None
    for i, a in enumerate(argv):
        if a.startswith(name + "="):
            found = a.split("=", 1)[1]
        elif a == name:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise SystemExit(f"{name} needs a value")
            found = argv[i + 1]
    return found


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    only = _option(argv, "--only")
    modes = (_option(argv, "--modes") or ",".join(MODES)).split(",")
    out = _option(argv, "--json")
    names = only.split(",") if only else list(MODELS)
    rows = []
    for name in names:
        for mode in modes:
            row = run_kiln(name) if mode == "kiln" else run_mode(name, mode, "--no-torch" not in argv)
            if not row:
                continue
            rows.append(row)
            t = row.get("torch")
            print(
                f"{name:<26} {mode:<6} kiln graphs/breaks/plain {row['graphs']:>3}/{row['breaks']:>3}/{row['plain']:>3}"
                f" match={'yes' if row['match'] else 'NO ':<3}"
                + (f" torch {t[0]:>3}/{t[1]:>3}" if t else "")
                + f"  {row['seconds']:6.1f}s",
                flush=True,
            )
            for r in row["reasons"][:4]:
                print(f"      {r}", flush=True)
    total = {k: sum(max(r[k], 0) for r in rows) for k in ("breaks", "plain")}
    one = sum(1 for r in rows if r["graphs"] == 1 and r["breaks"] == 0 and r["plain"] == 0)
    print(f"\n{len(rows)} model-modes: {one} at 1 graph/0 breaks/0 plain; total breaks {total['breaks']}, "
          f"frames in Python {total['plain']}, mismatches {sum(1 for r in rows if not r['match'])}")  # fmt: skip
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
