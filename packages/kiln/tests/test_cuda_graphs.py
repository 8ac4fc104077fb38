"""kiln.compile(mode="reduce-overhead") end to end: on a GPU one CUDA graph per compiled graph
(forward and backward in training) replays with parameters read in place, outputs kept across
calls intact, and results equal to eager's, also after optimizer steps change the parameters in
place. On the CPU the mode compiles as the default does, and the same checks hold."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import kiln

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.norm = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


@pytest.fixture(autouse=True)
def _reset() -> None:
    kiln.reset()


def _models() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    eager = MLP().to(DEVICE)
    return eager, copy.deepcopy(eager)


def test_inference_outputs_kept_across_calls_stay_right() -> None:
    eager, model = _models()
    compiled = kiln.compile(model, mode="reduce-overhead")
    kept = []
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(8, 32, device=DEVICE)
            kept.append((x, compiled(x)))
        for x, y in kept:
            torch.testing.assert_close(y, eager(x))
        # the usual loop: one result alive at a time
        for _ in range(6):
            x = torch.randn(8, 32, device=DEVICE)
            y = compiled(x)
            torch.testing.assert_close(y, eager(x))


def test_training_steps_match_eager() -> None:
    eager, model = _models()
    compiled = kiln.compile(model, mode="reduce-overhead")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        x = torch.randn(8, 32, device=DEVICE)
        target = torch.randint(0, 10, (8,), device=DEVICE)
        losses = []
        for opt, fn in ((opt_e, eager), (opt_c, compiled)):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(fn(x), target)
            loss.backward()
            losses.append(loss.detach())
            opt.step()
        torch.testing.assert_close(losses[1], losses[0], msg=f"step {step}")
        for (name, pe), pc in zip(eager.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(pc, pe, msg=f"step {step}: {name}")
            torch.testing.assert_close(pc.grad, pe.grad, msg=f"step {step}: grad of {name}")


def test_gradient_accumulation_without_zero_grad() -> None:
    eager, model = _models()
    compiled = kiln.compile(model, mode="reduce-overhead")
    for _ in range(4):  # grads accumulate into .grad in place across backward calls
        x = torch.randn(8, 32, device=DEVICE)
        eager(x).square().mean().backward()
        compiled(x).square().mean().backward()
    for (name, pe), pc in zip(eager.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(pc.grad, pe.grad, msg=f"grad of {name}")


def test_cuda_graph_replays_check_static_pointers_with_the_tensor_checker() -> None:
    """kiln hands the Triton backend the torch-linked checker's C pointer loop, which its CUDA-graph
    runners plan their static inputs' check with (Note [The runner's per-call path] in
    kiln_codegen_triton's cudagraphs.py; the map of `Tensor.data_ptr` where the checker is absent)."""
    from kiln import backends
    from kiln_dynamo import tensor_check

    backend = backends._codegen(torch.device("cuda"), "reduce-overhead")
    assert backend.pointer_check is tensor_check.data_ptrs_equal
    assert tensor_check.install(build=True), tensor_check.status()
    check = backend.pointer_check()
    w, x = torch.randn(3), torch.randn(2)
    recorded = (w.data_ptr(), None)  # x: a copied input, not checked
    assert check is not None and check((w, x), recorded)
    with torch.no_grad():
        w.data = torch.randn(3)  # `param.data = ...`: the same object at a new address
    assert not check((w, x), recorded)
