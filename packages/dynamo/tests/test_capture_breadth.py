"""Constructs that architectures added to the breadth suite in its thirteenth session reach
(`bench/breadth_models.py`): registries keyed by classes (torch's pytree, Note [Classes as dict
keys]), dict subclasses with their own subscript (transformers' ACT2FN, Note [A dict subclass's
own subscript]), each compared with eager and counted (graphs, breaks, recompiles)."""

from __future__ import annotations

import collections
import collections.abc
import inspect
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import CountingBackend, assert_same, check
from torch import nn

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(5 * sum(shape) + 2)
    return torch.randn(*shape, generator=g)


class Leaf:
    pass


class Other:
    pass


REGISTRY: dict[type, str] = {tuple: "tuple", list: "list", torch.Tensor: "tensor", Leaf: "leaf"}


def by_class(x: torch.Tensor, y: Any) -> Any:
    out = x
    for v in (x, [x], (x,), Leaf(), 3):
        if type(v) in REGISTRY:
            out = out + len(REGISTRY[type(v)])
    keys = list(REGISTRY)
    return out, REGISTRY.get(type(y), "none"), keys[0] is tuple, [k.__name__ for k in REGISTRY], keys[3]()


def test_dict_keyed_by_classes_is_one_graph() -> None:
    """Note [Classes as dict keys]: lookups by `type(v)`, `get`, iteration over the keys (a key
    called builds the class)."""
    check(by_class, t(3), [1])
    got = kiln_dynamo.explain(by_class)(t(3), (1,))
    assert got.graph_count == 1 and got.break_reasons == [], got
    assert got.result[1] == "tuple" and type(got.result[4]) is Leaf


def test_a_class_key_is_guarded() -> None:
    """The argument's type is guarded (a new type recompiles), and so are the registry's keys: a
    class registered after the capture is seen."""
    backend = CountingBackend()
    f = kiln_dynamo.compile(by_class, backend=backend)
    x = t(3)
    assert_same(f(x, [1]), by_class(x, [1]))
    assert_same(f(x, (1,)), by_class(x, (1,)))
    assert f(x, Other())[1] == "none"
    REGISTRY[Other] = "other"
    try:
        assert_same(f(x, Other()), by_class(x, Other()))
        assert f(x, Other())[1] == "other"
    finally:
        del REGISTRY[Other]
    assert f(x, Other())[1] == "none"
    assert backend.graphs >= 4


def pytree_of(x: torch.Tensor, y: torch.Tensor) -> Any:
    tree = ((x, [y]), {"a": x * 2, "b": (3, None)})
    leaves = torch.utils._pytree.tree_leaves(tree)
    return [leaf if leaf is None else leaf + 1 for leaf in leaves], torch.utils._pytree.tree_is_leaf(x)


def test_torch_pytree_leaves_is_one_graph() -> None:
    """torch.utils._pytree reads its node registry (a dict keyed by classes, and by the
    `namedtuple` function) for every node."""
    check(pytree_of, t(2), t(3))


class Instantier(collections.OrderedDict):
    """transformers' ClassInstantier, written out: a subscript builds the registered module."""

    def __getitem__(self, key: str) -> Any:
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


ACTS = Instantier({"relu": nn.ReLU, "leaky": (nn.LeakyReLU, {"negative_slope": 0.25}), "tanh": nn.Tanh})


def activations(x: torch.Tensor, name: str) -> Any:
    y = ACTS[name](x) + ACTS["leaky"](x)
    # `get`, `in` and `len` do not go through `__getitem__` in CPython: the raw entries
    return y, ACTS.get("relu") is nn.ReLU, "tanh" in ACTS, len(ACTS), ACTS.get("leaky")[1]


def test_a_dict_subclass_with_its_own_subscript_is_inlined() -> None:
    """Note [A dict subclass's own subscript]: the override runs at `d[k]` (building a torch.nn
    module, Note [Modules made in the frame]), dict's behaviour everywhere else."""
    check(activations, t(5), "relu")
    check(activations, t(5), "tanh")


def test_the_entries_behind_an_own_subscript_are_guarded() -> None:
    backend = CountingBackend()
    f = kiln_dynamo.compile(activations, backend=backend)
    x = t(5)
    assert_same(f(x, "relu"), activations(x, "relu"))
    dict.__setitem__(ACTS, "relu", nn.Sigmoid)  # what the guard reads is the raw entry
    try:
        assert_same(f(x, "relu"), activations(x, "relu"))
        torch.testing.assert_close(f(x, "relu")[0], torch.sigmoid(x) + F.leaky_relu(x, 0.25))
    finally:
        dict.__setitem__(ACTS, "relu", nn.ReLU)
    assert backend.graphs == 2


class Doubling(dict):
    """An override whose answer differs from the raw entry: a subscript must not bypass it."""

    def __getitem__(self, key: str) -> Any:
        return super().__getitem__(key) * 2


SCALES = Doubling({"a": 1.5, "b": 3})


def doubled(x: torch.Tensor) -> Any:
    return x * SCALES["a"] + SCALES["b"], SCALES.get("a"), SCALES.__getitem__("b")


def test_an_override_is_never_bypassed() -> None:
    check(doubled, t(4))
    assert doubled(t(4))[1:] == (1.5, 6)


def transformers_activations(x: torch.Tensor, name: str) -> torch.Tensor:
    from transformers.activations import ACT2FN

    return ACT2FN[name](x) + ACT2FN["gelu_new"](x) + ACT2FN["gelu_10"](x)


@pytest.mark.parametrize("name", ["silu", "gelu", "relu", "quick_gelu"])
def test_transformers_act2fn_in_a_forward_is_one_graph(name: str) -> None:
    """mamba's, jamba's and lfm2's convolutions and deberta's pooler call `ACT2FN[name](x)` in
    their forward: the registry's subscript and the activation module it builds are traced."""
    pytest.importorskip("transformers")
    check(transformers_activations, t(6), name)


class Counted(nn.Module):
    made = 0

    def __init__(self) -> None:
        super().__init__()
        Counted.made += 1  # eager counts every construction: built while tracing it would not

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def build_user_module(x: torch.Tensor) -> torch.Tensor:
    return Counted()(x)


def test_a_user_module_built_in_the_frame_still_breaks() -> None:
    """Note [Modules made in the frame], which classes: a user's constructor may have effects
    (a counter here) that building once while tracing would not repeat."""
    report = kiln_dynamo.explain(build_user_module)(t(3))
    assert any("constructing Counted inside the frame" in r.reason for r in report.break_reasons)
    before = Counted.made
    kiln_dynamo.compile(build_user_module, backend=CountingBackend())(t(3))
    assert Counted.made == before + 1


class Swish(nn.Module):
    """Adds only methods to nn.Module (Note [User modules with torch's constructor])."""

    beta = 1.5  # a plain class attribute nn.Module does not have

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.beta * x) + self.shift(x)

    def shift(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0 + 1


class GatedSiLU(nn.SiLU):  # a torch.nn class with its own constructor arguments
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def build_swish(x: torch.Tensor) -> Any:
    act = Swish()
    gated = GatedSiLU(inplace=False)
    return act(x) + gated(x), act.training, type(act).__name__


def test_a_user_module_that_adds_only_methods_is_built_in_the_frame() -> None:
    """Note [User modules with torch's constructor]: one graph, no break, eager's values."""
    check(build_swish, t(3, 4))
    got = kiln_dynamo.explain(build_swish)(t(3, 4))
    assert (got.graph_count, got.break_reasons) == (1, []), got
    assert_same(got.result, build_swish(t(3, 4)))


def build_and_return(x: torch.Tensor) -> Any:
    m = Swish()
    return m(x), m


def test_a_user_module_built_in_the_frame_leaves_it_rebuilt() -> None:
    """Leaving the frame, it is built again by the runner, a new module per call as in eager."""
    kiln_dynamo.reset()
    f = kiln_dynamo.compile(build_and_return, backend=CountingBackend())
    y1, m1 = f(t(2, 3))
    _, m2 = f(t(2, 3))
    assert type(m1) is Swish and type(m2) is Swish and m1 is not m2 and m1.training
    torch.testing.assert_close(y1, build_and_return(t(2, 3))[0])


def test_a_user_modules_forward_is_guarded() -> None:
    """The class's `forward` is read through a guarded class attribute: replacing it recompiles."""
    kiln_dynamo.reset()
    backend = CountingBackend()
    f = kiln_dynamo.compile(build_swish, backend=backend)
    x = t(3, 4)
    f(x)
    old = Swish.forward
    try:
        Swish.forward = lambda self, x: x * 10  # type: ignore[method-assign]
        assert_same(f(x), build_swish(x))
    finally:
        Swish.forward = old  # type: ignore[method-assign]
    assert backend.graphs == 2
    assert_same(f(x), build_swish(x))


def build_local_chain(x: torch.Tensor) -> Any:
    class A(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    class B(A):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    return B()(x)


def local_module_leaves(x: torch.Tensor) -> Any:
    class C(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x - 1

    c = C()
    return c(x), c


def test_a_module_class_defined_in_the_frame() -> None:
    """A module class defined in the frame is built too (`super()` through its own cell); an
    instance of it may not leave the frame (eager makes a new class per call): a break there,
    with eager's values."""
    check(build_local_chain, t(4))
    got = kiln_dynamo.explain(local_module_leaves)(t(4))
    assert any("defined in the frame, cannot leave it" in r.reason for r in got.break_reasons), got
    want = local_module_leaves(t(4))
    torch.testing.assert_close(got.result[0], want[0])
    assert type(got.result[1]).__qualname__ == type(want[1]).__qualname__


class Noted(nn.ReLU):
    stores = 0

    @property
    def inplace(self) -> bool:
        return False

    @inplace.setter
    def inplace(self, value: bool) -> None:
        Noted.stores += 1  # ReLU's constructor stores `inplace`: user code runs


class OwnCall(nn.Module):
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 5


class TrainingFlagMixin:
    sets = 0

    @property
    def training(self) -> bool:
        return True

    @training.setter
    def training(self, value: bool) -> None:
        TrainingFlagMixin.sets += 1  # Module.__init__ stores `training`: found after the base


class WithMixin(nn.Module, TrainingFlagMixin):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3


def build_noted(x: torch.Tensor) -> Any:
    return Noted()(x)


def build_with_mixin(x: torch.Tensor) -> Any:
    return WithMixin()(x)


def build_own_call(x: torch.Tensor) -> Any:
    return OwnCall()(x)


@pytest.mark.parametrize("fn", [build_noted, build_own_call, build_with_mixin])
def test_a_subclass_whose_construction_reaches_user_code_still_breaks(fn: Any) -> None:
    """A data descriptor the constructor stores through (in the class or in a mixin after the
    torch.nn base), or a dunder of its own: a break, and the user code runs as in eager (the
    setter once per call)."""
    got = kiln_dynamo.explain(fn)(t(3))
    assert any("inside the frame" in r.reason for r in got.break_reasons), got
    before = Noted.stores, TrainingFlagMixin.sets
    kiln_dynamo.reset()
    f = kiln_dynamo.compile(fn, backend=CountingBackend())
    assert_same(f(t(3)), fn(t(3)))
    if fn is build_noted:
        assert Noted.stores == before[0] + 2
    if fn is build_with_mixin:
        assert TrainingFlagMixin.sets == before[1] + 2


def recurrence(left: Any, right: Any) -> Any:
    a_left, b_left = left
    a_right, b_right = right
    return a_left * a_right, a_right * b_left + b_right


def scans(a: torch.Tensor, b: torch.Tensor) -> Any:
    from torch._higher_order_ops.associative_scan import associative_scan

    _, states = associative_scan(recurrence, (a, b), dim=2, combine_mode="generic")  # mamba's scan
    suffix = associative_scan(lambda x, y: x + y, b, dim=-1, reverse=True, combine_mode="generic")
    as_list = associative_scan(lambda x, y: [x[0] * y[0]], [a], dim=0, combine_mode="generic")
    return states, suffix, as_list


def test_associative_scan_is_traced_through_its_stand_in() -> None:
    """Note [Stand-ins for torch's higher-order functions]: torch's associative_scan (vmap,
    pytree specs) is traced as the sequential scan; values and output types match eager's call
    of the real function, and the recurrence equals mamba's eager loop."""
    g = torch.Generator().manual_seed(4)
    a, b = torch.rand(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    check(scans, a, b)
    state, loop = torch.zeros(2, 3), []
    for i in range(5):
        state = a[:, :, i] * state + b[:, :, i]
        loop.append(state)
    got = kiln_dynamo.compile(scans, backend=CountingBackend())(a, b)
    torch.testing.assert_close(got[0], torch.stack(loop, 2))
    torch.testing.assert_close(got[1], b.flip(-1).cumsum(-1).flip(-1))


def pointwise_scan_on_cpu(x: torch.Tensor) -> Any:
    from torch._higher_order_ops.associative_scan import associative_scan

    try:
        return associative_scan(lambda u, v: u + v, x, dim=0)  # "pointwise" wants CUDA: ValueError
    except ValueError:
        return x * 2


def test_a_call_the_stand_in_does_not_cover_goes_to_the_real_function() -> None:
    report = kiln_dynamo.explain(pointwise_scan_on_cpu)(t(4))
    torch.testing.assert_close(report.result, t(4) * 2)


def test_stand_ins_can_be_switched_off(monkeypatch: Any) -> None:
    from kiln_dynamo import stand_ins

    monkeypatch.setattr(stand_ins, "ENABLED", False)
    g = torch.Generator().manual_seed(4)
    a, b = torch.rand(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    report = kiln_dynamo.explain(scans)(a, b)
    assert report.graph_count != 1 or report.break_reasons  # torch's own body: not traced whole


def from_keys(x: torch.Tensor, n: int) -> Any:
    states = dict.fromkeys(range(n))  # transformers' cache layers build their state dicts so
    flags = dict.fromkeys(["conv", "ssm"], False)
    shared = dict.fromkeys((1, 2), [])  # noqa: RUF024 (the shared value is the point)
    shared[1].append(x)
    states[0] = x * 2
    return states, flags, shared, shared[1] is shared[2], len(states)


def test_dict_fromkeys_shares_its_one_value() -> None:
    check(from_keys, t(3), 3)
    out = kiln_dynamo.compile(from_keys, backend=CountingBackend())(t(3), 2)
    assert out[2][1] is out[2][2] and out[3] is True


class LayerView(collections.abc.Sequence):
    """transformers' per-layer config view: `__len__` from the config, read by its own subscript."""

    def __init__(self, layers: int) -> None:
        self.layers = layers

    def __len__(self) -> int:
        return self.layers

    def __getitem__(self, i: Any) -> Any:
        if i < 0 or i >= len(self):
            raise IndexError("list index out of range")
        return i * 10


VIEW = LayerView(3)


class BadLength:
    def __len__(self) -> Any:
        return 2.0  # noqa: PLE0303 (len() raises TypeError in eager)


def lengths(x: torch.Tensor) -> Any:
    return x * len(VIEW) + VIEW[2], len(VIEW)


def test_len_of_an_outside_object_runs_its_python_len() -> None:
    """Note [Mapping protocol of user objects]: `len()` inlines the class's `__len__`."""
    check(lengths, t(3))


BAD = BadLength()


def bad_length(x: torch.Tensor) -> Any:
    try:
        return x + len(BAD)
    except TypeError:
        return x - 1


def test_a_len_that_is_not_an_int_is_not_traced() -> None:
    report = kiln_dynamo.explain(bad_length)(t(2))
    assert any("__len__ gave" in r.reason for r in report.break_reasons), report
    torch.testing.assert_close(report.result, t(2) - 1)


class Plain:
    pass


class Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class Flagged:
    def __init__(self, on: bool) -> None:
        self.on = on

    def __bool__(self) -> bool:
        return self.on

    def __len__(self) -> int:
        return 0  # __bool__ wins


PLAIN, EMPTY, FULL, FLAG = Plain(), Sized(0), Sized(2), Flagged(True)


def truths(x: torch.Tensor) -> torch.Tensor:
    # whisper's attention: `if is_cross_attention and cache and is_updated`
    return x + (1 if PLAIN else 0) + (2 if EMPTY else 0) + (4 if FULL else 0) + (8 if FLAG else 0)


def test_truth_of_an_outside_object() -> None:
    """`if obj:` on an object from outside the frame: its Python `__bool__`, else `__len__`, else
    True; what they read is guarded (a change recompiles)."""
    check(truths, t(2))
    backend = CountingBackend()
    f = kiln_dynamo.compile(truths, backend=backend)
    x = t(2)
    torch.testing.assert_close(f(x), x + 13)
    FULL.n, FLAG.on = 0, False
    try:
        torch.testing.assert_close(f(x), truths(x))
        torch.testing.assert_close(f(x), x + 1)
    finally:
        FULL.n, FLAG.on = 2, True
    assert backend.graphs == 2


def scaled(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    return x * scale


SIGNATURE = inspect.signature(scaled)  # as a decorator computes it once


def bound_call(x: torch.Tensor) -> Any:
    # a decorator's `signature.bind(...)`: BoundArguments keeps its state in slots
    bound = SIGNATURE.bind(x)
    bound.apply_defaults()
    return scaled(*bound.args, **bound.kwargs), dict(bound.arguments)


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a: Any) -> None:
        self.a = a


def slots(x: torch.Tensor) -> Any:
    s = Slotted(x + 1)
    has_b = hasattr(s, "b")  # a slot never set: AttributeError in eager
    s.b = x * 3
    return s.a + s.b, has_b, s


def test_slots_of_objects_made_in_the_frame() -> None:
    """Note [Slots of objects made in the frame]: stores through member descriptors, an unset
    slot reads as missing, and the object rebuilt after the graph has its slots set."""
    check(bound_call, t(3))
    out = kiln_dynamo.compile(slots, backend=CountingBackend())(t(3))
    want = slots(t(3))
    assert_same(out[:2], want[:2])
    assert type(out[2]) is Slotted and not hasattr(out[2], "__dict__")
    torch.testing.assert_close(out[2].b, want[2].b)
    report = kiln_dynamo.explain(slots)(t(3))
    assert report.graph_count == 1 and not report.break_reasons, report


def no_dict(x: torch.Tensor) -> Any:
    s = Slotted(x)
    try:
        s.c = 1  # not a slot, and no __dict__: AttributeError in eager
    except AttributeError:
        return x - 1
    return x


def test_a_name_that_is_not_a_slot_is_not_stored() -> None:
    report = kiln_dynamo.explain(no_dict)(t(2))
    torch.testing.assert_close(report.result, t(2) - 1)


def explicit_getitem(x: torch.Tensor) -> Any:
    # `d.__getitem__(k)`: a defaultdict's missing key calls its factory, a Counter's reads 0, a
    # plain dict's raises KeyError (dict's own subscript, as `super().__getitem__` reaches it)
    d = collections.defaultdict(list)
    d.__getitem__("a").append(x)
    counts = collections.Counter(["p"])
    try:
        {"k": 1}.__getitem__("missing")
    except KeyError:
        missing = True
    return d, counts.__getitem__("z"), counts.__getitem__("p"), missing, x + 1


def test_explicit_getitem_keeps_each_mappings_missing_key_rule() -> None:
    check(explicit_getitem, t(2))
