"""Note [Welford chunks] (split.py): a split Welford column reduction's chunks and its tile."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from triton_check import DEVICES, aten, check

from kiln_codegen_triton import TritonBackend
from kiln_codegen_triton.heuristics import Config


def bn_stats(x: torch.Tensor) -> Any:
    """A BatchNorm's training statistics as CUDA's decomposition gives them: a variance and a mean
    of the float32 input over every dim but the channels."""
    xf = aten._to_copy.default(x, dtype=torch.float32)
    return aten.var.correction(xf, [0, 2, 3], correction=0), aten.mean.dim(xf, [0, 2, 3])


def _split(backend: TritonBackend) -> tuple[Any, Any]:
    """The partial kernel's launcher and the second kernel's spec of the one split reduction."""
    launchers = backend.last_launchers
    partial = [launcher for name, launcher in launchers.items() if name.endswith("_partial")]
    assert len(partial) == 1, sorted(launchers)
    fused = partial[0].spec.name.removesuffix("_partial").split("_fused")[1]
    second = [launcher.spec for n, launcher in launchers.items() if n.split("_fused")[1] == fused]
    assert len(second) == 1, sorted(launchers)
    return partial[0], second[0]


def _activation(n: int, c: int, hw: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(n, c, hw, hw) * 3 + 1
    return x.to(dtype).to(memory_format=torch.channels_last)


# (N, C, H=W): the rows (N*H*W) and the chunks with the rule on and off. 6272 and 1568 rows are
# ResNet-50's 14x14 and 7x7 maps at batch 32, divided by 16: the off rule rounds the chunk count
# up to a power of two that leaves 49-row chunks; the rule keeps 128 rows or more, as the largest
# divisor of the row within the bound (49 chunks of 128, 8 of 196)
SHAPES = [
    ((2, 8, 56), 49, 128),
    ((2, 16, 28), 8, 32),
    ((1, 8, 40), 10, 32),  # 1600 rows: at most 12 chunks, 10 the largest divisor
]


@pytest.mark.parametrize(("shape", "on", "off"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_welford_chunks_of_at_least_128_rows(
    shape: tuple[int, int, int], on: int, off: int, dtype: torch.dtype, caplog: pytest.LogCaptureFixture
) -> None:
    n, c, hw = shape
    rows = n * hw * hw
    x = _activation(n, c, hw, dtype)
    caplog.set_level(logging.DEBUG, logger="kiln.codegen_triton.output_code")
    backend = check(bn_stats, x, device=DEVICES[0], backend=TritonBackend())
    partial, second = _split(backend)
    chunks = on
    assert second.rnumel == chunks and rows // chunks >= 128
    assert partial.spec.rnumel == rows // chunks and partial.spec.welford and partial.spec.outer
    assert f"split into {chunks} chunks of {rows // chunks} rows" in caplog.text
    # the tile: 16 channels by 32 rows of four warps where chunks x channels are few
    assert partial.candidates[0] == Config(min(16, partial.spec.xnumel), RBLOCK=32, num_warps=4)

    caplog.clear()
    backend = check(bn_stats, x, device=DEVICES[0], backend=TritonBackend(welford_chunks=False))
    partial, second = _split(backend)
    assert second.rnumel == off and partial.spec.rnumel == rows // off
    assert "Welford column reduction" not in caplog.text


def test_welford_chunk_tile_follows_the_outputs() -> None:
    """Many chunks x channels take 64-channel tiles of 8 rows (still four warps); the switch off
    gives back Note [Welford tiles]' config."""
    from dataclasses import replace

    from kiln_codegen_triton import heuristics
    from kiln_codegen_triton.heuristics import configs

    backend = check(
        bn_stats, _activation(2, 8, 56, torch.bfloat16), device=DEVICES[0], backend=TritonBackend()
    )
    partial, _ = _split(backend)
    wide = replace(partial.spec, xnumel=196 * 512, rnumel=128)
    assert configs(wide, rblock_cap=2048)[0] == Config(64, RBLOCK=8, num_warps=4)
    tiles = configs(wide, rblock_cap=2048, welford_chunks=False)[0]
    assert (tiles.XBLOCK * tiles.RBLOCK * 2, tiles.num_warps) == (
        heuristics.WELFORD_TILE_BYTES,
        heuristics.WELFORD_WARPS,
    )


def test_row_reductions_and_sums_keep_their_chunks() -> None:
    """The rule is for Welford column reductions: a column sum of the same rows splits as before."""

    def col_sum(x: torch.Tensor) -> Any:
        return aten.sum.dim_IntList(aten._to_copy.default(x, dtype=torch.float32), [0, 2, 3])

    x = _activation(2, 8, 56, torch.float32)
    on = check(col_sum, x, device=DEVICES[0], backend=TritonBackend())
    off = check(col_sum, x, device=DEVICES[0], backend=TritonBackend(welford_chunks=False))
    assert _split(on)[1].rnumel == _split(off)[1].rnumel
    assert _split(on)[0].candidates == _split(off)[0].candidates


@pytest.mark.parametrize("shared", [True, False])
def test_one_triple_of_partials_per_welford(shared: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Note [One triple per Welford] (split.py): a var_mean's mean and m2 are one Welford; split,
    they share three partial buffers and the second kernel combines them once."""

    def var_mean(x: torch.Tensor) -> Any:
        return aten.var_mean.correction(x, [0, 2, 3], correction=0, keepdim=True)

    caplog.set_level(logging.DEBUG, logger="kiln.codegen_triton.output_code")
    x = _activation(2, 8, 56, torch.float32)
    backend = check(var_mean, x, device=DEVICES[0], backend=TritonBackend(welford_shared=shared))
    partial, second = _split(backend)
    stores = partial.spec.source.count("tl.store(")
    assert stores == (3 if shared else 6), partial.spec.source
    assert second.source.count("k_welford)") == (1 if shared else 2), second.source
    assert ("Welford outputs share their partials" in caplog.text) is shared
