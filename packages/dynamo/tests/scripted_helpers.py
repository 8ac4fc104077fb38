"""A module of `@torch.jit.script` helpers called from another module's function, as transformers'
DeBERTa calls its own (test_capture_functions.py)."""

from __future__ import annotations

import torch


@torch.jit.script
def scaled_size_sqrt(x: torch.Tensor, factor: int) -> torch.Tensor:
    return torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * factor)


def attention_scale(x: torch.Tensor) -> torch.Tensor:
    return x / scaled_size_sqrt(x, 2).to(dtype=x.dtype)
