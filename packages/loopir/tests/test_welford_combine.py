"""The reference interpreter's ``welford_combine`` (Chan's formula over chunk statistics)."""

from __future__ import annotations

import torch


def test_the_reference_interpreter_combines_welford_triples_as_one_pass_would() -> None:
    """``welford_combine`` (the second kernel of a split Welford reduction in the Triton
    generator) in loopir's reference interpreter: chunk statistics of a row combine into the
    row's own mean, m2 and weight."""
    from kiln_loopir.interpret import GridHandler

    x = torch.randn(3, 64, dtype=torch.float64) * 5 + 100  # a mean far from 0
    chunks = x.reshape(3, 4, 16)
    means, m2s = chunks.mean(-1), ((chunks - chunks.mean(-1, keepdim=True)) ** 2).sum(-1)
    weights = torch.full((3, 4), 16.0, dtype=torch.float64)
    handler = GridHandler({}, {}, [3, 4], 1)
    mean, m2, weight = handler.reduction(
        torch.float64, torch.float64, "welford_combine", (means, m2s, weights)
    )
    torch.testing.assert_close(mean.reshape(3), x.mean(-1))
    torch.testing.assert_close(m2.reshape(3), ((x - x.mean(-1, keepdim=True)) ** 2).sum(-1))
    torch.testing.assert_close(weight.reshape(3), torch.full((3,), 64.0, dtype=torch.float64))
