"""Reductions through Triton against eager: every reduction type, persistent and looped blocks,
outer (column) reductions, Welford statistics and fused prologues and epilogues."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from triton_check import DEVICES, aten, check, kinds, make

from kiln_codegen_triton import TritonBackend
from kiln_loopir.testing import downcast_mul_sum, mul_sum, with_vals

# (name, function of x) for every reduction the lowerings produce
REDUCTIONS: list[tuple[str, Any]] = [
    ("sum", lambda x: aten.sum.dim_IntList(x, [1])),
    ("mean", lambda x: aten.mean.dim(x, [1])),
    ("amax", lambda x: aten.amax.default(x, [1])),
    ("amin", lambda x: aten.amin.default(x, [1])),
    ("argmax", lambda x: aten.argmax.default(x, 1)),
    ("argmin", lambda x: aten.argmin.default(x, 1)),
    ("prod", lambda x: aten.prod.dim_int(x, 1)),
    ("any", lambda x: aten.any.dim(x, 1)),
    ("all", lambda x: aten.all.dim(x, 1)),
    ("var", lambda x: aten.var.correction(x, [1], correction=1)),
    ("var_mean", lambda x: aten.var_mean.correction(x, [1], correction=0)),
]


def _all_reductions(x: torch.Tensor) -> Any:
    return tuple(fn(x) for _, fn in REDUCTIONS)


NAMES = [n for n, _ in REDUCTIONS]

# the two ways to reduce a row: whole row in registers, or a loop of RBLOCK chunks
BLOCKINGS = {"persistent": {}, "looped": {"max_persistent_rblock": 8}}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("blocking", list(BLOCKINGS))
def test_every_reduction(blocking: str, device: str) -> None:
    x = make((6, 37), low=-1.5, high=1.5)
    x[1, 5] = x[1, 9] = 3.0  # a tie: argmax takes the first
    x[2, 3] = float("nan")  # max/argmax propagate NaN
    backend = check(_all_reductions, x, device=device, backend=TritonBackend(**BLOCKINGS[blocking]))
    assert set(kinds(backend)) == {blocking}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(3, 0), (0, 4), (2, 0, 3)], ids=str)
def test_reductions_over_no_element(shape: tuple[int, ...], device: str) -> None:
    """Note [Reductions over no element] (kiln_loopir): a sum, product, any/all, mean, var and
    var_mean over a size-0 dim are their identities (or eager's NaN), not kernels; the digit of
    a size-0 dim was a modulus by zero and the generator failed."""

    def fn(x: torch.Tensor) -> Any:
        d = [shape.index(0)]
        return (
            aten.sum.dim_IntList(x, d),
            aten.sum.default(x),
            aten.prod.default(x),
            aten.prod.dim_int(x, d[0]),
            aten.any.dim(x, d[0]),
            aten.all.default(x),
            aten.mean.dim(x, d),
            aten.var.correction(x, d, correction=1),
            aten.var_mean.correction(x, d, correction=0)[0],
            aten.var_mean.correction(x, d, correction=0)[1],
        )

    check(fn, torch.zeros(shape), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool], ids=str
)
def test_reductions_by_dtype(dtype: torch.dtype, device: str) -> None:
    def fn(x: torch.Tensor) -> Any:
        out = [aten.sum.dim_IntList(x, [1]), aten.amax.default(x, [1]), aten.any.dim(x, 1)]
        if dtype != torch.bool:
            out.append(aten.argmin.default(x, 1))
        if dtype.is_floating_point:
            out += [aten.mean.dim(x, [1]), aten.var.correction(x, [1], correction=1)]
        return tuple(out)

    x = make((5, 23), dtype, low=-3, high=3)
    for blocking in BLOCKINGS.values():
        check(fn, x, device=device, backend=TritonBackend(**blocking), scale=4.0)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_and_layer_norm_are_one_kernel(device: str) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
        sm = aten._softmax.default(x, 1, False)
        lsm = aten._log_softmax.default(x, 1, False)
        ln = aten.native_layer_norm.default(x, [x.shape[1]], w, b, 1e-5)
        return sm, lsm, ln[0]

    x, w, b = make((8, 50)), make((50,)), make((50,))
    backend = check(fn, x, w, b, device=device)
    assert kinds(backend) == ["persistent"]
    looped = check(fn, x, w, b, device=device, backend=TritonBackend(max_persistent_rblock=16))
    assert kinds(looped) == ["looped"]
    # the looped kernel walks each row once per pass: softmax reads its max, then its sum
    assert looped.last_source.count("for roffset in range") >= 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_layer_norm_sums_its_row_once(dtype: torch.dtype, device: str) -> None:
    # Note [One sum of a row]: aotgrad's layer norm is a var and a mean of the same row; in a
    # persistent kernel the var's mean and the mean are one tl.sum (two before: three reductions)
    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        var = aten.var.correction(x, [1], correction=0, keepdim=True)
        mean = aten.mean.dim(x, [1], True)
        normed = aten.mul.Tensor(aten.sub.Tensor(x, mean), aten.rsqrt.default(aten.add.Tensor(var, 1e-5)))
        return (aten.mul.Tensor(normed, w),)

    backend = check(fn, make((8, 96), dtype), make((96,), dtype), device=device, scale=2.0)
    assert kinds(backend) == ["persistent"]
    assert backend.last_source.count("tl.sum(") == 2, backend.last_source


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [20, 300])
def test_outer_reduction(rows: int, device: str) -> None:
    """x.sum(0): the reduced dim is strided; short persistent rows or a looped tile of columns."""

    def fn(x: torch.Tensor) -> Any:
        return aten.sum.dim_IntList(x, [0]), aten.amax.default(x, [0]), aten.mean.dim(x, [0, 2])

    backend = check(fn, make((rows, 24, 5)), device=device)
    assert backend.last_specs[0].outer
    assert kinds(backend)[0] == ("persistent" if rows <= 32 else "looped")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reorder", [True, False])
def test_rows_strided_both_ways_are_taken_in_memory_order(reorder: bool, device: str) -> None:
    """Note [Reductions walk their reads' memory order]: T5's mask, ``[L, S, H]`` read as
    ``[1, H, L, S]`` rows over S, densified and reduced in one kernel; rows taken ``(l, h)`` so that
    a block's rows are side by side in memory (an outer reduction), a row still one program's."""

    def fn(x: torch.Tensor) -> Any:
        mask = aten.unsqueeze.default(aten.permute.default(x, [2, 0, 1]), 0)
        dense = aten.clone.default(mask, memory_format=torch.contiguous_format)
        excluded = aten.all.dim(aten.eq.Scalar(mask, float("-inf")), -1, True)
        return dense, excluded, aten.sum.dim_IntList(mask, [-1])

    x = make((24, 40, 3))
    x[5, :, 1] = float("-inf")  # a row excluded everywhere
    backend = check(fn, x, device=device, backend=TritonBackend(reorder_reductions=reorder))
    spec = backend.last_specs[0]
    assert spec.reordered == reorder and spec.outer == reorder and spec.kind == "persistent"
    if reorder:  # the rows' loads walk x's last dim as the block's rows
        assert "(xindex % 3)" in spec.source and "(3 * rindex)" in spec.source


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reorder", [True, False])
def test_gathers_along_the_row_take_their_column_as_the_rows(reorder: bool, device: str) -> None:
    """Note [Gathers along a row walk the rows]: T5's mask under transformers 5.17, the embedding
    lookup of the position bias fused into the densified mask and its ``all(== -inf)``: rows taken
    ``(b, l, h)``, so the gather steps by 1 along a program's rows and the bucket input is one row
    for the heads of a program; values as eager's (a head excluded everywhere, one bucket excluded)."""
    b, h, length = 2, 3, 40

    def fn(bucket: torch.Tensor, weight: torch.Tensor, keep: torch.Tensor) -> Any:
        values = aten.embedding.default(weight, bucket)  # [L, S, H]
        bias = aten.unsqueeze.default(aten.permute.default(values, [2, 0, 1]), 0)  # [1, H, L, S]
        keep4 = aten.expand.default(keep, [b, 1, length, length])
        mask = aten.where.self(keep4, bias, aten.scalar_tensor.default(-1e30))
        dense = aten.clone.default(mask, memory_format=torch.contiguous_format)
        return dense, aten.all.dim(aten.eq.Scalar(mask, float("-inf")), -1, True)

    gen = torch.Generator().manual_seed(0)
    bucket = torch.randint(0, 7, (length, length), generator=gen)
    weight = make((7, h))
    weight[:, 1] = float("-inf")  # head 1: every row excluded everywhere
    weight[4, 2] = float("-inf")  # one bucket of head 2
    keep = torch.rand(b, 1, 1, length, generator=gen) > 0.3
    keep[0] = True  # batch 0: head 1's rows are -inf everywhere
    excluded = fn(bucket, weight, keep)[1]
    assert excluded[0, 1].all() and not excluded[1].any() and not excluded[:, 2].any()
    backend = check(fn, bucket, weight, keep, device=device, backend=TritonBackend(reorder_gathers=reorder))
    spec = next(s for s in backend.last_specs if s.kind == "persistent")
    assert spec.reordered == reorder and not spec.outer
    gather = next(line for line in spec.source.splitlines() if "tl.load(p_weight" in line)
    # in logical order the head is the middle digit, (xindex // 40) % 3; reordered, the last
    assert ("(xindex % 3)" in gather) == reorder, gather


@pytest.mark.parametrize("device", DEVICES)
def test_full_reduction_and_epilogue(device: str) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        total = aten.sum.default(aten.mul.Tensor(x, y))  # prologue fused into the reduction
        norm = aten.div.Tensor(x, aten.sqrt.default(total))  # epilogue reads the scalar
        rows = aten.add.Tensor(aten.amax.default(x, [1], True), 1.0)  # epilogue on the reduced value
        return total, norm, rows

    check(fn, make((9, 70), low=0.1, high=1), make((9, 70), low=0.1, high=1), device=device)
    check(
        fn,
        make((9, 70), low=0.1, high=1),
        make((9, 70), low=0.1, high=1),
        device=device,
        backend=TritonBackend(max_persistent_rblock=64),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_reduction_over_one_element_and_broadcast_input(device: str) -> None:
    def fn(x: torch.Tensor, v: torch.Tensor) -> Any:
        one = aten.sum.dim_IntList(x, [1])  # x is (n, 1): nothing to reduce
        expanded = aten.expand.default(v, [7, 12])
        return one, aten.sum.dim_IntList(expanded, [0]), aten.argmax.default(expanded, 1)

    check(fn, make((7, 1)), make((12,)), device=device)


SPLIT = {"split_min_rnumel": 64, "split_target_programs": 16}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [True, False])
@pytest.mark.parametrize("blocking", list(BLOCKINGS))
def test_split_reductions(blocking: str, rows: bool, device: str) -> None:
    """A long reduction with few outputs runs as a partial kernel and a final one; the final one
    reduces rows of chunk results, or (``split_rows=False``) columns (Note [The second kernel
    reduces rows])."""

    def fn(x: torch.Tensor, c: torch.Tensor) -> Any:
        total = aten.sum.default(x)
        top = aten.amax.default(x, [0, 1])
        cols = aten.sum.dim_IntList(c, [0])  # outer: 5 columns, 700 rows
        scaled = aten.mul.Tensor(aten.amin.default(c, [0]), 3.0)  # epilogue after the split
        anyneg = aten.any.dim(aten.lt.Scalar(c, -1.9), 0)
        return total, top, cols, scaled, anyneg

    backend = TritonBackend(**SPLIT, **BLOCKINGS[blocking], split_rows=rows)
    check(fn, make((31, 23)), make((700, 5)), device=device, backend=backend)
    partials = [s for s in backend.last_specs if s.name.endswith("_partial")]
    assert len(partials) == 2 and len(backend.last_specs) == 4  # a full and a column kernel, split
    seconds = [s for s in backend.last_specs if not s.name.endswith("_partial")]
    # the column sum's second kernel: 5 outputs of a few chunks each, as rows or as columns
    assert any(s.outer for s in seconds) == (not rows)
    # Welford statistics split where the chunks divide the rows (700 = 4 * 175), combined by
    # Chan's formula; a row length no power-of-two chunk count divides stays whole
    var = check(
        lambda x: aten.var.correction(x, [0], correction=1),
        make((700, 5)),
        device=device,
        backend=TritonBackend(**SPLIT),
    )
    assert any("_partial" in s.name for s in var.last_specs)
    prime = check(
        lambda x: aten.var.correction(x, [0], correction=1),
        make((701, 5)),
        device=device,
        backend=TritonBackend(**SPLIT),
    )
    assert not any("_partial" in s.name for s in prime.last_specs)


@pytest.mark.parametrize("device", DEVICES)
def test_members_that_reduce_differently_shaped_rows_split(device: str) -> None:
    """Note [Each member splits its own row] (split.py): a bias gradient summed over ``[B, T]``
    and a weight gradient over the ``[B * T]`` flattened tokens share one column-reduction kernel;
    each member's partial cuts its own reduced dims (BERT's training backward raised an
    IndexError here and ran its whole graph unfused)."""

    def fn(g: torch.Tensor, x: torch.Tensor) -> Any:
        bias = aten.sum.dim_IntList(g, [0, 1])  # reduced dims [10, 70]
        flat = aten.view.default(aten.mul.Tensor(g, x), [700, 24])
        weight = aten.sum.dim_IntList(flat, [0])  # reduced dims [700]
        return bias, weight

    backend = TritonBackend(**SPLIT)
    check(fn, make((10, 70, 24)), make((10, 70, 24)), device=device, backend=backend)
    assert any(s.name.endswith("_partial") for s in backend.last_specs), [s.name for s in backend.last_specs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("peel", [True, False])
def test_a_reduction_with_stored_row_values_splits_after_peeling(peel: bool, device: str) -> None:
    """A column sum fused with a full-size value it stores (a layer-scale backward: ``g * gamma``
    stored, ``sum(g * x)`` over the rows): the stored value is peeled into a pointwise kernel of
    its own and the sum splits (Note [Split reductions]); ``split_peel=False`` keeps one kernel.
    A value that reads the node's reduction (``x - max``) is never peeled."""

    def layer_scale_backward(g: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor) -> Any:
        return aten.mul.Tensor(g, gamma), aten.sum.dim_IntList(aten.mul.Tensor(g, x), [0])

    backend = TritonBackend(**SPLIT, split_peel=peel)
    check(layer_scale_backward, make((700, 24)), make((700, 24)), make((24,)), device=device, backend=backend)
    names = [s.name for s in backend.last_specs]
    if peel:
        assert len(names) == 3 and names[0].endswith("_rows") and names[1].endswith("_partial"), names
        assert backend.last_specs[0].kind == "pointwise"
    else:
        assert len(names) == 1, names

    def centred(x: torch.Tensor) -> Any:  # the stored value reads the reduction: stays whole
        top = aten.amax.default(x, [0], True)
        return aten.sub.Tensor(x, top), top

    backend = TritonBackend(**SPLIT, split_peel=peel)
    check(centred, make((700, 24)), device=device, backend=backend)
    assert not any(s.name.endswith("_rows") for s in backend.last_specs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_statistics_of_few_channels_split(channels_last: bool, device: str) -> None:
    """BatchNorm's training statistics: mean and variance over (N, H, W) for each of a few
    channels, in NCHW (rows of H*W) and NHWC (a column reduction): both split into partial
    Welford kernels combined by Chan's formula, equal to eager."""

    def fn(x: torch.Tensor) -> Any:
        var, mean = aten.var_mean.correction(x, [0, 2, 3], correction=0, keepdim=True)
        return (
            var,
            mean,
            aten.mul.Tensor(aten.sub.Tensor(x, mean), aten.rsqrt.default(aten.add.Tensor(var, 1e-5))),
        )

    x = make((8, 3, 16, 16), low=-3, high=5)  # a mean far from 0: the combine must not cancel
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    backend = TritonBackend(**SPLIT)
    check(fn, x, device=device, backend=backend)
    assert any("_partial" in s.name for s in backend.last_specs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_one_accumulator_per_reduction_of_a_value(channels_last: bool, device: str) -> None:
    """Note [One accumulator per reduction of a value]: `var_mean`'s two buffers are one Welford,
    and the partial kernel of its split stores (mean, m2, weight) of each from one accumulator
    triple, not six (ResNet-50's BatchNorm statistics ran at 24-29% of copy bandwidth); in a
    looped kernel, two sums of one value share an accumulator, a max of it keeps its own. Equal
    to eager."""

    def statistics(x: torch.Tensor) -> Any:
        return aten.var_mean.correction(x, [0, 2, 3], correction=0, keepdim=True)

    def mixed(x: torch.Tensor) -> Any:
        var, mean = aten.var_mean.correction(x, [1], correction=0, keepdim=True)
        total = aten.sum.dim_IntList(x, [1], True)
        return var, mean, total, aten.amax.default(x, [1], True), aten.sum.dim_IntList(x, [1], True)

    if channels_last:  # the shapes of the two tests above, which split
        x, backend = (
            make((8, 64, 14, 14), low=-3, high=5).contiguous(memory_format=torch.channels_last),
            TritonBackend(),
        )
    else:
        x, backend = make((8, 3, 16, 16), low=-3, high=5), TritonBackend(**SPLIT)
    check(statistics, x, device=device, backend=backend)
    partials = [s for s in backend.last_specs if "_partial" in s.name]
    assert partials, [s.name for s in backend.last_specs]
    for spec in partials:
        if spec.kind == "looped":  # one accumulator triple, reduced once
            assert spec.source.count("tl.zeros([XBLOCK, RBLOCK]") == 3, spec.source
            assert spec.source.count("k_welford)") == 1, spec.source
        else:  # a row in registers: one sum of the row and one of its squared deviations
            assert spec.source.count("tl.sum(") == 2, spec.source
    looped = TritonBackend(max_persistent_rblock=16, split_min_rnumel=2**30)
    check(mixed, make((6, 300)), device=device, backend=looped)
    (spec,) = looped.last_specs
    assert spec.kind == "looped"
    # a Welford triple, one sum (var_mean's own sum is inside the Welford), one max
    assert (
        spec.source.count("tl.zeros([XBLOCK, RBLOCK]") + spec.source.count("tl.full([XBLOCK, RBLOCK]") == 5
    ), spec.source


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("min_chunk", [64, 256])
def test_channels_last_batch_statistics_split_into_short_chunks(min_chunk: int, device: str) -> None:
    """Note [Short chunks of column reductions]: NHWC statistics over 8x14x14 = 1568 rows of 64
    channels split into chunks as short as ``split_outer_min_chunk`` rows (32 chunks of 49 rows by
    default; 8 of 196 under the row rule's 256), equal to eager either way."""

    def fn(x: torch.Tensor) -> Any:
        return aten.var_mean.correction(x, [0, 2, 3], correction=0, keepdim=True)

    x = make((8, 64, 14, 14), low=-3, high=5).contiguous(memory_format=torch.channels_last)
    backend = TritonBackend(split_outer_min_chunk=min_chunk)
    check(fn, x, device=device, backend=backend)
    partials = [s for s in backend.last_specs if "_partial" in s.name]
    assert partials and partials[0].outer
    assert partials[0].xnumel == 64 * (32 if min_chunk == 64 else 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("by_tiles", [True, False])
def test_norm_weight_gradient_with_row_statistics_is_a_column_reduction(by_tiles: bool, device: str) -> None:
    """Note [Row statistics do not decide a column reduction]: a layer norm's weight gradient
    loads each token's mean and rstd along its row; it is still a column reduction (split into
    partial chunks of wide column tiles), not one program per column reading 2 bytes a sector."""

    def fn(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor) -> Any:
        normed = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
        return aten.sum.dim_IntList(aten.mul.Tensor(g, normed), [0]), aten.sum.dim_IntList(g, [0])

    g, x = make((1024, 384), torch.bfloat16), make((1024, 384), torch.bfloat16)  # 384 outputs: whole as rows
    mean, rstd = make((1024, 1), torch.bfloat16), make((1024, 1), torch.bfloat16, low=0.5, high=2)
    backend = TritonBackend(outer_by_tiles=by_tiles)
    check(fn, g, x, mean, rstd, device=device, backend=backend, scale=4.0)
    partials = [s for s in backend.last_specs if "_partial" in s.name]
    if by_tiles:
        assert partials and backend.last_specs[-1].kind == "persistent", backend.last_specs
    else:  # as before: a row reduction per column, whole
        assert not partials and not backend.last_specs[0].outer


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_mul_then_sum_is_one_kernel(device: str) -> None:
    """Issue 19, fusion bounds: the product inlines into the reduction, the bf16 result is its
    epilogue; the float32 sum of a rounded product likewise (sizes below the split threshold)."""

    a, b = make((16, 96), torch.bfloat16), make((16, 96), torch.bfloat16)
    assert len(check(with_vals(mul_sum, a, b), a, b, device=device).last_specs) == 1
    a, b = make((256, 8)), make((256, 8))
    assert len(check(with_vals(downcast_mul_sum, a, b), a, b, device=device).last_specs) == 1
