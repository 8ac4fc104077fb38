"""More capture cases: super(), imports, nested containers, dict/list idioms, model helpers."""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import itertools
import math
import operator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import check
from torch import nn

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3 * sum(shape) + 1)
    return torch.randn(*shape, generator=g)


class Mode(enum.Enum):
    SUM = "sum"
    MEAN = "mean"


class Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)

    def extra(self, x):
        return x + 1


class Derived(Base):
    def forward(self, x):
        return super().forward(x).relu() + super().extra(x)


class Derived2(Base):
    def forward(self, x):
        return super().forward(x) * 2


class Shape:
    def __init__(self, h: int, w: int) -> None:
        self.h = h
        self.w = w

    def area(self) -> int:
        return self.h * self.w


class Square(Shape):
    def __init__(self, s: int) -> None:
        super().__init__(s, s)


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int
    b: float = 1.5


class Reducer:
    def __init__(self, mode: Mode) -> None:
        self.mode = mode

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum() if self.mode is Mode.SUM else x.mean()


REDUCE_SUM = Reducer(Mode.SUM)
ACTS = {"relu": torch.relu, "tanh": torch.tanh, "gelu": F.gelu}


def m_super_in_new_object(x):
    return x * Square(3).area()


def m_import_inside(x):
    import math as m

    from torch.nn import functional as fn

    return fn.relu(x) * m.pi


def m_enum(x, mode=Mode.MEAN):
    return x.sum() if mode == Mode.SUM else x.mean()


def m_callable_object(x):
    return REDUCE_SUM(x) + 1


def m_frozen_dataclass(x):
    f = Frozen(2)
    return x * f.a + f.b


def m_act_table(x):
    out = []
    for name in sorted(ACTS):
        out.append(ACTS[name](x))
    return torch.stack(out)


def m_nested_containers(x):
    cfg = {"layers": [{"scale": 2}, {"scale": 3}], "bias": (1, 2)}
    for layer in cfg["layers"]:
        x = x * layer["scale"]
    return x + sum(cfg["bias"])


def m_itertools_free(x):
    pairs = list(zip([1, 2, 3], [4, 5, 6], strict=True))
    return x * sum(a * b for a, b in pairs)


def m_defaultdict_free(x):
    d = {}
    for i, name in enumerate(["a", "b", "a"]):
        d[name] = d.get(name, 0) + i
    return x * d["a"] - d["b"]


def m_string_format(x):
    key = "layer_{}_{}".format(1, "w")
    return {key: x, f"{key}!": x * 2}


def m_while_shrink(x):
    while x.shape[-1] > 2:
        x = x[..., ::2]
    return x


def m_for_else(x):
    for i in range(3):
        if i == 5:
            break
    else:
        x = x + 10
    return x


def m_continue_break(x):
    acc = x
    for i in range(10):
        if i % 2:
            continue
        if i > 6:
            break
        acc = acc + i
    return acc


def m_nested_functions_default(x):
    def scale(y, s=3):
        return y * s

    return scale(x) + scale(x, s=1)


def m_recursive_list_build(x):
    layers = []
    for i in range(3):
        layers += [x * i]
    return torch.cat(layers)


def m_tensor_list_comprehension_filter(x):
    return [row * 2 for i, row in enumerate(x) if i != 1]


def m_unpack_star_call(x):
    shape = (2, -1)
    return x.reshape(*shape), x.view(shape)


def m_kw_splat(x):
    opts = {"dim": -1, "keepdim": True}
    return x.sum(**opts), x.amax(**opts)


def m_partial_of_lambda(x):
    add = functools.partial(lambda a, b: a + b, b=3)
    return add(x)


def m_math_on_shapes(x):
    d = x.shape[-1]
    return x / math.sqrt(d), math.ceil(d / 3), math.isclose(d, 4.0)


def m_bool_ops(x):
    a = x.shape[0] > 1 and x.shape[1] > 1
    b = x.shape[0] > 10 or x.dim() == 2
    return x * int(a) + int(b)


def m_is_none_chain(x, mask=None, bias=None):
    if mask is not None:
        x = x * mask
    if bias is None:
        bias = 0.5
    return x + bias


def m_tensor_in_dict_out(x):
    return {"logits": x, "probs": x.softmax(-1), "meta": {"n": x.shape[0]}}


def m_grad_mode_nested_functions(x, w):
    def frozen(y):
        with torch.no_grad():
            return y @ w

    return frozen(x) + x @ w


def m_dtype_promotion(x):
    return x.to(torch.int64) + 1.5, (x > 0).float().mean(), x.double() * 2


def m_torch_finfo(x):
    return x.clamp(min=torch.finfo(x.dtype).min / 2)


def m_new_tensor_methods(x):
    return x.new_ones(2), x.new_full((2,), 7.0), x.new_empty(0).shape


def m_slice_assign_local(x):
    y = torch.zeros(4, 4)
    y[1:3, 1:3] = x
    return y


def m_inplace_chain_on_clone(x):
    y = x.clone()
    y += 1
    y *= 2
    y -= x
    return y


def m_compare_sizes(x, y):
    return x + y if x.shape == y.shape else x


def m_list_of_shapes(xs):
    return [tuple(v.shape) for v in xs], torch.cat([v.flatten() for v in xs])


def m_max_of_shapes(xs):
    n = max(v.shape[0] for v in xs)
    return torch.stack([F.pad(v, (0, n - v.shape[0])) for v in xs])


def m_chunk_loop(x):
    out = 0
    for c in x.chunk(4, dim=0):
        out = out + c.sum(0)
    return out


def m_itertools_product(x):
    total = x * 0
    for a, b in itertools.product(range(2), range(2)):
        total = total + a * b
    return total


def m_ordered_items(x):
    d = collections.OrderedDict([("a", 1), ("b", 2)])
    return [x * v for k, v in d.items() if k != "c"]


MORE: list[tuple[str, Any, tuple[Any, ...]]] = [
    ("super_module", Derived, (t(2, 4),)),
    ("super_two_arg", Derived2, (t(2, 4),)),
    ("super_in_new_object", m_super_in_new_object, (t(3),)),
    ("import_inside", m_import_inside, (t(3),)),
    ("enum_default", m_enum, (t(3),)),
    ("callable_object", m_callable_object, (t(3),)),
    ("frozen_dataclass", m_frozen_dataclass, (t(3),)),
    ("act_table", m_act_table, (t(3),)),
    ("nested_containers", m_nested_containers, (t(3),)),
    ("zip_sum", m_itertools_free, (t(3),)),
    ("dict_get_counts", m_defaultdict_free, (t(3),)),
    ("string_format", m_string_format, (t(3),)),
    ("while_shrink", m_while_shrink, (t(2, 16),)),
    ("for_else", m_for_else, (t(3),)),
    ("continue_break", m_continue_break, (t(3),)),
    ("nested_functions_default", m_nested_functions_default, (t(3),)),
    ("list_iadd", m_recursive_list_build, (t(3),)),
    ("listcomp_filter", m_tensor_list_comprehension_filter, (t(3, 2),)),
    ("unpack_star_call", m_unpack_star_call, (t(4, 2),)),
    ("kw_splat", m_kw_splat, (t(3, 2),)),
    ("partial_of_lambda", m_partial_of_lambda, (t(3),)),
    ("math_on_shapes", m_math_on_shapes, (t(2, 4),)),
    ("bool_ops", m_bool_ops, (t(2, 3),)),
    ("is_none_chain", m_is_none_chain, (t(3),)),
    ("is_none_chain_mask", m_is_none_chain, (t(3), t(3))),
    ("dict_out", m_tensor_in_dict_out, (t(2, 3),)),
    ("grad_mode_nested", m_grad_mode_nested_functions, (t(2, 3).requires_grad_(), t(3, 2).requires_grad_())),
    ("dtype_promotion", m_dtype_promotion, (t(3),)),
    ("torch_finfo", m_torch_finfo, (t(3),)),
    ("new_tensor_methods", m_new_tensor_methods, (t(3),)),
    ("slice_assign_local", m_slice_assign_local, (t(2, 2),)),
    ("inplace_chain_on_clone", m_inplace_chain_on_clone, (t(3),)),
    ("compare_sizes", m_compare_sizes, (t(3), t(3))),
    ("list_of_shapes", m_list_of_shapes, ([t(2), t(3, 1)],)),
    ("max_of_shapes", m_max_of_shapes, ([t(2), t(4)],)),
    ("chunk_loop", m_chunk_loop, (t(8, 2),)),
    ("itertools_product", m_itertools_product, (t(3),)),
    ("ordered_items", m_ordered_items, (t(3),)),
]


@pytest.mark.parametrize(("name", "fn", "args"), MORE, ids=[c[0] for c in MORE])
def test_more_matches_eager(name: str, fn: Any, args: tuple[Any, ...]) -> None:
    if name.startswith("super_") and name != "super_in_new_object":
        torch.manual_seed(0)
        fn = fn()
    check(fn, *args)


class Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    @torch.no_grad()
    def frozen_part(self, x):
        return self.lin(x) * 2

    def forward(self, x):
        return self.frozen_part(x) + self.lin(x)


def test_no_grad_decorator_is_inlined() -> None:
    torch.manual_seed(0)
    backend = check(Decorated(), t(2, 3))
    targets = [str(n.target) for n in backend.gms[0].graph.nodes]
    assert not any("frozen_part" in s for s in targets), targets


def test_backend_sees_capture_time_and_frame_in_graph_meta() -> None:
    seen: list[dict[str, Any]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append(dict(gm.meta))
        return gm.forward

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * 2

    x = torch.randn(3)
    torch.testing.assert_close(kiln_dynamo.compile(scaled, backend=backend)(x), scaled(x))
    assert len(seen) == 1
    assert 0.0 < seen[0]["capture_seconds"] < 60.0
    assert seen[0]["frame"].startswith("scaled (") and __file__ in seen[0]["frame"]


def number_augmented_by_tensor(x: torch.Tensor) -> torch.Tensor:
    buckets = 0
    buckets += (x > 0).to(torch.long) * 16  # T5's _relative_position_bucket
    scale = 1.5
    scale *= x
    return buckets + scale


def test_number_augmented_by_a_tensor_is_out_of_place() -> None:
    backend = check(number_augmented_by_tensor, t(3, 4))
    targets = {n.target for gm in backend.gms for n in gm.graph.nodes}
    assert not targets & {operator.iadd, operator.imul}


@torch.library.custom_op("kiln_dynamo_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


def test_a_custom_op_called_as_its_python_function_is_one_node() -> None:
    # `@torch.library.custom_op` returns a CustomOpDef; calling it is calling the registered
    # operator: one graph node (its fake kernel at trace time), not its Python wrapper inlined
    def f(x):
        return scaled_tanh(x + 1, 0.5) * 2

    backend = check(f, t(3, 4))
    (gm,) = backend.gms
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.kiln_dynamo_test.scaled_tanh.default in targets, targets


def _ordered_by_constant_keys(x: torch.Tensor) -> tuple[Any, ...]:
    d = {"b": x, "a": x * 2, "c": x + 1}
    feats = [x[:2], x, x[:3]]
    by_len = sorted(feats, key=lambda f: f.shape[0])
    named = sorted(d.items())  # (name, tensor) pairs: the names decide
    down = sorted(d.items(), key=lambda kv: kv[0], reverse=True)
    feats.sort(key=lambda f: -f.shape[0])
    return by_len, named, down, feats, max(feats, key=len), min(d.items()), max([], default=x)


def _sort_with_a_type_as_key(x: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    nums = [10, 9, 100]
    nums.sort(key=str)  # eager: [10, 100, 9]; kiln ignored the key before
    return x * nums[-1], nums


def test_ordering_by_constant_keys_matches_eager_and_keeps_the_items() -> None:
    """Note [Ordering by constant keys] (variables/lists.py): one graph, eager's order, and the
    items themselves (the same tensors) come back."""
    check(_ordered_by_constant_keys, t(4))
    check(_sort_with_a_type_as_key, t(4))
    x = t(4)
    kiln_dynamo.reset()
    by_len, *_rest, feats, biggest, _, empty = kiln_dynamo.compile(
        _ordered_by_constant_keys, backend="eager"
    )(x)
    assert [f.shape[0] for f in by_len] == [2, 3, 4] and biggest is feats[0] and empty is x


def _equal_heads(x: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    return sorted([(1, x), (1, x * 2)])  # equal heads: Python compares the tensors


def test_ordering_that_would_compare_tensors_is_a_break_with_eager_error() -> None:
    with pytest.raises(RuntimeError, match="ambiguous"):
        _equal_heads(t(4))
    kiln_dynamo.reset()
    with pytest.raises(RuntimeError, match="ambiguous"):
        kiln_dynamo.compile(_equal_heads, backend="eager")(t(4))
    assert any("not Python constants" in str(r) for r in kiln_dynamo.counters.break_reasons)


def _slice_fields(x: torch.Tensor, n: int) -> tuple[Any, ...]:
    s = slice(1, n, 2)
    t = slice(n)
    return x[s] * s.start, s.stop, s.step, t.start, t.stop, x[: t.stop]


def test_slice_fields_are_read_in_the_graph() -> None:
    check(_slice_fields, t(8), 6)


def _keys_view_set_ops(x: torch.Tensor) -> tuple[Any, ...]:
    d = {"a": x, "b": x * 2, "c": x + 1}
    e = {"b": 1, "z": 2}
    common = d.keys() & {"a", "z"}
    return x * len(common), sorted(d.keys() - {"a"}), d.keys() | {"q"}, d.keys() ^ e.keys(), {"c"} - d.keys()


def test_set_operators_on_a_dicts_keys_view() -> None:
    check(_keys_view_set_ops, t(4))


def _ordered_dict_moves(x: torch.Tensor, outside: collections.OrderedDict[str, Any]) -> tuple[Any, ...]:
    od = collections.OrderedDict(a=x, b=x * 2, c=x + 1)
    od.move_to_end("a")
    od.move_to_end("c", last=False)
    k, v = od.popitem(last=False)
    plain = {"p": 1, "q": x}
    last = plain.popitem()
    outside.move_to_end("first")  # the caller's dict: its new order is written back
    outside.popitem(last=True)
    return v * 2, k, list(od), last, plain


def test_ordered_dict_move_to_end_and_popitem() -> None:
    def state(x: torch.Tensor, outside: collections.OrderedDict[str, Any]) -> list[str]:
        return list(outside)

    outside = collections.OrderedDict(first=1, second=2, third=3)
    check(_ordered_dict_moves, t(4), outside, state=state, calls=1)


def _itertools_more(x: torch.Tensor) -> tuple[Any, ...]:
    layers = [x, x * 2, x + 1, x - 3]
    diffs = [b - a for a, b in itertools.pairwise(layers)]
    running = list(itertools.accumulate(layers))
    scaled = list(itertools.accumulate([1, 2, 3], operator.mul, initial=2))
    maxed = list(itertools.accumulate(layers, torch.maximum))
    flat = list(itertools.chain.from_iterable([[x], (x * 3, x * 4)]))
    return diffs, running, scaled, maxed, flat, list(itertools.islice(layers, 1, None, 2))


def test_itertools_pairwise_accumulate_islice_chain_from_iterable() -> None:
    check(_itertools_more, t(4))


def _version_checks(x: torch.Tensor) -> tuple[Any, ...]:
    import sys

    if sys.version_info >= (3, 12):  # both branches: 3.11 and 3.12 are supported
        x = x * 2
    else:
        x = x * 3
    return x, sys.version_info[:2], sys.version_info.major, sys.version_info


def test_sys_version_info_is_a_constant() -> None:
    """Before: "container subclass version_info" sent the whole frame to Python."""
    check(_version_checks, t(4))
