"""Common subexpressions through the whole pipeline (Note [Common subexpressions of the graph] in
kiln_loopir's passes/cse.py): a mask shared by two attention calls is converted once, two
`nonzero` calls keep their own data-dependent sizes, and `cse=False` turns the pass off."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import kiln


def two_attentions(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(h, k, v, attn_mask=mask)


def attention_inputs() -> tuple[torch.Tensor, ...]:
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    return q, k, v, torch.tril(torch.ones(16, 16, dtype=torch.bool))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_a_boolean_mask_shared_by_two_attentions_is_converted_once(
    backend: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kiln.reset()
    q, k, v, mask = attention_inputs()
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"):
        got = kiln.compile(two_attentions, options={"strict": True, "cpu_backend": backend})(q, k, v, mask)
    torch.testing.assert_close(got, two_attentions(q, k, v, mask))
    assert "cse: merged 3 nodes" in caplog.text and "where.self x1" in caplog.text


def test_the_pass_can_be_switched_off(caplog: pytest.LogCaptureFixture) -> None:
    kiln.reset()
    q, k, v, mask = attention_inputs()
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"):
        got = kiln.compile(two_attentions, options={"strict": True, "cse": False})(q, k, v, mask)
    torch.testing.assert_close(got, two_attentions(q, k, v, mask))
    assert "cse: off (option cse=False)" in caplog.text and "cse: merged" not in caplog.text


def test_two_nonzero_calls_keep_their_own_sizes() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.nonzero(x > 0)
        b = torch.nonzero(x > 0.5)
        c = torch.nonzero(x > 0)
        return a * 2, b + 1, c - 1, (x > 0).sum()

    kiln.reset()
    compiled = kiln.compile(f, options={"strict": True})
    for seed in range(3):
        x = torch.randn(50, generator=torch.Generator().manual_seed(seed))
        for got, ref in zip(compiled(x), f(x), strict=True):
            torch.testing.assert_close(got, ref)
