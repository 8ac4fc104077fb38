"""Through the whole pipeline (dynamo -> aotgrad -> loopir -> C++), each generated kernel is named
for the aten ops it fuses and its source opens with the user's file:line it came from."""

from __future__ import annotations

import inspect
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import kiln


def _user_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x) * w
    return y.sum(dim=1)


def test_kernel_source_names_the_users_lines(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.reset()
    caplog.set_level(logging.DEBUG, logger="kiln.codegen_cpp.output_code")
    x, w = torch.randn(8, 16), torch.randn(16)
    torch.testing.assert_close(kiln.compile(_user_fn)(x, w), _user_fn(x, w))
    paths = [
        r.getMessage().split("kernels: ", 1)[1]
        for r in caplog.records
        if r.getMessage().startswith("kernels: ")
    ]
    assert paths, "no C++ kernels were logged"
    source = Path(paths[-1]).read_text()
    [(comment, name)] = re.findall(r'((?://.*\n)+)extern "C" int64_t (\w+)\(', source)
    head = comment.splitlines()
    assert name == "cpp_fused_mul_sum_tanh_0"
    start = inspect.getsourcelines(_user_fn)[1]
    assert head[1:] == [
        f"//   {__file__}:{start + 1}  y = torch.tanh(x) * w",
        f"//   {__file__}:{start + 2}  return y.sum(dim=1)",
    ]
