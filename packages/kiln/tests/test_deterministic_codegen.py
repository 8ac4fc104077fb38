"""Note [Deterministic schedules] (kiln_loopir's scheduler.py): the code both generators emit for
a training step is the same in every process, whatever the string hash seed.

T5's training backward came out in another kernel order in each process; ``codegen_hashes.py``
compiles a small T5-style step (two blocks, forward and backward) with the C++ generator and the
Triton generator (under Triton's interpreter) and prints the hash of every generated source.
Under the old tie-breaks its backward differed under each of the seeds below, in both generators.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SEEDS = (0, 1, 4, 5)


def test_generated_code_does_not_depend_on_the_hash_seed() -> None:
    script = Path(__file__).with_name("codegen_hashes.py")
    runs = {}
    for seed in SEEDS:
        env = {**os.environ, "PYTHONHASHSEED": str(seed), "TRITON_INTERPRET": "1"}
        done = subprocess.run(
            [sys.executable, str(script)], check=False, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[seed] = json.loads(done.stdout.strip().splitlines()[-1])
    for generator in ("cpp", "triton"):
        hashes = {seed: run[generator] for seed, run in runs.items()}
        assert len(hashes[0]) == 2, hashes  # the forward's sources and the backward's
        assert all(h == hashes[0] for h in hashes.values()), f"{generator}: {hashes}"
