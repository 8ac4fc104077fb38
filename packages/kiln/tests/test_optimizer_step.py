"""A whole training step through kiln.compile on the CPU, the optimizer step included, in strict mode.

`loss.backward()` is the one break; the optimizer step (and `zero_grad`) after it is a graph of its
own (Note [Tracing an optimizer step] in kiln_dynamo/variables/optimizer.py) that aotgrad and the C++
generator compile like any other: the parameters and the optimizer state are graph inputs mutated
in place, written back after the graph (the parameters under no_grad: a leaf that requires grad
can only have been updated under no_grad, kiln_aotgrad/runtime.py). Strict mode makes any fallback
a failure.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import kiln


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), id="sgd-momentum"),
        pytest.param(lambda ps: torch.optim.Adam(ps, lr=0.01), id="adam"),
        pytest.param(
            lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True, weight_decay=0.1), id="adamw-foreach"
        ),
    ],
)
def test_training_step_with_the_optimizer_compiled_matches_eager(make) -> None:  # type: ignore[no-untyped-def]
    kiln.reset()
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
    mine = copy.deepcopy(eager)
    opt_e, opt_c = make(eager.parameters()), make(mine.parameters())
    sched_e = torch.optim.lr_scheduler.StepLR(opt_e, 2, gamma=0.5)
    sched_c = torch.optim.lr_scheduler.StepLR(opt_c, 2, gamma=0.5)

    def train_step(
        model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    compiled = kiln.compile(train_step, options={"strict": True})
    for i in range(4):
        x = torch.randn(5, 6)
        y = torch.randint(0, 3, (5,))
        torch.testing.assert_close(compiled(mine, opt_c, x, y), train_step(eager, opt_e, x, y))
        for (name, p_e), p_c in zip(eager.named_parameters(), mine.parameters(), strict=True):
            torch.testing.assert_close(p_c, p_e, msg=f"parameter {name} after step {i}")
            assert p_c.grad is None
            for k, v in opt_e.state[p_e].items():
                torch.testing.assert_close(opt_c.state[p_c][k], v, msg=f"{k} of {name}")
        sched_e.step()
        sched_c.step()
    records = kiln.compile_log()
    assert records and all(r.fell_back is None for r in records)
    report = kiln.explain(train_step)(mine, opt_c, x, y)
    assert report.graph_count == 2 and report.graph_break_count == 1, str(report)
    assert "backward()" in str(report.break_reasons[0])
