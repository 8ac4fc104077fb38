"""Note [Loops split at their guards] (kernel.py): a pointwise kernel whose values compare a loop's
index with a constant (a padded window, a pad, a `cat` along the innermost dim) runs its
innermost loop in pieces between the points where those comparisons change answer, under an
``if`` on the enclosing loop's points; results equal eager's bit for bit with the switch on and off,
at one and at two threads, and the pieces are where the comparisons say."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from cpp_check import aten, check, make

from kiln_codegen_cpp.kernel import _guard_point


def _serial(source: str, name: str) -> str:
    """The serial path of the first kernel whose name holds ``name``."""
    at = re.search(rf'extern "C" int64_t cpp_fused\w*{name}\w*\(', source)
    assert at is not None, source
    kernel = source[at.start() : source.index("\n}\n", at.start())]
    return kernel[kernel.rindex("} else {\n    for") :] if "} else {\n    for" in kernel else kernel


def _pieces(kernel: str) -> list[tuple[str, int, int]]:
    return [
        (m.group(1), int(m.group(2)), int(m.group(3)))
        for m in re.finditer(r"for \(int64_t (x\d) = INT64_C\((\d+)\); \1 < INT64_C\((\d+)\);", kernel)
    ]


def _pool(x: torch.Tensor) -> Any:
    # ResNet's stem: a 3x3 max pooling of stride 2 and padding 1 after a ReLU
    return aten.max_pool2d_with_indices.default(aten.relu.default(x), [3, 3], [2, 2], [1, 1])[0]


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_padded_max_pooling_splits_both_loops(
    on: bool, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_CPP_OPTIONS", f"split_guarded_loops={int(on)}")
    torch.set_num_threads(threads)
    try:
        compiled = check(_pool, make((2, 8, 32, 32)), scale=0.0)
    finally:
        torch.set_num_threads(1)
    kernel = _serial(compiled.backend.last_source, "max_pool")  # type: ignore[attr-defined]
    if not on:
        assert _pieces(kernel) == [] and "#pragma omp simd" in kernel
        return
    # the column loop at its padding's point (column 0 reads column -1), inside an if on the rows
    # after row 0 (which reads row -1); the last window ends at row and column 31, in the input
    assert "if (x2 >= INT64_C(1)) {" in kernel, kernel
    assert _pieces(kernel) == [("x3", 0, 1), ("x3", 1, 16)], kernel
    assert kernel.count("#pragma omp simd") == 3  # the two pieces, and row 0's loop


def test_odd_sizes_and_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooling whose last windows also read past the end: points at both ends, the ``if`` on
    the widest span of rows between the rows' points."""
    monkeypatch.setenv("KILN_CPP_OPTIONS", "split_guarded_loops=1")

    def pool(x: torch.Tensor) -> Any:
        return aten.mul.Tensor(aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])[0], 2.0)

    compiled = check(pool, make((2, 3, 9, 13)), scale=0.0)
    kernel = _serial(compiled.backend.last_source, "max_pool")  # type: ignore[attr-defined]
    assert "if (x2 >= INT64_C(1) && x2 < INT64_C(4)) {" in kernel, kernel
    assert _pieces(kernel) == [("x3", 0, 1), ("x3", 1, 6), ("x3", 6, 7)], kernel


def test_average_pooling_and_pads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CPP_OPTIONS", "split_guarded_loops=1")

    def padded(x: torch.Tensor) -> Any:
        p = aten.constant_pad_nd.default(x, [1, 2, 2, 1], -1.5)
        return (
            aten.avg_pool2d.default(p, [3, 3], [2, 2], [1, 1]),
            aten.avg_pool2d.default(x, [2, 3], [3, 2], [1, 1], True, False),
            aten.constant_pad_nd.default(x, [3, 0], 0.0),
        )

    check(padded, make((2, 4, 7, 11)), scale=0.0)


def test_unit_stride_masks_stay_one_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `cat` along the innermost dim and a stride-1 window: masked loads of unit stride, which
    GCC vectorizes as they are: not split."""
    monkeypatch.setenv("KILN_CPP_OPTIONS", "split_guarded_loops=1")

    def cat(a: torch.Tensor, b: torch.Tensor) -> Any:
        return aten.mul.Tensor(aten.cat.default([a, b], -1), 2.0)

    compiled = check(cat, make((4, 6, 20)), make((4, 6, 12)), scale=0.0)
    assert _pieces(_serial(compiled.backend.last_source, "cat")) == []  # type: ignore[attr-defined]

    def pool(x: torch.Tensor) -> Any:
        return aten.max_pool2d_with_indices.default(x, [3, 3], [1, 1], [1, 1])[0]

    compiled = check(pool, make((2, 3, 9, 13)), scale=0.0)
    assert _pieces(_serial(compiled.backend.last_source, "max_pool")) == []  # type: ignore[attr-defined]


def test_training_pooling_indices_and_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """The indices a training graph keeps for the backward come out of the split loops too."""
    monkeypatch.setenv("KILN_CPP_OPTIONS", "split_guarded_loops=1")

    def pool(x: torch.Tensor) -> Any:
        out, idx = aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])
        return out, idx

    check(pool, make((2, 5, 15, 16)), scale=0.0)


@pytest.mark.parametrize("a", [-3, -2, -1, 1, 2, 3])
def test_guard_points(a: int) -> None:
    """The point where ``a*v + b <op> c`` changes answer, against counting."""
    tests = {"ge": int.__ge__, "gt": int.__gt__, "lt": int.__lt__, "le": int.__le__}
    for b in range(-5, 6):
        for c in range(-5, 6):
            for op, cmp in tests.items():
                changes = [v for v in range(-20, 21) if cmp(a * v + b, c) != cmp(a * (v - 1) + b, c)]
                assert changes == [_guard_point(a, b, op, c)], (a, b, op, c)
