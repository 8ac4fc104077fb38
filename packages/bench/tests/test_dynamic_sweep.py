"""The dynamic-shapes sweep runs, checks against eager, and counts compiles."""

from __future__ import annotations

from kiln_bench import dynamic


def test_sweep_counts_compiles() -> None:
    eager, compiled = dynamic.main(["--sizes", "2,3,5"])
    assert eager.backend == "kiln (eager)" and eager.compiles == 2  # static, then one dynamic graph
    # kiln's own backend compiles symbolic sizes on the CPU too: static, then one dynamic graph
    assert compiled.compiles == 2
    assert compiled.second_pass_s > 0
