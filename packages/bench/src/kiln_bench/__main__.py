"""`python -m kiln_bench`: run a suite, print a table, write JSON and a PNG.

    python -m kiln_bench --suite models --models gpt2,mlp --modes inference,training \
        --backends eager,inductor,kiln --out packages/bench/results/run

`--profile` adds the profile view (kiln_bench.profile): per model and backend, wall ms, device
kernel ms and kernels per call, the device's idle share and the five slowest kernels, from
torch.profiler over `--profile-calls` steady-state calls; in the JSON as each result's
extra["profile"].
"""

from __future__ import annotations

import os

# Compile time is measured from empty caches: inductor's own caches are off for the whole run.
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import argparse
import sys
from pathlib import Path

import torch

from kiln_bench import harness, micro, report
from kiln_bench import profile as profiling
from kiln_bench.backends import ablation_variants
from kiln_bench.backends import parse as parse_backend
from kiln_bench.models import MODEL_NAMES, SIZES

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _list(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v for v in value.split(",") if v]
    unknown = [v for v in items if v not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(allowed)})"
        )
    return items


def profile_rows(results: list[harness.Result]) -> list[tuple[str, str, str, dict | None, str]]:
    return [
        (r.model, r.mode, r.backend, r.extra.get("profile"), r.reason or r.extra.get("profile_error", ""))
        for r in results
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["models", "micro"], default="models")
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument(
        "--backends", default="eager,inductor,kiln", help="eager, inductor, kiln; a compiler may add :MODE"
    )
    parser.add_argument("--size", choices=SIZES, default="cpu")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls (default 20 on CPU, 50 on GPU)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="warm-up calls (default 3 on CPU, 10 on GPU)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (MODELS.md: 1)")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.png")
    parser.add_argument(
        "--profile", action="store_true", help="profile each backend's steady-state calls (torch.profiler)"
    )
    parser.add_argument("--profile-calls", type=int, default=5, help="calls profiled per backend (default 5)")
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="add one variant of each kiln backend per optimization switch, turned off (Note [The ablation])",
    )
    args = parser.parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    profile_calls = max(args.profile_calls, 1) if args.profile else 0
    if profile_calls and not on_gpu:
        # Note [What the profile counts]: C++ kernels are named ranges only when asked for, and
        # both compilers read the switch when they generate code, so before the first compile
        os.environ.setdefault("KILN_PROFILE", "1")
        os.environ.setdefault("TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE", "1")
    repeats = args.repeats if args.repeats is not None else (50 if on_gpu else 20)
    warmup = args.warmup if args.warmup is not None else (10 if on_gpu else 3)
    backends = [v for v in args.backends.split(",") if v]
    for backend in backends:
        try:
            parse_backend(backend)
        except KeyError as e:
            parser.error(str(e.args[0]))
    if args.ablation:
        kilns = [b for b in backends if parse_backend(b)[0] == "kiln" and b.count(":") < 2]
        if not kilns:
            parser.error("--ablation varies a kiln backend: name one in --backends")
        backends += [v for b in kilns for v in ablation_variants(b, args.device)]
    settings = {"suite": args.suite, "size": args.size, "device": args.device, "dtype": args.dtype,
                "repeats": repeats, "warmup": warmup, "profile_calls": profile_calls}  # fmt: skip
    if not on_gpu:
        torch.set_num_threads(args.threads)
    if args.suite == "micro":
        results = micro.run(
            backends, device=args.device, repeats=repeats, warmup=warmup, progress=sys.stderr,
            profile_calls=profile_calls,
        )  # fmt: skip
    else:
        models = _list(args.models, MODEL_NAMES, "models")
        modes = _list(args.modes, harness.MODES, "modes")
        from tqdm import tqdm

        results = []
        jobs = [(m, mode) for m in models for mode in modes]
        for model, mode in tqdm(jobs, desc="models", unit="run", file=sys.stderr):
            results += harness.run_model(
                model, mode, backends, size=args.size, device=args.device, dtype=DTYPES[args.dtype],
                repeats=repeats, warmup=warmup, profile_calls=profile_calls,
            )  # fmt: skip
            if args.out is not None:  # after every model: a run cut short keeps what it measured
                report.write_json(args.out.with_suffix(".json"), results, {**settings, "partial": True})
    print(report.table(results))
    ablation = report.ablation_table(results)
    if ablation:
        print()
        print(ablation)
    if profile_calls:
        print()
        print(profiling.table(profile_rows(results)))
    if args.out is not None:
        report.write_json(args.out.with_suffix(".json"), results, settings)
        report.write_png(args.out.with_suffix(".png"), results)
        print(f"\nwrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
