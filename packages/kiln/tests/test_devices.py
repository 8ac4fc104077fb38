"""Graphs on devices a code generator cannot run, and operators on two devices.

Note [Graphs no code generator can run] (kiln's backends.py): a graph with `meta` inputs (no
memory: compiled C++ kernels segfaulted on them) or inputs on two devices runs as captured.
Note [Operators on two devices] (kiln_dynamo's fake.py): an operator whose tensors live on two
devices is not traced, so eager's own error reaches the user, as without kiln. This machine has
no second device but `meta`, which eager treats as one (it refuses a CPU tensor beside a meta one).
"""

from __future__ import annotations

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()


def test_meta_inputs_run_as_captured() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(-1) + x.mean()

    x = torch.ones(4, 5, device="meta")
    got = kiln.compile(f)(x)
    assert got.device.type == "meta" and got.shape == f(x).shape and got.dtype == f(x).dtype
    reasons = [r.fell_back for r in kiln.compile_log()]
    assert reasons and all(r and "meta tensor" in r for r in reasons)


def test_module_on_meta_runs_as_captured() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("meta")
    x = torch.ones(3, 8, device="meta")
    got = kiln.compile(model)(x)
    assert got.device.type == "meta" and got.shape == (3, 4)


def test_operator_on_two_devices_raises_eagers_error() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x + 1) * torch.arange(3.0)  # a CPU tensor beside the meta one: eager refuses

    x = torch.ones(2, 3, device="meta")
    with pytest.raises(RuntimeError) as eager:
        f(x)
    with pytest.raises(RuntimeError) as compiled:
        kiln.compile(f)(x)
    assert str(compiled.value) == str(eager.value)


def test_cpu_scalar_and_cpu_indices_stay_in_the_graph() -> None:
    def scalar(x: torch.Tensor) -> torch.Tensor:
        return (x + 1) * torch.tensor(2.0)  # a 0-dim CPU tensor mixes with any device

    def index(x: torch.Tensor) -> torch.Tensor:
        return (x + 1)[torch.tensor([0, 1, 1])]  # eager's `index` takes CPU indices

    x = torch.ones(2, 3, device="meta")
    for fn in (scalar, index):
        explained = kiln.explain(fn)(x)
        assert explained.graph_count == 1 and explained.graph_break_count == 0, fn.__name__


def test_cpu_graph_unchanged() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x + 1) * torch.arange(3.0) + torch.tensor(2.0)

    x = torch.randn(2, 3)
    torch.testing.assert_close(kiln.compile(f)(x), f(x))
    assert all(not r.fell_back for r in kiln.compile_log())
    assert kiln.explain(f)(x).graph_break_count == 0


def test_fused_fast_path_on_two_devices_keeps_eagers_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Fast paths on two devices] (kiln_dynamo's variables/torch.py): on CUDA, eager's encoder
    # layer takes its fused kernel, which refuses a mask made on the CPU; kiln's decomposable branch
    # dropped the mask (is_causal=True) and answered. This machine has no CUDA, so `meta` stands in:
    # named the privateuse1 backend, it passes the fast path's device check (its meta kernel does not
    # check devices, so here eager answers too: the test asserts the fused op is traced and breaks).
    import torch.utils.backend_registration as registration

    monkeypatch.setattr(registration, "_privateuse1_backend_name", "meta")
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    layer = layer.eval().to("meta")
    mask = torch.triu(torch.full((4, 4), float("-inf")), diagonal=1)  # on the CPU

    def f(x: torch.Tensor) -> torch.Tensor:
        return layer(x, src_mask=mask, is_causal=True) + 1

    x = torch.ones(2, 4, 16, device="meta")
    with torch.no_grad():
        explained = kiln.explain(f)(x)
        got = kiln.compile(f)(x)
    reasons = " ".join(str(r) for r in explained.break_reasons)
    assert "_transformer_encoder_layer_fwd takes tensors on meta and cpu" in reasons
    assert got.device.type == "meta" and got.shape == (2, 4, 16)


def test_fast_path_answer_unchanged_on_one_device() -> None:
    # the decomposable branch is still taken where every tensor is on one device
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True).eval()
    mask = torch.triu(torch.full((4, 4), float("-inf")), diagonal=1)

    def f(x: torch.Tensor) -> torch.Tensor:
        return layer(x, src_mask=mask, is_causal=True) + 1

    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        explained = kiln.explain(f)(x)
        torch.testing.assert_close(kiln.compile(f)(x), f(x))
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    ops = " ".join(str(n.target) for g in explained.graphs for n in g.graph.nodes)
    assert "_transformer_encoder_layer_fwd" not in ops
