"""Fake tensors: metadata equal to eager's for a sweep of operators; clear reasons otherwise."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from kiln_dynamo.exc import FakeUnsupported
from kiln_dynamo.fake import FakeMode, FakeTensor, from_real, metadata, run_fake

OPS: list[tuple[str, Any, tuple[Any, ...]]] = [
    ("add", torch.add, (torch.randn(3, 4), torch.randn(4))),
    ("mul_scalar", torch.mul, (torch.randn(3), 2)),
    ("matmul", torch.matmul, (torch.randn(2, 3, 4), torch.randn(4, 5))),
    ("linear", F.linear, (torch.randn(2, 3), torch.randn(4, 3), torch.randn(4))),
    ("conv2d", F.conv2d, (torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3))),
    ("softmax", F.softmax, (torch.randn(2, 5), -1)),
    ("layer_norm", F.layer_norm, (torch.randn(2, 5), (5,))),
    ("transpose", torch.transpose, (torch.randn(2, 3, 4), 0, 2)),
    ("permute_contig", lambda x: x.permute(2, 0, 1).contiguous(), (torch.randn(2, 3, 4),)),
    ("view", lambda x: x.view(6, 4), (torch.randn(2, 3, 4),)),
    ("expand", lambda x: x.expand(3, 4), (torch.randn(1, 4),)),
    ("sum_dim", torch.sum, (torch.randn(3, 4), 1)),
    ("max_dim", torch.max, (torch.randn(3, 4), 0)),
    ("cat", torch.cat, ([torch.randn(2, 3), torch.randn(1, 3)],)),
    ("split", lambda x: x.split(2), (torch.randn(5, 3),)),
    ("to_half", lambda x: x.half(), (torch.randn(3),)),
    ("int_div", torch.div, (torch.arange(6), 4)),
    ("compare", torch.gt, (torch.randn(3), 0)),
    ("where", torch.where, (torch.randn(3) > 0, torch.randn(3), torch.randn(3))),
    ("embedding", F.embedding, (torch.tensor([[0, 2]]), torch.randn(4, 3))),
    ("index", lambda x, i: x[i], (torch.randn(5, 3), torch.tensor([0, 4]))),
    ("slice_step", lambda x: x[:, ::2], (torch.randn(3, 6),)),
    ("sdpa", F.scaled_dot_product_attention, (torch.randn(1, 2, 3, 4),) * 3),
    ("batch_norm", F.batch_norm, (torch.randn(2, 3), torch.zeros(3), torch.ones(3))),
    ("grad_flow", lambda x, w: (x @ w).relu(), (torch.randn(2, 3), torch.randn(3, 2, requires_grad=True))),
    ("param", lambda w: w * 2, (torch.nn.Parameter(torch.randn(3)),)),
    ("channels_last", lambda x: x.to(memory_format=torch.channels_last) + 1, (torch.randn(1, 3, 4, 4),)),
    ("factory_in_mode", lambda x: torch.zeros(2, 3) + torch.arange(3), (torch.randn(1),)),
]


def _fake(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return from_real(x)
    if isinstance(x, list):
        return [_fake(i) for i in x]
    return x


def _flat(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for i in x for t in _flat(i)]
    return []


@pytest.mark.parametrize(("name", "fn", "args"), OPS, ids=[o[0] for o in OPS])
def test_fake_metadata_equals_eager(name: str, fn: Any, args: tuple[Any, ...]) -> None:
    real = fn(*args)
    with FakeMode():
        fake = fn(*[_fake(a) for a in args])
    real_flat, fake_flat = _flat(real), _flat(fake)
    assert len(real_flat) == len(fake_flat)
    for r, f in zip(real_flat, fake_flat, strict=True):
        assert isinstance(f, FakeTensor)
        assert metadata(f) == metadata(r)


def test_from_real_keeps_parameter_flag_and_device() -> None:
    p = torch.nn.Parameter(torch.randn(2, 3))
    f = from_real(p)
    assert f.is_param and f.requires_grad and f.fake_device == torch.device("cpu")
    assert f.meta.device.type == "meta"


@pytest.mark.parametrize("fn", [lambda x: x.sum().item(), lambda x: x.nonzero(), torch.unique])
def test_data_dependent_ops_raise_a_reason(fn: Any) -> None:
    with pytest.raises(FakeUnsupported, match=r"needs tensor data|meta"), FakeMode():
        fn(from_real(torch.randn(4)))


@pytest.mark.parametrize("x_channels_last", [False, True])
@pytest.mark.parametrize("w_channels_last", [False, True])
@pytest.mark.parametrize("groups", [1, 8])
@pytest.mark.parametrize("transposed", [False, True])
def test_cpu_convolution_strides_match_the_device(
    x_channels_last: bool, w_channels_last: bool, groups: int, transposed: bool
) -> None:
    # Note [CPU convolution strides]: the meta kernel says contiguous where the CPU says channels-last.
    x, w = torch.randn(2, 8, 6, 6), torch.randn(8, 8 // groups, 3, 3)
    if x_channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    if w_channels_last:
        w = w.contiguous(memory_format=torch.channels_last)
    args = ([1, 1], [0, 0], [1, 1], transposed, [0, 0], groups)
    real = torch.ops.aten.convolution(x, w, None, *args)
    fake = run_fake(torch.ops.aten.convolution.default, (from_real(x), from_real(w), None, *args), {})
    assert metadata(fake) == metadata(real)


@pytest.mark.parametrize("w_channels_last", [False, True])
def test_a_convolution_to_one_pixel_has_the_devices_strides(w_channels_last: bool) -> None:
    """Note [CPU convolution strides], in full: an output of one pixel is both layouts; the CPU
    kernel gives it the channels-last strides (16, 1, 16, 16), the meta kernel (16, 1, 1, 1)."""
    x = torch.randn(2, 8, 1, 1).as_strided((2, 8, 1, 1), (8, 1, 8, 8))  # as a max pooling leaves it
    w = torch.randn(16, 8, 1, 1)
    if w_channels_last:
        w = w.contiguous(memory_format=torch.channels_last)
    args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    real = torch.ops.aten.convolution(x, w, None, *args)
    fake = run_fake(torch.ops.aten.convolution.default, (from_real(x), from_real(w), None, *args), {})
    assert real.stride() == (16, 1, 16, 16)
    assert metadata(fake) == metadata(real)


# Note [Operators that ask the device]
SDPA_CASES: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("plain", (2, 4, 128, 64), {}),
    ("causal", (2, 4, 128, 64), {"is_causal": True}),
    ("scaled", (2, 4, 128, 64), {"scale": 0.125}),
    ("odd_head_dim", (2, 3, 17, 200), {}),
    ("dropout", (2, 4, 64, 64), {"dropout_p": 0.1}),
]


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", SDPA_CASES, ids=[c[0] for c in SDPA_CASES])
def test_attention_kernel_choice_is_the_devices(device: str, dtype: torch.dtype, case: Any) -> None:
    """The fused-attention choice on fake tensors is the one eager makes on real ones (the meta
    kernel alone answers "math" for everything)."""
    _, shape, kwargs = case
    q = torch.randn(*shape, device=device, dtype=dtype).transpose(1, 2).contiguous().transpose(1, 2)
    op = torch.ops.aten._fused_sdp_choice.default
    real = op(q, q, q, **kwargs)
    fq = from_real(q)
    assert run_fake(op, (fq, fq, fq), kwargs) == real
    with FakeMode():
        assert op(fq, fq, fq, **kwargs) == real


def test_attention_traced_on_fakes_runs_the_fused_kernel_eager_runs() -> None:
    """scaled_dot_product_attention's composite, run on fake CPU tensors, decomposes into the
    flash kernel eager calls, not into the math decomposition."""
    q = torch.randn(2, 4, 128, 64)
    seen: list[str] = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    fq = from_real(q)
    with Spy():
        out = F.scaled_dot_product_attention(fq, fq, fq)
    assert isinstance(out, FakeTensor) and tuple(out.shape) == (2, 4, 128, 64)
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in seen, seen
    assert not any("bmm" in s or "softmax" in s for s in seen), seen


def _lstsq(driver: str | None, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[str, Any, tuple[Any, ...]]:
    fn = lambda x, y: torch.linalg.lstsq(x, y, driver=driver)  # noqa: E731
    return (f"lstsq_{driver}_{a}_{b}", fn, (torch.randn(a), torch.randn(b)))


# kiln's own meta functions (meta.py): torch has no meta kernel for these
OWN_META: list[tuple[str, Any, tuple[Any, ...]]] = [
    *[
        (f"geqrf_{s}", torch.geqrf, (torch.randn(s),))
        for s in [(5, 5), (5, 2), (2, 5), (5, 0), (3, 4, 2), (0, 3, 3)]
    ],
    ("histogram_count", torch.histogram, (torch.randn(7), 4)),
    ("histogram_edges", torch.histogram, (torch.randn(7), torch.tensor([0.0, 1.0, 3.0]))),
    ("histogram_0d", torch.histogram, (torch.tensor(1.0), 1)),
    ("histogramdd_counts", torch.histogramdd, (torch.randn(5, 3), [2, 3, 4])),
    ("histogramdd_int", torch.histogramdd, (torch.randn(5, 2), 3)),
    (
        "histogramdd_edges",
        torch.histogramdd,
        (torch.randn(5, 2), [torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0, 2.0])]),
    ),
    *[
        _lstsq(driver, a, b)
        for driver in ["gels", "gelsy", "gelsd", "gelss", None]
        for a, b in [
            ((2, 3), (2, 3)),
            ((3, 3), (3, 3)),
            ((4, 3), (4, 3)),
            ((4, 3), (4,)),
            ((2, 4, 3), (2, 4, 5)),
        ]
        if not (driver in ("gelsd", "gelss") and a[-2] > a[-1])
    ],
    # Note [view_copy of a tensor no view can describe]: torch's meta kernel rejects these
    ("view_copy_transposed", torch.view_copy, (torch.randn(3, 4).t(), (12,))),
    ("view_copy_permuted", torch.view_copy, (torch.randn(2, 3, 4).permute(2, 0, 1), (4, -1))),
    ("view_copy_viewable", torch.view_copy, (torch.randn(3, 4).t(), (4, 3))),
    ("view_copy_dtype", torch.view_copy, (torch.randn(3, 4).t(), torch.int32)),
]


@pytest.mark.parametrize(("name", "fn", "args"), OWN_META, ids=[o[0] for o in OWN_META])
def test_kilns_own_meta_functions_match_eager(name: str, fn: Any, args: tuple[Any, ...]) -> None:
    test_fake_metadata_equals_eager(name, fn, args)


@pytest.mark.parametrize("driver", ["gelsd", "gelss"])
def test_lstsq_residuals_that_depend_on_the_rank_raise_a_reason(driver: str) -> None:
    with pytest.raises(FakeUnsupported, match="full-rank"), FakeMode():
        torch.linalg.lstsq(from_real(torch.randn(4, 3)), from_real(torch.randn(4, 2)), driver=driver)


# Note [Constant fakes]
def test_a_question_about_constants_is_answered_while_tracing() -> None:
    with FakeMode():
        n = torch.scalar_tensor(2, dtype=torch.int64)
        assert torch.equal(n - 1 <= 0, torch.zeros((), dtype=torch.bool))
        picked = torch.masked_select(from_real(torch.randn(4, 3)), torch.arange(3) < 2)
    assert isinstance(picked, FakeTensor) and tuple(picked.shape) == (8,) and picked.constant is None


def test_inputs_and_their_results_carry_no_constant() -> None:
    x = from_real(torch.randn(3))
    with FakeMode():
        y = x + torch.ones(3)
        with pytest.raises(FakeUnsupported, match="needs tensor data"):
            torch.equal(y, y)
    assert x.constant is None and y.constant is None


@pytest.mark.parametrize("through_view", [False, True])
def test_a_write_of_data_drops_the_constants_of_every_alias(through_view: bool) -> None:
    x = from_real(torch.randn(2))
    with FakeMode():
        c = torch.zeros(4)
        assert torch.equal(c, torch.zeros(4))
        (c[1:3] if through_view else c).add_(x if through_view else x.repeat(2))
        with pytest.raises(FakeUnsupported, match="needs tensor data"):
            torch.equal(c, torch.zeros(4))


def test_a_write_of_constants_keeps_every_alias_constant() -> None:
    with FakeMode():
        c = torch.zeros(4)
        c[1:3].add_(torch.ones(2))
    assert isinstance(c, FakeTensor) and c.constant is not None
    assert torch.equal(c.constant, torch.tensor([0.0, 1.0, 1.0, 0.0]))


@pytest.mark.parametrize(
    "make",
    [lambda: torch.rand(3), lambda: torch.empty(3), lambda: torch.zeros(5000)],
    ids=["random", "uninitialized", "large"],
)
def test_random_uninitialized_or_large_results_are_not_constants(make: Any) -> None:
    with FakeMode():
        t = make()
    assert t.constant is None


def test_unique_of_one_element_has_a_known_size_and_of_more_raises() -> None:
    with FakeMode():
        values, inverse, counts = torch.ops.aten._unique2(from_real(torch.randn(1, 1)), True, True, True)
        assert [tuple(t.shape) for t in (values, inverse, counts)] == [(1,), (1, 1), (1,)]
        with pytest.raises(FakeUnsupported, match="needs tensor data"):
            torch.ops.aten._unique2(from_real(torch.randn(2)))


def test_metadata_queries_as_operators_answer_symbolic_sizes() -> None:
    # Note [Metadata queries as operators]: torch 2.11's batched matmul asks `aten::size` through
    # the dispatcher; re-running that on the meta tensor failed there, breaking every batched `@`.
    from kiln_symbolic import ShapeEnv, make_symint

    env = ShapeEnv()
    s = make_symint(env, env.create_symbol(5, "s"), 5)
    fake = from_real(torch.randn(2, 5, 3), layout=([2, s, 3], [3 * s, 3, 1]))
    with FakeMode():
        assert torch.ops.aten.size.default(fake) == [2, s, 3]
        assert torch.ops.aten.sym_size.int(fake, 1) == s
        assert torch.ops.aten.stride.default(fake) == [3 * s, 3, 1]
        assert torch.ops.aten.sym_stride.int(fake, 0) == 3 * s
        assert torch.ops.aten.sym_numel.default(fake) == 6 * s
        assert torch.ops.aten.dim.default(fake) == 3
        assert torch.ops.aten.sym_storage_offset.default(fake) == 0
        out = fake @ from_real(torch.randn(2, 3, 5), layout=([2, 3, s], [3 * s, s, 1]))
    assert isinstance(out, FakeTensor) and list(out.shape) == [2, s, s]


def test_composite_operators_run_under_the_python_dispatcher_only_with_symbolic_sizes() -> None:
    # Note [Composite operators under symbolic sizes]: torch's Python decompositions of composite
    # operators (matmul, linear) keep sizes symbolic where some versions' C++ reads them as ints
    from kiln_symbolic import ShapeEnv, make_symint

    from kiln_dynamo.fake import dispatch_for

    key = torch._C.DispatchKey.PythonDispatcher
    env = ShapeEnv()
    s = make_symint(env, env.create_symbol(5, "s"), 5)
    symbolic = from_real(torch.randn(2, 5), layout=([2, s], [s, 1]))
    static = from_real(torch.randn(2, 5))
    for values, on in (([static, 3], False), ([static, symbolic], True), ([static, s], True), ([], False)):
        with dispatch_for(values):
            assert torch._C._dispatch_tls_is_dispatch_key_included(key) is on, values
    assert not torch._C._dispatch_tls_is_dispatch_key_included(key)


# Note [Fused GRU cell] in meta.py: a CUDA-only kernel with no meta kernel. No GPU here, so the
# stand-in is fake tensors that say "cuda" over meta storage: the dispatch takes the same path
# (torch's meta kernel missing, kiln's own answers).
@pytest.mark.parametrize("biased", [False, True])
def test_fused_gru_cell_on_stand_in_cuda_fakes(biased: bool) -> None:
    cuda = torch.device("cuda")

    def fake(*shape: int, dtype: torch.dtype = torch.float16) -> FakeTensor:
        return FakeTensor(torch.empty(shape, dtype=dtype, device="meta"), cuda)

    batch, hidden = 3, 5
    gates = [fake(batch, 3 * hidden), fake(batch, 3 * hidden)]
    hx = fake(batch, hidden)
    bias = [fake(3 * hidden), fake(3 * hidden)] if biased else []
    with FakeMode():
        hy, workspace = torch.ops.aten._thnn_fused_gru_cell(*gates, hx, *bias)
    for t in (hy, workspace):
        assert isinstance(t, FakeTensor) and t.device == cuda and t.dtype == torch.float16
    assert tuple(hy.shape) == (batch, hidden) and hy.stride() == (hidden, 1)
    assert tuple(workspace.shape) == (batch, 5 * hidden) and workspace.is_contiguous()


def test_fused_gru_cell_with_mismatched_shapes_raises_a_reason() -> None:
    cuda = torch.device("cuda")
    gates = FakeTensor(torch.empty((3, 12), device="meta"), cuda)
    hx = FakeTensor(torch.empty((3, 5), device="meta"), cuda)
    with pytest.raises(FakeUnsupported, match="_thnn_fused_gru_cell"), FakeMode():
        torch.ops.aten._thnn_fused_gru_cell(gates, gates, hx)
