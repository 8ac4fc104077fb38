"""Which C++ kernels of the public models open an OpenMP team, for how much work, and whether
reductions with few outputs split: an audit of the parallel plans (Note [Parallel plan], Note
[Reductions with few outputs], Note [Work of a kernel] in kiln_codegen_cpp/parallel.py).

Each model of kiln_bench's public suite (CPU size) is compiled by kiln at ``--threads`` (default
2: the plans do not depend on the count, which is read at run time, but a team of one never
forks), inference and/or a training step, with ``KILN_LOG=parallel`` captured: every kernel's
plan line (serial, or parallel with its kind, units and thread cap) and its element-iterations
(weighted by its body). It reports per model the kernels, how many have a parallel region, the
smallest work among those, and two findings that should be empty:

* ``tiny parallel``: a kernel with a parallel region below ``PARALLEL_GRAIN`` weighted
  element-iterations (the threshold the plans apply; with symbolic sizes the kernel applies it
  at run time, which this audit does not see);
* ``unsplit few-output reductions``: a reduction with fewer than ``FEW_OUTPUTS`` parallel units
  (outputs; for a column reduction, blocks of 64 outputs: a bias gradient of 256 channels has 4)
  and at least ``2 * PARALLEL_GRAIN`` element-iterations, big enough to split, whose plan is
  not ``split`` (so at most that many threads work on it), with its plan, for a look at why
  (several r-phases, symbolic sizes).

The table also counts the few-output reductions, how many split and how many are too small to
split (each piece would hold less than twice ``MIN_SPLIT_WORK``: left whole by design).

``--strict`` exits 1 when either is not empty. A benchmark-side audit, not a test (the tests in
tests/test_parallel.py hold the rules on small graphs).

    python packages/codegen_cpp/bench/parallel_audit.py --models resnet,gpt2,bert,mlp,cnn,convnext,t5,llama --modes eval,train
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tempfile
from dataclasses import dataclass

import torch

from kiln_codegen_cpp.parallel import FEW_OUTPUTS, MIN_SPLIT_WORK, PARALLEL_GRAIN

DEFAULT_MODELS = "resnet,gpt2,bert,mlp,cnn,convnext,t5,llama"
_LINE = re.compile(
    r"kernel (?P<name>\S+): (?:serial|parallel (?P<kind>\w+): collapse \d+, (?P<units>\d+) units, "
    r"at most (?P<cap>\d+) threads) \((?P<work>\d+) element-iterations(?:, weighted (?P<weighted>\d+))?"
    r"(?:; a reduction of (?P<outputs>\d+) outputs)?\)"
)


@dataclass(frozen=True)
class Plan:
    name: str
    kind: str  # "serial" or the parallel kind
    units: int
    cap: int
    work: int
    weighted: int
    outputs: int | None  # a reduction's outputs


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.plans: list[Plan] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = _LINE.search(record.getMessage())
        if m is None:
            return
        work = int(m["work"])
        self.plans.append(
            Plan(
                m["name"],
                m["kind"] or "serial",
                int(m["units"] or 1),
                int(m["cap"] or 1),
                work,
                int(m["weighted"] or work),
                int(m["outputs"]) if m["outputs"] else None,
            )
        )


def audit(name: str, mode: str) -> list[Plan]:
    # imported here, not at the top: codegen_cpp's tests import this module for its parser, in an
    # environment without the kiln umbrella or kiln_bench
    import kiln
    from kiln_bench.models import build, logits_of, loss_of

    capture = _Capture()
    logger = logging.getLogger("kiln.codegen_cpp.parallel")
    level = logger.level
    logger.setLevel(logging.DEBUG)  # setLevel, not the attribute: it clears the isEnabledFor cache
    logger.addHandler(capture)
    try:
        kiln.reset()
        w = build(name, "cpu")
        compiled = kiln.compile(w.model)
        if mode == "train":
            w.model.train()
            loss_of(w, compiled(**w.inputs)).backward()
        else:
            w.model.eval()
            with torch.no_grad():
                logits_of(compiled(**w.inputs))
    finally:
        logger.removeHandler(capture)
        logger.setLevel(level)
        kiln.reset()
    # a kernel is rendered once; keep the last line of each name (a recompile logs it again)
    return list({p.name: p for p in capture.plans}.values())


def _few_outputs(p: Plan) -> bool:
    """A reduction whose parallel units (outputs, or a column reduction's blocks of outputs) are
    fewer than ``FEW_OUTPUTS``, with work enough to split; a ``split`` plan is one by definition."""
    if p.outputs is None or p.work < 2 * PARALLEL_GRAIN:
        return False
    return p.kind == "split" or (p.units if p.kind != "serial" else p.outputs) < FEW_OUTPUTS


def _too_small(p: Plan) -> bool:
    """Would each (unit, chunk) piece of a split hold less than ``MIN_SPLIT_WORK`` twice over?
    (``split_chunks`` then leaves it whole, by design: Note [Reductions with few outputs].)"""
    units = p.units if p.kind != "serial" else (p.outputs or 1)
    return p.work // (units * MIN_SPLIT_WORK) < 2


def findings(plans: list[Plan]) -> tuple[list[Plan], list[Plan]]:
    """(tiny kernels with a parallel region, few-output reductions left unsplit though big
    enough to split)."""
    tiny = [p for p in plans if p.kind != "serial" and p.cap > 1 and p.weighted < PARALLEL_GRAIN]
    unsplit = [p for p in plans if _few_outputs(p) and p.kind != "split" and not _too_small(p)]
    return tiny, unsplit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--modes", default="eval,train", help="eval and/or train (a training step)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--strict", action="store_true", help="exit 1 on any finding")
    args = parser.parse_args(argv)
    # an empty cache: every kernel is generated anew, so every plan is logged
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-audit-")
    torch.set_num_threads(args.threads)
    bad = 0
    print(
        f"{'model':10s} {'mode':5s} {'kernels':>7s} {'parallel':>8s} {'least parallel work':>20s} "
        f"{'few-output reductions':>32s}  findings"
    )
    for name in filter(None, args.models.split(",")):
        for mode in filter(None, args.modes.split(",")):
            try:
                plans = audit(name, mode)
            except Exception as e:  # one model failing is a row, not the end of the audit
                print(f"{name:10s} {mode:5s} error: {type(e).__name__}: {e}"[:200], flush=True)
                continue
            parallel = [p for p in plans if p.kind != "serial" and p.cap > 1]
            least = min((p.weighted for p in parallel), default=0)
            tiny, unsplit = findings(plans)
            bad += len(tiny) + len(unsplit)
            note = "none" if not (tiny or unsplit) else f"{len(tiny)} tiny parallel, {len(unsplit)} unsplit"
            few = [p for p in plans if _few_outputs(p)]
            split = sum(p.kind == "split" for p in few)
            small = sum(p.kind != "split" and _too_small(p) for p in few)
            print(
                f"{name:10s} {mode:5s} {len(plans):7d} {len(parallel):8d} {least:20d} "
                f"{f'{len(few)} ({split} split, {small} too small)':>32s}  {note}",
                flush=True,
            )
            for p in tiny:
                print(f"    tiny parallel: {p}", flush=True)
            for p in unsplit:
                print(f"    unsplit few-output reduction: {p}", flush=True)
    return 1 if bad and args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
