"""Training graphs with convolutions under the CUDA layout rule (forced on CPU tensors with
``layout_policy="cuda"``; ``layout_training``, on by default, named here so the tests say it: Note
[Channels-last for convolutions]): the forward runs channels-last, leaves the activations it saves in that
layout, and the backward graph is compiled for those strides (Note [Saved activations in the
forward's layout] in kiln_aotgrad, Note [Outputs only the backward reads] in kiln_loopir). Both
code generators; gradients against eager over several steps."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import kiln


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    """Compiled frames of torch's own modules (``Sequential.forward``, ``Conv2d.forward``) are
    cached per code object: start and leave with none, whatever ran before in the session."""
    kiln.reset()
    yield
    kiln.reset()


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1),
            nn.ReLU(),
        )
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return self.head(y.mean(dim=(2, 3)))


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_a_conv_net_trains_channels_last_with_eagers_gradients(
    cpu_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = _ConvNet().train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(
        model,
        options={
            "layout_policy": "cuda",
            "layout_training": True,
            "cpu_backend": cpu_backend,
            "strict": True,
        },
    )
    x = torch.randn(2, 3, 8, 8)
    with (
        caplog.at_level(logging.INFO, logger="kiln.aotgrad.partition"),
        caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"),
    ):
        for _ in range(2):
            for p in [*model.parameters(), *reference.parameters()]:
                p.grad = None
            out, want = compiled(x), reference(x)
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
            assert out.stride() == want.stride()
            out.square().sum().backward()
            want.square().sum().backward()
            for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
                assert p.grad is not None and q.grad is not None
                same = [
                    a == b
                    for a, b, n in zip(p.grad.stride(), q.grad.stride(), p.shape, strict=True)
                    if n != 1
                ]
                assert all(same), (
                    name,
                    p.grad.stride(),
                    q.grad.stride(),
                )  # eager's layout (size-1 dims aside)
                torch.testing.assert_close(
                    p.grad, q.grad, rtol=1e-3, atol=1e-3, msg=lambda m, n=name: f"{n}: {m}"
                )
            for a, b in zip(model.buffers(), reference.buffers(), strict=True):  # BatchNorm running stats
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    chose = [
        r.getMessage() for r in caplog.records if "chooses channels-last: training graph" in r.getMessage()
    ]
    assert len(chose) == 2, chose  # the forward and the backward graph
    restrided = [
        r.getMessage()
        for r in caplog.records
        if "reaches the backward with the forward's strides" in r.getMessage()
    ]
    assert restrided, "no saved activation kept the forward's channels-last layout"


@pytest.mark.parametrize(
    ("groups", "why"), [(2, "grouped convs (slower in NHWC)"), (4, "depthwise convs (NHWC weight gradient")]
)
def test_grouped_and_depthwise_convolutions_keep_training_in_eagers_layouts(
    groups: int, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = nn.Sequential(nn.Conv2d(4, 8 if groups == 2 else 4, 3, groups=groups), nn.ReLU()).train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"layout_policy": "cuda", "layout_training": True, "strict": True})
    x = torch.randn(2, 4, 8, 8)
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"):
        compiled(x).sum().backward()
    reference(x).sum().backward()
    assert why in caplog.text
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)


class _AtenCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops run outside generated kernels, with their tensor arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        self.calls.append((str(func.overloadpacket.__name__), tensors))
        return func(*args, **(kwargs or {}))


def test_no_layout_conversion_is_left_around_the_convolutions_backward() -> None:
    """Note [Channels-last for convolutions]: the max-pool backward is a generated kernel (Note [Max
    pooling backward as a gather]) and every convolution backward gets its gradient and its input
    in NHWC, the network's image included (an NCHW input beside an NHWC gradient made cuDNN convert
    the whole gradient)."""
    torch.manual_seed(0)
    model = _ConvNet().train()
    reference = copy.deepcopy(model)
    options = {"layout_policy": "cuda", "layout_training": True, "cpu_backend": "triton", "strict": True}
    compiled = kiln.compile(model, options=options)
    x = torch.randn(2, 3, 8, 8)
    compiled(x).square().sum().backward()  # compiles both graphs
    for p in model.parameters():
        p.grad = None
    recorder = _AtenCalls()
    with recorder:
        out = compiled(x)
        out.square().sum().backward()
    reference(x).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3)
    names = [name for name, _ in recorder.calls]
    assert "max_pool2d_with_indices_backward" not in names, names
    backward_convs = [tensors for name, tensors in recorder.calls if name == "convolution_backward"]
    assert len(backward_convs) == 3
    for tensors in backward_convs:
        grad, inp = tensors[0], tensors[1]
        assert grad.is_contiguous(memory_format=torch.channels_last), grad.stride()
        assert inp.is_contiguous(memory_format=torch.channels_last), inp.stride()


class _InvertedResidual(nn.Module):
    """MobileNetV2's block: expand, depthwise, project, residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(8, 16, 1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU6(),
            nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU6(),
            nn.Conv2d(16, 8, 1, bias=False),
            nn.BatchNorm2d(8),
        )
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.body(x)
        return self.head(y.mean(dim=(2, 3)))


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_cpu_training_of_an_inverted_residual_block_runs_channels_last(
    cpu_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Note [Channels-last in CPU training]: the CPU rule, by default, runs both graphs of a
    network whose convolutions' inputs outweigh their weights channels-last (here 2,880 elements
    against 400); gradients, running statistics and the gradients' layouts are eager's over two
    steps. (Convolutions this small would run PyTorch's native kernel in eager's layouts, Note
    [Small convolutions keep eager's layouts in CPU training]: off here, to test the count.)"""
    torch.manual_seed(0)
    model = _InvertedResidual().train()
    reference = copy.deepcopy(model)
    options = {"cpu_backend": cpu_backend, "strict": True, "native_small_conv": False}
    compiled = kiln.compile(model, options=options)
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"):
        for _ in range(2):
            for p in [*model.parameters(), *reference.parameters()]:
                p.grad = None
            x.grad = x_ref.grad = None
            out, want = compiled(x), reference(x_ref)
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
            out.square().sum().backward()
            want.square().sum().backward()
            torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-3, atol=1e-3)
            assert x.grad.stride() == x_ref.grad.stride()
            for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(
                    p.grad, q.grad, rtol=1e-3, atol=1e-3, msg=lambda m, n=name: f"{n}: {m}"
                )
                assert p.grad.is_contiguous() == q.grad.is_contiguous(), name
            for a, b in zip(model.buffers(), reference.buffers(), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    chose = [
        r.getMessage()
        for r in caplog.records
        if "cpu rule chooses channels-last: training graph" in r.getMessage()
    ]
    assert len(chose) == 2, chose  # the forward and the backward graph


def test_cpu_training_under_symbolic_sizes_keeps_eagers_layouts(caplog: pytest.LogCaptureFixture) -> None:
    """Note [Channels-last in CPU training]: with a symbolic batch both graphs keep eager's
    layouts (the backward is compiled once for the forward's saved strides); gradients equal
    eager's at two batches."""
    torch.manual_seed(0)
    model = _InvertedResidual().train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, dynamic=True, options={"strict": True})
    with caplog.at_level(logging.DEBUG, logger="kiln.loopir.passes"):
        for batch in (3, 5):
            for p in [*model.parameters(), *reference.parameters()]:
                p.grad = None
            x = torch.randn(batch, 8, 6, 6)
            compiled(x).square().sum().backward()
            reference(x).square().sum().backward()
            for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(
                    p.grad, q.grad, rtol=1e-3, atol=1e-3, msg=lambda m, n=name: f"{n}: {m}"
                )
    assert "symbolic convolution sizes" in caplog.text
    assert "cpu rule chooses channels-last" not in caplog.text


class _ConvNeXtBlock(nn.Module):
    """ConvNeXt's block on a small map: a 7x7 depthwise convolution read through a permute to
    (N, H, W, C) for a layer norm and a linear layer, permuted back and added to its input."""

    def __init__(self) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.norm = nn.LayerNorm(16)
        self.mlp = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mlp(self.norm(self.dwconv(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return self.head((x + y).mean(dim=(2, 3)))


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_a_depthwise_backward_on_a_small_map_runs_nchw_in_training(cpu_backend: str) -> None:
    """Note [Depthwise convolution backwards on small maps]: the 7x7 depthwise convolution on a
    4x4 map, whose input eager holds NHWC (the permutes), gets its backward's gradient and input
    NCHW; gradients (the image's included) and their strides as eager's over two steps."""
    torch.manual_seed(0)
    model = _ConvNeXtBlock().train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"cpu_backend": cpu_backend, "strict": True})
    x = torch.randn(2, 16, 4, 4).permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2).requires_grad_()
    x_ref = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    for step in range(2):
        for p in [*model.parameters(), *reference.parameters()]:
            p.grad = None
        x.grad = x_ref.grad = None
        recorder = _AtenCalls()
        with recorder if step else contextlib.nullcontext():
            out = compiled(x)
            out.square().sum().backward()
        want = reference(x_ref)
        want.square().sum().backward()
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-3, atol=1e-3)
        assert x.grad.stride() == x_ref.grad.stride()
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(
                p.grad, q.grad, rtol=1e-3, atol=1e-3, msg=lambda m, n=name: f"{n}: {m}"
            )
            for fmt in (torch.contiguous_format, torch.channels_last):  # size-1 dims' strides aside
                assert p.grad.is_contiguous(memory_format=fmt) == q.grad.is_contiguous(memory_format=fmt), (
                    name
                )
    (tensors,) = [tensors for name, tensors in recorder.calls if name == "convolution_backward"]
    grad, inp = tensors[0], tensors[1]
    assert grad.is_contiguous() and inp.is_contiguous(), (grad.stride(), inp.stride())


class _OnePixel(torch.nn.Module):
    """Layout fuzz seed 1033: a max pooling to one pixel, a 1x1 convolution, an average pooling
    and a cat of channels-last values."""

    def __init__(self) -> None:
        super().__init__()
        self.m1 = torch.nn.Conv2d(4, 3, 3, stride=3)
        self.m2 = torch.nn.Conv2d(3, 8, 3, padding=2, dilation=2, bias=False)
        self.m3 = torch.nn.Conv2d(8, 16, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.nn.functional.max_pool2d(self.m2(self.m1(x)), 3, 3, 1)
        t = torch.nn.functional.avg_pool2d(self.m3(t), 2, 1, 1, count_include_pad=False)
        return torch.cat([t, t], 1)


@pytest.mark.parametrize("train", [False, True])
def test_values_of_one_pixel_keep_eagers_channels_last_strides(train: bool) -> None:
    """Note [CPU convolution strides] (kiln_dynamo): the output came back row-major where eager's
    is channels-last."""
    torch.manual_seed(0)
    model = _OnePixel()
    x = torch.randn(2, 4, 4, 9).contiguous(memory_format=torch.channels_last).requires_grad_(train)
    compiled = kiln.compile(copy.deepcopy(model))
    with torch.set_grad_enabled(train):
        expected, got = model(x), compiled(x)
    torch.testing.assert_close(got, expected)
    assert got.stride() == expected.stride() == (128, 1, 64, 32)
