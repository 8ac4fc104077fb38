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
from kiln_codegen_triton.interp import replay_gpu_form
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

    f32 = configs(spec("persistent", torch.float32, rnumel=128))[0]
    bf16 = configs(spec("persistent", torch.bfloat16, rnumel=128))[0]
    assert f32.RBLOCK == bf16.RBLOCK == 128 and bf16.XBLOCK == 2 * f32.XBLOCK
    # Note [One warp per 1024 elements]: half-precision rows of 129-512 elements
    for rnumel, rows in ((192, 4), (384, 2)):
        half = configs(spec("persistent", torch.bfloat16, rnumel=rnumel))[0]
        assert (half.XBLOCK, half.num_warps, half.XBLOCK * half.RBLOCK) == (rows, 1, 1024)
        assert configs(spec("persistent", torch.float32, rnumel=rnumel))[0].num_warps > 1
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


def test_welford_column_loops_take_small_tiles_when_the_grid_is_large() -> None:
    # Note [Welford tiles] in heuristics.py: the first kernel of a split BatchNorm statistics
    # reduction (channels-last, a Welford per channel over chunks of rows) is marked, and takes
    # the small Welford tile only with programs to spare and the switch on
    # (Note [Welford chunks] in split.py, which comes first, switched off here)
    from dataclasses import replace

    from kiln_codegen_triton import heuristics
    from kiln_codegen_triton.heuristics import configs

    def bn_stats(x: torch.Tensor) -> Any:
        xf = aten._to_copy.default(x, dtype=torch.float32)
        return aten.var.correction(xf, [0, 2, 3], correction=0), aten.mean.dim(xf, [0, 2, 3])

    x = torch.randn(2, 16, 32, 32, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    backend = TritonBackend(welford_chunks=False)
    check(bn_stats, x, device=DEVICES[0], backend=backend)
    partial = [
        launcher.spec for name, launcher in backend.last_launchers.items() if name.endswith("_partial")
    ]
    assert len(partial) == 1 and partial[0].welford and partial[0].outer and partial[0].kind == "looped"
    assert not any(
        launcher.spec.welford
        for launcher in backend.last_launchers.values()
        if launcher.spec is not partial[0]
    )
    column_sum = configs(
        replace(partial[0], welford=False, xnumel=131072, rnumel=196), rblock_cap=2048, welford_chunks=False
    )[0]
    big = configs(replace(partial[0], xnumel=131072, rnumel=196), rblock_cap=2048, welford_chunks=False)[0]
    assert (big.XBLOCK * big.RBLOCK * 2, big.num_warps) == (
        heuristics.WELFORD_TILE_BYTES,
        heuristics.WELFORD_WARPS,
    )
    assert column_sum.XBLOCK * column_sum.RBLOCK * 2 == heuristics.OUTER_TILE_BYTES
    assert (
        configs(
            replace(partial[0], xnumel=131072, rnumel=196),
            rblock_cap=2048,
            welford_tiles=False,
            welford_chunks=False,
        )[0]
        == column_sum
    )
    # short rows (49) take the small tile too since the five-shape sweep (WELFORD_MIN_ROWS = 0);
    # the constant still gates them for a sweep
    short = configs(replace(partial[0], xnumel=131072, rnumel=49), rblock_cap=2048, welford_chunks=False)[0]
    assert (short.XBLOCK * short.RBLOCK * 2, short.num_warps) == (
        heuristics.WELFORD_TILE_BYTES,
        heuristics.WELFORD_WARPS,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(heuristics, "WELFORD_MIN_ROWS", 128)
        short = configs(replace(partial[0], xnumel=131072, rnumel=49), rblock_cap=2048, welford_chunks=False)[
            0
        ]
        assert (
            short
            == configs(
                replace(partial[0], welford=False, xnumel=131072, rnumel=49),
                rblock_cap=2048,
                welford_chunks=False,
            )[0]
        )
    # too few programs for the small tile: the column-sum rule (512 columns: 8 programs)
    few = configs(partial[0], rblock_cap=2048, welford_chunks=False)[0]
    assert few == configs(replace(partial[0], welford=False), rblock_cap=2048, welford_chunks=False)[0]
    # results equal eager with the switch off too
    check(bn_stats, x, device=DEVICES[0], backend=TritonBackend(welford_tiles=False, welford_chunks=False))


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
    # the session's cache also holds the records of other tests (a matmul template's choice has
    # no "config"), in no fixed order: count the kernels' records only
    records = [json.loads(p.read_text()) for p in (Path(cache_root) / "triton" / "autotune").glob("*.json")]
    assert len([r for r in records if "config" in r]) >= tuned
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
    from kiln_loopir.wrapper_support import wrapper_namespace

    _flat = wrapper_namespace()["_flat"]  # Note [The names every wrapper uses]
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


@pytest.mark.parametrize("device", DEVICES)
def test_an_input_differing_only_in_size_one_strides_is_not_copied(device: str) -> None:
    """Note [A lean wrapper]: a dim of one element is never stepped over, so the input check
    compares strides on the other dims only (a saved BatchNorm statistic of shape (1, C, 1, 1) was
    copied on every backward call); a stride that does matter still gets the input copied."""

    def f(x: Any, y: Any) -> Any:
        return aten.mul.Tensor(x, y)

    x, y = to_device([make((1, 8, 1, 1)), make((2, 8, 3, 3))], device)
    backend = TritonBackend()
    compiled = compile_graph(torch.fx.symbolic_trace(f), [x, y], backend=backend)
    assert "x.stride(1) != 1 or" in backend.last_wrapper and "x.stride() !=" not in backend.last_wrapper
    odd = torch.empty_strided((1, 8, 1, 1), (1, 1, 1, 1), device=device).copy_(x)  # as the forward returns it
    sliced = torch.cat([x, x], dim=1)[:, ::2]  # stride 2 on the dim of 8: must be copied
    assert sliced.stride(1) == 2
    for value in (x, odd, sliced):
        torch.testing.assert_close(compiled(value, y), f(value, y))


class _NoLaunch:
    def __init__(self, real: Any = None) -> None:
        self.real = real

    def install(self, namespace: dict[str, Any], slot: str) -> None:
        namespace[slot] = lambda *args: None
        namespace.setdefault("_real_launchers", {})[slot] = self.real


def _run_kernels(captured: dict[str, Any]) -> None:
    """Make the GPU form's launches run its kernels under Triton's interpreter (Note [A GPU form
    run under the interpreter] in interp.py)."""
    namespace = captured["namespace"]
    seen = replay_gpu_form(namespace, namespace["_real_launchers"])
    call = captured["call"]
    captured["call"] = lambda *args: call(*seen(list(args)))


def _gpu_form(monkeypatch: pytest.MonkeyPatch, gm: Any, inputs: list[Any], lean: str) -> dict[str, Any]:
    """The wrapper a GPU gets for ``gm``, generated for CPU tensors with kernels not launched:
    its ``source``, ``call`` and ``namespace``."""
    from kiln_codegen_triton import wrapper as wrapper_module

    class GpuForm(wrapper_module.WrapperCodegen):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.pointers = True
            self.flat_inputs = self._inputs_needing_flat_views()
            self.namespace["_get_stream"] = lambda index: 0

    monkeypatch.setenv("KILN_LEAN_WRAPPER", lean)
    captured: dict[str, Any] = {}

    def make_wrapper(schedule: Any, graph: Any, groups: Any, launchers: Any, *a: Any, **k: Any) -> Any:
        gen = GpuForm(schedule, graph, groups, {n: _NoLaunch(r) for n, r in launchers.items()}, *a, **k)
        source = gen.generate()
        exec(compile(source, "<gpu form>", "exec"), gen.namespace)
        captured.update(source=source, call=gen.namespace["call"], namespace=gen.namespace)
        return gen.namespace["call"], source

    monkeypatch.setattr("kiln_codegen_triton.backend.make_wrapper", make_wrapper)
    compile_graph(gm, inputs, backend=TritonBackend())
    return captured


def _conv(x: Any, w: Any) -> Any:
    return aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)


def test_the_gpu_wrapper_takes_reused_buffers_and_extern_results_in_their_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note [A lean wrapper], on the wrapper a GPU gets: a buffer that takes over a freed one of
    its layout is passed to the next convolution as it is, not re-viewed; int lists are tuple
    literals; an extern result in its planned layout is taken as returned, one in other strides
    is copied into it. Switched off, the wrapper builds the views again."""

    def f(x: Any, w1: Any, w2: Any, w3: Any) -> Any:
        a = aten.relu.default(_conv(x, w1))
        b = aten.relu.default(_conv(a, w2))
        c = aten.relu.default(_conv(b, w3))
        return _conv(c, w3)

    inputs = [make((2, 4, 6, 6)), make((4, 4, 3, 3)), make((4, 4, 3, 3)), make((4, 4, 3, 3))]
    gm = torch.fx.symbolic_trace(f)
    sources = {}
    for lean in ("1", "0"):
        captured = _gpu_form(monkeypatch, gm, inputs, lean)
        sources[lean] = captured["source"]
        want = gm(*inputs)
        out = captured["call"](*inputs)
        assert out.shape == want.shape and out.stride() == want.stride()
        # an extern result in other strides than planned is copied into the planned layout
        namespace = captured["namespace"]
        last = max(
            (s for s in namespace if s.startswith("_op_")), key=lambda s: int(s.removeprefix("_op_extern"))
        )
        other = want.to(memory_format=torch.channels_last) if want.is_contiguous() else want.contiguous()
        namespace[last] = lambda *args, other=other, **kwargs: other
        out = captured["call"](*inputs)
        assert out.stride() == want.stride() and out.data_ptr() != other.data_ptr()
        torch.testing.assert_close(out, want)
    lean, full = sources["1"], sources["0"]
    assert "reuses" in lean and "[1, 1]" not in lean and "(1, 1)" in lean, lean
    views = [src.count(".as_strided(") + src.count("_reinterpret(") for src in (lean, full)]
    assert views[0] < views[1], (lean, full)
    assert "= _r if _r.shape ==" in lean and "= _r if" not in full


def test_the_gpu_wrapper_takes_an_extern_result_differing_only_in_size_one_strides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note [A lean wrapper]: a convolution result of shape (N, C, 1, 1) read by the next
    convolution is taken as returned when its strides differ from the planned ones only on the
    size-one dims (it was copied on every call); the graph's output keeps eager's strides."""

    def f(x: Any, w1: Any, w2: Any) -> Any:
        return _conv(aten.relu.default(_conv(x, w1)), w2)

    inputs = [make((2, 4, 1, 1)), make((4, 4, 3, 3)), make((4, 4, 3, 3))]
    gm = torch.fx.symbolic_trace(f)
    captured = _gpu_form(monkeypatch, gm, inputs, "1")
    namespace, want = captured["namespace"], gm(*inputs)
    first = min(
        (s for s in namespace if s.startswith("_op_")), key=lambda s: int(s.removeprefix("_op_extern"))
    )
    odd = torch.empty_strided((2, 4, 1, 1), (4, 1, 7, 5))
    namespace[first] = lambda *args, **kwargs: odd
    copies: list[Any] = []
    dense = namespace["_dense"]
    namespace["_dense"] = lambda *args: copies.append(args) or dense(*args)
    out = captured["call"](*inputs)
    assert copies == [] and out.shape == want.shape and out.stride() == want.stride()


@pytest.mark.parametrize("gpu_form", [False, True])
def test_views_and_allocations_without_torchs_python_layer(
    monkeypatch: pytest.MonkeyPatch, gpu_form: bool
) -> None:
    """Note [Allocations and views without torch's Python layer]: an extern op's arguments that
    view an input of nonzero storage offset, or another op's result, are built by
    ``_reinterpret`` with the offset relative to the variable's own; buffers by ``_alloc``. The
    results equal eager's, strides included, and equal the wrapper's with the switch off. A
    graph output that views a buffer is still an ``as_strided`` view (it shares the version
    counter of what it views)."""

    def f(x: Any, w: Any, v: Any) -> Any:
        h = aten.mm.default(aten.view.default(x, [6, 4]), aten.permute.default(w, [1, 0]))  # (6, 5)
        g = aten.mm.default(aten.permute.default(h, [1, 0]), v)  # (5, 3): a view of a result
        r = aten.relu.default(g)
        return aten.permute.default(r, [1, 0]), aten.slice.Tensor(h, 0, 1, 4)

    # the wrapper as compiled for the session's device (CPU tensors need the interpreter); the
    # GPU form is generated for CPU tensors
    device = "cpu" if gpu_form else DEVICES[0]
    base = make((30,)).to(device)
    x = base[6:].view(2, 3, 4)  # storage offset 6
    inputs = [x, make((5, 4)).to(device), make((6, 3)).to(device)]
    gm = torch.fx.symbolic_trace(f)
    want = gm(*inputs)
    sources = {}
    for direct in ("1", "0"):
        monkeypatch.setenv("KILN_DIRECT_CALLS", direct)
        if gpu_form:
            captured = _gpu_form(monkeypatch, gm, inputs, "1")
            source, call = captured["source"], captured["call"]
        else:
            backend = TritonBackend()
            call = compile_graph(gm, inputs, backend=backend)
            source = backend.last_wrapper
        sources[direct] = source
        got = call(*inputs)
        for g, w in zip(got, want, strict=True):
            assert (
                g.shape == w.shape and g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
            )
            if not gpu_form or g is got[1]:  # the GPU form's kernels are not launched (relu)
                torch.testing.assert_close(g, w)
    fast, slow = sources["1"], sources["0"]
    assert "_reinterpret(x, (6, 4), (4, 1), 0)" in fast or gpu_form is False, fast
    assert "_reinterpret(" in fast and "_reinterpret(" not in slow, fast
    assert "_alloc(" in fast and "_alloc(" not in slow, fast
    assert fast.splitlines()[-1].count(".as_strided(") == slow.splitlines()[-1].count(".as_strided(")


@pytest.mark.parametrize("switch", ["1", "0"])
def test_the_gpu_wrapper_checks_inputs_the_forward_laid_out_for_their_offset_only(
    monkeypatch: pytest.MonkeyPatch, switch: str
) -> None:
    """Note [Inputs the forward laid out]: a backward graph's input that kiln_aotgrad lists as laid
    out by the compiled forward is checked for its storage offset only (a moved one is still
    copied into place); the others in full. ``KILN_LAID_OUT_INPUTS=0`` checks all in full."""

    def f(x: Any, y: Any) -> Any:
        return aten.mm.default(aten.relu.default(x), y)

    x, y = make((4, 6)), make((6, 3))
    gm = torch.fx.symbolic_trace(f)
    gm.meta["laid_out_inputs"] = (0,)
    monkeypatch.setenv("KILN_LAID_OUT_INPUTS", switch)
    captured = _gpu_form(monkeypatch, gm, [x, y], "1")
    source = captured["source"]
    if switch == "1":
        assert "if x.storage_offset() != 0: x = _conform(" in source and "x.stride()" not in source, source
    else:
        assert "x.stride()" in source, source
    assert "y.stride()" in source, source
    conformed: list[str] = []
    conform = captured["namespace"]["_conform"]
    captured["namespace"]["_conform"] = lambda t, *a, **k: conformed.append(k["name"]) or conform(t, *a, **k)
    shifted = torch.cat([torch.zeros(1, 6), x])[1:]  # the same layout at offset 6: copied
    captured["call"](shifted, y)
    assert conformed == ["x"]


def test_the_gpu_wrapper_allocates_a_buffer_as_its_readers_view_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Buffers in the shape their readers view them on a GPU]: an activation (2, 3, 8) that
    three GEMMs read as (6, 8) is allocated as (6, 8) and passed to each as it is, over the memory
    the kernel writes, instead of a view per GEMM per call; switched off, the views come back."""

    def f(x: Any, w1: Any, w2: Any, w3: Any) -> Any:
        a = aten.view.default(aten.relu.default(x), [6, 8])
        return tuple(aten.mm.default(a, aten.t.default(w)) for w in (w1, w2, w3))

    inputs = [make((2, 3, 8)), make((8, 8)), make((8, 8)), make((8, 8))]
    gm = torch.fx.symbolic_trace(f)
    for on in ("1", "0"):
        monkeypatch.setenv("KILN_VIEWED_BUFFERS", on)
        captured = _gpu_form(monkeypatch, gm, inputs, "1")
        source, namespace = captured["source"], captured["namespace"]
        written, read = [], []
        for slot in [s for s in namespace if s.startswith("_k")]:
            namespace[slot] = lambda stream, *pointers, w=written: w.append(pointers[-1])  # its output

        for slot in [s for s in namespace if s.startswith("_op_")]:

            def gemm(a: Any, b: Any, op: Any = namespace[slot], read: list[Any] = read) -> Any:
                read.append((a.data_ptr(), a.shape, a.stride()))
                return op(a, b)

            namespace[slot] = gemm
        outs = captured["call"](*inputs)
        assert len(outs) == 3 and all(o.shape == (6, 8) for o in outs)
        assert len(written) == 1 and read == [(written[0], (6, 8), (8, 1))] * 3, (written, read)
        views = [line for line in source.splitlines() if "_op_" in line and "_reinterpret(buf" in line]
        if on == "1":
            assert "_alloc((6, 8), (8, 1)" in source and not views, source
        else:
            assert "_alloc((2, 3, 8), (24, 8, 1)" in source and len(views) == 3, source


@pytest.mark.skipif(
    DEVICES != ["cpu"],
    reason="runs the GPU form's kernels through Triton's interpreter on CPU tensors, which a process "
    "that compiles for a GPU cannot; on a GPU every other test runs that form for real",
)
def test_the_gpu_wrapper_with_its_kernels_run_gives_eagers_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU form of a transformer-like block (a norm, GEMMs that view its result, an activation
    between them, a residual) with its kernels run under the interpreter on the memory its pointers
    start, against eager: Note [Buffers in the shape their readers view them on a GPU] on and off,
    Note [A lean wrapper] on and off."""

    def f(x: Any, w1: Any, w2: Any, w3: Any) -> Any:
        h = aten.relu.default(aten.add.Tensor(x, 1.0))  # (2, 3, 8), read by two GEMMs as (6, 8)
        a = aten.mm.default(aten.view.default(h, [6, 8]), aten.t.default(w1))
        b = aten.mm.default(aten.view.default(h, [6, 8]), aten.t.default(w2))
        g = aten.mul.Tensor(aten.sigmoid.default(a), b)  # (6, 16), read by a GEMM as it is
        out = aten.mm.default(g, aten.t.default(w3))
        return aten.add.Tensor(aten.view.default(out, [2, 3, 8]), x), aten.view.default(g, [2, 3, 16])

    inputs = [make((2, 3, 8)), make((16, 8)), make((16, 8)), make((8, 16))]
    gm = torch.fx.symbolic_trace(f)
    want = gm(*inputs)
    for viewed, lean in (("1", "1"), ("0", "1"), ("1", "0")):
        monkeypatch.setenv("KILN_VIEWED_BUFFERS", viewed)
        captured = _gpu_form(monkeypatch, gm, inputs, lean)
        _run_kernels(captured)
        got = captured["call"](*inputs)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.stride() == w.stride(), (viewed, lean)
            torch.testing.assert_close(g, w)


def test_a_declined_kernel_gets_flat_storage_of_a_buffer_that_took_over_a_shaped_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Note [A lean wrapper]: on a GPU a buffer may take over a freed one that was allocated in its
    own shape (read by a convolution as it is); a buffer of another layout that reuses it holds that
    shaped tensor, and a kernel the generator declined (loopir's interpreter, which indexes flat
    storage) must get it flattened. It was handed the 4-D tensor (layout_fuzz.py seed 306: the
    interpreter's flat write raised)."""
    from kiln_codegen_triton import backend as backend_module
    from kiln_codegen_triton.kernel import CodegenUnsupported

    def f(x: Any, w: Any, w2: Any) -> Any:
        a = aten.relu.default(x)  # (2, 4, 6, 6), read by the convolution as it is
        c = _conv(a, w)
        b = aten.mul.Tensor(aten.view.default(c, [8, 36]), 2.0)  # may take over a's memory
        return aten.mm.default(aten.t.default(b), w2)  # b read through a view

    def declined(*args: Any, **kwargs: Any) -> Any:
        raise CodegenUnsupported("declined by the test")

    inputs = [make((2, 4, 6, 6)), make((4, 4, 3, 3)), make((8, 5))]
    gm = torch.fx.symbolic_trace(f)
    want = gm(*inputs)
    monkeypatch.setattr(backend_module, "build_kernel", declined)
    monkeypatch.setenv("KILN_VIEWED_BUFFERS", "0")  # b in its own layout, not as the GEMM views it
    captured = _gpu_form(monkeypatch, gm, inputs, "1")
    source = captured["source"]
    assert "buf4 = buf1  # reuses buf1\n" in source and "reference interpreter" in source, source
    got = captured["call"](*inputs)  # no Triton kernel: the interpreter runs every one
    torch.testing.assert_close(got, want)
