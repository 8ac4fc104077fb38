#!/usr/bin/env bash
# The dynamic-shape suites under another torch than CI's, on this CPU machine: the H200 machine runs
# torch 2.11, whose fake-tensor behaviour differs from 2.13's (Note [Composite operators under
# symbolic sizes], Note [Metadata queries as operators]); CI cannot catch such failures.
#   bash scripts/torch_version_check.sh [VERSION]     (default 2.11.0; about 5 GB in /tmp)
# torch's CPU-only wheels of old versions are not on this machine's index, so the CUDA wheel is
# installed with its NVIDIA libraries (it imports and runs on the CPU); Triton is not installed,
# so the Triton-backend tests are deselected. kiln runs from the sources through PYTHONPATH.
set -uo pipefail
version="${1:-2.11.0}"
venv="/tmp/torch-${version}-venv"
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "torch==${version}" numpy sympy pytest expecttest "transformers>=5.17" || exit 1
fi
export PYTHONPATH="$(ls -d "$root"/packages/*/src | tr '\n' ':')" KILN_CACHE_DIR="/tmp/kiln-cache-torch-${version}"
cd "$root"
"$venv/bin/python" -c "import torch; print('torch', torch.__version__)"
"$venv/bin/python" -m pytest -q -p no:cacheprovider packages/dynamo/tests/test_dynamic_shapes.py packages/dynamo/tests/test_fake.py \
  packages/aotgrad/tests/test_dynamic.py 2>&1 | tail -3
"$venv/bin/python" -m pytest -q -p no:cacheprovider packages/kiln/tests/test_dynamic.py -k "not triton" 2>&1 | tail -8
"$venv/bin/python" scripts/diag_fake_failures.py 2>&1 | grep -E "^(torch|===|   break|--- run_fake)"
