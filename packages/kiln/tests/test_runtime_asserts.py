"""Run-time assertions in a compiled graph raise as in eager (Note [Extern calls kept for their
effect] in kiln_loopir's scheduler.py): ``torch._assert_async`` returns nothing, and was dropped as
dead code by both code generators, so a program that raises in eager returned."""

from __future__ import annotations

import pytest
import torch

import kiln


def _checked(x: torch.Tensor) -> torch.Tensor:
    torch._assert_async((x > -100).all(), "x below -100")
    return x * 2


@pytest.fixture(autouse=True)
def _reset() -> None:
    kiln.reset()


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_a_failing_assert_raises_as_in_eager(cpu_backend: str) -> None:
    compiled = kiln.compile(_checked, options={"cpu_backend": cpu_backend, "strict": True})
    good = torch.zeros(4)
    torch.testing.assert_close(compiled(good), _checked(good))
    bad = torch.full((4,), -200.0)
    with pytest.raises(RuntimeError, match="x below -100") as eager_error:
        _checked(bad)
    with pytest.raises(RuntimeError, match="x below -100") as compiled_error:
        compiled(bad)
    assert type(compiled_error.value) is type(eager_error.value)
    assert kiln.capture_stats().graphs == 1 and not [r for r in kiln.compile_log() if r.fell_back]


def test_an_assert_in_a_training_graph_raises() -> None:
    lin = torch.nn.Linear(4, 4)

    def step(x: torch.Tensor) -> torch.Tensor:
        y = lin(x)
        torch._assert_async(torch.isfinite(y).all(), "not finite")
        return y.sum()

    compiled = kiln.compile(step, options={"strict": True})
    compiled(torch.ones(2, 4)).backward()
    with pytest.raises(RuntimeError, match="not finite"):
        compiled(torch.full((2, 4), float("inf")))
