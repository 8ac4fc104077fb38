"""Reports of a benchmark run: a terminal table, JSON, and a PNG bar chart of speedups."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from kiln_bench.harness import Result, geomean


def summary(results: Sequence[Result]) -> dict[str, dict[str, Any]]:
    """Per (mode, backend): geomean speedup over passing models, median compile time, pass count."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        key = f"{r.mode}/{r.backend}"
        entry = out.setdefault(key, {"speedups": [], "compile_s": [], "passed": 0, "total": 0})
        entry["total"] += 1
        if r.ok and r.speedup is not None:
            entry["passed"] += 1
            entry["speedups"].append(r.speedup)
        if r.compile_s is not None:
            entry["compile_s"].append(r.compile_s)
    for entry in out.values():
        entry["geomean_speedup"] = geomean(entry.pop("speedups"))
        times = sorted(entry.pop("compile_s"))
        entry["median_compile_s"] = times[len(times) // 2] if times else None
    return out


def _ablation_ms(r: Result) -> float:
    """The time an ablation compares: the GPU's busy time per call where the run was profiled on
    a GPU (a default-mode call on the H200 is bound by its host, whose noise swamps what one pass
    changes in the kernels), else the median wall time."""
    busy = ((r.extra or {}).get("profile") or {}).get("busy_ms")
    return float(busy) if busy else float(r.compiled_ms or 0.0)


def ablation_table(results: Sequence[Result]) -> str:
    """Note [The ablation] in backends.py: per kiln variant (``kiln:MODE:option=value``), the
    geomean over models of its time (:func:`_ablation_ms`: GPU busy time when profiled) divided
    by plain ``kiln:MODE``'s (above 1: the switched-off pass was saving that much), the worst
    model, and its geomean speedup over eager. Empty when the run has no variants."""
    base: dict[tuple[str, str, str], float] = {}
    for r in results:
        if r.ok and _ablation_ms(r) and r.backend.count(":") < 2:
            base[(r.model, r.mode, r.backend.rstrip(":"))] = _ablation_ms(r)
    rows: dict[tuple[str, str], list[tuple[str, float, float]]] = {}
    for r in results:
        if r.backend.count(":") < 2:
            continue
        name, mode, _ = r.backend.split(":", 2)
        plain = f"{name}:{mode}" if mode else name
        ref = base.get((r.model, r.mode, plain))
        entry = rows.setdefault((r.mode, r.backend), [])
        if r.ok and _ablation_ms(r) and ref and r.speedup:
            entry.append((r.model, _ablation_ms(r) / ref, r.speedup))
    if not rows:
        return ""
    lines = [f"{'mode':<10} {'variant':<44} {'models':>6} {'time / kiln':>11} {'speedup':>8}  worst model"]
    for (mode, backend), entries in rows.items():
        ratio = geomean([e[1] for e in entries])
        speed = geomean([e[2] for e in entries])
        worst = max(entries, key=lambda e: e[1], default=None)
        lines.append(
            f"{mode:<10} {backend:<44} {len(entries):>6} {format(ratio, '11.3f') if ratio else '-':>11} "
            f"{format(speed, '8.3f') if speed else '-':>8}  "
            + (f"{worst[0]} {worst[1]:.3f}" if worst else "-")
        )
    return "\n".join(lines)


def _graphs(r: Result) -> str:
    """'graphs/breaks' for a backend that reports them (kiln), '-' otherwise."""
    if "graphs" not in r.extra:
        return "-"
    text = f"{r.extra['graphs']}/{r.extra.get('graph_breaks', 0)}"
    if r.extra.get("graphs_fell_back"):
        text += f" ({r.extra['graphs_fell_back']} fell back)"
    return text + (
        f" ({r.extra['frames_not_captured']} eager frames)" if r.extra.get("frames_not_captured") else ""
    )


def _fell_back(r: Result) -> str:
    """Why kiln ran graphs of this row unfused ('' when none did)."""
    reasons = r.extra.get("fell_back") or []
    return "fell back: " + "; ".join(str(why)[:160] for why in reasons) if reasons else ""


# kiln's compile phases in pipeline order (kiln.backends.PHASES).
_PHASE_ORDER = ("capture", "aotgrad", "lower", "schedule", "codegen", "compile", "first run")


def _phases(r: Result) -> str:
    phases = r.extra.get("phases_s") or {}
    return " ".join(f"{k} {phases[k]:.2f}" for k in _PHASE_ORDER if phases.get(k, 0.0) >= 0.005)


def table(results: Sequence[Result]) -> str:
    bw = max([9, *(len(r.backend) for r in results)])
    lines = [
        f"{'model':<11} {'mode':<10} {'backend':<{bw}} {'result':<6} {'compile s':>9} {'eager ms':>9} {'ms':>9} "
        f"{'speedup':>8}  {'graphs/breaks':<14} compile s by phase / reason"
    ]
    for r in results:

        def num(v: float | None, fmt: str) -> str:
            return format(v, fmt) if v is not None else format("-", ">" + fmt.split(".", maxsplit=1)[0])

        lines.append(
            f"{r.model:<11} {r.mode:<10} {r.backend:<{bw}} {'ok' if r.ok else 'FAIL':<6} {num(r.compile_s, '9.2f')} "
            f"{num(r.eager_ms, '9.2f')} {num(r.compiled_ms, '9.2f')} {num(r.speedup, '8.2f')}  "
            f"{_graphs(r):<14} {r.reason or _fell_back(r) or _phases(r)}"
        )
    lines.append("")
    for key, s in summary(results).items():
        gm = s["geomean_speedup"]
        mc = s["median_compile_s"]
        lines.append(
            f"{key:<20} passed {s['passed']}/{s['total']}  geomean speedup "
            f"{format(gm, '.3f') if gm is not None else '-'}  median compile "
            f"{format(mc, '.2f') + ' s' if mc is not None else '-'}"
        )
    return "\n".join(lines)


def metadata(settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        **settings,
    }


def write_json(path: Path, results: Sequence[Result], settings: dict[str, Any]) -> None:
    payload = {
        "metadata": metadata(settings),
        "summary": summary(results),
        "results": [r.to_json() for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def write_png(path: Path, results: Sequence[Result]) -> None:
    """Grouped bars: one group per model and mode, one bar per compiled backend (failures at 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compiled = [r for r in results if r.backend != "eager"]
    groups = sorted({(r.model, r.mode) for r in compiled})
    names = sorted({r.backend for r in compiled})
    by_key = {(r.model, r.mode, r.backend): r for r in compiled}
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(groups) * max(len(names), 1)), 4))
    for i, backend in enumerate(names):
        heights = []
        for model, mode in groups:
            r = by_key.get((model, mode, backend))
            heights.append(r.speedup if r is not None and r.ok and r.speedup is not None else 0.0)
        ax.bar([g + i * width for g in range(len(groups))], heights, width, label=backend)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([g + width * (len(names) - 1) / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{m}\n{mode[:5]}" for m, mode in groups], fontsize=8)
    ax.set_ylabel("speedup over eager (0 = failed)")
    if names:
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
