"""Note [Aligned attention biases] (kiln_loopir/lowering.py): the bias of the memory-efficient and
cuDNN attention kernels reaches them with every stride but the last a multiple of 8 elements,
whatever layout loopir chose for it, with expanded dims kept expanded and values unchanged.

Those kernels exist only on CUDA, so a probe op stands in for them here: registered as an op
whose argument 0 is an attention bias, it records the strides it receives. On both code
generators, static and symbolic sizes.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln_loopir import lowering

seen: list[tuple[int, ...]] = []


@torch.library.custom_op("kiln_test::bias_probe", mutates_args=())
def bias_probe(bias: torch.Tensor) -> torch.Tensor:
    seen.append(tuple(bias.stride()))
    return bias * 1.0


@bias_probe.register_fake
def _(bias: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(bias, memory_format=torch.contiguous_format)


probe = torch.ops.kiln_test.bias_probe  # called through torch.ops: captured as the op itself


@pytest.fixture(autouse=True)
def probe_is_an_attention_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(lowering.ALIGNED_BIAS_ARGS, torch.ops.kiln_test.bias_probe.default, 0)
    seen.clear()


def dense_mask(x: torch.Tensor) -> torch.Tensor:
    return probe(torch.where(x > 0, 0.0, -1e9))


def expanded_mask(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    m = torch.where(x > 0, 0.0, -1e9).expand(q.size(0), q.size(1), x.size(2), x.size(3))
    return probe(m)


def padded_mask(x: torch.Tensor) -> torch.Tensor:
    # eager SDPA's own padding: already aligned, nothing to copy
    s = x.size(-1)
    return probe(F.pad(torch.where(x > 0, 0.0, -1e9), (0, 8 - s % 8))[..., :s])


def _device(backend: str) -> str:
    """Where a backend's test inputs live: the Triton generator runs on CUDA tensors where there is
    a GPU (the session's interpreter is off there: conftest.py), on CPU tensors under its
    interpreter otherwise."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def _aligned(stride: tuple[int, ...]) -> bool:
    return stride[-1] == 1 and all(s % 8 == 0 for s in stride[:-1])


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
def test_a_bias_reaches_the_kernel_aligned(
    backend: str, dynamic: bool, caplog: pytest.LogCaptureFixture
) -> None:
    kiln.reset()
    caplog.set_level(logging.INFO, logger="kiln.loopir.passes")
    compiled = kiln.compile(dense_mask, dynamic=dynamic, options={"cpu_backend": backend})
    for n in (5, 13, 16):
        x = torch.randn(2, 3, n, n, device=_device(backend))
        seen.clear()
        got = compiled(x)
        torch.testing.assert_close(got, dense_mask(x), rtol=0, atol=0)
        assert seen and _aligned(seen[0]), (n, seen)
        assert seen[0][-2] == -(-n // 8) * 8, seen  # rows padded to a multiple of 8, no more
    assert [r for r in caplog.records if "attention bias" in r.getMessage()]  # KILN_LOG=passes says so


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_an_expanded_bias_stays_expanded(backend: str) -> None:
    kiln.reset()
    compiled = kiln.compile(expanded_mask, options={"cpu_backend": backend})
    x, q = torch.randn(2, 1, 7, 7, device=_device(backend)), torch.randn(2, 4, 7, 8, device=_device(backend))
    got = compiled(x, q)
    torch.testing.assert_close(got, expanded_mask(x, q), rtol=0, atol=0)
    (stride,) = seen[:1]
    assert _aligned(stride) and stride[1] == 0, stride  # the 4 heads share one copy of the mask


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_an_aligned_bias_is_not_copied(backend: str, caplog: pytest.LogCaptureFixture) -> None:
    kiln.reset()
    caplog.set_level(logging.INFO, logger="kiln.loopir.passes")
    compiled = kiln.compile(padded_mask, options={"cpu_backend": backend})
    x = torch.randn(2, 1, 5, 5, device=_device(backend))
    torch.testing.assert_close(compiled(x), padded_mask(x), rtol=0, atol=0)
    assert _aligned(seen[0]), seen
    assert not [r for r in caplog.records if "attention bias" in r.getMessage()]


@torch.library.custom_op("kiln_test::operand_probe", mutates_args=())
def operand_probe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    seen.extend((tuple(q.stride()), tuple(k.stride()), tuple(v.stride())))
    seen.append((q.storage_offset(), k.storage_offset(), v.storage_offset()))
    return q @ k.transpose(-1, -2) @ v


@operand_probe.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def split_heads(x: torch.Tensor) -> torch.Tensor:
    # LeViT's heads: one projection split into q, k, v of head dims 4, 4 and 12 (offsets 4 and 8
    # elements into each row: not multiples of 8, the kernels' alignment)
    b, n, _ = x.shape
    q, k, v = (x * 2).view(b, n, 2, -1).split([4, 4, 12], dim=3)
    return torch.ops.kiln_test.operand_probe(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_attention_operands_reach_the_kernel_aligned(
    backend: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Note [Aligned attention operands]: the query, key and value of the fused attention
    kernels reach them with strides and offsets that are multiples of 8 elements."""
    monkeypatch.setitem(lowering.ALIGNED_OPERAND_ARGS, torch.ops.kiln_test.operand_probe.default, (0, 1, 2))
    kiln.reset()
    caplog.set_level(logging.INFO, logger="kiln.loopir.passes")
    x = torch.randn(2, 5, 40, device=_device(backend))
    seen.clear()
    got = kiln.compile(split_heads, options={"cpu_backend": backend})(x)
    torch.testing.assert_close(got, split_heads(x))
    *strides, offsets = seen[:4]
    assert all(_aligned(s) for s in strides), strides
    assert all(o % 8 == 0 for o in offsets), offsets
    assert [r for r in caplog.records if "attention operand" in r.getMessage()]


def levit_attention(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    # an explicit attention over split heads (head dims 8, 8, 16 of one projection), which the
    # attention pass rewrites into the public scaled_dot_product_attention
    b, n, _ = x.shape
    q, k, v = (x * 2).view(b, n, 3, -1).split([8, 8, 16], dim=3)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return ((q @ k.transpose(-2, -1)) * 0.25 + bias).softmax(dim=-1) @ v


def test_public_attention_aligned_on_cuda_only(caplog: pytest.LogCaptureFixture) -> None:
    """Note [Aligned attention operands]: the public SDPA the attention pass emits picks its kernel
    at run time, so on CUDA its operands and mask are aligned; on the CPU (any layout) none is
    copied, and the rewritten attention equals eager's."""
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    assert lowering.aligned_args(sdpa, torch.device("cuda", 0)) == (3, (0, 1, 2))
    assert lowering.aligned_args(sdpa, torch.device("cpu")) == (None, ())
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention.default
    assert lowering.aligned_args(efficient, torch.device("cpu")) == (3, (0, 1, 2))
    kiln.reset()
    caplog.set_level(logging.DEBUG, logger="kiln.loopir.passes")
    x, bias = torch.randn(2, 5, 96), torch.randn(3, 5, 5)
    with torch.no_grad():
        got = kiln.compile(levit_attention)(x, bias)
    torch.testing.assert_close(got, levit_attention(x, bias))
    messages = [r.getMessage() for r in caplog.records]
    assert any("scaled_dot_product_attention" in m for m in messages), messages
    assert not [m for m in messages if "attention operand" in m or "attention bias" in m]
