"""`copy.copy` / `copy.deepcopy` of an existing user object whose state is constants.

Note [Copying an object of constants]: `copy.deepcopy(config)` (transformers' `get_text_config`,
which a BART-family decoder calls to build its KV cache on every forward) runs copy's generic
protocol: `__reduce_ex__(4)` in C, then `cls.__new__(cls)` and `y.__dict__.update(state)`. Kiln
cannot step through the C part, so the copy used to break the frame (and the frames it left to
Python broke again on each attribute store of the copy). Where the protocol is the default one
all the way, its result is known at trace time: a new instance of the same class whose instance
dict holds copies of the original's entries. So kiln folds the call into a `NewObjectVariable`
(an object made in the frame: distinct from the original, its stores stay its own) when:

- the class is a plain Python class (metaclass `type`/`ABCMeta`, `object.__new__`, no
  `__slots__`) that overrides none of `__reduce_ex__`, `__reduce__`, `__getstate__`,
  `__getnewargs__`, `__getnewargs_ex__`, and copyreg has no reducer for it;
- `__deepcopy__`/`__copy__` on the instance and `__setstate__` on the new object are absent when
  looked up as copy looks them up (through the class's own `__getattribute__`, which is traced);
- for a deep copy, every value of the instance dict is a Python constant in plain containers
  (copied at trace time, as a fresh value; containers shared by two entries are refused, since
  the copy would share them), for a shallow copy any value (the copy holds the same trackers).

Every value is read through the instance dict's source, and the dict's keys are guarded, so the
graph is reused only while the original holds the same state. Anything else inlines copy's own
Python code as before.

The same holds for an object made in the frame (a `NewObjectVariable`: transformers'
`get_text_config` deep-copies a sub-config that `WhisperConfig.get_text_config` built in the same
call; copy's `id(x)` of an object with no identity outside the frame used to break). Its state is
the tracker's own attributes, known at trace time, so no guard is needed: nothing is read from
outside the frame. A deep copy needs every attribute to be a constant tree of exact trackers
(constants, lists, tuples, plain dicts, sets) with no list, dict or set tracker reached twice
(the copy would share it where the fold makes two); a shallow copy takes the same trackers. The
class and the `__deepcopy__`/`__copy__`/`__setstate__` lookups are checked as above.
"""

from __future__ import annotations

import abc
import copy
import copyreg
import inspect
from typing import TYPE_CHECKING, Any

import torch

from kiln_dynamo.logs import get_artifact_logger
from kiln_dynamo.source import GetItemSource, InstanceDictSource
from kiln_dynamo.variables.base import VariableTracker
from kiln_dynamo.variables.exceptions import ObservedException, missing_attribute

if TYPE_CHECKING:
    from kiln_dynamo.variables.base import Tx
    from kiln_dynamo.variables.user_defined import NewObjectVariable, UserObjectVariable

VT = VariableTracker
log = get_artifact_logger("decisions")

_DEFAULT_PROTOCOL = {
    "__reduce_ex__": object.__reduce_ex__,
    "__reduce__": object.__reduce__,
    "__getstate__": getattr(object, "__getstate__", None),  # 3.11+
    "__getnewargs__": None,
    "__getnewargs_ex__": None,
}
# immutable constants whose deepcopy is an equal value (copy's own atomic types, and torch's)
_ATOMIC = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device)


def foldable_class(cls: type) -> str | None:
    """Why copy's protocol on an instance of `cls` is not the default one, or None."""
    if type(cls) not in (type, abc.ABCMeta):
        return f"its metaclass is {type(cls).__name__}"
    if cls.__new__ is not object.__new__:  # type: ignore[comparison-overlap]
        return "it defines __new__ or has a C base"
    if cls.__dictoffset__ == 0 or any("__slots__" in vars(k) for k in cls.__mro__):
        return "it has __slots__"
    if copyreg.dispatch_table.get(cls) is not None:
        return "copyreg has a reducer for it"
    for name, default in _DEFAULT_PROTOCOL.items():
        if inspect.getattr_static(cls, name, None) is not default:
            return f"it defines {name}"
    return None


def _absent(tx: Tx, obj: VT, name: str) -> bool:
    """`getattr(obj, name, None) is None`, traced as copy does it."""
    try:
        found = tx.load_attr(obj, name)
    except (AttributeError, ObservedException) as e:
        if not missing_attribute(e):
            raise
        return True
    return found.is_constant() and found.as_constant() is None


def _constant_tree(value: Any, seen: set[int]) -> bool:
    """Made of atomic constants in plain containers, with no mutable container reached twice."""
    if type(value) in _ATOMIC:
        return True
    if type(value) in (list, dict, set):
        if id(value) in seen:
            return False
        seen.add(id(value))
    if type(value) in (list, tuple, set, frozenset):
        return all(_constant_tree(v, seen) for v in value)
    if type(value) is dict:
        return all(type(k) in _ATOMIC or type(k) is tuple for k in value) and all(
            _constant_tree(v, seen) for v in value.values()
        )
    return False


def _plain_trackers(v: VT, seen: set[int]) -> bool:
    """A constant tree of exact container trackers, none of list, dict or set reached twice."""
    from kiln_dynamo.variables.base import ConstantVariable
    from kiln_dynamo.variables.dicts import DictVariable, SetVariable
    from kiln_dynamo.variables.lists import ListVariable, TupleVariable

    kind = type(v)
    if kind is ConstantVariable:
        return _constant_tree(v.as_constant(), set())
    if kind in (ListVariable, DictVariable, SetVariable):
        if id(v) in seen:
            return False
        seen.add(id(v))
    if kind in (ListVariable, TupleVariable):
        return all(_plain_trackers(i, seen) for i in v.items)  # type: ignore[attr-defined]
    if kind is DictVariable and v.python_type() is dict:
        return v.is_constant() and all(_plain_trackers(i, seen) for i in v.items.values())  # type: ignore[attr-defined]
    if kind is SetVariable:
        return v.is_constant() and _constant_tree(v.as_constant(), set())
    return False


def _hook_absent(tx: Tx, x: VT, deep: bool) -> bool:
    """No `__deepcopy__` / `__copy__` on `x`, looked up as copy looks it up."""
    hook = "__deepcopy__" if deep else "__copy__"
    if _absent(tx, x, hook):
        return True
    log.info("copy of %s not folded: it has %s", x.describe(), hook)
    return False


def _made(
    tx: Tx, x: VT, cls: type, state: dict[str, VT], deep: bool, plain: bool
) -> NewObjectVariable | None:
    """The new object holding `state` (deep: copies of its constants, which `plain` says they
    are; shallow: the same trackers), or None where copy's protocol would do otherwise."""
    from kiln_dynamo.variables.user_defined import NewObjectVariable

    new = NewObjectVariable(cls)
    if not _absent(tx, new, "__setstate__"):  # looked up on the empty new object, as copy does
        return None
    if deep:
        if not plain:
            log.info("deepcopy of %s not folded: a value is not a plain constant", x.describe())
            return None
        values = copy.deepcopy({k: v.as_constant() for k, v in state.items()})
        new.attrs.update({k: tx.wrap_constant(v) for k, v in values.items()})
    else:
        new.attrs.update(state)
    log.info("%s of %s folded into a new object", "deepcopy" if deep else "copy", x.describe())
    return new


def fold_new_copy(tx: Tx, x: NewObjectVariable, deep: bool) -> NewObjectVariable | None:
    """The copy of an object made in the frame (Note [Copying an object of constants]), or None."""
    why = foldable_class(x.cls)
    if why is not None:
        log.info("copy of %s not folded: %s", x.describe(), why)
        return None
    if not _hook_absent(tx, x, deep):
        return None
    seen: set[int] = set()
    plain = not deep or all(_plain_trackers(v, seen) for v in x.attrs.values())
    return _made(tx, x, x.cls, dict(x.attrs), deep, plain)


def fold_copy(tx: Tx, x: UserObjectVariable, deep: bool) -> NewObjectVariable | None:
    """The copy as a new object (Note [Copying an object of constants]), or None to inline copy."""
    from kiln_dynamo.variables.dicts import DictVariable

    obj, cls = x.obj, type(x.obj)
    why = foldable_class(cls)
    if why is None and x.source is None:
        why = "the object has no source to guard"
    if why is None and tx.output.side_effects.has_pending_attrs(obj):
        why = "the frame stored attributes on it"
    if why is not None:
        log.info("copy of %s not folded: %s", x.describe(), why)
        return None
    assert x.source is not None
    if not _hook_absent(tx, x, deep):
        return None
    d = object.__getattribute__(obj, "__dict__")
    dict_vt = tx.wrap(d, InstanceDictSource(x.source))  # guards its keys
    if not isinstance(dict_vt, DictVariable) or tx.output.side_effects.is_mutated(dict_vt):
        return None
    state: dict[str, VT] = {}
    for k in list(d):
        if type(k) is not str:
            return None
        state[k] = tx.wrap(d[k], GetItemSource(InstanceDictSource(x.source), k))
    plain = not deep or (
        all(v.is_constant() for v in state.values())
        and _constant_tree({k: v.as_constant() for k, v in state.items()}, set())
    )
    return _made(tx, x, cls, state, deep, plain)
