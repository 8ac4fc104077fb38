#!/usr/bin/env bash
# One device call of the GPU issues' loop: CUDA tests of codegen_triton, the launch micro-benchmark
# and the profile of a few models (wall vs GPU time), each under its own time limit, logs in $OUT.
#   scripts/gpu_session.sh checker cold tests-par launch "resnet,gpt2"
# checker: build the torch-linked tensor checker first (guards at full speed in what follows);
# cold: cold compile per model and backend, fresh processes (scripts/gpu_cold_compile.py; COLD_MODELS,
# COLD_BACKENDS, COLD_DTYPE, COLD_MODE); tests-par: codegen_triton's CUDA tests in 4 parallel shards.
# The GPU machine lacks expecttest (test_opinfo imports it): download its wheel into .whl/ here
# (pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl expecttest) and name
# .whl in the device call's carry; gpu_run.sh installs it.
set -uo pipefail
out="${OUT:-gpu-logs}"; mkdir -p "$out"
bash scripts/gpu_run.sh >/dev/null 2>&1 </dev/null  # installs the packages into /tmp/kiln-site
export PYTHONPATH=/tmp/kiln-site KILN_CACHE_DIR=/tmp/kiln-cache PYTHONUNBUFFERED=1
for step in "$@"; do
  echo "== $step ($(date +%T))"
  case "$step" in
    checker) timeout 240 python3 -m kiln_dynamo.tensor_check 2>&1 | tail -3 ;;
    cold) KILN_TENSOR_CHECKER=0 timeout "${COLD_LIMIT:-300}" python3 scripts/gpu_cold_compile.py --models "${COLD_MODELS:-resnet,bert}" --backends "${COLD_BACKENDS:-kiln,kiln-threads,inductor}" --dtype "${COLD_DTYPE:-bfloat16}" --mode "${COLD_MODE:-inference}" --out "$out/cold-${COLD_MODE:-inference}.json" 2>&1 | grep -v Warning | tee "$out/cold-${COLD_MODE:-inference}.log" ;;
    tests-par)
      t=packages/codegen_triton/tests
      shards=("$t/test_pointwise.py" "$t/test_reductions.py $t/test_memory_ops.py" "$t/test_wrapper.py $t/test_cudagraphs.py $t/test_launcher.py $t/test_kernel_names.py $t/test_templates.py" "$t/test_opinfo.py $t/test_passes.py $t/test_gpu_compile.py $t/test_codegen_triton_package.py")
      for i in 0 1 2 3; do timeout "${TEST_LIMIT:-240}" python3 -m pytest -q -p no:cacheprovider ${shards[$i]} > "$out/triton-tests-$i.log" 2>&1 & done; wait
      for i in 0 1 2 3; do echo "-- shard $i"; grep -E "passed|failed|error|FAILED|Error" "$out/triton-tests-$i.log" | tail -8; done ;;
    tests) timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -x ${TESTS:-packages/codegen_triton/tests} 2>&1 | tail -25 | tee "$out/triton-tests.log" ;;
    launch) timeout "${LAUNCH_LIMIT:-150}" python3 scripts/gpu_launch_bench.py --out "$out/launch.json" 2>&1 | tail -12 | tee "$out/launch.log" ;;
    *) timeout "${PROFILE_LIMIT:-300}" python3 scripts/gpu_profile.py --models "$step" --backends "${BACKENDS:-eager,kiln,kiln:reduce-overhead,inductor,inductor:reduce-overhead}" --out "$out/profile-${step//,/-}.json" ${CPROFILE:+--cprofile $CPROFILE} ${PROFILE_ARGS:-} 2>&1 | grep -v Warning > "$out/profile-${step//,/-}.log"; tail -n "${PROFILE_TAIL:-60}" "$out/profile-${step//,/-}.log" ;;
  esac
done
