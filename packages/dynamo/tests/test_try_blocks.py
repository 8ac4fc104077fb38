"""Try blocks and mapping subclasses: the patterns HuggingFace models run through.

A try block's body is traced like straight-line code (Note [Tracing try blocks]); an exception
the traced code raises enters the handler CPython would run (Note [Exceptions the frame raises
and catches]); a break inside the block splits the frame before it, and the block runs as
Python with its handlers. Each case compares with eager, counts graphs and breaks, and checks
that a second call hits every cache.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any, ClassVar

import torch
from conftest import assert_same

import kiln_dynamo


def _run(fn: Any, *args: Any, graphs: int, breaks: int, fallbacks: int = 0) -> None:
    compiled = kiln_dynamo.compile(fn)
    counters = kiln_dynamo.counters
    seen = made = -1
    for call in range(2):
        assert_same(fn(*args), compiled(*args))
        if call == 0:
            seen, made = counters.frames_seen, counters.graphs
    assert (counters.frames_seen, counters.graphs) == (seen, made)  # the second call hit the cache
    assert counters.recompiles == 0
    reasons = [str(r) for r in counters.break_reasons]
    assert (counters.graphs, counters.graph_breaks, len(counters.fallbacks)) == (graphs, breaks, fallbacks), (
        reasons
    )


# --- try blocks --------------------------------------------------------------------------------


def is_compiling() -> bool:  # transformers.utils.import_utils.is_torchdynamo_compiling
    try:
        import torch

        return torch.compiler.is_compiling()
    except Exception:
        return False


def takes_compile_path(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    if is_compiling():
        return y + 1
    return y - 1


def test_try_helper_is_inlined_and_answers_compiling() -> None:
    x = torch.rand(4)
    compiled = kiln_dynamo.compile(takes_compile_path)
    torch.testing.assert_close(compiled(x), x.cos() + 1)  # the compile-friendly path
    compiled(x)
    counters = kiln_dynamo.counters
    assert (counters.graphs, counters.graph_breaks, counters.fallbacks) == (1, 0, [])


def try_finally(x: torch.Tensor) -> torch.Tensor:
    acc = [x.sin()]
    try:
        y = x * 2
        acc.append(y)
    finally:
        acc.append(x + 3)
    return torch.stack(acc).sum(0)


def test_try_finally_is_traced_whole() -> None:
    _run(try_finally, torch.rand(4), graphs=1, breaks=0)


def nested_try(x: torch.Tensor) -> torch.Tensor:
    try:
        y = x + 1
        try:
            y = y * 2
        except ValueError:
            y = y - 100
    except (TypeError, KeyError):
        y = x
    return y.relu()


def test_nested_try_is_traced_whole() -> None:
    _run(nested_try, torch.randn(4), graphs=1, breaks=0)


def lookup(d: dict[str, int], x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    try:
        scale = d["missing"]  # raises while tracing: the handler decides
    except KeyError:
        scale = 3
    return y * scale


def test_a_key_error_the_frame_catches_is_traced() -> None:
    # Note [Exceptions the frame raises and catches]: the KeyError enters the handler while
    # tracing, as in CPython; the dict's keys are guarded, so a dict that has the key recompiles
    _run(lookup, {"present": 1}, torch.rand(4), graphs=1, breaks=0)
    x = torch.rand(4)
    compiled = kiln_dynamo.compile(lookup)
    assert_same(compiled({"missing": 5}, x), lookup({"missing": 5}, x))
    assert kiln_dynamo.counters.recompiles == 1


class _Gate:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return True  # swallows: kiln does not call exits with an exception, so it must not trace this


def raises_through_a_with_block(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    try:
        with _Gate():
            raise KeyError("k")
        y = y + 1  # the exit swallowed the KeyError: this runs
    except KeyError:
        y = y - 100
    return y


def test_an_exception_through_a_with_exit_splits_before_the_block() -> None:
    _run(raises_through_a_with_block, torch.rand(4), graphs=1, breaks=1, fallbacks=1)
    first = kiln_dynamo.counters.break_reasons[0]
    assert "with block" in first.reason and first.note is not None and "before the try block" in first.note


def breaks_in_try(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    try:
        y = y + len(os.getcwd()) * 0
    except OSError:
        y = y - 1
    return y.sin()


def test_break_in_try_splits_before_the_block() -> None:
    _run(breaks_in_try, torch.rand(4), graphs=1, breaks=1, fallbacks=1)


def helper_with_break_in_try(y: torch.Tensor) -> torch.Tensor:
    try:
        print("inside")
        return y * 2
    except RuntimeError:
        return y


def calls_helper_with_break(x: torch.Tensor) -> torch.Tensor:
    y = x + 1
    y = helper_with_break_in_try(y)
    return y.sin()


def test_inlined_try_with_break_splits_the_caller_at_the_call(capsys: Any) -> None:
    # one chain split through the helper's try block (Note [A break inside a try block of the
    # innermost frame] in breaks.py): two graphs, nothing left to Python (before capture18c the
    # helper ran for real and split before its try block, with nothing before it to compile)
    _run(calls_helper_with_break, torch.rand(4), graphs=2, breaks=1, fallbacks=0)
    assert capsys.readouterr().out == "inside\n" * 4


def helper_with_try(y: torch.Tensor) -> torch.Tensor:
    try:
        return y * 2
    except RuntimeError:
        return y


def try_in_loop(x: torch.Tensor) -> torch.Tensor:
    for _ in range(3):
        x = helper_with_try(x) + 1
        try:
            x = x.tanh()
        finally:
            x = x - 0.5
    return x


def test_try_in_loop_and_inlined_helper_are_traced_whole() -> None:
    _run(try_in_loop, torch.rand(4), graphs=1, breaks=0)


# --- mapping subclasses ------------------------------------------------------------------------


class Interface(MutableMapping[str, Any]):  # transformers.utils.generic.GeneralInterface
    _global_mapping: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        self._local_mapping: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self._local_mapping:
            return self._local_mapping[key]
        return self._global_mapping[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._local_mapping.update({key: value})

    def __delitem__(self, key: str) -> None:
        del self._local_mapping[key]

    def __iter__(self) -> Any:
        return iter({**self._global_mapping, **self._local_mapping})

    def __len__(self) -> int:
        return len(self._global_mapping.keys() | self._local_mapping.keys())


class AttentionInterface(Interface):
    _global_mapping: ClassVar[dict[str, Any]] = {
        "sdpa": torch.nn.functional.scaled_dot_product_attention,
        "relu": torch.relu,
    }


INTERFACES = AttentionInterface()


def pick_attention(x: torch.Tensor, name: str) -> torch.Tensor:
    fn = torch.sigmoid
    if name in INTERFACES:  # Mapping.__contains__: a try block around self[key]
        fn = INTERFACES[name]
    return fn(x * 2)


def test_in_and_subscript_on_a_mapping_subclass() -> None:
    x = torch.randn(4)
    _run(pick_attention, x, "relu", graphs=1, breaks=0)


def test_missing_key_in_a_mapping_subclass_is_still_correct() -> None:
    # __contains__ catches the KeyError of self[key] (raised in the inlined __getitem__): the
    # handler of __contains__ takes it while tracing, as in CPython, so nothing breaks
    x = torch.randn(4)
    _run(pick_attention, x, "eager", graphs=1, breaks=0)


def test_local_override_is_guarded() -> None:
    x = torch.randn(4)
    interfaces = AttentionInterface()

    def pick(x: torch.Tensor) -> torch.Tensor:
        return interfaces["relu"](x)

    compiled = kiln_dynamo.compile(pick)
    assert_same(compiled(x), pick(x))
    interfaces["relu"] = torch.tanh
    assert_same(compiled(x), torch.tanh(x))


# --- duck typing on tensors --------------------------------------------------------------------


def is_jax_jitting(x: Any) -> bool:  # transformers.utils.import_utils.is_jax_jitting
    if not hasattr(x, "jax"):
        return False
    try:
        import jax  # noqa: F401  (not installed: the handler answers)

        return True
    except Exception:
        return False


def duck_typed(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if is_jax_jitting(x) or hasattr(x, "jax") or hasattr(y, "jax"):
        return y - 1
    return y + 1


def test_missing_tensor_attribute_is_false_and_guarded() -> None:
    x = torch.rand(4)
    _run(duck_typed, x, graphs=1, breaks=0)
    compiled = kiln_dynamo.compile(duck_typed)
    x.jax = lambda: None  # type: ignore[attr-defined]  # the guard fails; eager's answer wins
    assert_same(compiled(x), duck_typed(x))
    assert_same(compiled(x), x * 2 - 1)


class Registry(dict[str, Any]):  # transformers.utils.output_capturing._CanRecordRegistry
    def __setitem__(self, model: Any, flags: Any) -> None:
        super().__setitem__(str(model.__class__), flags)

    def get(self, model: Any) -> Any:  # type: ignore[override]
        return super().get(str(model.__class__)) or {}


REGISTRY = Registry()
REGISTRY[torch.nn.Linear(1, 1)] = {"hidden_states": 1}


def recordable(x: torch.Tensor, model: torch.nn.Module) -> Any:
    flags = REGISTRY.get(model)
    keys = {f"output_{k}": True for k in flags}
    return x * len(keys), keys


def test_dict_subclass_method_is_inlined() -> None:
    _run(recordable, torch.rand(3), torch.nn.Linear(1, 1), graphs=1, breaks=0)
    kiln_dynamo.reset()
    _run(recordable, torch.rand(3), torch.nn.ReLU(), graphs=1, breaks=0)


def stores_into_registry(x: torch.Tensor) -> Any:
    REGISTRY["x"] = 1  # an overridden __setitem__: not modelled, the frame breaks there
    return x + 1


def test_dict_subclass_override_is_never_bypassed() -> None:
    x = torch.rand(3)
    out = kiln_dynamo.compile(stores_into_registry)(x)
    assert_same(out, x + 1)
    assert "<class 'str'>" in REGISTRY and "x" not in REGISTRY
    del REGISTRY["<class 'str'>"]
