"""``KILN_LOG`` artifacts of codegen_cpp, through stdlib logging under ``kiln.codegen_cpp``.

``KILN_LOG=output_code`` (or ``all``) sets logger ``kiln.codegen_cpp.output_code`` to DEBUG: each
compiled graph logs its ``CppOptions``, the path and source of its wrapper and the path of its C++ translation
unit, and each accumulating scatter the loop it is vectorized along, if any (Note [Scatter loops
and omp simd] in kernel.py). ``cache`` logs each build's disk hit or compile (a build in parts: how many, each part's compile
time and the link's, Note [Parallel C++ builds] in units.py); ``parallel`` logs each kernel's parallel plan (serial, or
which loops run on how many threads at most: Note [Parallel plan] in parallel.py); ``fusion``
each fusion the generator refuses (Note [Row and column reductions are not fused]); a corrupt
cache entry is a warning on ``kiln.codegen_cpp.cache`` whatever ``KILN_LOG`` says (Note [Verified
cache entries] in build.py). The variable is read at each compilation (:func:`configure`), so tests may set it.
"""

from __future__ import annotations

from kiln_loopir import configure_artifacts

ARTIFACTS: dict[str, str] = {
    "output_code": "kiln.codegen_cpp.output_code",
    "cache": "kiln.codegen_cpp.cache",
    "parallel": "kiln.codegen_cpp.parallel",
    "fusion": "kiln.codegen_cpp.fusion",
}


def configure(value: str | None = None) -> set[str]:
    """Turn on the artifacts ``KILN_LOG`` names; returns them."""
    return configure_artifacts(ARTIFACTS, value)
