"""The ops of a guard tree (`GuardTree`, evaluated in C by guard_tree.c; keep the numbers in step).

A tree is built from op tuples `(op, dst, src, src2, n, obj, obj2)` over slots: slots
`0..nvalues-1` are the frame's entry values, and each load writes one new slot from earlier
ones. Checks stop the program at the first that fails; every check computes what the Python
expression beside it computes, and an `Exception` raised by any op is a failing guard.
"""

from __future__ import annotations

import enum


class GuardOp(enum.IntEnum):
    LOAD_ATTR = 0  # dst = src.<obj>              (obj: str)
    LOAD_OBJATTR = 1  # dst = object.__getattribute__(src, <obj>)
    LOAD_ITEM = 2  # dst = src[<obj>]
    LOAD_CONST = 3  # dst = <obj>
    LOAD_TYPE = 4  # dst = type(src)
    LOAD_CALL = 5  # dst = <obj>() if n == 0 else <obj>(<obj2>)
    TYPE_IS = 10  # type(src) is <obj>
    IS = 11  # src is <obj>
    IS_REF = 12  # src is <obj>()                 (obj: a weakref.ref)
    ID_EQ = 13  # id(src) == n
    EQ = 14  # src == <obj>
    ITEM_TYPES = 15  # tuple(map(type, src)) == <obj>  (obj: tuple of types)
    LEN_EQ = 16  # len(src) == n
    KEYS_EQ = 17  # list(src.keys()) == <obj>     (obj: list)
    NOT_IN = 18  # <obj> not in src
    FALSY = 19  # not src
    SAME = 20  # src is src2
    # type(src) is type(<obj>) and each part the same double as <obj>'s (NaN equal to NaN, -0.0
    # not 0.0; obj: a float or complex), Note [Same floats in C] in guard_tree.c
    SAME_FLOAT = 21
    # each row of <obj> (a tuple of (slot, type, dtype, device | None, requires_grad, sizes,
    # strides)) matches: type(t) is type, t.dtype == dtype, t.device == device (None: t.is_cpu),
    # t.requires_grad == requires_grad, t.shape == sizes, t.stride() == strides
    TENSORS = 30


def op(
    code: GuardOp,
    dst: int = -1,
    src: int = -1,
    src2: int = -1,
    n: int = 0,
    obj: object = None,
    obj2: object = None,
) -> tuple[int, int, int, int, int, object, object]:
    """One op tuple, as GuardTree takes it."""
    return (int(code), dst, src, src2, n, obj, obj2)
