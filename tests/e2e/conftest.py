"""Test session setup: a private kiln compile cache (a temporary directory for the session), so
the end-to-end tests neither read nor fill the user's ~/.cache/kiln; subprocesses inherit it."""

from __future__ import annotations

import os
import tempfile

os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-e2e-tests-")
