"""Note [Meta kernels that ask the device]: traced metadata is the real CPU kernel's, also where
torch's meta registration asks `device_hint`, which reads a meta tensor as CUDA: the auxiliary
outputs of `_embedding_bag`, the column-major eigenvectors of `linalg_eig` and Vh of `_linalg_svd`."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._meta_registrations

from kiln_aotgrad.tracer import fake_call
from kiln_dynamo.fake import from_real

aten = torch.ops.aten


def _assert_metadata_is_the_kernels(op: Any, args: tuple[Any, ...]) -> None:
    real = op(*args)
    fake = fake_call(op, tuple(from_real(a) if isinstance(a, torch.Tensor) else a for a in args), {})
    real, fake = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
    for i, (r, f) in enumerate(zip(real, fake, strict=True)):
        got = (tuple(f.shape), f.stride(), f.dtype, f.fake_device)
        assert got == (tuple(r.shape), r.stride(), r.dtype, r.device), f"output {i}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("op", [aten._embedding_bag.default, aten._embedding_bag_forward_only.default])
@pytest.mark.parametrize(
    ("mode", "weighted", "padding_idx"),
    [(0, False, -1), (0, True, -1), (0, False, 3), (1, False, -1), (2, False, -1)],
)
def test_embedding_bag_metadata_is_the_cpu_kernels(
    op: object, mode: int, weighted: bool, padding_idx: int, dtype: torch.dtype
) -> None:
    weight = torch.randn(50, 8, dtype=dtype)
    indices, offsets = torch.randint(0, 50, (24,)), torch.arange(0, 24, 6)
    psw = torch.rand(24, dtype=dtype) if weighted else None
    _assert_metadata_is_the_kernels(
        op, (weight, indices, offsets, False, mode, False, psw, False, padding_idx)
    )


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (aten.linalg_eig.default, (torch.randn(3, 5, 5),)),
        (aten._linalg_svd.default, (torch.randn(3, 5, 4),)),
        (aten._linalg_svd.default, (torch.randn(2, 4, 6), True)),
        (aten._fft_c2c.default, (torch.randn(4, 6, 5, dtype=torch.complex64), [0, 2], 0, True)),
        (aten.median.dim, (torch.randn(3, 5, 4), 1)),
    ],
    ids=["linalg_eig", "svd", "svd-full", "fft_c2c", "median"],
)
def test_other_device_asking_meta_kernels_answer_for_the_cpu(op: Any, args: tuple[Any, ...]) -> None:
    _assert_metadata_is_the_kernels(op, args)


def test_torch_keeps_its_own_answer_outside_kiln() -> None:
    """The hint is kiln's only while kiln runs a meta kernel: elsewhere `device_hint` of a meta
    tensor is torch's (CUDA)."""
    fake_call(aten._linalg_svd.default, (from_real(torch.randn(3, 3)),), {})  # installs the hint
    assert torch._meta_registrations.device_hint(torch.empty(2, device="meta")) == "cuda"
