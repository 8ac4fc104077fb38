"""The wrapper and the modes: buffer reuse, strided outputs, extern calls, the on-disk caches,
max-autotune, CUDA graphs (on a GPU) and the output_code log."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from triton_check import DEVICES, aten, check, make, to_device

from kiln_codegen_triton import TritonBackend, counters
from kiln_loopir import compile_graph


def _chain(x: torch.Tensor, w: torch.Tensor) -> Any:
    h = aten.mm.default(x, w)
    a = aten.relu.default(h)
    s = aten._softmax.default(a, 1, False)
    m = aten.mm.default(s, aten.permute.default(w, [1, 0]))
    return aten.add.Tensor(m, x)


@pytest.mark.parametrize("device", DEVICES)
def test_reuse_plan_and_stats(device: str) -> None:
    gm = torch.fx.symbolic_trace(_chain)
    x, w = to_device([make((8, 16)), make((16, 16))], device)
    compiled = compile_graph(gm, [x, w], backend="triton")
    torch.testing.assert_close(compiled(x, w), gm(x, w))
    assert compiled.stats.extern_calls == 2 and compiled.stats.kernels >= 2
    assert compiled.stats.reused >= 1  # a freed buffer's memory is taken over


@pytest.mark.parametrize("device", DEVICES)
def test_outputs_are_views_with_eager_strides(device: str) -> None:
    def fn(x: torch.Tensor) -> Any:
        y = aten.mul.Tensor(x, 2.0)
        return (
            aten.permute.default(y, [1, 0]),
            aten.slice.Tensor(y, 1, 2, 6),
            aten.expand.default(aten.slice.Tensor(y, 0, 0, 1), [3, 9]),
        )

    x = to_device(make((5, 9)), device)
    gm = torch.fx.symbolic_trace(fn)
    compiled = compile_graph(gm, [x], backend="triton")
    for got, want in zip(compiled(x), gm(x), strict=True):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride() and got.device == want.device


@pytest.mark.parametrize("device", DEVICES)
def test_the_default_mode_tunes_only_kernels_that_move_enough_memory(device: str, cache_root: str) -> None:
    # Note [Autotuning large kernels in the default mode]: the row sum moves 32*300*4 bytes in
    # and 32*4 out; the gelu the same in and out. A threshold between the two kernels' sizes
    # tunes only the larger one; 0 tunes none.
    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        return aten.gelu.default(x), aten.sum.dim_IntList(y, [1])

    x, y = make((8, 16)), make((32, 300))
    before = dict(counters)
    backend = check(fn, x, y, device=device, backend=TritonBackend(autotune_min_bytes=32 * 300 * 4), calls=2)
    tuned = {name for name, launcher in backend.last_launchers.items() if launcher.autotune}
    assert tuned and all("sum" in name for name in tuned), tuned
    assert counters["autotuned"] - before["autotuned"] == len(tuned)  # on the first call only
    assert all(len(backend.last_launchers[name].candidates) >= 2 for name in tuned)
    off = check(fn, x, y, device=device, backend=TritonBackend(autotune_min_bytes=0))
    assert not any(launcher.autotune for launcher in off.last_launchers.values())


def test_bytes_per_program_size_reductions_by_their_element_type() -> None:
    # Note [Bytes per program] in heuristics.py: a bfloat16 row program takes twice the rows
    # of a float32 one; an outer reduction's tile is 4 KB for both
    from dataclasses import replace

    from kiln_codegen_triton.heuristics import configs
    from kiln_codegen_triton.kernel import KernelSpec

    def spec(
        kind: str, dtype: torch.dtype, *, outer: bool = False, xnumel: int = 4096, rnumel: int = 768
    ) -> KernelSpec:
        return KernelSpec(
            "k", "", ("a", "b"), (dtype, dtype), kind, xnumel, 1, rnumel, (), ("b",), False, outer
        )

    f32 = configs(spec("persistent", torch.float32, rnumel=256))[0]
    bf16 = configs(spec("persistent", torch.bfloat16, rnumel=256))[0]
    assert f32.RBLOCK == bf16.RBLOCK == 256 and bf16.XBLOCK == 2 * f32.XBLOCK
    # Note [One warp per row]: rows of 513-1024 elements, whatever the type
    for dtype in (torch.float32, torch.bfloat16):
        row = configs(spec("persistent", dtype))[0]
        assert (row.XBLOCK, row.RBLOCK, row.num_warps) == (1, 1024, 1)
    bf16 = configs(spec("persistent", torch.bfloat16))[0]
    outer32 = configs(spec("looped", torch.float32, outer=True), rblock_cap=2048)[0]
    outer16 = configs(spec("looped", torch.bfloat16, outer=True), rblock_cap=2048)[0]
    assert outer32.XBLOCK * outer32.RBLOCK * 4 == outer16.XBLOCK * outer16.RBLOCK * 2 == 4096
    small = configs(spec("persistent", torch.bfloat16), autotune="small")
    assert small[0] == bf16 and len(small) == len(set(small)) >= 3
    assert configs(replace(spec("pointwise", torch.float32)), autotune="small") == configs(
        spec("pointwise", torch.float32)
    )


@pytest.mark.parametrize("device", DEVICES)
def test_max_autotune_times_configs_once_and_caches_on_disk(device: str, cache_root: str) -> None:
    def fn(x: torch.Tensor) -> Any:
        return aten.gelu.default(x), aten.sum.dim_IntList(x, [1])

    x = make((32, 300))
    before = dict(counters)
    backend = check(fn, x, device=device, backend=TritonBackend(mode="max-autotune"), calls=2)
    tuned = len(backend.last_launchers)
    assert tuned >= 1 and counters["autotuned"] - before["autotuned"] == tuned  # first call only
    chosen = [launcher.config for launcher in backend.last_launchers.values()]
    assert all(c is not None for c in chosen)
    records = list((Path(cache_root) / "triton" / "autotune").glob("*.json"))
    assert len(records) >= tuned and "config" in json.loads(records[0].read_text())
    # a new compilation (another process, say) reads the choices instead of timing again
    again = check(fn, x, device=device, backend=TritonBackend(mode="max-autotune"))
    assert counters["autotune_hits"] - before["autotune_hits"] == tuned
    assert [launcher.config for launcher in again.last_launchers.values()] == chosen


@pytest.mark.parametrize("device", DEVICES)
def test_generated_module_is_cached_and_logged(
    device: str, cache_root: str, caplog: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KILN_LOG", "output_code")
    x = make((4, 50))
    with caplog.at_level(logging.DEBUG, logger="kiln.codegen_triton.output_code"):
        backend = check(lambda t: aten.sigmoid.default(aten.exp.default(t)), x, device=device)
    path = Path(backend.last_module_path)
    assert path.is_relative_to(Path(cache_root)) and path.read_text() == backend.last_source
    assert "@triton.jit" in caplog.text and "def call(" in caplog.text
    written = counters["modules_written"]
    check(lambda t: aten.sigmoid.default(aten.exp.default(t)), x, device=device)
    assert counters["modules_written"] == written  # same source: loaded, not written again


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        TritonBackend(mode="fastest")


@pytest.mark.parametrize("device", DEVICES)
def test_reduce_overhead(device: str) -> None:
    """CUDA graphs on a GPU: record on the second call, replay after, right for new addresses."""
    gm = torch.fx.symbolic_trace(_chain)
    x, w = to_device([make((8, 16)), make((16, 16))], device)
    backend = TritonBackend(mode="reduce-overhead")
    compiled = compile_graph(gm, [x, w], backend=backend)
    runner = backend.last_cudagraphs
    if device == "cpu":
        assert runner is None  # no CUDA graphs off a GPU: the plain wrapper runs
    outputs = []
    for i in range(4):
        xi, wi = x + i, w * (i + 1)  # fresh tensors at new addresses every call
        outputs.append(compiled(xi, wi))
        torch.testing.assert_close(outputs[-1], gm(xi, wi))
    # a later replay never overwrites what an earlier call returned (Note [Outputs of a CUDA graph])
    for i, out in enumerate(outputs):
        torch.testing.assert_close(out, gm(x + i, w * (i + 1)))
    if device == "cuda":
        # warm-up, slot one, slot two, then both slots' outputs are held: the plain wrapper
        assert runner is not None and runner.recordings == 2 and runner.replays == 2
        assert runner._copy_idx == [0, 1]  # both inputs moved between calls: copied


@pytest.mark.parametrize("device", DEVICES)
def test_graphs_that_mutate_inputs_are_not_recorded(device: str) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        aten.add_.Tensor(x, y)  # mutates its input: a CUDA graph would mutate a static copy
        return aten.mul.Tensor(x, 2.0)

    x, y = to_device([make((3, 4)), make((3, 4))], device)
    gm = torch.fx.symbolic_trace(fn)
    backend = TritonBackend(mode="reduce-overhead")
    compiled = compile_graph(gm, [x.clone(), y], backend=backend)
    assert backend.last_cudagraphs is None
    for _ in range(3):
        mine, theirs = x.clone(), x.clone()
        torch.testing.assert_close(compiled(mine, y), gm(theirs, y))
        torch.testing.assert_close(mine, theirs)


def test_extern_outputs_returned_as_none_pass_through() -> None:
    # CUDA flash attention returns None for cum_seq_q/cum_seq_k, which its meta kernel gives as
    # tensors; the wrapper's _flat must not fail on them (bf16 GPT-2 on the H200 did).
    from kiln_codegen_triton.wrapper import _flat

    assert _flat(None, 4, (4,), (1,), 0) is None
    t = torch.arange(6.0).view(2, 3)
    flat = _flat(t.t(), 6, (3, 2), (2, 1), 0)
    assert flat is not None and torch.equal(flat.view(3, 2), t.t())


@pytest.mark.parametrize("device", DEVICES)
def test_unread_extern_outputs_are_not_taken(device: str) -> None:
    # Note [Unread extern outputs]: only the values of a sort are read; its indices are never
    # bound (a fused attention's undefined logsumexp in inference must not be conformed either)
    def fn(x: torch.Tensor) -> Any:
        values, _indices = aten.sort.default(x, 1)
        return aten.mul.Tensor(values, 2.0)

    x = to_device(make((4, 33)), device)
    gm = torch.fx.symbolic_trace(fn)
    backend = TritonBackend()
    compiled = compile_graph(gm, [x], backend=backend)
    torch.testing.assert_close(compiled(x), gm(x))
    wrapper = backend.last_wrapper
    assert "_r[0]" in wrapper and "_r[1]" not in wrapper, wrapper


@pytest.mark.parametrize(
    "damage",
    [b"\xff\xfe garbage", b"# kiln codegen_triton kernels\nimport tri"],
    ids=["garbage", "truncated"],
)
def test_a_corrupt_module_file_is_reported_and_written_again(
    damage: bytes, tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    """A module file whose bytes are not its source (its name is the source's hash) is never
    imported: it is reported and replaced (Note [Atomic cache writes] in runtime.py)."""
    import hashlib

    from kiln_codegen_triton.runtime import load_module

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    source = f"size = {len(damage)}  # {tmp_path}\n"
    key = hashlib.sha256(source.encode()).hexdigest()
    path = tmp_path / "triton" / key[:2] / f"{key}.py"
    path.parent.mkdir(parents=True)
    path.write_bytes(damage)
    before = dict(counters)
    with caplog.at_level(logging.WARNING, logger="kiln.codegen_triton.cache"):
        module, where = load_module(source)
    assert where == path
    assert module.size == len(damage)
    assert path.read_text() == source
    assert counters["corrupt"] - before["corrupt"] == 1
    assert "corrupt Triton module" in caplog.text and str(path) in caplog.text


@pytest.mark.parametrize("device", DEVICES)
def test_a_corrupt_autotune_record_is_reported_and_timed_again(
    device: str, tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    def fn(x: torch.Tensor) -> Any:
        return aten.sum.dim_IntList(aten.mul.Tensor(x, 0.375), [1])

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    x = make((4, 40))
    check(fn, x, device=device, backend=TritonBackend(mode="max-autotune"))
    records = sorted((tmp_path / "triton" / "autotune").glob("*.json"))
    assert records
    for i, record in enumerate(records):  # a truncated record, and bytes that are not text
        record.write_bytes(record.read_bytes()[:20] if i % 2 == 0 else b"\xff\x00\x01")
    before = dict(counters)
    with caplog.at_level(logging.WARNING, logger="kiln.codegen_triton.cache"):
        check(fn, x, device=device, backend=TritonBackend(mode="max-autotune"))
    assert counters["corrupt"] - before["corrupt"] == len(records)
    assert counters["autotuned"] - before["autotuned"] == len(records)
    assert caplog.text.count("corrupt autotune record") == len(records)
    assert all("config" in json.loads(record.read_text()) for record in records)  # rewritten whole


@pytest.mark.parametrize("device", DEVICES)
def test_guarded_inputs_are_checked_for_their_storage_offset_only(device: str) -> None:
    """Note [Inputs the frame guard checks]: with ``guarded_layouts`` a GPU wrapper reads only
    each input's storage offset (the frame's guard checked the rest); an input at another offset
    is still copied into the compiled layout, so the answer stays eager's."""

    def f(x: Any, y: Any) -> Any:
        return aten.mul.Tensor(aten.add.Tensor(x, y), 2.0)

    x, y = to_device([make((4, 8)), make((4, 8))], device)
    backend = TritonBackend(guarded_layouts=True)
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, y], backend=backend)
    wrapper = backend.last_wrapper
    if device == "cuda":
        assert "x.stride()" not in wrapper and "x.storage_offset() != 0" in wrapper, wrapper
    else:  # under the interpreter kernels take tensors: the full check stays
        assert "x.stride()" in wrapper, wrapper
    shifted = torch.cat([torch.zeros(1, 8, device=device), x])[1:]  # the same layout at offset 8
    assert shifted.storage_offset() == 8 and shifted.stride() == x.stride()
    torch.testing.assert_close(compiled(shifted, y), f(shifted, y))
    torch.testing.assert_close(compiled(x, y), f(x, y))
