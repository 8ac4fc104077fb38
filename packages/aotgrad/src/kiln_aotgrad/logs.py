"""Logging artifacts of kiln_aotgrad (KILN_LOG), next to kiln_dynamo's.

`aot_graphs` prints every graph handed to a compiler (inference, forward, backward) as FX code;
`partition` prints what each partition saved, its bytes and what the backward recomputes;
`fallbacks` names every operator kept as one aten call because its decomposition failed (Note
[One op kept when its decomposition fails] in tracer.py); `dynamic` says why a graph with
symbolic sizes was refused (the frame is then compiled static). Each is
a stdlib logger under `kiln.aotgrad.<artifact>`; `KILN_LOG=aot_graphs,partition` (or `aotgrad`,
or `all`) gives them a stderr handler at INFO when the package is imported or `configure()` runs.
"""

from __future__ import annotations

import logging

from kiln_dynamo import configure_artifacts

ARTIFACTS = ("aot_graphs", "partition", "fallbacks", "dynamic")


def get_artifact_logger(artifact: str) -> logging.Logger:
    assert artifact in ARTIFACTS, artifact
    return logging.getLogger(f"kiln.aotgrad.{artifact}")


def configure(spec: str | None = None) -> list[str]:
    """Turn on the artifacts named in `spec` (default: $KILN_LOG); returns the ones enabled."""
    return configure_artifacts({a: f"kiln.aotgrad.{a}" for a in ARTIFACTS}, "aotgrad", spec)


graphs_log = get_artifact_logger("aot_graphs")
partition_log = get_artifact_logger("partition")
fallbacks_log = get_artifact_logger("fallbacks")
dynamic_log = get_artifact_logger("dynamic")
