"""Note [Meta kernels that ask the device]: traced metadata is the real CPU kernel's, also for
the auxiliary outputs of `_embedding_bag` whose meta registration answers for CUDA."""

from __future__ import annotations

import pytest
import torch

from kiln_aotgrad.tracer import fake_call
from kiln_dynamo.fake import from_real

aten = torch.ops.aten


@pytest.mark.parametrize("op", [aten._embedding_bag.default, aten._embedding_bag_forward_only.default])
@pytest.mark.parametrize(("mode", "weighted"), [(0, False), (0, True), (1, False), (2, False)])
def test_embedding_bag_metadata_is_the_cpu_kernels(op: object, mode: int, weighted: bool) -> None:
    weight, indices, offsets = torch.randn(50, 8), torch.randint(0, 50, (24,)), torch.arange(0, 24, 6)
    psw = torch.rand(24) if weighted else None
    args = (weight, indices, offsets, False, mode, False, psw)
    real = op(*args)  # type: ignore[operator]
    fake = fake_call(op, tuple(from_real(a) if isinstance(a, torch.Tensor) else a for a in args), {})
    for r, f in zip(real, fake, strict=True):
        assert (tuple(f.shape), f.stride(), f.dtype, f.device) == (
            tuple(r.shape),
            r.stride(),
            r.dtype,
            r.device,
        )
