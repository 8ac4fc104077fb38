"""Compiling a capture's guard into a C guard tree (kiln_frame_hook.GuardTree).

The model. `guards.py` records every check twice: as a Python expression (the readable
reference guard, which also explains failures) and as `CCheck`s, a kind over a `Source`.
Sources form a tree rooted at the frame's entry values (or at constants: ACTIVE, a globals
dict, torch's hook registries), and this module walks it: each distinct source becomes one
load into a slot of the tree's program (`L['self']` → `._modules` → `['fc']` → `._parameters`
→ `['weight']`), however many checks read it or below it, and each check becomes one op on
its slot. The frame hook runs the program in C; the Python guard runs only to explain a failure.

Order (the verdict is a conjunction, so order changes speed, not answers): checks on global
state and constants first (grad mode, the compile key: cheap, and what changes between calls
most), then the entry values' tensors in one packed loop (a new shape or dtype fails there),
then everything reached through attributes in source order, and last the packed table of the
remaining tensors (parameters and buffers).

A part whose checks this module cannot express (a source kind it does not know) stays in a
*residual* Python guard that the tree calls after its own checks pass; `Guard.residual_parts`
counts them (the public models need none). `KILN_C_GUARDS=0` (or `set_c_guards(False)`) turns
the tree off: entries then carry the Python guard, as before. A tree skips, on a call, the loads and
checks whose inputs its dict and type version witnesses say did not change since its last passing
call (Note [Skipping what did not change] in kiln_frame_hook's guard_memo.c; the tensor tables
always run); `KILN_GUARD_MEMO=0` (or `set_guard_memo(False)`) turns that off.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import kiln_frame_hook as hook
from kiln_dynamo.source import (
    AttrSource,
    ClosureSource,
    ConstSource,
    DictEntrySource,
    ForeignGlobalSource,
    GetItemSource,
    GlobalSource,
    InstanceDictSource,
    LocalSource,
    Source,
    TypeSource,
)
from kiln_dynamo.tensor_check import dispatch_keys, install
from kiln_frame_hook import GuardOp, op

_enabled = os.environ.get("KILN_C_GUARDS", "1") != "0"
_memo = os.environ.get("KILN_GUARD_MEMO", "1") != "0"


def c_guards_enabled() -> bool:
    return _enabled


def set_c_guards(on: bool) -> bool:
    """Build C guard trees for new entries (True) or Python guards only; returns the previous
    setting. Entries already cached keep the guard they were made with."""
    global _enabled
    previous, _enabled = _enabled, on
    return previous


def guard_memo_enabled() -> bool:
    return _memo


def set_guard_memo(on: bool) -> bool:
    """Let new guard trees skip what did not change since their last passing call (True), or run
    every op on every call; returns the previous setting (Note [Skipping what did not change] in
    kiln_frame_hook's guard_memo.c; KILN_GUARD_MEMO=0 turns it off)."""
    global _memo
    previous, _memo = _memo, on
    return previous


@dataclass(slots=True)
class Agreement:
    """What `checking_agreement` saw: calls that compared both evaluators, and disagreements."""

    calls: int = 0
    disagreements: list[str] = field(default_factory=list)
    # the last entry values each tree was called with, by id of the tree (for benchmarks)
    last_values: dict[int, tuple[hook.GuardTree, tuple[Any, ...]]] = field(default_factory=dict)


_agreement: Agreement | None = None


@contextlib.contextmanager
def checking_agreement() -> Iterator[Agreement]:
    """For tests: entries made within the block hold `Agreeing` guards, which run the C tree and
    the Python guard on every call, record any difference, and answer with the tree's verdict."""
    global _agreement
    previous, _agreement = _agreement, Agreement()
    try:
        yield _agreement
    finally:
        _agreement = previous


def agreement() -> Agreement | None:
    return _agreement


class Agreeing:
    """A cache guard that evaluates both ways (see checking_agreement)."""

    __slots__ = ("log", "tree")

    def __init__(self, tree: hook.GuardTree, log: Agreement) -> None:
        self.tree = tree  # compared with tree.reference.fn, the Python guard it was compiled from
        self.log = log

    @property
    def reference(self) -> Any:
        return self.tree.reference

    def __call__(self, *values: Any) -> bool:
        c = bool(self.tree(*values))
        py = bool(self.reference.fn(*values))
        self.log.calls += 1
        self.log.last_values[id(self.tree)] = (self.tree, values)
        if c != py:
            reason = self.reference.failure_reason(values)
            self.log.disagreements.append(f"C tree says {c}, Python guard says {py} ({reason})")
        return c


def memo_report(tree: hook.GuardTree) -> str:
    """What a tree's memo skips on a warm call (Note [Skipping what did not change]): counts, and
    the ops it still runs. The memo is recorded in C on a tree's first passing call, after the
    KILN_LOG=guards text was printed: call this on a cache entry's guard to see it."""
    m = tree.memo
    if m is None:
        return "guard memo: off"
    if not m["valid"]:
        return f"guard memo: nothing recorded yet ({m['misses']} misses)"
    ops = tree.ops
    run = [
        f"  {GuardOp(ops[i][0]).name} s{ops[i][2]} {ops[i][5] if isinstance(ops[i][5], str) else ''}".rstrip()
        for i in m["run"]
    ]
    head = (
        f"guard memo: {m['skipped_ops']} of {tree.nops} ops skipped on a warm call, {m['witnesses']} witnesses; "
        f"{m['hits']} hits, {m['misses']} misses; still run:"
    )
    return "\n".join([head, *run])


# The CCheck kinds guards.py records (each one op, or a row of a tensor table).
CHECK_KINDS = (
    "type_is",
    "is",
    "is_ref",
    "id_eq",
    "eq",
    "same_float",
    "item_types",
    "len",
    "keys",
    "not_in",
    "falsy",
    "same",
    "tensor",
    "call_is",
    "call_eq",
)


class NotInC(Exception):
    """A check or source the tree cannot express: it stays in the residual Python guard."""


# Tensor types whose `is_cpu` and `device` are torch's own getters with no __torch_function__:
# for them a CPU device is checked through `t.is_cpu` (Note [Tensor metadata through the
# attribute protocol] in kiln_frame_hook's guard_tree.c).
_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _cpu_shortcut(t: type, device: torch.device) -> bool:
    base = torch._C.TensorBase
    return (
        device.type == "cpu"
        and t in _PLAIN_TENSOR_TYPES
        and t.device is base.device
        and t.is_cpu is base.is_cpu
    )


def _plain_getters(t: type) -> bool:
    """Whether `t`'s metadata getters are torch's own (Note [The torch-linked tensor checker])."""
    base = torch._C.TensorBase
    names = ("dtype", "device", "is_cpu", "requires_grad", "shape", "stride")
    return t in _PLAIN_TENSOR_TYPES and all(getattr(t, n) is getattr(base, n) for n in names)


def _root(source: Source) -> Source:
    while hasattr(source, "base"):
        source = source.base
    return source


def _label(value: object) -> str:
    if isinstance(value, weakref.ref):
        value = value()
    if isinstance(value, type):
        return value.__qualname__
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return name if isinstance(name, str) else repr(value)


class TreeCompiler:
    """Turns CChecks into ops; one slot per distinct source (the shared prefixes)."""

    def __init__(self, entry_names: list[str], globals_dict: dict[str, Any]) -> None:
        self.entry_names = entry_names
        self.globals_dict = globals_dict
        self.ops: list[tuple[int, int, int, int, int, object, object]] = []
        self.lines: list[str] = []  # the tree as text, one line per op
        self.depth: list[int] = [0] * len(entry_names)
        self.slots: dict[Source, int] = {LocalSource(n): i for i, n in enumerate(entry_names)}
        self.consts: dict[int, int] = {}
        self.nslots = len(entry_names)
        self.tensor_rows: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]] = ([], [])
        self.tensor_lines: tuple[list[str], list[str]] = ([], [])

    # --- loads ---------------------------------------------------------------------------
    def _load(
        self, code: GuardOp, src: int, text: str, obj: object = None, obj2: object = None, n: int = 0
    ) -> int:
        dst = self.nslots
        self.nslots += 1
        self.ops.append(op(code, dst, src, n=n, obj=obj, obj2=obj2))
        depth = self.depth[src] + 1 if src >= 0 else 0
        self.depth.append(depth)
        self.lines.append("  " * depth + f"s{dst} = {text}")
        return dst

    def const(self, obj: object, label: str) -> int:
        hit = self.consts.get(id(obj))
        if hit is None:
            hit = self.consts[id(obj)] = self._load(GuardOp.LOAD_CONST, -1, label, obj=obj)
        return hit

    def slot(self, source: Source) -> int:
        hit = self.slots.get(source)
        if hit is not None:
            return hit
        loader = _LOADERS.get(type(source))
        if loader is None:
            raise NotInC(f"no C load for a {type(source).__name__}")
        slot = loader(self, source)
        self.slots[source] = slot
        return slot

    # --- checks --------------------------------------------------------------------------
    def check(
        self, code: GuardOp, src: int, text: str, obj: object = None, n: int = 0, src2: int = -1
    ) -> None:
        self.ops.append(op(code, -1, src, src2, n, obj))
        depth = self.depth[src] + 1 if src >= 0 else 0
        self.lines.append("  " * depth + f"? s{src} {text}")

    def emit(self, c: Any) -> None:
        """One CCheck (guards.py)."""
        kind = c.kind
        if kind in ("call_is", "call_eq"):
            fn, args = c.arg
            if len(args) > 1:
                raise NotInC("calls with more than one argument")
            text = f"{_label(fn)}({', '.join(map(repr, args))})"
            s = self._load(GuardOp.LOAD_CALL, -1, text, obj=fn, obj2=args[0] if args else None, n=len(args))
            if kind == "call_is":
                self.check(GuardOp.IS, s, f"is {c.arg2!r}", obj=c.arg2)
            else:
                self.check(GuardOp.EQ, s, f"== {c.arg2!r}", obj=c.arg2)
            return
        s = self.slot(c.source)
        if kind == "type_is":
            self.check(GuardOp.TYPE_IS, s, f"type is {_label(c.arg)}", obj=c.arg)
        elif kind == "is":
            self.check(GuardOp.IS, s, f"is {_label(c.arg)}", obj=c.arg)
        elif kind == "is_ref":
            self.check(GuardOp.IS_REF, s, f"is {_label(c.arg)}", obj=c.arg)
        elif kind == "id_eq":
            self.check(GuardOp.ID_EQ, s, f"id == {c.arg}", n=c.arg)
        elif kind == "same_float":  # Note [Same floats in C] in kiln_frame_hook's guard_tree.c
            self.check(GuardOp.SAME_FLOAT, s, f"same float as {c.arg!r}", obj=c.arg)
        elif kind == "eq":
            self.check(GuardOp.EQ, s, f"== {c.arg!r}", obj=c.arg)
        elif kind == "item_types":
            self.check(GuardOp.ITEM_TYPES, s, "item types " + ", ".join(map(_label, c.arg)), obj=c.arg)
        elif kind == "len":
            self.check(GuardOp.LEN_EQ, s, f"len == {c.arg}", n=c.arg)
        elif kind == "keys":
            self.check(GuardOp.KEYS_EQ, s, f"keys == {c.arg!r}", obj=c.arg)
        elif kind == "not_in":
            self.check(GuardOp.NOT_IN, s, f"has no {c.arg!r}", obj=c.arg)
        elif kind == "falsy":
            self.check(GuardOp.FALSY, s, "is empty / false")
        elif kind == "same":
            self.check(GuardOp.SAME, s, f"is s{self.slot(c.arg)}", src2=self.slot(c.arg))
        elif kind == "tensor":
            t, dtype, device, requires_grad, sizes, strides, keys = c.arg
            table = 0 if isinstance(c.source, LocalSource) else 1
            dev = None if _cpu_shortcut(t, device) else device
            fast = _plain_getters(t)  # the torch-linked checker may read its TensorImpl
            # Without the torch-linked checker the tree calls torch's own `_dispatch_keys` and
            # compares the key set it gives with the one seen at capture (arg2): one pybind call
            # and one pybind `==` per row, not kiln's Python `dispatch_keys` (~30% less per row).
            keyset = c.arg2
            row = (s, t, dtype, dev, requires_grad, tuple(sizes), tuple(strides), keys)
            if keyset is None:
                self.tensor_rows[table].append((*row, dispatch_keys, fast))
            else:
                self.tensor_rows[table].append((*row, torch._C._dispatch_keys, fast, keyset))
            self.tensor_lines[table].append(
                f"s{s} {c.source.name()}: {t.__qualname__} {dtype} {device} requires_grad={requires_grad} "
                f"sizes={tuple(sizes)} strides={tuple(strides)} keys={keys:#x}"
            )
        else:
            raise NotInC(f"no C check {kind!r}")

    def tensors(self, table: int, at: tuple[int, int] | None = None) -> None:
        """The TENSORS op of one table, at the end or at (op index, line index)."""
        rows = self.tensor_rows[table]
        if not rows:
            return
        which = "entry values" if table == 0 else "others"
        lines = [f"tensors ({which}; {len(rows)} in one loop):"]
        lines += ["  " + line for line in self.tensor_lines[table]]
        op_at, line_at = at if at is not None else (len(self.ops), len(self.lines))
        self.ops.insert(op_at, op(GuardOp.TENSORS, obj=tuple(rows)))
        self.lines[line_at:line_at] = lines


def _load_global(tc: TreeCompiler, s: GlobalSource) -> int:
    g = tc.const(tc.globals_dict, "G")
    return tc._load(GuardOp.LOAD_ITEM, g, f"G[{s.global_name!r}]", obj=s.global_name)


def _load_foreign_global(tc: TreeCompiler, s: ForeignGlobalSource) -> int:
    g = tc.const(s.globals_dict, f"globals of {s.globals_dict.get('__name__', '?')}")
    return tc._load(GuardOp.LOAD_ITEM, g, s.name(), obj=s.global_name)


def _load_attr(tc: TreeCompiler, s: AttrSource) -> int:
    return tc._load(GuardOp.LOAD_ATTR, tc.slot(s.base), f".{s.attr}", obj=s.attr)


def _load_instance_dict(tc: TreeCompiler, s: InstanceDictSource) -> int:
    return tc._load(GuardOp.LOAD_OBJATTR, tc.slot(s.base), ".__dict__ (object's)", obj="__dict__")


def _load_dict_entry(tc: TreeCompiler, s: DictEntrySource) -> int:
    d = tc.slot(AttrSource(s.base, s.dict_attr))
    return tc._load(GuardOp.LOAD_ITEM, d, f"[{s.key!r}]", obj=s.key)


def _load_item(tc: TreeCompiler, s: GetItemSource) -> int:
    return tc._load(GuardOp.LOAD_ITEM, tc.slot(s.base), f"[{s.index!r}]", obj=s.index)


def _load_closure(tc: TreeCompiler, s: ClosureSource) -> int:
    cells = tc.slot(AttrSource(s.base, "__closure__"))
    cell = tc._load(GuardOp.LOAD_ITEM, cells, f"[{s.index}]", obj=s.index)
    return tc._load(GuardOp.LOAD_ATTR, cell, ".cell_contents", obj="cell_contents")


def _load_const(tc: TreeCompiler, s: ConstSource) -> int:
    return tc.const(s.obj, s.label)


def _load_type(tc: TreeCompiler, s: TypeSource) -> int:
    return tc._load(GuardOp.LOAD_TYPE, tc.slot(s.base), "type()")


_LOADERS: dict[type, Callable[[TreeCompiler, Any], int]] = {
    GlobalSource: _load_global,
    ForeignGlobalSource: _load_foreign_global,
    AttrSource: _load_attr,
    InstanceDictSource: _load_instance_dict,
    DictEntrySource: _load_dict_entry,
    GetItemSource: _load_item,
    ClosureSource: _load_closure,
    ConstSource: _load_const,
    TypeSource: _load_type,
}


def _is_global(part: Any) -> bool:
    return all(c.source is None or not isinstance(_root(c.source), LocalSource) for c in part.c)


def compile_tree(
    parts: list[Any], bound: list[Source], entry_names: list[str], globals_dict: dict[str, Any]
) -> tuple[TreeCompiler, list[int]]:
    """The program of `parts` (GuardParts, in order) and the indices of the parts left to the
    residual Python guard. `bound` are the sources the Python guard binds to locals: each is
    loaded too, so that a load that fails in Python fails in the tree."""
    tc = TreeCompiler(entry_names, globals_dict)
    residual: list[int] = []

    def compile_part(i: int) -> None:
        part = parts[i]
        if part.c is None:
            residual.append(i)
            return
        mark = (len(tc.ops), len(tc.lines), tc.nslots, dict(tc.slots), dict(tc.consts))
        rows = (len(tc.tensor_rows[0]), len(tc.tensor_rows[1]))
        try:
            for c in part.c:
                tc.emit(c)
        except NotInC:
            # undo this part's ops; its checks go to the residual guard
            del tc.ops[mark[0] :], tc.lines[mark[1] :], tc.depth[mark[2] :]
            tc.nslots, tc.slots, tc.consts = mark[2], mark[3], mark[4]
            for table in (0, 1):
                del tc.tensor_rows[table][rows[table] :], tc.tensor_lines[table][rows[table] :]
            residual.append(i)

    first = [i for i, p in enumerate(parts) if p.c is not None and _is_global(p)]
    for i in first:
        compile_part(i)
    entry_tensors_at = (len(tc.ops), len(tc.lines))  # the entry values' tensors go here
    taken = set(first)
    for i in range(len(parts)):
        if i not in taken:
            compile_part(i)
    for source in bound:
        try:
            tc.slot(source)
        except NotInC:
            residual.append(-1)  # a binding the tree cannot load: the residual evaluates it
    tc.tensors(1)
    tc.tensors(0, entry_tensors_at)
    return tc, sorted(set(residual))


def build_tree(
    parts: list[Any],
    bound: list[Source],
    entry_names: list[str],
    globals_dict: dict[str, Any],
    residual_fn: Callable[[list[int]], Callable[..., Any] | None],
    reference: object,
    title: str,
    full_text: bool = True,
) -> tuple[hook.GuardTree, int]:
    """The GuardTree for a guard, and how many of its parts are residual. `residual_fn(indices)`
    compiles the Python guard of just those parts (with every binding). Without `full_text` the
    tree's text is its one-line summary (an entry keeps its tree alive: KILN_LOG=guards asks
    for the whole text)."""
    install()  # the torch-linked tensor checker, if built (once per process)
    tc, residual = compile_tree(parts, bound, entry_names, globals_dict)
    fn = residual_fn(residual) if residual else None
    n_residual = sum(1 for i in residual if i >= 0)
    head = (
        f"guard tree for {title}: {len(tc.ops)} ops, {tc.nslots} slots, "
        f"{len(tc.tensor_rows[0]) + len(tc.tensor_rows[1])} tensors, {n_residual} residual Python checks"
    )
    names = ", ".join(f"s{i} = L[{n!r}]" for i, n in enumerate(entry_names))
    text = "\n".join([head, f"entry values: {names}", *tc.lines]) if full_text else head
    tree = hook.GuardTree(len(entry_names), tc.nslots, tc.ops, fn, reference, text, memo=_memo)
    return tree, n_residual
