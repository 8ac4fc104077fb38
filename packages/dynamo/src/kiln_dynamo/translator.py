"""The symbolic bytecode evaluator: one method per opcode, over a stack of trackers.

`InstructionTranslator` steps through a code object's instructions (`dis` decodes them: cache
entries dropped, jump targets as offsets). Its state is a stack and a dict of locals holding
`VariableTracker`s, the cells of the frame, and the instruction pointer. Each opcode is the
method of the same name; an opcode without a method is `Unsupported`. Jumps on constants are
followed (loops unroll); a jump on a tensor's truth value is data-dependent and unsupported,
which makes it a graph break. For graph breaks the root translator records the instruction it
was running when `Unsupported` escaped (`break_offset`) and, on the second pass, stops right
before it (`BreakHere`); a try block's body is traced as straight-line code, its handlers only
for exceptions the traced program raises itself (Note [Tracing try blocks]).

Note [Tracing try blocks]: the body of a try/except or try/finally block is traced like any
other code, as torch.compile does: the normal path through it (a finally body included, which
CPython copies onto that path) needs nothing from the exception table. An exception the modelled
program raises while tracing (a `raise`, a KeyError from a dict, StopIteration) enters the handler
CPython would run (Note [Exceptions the frame raises and catches] in variables/exceptions.py).
What else would enter a handler makes the frame split before the outermost try block around it
(`_split_before_try`), so the block runs as Python with its handlers: an unsupported instruction
(a break: the break instruction is what a handler might have to catch, and a frame is not split
inside a try block) and a Python exception that kiln's own modelling raised (an AttributeError, a
fake-tensor shape error). What remains is an exception raised at run time by an operator of the
graph: it propagates out of the graph without entering the handler, as in torch.compile; a
handler that catches what a tensor operator raises (a RuntimeError from a shape mismatch, say) is
the one case where the compiled frame differs from eager, and only on inputs that make that
operator fail.

Calls inline: a user function runs in a child translator (`inline_call`) that shares the
parent's OutputGraph, so the whole call tree lands in one graph. A generator runs step by step
as its consumer asks (Note [Generators traced step by step] in variables/generators.py); a
generator expression or torch's own generator that a consuming builtin takes at once runs to
completion in a child translator that collects the yielded values into a list iterator (Note
[Generators consumed where they are made]).

Note [3.11 and 3.12]: the opcodes that differ are handled explicitly: PRECALL (3.11 only),
LOAD_METHOD (3.11) vs the method bit of LOAD_ATTR (3.12), the NULL bit of LOAD_GLOBAL, the
3.11 direction-specific POP_JUMP_{FORWARD,BACKWARD}_IF_* vs 3.12 POP_JUMP_IF_*, FOR_ITER's
exhaustion (3.11 pops the iterator and jumps to the target; 3.12 jumps past END_FOR),
COMPARE_OP's argument encoding, BINARY_SLICE/STORE_SLICE, RETURN_CONST, LOAD_FAST_AND_CLEAR
and CALL_INTRINSIC_1 (3.12).
"""

from __future__ import annotations

import collections
import dis
import inspect
import operator
import os
import sys
import types
from typing import Any

import torch

from kiln_dynamo import bytecode, inference, resume
from kiln_dynamo.exc import Unsupported, UserFrame
from kiln_dynamo.logs import decisions_log
from kiln_dynamo.output import OutputGraph, source_line
from kiln_dynamo.source import ForeignGlobalSource, GetItemSource, GlobalSource, Source
from kiln_dynamo.variables import locks
from kiln_dynamo.variables.base import (
    NULL,
    CellVariable,
    ConstantMethodVariable,
    ConstantVariable,
    MethodVariable,
    SliceVariable,
    VariableTracker,
)
from kiln_dynamo.variables.builtins import BINARY_OPERATORS, COMPARE_OPERATORS, BuiltinVariable
from kiln_dynamo.variables.dicts import DictVariable, DictViewVariable, SetVariable, key_of
from kiln_dynamo.variables.exceptions import (
    ExceptionVariable,
    ObservedException,
    exception_classes,
    raise_exception,
)
from kiln_dynamo.variables.formatted import FormattedStringVariable, can_defer, sequence_text
from kiln_dynamo.variables.functions import NestedFunctionVariable, passes_result
from kiln_dynamo.variables.generators import GeneratorObjectVariable
from kiln_dynamo.variables.lists import (
    BaseListVariable,
    DequeVariable,
    ListIteratorVariable,
    ListVariable,
    SizeVariable,
    TupleVariable,
    iterator_of,
)
from kiln_dynamo.variables.ndarray import NdarrayVariable, ndarray_binary, ndarray_unary
from kiln_dynamo.variables.nn_module import NNModuleVariable
from kiln_dynamo.variables.opaque import InferenceModeVariable, TracedInferenceExitVariable
from kiln_dynamo.variables.stdlib import NewWeakrefVariable, WeakrefVariable
from kiln_dynamo.variables.symbolic import SymNodeVariable, symbolic_op
from kiln_dynamo.variables.tensor import TensorVariable
from kiln_dynamo.variables.torch import (
    TRUSTED_MODULE_PREFIXES,
    AutocastVariable,
    GradModeVariable,
    WithExitVariable,
)
from kiln_dynamo.variables.user_defined import (
    BuildClassVariable,
    NewObjectVariable,
    SuperVariable,
    UserObjectVariable,
)

PY = bytecode.PY_VERSION
if PY not in ((3, 11), (3, 12)):
    raise NotImplementedError(PY)

VT = VariableTracker
MAX_INLINE_DEPTH = 40
_TORCH_DIR = os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), "")

_BINARY_BY_SYMBOL = {sym: fn for fn, sym in BINARY_OPERATORS.items()}
_COMPARE_BY_SYMBOL = {sym: fn for fn, sym in COMPARE_OPERATORS.items()}
_CONST_BINARY = {fn: fn for fn in BINARY_OPERATORS}
_OUT_OF_PLACE = {fn: _BINARY_BY_SYMBOL[sym[:-1]] for fn, sym in BINARY_OPERATORS.items() if sym.endswith("=")}


def _sequence_result(a: VT, b: VT | None, items: list[VT]) -> BaseListVariable:
    """`a + b` / `a * n` on sequences, typed as Python types it: a list stays a list; torch.Size
    wins over a plain tuple on either side (`Size.__radd__`), while any other tuple (a namedtuple
    included) gives a plain tuple."""
    if isinstance(a, ListVariable):
        return ListVariable(items)
    if isinstance(a, SizeVariable) or (isinstance(b, SizeVariable) and type(a) is TupleVariable):
        if not all(
            (i.is_constant() and type(i.as_constant()) is int)
            or (isinstance(i, SymNodeVariable) and i.python_type() is int)
            for i in items
        ):
            raise Unsupported("torch.Size arithmetic with an item that is not a Python int")
        return SizeVariable(items)
    return TupleVariable(items)


def _sequence_items(v: VT) -> tuple[type, list[VT]] | None:
    """(tuple or list, items) of a tuple/list/Size tracker or a constant tuple/list; None for
    anything else (a deque compares only with deques: left to the callers' other rules)."""
    if isinstance(v, DequeVariable):
        return None
    if isinstance(v, BaseListVariable):
        items = list(v.items)
        kind = v.python_type()
    elif v.is_constant() and isinstance(v.as_constant(), (tuple, list)):
        value = v.as_constant()
        items = [ConstantVariable(x) for x in value]
        kind = type(value)
    else:
        return None
    if issubclass(kind, tuple):
        return tuple, items
    if issubclass(kind, list):
        return list, items
    return None


def _characters_needed(a: VT, b: VT) -> tuple[VT, VT]:
    """A string formatted from tensor data compares by its characters, which capture does not
    have: a break (Note [Strings formatted from tensors]), never an answer by identity. One made
    of symbolic sizes becomes its characters, the sizes specialized (Note [Strings formatted from
    symbolic sizes])."""
    a, b = (
        ConstantVariable(v.as_constant()) if isinstance(v, FormattedStringVariable) else v for v in (a, b)
    )
    return a, b


def _joinable_strings(a: VT, b: VT) -> bool:
    """`a + b` of strings one of which is built after the graph: that string, longer."""
    if not (isinstance(a, FormattedStringVariable) or isinstance(b, FormattedStringVariable)):
        return False
    return all(
        isinstance(v, FormattedStringVariable) or (v.is_constant() and type(v.as_constant()) is str)
        for v in (a, b)
    )


def _symbolic_operands(a: VT, b: VT) -> bool:
    """A size symbol with a number or another size symbol: arithmetic for the ShapeEnv."""
    if not (isinstance(a, SymNodeVariable) or isinstance(b, SymNodeVariable)):
        return False
    return all(isinstance(v, SymNodeVariable) or _is_number(v) for v in (a, b))


def _is_number(vt: VT) -> bool:
    return vt.is_constant() and isinstance(vt.as_constant(), (bool, int, float, complex))


_GENERATOR_FAST_PATH = os.environ.get("KILN_GENERATOR_FAST_PATH", "1") != "0"
_NO_OPS = frozenset({"PRECALL", "CACHE", "EXTENDED_ARG"})
# Builtins that take their (last) argument's items all at once (Note [Generators consumed where
# they are made]); any and all stop at the first decisive item, zip, map, enumerate are lazy
_WHOLE_CONSUMERS = frozenset({sum, tuple, list, set, frozenset, sorted, min, max, dict})


def _consumes_whole(v: VariableTracker) -> bool:
    if isinstance(v, BuiltinVariable):
        return any(v.fn is c for c in _WHOLE_CONSUMERS)
    return (
        isinstance(v, (MethodVariable, ConstantMethodVariable))
        and v.name == "join"
        and v.obj.is_constant()
        and isinstance(v.obj.as_constant(), str)
    )


def _arg(inst: dis.Instruction) -> int:
    return inst.arg if inst.arg is not None else 0


class _ForcedBreak:
    """A testing seam: with `at = k`, the k-th root instruction whose opname is in `opnames`
    raises `Unsupported` on the first tracing pass, so that tests can split any frame anywhere
    and compare it with eager (test_graph_breaks.py's sweep). `at` is None in normal use."""

    opnames = frozenset(
        {"CALL", "BINARY_OP", "BINARY_SUBSCR", "COMPARE_OP", "LOAD_ATTR", "STORE_ATTR", "STORE_SUBSCR",
         "BUILD_STRING", "UNPACK_SEQUENCE", "CALL_FUNCTION_EX", "GET_ITER", "UNARY_NEGATIVE"}
    )  # fmt: skip

    def __init__(self) -> None:
        self.at: int | None = None
        self.seen = 0

    def maybe_break(self, inst: dis.Instruction) -> None:
        if inst.opname in self.opnames:
            self.seen += 1
            if self.seen == self.at:
                raise Unsupported("a break forced by a test")


FORCED_BREAK = _ForcedBreak()


class _Return(Exception):
    def __init__(self, value: VT) -> None:
        self.value = value


class Yielded(Exception):
    """A generator traced step by step reached a yield (Note [Generators traced step by step])."""

    def __init__(self, value: VT) -> None:
        self.value = value


class BreakHere(Exception):
    """The second tracing pass reached the instruction where the frame splits (resume.py)."""

    def __init__(self, tx: InstructionTranslator, inst: dis.Instruction) -> None:
        self.tx = tx
        self.inst = inst
        self.grad_mode = torch.is_grad_enabled()


_SET_OPERATORS = frozenset({"&", "|", "-", "^"})


_RICH = {
    operator.eq: ("__eq__", "__eq__"),
    operator.ne: ("__ne__", "__ne__"),
    operator.lt: ("__lt__", "__gt__"),
    operator.le: ("__le__", "__ge__"),
    operator.gt: ("__gt__", "__lt__"),
    operator.ge: ("__ge__", "__le__"),
}
_DUNDER_OPS = {
    "+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod", "**": "pow",
    "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift", ">>": "rshift",
}  # fmt: skip
_NOT_IMPLEMENTED_SCALARS = (int, float, bool, complex, str, bytes, type(None))
_USER_OBJECTS = (NewObjectVariable, UserObjectVariable)


def _weak_pair(a: VT, b: VT) -> bool:
    """A weak reference made in the frame and one read from outside (`is` between them)."""
    kinds = (NewWeakrefVariable, WeakrefVariable)
    return isinstance(a, kinds) and isinstance(b, kinds) and type(a) is not type(b)


def _keys_view(v: VT) -> bool:
    return isinstance(v, DictViewVariable) and v.kind == "keys"


class InstructionTranslator:
    def __init__(
        self,
        output: OutputGraph,
        code: types.CodeType,
        f_globals: dict[str, Any],
        f_builtins: dict[str, Any],
        symbolic_locals: dict[str, VT],
        cells: dict[str, CellVariable],
        parent: InstructionTranslator | None = None,
    ) -> None:
        self.output = output
        self.code = code
        self.f_globals = f_globals
        self.f_builtins = f_builtins
        self.locals = symbolic_locals
        self.cells = cells
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        # shared and read-only: Note [Instructions read once per code object]
        self.instructions, self.index_of = bytecode.read(code)
        self.stack: list[VT] = []
        self.ip = 0
        self.lineno: int | None = code.co_firstlineno
        self.kw_names: tuple[str, ...] = ()
        self.yielded: list[VT] | None = [] if code.co_flags & (0x20 | 0x200) else None
        self.step_by_step = False  # a generator suspended at each yield (GeneratorObjectVariable)
        self.generators: list[GeneratorObjectVariable] = []  # root only: those the frame made
        self.facts = resume.facts(code)
        self.exception_table = bytecode.parse_exception_table(code)
        self.exc_info: VT = ConstantVariable(None)  # the exception being handled (sys.exc_info())
        self.break_at: int | None = None  # root only: split the frame when this offset is reached
        self.current: dis.Instruction | None = None
        # this frame was inlined for a call whose result is exactly what the frame returns (no
        # hook, no builtin around it), so a continuation of it can stand in for the call
        self.direct = False
        self.direct_next = False  # the call being made now is such a call
        # eager's caller of this frame is `parent` itself: a plain call, no Module.__call__ or
        # hook or stand-in frames between them (Note [Warnings from above the compiled frame])
        self.same_caller = False
        self.same_caller_next = False
        self.function: VT | None = None  # the tracker of the function this frame runs, when inlined

    # --- locations ----------------------------------------------------------------------------
    def where(self) -> str:
        return f"{self.code.co_filename}:{self.lineno}"

    def user_frames(self) -> tuple[UserFrame, ...]:
        """The user's frames from the captured frame down to this one (inlined calls)."""
        frames = []
        tx: InstructionTranslator | None = self
        while tx is not None:
            info = resume.resume_info(tx.code)
            name = tx.code.co_name if info is None else info.original.co_name
            frames.append(
                UserFrame(tx.code.co_filename, tx.lineno, name, source_line(tx.code.co_filename, tx.lineno))
            )
            tx = tx.parent
        return tuple(reversed(frames))

    def stack_trace(self) -> str:
        return "\n".join(f"  {f}" for f in self.user_frames())

    # --- running ------------------------------------------------------------------------------
    def run(self) -> VT:
        try:
            while True:
                inst = self.instructions[self.ip]
                self.ip += 1
                if inst.positions is not None and inst.positions.lineno is not None:
                    self.lineno = inst.positions.lineno
                self.current = inst
                if self.parent is None:
                    if inst.offset == self.break_at:
                        raise BreakHere(self, inst)
                    if FORCED_BREAK.at is not None and self.break_at is None:
                        FORCED_BREAK.maybe_break(inst)
                elif self._at_break_path(inst):
                    raise BreakHere(self, inst)
                handler = getattr(self, inst.opname, None)
                if handler is None:
                    raise Unsupported(f"opcode {inst.opname} is not supported")
                self.output.guards.where = self.where()
                try:
                    handler(inst)
                except ObservedException as e:
                    if not self._enter_handler(inst, e):
                        raise
        except _Return as r:
            return r.value
        except Unsupported as e:
            located = e.located(self.where(), self.user_frames(), self.depth)
            if isinstance(e, locks.LockBlockHasEffects) and e.enter_offset is not None:
                located = _before_lock(located, e.enter_offset)  # Note [Locks in the frame]
            if self.current is not None:  # Note [Resuming a chain of frames]
                located.chain.append((self.depth, self.current.offset, self.depth == 0 or self.direct))
            if self.parent is None and self.current is not None and located.break_offset is None:
                located.break_offset = self.current.offset
                held = [v.enter_offset for v in self.stack if isinstance(v, locks.LockExitVariable)]
                if held and held[0] is not None:  # a break inside the block: split before it
                    located = _before_lock(located, held[0])
                blocks = [v.enter_offset for v in self.stack if isinstance(v, TracedInferenceExitVariable)]
                if blocks and blocks[0] is not None:
                    located = _at_inference_block(located, blocks[0])
                located = self._split_before_try(located)
            raise located from e.__cause__
        except RecursionError as e:
            raise Unsupported("recursion too deep while tracing").located(self.where()) from e
        except (BreakHere, Yielded):
            raise
        except Exception as e:
            # Note [Tracing try blocks]: a Python exception raised by the modelled code inside a
            # try block is one its handler might catch; kiln does not model handlers, so the
            # frame splits before the block instead (the block then runs as Python).
            offset = self.instructions[self.ip - 1].offset
            if not self.facts.in_try(offset):
                raise
            raised = Unsupported(f"{type(e).__name__} raised inside a try block while tracing: {e}").located(
                self.where(), self.user_frames(), self.depth
            )
            if self.parent is None:
                raised.break_offset = offset
                raised = self._split_before_try(raised)
            raise raised from e

    def _at_break_path(self, inst: dis.Instruction) -> bool:
        """Whether this inlined frame is where the second pass of a chain split stops: its depth is
        the path's last, it is at that offset, and every frame above it is at its own."""
        path = self.output.break_path
        if path is None or self.depth != len(path) - 1 or inst.offset != path[-1]:
            return False
        up = self.parent
        while up is not None:
            if up.current is None or up.current.offset != path[up.depth]:
                return False
            up = up.parent
        return True

    def _enter_handler(self, inst: dis.Instruction, e: ObservedException) -> bool:
        """Note [Exceptions the frame raises and catches]: go to the handler CPython would run
        for an exception raised by `inst`; False when this code has none there."""
        entry = next((x for x in self.exception_table if x.start <= inst.offset < x.end), None)
        if entry is None:
            return False
        target = self.index_of[entry.target]
        nxt = self.instructions[target + 1] if target + 1 < len(self.instructions) else None
        if nxt is not None and nxt.opname == "WITH_EXCEPT_START":
            raise Unsupported(
                f"{e.exc.cls.__name__} raised inside a with block: kiln does not pass exceptions to __exit__"
            ) from e
        del self.stack[entry.depth :]
        if entry.lasti:
            self.push(ConstantVariable(inst.offset))
        self.push(e.exc)
        self.ip = target
        return True

    def _split_before_try(self, e: Unsupported) -> Unsupported:
        """Note [Tracing try blocks]: a break inside a try block moves before the outermost
        try block around it, whose handler must see what the break instruction raises."""
        assert e.break_offset is not None
        starts = [start for start, end in self.facts.try_extents if start <= e.break_offset < end]
        if not starts:
            return e
        start = min(starts)
        if resume.is_resume_code(self.code):
            try:
                resume.original_of(self.code, start)
            except KeyError:  # a chain continuation's prologue call: no point of the original
                return e
        moved = Unsupported(e.msg, e.where, advice=e.advice, frames=e.frames, before=True, depth=0)
        moved.break_offset = start
        moved.note = "split before the try block around it: kiln does not split a frame inside a try block"
        # a break in a frame this one calls may still split the chain through the try block
        # (Note [A chain through try and with blocks] in breaks.py)
        moved.chain = e.chain
        moved.inside_try = True
        return moved

    def jump(self, inst: dis.Instruction) -> None:
        self.ip = self.index_of[inst.argval]

    def push(self, v: VT) -> None:
        self.stack.append(v)

    def pop(self) -> VT:
        return self.stack.pop()

    def popn(self, n: int) -> list[VT]:
        if n == 0:
            return []
        out = self.stack[-n:]
        del self.stack[-n:]
        return out

    # --- helpers shared with trackers ---------------------------------------------------------
    def wrap(self, value: Any, source: Source | None) -> VT:
        return self.output.builder.wrap(value, source)

    def wrap_constant(self, value: Any) -> VT:
        if isinstance(value, torch.Tensor):
            raise Unsupported("a tensor appeared where a constant was expected")
        return self.output.builder.wrap(value, None)

    def load_attr(self, obj: VT, name: str) -> VT:
        return obj.getattr(self, name)

    def values_equal(self, a: VT, b: VT) -> bool:
        """`a == b` as `in`, `list.count`/`index` and sequence comparison ask it: identity first,
        then equality (Note [Equality of sizes and sequences])."""
        if a.is_constant() and b.is_constant():
            return bool(a.as_constant() == b.as_constant())
        if a.identity() is b.identity():
            return True
        a, b = _characters_needed(a, b)
        if a.is_constant() and b.is_constant():
            return bool(a.as_constant() == b.as_constant())
        if _symbolic_operands(a, b):
            return symbolic_op(self, operator.eq, [a, b]).truth(self)
        if isinstance(a, _USER_OBJECTS) or isinstance(b, _USER_OBJECTS):
            return self.rich_compare(operator.eq, a, b).truth(self)  # Note [Comparing user objects]
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            raise Unsupported("comparing a tensor for equality in Python control flow")
        seq = self.sequences_equal(a, b)
        if seq is not None:
            return seq
        return False

    def sequences_equal(self, a: VT, b: VT) -> bool | None:
        """Note [Equality of sizes and sequences]: two tuples (a `torch.Size` is one), or two lists,
        are equal when their lengths are and their items are, pairwise, as Python compares them
        (identity, then `==`); a list never equals a tuple. None when `a` and `b` are not both such
        sequences. Items that are size symbols compare through the ShapeEnv, which guards the
        answer. Before, a `torch.Size` with a symbolic size compared to a tuple answered by type
        (`x.shape == (b, t)` was False), and a size symbol `in` a tuple of ints answered by
        identity (False), under dynamic shapes: wrong answers, found in the eleventh session
        (`nn.LSTM` raised its hidden-size error where eager ran)."""
        sa, sb = _sequence_items(a), _sequence_items(b)
        if sa is None or sb is None:
            return None
        (kind_a, items_a), (kind_b, items_b) = sa, sb
        if kind_a is not kind_b or len(items_a) != len(items_b):
            return False
        return all(self.values_equal(x, y) for x, y in zip(items_a, items_b, strict=True))

    # Note [Comparisons of sizes stay symbolic]: `n in (4, 7)`, `x.shape[:1] == (2 * n,)` and
    # `[n, m] != [4, 4]` over size symbols are SymBools (an `Or` of `Eq`s, an `And` of them), not
    # Python bools: asking the ShapeEnv for the answer guards it, and a guard `Eq(s0, 4)` pins
    # the size (a replacement) or `Eq(s0, 2*s2)` ties two symbols, so the next size recompiles
    # although nothing in the frame branched on the answer. A SymBool that only leaves the frame
    # is computed again in Python from its operands there (Note [Symbolic numbers stay out of
    # the graph until a tensor needs them]); one that decides a branch is guarded then, as one
    # guard over the whole comparison. Only when every pair compared is numbers or sequences of
    # them (a tensor or a user object among the items keeps Python's one-by-one, short-circuit
    # answer through `values_equal`; a string or None never equals a number); constant pairs are
    # decided at once, and a pair known unequal (different lengths, a constant False) decides
    # the whole comparison.
    # Measured: `size_comparisons` and `int_logic` of bench/dynamic_probes.py compiled 3 and 5
    # graphs under dynamic=True where torch.compile (which also returns these as SymBools)
    # compiled 1 and 2.
    def symbolic_equal(self, a: VT, b: VT) -> VT | None:
        """`a == b` as a tracker, a SymBool when sizes decide it (Note [Comparisons of sizes stay
        symbolic]); None when a pair is not numbers or sequences of them."""
        if a.is_constant() and b.is_constant():
            if isinstance(a.as_constant(), (tuple, list)) or isinstance(b.as_constant(), (tuple, list)):
                return ConstantVariable(self.values_equal(a, b))
            return (
                ConstantVariable(bool(a.as_constant() == b.as_constant()))
                if _is_number(a) and _is_number(b)
                else None
            )
        if a.identity() is b.identity():
            return ConstantVariable(True)
        if _symbolic_operands(a, b):
            return symbolic_op(self, operator.eq, [a, b])
        for x, y in ((a, b), (b, a)):
            if (
                isinstance(x, SymNodeVariable)
                and y.is_constant()
                and isinstance(y.as_constant(), (str, bytes, type(None)))
            ):
                return ConstantVariable(False)  # a number never equals a string or None
        sa, sb = _sequence_items(a), _sequence_items(b)
        if sa is None or sb is None:
            return None
        (kind_a, items_a), (kind_b, items_b) = sa, sb
        if kind_a is not kind_b or len(items_a) != len(items_b):
            return ConstantVariable(False)
        parts = []
        for x, y in zip(items_a, items_b, strict=True):
            part = self.symbolic_equal(x, y)
            if part is None:
                return None
            parts.append(part)
        return self._fold_bools(operator.and_, parts)

    def symbolic_contains(self, container: VT, item: VT) -> VT | None:
        """`item in container` for a tuple or list as a tracker, a SymBool when sizes decide it
        (Note [Comparisons of sizes stay symbolic]); None when that does not apply."""
        if not isinstance(container, BaseListVariable | ConstantVariable):
            return None  # asking another container whether it is a constant reads all its entries
        seq = _sequence_items(container)
        if seq is None:
            return None
        items = seq[1]
        if not any(isinstance(v, SymNodeVariable) for v in (item, *items)):
            return None
        parts = []
        for x in items:
            part = self.symbolic_equal(x, item)
            if part is None:
                return None
            parts.append(part)
        return self._fold_bools(operator.or_, parts)

    def _fold_bools(self, fn: Any, parts: list[VT]) -> VT:
        """`and`/`or` (`fn` is operator.and_ or operator.or_) of constant and symbolic bools: a
        constant that decides it (False for and, True for or) answers at once."""
        decisive = fn is operator.or_
        out: VT | None = None
        for part in parts:
            if part.is_constant():
                if bool(part.as_constant()) is decisive:
                    return ConstantVariable(decisive)
                continue
            out = part if out is None else symbolic_op(self, fn, [out, part])
        return out if out is not None else ConstantVariable(not decisive)

    def contains(self, container: VT, item: VT) -> bool:
        if hasattr(container, "contains"):
            return bool(container.contains(self, item))
        if container.is_constant() and item.is_constant():
            return item.as_constant() in container.as_constant()
        if isinstance(container, NNModuleVariable):
            from torch import nn

            if isinstance(container.module, nn.ModuleDict):
                return item.as_constant() in container.module._modules
        raise Unsupported(f"`in` on {container.describe()}")

    def subscript(self, obj: VT, key: VT) -> VT:
        return obj.getitem(self, key)

    def binary_op(self, fn: Any, a: VT, b: VT) -> VT:
        if isinstance(a, NdarrayVariable) or isinstance(b, NdarrayVariable):
            return ndarray_binary(self, fn, a, b)  # Note [NumPy round trips]
        if isinstance(b, TensorVariable) and fn in _OUT_OF_PLACE and _is_number(a):
            fn = _OUT_OF_PLACE[fn]  # `n += t` for a number n is `n + t` (FX cannot print `0 += t`)
        if isinstance(a, _USER_OBJECTS) or isinstance(b, _USER_OBJECTS):
            return self.user_binary(fn, a, b)
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            return self.output.create_call(self, "call_function", fn, [a, b], {})
        if _symbolic_operands(a, b):
            return symbolic_op(self, _OUT_OF_PLACE.get(fn, fn), [a, b])
        if a.is_constant() and b.is_constant() and not isinstance(a, BaseListVariable | DictVariable):
            try:
                return self.wrap_constant(fn(a.as_constant(), b.as_constant()))
            except Exception as e:
                raise Unsupported(f"{BINARY_OPERATORS.get(fn, fn)} raised {type(e).__name__}: {e}") from e
        sym = BINARY_OPERATORS.get(fn, "")
        base = sym.rstrip("=") if sym.endswith("=") and sym not in ("==",) else sym
        if base == "+" and _joinable_strings(a, b):
            return FormattedStringVariable.join([a, b])  # Note [Strings formatted from tensors]
        if (isinstance(a, DequeVariable) or isinstance(b, DequeVariable)) and sym != "+=":
            raise Unsupported(f"operator {sym or fn} on {a.describe()} and {b.describe()}")
        if isinstance(a, BaseListVariable) and base == "+" and isinstance(b, BaseListVariable):
            if sym == "+=" and isinstance(a, ListVariable):
                a.call_method(self, "extend", [b], {})
                return a
            if type(a) is not type(b) and not (isinstance(a, TupleVariable) and isinstance(b, TupleVariable)):
                raise Unsupported(f"{a.describe()} + {b.describe()}")
            return _sequence_result(a, b, a.items + b.items)
        if sym == "+=" and isinstance(a, ListVariable):
            a.call_method(self, "extend", [b], {})
            return a
        if isinstance(a, BaseListVariable) and base == "*" and b.is_constant():
            return _sequence_result(a, None, a.items * b.as_constant())
        if isinstance(b, BaseListVariable) and base == "*" and a.is_constant():
            return _sequence_result(b, None, b.items * a.as_constant())
        if (
            isinstance(a, DictVariable)
            and base == "|"
            and isinstance(b, DictVariable)
            and a.user_cls in (dict, collections.OrderedDict)
        ):
            if sym == "|=":
                a.call_method(self, "update", [b], {})
                return a
            return DictVariable({**a.items, **b.items}, a.user_cls)
        if base in _SET_OPERATORS and (_keys_view(a) or _keys_view(b)):
            if not all(_keys_view(v) or isinstance(v, SetVariable) for v in (a, b)):
                raise Unsupported(f"operator {sym} on {a.describe()} and {b.describe()}")
            # a dict's keys view with a set or another keys view: Python's result is a new set
            a, b = (SetVariable([key_of(i) for i in v.iterate(self)]) if _keys_view(v) else v for v in (a, b))
        if isinstance(a, SetVariable) and isinstance(b, SetVariable):  # items compare as keys
            out = fn(set(a.items), set(b.items))
            return SetVariable(list(out)) if isinstance(out, set) else ConstantVariable(out)
        if isinstance(a, SetVariable) and b.is_constant():
            return SetVariable(list(fn(a.as_constant(), b.as_constant())))
        raise Unsupported(f"operator {sym or fn} on {a.describe()} and {b.describe()}")

    def compare_op(self, fn: Any, a: VT, b: VT) -> VT:
        if isinstance(a, NdarrayVariable) or isinstance(b, NdarrayVariable):
            return ndarray_binary(self, fn, a, b)
        if isinstance(a, _USER_OBJECTS) or isinstance(b, _USER_OBJECTS):
            return self.rich_compare(fn, a, b)
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            return self.output.create_call(self, "call_function", fn, [a, b], {})
        if _symbolic_operands(a, b):
            return symbolic_op(self, fn, [a, b])
        if a.is_constant() and b.is_constant():
            return ConstantVariable(fn(a.as_constant(), b.as_constant()))
        a, b = _characters_needed(a, b)
        if a.is_constant() and b.is_constant():
            return ConstantVariable(fn(a.as_constant(), b.as_constant()))
        if fn in (operator.eq, operator.ne):
            equal = self.symbolic_equal(a, b)  # Note [Comparisons of sizes stay symbolic]
            if isinstance(equal, SymNodeVariable):
                return equal if fn is operator.eq else symbolic_op(self, torch.sym_not, [equal])
            seq = self.sequences_equal(a, b)  # Note [Equality of sizes and sequences]
            if seq is not None:
                return ConstantVariable(seq if fn is operator.eq else not seq)
            same = a.identity() is b.identity()
            if same or type(a) is not type(b):
                return ConstantVariable(same if fn is operator.eq else not same)
        raise Unsupported(f"comparison {COMPARE_OPERATORS[fn]} on {a.describe()} and {b.describe()}")

    def user_binary(self, fn: Any, a: VT, b: VT) -> VT:
        """`a + b` (any binary operator, in place too) with an instance of a user class: Python's
        protocol, as Note [Comparing user objects]: `a.__iadd__(b)` first for `+=`, then
        `a.__add__(b)` and `b.__radd__(a)` (the reflected one first when b's class is a proper
        subclass of a's that defines it; never for two objects of one class), each inlined when
        the class defines it in Python; `NotImplemented` passes on; a built-in scalar or string
        answers NotImplemented; anything else on the other side is a break, and so is an operator
        nobody implements (eager raises TypeError)."""
        sym = BINARY_OPERATORS.get(fn, "")
        inplace = sym.endswith("=")
        op = _DUNDER_OPS.get(sym.rstrip("="))
        if op is None:
            raise Unsupported(f"operator {sym or fn} on {a.describe()} and {b.describe()}")
        ta, tb = a.python_type(), b.python_type()
        order = [(a, f"__{op}__", b), (b, f"__r{op}__", a)]
        if tb is ta:
            order.pop()
        elif issubclass(tb, ta) and inspect.isfunction(inspect.getattr_static(tb, f"__r{op}__", None)):
            order.reverse()
        if inplace:
            order.insert(0, (a, f"__i{op}__", b))
        for x, meth, y in order:
            if isinstance(x, ConstantVariable) and type(x.value) in _NOT_IMPLEMENTED_SCALARS:
                continue
            if not isinstance(x, _USER_OBJECTS):
                raise Unsupported(f"operator {sym} of {x.describe()} with {y.describe()}")
            static = inspect.getattr_static(x.python_type(), meth, None)
            if static is None:
                continue
            if not inspect.isfunction(static):
                raise Unsupported(f"{x.python_type().__qualname__}.{meth} is not a Python function")
            r = x.getattr(self, meth).call(self, [y], {})
            if not (r.is_constant() and r.as_constant() is NotImplemented):
                return r
        raise Unsupported(f"operator {sym} that neither operand implements (TypeError)")

    def rich_compare(self, fn: Any, a: VT, b: VT) -> VT:
        """Note [Comparing user objects]: `a == b` (and `!=`, `<`, ...) where an operand is an
        instance of a user class runs Python's protocol: the reflected method of `b` first when
        b's class is a proper subclass of a's that defines it, then `a.__eq__(b)`, then
        `b.__eq__(a)`, each inlined when the class defines it in Python; `NotImplemented` passes
        to the next; `object`'s defaults answer identity for `==`/`!=` (`__ne__` inverts a
        Python `__eq__`), and an ordering nobody implements is a break (eager raises TypeError).
        A built-in scalar or string on the other side answers NotImplemented, as CPython's do;
        any other value there (a tensor, a list) is a break. Before, `==` answered identity
        without asking the class: `E() == "x"` was False for an `__eq__` that says True."""
        name, reflected = _RICH[fn]
        order = [(a, name, b), (b, reflected, a)]
        ta, tb = a.python_type(), b.python_type()
        if (
            tb is not ta
            and issubclass(tb, ta)
            and inspect.isfunction(inspect.getattr_static(tb, reflected, None))
        ):
            order.reverse()
        for x, meth, y in order:
            if isinstance(x, ConstantVariable) and type(x.value) in _NOT_IMPLEMENTED_SCALARS:
                continue  # int/str/None.__eq__(user object) is NotImplemented
            if not isinstance(x, _USER_OBJECTS):
                raise Unsupported(f"comparison {COMPARE_OPERATORS[fn]} of {x.describe()} with {y.describe()}")
            cls = x.python_type()
            static = inspect.getattr_static(cls, meth, None)
            if meth == "__ne__" and static is object.__ne__:  # object.__ne__ inverts __eq__
                eq = inspect.getattr_static(cls, "__eq__", None)
                if inspect.isfunction(eq):
                    r = x.getattr(self, "__eq__").call(self, [y], {})
                    if r.is_constant() and r.as_constant() is NotImplemented:
                        continue
                    return ConstantVariable(not r.truth(self))
                static = eq
            if inspect.isfunction(static):
                r = x.getattr(self, meth).call(self, [y], {})
                if r.is_constant() and r.as_constant() is NotImplemented:
                    continue
                return r
            if static is not getattr(object, meth, None) and not (
                meth == "__ne__" and static is object.__eq__
            ):
                raise Unsupported(f"{cls.__qualname__}.{meth} is not a Python function")
        if fn in (operator.eq, operator.ne):
            same = a.identity() is b.identity()
            return ConstantVariable(same if fn is operator.eq else not same)
        raise Unsupported(f"comparison {COMPARE_OPERATORS[fn]} that neither operand implements (TypeError)")

    def unary_op(self, fn: Any, a: VT) -> VT:
        if fn is operator.not_:
            return ConstantVariable(not a.truth(self))
        if isinstance(a, TensorVariable):
            return self.output.create_call(self, "call_function", fn, [a], {})
        if isinstance(a, NdarrayVariable):
            return ndarray_unary(self, fn, a)
        if isinstance(a, SymNodeVariable):
            return symbolic_op(self, fn, [a])
        if a.is_constant():
            return self.wrap_constant(fn(a.as_constant()))
        raise Unsupported(f"unary {fn.__name__} on {a.describe()}")

    def inline_call(
        self,
        code: types.CodeType,
        f_globals: dict[str, Any],
        bound: dict[str, VT],
        closure: list[CellVariable],
        label: str,
        rebuild: tuple[VT, list[VT], dict[str, VT]] | None = None,
    ) -> VT:
        if self.depth >= MAX_INLINE_DEPTH:
            raise Unsupported(f"call depth over {MAX_INLINE_DEPTH} while inlining {label}")
        if code.co_flags & (0x80 | 0x100 | 0x200):
            raise Unsupported(f"{label} is a coroutine or async generator")
        step_by_step = bool(code.co_flags & 0x20) and not (
            (code.co_name == "<genexpr>" or code.co_filename.startswith(_TORCH_DIR))
            and self._consumed_at_once(code)
        )
        cells: dict[str, CellVariable] = {}
        for name in code.co_cellvars:
            cells[name] = CellVariable(
                bound.pop(name) if name in bound and name not in code.co_varnames else None
            )
            if name in code.co_varnames and name in bound:
                cells[name].contents = bound[name]
        if len(closure) != len(code.co_freevars):
            raise Unsupported(f"{label}: closure does not match its free variables")
        for name, cell in zip(code.co_freevars, closure, strict=True):
            cells[name] = cell
        child = InstructionTranslator(self.output, code, f_globals, self.f_builtins, dict(bound), cells, self)
        child.direct = self.direct_next and not step_by_step
        child.same_caller = self.same_caller_next and not step_by_step
        child.function = rebuild[0] if rebuild is not None else None
        self.direct_next = False
        self.same_caller_next = False
        if step_by_step:
            # Note [Generators traced step by step]: a generator runs as its consumer asks, so
            # their effects interleave as in CPython; only one a consuming builtin takes at once
            # runs to completion here (Note [Generators consumed where they are made]).
            child.step_by_step = True
            root: InstructionTranslator = self
            while root.parent is not None:
                root = root.parent
            created_at = root.current.offset if root.current is not None else None
            gen = GeneratorObjectVariable(child, code.co_qualname, rebuild, created_at)
            root.generators.append(gen)
            return gen
        result = child.run()
        for name in code.co_cellvars:  # Note [Functions made in the frame that leave it]
            cells[name].closed = True  # type: ignore[attr-defined]
        if child.yielded is not None:
            return ListIteratorVariable(child.yielded, "generator")
        return result

    def _consumed_at_once(self, code: types.CodeType) -> bool:
        """Note [Generators consumed where they are made]: a generator expression, or a
        generator of torch's own code, runs to completion where it is made only when the bytecode
        shows that nothing runs between its creation and its consumption: the CALL that makes
        it is followed directly (PRECALL, CACHE and EXTENDED_ARG aside) by the CALL of a
        builtin that consumes its last positional argument whole, with no keyword arguments
        (`sum(x * s for x in xs)`, `tuple(...)`, `", ".join(...)`), and the generator is that
        argument (the CALL's argument count says which stack slots hold the consumer). Nothing
        the generator reads can then change before it has run, and running it here keeps the
        child translator's chain-split flags (Note [Resuming a chain of frames]). A user's
        generator function is always stepped (a break in its body then splits at its call). Any
        other generator (stored in a variable, handed to `zip`, `map` or a user function, consumed
        by `any`/`all`, which stop early) is a `GeneratorObjectVariable` stepped as its
        consumer asks (Note [Generators traced step by step]): before, generator expressions
        always ran here, and read a variable rebound, a list mutated or a tensor changed in
        place between creation and consumption with its old value (a wrong answer). Off with
        KILN_GENERATOR_FAST_PATH=0 (every generator is stepped)."""
        if not _GENERATOR_FAST_PATH or self.current is None:
            return False
        nxt = self.ip
        while nxt < len(self.instructions) and self.instructions[nxt].opname in _NO_OPS:
            nxt += 1
        if nxt >= len(self.instructions) or self.instructions[nxt].opname != "CALL":
            return False
        n = _arg(self.instructions[nxt])
        if n < 1 or self.kw_names or len(self.stack) < n + 1:
            return False
        callee = self.stack[len(self.stack) - (n - 1) - 2 : len(self.stack) - (n - 1)]
        ok = any(_consumes_whole(v) for v in callee)
        decisions_log.info(
            "%s made at %s: %s",
            code.co_qualname,
            self.where(),
            "consumed at once, runs to completion" if ok else "traced step by step",
        )
        return ok

    def call(self, fn: VT, args: list[VT], kwargs: dict[str, VT]) -> VT:
        return fn.call(self, args, kwargs)

    # ==========================================================================================
    # Opcodes. Names match dis.opname; each documents only what differs from CPython's meaning.
    # ==========================================================================================
    def NOP(self, inst: dis.Instruction) -> None:
        pass

    def RESUME(self, inst: dis.Instruction) -> None:
        pass

    def CACHE(self, inst: dis.Instruction) -> None:
        pass

    def EXTENDED_ARG(self, inst: dis.Instruction) -> None:
        pass

    def MAKE_CELL(self, inst: dis.Instruction) -> None:
        pass  # cells are created when the translator starts

    def COPY_FREE_VARS(self, inst: dis.Instruction) -> None:
        pass

    def RETURN_GENERATOR(self, inst: dis.Instruction) -> None:
        self.push(ConstantVariable(None))

    def POP_TOP(self, inst: dis.Instruction) -> None:
        self.pop()

    def PUSH_NULL(self, inst: dis.Instruction) -> None:
        self.push(NULL)

    def COPY(self, inst: dis.Instruction) -> None:
        self.push(self.stack[-_arg(inst)])

    def SWAP(self, inst: dis.Instruction) -> None:
        i = _arg(inst)
        self.stack[-1], self.stack[-i] = self.stack[-i], self.stack[-1]

    def LOAD_CONST(self, inst: dis.Instruction) -> None:
        self.push(
            self.wrap_constant(inst.argval)
            if not isinstance(inst.argval, types.CodeType)
            else ConstantVariable(inst.argval)
        )

    def RETURN_CONST(self, inst: dis.Instruction) -> None:
        self._before_return()
        raise _Return(self.wrap_constant(inst.argval))

    def RETURN_VALUE(self, inst: dis.Instruction) -> None:
        self._before_return()
        raise _Return(self.pop())

    def _before_return(self) -> None:
        if self.parent is None:
            for gen in self.generators:
                gen.check_left_suspended()

    def YIELD_VALUE(self, inst: dis.Instruction) -> None:
        if self.yielded is None:
            raise Unsupported("yield outside a generator")
        value = self.pop()
        self.push(ConstantVariable(None))  # what the yield evaluates to: send() replaces it
        if self.step_by_step:
            raise Yielded(value)  # Note [Generators traced step by step]
        self.yielded.append(value)

    def GET_YIELD_FROM_ITER(self, inst: dis.Instruction) -> None:
        v = self.pop()
        self.push(v if isinstance(v, ListIteratorVariable) else ListIteratorVariable(v.iterate(self)))

    def SEND(self, inst: dis.Instruction) -> None:
        """`yield from`: one step of the receiver under the value sent."""
        value = self.pop()
        receiver = self.stack[-1]
        if isinstance(receiver, GeneratorObjectVariable):
            item, ret = receiver.send(self, value), receiver.return_value
        elif (
            isinstance(receiver, ListIteratorVariable) and value.is_constant() and value.as_constant() is None
        ):
            item, ret = receiver.next(self), ConstantVariable(None)
        else:
            raise Unsupported(f"yield from {receiver.describe()}")
        if item is not None:
            self.push(item)
            return
        if PY == (3, 11):
            self.stack[-1] = ret
        elif PY == (3, 12):
            self.push(ret)  # END_SEND at the target drops the receiver
        else:  # pragma: no cover
            raise NotImplementedError(PY)
        self.jump(inst)

    def END_SEND(self, inst: dis.Instruction) -> None:  # 3.12
        value = self.pop()
        self.pop()
        self.push(value)

    # --- locals and cells ----------------------------------------------------------------------
    def LOAD_FAST(self, inst: dis.Instruction) -> None:
        name = inst.argval
        if name in self.cells and name not in self.locals:
            self.push(self._cell_get(name))
            return
        if name not in self.locals:
            raise Unsupported(f"local variable {name!r} referenced before assignment")
        self.push(self.locals[name])

    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_AND_CLEAR(self, inst: dis.Instruction) -> None:
        self.push(self.locals.pop(inst.argval, NULL))

    def STORE_FAST(self, inst: dis.Instruction) -> None:
        v = self.pop()
        if v is NULL:
            self.locals.pop(inst.argval, None)
        else:
            self.locals[inst.argval] = v

    def DELETE_FAST(self, inst: dis.Instruction) -> None:
        self.locals.pop(inst.argval, None)

    def _cell_get(self, name: str) -> VT:
        cell = self.cells[name]
        if cell.contents is None:
            raise Unsupported(f"free variable {name!r} referenced before assignment")
        return cell.contents

    def LOAD_DEREF(self, inst: dis.Instruction) -> None:
        self.push(self._cell_get(inst.argval))

    def LOAD_CLOSURE(self, inst: dis.Instruction) -> None:
        self.push(self.cells[inst.argval])

    def STORE_DEREF(self, inst: dis.Instruction) -> None:
        cell = self.cells[inst.argval]
        if getattr(cell, "real", False) or getattr(cell, "root_free", False):
            raise Unsupported(f"assignment to nonlocal {inst.argval!r}, a cell that outlives the frame")
        cell.contents = self.pop()

    def DELETE_DEREF(self, inst: dis.Instruction) -> None:
        raise Unsupported("del of a closure variable")

    def LOAD_GLOBAL(self, inst: dis.Instruction) -> None:
        name = inst.argval
        if _arg(inst) & 1:
            self.push(NULL)
        self.push(self._load_global(name))

    def _load_global(self, name: str) -> VT:
        pending = self.output.side_effects.pending_attr(self.f_globals, name)
        if pending is not None:
            return pending
        if name in self.f_globals:
            if self.f_globals is self.output.f_globals:
                src: Source | None = GlobalSource(name)
            elif str(self.f_globals.get("__name__", "")).split(".")[0] in TRUSTED_MODULE_PREFIXES:
                src = None  # torch's own module globals (F, _VF, ...) are trusted, not guarded
            else:
                src = ForeignGlobalSource(self.f_globals, name)
            return self.wrap(self.f_globals[name], src)
        builtins = self.f_builtins
        if name in builtins:
            return self.wrap(builtins[name], self._builtin_source(name))
        raise Unsupported(f"NameError: name {name!r} is not defined")

    def _builtin_source(self, name: str) -> Source | None:
        """Note [Guarding builtins]: a builtin read through LOAD_GLOBAL holds while no global of
        its name appears (`len = mylen` at module level after the capture) and while the
        builtins dict still maps the name to it (`builtins.len = ...`): the first is a guard of
        its own, the second comes with the source returned here (its identity is guarded like
        any function's). torch's own modules are trusted, as for their globals."""
        if str(self.f_globals.get("__name__", "")).split(".")[0] in TRUSTED_MODULE_PREFIXES:
            return None
        label = "G" if self.f_globals is self.output.f_globals else str(self.f_globals.get("__name__", "?"))
        self.output.guards.absent_from(self.f_globals, label, name)
        return GetItemSource(self.output.const_source(self.f_builtins, "__builtins__"), name)

    def STORE_GLOBAL(self, inst: dis.Instruction) -> None:
        value = self.pop()
        target = _GlobalsTarget(self.f_globals, self.f_globals is self.output.f_globals)
        self.output.side_effects.store_attr(target, self.f_globals, inst.argval, value)

    # --- attributes ---------------------------------------------------------------------------
    def LOAD_ATTR(self, inst: dis.Instruction) -> None:
        obj = self.pop()
        if PY == (3, 12) and _arg(inst) & 1:
            self.push(NULL)
            self.push(self._getattr(obj, inst.argval))
            return
        self.push(self._getattr(obj, inst.argval))

    def LOAD_METHOD(self, inst: dis.Instruction) -> None:  # 3.11
        obj = self.pop()
        self.push(NULL)
        self.push(self._getattr(obj, inst.argval))

    def _getattr(self, obj: VT, name: str) -> VT:
        try:
            return obj.getattr(self, name)
        except AttributeError as e:
            raise Unsupported(f"AttributeError raised inside a compiled frame: {e}") from e

    def STORE_ATTR(self, inst: dis.Instruction) -> None:
        obj = self.pop()
        value = self.pop()
        obj.setattr(self, inst.argval, value)

    def DELETE_ATTR(self, inst: dis.Instruction) -> None:
        obj = self.pop()
        if not isinstance(obj, NewObjectVariable):
            raise Unsupported("del of an attribute")
        obj.delete(self, inst.argval)  # an object made in the frame: nothing outside sees it yet

    def LOAD_SUPER_ATTR(self, inst: dis.Instruction) -> None:  # 3.12
        obj = self.pop()
        cls = self.pop()
        self.pop()  # the global `super`
        attr = self._getattr(SuperVariable(cls, obj), inst.argval)
        if _arg(inst) & 1:
            self.push(NULL)
        self.push(attr)

    def zero_arg_super(self) -> VT:
        """`super()` inside a method: the `__class__` cell and the first argument."""
        if "__class__" not in self.cells or self.code.co_argcount == 0:
            raise Unsupported("super() outside a method")
        cls = self._cell_get("__class__")
        first = self.code.co_varnames[0]
        obj = self.locals.get(first) or (self.cells[first].contents if first in self.cells else None)
        if obj is None:
            raise Unsupported("super(): first argument unavailable")
        return SuperVariable(cls, obj)

    def IMPORT_NAME(self, inst: dis.Instruction) -> None:
        fromlist = self.pop().as_constant()
        level = self.pop().as_constant()
        name = inst.argval
        if level:  # `from ..modeling_utils import X`: resolved against the importing package
            package = self.f_globals.get("__package__") or ""
            parts = package.rsplit(".", level - 1) if package else []
            if not package or len(parts) < level:
                raise Unsupported(f"relative import of {name!r} outside a package")
            name = f"{parts[0]}.{name}" if name else parts[0]
            if not fromlist:
                raise Unsupported(f"relative import of {name!r} without names")
        if name not in sys.modules:
            raise Unsupported(f"import of {name!r} (only modules already imported are supported)")
        module = sys.modules[name if fromlist else name.split(".")[0]]
        self.push(self.wrap(module, None))

    def IMPORT_FROM(self, inst: dis.Instruction) -> None:
        self.push(self._getattr(self.stack[-1], inst.argval))

    # --- operators ----------------------------------------------------------------------------
    def BINARY_OP(self, inst: dis.Instruction) -> None:
        b = self.pop()
        a = self.pop()
        fn = _BINARY_BY_SYMBOL.get(inst.argrepr)
        if fn is None:
            raise Unsupported(f"binary operator {inst.argrepr}")
        self.push(self.binary_op(fn, a, b))

    def COMPARE_OP(self, inst: dis.Instruction) -> None:
        b = self.pop()
        a = self.pop()
        self.push(self.compare_op(_COMPARE_BY_SYMBOL[inst.argval], a, b))

    def IS_OP(self, inst: dis.Instruction) -> None:
        b = self.pop()
        a = self.pop()
        same = a.identity() is b.identity()
        if not same and _weak_pair(a, b):
            # one reference made in the frame, one read from outside: the same object when they
            # point to the same referent (Note [Weak references made in the frame])
            raise Unsupported("`is` between a weak reference made in the frame and one from outside")
        if not same and a.is_constant() and b.is_constant():
            same = a.as_constant() is b.as_constant()
        self.push(ConstantVariable(same != bool(_arg(inst))))

    def CONTAINS_OP(self, inst: dis.Instruction) -> None:
        container = self.pop()
        item = self.pop()
        found = self.symbolic_contains(container, item)  # Note [Comparisons of sizes stay symbolic]
        if found is None:
            self.push(ConstantVariable(self.contains(container, item) != bool(_arg(inst))))
        elif not _arg(inst):
            self.push(found)
        elif isinstance(found, SymNodeVariable):
            self.push(symbolic_op(self, torch.sym_not, [found]))
        else:
            self.push(ConstantVariable(not found.as_constant()))

    def UNARY_NEGATIVE(self, inst: dis.Instruction) -> None:
        self.push(self.unary_op(operator.neg, self.pop()))

    def UNARY_POSITIVE(self, inst: dis.Instruction) -> None:
        self.push(self.unary_op(operator.pos, self.pop()))

    def UNARY_INVERT(self, inst: dis.Instruction) -> None:
        self.push(self.unary_op(operator.invert, self.pop()))

    def UNARY_NOT(self, inst: dis.Instruction) -> None:
        self.push(ConstantVariable(not self.pop().truth(self)))

    def CALL_INTRINSIC_1(self, inst: dis.Instruction) -> None:  # 3.12
        v = self.pop()
        if inst.argrepr == "INTRINSIC_LIST_TO_TUPLE":
            self.push(TupleVariable(v.iterate(self)))
        elif inst.argrepr == "INTRINSIC_UNARY_POSITIVE":
            self.push(self.unary_op(operator.pos, v))
        elif inst.argrepr == "INTRINSIC_STOPITERATION_ERROR":
            # the handler around a 3.12 generator's body: PEP 479 turns StopIteration into this
            if isinstance(v, ExceptionVariable) and issubclass(v.cls, StopIteration):
                v = ExceptionVariable(RuntimeError, [ConstantVariable("generator raised StopIteration")])
            self.push(v)
        else:
            raise Unsupported(f"intrinsic {inst.argrepr}")

    # --- subscripts and slices ----------------------------------------------------------------
    def BINARY_SUBSCR(self, inst: dis.Instruction) -> None:
        key = self.pop()
        obj = self.pop()
        self.push(self.subscript(obj, key))

    def STORE_SUBSCR(self, inst: dis.Instruction) -> None:
        key = self.pop()
        obj = self.pop()
        value = self.pop()
        obj.setitem(self, key, value)

    def DELETE_SUBSCR(self, inst: dis.Instruction) -> None:
        key = self.pop()
        obj = self.pop()
        obj.delitem(self, key)

    def BUILD_SLICE(self, inst: dis.Instruction) -> None:
        items = self.popn(_arg(inst))
        if len(items) == 2:
            items.append(ConstantVariable(None))
        self.push(SliceVariable(*items))

    def BINARY_SLICE(self, inst: dis.Instruction) -> None:  # 3.12
        stop = self.pop()
        start = self.pop()
        obj = self.pop()
        self.push(self.subscript(obj, SliceVariable(start, stop, ConstantVariable(None))))

    def STORE_SLICE(self, inst: dis.Instruction) -> None:  # 3.12
        stop = self.pop()
        start = self.pop()
        obj = self.pop()
        value = self.pop()
        obj.setitem(self, SliceVariable(start, stop, ConstantVariable(None)), value)

    # --- building containers ------------------------------------------------------------------
    def BUILD_TUPLE(self, inst: dis.Instruction) -> None:
        self.push(TupleVariable(self.popn(_arg(inst))))

    def BUILD_LIST(self, inst: dis.Instruction) -> None:
        self.push(ListVariable(self.popn(_arg(inst))))

    def BUILD_SET(self, inst: dis.Instruction) -> None:
        self.push(SetVariable([key_of(v) for v in self.popn(_arg(inst))]))

    def BUILD_MAP(self, inst: dis.Instruction) -> None:
        items = self.popn(2 * _arg(inst))
        self.push(DictVariable({key_of(items[i]): items[i + 1] for i in range(0, len(items), 2)}))

    def BUILD_CONST_KEY_MAP(self, inst: dis.Instruction) -> None:
        keys = self.pop().as_constant()
        values = self.popn(_arg(inst))
        self.push(DictVariable(dict(zip(keys, values, strict=True))))

    def BUILD_STRING(self, inst: dis.Instruction) -> None:
        parts = self.popn(_arg(inst))
        if any(isinstance(p, FormattedStringVariable) for p in parts):
            self.push(FormattedStringVariable.join(parts))  # Note [Strings formatted from tensors]
            return
        self.push(ConstantVariable("".join(p.as_constant() for p in parts)))

    def FORMAT_VALUE(self, inst: dis.Instruction) -> None:
        fmt = self.pop().as_constant() if (_arg(inst) & 0x04) else ""
        value = self.pop()
        conv = _arg(inst) & 0x03
        if isinstance(value, FormattedStringVariable) and conv in (0, 1) and fmt == "":
            self.push(value)  # a string formatted as itself
            return
        text = sequence_text(value) if fmt == "" else None  # `f"{x.shape}"` is `str(x.shape)`
        if text is not None:  # Note [Strings formatted from symbolic sizes]
            self.push(text)
            return
        if can_defer(value, conv, fmt):  # Note [Strings formatted from tensors]
            if isinstance(value, TensorVariable):
                self.push(FormattedStringVariable.of_tensor(self, value, fmt))
            else:  # Note [Strings formatted from symbolic sizes]
                self.push(FormattedStringVariable.of_number(self, value, fmt))
            return
        if not value.is_constant():
            raise Unsupported(f"formatting {value.describe()} into a string")
        v = value.as_constant()
        v = {0: v, 1: str(v), 2: repr(v), 3: ascii(v)}[conv]
        self.push(ConstantVariable(format(v, fmt)))

    # Note [Displays built across a break]: LIST_APPEND, SET_ADD, MAP_ADD, LIST_EXTEND,
    # SET_UPDATE and DICT_UPDATE/DICT_MERGE add to a list, set or dict lower on the stack. In the
    # original frame that object is one BUILD_LIST/BUILD_SET/BUILD_MAP made (no source, nothing
    # to replay), but a display split by a graph break (`{**d, 'z': obj.peek(x)}` where `peek`
    # breaks) reaches its continuation half built, as an argument `___stack<i>`: a real object
    # with a source, which the continuation's runner returns as is. Each of these opcodes
    # therefore records the mutation like the container's own methods do, so the runner replays
    # it on the real object (a no-op for an object made in the frame).
    def _build_target(self, inst: dis.Instruction, kind: type) -> Any:
        target = self.stack[-_arg(inst)]
        assert isinstance(target, kind)
        self.output.side_effects.mutated(target)
        return target

    def LIST_APPEND(self, inst: dis.Instruction) -> None:
        v = self.pop()
        self._build_target(inst, ListVariable).items.append(v)

    def SET_ADD(self, inst: dis.Instruction) -> None:
        v = self.pop()
        self._build_target(inst, SetVariable).items[key_of(v)] = None

    def MAP_ADD(self, inst: dis.Instruction) -> None:
        v = self.pop()
        k = self.pop()
        self._build_target(inst, DictVariable).items[key_of(k)] = v

    def LIST_EXTEND(self, inst: dis.Instruction) -> None:
        v = self.pop()
        items = v.iterate(self)
        self._build_target(inst, ListVariable).items.extend(items)

    def SET_UPDATE(self, inst: dis.Instruction) -> None:
        v = self.pop()
        items = v.iterate(self)
        target = self._build_target(inst, SetVariable)
        for item in items:
            target.items[key_of(item)] = None

    def DICT_UPDATE(self, inst: dis.Instruction) -> None:
        v = self.pop()
        self._build_target(inst, DictVariable).update_from(self, v)

    DICT_MERGE = DICT_UPDATE

    def LIST_TO_TUPLE(self, inst: dis.Instruction) -> None:
        self.push(TupleVariable(self.pop().iterate(self)))

    def UNPACK_SEQUENCE(self, inst: dis.Instruction) -> None:
        items = self.pop().iterate(self)
        if len(items) != _arg(inst):
            raise Unsupported(f"cannot unpack {len(items)} values into {_arg(inst)}")
        for item in reversed(items):
            self.push(item)

    def UNPACK_EX(self, inst: dis.Instruction) -> None:
        items = self.pop().iterate(self)
        before, after = _arg(inst) & 0xFF, _arg(inst) >> 8
        if len(items) < before + after:
            raise Unsupported("not enough values to unpack")
        mid = ListVariable(items[before : len(items) - after])
        for item in reversed([*items[:before], mid, *items[len(items) - after :]]):
            self.push(item)

    # --- functions and calls ------------------------------------------------------------------
    def MAKE_FUNCTION(self, inst: dis.Instruction) -> None:
        code_vt = self.pop()
        code = code_vt.as_constant()
        flags = _arg(inst)
        closure = self.pop().iterate(self) if flags & 0x08 else []
        annotations = self.pop() if flags & 0x04 else None
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop().iterate(self) if flags & 0x01 else []
        kwd = {k: v for k, v in kwdefaults.items.items()} if isinstance(kwdefaults, DictVariable) else {}
        cells = [c for c in closure if isinstance(c, CellVariable)]
        self.push(
            NestedFunctionVariable(code, self.f_globals, defaults, kwd, cells, code.co_qualname, annotations)
        )

    def LOAD_BUILD_CLASS(self, inst: dis.Instruction) -> None:
        self.push(BuildClassVariable())  # Note [Class definitions in the frame]

    def PRECALL(self, inst: dis.Instruction) -> None:  # 3.11
        pass

    def KW_NAMES(self, inst: dis.Instruction) -> None:
        self.kw_names = inst.argval if isinstance(inst.argval, tuple) else self.code.co_consts[_arg(inst)]

    def CALL(self, inst: dis.Instruction) -> None:
        n = _arg(inst)
        args = self.popn(n)
        a = self.pop()
        b = self.pop()
        if b is NULL:
            fn = a
        else:
            fn = b
            args = [a, *args]
        kw_names = self.kw_names
        self.kw_names = ()
        kwargs: dict[str, VT] = {}
        if kw_names:
            kwargs = dict(zip(kw_names, args[len(args) - len(kw_names) :], strict=True))
            args = args[: len(args) - len(kw_names)]
        self.push(self._call_direct(fn, args, kwargs))

    def _call_direct(self, fn: VT, args: list[VT], kwargs: dict[str, VT]) -> VT:
        """A CALL's call, with the frame it inlines marked `direct` when the call returns what that
        frame returns (Note [Resuming a chain of frames])."""
        self.direct_next = passes_result(fn)
        self.same_caller_next = self.direct_next and not isinstance(fn, NNModuleVariable)
        try:
            return self.call(fn, args, kwargs)
        finally:
            self.direct_next = False
            self.same_caller_next = False

    def CALL_FUNCTION_EX(self, inst: dis.Instruction) -> None:
        kwargs_vt = self.pop() if _arg(inst) & 1 else None
        args_vt = self.pop()
        fn = self.pop()
        if self.stack and self.stack[-1] is NULL:
            self.pop()
        args = args_vt.iterate(self)
        kwargs: dict[str, VT] = {}
        if kwargs_vt is not None:
            if not isinstance(kwargs_vt, DictVariable):
                raise Unsupported(f"**{kwargs_vt.describe()}")
            kwargs = {str(k): v for k, v in kwargs_vt.items.items()}
        self.push(self._call_direct(fn, args, kwargs))

    # --- with -------------------------------------------------------------------------------
    def BEFORE_WITH(self, inst: dis.Instruction) -> None:
        ctx = self.pop()
        if isinstance(ctx, InferenceModeVariable) and inference.trace_enabled():
            # Note [inference_mode traced] (inference.py)
            self.push(TracedInferenceExitVariable(ctx, inst.offset if self.parent is None else None))
            self.push(ctx.enter(self))
            return
        if not isinstance(ctx, GradModeVariable | AutocastVariable):
            lock = _lock_of(ctx)
            if lock is not None:  # Note [Locks in the frame] (variables/locks.py)
                self.push(locks.enter_lock(self, ctx, lock, inst.offset if self.parent is None else None))
                self.push(ConstantVariable(True))  # what acquire() returns
                return
            self._python_with(ctx)
            return
        self.push(WithExitVariable(ctx))
        self.push(ctx.enter(self))

    def _python_with(self, ctx: VT) -> None:
        """Note [User context managers]: a context manager whose class defines `__enter__` and
        `__exit__` in Python (contextlib.nullcontext, a user's own) has both inlined: the bound
        `__exit__` goes on the stack where CPython puts it, the normal exit calls it with three
        Nones. An exception raised at run time inside the block does not reach it (as with
        every traced with-block, README), and a break inside the block splits before it (only
        grad mode and autocast exits can cross a split)."""
        try:
            cls = ctx.python_type()
        except Unsupported:
            raise Unsupported(f"with-statement over {ctx.describe()}") from None
        if not all(inspect.isfunction(getattr(cls, n, None)) for n in ("__enter__", "__exit__")):
            raise Unsupported(f"with-statement over {ctx.describe()}")
        exit_fn = self._getattr(ctx, "__exit__")
        entered = self._getattr(ctx, "__enter__").call(self, [], {})
        self.push(exit_fn)
        self.push(entered)

    # --- control flow -------------------------------------------------------------------------
    def _truth(self, v: VT) -> bool:
        return v.truth(self)

    def _pop_jump(self, inst: dis.Instruction, jump_when: bool) -> None:
        if self._truth(self.pop()) == jump_when:
            self.jump(inst)

    def _pop_jump_none(self, inst: dis.Instruction, jump_when_none: bool) -> None:
        v = self.pop()
        is_none = v.is_constant() and v.as_constant() is None
        if is_none == jump_when_none:
            self.jump(inst)

    def POP_JUMP_IF_TRUE(self, inst: dis.Instruction) -> None:
        self._pop_jump(inst, True)

    def POP_JUMP_IF_FALSE(self, inst: dis.Instruction) -> None:
        self._pop_jump(inst, False)

    def POP_JUMP_IF_NONE(self, inst: dis.Instruction) -> None:
        self._pop_jump_none(inst, True)

    def POP_JUMP_IF_NOT_NONE(self, inst: dis.Instruction) -> None:
        self._pop_jump_none(inst, False)

    # 3.11 spells the direction in the opcode name.
    POP_JUMP_FORWARD_IF_TRUE = POP_JUMP_BACKWARD_IF_TRUE = POP_JUMP_IF_TRUE
    POP_JUMP_FORWARD_IF_FALSE = POP_JUMP_BACKWARD_IF_FALSE = POP_JUMP_IF_FALSE
    POP_JUMP_FORWARD_IF_NONE = POP_JUMP_BACKWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_FORWARD_IF_NOT_NONE = POP_JUMP_BACKWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE

    def JUMP_IF_TRUE_OR_POP(self, inst: dis.Instruction) -> None:  # 3.11
        if self._truth(self.stack[-1]):
            self.jump(inst)
        else:
            self.pop()

    def JUMP_IF_FALSE_OR_POP(self, inst: dis.Instruction) -> None:  # 3.11
        if not self._truth(self.stack[-1]):
            self.jump(inst)
        else:
            self.pop()

    def JUMP_FORWARD(self, inst: dis.Instruction) -> None:
        self.jump(inst)

    JUMP_BACKWARD = JUMP_BACKWARD_NO_INTERRUPT = JUMP = JUMP_FORWARD

    def GET_ITER(self, inst: dis.Instruction) -> None:
        v = self.pop()
        if (isinstance(v, ListVariable) and v.python_type() is list) or type(v) in (
            DictVariable,
            DictViewVariable,
        ):
            self.push(iterator_of(self, v))  # Note [Lazy iterators]: a list is read at each step
            return
        self.push(v if isinstance(v, ListIteratorVariable) else ListIteratorVariable(v.iterate(self)))

    def FOR_ITER(self, inst: dis.Instruction) -> None:
        it = self.stack[-1]
        if not isinstance(it, ListIteratorVariable):
            raise Unsupported(f"for-loop over {it.describe()}")
        item = it.next(self)
        if item is not None:
            self.push(item)
            return
        self.pop()
        if PY == (3, 11):
            self.jump(inst)
        elif PY == (3, 12):
            self.ip = self.index_of[inst.argval] + 1  # past END_FOR
        else:  # pragma: no cover
            raise NotImplementedError(PY)

    def END_FOR(self, inst: dis.Instruction) -> None:  # 3.12
        self.popn(2)

    def LOAD_ASSERTION_ERROR(self, inst: dis.Instruction) -> None:
        raise Unsupported("an assertion failed inside the compiled frame")

    # --- exceptions (Note [Exceptions the frame raises and catches]) --------------------------
    def RAISE_VARARGS(self, inst: dis.Instruction) -> None:
        n = _arg(inst)
        if n == 0:
            if not isinstance(self.exc_info, ExceptionVariable):
                raise Unsupported("bare raise with no exception being handled")
            raise raise_exception(self.exc_info)
        if n == 2:
            self.pop()  # `raise e from cause`: the cause only shows in a traceback
        exc = self.pop()
        if not isinstance(exc, ExceptionVariable):
            exc = self.call(exc, [], {})  # `raise MyError`
        if not isinstance(exc, ExceptionVariable):
            raise Unsupported(f"raise of {exc.describe()}")
        raise raise_exception(exc)

    def PUSH_EXC_INFO(self, inst: dis.Instruction) -> None:
        exc = self.pop()
        self.push(self.exc_info)
        self.push(exc)
        self.exc_info = exc

    def POP_EXCEPT(self, inst: dis.Instruction) -> None:
        self.exc_info = self.pop()

    def CHECK_EXC_MATCH(self, inst: dis.Instruction) -> None:
        classes = exception_classes(self, self.pop())
        exc = self.stack[-1]
        self.push(ConstantVariable(isinstance(exc, ExceptionVariable) and issubclass(exc.cls, classes)))

    def RERAISE(self, inst: dis.Instruction) -> None:
        exc = self.pop()
        if _arg(inst):
            self.pop()  # the offset that raised (f_lasti)
        if not isinstance(exc, ExceptionVariable):
            raise Unsupported(f"re-raise of {exc.describe()}")
        raise raise_exception(exc)


class _GlobalsTarget(VariableTracker):
    """Where STORE_GLOBAL writes go: the replay assigns into the globals dict."""

    def __init__(self, f_globals: dict[str, Any], is_root: bool) -> None:
        self.f_globals = f_globals
        self.is_root = is_root


def run_root(
    output: OutputGraph,
    code: types.CodeType,
    f_globals: dict[str, Any],
    f_builtins: dict[str, Any],
    entry_values: dict[str, Any],
    break_at: int | None = None,
    break_path: tuple[int, ...] | None = None,
) -> VT | BreakHere:
    """Trace the frame of `code` whose entry values (arguments, free variables) are given; with
    `break_at`, stop when that instruction is reached and return where the frame stands."""
    from kiln_dynamo.source import LocalSource

    symbolic: dict[str, VT] = {}
    cells: dict[str, CellVariable] = {}
    output.guards.where = f"{code.co_filename}:{code.co_firstlineno} (entry of {code.co_name})"
    for name, value in entry_values.items():
        vt = None
        if type(value) is int and name not in code.co_freevars:
            vt = output.add_int_input(value, LocalSource(name))  # None: it stays a constant
        if vt is None:
            vt = output.builder.wrap(value, LocalSource(name))
        if name in code.co_freevars:
            cell = CellVariable(vt)
            cell.root_free = True  # type: ignore[attr-defined]
            cells[name] = cell
        else:
            symbolic[name] = vt
    for name in code.co_cellvars:
        cells[name] = CellVariable(symbolic.get(name))
        cells[name].root_cell = True  # type: ignore[attr-defined]  # Note [Functions made in the frame that leave it]
    tx = InstructionTranslator(output, code, f_globals, f_builtins, symbolic, cells)
    if break_path is not None and len(break_path) > 1:
        output.break_path = break_path
    else:
        tx.break_at = break_at
    try:
        return tx.run()
    except BreakHere as b:
        return b
    except ObservedException as e:  # Note [A frame that only raises] in convert_frame.py
        e.only_raises = output.op_count() == 0 and not output.side_effects.any()
        raise
    except (AttributeError, KeyError, IndexError) as e:  # raised by the modelled code itself
        raise Unsupported(f"{type(e).__name__} raised inside the compiled frame: {e}", tx.where()) from e


_ = (BuiltinVariable, sys)


def _lock_of(ctx: VT) -> object | None:
    """The lock a with-statement enters, when `ctx` is a threading.Lock or RLock."""
    try:
        if not issubclass(ctx.python_type(), locks.LOCK_TYPES):
            return None
        return ctx.identity()
    except Unsupported:
        return None


def _at_inference_block(e: Unsupported, enter_offset: int) -> Unsupported:
    """A break inside a traced `torch.inference_mode()` block of the frame itself moves to the
    block's BEFORE_WITH: CPython enters the mode there and the continuation, which holds the
    block's body, is captured under it (Note [inference_mode traced] in inference.py)."""
    moved = Unsupported(e.msg, e.where, advice=e.advice, frames=e.frames, depth=0)
    moved.break_offset = enter_offset
    moved.note = (
        "split at the torch.inference_mode() block around it: CPython enters the mode, and the "
        "block's body is captured on its own under it"
    )
    return moved


def _before_lock(e: Unsupported, enter_offset: int) -> Unsupported:
    """The frame splits before the with-block over the lock, which then runs as Python."""
    moved = Unsupported(e.msg, e.where, advice=e.advice, frames=e.frames, before=True, depth=0)
    moved.break_offset = enter_offset
    moved.note = "split before the with-block over the lock: its block runs as Python, under the lock"
    return moved
