"""Test session setup: each test's random inputs come from generators seeded for it."""

from __future__ import annotations

import pytest

from kiln_loopir.testing import seed_generators


@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest) -> None:
    seed_generators(request.node.nodeid)  # Note [Seeded tests] in kiln_loopir.testing
