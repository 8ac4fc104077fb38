"""CPU convolutions through oneDNN, end to end (Note [Convolutions through oneDNN] in loopir's
passes/conv_fusion.py): eval-mode BatchNorm folds only while its statistics are frozen, and a
``train()`` or a ``requires_grad`` change compiles again into a graph that keeps BatchNorm.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import kiln

# fp32: a folded weight rounds w * g once, eager rounds conv(x, w) and then its scaled value
TOL: dict[str, float] = {"rtol": 1e-5, "atol": 5e-5}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + y).mean((2, 3))


def _net() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = Net()
    for bn in (net.bn1, net.bn2):  # statistics that are not the identity
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        nn.init.uniform_(bn.weight, 0.5, 2)
        nn.init.uniform_(bn.bias, -1, 1)
    return net.eval(), torch.randn(2, 3, 16, 16)


@pytest.fixture(autouse=True)
def _reset() -> None:
    kiln.reset()


def _passes(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "kiln.loopir.passes")


def test_eval_batchnorm_folds_and_train_recompiles(
    caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KILN_LOG", "passes")
    caplog.set_level("DEBUG", logger="kiln.loopir.passes")
    net, x = _net()
    compiled = kiln.compile(net, options={"strict": True, "conv_prepack": True})  # the pass needs it
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x), **TOL)
    assert "2 of 2 convolutions through oneDNN" in _passes(caplog)
    assert "affine+add+relu" in _passes(caplog)
    graphs = len(kiln.compile_log())
    caplog.clear()
    net.train()  # batch statistics, running statistics updated: nothing to fold
    reference, _ = _net()
    reference.train()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), reference(x), **TOL)
    assert len(kiln.compile_log()) > graphs
    text = _passes(caplog)
    assert "affine+" not in text and text.count("0 affine steps folded") == 2  # batch statistics
    torch.testing.assert_close(net.bn1.running_mean, reference.bn1.running_mean)


def test_parameters_that_require_grad_keep_batchnorm_for_the_backward(
    caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KILN_LOG", "passes")
    caplog.set_level("DEBUG", logger="kiln.loopir.passes")
    net, x = _net()
    net.requires_grad_(False)
    compiled = kiln.compile(net, options={"strict": True, "conv_prepack": True})  # the pass needs it
    torch.testing.assert_close(compiled(x), net(x), **TOL)  # grad mode on, nothing needs a grad
    assert "affine+add+relu" in _passes(caplog)  # an inference graph: folded
    graphs = len(kiln.compile_log())
    caplog.clear()
    net.requires_grad_(True)
    out = compiled(x)
    assert len(kiln.compile_log()) > graphs  # compiled again, for the backward
    assert "conv_fusion: training graph" in _passes(caplog)
    out.sum().backward()
    got = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net(x).sum().backward()
    for g, want in zip(got, [p.grad for p in net.parameters()], strict=True):
        torch.testing.assert_close(g, want, **TOL)


def test_an_optimizer_step_reaches_the_prepacked_weights() -> None:
    net, x = _net()
    compiled = kiln.compile(net, options={"strict": True, "conv_prepack": True})  # the pass needs it
    with torch.no_grad():
        compiled(x)
        for p in net.parameters():
            p.mul_(0.9).add_(0.01)  # in place, as optimizers do: versions move
        net.bn2.running_var.mul_(1.5)
        torch.testing.assert_close(compiled(x), net(x), **TOL)


def test_statistics_an_eager_training_step_moved_reach_the_folded_weights() -> None:
    # loopir's Note [Running statistics move without a version]: eager's train-mode BatchNorm
    # updates the running statistics without moving their versions (fix30: the compiled eval
    # module kept the statistics it had folded first)
    net, x = _net()
    compiled = kiln.compile(net, options={"strict": True, "conv_prepack": True})
    with torch.no_grad():
        compiled(x)
        net.train()
        for _ in range(2):
            net(torch.randn(4, 3, 16, 16) * 3 + 1)  # eager, not compiled: calibrating the statistics
        net.eval()
        torch.testing.assert_close(compiled(x), net(x), **TOL)


def test_a_fused_optimizer_step_reaches_the_prepacked_weights() -> None:
    # loopir's Note [Writes that do not move a version]: a fused optimizer writes the parameters
    # without moving their versions (fix30: the compiled eval module kept its first packs); no
    # BatchNorm, whose folded values are keyed by value anyway
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, bias=False))
    x = torch.randn(2, 3, 10, 10)
    compiled = kiln.compile(net, options={"strict": True, "conv_prepack": True})
    opt = torch.optim.SGD(net.parameters(), lr=0.1, fused=True)
    with torch.no_grad():
        compiled(x)
    for _ in range(2):
        net(x * 2).square().mean().backward()  # eager, as a training loop between evaluations
        versions = [p._version for p in net.parameters()]
        opt.step()
        opt.zero_grad()
        assert [p._version for p in net.parameters()] == versions  # what the Note is about
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), net(x), **TOL)


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no oneDNN bfloat16 kernels")
def test_bfloat16_batchnorm_folds_and_follows_in_place_updates(caplog: pytest.LogCaptureFixture) -> None:
    # Note [BatchNorm of a bfloat16 convolution folds in float32]: aotgrad's bfloat16 BatchNorm
    # (float32 statistics, one conversion back) folds into the oneDNN call
    caplog.set_level("DEBUG", logger="kiln.loopir.passes")
    net, x = _net()
    exact = net.double()
    net, x = copy.deepcopy(exact).to(torch.bfloat16), x.to(torch.bfloat16)
    compiled = kiln.compile(net, options={"strict": True, "conv_prepack": True})
    with torch.no_grad():
        for step in range(2):
            out, eager, want = compiled(x), net(x), exact(x.double())
            assert out.dtype == torch.bfloat16
            # no farther from the float64 result than eager's bfloat16 result, but for a rounding
            ulp = want.abs().max().item() * 2**-8
            assert (out.double() - want).abs().max() <= (eager.double() - want).abs().max() + ulp
            torch.testing.assert_close(out.double(), eager.double(), rtol=2e-2, atol=2 * ulp)
            if step == 0:
                for p, q in zip(net.parameters(), exact.parameters(), strict=True):
                    p.mul_(-0.9)  # in place: the packed weights must follow
                    q.mul_(-0.9)
    assert "2 of 2 convolutions through oneDNN" in _passes(caplog)
    assert _passes(caplog).count("4 affine steps folded") == 2
