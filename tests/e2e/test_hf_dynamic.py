"""HuggingFace LMs (tiny configs) at 3 batch sizes x 5 sequence lengths under dynamic shapes:
every result equals eager; automatic dynamic compiles twice, `dynamic=True` once."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import tiny_hf
import torch

import kiln_dynamo

_gpt2, _llama = tiny_hf.gpt2, tiny_hf.llama


# the second call changes both dims, so automatic dynamic makes both symbolic at once
SHAPES = [(2, 5), *[s for s in itertools.product((3, 4, 2), (8, 16, 24, 33, 5)) if s != (2, 5)]]


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_lm_at_many_shapes(make: Any, dynamic: bool | None) -> None:
    kiln_dynamo.reset()
    torch.manual_seed(0)
    model = make().eval()
    compiled = kiln_dynamo.compile(model, dynamic=dynamic)  # the eager backend: capture only
    with torch.no_grad():
        for b, t in SHAPES:
            ids = torch.randint(0, 64, (b, t))
            torch.testing.assert_close(compiled(ids).logits, model(ids).logits)
    counters = kiln_dynamo.counters
    assert counters.fallbacks == [] and counters.graph_breaks == 0
    assert counters.graphs == (2 if dynamic is None else 1)


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_lm_compiled_by_kiln_at_many_shapes(make: Any, dynamic: bool | None) -> None:
    """The whole pipeline on the CPU: aotgrad traces the symbolic graph once, loopir lowers it
    with symbolic sizes and one C++ build serves every shape."""
    import kiln

    kiln.reset()
    torch.manual_seed(0)
    model = make().eval()
    compiled = kiln.compile(model, dynamic=dynamic)
    with torch.no_grad():
        for b, t in SHAPES:
            ids = torch.randint(0, 64, (b, t))
            torch.testing.assert_close(compiled(ids).logits, model(ids).logits)
    counters = kiln_dynamo.counters
    assert counters.fallbacks == [] and counters.dynamic_fallbacks == []
    assert counters.graphs == (2 if dynamic is None else 1)
    assert all(r.fell_back is None and not r.declined for r in kiln.compile_log())
    # layer norm / RMS norm over the symbolic sequence dim are kernels, not extern reductions
    # (Note [Element counts over symbolic dims])
    reductions = ("aten.mean", "aten.var", "aten.sum", "aten.native_layer_norm", "aten.amax")
    extern = [op for r in kiln.compile_log() for op, _ in r.op_fallbacks if op.startswith(reductions)]
    assert extern == []


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_lm_compiled_by_kiln_triton_at_many_shapes(name: str) -> None:
    """The Triton code generator with symbolic sizes (Note [Symbolic sizes in Triton kernels]):
    one Triton module and wrapper serve every shape; run under Triton's interpreter in a process
    of its own (hf_dynamic_triton.py)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("hf_dynamic_triton.py")
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(script.parent), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(script), name], check=False, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"{name} dynamic=None: {len(SHAPES)} shapes equal eager, 2 compiles" in done.stdout
    assert f"{name} dynamic=True: {len(SHAPES)} shapes equal eager, 1 compiles" in done.stdout
