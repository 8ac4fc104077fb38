"""The harness measures real backends, catches wrong answers, and reports failures as results."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from kiln_bench import report
from kiln_bench.__main__ import main
from kiln_bench.backends import compile_model
from kiln_bench.harness import Result, geomean, run_model


class _Perturbed(nn.Module):
    """A 'compiler' that gives a slightly wrong answer."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **kwargs: torch.Tensor) -> torch.Tensor:
        return self.model(**kwargs) * 1.05


def _wrong(backend: str, model: nn.Module) -> nn.Module:
    return _Perturbed(model)


def _broken(backend: str, model: nn.Module) -> nn.Module:
    raise RuntimeError("the compiler crashed")


def test_eager_backend_passes_with_a_speedup() -> None:
    (result,) = run_model("mlp", "inference", ["eager"], repeats=3, warmup=1)
    assert result.ok, result.reason
    assert result.speedup is not None and result.speedup > 0
    assert result.compile_s is not None


def test_training_compares_gradients() -> None:
    (result,) = run_model("mlp", "training", ["eager"], repeats=2, warmup=1)
    assert result.ok, result.reason


def test_a_wrong_answer_fails_accuracy() -> None:
    (result,) = run_model("mlp", "inference", ["wrong"], repeats=2, warmup=0, compile_fn=_wrong)
    assert not result.ok and result.reason.startswith("accuracy: logits")
    (result,) = run_model("mlp", "training", ["wrong"], repeats=2, warmup=0, compile_fn=_wrong)
    assert not result.ok and result.reason.startswith("accuracy: loss")


def test_a_crashing_backend_is_a_result() -> None:
    (result,) = run_model("mlp", "inference", ["broken"], repeats=2, warmup=0, compile_fn=_broken)
    assert not result.ok and result.reason == "RuntimeError: the compiler crashed"


def test_kiln_backend_reports_what_is_missing() -> None:
    import kiln

    if hasattr(kiln, "compile"):
        (result,) = run_model("mlp", "inference", ["kiln"], repeats=2, warmup=1)
        assert result.backend == "kiln"
    else:
        try:
            compile_model("kiln", nn.Linear(2, 2))
        except NotImplementedError as e:
            assert "kiln.compile is not built yet" in str(e)
        else:
            raise AssertionError("expected NotImplementedError")


def test_summary_geomean_and_reports(tmp_path: Path) -> None:
    results = [
        Result("a", "inference", "x", True, speedup=2.0, compile_s=1.0, eager_ms=2.0, compiled_ms=1.0),
        Result("b", "inference", "x", True, speedup=0.5, compile_s=3.0, eager_ms=1.0, compiled_ms=2.0),
        Result("c", "inference", "x", False, reason="boom", compile_s=2.0),
    ]
    s = report.summary(results)["inference/x"]
    assert s["passed"] == 2 and s["total"] == 3
    assert abs(s["geomean_speedup"] - 1.0) < 1e-12
    assert s["median_compile_s"] == 2.0
    assert geomean([]) is None
    text = report.table(results)
    assert "boom" in text and "passed 2/3" in text
    report.write_json(tmp_path / "r.json", results, {"suite": "models"})
    payload = json.loads((tmp_path / "r.json").read_text())
    assert payload["metadata"]["suite"] == "models" and len(payload["results"]) == 3
    report.write_png(tmp_path / "r.png", results)
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_graph_that_fell_back_is_named_in_the_table() -> None:
    extra = {"graphs": 1, "graph_breaks": 0, "graphs_fell_back": 1, "fell_back": ["graph_0: IndexError: x"]}
    ran = Result(
        "bert", "training", "kiln", True, speedup=0.84, compile_s=3.0, eager_ms=45.0, compiled_ms=54.0
    )
    ran.extra.update(extra)
    row = report.table([ran]).splitlines()[1]
    assert "1/0 (1 fell back)" in row and "fell back: graph_0: IndexError: x" in row, row


def test_command_line(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "run"
    assert main(["--models", "mlp", "--modes", "inference", "--backends", "eager", "--repeats", "2",
                 "--warmup", "1", "--out", str(out)]) == 0  # fmt: skip
    assert (tmp_path / "run.json").exists() and (tmp_path / "run.png").exists()
    payload = json.loads((tmp_path / "run.json").read_text())
    assert [r["model"] for r in payload["results"]] == ["mlp"]
