"""Note [Saved values the forward laid out, checked by offset] (kiln_codegen_cpp's wrapper.py),
end to end: a CPU training step whose backward reads activations the compiled forward saved (a
patch embedding's output read through a permute, layer-norm statistics, a GELU's input) checks
those inputs for their storage offset only, the parameters and the incoming gradient in full,
and its gradients are eager's over several steps."""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import kiln


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    kiln.reset()
    yield
    kiln.reset()


class _PatchBlock(nn.Module):
    """A patch embedding, then a token MLP under a layer norm, then a depthwise convolution over
    the tokens put back on the map (PVT v2's shape of block)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.embed(x)
        b, _, h, w = y.shape
        t = self.fc(self.norm(y.flatten(2).transpose(1, 2)))
        m = nn.functional.gelu(t).transpose(1, 2).reshape(b, 16, h, w)
        return self.head(self.dw(m).mean(dim=(2, 3)))


def _backward_wrapper(records: list[logging.LogRecord]) -> str:
    sources = [r.getMessage() for r in records if "def call(" in r.getMessage()]
    assert len(sources) == 2, len(sources)  # the forward's, then the backward's
    return sources[1]


@pytest.mark.parametrize("switch", ["1", "0"])
def test_saved_values_reach_the_backward_checked_by_offset(
    switch: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KILN_LOG", "output_code")
    monkeypatch.setenv("KILN_LAID_OUT_INPUTS", switch)
    torch.manual_seed(0)
    model = _PatchBlock().train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"cpu_backend": "cpp", "strict": True})
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code"):
        for step in range(3):
            x = torch.randn(2, 3, 8, 8)
            for p in [*model.parameters(), *reference.parameters()]:
                p.grad = None
            out, want = compiled(x), reference(x)
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
            (out * torch.arange(4.0)).sum().backward()
            (want * torch.arange(4.0)).sum().backward()
            for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=f"{name} step {step}")
    source = _backward_wrapper(caplog.records)
    header = source[source.index("def call(") :].split("\n", 1)[0]
    inputs = [a.strip() for a in header[header.index("(") + 1 : header.rindex(")")].split(",")]
    offset_only = {
        n for n in inputs if re.search(rf"^\s*if {re.escape(n)}\.storage_offset\(\) != \d+: ", source, re.M)
    }
    saved = [n for n in inputs if not n.startswith(("primals_", "tangents_"))]
    assert saved, inputs
    if switch == "1":
        assert set(saved) <= offset_only, (saved, offset_only)
        assert not any(n.startswith(("primals_", "tangents_")) for n in offset_only), offset_only
    else:
        assert not offset_only, offset_only
