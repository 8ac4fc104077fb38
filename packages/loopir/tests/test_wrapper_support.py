"""extern_callable: a wrapper calls torch's Python binding of an extern op where it is the same
operator (Note [Extern calls through torch's Python bindings])."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kiln_loopir.wrapper_support import BOUND_OPS, NN_BOUND_OPS, WrapperConstants, extern_callable

aten = torch.ops.aten


def _samples() -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    q = k = v = torch.randn(1, 2, 4, 8)
    x = torch.randn(2, 2, 7, 6).to(memory_format=torch.channels_last)
    return [
        (aten.mm.default, (a, b), {}),
        (aten.addmm.default, (torch.randn(5), a, b), {"beta": 0.5, "alpha": 2.0}),
        (aten.bmm.default, (torch.randn(2, 3, 4), torch.randn(2, 4, 5)), {}),
        (aten.baddbmm.default, (torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)), {}),
        (aten.addmv.default, (torch.randn(3), a, torch.randn(4)), {}),
        (aten.mv.default, (a, torch.randn(4)), {}),
        (aten.dot.default, (torch.randn(4), torch.randn(4)), {}),
        (
            aten.convolution.default,
            (
                torch.randn(1, 2, 5, 5),
                torch.randn(3, 2, 3, 3),
                None,
                [1, 1],
                [1, 1],
                [1, 1],
                False,
                [0, 0],
                1,
            ),
            {},
        ),
        (aten.embedding.default, (torch.randn(10, 3), torch.tensor([[1, 2], [3, 9]])), {}),
        (aten.native_layer_norm.default, (torch.randn(2, 6), [6], torch.randn(6), torch.randn(6), 1e-5), {}),
        (aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v), {"scale": 0.5}),
        (aten.max_pool2d_with_indices.default, (x, [3, 3], [2, 2], [1, 1], [1, 1], False), {}),
        (aten.max_pool2d_with_indices.default, (x, (2, 2)), {"stride": (1, 1), "ceil_mode": True}),
        (aten.max_pool3d_with_indices.default, (x.unsqueeze(2), [1, 2, 2]), {}),
        (aten.avg_pool2d.default, (x, [3, 3], [2, 2], [1, 1], True, False, None), {}),
        (aten.adaptive_max_pool2d.default, (x, [2, 3]), {}),
        (aten._adaptive_avg_pool2d.default, (x, [1, 1]), {}),
        (
            aten._native_batch_norm_legit_no_training.default,
            (x, torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2) + 0.5, 0.1, 1e-5),
            {},
        ),
    ]


@pytest.mark.parametrize("case", range(len(_samples())))
def test_a_bound_op_gives_the_operators_result(case: int) -> None:
    op, args, kwargs = _samples()[case]
    bound = extern_callable(op)
    assert bound is not op and not isinstance(bound, torch._ops.OpOverload)
    torch.testing.assert_close(bound(*args, **kwargs), op(*args, **kwargs), rtol=0, atol=0)


def test_every_bound_op_has_a_binding_or_stays_an_overload() -> None:
    for name in BOUND_OPS:
        op = getattr(aten, name).default
        assert extern_callable(op) is getattr(torch._C._VariableFunctions, name, op)


def test_every_nn_bound_op_has_its_binding_in_torch_nn() -> None:
    for name in NN_BOUND_OPS:
        op = getattr(aten, name).default
        assert extern_callable(op) is getattr(torch._C._nn, name)


def test_the_out_overload_writes_into_out() -> None:
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    out = torch.empty(3, 5)
    extern_callable(aten.mm.out)(a, b, out=out)
    torch.testing.assert_close(out, a @ b)


def test_other_ops_and_overloads_are_called_as_they_are() -> None:
    for op in (
        aten.add.Tensor,
        aten.add.Scalar,
        aten.sum.dim_IntList,
        aten.mm.dtype,
        aten.var_mean.correction,
    ):
        assert extern_callable(op) is op
    f = lambda x: x  # noqa: E731  any callable that is not an OpOverload
    assert extern_callable(f) is f


def test_the_switch_calls_every_op_as_its_overload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_EXTERN_BINDINGS", "0")
    assert extern_callable(aten.mm.default) is aten.mm.default


def test_wrapper_constants_name_what_has_no_literal() -> None:
    class Wrapper(WrapperConstants):
        def __init__(self) -> None:
            self.consts = 0
            self.namespace: dict[str, Any] = {}

    w = Wrapper()
    t = torch.ones(2)
    literals = [w.const(v) for v in (None, True, 3, "a", 0.5, torch.float16)]
    assert literals == ["None", "True", "3", "'a'", "0.5", "_torch.float16"]
    assert (w.const(float("inf")), w.const(t)) == ("_c0", "_c1")
    assert w.namespace["_c0"] == float("inf") and w.namespace["_c1"] is t and w.consts == 2


def test_wrapper_namespace_holds_the_shared_names() -> None:
    from kiln_loopir.wrapper_support import (
        DataDependentCheckFailed,
        conform_input,
        dense_storage,
        flat_storage,
        wrapper_namespace,
    )

    ns = wrapper_namespace()
    assert (ns["_flat"], ns["_dense"], ns["_conform"]) == (flat_storage, dense_storage, conform_input)
    assert ns["_CheckFailed"] is DataDependentCheckFailed and ns["_torch"] is torch
    assert wrapper_namespace() is not ns  # each wrapper adds its own names to a fresh dict


def test_seed_generators_seeds_per_test_and_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Seeded tests]: the same test id draws the same data; another id or base, other data."""
    import random

    from kiln_loopir.testing import seed_generators

    def draw(test_id: str) -> tuple[float, list[float]]:
        seed_generators(test_id)
        return random.random(), torch.randn(4).tolist()

    monkeypatch.delenv("KILN_TEST_SEED", raising=False)
    first = draw("tests/a.py::test_x")
    assert draw("tests/a.py::test_x") == first and draw("tests/a.py::test_y") != first
    monkeypatch.setenv("KILN_TEST_SEED", "1")
    assert draw("tests/a.py::test_x") != first
