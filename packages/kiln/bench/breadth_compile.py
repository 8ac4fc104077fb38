"""The whole pipeline on the breadth suite's architectures: every output and gradient against eager.

The breadth suite (`packages/dynamo/bench/breadth_models.py`, 105 architectures built from configs
at tiny size) checks capture with the eager backend; this runs each model through all of kiln —
dynamo, aotgrad, loopir, a code generator — and compares with eager:

* `eval`: eval mode under no_grad, every tensor of the output (tree-flattened: logits, hidden
  states, caches) compared, and its Python structure (types, keys, lengths);
* `train`: train mode, forward + a loss on every floating output + backward; the outputs and
  every parameter's gradient compared.

For each code generator asked (`--backends cpp,triton`: `triton` runs the Triton generator's
kernels under its interpreter on CPU tensors, the path the H200 takes, with the CUDA layout rule
forced). Tolerances are dtype-aware (float32: rtol 1e-4, atol 1e-4 on outputs; gradients 1e-3 /
1e-4: kiln's fused reductions sum in another order). A model whose graphs fall back to eager is
reported (`fell_back`) with the reason: a fallback is never a wrong answer, but it is listed.

    python packages/kiln/bench/breadth_compile.py [--only gpt2,bert] [--suite main|wider|all] [--modes eval,train]
        [--backends cpp,triton] [--dynamic none|true] [--option pad_mm=force] [--json out.json]

`--dynamic true` compiles with every size symbolic from the first call (a graph that cannot take
symbolic sizes compiles static, not a fallback); `--option NAME=VALUE` (repeatable) adds a
kiln.compile option, e.g. `pad_mm=force` pads every GEMM, so that the paths of returned views over
results in another layout run on real models.

A row's `match` false is a wrong answer (or a crash, with its reason). Seeded: models that draw
random numbers in eval (vit_mae's patch mask) see the same generator state in both runs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.utils._pytree as pytree

import kiln
import kiln_dynamo

BENCH = Path(__file__).resolve().parents[2] / "dynamo" / "bench"
sys.path.insert(0, str(BENCH))
from breadth import build  # type: ignore[import-not-found]  # noqa: E402
from breadth_models import MODELS, WIDER  # type: ignore[import-not-found]  # noqa: E402


def _open(x: Any) -> Any:
    """``x`` with plain dataclass instances (which pytree treats as leaves) opened into their
    type's name and a dict of their fields, so their tensors are compared and reach the loss."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type) and not isinstance(x, dict):
        return (type(x).__name__, {f.name: _open(getattr(x, f.name)) for f in dataclasses.fields(x)})
    if type(x) is dict:
        return {k: _open(v) for k, v in x.items()}
    if type(x) in (list, tuple):
        return type(x)(_open(v) for v in x)
    return x  # tensors, and containers pytree knows (ModelOutput, namedtuples)


def _structure(x: Any) -> Any:
    """The Python shape of a result: container types, keys and lengths (tensors as a marker)."""
    leaves, spec = pytree.tree_flatten(_open(x))
    return str(spec), [type(v).__name__ if not isinstance(v, torch.Tensor) else "T" for v in leaves]


def _tensors(x: Any) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(_open(x)) if isinstance(v, torch.Tensor)]


def _compare(got: Any, ref: Any, rtol: float, atol: float) -> str:
    """'' when equal, else what differs first."""
    if _structure(got) != _structure(ref):
        return f"structure {_structure(got)} != {_structure(ref)}"[:300]
    for i, (a, b) in enumerate(zip(_tensors(got), _tensors(ref), strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"leaf {i}: {tuple(a.shape)} {a.dtype} != {tuple(b.shape)} {b.dtype}"
        try:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as e:
            return f"leaf {i} {tuple(a.shape)}: " + " ".join(str(e).split())[:240]
    return ""


def _loss(out: Any) -> torch.Tensor:
    floats = [t for t in _tensors(out) if t.is_floating_point() and t.requires_grad]
    return sum((t.float().pow(2).mean() for t in floats), torch.zeros(()))


def _options(backend: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    base = {"cpu_backend": "triton", "layout_policy": "cuda"} if backend == "triton" else {}
    return {**base, **(extra or {})}


def _option_value(text: str) -> Any:
    """``--option`` values: booleans and numbers as Python's, anything else a string."""
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    try:
        return int(text)
    except ValueError:
        return text


def run(
    name: str, mode: str, backend: str, dynamic: bool | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name, "mode": mode, "backend": backend}
    t0 = time.perf_counter()
    try:
        model, inputs, _ = build(name, mode)
    except Exception as e:
        return {**row, "match": False, "why": f"BUILD {type(e).__name__}: {e}"[:300], "seconds": 0.0}
    ref_model = copy.deepcopy(model)
    kiln.reset()
    try:
        compiled = kiln.compile(model, dynamic=dynamic, options=_options(backend, extra))
        with contextlib.redirect_stdout(io.StringIO()):
            if mode == "eval":
                with torch.no_grad():
                    torch.manual_seed(3)
                    ref = ref_model(**inputs)
                    torch.manual_seed(3)
                    got = compiled(**inputs)
                    torch.manual_seed(3)
                    got2 = compiled(**inputs)  # a second call: the compiled code itself, no capture
                why = _compare(got, ref, 1e-4, 1e-4) or _compare(got2, ref, 1e-4, 1e-4)
            else:
                torch.manual_seed(3)
                ref = ref_model(**inputs)
                _loss(ref).backward()
                torch.manual_seed(3)
                got = compiled(**inputs)
                _loss(got).backward()
                why = _compare(got, ref, 1e-4, 1e-4)
                for (pname, p), q in zip(model.named_parameters(), ref_model.parameters(), strict=True):
                    if why:
                        break
                    if (p.grad is None) != (q.grad is None):
                        why = f"grad of {pname}: {p.grad is None} vs eager {q.grad is None}"
                    elif p.grad is not None:
                        why = _compare(p.grad, q.grad, 1e-3, 1e-4)
                        why = f"grad of {pname}: {why}" if why else ""
        log = kiln.compile_log()
        row.update(
            match=not why,
            why=why,
            graphs=len(log),
            fell_back=sorted({str(g.fell_back)[:160] for g in log if g.fell_back}),
            breaks=kiln_dynamo.counters.graph_breaks,
        )
    except Exception as e:  # a crash is a result too
        row.update(match=False, why=f"CRASH {type(e).__name__}: {e}"[:300])
        traceback.print_exc(file=sys.stderr)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--skip", default="", help="models to leave out")
    parser.add_argument(
        "--suite", default="main", choices=["main", "wider", "all"], help="which models without --only"
    )
    parser.add_argument("--modes", default="eval,train")
    parser.add_argument("--backends", default="cpp,triton")
    parser.add_argument("--dynamic", default="none", choices=["none", "true", "false"])
    parser.add_argument("--option", action="append", default=[], help="NAME=VALUE, a kiln.compile option")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    dynamic = {"none": None, "true": True, "false": False}[args.dynamic]
    extra = {k: _option_value(v) for k, v in (o.split("=", 1) for o in args.option)}
    torch.set_num_threads(1)
    suite = {"main": MODELS, "wider": WIDER, "all": {**MODELS, **WIDER}}[args.suite]
    names = [n for n in (args.only.split(",") if args.only else suite) if n not in args.skip.split(",")]
    rows = []
    for backend in args.backends.split(","):
        for name in names:
            for mode in args.modes.split(","):
                row = run(name, mode, backend, dynamic, extra)
                rows.append(row)
                flag = "ok " if row.get("match") else "BAD"
                extra = f" fell back: {row['fell_back']}" if row.get("fell_back") else ""
                print(
                    f"{flag} {backend:6} {mode:5} {name:24} {row['seconds']:6.1f}s {row.get('why', '')}{extra}",
                    flush=True,
                )
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if not r.get("match")]
    fell = [r for r in rows if r.get("fell_back")]
    print(
        f"\n{len(rows)} rows: {len(rows) - len(bad)} match eager, {len(bad)} do not; {len(fell)} with a graph fallen back"
    )


if __name__ == "__main__":
    main()
