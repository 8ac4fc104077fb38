"""kiln-bench: not built yet.

It will own: benchmarks: model suites and the harness that measures eager, kiln and torch.compile
in one run, with reports.
"""

__version__ = "0.1.0"
