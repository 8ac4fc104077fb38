"""Logging artifacts of kiln_aotgrad (KILN_LOG), next to kiln_dynamo's.

`aot_graphs` prints every graph handed to a compiler (inference, forward, backward) as FX code;
`partition` prints what each partition saved, its bytes and what the backward recomputes. Each is
a stdlib logger under `kiln.aotgrad.<artifact>`; `KILN_LOG=aot_graphs,partition` (or `aotgrad`,
or `all`) gives them a stderr handler at INFO when the package is imported or `configure()` runs.
"""

from __future__ import annotations

import logging
import os

ARTIFACTS = ("aot_graphs", "partition")

_handler: logging.Handler | None = None


def get_artifact_logger(artifact: str) -> logging.Logger:
    assert artifact in ARTIFACTS, artifact
    return logging.getLogger(f"kiln.aotgrad.{artifact}")


def configure(spec: str | None = None) -> list[str]:
    """Turn on the artifacts named in `spec` (default: $KILN_LOG); returns the ones enabled."""
    global _handler
    if spec is None:
        spec = os.environ.get("KILN_LOG", "")
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if "all" in names or "aotgrad" in names:
        names = list(ARTIFACTS)
    enabled = [n for n in names if n in ARTIFACTS]
    if enabled and _handler is None:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for art in ARTIFACTS:
        logger = get_artifact_logger(art)
        if art in enabled:
            assert _handler is not None
            logger.setLevel(logging.INFO)
            if _handler not in logger.handlers:
                logger.addHandler(_handler)
        elif _handler is not None and _handler in logger.handlers:
            logger.removeHandler(_handler)
    return enabled


graphs_log = get_artifact_logger("aot_graphs")
partition_log = get_artifact_logger("partition")
