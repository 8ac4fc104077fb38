"""Pure standard-library calls on constants, folded without a break (issue 16): `re` on constant
strings (Note [Frozen values]), `packaging.version` comparisons of `torch.__version__`,
`collections.namedtuple` called in the frame (Note [namedtuple made in the frame]) and
`functools.wraps` on a function made in the frame (Note [Attributes of a function made in the
frame]). Each case compares with eager (values and types) and counts graphs and breaks; values
read from outside the frame are changed to check that the guard recompiles."""

from __future__ import annotations

import collections
import functools
import re
from typing import Any

import torch
from conftest import CountingBackend, assert_same, one_graph
from packaging import version

import kiln_dynamo


def t(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 * sum(shape) + 3)
    return torch.randn(*shape, generator=g)


def _re_ops(x: torch.Tensor) -> Any:
    m = re.match(r"layer_(\d+)\.(?P<kind>\w+)", "layer_12.attn")
    p = re.compile(r"h\.(\d+)", re.IGNORECASE)
    n = int(m.group(1)) + len(re.findall(r"\d", "a1b22"))
    parts = re.split(r"[._]", "model.layers_3.mlp")
    s = re.sub(r"\.(\d+)\.", r"[\1].", "blocks.4.norm")
    miss = re.fullmatch(r"\d+", "12a")
    found = p.search("H.7")
    return (x * n, m.groups(), m.groupdict(), m.span(1), m[2], parts, s, miss is None,
            found.group(1), p.pattern, bool(found), re.escape("a.b"), m.string)  # fmt: skip


def test_re_on_constant_strings_folds() -> None:
    x = t(3)
    got = one_graph(_re_ops, x)
    assert_same(got, _re_ops(x))


_PAT = re.compile(r"(\d+)")


def _global_pattern(x: torch.Tensor) -> Any:
    return x * int(_PAT.match("35").group(1)), _PAT.match("35")


def test_pattern_from_a_global_is_guarded() -> None:
    global _PAT
    x = t(4)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_global_pattern, backend=backend)
    got = compiled(x)
    torch.testing.assert_close(got[0], _global_pattern(x)[0])
    assert type(got[1]) is re.Match and got[1].group(0) == "35"
    old = _PAT
    try:
        _PAT = re.compile(r"(\d)")  # another pattern: the guard recompiles, and the answer follows
        torch.testing.assert_close(compiled(x)[0], x * 3)
    finally:
        _PAT = old
    assert backend.graphs == 2


def _re_on_tensor_repr(x: torch.Tensor) -> Any:
    return re.sub(r"\d", lambda m: m.group(0) * 2, "a1") + str(x.shape[0])


def test_re_with_a_callable_repl_keeps_its_break() -> None:
    x = t(2)
    report = kiln_dynamo.explain(_re_on_tensor_repr)(x)
    assert report.result == _re_on_tensor_repr(x)
    assert report.break_reasons or report.graph_count == 0


def _finditer(x: torch.Tensor) -> Any:
    return x * sum(int(m.group(0)) for m in re.compile(r"\d").finditer("1 2 3"))


def test_pattern_method_outside_the_table_breaks_and_stays_right() -> None:
    x = t(3)
    report = kiln_dynamo.explain(_finditer)(x)
    assert any("finditer" in str(r) for r in report.break_reasons), report
    torch.testing.assert_close(report.result, _finditer(x))


def _version_check(x: torch.Tensor) -> Any:
    v = version.parse(torch.__version__)
    if v >= version.parse("2.0") and v.major >= 2:
        x = x * 2
    if version.Version("1.9") > v:
        x = x + 100
    return x, v.release[:2] == (v.major, v.minor), str(version.Version("2.1.0"))


def test_packaging_version_comparison_folds() -> None:
    x = t(3)
    got = one_graph(_version_check, x)
    assert_same(got, _version_check(x))


_MIN = version.parse("2.0")


def _version_global(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if version.parse(torch.__version__) >= _MIN else x + 1


def test_version_from_a_global_is_guarded() -> None:
    global _MIN
    x = t(5)
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_version_global, backend=backend)
    torch.testing.assert_close(compiled(x), x * 2)
    old = _MIN
    try:
        _MIN = version.parse("99.0")  # the guard on the global recompiles; the branch flips
        torch.testing.assert_close(compiled(x), x + 1)
    finally:
        _MIN = old
    assert backend.graphs == 2


def _namedtuple(x: torch.Tensor) -> Any:
    P = collections.namedtuple("P", "a b", defaults=[0])
    p = P(x, x + 1)
    return p, P(x)._asdict(), p._fields, p.a + p[1]


def test_namedtuple_made_in_the_frame() -> None:
    x = t(3)
    got = one_graph(_namedtuple, x)
    want = _namedtuple(x)
    assert type(got[0]).__name__ == "P" and type(got[0]).__module__ == __name__
    assert type(got[0])._fields == type(want[0])._fields
    assert_same(tuple(got[0]), tuple(want[0]))
    assert_same(got[1:], want[1:])


def _namedtuple_bad(x: torch.Tensor) -> Any:
    return collections.namedtuple("P", "a a")


def test_namedtuple_with_an_invalid_field_list_raises_as_eager() -> None:
    import pytest

    with pytest.raises(ValueError, match="Encountered duplicate field name"):
        _namedtuple_bad(t(1))
    with pytest.raises(ValueError, match="Encountered duplicate field name"):
        kiln_dynamo.compile(_namedtuple_bad, backend=CountingBackend())(t(1))


def _wraps(x: torch.Tensor) -> Any:
    def deco(f: Any) -> Any:
        @functools.wraps(f)
        def w(*a: Any, **k: Any) -> Any:
            return f(*a, **k) + 1

        w.flag = True  # type: ignore[attr-defined]
        return w

    @deco
    def g(y: torch.Tensor) -> torch.Tensor:
        """Doubles."""
        return y * 2

    return (g(x), g.__name__, g.__qualname__, g.__doc__, g.__module__, g.__wrapped__(x),
            getattr(g, "flag", None), getattr(g, "missing", 5), hasattr(g, "nothing"),
            sorted(g.__annotations__))  # fmt: skip


def test_functools_wraps_on_a_function_made_in_the_frame() -> None:
    x = t(3)
    got = one_graph(_wraps, x)
    assert_same(got, _wraps(x))


def _vars(x: torch.Tensor) -> Any:
    class C:
        pass

    c = C()
    c.a = 1  # type: ignore[attr-defined]
    d = vars(c)
    d["b"] = 2  # seen by c.b
    c.e = 3  # type: ignore[attr-defined]  (seen by d)
    return x * c.b + getattr(c, "a", 0), dict(d), "e" in d, c.__dict__ == d, len(vars(c))


def test_vars_of_an_object_made_in_the_frame_is_its_live_dict() -> None:
    x = t(3)
    got = one_graph(_vars, x)
    assert_same(got, _vars(x))


class _Outside:
    def __init__(self) -> None:
        self.k = 2


def _vars_outside(x: torch.Tensor, o: _Outside) -> Any:
    return x * vars(o)["k"]


def test_vars_of_an_outside_object_is_guarded() -> None:
    x, o = t(3), _Outside()
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_vars_outside, backend=backend)
    torch.testing.assert_close(compiled(x, o), x * 2)
    o.k = 5
    torch.testing.assert_close(compiled(x, o), x * 5)


def _inference_block(x: torch.Tensor) -> Any:
    y = x + 1
    with torch.inference_mode():
        z = y * 2
        inner = torch.is_inference_mode_enabled()
    return z - 1, z, inner, torch.is_inference_mode_enabled()


def _inference_return_inside(x: torch.Tensor) -> Any:
    y = x.sin()
    with torch.inference_mode():
        return y * 2


def _inference_off_inside(x: torch.Tensor) -> Any:
    with torch.inference_mode(mode=False):
        return x * 3


def _same_inference(got: Any, want: Any) -> None:
    assert_same(got, want)
    pairs = zip(
        got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,), strict=True
    )
    for g, w in pairs:
        if isinstance(w, torch.Tensor):
            assert g.is_inference() == w.is_inference()


def test_inference_mode_block_untraced_is_two_clean_breaks_and_matches_eager() -> None:
    """With KILN_TRACE_INFERENCE_MODE=0 (tests/test_inference_mode.py has the traced block)."""
    prev = kiln_dynamo.set_trace_inference_mode(False)
    try:
        _two_clean_breaks()
    finally:
        kiln_dynamo.set_trace_inference_mode(prev)


def _two_clean_breaks() -> None:
    x = t(3)
    report = kiln_dynamo.explain(_inference_block)(x)
    reasons = [b.reason for b in report.break_reasons]
    assert len(reasons) == 2 and all("torch.inference_mode inside a compiled frame" in r for r in reasons), (
        reasons
    )
    assert all(b.note is None for b in report.break_reasons)  # no chain of frames: at the with line
    assert report.graph_count == 3
    _same_inference(report.result, _inference_block(x))
    xg = t(3).requires_grad_()
    _same_inference(kiln_dynamo.compile(_inference_block)(xg), _inference_block(xg))
    with torch.inference_mode():  # entered already: the same code, the mode guarded
        _same_inference(kiln_dynamo.compile(_inference_block)(x), _inference_block(x))


def test_inference_mode_block_variants_match_eager() -> None:
    for fn in (_inference_return_inside, _inference_off_inside):
        x = t(4)
        _same_inference(kiln_dynamo.compile(fn)(x), fn(x))
        xg = t(4).requires_grad_()
        _same_inference(kiln_dynamo.compile(fn)(xg), fn(xg))
    assert not torch.is_inference_mode_enabled()


def _seeded(x: torch.Tensor) -> torch.Tensor:
    import random

    random.seed(0)
    return x * random.random()


def _drawn(x: torch.Tensor) -> torch.Tensor:
    import random

    y = x * 2
    return y * random.uniform(1.0, 2.0)


def test_python_random_is_a_clean_break_in_program_order() -> None:
    import random

    report = kiln_dynamo.explain(_seeded)(t(3))
    assert report.graph_count == 1
    reasons = [b.reason for b in report.break_reasons]
    assert len(reasons) == 2 and all("Python's random number generator" in r for r in reasons), reasons
    for fn in (_seeded, _drawn):
        compiled = kiln_dynamo.compile(fn, backend=CountingBackend())
        x = t(3)
        random.seed(5)
        got = [compiled(x) for _ in range(3)]
        random.seed(5)
        want = [fn(x) for _ in range(3)]
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    random.seed(9)
    kiln_dynamo.compile(_drawn, backend=CountingBackend())(t(3))
    after_compiled = random.random()
    random.seed(9)
    _drawn(t(3))
    assert random.random() == after_compiled  # the generator's state advanced exactly as in eager


class _Obj:
    def __init__(self) -> None:
        self.k = 2


def _write_dict_read_attr(x: torch.Tensor, o: _Obj) -> Any:
    vars(o)["k"] = 3
    return x * o.k


def _write_dunder_dict_read_attr(x: torch.Tensor, o: _Obj) -> Any:
    o.__dict__["k"] = 3
    return x * o.k


def _store_then_read_dict(x: torch.Tensor, o: _Obj) -> Any:
    o.k = 4
    return x * vars(o)["k"]


def _read_dict_then_store(x: torch.Tensor, o: _Obj) -> Any:
    d = o.__dict__
    o.k = 5
    return x * d["k"]


def _read_both(x: torch.Tensor, o: _Obj) -> Any:
    return x * o.__dict__["k"] * o.k


def test_instance_dict_and_attributes_of_an_outside_object_stay_coherent() -> None:
    """Note [Two views of an instance dict]: each of these gave the value from before the write."""
    for fn in (
        _write_dict_read_attr,
        _write_dunder_dict_read_attr,
        _store_then_read_dict,
        _read_dict_then_store,
    ):
        got_o, want_o = _Obj(), _Obj()
        report = kiln_dynamo.explain(fn)(t(3), got_o)
        assert_same(report.result, fn(t(3), want_o))
        assert got_o.k == want_o.k
        assert any("Two views of an instance dict" in b.reason for b in report.break_reasons), fn
    o = _Obj()
    torch.testing.assert_close(one_graph(_read_both, t(3), o), t(3) * 4)


class _Mod(torch.nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.k = 2
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "write_dict":
            self.__dict__["k"] = 3
            return x * self.k
        if self.how == "vars_write":
            vars(self)["k"] = 6
            return x * self.k
        self.k = 4
        return x * self.__dict__["k"]


def test_instance_dict_and_attributes_of_a_module_stay_coherent() -> None:
    for how in ("write_dict", "vars_write", "store_then_dict"):
        got_m, want_m = _Mod(how), _Mod(how)
        report = kiln_dynamo.explain(got_m)(t(3))
        assert_same(report.result, want_m(t(3)))
        assert got_m.k == want_m.k
        assert any("Two views of an instance dict" in b.reason for b in report.break_reasons), how


def _outside(y: torch.Tensor) -> torch.Tensor:
    """Triples."""
    return y * 3


_outside.tag = "a"  # type: ignore[attr-defined]


def _wraps_outside(x: torch.Tensor) -> Any:
    @functools.wraps(_outside)
    def w(y: torch.Tensor) -> torch.Tensor:
        return _outside(y) + 1

    return w(x), w.__name__, w.__doc__, w.__wrapped__ is _outside, w.tag, sorted(w.__annotations__)  # type: ignore[attr-defined]


def test_functools_wraps_of_an_outside_function_reads_its_attributes_guarded() -> None:
    x = t(3)
    assert_same(one_graph(_wraps_outside, x), _wraps_outside(x))
    backend = CountingBackend()
    compiled = kiln_dynamo.compile(_wraps_outside, backend=backend)
    assert compiled(x)[4] == "a"
    try:
        _outside.tag = "b"  # type: ignore[attr-defined]  (read through its source: recompiles)
        assert compiled(x)[4] == "b"
    finally:
        _outside.tag = "a"  # type: ignore[attr-defined]
    assert backend.graphs == 2


def test_a_random_generator_object_from_outside_is_a_clean_break() -> None:
    import random

    rng_a, rng_b = random.Random(3), random.Random(3)

    def draw(x: torch.Tensor, rng: random.Random) -> torch.Tensor:
        return (x + 1) * rng.random()

    report = kiln_dynamo.explain(draw)(t(3), rng_a)
    assert any("Python's random number generator" in b.reason for b in report.break_reasons)
    assert_same(report.result, draw(t(3), rng_b))
    assert rng_a.getstate() == rng_b.getstate()
