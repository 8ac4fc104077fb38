"""The partitioners: a min-cut checked by hand, min-cut vs default, what may be recomputed."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from aot_helpers import Recorder, check
from torch import nn

import kiln_aotgrad
from kiln_aotgrad import Partition
from kiln_aotgrad.partition import recomputable


def _partition_of(res: object) -> Partition:
    compiled = res.compiled  # type: ignore[attr-defined]
    (art,) = compiled.compiled.values()
    assert art.partition is not None
    return art.partition


def _crafted(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x @ w  # matmul: never recomputed
    y = h.sin().exp()  # pointwise: recomputable from h
    return (y * y).sum()


def test_min_cut_saves_the_hand_computed_bytes() -> None:
    # The backward needs x (for dw = x^T dh), w (for dx = dh w^T) and the pointwise chain
    # sin -> exp -> square, all of which come back from h. The cheapest cut saves x, w and h:
    # 64*32*4 + 32*16*4 + 64*16*4 = 8192 + 2048 + 4096 = 14336 bytes.
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(32, 16, requires_grad=True)
    p = _partition_of(check(_crafted, x, w, partition="min_cut"))
    assert p.saved_bytes == 14336
    # Default saves what the backward reads: x^T, w^T, cos(h) and exp(sin(h)), plus no recompute.
    d = _partition_of(check(_crafted, x, w, partition="default"))
    assert d.saved_bytes == 8192 + 2048 + 4096 + 4096
    assert d.recomputed == []
    assert p.recomputed  # sin/exp/cos are recomputed in the backward


def test_min_cut_saves_fewer_bytes_than_default_on_linear_gelu_layernorm_linear() -> None:
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 32))
    x = torch.randn(256, 32, requires_grad=True)
    mc = _partition_of(check(model, x, partition="min_cut"))  # gradients equal eager
    df = _partition_of(check(model, x, partition="default"))
    assert mc.saved_bytes < df.saved_bytes, (mc.saved_bytes, df.saved_bytes)
    assert mc.activation_bytes <= 0.7 * df.activation_bytes, (mc.activation_bytes, df.activation_bytes)


def test_random_and_matmul_are_never_recomputed() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.dropout((x @ w).relu(), 0.5, training=True).sum(0)

    x = torch.randn(8, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    p = _partition_of(check(f, x, w, seed=3))
    by_name = {n.name: n for n in p.bw.graph.nodes}
    recomputed = {str(by_name[name].target) for name in p.recomputed}
    assert recomputed, "relu is cheap: expected some recompute"
    assert not any("bernoulli" in t or "mm" in t for t in recomputed), recomputed
    for n in p.fw.graph.nodes:
        if n.op == "call_function" and "bernoulli" in str(n.target):
            assert not recomputable(n)


def test_dropout_gradients_match_eager_for_the_same_seed() -> None:
    # Note [RNG in compiled graphs]: same random calls in the same order -> same mask.
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 4)).train()
    for seed in (0, 1, 2):
        check(model, torch.randn(32, 16, requires_grad=True), seed=seed)


# Note [What saving a value costs]: the row statistics cross to the backward, not the
# normalized rows.


class _RMSNorm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _full_size_saved(p: Partition, numel: int) -> list[str]:
    """Saved values as large as the rows that are neither graph inputs nor views of them."""
    output = next(n for n in reversed(p.fw.graph.nodes) if n.op == "output")
    values = list(output.args[0])[-len(p.saved) :]
    out = []
    for n in values:
        base = n
        while base.op == "call_function" and getattr(base.target, "is_view", False):
            base = base.args[0]
        val = n.meta.get("val")
        if base.op != "placeholder" and isinstance(val, torch.Tensor) and val.numel() >= numel:
            out.append(n.name)
    return out


def _norm_and_rows() -> list[tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    return [
        (nn.LayerNorm(96), torch.randn(64, 96, requires_grad=True)),
        (_RMSNorm(96), torch.randn(64, 96, requires_grad=True)),
    ]


def test_layer_norm_and_rms_norm_save_the_statistics_not_the_normalized_rows() -> None:
    for model, x in _norm_and_rows():
        p = _partition_of(check(model, x, atol=1e-4, rtol=1e-4))  # gradients equal eager
        assert _full_size_saved(p, x.numel()) == [], (type(model).__name__, p.saved)
        assert p.forward_writes == 0, p.saved
        assert "taken" in p.cost_note, p.cost_note
        assert p.recomputed  # the normalized rows, in the backward's kernels
        # the statistics: a few floats a row, besides x and the weight
        assert p.saved_bytes <= x.numel() * 4 + 96 * 4 * 2 + 64 * 4 * 3, p.saved_bytes


def test_fusion_aware_saves_off_saves_the_normalized_rows() -> None:
    model, x = _norm_and_rows()[0]
    rec_on = check(model, x, atol=1e-4, rtol=1e-4)
    rec = Recorder()
    compiled = kiln_aotgrad.aot_module(copy.deepcopy(model), rec, fusion_aware_saves=False)
    compiled(x.detach().requires_grad_()).sum().backward()
    (art,) = compiled.compiled.values()
    off = art.partition
    assert off is not None and off.cost_note == ""
    assert _full_size_saved(off, x.numel())  # xhat
    assert off.forward_writes >= x.numel() * 4
    assert _partition_of(rec_on).saved_bytes - off.saved_bytes <= 64 * 4 * 2  # a stat a row more


def test_a_matmul_result_is_saved_not_recomputed() -> None:
    # h = x @ w is written by the forward (an extern op); its LayerNorm's backward reads h, mean
    # and rstd. The cut may not recompute the matmul for it, whatever the weights.
    torch.manual_seed(0)
    x = torch.randn(32, 16, requires_grad=True)
    w = torch.randn(16, 48, requires_grad=True)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x @ w, (48,)).sin()

    p = _partition_of(check(f, x, w, atol=1e-4, rtol=1e-4))
    by_name = {n.name: n for n in p.bw.graph.nodes}
    recomputed = {str(by_name[name].target) for name in p.recomputed}
    assert not any("mm" in t for t in recomputed), recomputed
    saved = {n.name: n for n in p.fw.graph.nodes if n.name in p.saved}
    assert any(str(n.target).startswith("aten.mm") for n in saved.values()), p.saved
    assert p.forward_writes <= 32 * 48 * 4, (p.forward_writes, p.saved)  # at most sin's input


def test_a_cut_that_holds_much_more_memory_is_refused() -> None:
    # Bytes alone save h = x[:, :90] + x[:, 10:] (0.9 of x); at twice h's bytes x is cheaper (it
    # is an input: no write), but holds 11% more bytes: over the slack, the bytes-only cut stands.
    x = torch.randn(64, 100, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x[:, :90] + x[:, 10:]).sin().sum()

    p = _partition_of(check(f, x))
    assert "refused (memory)" in p.cost_note, p.cost_note
    assert p.saved_bytes == 64 * 90 * 4, (p.saved, p.saved_bytes)


def test_layer_norm_with_symbolic_rows_saves_the_statistics() -> None:
    import kiln_dynamo

    kiln_dynamo.reset()
    try:
        torch.manual_seed(0)
        model = nn.LayerNorm(32)
        ref = copy.deepcopy(model)
        rec = Recorder()
        backend = kiln_aotgrad.aot_backend(rec)
        backend.__kiln_dynamic_shapes__ = True  # type: ignore[attr-defined]
        compiled = kiln_dynamo.compile(model, backend=backend, dynamic=True)
        for rows in (5, 9, 17):
            x = torch.randn(rows, 32)
            out, want = compiled(x.clone().requires_grad_()), ref(x)
            torch.testing.assert_close(out, want)
            out.sum().backward()
            want.sum().backward()
            for p, q in zip(model.parameters(), ref.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
        assert len(rec.graphs) == 2, len(rec.graphs)  # one symbolic forward and backward
        fw = rec.graphs[0]
        saved = [n for n in next(n for n in reversed(fw.graph.nodes) if n.op == "output").args[0][1:]]
        rows_sized = [
            n.name
            for n in saved
            if isinstance(n, torch.fx.Node)
            and n.op != "placeholder"
            and isinstance(n.meta.get("val"), torch.Tensor)
            and n.meta["val"].dim() == 2
            and n.meta["val"].shape[1] == 32
        ]
        assert rows_sized == [], rows_sized
    finally:
        kiln_dynamo.reset()


def _bn_relu_conv() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)
    )
    return model, torch.randn(4, 3, 12, 12, requires_grad=True)


def _recomputed_targets(p: Partition) -> set[str]:
    by_name = {n.name: n for n in p.bw.graph.nodes}
    return {str(by_name[name].target) for name in p.recomputed}


def test_a_value_a_convolution_backward_reads_is_saved_not_recomputed() -> None:
    # Note [Values the backward would write]: the second convolution's weight gradient reads
    # relu(bn(conv(x))); recomputed, it is a kernel of its own in the backward. The forward writes
    # it anyway (the convolution reads it), so it is saved.
    model, x = _bn_relu_conv()
    p = _partition_of(check(model, x, atol=1e-4, rtol=1e-4))  # gradients equal eager
    assert not any("relu" in t for t in _recomputed_targets(p)), p.recomputed
    saved = [n for n in p.fw.graph.nodes if n.name in p.saved]
    assert any("relu" in str(n.target) for n in saved), p.saved
    # switched off: the bytes-only weights recompute it from the BatchNorm's input
    rec = Recorder()
    compiled = kiln_aotgrad.aot_module(copy.deepcopy(model), rec, materialized_saves=False)
    compiled(x.detach().requires_grad_()).sum().backward()
    (art,) = compiled.compiled.values()
    assert art.partition is not None
    assert any("relu" in t for t in _recomputed_targets(art.partition)), art.partition.recomputed
    assert art.partition.saved_bytes < p.saved_bytes


def test_a_value_a_pooling_backward_reads_for_its_shape_stays_recomputed() -> None:
    # Note [Values the backward would write]: the max-pool's backward takes relu(bn(conv(x))) for
    # its shape alone (it reads the gradient and the saved indices), so the ReLU output is not
    # saved for it; the pool's output, which the next convolution's weight gradient reads, is
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
    )
    x = torch.randn(4, 3, 12, 12, requires_grad=True)
    p = _partition_of(check(model, x, atol=1e-4, rtol=1e-4))  # gradients equal eager
    saved = [n for n in p.fw.graph.nodes if n.name in p.saved]
    assert not any("relu" in str(n.target) for n in saved), p.saved
    assert any("max_pool2d" in str(n.target) or "getitem" in n.name for n in saved), p.saved


def test_values_fused_into_the_backward_stay_recomputed() -> None:
    # Note [Values the backward would write]: a LayerNorm's normalized rows are read by fused
    # (pointwise, reduction) backward ops only, so they stay recomputed
    for model, x in _norm_and_rows():
        p = _partition_of(check(model, x, atol=1e-4, rtol=1e-4))
        assert p.recomputed and _full_size_saved(p, x.numel()) == [], p.saved


def test_fills_a_backward_op_reads_stay_recomputed() -> None:
    # Note [Values the backward would write]: an embedding gradient's zero table (a `full` the
    # backward's index_put writes into) is made again in the backward, not saved
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 16))
    ids = torch.randint(0, 50, (4, 7))
    p = _partition_of(check(model, ids, atol=1e-5, rtol=1e-5))
    saved = [n for n in p.fw.graph.nodes if n.name in p.saved]
    fills = [n.name for n in saved if any(f in str(n.target) for f in ("full", "zeros", "empty", "arange"))]
    assert fills == [], p.saved
