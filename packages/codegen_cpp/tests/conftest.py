"""Test session setup: a private compile cache, and the "cpp" backend visible to loopir.

The cache lives in a temporary directory for the whole session (kernels compiled by one test
are reused by the next, which keeps the suite fast) and never touches ~/.cache/kiln. When the
package is installed its entry point makes "cpp" visible; when tests run from a source tree
(PYTHONPATH) the backend is registered in process instead.
"""

from __future__ import annotations

import importlib.metadata
import os
import random
import tempfile
import zlib

import pytest
import torch

_CACHE = tempfile.mkdtemp(prefix="kiln-cpp-tests-")
os.environ["KILN_CACHE_DIR"] = _CACHE

import kiln_loopir  # noqa: E402
from kiln_codegen_cpp import CppBackend  # noqa: E402

if not any(ep.name == "cpp" for ep in importlib.metadata.entry_points(group="kiln_loopir.backends")):
    kiln_loopir.register_backend("cpp", CppBackend)


@pytest.fixture
def cache_root() -> str:
    return _CACHE


# Note [Seeded tests]: every test draws its random inputs from generators seeded for it, so a
# test's data does not depend on which tests ran before it (a tight tolerance once passed or
# failed with the test order). The seed is the test's node id hashed with a fixed base, so two
# tests do not share data either; ``KILN_TEST_SEED`` changes the base, to check that no
# tolerance holds for one seed only.
@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest) -> None:
    base = os.environ.get("KILN_TEST_SEED", "0")
    seed = zlib.crc32(f"{base}:{request.node.nodeid}".encode())
    random.seed(seed)
    torch.manual_seed(seed)
