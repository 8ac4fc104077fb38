"""The assembler: exception-table and instruction round trips over real code, trampolines that keep
the original signature, on this interpreter and (when installed) on the other supported one."""

from __future__ import annotations

import dis
import inspect
import json
import pathlib
import shutil
import subprocess
import sys
import types
from typing import Any

import pytest
import torch

from kiln_dynamo import bytecode
from kiln_dynamo.convert_frame import entry_names


def _all_code(module: types.ModuleType) -> list[types.CodeType]:
    out: list[types.CodeType] = []
    stack = [obj.__code__ for obj in vars(module).values() if isinstance(obj, types.FunctionType)]
    for cls in (c for c in vars(module).values() if isinstance(c, type)):
        stack += [f.__code__ for f in vars(cls).values() if isinstance(f, types.FunctionType)]
    while stack:
        code = stack.pop()
        out.append(code)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return out


MODULES = [json.decoder, inspect, torch.nn.modules.module, torch.nn.functional, torch.fx.graph]


@pytest.mark.parametrize("module", MODULES, ids=[m.__name__ for m in MODULES])
def test_exception_table_round_trip(module: types.ModuleType) -> None:
    codes = _all_code(module)
    assert len(codes) > 5
    n_entries = 0
    for code in codes:
        entries = bytecode.parse_exception_table(code)
        n_entries += len(entries)
        assert bytecode.encode_exception_table(entries) == code.co_exceptiontable, code.co_qualname
        for e in entries:
            assert 0 <= e.start < e.end <= len(code.co_code) and e.target < len(code.co_code)
    assert n_entries > 0


@pytest.mark.parametrize("module", MODULES, ids=[m.__name__ for m in MODULES])
def test_instruction_round_trip(module: types.ModuleType) -> None:
    for code in _all_code(module):
        decoded = bytecode.decode_code(code)
        raw = bytecode.encode(decoded)
        # Inline caches are written as zeros; compare with the original's caches zeroed.
        assert len(raw) == len(code.co_code), code.co_qualname
        assert raw[::2][: len(raw) // 2] == _ops_with_zeroed_caches(code)[::2], code.co_qualname


def _ops_with_zeroed_caches(code: types.CodeType) -> bytes:
    raw = bytearray(code.co_code)
    i = 0
    while i < len(raw):
        n = bytecode.cache_entries(raw[i])
        for j in range(n):
            raw[i + 2 + 2 * j] = 0
            raw[i + 3 + 2 * j] = 0
        i += 2 + 2 * n
    return bytes(raw)


def _outer() -> Any:
    z = 10

    def f(a, b=2, /, c=3, *args, k, m=5, **kw):
        def g():
            return a + z

        return g

    return f


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {"k": 4}), ((1, 2, 3, 4, 5), {"k": 0, "m": 1, "q": 9}), ((7, 8), {"c": 1, "k": 2})],
)
def test_trampoline_keeps_signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    f = _outer()
    code = f.__code__
    names = entry_names(code)
    seen: list[tuple[Any, ...]] = []

    def runner(*values: Any) -> str:
        seen.append(values)
        return "ran"

    tramp = bytecode.build_trampoline(code, runner, names)
    for attr in ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_freevars", "co_cellvars"):
        assert getattr(tramp, attr) == getattr(code, attr)
    g = types.FunctionType(tramp, f.__globals__, "f", f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    assert g(*args, **kwargs) == "ran"
    bound = inspect.signature(f).bind(*args, **kwargs)
    bound.apply_defaults()
    expected = (*(bound.arguments.get(n, ()) for n in names[:-1]), 10)
    assert seen[0] == expected


_OTHER = {(3, 11): "3.12", (3, 12): "3.11"}[sys.version_info[:2]]


def _other_python() -> str | None:
    for cand in (
        shutil.which(f"python{_OTHER}"),
        f"/root/.pyenv/versions/{_OTHER}.1/bin/python{_OTHER}",
        f"/root/.pyenv/versions/{_OTHER}.7/bin/python{_OTHER}",
    ):
        if cand and pathlib.Path(cand).exists():
            probe = subprocess.run([cand, "-c", "print(1)"], capture_output=True, text=True, check=False)
            if probe.returncode == 0:
                return cand
    return None


@pytest.mark.parametrize("module", MODULES, ids=[m.__name__ for m in MODULES])
def test_assemble_disassemble_round_trip(module: types.ModuleType) -> None:
    """assemble(disassemble(code)) gives the same bytes, exception table and lines; the stack
    depth analysis never exceeds what CPython's compiler computed."""
    for code in _all_code(module):
        instrs = bytecode.disassemble(code)
        asm = bytecode.assemble(instrs, code.co_firstlineno)
        assert asm.code == code.co_code, code.co_qualname
        assert asm.exceptiontable == code.co_exceptiontable, code.co_qualname
        new = code.replace(co_code=asm.code, co_linetable=asm.linetable, co_exceptiontable=asm.exceptiontable)
        lines = [i.positions.lineno if i.positions else None for i in dis.get_instructions(new)]
        assert lines == [i.positions.lineno if i.positions else None for i in dis.get_instructions(code)]
        assert bytecode.stack_depth(instrs) <= code.co_stacksize, code.co_qualname


def test_long_jumps_get_extended_args() -> None:
    """A jump over more than 255 code units needs EXTENDED_ARG, which moves what follows."""
    body = "\n".join(f"        y = y + {i}" for i in range(300))
    src = f"def f(x):\n    y = x\n    if x:\n{body}\n    return y\n"
    scope: dict[str, Any] = {}
    exec(compile(src, "<long>", "exec"), scope)
    code = scope["f"].__code__
    asm = bytecode.assemble(bytecode.disassemble(code), code.co_firstlineno)
    assert asm.code == code.co_code
    g = types.FunctionType(code.replace(co_code=asm.code, co_linetable=asm.linetable), {})
    assert g(1) == 1 + sum(range(300)) and g(0) == 0


def continued(a: int, b: list[int]) -> Any:
    total = a
    for v in b:
        total += v
    with torch.no_grad():
        c = total * 2
    try:
        d = c + 1
    except ValueError:
        d = -1
    return total, c, d


def test_continuation_code_runs_the_rest_of_the_function() -> None:
    """A continuation at each statement start, given the locals live there, returns what the
    original returns (no frame hook involved: plain CPython runs the generated code)."""
    from kiln_dynamo import resume

    code = continued.__code__
    first = code.co_firstlineno
    # the locals as they are when the statement on that line is about to run
    before = {
        first + 4: {"a": 3, "b": [1, 2], "total": 6},  # with torch.no_grad():
        first + 6: {"a": 3, "b": [1, 2], "total": 6, "c": 12},  # try:
        first + 10: {"a": 3, "b": [1, 2], "total": 6, "c": 12, "d": 13},  # return
    }
    expected = continued(3, [1, 2])
    n = 0
    for inst in dis.get_instructions(code):
        if inst.starts_line not in before:
            continue
        values = before.pop(inst.starts_line)  # the line's first instruction only
        # live and bound (a with-block's handler path makes `c` live before it is bound)
        live = tuple(sorted(n for n in resume.live_locals(code, inst.offset) if n in values))
        assert "a" not in live and "total" in live
        cont = resume.resume_code(code, inst.offset, (), live)
        assert cont.co_name == f"resume_in_continued_at_{inst.offset}"
        fn = types.FunctionType(cont, continued.__globals__)
        assert fn(*[values[name] for name in live]) == expected, inst.starts_line
        n += 1
    assert n == 3


def test_assembler_on_other_supported_python() -> None:
    """bytecode.py needs no torch: load it alone under the other CPython and run a trampoline."""
    exe = _other_python()
    if exe is None:
        pytest.skip(f"python{_OTHER} not installed")
    path = pathlib.Path(bytecode.__file__)
    script = f"""
import importlib.util, sys, types, json
spec = importlib.util.spec_from_file_location("bc", {str(path)!r})
bc = importlib.util.module_from_spec(spec); sys.modules["bc"] = bc; spec.loader.exec_module(bc)
def outer():
    z = 5
    def f(a, b=2, *args, k=3, **kw):
        def g(): return a
        return a + b + z
    return f
f = outer()
f.__code__ = bc.build_trampoline(f.__code__, lambda *v: v, ['a', 'b', 'args', 'k', 'kw', 'z'])
assert f(1, 7, 8, k=4, q=1) == (1, 7, (8,), 4, {{'q': 1}}, 5)
n = 0
for m in (json, types):
    for v in vars(m).values():
        if isinstance(v, types.FunctionType):
            c = v.__code__
            assert bc.encode_exception_table(bc.parse_exception_table(c)) == c.co_exceptiontable
            assert len(bc.encode(bc.decode_code(c))) == len(c.co_code)
            n += 1
print("ok", n)
"""
    out = subprocess.run([exe, "-c", script], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


def test_other_python_opcodes_have_handlers() -> None:
    """Every opcode that the other supported CPython emits for this suite's model code has a
    handler (torch is not needed to compile: the test files are compiled, not imported)."""
    from kiln_dynamo.translator import InstructionTranslator

    exe = _other_python()
    if exe is None:
        pytest.skip(f"python{_OTHER} not installed")
    files = sorted(str(p) for p in pathlib.Path(__file__).parent.glob("test_capture_*.py"))
    script = f"""
import dis, types
names = set()
def walk(code):
    if code.co_flags & 0x80 or code.co_name == "<module>":
        pass
    else:
        names.update(i.opname for i in dis.get_instructions(code))
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            walk(c)
for f in {files!r}:
    walk(compile(open(f).read(), f, "exec"))
print(" ".join(sorted(names)))
"""
    out = subprocess.run([exe, "-c", script], capture_output=True, text=True, check=True)
    used = set(out.stdout.split())
    # Only in exception handlers (never executed symbolically) or class bodies.
    not_traced = {
        "PUSH_EXC_INFO",
        "POP_EXCEPT",
        "RERAISE",
        "WITH_EXCEPT_START",
        "CHECK_EXC_MATCH",
        "CLEANUP_THROW",
        "LOAD_BUILD_CLASS",
        "LOAD_LOCALS",
        "LOAD_NAME",
        "STORE_NAME",
        "SETUP_ANNOTATIONS",
        "LOAD_FROM_DICT_OR_DEREF",
        "LOAD_FROM_DICT_OR_GLOBALS",
    }
    missing = sorted(n for n in used - not_traced if not hasattr(InstructionTranslator, n))
    assert missing == [], missing


def test_instructions_are_read_once_per_code_object() -> None:
    # Note [Instructions read once per code object]
    def f(x: int) -> int:
        return x + 1

    insts, index_of = bytecode.read(f.__code__)
    assert insts == tuple(dis.get_instructions(f.__code__))
    assert index_of == {inst.offset: i for i, inst in enumerate(insts)}
    assert bytecode.read(f.__code__)[0] is insts and bytecode.instructions(f.__code__) is insts


def test_equal_code_objects_keep_their_own_instructions() -> None:
    # equal code (same bytes, constants, names) compiled from two files: a nested code constant's
    # argval is the one of the code object asked about, never the other's
    source = "def outer():\n    def inner():\n        return 1\n    return inner\n"
    first, second = (compile(source, name, "exec").co_consts[0] for name in ("a.py", "b.py"))
    assert first == second and first is not second
    for code, name in ((first, "a.py"), (second, "b.py")):
        nested = [i.argval for i in bytecode.instructions(code) if isinstance(i.argval, types.CodeType)]
        assert [c.co_filename for c in nested] == [name]


def test_instructions_read_by_a_capture_are_dropped_when_its_tracing_ends() -> None:
    # Note [Instructions read once per code object]: the memo holds the code objects it read,
    # which must not outlive the capture (the backend sees it already empty)
    import kiln_dynamo

    def helper(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def fn(x: torch.Tensor) -> torch.Tensor:
        return helper(x) + helper(x + 1)

    seen: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append(len(bytecode._READ))
        return gm.forward

    x = torch.randn(3)
    assert torch.equal(kiln_dynamo.compile(fn, backend=backend)(x), fn(x))
    assert seen == [0] and not bytecode._READ
