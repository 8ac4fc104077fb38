"""PyTorch's OpInfo database, swept: every float32 CPU operator's first sample, called through a
compiled frame, must equal eager (never a wrong answer, never a crash). Operators whose frame is
not captured must say why; the capture rate must not regress below the floor."""

from __future__ import annotations

import collections
import os
import warnings
from typing import Any

import torch

import kiln_dynamo

# Operators with random results, or that allocate uninitialised memory, cannot be compared.
_NONDETERMINISTIC = (
    "rand",
    "normal",
    "bernoulli",
    "multinomial",
    "uniform",
    "empty",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "dropout",
    "rrelu",
    "fractional_max_pool",
)
# Every STRIDE-th operator (deterministic): torch's sample-input generation is slow under pytest
# (inspect.getframeinfo per sample), and the whole sweep took ~100 s of this suite's budget.
# Run all of them with KILN_OPINFO_STRIDE=1 (648 compared, 594 captured, 0 wrong when written).
STRIDE = int(os.environ.get("KILN_OPINFO_STRIDE", "2"))
CAPTURE_FLOOR = 0.85  # fraction of compared operators captured whole


def test_opinfo_sweep() -> None:
    from torch.testing._internal.common_methods_invocations import op_db

    compared = captured = 0
    wrong: list[str] = []
    reasons: collections.Counter[str] = collections.Counter()
    warnings.simplefilter("ignore")
    for info in op_db[::STRIDE]:
        if any(s in info.name for s in _NONDETERMINISTIC) or torch.float32 not in info.supported_dtypes(
            "cpu"
        ):
            continue
        try:
            sample = next(iter(info.sample_inputs("cpu", torch.float32, requires_grad=False)))
            ref = info.op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            continue
        op = info.op

        def frame(inp: Any, args: Any, kwargs: Any, op: Any = op) -> Any:
            return op(inp, *args, **kwargs)

        kiln_dynamo.reset()
        try:
            out = kiln_dynamo.compile(frame)(sample.input, sample.args, sample.kwargs)
            torch.testing.assert_close(out, ref, equal_nan=True)
        except Exception as e:
            wrong.append(f"{info.name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        compared += 1
        captured += kiln_dynamo.counters.graphs > 0
        for _, reason in kiln_dynamo.counters.fallbacks:
            assert "internal error" not in reason, f"{info.name}: {reason}"
            reasons[reason.split(" (at")[0]] += 1
    assert wrong == []
    assert compared > 600 // STRIDE
    assert captured >= CAPTURE_FLOOR * compared, reasons.most_common(10)
