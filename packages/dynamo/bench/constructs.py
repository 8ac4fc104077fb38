# ruff: noqa: E741, E742, UP031, UP036, PLR0124, B007, B028, RUF005, RUF015 - user code as users write it
"""Real-world Python constructs, one small function each: graphs and breaks from `kiln_dynamo.explain`.

Run: python packages/dynamo/bench/constructs.py [--torch] [name ...]

`--torch` also runs each case through `torch._dynamo.explain` (torch.compile's capture, eager
backend) and prints a table of every case not at one graph in either, kiln's graphs/breaks/frames
left to Python beside torch.compile's graphs/breaks, and the cases where kiln breaks more (more
breaks, or the frame left to Python where torch.compile captured a graph).

Each case is the kind of Python that model code writes (containers, itertools, sorting, string
and math helpers, classes, context managers, numpy, module building). The table lists the cases
that are not one graph with no break, with the reasons, and any case whose result differs from
eager's (types compared, tensors with allclose). A benchmark of capture breadth (issue 16), not
a test: some cases break by design (inference_mode, optimizer steps, modules built in the frame).
"""

import collections
import contextlib
import dataclasses
import enum
import faulthandler
import functools
import itertools
import math
import operator
import os
import typing

import numpy as np
import torch
from torch import nn

import kiln_dynamo

cases = {}


def case(*args):
    def deco(fn):
        cases[fn.__name__] = (fn, args)
        return fn

    return deco


x = torch.randn(4, 8)


@case(x)
def sorted_key(x):
    d = {"b": x, "a": x * 2}
    return sum(v for k, v in sorted(d.items(), key=lambda kv: kv[0]))


@case(x)
def list_sort(x):
    l = [3, 1, 2]
    l.sort(reverse=True)
    return x * l[0]


@case(x)
def itertools_stuff(x):
    out = []
    for a, b in itertools.product([1, 2], [3]):
        out.append(x * a + b)
    for a, b in itertools.pairwise(list(out)):
        out.append(a - b)
    acc = list(itertools.accumulate([1, 2, 3]))
    ch = list(itertools.chain.from_iterable([[x], [x]]))
    return sum(out) + acc[-1] + ch[0], list(itertools.islice(itertools.count(), 3))


@case(x)
def reduce_partial(x):
    f = functools.partial(torch.add, alpha=2)
    return functools.reduce(operator.add, [x, x, x]) + f(x, x)


@case(x)
def defaultdict_use(x):
    d = collections.defaultdict(list)
    d["a"].append(x)
    d["b"].append(x * 2)
    return torch.cat(d["a"] + d["b"])


@case(x)
def counter_deque(x):
    c = collections.Counter("aab")
    q = collections.deque([x, x + 1], maxlen=2)
    q.append(x + 2)
    return q[0] * c["a"]


@case(x)
def namedtuple_ret(x):
    P = collections.namedtuple("P", "a b")
    return P(x, x + 1)


@dataclasses.dataclass
class Cfg:
    scale: float = 2.0
    bias: int = 1


@case(x)
def dataclass_in_frame(x):
    c = Cfg(scale=3.0)
    c2 = dataclasses.replace(c, bias=2)
    return x * c.scale + c2.bias, dataclasses.asdict(c)


@case(x)
def fstring_and_format(x):
    name = f"layer_{x.shape[0]}"
    return x * len(name), f"{1}-{2}", "%d" % 3


@case(x)
def str_methods(x):
    s = "a.b.c"
    parts = s.split(".")
    return x * len(parts), "_".join(parts).upper(), s.startswith("a"), s.replace(".", "")


@case(x)
def math_mix(x):
    return (
        x * math.sqrt(x.shape[-1])
        + math.pi
        + math.log(2)
        + round(2.6)
        + abs(-3)
        + divmod(7, 2)[0]
        + min(3, 4)
        + max([1, 5])
    )


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@case(x)
def enum_use(x):
    c = Color.RED
    if c is Color.RED:
        return x * c.value
    return x


@case(x)
def try_except_keyerror(x):
    d = {"a": 1}
    try:
        v = d["b"]
    except KeyError:
        v = 2
    return x * v


@case(x)
def isinstance_checks(x):
    return (
        x * (2 if isinstance(x, torch.Tensor) and isinstance(3, (int, float)) else 1),
        callable(len),
        hasattr(x, "shape"),
    )


@case(x)
def numpy_const(x):
    a = np.arange(4).sum()
    return x * float(a) + np.float32(2.0)


@case(x)
def numpy_roundtrip(x):
    return torch.from_numpy(x.numpy() * 2)


@case(x)
def set_ops(x):
    s = {1, 2} | {3}
    return x * len(s), 2 in s, sorted(s - {1})


@case(x)
def global_config_os(x):
    v = os.environ.get("KILN_NOT_SET_XYZ", "1")
    return x * int(v), os.path.join("a", "b"), os.path.basename("/a/b.c")


@case(x)
def generator_expr_any(x):
    vals = [x, x * 2]
    return any(v.shape[0] > 3 for v in vals), all(v.dim() == 2 for v in vals), sum(v.sum() for v in vals)


@case(x)
def zip_strict_reversed(x):
    out = x
    for a, b in zip(reversed([1, 2]), [3, 4], strict=True):
        out = out + a * b
    return out


@case(x)
def dict_methods(x):
    d = {"a": x}
    d.update(b=x + 1)
    d.setdefault("c", x + 2)
    p = d.pop("a")
    return p + d["b"] + d.get("z", x), list(d), d | {"q": 1}


@case(x)
def slices_and_unpack(x):
    a, *rest = [1, 2, 3]
    first, second = x.chunk(2, dim=1)
    return first * a + second * rest[-1], x[..., ::2], x[:, None].shape


@case(x)
def type_checks(x):
    return type(x).__name__, x.dtype is torch.float32, x.dtype.is_floating_point, torch.finfo(x.dtype).eps * x


@case(x)
def tensor_methods_python(x):
    return x.size(0) * x, x.shape[-1], x.numel(), x.ndim, len(x), x.tolist()[0][0] if False else 1


@case(x)
def walrus_and_ternary(x):
    if (n := x.shape[0]) > 2:
        return x * n
    return x


@case(x)
def string_dict_key_format(x):
    d = {f"k{i}": x * i for i in range(3)}
    return d["k2"], list(d.keys())


@case(x)
def nested_closure(x):
    scale = 2

    def inner(y):
        return y * scale

    def outer(y):
        return inner(y) + 1

    return outer(x)


@case(x)
def lambda_map_filter(x):
    return list(map(lambda t: t * 2, [x, x])), list(filter(lambda i: i % 2, range(5)))


class WithProp(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    @property
    def scale(self):
        return 2.0

    def forward(self, x):
        return self.lin(x) * self.scale


@case(x)
def module_property(x):
    return WithProp()(x)


@case(x)
def super_call_chain(x):
    class A(nn.Module):
        def forward(self, x):
            return x + 1

    class B(A):
        def forward(self, x):
            return super().forward(x) * 2

    return B()(x)


@case(x)
def torch_no_grad_decorator(x):
    @torch.no_grad()
    def f(y):
        return y * 2

    return f(x)


@case(x)
def contextlib_suppress(x):
    with contextlib.suppress(KeyError):
        x = x + {}["a"]
    return x


@case(x)
def exception_raise_catch_custom(x):
    class MyErr(Exception):
        pass

    try:
        raise MyErr("boom")
    except MyErr as e:
        msg = str(e)
    return x * len(msg)


@case(x)
def assert_stmt(x):
    assert x.dim() == 2, "need 2d"
    return x + 1


@case(x)
def typing_cast(x):
    y = typing.cast(torch.Tensor, x)
    return y * 2


@case(x)
def int_float_conversion(x):
    return x * int(3.7) + float("1.5") + bool(1), str(3), int("4")


@case(x)
def chained_comparison(x):
    n = x.shape[0]
    return x * (1 if 0 < n < 10 else 2)


@case(x)
def tuple_compare_sort(x):
    items = sorted([(2, "b"), (1, "a")])
    return x * items[0][0], max(items, key=lambda t: t[0])


@case(x)
def inference_mode(x):
    with torch.inference_mode():
        y = x * 2
    return y


@case(x)
def getattr_default_builtin(x):
    class C:
        pass

    c = C()
    c.a = 1
    return x * getattr(c, "a", 0) + getattr(c, "b", 5), hasattr(c, "z"), vars(c)


@case(x)
def id_and_hash(x):
    return x * (hash("a") == hash("a")), id(x) == id(x)


@case(x)
def bytes_and_ord(x):
    return x * ord("a"), chr(98), b"ab".decode()


@case(x)
def list_index_count(x):
    l = [1, 2, 2, 3]
    return x * l.index(3) + l.count(2), l[::-1], l.copy()


@case(x)
def sum_of_tensors_start(x):
    return sum([x, x], torch.zeros_like(x))


@case(x)
def print_free(x):
    import logging

    logging.getLogger("quiet_probe").debug("x %s", x.shape)
    return x + 1


@case(x)
def warnings_warn(x):
    import warnings

    warnings.warn("careful")
    return x + 1


@case(x)
def random_python(x):
    import random

    random.seed(0)
    return x * random.random()


@case(x)
def frozenset_and_in(x):
    fs = frozenset({"a", "b"})
    return x * ("a" in fs), len(fs)


@case(x)
def slice_object(x):
    s = slice(0, 2)
    return x[s], s.start


@case(x)
def class_attr_counter(x):
    class K:
        n = 0

    K.n += 1
    return x * K.n


@case(x)
def all_any_tensor(x):
    return torch.all(x > -100), bool((x > -100).all())


@case(x)
def functools_wraps_decorator(x):
    def deco(f):
        @functools.wraps(f)
        def w(*a, **k):
            return f(*a, **k) + 1

        return w

    @deco
    def g(y):
        return y * 2

    return g(x), g.__name__


@case(x)
def lru_cached_helper(x):
    return x * _cached(3)


@functools.cache
def _cached(n):
    return n * 2


@case(x)
def builtin_iter_next(x):
    it = iter([x, x * 2])
    a = next(it)
    b = next(it, None)
    c = next(it, None)
    return a + b, c


@case(x)
def string_in_tensor_repr(x):
    return x + 1, repr(3), str([1, 2])


@case(x)
def dict_keys_views(x):
    d = {"a": 1, "b": 2}
    return x * len(d.keys() & {"a"}), list(d.values()), list(reversed(d))


@case(x)
def ordered_dict_move(x):
    od = collections.OrderedDict(a=1, b=2)
    od.move_to_end("a")
    return x * next(iter(od.values())), list(od)


@case(x)
def chainmap(x):
    cm = collections.ChainMap({"a": 1}, {"b": 2})
    return x * cm["b"]


@case(x)
def super_init_dataclass_frozen(x):
    @dataclasses.dataclass(frozen=True)
    class F:
        a: int

    f = F(3)
    return x * f.a, f


@case(x)
def named_tuple_typing(x):
    class NT(typing.NamedTuple):
        a: torch.Tensor
        b: int

    nt = NT(x, 2)
    return nt.a * nt.b, nt._replace(b=3), nt._asdict()


@case(x)
def bisect_heapq(x):
    import bisect
    import heapq

    h = [3, 1, 2]
    heapq.heapify(h)
    return x * heapq.heappop(h) + bisect.bisect_left([1, 3, 5], 4)


@case(x)
def copy_module(x):
    import copy

    l = [x]
    l2 = copy.copy(l)
    return l2[0] * 2, copy.deepcopy({"a": 1})


@case(x)
def torch_dtype_promote(x):
    return x.to(torch.float64) + torch.tensor(1, dtype=torch.int32), torch.promote_types(
        torch.int32, torch.float32
    )


@case(x)
def tensor_item_in_python_cond(x):
    return x * (2 if x.shape[1] % 2 == 0 else 3)


@case(x)
def inspect_signature(x):
    import inspect

    sig = inspect.signature(lambda a, b=2: None)
    return x * len(sig.parameters)


@case(x)
def string_formatting_methods(x):
    return x * 1, "abc".center(7, "*"), "a,b".partition(","), "x".zfill(3), "A".lower().strip()


@case(x)
def sys_version_check(x):
    import sys

    if sys.version_info >= (3, 8):
        return x * 2
    return x


@case(x)
def torch_version_check(x):
    from packaging import version

    if version.parse(torch.__version__) >= version.parse("2.0"):
        return x * 2
    return x


@case(x)
def is_compiling_checks(x):
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return x
    if torch.compiler.is_compiling():
        return x * 3
    return x * 2


@case(x)
def weakref_use(x):
    import weakref

    class O:
        pass

    o = O()
    r = weakref.ref(o)
    return x * (r() is o)


@case(x)
def re_module(x):
    import re

    m = re.match(r"layer_(\d+)", "layer_12")
    return x * int(m.group(1))


@case(x)
def setattr_on_self_obj(x):
    class S:
        pass

    s = S()
    s.v = x * 2
    return s.v, s


@case(x)
def complex_slicing_assign(x):
    y = x.clone()
    y[:, :2] = 0
    y[y > 1] = 1
    return y


@case(x)
def global_counter_mutation(x):
    global _COUNT
    _COUNT += 1
    return x * _COUNT


_COUNT = 0


@case(x)
def yield_from_generator(x):
    def gen():
        yield x
        yield x * 2

    return sum(gen()), list(enumerate(gen()))[1][0]


@case(x)
def star_args_kwargs(x):
    def f(*a, **k):
        return sum(a) + k.get("z", 0)

    return f(*[x, x], **{"z": 1})


@case(x)
def dict_of_modules(x):
    m = nn.ModuleDict({"a": nn.Linear(8, 8), "b": nn.ReLU()})
    for k, mod in m.items():
        x = mod(x)
    return x, list(m.keys())


@case(x)
def parameter_list(x):
    pl = nn.ParameterList([nn.Parameter(torch.ones(8)), nn.Parameter(torch.ones(8) * 2)])
    for p in pl:
        x = x * p
    return x, len(pl)


@case(x)
def module_apply_children(x):
    m = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 4)))
    n = sum(1 for _ in m.modules()) + len(list(m.children())) + sum(p.numel() for p in m.parameters())
    return m(x) * n, [name for name, _ in m.named_modules()]


@case(x)
def rnn_cells(x):
    cell = nn.GRUCell(8, 8)
    h = torch.zeros(4, 8)
    for _ in range(2):
        h = cell(x, h)
    return h


@case(x)
def checkpoint_use(x):
    from torch.utils.checkpoint import checkpoint

    lin = nn.Linear(8, 8)
    return checkpoint(lambda t: lin(t).relu(), x, use_reentrant=False)


@case(x)
def train_eval_switch(x):
    m = nn.Sequential(nn.Dropout(0.5), nn.Linear(8, 8))
    m.eval()
    y = m(x)
    m.train()
    return y, m.training


@case(x)
def optimizer_step(x):
    lin = nn.Linear(8, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    loss = lin(x).sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(lin.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    return lin.weight


@case(x)
def einops_like_reshape(x):
    b, n = x.shape
    return x.view(b, 2, n // 2).permute(0, 2, 1).reshape(b, -1)


@case(x)
def tensor_bool_python_ops(x):
    flags = [True, False]
    return x * sum(flags), not flags[1], flags[0] and x.shape[0]


@case(x)
def nonlocal_mutation(x):
    count = 0

    def bump():
        nonlocal count
        count += 1

    bump()
    bump()
    return x * count


@case(x)
def tensor_iter(x):
    return [r * 2 for r in x][0], tuple(x.unbind(0))[1]


@case(x)
def torch_size_ops(x):
    s = x.shape
    return torch.Size([s[0], 2]), s[1:], s + (1,), list(s), s.numel()


@case(x)
def dtype_from_string(x):
    return x.to(torch.float16), torch.get_default_dtype()


@case(x)
def math_isclose_inf(x):
    return x * (1 if math.isfinite(2.0) else 0) + (math.inf > 1), float("inf")


@case(x)
def tensor_new_methods(x):
    return x.new_zeros(2, 3), x.new_full((2,), 3.0), x.new_tensor([1.0, 2.0]), torch.full_like(x, 2)


@case(x)
def torch_functional_pad_interp(x):
    import torch.nn.functional as F

    y = x.view(1, 1, 4, 8)
    return (
        F.interpolate(y, scale_factor=2, mode="nearest"),
        F.pad(y, (1, 1)),
        F.one_hot(torch.tensor([1, 2]), 4),
    )


@case(x)
def tensor_data_ptr_is(x):
    y = x.view(-1)
    return y.data_ptr() == x.data_ptr(), x.is_contiguous(), x.stride()


@case(x)
def dict_comprehension_items_sorted(x):
    d = {"b": x, "a": x * 2}
    return {k: v + 1 for k, v in sorted(d.items())}


@case(x)
def while_loop_python_counter(x):
    i = 0
    while i < 3:
        x = x * 2
        i += 1
    return x


@case(x)
def for_else_break(x):
    for i in range(5):
        if i == 2:
            break
    else:
        i = -1
    return x * i


@case(x)
def list_extend_insert_remove(x):
    l = [x]
    l.extend([x * 2])
    l.insert(0, x * 3)
    l.pop(1)
    del l[0]
    return l


@case(x)
def unicode_and_strs(x):
    return x * len("héllo".encode()), "a" * 3, "abc"[::-1]


@case(x)
def int_bit_ops(x):
    n = 6
    return x * (n & 3 | 8 ^ 1) + (n << 1) + (n >> 1), (5).bit_length(), pow(2, 3, 5)


@case(x)
def complex_numbers(x):
    c = complex(1, 2)
    return x * abs(c), c.real


@case(x)
def tensor_hooks_registration(x):
    y = x.clone().requires_grad_()
    return y * 2


@case(x)
def torch_manual_seed_rand(x):
    torch.manual_seed(0)
    return x + torch.rand(4, 8)


@case(x)
def rng_state_fork(x):
    with torch.random.fork_rng():
        torch.manual_seed(1)
        r = torch.rand(1)
    return x * r


@case(x)
def attr_of_functions(x):
    def f():
        pass

    return x * (f.__name__ == "f"), f.__qualname__


@case(x)
def class_method_static(x):
    class U:
        k = 2

        @classmethod
        def make(cls):
            return cls.k

        @staticmethod
        def s():
            return 3

    return x * U.make() + U.s()


@case(x)
def property_setter_obj(x):
    class P:
        def __init__(self):
            self._v = 1

        @property
        def v(self):
            return self._v

        @v.setter
        def v(self, val):
            self._v = val

    p = P()
    p.v = 3
    return x * p.v


@case(x)
def dunder_methods_user_class(x):
    class V:
        def __init__(self, t):
            self.t = t

        def __add__(self, o):
            return V(self.t + o.t)

        def __len__(self):
            return 2

        def __getitem__(self, i):
            return self.t * i

        def __contains__(self, i):
            return True

        def __iter__(self):
            return iter([self.t])

        def __bool__(self):
            return True

        def __call__(self, y):
            return y + self.t

    v = V(x) + V(x)
    return v[2], len(v), 1 in v, list(v)[0], v(x), bool(v)


@case(x)
def abc_and_iterable_check(x):
    import collections.abc as cabc

    return x * isinstance([1], cabc.Sequence) + isinstance({}, cabc.Mapping)


@case(x)
def tensor_type_methods(x):
    return x.type(torch.float64), x.is_floating_point(), x.element_size(), x.dim()


def _same(a, b):
    if type(a).__qualname__ != type(b).__qualname__:  # a class made in the frame is new per call
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a, b, equal_nan=True)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return True


def main():
    import contextlib as cl
    import io
    import sys
    import warnings

    with_torch = "--torch" in sys.argv[1:]
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    bad, wrong = [], []
    rows = []  # (name, kiln graphs, kiln breaks, kiln frames in Python, torch graphs, torch breaks)
    for name, (fn, args) in cases.items():
        if only and name not in only:
            continue
        faulthandler.dump_traceback_later(60, exit=True)
        try:
            with cl.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(0)
                want = fn(*args)
                kiln_dynamo.reset()
                torch.manual_seed(0)
                r = kiln_dynamo.explain(fn)(*args)
        except Exception as e:
            bad.append(name)
            print(f"{name}: raised {type(e).__name__}: {str(e)[:200]}")
            continue
        finally:
            faulthandler.cancel_dump_traceback_later()
        # is_compiling() answers True under capture, as under torch.compile; global/rng state moves per call
        if name not in (
            "is_compiling_checks",
            "random_python",
            "torch_manual_seed_rand",
            "global_counter_mutation",
        ) and not _same(r.result, want):
            wrong.append(name)
            print(f"{name}: RESULT DIFFERS FROM EAGER")
        if r.graph_count != 1 or r.break_reasons:
            bad.append(name)
            print(
                f"{name}: graphs={r.graph_count}",
                "; ".join(str(b).splitlines()[0][:200] for b in r.break_reasons),
            )
        if with_torch:
            plain = sum(1 for b in r.break_reasons if str(b).startswith("runs as plain Python"))
            rows.append((name, r.graph_count, len(r.break_reasons) - plain, plain, *_torch_counts(fn, args)))
    print(f"{len(cases)} cases, {len(bad)} not one graph with no break, {len(wrong)} differ from eager")
    if with_torch:
        _print_torch_table(rows)


def _torch_counts(fn, args):
    """torch.compile's graphs and breaks for one case (`torch._dynamo.explain`), (-1, -1) if it raised."""
    import contextlib as cl
    import io
    import warnings

    import torch._dynamo

    torch._dynamo.reset()
    try:
        with cl.redirect_stdout(io.StringIO()), cl.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            tex = torch._dynamo.explain(fn)(*args)
        # a break at the frame's last statement leaves no graph after it, and torch's
        # graph_break_count does not count it; its break_reasons do
        return tex.graph_count, max(tex.graph_break_count, len(tex.break_reasons))
    except Exception:
        return -1, -1
    finally:
        torch._dynamo.reset()


def _print_torch_table(rows):
    """Rows not at 1 graph / 0 breaks in kiln or torch.compile; kiln's frames in Python count as
    breaks of their own (a frame torch.compile splits, kiln may run whole as Python)."""
    print(f"\n{'case':<32} kiln g/b/py  torch g/b")
    worse = []
    for name, kg, kb, kp, tg, tb in rows:
        if (kg, kb, kp) == (1, 0, 0) and (tg, tb) == (1, 0):
            continue
        # worse: more breaks, or a frame left to Python (no graph) where torch.compile made graphs
        # (no graph in either: both ran the frame as Python, whatever kiln's count of it says)
        more = tb >= 0 and ((kb + kp > tb and (kg, tg) != (0, 0)) or (kg == 0 and tg > 0))
        if more:
            worse.append(name)
        note = "kiln breaks more" if more else "torch.compile raised" if tb < 0 else ""
        t = f"{tg}/{tb}" if tb >= 0 else "-"
        print(f"{name:<32} {kg:>4}/{kb}/{kp:<4} {t:>6}    {note}")
    one_k = sum(1 for r in rows if r[1:4] == (1, 0, 0))
    one_t = sum(1 for r in rows if r[4:6] == (1, 0))
    print(
        f"{len(rows)} cases: kiln at 1/0/0 in {one_k}, breaks {sum(r[2] for r in rows)},"
        f" frames in Python {sum(r[3] for r in rows)}; torch.compile at 1/0 in {one_t},"
        f" breaks {sum(max(r[5], 0) for r in rows)}; kiln breaks more in {len(worse)}: {', '.join(worse)}"
    )


if __name__ == "__main__":
    main()
