"""Inputs that share memory, written in place (Note [Mutated inputs that share memory] in
kiln_aotgrad's api.py): found in the ninth session, `f(buf[:4], buf[2:])` writing both returned 4
where eager returns 6 and left the buffer wrong. Every case runs compiled and eagerly on copies
of the same data and compares results and every tensor the program wrote."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import kiln


def _two_views(buf: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return buf[:4], buf[2:]


def _disjoint_views(buf: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return buf[:3], buf[3:]


def _separate(buf: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return buf[:4].clone(), buf[2:].clone()


def _same_tensor(buf: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return buf[:4], buf[:4]


def _transposed(buf: torch.Tensor) -> tuple[torch.Tensor, ...]:
    m = buf[:4].view(2, 2)
    return m, m.t()


def add_then_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)
    b.mul_(2)
    return a.sum() * 10 + b.sum()


def write_one_read_other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.copy_(a * 3)
    return b + 1


PROGRAMS: dict[str, Callable[..., Any]] = {
    "add_then_mul": add_then_mul,
    "write_one_read_other": write_one_read_other,
}
SPLITS = [_two_views, _disjoint_views, _separate, _same_tensor, _transposed]


@pytest.mark.parametrize("program", PROGRAMS)
def test_calls_alternating_between_shared_and_separate_inputs(program: str) -> None:
    fn = PROGRAMS[program]
    compiled = kiln.compile(fn)
    # every order of the splits twice: the graph compiled for one aliasing is then called with another
    for split in [*SPLITS, *reversed(SPLITS)]:
        got, want = torch.arange(6.0), torch.arange(6.0)
        args_c, args_e = split(got), split(want)
        out_c, out_e = compiled(*args_c), fn(*args_e)
        torch.testing.assert_close(out_c, out_e, msg=f"{split.__name__}: result")
        torch.testing.assert_close(got, want, msg=f"{split.__name__}: the buffer")
        for c, e in zip(args_c, args_e, strict=True):
            torch.testing.assert_close(c, e, msg=f"{split.__name__}: an argument")


def test_a_module_writing_its_input_and_a_view_of_it() -> None:
    class Acc(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, state: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
            row.add_(self.lin(state).sum(0))
            state.mul_(0.5)
            return state.sum(1)

    torch.manual_seed(0)
    m = Acc()
    compiled = kiln.compile(m)
    with torch.no_grad():
        for shared in (False, True, False):
            got, want = torch.randn(3, 4), None
            want = got.clone()
            row_c = got[1] if shared else got[1].clone()
            row_e = want[1] if shared else want[1].clone()
            torch.testing.assert_close(compiled(got, row_c), m(want, row_e))
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(row_c, row_e)
