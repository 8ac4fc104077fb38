"""Reading and writing CPython 3.11/3.12 bytecode.

Decision (see Note [Own assembler]): kiln_dynamo owns its assembler instead of pinning PyPI's
`bytecode`. The code it has to *write* today is small and straight-line: a trampoline with the
original function's argument layout that loads the frame's entry values and calls a Python
runner (codegen.py), so the assembler only needs instruction encoding, EXTENDED_ARG, inline cache
slots, a line table and an empty exception table. Reading goes through `dis`, which already
decodes 3.11/3.12 (jump targets, cache entries, argument values); `parse_exception_table` /
`encode_exception_table` implement CPython's varint exception-table format so that rewriting
whole functions (graph breaks and resume functions, next issue) starts from tested pieces; the
round-trip tests check them over real code.

Note [Own assembler]: a dependency on `bytecode` would have to be pinned per CPython minor and
would still need our own stack-depth and exception-table checks; the few hundred lines here are
easier to keep honest with round-trip tests, and the version differences stay in one place.
"""

from __future__ import annotations

import dis
import opcode
import sys
import types
from dataclasses import dataclass

PY_VERSION = sys.version_info[:2]
if PY_VERSION not in ((3, 11), (3, 12)):
    raise NotImplementedError(f"kiln_dynamo supports CPython 3.11 and 3.12, not {sys.version}")

_CACHES: list[int] = list(opcode._inline_cache_entries)  # type: ignore[attr-defined]
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]


def cache_entries(op: int) -> int:
    return _CACHES[op] if op < len(_CACHES) else 0


def instructions(code: types.CodeType) -> list[dis.Instruction]:
    """The instructions of `code`, cache entries left out, jump targets as byte offsets."""
    return list(dis.get_instructions(code))


def encode(ops: list[tuple[str, int]]) -> bytes:
    """Encode (opname, arg) pairs, with EXTENDED_ARG prefixes and zeroed inline caches."""
    out = bytearray()
    for name, arg in ops:
        op = dis.opmap[name]
        if arg > 0xFFFFFF:
            out += bytes([_EXTENDED_ARG, (arg >> 24) & 0xFF])
        if arg > 0xFFFF:
            out += bytes([_EXTENDED_ARG, (arg >> 16) & 0xFF])
        if arg > 0xFF:
            out += bytes([_EXTENDED_ARG, (arg >> 8) & 0xFF])
        out += bytes([op, arg & 0xFF])
        out += b"\x00\x00" * cache_entries(op)
    return bytes(out)


def _write_varint(out: bytearray, value: int) -> None:
    # 6-bit groups, most significant first; bit 6 (0x40) says "more follows".
    groups = [value & 63]
    value >>= 6
    while value:
        groups.append(value & 63)
        value >>= 6
    for i, g in enumerate(reversed(groups)):
        out.append(g | (64 if i < len(groups) - 1 else 0))


def _write_signed_varint(out: bytearray, value: int) -> None:
    _write_varint(out, (-value << 1) | 1 if value < 0 else value << 1)


def simple_linetable(n_code_units: int, line_delta: int = 0) -> bytes:
    """A 3.11/3.12 location table giving every instruction one line (co_firstlineno + delta)."""
    out = bytearray()
    first = True
    while n_code_units > 0:
        n = min(8, n_code_units)
        out.append(0x80 | (13 << 3) | (n - 1))  # code 13: line only, no columns
        _write_signed_varint(out, line_delta if first else 0)
        first = False
        n_code_units -= n
    return bytes(out)


@dataclass(frozen=True, slots=True)
class ExceptionTableEntry:
    start: int  # byte offsets, end exclusive
    end: int
    target: int
    depth: int
    lasti: bool


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    b = data[i]
    val = b & 63
    while b & 64:
        i += 1
        b = data[i]
        val = (val << 6) | (b & 63)
    return val, i + 1


def parse_exception_table(code: types.CodeType) -> list[ExceptionTableEntry]:
    """Decode co_exceptiontable (CPython's Objects/exception_handling_notes.txt format)."""
    data = code.co_exceptiontable
    out: list[ExceptionTableEntry] = []
    i = 0
    while i < len(data):
        start, i = _read_varint(data, i)
        length, i = _read_varint(data, i)
        target, i = _read_varint(data, i)
        dl, i = _read_varint(data, i)
        out.append(ExceptionTableEntry(start * 2, (start + length) * 2, target * 2, dl >> 1, bool(dl & 1)))
    return out


def encode_exception_table(entries: list[ExceptionTableEntry]) -> bytes:
    out = bytearray()
    for e in entries:
        first = len(out)
        _write_varint(out, e.start // 2)
        out[first] |= 0x80  # start-of-entry marker
        _write_varint(out, (e.end - e.start) // 2)
        _write_varint(out, e.target // 2)
        _write_varint(out, (e.depth << 1) | int(e.lasti))
    return bytes(out)


def decode_code(code: types.CodeType) -> list[tuple[str, int]]:
    """(opname, full arg) per instruction, EXTENDED_ARG folded in and caches dropped."""
    raw = code.co_code
    out: list[tuple[str, int]] = []
    ext = 0
    i = 0
    while i < len(raw):
        op, arg = raw[i], raw[i + 1]
        if op == _EXTENDED_ARG:
            ext = (ext | arg) << 8
            i += 2
            continue
        name = opcode.opname[op]
        out.append((name, ext | arg))
        ext = 0
        i += 2 + 2 * cache_entries(op)
    return out


def localsplus_index(code: types.CodeType, name: str, kind: str) -> int:
    """Index of a cell or free variable in the frame's locals-plus array (3.11/3.12 layout)."""
    nlocals = len(code.co_varnames)
    cells = [c for c in code.co_cellvars if c not in code.co_varnames]
    if kind == "free":
        return nlocals + len(cells) + code.co_freevars.index(name)
    if name in code.co_varnames:
        return code.co_varnames.index(name)
    return nlocals + cells.index(name)


def build_trampoline(code: types.CodeType, runner: object, entry_names: list[str]) -> types.CodeType:
    """A code object with `code`'s signature whose body is `return runner(*entry values)`.

    Arguments are read with LOAD_FAST (the trampoline never runs MAKE_CELL, so an argument that
    the original turns into a cell is still the plain value in its slot); free variables are
    copied into the frame with COPY_FREE_VARS and read with LOAD_DEREF.
    """
    ops: list[tuple[str, int]] = []
    if code.co_freevars:
        ops.append(("COPY_FREE_VARS", len(code.co_freevars)))
    ops.append(("RESUME", 0))
    ops.append(("PUSH_NULL", 0))
    ops.append(("LOAD_CONST", 1))
    for name in entry_names:
        if name in code.co_freevars:
            ops.append(("LOAD_DEREF", localsplus_index(code, name, "free")))
        else:
            ops.append(("LOAD_FAST", code.co_varnames.index(name)))
    n = len(entry_names)
    if PY_VERSION == (3, 11):
        ops.append(("PRECALL", n))
        ops.append(("CALL", n))
    elif PY_VERSION == (3, 12):
        ops.append(("CALL", n))
    else:  # pragma: no cover - rejected at import
        raise NotImplementedError(PY_VERSION)
    ops.append(("RETURN_VALUE", 0))
    raw = encode(ops)
    return code.replace(
        co_code=raw,
        co_consts=(None, runner),
        co_names=(),
        co_stacksize=n + 2,
        co_linetable=simple_linetable(len(raw) // 2),
        co_exceptiontable=b"",
        co_flags=code.co_flags & ~(0x20 | 0x80 | 0x100 | 0x200),  # never a generator/coroutine
    )
