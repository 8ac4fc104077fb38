#!/usr/bin/env bash
# One device call of the GPU issues' loop: CUDA tests of codegen_triton, the launch micro-benchmark
# and the profile of a few models (wall vs GPU time), each under its own time limit, logs in $OUT.
#   scripts/gpu_session.sh tests launch "resnet,gpt2"
set -uo pipefail
out="${OUT:-gpu-logs}"; mkdir -p "$out"
bash scripts/gpu_run.sh >/dev/null 2>&1 </dev/null  # installs the packages into /tmp/kiln-site
export PYTHONPATH=/tmp/kiln-site KILN_CACHE_DIR=/tmp/kiln-cache PYTHONUNBUFFERED=1
for step in "$@"; do
  echo "== $step ($(date +%T))"
  case "$step" in
    tests) timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -x ${TESTS:-packages/codegen_triton/tests} 2>&1 | tail -25 | tee "$out/triton-tests.log" ;;
    launch) timeout "${LAUNCH_LIMIT:-150}" python3 scripts/gpu_launch_bench.py --out "$out/launch.json" 2>&1 | tail -12 | tee "$out/launch.log" ;;
    *) timeout "${PROFILE_LIMIT:-300}" python3 scripts/gpu_profile.py --models "$step" --backends "${BACKENDS:-eager,kiln,kiln:reduce-overhead,inductor,inductor:reduce-overhead}" --out "$out/profile-${step//,/-}.json" ${CPROFILE:+--cprofile $CPROFILE} 2>&1 | grep -v Warning > "$out/profile-${step//,/-}.log"; tail -n "${PROFILE_TAIL:-60}" "$out/profile-${step//,/-}.log" ;;
  esac
done
