"""Recurrent layers in training through kiln.compile on the CPU, against eager, in strict mode.

An ``nn.LSTM`` in training lowers to ``mkldnn_rnn_layer`` calls whose workspace (the fourth
result) the backward's ``mkldnn_rnn_layer_backward`` reads. Its kernel makes the workspace only
while grad mode is on, and its size only the kernel knows (the meta kernel says ``(0,)``). The
compiled forward runs with grad mode off (inside ``autograd.Function.forward``), so the workspace
came back None and the graph failed at its first call (``'NoneType' object has no attribute
'as_strided'``) and ran eagerly from then on (found in
``packages/codegen_cpp/bench/train1.py``'s lstm model). Note [Opaque extern results] in
kiln_loopir/wrapper_support.py says how the wrapper now calls it. Strict mode turns any fallback
into a failure here.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import kiln


class Classifier(nn.Module):
    def __init__(self, rnn: type[nn.Module], layers: int, bidirectional: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.rnn = rnn(16, 16, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(32 if bidirectional else 16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        return self.head(out[:, -1])


CASES = [
    pytest.param(nn.LSTM, 2, False, id="lstm-2-layers"),
    pytest.param(nn.LSTM, 1, True, id="lstm-bidirectional"),
    pytest.param(nn.GRU, 2, False, id="gru-2-layers"),
    pytest.param(nn.RNN, 2, False, id="rnn-tanh-2-layers"),
]


# the Triton generator (under its interpreter) for the LSTM, whose workspace is the opaque result
TRITON_CASES = [
    pytest.param(nn.LSTM, 2, False, "triton", id="lstm-2-layers-triton"),
    pytest.param(nn.LSTM, 1, True, "triton", id="lstm-bidirectional-triton"),
]


@pytest.mark.parametrize(
    ("rnn", "layers", "bidirectional", "codegen"),
    [pytest.param(*case.values, "cpp", id=case.id) for case in CASES] + TRITON_CASES,
)
def test_rnn_training_step_is_compiled_and_matches_eager(
    rnn: type[nn.Module], layers: int, bidirectional: bool, codegen: str
) -> None:
    kiln.reset()
    torch.manual_seed(0)
    eager = Classifier(rnn, layers, bidirectional).train()
    mine = copy.deepcopy(eager)
    # both wrappers take the LSTM's workspace as it is (Note [Opaque extern results])
    compiled = kiln.compile(mine, options={"strict": True, "cpu_backend": codegen})
    ids = torch.randint(0, 50, (4, 9), generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 3, (4,), generator=torch.Generator().manual_seed(2))
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(mine.parameters(), lr=0.1)
    for _ in range(2):  # the first step compiles, the second reuses
        losses = []
        for model, opt in ((eager, opt_e), (compiled, opt_c)):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(ids), target)
            loss.backward()
            losses.append(loss)
            opt.step()
        torch.testing.assert_close(losses[1], losses[0])
        for (name, p_e), p_c in zip(eager.named_parameters(), mine.parameters(), strict=True):
            torch.testing.assert_close(p_c.grad, p_e.grad, msg=f"gradient of {name}")
            torch.testing.assert_close(p_c, p_e, msg=f"parameter {name}")
    records = kiln.compile_log()
    assert records and all(r.fell_back is None for r in records)


def test_rnn_in_train_mode_under_no_grad_matches_eager() -> None:
    # train mode without autograd: eager makes no workspace, and nothing reads one
    kiln.reset()
    torch.manual_seed(0)
    model = Classifier(nn.LSTM, 2, False).train()
    ids = torch.randint(0, 50, (4, 9), generator=torch.Generator().manual_seed(1))
    compiled = kiln.compile(model, options={"strict": True})
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids))
    assert all(r.fell_back is None for r in kiln.compile_log())
