#!/usr/bin/env bash
# Runs on the H200 machine through the device tool, from the repository root (Python 3.12,
# torch 2.11, triton 3.6, no network): installs every package into a private folder, then runs
# the steps named on the command line, each under its own time limit, logging into $OUT.
#
#   scripts/gpu_run.sh triton-tests bandwidth bench-inference
#
# Steps: triton-tests (codegen_triton's tests on CUDA), bandwidth (micro-kernel GB/s), cpp-tests,
# dynamo-tests, kiln-tests, bench-inference, bench-bf16, bench-training (the model suite at gpu
# size, eager vs torch.compile vs kiln). Each step's time limit is STEP_LIMIT seconds (default 240;
# BENCH_LIMIT for the model-suite steps).
set -uo pipefail
out="${OUT:-gpu-logs}"
mkdir -p "$out"
limit="${STEP_LIMIT:-240}"
python3 --version; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
site=/tmp/kiln-site
if [ ! -d "$site/kiln" ]; then
    python3 -m pip install -q --no-deps --no-index --no-build-isolation --target "$site" \
        packages/frame_hook packages/symbolic packages/dynamo packages/aotgrad packages/loopir packages/codegen_cpp \
        packages/codegen_triton packages/kiln packages/bench 2>&1 | tail -5
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl 2>&1 | tail -2
    fi
fi
export PYTHONPATH="$site" KILN_CACHE_DIR=/tmp/kiln-cache
tests() { timeout "$limit" python3 -m pytest -q -p no:cacheprovider -x "packages/$1/tests" 2>&1 | tail -15 > "$out/$1-tests.log"; tail -3 "$out/$1-tests.log"; }
bench() { timeout "${BENCH_LIMIT:-$2}" python3 -m kiln_bench --size gpu --device cuda --backends eager,inductor,kiln "${@:3}" --out "$out/$1" 2>&1 | grep -v "models:" | tail -40 > "$out/$1.log"; tail -20 "$out/$1.log"; }
for step in "$@"; do
    echo "== $step ($(date +%T))"
    case "$step" in
        triton-tests) tests codegen_triton ;;
        cpp-tests) tests codegen_cpp ;;
        dynamo-tests) tests dynamo ;;
        kiln-tests) tests kiln ;;
        bandwidth) timeout "$limit" python3 packages/codegen_triton/bench/bandwidth.py --out "$out/bandwidth.json" 2>&1 | tail -40 | tee "$out/bandwidth.log" ;;
        bench-inference) bench gpu-inference-fp32 "$limit" --modes inference ;;
        bench-bf16) bench gpu-inference-bf16 "$limit" --modes inference --dtype bfloat16 ;;
        bench-training) bench gpu-training-fp32 "$limit" --modes training ;;
        *) echo "unknown step $step" ;;
    esac
done
