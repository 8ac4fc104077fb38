"""What the C hook asks Python on a cache miss: classify the code, call the callback, check its answer.

The C side (`_C.c`) handles every frame whose decision it can make alone: skipped code, guard
hits, run-only. When it cannot, it calls `dispatch` once, with the frame's parts. `dispatch`
applies the default skip rules (the standard library, kiln's own packages, registered prefixes and
codes), builds the `Frame` the user's callback sees, calls it, and turns its answer into the tuple
`(action, guard, code, run_code)` the C side acts on. Everything that can be checked in Python is
checked here, so the C side trusts what it receives.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
import os
import sys
import sysconfig
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import CodeType, FunctionType
from typing import Any

from kiln_frame_hook import _C


class Action(enum.Enum):
    """What a callback may return instead of a GuardedCode."""

    RUN = _C.ACTION_RUN  # run the original code this time; ask again next time
    SKIP = _C.ACTION_SKIP  # never intercept this code again (until reset)
    RUN_ONLY = _C.ACTION_RUN_ONLY  # stop calling the callback for it; cached entries still run


class _Unbound:
    """The value a guard receives for a closure cell that holds nothing yet."""

    _instance: _Unbound | None = None

    def __new__(cls) -> _Unbound:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNBOUND"

    def __reduce__(self) -> str:
        return "UNBOUND"


UNBOUND = _Unbound()


@dataclass(frozen=True, slots=True)
class GuardedCode:
    """A callback's answer that adds a cache entry and runs `code` now.

    `guard(*entry_values) -> bool` decides, on later calls, whether `code` may run in place of the
    original; it is called positionally with the values named by `entry_names(original_code)`.
    `code` must keep the original's argument layout, free and cell variables; it may add locals.
    """

    guard: Callable[..., Any]
    code: CodeType


@dataclass(frozen=True, slots=True)
class Frame:
    """The frame about to run, as the callback sees it. `locals` is a snapshot: at entry the only
    locals are the arguments and the closure's free variables (UNBOUND for an empty cell)."""

    code: CodeType
    function: FunctionType
    locals: Mapping[str, Any]
    globals: dict[str, Any]
    builtins: dict[str, Any]
    entries: tuple[_C.CacheEntry, ...]
    limit_reached: bool


_ARG_FLAGS = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


def entry_names(code: CodeType) -> tuple[str, ...]:
    """The names of the values a guard receives, in order: the argument slots (positional,
    keyword-only, *args, **kwargs) then the free variables."""
    nargs = code.co_argcount + code.co_kwonlyargcount + bin(code.co_flags & _ARG_FLAGS).count("1")
    return code.co_varnames[:nargs] + code.co_freevars


def flat_code(original: CodeType, transformed: CodeType) -> CodeType:
    """The form of `transformed` that the hook runs (see Note [Running a transformed code object]
    in _C.c): the same argument slots, all positional. Raises ValueError if `transformed` does not
    keep the original's argument layout, free and cell variables."""
    problems = []
    for attr in ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_freevars", "co_cellvars"):
        if getattr(original, attr) != getattr(transformed, attr):
            problems.append(f"{attr} {getattr(transformed, attr)!r} != {getattr(original, attr)!r}")
    if original.co_flags & _ARG_FLAGS != transformed.co_flags & _ARG_FLAGS:
        problems.append("*args/**kwargs flags differ")
    nargs = len(entry_names(original)) - len(original.co_freevars)
    if transformed.co_varnames[:nargs] != original.co_varnames[:nargs]:
        problems.append(f"argument names {transformed.co_varnames[:nargs]} != {original.co_varnames[:nargs]}")
    if transformed.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        problems.append("the transformed code is a generator or coroutine")
    if problems:
        raise ValueError(
            f"transformed code for {original.co_qualname} ({original.co_filename}:{original.co_firstlineno}) "
            "must keep the original's signature: " + "; ".join(problems)
        )
    return transformed.replace(
        co_argcount=nargs,
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_flags=transformed.co_flags & ~_ARG_FLAGS,
    )


# --- skip rules ---------------------------------------------------------------------------------

# The compiler's own packages. kiln_bench is not among them: its models are user code to compile.
_KILN_PACKAGES = (
    "kiln",
    "kiln_frame_hook",
    "kiln_dynamo",
    "kiln_aotgrad",
    "kiln_loopir",
    "kiln_codegen_cpp",
    "kiln_codegen_triton",
)

_skip_prefixes: list[str] = []
_skip_codes: weakref.WeakSet[CodeType] = weakref.WeakSet()
_touched: weakref.WeakSet[CodeType] = weakref.WeakSet()  # codes given entries or a strategy
_skip_by_file: dict[str, bool] = {}
_defaults_loaded = False


def _default_prefixes() -> tuple[list[str], list[str]]:
    """(skipped, exempt) directory prefixes: the standard library, minus its site-packages, and
    the folders of kiln's own packages (found without importing them)."""
    paths = sysconfig.get_paths()
    skipped = {paths["stdlib"], paths["platstdlib"]}
    exempt = {paths["purelib"], paths["platlib"]}
    for name in _KILN_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            skipped.update(spec.submodule_search_locations)
    norm = [os.path.join(os.path.realpath(p), "") for p in skipped]
    return norm, [os.path.join(os.path.realpath(p), "") for p in exempt]


def _load_defaults() -> None:
    global _defaults_loaded, _exempt_prefixes
    if not _defaults_loaded:
        skipped, _exempt_prefixes = _default_prefixes()
        _skip_prefixes.extend(skipped)
        _defaults_loaded = True


_exempt_prefixes: list[str] = []


def add_skip_prefix(path: str) -> None:
    """Never intercept code from files under `path` (a folder, or a file path prefix)."""
    _skip_prefixes.append(os.path.realpath(path))
    _skip_by_file.clear()


def skip_code(code: CodeType) -> None:
    """Never intercept `code`: its frames always run as they are."""
    _skip_codes.add(code)
    _touched.add(code)
    _C.set_strategy(code, _C.STRATEGY_SKIP)


def _file_is_skipped(filename: str) -> bool:
    cached = _skip_by_file.get(filename)
    if cached is None:
        if filename.startswith("<frozen "):
            cached = True
        else:
            path = os.path.realpath(filename) if os.path.isabs(filename) else filename
            under = [p for p in _skip_prefixes if path.startswith(p)]
            # site-packages sits inside the standard library's folder but is not part of it
            exempt = [p for p in _exempt_prefixes if path.startswith(p)]
            cached = any(len(p) > max((len(e) for e in exempt), default=0) for p in under)
        _skip_by_file[filename] = cached
    return cached


def is_skipped(code: CodeType) -> bool:
    """Whether the default rules (or skip_code / add_skip_prefix) leave `code` alone."""
    _load_defaults()
    return code in _skip_codes or _file_is_skipped(code.co_filename)


# --- the dispatcher -----------------------------------------------------------------------------

_RUN = (_C.ACTION_RUN, None, None, None, None)
_SKIP = (_C.ACTION_SKIP, None, None, None, None)
_RUN_ONLY = (_C.ACTION_RUN_ONLY, None, None, None, None)


def _reusable_function(
    function: FunctionType, run_code: CodeType, f_globals: dict[str, Any]
) -> FunctionType | None:
    """A function for run_code that the C side may reuse on every hit, or None when holding one
    could keep a dead namespace alive (see Note [Reusing the function] in _C.c)."""
    if function.__closure__ is not None:
        return None
    module = sys.modules.get(f_globals.get("__name__"))  # type: ignore[arg-type]
    if module is None or getattr(module, "__dict__", None) is not f_globals:
        return None
    return FunctionType(run_code, f_globals, function.__name__)


def dispatch(
    callback: Callable[[Frame], object],
    code: CodeType,
    function: FunctionType,
    values: tuple[Any, ...],
    f_globals: dict[str, Any],
    f_builtins: dict[str, Any],
    entries: list[_C.CacheEntry],
    limit_reached: bool,
) -> tuple[int, Any, Any, Any, Any]:
    """Called by the C hook on a miss; see the module docstring."""
    if is_skipped(code):
        _touched.add(code)
        return _SKIP
    frame = Frame(
        code=code,
        function=function,
        locals=dict(zip(entry_names(code), values, strict=True)),
        globals=f_globals,
        builtins=f_builtins,
        entries=tuple(entries),
        limit_reached=limit_reached,
    )
    answer = callback(frame)
    if answer is None or answer is Action.RUN:
        return _RUN
    if answer is Action.SKIP:
        _touched.add(code)
        return _SKIP
    if answer is Action.RUN_ONLY:
        _touched.add(code)
        return _RUN_ONLY
    if isinstance(answer, GuardedCode):
        if not callable(answer.guard):
            raise TypeError(f"the guard of a GuardedCode must be callable, not {answer.guard!r}")
        if not isinstance(answer.code, CodeType):
            raise TypeError(f"the code of a GuardedCode must be a code object, not {answer.code!r}")
        run_code = flat_code(code, answer.code)
        _touched.add(code)
        return (
            _C.ACTION_ENTRY,
            answer.guard,
            answer.code,
            run_code,
            _reusable_function(function, run_code, f_globals),
        )
    raise TypeError(
        f"frame callback {callback!r} returned {answer!r} for {code.co_qualname}; "
        "expected a GuardedCode, RUN, SKIP, RUN_ONLY or None"
    )


def clear(code: CodeType) -> None:
    """Drop the code's entries and strategy, an explicit skip_code included."""
    _skip_codes.discard(code)
    _C.clear(code)


def reset() -> None:
    """Drop every code's entries and strategies; explicit skip_code marks are re-applied."""
    for code in list(_touched):
        _C.clear(code)
    _touched.clear()
    for code in list(_skip_codes):
        _C.set_strategy(code, _C.STRATEGY_SKIP)
        _touched.add(code)


_C.init(dispatch, UNBOUND)
