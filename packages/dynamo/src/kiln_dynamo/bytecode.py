"""Reading and writing CPython 3.11/3.12 bytecode.

Decision (see Note [Own assembler]): kiln_dynamo owns its assembler instead of pinning PyPI's
`bytecode`. Two kinds of code are
written. The trampoline of a whole-frame capture is straight-line (`build_trampoline`). Graph
breaks need more (resume.py): a continuation function is a copy of the original body with a new
prologue and new local slots, and the code that replaces a broken frame has jumps and an
exception handler. For those, `disassemble` turns a code object into a list of `Instr` whose
jumps and exception-table entries point at other `Instr` objects (not offsets), and `assemble`
lays such a list out again: EXTENDED_ARG prefixes to a fixed point, jump arguments from the
targets' new offsets, a line table and the flat exception table recomputed from each
instruction's entry (Note [Exception table as per-instruction pointers]). Reading goes through
`dis`, which already decodes 3.11/3.12 (jump targets, cache entries, argument values); the
round-trip tests check assemble(disassemble(code)) over real code.

Note [Exception table as per-instruction pointers]: CPython's table is flat (non-overlapping
ranges, innermost handler wins). Each `Instr` carries the `ExnEntry` that covers it (or None),
shared by identity between the instructions of one range; `assemble` re-derives the ranges by
grouping consecutive instructions with the same entry. Inserting or moving instructions then
keeps the table valid by construction, as long as a new instruction is given the entry it
should be covered by (prologues: none).

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


# Instructions after which control never falls through to the next one.
NO_FALLTHROUGH = frozenset(
    {
        "RETURN_VALUE",
        "RETURN_CONST",
        "RAISE_VARARGS",
        "RERAISE",
        "JUMP_FORWARD",
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
        "JUMP",
        "JUMP_NO_INTERRUPT",
    }
)


def cache_entries(op: int) -> int:
    return _CACHES[op] if op < len(_CACHES) else 0


# Note [Instructions read once per code object]: the translator reads a function's instructions
# each time it inlines a call of it, and a model calls the same few functions per layer and per
# module (T5's capture disassembled 57,000 instructions through `dis` for about 800 inlined calls,
# 0.8 s under a profiler). A code object never changes, so its instructions and the index of
# each offset are read once and shared, read-only, by every translator of it. Keyed by identity,
# with the code object held so that its id is not reused: equal code objects (same bytes,
# constants and names) may come from different files, and a nested code constant's `argval` must
# be the one of this code object. The memo lives for one frame's tracing (`forget` at its end,
# convert_frame.py): it holds the code objects it read, and with them their functions' constants,
# which must not outlive the capture that read them (a model deleted after its compile is freed).
_READ: dict[int, tuple[types.CodeType, tuple[dis.Instruction, ...], dict[int, int]]] = {}
_READ_LIMIT = 4096


def instructions(code: types.CodeType) -> tuple[dis.Instruction, ...]:
    """The instructions of `code`, cache entries left out, jump targets as byte offsets."""
    return read(code)[0]


def forget() -> None:
    """Drop the instructions read so far (Note [Instructions read once per code object])."""
    _READ.clear()


def read(code: types.CodeType) -> tuple[tuple[dis.Instruction, ...], dict[int, int]]:
    """The instructions of `code` (as `instructions`) and the position of each offset among
    them; shared, never to be changed (Note [Instructions read once per code object])."""
    known = _READ.get(id(code))
    if known is not None and known[0] is code:
        return known[1], known[2]
    insts = tuple(dis.get_instructions(code))
    index_of = {inst.offset: i for i, inst in enumerate(insts)}
    if len(_READ) >= _READ_LIMIT:
        _READ.clear()
    _READ[id(code)] = (code, insts, index_of)
    return insts, index_of


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
    """A signed varint of the location table: unlike the exception table's, it is little-endian
    (least significant 6-bit group first)."""
    value = (-value << 1) | 1 if value < 0 else value << 1
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    out.append(value)


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


# --- instruction lists: disassemble, edit, assemble ------------------------------------------

_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


@dataclass(slots=True, eq=False)
class ExnEntry:
    """One handler: where to jump, the stack depth to unwind to, and whether to push lasti."""

    target: Instr
    depth: int
    lasti: bool


@dataclass(slots=True, eq=False)
class Instr:
    """A mutable instruction: `arg` is the raw argument except for jumps, whose argument comes
    from `target` at assembly time. `argval` is dis's decoded value (a name for local, cell and
    free variable ops, used when a code's variable layout changes)."""

    opname: str
    arg: int = 0
    target: Instr | None = None
    lineno: int | None = None
    argval: object = None
    exn: ExnEntry | None = None
    offset: int = -1  # in the code it was read from; -1 for new instructions

    @property
    def opcode(self) -> int:
        return dis.opmap[self.opname]


def is_jump(opname: str) -> bool:
    return dis.opmap[opname] in _JUMPS


def disassemble(code: types.CodeType) -> list[Instr]:
    """`code` as Instr objects: EXTENDED_ARG folded, jumps and handlers pointing at Instrs."""
    out: list[Instr] = []
    at: dict[int, Instr] = {}
    pending: list[int] = []
    raw = list(dis.get_instructions(code))
    for inst in raw:
        if inst.opname == "EXTENDED_ARG":
            pending.append(inst.offset)
            continue
        lineno = inst.positions.lineno if inst.positions is not None else None
        ins = Instr(inst.opname, inst.arg or 0, None, lineno, inst.argval, None, inst.offset)
        for off in (*pending, inst.offset):
            at[off] = ins
        pending = []
        out.append(ins)
    for inst in raw:
        if inst.opcode in _JUMPS and inst.opname != "EXTENDED_ARG":
            at[inst.offset].target = at[inst.argval]
    for e in parse_exception_table(code):
        entry = ExnEntry(at[e.target], e.depth, e.lasti)
        for ins in out:
            if e.start <= ins.offset < e.end:
                ins.exn = entry
    return out


def _ext_count(arg: int) -> int:
    return 0 if arg <= 0xFF else 1 if arg <= 0xFFFF else 2 if arg <= 0xFFFFFF else 3


def _jump_arg(ins: Instr, start: int, ext: int, offsets: dict[int, int]) -> int:
    assert ins.target is not None, ins
    after = start + 2 * ext + 2 + 2 * cache_entries(ins.opcode)
    target = offsets[id(ins.target)]
    delta = (after - target) if "BACKWARD" in ins.opname else (target - after)
    if delta < 0:
        raise ValueError(f"{ins.opname} cannot jump {'forward' if 'BACKWARD' in ins.opname else 'backward'}")
    return delta // 2


@dataclass(slots=True)
class Assembled:
    code: bytes
    linetable: bytes
    exceptiontable: bytes
    offsets: dict[int, int]  # id(Instr) -> offset of its first code unit (EXTENDED_ARG included)
    real: dict[int, int]  # id(Instr) -> offset of its opcode (what dis reports)


def assemble(instrs: list[Instr], firstlineno: int) -> Assembled:
    """Lay out `instrs`: EXTENDED_ARG prefixes grow until every argument fits (a fixed point,
    since a longer jump may need a prefix that moves other targets)."""
    exts = [_ext_count(i.arg) if i.target is None else 0 for i in instrs]
    while True:
        offsets: dict[int, int] = {}
        pos = 0
        for ins, ext in zip(instrs, exts, strict=True):
            offsets[id(ins)] = pos
            pos += 2 * ext + 2 + 2 * cache_entries(ins.opcode)
        changed = False
        for k, ins in enumerate(instrs):
            if ins.target is not None:
                ins.arg = _jump_arg(ins, offsets[id(ins)], exts[k], offsets)
                need = _ext_count(ins.arg)
                if need > exts[k]:
                    exts[k] = need
                    changed = True
        if not changed:
            break
    out = bytearray()
    for ins, ext in zip(instrs, exts, strict=True):
        for shift in range(ext, 0, -1):
            out += bytes([_EXTENDED_ARG, (ins.arg >> (8 * shift)) & 0xFF])
        out += bytes([ins.opcode, ins.arg & 0xFF])
        out += b"\x00\x00" * cache_entries(ins.opcode)
    # the location table: line only (code 13) or none (code 15), at most 8 code units per entry
    lines = bytearray()
    line = firstlineno
    for ins, ext in zip(instrs, exts, strict=True):
        units = ext + 1 + cache_entries(ins.opcode)
        while units > 0:
            n = min(8, units)
            if ins.lineno is None:
                lines.append(0x80 | (15 << 3) | (n - 1))
            else:
                lines.append(0x80 | (13 << 3) | (n - 1))
                _write_signed_varint(lines, ins.lineno - line)
                line = ins.lineno
            units -= n
    # the exception table: consecutive instructions sharing an entry form one range
    entries: list[ExceptionTableEntry] = []
    k = 0
    while k < len(instrs):
        entry = instrs[k].exn
        if entry is None:
            k += 1
            continue
        j = k
        while j + 1 < len(instrs) and instrs[j + 1].exn is entry:
            j += 1
        end = offsets[id(instrs[j])] + 2 * exts[j] + 2 + 2 * cache_entries(instrs[j].opcode)
        entries.append(
            ExceptionTableEntry(
                offsets[id(instrs[k])], end, offsets[id(entry.target)], entry.depth, entry.lasti
            )
        )
        k = j + 1
    real = {id(ins): offsets[id(ins)] + 2 * ext for ins, ext in zip(instrs, exts, strict=True)}
    return Assembled(bytes(out), bytes(lines), encode_exception_table(entries), offsets, real)


def stack_depth(instrs: list[Instr]) -> int:
    """The deepest stack any path through `instrs` reaches (handlers start at depth + 1 + lasti)."""
    index = {id(ins): k for k, ins in enumerate(instrs)}
    depth_at: dict[int, int] = {0: 0}
    work = [0]
    best = 0

    def visit(k: int, d: int) -> None:
        if k < len(instrs) and depth_at.get(k, -1) < d:
            depth_at[k] = d
            work.append(k)

    while work:
        k = work.pop()
        ins = instrs[k]
        d = depth_at[k]
        best = max(best, d)
        if ins.exn is not None:
            visit(index[id(ins.exn.target)], ins.exn.depth + 1 + int(ins.exn.lasti))
        arg = ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None
        if ins.target is not None:
            jd = d + dis.stack_effect(ins.opcode, arg, jump=True)
            best = max(best, jd)
            visit(index[id(ins.target)], jd)
        if ins.opname not in NO_FALLTHROUGH:
            nd = d + dis.stack_effect(ins.opcode, arg, jump=False)
            best = max(best, nd)
            visit(k + 1, nd)
    return best
