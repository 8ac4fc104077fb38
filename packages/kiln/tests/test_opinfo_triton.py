"""PyTorch's OpInfo database through `kiln.compile` with the Triton code generator, in float32,
bfloat16 and float16: without a GPU on CPU tensors under Triton's interpreter
(`options={"cpu_backend": "triton"}`; conftest.py turns `TRITON_INTERPRET=1` on, Note [Triton's
interpreter is process-wide]), on a GPU machine on CUDA tensors. Judged as the C++ sweep
(test_opinfo_kiln.py, opinfo_sweep.py), plus every kernel must be generated as Triton: a kernel
the generator declines (loopir's reference interpreter runs it) counts as a fallback. Low-precision values are judged against eager and,
where they differ, against the float64 answer (Note [Low-precision results] in opinfo_sweep.py).

An op falls back only for a reason listed: `KNOWN_FALLBACKS` (capture; the same for both code
generators), `TRITON_FALLBACKS` (this generator, by dtype) or, on CUDA, `CUDA_FALLBACKS`. An op that compiles whole while
listed fails until its entry is removed, so the lists only shrink.

Budget: the whole sweep, 3 samples per op, took 127 s in float32 (643 ops) on the 2-core
CI-class machine when it was otherwise idle, and 837 s (bfloat16, 518 ops) and 1,041 s
(float16, 514 ops) while other jobs loaded it 4-5 times over. CI runs every third op of each
dtype's list, staggered (float32 from position 0, bfloat16 from 1, float16 from 2; 560 tests),
about the work of the float32 sweep (~2.5 minutes idle). `KILN_OPINFO_TRITON_STRIDE=1` runs every op in
every dtype; `KILN_OPINFO_SHARD=i/n` runs shard i of n of every dtype.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from opinfo_sweep import KNOWN_FALLBACKS, key, op_outcome, select, sweep_op

import kiln
from kiln_codegen_triton import interpreting

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SAMPLES = 3
STRIDE = int(os.environ.get("KILN_OPINFO_TRITON_STRIDE", "3"))
SHARD = os.environ.get("KILN_OPINFO_SHARD")
# dtype -> first op position of the default stride
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

# (dtype, op) -> why some of it runs in loopir's interpreter with the Triton code generator
# (float16 and bfloat16 atomic adds are generated: Note [16-bit atomic adds] in
# kiln_codegen_triton's kernel.py)
# (nonzero, argwhere and masked_select compile whole with data-dependent sizes on the Triton
# generator too since the eighth session: Note [Data-dependent sizes in the Triton wrapper])
TRITON_FALLBACKS: dict[tuple[torch.dtype, str], str] = {}

# op-name prefix -> why those ops are not captured on CUDA (they run eagerly, whole)
CUDA_FALLBACKS: dict[str, str] = {
    "jiterator_": "a torch.cuda.jiterator function is compiled by torch at call time: opaque to capture",
}
# the Triton code generator for CPU graphs runs only under the interpreter; on a GPU machine the
# CPU graphs of the sweep (factory ops such as `full`, `arange`) get the C++ one, as a user's do
CPU_BACKEND = "triton" if DEVICE == "cpu" else "cpp"


def _cases() -> list[Any]:
    cases = []
    for dtype, start in DTYPES.items():
        infos = (
            select(SHARD, dtype=dtype, device=DEVICE)
            if SHARD
            else select(dtype=dtype, device=DEVICE)[start::STRIDE]
        )
        name = str(dtype).removeprefix("torch.")
        cases += [pytest.param(info, dtype, id=f"{name}-{key(info)}") for info in infos]
    return cases


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    assert DEVICE == "cuda" or interpreting(), "conftest.py turns Triton's interpreter on without a GPU"
    kiln.reset()
    yield
    kiln.reset()


@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
@pytest.mark.parametrize(("info", "dtype"), _cases())
def test_opinfo_through_kiln_triton(info: Any, dtype: torch.dtype) -> None:
    outcomes = sweep_op(info, SAMPLES, dtype, cpu_backend=CPU_BACKEND, device=DEVICE)
    kind = op_outcome(outcomes)
    if kind == "skipped":
        pytest.skip(f"no {dtype} CPU sample of {key(info)} that eager runs returns a tensor")
    details = "\n".join(f"sample {o.sample}: {o.kind}: {o.detail}" for o in outcomes if o.kind != "pass")
    assert kind in ("pass", "fallback"), details
    cuda_listed = DEVICE == "cuda" and any(key(info).startswith(prefix) for prefix in CUDA_FALLBACKS)
    listed = key(info) in KNOWN_FALLBACKS or (dtype, key(info)) in TRITON_FALLBACKS or cuda_listed
    if listed:
        assert kind == "fallback", f"{key(info)} now compiles whole in {dtype}: remove it from the list"
    else:
        assert kind == "pass", details


def test_triton_fallbacks_name_real_ops() -> None:
    for dtype, name in TRITON_FALLBACKS:
        assert name in {key(info) for info in select(dtype=dtype, device=DEVICE)}, (dtype, name)
