"""Test session setup: a private cache, the interpreter when there is no GPU, and the backend.

Without CUDA, Triton kernels can only run through Triton's interpreter, so the session turns
``TRITON_INTERPRET=1`` on before triton is imported (CI sets it too). The generated-module and
autotune cache lives in a temporary directory for the whole session and never touches
~/.cache/kiln; the backend is found by name whether the package is installed or the tests run
from a source tree (Note [A code generator's test session] in kiln_loopir.testing).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
else:
    # cuDNN convolutions run in TF32 by default: eager's and kiln's, in other layouts, pick other
    # algorithms and differ by ~1e-3 (conv_bias's test on an H100), beyond float32 tolerances
    torch.backends.cudnn.allow_tf32 = False

from kiln_codegen_triton import TritonBackend
from kiln_loopir.testing import backend_test_session, seed_generators

_CACHE = backend_test_session("triton", TritonBackend, "kiln-triton-tests-")


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
