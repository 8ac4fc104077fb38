"""Memoized meta kernels (Note [Meta results are memoized]): a remembered answer is the kernel's
answer, fresh, and only operators whose answer the key describes are remembered."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kiln_dynamo import meta_memo
from kiln_dynamo.fake import FakeMode, metadata

aten = torch.ops.aten


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def geometry(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device)


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    meta_memo.clear()


def test_a_remembered_answer_is_a_fresh_tensor_of_the_kernels_geometry() -> None:
    a, b = meta(4, 3).t(), meta(3, 1)
    first = meta_memo.meta_call(aten.mul.Tensor, (a, b), {})
    second = meta_memo.meta_call(aten.mul.Tensor, (a, b), {})
    assert len(meta_memo._MEMO) == 1
    assert second is not first and second.untyped_storage() is not first.untyped_storage()
    assert geometry(second) == geometry(first) == geometry(aten.mul.Tensor(a, b))


def test_tuples_of_results_are_remembered_whole() -> None:
    x, w, rm, rv = meta(2, 3, 4, 4), meta(3), meta(3), meta(3)
    args = (x, w, None, rm, rv, True, 0.1, 1e-5)
    want = aten.native_batch_norm.default(*args)
    meta_memo.meta_call(aten.native_batch_norm.default, args, {})
    got = meta_memo.meta_call(aten.native_batch_norm.default, args, {})
    assert type(got) is type(want) and [geometry(t) for t in got] == [geometry(t) for t in want]


@pytest.mark.parametrize("fill, dtype", [(1, torch.int64), (1.0, torch.float32), (True, torch.bool)])
def test_python_numbers_are_keyed_by_their_type(fill: Any, dtype: torch.dtype) -> None:
    # 1, 1.0 and True are equal and hash alike, but `full` infers three dtypes from them
    for other in (1, 1.0, True):
        meta_memo.meta_call(aten.full.default, ([2], other), {"device": torch.device("meta")})
    assert (
        meta_memo.meta_call(aten.full.default, ([2], fill), {"device": torch.device("meta")}).dtype == dtype
    )


def test_geometry_beyond_sizes_is_keyed() -> None:
    # same sizes, other strides or offset: clone keeps a dense input's strides
    plain, transposed = meta(3, 4), meta(4, 3).t()
    assert meta_memo.meta_call(aten.clone.default, (plain,), {}).stride() == (4, 1)
    assert meta_memo.meta_call(aten.clone.default, (transposed,), {}).stride() == (1, 3)


def test_operators_that_alias_or_write_are_not_remembered() -> None:
    x = meta(3, 4)
    assert meta_memo.meta_call(aten.add_.Tensor, (x, x), {}) is x
    view = meta_memo.meta_call(aten.view.default, (x, [12]), {})
    assert view._base is x
    assert not meta_memo._MEMO


def test_a_kernel_that_raises_raises_again() -> None:
    for _ in range(2):
        with pytest.raises(RuntimeError):
            meta_memo.meta_call(aten.mul.Tensor, (meta(3), meta(4)), {})
    assert not meta_memo._MEMO


def test_the_device_hint_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Meta kernels that ask the device]: `_linalg_svd`'s meta kernel lays out U and Vh per
    # device; answering with the other device's layout would give strides that are not eager's
    import torch._meta_registrations as registrations

    original = registrations.device_hint
    monkeypatch.setattr(registrations, "device_hint", lambda t: meta_memo.DEVICE_HINT.get() or original(t))
    a = meta(5, 4)
    answers = {}
    for hint in (None, "cpu", None, "cpu"):
        token = meta_memo.DEVICE_HINT.set(hint)
        try:
            got = meta_memo.meta_call(aten._linalg_svd.default, (a,), {})
            want = aten._linalg_svd.default(a)
        finally:
            meta_memo.DEVICE_HINT.reset(token)
        assert [geometry(t) for t in got] == [geometry(t) for t in want]
        answers[hint] = [t.stride() for t in got]
    assert answers[None] != answers["cpu"]


def test_fake_operators_answer_as_eager_when_remembered() -> None:
    x, w = torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last), torch.randn(4, 3, 3, 3)

    def program(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
        y = torch.nn.functional.conv2d(x, w, padding=1)
        z = torch.nn.functional.batch_norm(y, None, None, training=True) * 2 + 1
        return [y, z, z.sum(dim=(2, 3)), (z > 0).to(torch.float16), torch.ones(3, dtype=torch.int32)]

    want = [metadata(t) for t in program(x, w)]
    for _ in range(2):  # the second run answers from the memo
        with FakeMode():
            got = [metadata(t) for t in program(x, w)]
        assert got == want
    assert meta_memo._MEMO
