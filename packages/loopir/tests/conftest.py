"""Test session setup: each test's random inputs come from generators seeded for it."""

from __future__ import annotations

import os
import random
import zlib

import pytest
import torch


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
