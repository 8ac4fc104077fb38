"""Every model of the public suite compiles with kiln's default backend and matches eager on the
CPU, for inference and for training (loss and every parameter's gradient), by the accuracy rule
of PyTorch's benchmark harness (kiln_bench.accuracy)."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln_bench.harness import MODES, run_model
from kiln_bench.models import MODEL_NAMES


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_matches_eager(name: str, mode: str) -> None:
    torch.set_num_threads(1)
    (result,) = run_model(name, mode, ["kiln"], repeats=1, warmup=0)
    assert result.ok, result.reason
    graphs = kiln.compile_log()
    assert graphs, "kiln captured no graph"
    assert [g.fell_back for g in graphs if g.fell_back] == []  # compiled by kiln, not run eagerly
