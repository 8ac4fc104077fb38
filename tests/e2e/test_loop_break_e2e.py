"""A break inside the decoder-layer loop of a transformers LM (a forward hook on every block that
branches on a tensor value), compiled end to end by kiln: the layers and the code after the loop
are compiled (Note [Compiling what follows a loop] in kiln_dynamo's resume.py), the answer is
eager's, in eval and in training."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import tiny_hf
import torch

import kiln
import kiln_dynamo

FLAGGED: list[int] = []


def check_block(module: Any, args: Any, out: Any) -> None:
    hidden = out[0] if isinstance(out, tuple) else out
    if hidden.abs().max() > 1e4:  # data-dependent: a break inside the loop over the blocks
        FLAGGED.append(1)


def test_a_break_in_every_decoder_layer_compiles_the_rest() -> None:
    kiln.reset()
    torch.manual_seed(0)
    model = tiny_hf.gpt2()
    for block in model.transformer.h:
        block.register_forward_hook(check_block)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0  # training compares gradients: no random numbers
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 8))
    compiled = kiln.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no graph may fall back to eager
        model.eval(), ref.eval()
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(compiled(ids).logits, ref(ids).logits)
        assert kiln_dynamo.counters.after_loops >= 1
        model.train(), ref.train()
        model.config.use_cache = ref.config.use_cache = False
        out = compiled(ids, labels=ids)
        want = ref(ids, labels=ids)
        out.loss.backward()
        want.loss.backward()
    torch.testing.assert_close(out.loss, want.loss)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert FLAGGED == []


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.abs().max() > 1e4:  # data-dependent: a break inside each layer
            FLAGGED.append(1)
        return torch.nn.functional.gelu(y)


class _PreNorm(torch.nn.Module):
    """A pre-norm residual stack whose loop body does tensor work around the layer call."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(16) for _ in range(4)])
        self.layers = torch.nn.ModuleList([_Block() for _ in range(4)])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        for norm, layer in zip(self.norms, self.layers, strict=True):
            residual = h
            h = layer(norm(h) * 0.5)
            h = torch.tanh(h) + residual
        return self.head(h).log_softmax(-1)


def test_the_loop_body_around_the_break_is_compiled_too() -> None:
    """Note [Loop body pieces]: the statements before and after each layer call are graphs
    compiled by kiln (C++ here), reused by every iteration; eval and training match eager."""
    kiln.reset()
    torch.manual_seed(0)
    model = _PreNorm()
    ref = copy.deepcopy(model)
    x = torch.randn(3, 16)
    compiled = kiln.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no graph may fall back to eager
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(compiled(x), ref(x))
        c = kiln_dynamo.counters
        assert c.loop_pieces == 1 and c.after_loops == 1 and c.recompiles == 0
        out = compiled(x)
        want = ref(x)
        out.square().sum().backward()
        want.square().sum().backward()
    torch.testing.assert_close(out, want)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    names = [f"{g.frame} {g.graph}" for g in kiln.compile_log()]
    assert sum("piece_of_" in n for n in names) >= 2, names  # before and after the layer call
