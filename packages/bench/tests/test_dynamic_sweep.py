"""The dynamic-shapes sweep runs, checks against eager, and counts compiles."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import kiln
from kiln_bench import dynamic, models


def test_block_sweep_counts_compiles() -> None:
    eager, compiled = dynamic.main(["--block", "--sizes", "2,3,5"])
    assert eager.backend == "kiln (eager)" and eager.compiles == 2  # static, then one dynamic graph
    # kiln's own backend compiles symbolic sizes on the CPU too: static, then one dynamic graph
    assert compiled.compiles == 2
    assert compiled.second_pass_s > 0


def test_the_sweep_shapes_are_the_issues() -> None:
    text = dynamic.shapes_for("gpt2", dynamic.BATCHES, dynamic.SEQS)
    assert len(text) == 30 and text[0] == (2, 16) and text[-1] == (64, 512)
    assert dynamic.shapes_for("resnet", dynamic.BATCHES, dynamic.SEQS) == [(b, None) for b in dynamic.BATCHES]


def test_inputs_at_another_shape_keep_dtypes_and_vocabulary() -> None:
    with dynamic._text_positions(512):
        w = models.build("t5")
    assert models._TEXT["cpu"]["seq"] == 128  # restored
    feeds = dynamic.inputs_at(w, 4, 512, torch.Generator().manual_seed(0))
    assert set(feeds) == {"input_ids", "decoder_input_ids"}
    for k, v in feeds.items():
        assert v.shape == (4, 512) and v.dtype == w.inputs[k].dtype
        assert int(v.max()) <= int(w.inputs[k].max())


def test_model_sweep_one_dynamic_graph_and_static_per_shape(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    (r,) = dynamic.main(
        ["--models", "mlp", "--backends", "kiln", "--batches", "2,4,8", "--repeats", "1", "--json", str(out)]
    )
    assert r.mismatches == []
    assert r.compiles == 2  # static first, then one symbolic graph for every later batch size
    assert len(r.dynamic_ms) == len(r.static_ms) == 3 and all(x > 0 for x in r.ratios())
    # Note [Interleaved dynamic and static timing]: the static entries sat next to the dynamic
    # one (no reset between them), and the dynamic entry still served every shape
    assert r.interleaved and r.compiles == 2
    assert kiln.capture_stats().graphs == 2 + 3  # one static graph per shape, no recompile
    saved = json.loads(out.read_text())[0]
    assert saved["model"] == "mlp" and saved["interleaved"] is True
