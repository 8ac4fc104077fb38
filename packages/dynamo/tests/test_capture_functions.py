"""Function-style model code captured whole: each case equals eager and makes exactly one graph."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import operator
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from conftest import CountingBackend, assert_same, check, one_graph

import kiln_dynamo
from kiln_dynamo.fake import call_fake, from_real

SCALE = 0.5
OFFSETS = (1, 2, 3)
CONFIG = {"hidden": 8, "act": "gelu"}


def t(*shape: int, grad: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    x = torch.randn(*shape, generator=g)
    return x.requires_grad_(grad)


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class Cfg:
    scale: float = 2.0
    bias: bool = True


class Holder:
    def __init__(self, w: torch.Tensor) -> None:
        self.w = w
        self.k = 3

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w + self.k

    @property
    def double_k(self) -> int:
        return self.k * 2


def helper(x: torch.Tensor, n: int = 2) -> torch.Tensor:
    return x * n + 1


def make_adder(k: float) -> Any:
    def add(x: torch.Tensor) -> torch.Tensor:
        return x + k

    return add


ADD3 = make_adder(3.0)


# --- cases: (name, fn, args) -------------------------------------------------------------------
def c_add(x, y):
    return x + y


def c_chain(x):
    return torch.tanh(torch.sigmoid(x) * 2 - 1).exp().log1p()


def c_matmul(x, w):
    return x @ w


def c_inplace_local(x):
    y = x.clone()
    y.add_(1)
    y.mul_(2)
    return y


def c_views(x):
    return x.view(2, -1).t().contiguous().reshape(-1), x.permute(1, 0).unsqueeze(0).squeeze(0)


def c_getitem(x):
    return x[0], x[:, 1:3], x[..., None], x[1, ::2], x[-1]


def c_setitem(x):
    y = x.clone()
    y[0] = 0.0
    y[:, 1] = 5.0
    return y


def c_shape_arith(x):
    b, n = x.shape
    return x.reshape(b * n // 2, 2) * (n / b)


def c_size_dim(x):
    return x.new_zeros(x.size(0), x.size(-1) + 1), x.dim(), x.numel(), x.ndim


def c_dtype_cast(x):
    return x.to(torch.float64).sum(), x.half().float(), x.type(torch.int32)


def c_factory(x):
    return torch.zeros(3, 4) + x, torch.ones_like(x), torch.arange(4) * 2, torch.full((2,), 3.0)


def c_reductions(x):
    return x.sum(), x.mean(1), x.max(dim=0).values, x.amax(-1, keepdim=True), x.std(0), torch.argmax(x, 1)


def c_softmax(x):
    return F.softmax(x, dim=-1), F.log_softmax(x, -1), x.softmax(0)


def c_cat_stack(x, y):
    return torch.cat([x, y], dim=0), torch.stack((x, y)), torch.cat([x, y], 1).chunk(2, dim=1)


def c_split_unpack(x):
    a, b = x.split(2, dim=1)
    return a * b


def c_unbind_loop(x):
    out = []
    for row in x.unbind(0):
        out.append(row.sum())
    return torch.stack(out)


def c_iter_tensor(x):
    acc = 0
    for row in x:
        acc = acc + row
    return acc


def c_python_loop(x):
    for i in range(3):
        x = x * (i + 1)
    return x


def c_while_loop(x):
    i = 0
    while i < 4:
        x = x + i
        i += 1
    return x


def c_if_const(x):
    if x.dim() == 2:
        return x * 2
    return x


def c_if_shape(x):
    return x.sum() if x.shape[0] > 2 else x.mean()


def c_ternary_none(x, y=None):
    return x * 1 if y is None else x + y


def c_global_const(x):
    return x * SCALE + OFFSETS[1]


def c_global_dict(x):
    return x[:, : CONFIG["hidden"] // 4] if CONFIG["act"] == "gelu" else x


def c_helper(x):
    return helper(x) + helper(x, n=3)


def c_closure(x):
    k = 2

    def inner(y):
        return y * k

    return inner(x) + ADD3(x)


def c_lambda(x):
    f = lambda y: y.relu() + 1  # noqa: E731
    return f(x) * 2


def c_nested_closure_write(x):
    acc = [x]

    def push(y):
        acc.append(y * 2)

    push(x)
    push(acc[-1])
    return sum(acc)


def c_partial(x):
    p = functools.partial(helper, n=4)
    return p(x)


def c_partial_torch(x):
    act = functools.partial(F.leaky_relu, negative_slope=0.2)
    return act(x)


def c_listcomp(x):
    parts = [x * i for i in range(3)]
    return torch.stack(parts)


def c_dictcomp(x):
    d = {f"k{i}": x + i for i in range(2)}
    return d["k1"] - d["k0"]


def c_genexpr_sum(x):
    return sum(x * i for i in range(4))


def c_zip_enumerate(x, y):
    out = []
    for i, (a, b) in enumerate(zip(x, y, strict=True)):
        out.append(a * b + i)
    return out


def c_reversed(x):
    out = x
    for i in reversed(range(3)):
        out = out - i
    return out


def c_dict_ops(x):
    d = {"a": x, "b": x * 2}
    d["c"] = d["a"] + d["b"]
    total = 0
    for _k, v in d.items():
        total = total + v
    return total, list(d.keys()), len(d), "a" in d, d.get("z", 7)


def c_list_ops(x):
    xs = [x, x + 1]
    xs.extend([x + 2])
    xs.insert(0, x - 1)
    last = xs.pop()
    return xs[1:], last, len(xs), xs[::-1]


def c_tuple_ops(x):
    t1 = (x, 1, "a")
    t2 = t1 + (2,)  # noqa: RUF005 - tuple concatenation is the case under test
    a, *rest = t2
    return a * 2, rest, t2[1:].index(1), t1[1:] * 2


def c_set_ops(x):
    s = {1, 2, 3}
    s.add(4)
    return x * len(s), 3 in s


def c_namedtuple_out(x):
    return Point(x, x * 2)


def c_namedtuple_in(p):
    return p.x + p.y, p[0]


def c_namedtuple_make(x):
    p = Point(x=x, y=x + 1)
    return p.y - p.x, p._replace(x=x * 0)


def c_dataclass_in(x, cfg):
    return x * cfg.scale + (1 if cfg.bias else 0)


def c_dataclass_make(x):
    cfg = Cfg(scale=3.0)
    return x * cfg.scale, cfg


def c_object_method(x, h):
    return h.apply(x) + h.double_k


def c_object_new(x):
    h = Holder(x)
    return h.apply(x)


def c_math(x):
    return x * math.sqrt(2.0) + math.pi + math.floor(2.7) + math.log(math.e)


def c_operator(x, y):
    return operator.add(x, y), operator.mul(x, 2), operator.getitem(x, 0), operator.neg(y)


def c_builtins(x):
    n = len([1, 2, 3])
    m = max(3, 4, 1) + min([5, 2]) + abs(-2) + int("3") + round(2.6)
    ok = isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter)
    return x * n + m if ok and all([True, 1]) and not any([0, False]) else x


def c_getattr_builtin(x):
    return torch.relu(x) if hasattr(torch, "relu") else x


def c_fstring_key(x):
    d = {}
    for i in range(2):
        d[f"layer_{i}"] = x * i
    return d


def c_str_methods(x):
    name = "Layer.Norm"
    parts = name.lower().split(".")
    return x * len(parts), "_".join(parts)


def c_kwargs(x, *, scale=2.0, shift=1.0):
    return x * scale + shift


def c_varargs(*xs):
    return sum(xs[1:], xs[0])


def c_kwvarargs(x, **kw):
    return x * kw["a"] + kw.get("b", 0)


def call_with_star(x):
    args = (x, 3)
    kw = {"n": 5}
    return helper(*args[:1], **kw) + helper(*args)


def c_dict_input(d):
    return d["x"] * d["scale"]


def c_list_input(xs):
    return torch.cat(xs) * len(xs)


def c_return_input(x, y):
    return x, y * 1, None, 3, "s"


def c_dtype_device(x):
    y = torch.zeros(2, dtype=x.dtype, device=x.device)
    return y, x.dtype == torch.float32, str(x.device)


def c_no_grad(x, w):
    with torch.no_grad():
        y = x @ w
    return y, (x @ w)


def c_enable_grad(x, w):
    with torch.no_grad():
        with torch.enable_grad():
            y = x @ w
        z = y * 2
    return y, z


def c_set_grad_enabled(x, w):
    with torch.set_grad_enabled(False):
        y = x * w
    return y


def c_is_grad_enabled(x):
    return x * 2 if torch.is_grad_enabled() else x


def c_requires_grad_flow(x, w):
    y = (x * w).sum()
    return y, y.requires_grad


def c_einsum(x, w):
    return torch.einsum("ij,jk->ik", x, w)


def c_where_clamp(x):
    return torch.where(x > 0, x, x * 0.1).clamp(-1, 1), x.clamp_min(0)


def c_comparisons(x, y):
    return x > y, x == y, (x >= 0) & (y <= 0), ~(x < 0)


def c_masked_fill(x):
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
    return x.masked_fill(mask, float("-inf")).softmax(-1)


def c_scalar_tensor_ops(x):
    return 2**x, 1 / (x.abs() + 1), -x, x // 2, x % 3, abs(x)


def c_linear_functional(x, w, b):
    return F.linear(x, w, b).relu()


def c_dropout_eval(x):
    return F.dropout(x, p=0.5, training=False)


def c_layer_norm_fn(x):
    return F.layer_norm(x, (x.shape[-1],))


def c_conv_fn(x, w):
    return F.conv2d(x, w, padding=1).relu()


def c_pool(x):
    return F.max_pool2d(x, 2), F.adaptive_avg_pool2d(x, 1).flatten(1)


def c_attention_fn(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return scores.softmax(-1) @ v


def c_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def c_gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def c_rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def c_rotary(x):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((-x2, x1), dim=-1)


def c_tensor_methods_misc(x):
    return x.flip(0), x.roll(1, 0), x.cumsum(1), x.sort(dim=1).values, x.topk(2).indices, x.expand(2, 4, 4)


def c_tensor_attrs(x):
    return x.T, x.mT, x.is_floating_point(), x.is_contiguous(), x.element_size()


def c_torch_size(x):
    s = x.shape
    return x.reshape(torch.Size([s[0] * s[1], 1])), s[1:], s.numel(), list(s)


def c_nested_calls(x):
    def a(y):
        return b(y) + 1

    def b(y):
        return y * 3

    return a(x) + a(x * 2)


def c_recursion_bounded(x):
    def f(y, n):
        return y if n == 0 else f(y * 2, n - 1)

    return f(x, 3)


def c_default_arg_tensor(x, y=None, alpha=1.0):
    if y is None:
        y = torch.ones_like(x)
    return x + alpha * y


def c_isinstance_tuple(x, pair):
    if isinstance(pair, (tuple, list)):
        return x * pair[0] + pair[1]
    return x


def c_sorted_keys(x):
    d = {"b": 2, "a": 1}
    return [x * d[k] for k in sorted(d)]


def c_ordered_dict(x):
    d = collections.OrderedDict()
    d["z"] = x
    d["y"] = x + 1
    return d


def c_slice_obj(x):
    s = slice(1, 3)
    return x[s], x[:, slice(None, None, 2)]


def c_index_tensor(x):
    idx = torch.tensor([0, 2])
    return x[idx], x.index_select(0, idx), x.gather(1, torch.zeros(4, 1, dtype=torch.long))


def c_bool_mask_where(x):
    return torch.where(x > 0, 1.0, 0.0).sum(0)


def c_int_float_of_const(x):
    n = int(x.shape[0] / 2)
    return x[:n] * float(n), bool(n), str(n)


def c_min_max_shapes(x, y):
    n = min(x.shape[0], y.shape[0])
    return x[:n] + y[:n], max(x.shape)


def c_chained_compare(x):
    n = x.shape[1]
    return x * 2 if 0 < n < 10 else x


def c_any_all_shapes(xs):
    return torch.stack(xs) if all(t.shape == xs[0].shape for t in xs) else xs[0]


def c_map_filter(x):
    vals = list(map(lambda i: x * i, [1, 2, 3]))
    keep = list(filter(lambda i: i % 2 == 1, range(5)))
    return vals, keep


def c_type_check(x):
    return x * 2 if type(x) is torch.Tensor else x


def c_torch_functional_misc(x):
    return (
        torch.flatten(x),
        torch.transpose(x, 0, 1),
        torch.nn.functional.pad(x, (1, 1)),
        torch.outer(x[0], x[1]),
    )


def c_mutate_input_list(xs):
    xs.append(xs[0] * 2)
    return len(xs)


def c_mutate_input_dict(d):
    d["y"] = d["x"] + 1
    del d["x"]
    return d["y"]


def c_inplace_input(x):
    x.mul_(2)
    return x


def c_global_write(x):
    global _LAST
    _LAST = x * 2
    return x


_LAST: Any = None


def c_obj_attr_write(x, h):
    h.w = x + 1
    h.k = 10
    return h.apply(x)


def c_cell_counter(x):
    count = 0

    def bump():
        nonlocal count
        count += 1

    bump()
    bump()
    return x * count


CASES: list[tuple[str, Any, tuple[Any, ...]]] = [
    ("add", c_add, (t(3, 4), t(3, 4))),
    ("chain", c_chain, (t(4, 4),)),
    ("matmul", c_matmul, (t(3, 4), t(4, 5))),
    ("inplace_local", c_inplace_local, (t(3, 4),)),
    ("views", c_views, (t(4, 4),)),
    ("getitem", c_getitem, (t(4, 4),)),
    ("setitem", c_setitem, (t(4, 4),)),
    ("shape_arith", c_shape_arith, (t(4, 6),)),
    ("size_dim", c_size_dim, (t(4, 6),)),
    ("dtype_cast", c_dtype_cast, (t(3, 3),)),
    ("factory", c_factory, (t(3, 4),)),
    ("reductions", c_reductions, (t(4, 5),)),
    ("softmax", c_softmax, (t(3, 5),)),
    ("cat_stack", c_cat_stack, (t(2, 4), t(2, 4))),
    ("split_unpack", c_split_unpack, (t(3, 4),)),
    ("unbind_loop", c_unbind_loop, (t(3, 4),)),
    ("iter_tensor", c_iter_tensor, (t(3, 4),)),
    ("python_loop", c_python_loop, (t(3),)),
    ("while_loop", c_while_loop, (t(3),)),
    ("if_const", c_if_const, (t(3, 2),)),
    ("if_shape", c_if_shape, (t(3, 2),)),
    ("ternary_none", c_ternary_none, (t(3),)),
    ("ternary_none_given", c_ternary_none, (t(3), t(3))),
    ("global_const", c_global_const, (t(3),)),
    ("global_dict", c_global_dict, (t(3, 8),)),
    ("helper", c_helper, (t(3),)),
    ("closure", c_closure, (t(3),)),
    ("lambda", c_lambda, (t(3),)),
    ("nested_closure_write", c_nested_closure_write, (t(3),)),
    ("partial", c_partial, (t(3),)),
    ("partial_torch", c_partial_torch, (t(3),)),
    ("listcomp", c_listcomp, (t(3),)),
    ("dictcomp", c_dictcomp, (t(3),)),
    ("genexpr_sum", c_genexpr_sum, (t(3),)),
    ("zip_enumerate", c_zip_enumerate, (t(2, 3), t(2, 3))),
    ("reversed", c_reversed, (t(3),)),
    ("dict_ops", c_dict_ops, (t(3),)),
    ("list_ops", c_list_ops, (t(3),)),
    ("tuple_ops", c_tuple_ops, (t(3),)),
    ("set_ops", c_set_ops, (t(3),)),
    ("namedtuple_out", c_namedtuple_out, (t(3),)),
    ("namedtuple_in", c_namedtuple_in, (Point(t(3), t(3)),)),
    ("namedtuple_make", c_namedtuple_make, (t(3),)),
    ("dataclass_in", c_dataclass_in, (t(3), Cfg())),
    ("dataclass_make", c_dataclass_make, (t(3),)),
    ("object_method", c_object_method, (t(3), Holder(t(3)))),
    ("object_new", c_object_new, (t(3),)),
    ("math", c_math, (t(3),)),
    ("operator", c_operator, (t(3), t(3))),
    ("builtins", c_builtins, (t(3),)),
    ("getattr_builtin", c_getattr_builtin, (t(3),)),
    ("fstring_key", c_fstring_key, (t(3),)),
    ("str_methods", c_str_methods, (t(3),)),
    ("kwargs", c_kwargs, (t(3),)),
    ("varargs", c_varargs, (t(3), t(3), t(3))),
    ("kwvarargs", lambda x: c_kwvarargs(x, a=2, b=3), (t(3),)),
    ("call_with_star", call_with_star, (t(3),)),
    ("dict_input", c_dict_input, ({"x": t(3), "scale": 3},)),
    ("list_input", c_list_input, ([t(2), t(3)],)),
    ("return_input", c_return_input, (t(3), t(3))),
    ("dtype_device", c_dtype_device, (t(3),)),
    ("no_grad", c_no_grad, (t(2, 3, grad=True), t(3, 2, grad=True))),
    ("enable_grad", c_enable_grad, (t(2, 3, grad=True), t(3, 2, grad=True))),
    ("set_grad_enabled", c_set_grad_enabled, (t(3, grad=True), t(3))),
    ("is_grad_enabled", c_is_grad_enabled, (t(3),)),
    ("requires_grad_flow", c_requires_grad_flow, (t(3), t(3, grad=True))),
    ("einsum", c_einsum, (t(2, 3), t(3, 4))),
    ("where_clamp", c_where_clamp, (t(3, 3),)),
    ("comparisons", c_comparisons, (t(3), t(3))),
    ("masked_fill", c_masked_fill, (t(4, 4),)),
    ("scalar_tensor_ops", c_scalar_tensor_ops, (t(3),)),
    ("linear_functional", c_linear_functional, (t(2, 3), t(4, 3), t(4))),
    ("dropout_eval", c_dropout_eval, (t(3, 3),)),
    ("layer_norm_fn", c_layer_norm_fn, (t(2, 5),)),
    ("conv_fn", c_conv_fn, (t(1, 2, 5, 5), t(3, 2, 3, 3))),
    ("pool", c_pool, (t(1, 2, 4, 4),)),
    ("attention_fn", c_attention_fn, (t(2, 4, 8), t(2, 4, 8), t(2, 4, 8))),
    ("sdpa", c_sdpa, (t(1, 2, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8))),
    ("gelu_tanh", c_gelu_tanh, (t(3, 3),)),
    ("rms_norm", c_rms_norm, (t(2, 6), t(6))),
    ("rotary", c_rotary, (t(2, 6),)),
    ("tensor_methods_misc", c_tensor_methods_misc, (t(4, 4),)),
    ("tensor_attrs", c_tensor_attrs, (t(3, 2),)),
    ("torch_size", c_torch_size, (t(3, 2),)),
    ("nested_calls", c_nested_calls, (t(3),)),
    ("recursion_bounded", c_recursion_bounded, (t(3),)),
    ("default_arg_tensor", c_default_arg_tensor, (t(3),)),
    ("isinstance_tuple", c_isinstance_tuple, (t(3), (2, 3))),
    ("sorted_keys", c_sorted_keys, (t(3),)),
    ("ordered_dict", c_ordered_dict, (t(3),)),
    ("slice_obj", c_slice_obj, (t(4, 4),)),
    ("index_tensor", c_index_tensor, (t(4, 4),)),
    ("bool_mask_where", c_bool_mask_where, (t(3, 3),)),
    ("int_float_of_const", c_int_float_of_const, (t(4, 2),)),
    ("min_max_shapes", c_min_max_shapes, (t(4), t(3))),
    ("chained_compare", c_chained_compare, (t(2, 3),)),
    ("any_all_shapes", c_any_all_shapes, ([t(2), t(2)],)),
    ("map_filter", c_map_filter, (t(2),)),
    ("type_check", c_type_check, (t(2),)),
    ("torch_functional_misc", c_torch_functional_misc, (t(2, 3),)),
    ("inplace_input", c_inplace_input, (t(3),)),
    ("cell_counter", c_cell_counter, (t(3),)),
]


@pytest.mark.parametrize(("name", "fn", "args"), CASES, ids=[c[0] for c in CASES])
def test_function_matches_eager(name: str, fn: Any, args: tuple[Any, ...]) -> None:
    check(fn, *args)


def test_mutate_input_list() -> None:
    check(c_mutate_input_list, [t(3)], state=lambda xs: xs, calls=1)


def test_mutate_input_dict() -> None:
    check(c_mutate_input_dict, {"x": t(3)}, state=lambda d: d, calls=1)


def test_global_write() -> None:
    check(c_global_write, t(3), calls=1)
    eager = t(3) * 2
    torch.testing.assert_close(_LAST, eager)


def test_object_attr_write() -> None:
    check(c_obj_attr_write, t(3), Holder(t(3)), state=lambda x, h: (h.w, h.k), calls=1)


@torch.jit.script
def _scripted_scale(x: torch.Tensor, factor: int) -> torch.Tensor:
    return torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * factor)


def test_scripted_function_is_inlined() -> None:
    """Note [Scripted functions]: a `@torch.jit.script` function called in the frame is traced
    through the Python function it was compiled from (DeBERTa's attention), with no break."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x / _scripted_scale(x, 2)

    x = torch.randn(2, 8)
    torch.testing.assert_close(one_graph(f, x), f(x))
    check(f, x, calls=3)  # one graph, no recompile on the calls after the first

    import scripted_helpers  # a scripted helper read from another module's globals

    check(lambda x: scripted_helpers.attention_scale(scripted_helpers.attention_scale(x)), x, calls=3)


def test_tensor_of_python_numbers_as_a_slice_bound() -> None:
    """Note [Tensors made from Python numbers]: `torch.tensor(n)` of constants carries its value,
    so using it as a slice bound (DeBERTa's attention span) does not break the graph."""

    def f(q: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        span = torch.tensor(min(q.size(-2), 16))
        return emb[16 - span : 16 + span, :] * 2

    q, emb = torch.randn(2, 8, 4), torch.randn(32, 4)
    torch.testing.assert_close(one_graph(f, q, emb), f(q, emb))
    check(f, q, emb, calls=3)


def _branch_on_lazy_bits(z: torch.Tensor) -> torch.Tensor:
    y = z.conj()
    n = torch._neg_view(z)
    return (
        (y * 2 if y.is_conj() else y * 3) + (n * 5 if n.is_neg() else n * 7) + (z * 11 if z.is_conj() else z)
    )


def test_lazy_conj_and_neg_bits_are_the_meta_tensors() -> None:
    """Note [Lazy bits of fake tensors] (fake.py): the fake wrapper of `z.conj()` answered
    `is_conj()` False, and the branch took eager's other side."""
    check(_branch_on_lazy_bits, torch.randn(3, 4, dtype=torch.complex64))


def _lazy_bits_after_resolving(z: torch.Tensor) -> Any:
    y = z.conj()
    n = torch._neg_view(z.real)
    return (
        y.resolve_conj().is_conj(),
        y[0].is_conj(),
        y.clone().is_conj(),
        (y + 0).is_conj(),
        n.resolve_neg().is_neg(),
        torch._neg_view(n).is_neg(),
        torch.view_as_real(y.resolve_conj()) * 2,
    )


def test_lazy_bits_of_fakes_follow_eager() -> None:
    """Note [Lazy bits of fake tensors]: `z.conj().resolve_conj()` returned the view itself on
    fakes, and `is_conj()` read from its meta tensor answered True where eager answers False."""
    z = torch.randn(3, 4, dtype=torch.complex64)
    fake = call_fake(lambda t: (t.conj(), torch._neg_view(t)), from_real(z))
    assert (fake[0].is_conj(), fake[0].is_neg(), fake[1].is_conj(), fake[1].is_neg()) == (
        True,
        False,
        False,
        True,
    )
    check(_lazy_bits_after_resolving, z)


def test_conjugate_view_passed_in_reads_as_one() -> None:
    """A real conjugate view passed in: its fake had no bit, so `z.is_conj()` was False while
    tracing and the branch took eager's other side (a wrong answer)."""

    def f(z: torch.Tensor) -> Any:
        return (z * 2 if z.is_conj() else z * 3) + 1, z.is_conj(), z.resolve_conj().is_conj()

    z = torch.randn(3, 4, dtype=torch.complex64)
    check(f, z.conj())
    kiln_dynamo.reset()
    compiled = kiln_dynamo.compile(f)
    for arg in (z.conj(), z, torch._neg_view(z)):
        assert_same(f(arg), compiled(arg))


def _scaled_add(x: torch.Tensor, y: torch.Tensor, *, alpha: float = 1.0) -> torch.Tensor:
    return x + alpha * y.sin()


def test_a_partial_compiles_the_function_it_wraps() -> None:
    """Note [Compiling a partial]: the partial's bound tensor and keyword reach the frame as
    arguments; a new partial over the same function with another keyword is guarded apart."""
    kiln_dynamo.reset()
    backend = CountingBackend()
    y = t(3, 4)
    part = functools.partial(_scaled_add, y=y, alpha=2.0)
    compiled = kiln_dynamo.compile(part, backend)
    x = t(3, 4)
    assert_same(compiled(x), part(x))
    assert_same(compiled(x + 1), part(x + 1))
    assert backend.graphs == 1
    other = kiln_dynamo.compile(functools.partial(_scaled_add, y=y, alpha=-3.0), backend)
    assert_same(other(x), _scaled_add(x, y, alpha=-3.0))
    nested = kiln_dynamo.compile(functools.partial(functools.partial(_scaled_add, x), alpha=0.5), backend)
    assert_same(nested(y), _scaled_add(x, y, alpha=0.5))


def test_a_callable_without_a_python_frame_is_refused_clearly() -> None:
    with pytest.raises(TypeError, match="runs no Python frame"):
        kiln_dynamo.compile(torch.sin, CountingBackend())
