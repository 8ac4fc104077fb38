"""Test session setup: a private cache, the interpreter when there is no GPU, and the backend.

Without CUDA, Triton kernels can only run through Triton's interpreter, so the session turns
``TRITON_INTERPRET=1`` on before triton is imported (CI sets it too). The generated-module and
autotune cache lives in a temporary directory for the whole session and never touches
~/.cache/kiln. When the package is installed its entry point makes "triton" visible; when tests
run from a source tree (PYTHONPATH) the backend is registered in process instead.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

_CACHE = tempfile.mkdtemp(prefix="kiln-triton-tests-")
os.environ["KILN_CACHE_DIR"] = _CACHE

import kiln_loopir  # noqa: E402
from kiln_codegen_triton import TritonBackend  # noqa: E402
from kiln_loopir.testing import seed_generators  # noqa: E402

if not any(ep.name == "triton" for ep in importlib.metadata.entry_points(group="kiln_loopir.backends")):
    kiln_loopir.register_backend("triton", TritonBackend)


def pytest_configure(config: pytest.Config) -> None:
    # the interpreter evaluates masked-off lanes too (log of 0, 0/0): numpy warns, results are
    # discarded by the masks
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture
def cache_root() -> str:
    return _CACHE


@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest) -> None:
    seed_generators(request.node.nodeid)  # Note [Seeded tests] in kiln_loopir.testing
