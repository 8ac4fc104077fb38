"""``KILN_LOG`` artifacts of loopir, through stdlib logging under ``kiln.loopir``.

``KILN_LOG=ir,schedule`` (comma-separated; ``all`` turns on every artifact) sets the matching
loggers to DEBUG and gives them a stderr handler if the application configured none:

* ``ir`` (logger ``kiln.loopir.ir``): each fx node's lowering and each buffer's loop body as
  pseudo code, one ``ops`` call per line;
* ``schedule`` (logger ``kiln.loopir.schedule``): dead code removed, every fusion with its score,
  the final order of kernels and the buffer plan (each output written in place of an input);
* ``passes`` (logger ``kiln.loopir.passes``): what each graph pass before lowering rewrote, padded
  or re-laid, and why (the layout rule's verdict, each matmul padded or left with its timing);
* ``fallbacks`` (logger ``kiln.loopir.fallbacks``): every op whose lowering declined or failed,
  with the reason: it runs eager's kernel as an extern call and the rest of the graph is compiled.

The variable is read when :func:`configure` runs (at each ``compile_graph``), so tests may set it.
"""

from __future__ import annotations

import logging
import os

ARTIFACTS: dict[str, str] = {
    "ir": "kiln.loopir.ir",
    "schedule": "kiln.loopir.schedule",
    "passes": "kiln.loopir.passes",
    "fallbacks": "kiln.loopir.fallbacks",
}


def enabled_artifacts(value: str | None = None, artifacts: dict[str, str] = ARTIFACTS) -> set[str]:
    """The artifacts of ``artifacts`` named in ``value`` (default: the ``KILN_LOG`` variable)."""
    raw = os.environ.get("KILN_LOG", "") if value is None else value
    names = {part.strip() for part in raw.split(",") if part.strip()}
    if "all" in names:
        return set(artifacts)
    return names & set(artifacts)


def configure_artifacts(artifacts: dict[str, str], value: str | None = None) -> set[str]:
    """Turn on the artifacts (name -> logger name) that ``KILN_LOG`` names; returns them. Shared
    with code generators for their own artifacts."""
    names = enabled_artifacts(value, artifacts)
    for name in names:
        logger = logging.getLogger(artifacts[name])
        logger.setLevel(logging.DEBUG)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
            logger.addHandler(handler)
    return names


def configure(value: str | None = None) -> set[str]:
    """Turn on loopir's artifacts ``KILN_LOG`` names; returns them."""
    return configure_artifacts(ARTIFACTS, value)
