"""From a frame to a cache entry: trace, compile, generate guard and runner.

`capture(code, entry_values, f_globals, f_builtins, backend)` is the whole pipeline for one frame:
trace it symbolically (translator.py) into an OutputGraph, render the runner (codegen.py), close
the graph with the runner's outputs, hand the GraphModule and the real example inputs to the
backend, compile the guard (guards.py) and assemble the trampoline (bytecode.py). When something
in the frame is unsupported, the frame is traced again up to that point and split there (a graph
break: breaks.py decides, resume.py writes the split code and the continuation), so the returned
`CapturedFrame` may carry a `split` reason; when it cannot be split, `Unsupported` is raised.

Global state that tracing touches (grad mode, autocast) is saved before and restored after,
whatever happens. Any exception other than `Unsupported` raised while tracing is a kiln bug: it is turned
into an `Unsupported` with the internal error named, so that the frame falls back instead of
crashing the user's program (Note [Never a crash]).

`make_callback(backend, fullgraph)` is what kiln_frame_hook calls on a cache miss: it skips
torch's own and generated code, explains why the existing entries' guards failed (the
`recompiles` log), captures the frame and answers with `GuardedCode(guard, trampoline)`; a frame
that cannot be captured is answered with SKIP (it runs as plain Python from then on; the frames
it calls are still offered to the callback), or, under fullgraph, the `Unsupported` propagates.
Either way the reason is recorded (`counters.break_reasons`) and logged once per site
(`KILN_LOG=graph_breaks`). Continuations are captured like any frame.

Note [One callback per compile]: each `compile(...)` call makes its own callback and installs it
as the *thread* callback only while its wrapper runs, so only frames started by the compiled
function (and what it calls) are captured, with that compile's backend.
"""

from __future__ import annotations

import os
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from kiln_dynamo import bytecode, loop_pieces, resume
from kiln_dynamo.backends import ACTIVE, Backend, CompileKey, compile_key
from kiln_dynamo.backends import eager as eager_backend
from kiln_dynamo.breaks import CannotSplit, ChainCut, chain_path, prepare_chain, prepare_split
from kiln_dynamo.codegen import build_runner, generate_runner
from kiln_dynamo.counters import counters
from kiln_dynamo.exc import BreakReason, DynamicShapesUnsupported, Unsupported
from kiln_dynamo.fake import FakeTensor, restore_autograd, restore_geometry
from kiln_dynamo.fx_source import forget_source_when_freed
from kiln_dynamo.guard_tree import Agreeing
from kiln_dynamo.guards import Guard, LockTakingGuard, build_guard, guard_tree_text, readable_guards
from kiln_dynamo.logs import (
    bytecode_log,
    decisions_log,
    graph_breaks_log,
    graph_log,
    guards_log,
    recompiles_log,
)
from kiln_dynamo.output import OutputGraph
from kiln_dynamo.resume import SplitPlan
from kiln_dynamo.shapes import ShapeContext, frame_state
from kiln_dynamo.translator import BreakHere, run_root
from kiln_dynamo.variables.opaque import autocast_state, restore_autocast_state


def entry_names(code: types.CodeType) -> list[str]:
    """Argument slots (positional, keyword-only, *args, **kwargs) then free variables."""
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    return list(code.co_varnames[:n]) + list(code.co_freevars)


@dataclass(slots=True)
class CapturedFrame:
    graph_module: torch.fx.GraphModule | None
    guard: Guard
    code: types.CodeType  # the trampoline
    runner: Callable[..., Any]
    runner_source: str
    capture_seconds: float
    has_side_effects: bool = False
    split: BreakReason | None = None  # set when the frame was split at a graph break


def _shielded(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Run a backend's compiled callable with no frame callback on this thread: its own Python
    (generated wrappers, kernels' launchers) is not user code and must not be captured."""
    try:
        import kiln_frame_hook as hook
    except ImportError:
        return compiled
    set_cb = hook.set_thread_callback

    def call(*args: Any) -> Any:
        previous = set_cb(None)
        try:
            return compiled(*args)
        finally:
            set_cb(previous)

    return call


def _op_count(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def readable_graph(gm: torch.fx.GraphModule) -> str:
    lines = []
    for node in gm.graph.nodes:
        src = node.meta.get("source_line") or ""
        text = node.format_node() or ""
        lines.append(f"    {text:<90}  # {src}" if src else f"    {text}")
    return "\n".join(lines)


def capture(
    code: types.CodeType,
    entry_values: dict[str, Any],
    f_globals: dict[str, Any],
    f_builtins: dict[str, Any],
    backend: Backend,
    allow_breaks: bool = True,
    key: CompileKey | None = None,
) -> CapturedFrame:
    """Capture the frame whole, or, when something in it is unsupported and `allow_breaks`,
    split it at a graph break (breaks.py, Note [Trace twice]). Raises `Unsupported` when neither
    works; `not_split` on it then says why the frame could not be split. With `key`, the guard
    first checks that this compile is the one running (Note [The compile key in every guard]).
    A backend that refuses symbolic sizes (`DynamicShapesUnsupported`) gets the frame again,
    static (Note [Automatic dynamic] in shapes.py)."""
    try:
        return _capture_or_split(code, entry_values, f_globals, f_builtins, backend, allow_breaks, key)
    except _RetryStatic:
        return _capture_or_split(code, entry_values, f_globals, f_builtins, backend, allow_breaks, key)


class _RetryStatic(Exception):
    pass


def _after_capture() -> str:
    return "after capture (the shape env is frozen)"


def _capture_or_split(
    code: types.CodeType,
    entry_values: dict[str, Any],
    f_globals: dict[str, Any],
    f_builtins: dict[str, Any],
    backend: Backend,
    allow_breaks: bool,
    key: CompileKey | None,
) -> CapturedFrame:
    try:
        return _capture(code, entry_values, f_globals, f_builtins, backend, None, key)
    except Unsupported as e:
        if not allow_breaks or e.break_offset is None or e.only_raises:
            raise  # Note [A frame that only raises]: nothing to split off
        first = e
    own_locals = resume.reads_own_locals(code)  # Note [A frame that reads its own locals]
    if own_locals is not None:
        first.not_split = own_locals
        raise first
    path = (
        chain_path(first)
        if _chain_splits and (not first.before or first.inside_try) and not loop_pieces.is_loop_piece(code)
        else None
    )
    while path is not None:  # Note [Resuming a chain of frames] in breaks.py
        try:
            return _capture(code, entry_values, f_globals, f_builtins, backend, first, key, path)
        except ChainCut as cut:
            decisions_log.info("%s: chain split shortened: %s", code.co_name, cut)
            path = path[: cut.level] if cut.level >= 2 else None
        except (CannotSplit, Unsupported) as why:
            decisions_log.info("%s: no chain split: %s", code.co_name, why)
            path = None
    try:
        split = _capture(code, entry_values, f_globals, f_builtins, backend, first, key)
    except CannotSplit as why:
        first.not_split = str(why)
        if why.loop_entry is not None:
            # Note [Splitting before a loop]: the part of the frame before the loop is still
            # worth a graph; the continuation, which holds the loop, will run as plain Python
            # up to the loop's exit (Note [Compiling what follows a loop] in resume.py).
            retry = Unsupported(
                first.msg, first.where, advice=first.advice, frames=first.frames, before=True, depth=0
            )
            retry.break_offset = why.loop_entry
            retry.note = f"split before the loop around it: {why}"
            try:
                before_loop = _capture(code, entry_values, f_globals, f_builtins, backend, retry, key)
            except (CannotSplit, Unsupported):
                pass
            else:
                # A continuation that starts at the loop (the one this split makes, seen again by
                # the hook) has nothing to compile before it: it runs as plain Python, and the
                # frames the loop calls are captured on their own, rather than splitting again.
                gm = before_loop.graph_module
                if not (resume.is_resume_code(code) and (gm is None or _op_count(gm) == 0)):
                    return before_loop
            if resume.is_resume_code(code):
                first.not_split = (
                    "the break is inside a loop, which this continuation holds: the loop runs as "
                    "plain Python and the functions it calls are captured on their own"
                )
            _compile_after_loop(code, why.loop_entry, first)
    except Unsupported as e:
        first.not_split = f"the second tracing pass failed: {e.msg}"
    else:
        if not (loop_pieces.is_loop_piece(code) and _nothing_compiled(split)):
            return split
        # Note [A piece with nothing before its break] (loop_pieces.py)
        assert first.break_offset is not None
        rest = loop_pieces.continue_after(code, first.break_offset)
        if isinstance(rest, str):
            first.not_split = (
                f"this loop piece has nothing to compile before the break, and {rest}: it runs as Python"
            )
        else:
            first.not_split = (
                "this loop piece has nothing to compile before the break: it runs as Python up to the "
                f"end of the break's statement and continues in {rest[1].co_name}"
            )
            first.loop_code = rest[0]
    raise first


def _nothing_compiled(captured: CapturedFrame) -> bool:
    gm = captured.graph_module
    return (gm is None or _op_count(gm) == 0) and not captured.has_side_effects


def after_loops_enabled() -> bool:
    return _after_loops


def set_after_loops(on: bool) -> bool:
    """Compile the code after a loop that holds a break (Note [Compiling what follows a loop] in
    resume.py; KILN_AFTER_LOOP=0 turns it off); returns the previous setting."""
    global _after_loops
    previous, _after_loops = _after_loops, on
    return previous


def set_loop_pieces(on: bool) -> bool:
    """Compile the body of a loop that holds a break as pieces the hook captures (Note [Loop
    body pieces] in loop_pieces.py; KILN_LOOP_PIECES=0 turns it off); returns the previous setting."""
    global _loop_pieces
    previous, _loop_pieces = _loop_pieces, on
    return previous


_after_loops = os.environ.get("KILN_AFTER_LOOP", "1") != "0"
_chain_splits = os.environ.get("KILN_CHAIN_SPLITS", "1") != "0"


def set_chain_splits(on: bool) -> bool:
    """Split every frame of a call chain at once for a break deep in it (Note [Resuming a chain
    of frames] in breaks.py; KILN_CHAIN_SPLITS=0 turns it off); returns the previous setting."""
    global _chain_splits
    previous, _chain_splits = _chain_splits, on
    return previous


_loop_pieces = os.environ.get("KILN_LOOP_PIECES", "1") != "0"


# Note [Module constructors run as Python]: when a frame builds a module kiln does not build in
# the trace (one with parameters, or a user's class), the construction is a break and CPython
# runs `cls(...)`; the hook then sees the class's `__init__` (and its bases' `super().__init__()`).
# Capturing those frames finds little to compile (attribute stores, parameter creation, in-place
# random initialisation) and breaks at each of them: `Module.__setattr__` through
# `super().__setattr__`, new `Parameter`s, submodules with parameters, so a user module with one
# `nn.Linear` made four breaks more and five frames' captures. A constructor frame (`__init__`
# whose `self` is an `nn.Module`) therefore runs as Python, uncaptured, as its break already says
# (counters.module_inits, KILN_LOG=decisions). Functions it calls are still offered to the hook.
# An `__init__` the user compiled explicitly is captured; KILN_CAPTURE_MODULE_INIT=1
# (`set_module_inits_skipped(False)`) captures every one, as before.
_module_inits_skipped = os.environ.get("KILN_CAPTURE_MODULE_INIT", "0") != "1"


def set_module_inits_skipped(on: bool) -> bool:
    """Run nn.Module constructors as Python, uncaptured (Note [Module constructors run as
    Python]); returns the previous setting."""
    global _module_inits_skipped
    previous, _module_inits_skipped = _module_inits_skipped, on
    return previous


def _module_init(code: types.CodeType, values: tuple[Any, ...]) -> bool:
    return code.co_name == "__init__" and bool(values) and isinstance(values[0], torch.nn.Module)


def _compile_after_loop(code: types.CodeType, loop_entry: int, e: Unsupported) -> None:
    """The loop runs as Python: have its exit continue in a continuation the hook captures
    (Note [Compiling what follows a loop]) and its body call pieces the hook captures (Note
    [Loop body pieces]), and say so in the reason."""
    if not (_after_loops or _loop_pieces):
        return
    done = loop_pieces.loop_code(code, loop_entry, after=_after_loops, pieces=_loop_pieces)
    if isinstance(done, str):
        e.not_split = f"{e.not_split}; the code after the loop runs as Python too: {done}"
        return
    if isinstance(done.after, str):
        e.not_split = f"{e.not_split}; the code after the loop runs as Python too: {done.after}"
    elif done.after is not None:
        e.not_split = f"{e.not_split}; the code after the loop is captured: the loop's exit continues in {done.after.co_name}"
    if isinstance(done.pieces, str):
        e.not_split = f"{e.not_split}; the loop body runs as Python: {done.pieces}"
    elif done.pieces is not None:
        names = ", ".join(c.co_name for c in done.pieces.codes)
        e.not_split = f"{e.not_split}; the loop body is captured in pieces called per iteration: {names}"
    decisions_log.info("%s: %s", code.co_name, e.not_split)
    e.loop_code = done.code
    e.loop_after = isinstance(done.after, types.CodeType)
    e.loop_pieces = 0 if not isinstance(done.pieces, loop_pieces.Pieces) else len(done.pieces.codes)


def _capture(
    code: types.CodeType,
    entry_values: dict[str, Any],
    f_globals: dict[str, Any],
    f_builtins: dict[str, Any],
    backend: Backend,
    brk: Unsupported | None,
    key: CompileKey | None = None,
    chain: tuple[int, ...] | None = None,
) -> CapturedFrame:
    t0 = time.perf_counter()
    names = entry_names(code)
    assert list(entry_values) == names, (list(entry_values), names)
    shape_ctx = ShapeContext(
        key.dynamic if key is not None else None, frame_state(code), takes_symbolic_sizes(backend)
    )
    output = OutputGraph(code, names, f_globals, shape_ctx)
    if key is not None:
        output.guards.compile_key(ACTIVE, key, key.label)
    grad = torch.is_grad_enabled()
    autocast = autocast_state()
    plan: SplitPlan | None = None
    try:
        result = run_root(
            output,
            code,
            f_globals,
            f_builtins,
            entry_values,
            brk.break_offset if brk is not None else None,
            chain,
        )
        if isinstance(result, BreakHere):
            assert brk is not None
            before = brk.before and brk.depth == 0 and chain is None
            if chain is not None:
                values, plan = prepare_chain(result)
            else:
                values, plan = prepare_split(result, code, before)
            reenter = _close_autocast_blocks(output, result)
            if before and output.op_count() == 0 and not output.side_effects.any():
                raise CannotSplit("nothing to compile before it")
            spec, _ = generate_runner(
                output, None, values, _final_grad_mode(output, result.grad_mode), reenter
            )
        else:
            if brk is not None:
                raise CannotSplit("the second tracing pass did not reach the break")
            final = _final_grad_mode(output, torch.is_grad_enabled())
            spec, _ = generate_runner(output, result, grad_mode=final)
    except (Unsupported, CannotSplit, ChainCut):
        raise
    except Exception as e:  # Note [Never a crash]
        raise Unsupported(f"internal error while tracing: {type(e).__name__}: {e}") from e
    finally:
        bytecode.forget()  # Note [Instructions read once per code object]
        for ctx in reversed(output.open_contexts):  # Note [Autocast as graph state]
            ctx.__exit__(None, None, None)
        output.open_contexts.clear()
        restore_autocast_state(autocast)
        torch._C._set_grad_enabled(grad)
    gm: torch.fx.GraphModule | None = None
    compiled: Callable[..., Any] | None = None
    if spec.needs_graph:
        output.graph.output(tuple(spec.outputs))
        gm = torch.fx.GraphModule(torch.nn.Module(), output.graph)
        forget_source_when_freed(gm)  # Note [Generated FX source outlives its module]
        example_inputs = [value for _, _, value in output.inputs]
        for node, _, value in output.inputs:  # Note [Placeholders keep their entry geometry]
            val = node.meta.get("val")
            if isinstance(val, FakeTensor) and isinstance(value, torch.Tensor):
                restore_geometry(val, value)
                restore_autograd(val, value)  # Note [Placeholders keep their entry autograd state]
        counters.graphs += 1
        counters.ops += output.op_count()
        if graph_log.isEnabledFor(20):
            graph_log.info(
                "graph for %s (%s:%s)\n%s",
                code.co_name,
                code.co_filename,
                code.co_firstlineno,
                readable_graph(gm),
            )
        # What the backend may report about the graph it is given (kiln's umbrella shows both).
        gm.meta["capture_seconds"] = time.perf_counter() - t0
        gm.meta["frame"] = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
        try:
            compiled = backend(gm, example_inputs)
        except DynamicShapesUnsupported as e:
            if not shape_ctx.has_symbols():
                raise RuntimeError(f"backend raised DynamicShapesUnsupported on a static graph: {e}") from e
            assert shape_ctx.state is not None
            shape_ctx.state.static_only = str(e)
            recompiles_log.info("%s: compiling static shapes instead: %s", code.co_name, e)
            counters.dynamic_fallbacks.append((code.co_name, str(e)))
            raise _RetryStatic from e
        except Exception as e:  # DESIGN.md: a failing backend falls back to the captured graph
            warnings.warn(
                f"kiln_dynamo: backend {getattr(backend, '__name__', backend)!r} failed on {code.co_name} "
                f"({type(e).__name__}: {e}); running the captured graph eagerly",
                RuntimeWarning,
                stacklevel=2,
            )
            compiled = gm.forward
        if backend is not eager_backend:
            compiled = _shielded(compiled)
    runner = build_runner(spec, output.ctx.consts, compiled)
    if shape_ctx.has_symbols():
        for problem in shape_ctx.specialized_marks():
            if key is not None and key.fullgraph:
                raise Unsupported(problem)
            warnings.warn(f"kiln_dynamo: {problem}", UserWarning, stacklevel=2)
        output.guards.shape_guards(shape_ctx)
    shape_ctx.env.freeze()
    # the graph's SymInts keep the env alive: it must not keep the translator (and through it
    # the frame's objects) alive too
    shape_ctx.env.where = _after_capture
    guard = build_guard(output.guards, len(names), f_globals, code.co_name)
    if output.side_effects.held_lock is not None:  # Note [Effects under a lock replayed under it]
        guard.lock = output.side_effects.held_lock.lock
    if guards_log.isEnabledFor(20):
        guards_log.info("guards for %s:\n%s", code.co_name, readable_guards(guard))
        tree = guard_tree_text(guard)
        if tree is not None:
            guards_log.info("%s", tree)
    split: BreakReason | None = None
    if plan is None:
        new_code = bytecode.build_trampoline(code, runner, names)
    else:
        assert brk is not None
        new_code = resume.split_code(code, runner, names, plan)
        note = brk.note
        if chain is not None:
            note = (
                f"{len(chain)} frames resumed at once: the continuation of {code.co_name} calls those of the "
                "frames it called (Note [Resuming a chain of frames])"
            )
        split = BreakReason.of(brk, _display_name(code), split=True, note=note)
    if bytecode_log.isEnabledFor(20):
        bytecode_log.info("runner for %s:\n%s", code.co_name, spec.source)
        if plan is not None:
            import dis

            bytecode_log.info("split code of %s:\n%s", code.co_name, dis.Bytecode(new_code).dis())
    output.builder.keepalive.clear()
    side_effects = output.side_effects.any()
    return CapturedFrame(
        gm, guard, new_code, runner, spec.source, time.perf_counter() - t0, side_effects, split
    )


def takes_symbolic_sizes(backend: Backend) -> bool:
    """Only a backend that says so (`__kiln_dynamic_shapes__ = True`; dynamo's eager does) gets
    graphs with symbolic sizes: another one might compile for the example inputs' sizes only."""
    return backend is eager_backend or bool(getattr(backend, "__kiln_dynamic_shapes__", False))


def _close_autocast_blocks(output: OutputGraph, b: BreakHere) -> list[tuple[Any, ...]]:
    """Autocast blocks entered in this graph and still open at the split: the graph leaves them
    (so that it is self-contained), and the runner enters them again before the break
    instruction runs; their exits cross the split as AutocastExit objects. Returns the arguments
    to enter them with, outermost first."""
    from torch.amp.autocast_mode import _exit_autocast

    from kiln_dynamo.variables.torch import AutocastVariable, WithExitVariable

    open_blocks = [
        v.ctx
        for v in b.tx.stack
        if isinstance(v, WithExitVariable)
        and isinstance(v.ctx, AutocastVariable)
        and not v.ctx.entered_before
    ]
    for block in reversed(open_blocks):
        output.graph.create_node("call_function", _exit_autocast, (block.node,), {})
    return [block.args for block in open_blocks]


def _final_grad_mode(output: OutputGraph, mode: bool) -> bool | None:
    """Note [Grad mode at the end of a frame]: a frame may end in another grad mode than it began
    in (a continuation that leaves a `no_grad` block, a call to `torch.set_grad_enabled(False)`,
    a split inside a block). The graph always ends in the mode it began in, so that a backend
    sees a self-contained graph; the runner then sets the final mode itself (returned here, None
    when unchanged)."""
    if mode == output.initial_grad_mode:
        return None
    output.set_grad_mode(output.initial_grad_mode)
    return mode


def _display_name(code: types.CodeType) -> str:
    info = resume.resume_info(code)
    return code.co_name if info is None else f"{info.original.co_name} (continuation {code.co_name})"


# --- the frame hook's callback ----------------------------------------------------------------

_TORCH_DIR = os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), "")


def _package_path(name: str) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: its folder
        return os.path.join(os.path.realpath(next(iter(spec.submodule_search_locations))), "")
    return os.path.realpath(spec.origin) if spec.origin else None  # a module: its file


# Note [Frames kiln never captures]: the frame hook's own rules skip the standard library and
# kiln's packages; on top of them, libraries whose code a model only *calls* (numpy, triton,
# sympy, typing_extensions, the test runner) are added to the hook's skip prefixes once: a frame
# that runs as Python after a break calls into them (lazy imports, numpy helpers, Triton's
# launcher), and capturing those frames on their own cost compile time for nothing a user wrote
# (torch.compile skips the same kinds of files). They are still traced when a captured frame calls
# them and tracing can follow; an explicit `compile(f)` of one is captured.
_LIBRARIES = ("numpy", "triton", "sympy", "typing_extensions", "_pytest", "pluggy")
_libraries_skipped = False


def skip_libraries() -> None:
    """Note [Frames kiln never captures]: register the libraries with the frame hook, once."""
    global _libraries_skipped
    if _libraries_skipped:
        return
    import kiln_frame_hook as hook

    for name in _LIBRARIES:
        path = _package_path(name)
        if path is not None:
            hook.add_skip_prefix(path)
    _libraries_skipped = True


def is_user_code(code: types.CodeType) -> bool:
    """Frames worth capturing: not torch's own files, not generated code (`<eval_with_key>`, the
    runners and guards kiln generates, `exec`'d strings)."""
    filename = code.co_filename
    if filename.startswith("<"):
        return False
    return not os.path.realpath(filename).startswith(_TORCH_DIR)


_FUNCTION_CTX = torch.autograd.function.FunctionCtx


def make_callback(
    backend: Backend,
    fullgraph: bool,
    targets: frozenset[types.CodeType] = frozenset(),
    dynamic: bool | None = None,
) -> Callable[[Any], Any]:
    """The callback that kiln_frame_hook calls on a cache miss (Note [One callback per compile]).

    `targets` are the codes the user compiled explicitly (a function, or a module's forward):
    they are captured even when they live in torch's own files (`compile(nn.Linear(...))`).
    """
    import kiln_frame_hook as hook

    skip_libraries()  # Note [Frames kiln never captures]
    key = compile_key(backend, fullgraph, dynamic)

    def callback(frame: Any) -> Any:
        code: types.CodeType = frame.code
        if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):
            return hook.SKIP  # generators and coroutines (a compiled one is reported by compile())
        if (
            code not in targets
            and not resume.is_resume_code(code)
            and not loop_pieces.is_loop_piece(code)
            and not is_user_code(code)
        ):
            return hook.SKIP
        values = tuple(frame.locals.values())
        if _module_inits_skipped and code not in targets and _module_init(code, values):
            counters.module_inits += 1  # Note [Module constructors run as Python]
            decisions_log.info(
                "%s.__init__ (%s:%s) runs as Python: a module constructor (KILN_CAPTURE_MODULE_INIT=1 captures it)",
                type(values[0]).__qualname__,
                code.co_filename,
                code.co_firstlineno,
            )
            return hook.SKIP
        if values and isinstance(values[0], _FUNCTION_CTX):
            # An autograd.Function's forward/backward run by autograd itself: the call of
            # `apply` that led here was already a break with its reason (Note [autograd.Function
            # in the graph]); the body runs as plain Python, as part of that one break.
            return hook.SKIP
        counters.frames_seen += 1
        if frame.entries:
            reason = _failure_reason(frame.entries, values)
            counters.recompiles += 1
            counters.guard_failures.append(f"{code.co_name}: {reason}")
            recompiles_log.info(
                "recompiling %s (%s:%s): guard failed: %s",
                code.co_name,
                code.co_filename,
                code.co_firstlineno,
                reason,
            )
            if frame.limit_reached:
                msg = f"cache limit ({hook.get_cache_limit()}) reached; last failure: {reason}"
                counters.fallbacks.append((code.co_name, msg))
                recompiles_log.warning("%s: %s", code.co_name, msg)
                return hook.RUN_ONLY  # cached entries still run; no more captures of this code
        try:
            captured = capture(
                code,
                dict(frame.locals),
                frame.globals,
                frame.builtins,
                backend,
                allow_breaks=not fullgraph,
                key=key,
            )
        except Exception as e:  # Note [Never a crash]: anything but fullgraph's Unsupported falls back
            if fullgraph and isinstance(e, Unsupported):
                raise
            if isinstance(e, Unsupported) and e.only_raises:
                # Note [A frame that only raises]: as a frame without tensor work
                counters.frames_without_graph += 1
                decisions_log.info("%s runs as Python: it only raises (%s)", code.co_name, e.msg)
                return hook.SKIP
            if isinstance(e, Unsupported):
                # a loop piece with nothing to compile before its break (Note [A piece with
                # nothing before its break]) is not counted again as a frame left to Python: the
                # loop's own frame, which runs the piece's statements as Python before, already is
                record_plain(code, e, fallback=not loop_pieces.is_loop_piece(code))
                if e.loop_code is not None:
                    # Notes [Compiling what follows a loop], [Loop body pieces]: the loop runs as
                    # Python, its exit calls a continuation and its body pieces; the rewrite
                    # depends on no value, so nothing to guard
                    counters.after_loops += e.loop_after
                    counters.loop_pieces += e.loop_pieces
                    nvalues = len(values)
                    return hook.GuardedCode(
                        hook.GuardTree(nvalues, nvalues, [], None, None, "no checks"), e.loop_code
                    )
            else:
                reason = f"internal error: {type(e).__name__}: {e}"
                counters.fallbacks.append((code.co_name, reason))
                graph_breaks_log.info("%s runs as plain Python: %s", code.co_name, reason)
            return hook.SKIP
        if captured.split is not None:
            counters.graph_breaks += 1
            counters.break_reasons.append(captured.split)
            _log_break(captured.split)
        elif captured.graph_module is None and not captured.has_side_effects:
            # Note [Frames without tensor work]: nothing to compile; plain Python is as fast.
            #
            # Note [A frame that only raises]: a frame whose traced path ends in an exception of
            # the program's own (an ObservedException that no handler of the frame takes: a
            # config's `__getattribute__` called by getattr(config, name, default) from a frame
            # that runs as Python) has nothing after the raise; when nothing before it was an
            # operator or a side effect either (run_root checks), it is a frame without tensor
            # work too: it runs as Python, counted in `frames_without_graph`, and is not tried
            # again, rather than being reported as a frame left to Python. One that did tensor
            # work before the raise stays a break there, so that the work before is compiled.
            counters.frames_without_graph += 1
            return hook.SKIP
        counters.frames_captured += 1
        for listen in capture_listeners:
            listen(_display_name(code), captured)
        hook.skip_code(captured.runner.__code__)
        if captured.guard.lock is not None and not captured.guard(*values):
            # Note [Effects under a lock replayed under it]: the hook runs a new entry without
            # its guard; another thread changed what the block read while it was captured
            decisions_log.info(
                "%s: state read under a lock changed while it was captured: runs as Python this time",
                code.co_name,
            )
            return hook.RUN
        return hook.GuardedCode(captured.guard.for_hook(), captured.code)

    return callback


# Called with (frame name, CapturedFrame) for each frame installed in the cache (explain.py).
capture_listeners: list[Callable[[str, CapturedFrame], None]] = []

_logged_sites: set[tuple[str, str | None, int | None, str]] = set()


def _log_break(reason: BreakReason) -> None:
    """KILN_LOG=graph_breaks: each break once per site (file, line, reason)."""
    if reason.site not in _logged_sites:
        _logged_sites.add(reason.site)
        graph_breaks_log.info("%s", reason)


def record_plain(code: types.CodeType, e: Unsupported, fallback: bool = True) -> None:
    if fallback:
        counters.fallbacks.append((code.co_name, str(e)))
    reason = BreakReason.of(e, _display_name(code), split=False, not_split=e.not_split)
    counters.break_reasons.append(reason)
    _log_break(reason)


def _failure_reason(entries: Any, values: tuple[Any, ...]) -> str:
    import kiln_frame_hook as hook

    for entry in entries:
        guard = entry.guard
        while isinstance(guard, (hook.GuardTree, Agreeing, LockTakingGuard)):
            guard = guard.reference  # the readable Python guard explains the failure
        if isinstance(guard, Guard):
            reason = guard.failure_reason(values)
            if reason is not None:
                return reason
    return "unknown"
