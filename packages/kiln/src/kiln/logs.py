"""The umbrella's KILN_LOG artifact: `perf`, one line per compiled graph with its time per phase
(aotgrad, loopir+codegen), through the stdlib logger `kiln.perf`. Each package configures its own
artifacts (dynamo: graph, guards, ...; loopir: ir, schedule; codegen_cpp: output_code)."""

from __future__ import annotations

import logging
import os

perf_log = logging.getLogger("kiln.perf")


def configure(spec: str | None = None) -> bool:
    """Turn on `perf` if `spec` (default: $KILN_LOG) names it or `all`; returns whether it is on."""
    names = {s.strip() for s in (os.environ.get("KILN_LOG", "") if spec is None else spec).split(",")}
    on = bool(names & {"perf", "all"})
    if on and not perf_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        perf_log.addHandler(handler)
        perf_log.setLevel(logging.INFO)
    return on
