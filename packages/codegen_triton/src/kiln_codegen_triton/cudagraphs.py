"""CUDA graphs for ``mode="reduce-overhead"``: record a wrapper's launches once, replay them.

A compiled graph launches one kernel per fused node and calls a few extern ops; at small sizes
the CPU cost of those launches is the run time. :class:`CudaGraphRunner` wraps the wrapper's
``call`` so that one recorded ``torch.cuda.CUDAGraph`` covers the whole compiled call:

* the first call runs the wrapper as it is (warm-up: cuBLAS/cuDNN handles, workspaces, autotuning
  happen outside any capture);
* the second call records: warm-up once more on a side stream, then capture ``call(*inputs)`` into
  a private memory pool, so the buffers the wrapper allocates stay put;
* every later call checks its inputs, copies the ones that move into their static buffers (one
  ``Tensor.copy_``, or one ``torch._foreach_copy_`` for several) and calls ``graph.replay()``, by a
  closure planned at the recording (Note [The runner's per-call path]).

Note [Static inputs of a CUDA graph]: parameters and buffers keep their memory from call to call,
and copying each into a graph-owned buffer on every call (ResNet-50: 268 copies) costs more than
the graph saves. So an input whose address is the same at the warm-up and at the recording call
is *static*: the graph reads it where it lies, and is recorded on the caller's tensor itself. An
input at a new address (a fresh batch) is *copied* into a graph-owned buffer before each replay.
A replay first checks that every static input is still at its recorded address (their pointers
read in one C loop, or by one ``map``: Note [The runner's per-call path]); where one moved (``param.data = ...``, a new batch that happened to sit still twice)
it becomes a copied input and the graph is recorded again: a moved input is never read from its
old address. After ``MAX_RECORDINGS`` recordings the runner gives up and runs the wrapper.
A static input's shape, strides and dtype are not looked at on a replay when the caller guards
them (``guarded_inputs=True``: kiln's frame guards do, as torch's do for its CUDA graphs);
otherwise every input's metadata is compared with the recording's on every call, and a call
that differs runs the plain wrapper, which conforms or refuses it.

Note [Outputs of a CUDA graph]: a replay writes its outputs into the same memory every time, so
an output the caller still holds from an earlier call would be overwritten by the next replay.
The runner returns aliases of the graph's outputs and, before replaying, asks whether any of the
previous call's outputs is still alive (the storage's use count is above the runner's own
references). A graph whose outputs are all dead replays; otherwise a second recording (the other
*slot*, with its own outputs, over the same inputs and the same pool) replays; when the outputs
of both are alive (a caller that keeps every result in a list) the call runs the plain wrapper,
whose outputs are fresh. The usual loop ``y = f(x)`` ping-pongs between the two slots; training
frees a slot when its gradients are consumed (``zero_grad`` sets them to None). Nothing is cloned
and nothing is ever overwritten while someone can read it.

Note [Outputs that are inputs]: a training graph's forward returns, beside its results, the
values its backward saves, and some of those are its inputs themselves (the batch, the weights a
convolution's backward reads: five of fourteen outputs of a small conv net's forward); a backward
returns an incoming gradient as the gradient of an add's operand. The graph computes nothing for
such an output, and a replay must not hand back the tensor of the recording call: at a recording
each top-level output whose storage is an input's is noted with that input's position, and a
replay returns the input of *this* call (the caller's own tensor where the wrapper returned it
as it was, else the same view of it: same sizes, strides, and offset from the input's). For a
copied input the view is taken of the caller's tensor, not of the graph's copy (which the next
call overwrites). Such outputs are not graph memory, so they take no part in a slot's
use counts (Note [Outputs of a CUDA graph]). Before this, the whole graph ran without CUDA graphs
(an H100, ResNet-50 bf16 training: reduce-overhead 15.9 ms a step against torch.compile's 9.3).
An alias the runner cannot rebuild (inside a nested output, of a copied input held in other
strides than the caller's) still turns the runner off, with the reason.

Graphs the runner refuses (:func:`cudagraph_blocker`): an extern op that mutates its inputs, a
kernel that scatters into an input (both would write a static copy instead of the caller's
tensor), inputs off the GPU. A capture that fails (an op that synchronizes, a data-dependent shape) turns the
runner off for good with the reason in ``disabled`` and ``KILN_LOG=output_code``, and the wrapper
runs as it is.

Note [CUDA graphs per size]: a CUDA graph replays fixed launches (grids, size arguments,
allocations), so a wrapper compiled for symbolic sizes (Note [Symbolic sizes in the Triton
wrapper]) is recorded once per distinct tuple of size-symbol values: :class:`CudaGraphsPerSize`
reads the symbols from the call's arguments (the same sources the wrapper binds them from) and
keeps one :class:`CudaGraphRunner` per tuple, each with its own warm-up, static inputs, two
output slots and memory pool (a replay of one size never writes memory another size's outputs
live in). A training loop whose last batch is smaller gets a second runner for that size; a
model served at many sizes gets one per size up to ``MAX_SIZES``, after which a new size runs the
wrapper directly (slower, never wrong) and ``KILN_LOG=output_code`` says so once.
"""

from __future__ import annotations

import logging
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln_loopir.ir import InputBuffer, Scatter
from kiln_loopir.scheduler import ExternKernelSchedulerNode, Scheduler
from kiln_loopir.wrapper_support import dense_tensor

log = logging.getLogger("kiln.codegen_triton.output_code")

MAX_RECORDINGS = 8
SLOTS = 2
MAX_SIZES = 16  # Note [CUDA graphs per size]


def cudagraph_blocker(schedule: Scheduler) -> str | None:
    """Why this schedule must not be recorded (None when it may)."""
    inputs = {n for n, b in schedule.name_to_buffer.items() if isinstance(b, InputBuffer)}
    for node in schedule.nodes:
        if isinstance(node, ExternKernelSchedulerNode):
            schema = getattr(node.node.op, "_schema", None)
            if schema is not None and schema.is_mutable:
                return f"extern {node.node.op} mutates its inputs"
        for m in node.get_nodes():
            buffer = getattr(m, "node", None)
            if isinstance(buffer, Scatter) and buffer.mutates in inputs:
                return f"{buffer.name} writes into input {buffer.mutates}"
    return None


# (tensors, data pointers, indices) -> whether every indexed tensor is at its pointer; a C++
# helper in torch's CUDA builds, a loop where it is missing
_ptrs_equal: Callable[[list[Any], list[int | None], list[int]], bool] | None = getattr(
    torch._C, "_tensors_data_ptrs_at_indices_equal", None
)
_use_count: Callable[[int], int] = torch._C._storage_Use_Count
_data_ptr = torch.Tensor.data_ptr
_detach = torch.Tensor.detach


# Note [The runner's per-call path]: a replay is preceded by bookkeeping whose cost is host time
# on every call (issue 14: `packages/codegen_triton/bench/runner_overhead.py` times it without a
# GPU, `packages/kiln/bench/call_overhead.py --runner` inside a kiln call), and on a GPU what runs
# before `graph.replay()` adds to the wall time one for one (the GPU waits for it); most of it
# scales with the inputs (ResNet-50: ~270 static ones) or the outputs. So what a call does is
# planned when a graph is recorded, into one closure (`CudaGraphRunner._plan`) that holds, as its
# own locals, everything a replay reads: the static inputs' check (one C loop over the call's
# arguments, or the static inputs picked by one `operator.itemgetter`, their pointers read by
# `map(Tensor.data_ptr, ...)` and compared with the recorded ones as one list: see "Static
# pointers" below), the copied inputs' picker, buffers and
# recorded shapes and dtypes (one list compare), the slots, each with its planned use-count check
# (one C call for a slot of one output storage) and its planned aliases (a flat tuple of tensors
# by `map(Tensor.detach, ...)`), and the copy (`Tensor.copy_` for one copied input, one
# `torch._foreach_copy_` for several). The closure only ever takes the call where every check
# passes and a slot is free; any other call (a moved static input, other shapes, every slot held,
# the warm-up, a recording) returns `_MISS` and runs the full path, `_call`, which checks the same
# things again in its own order and decides as it always has. The checks are the same ones, on
# the same values: this changes how they run, never what they check. The plan is made again
# whenever the slots change (a recording) and dropped when the runner turns itself off.
#
# Static pointers: torch's CUDA builds have a C helper (`torch._C._tensors_data_ptrs_at_indices_equal`),
# which every replay used where present (the full path still does); it converts each tensor and
# pointer through pybind11 casts, and its C++ built against this CPU torch by hand ran 1.3-1.8x
# slower than `map(Tensor.data_ptr, ...)` over the same `nn.Parameter`s (27, 109 and 268 of them:
# 3.6/28.2/69.3 us against 2.8/18.7/51.1 on this loaded machine). So the plan reads the pointers
# with `map`, unless its caller hands it a C loop that reads the TensorImpls directly
# (`pointer_check`, asked at each plan, called with the call's own argument tuple and the
# recorded pointers, None where not checked: no itemgetter either). kiln passes the one in
# kiln_dynamo's torch-linked tensor checker (Note [The torch-linked tensor checker]): 0.7/2.7/14.5
# us in the same run (268 ranged 6-15 us with the load). `runner_overhead.py --c-check` times the
# runner with it; `--steps` times torch's helper where torch has it.
# `triton_options={"cudagraph_plan": False}` (kiln_bench: `kiln:reduce-overhead:triton.cudagraph_plan=False`)
# or `KILN_CUDAGRAPH_PLAN=0` turns the plan off: every call takes the full path, as before this
# Note (an A/B on a GPU). KILN_LOG=output_code prints each plan.
PLANNED_REPLAY = os.environ.get("KILN_CUDAGRAPH_PLAN", "1") != "0"
# (a call's arguments, the recorded pointers: None at the inputs not checked) -> whether each
# checked input is at its pointer: a C loop the caller may provide (`pointer_check`; kiln passes
# kiln_dynamo's torch-linked checker's); False also when it cannot tell, which sends the call
# down the full path
PointerCheck = Callable[[tuple[Any, ...], tuple[int | None, ...]], bool]
_MISS: Any = object()  # the planned replay declined this call: run the full path


def _picker(idxs: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """args -> (args[i] for i in idxs), as a tuple, in one C call."""
    if not idxs:
        return lambda args: ()
    if len(idxs) == 1:
        only = idxs[0]
        return lambda args: (args[only],)
    return operator.itemgetter(*idxs)


def _static_copy(t: torch.Tensor) -> torch.Tensor:
    """A graph-owned buffer with ``t``'s shape and strides (contiguous when ``t`` overlaps itself)."""
    if dense_tensor(t):
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    else:
        out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _meta(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return (a.shape, a.stride(), a.dtype, a.device)
    return ("value", a)


def _flat_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [t for o in out for t in _flat_tensors(o)]
    return []


def _aliases(out: Any) -> Any:
    """New tensor objects over the same memory (what the caller gets; Note [Outputs of a CUDA graph])."""
    if isinstance(out, torch.Tensor):
        return out.detach()
    if isinstance(out, tuple):
        return tuple(_aliases(o) for o in out)
    if isinstance(out, list):
        return [_aliases(o) for o in out]
    return out


def capture_cuda(fn: Callable[..., Any], args: list[Any], pool: Any) -> tuple[Callable[[], None], Any]:
    """Record ``fn(*args)`` into one CUDA graph in ``pool``: (replay, the recorded outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn(*args)
    return graph.replay, outputs


@dataclass(frozen=True, slots=True)
class _InputAlias:
    """Output ``out`` is input ``arg`` itself (``view`` None) or a view of it: (sizes, strides,
    offset from the input's own offset). Note [Outputs that are inputs]."""

    out: int
    arg: int
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None

    def rebuild(self, args: Sequence[Any]) -> torch.Tensor:
        a = args[self.arg]
        if self.view is None:
            return a
        sizes, strides, offset = self.view
        return a.as_strided(sizes, strides, a.storage_offset() + offset)


def _free_check(cdatas: list[int], baselines: list[int]) -> Callable[[], bool]:
    """Whether no one but the runner holds these storages (Note [Outputs of a CUDA graph]),
    planned for their number (Note [The runner's per-call path])."""
    if not cdatas:  # every output is an input (Note [Outputs that are inputs]): nothing to hold
        return lambda: True
    if len(cdatas) == 1:
        only, baseline = cdatas[0], baselines[0]
        return lambda: _use_count(only) == baseline
    return lambda: list(map(_use_count, cdatas)) == baselines


def _alias_plan(
    outputs: Any, flat: bool, from_inputs: tuple[_InputAlias, ...]
) -> Callable[[Sequence[Any]], Any]:
    """args -> what the caller gets (Note [Outputs of a CUDA graph], Note [Outputs that are
    inputs]), planned for the outputs' structure (Note [The runner's per-call path])."""
    if not from_inputs:
        if not flat:
            return lambda args: _aliases(outputs)
        if type(outputs) is list:
            return lambda args: list(map(_detach, outputs))
        if len(outputs) == 1:
            only = outputs[0]
            return lambda args: (_detach(only),)
        return lambda args: tuple(map(_detach, outputs))
    kind = type(outputs)

    def rebuild(args: Sequence[Any]) -> Any:
        out = [o.detach() if isinstance(o, torch.Tensor) else _aliases(o) for o in outputs]
        for alias in from_inputs:
            out[alias.out] = alias.rebuild(args)
        return kind(out)

    return rebuild


@dataclass
class _Slot:
    replay: Callable[[], None]
    outputs: Any
    cdatas: list[int] = field(default_factory=list)  # the outputs' StorageImpls
    baselines: list[int] = field(default_factory=list)  # their use counts with only the runner's references
    flat: bool = False  # outputs is a tuple or list of plain tensors (Note [The runner's per-call path])
    from_inputs: tuple[_InputAlias, ...] = ()  # Note [Outputs that are inputs]
    # planned from the above (Note [The runner's per-call path])
    free: Callable[[], bool] = field(init=False)
    aliases: Callable[[Sequence[Any]], Any] = field(init=False)

    def __post_init__(self) -> None:
        self.free = _free_check(self.cdatas, self.baselines)
        self.aliases = _alias_plan(self.outputs, self.flat, self.from_inputs)


def _slot(replay: Callable[[], None], outputs: Any, from_inputs: tuple[_InputAlias, ...] = ()) -> _Slot:
    cdatas: list[int] = []
    skip = {a.out for a in from_inputs}
    tops = outputs if from_inputs else [outputs]
    for k, top in enumerate(tops):
        if from_inputs and k in skip:
            continue
        for t in _flat_tensors(top):
            cdata = t.untyped_storage()._cdata
            if cdata not in cdatas:
                cdatas.append(cdata)
    flat = type(outputs) in (tuple, list) and all(type(o) is torch.Tensor for o in outputs)
    return _Slot(replay, outputs, cdatas, [_use_count(c) for c in cdatas], flat, from_inputs)


class CudaGraphRunner:
    """Records and replays ``fn``; see the module docstring and its notes.

    ``planned``: Note [The runner's per-call path] (None: ``KILN_CUDAGRAPH_PLAN``, on unless "0");
    ``pointer_check() -> PointerCheck | None``: the plan's C check of the static inputs' pointers.
    ``capture(fn, args, pool) -> (replay, outputs)`` records one graph (:func:`capture_cuda` on a
    GPU; tests pass a stand-in to check the runner's bookkeeping on the CPU). ``new_pool()`` makes
    a fresh memory pool (default: CUDA's ``graph_pool_handle`` for :func:`capture_cuda`, a stand-in
    object for any other capture; a test that wraps ``capture_cuda`` passes CUDA's)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        capture: Callable[
            [Callable[..., Any], list[Any], Any], tuple[Callable[[], None], Any]
        ] = capture_cuda,
        pool: Any = None,
        new_pool: Callable[[], Any] | None = None,
        guarded_inputs: bool = False,
        planned: bool | None = None,
        pointer_check: Callable[[], PointerCheck | None] | None = None,
    ) -> None:
        self.fn = fn
        self.capture = capture
        # Note [The runner's per-call path]; None: KILN_CUDAGRAPH_PLAN (on unless "0")
        self.planned = PLANNED_REPLAY if planned is None else planned
        self.pointer_check = pointer_check  # asked at each plan: a C check, or None for `map`
        if new_pool is None:
            new_pool = torch.cuda.graph_pool_handle if capture is capture_cuda else object
        self._new_pool = new_pool
        self.guarded_inputs = guarded_inputs
        self.disabled: str | None = None
        self.replays = 0
        self.recordings = 0
        self.plain_calls = 0  # calls that ran the wrapper: warm-up, every slot busy, inputs changed
        self._busy_logged = False
        self._pool = pool
        self._own_pool = pool is None  # Note [A pool outlives its graphs only while one is alive]
        self._warm_ptrs: list[int | None] | None = None
        self._copied: set[int] = set()  # Note [Static inputs of a CUDA graph]
        self._static_idx: list[int] = []
        self._static_ptrs: list[int | None] = []
        self._inputs: list[Any] = []  # what the graph reads: the caller's tensor or our copy
        self._copy_dst: list[torch.Tensor] = []
        self._copy_idx: list[int] = []
        self._copy_strides: dict[int, tuple[int, ...]] = {}  # a copied input's strides at the caller
        # Note [The runner's per-call path]: planned at each recording
        self._pick_static: Callable[[Sequence[Any]], tuple[Any, ...]] = _picker([])
        self._pick_copied: Callable[[Sequence[Any]], tuple[Any, ...]] = _picker([])
        self._static_ptr_list: list[int] = []  # _static_ptrs at _static_idx, in order
        self._all_meta: list[Any] = []
        self._slots: list[_Slot] = []
        self._fast: Callable[[tuple[Any, ...]], Any] | None = None  # Note [The runner's per-call path]

    def __call__(self, *args: Any) -> Any:
        fast = self._fast
        if fast is not None:
            out = fast(args)
            if out is not _MISS:
                return out
        return self._call(args)

    def _plan(self) -> None:
        """Plan the replay of the current slots (Note [The runner's per-call path])."""
        if not self.planned:
            return
        pick_static, static_ptrs, data_ptr = self._pick_static, self._static_ptr_list, _data_ptr
        in_c = self.pointer_check() if self.pointer_check is not None and static_ptrs else None
        all_ptrs = tuple(self._static_ptrs)  # None at the inputs not checked
        all_meta = None if self.guarded_inputs else self._all_meta
        pick_copied = self._pick_copied
        copy_dst = list(self._copy_dst)
        copy_meta = [(d.shape, d.dtype) for d in copy_dst]  # a copy must neither broadcast nor cast
        only_dst = copy_dst[0] if len(copy_dst) == 1 else None
        foreach_copy = torch._foreach_copy_
        slots = tuple(self._slots)
        runner = self

        def replay(args: tuple[Any, ...]) -> Any:
            if in_c is not None:
                if not in_c(args, all_ptrs):
                    return (
                        _MISS  # a static input moved (Note [Static inputs of a CUDA graph]), or cannot tell
                    )
            elif static_ptrs and list(map(data_ptr, pick_static(args))) != static_ptrs:
                return _MISS  # a static input moved (Note [Static inputs of a CUDA graph])
            if all_meta is not None and [_meta(a) for a in args] != all_meta:
                return _MISS
            for slot in slots:
                if slot.free():
                    break
            else:
                return _MISS
            if copy_dst:
                copied = pick_copied(args)
                if [(a.shape, a.dtype) for a in copied] != copy_meta:
                    return _MISS
                if only_dst is not None:
                    only_dst.copy_(copied[0])
                else:
                    foreach_copy(copy_dst, list(copied))
            slot.replay()
            runner.replays += 1
            return slot.aliases(args)

        self._fast = replay
        log.debug(
            "CUDA graph: replay planned: %d static inputs checked by pointer (%s), %d copied (%s), %d slot(s)"
            " (Note [The runner's per-call path])",
            len(self._static_idx),
            "in C" if in_c is not None else "map",
            len(copy_dst),
            "copy_" if only_dst is not None else "_foreach_copy_" if copy_dst else "none",
            len(slots),
        )

    def _call(self, args: tuple[Any, ...]) -> Any:
        """The full path: the warm-up, recordings, and every call the planned replay declines."""
        if self.disabled is not None:
            return self.fn(*args)
        if self._warm_ptrs is None:  # warm-up
            self._warm_ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
            self.plain_calls += 1
            return self.fn(*args)
        if not self._slots:
            return self._record_first(args)
        if not self._statics_in_place(args):
            moved = [i for i in self._static_idx if args[i].data_ptr() != self._static_ptrs[i]]
            log.debug("CUDA graph: inputs %s moved; recording again with them copied", moved)
            self._copied.update(moved)
            return self._record_first(args)
        if not self.guarded_inputs and [_meta(a) for a in args] != self._all_meta:
            self.plain_calls += 1  # the graph was recorded for other inputs
            return self.fn(*args)
        copied = self._pick_copied(args)
        for a, static in zip(copied, self._copy_dst, strict=True):
            if a.shape != static.shape or a.dtype != static.dtype:  # a copy would broadcast or cast
                self.plain_calls += 1
                return self.fn(*args)
        slot = None
        for s in self._slots:
            if s.free():
                slot = s
                break
        if slot is None:
            if len(self._slots) < SLOTS and self.recordings < MAX_RECORDINGS:
                slot = self._record_slot()
                if slot is None:
                    return self.fn(*args)
            else:  # every slot's outputs are still held by the caller
                if not self._busy_logged:
                    self._busy_logged = True
                    log.info(
                        "CUDA graph: the outputs of its %d recordings are all still held by the caller;"
                        " running the kernels directly (slower) until one is released"
                        " (Note [Outputs of a CUDA graph])",
                        len(self._slots),
                    )
                self.plain_calls += 1
                return self.fn(*args)
        if copied:
            torch._foreach_copy_(self._copy_dst, list(copied))
        slot.replay()
        self.replays += 1
        return slot.aliases(args)

    def _statics_in_place(self, args: tuple[Any, ...]) -> bool:
        """Whether every static input is at its recorded address (Note [Static inputs of a CUDA graph])."""
        if _ptrs_equal is not None:
            return bool(_ptrs_equal(list(args), self._static_ptrs, self._static_idx))
        return list(map(_data_ptr, self._pick_static(args))) == self._static_ptr_list

    # ------------------------------------------------------------------------------ recording

    def _record_first(self, args: tuple[Any, ...]) -> Any:
        """(Re)record slot one for these arguments, replay it, and return its outputs."""
        if self.recordings >= MAX_RECORDINGS:
            self._disable(f"recorded {self.recordings} times: inputs keep moving")
            return self.fn(*args)
        assert self._warm_ptrs is not None
        self._fast = None  # planned again once slot one is recorded
        if self._slots and self._own_pool:
            # Note [A pool outlives its graphs only while one is alive]: torch releases a private
            # pool when the last graph recorded into it dies, and a capture into the released
            # handle fails inside torch's allocator (an internal assert on the H200, torch 2.11),
            # leaving the CUDA generator in capture mode: the program's next `torch.randn` on
            # the GPU raised. Dropping every slot drops every graph, so the next recording gets a
            # fresh pool; outputs the caller still holds keep their blocks until released.
            self._pool = None
        self._slots = []
        self._static_idx, self._static_ptrs = [], [None] * len(args)
        self._inputs, self._copy_dst, self._copy_idx = [], [], []
        self._copy_strides = {}
        self._all_meta = [_meta(a) for a in args]
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                self._inputs.append(a)
                continue
            if a.device.type != "cuda" and self.capture is capture_cuda:
                self._disable(f"input {i} is on {a.device}")
                return self.fn(*args)
            if i not in self._copied and a.data_ptr() == self._warm_ptrs[i]:
                self._static_idx.append(i)
                self._static_ptrs[i] = a.data_ptr()
                self._inputs.append(a)
            else:
                self._copied.add(i)
                static = _static_copy(a)
                self._inputs.append(static)
                self._copy_dst.append(static)
                self._copy_idx.append(i)
                self._copy_strides[i] = tuple(a.stride())
        self._pick_static, self._pick_copied = _picker(self._static_idx), _picker(self._copy_idx)
        self._static_ptr_list = [a.data_ptr() for a in self._pick_static(args)]
        slot = self._record_slot()
        if slot is None:
            return self.fn(*args)
        slot.replay()
        self.replays += 1
        return slot.aliases(args)

    def _record_slot(self) -> _Slot | None:
        if self._pool is None:  # a stand-in capture gets a stand-in pool (tests see which one)
            self._pool = self._new_pool()
        try:
            replay, outputs = self.capture(self.fn, self._inputs, self._pool)
        except Exception as exc:  # capture is impossible for this graph: run it plainly
            self._disable(f"capture failed: {type(exc).__name__}: {exc}")
            return None
        self.recordings += 1
        from_inputs = self._input_aliases(outputs)
        if isinstance(from_inputs, str):
            self._disable(from_inputs)
            return None
        slot = _slot(replay, outputs, from_inputs)
        self._slots.append(slot)
        self._plan()
        return slot

    def _input_aliases(self, outputs: Any) -> tuple[_InputAlias, ...] | str:
        """The outputs that are inputs or views of them (Note [Outputs that are inputs]), or why
        one cannot be rebuilt from a call's arguments."""
        by_storage: dict[int, int] = {}
        for i, a in enumerate(self._inputs):
            if isinstance(a, torch.Tensor):
                by_storage.setdefault(a.untyped_storage()._cdata, i)
        if not by_storage or not any(
            t.untyped_storage()._cdata in by_storage for t in _flat_tensors(outputs)
        ):
            return ()
        if type(outputs) not in (tuple, list):
            return "an output aliases an input (outputs not a tuple or list)"
        found: list[_InputAlias] = []
        for j, o in enumerate(outputs):
            if not isinstance(o, torch.Tensor):
                if any(t.untyped_storage()._cdata in by_storage for t in _flat_tensors(o)):
                    return f"output {j} holds an alias of an input inside it"
                continue
            k = by_storage.get(o.untyped_storage()._cdata)
            if k is None:
                continue
            inp = self._inputs[k]
            if k in self._copy_strides and tuple(inp.stride()) != self._copy_strides[k]:
                return f"output {j} is a view of copied input {k}, held in other strides than the caller's"
            if o is inp:
                found.append(_InputAlias(j, k, None))
            else:
                view = (tuple(o.shape), tuple(o.stride()), o.storage_offset() - inp.storage_offset())
                found.append(_InputAlias(j, k, view))
        if found:
            log.debug(
                "CUDA graph: outputs %s are inputs %s, returned from each call's arguments"
                " (Note [Outputs that are inputs])",
                [a.out for a in found],
                [a.arg for a in found],
            )
        return tuple(found)

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        self._fast = None
        self._slots, self._inputs, self._copy_dst = [], [], []
        log.warning("CUDA graphs off for this graph, running its kernels directly: %s", reason)


class CudaGraphsPerSize:
    """One :class:`CudaGraphRunner` per distinct value of the size symbols (Note [CUDA graphs per
    size]); ``symbols(*args)`` reads them from a call's arguments. ``runner_kwargs`` go to each
    runner (``capture``, ``guarded_inputs``; a runner makes its own pool unless one is given)."""

    def __init__(
        self, fn: Callable[..., Any], symbols: Callable[..., tuple[int, ...]], **runner_kwargs: Any
    ) -> None:
        self.fn = fn
        self.symbols = symbols
        self.runner_kwargs = runner_kwargs
        self.runners: dict[tuple[int, ...], CudaGraphRunner] = {}
        self.plain_calls = 0  # calls at a size beyond MAX_SIZES

    def __call__(self, *args: Any) -> Any:
        key = self.symbols(*args)
        runner = self.runners.get(key)
        if runner is None:
            if len(self.runners) >= MAX_SIZES:
                if self.plain_calls == 0:
                    log.info("CUDA graphs recorded for %d sizes; other sizes run the wrapper", MAX_SIZES)
                self.plain_calls += 1
                return self.fn(*args)
            runner = self.runners[key] = CudaGraphRunner(self.fn, **self.runner_kwargs)
        return runner(*args)

    @property
    def disabled(self) -> str | None:
        """Why a runner turned CUDA graphs off (the first one that did), or None."""
        return next((r.disabled for r in self.runners.values() if r.disabled is not None), None)

    @property
    def replays(self) -> int:
        return sum(r.replays for r in self.runners.values())

    @property
    def recordings(self) -> int:
        return sum(r.recordings for r in self.runners.values())
