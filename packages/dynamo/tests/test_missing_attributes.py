"""Missing attributes of objects whose class looks attributes up in Python.

A class with its own `__getattribute__` (transformers' configs remap names through
`attribute_map`) is inlined; the AttributeError its `super().__getattribute__` raises is the
program's own (Note [Missing attributes seen by the program]): getattr's default, hasattr and an
`except AttributeError` of the traced code take it. A frame whose traced path only raises it,
with nothing compiled before, runs as Python as a frame without tensor work (Note [A frame that
only raises]), not as a frame left to Python.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from conftest import assert_same

import kiln_dynamo


class Config:
    attribute_map: ClassVar[dict[str, str]] = {"hidden": "hidden_size"}

    def __init__(self) -> None:
        self.hidden_size = 3

    def __getattribute__(self, key: str) -> Any:
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


CONFIG = Config()


def reads_missing(x: torch.Tensor) -> torch.Tensor:
    use_cache = getattr(CONFIG, "use_cache", None)
    has = hasattr(CONFIG, "is_causal")
    try:
        CONFIG.output_attentions  # noqa: B018
        caught = 0
    except AttributeError:
        caught = 1
    return x * CONFIG.hidden + (use_cache is None) + has + caught


def test_missing_attribute_of_python_getattribute_is_caught_in_the_graph() -> None:
    x = torch.rand(4)
    compiled = kiln_dynamo.compile(reads_missing)
    for _ in range(2):
        assert_same(reads_missing(x), compiled(x))
    c = kiln_dynamo.counters
    assert (c.graphs, c.graph_breaks, c.fallbacks, c.recompiles) == (1, 0, [], 0)


def test_uncaught_missing_attribute_raises_as_eager() -> None:
    def needs(x: torch.Tensor) -> torch.Tensor:
        return x + getattr(CONFIG, "use_cache")  # noqa: B009

    with pytest.raises(AttributeError, match="use_cache"):
        kiln_dynamo.compile(needs)(torch.rand(2))


def test_frame_that_only_raises_runs_as_python_without_a_fallback() -> None:
    # what getattr(config, "use_cache", None) from a frame running as Python leads to: the
    # config's __getattribute__ is a frame of its own, and it raises
    compiled = kiln_dynamo.compile(Config.__getattribute__)
    for _ in range(2):
        with pytest.raises(AttributeError, match="use_cache"):
            compiled(CONFIG, "use_cache")
    assert compiled(CONFIG, "hidden") == 3
    c = kiln_dynamo.counters
    assert (c.graphs, c.graph_breaks, c.fallbacks) == (0, 0, [])
    assert c.frames_without_graph == 1


def test_tensor_work_before_the_raise_is_still_compiled() -> None:
    def works_then_raises(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return CONFIG.use_cache

    x, y = torch.ones(3), torch.ones(3)
    with pytest.raises(AttributeError):
        works_then_raises(x)
    with pytest.raises(AttributeError):
        kiln_dynamo.compile(works_then_raises)(y)
    assert_same(x, y)
    c = kiln_dynamo.counters
    assert (c.graphs, c.graph_breaks) == (1, 1)
