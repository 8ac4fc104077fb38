"""Sources: where a value seen by the capture came from, as an expression over the frame.

Every value read from outside the frame (an argument, a global, a closure cell, a module
attribute, an item of an input list) carries a `Source`. A source renders two ways:
`code(ctx)` is the Python expression that the generated guard and runner evaluate (entry values
are parameters `L0, L1, ...`, the frame's globals are `G`, other objects live in the constant
table `___c`); `name()` is the readable spelling used in logs and guard-failure reasons, e.g.
`L['self'].layers[0].weight` or `G['SCALE']`.
"""

from __future__ import annotations

from dataclasses import dataclass


class CodeContext:
    """What the generated code can refer to: entry parameter names and the constant table.

    A context made with `cse=True` binds every non-trivial source to a local (`v3 = L0.layers`)
    the first time it is rendered and reuses the local afterwards; the assignments collect in
    `stmts`, which the generator drains into its function body before the line that needs them.
    Children share their parent's constant table.
    """

    def __init__(self, entry_names: list[str], parent: CodeContext | None = None, cse: bool = False) -> None:
        self.entry_names = entry_names
        self.consts: list[object] = parent.consts if parent is not None else []
        self._const_index: dict[int, int] = parent._const_index if parent is not None else {}
        self.cse: dict[Source, str] | None = {} if cse else None
        self.stmts: list[str] = []

    def bind(self, source: Source) -> str:
        if self.cse is None or isinstance(source, LocalSource):
            return source.code(self)
        hit = self.cse.get(source)
        if hit is not None:
            return hit
        expr = source.code(self)
        name = f"v{len(self.cse)}"
        self.cse[source] = name
        self.stmts.append(f"{name} = {expr}")
        return name

    def drain(self) -> list[str]:
        out, self.stmts = self.stmts, []
        return out

    def param(self, name: str) -> str:
        return f"L{self.entry_names.index(name)}"

    def const(self, obj: object) -> str:
        key = id(obj)
        if key not in self._const_index:
            self._const_index[key] = len(self.consts)
            self.consts.append(obj)
        return f"___c[{self._const_index[key]}]"


class Source:
    __slots__ = ()

    def code(self, ctx: CodeContext) -> str:
        raise NotImplementedError

    def name(self) -> str:
        raise NotImplementedError

    def needs_globals(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.name()


@dataclass(frozen=True, slots=True)
class LocalSource(Source):
    local: str

    def code(self, ctx: CodeContext) -> str:
        return ctx.param(self.local)

    def name(self) -> str:
        return f"L[{self.local!r}]"


@dataclass(frozen=True, slots=True)
class GlobalSource(Source):
    """A name in the frame's own globals (`G`)."""

    global_name: str

    def code(self, ctx: CodeContext) -> str:
        return f"G[{self.global_name!r}]"

    def name(self) -> str:
        return f"G[{self.global_name!r}]"

    def needs_globals(self) -> bool:
        return True


@dataclass(frozen=True, slots=True, eq=False)
class ForeignGlobalSource(Source):
    """A name in another module's globals (a function inlined from elsewhere)."""

    globals_dict: dict[str, object]
    global_name: str

    def code(self, ctx: CodeContext) -> str:
        return f"{ctx.const(self.globals_dict)}[{self.global_name!r}]"

    def name(self) -> str:
        mod = self.globals_dict.get("__name__", "?")
        return f"{mod}.{self.global_name}"


@dataclass(frozen=True, slots=True)
class AttrSource(Source):
    base: Source
    attr: str

    def code(self, ctx: CodeContext) -> str:
        return f"{ctx.bind(self.base)}.{self.attr}"

    def name(self) -> str:
        return f"{self.base.name()}.{self.attr}"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


@dataclass(frozen=True, slots=True)
class InstanceDictSource(Source):
    """`base.__dict__` read with `object.__getattribute__`: for an object whose class defines
    __getattribute__ in Python (transformers' configs), the guard and the runner read what the
    capture read, without running that Python on every call."""

    base: Source

    def code(self, ctx: CodeContext) -> str:
        return f"{ctx.const(object.__getattribute__)}({ctx.bind(self.base)}, '__dict__')"

    def name(self) -> str:
        return f"{self.base.name()}.__dict__"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


@dataclass(frozen=True, slots=True)
class DictEntrySource(Source):
    """`base.<dict_attr>[key]`: a parameter, buffer or submodule read without Module.__getattr__."""

    base: Source
    dict_attr: str
    key: str

    def code(self, ctx: CodeContext) -> str:
        return f"{ctx.bind(self.base)}.{self.dict_attr}[{self.key!r}]"

    def name(self) -> str:
        if self.key.isidentifier():
            return f"{self.base.name()}.{self.key}"
        return f"{self.base.name()}[{self.key}]"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


@dataclass(frozen=True, slots=True)
class GetItemSource(Source):
    base: Source
    index: object  # an int or str key, an enum member, a class (Note [Classes as dict keys])

    def code(self, ctx: CodeContext) -> str:
        literal = type(self.index) in (int, str, bool, float, type(None))
        return f"{ctx.bind(self.base)}[{repr(self.index) if literal else ctx.const(self.index)}]"

    def name(self) -> str:
        return f"{self.base.name()}[{self.index!r}]"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


@dataclass(frozen=True, slots=True)
class RawItemSource(Source):
    """`dict.__getitem__(base, index)`: an entry of a dict subclass read without the subclass's
    own `__getitem__` (Note [A dict subclass's own subscript])."""

    base: Source
    index: object

    def code(self, ctx: CodeContext) -> str:
        literal = type(self.index) in (int, str, bool, float, type(None))
        key = repr(self.index) if literal else ctx.const(self.index)
        return f"{ctx.const(dict.__getitem__)}({ctx.bind(self.base)}, {key})"

    def name(self) -> str:
        return f"dict.__getitem__({self.base.name()}, {self.index!r})"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


@dataclass(frozen=True, slots=True)
class ClosureSource(Source):
    """Contents of closure cell `index` of the function at `base`."""

    base: Source
    index: int

    def code(self, ctx: CodeContext) -> str:
        return f"{ctx.bind(self.base)}.__closure__[{self.index}].cell_contents"

    def name(self) -> str:
        return f"{self.base.name()}.__closure__[{self.index}].cell_contents"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


@dataclass(frozen=True, slots=True, eq=False)
class ConstSource(Source):
    """An object the capture holds on to (the guard and runner keep it alive)."""

    obj: object
    label: str

    def code(self, ctx: CodeContext) -> str:
        return ctx.const(self.obj)

    def name(self) -> str:
        return self.label


@dataclass(frozen=True, slots=True)
class TypeSource(Source):
    base: Source

    def code(self, ctx: CodeContext) -> str:
        return f"type({ctx.bind(self.base)})"

    def name(self) -> str:
        return f"type({self.base.name()})"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


@dataclass(frozen=True, slots=True)
class WeakrefCallSource(Source):
    """What a weak reference points to now: `base()`."""

    base: Source

    def code(self, ctx: CodeContext) -> str:
        return f"{ctx.bind(self.base)}()"

    def name(self) -> str:
        return f"{self.base.name()}()"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


def iterator_rest(it: object) -> object:
    """The items a dict, OrderedDict, list or tuple iterator has left, as a new list, read
    without advancing it: a dict iterator's `__reduce__` is `(iter, (list_of_the_rest,))`, a
    list or tuple iterator's `(iter, (sequence,), position)`, or `(iter, ([],))` once exhausted
    (Note [Iterators over a dict from outside] in variables/lists.py)."""
    r = it.__reduce__()
    if r[0] is not iter or type(r[1][0]) not in (list, tuple):
        return None
    if len(r) == 2:
        return r[1][0] if type(r[1][0]) is list else None
    return list(r[1][0][r[2] :]) if len(r) == 3 and type(r[2]) is int else None


def iterator_sequence(it: object) -> object:
    """The list a list iterator runs over (None once it is exhausted), read without advancing it."""
    r = it.__reduce__()
    return r[1][0] if len(r) == 3 else None


@dataclass(frozen=True, slots=True)
class IteratorRestSource(Source):
    """The items left in the dict iterator at `base`, as a list (`iterator_rest`)."""

    base: Source

    def code(self, ctx: CodeContext) -> str:
        return f"{ctx.const(iterator_rest)}({ctx.bind(self.base)})"

    def name(self) -> str:
        return f"rest({self.base.name()})"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


@dataclass(frozen=True, slots=True)
class IteratorSequenceSource(Source):
    """The list the list iterator at `base` runs over (`iterator_sequence`)."""

    base: Source

    def code(self, ctx: CodeContext) -> str:
        return f"{ctx.const(iterator_sequence)}({ctx.bind(self.base)})"

    def name(self) -> str:
        return f"sequence({self.base.name()})"

    def needs_globals(self) -> bool:
        return self.base.needs_globals()


@dataclass(frozen=True, slots=True)
class KeyedSource(Source):
    """`base[key]` where the key is itself an object reached through a source (an optimizer's
    state, a dict keyed by parameters: Note [Tracing an optimizer step])."""

    base: Source
    key: Source

    def code(self, ctx: CodeContext) -> str:
        return f"{ctx.bind(self.base)}[{ctx.bind(self.key)}]"

    def name(self) -> str:
        return f"{self.base.name()}[{self.key.name()}]"

    def needs_globals(self) -> bool:
        return self.base.needs_globals() or self.key.needs_globals()
