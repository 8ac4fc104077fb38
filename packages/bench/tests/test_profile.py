"""The profile view: aggregation of profiler events (CUDA ones synthetic, as torch.profiler builds
them), and `--profile` end to end on the CPU."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from kiln_bench.__main__ import main
from kiln_bench.backends import ABLATION, ablation_variants, parse, variant_options
from kiln_bench.harness import run_model
from kiln_bench.profile import CALL, EAGER, eager_same_calls, median_call, summarize, table

_ids = itertools.count(1)


def _gpu(
    name: str, start: float, end: float, activity: str = "kernel", annotation: bool = False
) -> FunctionEvent:
    return FunctionEvent(
        next(_ids), name, thread=7, start_us=start, end_us=end, use_device="cuda",
        device_type=DeviceType.CUDA, activity_type=activity, is_user_annotation=annotation,
    )  # fmt: skip


def _cpu(
    name: str, start: float, end: float, children: tuple[FunctionEvent, ...] = (), annotation: bool = False
) -> FunctionEvent:
    activity = "user_annotation" if annotation else "cpu_op"
    e = FunctionEvent(
        next(_ids), name, thread=1, start_us=start, end_us=end, activity_type=activity,
        is_user_annotation=annotation,
    )  # fmt: skip
    for c in children:
        e.append_cpu_child(c)
        c.set_cpu_parent(e)
    return e


def test_cuda_kernels_are_summed_per_call_and_ranked() -> None:
    # two calls: per call a 30 us and a 10 us kernel, a 5 us copy; an annotation spanning them,
    # and the CPU side (launches) that is not device time
    events = []
    for base in (0.0, 1000.0):
        events += [
            _gpu("triton_poi_fused_gelu_view_0", base + 100, base + 130),
            _gpu("triton_red_fused_sum_1", base + 125, base + 135),  # overlaps the first by 5 us
            _gpu("Memcpy HtoD (Pageable -> Device)", base + 200, base + 205, activity="gpu_memcpy"),
            _gpu("kiln:call", base + 90, base + 300, activity="gpu_user_annotation", annotation=True),
            _cpu("cudaLaunchKernel", base, base + 50),  # CPU side: not device time
        ]
    p = summarize(events, calls=2, wall_ms=0.5, cuda=True)
    assert p.unit == "kernel" and p.calls == 2
    assert p.launches == 2.0 and p.copies == 1.0
    assert p.device_ms == pytest.approx(0.040)  # kernels only: 30 + 10 us
    assert p.busy_ms == pytest.approx(0.040)  # union: 100..135 and 200..205
    assert p.idle_share == pytest.approx(1 - 0.040 / 0.5)
    names = [h.name for h in p.top]
    assert names == [
        "triton_poi_fused_gelu_view_0",
        "triton_red_fused_sum_1",
        "Memcpy HtoD (Pageable -> Device)",
    ]
    assert [h.share for h in p.top] == pytest.approx([30 / 45, 10 / 45, 5 / 45])
    assert p.top[0].ms_per_call == pytest.approx(0.030) and p.top[0].count_per_call == 1.0


def test_cuda_top_is_capped_at_five_and_idle_never_negative() -> None:
    events = [_gpu(f"k{i}", 10.0 * i, 10.0 * i + i + 1) for i in range(8)]
    p = summarize(events, calls=1, wall_ms=0.001, cuda=True)
    assert [h.name for h in p.top] == ["k7", "k6", "k5", "k4", "k3"]
    assert p.idle_share == 0.0
    assert summarize([], calls=3, wall_ms=None, cuda=True).idle_share is None


def test_cpu_ops_count_self_time_and_leaves() -> None:
    mm = _cpu("aten::mm", 10, 50)
    kernel = _cpu("kiln:cpp_fused_add_0", 60, 70, annotation=True)  # a leaf range: a C++ kernel
    theirs = _cpu("graph_0_cpp_fused_mul_1", 72, 77)  # torch.compile's C++ kernel range
    linear = _cpu("aten::linear", 5, 55, (mm,))
    guard = _cpu("TorchDynamo Cache Lookup", 0, 4)
    wrapper = _cpu("## Call CompiledFxGraph ##", 4, 90, (linear, kernel, theirs))
    events = [guard, wrapper, linear, mm, kernel, theirs, _gpu("never counted on the CPU", 0, 1000)]
    p = summarize(events, calls=1, wall_ms=0.08, cuda=False, profiled_wall_ms=0.1)
    assert p.unit == "op"
    # linear's self time is 50 - 40; the guard and the wrapper's own time are runtime, not ops
    assert p.device_ms == pytest.approx((10 + 40 + 10 + 5) / 1e3)
    assert p.launches == 3.0  # the leaf ops: mm and the two kernels
    assert p.idle_share == pytest.approx(1 - 0.065 / 0.1)  # of the profiled call's own wall
    assert [h.name for h in p.top] == [
        "aten::mm",
        "aten::linear",
        "kiln:cpp_fused_add_0",
        "graph_0_cpp_fused_mul_1",
    ]
    unprofiled = summarize(events, calls=1, wall_ms=0.08, cuda=False)
    assert unprofiled.idle_share == pytest.approx(1 - 0.065 / 0.08)


def test_the_median_call_is_reported_not_a_preempted_one() -> None:
    # three calls, each in its range: kernels of 10, 12 and 90 us (the last call was preempted)
    events = []
    for base, (kernel_us, wall_us) in zip(
        (0.0, 1000.0, 2000.0), ((10, 100), (12, 120), (90, 900)), strict=True
    ):
        events += [
            _cpu(CALL, base, base + wall_us, (), annotation=True),
            _cpu("aten::add", base + 1, base + 5),
            _gpu("triton_poi_fused_add_0", base + 20, base + 20 + kernel_us),
            _gpu(CALL, base + 19, base + 20 + kernel_us, activity="gpu_user_annotation", annotation=True),
        ]
    p = median_call(events, wall_ms=0.1, cuda=True)
    assert p.calls == 3 and p.launches == 1.0
    assert p.device_ms == pytest.approx(0.012) and p.profiled_wall_ms == pytest.approx(0.120)
    assert p.idle_share == pytest.approx(1 - 0.012 / 0.1)
    cpu = median_call(events, wall_ms=None, cuda=False)
    assert cpu.device_ms == pytest.approx(0.004) and [h.name for h in cpu.top] == ["aten::add"]
    assert cpu.idle_share == pytest.approx(1 - 0.004 / 0.120)  # the call's own wall


def test_eager_steps_profiled_between_the_calls_are_reported_apart() -> None:
    """Note [Eager in the same calls]: a compiled call, then an eager step, three times; each side
    is summarized from its own ranges only, and eager's median step gives the ms of the compiled
    row's ops."""
    events = []
    calls = ((40, 30, 200), (44, 33, 210), (90, 70, 280))  # (mm us, eager's mm us, eager's wall us)
    for base, (mm_us, eager_mm_us, eager_us) in zip((0.0, 1000.0, 2000.0), calls, strict=True):
        events += [
            _cpu(EAGER, base, base + eager_us, (), annotation=True),
            _cpu("aten::mm", base + 10, base + 10 + eager_mm_us),
            _cpu("aten::mul", base + 100, base + 120),
            _cpu(CALL, base + 300, base + 400 + mm_us, (), annotation=True),
            _cpu("aten::mm", base + 310, base + 310 + mm_us),
            _cpu("kiln:cpp_fused_mul_0", base + 360, base + 365, annotation=True),
        ]
    p = median_call(events, wall_ms=0.2, cuda=False)
    assert p.calls == 3 and p.launches == 2.0  # eager's ops are not the call's
    assert p.device_ms == pytest.approx((44 + 5) / 1e3) and p.profiled_wall_ms == pytest.approx(0.144)
    same = eager_same_calls(events, [h.name for h in p.top])
    assert same is not None
    assert same["profiled_wall_ms"] == pytest.approx(0.21)  # eager's median step, the second
    assert same["device_ms"] == pytest.approx((33 + 20) / 1e3)
    assert same["top_ms"] == pytest.approx({"aten::mm": 0.033, "kiln:cpp_fused_mul_0": 0.0})
    assert eager_same_calls([e for e in events if e.name != EAGER], ["aten::mm"]) is None
    row = summarize(events[3:6], calls=1, wall_ms=0.2, cuda=False, profiled_wall_ms=0.14).to_json()
    row["eager_same_calls"] = same
    lines = table([("gpt2", "training", "kiln", row, "")]).splitlines()
    assert lines[3].split()[:2] == ["0.210", "0.053"]  # under prof ms and dev ms
    assert lines[0].index("prof ms") + 7 == lines[3].index("0.210") + 5
    assert lines[3].endswith("eager, same calls (ms, this row vs eager): aten::mm 0.040 vs 0.033")
    assert lines[-1].startswith("eager, same calls:")


def test_table_prints_a_line_per_backend_and_its_kernels() -> None:
    events = [_gpu("triton_poi_fused_add_0", 0, 20)]
    p = summarize(events, calls=1, wall_ms=0.1, cuda=True, profiled_wall_ms=0.25).to_json()
    p["host_ms"] = 0.04
    rows = [
        ("gpt2", "inference", "kiln:reduce-overhead", p, ""),
        ("gpt2", "inference", "inductor", None, "Err: x"),
    ]
    lines = table(rows).splitlines()
    assert lines[0].index("wall ms") + 7 == lines[1].index("0.100") + 5  # right-aligned columns
    assert lines[1].split()[:9] == [
        "gpt2", "inference", "kiln:reduce-overhead", "0.100", "0.040", "0.250", "0.020", "1.0", "80.0%",
    ]  # fmt: skip
    # GPU idle is against the harness's wall, not the profiled calls'
    assert lines[1].endswith("100.0% triton_poi_fused_add_0")
    assert lines[2].endswith("by family: generated 1 / 0.02 ms")
    assert lines[3].endswith("Err: x") and lines[-1].startswith("CUDA:")


def test_profile_flag_end_to_end_on_the_cpu(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    for var in ("KILN_PROFILE", "TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"):
        monkeypatch.setenv(var, "1")  # what --profile sets, undone after the test
    out = tmp_path / "profile"
    argv = ["--models", "mlp", "--modes", "inference", "--backends", "eager,kiln", "--profile"]
    argv += ["--repeats", "3", "--warmup", "1", "--profile-calls", "2", "--out", str(out)]
    assert main(argv) == 0
    payload = json.loads(out.with_suffix(".json").read_text())
    assert payload["metadata"]["profile_calls"] == 2
    by_backend = {r["backend"]: r for r in payload["results"]}
    for backend, r in by_backend.items():
        assert r["ok"], r["reason"]
        p = r["extra"]["profile"]
        assert p["unit"] == "op" and p["calls"] == 2 and p["wall_ms"] == r["compiled_ms"]
        assert p["profiled_wall_ms"] > 0
        assert p["device_ms"] > 0 and p["launches"] >= 1 and 0.0 <= p["idle_share"] <= 1.0
        assert 1 <= len(p["top"]) <= 5
        assert all(0 < h["share"] <= 1 and h["ms_per_call"] > 0 for h in p["top"]), backend
        assert sum(h["share"] for h in p["top"]) <= 1 + 1e-9
    kiln_top = [h["name"] for h in by_backend["kiln"]["extra"]["profile"]["top"]]
    assert any(n.startswith("kiln:cpp_fused_") for n in kiln_top), kiln_top
    # Note [Eager in the same calls]: the compiled row only, with eager's ms of its slowest ops
    assert by_backend["eager"]["extra"]["profile"]["eager_same_calls"] is None
    same = by_backend["kiln"]["extra"]["profile"]["eager_same_calls"]
    assert same["profiled_wall_ms"] > 0 and same["device_ms"] > 0 and list(same["top_ms"]) == kiln_top
    printed = capsys.readouterr().out
    assert "slowest, with their share of device time" in printed and "kiln:cpp_fused_" in printed
    assert "eager, same calls:" in printed


def test_backends_take_a_compile_mode() -> None:
    assert parse("kiln:reduce-overhead") == ("kiln", "reduce-overhead")
    assert parse("inductor") == ("inductor", None)
    for bad in ("eager:reduce-overhead", "kiln:fast", "tvm"):
        with pytest.raises(KeyError):
            parse(bad)
    with pytest.raises(SystemExit):
        main(["--backends", "kiln:fast"])
    (result,) = run_model("mlp", "inference", ["kiln:reduce-overhead"], repeats=1, warmup=0)
    assert result.ok and result.backend == "kiln:reduce-overhead", result.reason
    assert result.extra["graphs"] == 1  # kiln's compile details, found under the mode too


def test_a_kiln_variant_carries_its_options_to_kiln_compile() -> None:
    assert variant_options("kiln::layout=False+triton.allow_tiling=False+cpp.weighted_work=False") == {
        "layout": False,
        "triton_options": {"allow_tiling": False},
        "cpp_options": {"weighted_work": False},
    }
    assert parse("kiln:reduce-overhead:pad_mm=False") == ("kiln", "reduce-overhead")
    for bad in ("inductor::layout=False", "kiln::layout", "kiln::layout=nope", "kiln::x.y=1"):
        with pytest.raises(KeyError):
            parse(bad)
    # the option reaches kiln.compile: a malformed value fails the compile, named in the reason
    (result,) = run_model("mlp", "inference", ["kiln::layout_policy='sideways'"], repeats=1, warmup=0)
    assert not result.ok and "layout_policy" in result.reason


def test_the_ablation_adds_one_variant_per_switch_and_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    cpu = ablation_variants("kiln", "cpu")
    assert cpu == [f"kiln::{o}={v!r}" for d, o, v in ABLATION if d == "cpu"]
    assert ablation_variants("kiln:reduce-overhead", "cuda")[0] == "kiln:reduce-overhead:layout=False"
    assert main(["--models", "mlp", "--modes", "inference", "--backends", "eager,kiln", "--ablation",
                 "--repeats", "2", "--warmup", "0"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    table = printed[printed.index("time / kiln") :]
    for variant in cpu:
        assert variant in table, (variant, table)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the CUDA path of the profile needs a GPU (H200 run)"
)
def test_profile_flag_end_to_end_on_cuda(tmp_path: Path) -> None:
    out = tmp_path / "profile"
    argv = ["--device", "cuda", "--size", "gpu", "--models", "mlp", "--modes", "inference"]
    argv += ["--backends", "eager,kiln,kiln:reduce-overhead", "--profile", "--profile-calls", "3"]
    argv += ["--repeats", "5", "--warmup", "2", "--out", str(out)]
    assert main(argv) == 0
    results = json.loads(out.with_suffix(".json").read_text())["results"]
    for r in results:
        assert r["ok"], r["reason"]
        p = r["extra"]["profile"]
        assert p["unit"] == "kernel" and p["launches"] >= 1 and 0.0 <= p["idle_share"] <= 1.0
        assert 0 < p["device_ms"] <= p["profiled_wall_ms"] * 1.05, p
        assert 1 <= len(p["top"]) <= 5 and sum(h["share"] for h in p["top"]) <= 1 + 1e-9
    for r in results[1:]:  # kiln's own kernels are named for what they fuse
        names = [h["name"] for h in r["extra"]["profile"]["top"]]
        assert any(re.match(r"triton_(poi|per|red)_fused_\w+_\d+$", n) for n in names), names
        # Note [Bandwidth of generated kernels]: the MLP's layer norms move 24 MB at gpu size
        b = r["extra"]["profile"]["bandwidth"]
        assert b is not None and b["kernels"] >= 1 and b["copy_gbps"] > 100, b


def test_cuda_kernels_are_counted_by_family() -> None:
    # Note [Kernel families]: per call, how many kernels of each kind and their time
    events = [
        _gpu("triton_poi_fused_relu_0", 0, 10),
        _gpu("triton_red_fused_sum_1", 10, 30),
        _gpu("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", 30, 70),
        _gpu("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 70, 100),
        _gpu("void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16>", 100, 105),
        _gpu("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", 105, 125),
        _gpu("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 125, 126),
        _gpu("Memset (Device)", 126, 127, activity="gpu_memset"),
    ]
    p = summarize(events, calls=1, wall_ms=0.2, cuda=True)
    assert p.families is not None
    assert {k: c for k, (c, _) in p.families.items()} == {
        "aten": 1.0,
        "attention": 1.0,
        "conv": 2.0,
        "gemm": 1.0,
        "generated": 2.0,
    }
    assert p.families["generated"][1] == pytest.approx(0.030)
    assert p.families["conv"][1] == pytest.approx(0.035)
    assert "by family: aten 1 / 0.00 ms" in table([("m", "inference", "kiln", p.to_json(), "")])
    assert summarize([], calls=1, wall_ms=None, cuda=False).families is None


def test_generated_kernels_are_set_against_the_copy_bandwidth() -> None:
    # Note [Bandwidth of generated kernels]: 1000 GB/s copy; a 32 MiB kernel at 40 us per launch
    # (839 GB/s, 84%), a 64 MiB one at 160 us (419 GB/s, 42%: below 70%), a 1 MiB one (too small
    # to count) and an extern GEMM (no bytes)
    mib = 1 << 20
    events = [
        _gpu("triton_poi_fused_add_0", 0, 40),
        _gpu("triton_poi_fused_add_0", 50, 90),
        _gpu("triton_red_fused_sum_1", 100, 260),
        _gpu("triton_poi_fused_relu_2", 300, 301),
        _gpu("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", 400, 500),
    ]
    sizes = {
        "triton_poi_fused_add_0": 32 * mib,
        "triton_red_fused_sum_1": 64 * mib,
        "triton_poi_fused_relu_2": mib,
    }
    p = summarize(events, calls=1, wall_ms=1.0, cuda=True, kernel_bytes=sizes, copy_gbps=1000.0)
    b = p.bandwidth
    assert b is not None and (b.kernels, b.at_target) == (2, 1)
    assert b.below_ms == pytest.approx(0.160)
    (slow_name, slow_mb, slow_us, slow_share), (fast_name, _, fast_us, fast_share) = b.slowest
    assert (slow_name, slow_mb, fast_name) == ("triton_red_fused_sum_1", 64.0, "triton_poi_fused_add_0")
    assert (slow_us, fast_us) == (pytest.approx(160.0), pytest.approx(40.0))
    assert slow_share == pytest.approx(64 * mib / 160e-6 / 1e12) and fast_share == pytest.approx(
        32 * mib / 40e-6 / 1e12
    )
    line = table([("m", "inference", "kiln", p.to_json(), "")])
    assert "bandwidth: 1/2 generated kernels >= 16 MB at >= 70% of copy (1000 GB/s)" in line
    assert "42% triton_red_fused_sum_1 (64 MB, 160 us)" in line
    # without bytes (torch.compile, eager, the CPU) there is no bandwidth
    assert summarize(events, calls=1, wall_ms=1.0, cuda=True).bandwidth is None
