"""``KILN_LOG`` artifacts of codegen_cpp, through stdlib logging under ``kiln.codegen_cpp``.

``KILN_LOG=output_code`` (or ``all``) sets logger ``kiln.codegen_cpp.output_code`` to DEBUG: each
compiled graph logs the path and source of its wrapper and the path of its C++ translation
unit. The variable is read at each compilation (:func:`configure`), so tests may set it.
"""

from __future__ import annotations

import logging
import os

ARTIFACTS: dict[str, str] = {"output_code": "kiln.codegen_cpp.output_code"}


def configure(value: str | None = None) -> set[str]:
    """Turn on the artifacts ``KILN_LOG`` names; returns them."""
    raw = os.environ.get("KILN_LOG", "") if value is None else value
    names = {part.strip() for part in raw.split(",") if part.strip()}
    names = set(ARTIFACTS) if "all" in names else names & set(ARTIFACTS)
    for name in names:
        logger = logging.getLogger(ARTIFACTS[name])
        logger.setLevel(logging.DEBUG)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
            logger.addHandler(handler)
    return names
