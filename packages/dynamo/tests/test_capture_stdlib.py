"""Standard-library containers and references made in the frame, captured without a break
(issue 16): `collections.deque` (with `maxlen`), `collections.Counter`, `itertools.count` (with
`islice`, `zip`, `next`), `weakref.ref` of an object from outside the frame. Each case compares
with eager (values, types, what is left of an iterator that leaves the frame) and counts graphs
and breaks."""

from __future__ import annotations

import collections
import itertools
import weakref
from typing import Any

import pytest
import torch
from conftest import CountingBackend, one_graph

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(11 * sum(shape) + 1)
    return torch.randn(*shape, generator=g)


def _deque_ops(x: torch.Tensor) -> Any:
    q = collections.deque([x, x + 1], maxlen=3)
    q.append(x + 2)
    q.append(x + 3)  # full: drops x from the left
    q.appendleft(x * 10)  # full: drops x + 3 from the right
    q.extend([x - 1])
    q.rotate(1)
    left = q.popleft()
    q += [x * 3]
    return left, q, len(q), q.maxlen, iter(q), reversed(q), q[-1]


def _same_deque(a: collections.deque[Any], b: collections.deque[Any]) -> None:
    assert type(a) is type(b) and a.maxlen == b.maxlen and len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v)


def test_deque_methods_and_maxlen_match_eager() -> None:
    x = t(3)
    got = one_graph(_deque_ops, x)
    want = _deque_ops(x)
    torch.testing.assert_close(got[0], want[0])
    _same_deque(got[1], want[1])
    assert got[2:4] == want[2:4]
    for g, w in zip(got[4:6], want[4:6], strict=True):  # iterators keep eager's types and items
        assert type(g) is type(w)
        for u, v in zip(list(g), list(w), strict=True):
            torch.testing.assert_close(u, v)
    torch.testing.assert_close(got[6], want[6])


def test_deque_slicing_and_arithmetic_are_not_modelled() -> None:
    def f(x: torch.Tensor) -> Any:
        q = collections.deque([x, x])
        return q + q

    report = kiln_dynamo.explain(f)(t(2))
    assert report.break_reasons and "deque" in str(report.break_reasons[0])
    _same_deque(report.result, f(t(2)))


SCALE = [1, 2, 2]


def _counter_ops(x: torch.Tensor) -> Any:
    c = collections.Counter("abracadabra")
    c.update(SCALE)
    c.update({"a": 2}, z=4)
    c.subtract(["b"])
    del c["missing"]  # a Counter ignores a missing key
    top = c.most_common(2)
    return x * c["a"] + c["nope"] + c[2], c, top, c.total(), list(c.elements())[:4], c.most_common()


def test_counter_matches_eager_and_guards_what_it_counts() -> None:
    global SCALE
    x = t(4)
    got = one_graph(_counter_ops, x)
    want = _counter_ops(x)
    torch.testing.assert_close(got[0], want[0])
    assert type(got[1]) is collections.Counter and list(got[1].items()) == list(want[1].items())
    assert got[2:] == want[2:]
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_counter_ops, backend=backend)
    compiled(x)
    old = SCALE
    try:
        SCALE = [2, 2, 2, 2]  # what is counted changes: the guard on the global recompiles
        torch.testing.assert_close(compiled(x)[0], _counter_ops(x)[0])
        assert compiled(x)[1] == _counter_ops(x)[1]
    finally:
        SCALE = old
    assert backend.graphs == 2


def test_counter_of_tensors_counts_them_in_the_graph() -> None:
    def f(x: torch.Tensor) -> Any:
        c = collections.Counter({"a": x})
        c.update({"a": x * 2, "b": x})
        return c

    got, want = one_graph(f, t(3)), f(t(3))
    assert list(got) == list(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def _count_ops(x: torch.Tensor) -> Any:
    c = itertools.count(5, 2)
    first = next(c)
    pairs = list(zip(c, "ab", strict=False))  # zip advances the count once more before "ab" runs out
    head = list(itertools.islice(c, 1, 3))
    for i in c:
        if i > 17:
            break
    return x * first + sum(p[0] for p in pairs), pairs, head, i, c


def test_itertools_count_matches_eager_and_leaves_at_its_position() -> None:
    x = t(2)
    got = one_graph(_count_ops, x)
    want = _count_ops(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:4] == want[1:4]
    assert type(got[4]) is itertools.count and next(got[4]) == next(want[4])


def test_islice_of_count_takes_only_what_is_consumed() -> None:
    def f(x: torch.Tensor) -> Any:
        c = itertools.count()
        s = itertools.islice(c, 2, 10, 3)
        a = next(s)
        return x + a, next(c), s, c  # the islice left the count at 3

    got, want = one_graph(f, t(2)), f(t(2))
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]
    assert list(got[2]) == list(want[2]) and next(got[3]) == next(want[3])


class Holder:
    pass


HELD = Holder()


def _weak(x: torch.Tensor) -> Any:
    r = weakref.ref(HELD)
    return x * (r() is HELD), r, r is weakref.ref(HELD)


def test_weakref_of_an_outside_object_is_its_own_reference() -> None:
    global HELD
    x = t(3)
    got = one_graph(_weak, x)
    want = _weak(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] is want[1] is weakref.ref(HELD) and got[2] is True
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_weak, backend=backend)
    compiled(x)
    old = HELD
    try:
        HELD = Holder()  # another object: the reference the runner builds points to it
        assert compiled(x)[1]() is HELD
    finally:
        HELD = old
    assert compiled(x)[1]() is old


def test_weakref_of_an_object_made_in_the_frame_breaks() -> None:
    def f(x: torch.Tensor) -> Any:
        h = Holder()
        r = weakref.ref(h)
        return x + 1, r() is h

    report = kiln_dynamo.explain(f)(t(2))
    assert any("made in the frame" in str(b) for b in report.break_reasons)
    assert report.result[1] is f(t(2))[1] is True


def test_weakref_of_a_type_without_weak_references_raises_as_eager() -> None:
    d: dict[str, int] = {}

    def f(x: torch.Tensor) -> Any:
        return x, weakref.ref(d)

    with pytest.raises(TypeError):
        f(t(2))
    with pytest.raises(TypeError):
        kiln_dynamo.compile(f, backend=CountingBackend())(t(2))


CONFIG = {"layers": [1, 2], "name": "m"}


def _copies(x: torch.Tensor) -> Any:
    import copy

    l1 = [x, x + 1]
    l2 = copy.copy(l1)
    l2.append(x)
    d = copy.deepcopy(CONFIG)
    d["layers"].append(3)  # a deep copy: the global's list is untouched
    s = copy.copy({1, 2})
    return l2[1] * 2, len(l1), d, CONFIG["layers"], copy.copy((x,))[0] is x, s, copy.deepcopy(2.5)


def test_copy_and_deepcopy_of_plain_values() -> None:
    global CONFIG
    x = t(3)
    got = one_graph(_copies, x)
    want = _copies(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] and CONFIG["layers"] == [1, 2]
    kiln_dynamo.reset()
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_copies, backend=backend)
    compiled(x)
    old = CONFIG
    try:
        CONFIG = {"layers": [7], "name": "n"}  # what the deep copy read changed: recompiled
        assert compiled(x)[2] == _copies(x)[2] == {"layers": [7, 3], "name": "n"}
    finally:
        CONFIG = old
    assert backend.graphs == 2


def test_device_probes_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Device probes]: `torch.cuda.get_device_capability(...)` and friends are folded on
    constant arguments (the answer of this process's device), so a check before a fused path
    does not break the graph."""
    from types import SimpleNamespace

    from kiln_dynamo.variables.stdlib import DEVICE_PROBES

    assert torch.cuda.get_device_capability in DEVICE_PROBES
    props = SimpleNamespace(major=9, minor=0, name="probe")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)

    def f(x: torch.Tensor) -> torch.Tensor:
        if torch.cuda.is_available() or torch.cuda.get_device_capability(torch.device("cuda", 0)) >= (8, 0):
            return x + 1
        return x * 2

    torch.testing.assert_close(one_graph(f, torch.ones(3)), f(torch.ones(3)))
