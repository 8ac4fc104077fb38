"""A seeded random generator of small Python programs around tensors, and a differential runner.

Each seed gives one module's source text (readable, so a failure is a program to read): a few
globals, a small user class with a property and a class attribute, a dataclass, helpers, and a
function `f(x, y, lst, obj, d, k=3)` built inside `make()` so that it closes over a cell it
writes with `nonlocal`. The body mixes tensor ops with Python values of every common kind (ints,
floats, bools, strings, lists, tuples, dicts, sets), control flow (if/elif/else, for with
break/continue/else, bounded while, try/except/finally with raised exceptions, `with
torch.no_grad()`), closures, lambdas, comprehensions, generator expressions, star unpacking,
attribute writes, `getattr/hasattr/setattr`, and tensor values that feed Python (`.item()`,
`.shape`, `.tolist()`, `bool(t)`, branches on `t.sum() > 0`).

The runner executes the module twice, one copy run as plain Python and one whose `f` is
compiled, calls each several times in a row and between calls changes the outside state the
same way in both copies (globals, the closure cell, an object's attribute, the class attribute,
the list and dict passed in, an input tensor in place, the input length). After every call the
return values (types at every level; tensors with assert_close), the raised exception's type,
and the outside state must be the same. Programs are safe by construction (indices guarded,
loops bounded, values kept small), except for the exceptions they raise on purpose.

Run: `python pyfuzz.py --seeds 0:500 --dynamic none --backend eager` (the backend "kiln" needs the
kiln package); a failing seed prints its program and the difference.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import random
import re
import sys
import tempfile
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

KINDS = ("int", "float", "bool", "str", "list", "tuple", "dict", "set", "tensor")
ROUNDS = 4


def _paren(src: str) -> str:
    """Parenthesize a compound expression, so that `.method()` or an operator may follow it."""
    return f"({src})" if any(c in src for c in " -*%") else src


# lists the runner may make one object (its aliasing mutation, c == 13): frozen together
_ALIASED_LISTS = frozenset({"lst", "G_l", "obj.items"})


# --- the generator --------------------------------------------------------------------------------
@dataclass
class Scope:
    vars: dict[str, str] = field(default_factory=dict)  # name -> kind
    frozen: set[str] = field(default_factory=set)  # lists being iterated: never grown


class Gen:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lines: list[str] = []
        self.counter = 0
        self.scope = Scope(
            vars={
                "x": "tensor",
                "y": "tensor",
                "lst": "list",
                "d": "dict",
                "k": "int",
                "cell": "int",
                "G_i": "int",
                "G_l": "list",
                "G_s": "str",
            }
        )
        self.budget = self.rng.randint(6, 18)  # statements left
        self.loops = 0  # loops around the statement being generated

    # helpers
    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def pick(self, kind: str) -> str | None:
        names = [n for n, k in self.scope.vars.items() if k == kind]
        return self.rng.choice(names) if names else None

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    # expressions ---------------------------------------------------------------------------------
    def expr(self, kind: str, depth: int = 2) -> str:
        if depth <= 0 or self.chance(0.3):
            var = self.pick(kind)
            if var is not None and self.chance(0.7):
                return var
            return _paren(self.leaf(kind))
        return _paren(getattr(self, f"expr_{kind}")(depth - 1))

    def leaf(self, kind: str) -> str:
        r = self.rng
        return {
            "int": lambda: str(r.randint(-3, 9)),
            "float": lambda: r.choice(["0.5", "1.5", "-2.0", "3.25", "0.0"]),
            "bool": lambda: r.choice(["True", "False"]),
            "str": lambda: repr(r.choice(["a", "bc", "", "key", "k1"])),
            "list": lambda: r.choice(["[]", "[1, 2, 3]", "[4, -1]", "list(range(3))"]),
            "tuple": lambda: r.choice(["()", "(1, 2)", "(5, 0, 3)"]),
            "dict": lambda: r.choice(["{}", "{'a': 1}", "{'k1': 2, 'b': 3}"]),
            "set": lambda: r.choice(["set()", "{1, 2}", "{0, 5, 7}"]),
            "tensor": lambda: r.choice(["x", "y", "torch.ones_like(x)", "x * 0.5"]),
        }[kind]()

    def expr_int(self, d: int) -> str:
        e = self.expr
        opts: list[Callable[[], str]] = [
            lambda: f"({e('int', d)} + {e('int', d)}) % 97",
            lambda: f"({e('int', d)} * {e('int', d)}) % 89",
            lambda: f"{e('int', d)} // (abs({e('int', d)}) + 1)",
            lambda: f"-{e('int', d)}",
            lambda: f"len({e('list', d)})",
            lambda: f"len({e('str', d)})",
            lambda: f"len({e('dict', d)})",
            lambda: f"len({e('set', d)})",
            lambda: f"len({e('tuple', d)})",
            lambda: "x.shape[0]",
            lambda: f"{e('tensor', d)}.size(0)",
            lambda: f"{e('tensor', d)}.numel()",
            lambda: f"int({e('tensor', d)}.argmax())",
            lambda: f"int(({e('tensor', d)} > 0).sum())",
            lambda: f"len({e('tensor', d)}.tolist())",
            lambda: self._guarded_index(d),
            lambda: f"sum({e('list', d)}) % 101",
            lambda: f"max({e('list', d)}, default={e('int', d)})",
            lambda: f"min({e('tuple', d)}, default=0)",
            lambda: "obj.a",
            lambda: "obj.double",
            lambda: "Obj.cls_attr",
            lambda: "obj.count_items()",
            lambda: "G_i",
            lambda: "cell",
            lambda: f"helper({e('int', d)})",
            lambda: f"kw_helper({e('int', d)}, 2, z={e('int', d)})",
            lambda: f"{e('dict', d)}.get({e('str', d)}, {e('int', d)})",
            lambda: f"({e('int', d)} if {e('bool', d)} else {e('int', d)})",
            lambda: f"sum(v for v in {e('list', d)} if v > {e('int', d)}) % 97",
            lambda: f"len([v for v in {e('list', d)} if v % 2 == 0])",
            lambda: f"sum(i * v for i, v in enumerate({e('list', d)})) % 97",
            lambda: f"(sorted({e('list', d)})[0] if {e('list', 0)} else 0)",
            lambda: f"next(iter({e('list', d)}), -1)",
            lambda: f"getattr(obj, 'extra', {e('int', d)})",
            lambda: f"Point({e('int', d)}, {e('int', d)}).norm1()",
            lambda: f"(lambda q: q * 2 + 1)({e('int', d)}) % 97",
            lambda: f"sum(1 for _ in zip({e('list', d)}, {e('tuple', d)}))",
            lambda: f"sum(gen_double({e('list', d)})) % 97",
            lambda: f"global_then_break({e('tensor', d)})",
            lambda: f"len({self._bag(d)})",
            lambda: f"sum({self._bag(d)}) % 97",
            lambda: f"{self._bag(d)}.first",
            lambda: f"Bag.twice({e('int', d)})",
            lambda: "Bag.made % 7",
            lambda: f"({self._bag(d)}[0] if len({self.pick('bag') or 'Bag([1])'}) > 1 else 0)",
            lambda: f"obj_then_break(obj, {e('tensor', d)})",
            lambda: f"obj.peek({e('tensor', d)})",
            lambda: f"int(side_then_break({self._growable()}, {e('tensor', d)}))",
            lambda: f"bump_global({e('int', d)})",
            lambda: (
                f"push({self.pick('list') if self.pick('list') not in self.scope.frozen else 'hist'}, {e('int', d)})"
            ),
            lambda: "len(hist)",
            lambda: f"{e('tensor', d)}.ndim + int({e('tensor', d)}.is_contiguous())",
            lambda: "k",
        ]
        return self.rng.choice(opts)()

    def _bag(self, d: int) -> str:
        name = self.pick("bag")
        if name is not None and self.chance(0.7):
            return name
        return self.rng.choice(
            [
                f"Bag({self.expr('list', d)})",
                f"SortedBag({self.expr('list', d)})",
                f"Bag.of({self.expr('int', d)})",
            ]
        )

    def _growable(self) -> str:
        names = [n for n, k in self.scope.vars.items() if k == "list" and n not in self.scope.frozen]
        return self.rng.choice(names) if names else "hist"

    def _guarded_index(self, d: int) -> str:
        lst = self.pick("list") or "lst"
        return f"({lst}[{self.expr('int', d)} % len({lst})] if {lst} else 0)"

    def expr_float(self, d: int) -> str:
        e = self.expr
        opts: list[Callable[[], str]] = [
            lambda: f"{e('float', d)} * 0.5",
            lambda: f"{e('float', d)} + {e('int', d)}",
            lambda: f"{e('int', d)} / (abs({e('int', d)}) + 1)",
            lambda: f"{e('tensor', d)}.sum().item()",
            lambda: f"float({e('tensor', d)}.mean())",
            lambda: f"{e('tensor', d)}.max().item()",
            lambda: f"{e('tensor', d)}[0].item()",
            lambda: "obj.scale",
            lambda: f"float({e('int', d)})",
            lambda: f"sum({e('tensor', d)}.tolist())",
            lambda: f"math.sqrt(abs({e('float', d)}))",
            lambda: f"sum(t.item() for t in {e('tensor', d)})",
            lambda: f"sum([float(v) for v in {e('tensor', d)}])",
            lambda: f"max((t.sum().item() for t in {self.pick('tlist') or '[x, y]'}), default=0.0)",
        ]
        return self.rng.choice(opts)()

    def expr_bool(self, d: int) -> str:
        e = self.expr
        opts: list[Callable[[], str]] = [
            lambda: f"{e('int', d)} > {e('int', d)}",
            lambda: f"{e('int', d)} == {e('int', d)}",
            # Note [Comparisons of float sums]
            lambda: f"round({e('float', d)}, 3) < round({e('float', d)}, 3)",
            lambda: f"bool({e('tensor', d)}.sum() > 0)",
            lambda: f"bool(({e('tensor', d)} > {e('float', d)}).any())",
            lambda: f"{e('int', d)} in {e('list', d)}",
            lambda: f"{e('int', d)} in {e('set', d)}",
            lambda: f"{e('int', d)} in {self._bag(d)}",
            lambda: f"{e('str', d)} in {e('dict', d)}",
            lambda: (
                f"isinstance({e(self.rng.choice(KINDS), d)}, {self.rng.choice(['int', 'list', 'torch.Tensor', 'str', '(int, float)'])})"
            ),
            lambda: f"hasattr(obj, {self.rng.choice(['extra', 'a', 'nope'])!r})",
            lambda: f"not {e('bool', d)}",
            lambda: f"({e('bool', d)} and {e('bool', d)})",
            lambda: f"({e('bool', d)} or {e('bool', d)})",
            lambda: f"any(v > {e('int', d)} for v in {e('list', d)})",
            lambda: f"all(v % 2 for v in {e('tuple', d)})",
            lambda: f"{e('list', d)} == sorted({e('list', 0)})",
            lambda: f"{e('str', d)}.startswith({e('str', 0)})",
            lambda: f"{e('tensor', d)}.shape[0] > {e('int', d)}",
            lambda: "obj.flag",
        ]
        return self.rng.choice(opts)()

    def expr_str(self, d: int) -> str:
        e = self.expr
        opts: list[Callable[[], str]] = [
            lambda: f'f"{{{self.pick("int") or "k"}}}-{{{self.pick("str") or "G_s"}}}"[:8]',
            lambda: f'f"{{{self.pick("int") or "k"}:03d}}|{{{self.pick("float") or "obj.scale"}:.2f}}"',
            lambda: f"(str({e('int', d)}) + '-' + {e('str', d)})[:8]",
            lambda: f"({e('str', d)} + 'x')[:8]",
            lambda: f"'%d' % {e('int', d)}",
            lambda: f"str({e('int', d)})",
            lambda: f"{e('str', d)}.upper()",
            lambda: f"'-'.join(str(v) for v in {e('list', d)})[:8]",
            lambda: f"'{{}}:{{}}'.format({e('int', d)}, {e('str', 0)})[:8]",
            lambda: f"type({e(self.rng.choice(KINDS), d)}).__name__",
            lambda: "G_s",
            lambda: "obj.name",
        ]
        return self.rng.choice(opts)()

    def expr_list(self, d: int) -> str:
        e = self.expr
        opts: list[Callable[[], str]] = [
            lambda: f"[{e('int', d)}, {e('int', d)}]",
            lambda: f"{e('list', d)} + [{e('int', d)}]",
            lambda: f"[v * 2 % 97 for v in {e('list', d)}]",
            lambda: f"sorted({e('list', d)})",
            lambda: f"sorted({e('set', d)}, reverse=True)",
            lambda: f"list(reversed({e('list', d)}))",
            lambda: f"{e('list', d)}[{self.rng.randint(0, 2)}:{self.rng.choice(['', '3', '-1'])}]",
            lambda: f"list(range({e('int', d)} % 5))",
            lambda: f"[i for i, v in enumerate({e('list', d)}) if v % 2]",
            lambda: f"[*{e('list', d)}, {e('int', d)}]",
            lambda: f"list({e('tuple', d)})",
            lambda: f"[int(v > 0) for v in {e('tensor', d)}.tolist()]",
            lambda: f"list({e('dict', d)}.values())",
            lambda: f"[a + b for a, b in zip({e('list', d)}, {e('tuple', d)})]",
            lambda: f"list({e('tensor', d)}.shape)",
            lambda: "obj.items",
            lambda: "G_l",
            lambda: f"list(map(lambda q: q + 1, {e('list', d)}))",
            lambda: f"list(filter(lambda q: q > 0, {e('list', d)}))",
        ]
        return self.rng.choice(opts)()

    def expr_tuple(self, d: int) -> str:
        e = self.expr
        opts: list[Callable[[], str]] = [
            lambda: f"({e('int', d)}, {e('int', d)})",
            lambda: f"tuple({e('list', d)})",
            lambda: f"{e('tuple', d)}[1:]",
            lambda: f"(*{e('tuple', d)}, {e('int', d)})",
            lambda: f"tuple({e('tensor', d)}.shape)",
            lambda: f"tuple(sorted({e('dict', d)}))" if False else f"tuple(v for v in {e('list', d)} if v)",
        ]
        return self.rng.choice(opts)()

    def expr_dict(self, d: int) -> str:
        e = self.expr
        opts: list[Callable[[], str]] = [
            lambda: f"{{{e('str', d)}: {e('int', d)}}}",
            lambda: f"{{str(v): v for v in {e('list', d)}}}",
            lambda: f"dict({e('dict', d)})",
            lambda: f"{{**{e('dict', d)}, 'z': {e('int', d)}}}",
            lambda: f"dict(zip(['a', 'b'], {e('list', d)}))",
        ]
        return self.rng.choice(opts)()

    def expr_set(self, d: int) -> str:
        e = self.expr
        opts: list[Callable[[], str]] = [
            lambda: f"{{{e('int', d)}, {e('int', d)}}}",
            lambda: f"set({e('list', d)})",
            lambda: f"{e('set', d)} | {{{e('int', d)}}}",
            lambda: f"{e('set', d)} & set({e('list', d)})",
            lambda: f"{{v % 5 for v in {e('list', d)}}}",
        ]
        return self.rng.choice(opts)()

    def expr_tensor(self, d: int) -> str:
        e = self.expr
        opts: list[Callable[[], str]] = [
            lambda: f"{e('tensor', d)} + {e('tensor', d)}",
            lambda: f"{e('tensor', d)} * {e('int', d)}",
            lambda: f"{e('tensor', d)} * {e('float', d)}",
            lambda: f"{e('tensor', d)}.sin()",
            lambda: f"torch.relu({e('tensor', d)})",
            lambda: f"torch.where({e('tensor', d)} > 0, {e('tensor', d)}, {e('tensor', d)})",
            lambda: f"{e('tensor', d)}.clamp(min={e('float', d)})",
            lambda: f"obj.method({e('tensor', d)})",
            lambda: f"helper_t({e('tensor', d)})",
            lambda: f"helper_t({e('tensor', d)}, a={e('int', d)})",
            lambda: f"torch.stack([{e('tensor', d)}, {e('tensor', d)}]).sum(0)",
            lambda: f"{e('tensor', d)}.flip(0)",
            lambda: f"{e('tensor', d)}.cumsum(0)",
            lambda: f"torch.full_like({e('tensor', d)}, {e('int', d)})",
            lambda: f"{e('tensor', d)} * ({e('int', d)} if {e('bool', d)} else {e('float', d)})",
            lambda: f"{e('tensor', d)}.tanh()",
            lambda: f"({e('tensor', d)} + len({e('list', d)}))",
            lambda: f"torch.cat([{e('tensor', d)}[:1], {e('tensor', d)}[1:]])",
            lambda: f"{e('tensor', d)}.abs().sqrt()",
            lambda: "obj.t",
            lambda: "sum(obj.tl)",
            lambda: f"sum({self.pick('tlist') or 'obj.tl'})",
            lambda: f"torch.stack({self.pick('tlist') or '[x, y]'}).sum(0)",
            lambda: f"({self.pick('tdict') or '{1: x}'}).get('p', x)",
            lambda: f"sum(t * i for i, t in enumerate({self.pick('tlist') or 'obj.tl'}))",
        ]
        return self.rng.choice(opts)()

    # statements ----------------------------------------------------------------------------------
    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def block(self, indent: int, depth: int, n: int | None = None) -> None:
        """At least one statement at `indent`."""
        n = n if n is not None else self.rng.randint(1, 3)
        for _ in range(n):
            self.stmt(indent, depth)

    def stmt(self, ind: int, depth: int) -> None:
        self.budget -= 1
        r = self.rng
        simple = [
            (6, self.s_assign),
            (3, self.s_reassign),
            (3, self.s_list_mut),
            (2, self.s_dict_mut),
            (1, self.s_set_mut),
            (2, self.s_obj),
            (2, self.s_global),
            (1, self.s_cell),
            (1, self.s_unpack),
            (1, self.s_inplace),
            (2, self.s_lazy),
            (1, self.s_class),
            (2, self.s_misc),
            (1, self.s_tlist_mut),
            (2, self.s_jump),
        ]
        compound = [
            (3, self.s_if),
            (3, self.s_for),
            (1, self.s_while),
            (2, self.s_try),
            (1, self.s_no_grad),
            (1, self.s_closure),
            (1, self.s_closure_break),
        ]
        table = simple + (compound if depth > 0 and self.budget > 0 else [])
        weights = [w for w, _ in table]
        fn = r.choices([f for _, f in table], weights)[0]
        fn(ind, depth)

    def _scoped(self, fn: Callable[[], None]) -> None:
        """Run `fn` with names it binds forgotten afterwards (a branch may not have run)."""
        saved = dict(self.scope.vars)
        fn()
        self.scope.vars = saved

    def s_assign(self, ind: int, depth: int) -> None:
        kind = self.rng.choice(KINDS)
        name = self.fresh()
        self.emit(ind, f"{name} = {self.expr(kind)}")
        self.scope.vars[name] = kind

    def s_reassign(self, ind: int, depth: int) -> None:
        kind = self.rng.choice(["int", "tensor", "str", "float", "list"])
        name = self.pick(kind)
        if name is None or name in ("x", "y", "lst", "d", "G_l") or name in self.scope.frozen:
            return self.s_assign(ind, depth)
        if kind == "int":
            op = self.rng.choice(["+=", "-=", "*="])
            self.emit(ind, f"{name} {op} {self.expr('int', 1)}")
            self.emit(ind, f"{name} %= 1000")
        elif kind == "tensor":
            self.emit(ind, f"{name} = {self.expr('tensor', 2)}")
        elif kind == "str":
            self.emit(ind, f"{name} = ({name} + {self.expr('str', 1)})[:10]")
        elif kind == "float":
            self.emit(ind, f"{name} = {self.expr('float', 2)}")
        else:
            self.emit(ind, f"{name} = {self.expr('list', 2)}")

    def s_list_mut(self, ind: int, depth: int) -> None:
        names = [n for n, k in self.scope.vars.items() if k == "list"] + ["obj.items"]
        name = self.rng.choice(names)
        grow = name not in self.scope.frozen
        e = self.expr
        opts = [
            f"if {name}:\n{'    ' * (ind + 1)}{name}.pop()",
            f"if {name}:\n{'    ' * (ind + 1)}del {name}[{e('int', 1)} % len({name})]",
            f"if {name}:\n{'    ' * (ind + 1)}{name}[{e('int', 1)} % len({name})] = {e('int', 1)}",
            f"{name}.sort()",
            f"{name}.reverse()",
            f"del {name}[:1]",
        ]
        if grow:
            opts += [
                f"{name}.append({e('int', 1)})",
                f"{name}.extend([{e('int', 1)}, {e('int', 0)}])",
                f"{name}.insert({e('int', 1)}, {e('int', 1)})",
                f"{name} += [{e('int', 1)}]" if "." not in name else f"{name}.append(len({name}))",
                f"{name}[1:2] = [{e('int', 1)}, {e('int', 1)}]",
            ]
        self.emit(ind, self.rng.choice(opts))
        if self.chance(0.5):
            self.emit(ind, f"del {name}[8:]")  # bounded length

    def s_dict_mut(self, ind: int, depth: int) -> None:
        name = self.pick("dict") or "d"
        e = self.expr
        key = e("str", 0)
        opts = [
            f"{name}[{key}] = {e('int', 1)}",
            f"{name}.update({{{key}: {e('int', 1)}}})",
            f"{name}.pop({key}, None)",
            f"if {key} in {name}:\n{'    ' * (ind + 1)}del {name}[{key}]",
            f"{name}.setdefault({key}, {e('int', 1)})",
            f"for kk in list({name}):\n{'    ' * (ind + 1)}{name}[kk] = ({name}[kk] + 1) % 50",
        ]
        self.emit(ind, self.rng.choice(opts))

    def s_tlist_mut(self, ind: int, depth: int) -> None:
        name = self.pick("tlist")
        if name is None or name in self.scope.frozen:
            return self.s_misc(ind, depth)
        e = self.expr
        self.emit(
            ind,
            self.rng.choice(
                [
                    f"{name}.append({e('tensor', 1)})",
                    f"{name}[0] = {e('tensor', 1)}",
                    f"{name}.pop()\n{'    ' * ind}{name}.append(y)",
                    f"{name}[-1].add_(1) if {name}[-1] is not y else None",
                    f"for j{self.counter}, t{self.counter} in enumerate({name}):\n{'    ' * (ind + 1)}"
                    f"{name}[j{self.counter}] = t{self.counter} * 2",
                ]
            ),
        )

    def s_set_mut(self, ind: int, depth: int) -> None:
        name = self.pick("set")
        if name is None:
            return self.s_assign(ind, depth)
        self.emit(ind, f"{name}.{self.rng.choice(['add', 'discard'])}({self.expr('int', 1)})")

    def s_obj(self, ind: int, depth: int) -> None:
        e = self.expr
        opts = [
            f"obj.a = {e('int', 1)}",
            f"obj.scale = {e('float', 1)}",
            f"setattr(obj, 'extra', {e('int', 1)})",
            f"if hasattr(obj, 'extra'):\n{'    ' * (ind + 1)}del obj.extra",
            f"obj.flag = {e('bool', 1)}",
            f"obj.bump({e('int', 1)})",
            f"obj.name = {e('str', 1)}",
            f"p{self.counter} = Point({e('int', 1)}, {e('int', 1)})\n{'    ' * ind}p{self.counter}.x += 1\n"
            f"{'    ' * ind}obj.a = p{self.counter}.norm1() % 50",
        ]
        self.emit(ind, self.rng.choice(opts))

    def s_global(self, ind: int, depth: int) -> None:
        e = self.expr
        opts = [
            f"G_i = ({e('int', 1)}) % 1000",
            "G_i += 1",
            f"G_s = {e('str', 1)}",
            "G_l.append(G_i)" if "G_l" not in self.scope.frozen else "G_i -= 1",
            f"G_l = {e('list', 1)}" if "G_l" not in self.scope.frozen else "G_i += 2",
        ]
        self.emit(ind, self.rng.choice(opts))
        if self.chance(0.3):
            self.emit(ind, "del G_l[8:]")

    def s_cell(self, ind: int, depth: int) -> None:
        self.emit(ind, f"cell = (cell + {self.expr('int', 1)}) % 1000")

    def s_unpack(self, ind: int, depth: int) -> None:
        a, b = self.fresh(), self.fresh()
        if self.chance(0.5):
            self.emit(ind, f"{a}, *{b} = {self.expr('list', 1)} + [0]")
            self.scope.vars[a] = "int"
            self.scope.vars[b] = "list"
        else:
            self.emit(ind, f"{a}, {b} = {self.expr('int', 1)}, {self.expr('tensor', 1)}")
            self.scope.vars[a] = "int"
            self.scope.vars[b] = "tensor"

    def s_lazy(self, ind: int, depth: int) -> None:
        """A lazy iterator made, its source changed, then drained: the drain sees the change."""
        lst = self.pick("list") or "lst"
        if lst in self.scope.frozen:
            lst = "obj.items"
        # obj.items is frozen too inside a loop over lst, G_l or itself (_ALIASED_LISTS): seed
        # 4078 inserted into obj.items in a loop over G_l, which the previous call had made
        # obj.items, without end (plain Python hung as the compiled copy did)
        grow = lst not in self.scope.frozen
        it, out = self.fresh("it"), self.fresh()
        made = self.rng.choice(
            [
                f"(v * 2 for v in {lst})",
                f"map(helper, {lst})",
                f"filter(lambda q: q > 1, {lst})",
                f"iter({lst})",
                f"reversed({lst})",
                f"enumerate({lst})",
                f"zip({lst}, {lst})",
                "iter(d)",
                "iter(d.values())",
                "(t.sum() for t in [x, y])",
            ]
        )
        self.emit(ind, f"{it} = {made}")
        if self.chance(0.4):
            self.emit(ind, f"next({it}, None)")
        grown = [f"{lst}.append({self.expr('int', 1)})", f"{lst}.insert(0, {self.expr('int', 1)})"]
        change = self.rng.choice(
            [
                *(grown if grow else []),
                f"if {lst}:\n{'    ' * (ind + 1)}{lst}.pop(0)",
                f"{lst}[:] = [9, 8]",
                "d['zz'] = 1",
                "d['a'] = 5",
                "x.add_(2)",
            ]
        )
        self.emit(ind, change)
        self.emit(ind, f"{out} = str(list({it}))[:30]")
        self.scope.vars[out] = "str"

    def s_class(self, ind: int, depth: int) -> None:
        e = self.expr
        opts = [
            f"Obj.cls_attr = ({e('int', 1)}) % 50",
            f"{self.fresh()} = obj.dyn_{self.rng.choice(['ab', 'xyz'])}",  # Obj.__getattr__
            f"{self.fresh()} = sorted({e('list', 1)}, key=lambda q: (q % 3, -q))",
            f"{self.fresh()} = getattr(obj, 'missing', None)",
        ]
        line = self.rng.choice(opts)
        self.emit(ind, line)
        if not line.startswith("Obj."):
            name = line.split(" ")[0]
            kind = "int" if "dyn_" in line else "list" if "sorted" in line else None
            if kind:
                self.scope.vars[name] = kind

    def s_inplace(self, ind: int, depth: int) -> None:
        self.emit(
            ind,
            self.rng.choice(
                [
                    "x.add_(1)",
                    "x.mul_(0.5)",
                    f"x[0] = {self.expr('float', 1)}",
                    "x[:2].add_(1)",
                    "x.view(-1)[1:].mul_(-1)",
                    "hist.append(len(hist))\n" + "    " * ind + "del hist[5:]",
                ]
            ),
        )

    def s_misc(self, ind: int, depth: int) -> None:
        e = self.expr
        name = self.fresh()
        opts = [
            (f"{name} = list(gen_double({e('list', 1)}))", "list"),
            (f"{name} = Point({e('int', 1)}, {e('int', 1)})", None),
            (
                f"{name} = {e('int', 1)}\n{'    ' * ind}try:\n{'    ' * (ind + 1)}{name} = checked({name})\n"
                f"{'    ' * ind}except ValueError:\n{'    ' * (ind + 1)}{name} = -1",
                "int",
            ),
            (
                f"with Tracker(hist) as tr{self.counter}:\n{'    ' * (ind + 1)}{name} = len(tr{self.counter}.log)",
                "int",
            ),
            (f"{name} = [helper(v) for v in {e('list', 1)} if v != {e('int', 0)}]", "list"),
            (f"{name} = {{kk: vv * 2 for kk, vv in d.items() if vv > 1}}", "dict"),
            (f"{name} = [x, {e('tensor', 1)}]", "tlist"),
            (f"obj.t = {e('tensor', 1)}", None),
            (f"{name} = {self._bag(1)}\n{'    ' * ind}{name}.first = {e('int', 1)}", "bag"),
            (f"{name} = [v + 1 for v in {self._bag(1)}]", "list"),
            (f"obj.tl.append({e('tensor', 1)})\n{'    ' * ind}del obj.tl[3:]", None),
            (f"{name} = {{'p': {e('tensor', 1)}, 'q': y}}", "tdict"),
        ]
        line, kind = self.rng.choice(opts)
        self.emit(ind, line)
        if kind:
            self.scope.vars[name] = kind
        elif "Point(" in line:
            self.scope.vars[name] = "point"
            self.emit(ind, f"{name}.y = {e('int', 1)}")

    # Note [Comparisons of float sums]: many float expressions are sums of the same tensor values
    # computed another way (`x.sum() > sum(x.tolist())`), equal but for rounding, and a compiled
    # reduction may add in another order than eager (a last-bit difference, within assert_close,
    # that flips the comparison: pyfuzz seed 36 under the kiln backend). Comparisons of floats
    # are made at three decimals on both sides, so that such a tie is a tie in both runs.
    def s_if(self, ind: int, depth: int) -> None:
        cond = self.rng.choice(
            [
                self.expr("bool", 2),
                # Note [Comparisons of float sums]
                f"{self.expr('tensor', 1)}.sum().round(decimals=3) > round({self.expr('float', 1)}, 3)",
                f"{self.expr('int', 1)}",
            ]
        )
        self.emit(ind, f"if {cond}:")
        self._scoped(lambda: self.block(ind + 1, depth - 1))
        if self.chance(0.3):
            self.emit(ind, f"elif {self.expr('bool', 1)}:")
            self._scoped(lambda: self.block(ind + 1, depth - 1))
        if self.chance(0.5):
            self.emit(ind, "else:")
            self._scoped(lambda: self.block(ind + 1, depth - 1))
        if self.chance(0.15):
            self.emit(ind, f"if {self.expr('bool', 1)}:")
            self.emit(ind + 1, f"return {self.ret_expr()}")

    def s_for(self, ind: int, depth: int) -> None:
        v = self.fresh("i")
        lst = self.pick("list") or "lst"
        choice = self.rng.randrange(8)
        frozen = None
        if choice == 0:
            self.emit(ind, f"for {v} in range({self.expr('int', 1)} % 4):")
            kinds = {v: "int"}
        elif choice == 1:
            w = self.fresh("e")
            self.emit(ind, f"for {v}, {w} in enumerate({lst}):")
            kinds = {v: "int", w: "int"}
            frozen = lst
        elif choice == 2:
            w = self.fresh("e")
            self.emit(ind, f"for {v}, {w} in zip({lst}, {self.expr('tuple', 1)}):")
            kinds = {v: "int", w: "int"}
            frozen = lst
        elif choice == 3:
            dn = self.pick("dict") or "d"
            w = self.fresh("e")
            self.emit(ind, f"for {v}, {w} in {dn}.items():")
            kinds = {v: "str", w: "int"}
            frozen = dn
        elif choice == 4:
            self.emit(ind, f"for {v} in {self.expr('tensor', 1)}.tolist():")
            kinds = {v: "float"}
        elif choice == 5:
            self.emit(ind, f"for {v} in reversed({lst}):")
            kinds = {v: "int"}
            frozen = lst
        elif choice == 6:
            self.emit(ind, f"for {v} in sorted({self.expr('set', 1)}):")
            kinds = {v: "int"}
        else:
            self.emit(ind, f"for {v} in {lst}:")
            kinds = {v: "int"}
            frozen = lst

        def body() -> None:
            self.scope.vars.update(kinds)
            was = set(self.scope.frozen)
            if frozen is not None:
                self.scope.frozen.add(frozen)
                if frozen == "d" or self.scope.vars.get(frozen) == "dict":
                    self.scope.frozen.add("d")
                if frozen in _ALIASED_LISTS:  # the runner may pass one as another (`w.lst = G_l`):
                    # growing G_l in a loop over lst never ended (seed 24053, a MemoryError)
                    self.scope.frozen |= _ALIASED_LISTS
            if self.chance(0.3):
                self.emit(ind + 1, f"if {self.expr('bool', 1)}:")
                self.emit(ind + 2, self.rng.choice(["break", "continue"]))
            self.loops += 1
            self.block(ind + 1, depth - 1)
            self.loops -= 1
            self.scope.frozen = was

        self._scoped(body)
        if self.chance(0.25):
            self.emit(ind, "else:")
            self._scoped(lambda: self.block(ind + 1, depth - 1, 1))

    def s_while(self, ind: int, depth: int) -> None:
        c = self.fresh("w")
        self.emit(ind, f"{c} = 0")
        self.emit(ind, f"while {c} < {self.expr('int', 1)} % 4:")
        self.emit(ind + 1, f"{c} += 1")
        self.scope.vars[c] = "int"
        if self.chance(0.3):
            self.emit(ind + 1, f"if {self.expr('bool', 1)}:")
            self.emit(ind + 2, "break")
        self.loops += 1
        self._scoped(lambda: self.block(ind + 1, depth - 1))
        self.loops -= 1
        if self.chance(0.2):
            self.emit(ind, "else:")
            self.emit(ind + 1, "G_i = (G_i + 7) % 1000")

    def s_try(self, ind: int, depth: int) -> None:
        self.emit(ind, "try:")
        exc = self.rng.choice(["ValueError", "KeyError", "IndexError", "ZeroDivisionError"])

        has_finally = self.chance(0.4)

        def body() -> None:
            self.block(ind + 1, depth - 1)
            if has_finally and self.chance(0.3):
                self.emit(ind + 1, f"if {self.expr('bool', 1)}:")
                self.emit(ind + 2, f"return {self.ret_expr()}")
            raiser = {
                "ValueError": f"raise ValueError({self.expr('str', 1)})",
                "KeyError": f"{self.pick('dict') or 'd'}['missing_key']",
                "IndexError": f"{self.pick('list') or 'lst'}[100]",
                "ZeroDivisionError": f"{self.expr('int', 1)} // 0",
            }[exc]
            self.emit(ind + 1, f"if {self.expr('bool', 1)}:")
            self.emit(ind + 2, raiser)

        self._scoped(body)
        caught = exc if self.chance(0.85) else "TypeError"
        as_ = self.fresh("err")
        self.emit(ind, f"except {caught} as {as_}:")
        self.emit(ind + 1, f"G_s = type({as_}).__name__")
        self._scoped(lambda: self.block(ind + 1, depth - 1, 1))
        if has_finally:
            self.emit(ind, "finally:")
            self._scoped(lambda: self.block(ind + 1, depth - 1, 1))

    def s_jump(self, ind: int, depth: int) -> None:
        """`break`/`continue` anywhere in a loop's body: inside try/finally, with, if."""
        if not self.loops:
            return self.s_assign(ind, depth)
        self.emit(ind, f"if {self.expr('bool', 1)}:")
        if self.chance(0.5):
            self.emit(ind + 1, "G_i = (G_i + 1) % 1000")
        self.emit(ind + 1, self.rng.choice(["break", "continue"]))

    def s_no_grad(self, ind: int, depth: int) -> None:
        self.emit(ind, "with torch.no_grad():")
        name = self.fresh()
        self.emit(ind + 1, f"{name} = {self.expr('tensor', 2)}")
        self.scope.vars[name] = "tensor"
        if self.chance(0.5):
            self.block(ind + 1, depth - 1, 1)

    def s_closure_break(self, ind: int, depth: int) -> None:
        """A closure made in the frame whose body breaks the graph, reading and writing the frame's cells."""
        fn, box = self.fresh("fn"), self.fresh("box")
        self.emit(ind, f"{box} = [{self.expr('int', 1)}]")
        self.emit(ind, f"def {fn}(t, z={self.expr('int', 0)}):")
        self.emit(ind + 1, f"{box}.append(z)")
        self.emit(ind + 1, f"del {box}[4:]")
        self.emit(ind + 1, "if t.sum() > 0:")
        self.emit(ind + 2, f"return t * len({box})")
        self.emit(ind + 1, f"return t - {box}[0]")
        self.scope.vars[box] = "list"
        name = self.fresh()
        self.emit(ind, f"{name} = {fn}({self.expr('tensor', 1)}) + {fn}(y, z=2)")
        self.scope.vars[name] = "tensor"

    def s_closure(self, ind: int, depth: int) -> None:
        acc, fn = self.fresh("acc"), self.fresh("fn")
        self.emit(ind, f"{acc} = {self.expr('int', 1)}")
        self.emit(ind, f"def {fn}(z):")
        self.emit(ind + 1, f"nonlocal {acc}")
        self.emit(ind + 1, f"{acc} = ({acc} + z) % 97")
        self.emit(ind + 1, f"return {acc} * 2")
        self.scope.vars[acc] = "int"
        name = self.fresh()
        self.emit(ind, f"{name} = {fn}({self.expr('int', 1)}) + {fn}({self.expr('int', 1)})")
        self.scope.vars[name] = "int"

    def ret_expr(self) -> str:
        names = list(self.scope.vars)
        self.rng.shuffle(names)
        chosen = names[: self.rng.randint(1, 4)]
        return "(" + ", ".join(chosen) + ",)"

    def program(self) -> str:
        body_start = len(self.lines)
        while self.budget > 0:
            self.stmt(2, 2)
        body = self.lines[body_start:]
        ret = self.ret_expr()
        return PRELUDE + "\n".join(body) + f"\n        return {ret}\n" + EPILOGUE


PRELUDE = """\
import math
from dataclasses import dataclass

import torch

G_i = 3
G_l = [1, 2]
G_s = "g"


class Obj:
    cls_attr = 2

    def __init__(self):
        self.a = 1
        self.scale = 0.5
        self.items = [3, 1, 2]
        self.flag = True
        self.name = "obj"
        self.t = torch.zeros(1)
        self.tl = [torch.ones(1)]

    @property
    def double(self):
        return self.a * 2

    def method(self, t):
        return t * self.scale + self.a

    def bump(self, n):
        self.a = (self.a + n) % 50
        return self.a

    def count_items(self):
        return len(self.items)

    def peek(self, t):
        self.a = (self.a + 1) % 50
        self.items.append(len(t.tolist()))
        del self.items[8:]
        return self.a

    def __getattr__(self, name):
        if name.startswith("dyn_"):
            return len(name) * self.a
        raise AttributeError(name)


class Bag:
    # a user container: protocols, a property with a setter, class/static methods, super()

    made = 0

    def __init__(self, items):
        self.items = list(items)
        Bag.made += 1

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __contains__(self, v):
        return v in self.items

    @property
    def first(self):
        return self.items[0] if self.items else -1

    @first.setter
    def first(self, v):
        if self.items:
            self.items[0] = v
        else:
            self.items.append(v)

    @classmethod
    def of(cls, n):
        return cls(range(n % 4))

    @staticmethod
    def twice(v):
        return v * 2


class SortedBag(Bag):
    def __init__(self, items):
        super().__init__(sorted(items))

    def __len__(self):
        return super().__len__() + 1


@dataclass
class Point:
    x: int
    y: int

    def norm1(self):
        return abs(self.x) + abs(self.y)


def helper(a):
    return (a * 3 + 1) % 97


def helper_t(t, a=2):
    return t * a - 1


def kw_helper(*args, **kw):
    return (len(args) + sum(kw.values())) % 97


def gen_double(items):
    for v in items:
        if v > 50:
            return
        yield v * 2


def bump_global(n):
    global G_i
    G_i = (G_i + n) % 1000
    return G_i


def push(items, v):
    items.append(v)
    del items[8:]
    return len(items)


def side_then_break(items, t):
    items.append(len(items))
    del items[8:]
    v = t.sum().item()
    items.append(int(v > 0))
    return v


def global_then_break(t):
    global G_i
    G_i = (G_i + 1) % 1000
    if t.sum() > 0:
        G_i = (G_i + 2) % 1000
    return G_i


def obj_then_break(o, t):
    o.a = (o.a + 1) % 50
    n = int(t.argmax())
    o.items.append(n)
    del o.items[8:]
    return o.a + n


def checked(v):
    if v % 3 == 0:
        raise ValueError("multiple of 3")
    return v


class Tracker:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append(1)
        return self

    def __exit__(self, *exc):
        self.log.append(2)
        del self.log[8:]
        return False


def make():
    cell = 0

    def set_cell(v):
        nonlocal cell
        cell = v

    def get_cell():
        return cell

    def f(x, y, lst, obj, d, k=3, hist=[]):
        global G_i, G_l, G_s
        nonlocal cell
"""

EPILOGUE = """
    return f, set_cell, get_cell
"""


def generate(seed: int) -> str:
    return Gen(seed).program()


# --- the runner -----------------------------------------------------------------------------------
class Mismatch(AssertionError):
    pass


# Note [Tensor reprs name their grad_fn]: a program may print tensors (`str(list(it))` over an
# iterator of tensor sums); a tensor that requires grad prints its grad_fn's class, which is
# `SumBackward0` in eager and the compiled graph's own autograd node when the sum was computed in a
# compiled graph (as under torch.compile). That name is not the program's result; the printed value
# is. Strings are compared with every grad_fn name blanked (a cut string may end inside one).
_GRAD_FN = re.compile(r"grad_fn=<\w*>?")


def _grad_fns_named_alike(text: str) -> str:
    return _GRAD_FN.sub("grad_fn=<>", text)


def same(a: Any, b: Any, path: str) -> None:
    ta, tb = type(a), type(b)
    if ta is not tb and not (ta.__qualname__ == tb.__qualname__ and ta.__module__.startswith("pyfuzz_")):
        raise Mismatch(f"{path}: type {type(a).__name__} != {type(b).__name__} ({a!r} vs {b!r})")
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype or a.requires_grad != b.requires_grad:
            raise Mismatch(
                f"{path}: {a.shape}/{a.dtype}/{a.requires_grad} != {b.shape}/{b.dtype}/{b.requires_grad}"
            )
        try:
            torch.testing.assert_close(a.detach(), b.detach(), equal_nan=True)
        except AssertionError as e:
            raise Mismatch(f"{path}: {e}") from None
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise Mismatch(f"{path}: len {len(a)} != {len(b)} ({a!r} vs {b!r})")
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            same(u, v, f"{path}[{i}]")
    elif isinstance(a, dict):
        if list(a) != list(b):
            raise Mismatch(f"{path}: keys {list(a)} != {list(b)}")
        for key in a:
            same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, float):
        if not (
            a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5)
        ):
            raise Mismatch(f"{path}: {a!r} != {b!r}")
    elif isinstance(a, str):
        if _grad_fns_named_alike(a) != _grad_fns_named_alike(b):
            raise Mismatch(f"{path}: {a!r} != {b!r}")
    elif isinstance(a, (set, int, bool, type(None))):
        if a != b:
            raise Mismatch(f"{path}: {a!r} != {b!r}")
    elif hasattr(a, "__dict__"):
        same(dict(vars(a)), dict(vars(b)), f"{path}.__dict__")
    elif a != b:
        raise Mismatch(f"{path}: {a!r} != {b!r}")


@dataclass
class World:
    """One copy of a program and the outside state it reads and writes."""

    ns: dict[str, Any]
    f: Callable[..., Any]
    set_cell: Callable[[int], None]
    get_cell: Callable[[], int]
    x: torch.Tensor
    y: torch.Tensor
    lst: list[int]
    obj: Any
    d: dict[str, int]
    raw_f: Any = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    grad: bool = True
    last_traceback: str = ""

    def state(self) -> dict[str, Any]:
        return {
            "G_i": self.ns["G_i"],
            "G_l": list(self.ns["G_l"]),
            "G_s": self.ns["G_s"],
            "cell": self.get_cell(),
            "x": self.x.clone(),
            "y": self.y.clone(),
            "lst": list(self.lst),
            "obj": dict(vars(self.obj)),
            "cls_attr": self.ns["Obj"].cls_attr,
            "d": dict(self.d),
            "hist": list(self.raw_f.__defaults__[1]),
        }


def build_world(code: Any, seed: int, tag: str) -> World:
    module = types.ModuleType(f"pyfuzz_{seed}_{tag}")
    sys.modules[module.__name__] = module  # dataclasses looks its module up
    ns = module.__dict__
    exec(code, ns)
    f, set_cell, get_cell = ns["make"]()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, generator=g)
    y = torch.randn(5, generator=g)
    y.requires_grad_(seed % 4 == 0)
    return World(ns, f, set_cell, get_cell, x, y, [4, 0, 7], ns["Obj"](), {"a": 1, "k1": 5}, f)


def mutate(w: World, rnd: int, rng: random.Random, dynamic_sizes: bool) -> None:
    """Change the outside state between calls (the same draws in both worlds: rng is shared-seeded)."""
    for _ in range(rng.randint(1, 3)):
        c = rng.randrange(17)
        if c == 0:
            w.ns["G_i"] = (w.ns["G_i"] + 1 + rnd) % 1000
        elif c == 1:
            w.ns["G_l"].append(rnd)
        elif c == 2:
            w.obj.a = rnd * 3 % 7
        elif c == 3:
            w.obj.scale = w.obj.scale * -1.5
        elif c == 4:
            if w.lst and rng.random() < 0.5:
                w.lst.pop()
            else:
                w.lst.append(rnd)
        elif c == 5:
            w.d[f"k{rnd}"] = rnd
        elif c == 6:
            w.set_cell(w.get_cell() + 5)
        elif c == 7:
            w.x.add_(1.0)
        elif c == 8:
            w.ns["Obj"].cls_attr += 1
        elif c == 9:
            w.obj.flag = not getattr(w.obj, "flag", False)
        elif c == 12:
            w.grad = not w.grad
        elif c == 13:  # aliasing between inputs and outside state
            alias = rng.randrange(5)
            if alias == 0:
                w.lst = w.obj.items
            elif alias == 1:
                w.lst = w.ns["G_l"]
            elif alias == 2:
                w.y = w.x
            elif alias == 3:
                w.lst = list(w.lst)
            else:
                w.obj.tl = [w.x, w.y]
        elif c == 14:  # a value changes type
            change = rng.randrange(5)
            if change == 0:
                w.ns["G_i"] = rng.choice([True, 2.5, -4])
            elif change == 1:
                w.obj.a = rng.choice([1.5, False, 7])
            elif change == 2:
                w.obj.flag = rng.choice([0, 1, None, [1]])
            elif change == 3:
                w.d["a"] = rng.choice([2.0, True, 3])
            else:
                w.lst.append(rng.choice([True, 1.25, -2]))
        elif c == 15:  # functions and methods replaced
            change = rng.randrange(4)
            if change == 0:
                w.ns["helper"] = lambda a: (a + 5) % 97
            elif change == 1:
                w.obj.method = lambda t: t * 3
            elif change == 2:
                w.ns["Obj"].double = property(lambda self: self.a * 3)
            else:
                w.obj.cls_attr = 11  # shadows the class attribute
        elif c == 16:
            if "flag" in vars(w.obj):
                del w.obj.flag  # Obj.__getattr__ raises AttributeError now
        elif c == 11:
            w.kwargs = {"k": rnd % 4} if rng.random() < 0.7 else {}
        elif c == 10 and dynamic_sizes:
            n = rng.choice([3, 4, 6, 7])
            g = torch.Generator().manual_seed(rnd)
            w.x = torch.randn(n, generator=g)
            w.y = torch.randn(n, generator=g)


def call(w: World) -> tuple[str, Any]:
    try:
        with torch.set_grad_enabled(w.grad):
            return "ok", w.f(w.x, w.y, w.lst, w.obj, w.d, **w.kwargs)
    except Exception as e:
        w.last_traceback = traceback.format_exc()
        return "raise", type(e)


@dataclass
class Outcome:
    seed: int
    ok: bool
    message: str = ""
    source: str = ""


def run_seed(
    seed: int,
    compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]],
    *,
    rounds: int = ROUNDS,
    sizes_change: bool = True,
) -> Outcome:
    """Run program `seed` as plain Python and compiled (`compile_fn(f)`), `rounds` calls each."""
    return run_source(generate(seed), seed, compile_fn, rounds=rounds, sizes_change=sizes_change)


def run_source(
    source: str,
    seed: int,
    compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]],
    *,
    rounds: int = ROUNDS,
    sizes_change: bool = True,
) -> Outcome:
    """`run_seed` over a given program (a generated one, edited by hand to minimize a failure)."""
    path = os.path.join(tempfile.gettempdir(), f"pyfuzz_{seed}.py")
    with open(path, "w") as fh:
        fh.write(source)
    try:
        code = compile(source, path, "exec")
    except SyntaxError:
        return Outcome(seed, False, "the generator wrote invalid Python:\n" + traceback.format_exc(), source)
    eager = build_world(code, seed, "eager")
    comp = build_world(code, seed, "compiled")
    try:
        comp.f = compile_fn(comp.f)
    except Exception:
        return Outcome(seed, False, "compile_fn raised:\n" + traceback.format_exc(), source)
    rng_e, rng_c = random.Random(seed + 1), random.Random(seed + 1)
    for rnd in range(rounds):
        if rnd:
            mutate(eager, rnd, rng_e, sizes_change)
            mutate(comp, rnd, rng_c, sizes_change)
        want = call(eager)
        try:
            got = call(comp)
        except BaseException:
            return Outcome(seed, False, f"round {rnd}: crash\n" + traceback.format_exc(), source)
        try:
            if want[0] != got[0]:
                raise Mismatch(f"outcome {want} != {got}\n{eager.last_traceback}\n{comp.last_traceback}")
            same(want[1], got[1], "result")
            same(eager.state(), comp.state(), "state")
        except Mismatch as m:
            return Outcome(seed, False, f"round {rnd}: {m}", source)
    return Outcome(seed, True, source=source)


def dynamo_compile(
    backend: Any = "eager", dynamic: bool | None = None
) -> Callable[[Callable[..., Any]], Any]:
    import kiln_dynamo

    return lambda fn: kiln_dynamo.compile(fn, backend, dynamic=dynamic)


def kiln_compile(backend: str = "kiln", dynamic: bool | None = None) -> Callable[[Callable[..., Any]], Any]:
    import importlib

    kiln = importlib.import_module("kiln")  # not a dependency of kiln-dynamo's tests
    return lambda fn: kiln.compile(fn, backend=backend, dynamic=dynamic)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0:100", help="a:b (half-open)")
    p.add_argument("--backend", default="eager", help="eager | aot_eager | kiln (via kiln.compile)")
    p.add_argument("--dynamic", default="none", choices=["none", "true", "false"])
    p.add_argument("--show", action="store_true", help="print the program of each failure")
    p.add_argument("--print", dest="print_seed", type=int, default=None, help="print one program and exit")
    p.add_argument("--breaks", action="store_true", help="count graph-break reasons")
    args = p.parse_args(argv)
    if args.print_seed is not None:
        print(generate(args.print_seed))
        return 0
    import kiln_dynamo

    dynamic = {"none": None, "true": True, "false": False}[args.dynamic]
    if args.backend in ("kiln", "aot_eager") or os.environ.get("PYFUZZ_VIA_KILN"):
        make = kiln_compile(args.backend, dynamic)
    else:
        make = dynamo_compile(args.backend, dynamic)
    a, b = (int(v) for v in args.seeds.split(":"))
    failures: list[Outcome] = []
    reasons: collections.Counter[str] = collections.Counter()
    for seed in range(a, b):
        kiln_dynamo.reset()
        out = run_seed(seed, make, sizes_change=dynamic is not False)
        if args.breaks:
            for br in kiln_dynamo.counters.break_reasons:
                reasons[str(getattr(br, "reason", br)).split("\n")[0][:100]] += 1
        if not out.ok:
            failures.append(out)
            print(f"FAIL seed {seed}: {out.message.splitlines()[0] if out.message else ''}", flush=True)
            if args.show:
                print(out.source)
                print(out.message)
    print(f"{b - a} seeds, {len(failures)} failures: {[o.seed for o in failures]}")
    if args.breaks:
        for r, n in reasons.most_common(25):
            print(f"{n:6d}  {r}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
