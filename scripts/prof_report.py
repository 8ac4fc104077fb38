"""Print a cProfile dump's view of one call tree: the top functions by cumulative and own time, and
the callees of the functions named on the command line (e.g. where the Triton kernels' loads in
the parent go: ``_load``, ``warmup``).

    python -m cProfile -o /tmp/p.prof -m kiln_bench ...
    python scripts/prof_report.py /tmp/p.prof _load warmup
"""

from __future__ import annotations

import pstats
import sys


def main() -> None:
    stats = pstats.Stats(sys.argv[1])
    stats.sort_stats("cumulative").print_stats(35)
    stats.sort_stats("tottime").print_stats(30)
    for name in sys.argv[2:]:
        stats.sort_stats("cumulative").print_callees(name, 14)


if __name__ == "__main__":
    main()
