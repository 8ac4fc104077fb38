"""CudaGraphRunner's bookkeeping: static and copied inputs, re-recording when a static input
moves, output slots that are never overwritten while the caller holds them, and the reasons a
graph is not recorded.

On the CPU (CI) a stand-in for the CUDA capture records a graph as "the function and the tensors
it was recorded on": a replay runs the function again on those very tensors and writes the
results into the recorded outputs, which is what a CUDA graph's replay does to memory. On a GPU
the same tests run with real CUDA graphs as well."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from triton_check import DEVICES

from kiln_codegen_triton import CudaGraphRunner
from kiln_codegen_triton.cudagraphs import MAX_RECORDINGS, capture_cuda


def fake_capture(fn: Callable[..., Any], args: list[Any], pool: Any) -> tuple[Callable[[], None], Any]:
    outputs = fn(*args)

    def replay() -> None:
        for static, new in zip(_leaves(outputs), _leaves(fn(*args)), strict=True):
            static.copy_(new)

    return replay, outputs


def _leaves(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _leaves(o)]


CAPTURES = [fake_capture] + ([capture_cuda] if "cuda" in DEVICES else [])
DEVICE = DEVICES[0]


def _fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = torch.relu(x @ w)
    return h, h.sum(0)


def _eager(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _fn(x.clone(), w.clone())


def _runner(capture: Any, **kwargs: Any) -> CudaGraphRunner:
    return CudaGraphRunner(_fn, capture=capture, **kwargs)


@pytest.mark.parametrize("capture", CAPTURES)
def test_parameters_are_read_in_place_and_batches_copied(capture: Any) -> None:
    w = torch.randn(16, 8, device=DEVICE)  # a parameter: same address on every call
    runner = _runner(capture)
    for i in range(6):
        x = torch.randn(4, 16, device=DEVICE)  # a fresh batch every call
        if i == 3:
            with torch.no_grad():
                w.mul_(2.0)  # an optimizer step: in place, the graph must see it
        y = runner(x, w)
        torch.testing.assert_close(y, _eager(x, w))
    assert runner.disabled is None
    assert runner._static_idx == [1] and runner._copy_idx == [0]  # w never copied
    assert runner.recordings == 2 and runner.plain_calls == 1  # warm-up; slots one and two


@pytest.mark.parametrize("capture", CAPTURES)
def test_a_static_input_that_moves_is_recorded_again_and_copied_from_then_on(capture: Any) -> None:
    w = torch.randn(16, 8, device=DEVICE)
    x = torch.randn(4, 16, device=DEVICE)
    runner = _runner(capture)
    for _ in range(3):
        torch.testing.assert_close(runner(x, w), _eager(x, w))
    assert runner._static_idx == [0, 1]
    recordings = runner.recordings
    w = torch.randn(16, 8, device=DEVICE)  # `param.data = ...`: new memory
    torch.testing.assert_close(runner(x, w), _eager(x, w))
    assert runner.recordings == recordings + 1 and runner._copy_idx == [1]
    w2 = torch.randn(16, 8, device=DEVICE)
    torch.testing.assert_close(runner(x, w2), _eager(x, w2))  # copied now: no new recording
    assert runner.recordings == recordings + 1


@pytest.mark.parametrize("capture", CAPTURES)
def test_outputs_the_caller_keeps_are_never_overwritten(capture: Any, caplog: Any) -> None:
    w = torch.randn(16, 8, device=DEVICE)
    runner = _runner(capture)
    kept, inputs = [], []
    with caplog.at_level(logging.INFO, logger="kiln.codegen_triton.output_code"):
        for _ in range(6):
            x = torch.randn(4, 16, device=DEVICE)
            inputs.append(x)
            kept.append(runner(x, w))
    # said once, not once per call
    assert sum("still held by the caller" in r.getMessage() for r in caplog.records) == 1
    for x, y in zip(inputs, kept, strict=True):
        torch.testing.assert_close(y, _eager(x, w))
    # warm-up, slot one, slot two; then both slots are held: the plain wrapper runs
    assert runner.recordings == 2 and runner.replays == 2 and runner.plain_calls == 4
    del kept[1:3]  # the outputs of both slots are free again
    x = torch.randn(4, 16, device=DEVICE)
    torch.testing.assert_close(runner(x, w), _eager(x, w))
    assert runner.replays == 3


@pytest.mark.parametrize("capture", CAPTURES)
def test_the_usual_loop_ping_pongs_between_two_slots(capture: Any) -> None:
    w = torch.randn(16, 8, device=DEVICE)
    runner = _runner(capture)
    y = None
    for _ in range(10):
        x = torch.randn(4, 16, device=DEVICE)
        previous = y
        y = runner(x, w)
        torch.testing.assert_close(y, _eager(x, w))
        if previous is not None:
            assert previous[0].data_ptr() != y[0].data_ptr()
        del previous
    assert runner.plain_calls == 1 and runner.recordings == 2 and runner.replays == 9


@pytest.mark.parametrize("capture", CAPTURES)
def test_unguarded_inputs_with_other_strides_run_the_wrapper(capture: Any) -> None:
    w = torch.randn(16, 8, device=DEVICE)
    x = torch.randn(4, 16, device=DEVICE)
    runner = _runner(capture)
    for _ in range(3):
        runner(x, w)
    replays = runner.replays
    wt = w.as_strided((16, 8), (1, 16))  # same address and shape, other strides
    torch.testing.assert_close(runner(x, wt), _eager(x, wt))
    assert runner.replays == replays  # not replayed: the graph reads w with w's strides
    # guarded (kiln's frame guards compare strides before the call): pointers only
    guarded = _runner(capture, guarded_inputs=True)
    for _ in range(3):
        torch.testing.assert_close(guarded(x, w), _eager(x, w))
    assert guarded.replays == 2


def test_a_failed_capture_turns_the_runner_off_with_a_reason() -> None:
    def broken(fn: Any, args: Any, pool: Any) -> Any:
        raise RuntimeError("operation not permitted when stream is capturing")

    w, x = torch.randn(16, 8, device=DEVICE), torch.randn(4, 16, device=DEVICE)
    runner = _runner(broken)
    for _ in range(3):
        torch.testing.assert_close(runner(x, w), _eager(x, w))
    assert runner.disabled is not None and "not permitted" in runner.disabled


def test_recordings_are_bounded() -> None:
    def total(*ts: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.stack(ts).sum(0),)

    runner = CudaGraphRunner(total, capture=fake_capture)
    ts = [torch.randn(5, device=DEVICE) for _ in range(2 * MAX_RECORDINGS)]
    for i in range(len(ts)):
        ts[i] = torch.randn(5, device=DEVICE)  # one more static input moves on every call
        y = runner(*ts)
        torch.testing.assert_close(y, total(*ts))
    assert runner.recordings <= MAX_RECORDINGS
    assert runner.disabled is not None and "recorded" in runner.disabled


def _saves_inputs(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A training forward's shape: results, then inputs and views of them saved for the backward."""
    return torch.relu(x @ w), x, w, w.t(), x[1:]


@pytest.mark.parametrize("capture", CAPTURES)
def test_outputs_that_are_inputs_come_from_each_calls_arguments(capture: Any) -> None:
    """Note [Outputs that are inputs]: the graph is recorded; an output that is an input is the
    caller's tensor of this call (never the recording call's, never the graph's copy), a view
    of an input is the same view of this call's input."""
    runner = CudaGraphRunner(_saves_inputs, capture=capture)
    w = torch.randn(6, 4, device=DEVICE)  # static: same address every call
    for _ in range(5):
        x = torch.randn(3, 6, device=DEVICE)  # copied: a new batch every call
        h, x_out, w_out, wt, x_tail = runner(x, w)
        torch.testing.assert_close(h, torch.relu(x @ w))
        assert x_out is x and w_out is w
        assert wt.data_ptr() == w.data_ptr() and wt.stride() == (1, 4) and torch.equal(wt, w.t())
        assert x_tail.data_ptr() == x[1:].data_ptr() and torch.equal(x_tail, x[1:])
    assert runner.disabled is None
    assert runner.replays >= 3


@pytest.mark.parametrize("capture", CAPTURES)
def test_outputs_that_are_inputs_do_not_keep_a_slot_busy(capture: Any) -> None:
    """The caller holds its own inputs; that must not count as holding the graph's outputs."""
    runner = CudaGraphRunner(lambda x, w: (x @ w, w), capture=capture, guarded_inputs=True)
    x, w = torch.randn(3, 6, device=DEVICE), torch.randn(6, 4, device=DEVICE)
    for _ in range(6):
        y, w_out = runner(x, w)
        assert w_out is w
        torch.testing.assert_close(y, x @ w)
        del y, w_out
    assert runner.plain_calls == 1  # the warm-up alone
    assert runner.recordings == 1 and runner.replays == 5


def test_an_input_alias_inside_a_nested_output_is_not_recorded() -> None:
    runner = CudaGraphRunner(lambda x: ((x, x + 1), x * 2), capture=fake_capture)
    x = torch.randn(3, device=DEVICE)
    for _ in range(3):
        (a, b), c = runner(x)
        assert a is x
        torch.testing.assert_close(b, x + 1)
        torch.testing.assert_close(c, x * 2)
    assert runner.disabled == "output 0 holds an alias of an input inside it"


@pytest.mark.parametrize("capture", CAPTURES)
def test_a_graph_of_symbolic_sizes_is_recorded_per_size(capture: Any) -> None:
    """Note [CUDA graphs per size]: one runner per tuple of symbol values, each with its own
    warm-up, recordings and output slots; a size seen again replays its own graph."""
    from kiln_codegen_triton.cudagraphs import MAX_SIZES, CudaGraphsPerSize

    w = torch.randn(16, 8, device=DEVICE)
    per_size = CudaGraphsPerSize(_fn, lambda x, w: (x.size(0),), capture=capture)
    batches = [4, 4, 4, 7, 7, 4, 7, 7, 3]
    for b in batches:
        x = torch.randn(b, 16, device=DEVICE)
        y = per_size(x, w)
        assert y[0].shape == (b, 8)
        torch.testing.assert_close(y, _eager(x, w))
    assert sorted(per_size.runners) == [(3,), (4,), (7,)]
    four, seven, three = per_size.runners[(4,)], per_size.runners[(7,)], per_size.runners[(3,)]
    assert (four.plain_calls, four.recordings, four.replays) == (1, 2, 3)
    assert (seven.plain_calls, seven.recordings, seven.replays) == (1, 2, 3)
    assert (three.plain_calls, three.recordings) == (1, 0)  # warm-up only
    assert per_size.disabled is None and per_size.replays == 6
    for b in range(10, 10 + MAX_SIZES):  # past the limit a new size runs the function directly
        x = torch.randn(b, 16, device=DEVICE)
        torch.testing.assert_close(per_size(x, w), _eager(x, w))
    assert len(per_size.runners) == MAX_SIZES and per_size.plain_calls == 3


def _many(x: torch.Tensor, *ws: torch.Tensor) -> Any:
    h = x
    for w in ws:
        h = torch.relu(h @ w)
    return (h, [h.sum(0)]) if h.shape[0] == 3 else (h, h.sum(0))


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("rows", [4, 3])  # a flat tuple of outputs; one with a list inside
def test_many_static_inputs_one_of_which_moves(capture: Any, rows: int) -> None:
    """Note [The runner's per-call path]: the planned picks check every static input, whichever
    moves, and the caller gets fresh tensor objects over the graph's outputs, in their structure."""
    ws = [torch.randn(8, 8, device=DEVICE) for _ in range(5)]
    runner = CudaGraphRunner(_many, capture=capture, guarded_inputs=True)
    seen: list[Any] = []
    for i in range(8):
        x = torch.randn(rows, 8, device=DEVICE)
        if i == 5:
            ws[3] = torch.randn(8, 8, device=DEVICE)  # a parameter replaced: a new address
        y = runner(x, *ws)
        torch.testing.assert_close(y, _many(x.clone(), *[w.clone() for w in ws]))
        assert type(y) is tuple and type(y[1]) is (list if rows == 3 else torch.Tensor)
        assert all(y[0] is not s[0] for s in seen)  # a new object each call
        seen = [y]
    assert runner.disabled is None and 4 in runner._copy_idx and runner._static_idx == [1, 2, 3, 5]
    assert runner.recordings >= 3 and runner.replays >= 4


@pytest.mark.parametrize("capture", CAPTURES)
def test_recording_again_from_scratch_takes_a_fresh_pool(capture: Any) -> None:
    """Note [A pool outlives its graphs only while one is alive]: the second slot shares the first
    one's pool; a recording that drops every slot (a static input moved) takes a new pool, since
    torch releases a private pool with its last graph."""
    pools: list[Any] = []

    def seen(fn: Callable[..., Any], args: list[Any], pool: Any) -> tuple[Callable[[], None], Any]:
        pools.append(pool)
        return capture(fn, args, pool)

    w = torch.randn(16, 8, device=DEVICE)
    # `seen` wraps the capture: on a GPU it must still record into CUDA's pools (a stand-in object
    # made torch.cuda.graph raise on the H200, and the runner ran without graphs)
    new_pool = torch.cuda.graph_pool_handle if capture is capture_cuda else None
    runner = CudaGraphRunner(_eager, capture=seen, new_pool=new_pool, guarded_inputs=True)
    x = torch.randn(4, 16, device=DEVICE)
    held = [runner(x, w) for _ in range(3)]  # warm-up, slot one, slot two (the first is held)
    assert len(pools) == 2 and pools[0] is pools[1]
    w2 = torch.randn(16, 8, device=DEVICE)  # the parameter moved: recorded again from scratch
    torch.testing.assert_close(runner(x, w2), _eager(x, w2))
    assert len(pools) == 3 and pools[2] is not pools[0]
    for y in held:  # outputs held across the new recording are intact
        torch.testing.assert_close(y, _eager(x, w))
    assert runner.disabled is None and runner.recordings == 3


# Note [The runner's per-call path]: the planned replay takes only the calls whose checks all pass;
# each test below drives a case that one of its shortcuts must still see.


@pytest.fixture
def planned(monkeypatch: Any) -> None:
    """The plan on, whatever KILN_CUDAGRAPH_PLAN says."""
    from kiln_codegen_triton import cudagraphs

    monkeypatch.setattr(cudagraphs, "PLANNED_REPLAY", True)


def _two_batches(x: torch.Tensor, m: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
    return (torch.relu((x * m) @ w),)


def _planned_calls(runner: CudaGraphRunner, monkeypatch: Any) -> list[int]:
    """Counts the calls that the planned replay declined (they run the full path)."""
    full: list[int] = []
    original = runner._call

    def counted(args: tuple[Any, ...]) -> Any:
        full.append(1)
        return original(args)

    monkeypatch.setattr(runner, "_call", counted)
    return full


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("batches", [1, 2])  # one copied input (`copy_`), two (`_foreach_copy_`)
def test_planned_replay_copies_inputs_at_new_addresses(
    capture: Any, batches: int, monkeypatch: Any, planned: None
) -> None:
    w = torch.randn(16, 8, device=DEVICE)
    m = torch.randn(4, 16, device=DEVICE)
    runner = CudaGraphRunner(
        _two_batches if batches == 2 else lambda x, w: _two_batches(x, m, w),
        capture=capture,
        guarded_inputs=True,
    )
    full = _planned_calls(runner, monkeypatch)
    for _ in range(8):
        x = torch.randn(4, 16, device=DEVICE)  # a new batch (and mask) at a new address every call
        if batches == 2:
            m = torch.randn(4, 16, device=DEVICE)
            y = runner(x, m, w)
        else:
            y = runner(x, w)
        torch.testing.assert_close(y, _two_batches(x, m, w))
    assert runner._copy_idx == list(range(batches)) and runner._static_idx == [batches]
    assert runner._fast is not None and runner.replays == 7 and len(full) == 3  # warm-up, slots one and two


@pytest.mark.parametrize("capture", CAPTURES)
def test_planned_replay_sees_a_parameter_updated_in_place(capture: Any, planned: None) -> None:
    w = torch.randn(16, 8, device=DEVICE)
    x = torch.randn(4, 16, device=DEVICE)  # the same batch every call: static too
    runner = CudaGraphRunner(_fn, capture=capture, guarded_inputs=True)
    for _ in range(6):
        with torch.no_grad():
            w.add_(1.0)  # every call: the graph reads w where it lies
        torch.testing.assert_close(runner(x, w), _eager(x, w))
    assert (
        runner._copy_idx == [] and runner.replays == 5 and runner.recordings == 1
    )  # outputs dropped: one slot


@pytest.mark.parametrize("capture", CAPTURES)
def test_planned_replay_records_again_when_a_static_input_moves(capture: Any, planned: None) -> None:
    ws = [torch.randn(8, 8, device=DEVICE) for _ in range(3)]
    x = torch.randn(3, 8, device=DEVICE)
    runner = CudaGraphRunner(_many, capture=capture, guarded_inputs=True)
    for _ in range(3):
        runner(x, *ws)
    recordings = runner.recordings
    ws[2] = torch.randn(8, 8, device=DEVICE)  # the last static input moves
    torch.testing.assert_close(runner(x, *ws), _many(x.clone(), *[w.clone() for w in ws]))
    assert runner.recordings == recordings + 1 and runner._copy_idx == [3]


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("change", ["shape", "dtype"])
def test_planned_replay_refuses_a_copied_input_of_another_shape_or_dtype(
    capture: Any, change: str, planned: None
) -> None:
    """A copy into the graph's buffer would broadcast or cast: the call runs the wrapper."""

    def double(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x * 2).to(w.dtype) @ w,)

    w = torch.randn(16, 8, device=DEVICE)
    runner = CudaGraphRunner(double, capture=capture, guarded_inputs=True)
    for _ in range(4):
        runner(torch.randn(4, 16, device=DEVICE), w)  # copied
    plain = runner.plain_calls
    if change == "shape":
        odd = torch.randn(1, 16, device=DEVICE)  # would broadcast into the (4, 16) buffer
    else:
        odd = torch.randn(4, 16, device=DEVICE, dtype=torch.float64)  # would be cast
    torch.testing.assert_close(runner(odd, w), double(odd, w))
    assert runner.plain_calls == plain + 1


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("kept", [0, 1])
def test_planned_replay_never_overwrites_a_kept_output(capture: Any, kept: int, planned: None) -> None:
    """One output storage (its use count read by one C call) and two (a list compared): keeping
    either output of a call keeps its slot out of the next replays."""

    def one(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return (x @ w,)

    for fn in (one, _fn):
        w = torch.randn(16, 8, device=DEVICE)
        runner = CudaGraphRunner(fn, capture=capture, guarded_inputs=True)
        for _ in range(3):
            runner(torch.randn(4, 16, device=DEVICE), w)
        x = torch.randn(4, 16, device=DEVICE)
        held = runner(x, w)[kept if fn is _fn else 0]
        expected = held.clone()
        for _ in range(4):
            x2 = torch.randn(4, 16, device=DEVICE)
            torch.testing.assert_close(runner(x2, w), fn(x2, w))
        torch.testing.assert_close(held, expected)


@pytest.mark.parametrize("capture", CAPTURES)
def test_planned_replay_decides_as_the_full_path(capture: Any) -> None:
    """The same calls with the plan on and off: the same results, recordings, replays and plain
    calls (a kept output, a moved parameter, a parameter updated in place, a new batch, a batch of
    another shape)."""

    def script(planned: bool) -> list[Any]:
        gen = torch.Generator(device=DEVICE).manual_seed(0)

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=DEVICE, generator=gen)

        ws = [randn(8, 8) for _ in range(3)]
        runner = CudaGraphRunner(_many, capture=capture, guarded_inputs=True, planned=planned)
        seen: list[Any] = []
        kept: list[Any] = []
        for i in range(14):
            x = randn(4, 8) if i != 9 else randn(5, 8)
            if i == 4:
                kept.append(runner(x, *ws))
                kept.append(runner(x, *ws))
            if i == 6:
                kept.clear()
                ws[1] = randn(8, 8)
            if i == 8:
                with torch.no_grad():
                    ws[0].mul_(0.5)
            y = runner(x, *ws)
            seen.append([t.clone() for t in _leaves(y)])
            seen.append((runner.recordings, runner.replays, runner.plain_calls, list(runner._copy_idx)))
        assert (runner._fast is not None) is planned
        return seen

    planned, full = script(True), script(False)
    for a, b in zip(planned, full, strict=True):
        if isinstance(a, tuple):
            assert a == b
        else:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("answer", ["truth", "cannot tell"])
def test_planned_replay_with_a_pointer_check_of_the_callers(capture: Any, answer: str, planned: None) -> None:
    """`pointer_check` (kiln passes a C loop): asked once per plan, called with the static inputs
    and their recorded pointers on every replay; a moved input is recorded again, and a check that
    cannot tell (False) sends the call down the full path, which replays as usual."""
    asked: list[int] = []
    calls: list[int] = []

    def check(args: tuple[Any, ...], ptrs: tuple[int | None, ...]) -> bool:
        calls.append(sum(p is not None for p in ptrs))
        return answer == "truth" and all(
            p is None or a.data_ptr() == p for a, p in zip(args, ptrs, strict=True)
        )

    def provider() -> Any:
        asked.append(1)
        return check

    ws = [torch.randn(8, 8, device=DEVICE) for _ in range(3)]
    runner = CudaGraphRunner(_many, capture=capture, guarded_inputs=True, pointer_check=provider)
    for i in range(8):
        x = torch.randn(4, 8, device=DEVICE)  # copied
        if i == 5:
            ws[1] = torch.randn(8, 8, device=DEVICE)  # moved: recorded again, copied from then on
        torch.testing.assert_close(runner(x, *ws), _many(x.clone(), *[w.clone() for w in ws]))
    assert runner.disabled is None and runner._copy_idx == [0, 2] and runner.replays == 7
    assert len(asked) == runner.recordings  # one plan per recording
    assert calls and set(calls[:3]) == {3}  # the three static weights before the move
