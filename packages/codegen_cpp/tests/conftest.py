"""Test session setup: a private compile cache, and the "cpp" backend visible to loopir.

The cache lives in a temporary directory for the whole session and never touches ~/.cache/kiln;
the backend is found by name whether the package is installed or the tests run from a source
tree (Note [A code generator's test session] in kiln_loopir.testing).
"""

from __future__ import annotations

import pytest

from kiln_codegen_cpp import CppBackend
from kiln_loopir.testing import backend_test_session, seed_generators

_CACHE = backend_test_session("cpp", CppBackend, "kiln-cpp-tests-")


@pytest.fixture
def cache_root() -> str:
    return _CACHE


@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest) -> None:
    seed_generators(request.node.nodeid)  # Note [Seeded tests] in kiln_loopir.testing
