"""Test session setup: a private compile cache, and the "cpp" backend visible to loopir.

The cache lives in a temporary directory for the whole session (kernels compiled by one test
are reused by the next, which keeps the suite fast) and never touches ~/.cache/kiln. When the
package is installed its entry point makes "cpp" visible; when tests run from a source tree
(PYTHONPATH) the backend is registered in process instead.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile

import pytest

_CACHE = tempfile.mkdtemp(prefix="kiln-cpp-tests-")
os.environ["KILN_CACHE_DIR"] = _CACHE

import kiln_loopir  # noqa: E402
from kiln_codegen_cpp import CppBackend  # noqa: E402
from kiln_loopir.testing import seed_generators  # noqa: E402

if not any(ep.name == "cpp" for ep in importlib.metadata.entry_points(group="kiln_loopir.backends")):
    kiln_loopir.register_backend("cpp", CppBackend)


@pytest.fixture
def cache_root() -> str:
    return _CACHE


@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest) -> None:
    seed_generators(request.node.nodeid)  # Note [Seeded tests] in kiln_loopir.testing
