"""The umbrella's KILN_LOG artifact: `perf`, one line per compiled graph with its time per phase
(capture, aotgrad, lower, schedule, codegen, compile, and whether the compile came from a cache;
Note [Compile time by phase] in backends.py), through the stdlib logger `kiln.perf`. Each package configures its own
artifacts (dynamo: graph, guards, ...; loopir: ir, schedule, passes; codegen_cpp: output_code)."""

from __future__ import annotations

import logging

from kiln_dynamo import configure_artifacts

perf_log = logging.getLogger("kiln.perf")
# why a graph with symbolic sizes was compiled static instead (KILN_LOG=dynamic)
dynamic_log = logging.getLogger("kiln.dynamic")


def configure(spec: str | None = None) -> bool:
    """Turn on `perf` if `spec` (default: $KILN_LOG) names it or `all`; returns whether it is on."""
    enabled = configure_artifacts({"perf": "kiln.perf", "dynamic": "kiln.dynamic"}, "kiln", spec)
    return "perf" in enabled
