"""Logging artifacts of kiln_dynamo, in the spirit of TORCH_LOGS.

Each artifact (`graph`, `guards`, `recompiles`, `bytecode`, `graph_breaks`, `dynamic`,
`decisions`: trace-time choices such as Note [Fused inference fast paths]) is a stdlib logger
under `kiln.dynamo.<artifact>`. `KILN_LOG=graph,guards` (read when the package is imported, or by
calling `configure()` again) gives those loggers a stderr handler at INFO level; everything else
stays silent unless the application configures logging itself.
"""

from __future__ import annotations

import logging
import os

ARTIFACTS = ("graph", "guards", "recompiles", "bytecode", "graph_breaks", "dynamic", "decisions")

_handler: logging.Handler | None = None


def get_artifact_logger(artifact: str) -> logging.Logger:
    assert artifact in ARTIFACTS, artifact
    return logging.getLogger(f"kiln.dynamo.{artifact}")


def configure_artifacts(loggers: dict[str, str], group: str, spec: str | None = None) -> list[str]:
    """Turn on the artifacts of `loggers` (artifact -> logger name) that `spec` (default:
    $KILN_LOG) names, or all of them for `all` or `group`; turn the others off. Returns the ones
    enabled. Shared by the packages above dynamo (aotgrad, the umbrella) for their own artifacts."""
    global _handler
    if spec is None:
        spec = os.environ.get("KILN_LOG", "")
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if "all" in names or group in names:
        names = list(loggers)
    enabled = [n for n in names if n in loggers]
    if enabled and _handler is None:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for art, name in loggers.items():
        logger = logging.getLogger(name)
        if art in enabled:
            assert _handler is not None
            logger.setLevel(logging.INFO)
            if _handler not in logger.handlers:
                logger.addHandler(_handler)
        elif _handler is not None and _handler in logger.handlers:
            logger.removeHandler(_handler)
            # back to the parent's level: an artifact turned off makes no records at all (left at
            # INFO, each record was still made and reached the root's handlers, a test's capture)
            logger.setLevel(logging.NOTSET)
    return enabled


def configure(spec: str | None = None) -> list[str]:
    """Turn on dynamo's artifacts named in `spec` (default: $KILN_LOG); returns the ones enabled."""
    enabled = configure_artifacts({a: f"kiln.dynamo.{a}" for a in ARTIFACTS}, "dynamo", spec)
    # `dynamic` also turns on kiln_symbolic's ShapeEnv log (symbols, guards with their lines)
    configure_artifacts({"dynamic": "kiln.symbolic.dynamic"}, "dynamo", spec)
    return enabled


graph_log = get_artifact_logger("graph")
guards_log = get_artifact_logger("guards")
recompiles_log = get_artifact_logger("recompiles")
bytecode_log = get_artifact_logger("bytecode")
graph_breaks_log = get_artifact_logger("graph_breaks")
decisions_log = get_artifact_logger("decisions")
