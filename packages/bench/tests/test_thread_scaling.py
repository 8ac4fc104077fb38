"""The thread-scaling benchmarks run in both modes and check before they time (issue 20).

``packages/codegen_cpp/bench/threads.py`` (the public suite) and ``packages/kiln/bench/
breadth_speed.py`` (the breadth suite) are scripts, loaded here from their files. Nothing here
depends on the times measured: each test runs one tiny model for a few rounds and looks at what
the rows say (their mode, thread count, accuracy verdict, whether a backend was timed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
_CACHE_VARS = ("KILN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def _load(relative: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, ModuleType]]:
    """Both scripts, with the environment they change at import restored afterwards (threads.py
    points every compile cache at a folder of its own) and no guard-checker build (kiln.prepare)."""
    monkeypatch.setenv("KILN_TENSOR_CHECKER", "0")
    saved = {var: os.environ.get(var) for var in _CACHE_VARS}
    path = list(sys.path)
    threads = torch.get_num_threads()
    try:
        yield {
            "threads": _load("packages/codegen_cpp/bench/threads.py", "kiln_threads_bench"),
            "breadth_speed": _load("packages/kiln/bench/breadth_speed.py", "kiln_breadth_speed_bench"),
        }
    finally:
        torch.set_num_threads(threads)
        sys.path[:] = path
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _doubled_gradients(model: torch.nn.Module) -> Any:
    """A 'compiled' model whose outputs equal eager's but whose gradients are twice eager's: a
    wrong answer only a training check sees."""

    def run(**inputs: Any) -> Any:
        out = model(**inputs)
        return out.detach() + (out - out.detach()) * 2

    return run


THREADS_ARGS = ["--models", "mlp", "--threads", "1", "--backends", "kiln", "--kernels", "0", "--row-s", "0",
                "--repeats", "2", "--warmup", "1"]  # fmt: skip


def test_threads_training_rows_say_their_mode(
    scripts: dict[str, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "threads.json"
    assert scripts["threads"].main([*THREADS_ARGS, "--mode", "training", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["settings"]["mode"] == "training"
    (model,) = doc["results"]
    (row,) = model["rows"]
    assert model["mode"] == row["mode"] == "training" and row["threads"] == 1
    assert row["kiln_ok"] and row["kiln_ms"] > 0 and row["eager_ms"] > 0
    assert doc["geomean"]["1"]["kiln"]["models"] == 1
    # the row printed as it is timed, the table's row (then where the model's time went)
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mlp ")]
    assert len(table) == 3 and all(" training " in line for line in table[:2])


def test_threads_times_no_step_whose_gradients_are_wrong(
    scripts: dict[str, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = scripts["threads"]
    monkeypatch.setattr(threads.kiln, "compile", lambda model, **_: _doubled_gradients(model))
    out = tmp_path / "threads.json"
    threads.main([*THREADS_ARGS, "--mode", "training", "--out", str(out)])
    (row,) = json.loads(out.read_text())["results"][0]["rows"]
    assert row["kiln_ok"] is False and "grad" in row["kiln_reason"]
    assert "kiln_ms" not in row and "kiln_speedup" not in row  # reported, never timed
    # the same 'compiler' is right in inference, where only the outputs count
    threads.main([*THREADS_ARGS, "--out", str(out)])
    (row,) = json.loads(out.read_text())["results"][0]["rows"]
    assert row["mode"] == "inference" and row["kiln_ok"] and row["kiln_ms"] > 0


BREADTH_ARGS = ["--device", "cpu", "--dtype", "float32", "--only", "nn_multihead_attention",
                "--backends", "eager,kiln", "--rounds", "2", "--calls", "1", "--warmup", "1"]  # fmt: skip


def test_breadth_speed_trains_at_each_thread_count(
    scripts: dict[str, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "breadth.json"
    speed = scripts["breadth_speed"]
    assert speed.main([*BREADTH_ARGS, "--mode", "train", "--threads", "1,2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["mode"], r["threads"]) for r in rows] == [
        ("nn_multihead_attention", "train", 1),
        ("nn_multihead_attention", "train", 2),
    ]
    for r in rows:
        assert r["kiln"]["mismatch"] == "" and r["kiln"]["ms"] > 0 and r["kiln"]["speedup"] > 0
    printed = capsys.readouterr().out
    assert "nn_multihead_attention @1t" in printed and "kiln at 2 threads: geomean" in printed


def test_breadth_speed_times_no_step_whose_gradients_are_wrong(
    scripts: dict[str, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    speed = scripts["breadth_speed"]
    compiled = speed._compiled
    monkeypatch.setattr(
        speed,
        "_compiled",
        lambda backend, model, *rest: (
            _doubled_gradients(model) if backend == "kiln" else compiled(backend, model, *rest)
        ),
    )
    out = tmp_path / "breadth.json"
    speed.main([*BREADTH_ARGS, "--mode", "train", "--threads", "1", "--json", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["kiln"]["mismatch"].startswith("grad of ")
    assert "ms" not in row["kiln"] and "speedup" not in row["kiln"]  # reported, never timed
    speed.main([*BREADTH_ARGS, "--threads", "1", "--json", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["mode"] == "eval" and row["kiln"]["mismatch"] == "" and row["kiln"]["ms"] > 0


def test_breadth_speed_takes_gradients_rounded_as_eager_rounds_them(scripts: dict[str, ModuleType]) -> None:
    """Note [Gradients checked by the suite's rule]: a gradient of magnitude ~9 off by 3e-3 (what
    float32 rounding gives eager itself) passes; one off by a factor of two does not."""
    grad_mismatch = scripts["breadth_speed"]._grad_mismatch
    ref, got = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ref.weight.grad = torch.linspace(-9, 9, 16).reshape(4, 4)
    ref.bias.grad = torch.ones(4)
    got.weight.grad = ref.weight.grad + 3e-3
    got.bias.grad = ref.bias.grad.clone()
    assert grad_mismatch(got, ref, torch.float32) == ""
    got.weight.grad = ref.weight.grad * 2
    assert grad_mismatch(got, ref, torch.float32).startswith("grad of weight")
    got.weight.grad = None
    assert grad_mismatch(got, ref, torch.float32).startswith("grad of weight: None")


def _shifted(fn: Any) -> Any:
    """A callable whose tensor outputs are ``fn``'s plus one: an answer off by far more than any
    tolerance."""

    def call(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return out + 1 if isinstance(out, torch.Tensor) else type(out)(t + 1 for t in out)

    return call


def test_breadth_speed_tells_when_eager_is_the_one_off(
    scripts: dict[str, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Note [Eager is not always the reference]: a backend that differs from eager but matches
    eager's float32 answer under SDPA's math backend is timed, with eager's difference kept as
    `eager_off`; a backend off that reference too stays a mismatch, untimed."""
    speed = scripts["breadth_speed"]
    compiled = speed._compiled
    wrong = {"eager"}

    def patched(backend: str, model: torch.nn.Module, *rest: Any) -> Any:
        fn = compiled(backend, model, *rest)
        return _shifted(fn) if backend in wrong else fn

    monkeypatch.setattr(speed, "_compiled", patched)
    out = tmp_path / "breadth.json"
    args = [*BREADTH_ARGS, "--threads", "1", "--json", str(out)]
    args[args.index("float32")] = "bfloat16"  # the reference is float32: dtypes differ, values compared
    speed.main(args)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["kiln"]["mismatch"] == "" and row["kiln"]["ms"] > 0
    assert row["kiln"]["eager_off"].startswith("eager off the float32 reference")
    wrong.clear()
    wrong.add("kiln")
    speed.main(args)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["kiln"]["mismatch"] and "eager_off" not in row["kiln"] and "ms" not in row["kiln"]
