"""The profile view (``python -m kiln_bench --profile``): where one compiled call's time goes.

After the harness has timed a backend (its wall ms per call: the median of interleaved timed
calls), the same step runs a few more times under ``torch.profiler``, and the events become one
:class:`Profile`: device time per call, launches per call, the share of wall time the device sat
idle, and the five slowest kernels with their share of device time.

Note [What the profile counts]:

* On CUDA the unit is a device *kernel*: an event whose ``device_type`` is CUDA. Its duration is
  ``self_device_time_total`` (the event's span on the device). Memory copies and sets
  (``gpu_memcpy`` / ``gpu_memset``, "Memcpy ..." / "Memset ...") are device time but not kernels;
  ``gpu_user_annotation`` ranges (record_function mirrored on the device timeline) span other
  kernels and are left out, or they would count twice. The device is *busy* for the union of
  those intervals (streams may overlap), and idle for ``1 - busy / wall``.
* On the CPU the unit is an *op*: a synchronous CPU event that is an operator (its name has a
  namespace: ``aten::mm``) or a C++ kernel's range, with its ``self_cpu_time_total``.
  ``--profile`` turns on ``KILN_PROFILE=1`` and ``TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1``, so
  each C++ kernel of kiln (``kiln:cpp_fused_add_0``) and of torch.compile
  (``graph_0_cpp_fused_add_0``) is such a range; otherwise its time would belong to no op. Other
  ranges (torch.compile's "Torch-Compiled Region", "## Call CompiledFxGraph ##", "TorchDynamo
  Cache Lookup") are the runtime between ops, as kiln's guard and wrapper are, which have no
  range. Launches are the leaf ops, busy is the sum of self times, and idle is the time in no op
  (Python, guards, wrappers), against the profiled call's own wall: the profiler slows ops and
  Python down alike, not so the harness's calls.

Each profiled call runs inside a ``kiln_bench::call`` range, and the figures are those of the
median call (Note [The median call]); ``summarize`` also boils down a window of several calls,
dividing totals by their number. On CUDA idle is against the harness's wall (the profiler slows
the CPU side, not the kernels).

Note [Eager in the same calls]: on the CPU each compiled backend's profiled calls alternate with
eager's steps (each in an :data:`EAGER` range), and the row carries eager's median call beside its
own (``eager_same_calls``: its wall and op time, and its ms per call of the row's slowest op
names). Backends are timed and profiled one after another, minutes apart, and a shared host's
speed drifts over minutes: in a 16-thread GPT-2 training run (twenty-sixth session, cpu16) the
eager steps timed between kiln's took 10.55 ms against 8.71 and 8.78 in the eager and
torch.compile rows, and kiln's ``aten::mm`` read 2.98 ms a step against eager's 2.19 and
torch.compile's 1.94, though kiln hands aten eager's very products (``scripts/matmul_ab.py``).
Only figures taken in the same calls compare: a row's op slower than eager's same op *in the
row's own calls* is slower.

Note [Host time per call]: on CUDA a call's wall time is the slower of two pipelines, the host
issuing work and the GPU running it, so wall minus GPU time says little about what a backend's
own Python and launches cost. ``host_ms`` is measured apart, without the profiler: the GPU is
drained, then the time until the call *returns* (its kernels queued, not run) is taken, median
of a few calls. That is the host's cost per call, comparable between backends whatever their
kernels take; the GPU issues' target "kiln's CPU overhead per call no more than torch.compile's"
reads it.
"""

from __future__ import annotations

import bisect
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch.autograd import DeviceType

TOP = 5
# the record_function range around each profiled call
CALL = "kiln_bench::call"
# the range around each eager step profiled between a compiled backend's (Note [Eager in the same calls])
EAGER = "kiln_bench::eager"
# C++ kernel ranges: kiln's (KILN_PROFILE, "kiln:cpp_fused_add_0") and torch.compile's
# (TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE, "graph_0_cpp_fused_add_0")
KERNEL_RANGE = re.compile(r"^kiln:|(^|_)cpp_")
COPY_ACTIVITIES = frozenset({"gpu_memcpy", "gpu_memset"})
COPY_PREFIXES = ("Memcpy", "Memset")
ANNOTATION_ACTIVITIES = frozenset({"gpu_user_annotation", "user_annotation"})


# Note [Kernel families]: a CUDA kernel's family by its name, so that two backends' launches per
# call can be set side by side by where they come from (ResNet-50 training: kiln 825 launches
# against torch.compile's 691, which of them differ?). "generated": Triton kernels (kiln's and
# torch.compile's are both named triton_*); "gemm": cuBLAS/cuBLASLt/CUTLASS matmuls (nvjet, sm90
# xmma, cutlass, gemv); "conv": cuDNN and PyTorch's own convolution kernels, with cuDNN's layout
# conversions; "attention": flash/memory-efficient/cuDNN attention; "aten": the rest of eager's
# kernels (elementwise, reductions, copies by kernel, indexing); the order of the patterns decides.
FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("generated", re.compile(r"^triton_|^kiln_|^kernel\d")),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.IGNORECASE)),
    (
        "conv",
        re.compile(
            r"conv|cudnn|nchwToNhwc|nhwcToNchw|implicit_convolve|wgrad|dgrad|xmma_fprop", re.IGNORECASE
        ),
    ),
    ("gemm", re.compile(r"gemm|gemv|nvjet|cutlass|sm\d+_xmma|cublas", re.IGNORECASE)),
)


# Note [Bandwidth of generated kernels]: issue 15's target is that every generated memory-bound
# kernel moving at least 16 MB runs at 70% or more of the device's copy bandwidth. A kernel's
# bytes come from kiln's code generator (loopir's BuildReport.kernel_bytes: the storage of every
# buffer the kernel takes, at the size hints), its time from the profile: the median profiled
# call's total for that name divided by its launches. The copy bandwidth is measured once per
# process on the same device: a 256 MiB device-to-device ``copy_``, its bytes read plus written
# over the median time of a few copies. The bytes are an upper bound (a kernel that reads a slice
# of a buffer, or gathers rows of a table, is charged the whole buffer), so a kernel that reads
# less than it takes looks faster than it is; a kernel below the line is slow for certain.
# Matmul templates and extern kernels have no bytes here: they are not memory-bound kernels of
# kiln's making. A kernel name that two generated kernels of other sizes share is left out.
BANDWIDTH_MIN_BYTES = 16 << 20
BANDWIDTH_TARGET = 0.70
SLOWEST = 5


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """The generated kernels of at least :data:`BANDWIDTH_MIN_BYTES` against the copy bandwidth
    (Note [Bandwidth of generated kernels])."""

    copy_gbps: float
    kernels: int  # distinct kernel names that move at least the minimum
    at_target: int  # of those, how many reach BANDWIDTH_TARGET of copy_gbps
    below_ms: float  # ms per call of the launches below the target
    # the slowest against the copy, fewest first: (name, MB, us per launch, share of copy_gbps)
    slowest: tuple[tuple[str, float, float, float], ...]


def bandwidth(
    kernels: Sequence[Any], calls: int, kernel_bytes: Mapping[str, int], copy_gbps: float
) -> Bandwidth:
    """Note [Bandwidth of generated kernels] over ``calls`` calls' CUDA kernel events."""
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        name = str(e.name)
        if kernel_bytes.get(name, 0) >= BANDWIDTH_MIN_BYTES:
            by_name.setdefault(name, []).append(_duration_us(e, True))
    rows = []
    below_us = 0.0
    for name, durations in by_name.items():
        per_launch_us = sum(durations) / len(durations)
        gbps = kernel_bytes[name] / per_launch_us / 1e3 if per_launch_us > 0 else float("inf")
        share = gbps / copy_gbps
        if share < BANDWIDTH_TARGET:
            below_us += sum(durations)
        rows.append((name, kernel_bytes[name] / 2**20, per_launch_us, share))
    rows.sort(key=lambda row: (row[3], row[0]))
    return Bandwidth(
        copy_gbps=copy_gbps,
        kernels=len(rows),
        at_target=sum(1 for row in rows if row[3] >= BANDWIDTH_TARGET),
        below_ms=below_us / max(calls, 1) / 1e3,
        slowest=tuple(rows[:SLOWEST]),
    )


_COPY_GBPS: dict[str, float] = {}


def copy_bandwidth(device: str, nbytes: int = 256 << 20, repeats: int = 7) -> float:
    """GB/s of a device-to-device copy of ``nbytes`` (read plus written bytes over the median
    time), measured once per device and process (Note [Bandwidth of generated kernels])."""
    if device not in _COPY_GBPS:
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        _COPY_GBPS[device] = 2 * nbytes / statistics.median(times) / 1e9
        del src, dst
    return _COPY_GBPS[device]


def family(name: str) -> str:
    """The family of a CUDA kernel by its name (Note [Kernel families])."""
    for label, pattern in FAMILIES:
        if pattern.search(name):
            return label
    return "aten"


@dataclass(frozen=True, slots=True)
class Hot:
    """One kernel (or op) name among the slowest: per call, and its share of all device time."""

    name: str
    ms_per_call: float
    share: float
    count_per_call: float


@dataclass(frozen=True, slots=True)
class Profile:
    """One backend's profile; see the module docstring for what each figure counts."""

    unit: str  # "kernel" (CUDA) or "op" (CPU)
    calls: int
    wall_ms: float | None  # the harness's median wall ms per call
    profiled_wall_ms: float | None  # wall ms of the profiled call(s)
    device_ms: float  # sum of kernel (op) durations, per call
    busy_ms: float  # time the device was busy, per call
    launches: float  # kernels (leaf ops) per call
    copies: float  # memcpy/memset per call (CUDA)
    idle_share: float | None  # 1 - busy / wall
    top: tuple[Hot, ...]
    host_ms: float | None = None  # CUDA: Note [Host time per call]
    # CUDA: kernels per call and kernel ms per call by family (Note [Kernel families])
    families: dict[str, tuple[float, float]] | None = None
    # CUDA, kiln: Note [Bandwidth of generated kernels]
    bandwidth: Bandwidth | None = None
    # CPU, compiled backends: Note [Eager in the same calls]
    eager_same_calls: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _activity(event: Any) -> str:
    return str(getattr(event, "activity_type", "") or "")


def _duration_us(event: Any, device: bool) -> float:
    if device:
        span = event.time_range.end - event.time_range.start
        return float(event.self_device_time_total or span)
    return float(event.self_cpu_time_total)


def device_events(events: Iterable[Any]) -> tuple[list[Any], list[Any]]:
    """(kernels, copies) among CUDA profiler events; annotations are neither."""
    kernels, copies = [], []
    for e in events:
        if e.device_type != DeviceType.CUDA:
            continue
        if getattr(e, "is_user_annotation", False) or _activity(e) in ANNOTATION_ACTIVITIES:
            continue
        if _activity(e) in COPY_ACTIVITIES or str(e.name).startswith(COPY_PREFIXES):
            copies.append(e)
        else:
            kernels.append(e)
    return kernels, copies


def cpu_ops(events: Iterable[Any]) -> list[Any]:
    """The synchronous CPU events that are work: operators and C++ kernel ranges (see the module
    docstring); every other range is runtime glue."""
    return [
        e
        for e in events
        if e.device_type == DeviceType.CPU
        and not e.is_async
        and e.name not in (CALL, EAGER)
        and ("::" in e.name or KERNEL_RANGE.search(e.name) is not None)
    ]


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _top(events: Sequence[Any], device: bool, calls: int, total_us: float) -> tuple[Hot, ...]:
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(str(e.name), []).append(_duration_us(e, device))
    ranked = sorted(by_name.items(), key=lambda item: (-sum(item[1]), item[0]))[:TOP]
    return tuple(
        Hot(name, sum(ds) / calls / 1e3, sum(ds) / total_us if total_us else 0.0, len(ds) / calls)
        for name, ds in ranked
    )


def summarize(
    events: Iterable[Any],
    calls: int,
    wall_ms: float | None,
    *,
    cuda: bool,
    profiled_wall_ms: float | None = None,
    kernel_bytes: Mapping[str, int] | None = None,
    copy_gbps: float | None = None,
) -> Profile:
    """Boil ``calls`` calls' profiler events down to one Profile (Note [What the profile counts]);
    with ``kernel_bytes`` and ``copy_gbps``, the bandwidth of the generated kernels too."""
    events = list(events)
    calls = max(calls, 1)
    if cuda:
        kernels, copies = device_events(events)
        device_us = sum(_duration_us(e, True) for e in kernels)
        total = device_us + sum(_duration_us(e, True) for e in copies)
        busy_us = _union_us((e.time_range.start, e.time_range.end) for e in [*kernels, *copies])
        unit, launches, ranked = "kernel", len(kernels), [*kernels, *copies]
        by_family: dict[str, tuple[float, float]] = {}
        for e in kernels:
            count, ms = by_family.get(family(str(e.name)), (0.0, 0.0))
            by_family[family(str(e.name))] = (count + 1 / calls, ms + _duration_us(e, True) / calls / 1e3)
        families: dict[str, tuple[float, float]] | None = dict(sorted(by_family.items()))
        traffic = bandwidth(kernels, calls, kernel_bytes, copy_gbps) if kernel_bytes and copy_gbps else None
    else:
        ops = cpu_ops(events)
        device_us = total = busy_us = sum(_duration_us(e, False) for e in ops)
        unit, launches, ranked, copies = "op", sum(1 for e in ops if not e.cpu_children), ops, []
        families, traffic = None, None
    busy_ms = busy_us / calls / 1e3
    against = wall_ms if cuda or not profiled_wall_ms else profiled_wall_ms
    idle = max(0.0, 1.0 - busy_ms / against) if against else None
    return Profile(
        unit=unit,
        calls=calls,
        wall_ms=wall_ms,
        profiled_wall_ms=profiled_wall_ms,
        device_ms=device_us / calls / 1e3,
        busy_ms=busy_ms,
        launches=launches / calls,
        copies=len(copies) / calls,
        idle_share=idle,
        top=_top(ranked, cuda, calls, total),
        families=families,
        bandwidth=traffic,
    )


def record(
    step: Callable[[], Any], device: str, calls: int, eager: Callable[[], Any] | None = None
) -> list[Any]:
    """The profiler events of ``calls`` calls of ``step`` (warm already), each call inside a
    :data:`CALL` range and synchronized, as the harness times it; with ``eager``, an eager step
    inside an :data:`EAGER` range before each (Note [Eager in the same calls])."""
    cuda = device.startswith("cuda")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            if eager is not None:
                with torch.profiler.record_function(EAGER):
                    eager()
                    if cuda:
                        torch.cuda.synchronize()
            with torch.profiler.record_function(CALL):
                step()
                if cuda:
                    torch.cuda.synchronize()
    return list(prof.events())


def split_calls(events: Iterable[Any], name: str = CALL) -> list[tuple[float, list[Any]]]:
    """Each ``name`` range's wall ms and the events that started in it (a device kernel starts
    after its call's range opens, and the range closes after a synchronize)."""
    events = list(events)
    ranges = sorted(
        (e for e in events if e.name == name and e.device_type == DeviceType.CPU),
        key=lambda e: e.time_range.start,
    )
    starts = [r.time_range.start for r in ranges]
    per_call: list[list[Any]] = [[] for _ in ranges]
    for e in events:
        if e.name in (CALL, EAGER):
            continue
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i >= 0 and e.time_range.start <= ranges[i].time_range.end:  # not the other ranges' events
            per_call[i].append(e)
    return [
        ((r.time_range.end - r.time_range.start) / 1e3, evs) for r, evs in zip(ranges, per_call, strict=True)
    ]


def median_call(
    events: Iterable[Any],
    wall_ms: float | None,
    *,
    cuda: bool,
    kernel_bytes: Mapping[str, int] | None = None,
    copy_gbps: float | None = None,
) -> Profile:
    """Note [The median call]: the profile of the profiled call with the median wall time. On a
    shared machine one of a few calls is often preempted; a mean would carry that call into
    every figure, the median call is a real call that was not. Events without call ranges
    (synthetic ones) are summarized as one window."""
    calls = split_calls(events)
    if not calls:
        return summarize(events, 1, wall_ms, cuda=cuda, kernel_bytes=kernel_bytes, copy_gbps=copy_gbps)
    middle = sorted(calls, key=lambda call: call[0])[(len(calls) - 1) // 2]
    profile = summarize(
        middle[1],
        1,
        wall_ms,
        cuda=cuda,
        profiled_wall_ms=middle[0],
        kernel_bytes=kernel_bytes,
        copy_gbps=copy_gbps,
    )
    return replace(profile, calls=len(calls))


def eager_same_calls(events: Iterable[Any], names: Iterable[str]) -> dict[str, Any] | None:
    """Note [Eager in the same calls]: eager's median call among the :data:`EAGER` ranges of
    ``events`` (CPU): its wall ms, its op ms, and its ms of each of ``names``."""
    calls = split_calls(events, EAGER)
    if not calls:
        return None
    wall, middle = sorted(calls, key=lambda call: call[0])[(len(calls) - 1) // 2]
    by_name: dict[str, float] = {}
    for e in cpu_ops(middle):
        by_name[str(e.name)] = by_name.get(str(e.name), 0.0) + _duration_us(e, False) / 1e3
    return {
        "profiled_wall_ms": wall,
        "device_ms": sum(by_name.values()),
        "top_ms": {name: by_name.get(name, 0.0) for name in names},
    }


def host_ms(step: Callable[[], Any], calls: int) -> float:
    """Note [Host time per call]: median ms until a call returns, the GPU drained before each."""
    times = []
    for _ in range(max(calls, 1)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e3


def profile(
    step: Callable[[], Any],
    device: str,
    calls: int,
    wall_ms: float | None,
    kernel_bytes: Mapping[str, int] | None = None,
    eager: Callable[[], Any] | None = None,
) -> Profile:
    """The profile of ``step``; on the CPU with ``eager`` (a compiled backend's row), eager's
    steps profiled between its calls too (Note [Eager in the same calls])."""
    cuda = device.startswith("cuda")
    host = host_ms(step, 2 * calls + 1) if cuda else None
    copy_gbps = copy_bandwidth(device) if cuda and kernel_bytes else None
    events = record(step, device, calls, None if cuda else eager)
    p = median_call(events, wall_ms, cuda=cuda, kernel_bytes=kernel_bytes, copy_gbps=copy_gbps)
    same = eager_same_calls(events, [h.name for h in p.top]) if eager is not None and not cuda else None
    return replace(p, host_ms=host, eager_same_calls=same)


NAME_WIDTH = 90


def bandwidth_line(b: dict[str, Any]) -> str:
    """One line of the profile view for Note [Bandwidth of generated kernels]."""
    head = (
        f"bandwidth: {b['at_target']}/{b['kernels']} generated kernels >= {BANDWIDTH_MIN_BYTES >> 20} MB"
        f" at >= {BANDWIDTH_TARGET:.0%} of copy ({b['copy_gbps']:.0f} GB/s)"
    )
    if b["at_target"] == b["kernels"]:
        return head
    slow = [
        f"{share:.0%} {name[:48]} ({mb:.0f} MB, {us:.0f} us)"
        for name, mb, us, share in b["slowest"]
        if share < BANDWIDTH_TARGET
    ]
    return f"{head}; below, {b['below_ms']:.2f} ms a call: " + ", ".join(slow[:3])


def _ms(value: float | None) -> str:
    return format(value, "8.3f") if value is not None else format("-", ">8")


def table(rows: Sequence[tuple[str, str, str, dict[str, Any] | None, str]]) -> str:
    """The profile view: a line per (model, mode, backend), then its slowest kernels.

    ``rows`` are (model, mode, backend, profile JSON or None, why there is none)."""
    bw = max([9, *(len(row[2]) for row in rows)])
    lead = f"{{:<11}} {{:<10}} {{:<{bw}}} {{:>8}} {{:>8}} {{:>8}} {{:>8}} {{:>9}} {{:>6}}  {{}}"
    lines = [lead.format("model", "mode", "backend", "wall ms", "host ms", "prof ms", "dev ms", "launches",
                         "idle", "slowest, with their share of device time")]  # fmt: skip
    units = set()
    for model, mode, backend, p, reason in rows:
        if p is None:
            lines.append(lead.format(model, mode, backend, "-", "-", "-", "-", "-", "-", reason))
            continue
        units.add(p["unit"])
        idle = format(p["idle_share"], ".1%") if p["idle_share"] is not None else "-"
        hot = [f"{h['share']:6.1%} {h['name'][:NAME_WIDTH]}" for h in p["top"]] or [""]
        lines.append(
            lead.format(model, mode, backend, _ms(p["wall_ms"]), _ms(p.get("host_ms")),
                        _ms(p.get("profiled_wall_ms")), _ms(p["device_ms"]), f"{p['launches']:.1f}", idle, hot[0])
        )  # fmt: skip
        lines.extend(lead.format("", "", "", "", "", "", "", "", "", h) for h in hot[1:])
        if p.get("families"):
            parts = [f"{name} {count:.0f} / {ms:.2f} ms" for name, (count, ms) in p["families"].items()]
            lines.append(lead.format("", "", "", "", "", "", "", "", "", "by family: " + ", ".join(parts)))
        if p.get("bandwidth"):
            lines.append(lead.format("", "", "", "", "", "", "", "", "", bandwidth_line(p["bandwidth"])))
        same = p.get("eager_same_calls")
        if same:  # Note [Eager in the same calls]
            mine = {h["name"]: h["ms_per_call"] for h in p["top"]}
            ops = ", ".join(
                f"{name[:56]} {mine.get(name, 0.0):.3f} vs {ms:.3f}"
                for name, ms in same["top_ms"].items()
                if ms
            )
            lines.append(
                lead.format("", "", "", "", "", _ms(same["profiled_wall_ms"]), _ms(same["device_ms"]), "", "",
                            "eager, same calls (ms, this row vs eager): " + (ops or "none of these ops"))
            )  # fmt: skip
    lines.append("wall ms: the harness's median call; the rest: the median profiled call (prof ms its wall)")
    if "kernel" in units:
        lines.append(
            "CUDA: dev ms = GPU kernel time per call, launches = kernels per call, idle = GPU idle share of wall,"
            " host ms = until a call returns, GPU drained first (Note [Host time per call])"
        )
    if "op" in units:
        lines.append(
            "CPU: dev ms = self CPU time of ops per call, launches = leaf ops per call, "
            "idle = time in no op, of prof ms"
        )
    if any(row[3] and row[3].get("eager_same_calls") for row in rows):
        lines.append(
            "eager, same calls: eager's median step among those profiled between the row's calls: its prof ms, "
            "dev ms, and the row's slowest ops in it (compare a row's ops with these, not with another row's)"
        )
    return "\n".join(lines)
