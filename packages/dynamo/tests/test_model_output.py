"""transformers' ModelOutput: built, read, mutated and returned inside a compiled frame, and read
when it arrives from outside, each compared with eager (Note [Rebuilding a ModelOutput])."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest
import torch
from conftest import CountingBackend, assert_same, check

import kiln_dynamo

transformers = pytest.importorskip("transformers")
ModelOutput = transformers.utils.ModelOutput


@dataclasses.dataclass
class Out(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden: tuple[torch.Tensor, ...] | None = None
    extra: torch.Tensor | None = None


@dataclasses.dataclass
class Fancy(ModelOutput):
    """A subclass that adds a property and overrides to_tuple (as CLIPOutput does)."""

    a: torch.Tensor | None = None
    b: torch.Tensor | None = None

    @property
    def both(self) -> torch.Tensor:
        return self.a + self.b

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(reversed([self[k] for k in self.keys()]))


@dataclasses.dataclass
class LookAlike(collections.OrderedDict):  # built like ModelOutput, but not one
    x: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.x is not None:
            self["x"] = self.x


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(shape) + 7)
    return torch.randn(*shape, generator=g)


def same_output(a: Any, b: Any) -> None:
    """Keys, items and every field's attribute agree (assert_same compares a dict's items only)."""
    assert_same(a, b)
    for f in dataclasses.fields(a):
        assert_same(getattr(a, f.name), getattr(b, f.name), f"out.{f.name}")


def explain(fn: Any, *args: Any) -> Any:
    report = kiln_dynamo.explain(fn)(*args)
    same_output(report.result, fn(*args)) if isinstance(report.result, ModelOutput) else None
    return report


# --- built inside the frame ---------------------------------------------------------------------


def build_and_return(x: torch.Tensor) -> Out:
    return Out(logits=x * 2, extra=x + 1)


def test_construct_and_return_is_a_real_model_output() -> None:
    x = t(3, 4)
    check(build_and_return, x)
    out = kiln_dynamo.compile(build_and_return, backend=CountingBackend())(x)
    assert type(out) is Out and list(out.keys()) == ["logits", "extra"]
    assert out.loss is None and out.hidden is None
    same_output(out, build_and_return(x))


def read_everything(x: torch.Tensor) -> Any:
    o = Out(None, x.sin(), (x, x * 3), None)
    k, v = next(iter(o.items()))
    return (
        o[0],
        o["logits"],
        o.logits,
        o.to_tuple(),
        o[1:],
        o[-1][1],
        len(o),
        "hidden" in o,
        "loss" in o,
        o.get("extra", 5),
        o.get("logits"),
        list(o.keys()),
        list(o.values()),
        [key for key in o],
        dict(o),
        k,
        v,
        isinstance(o, ModelOutput),
        isinstance(o, dict),
        o.loss is None,
        bool(o),
    )


def test_reads_follow_model_output_rules() -> None:
    check(read_everything, t(2, 3))


def none_fields(x: torch.Tensor) -> Any:
    empty = Out()
    first_none = Out(loss=None, logits=x)
    return len(empty), list(empty.keys()), first_none[0] + 1, first_none.to_tuple(), empty, first_none


def test_none_fields_are_not_keys() -> None:
    check(none_fields, t(4))


@dataclasses.dataclass
class Maps(ModelOutput):
    """First field a tuple, as transformers' BackboneOutput."""

    feature_maps: tuple[torch.Tensor, ...] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def first_field_alone(x: torch.Tensor) -> Any:
    # Note [A ModelOutput built from its first field alone]: a tuple or list whose head is not a
    # (str, value) pair is kept as the field; an empty one leaves the field None and no key
    full = Maps(feature_maps=(x * 2, x + 1), hidden_states=(x,))
    filtered = type(full)(**{k: v for k, v in full.items() if k != "hidden_states"})  # DETR's backbone
    listed = Maps([x.sin(), x.cos()])
    pairs = Maps(((x, x * 3), (x * 4, x)))  # pairs of tensors, not (str, value) pairs
    odd = Maps((1, "a"))
    empty = Maps(())
    outs = (filtered, listed, pairs, odd, empty)
    return (
        outs,
        [len(o) for o in outs],
        [list(o.keys()) for o in outs],
        empty.feature_maps,
        filtered[0][1] * 2,
    )


def test_first_field_alone_is_kept_when_not_pairs() -> None:
    x = t(3)
    check(first_field_alone, x)
    got = kiln_dynamo.compile(first_field_alone, backend=CountingBackend())(x)
    want = first_field_alone(x)
    for g, w in zip(got[0], want[0], strict=True):
        same_output(g, w)
    assert got[2] == [["feature_maps"], ["feature_maps"], ["feature_maps"], ["feature_maps"], []]
    assert type(got[0][1].feature_maps) is list and got[0][4].feature_maps is None


def test_positional_fields_and_hf_old_cache_name() -> None:
    fields = [f.name for f in dataclasses.fields(transformers.modeling_outputs.BaseModelOutputWithPast)]

    def fn(x: torch.Tensor) -> Any:
        cls = transformers.modeling_outputs.BaseModelOutputWithPast
        if "cache" in fields:  # transformers 5 renamed past_key_values; old names still work
            o = cls(x + 1, past_key_values=(x, x))
            old = (o["past_key_values"], "cache_params" in o, o.get("past_key_values"), o.past_key_values)
            return o, old
        return cls(x + 1, (x, x)), None

    check(fn, t(3))


def inner(x: torch.Tensor) -> Out:
    return Out(logits=x.cos(), hidden=(x,))


def outer(x: torch.Tensor) -> Any:
    o = inner(x)
    return o.logits + 1, o, o[1][0] * 2


def test_returned_from_an_inlined_call() -> None:
    check(outer, t(5))


def mutate(x: torch.Tensor) -> Any:
    o = Out(logits=x, extra=x * 2)
    o.hidden = (x + 1,)  # a new key, after extra
    o["logits"] = x - 1  # an existing key keeps its place
    o.loss = None  # never set: stays no key
    return o, o.to_tuple(), list(o.keys())


def test_mutation_keeps_eager_key_order() -> None:
    check(mutate, t(3))
    out = kiln_dynamo.compile(mutate, backend=CountingBackend())(t(3))[0]
    assert list(out.keys()) == ["logits", "extra", "hidden"]


def one_object(x: torch.Tensor) -> Any:
    o = Out(logits=x)
    return o, [o], {"o": o}


def test_one_object_rebuilt_once() -> None:
    out = kiln_dynamo.compile(one_object, backend=CountingBackend())(t(2))
    assert out[0] is out[1][0] is out[2]["o"]


def fancy(x: torch.Tensor) -> Any:
    o = Fancy(a=x, b=x * 2)
    return o.both, o.to_tuple(), o[0], o


def test_subclass_property_and_to_tuple_override_are_inlined() -> None:
    check(fancy, t(3))


def splat(x: torch.Tensor) -> Any:
    def take(logits: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return logits * extra

    return take(**Out(logits=x, extra=x + 2))


def test_double_star_unpacks_the_keys() -> None:
    check(splat, t(3))


# --- arriving from outside the frame ------------------------------------------------------------


def read_input(o: Out) -> Any:
    return o[0] * 2, o["logits"].sum(), o.extra, len(o), o.to_tuple(), "hidden" in o


def test_input_is_read_under_guards_on_type_and_keys() -> None:
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(read_input, backend=backend)
    a = Out(logits=t(3), extra=t(2))
    for o in (a, Out(logits=t(3), extra=t(2))):
        assert_same(compiled(o), read_input(o))
    assert backend.graphs == 1 and kiln_dynamo.counters.recompiles == 0
    assert kiln_dynamo.counters.fallbacks == []
    b = Out(loss=t(1), logits=t(3), extra=t(2))  # other keys: the guard fails, it recompiles
    assert_same(compiled(b), read_input(b))
    assert backend.graphs == 2 and kiln_dynamo.counters.recompiles == 1


def return_input(o: Out) -> Any:
    return o, o.logits + 1


def test_input_returned_is_the_same_object() -> None:
    o = Out(logits=t(3))
    out = kiln_dynamo.compile(return_input, backend=CountingBackend())(o)
    assert out[0] is o


def split_with_live_output(x: torch.Tensor) -> Any:
    o = Out(logits=x * 2, extra=x)
    print("split here")  # a graph break: the continuation receives `o` as a local
    return o.logits + o[1], o


def test_live_across_a_graph_break() -> None:
    x = t(4)
    report = explain(split_with_live_output, x)
    assert report.graph_count == 2 and report.graph_break_count == 1
    assert "print()" in report.break_reasons[0].reason
    assert_same(report.result, split_with_live_output(x))


# --- stores into one from outside (Note [Stores into a ModelOutput from outside]) -----------------


def mutate_input(o: Out) -> Any:
    o.extra = o.logits * 3  # a field that is not a key: appended to the keys
    return o.extra + 1, o.to_tuple(), list(o.keys())


def overwrite_and_setitem(o: Out) -> Any:
    o.logits = o.logits - 1  # a key: its place in the keys stays
    o["hidden"] = (o.logits, o.logits * 2)
    o.loss = None  # not a key: only the attribute, as ModelOutput does
    return o[0] + o.hidden[1], len(o)


def mutate_after_split(x: torch.Tensor) -> Any:
    o = Out(logits=x * 2)
    print("split here")
    o.extra = x  # in the continuation `o` came from outside: replayed on the real object
    return o


def same_state(a: Any, b: Any) -> None:
    """Attributes and items, in order, agree."""
    same_output(a, b)
    assert list(vars(a)) == list(vars(b)) and list(a.keys()) == list(b.keys())


@pytest.mark.parametrize("fn", [mutate_input, overwrite_and_setitem], ids=["setattr", "setitem"])
def test_stores_into_an_input_are_replayed(fn: Any) -> None:
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(fn, backend=backend)
    for _ in range(2):
        mine, ref = Out(logits=t(3)), Out(logits=t(3))
        assert_same(compiled(mine), fn(ref))
        same_state(mine, ref)
    assert backend.graphs == 1 and kiln_dynamo.counters.recompiles == 0
    assert kiln_dynamo.counters.fallbacks == []


def test_store_after_a_split_is_replayed() -> None:
    x = t(2)
    report = explain(mutate_after_split, x)
    assert report.graph_break_count == 1 and "print()" in report.break_reasons[0].reason
    same_state(report.result, mutate_after_split(x))
    assert report.result.extra is not None and list(report.result.keys()) == ["logits", "extra"]


# --- what is not modelled breaks, with a reason, and stays right --------------------------------


def pop_key(x: torch.Tensor) -> Any:
    o = Out(logits=x)
    try:
        o.pop("logits")
    except Exception:
        return x
    return x + 1


def set_back_to_none(x: torch.Tensor) -> Any:
    o = Out(logits=x, extra=x)
    o.extra = None  # ModelOutput keeps the item: not modelled
    return o, o.to_tuple()


def first_field_alone_not_a_tensor(x: torch.Tensor) -> Any:
    return Out((("logits", x),)), x + 1  # __post_init__ reads it as (key, value) pairs


def build_lookalike(x: torch.Tensor) -> Any:
    return LookAlike(x=x * 2)


@pytest.mark.parametrize(
    ("fn", "make_args", "words"),
    [
        (pop_key, lambda: (t(2),), "ModelOutput.pop"),
        (set_back_to_none, lambda: (t(2),), "setting attribute 'extra' of a Out to None"),
        (build_lookalike, lambda: (t(2),), "a dict subclass that is not a modelled ModelOutput"),
        (first_field_alone_not_a_tensor, lambda: (t(2),), "Out built from a non-tensor first field alone"),
    ],
    ids=["pop", "set_none", "lookalike", "iterator_first_field"],
)
def test_unmodelled_patterns_break_with_a_reason(fn: Any, make_args: Any, words: str) -> None:
    eager_args, comp_args = make_args(), make_args()
    torch.manual_seed(0)
    report = kiln_dynamo.explain(fn)(*comp_args)
    assert any(words in r.reason for r in report.break_reasons), [r.reason for r in report.break_reasons]
    expected = fn(*eager_args)
    assert_same(report.result, expected)
    assert_same(comp_args, eager_args, "args")


# --- rebuilt without the class's methods (Note [A ModelOutput rebuilt without its methods]) ------


def state(o: Any) -> tuple[Any, ...]:
    """Type, attributes and items, in order, values by identity."""
    return (
        type(o),
        [(k, id(v)) for k, v in vars(o).items()],
        [(k, id(v)) for k, v in collections.OrderedDict.items(o)],
    )


def rebuilt_often(x: torch.Tensor, y: torch.Tensor) -> Any:
    return Out(logits=x * 2, hidden=(x, y)), Out(loss=y.sum(), extra=x + 1)


def test_fast_rebuild_is_the_object_the_class_builds() -> None:
    from kiln_dynamo.variables import model_output

    model_output._plans.pop(Out, None)
    f = kiln_dynamo.compile(rebuilt_often, backend=CountingBackend())
    x, y = t(3), t(2)
    for _ in range(3):  # the first rebuild runs the class and checks the direct build against it
        got = f(x, y)
        for o in got:
            built = Out(**{k: getattr(o, k) for k in ("loss", "logits", "hidden", "extra")})
            assert state(o) == state(built)
        same_output(got[0], rebuilt_often(x, y)[0])
        same_output(got[1], rebuilt_often(x, y)[1])
    assert model_output._plans[Out] is not model_output._SLOW  # the direct build is in use
    got[0].extra = x  # still a ModelOutput: a field set later becomes the last key
    assert list(got[0].keys()) == ["logits", "hidden", "extra"] and got[0][2] is x


def test_fast_rebuild_restores_the_frame_key_order() -> None:
    from kiln_dynamo.variables import model_output

    f = kiln_dynamo.compile(mutate, backend=CountingBackend())
    for _ in range(3):
        out = f(t(3))
        assert list(out[0].keys()) == ["logits", "extra", "hidden"]
        same_output(out[0], mutate(t(3))[0])
    assert model_output._plans[Out] is not model_output._SLOW


@dataclasses.dataclass
class Counting(ModelOutput):
    """Overrides __post_init__: not modelled, so never built directly."""

    a: torch.Tensor | None = None
    b: torch.Tensor | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.__dict__["seen"] = self.__dict__.get("seen", 0) + 1


def test_a_class_with_its_own_construction_keeps_it() -> None:
    from kiln_dynamo.variables import model_output

    x = t(2)
    for _ in range(3):
        o = model_output._rebuild(Counting, {"a": x}, None)
        assert o.seen == 1 and list(o.keys()) == ["a"]
    assert model_output._plans[Counting] is model_output._SLOW


def test_pairs_in_the_first_field_take_the_class_path() -> None:
    from kiln_dynamo.variables import model_output

    x, y = t(2), t(3)
    model_output._rebuild(Out, {"logits": x}, None)  # a plan for Out
    # a first field that is not a tensor with the others None: __post_init__ reads it as pairs
    o = model_output._rebuild(Out, {"loss": [("logits", x), ("extra", y)]}, None)
    eager = Out(loss=[("logits", x), ("extra", y)])
    assert state(o) == state(eager) and o.loss is None and list(o.keys()) == ["logits", "extra"]
