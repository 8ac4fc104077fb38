"""The accuracy rule: allclose first, then RMSE against float64 relative to eager's own error."""

from __future__ import annotations

import torch

from kiln_bench.accuracy import check, check_tensor


def test_identical_and_close_pass() -> None:
    x = torch.randn(100, 50)
    assert check_tensor("x", x, x.clone(), None, 1e-3).ok
    assert check_tensor("x", x, x + 1e-6, None, 1e-3).ok


def test_wrong_values_fail_with_a_reason() -> None:
    x = torch.randn(100, 50)
    verdict = check_tensor("logits", x, x + 0.5, None, 1e-3)
    assert not verdict.ok and "logits" in verdict.reason and "max abs difference" in verdict.reason


def test_rmse_rule_accepts_a_result_no_worse_than_eager() -> None:
    exact = torch.randn(200, 100, dtype=torch.float64)
    eager = (exact + 1e-2 * torch.randn_like(exact)).float()
    compiled = (exact + 1e-2 * torch.randn_like(exact)).float()  # as wrong as eager, differently
    assert not torch.allclose(eager, compiled, rtol=1e-3, atol=1e-3)
    assert check_tensor("x", eager, compiled, exact, 1e-3).ok
    much_worse = (exact + 1e-1 * torch.randn_like(exact)).float()
    verdict = check_tensor("x", eager, much_worse, exact, 1e-3)
    assert not verdict.ok and "RMSE" in verdict.reason


def test_shape_dtype_nan_and_integer_mismatches() -> None:
    x = torch.randn(4, 4)
    assert "shape" in check_tensor("x", x, x.reshape(16), None, 1e-3).reason
    assert "dtype" in check_tensor("x", x, x.double(), None, 1e-3).reason
    y = x.clone()
    y[0, 0] = float("nan")
    assert not check_tensor("x", x, y, None, 1e-3).ok
    assert check_tensor("x", y, y.clone(), None, 1e-3).ok  # NaN where eager has NaN is fine
    i = torch.arange(10)
    assert check_tensor("i", i, i.clone(), None, 1e-3).ok
    assert not check_tensor("i", i, i + 1, None, 1e-3).ok


def test_tiny_magnitudes_are_not_waved_through() -> None:
    # a collapsed network's logits (~1e-24) would pass any absolute tolerance
    x = torch.randn(10, 10) * 1e-24
    assert not check_tensor("x", x, -x, None, 1e-3).ok


def test_check_reports_the_first_failure() -> None:
    a, b = torch.ones(3), torch.zeros(3)
    verdict = check(["first", "second"], [a, a], [a, b], None, 1e-3)
    assert not verdict.ok and verdict.reason.startswith("second")
    assert not check(["a"], [a], [a, a], None, 1e-3).ok
