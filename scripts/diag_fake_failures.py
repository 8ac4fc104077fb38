"""Which operator fails on kiln's fake tensors, and where inside torch: a diagnostic for torch
versions other than CI's (issue 16: on the H200 machine's torch 2.11 a 4-d batched matmul under a
symbolic length breaks the graph, and torch 2.13 here does not reproduce it).

    python scripts/diag_fake_failures.py

Wraps `kiln_dynamo.fake.run_fake` so that every exception it raises is printed with the operator,
its arguments' sizes and the innermost frames of the traceback, then captures small programs with a
symbolic length (`kiln.mark_dynamic`) and prints each one's graphs and break reasons (`kiln.explain`).
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch import nn

import kiln
from kiln_dynamo import fake

_run_fake = fake.run_fake
_seen: set[str] = set()


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"T{tuple(x.shape)}/{tuple(x.stride())}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_describe(y) for y in x) + "]"
    return repr(x)


def _logged(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return _run_fake(func, args, kwargs)
    except Exception as e:
        key = f"{func}: {type(e).__name__}: {e}"
        if key not in _seen:
            _seen.add(key)
            print(f"--- run_fake failed: {func} args={_describe(args)} kwargs={kwargs}")
            print("".join(traceback.format_exception(e)[-12:]))
        raise


fake.run_fake = _logged  # type: ignore[assignment]


def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1)


class Block(nn.Module):  # the Block of packages/dynamo/tests/test_dynamic_shapes.py
    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return x + self.proj(y)


def main() -> None:
    print("torch", torch.__version__)
    cases: list[tuple[str, Any, tuple[torch.Tensor, ...], int]] = [
        ("4-d q @ k^T", scores, (torch.randn(2, 2, 8, 8), torch.randn(2, 2, 8, 8)), 2),
        ("3-d q @ k^T", scores, (torch.randn(4, 8, 8), torch.randn(4, 8, 8)), 1),
        ("Block", Block().eval(), (torch.randn(2, 8, 16),), 1),
    ]
    for label, fn, inputs, dim in cases:
        kiln.reset()
        for x in inputs:
            kiln.mark_dynamic(x, dim)  # the length is symbolic from the first capture
        with torch.no_grad():
            report = kiln.explain(fn)(*inputs)
        print(f"=== {label}: {report.graph_count} graph(s), {report.graph_break_count} break(s)")
        for reason in report.break_reasons:
            print("   break:", str(reason)[:400])


if __name__ == "__main__":
    main()
