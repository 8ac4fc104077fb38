"""`copy.copy` / `copy.deepcopy` of a user object from outside the frame whose state is constants
(issue 16; Note [Copying an object of constants]), and the Python attribute hooks of objects made
in the frame (Note [Attribute hooks of objects made in the frame]): the shape of transformers'
`config.get_text_config()`, which deep-copies a config, deletes and sets attributes on the copy
through `__setattr__`/`__getattribute__` hooks and a validator keyed by type annotations."""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Literal, Optional, Union

import torch
from conftest import one_graph

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 * sum(shape) + 2)
    return torch.randn(*shape, generator=g)


def _check_int_or_none(value: Any) -> None:
    if not isinstance(value, int):
        raise TypeError("not an int")


_VALIDATORS = {Union: _check_int_or_none, Literal: None}  # keyed by annotations
_FIELDS: dict[str, Any] = {
    "decoder_layers": int | None,
    "num_layers": Optional[int],  # noqa: UP045 (the typing spelling is what is tested)
    "act": Literal["gelu"],
}


class Config:
    """A config in the style of transformers': names remapped on read and write, stores validated."""

    attribute_map: ClassVar[dict[str, str]] = {"hidden": "d_model"}

    def __init__(self) -> None:
        self.d_model = 8
        self.decoder_layers = 2
        self.encoder_layers = 3
        self.act = "gelu"
        self.id2label = {0: "a", 1: "b"}
        self.sizes = [1, 2]

    def __getattribute__(self, key: str) -> Any:
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key: str, value: Any) -> None:
        annotation = _FIELDS.get(key)
        if annotation is not None and (check := _VALIDATORS.get(getattr(annotation, "__origin__", Union))):
            check(value)
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def text_config(self) -> Config:
        out = copy.deepcopy(self)
        for key in list(vars(out)):
            if key.startswith("decoder_"):
                value = getattr(out, key)
                delattr(out, key)
                setattr(out, "num_" + key[len("decoder_") :], value)
        return out


CONFIG = Config()


def _text_config(x: torch.Tensor) -> Any:
    c = CONFIG.text_config()
    c.sizes.append(3)  # the copy's list, not the original's
    c.hidden = 4  # through attribute_map: the copy's d_model
    return x * c.num_layers + c.hidden + len(c.sizes), c is CONFIG, type(c) is Config, sorted(vars(c))


def test_deepcopy_of_a_config_is_one_graph_and_a_distinct_object() -> None:
    x = t(3)
    got = one_graph(_text_config, x)
    assert CONFIG.sizes == [1, 2] and CONFIG.d_model == 8 and CONFIG.decoder_layers == 2  # untouched
    want = _text_config(x)
    assert CONFIG.sizes == [1, 2]
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] == (False, True, sorted(want[3]))


def test_deepcopy_guards_the_state_it_read() -> None:
    x = t(3)
    fn = kiln_dynamo.compile(_text_config, backend="eager")
    torch.testing.assert_close(fn(x)[0], _text_config(x)[0])
    CONFIG.decoder_layers = 5
    try:
        torch.testing.assert_close(fn(x)[0], _text_config(x)[0])  # a guard failed: recaptured
    finally:
        CONFIG.decoder_layers = 2


class Shallow:
    def __init__(self) -> None:
        self.w = [1.0]
        self.n = 2


SHALLOW = Shallow()


def _shallow(x: torch.Tensor) -> Any:
    c = copy.copy(SHALLOW)
    c.n = 3  # the copy's own attribute
    return x * c.n * c.w[0], c.w is SHALLOW.w, c is SHALLOW, SHALLOW.n


def test_shallow_copy_shares_values_and_keeps_stores_its_own() -> None:
    x = t(2)
    got = one_graph(_shallow, x)
    want = _shallow(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] == (True, False, 2)


class WithDeepcopy(Shallow):
    def __deepcopy__(self, memo: dict[int, Any]) -> WithDeepcopy:
        out = WithDeepcopy()
        out.n = 10
        return out


def _own_hook(x: torch.Tensor) -> Any:
    return x * copy.deepcopy(WITH_DEEPCOPY).n


WITH_DEEPCOPY = WithDeepcopy()


def test_a_class_with_its_own_deepcopy_runs_it() -> None:
    x = t(2)
    report = kiln_dynamo.explain(_own_hook)(x)
    torch.testing.assert_close(report.result, x * 10)


# --- an object made in the frame (the second part of Note [Copying an object of constants]) ---


def _copy_of_new_config(x: torch.Tensor) -> Any:
    made = Config()  # made in the frame, as WhisperConfig.get_text_config makes its sub-config
    c = made.text_config()
    c.sizes.append(3)  # the copy's list, not the made object's
    c.hidden = 4  # through attribute_map: the copy's d_model
    out = x * c.num_layers + c.hidden + len(c.sizes) + made.d_model
    return out, c is made, made.sizes, c.sizes, c.id2label is made.id2label, sorted(vars(c)), made, c


def test_deepcopy_of_an_object_made_in_the_frame_is_one_graph() -> None:
    x = t(3)
    got = one_graph(_copy_of_new_config, x)
    want = _copy_of_new_config(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:6] == want[1:6] == (False, [1, 2], [1, 2, 3], False, want[5])
    made, c = got[6:]  # both objects come out of the graph with their own state
    assert type(made) is type(c) is Config and made is not c
    assert vars(made) == vars(want[6]) and vars(c) == vars(want[7])
    assert made.sizes is not c.sizes and made.id2label is not c.id2label


class Pair:
    def __init__(self, value: Any) -> None:
        self.a = value
        self.b = value
        self.n = 2


def _shared_list(x: torch.Tensor) -> Any:
    p = Pair([1])
    q = copy.deepcopy(p)
    q.a.append(2)  # deepcopy's memo keeps the two attributes one list
    return x * len(q.b), q.a is q.b, p.a


def test_deepcopy_keeps_a_list_shared_by_two_attributes_shared() -> None:
    x = t(2)
    report = kiln_dynamo.explain(_shared_list)(x)  # not folded: copy's own code runs
    want = _shared_list(x)
    torch.testing.assert_close(report.result[0], want[0])
    assert report.result[1:] == want[1:] == (True, [1])


def _tensor_attr(x: torch.Tensor) -> Any:
    p = Pair(x * 2)
    q = copy.deepcopy(p)
    return q.a + 1, q.a is p.a


def test_deepcopy_of_a_made_object_holding_a_tensor_is_not_folded() -> None:
    x = t(2)
    report = kiln_dynamo.explain(_tensor_attr)(x)
    want = _tensor_attr(x)
    torch.testing.assert_close(report.result[0], want[0])
    assert report.result[1] is want[1] is False


def _shallow_new(x: torch.Tensor) -> Any:
    p = Pair([1.0])
    q = copy.copy(p)
    q.n = 3  # the copy's own attribute
    q.a.append(2.0)  # the shared list
    return x * q.n * p.n * len(p.b), q.a is p.a, q is p


def test_shallow_copy_of_an_object_made_in_the_frame_shares_values() -> None:
    x = t(2)
    got = one_graph(_shallow_new, x)
    want = _shallow_new(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] == (True, False)
