"""The dynamic-shapes sweep runs, checks against eager, and counts compiles."""

from __future__ import annotations

from kiln_bench import dynamic


def test_sweep_counts_compiles() -> None:
    eager, compiled = dynamic.main(["--sizes", "2,3,5"])
    assert eager.backend == "kiln (eager)" and eager.compiles == 2  # static, then one dynamic graph
    # kiln's own backend compiles static per size until loopir takes symbolic sizes: the refused
    # dynamic capture, then sizes 3 and 5
    assert compiled.compiles == 4
    assert compiled.second_pass_s > 0
