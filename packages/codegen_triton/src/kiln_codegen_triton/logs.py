"""``KILN_LOG`` artifacts of codegen_triton, through stdlib logging under ``kiln.codegen_triton``.

``KILN_LOG=output_code`` (or ``all``) sets logger ``kiln.codegen_triton.output_code`` to DEBUG:
each compiled graph logs its kernel module (path and source) and its wrapper. ``autotune`` logs
each max-autotune choice with the timings it was made from. ``compile`` logs how each graph's
kernels were compiled (the worker pool: how many, in how long, how many fell back). A corrupt cache file (module or autotune record) is a
warning on ``kiln.codegen_triton.cache`` whatever ``KILN_LOG`` says. The variable is read at each
compilation (:func:`configure`), so tests may set it.
"""

from __future__ import annotations

from kiln_loopir import configure_artifacts

ARTIFACTS: dict[str, str] = {
    "output_code": "kiln.codegen_triton.output_code",
    "autotune": "kiln.codegen_triton.autotune",
    "cache": "kiln.codegen_triton.cache",
    "compile": "kiln.codegen_triton.compile",
}


def configure(value: str | None = None) -> set[str]:
    """Turn on the artifacts ``KILN_LOG`` names; returns them."""
    return configure_artifacts(ARTIFACTS, value)
