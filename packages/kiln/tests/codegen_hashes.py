"""Compile a small T5-style training step with both code generators and print, as JSON, the
sha256 of every generated kernel module and wrapper, per generator (Note [Deterministic
schedules] in kiln_loopir's scheduler.py). test_deterministic_codegen.py runs this under several
``PYTHONHASHSEED`` values; the Triton generator runs under Triton's interpreter on CPU tensors."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch
from torch import nn

import kiln
from kiln_codegen_cpp import CppBackend
from kiln_codegen_triton import TritonBackend

SOURCES: list[str] = []


def _recording(cls: Any) -> None:
    generate = cls.codegen_wrapper

    def codegen_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        fn = generate(self, *args, **kwargs)
        SOURCES.append(self.last_source + "\n" + self.last_wrapper)
        return fn

    cls.codegen_wrapper = codegen_wrapper


class Block(nn.Module):
    """T5's layer in small: RMS norms, attention with a learned bias, a ReLU MLP, residuals."""

    def __init__(self, d: int = 32, heads: int = 4, ffn: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.wi, self.wo = nn.Linear(d, ffn, bias=False), nn.Linear(ffn, d, bias=False)
        self.n1, self.n2 = nn.Parameter(torch.rand(d) + 0.5), nn.Parameter(torch.rand(d) + 0.5)
        self.bias = nn.Parameter(torch.randn(heads, 8, 8))

    def norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        y = self.norm(x, self.n1)
        q, k, v = (p(y).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = (q @ k.transpose(-1, -2) + self.bias).softmax(-1)
        x = x + self.o((a @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.wo(torch.relu(self.wi(self.norm(x, self.n2))))


def main() -> None:
    _recording(CppBackend)
    _recording(TritonBackend)
    hashes = {}
    for name, options in (("cpp", {}), ("triton", {"cpu_backend": "triton"})):
        torch.manual_seed(0)
        model = nn.Sequential(Block(), Block())
        x = torch.randn(2, 8, 32, requires_grad=True)
        SOURCES.clear()
        kiln.compile(model, options={**options, "strict": True})(x).sum().backward()
        hashes[name] = [hashlib.sha256(s.encode()).hexdigest() for s in SOURCES]
        kiln.reset()
    print(json.dumps(hashes))


if __name__ == "__main__":
    main()
