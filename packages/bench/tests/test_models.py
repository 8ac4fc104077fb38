"""Every model of the public suite builds at the cpu size and runs for inference and training."""

from __future__ import annotations

import pytest
import torch

from kiln_bench.harness import step
from kiln_bench.models import MODEL_NAMES, build, logits_of


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_builds_and_runs(name: str) -> None:
    workload = build(name, "cpu")
    workload.model.eval()
    names, outputs = step(workload, workload.model, "inference")
    (logits,) = outputs
    assert names == ["logits"]
    assert logits.shape[-1] == workload.num_classes
    assert torch.isfinite(logits).all()
    workload.model.train()
    names, outputs = step(workload, workload.model, "training")
    params = [p for p in workload.model.parameters() if p.requires_grad]
    assert names[0] == "loss" and len(outputs) > len(params) // 2
    assert all(torch.isfinite(g).all() for g in outputs)


def test_builds_are_deterministic() -> None:
    a, b = build("mlp"), build("mlp")
    assert torch.equal(a.inputs["x"], b.inputs["x"])
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))
    assert not torch.equal(build("mlp", seed=1).inputs["x"], a.inputs["x"])


def test_batchnorm_statistics_are_calibrated() -> None:
    workload = build("cnn")
    workload.model.eval()
    with torch.no_grad():
        logits = logits_of(workload.model(**workload.inputs))
    assert logits.abs().max() > 1e-3  # not the collapsed activations of default statistics


def test_unknown_names_are_clear_errors() -> None:
    with pytest.raises(KeyError, match="unknown model 'nope'"):
        build("nope")
    with pytest.raises(ValueError, match="unknown size"):
        build("mlp", "tpu")
