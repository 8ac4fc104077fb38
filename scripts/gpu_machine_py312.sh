#!/usr/bin/env bash
# The CPU-side test suites under the H200 machine's Python 3.12 (torch 2.11, gcc 13): the second
# CPython version kiln supports. Run from the repository root through the device tool; logs go to
# $OUT (or ./py312-logs). Builds every package into a private folder with the machine's own
# setuptools (no network there), so entry points (the cpp backend) are registered.
set -uo pipefail
out="${OUT:-py312-logs}"
mkdir -p "$out"
python3 --version; python3 -c "import torch; print('torch', torch.__version__)"
site=/tmp/kiln-site
rm -rf "$site"
python3 -m pip install -q --no-deps --no-index --no-build-isolation --target "$site" \
    packages/frame_hook packages/symbolic packages/dynamo packages/aotgrad packages/loopir packages/codegen_cpp \
    packages/codegen_triton packages/kiln packages/bench 2>&1 | tail -5
# Test-only packages the machine lacks (e.g. expecttest for OpInfo) travel as wheels in .whl/.
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl 2>&1 | tail -2
fi
export PYTHONPATH="$site"
status=0
for pkg in "$@"; do
    python3 -m pytest -q -p no:cacheprovider "packages/$pkg/tests" 2>&1 | tee "$out/py312-$pkg.log" | tail -4 || status=1
done
exit $status
