"""Every loopir lowering x dtypes through C++ against eager, driven by PyTorch's OpInfo samples.

For each dtype, the first samples of every OpInfo whose aten op has a loopir lowering are
recorded as aten graphs (``kiln_loopir.testing.record``) and merged into *one* graph with
disjoint inputs, so the whole dtype is one translation unit and one ``g++`` run rather than
hundreds. Each sample's outputs are then compared with eager (ATen's kernels, Note [oneDNN is not
the reference] in cpp_check.py) and must have run as C++ (no kernel declined to the
interpreter). When the merged graph cannot be compiled at all, or some kernel was declined, its
samples are compiled one by one to find which.

One test per (OpInfo, dtype) reads the shared result, so failures are reported per op, and
``KNOWN_FAILURES`` are strict xfails: a fix makes the test fail until its entry is removed.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.fx
from cpp_check import assert_same, eager
from torch.utils._pytree import tree_flatten

from kiln_codegen_cpp import CppBackend
from kiln_loopir import compile_graph
from kiln_loopir.testing import NotRecordable, lowered_op_infos, recorded_samples

# dtype -> samples per op (the second one non-contiguous)
DTYPES: dict[torch.dtype, int] = {
    torch.float32: 2, torch.float64: 1, torch.bfloat16: 2, torch.float16: 1,
    torch.int8: 1, torch.int32: 1, torch.int64: 1, torch.bool: 1,
}  # fmt: skip

# OpInfos named differently from the aten ops they record as
EXTRA = {"softmax", "log_softmax", "nn.functional.layer_norm", "__getitem__", "take_along_dim"}

# ops whose values are unspecified (uninitialized memory): only shape and dtype are compared
UNSPECIFIED_VALUES = {"empty", "empty_like", "new_empty", "empty_strided"}

# OpInfo key -> why its lowering declines some samples (they run as extern calls, correctly)
KNOWN_FALLBACKS: dict[str, str] = {
    "index_put": "boolean-mask indices have a data-dependent shape: aten.index_put runs as an extern call",
}

# (OpInfo name, variant, dtype or None for every dtype) -> why it fails (strict xfail)
KNOWN_FAILURES: dict[tuple[str, str, torch.dtype | None], str] = {}

OPS = lowered_op_infos(EXTRA)

# errors of eager on a sample (recording it runs eager too): the sample is passed over
EAGER_ERRORS = (RuntimeError, ValueError, TypeError, IndexError)


def _key(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}".rstrip(".")


@dataclass
class Sample:
    op: str
    index: int
    gm: torch.fx.GraphModule
    inputs: list[torch.Tensor]
    expected: list[Any]


@dataclass
class DtypeResult:
    problems: dict[str, list[str]] = field(default_factory=dict)  # op key -> what went wrong
    checked: dict[str, int] = field(default_factory=dict)  # op key -> samples compared
    recorded: set[str] = field(default_factory=set)  # ops with at least one recordable sample

    def fail(self, op: str, message: str) -> None:
        self.problems.setdefault(op, []).append(message)


def _samples(dtype: torch.dtype) -> list[Sample]:
    out: list[Sample] = []
    for op in OPS:
        if dtype not in op.supported_dtypes("cpu"):
            continue
        try:
            for i, _, gm, inputs in recorded_samples(
                op, dtype, DTYPES[dtype], (NotRecordable, *EAGER_ERRORS)
            ):
                try:
                    expected = eager(gm, *inputs)
                except EAGER_ERRORS:
                    continue
                leaves, _ = tree_flatten(expected)
                out.append(Sample(_key(op), i, gm, inputs, leaves))
        except Exception:  # a sample generator that fails is not ours to test
            continue
    return out


def _merge(samples: list[Sample]) -> torch.fx.GraphModule:
    """One graph running every sample's graph on its own inputs; outputs are all leaves in order."""
    graph = torch.fx.Graph()
    outputs: list[Any] = []
    for s, sample in enumerate(samples):
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        for node in sample.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = graph.placeholder(f"s{s}_{node.name}")
        result = graph.graph_copy(sample.gm.graph, env)
        leaves, _ = tree_flatten(result)
        outputs.extend(leaves)
    graph.output(tuple(outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _compare(result: DtypeResult, sample: Sample, actual: list[Any]) -> None:
    try:
        if sample.op.split(".")[0] in UNSPECIFIED_VALUES:
            for a, e in zip(actual, sample.expected, strict=True):
                assert (a.shape, a.dtype) == (e.shape, e.dtype)
        else:
            assert_same(list(actual), sample.expected, f"sample {sample.index}", scale=5.0)
        result.checked[sample.op] = result.checked.get(sample.op, 0) + 1
    except AssertionError as exc:
        result.fail(sample.op, f"sample {sample.index}: {exc}\n{sample.gm.code}")


def _run(result: DtypeResult, samples: list[Sample]) -> None:
    """Compile and run ``samples`` as one graph; on an error or a declined kernel, bisect."""
    if not samples:
        return
    inputs = [t for s in samples for t in s.inputs]
    backend = CppBackend()
    try:
        compiled = compile_graph(_merge(samples), inputs, backend=backend)
        actual = compiled(*inputs)
        problem = f"declined to the interpreter: {backend.last_declined}" if backend.last_declined else ""
    except Exception as exc:  # reported per op
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        if len(samples) == 1:
            result.fail(samples[0].op, f"sample {samples[0].index}: {problem}\n{samples[0].gm.code}")
        else:
            half = len(samples) // 2
            _run(result, samples[:half])
            _run(result, samples[half:])
        return
    fell_back = dict(compiled.stats.fallbacks)
    pos = 0
    for sample in samples:
        targets = {str(n.target) for n in sample.gm.graph.nodes if n.op == "call_function"}
        for target in targets & fell_back.keys():
            if sample.op not in KNOWN_FALLBACKS:
                result.fail(
                    sample.op, f"sample {sample.index}: {target} ran as an extern call: {fell_back[target]}"
                )
        n = len(sample.expected)
        _compare(result, sample, list(actual[pos : pos + n]))
        pos += n


@functools.cache
def sweep(dtype: torch.dtype) -> DtypeResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = DtypeResult()
        samples = _samples(dtype)
        result.recorded = {s.op for s in samples}
        _run(result, samples)
        return result


def _params() -> list[Any]:
    params = []
    for op in OPS:
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype not in supported:
                continue
            reason = KNOWN_FAILURES.get((op.name, op.variant_test_name, dtype)) or KNOWN_FAILURES.get(
                (op.name, op.variant_test_name, None)
            )
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(pytest.param(_key(op), dtype, marks=marks, id=f"{_key(op)}-{str(dtype)[6:]}"))
    return params


@pytest.mark.parametrize(("op", "dtype"), _params())
def test_opinfo_cpp(op: str, dtype: torch.dtype) -> None:
    result = sweep(dtype)
    problems = result.problems.get(op)
    assert not problems, "\n\n".join(problems)
    if op not in result.recorded:
        pytest.skip(f"no sample of {op} for {dtype} can be recorded as a functional aten graph")
    assert result.checked.get(op, 0) > 0
