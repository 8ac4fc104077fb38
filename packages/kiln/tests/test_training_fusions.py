"""Training graphs through `kiln.compile` against eager, forward and gradient: view scatters and
column sums fused with their producers.

Their backward is ``slice_backward`` (a zero fill and ``slice_scatter``) and ``select_backward``
(``select_scatter``), which loopir lowers to pointwise kernels (Note [View scatters are
pointwise] in kiln_loopir's lowerings/memory.py). Swin's patch merging takes ``x[:, 0::2, 0::2]``
and three more strided quarters; the model here does the same, plus an offset slice and a
select, at one and two threads, on the C++ generator and (without a GPU) the Triton one under
its interpreter.

A bias gradient is a column sum of a pointwise gradient, which the C++ generator fuses with its
producer (Note [Pointwise producers in a column reduction's order] in kiln_loopir's
scheduler.py); an MLP's training step checks it, at one and two threads.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kiln

BACKENDS = ["cpp"] if torch.cuda.is_available() else ["cpp", "triton"]


def _same_step(model: torch.nn.Module, ref: torch.nn.Module, out: torch.Tensor, want: torch.Tensor) -> None:
    """One training step's outputs and every parameter's gradient equal eager's."""
    out.square().mean().backward()
    want.square().mean().backward()
    torch.testing.assert_close(out, want)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def _merge(x: torch.Tensor) -> torch.Tensor:
    y = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
    return (y * y).sum(-1) + x[:, 1:5, 2].sum(-1, keepdim=True) + x[:, -1, :, 0].sum(-1)[:, None, None]


@pytest.fixture(autouse=True)
def _reset() -> Any:
    kiln.reset()
    yield
    kiln.reset()


@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("threads", [1, 2])
def test_slice_and_select_gradients_match_eager(threads: int, backend: str) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randn(2, 8, 6, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
        xe = x.detach().clone().requires_grad_(True)
        out = kiln.compile(_merge, options={"cpu_backend": backend, "strict": True})(x)
        want = _merge(xe)
        grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
        out.backward(grad)
        want.backward(grad)
        torch.testing.assert_close(out, want)
        assert x.grad is not None and xe.grad is not None
        torch.testing.assert_close(x.grad, xe.grad)
        log = kiln.compile_log()
        assert log and not [f for r in log for f in r.op_fallbacks], [r.op_fallbacks for r in log]
        assert not [d for r in log for d in r.declined]
    finally:
        torch.set_num_threads(before)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(48, 96),
        torch.nn.GELU(),
        torch.nn.Linear(96, 48),
        torch.nn.Tanh(),
        torch.nn.Linear(48, 10),
    )


@pytest.mark.parametrize("column_sum_fusion", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_mlp_gradients_match_eager(threads: int, column_sum_fusion: bool, monkeypatch: Any) -> None:
    monkeypatch.setenv("KILN_CPP_OPTIONS", f"column_sum_fusion={int(column_sum_fusion)}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, ref = _mlp(), _mlp()
        x = torch.randn(2, 40, 48, generator=torch.Generator().manual_seed(2))
        out = kiln.compile(model, options={"strict": True})(x)
        want = ref(x)
        _same_step(model, ref, out, want)
    finally:
        torch.set_num_threads(before)


class _NormBlock(torch.nn.Module):
    """Swin's shape of a block: a window shuffle (a transpose), layer norm, an MLP, a residual:
    its backward has layer norm's row reductions, its weight and bias column sums, the linear
    layers' bias sums and transposed producers (Note [Pointwise producers in a column
    reduction's order])."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.LayerNorm(48)
        self.fc1 = torch.nn.Linear(48, 96)
        self.fc2 = torch.nn.Linear(96, 48)
        self.head = torch.nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(2, 4, 16, 48).transpose(1, 2).reshape(2, 64, 48)
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
        return self.head(self.norm(x))


@pytest.mark.parametrize("column_sum_fusion", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_layer_norm_block_gradients_match_eager(
    threads: int, column_sum_fusion: bool, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KILN_CPP_OPTIONS", f"column_sum_fusion={int(column_sum_fusion)}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, ref = _NormBlock(), _NormBlock()
        x = torch.randn(2, 64, 48, generator=torch.Generator().manual_seed(3))
        xk, xe = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        out = kiln.compile(model, options={"strict": True})(xk)
        want = ref(xe)
        out.square().mean().backward()
        want.square().mean().backward()
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(xk.grad, xe.grad)
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("saved_inputs_as_is", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_weights_saved_as_themselves_gradients_match_eager(
    threads: int, saved_inputs_as_is: bool, monkeypatch: Any
) -> None:
    """The linear layers' weights are saved for the backward as the parameters themselves
    (Note [Saved inputs returned as themselves] in kiln_codegen_cpp's wrapper.py): two steps, a
    parameter updated in place between them, gradients as eager's."""
    monkeypatch.setenv("KILN_CPP_OPTIONS", f"saved_inputs_as_is={int(saved_inputs_as_is)}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, ref = _mlp(), _mlp()
        step = kiln.compile(model, options={"strict": True})
        for seed in (4, 5):
            x = torch.randn(2, 40, 48, generator=torch.Generator().manual_seed(seed))
            for m in (model, ref):
                m.zero_grad(set_to_none=True)
            _same_step(model, ref, step(x), ref(x))
            with torch.no_grad():
                for m in (model, ref):
                    m[0].weight.mul_(0.5)
    finally:
        torch.set_num_threads(before)


class _PostNorm(torch.nn.Module):
    """Post-norm residual blocks (BART's): ``norm(x + fc(x))``, the sum saved for the backward,
    with the scheduler's far output fusion on and off (Note [Outputs fused across the graph] in
    kiln_loopir's scheduler.py; its own test there checks the fusion happens)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(12))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(32) for _ in range(12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fc, norm in zip(self.fcs, self.norms, strict=True):
            x = norm(x + fc(x))
        return x


@pytest.mark.parametrize("far", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_saved_residual_sums_fused_match_eager(threads: int, far: bool) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, ref = _PostNorm(), _PostNorm()
        x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(2))
        out = kiln.compile(model, options={"strict": True, "far_output_fusion": far})(x)
        want = ref(x)
        _same_step(model, ref, out, want)
        log = kiln.compile_log()
        assert log and not [f for r in log for f in r.op_fallbacks], [r.op_fallbacks for r in log]
    finally:
        torch.set_num_threads(before)
