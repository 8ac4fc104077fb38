#!/usr/bin/env bash
# The queue of GPU work that landed without an H200 measurement, as device calls of under ten
# minutes each, most valuable first. Run one step per device call from the repository root:
#   bash scripts/gpu_next.sh call1        (carry: [".whl"], timeout_s 590)
# Each step writes its logs and kiln_bench JSONs into $OUT. Update the queue when a step's
# results are in (the session's closing note says which ran).
#
# call1 (issue 15): the matmul templates' CUDA tests and benchmark (mm7, never run on a GPU), the
#   split-reduction tests on CUDA (split Welford, second kernel over rows), fp32 training of the
#   conv models with channels-last training on and off (Note [Channels-last for convolutions]:
#   scripts/triton_kernel_audit.py estimates it fixed; turn it on by default if it wins).
# call2 (issues 14 + 15): bf16 inference of the whole suite, eager/kiln/torch.compile and both
#   reduce-overhead modes, profiled (GPU busy time, host time: extern bindings and the host-time
#   work of overhead8 land here first). call2b: the host time per call by layer on CUDA, reduce-overhead,
#   BERT against DistilBERT (0.15 vs 0.27 ms on the H200, the same on the CPU: packages/kiln/bench/call_overhead.py).
# call3 (issue 15): the ablation, GPU busy time (each switch off in turn), half the suite per call.
# call4 (issues 14 + 15): bf16 training and fp32 training of the whole suite.
# call5 (issues 17 + 20): the dynamic sweep on the H200, the CPU at 1/4/16 threads.
set -uo pipefail
out="${OUT:-gpu-logs}"; mkdir -p "$out"
bash scripts/gpu_run.sh >/dev/null 2>&1 </dev/null  # installs the packages into /tmp/kiln-site
export PYTHONPATH=/tmp/kiln-site KILN_CACHE_DIR=/tmp/kiln-cache PYTHONUNBUFFERED=1
bench() {  # bench LABEL LIMIT ARGS...: kiln_bench at gpu size on CUDA, log + JSON in $out
  local label=$1 limit=$2; shift 2
  timeout "$limit" python3 -m kiln_bench --size gpu --device cuda --out "$out/$label" "$@" > "$out/$label.log" 2>&1
  grep -v "models:" "$out/$label.log" | tail -n "${TAIL:-45}" | cut -c1-230
}
for step in "$@"; do
  echo "== $step ($(date +%T))"
  case "$step" in
    call1)
      timeout 110 python3 -m pytest -q -p no:cacheprovider packages/codegen_triton/tests -k "template or split or few_channels" 2>&1 | tail -6
      timeout 120 python3 packages/codegen_triton/bench/matmul_templates.py --tokens 4096 --out "$out/mm-templates.json" 2>&1 | tail -14
      bench train-f32-conv 300 --dtype float32 --modes training --models cnn,resnet,convnext --repeats 10 --warmup 3 --profile --profile-calls 3 \
        --backends eager,kiln,kiln:default:layout_training=True,inductor ;;
    call2)
      bench inference-bf16 560 --dtype bfloat16 --modes inference --repeats 30 --profile \
        --backends eager,kiln,kiln:reduce-overhead,inductor,inductor:reduce-overhead ;;
    call2b)
      timeout 400 python3 packages/kiln/bench/call_overhead.py --device cuda --dtype bfloat16 --mode reduce-overhead --models bert,distilbert,mlp --no-torch 2>&1 | tail -40 ;;
    call3)
      bench ablation-a 560 --dtype bfloat16 --modes inference --models gpt2,bert,llama,t5,mlp --repeats 10 --profile --profile-calls 3 --ablation --backends eager,kiln ;;
    call3b)
      bench ablation-b 560 --dtype bfloat16 --modes inference --models vit,resnet,convnext,cnn,distilbert --repeats 10 --profile --profile-calls 3 --ablation --backends eager,kiln ;;
    call4)
      bench training-bf16 560 --dtype bfloat16 --modes training --repeats 20 --warmup 5 --backends eager,kiln,inductor ;;
    call4b)
      bench training-f32 560 --dtype float32 --modes training --repeats 20 --warmup 5 --backends eager,kiln,inductor ;;
    call5)
      timeout 250 python3 -m kiln_bench.dynamic --device cuda --dtype bfloat16 --models gpt2,llama,resnet --batches 2,8,32 --seqs 16,128,512 --repeats 10 --json "$out/h200-dynamic.json" 2>&1 | tail -30
      timeout 300 python3 packages/codegen_cpp/bench/threads.py --threads 1,4,16 --models resnet,gpt2,bert,mlp,cnn,convnext,t5,llama --budget-s 280 2>&1 | tail -30 ;;
    *) echo "unknown step $step (call1 .. call5)" ;;
  esac
done
