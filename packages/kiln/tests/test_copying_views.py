"""Note [The copying variants of views are copies] (kiln_loopir) through each code generator:
`permute_copy`, `view_copy`, `as_strided_copy`... return new memory, never a view of their input
(loopir's own tests run its interpreter only; the generators live above it)."""

from __future__ import annotations

import pytest
import torch

import kiln

CASES = {
    "view_copy": lambda x: torch.view_copy(x, (4, 3)),
    "permute_copy": lambda x: torch.permute_copy(x, (1, 0)),
    "transpose_copy": lambda x: torch.transpose_copy(x, 0, 1),
    "as_strided_copy": lambda x: torch.as_strided_copy(x, (2, 3), (3, 1)),
    "slice_copy": lambda x: torch.slice_copy(x, 0, 0, 3),
    "unsqueeze_copy": lambda x: torch.unsqueeze_copy(x, 0),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", list(CASES))
def test_copying_views_return_new_memory(name: str, backend: str) -> None:
    kiln.reset()
    fn = CASES[name]
    x = torch.randn(3, 4)
    got = kiln.compile(fn, options={"cpu_backend": backend})(x)
    torch.testing.assert_close(got, fn(x))
    assert got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    before = got.clone()
    x.add_(1.0)  # the input's update must not show through the result
    torch.testing.assert_close(got, before)
