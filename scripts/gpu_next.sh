#!/usr/bin/env bash
# The queue of GPU work that landed without an H200 measurement, as device calls of under ten
# minutes each, most valuable first. Run one step per device call from the repository root:
#   bash scripts/gpu_next.sh call1        (carry: [".whl"], timeout_s 590)
# Each step writes its logs and kiln_bench JSONs into $OUT. Update the queue when a step's
# results are in (the session's closing note says which ran).
#
# Thirty-fifth session: call35a (the launch micro-benchmark with native launches; codegen_triton's whole suite on CUDA),
#   call35b (bf16 inference, kiln against triton.native_launch=False and torch.compile), call35c/call35d (issue 20: the
#   public suite on the host's CPU at 1/4/16 threads, inference, then training of four models) ran on an H200 at
#   7e791fb (packages/bench/results/2026-12-08-h200*-s35-*; 1612 of 1800 s, ~300 s lost to refused starts).
#   The suite on CUDA: 18 failures + test_opinfo.py not collected (no expecttest there), all in the tests (CPU tensors
#   on a CUDA machine, a stand-in's signature, a stand-in timing), fixed after, not re-run on CUDA: call35e (carry
#   [".whl"]: expecttest's wheel). Next: call35e, call35d's four skipped models (mlp, t5, convnext, resnet: call35f), call35g (CNN training and
#   ResNet inference kernels at 1/4/16 threads),
#   then call32d, call32c, call31a (runner rows), call30s, call30b, call30p, call30f, call31o, call28t, call29c,
#   call28l, call27t + call27b, call27m, call26p, call27l.
# Thirty-fourth session: call34d (fp32 inference of the suite, the launch micro-benchmark with a per-kernel breakdown,
#   the synchronization probe), call34c (bf16 + fp32 training), a reduced call34b (bf16 inference, 20 timed calls, 3
#   profiled) and codegen_triton's CUDA tests ran on an H100 at d22a4c2 (code as 791e29a) (packages/bench/results/2026-12-08-h100-s34-*; 1622 of
#   1800 s, ~330 s of it lost to two refused starts and a slow first start). The four configurations of issue 14 at one
#   commit: kiln >= torch.compile in each, no model slower than eager. Found on CUDA and fixed after, not re-run there:
#   a -0.0 constant came back +0.0 (Note [Negative zero constants]), cuDNN TF32 in the test session, three wrapper tests
#   that needed CPU tensors. Next: call34e (codegen_triton's whole suite on CUDA after those fixes), then call32d, call32c,
#   call31a (runner rows), call30s, call30b, call30p, call30f, call31o, call28t, call29c, call28l, call27t + call27b,
#   call27m, call26p, call27l.
# Thirty-third session: no device time (184 s left of the session's budget at its start; a machine needs ~315 s).
#   Landed without a GPU measurement: nothing that changes GPU code (the C++ generator's overlapped builds and
#   precompiled headers are CPU-only; call27t measures the host's compile times). Next, unchanged: call32d, call32g,
#   call32c, call31a (runner rows), call30s, call30b, call30p, call30f, call31o, call28t, call29c, call28l, call27t + call27b,
#   call27m, call26p, call27l.
# Thirty-second session: call31d, call31h, call30r, a reference probe (scripts/reference_probe.py), call_overhead.py on CUDA,
#   a plan A/B, scripts/pad_probe.py, call2 and the launch micro-benchmark ran on an H100 at 96b916d
#   (packages/bench/results/2026-12-08-h100-s32-*; 1616 of 1800 s). Found: deepseek_v3's bf16 'mismatch' is eager's (cuDNN
#   attention on a v at an 8-byte offset returns wrong values; kiln aligns it and agrees with float32); GPT-2's
#   logits copy to eager's strides costs 0.28 ms of GPU time where torch.compile returns the padded view. Changed after:
#   breadth_speed.py checks a mismatch against eager in float32 (call32d). Next, in this order: call32d, call32g, call32c (helper cpu32: small
#   convolutions on the native kernel at 16 threads), call31a (its
#   runner_overhead rows only), call30s, call30b, call30p, call30f, call31o, call28t, call29c, call28l, call27t + call27b,
#   call27m, call26p, call27l.
# Thirty-first session: no device time (237 s left of the session's budget at its start; a machine needs 315 s).
#   Landed without a GPU measurement: host31's planned CUDA-graph replay (call31h, call31a), cpu31's outer products
#   as multiplications (CPU only: call31o on the host's CPU), fix31's two-device fast-path fix. Next, in this order: call30r, call31h,
#   call31d (helper fix31: deepseek_v3 per submodule), call30d, call31a, call30s, call30b, call30p, call30f, call31o, call28t, call29c, call28l, call27t + call27b,
#   call27m, call26p, call27l.
# Thirtieth session: call10 (the breadth suite on the GPU, last run in the sixteenth session), call29b, call4c, a reduced call29r and call29w
#   ran on an H100 at 63081cf (packages/bench/results/2026-12-07-h100-s30-*; 1563 of 1800 s, 541 s of it lost to six
#   machines that did not start). Found: CUDA graphs in training were off for every forward (outputs that are inputs;
#   fixed after, Note [Outputs that are inputs], not measured: call30r), deepseek_v3's bf16 mismatch (call30d).
#   Next, in this order: call30r, call30d, call30s (helper cpu30: its saves on GPU training), call30b (helper bn30),
#   call30p (helper bench30: the nine breadth programs made portable), call30f (helper fix30: the CPU oneDNN bf16
#   passes fuzzed on the host's CPU, which has the bf16 instructions this box lacks now), call28t, call29c, call28l,
#   call27t + call27b, call27m, call26p, call27l.
# Twenty-ninth session: call28e, call28v, call3c (the ablation, complete for the first time: in three calls, the whole
#   suite needs ~1000 s) and call28h ran on an H200 and its host at 5df0116 (packages/bench/results/2026-12-06-h200-s29-*;
#   1647 of 1800 s, 91 s lost to an H100 that did not start). Changed after them, not measured on the device: fix29's
#   aotgrad fix (a padded GEMM's saved value checked in full: wrong gradients under pad_mm before), its conv_bias strides
#   fix, the GPU wrapper's flat storage for declined kernels; cpu29/train29 (CPU only: call29c for 16 threads); x ** 1.
#   Next, in this order: call29b (bf16 training of the suite: issues 14/15 need the row at today's code) + call4c (fp32),
#   call29r (CUDA graphs in training, never measured) + call28t (where a training step's host time goes), call29w,
#   call29c, call28l, call27t + call27b, call27m, call26p, call27l, call10.
# Twenty-eighth session: call28a, call28b, call2, fp32 inference of the suite, call28c and call28d ran on an H100 and
#   its host (packages/bench/results/2026-12-06-h100-s28-*; 1485 of 1800 s, ~270 s lost to two machines that did not
#   start). Changed after them, not measured on the device: loopir's Note [Values read through a channels-last
#   permute], Note [Pointwise nodes walk their memory order] (Triton), Note [Tiny kernels fuse without a shared
#   buffer]; helpers host28 (GPU wrapper's viewed buffers, C same-float guards), cpu28 (CPU training channels-last),
#   fix28 (frame_hook: entries per globals; aotgrad: decompositions keep eager's errors). Next, in this order: call28e
#   (the three loopir changes on ResNet-50/ConvNeXt bf16 training), call28h (kiln against torch.compile, host events
#   side by side, ResNet-50 + T5 bf16 inference), call28v (viewed buffers and same-float guards: accuracy + host ms),
#   call28l (cpu28's rule at 16 threads), call28t, call27t + call27b, call27m, call26p, call27l, call3c (the ablation,
#   with this session's switches), call10.
# Twenty-seventh session: call26w, call27h, call26s, call26p (its 1-thread row only: the 95 s budget ended in
#   torch.compile's compile; now 200 s), call26c and four compile probes ran on an H100 and its host, at 6b7ad2c + the
#   Welford tiles (packages/bench/results/2026-12-06-h100*-s27-*). Found and changed after them, not measured on the
#   device: Note [Tunings that are slow to compile] (GCC 13's sapphirerapids scheduling model: BERT's CPU training
#   compile 30 s, 4-5 s with -mtune=skylake-avx512 by hand), WELFORD_MIN_ROWS = 0, a pooling backward's `self` read
#   for its shape alone (the CNN's bf16 training step 3.66 -> 3.48 ms expected). Helpers: build27 (call27b: the C++
#   build in parallel translation units on 16 cores), moe27 (call27m: the mixtures of experts' combine, T5's guarded
#   logs). Next, in this order: call27z (the session's GPU changes on CNN and ResNet-50 bf16 training, BERT's CPU
#   compile), call27t + call27b (compile time on the host), call27m, call26p, call27l (issue 15's column sums below
#   70%), call26m/call26n, call3c (the ablation), call2 --dtype float32, call10.
# Twenty-sixth session: call25c, call25d, the rest of call25c's models, call4c, a BatchNorm-source dump with a GPT-2/LLaMA
#   training profile at 16 threads, kiln's per-kernel thread scaling, gpu_kernel_table.py on ResNet-50 bf16 training and
#   two bn_stats tile sweeps ran on an H100 and its host, all at 6b7ad2c (packages/bench/results/2026-12-06-h100*-s26-*).
#   None of the session's code changes ran on the device. Next, in this order: call26w (Note [Welford tiles] at more
#   shapes, ResNet-50 bf16 training with welford_tiles and materialized_saves off), call26s (materialized_saves on the
#   other training models), call26p (par26's CPU parallel-plan rules at 16 threads), call26c (kiln's CPU training compile
#   on the host: BERT 27 s), call26m/call26n (GPT-2's products at 16 threads), then call2 --dtype float32, call10.
# Twenty-fifth session: call24e, call5b, call2, bf16 training of all ten (call4 at 8 timed steps), a ResNet-50 bf16
#   training profile with the GPT-2 output strides, then call25b + call25a ran on an H100
#   (packages/bench/results/2026-12-06-h100*-s25-*). Found: GPT-2 at 16 threads fixed by full_teams (2.85 ms, 9.55
#   with full_teams=0, eager 5.79); outer_partials no faster (now off); write-backs now grouped per dtype (183 -> 24
#   copies a ResNet-50 step); the BatchNorm statistics' partial kernels still at 25% of copy on torch 2.11 (their
#   form there is mean + var, not the var_mean the one-accumulator change fixed: read their source on the device,
#   KILN_LOG=output_code). Twenty-sixth session (helper par26): call26p, the kernels of issue 20 that did not scale
#   (BatchNorm statistics, layer norm + GELU, T5's buckets) after their fixes, kiln against kiln_ab (the fixes off).
#   Next: call25c and call25d FIRST (issue 20: training at 1/4/16 threads, the wider set at
#   16), then the BatchNorm partials' source on the device, call4c (fp32 training), call2 --dtype float32, call10.
# Twenty-fourth session: call23a, call4c, call3c, call24a, call24b, call24a again ran on an H100
#   (packages/bench/results/2026-12-06-h100*-s24-*); the budget was spent before call24e (call24a ran twice by mistake in
#   its second call, ~80 s; a helper's look at the device's environment ~80 s). Not measured on the GPU: the launcher marker (Note [Launchers built in the workers]),
#   compile24's Python-side savings, Note [Padded results the program sees] (GPT-2's logits now copied to eager's
#   strides: its bf16 inference GPU time may grow ~0.1-0.2 ms), Note [Teams keep the pool's size] on the host.
#   Next: call24e FIRST (GPT-2 at 16 threads, the pad copy, bf16 training compile), then call24d (the whole 16-thread
#   probe), call2 (bf16 inference of the suite), call4 (bf16 training of all ten), call5b (threads), call10, call5c.
# Twenty-third session: call2, call5b, call4c, a BERT fp32-training probe and fp32 inference ran on an H100
#   (packages/bench/results/2026-12-06-h100*-s23-*). Found: BERT and DistilBERT float32 training ran their
#   backward unfused (an IndexError in the split reductions that outer_by_tiles exposed; fixed, Note [Each member
#   splits its own row]; kiln_bench now prints fallbacks); GPT-2 at 16 threads still 76 ms (eager 3.6) with the
#   guard checker built first, its slowest kernels the three that compute tanh. Next: call23a FIRST (the tanh
#   probe, then BERT/DistilBERT training in both dtypes after the fix), call4c (fp32 training: compile time after
#   compile23's four changes, 0.58x of torch.compile's before), call3c (ablation), call10, call5c.
# Twenty-second session: three calls on an H100 (H200s did not come): call21a, call22a, call5b
#   (packages/bench/results/2026-12-05-h100*-s22-*). Found and fixed from them: BERT's bf16 training failed
#   its accuracy check (padded LM head: Note [Bases returned in another layout], aotgrad), ConvNeXt's bf16
#   training was slower than eager in eager layouts (Note [Depthwise convolutions in half-precision
#   training]), norm weight gradients at 9% of copy bandwidth (Note [Row statistics do not decide a column
#   reduction], codegen_triton), GPT-2 at 16 CPU threads 23x slower than eager (suspected second OpenMP
#   runtime; a link-by-path change for it was dropped after the probe). call22d then ran (H100): one OpenMP runtime there
#   (torch's libgomp.so.1), so not that; the guard checker's background build beside the timed calls slows
#   OpenMP at 16 threads 40-100x (now `nice -n 19`, and threads.py builds it first); outer_by_tiles A/B:
#   LLaMA's generated kernels 1.80 -> 1.09 ms a step. Next: call2 FIRST (bf16 inference of the whole suite
#   after this session's changes), then call5b (threads, to see whether GPT-2 at 16 threads was the build),
#   call4c (fp32 training), call2 --dtype float32, call3c (ablation: outer_by_tiles is new), call5c, call10.
# Twenty-first session: no device time (loans paused). New first: call21a (aotgrad's fusion-aware saves, Note [What
#   saving a value costs]: every training graph's forward now saves a norm's input and row statistics instead of the
#   normalised rows; bf16 training, GPU time against fusion_aware_saves=False, and loopir's index_select gather kernels
#   ride along). Then the twentieth session's queue unchanged: call5b FIRST among the rest, call5c, call3c, call4c +
#   call4, call2 --dtype float32, call10.
# Twentieth session: the device started only after five refusals (~20 min of waiting); call20a (call18's
#   cudagraph test: its one CUDA failure was the test's own stand-in pool, fixed; call19: reorder_gathers made T5's mask
#   kernels slower, now off; gpu_dynamic_check --quick all ok; GPT-2's dynamic sweep) and call2 ran
#   (results/2026-12-05-h200-s20-*). A third call (call5b threads + call5c) ended with "the device machine stopped
#   answering": nothing came back, and the budget was spent. Next: call5b FIRST (issue 20: 1/4/16 threads, now with
#   512-bit vectors on AVX-512, Note [512-bit vectors on AVX-512 targets]; if it hangs the machine again, run
#   --threads 1,4 and 16 in separate calls), call5c (dynamic LLaMA/ResNet), call3c (ablation), call4c + call4
#   (training), call2 with --dtype float32, call10.
# Nineteenth session: no device time (loans paused). Order: call18 FIRST, then call19 (T5's 5.17 mask kernel,
#   reorder_gathers on/off, issue 15), then call2 (also covers loopir's inplace_reuse: off for Triton, so no GPU
#   change expected; the Triton interpreter's index checks are interpreter-only), call4c, call10, call3c, call5
#   (dynamic: cat/pad backward and floats of sizes in decompositions are now symbolic), call5b/call5d (threads:
#   hoist_row_invariant is new).
# Eighteenth session: no device time (no machine was lent). Next, unchanged: call18 FIRST, then call2 — it now also
#   measures loopir's kernel order (Note [Kernels placed where they are first needed], option late_placement: every
#   backend's kernels move to just before their first reader; compare kiln against kiln:default:late_placement=False
#   on the suite's GPU time and peak memory), then call4c, call10, call3c, call5 (the dynamic sweep: comparisons and
#   builtins of sizes now stay symbolic), call5b/call5d (threads: narrow_lanes and peel_shifted_blocks are new).
# Seventeenth session: call13/call14/call15 (host time: call_overhead.py's reduce-overhead rows had timed the plain
#   wrapper, fixed; kiln's host time per call is half of torch.compile's or less), call16 and call17 (deferred
#   kernel loads: compile time; the T5 reorder did not fire) (results/2026-12-04-h200-s17-*). Next: call18 FIRST
#   (the CUDA-graph runner's fresh pool on re-recording: test_cudagraphs.py failed 3 cases on CUDA before the fix;
#   pool_values_max on the conv nets), then call2 (the whole suite after this session: overlap_compile,
#   reorder_reductions, pool_values_max, hooks traced in the frame), call4c (fp32 training: compile time
#   against torch.compile with the deferred loads), call10 over all 121 (PROCS=8), call3c (ablation).
# Sixteenth session: call10 (LeViT, DeBERTa), call9 (T5's math SDPA: its position bias's last stride), call11 (T5's
#   dense mask), call4c (fp32 training), call2 (bf16 inference, profiled), two bandwidth sweeps and call12
#   (results/2026-12-04-h200-s16-*). Next: call4 (bf16 training, not run since the thirteenth), call3c
#   (the ablation: cse, attention_dense_mask, far_output_fusion are new switches), call10 over all 121
#   (PROCS=8), fp32 inference (call2 with --dtype float32), call5 (dynamic on the H200), call5b/call5d.
# Fifteenth session: call10 (new: the breadth suite timed, packages/kiln/bench/breadth_speed.py) three
#   times (all, the 14 behind models with --profile, all again) and the public suite in bf16 without
#   profile (results/2026-12-03-h200-s15-*). Next: call10 ONLY=levit,deberta,deberta_v2 PROFILE=1
#   PROCS=1 (LeViT's attention-operand alignment, committed after the run; DeBERTa's recompiles),
#   then call2 + call9 (call9 ran only its ConvNeXt half: T5's part did not print), call3c (with
#   cse), call5b, call5d, call4b, call8, as below.
# Fourteenth session: no device time (the session's budget was spent by the thirteenth, whose
#   submission it completes). The queue stands as below, with call9 (scripts/gpu_diag_kernels.py:
#   T5's math-path attention, ConvNeXt's `clone` layer norms) to run beside call2.
# Thirteenth session: call2, call4, call5b and call3c ran (README, the thirteenth session's paragraph;
#   results/2026-12-03-h200-s13-*). Next: call5b again (its rows were not kept: it now writes
#   threads.json), call3c for the other five models (vit,resnet,convnext,gpt2,t5 done: reorder),
#   call4b (fp32 training), the ConvNeXt/ViT layer-norm kernels at 15-37% of copy bandwidth
#   (KILN_LOG=output_code on the H200: the CPU audit of the same models does not reproduce their
#   NCHW reads), call5d (the C++ parallel plans' thresholds at 16 threads, issue 20), then call2
#   to measure Note [One sum of a row] and Note [Patch convolutions as
#   GEMMs] (ViT, ConvNeXt: kiln against kiln:default:patch_conv=False; keep it on if ViT's conv
#   family drops from 0.32 ms and no model's GPU time grows).
# Twelfth session: call5a, call5c, call8s ran (README, the twelfth session's paragraph), and call7's
#   tests by hand (dynamo 146 passed; kiln test_dynamic 45 passed, 6 failed, all torch 2.11/Triton 3.6
#   only: 4 max-pool cases, a parity guard of torch 2.11's pooling meta kernel, and 2 batch-norm
#   cases under Triton 3.6's interpreter, which cannot take `range()` over a symbolic rnumel; the
#   same runs locally with `scripts/torch_version_check.sh`). Next: call2 (bf16 inference suite
#   and reduce-overhead, after this session's changes), call4, call4b, call2c, call3/call3b.
# call1 (issue 15, conv9): channels-last training is on by default now (Note [Channels-last for
#   convolutions]: no grouped/depthwise conv) with max-pool backward generated (Note [Max pooling
#   backward as a gather]) and short column-reduction chunks (Note [Short chunks of column
#   reductions]): their CUDA tests, then fp32 and bf16 training of the conv models, profiled, with
#   each switch off in turn. Keep NHWC on by default if kiln <= kiln:...:layout_training=False on CNN
#   and ResNet in both dtypes; ConvNeXt must stay in eager layouts (depthwise veto). (The matmul
#   templates' tests and benchmark, call1 before, ran this session: /work/.device/1/mm-templates.json.)
# call2 (issues 14 + 15): bf16 inference of the whole suite, eager/kiln/torch.compile and both
#   reduce-overhead modes, profiled. Ran in the ninth session at f3e0b08 (2.13x vs 1.82x; RO 3.25x vs
#   2.38x: packages/bench/results/2026-12-02-h200-s9-*); run again after call1/call2c to see their effect.
#   call2b (host time by layer, RO, BERT vs DistilBERT) ran too (2026-12-02-h200-s9-printed.md).
# call2c (issue 14, overhead9): default-mode host time of the conv nets and GPT-2, inference and training,
#   with Note [A lean wrapper] (codegen_triton wrapper.py) off then on
#   (KILN_LEAN_WRAPPER=0 against the defaults; torch.compile alongside; the new pooling bindings are on in both): host ms per
#   call and launches from --profile. CPU estimate: scripts/triton_wrapper_overhead.py.
# call3 (issue 15): the ablation, GPU busy time (each switch off in turn), half the suite per call.
# call4 (issues 14 + 15): bf16 training (ran in the ninth session: 1.409x vs 1.361x) and fp32 training
#   (call4b, not run since the seventh session) of the whole suite.
# call5 (issue 17): the dynamic sweep on the H200. First dyn9's re-check of GPT-2 (was: dynamic/static
#   geomean 2.12, worst 3.18; dyn9 removed the symbolic wrapper's full input checks, the copies of
#   views with symbolic strides (logits, QKV heads) and layer-norm statistics through scratch
#   memory), then LLaMA and ResNet. call5b (issue 20): the CPU at 1/4/16 threads.
# call6 (issues 16 + 17): the dynamo suite under the H200 machine's Python 3.12 and torch 2.11
#   (issue 16 asks for it once), then BatchNorm training under dynamic=True on CUDA (tenth
#   session's wrong answer, Note [Batch norm under symbolic sizes], fixed and tested on the CPU
#   and under Triton's interpreter only).
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
      timeout 100 python3 -m pytest -q -p no:cacheprovider packages/codegen_triton/tests/test_pooling_triton.py packages/codegen_triton/tests/test_reductions.py packages/codegen_triton/tests/test_passes.py -k "pool or split or few_channels or short_chunks or channels_last" 2>&1 | tail -6
      bench train-f32-conv 220 --dtype float32 --modes training --models cnn,resnet,convnext --repeats 10 --warmup 3 --profile --profile-calls 3 \
        --backends eager,kiln,kiln:default:layout_training=False,inductor
      bench train-bf16-conv 230 --dtype bfloat16 --modes training --models cnn,resnet --repeats 10 --warmup 3 --profile --profile-calls 3 \
        --backends kiln,kiln:default:layout_training=False,kiln:default:pool_backward=False,kiln:default:triton.split_outer_min_chunk=256,inductor ;;
    call1b)
      bench train-bf16-conv 230 --dtype bfloat16 --modes training --models cnn,resnet --repeats 10 --warmup 3 --profile --profile-calls 3 \
        --backends kiln,kiln:default:layout_training=False,inductor ;;
    call2)
      bench inference-bf16 560 --dtype bfloat16 --modes inference --repeats 30 --profile \
        --backends eager,kiln,kiln:reduce-overhead,inductor,inductor:reduce-overhead ;;
    call2b)
      timeout 400 python3 packages/kiln/bench/call_overhead.py --device cuda --dtype bfloat16 --mode reduce-overhead --models bert,distilbert,mlp --no-torch 2>&1 | tail -40 ;;
    call2c)
      KILN_LEAN_WRAPPER=0 bench host-lean-off 270 --dtype bfloat16 --modes inference,training \
        --models resnet,convnext,gpt2 --repeats 20 --warmup 5 --profile --profile-calls 5 --backends kiln,inductor
      bench host-lean-on 270 --dtype bfloat16 --modes inference,training --models resnet,convnext,gpt2 --repeats 20 \
        --warmup 5 --profile --profile-calls 5 --backends kiln ;;
    call3)
      bench ablation-a 560 --dtype bfloat16 --modes inference --models gpt2,bert,llama,t5,mlp --repeats 10 --profile --profile-calls 3 --ablation --backends eager,kiln ;;
    call3c)  # the ablation, GPU busy time only, so few timed calls; the whole suite needs ~1000 s (twenty-ninth
      # session), so in three calls: call3c, call3d, call3e
      bench ablation-a 440 --dtype bfloat16 --modes inference --models resnet,convnext,vit,gpt2 \
        --repeats 3 --warmup 1 --profile --profile-calls 2 --ablation --backends kiln ;;
    call3d)
      bench ablation-b 440 --dtype bfloat16 --modes inference --models mlp,cnn,bert,distilbert,llama \
        --repeats 3 --warmup 1 --profile --profile-calls 2 --ablation --backends kiln ;;
    call3e)
      bench ablation-c 250 --dtype bfloat16 --modes inference --models t5 \
        --repeats 3 --warmup 1 --profile --profile-calls 2 --ablation --backends kiln ;;
    call3b)
      bench ablation-b 560 --dtype bfloat16 --modes inference --models vit,resnet,convnext,cnn,distilbert --repeats 10 --profile --profile-calls 3 --ablation --backends eager,kiln ;;
    call21a)  # twenty-first session: fusion-aware saves (aotgrad), training, GPU time per step
      bench train-bf16-saves 560 --dtype bfloat16 --modes training --models bert,gpt2,vit,llama,t5,convnext --repeats 10 --warmup 3 \
        --profile --profile-calls 3 --backends kiln,kiln:default:fusion_aware_saves=False,inductor ;;
    call30s)  # thirtieth session (helper cpu30): aotgrad's Note [Recomputing from many values] and loopir's Note
      # [Outputs read back] (a residual stream's sums saved and read back, not recomputed from every projection),
      # bf16 training, GPU time per step, both switched off against on. Expect the transformers' generated
      # kernels a few percent less GPU time (CPU: LLaMA's kernels -17%), CNNs unchanged; ~8 min
      bench train-bf16-residual 560 --dtype bfloat16 --modes training --models llama,gpt2,t5,vit,bert --repeats 10 \
        --warmup 3 --profile --profile-calls 3 \
        --backends kiln,kiln:default:recompute_sources=False+outputs_read_back=False,inductor ;;
    call25a)  # twenty-fifth session: ResNet-50 bf16 training after the grouped write-back (aotgrad, Note [Write-backs
      # in one call]: 183 memcpy a step before, "copies" in the profile row) and one accumulator per reduced value
      # (codegen_triton, Note [One accumulator per reduction of a value]: the BatchNorm statistics' partial kernels ran
      # six identical Welford triples, 24-29% of copy before); then GPT-2 at 16 CPU threads with full_teams=0 (76 ms at
      # b27ab39, before Note [Teams keep the pool's size]; 3.1 ms at 8a02c42): is full_teams what fixed it?
      TAIL=14 bench train-bf16-resnet-s25 100 --dtype bfloat16 --modes training --models resnet --repeats 6 --warmup 2 \
        --profile --profile-calls 2 --backends eager,kiln
      grep -E "bandwidth:" "$out/train-bf16-resnet-s25.log" | cut -c1-300
      timeout 40 python3 scripts/omp_probe.py --threads 16 --models gpt2 --calls 8 --cpp full_teams=0 --label full_teams=0 \
        --out "$out/probe16.jsonl" 2>&1 | grep "^gpt2" ;;
    call25b)  # twenty-fifth session (helper ln25): the layer-norm backward's column partials (Note [Partials of a
      # column reduction stay column reductions], codegen_triton split.py), kiln against the form before
      # (triton.outer_partials=False) in GPT-2 and BERT bf16 training: per backend, the "bandwidth:" line (kernels
      # >= 16 MB at >= 70% of copy, ms a call below it, the slowest: *_rsqrt_sub_sum_*_partial, *_mul_sum_view_*_partial
      # were 42-55% before) and the JSON's extra.profile families.generated ms and bandwidth.slowest; then the
      # same graph alone (bench/bandwidth.py: kiln, its variants, eager, torch.compile; rows of 768, 4096 tokens),
      # and a bf16 [8, 393216] sum over the batch like GPT-2's position-embedding gradient (38% before) at wider tiles
      TAIL=40 bench train-bf16-ln25 90 --dtype bfloat16 --modes training --models gpt2,bert --repeats 6 --warmup 2 \
        --profile --profile-calls 2 --backends kiln,kiln:default:triton.outer_partials=False
      grep -E "bandwidth:" "$out/train-bf16-ln25.log" | cut -c1-400
      peak=$(python3 -c "import torch; print(2.88 if 'H100' in torch.cuda.get_device_name() else 4.3)")
      timeout 40 python3 packages/codegen_triton/bench/bandwidth.py --out "$out/lnb-768.json" --dtype bfloat16 \
        --row 768 --sizes 3 --only layer_norm_backward --reps 7 --peak "$peak" \
        --variants "outer_partials=0;split_outer_min_chunk=64;split_outer_min_chunk=16" 2>&1 | tail -6
      timeout 25 python3 packages/codegen_triton/bench/bandwidth.py --out "$out/colsum-8rows.json" --dtype bfloat16 \
        --row 393216 --sizes 3 --only col_sum --reps 7 --peak "$peak" \
        --variants "OUTER_PERSISTENT_XBLOCK=256;OUTER_PERSISTENT_XBLOCK=256,PERSISTENT_WARPS=4;OUTER_PERSISTENT_XBLOCK=512" 2>&1 | tail -6 ;;
    call28a)  # twenty-eighth session (issue 15): Note [Convolution weights in NHWC] (loopir: a channels-last
      # convolution's weight copied NHWC in the graph, not by aten's 4.5 us strided copy inside every convolution: 33
      # direct_copy kernels, 148 us, a ResNet-50 bf16 training step on the H100 in s26; 17, 75 us, an inference call),
      # with the twenty-seventh session's GPU changes (Welford tiles for every row length, the pooling backward's
      # `self` read for its shape). Every kernel of a ResNet-50 and a ConvNeXt bf16 training step, kiln against
      # torch.compile (s26: ResNet-50 8.36 against 7.06 ms of kernels; s27: ConvNeXt's generated kernels 3.58 against
      # 3.08 ms, aten 0.62 against 0.48); then BERT's CPU training compile at 16 threads (Note [Tunings that are slow
      # to compile]: 29.8 s before, ~4-5 s expected)
      for m in resnet convnext; do
        timeout 200 python3 scripts/gpu_kernel_table.py --model $m --mode training --dtype bfloat16 --top 30 \
          --out "$out/ktable-$m-train.json" > "$out/ktable-$m-train.log" 2>&1
        grep -v -i -E "warn|usdt" "$out/ktable-$m-train.log" | grep -E "^==| ms +[0-9]+x|direct_copy" | cut -c1-150; done
      KILN_CACHE_DIR=$(mktemp -d) timeout 50 python3 -m kiln_bench --size cpu --device cpu --threads 16 --modes training \
        --models bert --backends kiln --repeats 4 --warmup 1 2>&1 | grep -E "^bert " | cut -c1-220 ;;
    call28b)  # twenty-eighth session (issue 15): Note [Convolution weights in NHWC] in inference (17 weight copies a
      # ResNet-50 bf16 call, 75 us, in s27), against nhwc_weights=False and torch.compile, GPU busy time per call
      bench infer-bf16-weights 150 --dtype bfloat16 --modes inference --models resnet,convnext --repeats 10 \
        --warmup 3 --profile --profile-calls 3 --backends kiln,kiln:default:nhwc_weights=False,inductor ;;
    call28c)  # twenty-eighth session (issue 15): Note [Convolution bias gradients in generated code] (loopir
      # conv_bias pass): a CUDA convolution backward's bias gradient as a generated column sum, not PyTorch's reduce
      # kernel (ConvNeXt bf16 training on the H100: 22 at::native::reduce_kernel, 0.60 ms a step; torch.compile none;
      # s28's kernel table before it: kiln 9.34 ms of kernels a step, tc 8.78). The step against conv_bias_grad=False
      # and torch.compile (GPU ms, launches, families)
      TAIL=14 bench train-bf16-convnext 200 --dtype bfloat16 --modes training --models convnext --repeats 8 --warmup 3 \
        --profile --profile-calls 3 --backends kiln,kiln:default:conv_bias_grad=False,inductor ;;
    call28d)  # twenty-eighth session (issue 15): ConvNeXt's layer-norm backward weight/bias partials ran at 17% of copy
      # on the H100 (bf16 training, s28 call28c: *_to_copy_add_mul_rsqrt_sub_sum_{204..214}_partial, 18.6 MB in 40 us,
      # 37.5 MB in 77 us; rows of 96-768 channels over 1568-100352 tokens). The same graph alone at ConvNeXt-T's
      # three widest stages (bench/bandwidth.py layer_norm_backward, bf16), kiln against its switches, eager and
      # torch.compile; then the model's own source of those kernels (KILN_LOG=output_code, the log kept in $out)
      for shape in "96 9.634" "192 4.817" "384 2.408"; do set -- $shape
        timeout 70 python3 packages/codegen_triton/bench/bandwidth.py --only layer_norm_backward --dtype bfloat16 \
          --row $1 --sizes $2 --peak 3.35 --reps 7 \
          --variants "outer_partials=1;split_outer_min_chunk=128;split_outer_min_chunk=512" \
          --out "$out/bw-lnb-$1.json" 2>&1 | grep -E "^layer_norm|variant" | cut -c1-140; done
      KILN_LOG=output_code timeout 60 python3 -m kiln_bench --size gpu --device cuda --dtype bfloat16 --modes training \
        --models convnext --backends kiln --repeats 1 --warmup 0 > "$out/convnext-train-source.log" 2>&1
      grep -A34 -E "def triton_red_fused__to_copy_add_mul_rsqrt_sub_sum_21[0-4]_partial" "$out/convnext-train-source.log" \
        | head -40 | cut -c1-200 ;;
    call34a)  # thirty-fourth session (issue 14): the launch micro-benchmark with where a default-mode call's host time
      # goes per kernel (the wrapper alone, its launches as no-ops, bare allocations; the wrapper kept in $out), the
      # CUDA-graph and launcher tests on CUDA, then call32g's synchronization probe on GPT-2 and the MLP (the two models
      # whose default-mode host time is above torch.compile's, s32: both about their GPU time)
      timeout 150 python3 scripts/gpu_launch_bench.py --kernels 200 --out "$out/launch.json" 2>&1 | grep -v -i warn | tail -14
      timeout 150 python3 -m pytest -q -p no:cacheprovider packages/codegen_triton/tests/test_cudagraphs.py \
        packages/codegen_triton/tests/test_launcher.py packages/codegen_triton/tests/test_worker_launchers.py 2>&1 | tail -4
      timeout 150 python3 scripts/sync_probe.py --models gpt2,mlp 2>&1 | grep -v -i -E "warn|usdt" | tail -24 ;;
    call35e)  # thirty-fifth session (issue 14): codegen_triton's whole suite on CUDA after the test fixes of s35 (carry
      # [".whl"]: expecttest for test_opinfo.py); expected: all pass
      timeout 560 python3 -m pytest -v --tb=short -p no:cacheprovider packages/codegen_triton/tests > "$out/triton-suite.log" 2>&1
      grep -E "FAILED|ERROR" "$out/triton-suite.log" | head -30; tail -3 "$out/triton-suite.log" ;;
    call35f)  # thirty-fifth session (issue 20): call35d's four models its budget skipped, training at 1/4/16 threads
      timeout 560 python3 packages/codegen_cpp/bench/threads.py --mode training --threads 1,4,16 \
        --models mlp,t5,convnext,resnet --budget-s 520 --row-s 2 --kernels 0 \
        --out "$out/threads-training-b.json" > "$out/threads-training-b.log" 2>&1
      grep -v -E "Warning|USDT" "$out/threads-training-b.log" | tail -30 | cut -c1-220 ;;
    call35g)  # thirty-fifth session (issue 20): where the CNN's training step stops scaling (s35 on the H200 host:
      # kiln 16.8 / 10.1 / 6.4 ms at 1 / 4 / 16 threads, eager 30.2 / 11.1 / 6.5, torch.compile 22.8 / 9.3 / 6.2) and
      # why ResNet inference is slower at 16 threads than at 4 (1.91 -> 2.23 ms; torch.compile 2.10 -> 2.04): each
      # kernel's fastest call per thread count, then the same for ResNet's inference call
      timeout 250 python3 packages/codegen_cpp/bench/kernel_time.py --models suite.cnn --threads 1,4,16 --top 25 2>&1 \
        | grep -v -i -E "warn|usdt" | tail -32
      timeout 250 python3 packages/codegen_cpp/bench/kernel_time.py --models suite.resnet --inference --threads 1,4,16 \
        --top 20 2>&1 | grep -v -i -E "warn|usdt" | tail -26 ;;
    call35a)  # thirty-fifth session (issue 14): Note [Native launches] (a C launch object per kernel instead of the
      # Python function calling Triton's C launch): the launch micro-benchmark (kiln native, kiln with Triton's
      # launcher, torch.compile; one launch each way, GIL released and kept), the native tests, then call34e (the
      # whole codegen_triton suite on CUDA, every kernel kind through the native launch), verbose into $out
      timeout 150 python3 scripts/gpu_launch_bench.py --kernels 200 --out "$out/launch.json" 2>&1 | grep -v -i warn | tail -20
      timeout 60 python3 -m pytest -q -p no:cacheprovider packages/codegen_triton/tests/test_native_launch.py 2>&1 | tail -3
      timeout 340 python3 -m pytest -v --tb=short -p no:cacheprovider packages/codegen_triton/tests > "$out/triton-suite.log" 2>&1
      grep -E "FAILED|ERROR" "$out/triton-suite.log" | head -30; tail -3 "$out/triton-suite.log" ;;
    call35b)  # thirty-fifth session (issue 14): the per-model effect of native launches, bf16 inference of the suite,
      # default mode, profiled: kiln, kiln with Triton's launcher (triton.native_launch=False), torch.compile
      TAIL=60 bench inference-bf16-native 560 --dtype bfloat16 --modes inference --repeats 20 --warmup 5 --profile \
        --profile-calls 3 --backends eager,kiln,kiln::triton.native_launch=False,inductor ;;
    call35c)  # thirty-fifth session (issue 20): the public suite on the host's CPU at 1/4/16 threads, inference,
      # eager / kiln / torch.compile interleaved (call5b at today's code; s25's: kiln 1.46/1.55/1.72, tc 1.34/1.43/1.55)
      timeout 300 python3 packages/codegen_cpp/bench/threads.py --threads 1,4,16 --models resnet,gpt2,bert,mlp,cnn,convnext,t5,llama \
        --budget-s 280 --kernels 0 --out "$out/threads.json" > "$out/threads.log" 2>&1; grep -v -E "Warning|USDT" "$out/threads.log" | tail -45 ;;
    call35d)  # thirty-fifth session (issue 20): training steps at 1/4/16 threads (call25c at today's code)
      timeout 300 python3 packages/codegen_cpp/bench/threads.py --mode training --threads 1,4,16 \
        --models gpt2,resnet,bert,llama,cnn,mlp,t5,convnext --budget-s 250 --row-s 2 --kernels 0 \
        --out "$out/threads-training.json" > "$out/threads-training.log" 2>&1
      grep -v -E "Warning|USDT" "$out/threads-training.log" | tail -45 | cut -c1-220 ;;
    call34e)  # thirty-fourth session (issue 14): codegen_triton's whole test suite on CUDA after the fixes of the CUDA failures
      # found in s34 (negative zero constants, cuDNN TF32 in the session, wrapper tests on the session's device); expected: all pass
      timeout 560 python3 -m pytest -q -p no:cacheprovider packages/codegen_triton/tests 2>&1 | tail -12 ;;
    call34d)  # thirty-fourth session (issue 14, the four suite configurations in one session: this one, call34b, call34c):
      # fp32 inference of the suite, eager / kiln / torch.compile, both reduce-overhead modes; then call34a's launch
      # micro-benchmark (with the breakdown) and the synchronization probe
      bench inference-f32 330 --dtype float32 --modes inference --repeats 20 --warmup 5 \
        --backends eager,kiln,kiln:reduce-overhead,inductor,inductor:reduce-overhead
      timeout 110 python3 scripts/gpu_launch_bench.py --kernels 200 --out "$out/launch.json" 2>&1 | grep -v -i warn | tail -14
      timeout 100 python3 scripts/sync_probe.py --models gpt2,mlp 2>&1 | grep -v -i -E "warn|usdt" | tail -24 ;;
    call34b)  # thirty-fourth session (issue 14): bf16 inference of the suite, profiled (call2)
      bench inference-bf16 570 --dtype bfloat16 --modes inference --repeats 30 --profile \
        --backends eager,kiln,kiln:reduce-overhead,inductor,inductor:reduce-overhead ;;
    call34c)  # thirty-fourth session (issue 14): bf16 and fp32 training of the suite (call29b + call4c)
      bench training-bf16 290 --dtype bfloat16 --modes training --repeats 8 --warmup 3 --backends eager,kiln,inductor
      bench training-f32 290 --dtype float32 --modes training --repeats 8 --warmup 3 --backends eager,kiln,inductor ;;
    call32d)  # thirty-second session: breadth_speed.py's float32 arbiter (Note [Eager is not always the reference]) on
      # the rows that differed from eager in s30's breadth run. Expected: deepseek_v3's kiln row timed, flagged "e" (eager
      # off float32, kiln within tolerance); funnel, vit_mae, vae: which side float32 takes
      KILN_COMPILE_WORKERS=2 timeout 300 python3 packages/kiln/bench/breadth_speed.py --device cuda --dtype bfloat16 \
        --only deepseek_v3,funnel,vit_mae,vae --calls 2 --rounds 3 --backends eager,kiln,inductor \
        --json "$out/breadth-arbiter.json" > "$out/breadth-arbiter.log" 2>&1
      grep -v -i warn "$out/breadth-arbiter.log" | tail -12 | cut -c1-230 ;;
    call32c)  # thirty-second session (issue 20, helper cpu32): loopir Note [Small convolutions outside oneDNN] (float32 CPU
      # training convolutions of <= 2^20 multiply-adds on PyTorch's native im2col kernel, option native_small_conv) and
      # codegen_cpp's laid_out_inputs, measured at one thread on the 2-core box (PVT v2 5.34 -> 4.16 ms a step, torch.compile
      # 5.36; breadth ResNet 3.69 -> 2.05). The native kernel parallelizes over the batch only: does it hold at 16 threads?
      # kiln_ab is kiln with native_small_conv=false. Expected: kiln <= kiln_ab at 1 thread; at 16 threads, if kiln_ab wins,
      # the pass needs a thread-aware threshold
      for t in 1 16; do
        timeout 270 python3 packages/codegen_cpp/bench/train1.py --models breadth.pvt_v2,breadth.resnet,breadth.levit \
          --backends eager,kiln,kiln_ab,inductor --ab-options native_small_conv=false --threads $t --repeats 20 \
          --out "$out/native-conv-$t.json" > "$out/native-conv-$t.log" 2>&1
        grep -v -i -E "warn|usdt" "$out/native-conv-$t.log" | tail -8 | cut -c1-200
      done ;;
    call32g)  # thirty-second session (issue 14): GPT-2's default-mode host time a call is about its GPU time under kiln and
      # torch.compile alike (1.86 / 1.46 ms for 1.78 / 1.51 ms of kernels, s32 call2) while at tiny size kiln's host time is
      # below torch.compile's (0.82 / 1.14 ms): does the call wait on the GPU? Synchronizing CUDA calls of a warm call and
      # the host time behind a queue of GPU work against on an idle GPU
      # ResNet-50 fp32 too: kiln's host 3.74 ms for 2.96 of kernels, torch.compile's 3.01 for 2.91 (s28), where in bf16
      # the same 125 launches take the host 1.82 ms: host time that grows with the GPU's is a wait
      timeout 150 python3 scripts/sync_probe.py --models gpt2,bert,resnet 2>&1 | grep -v -i -E "warn|usdt" | tail -24
      timeout 100 python3 scripts/sync_probe.py --models resnet --dtype float32 2>&1 | grep -v -i -E "warn|usdt" | tail -10 ;;
    call31o)  # thirty-first session (issue 20, helper cpu31): loopir Note [Outer products are multiplications]
      # (a bmm/mm with a reduction length of one as a broadcast multiplication, CPU graphs) on the host's 16-core CPU,
      # training, pass on against off in one run. On this 2-core box at one thread: PVT v2 / LeViT / MobileViT 1.3%
      # faster in the geomean (within noise), at two threads 4-6%. Expected: on no slower than off
      KILN_COMPILE_WORKERS=2 timeout 560 python3 packages/kiln/bench/breadth_speed.py --device cpu --mode train \
        --threads 16 --backends eager,kiln,kiln@outer_product=false --only pvt_v2,levit,mobilevit --calls 1 \
        --rounds 60 --json "$out/outer-product-16t.json" > "$out/outer-product-16t.log" 2>&1
      grep -v -i warn "$out/outer-product-16t.log" | tail -12 | cut -c1-200 ;;
    call31h)  # thirty-first session (issue 14, helper host31): reduce-overhead's wall against its GPU time after
      # Note [The runner's per-call path] (codegen_triton/cudagraphs.py: a replay's checks planned into one closure,
      # static pointers in one C loop of kiln_dynamo's tensor checker instead of torch's pybind helper, copy_ for one
      # copied input) and four small per-call cuts (aotgrad run_plain and guarded check, the backend's per-call
      # context, frame_hook's set_thread_callback). Before (H100, s30 and earlier): wall / GPU busy BERT 1.215, ViT
      # 1.19, ResNet-50 1.17, MLP 1.35 (target <= 1.15). Expected: the runner 2-4x cheaper (CPU: runner_overhead.py
      # --c-check; H200 s17 cProfile had torch's helper at 12-25 us a call on GPT-2..ResNet), host ms down ~5-20 us
      # a call, ratios down ~0.01-0.03; the MLP's floor (frame hook, module call, guard, replay launch) mostly stays
      TAIL=16 bench infer-bf16-ro-plan 190 --dtype bfloat16 --modes inference --repeats 20 --warmup 5 --profile \
        --profile-calls 3 --backends kiln:reduce-overhead ;;
    call31a)  # thirty-first session (issue 14, helper host31): the plan's A/B on the GPU, in one run (interleaved),
      # and the pointer check's forms on the GPU host's CPU (torch's CUDA helper against map(Tensor.data_ptr)):
      # on this CPU the helper's code was 1.3-1.8x slower than map at 27/109/268 nn.Parameters, the C loop 3-7x
      # faster than map. Expected: the "steps" rows show the helper slower than map; the runner with --c-check
      # 2-4x faster than before; plan on <= plan off in host ms on every kiln_bench row
      timeout 40 python3 packages/codegen_triton/bench/runner_overhead.py --models mlp,bert,resnet --steps \
        --calls 2000 --rounds 7 2>&1 | tail -30
      timeout 60 python3 packages/codegen_triton/bench/runner_overhead.py --c-check --calls 2000 --rounds 9 2>&1 | tail -21
      TAIL=12 bench infer-bf16-ro-plan-ab 150 --dtype bfloat16 --modes inference --models mlp,bert,vit --repeats 30 \
        --warmup 5 --profile --profile-calls 3 --backends kiln:reduce-overhead,kiln:reduce-overhead:triton.cudagraph_plan=False ;;
    call30r)  # thirtieth session (issue 14): CUDA graphs in training after Note [Outputs that are inputs]
      # (codegen_triton/cudagraphs.py). Before (s30, H100, bf16): every training forward returns inputs it saves for
      # the backward, so its CUDA graph was turned off ("an output aliases an input"): kiln:reduce-overhead ResNet-50
      # 15.90 ms a step (kiln default 16.77, torch.compile reduce-overhead 9.26), GPT-2 12.35 (10.94, 12.42), CNN
      # 5.16 (4.66, 4.69). Expected: no "CUDA graphs off" line, ResNet-50 near torch.compile's; the gradient check
      # must pass on every row
      TAIL=16 bench train-bf16-cudagraphs 420 --dtype bfloat16 --modes training --models resnet,cnn,gpt2,convnext \
        --repeats 8 --warmup 3 --backends kiln,kiln:reduce-overhead,inductor:reduce-overhead
      grep -c "CUDA graphs off" "$out/train-bf16-cudagraphs.log" ;;
    call30d)  # thirtieth session (correctness): the breadth suite on an H100 (call10, s30) found deepseek_v3's bf16
      # logits from kiln outside the 0.05 tolerance (219 of 1536 elements, max 0.19: about two of sixteen tokens),
      # torch.compile inside; on the CPU (C++ generator, and the Triton generator under the interpreter with the
      # CUDA rules forced) kiln matches. Suspects: a mixture of experts' routing flipped by a last-bit difference
      # upstream (its group choice compares sums of sigmoids), or a CUDA-only pass (attention, attention_mask,
      # pad_mm). Each switch off in turn, and float32 (a routing flip from rounding should vanish there)
      for dt in bfloat16 float32; do
        KILN_COMPILE_WORKERS=2 timeout 200 python3 packages/kiln/bench/breadth_speed.py --device cuda --dtype $dt \
          --only deepseek_v3,qwen3_moe,mixtral --calls 2 --rounds 3 --json "$out/ds-$dt.json" \
          --backends eager,kiln,kiln@attention=false,kiln@attention_mask=false,kiln@pad_mm=false,kiln@cse=false,inductor \
          > "$out/ds-$dt.log" 2>&1; grep -v -i -E "warn" "$out/ds-$dt.log" | tail -8 | cut -c1-250
        python3 -c "import json,sys; [print(r['model'], b, v.get('mismatch', '')[:120]) for r in json.load(open(sys.argv[1]))['rows'] for b, v in r.items() if isinstance(v, dict) and v.get('mismatch')]" "$out/ds-$dt.json"
      done ;;
    call31d)  # thirty-first session (correctness, helper fix31): isolates deepseek_v3's bf16 mismatch (call30d's rows,
      # identical on the H200 in s15 and the H100 in s30: 219/1536, max 0.19 at (0,1,47); logits peak at 0.39 here, and
      # flipping two tokens' experts moves them by 0.024 only, so a routing flip cannot explain it: something computes
      # wrong). The CPU matches bit for bit (C++, Triton's interpreter with layout_policy=cuda and pad_mm=force, and
      # transformers' CUDA experts path forced: histc of int32 ids), as do the GPU wrapper's pointer variant (read).
      # scripts/module_probe.py compiles every submodule alone on the inputs eager gave it: the first mismatching
      # module names the cause. Then the whole model with the GPU-only launch/wrapper paths off, and passes off.
      # Expected: one module (or its children) differs; or only the whole model does (then a fusion across modules).
      # --sdpa: each attention call eager made, every backend as given and on dense copies (kiln aligns q/k/v on CUDA
      # and picks its kernel from fake tensors: MLA's v is a view at an 8-byte offset, (384, 12, 48, 1))
      timeout 190 python3 scripts/module_probe.py --model deepseek_v3 --device cuda --dtype bfloat16 --whole --sdpa \
        --variant KILN_TRITON_DIRECT_LAUNCH=0,KILN_DIRECT_CALLS=0,KILN_LEAN_WRAPPER=0,KILN_VIEWED_BUFFERS=0 \
        --variant attention=false --variant attention_mask=false --variant cse=false --variant far_output_fusion=false \
        --variant tiny_fusion=false --variant outputs_read_back=false --variant view_scatter=false \
        --variant index_select=false --variant late_placement=false --variant inplace_reuse=false \
        > "$out/ds-modules.log" 2>&1; grep -v -i warn "$out/ds-modules.log" | tail -60 | cut -c1-220 ;;
    call30p)  # thirtieth session (breadth): nine hand-written programs of the breadth suite failed in eager on the
      # H100 (call10, s30: CPU tensors made in forward, a float32 buffer scattered into in bf16, lengths for
      # pack_padded_sequence on CUDA, autocast for "cpu"), so no compiler was measured on them. Fixed (helper bench30:
      # tensors on the input's device and dtype, lengths.cpu(), autocast on the input's device type). Expected: every
      # row has eager/kiln/inductor times, no "error" and no "mismatch"; packed_lstm keeps its 3 breaks (4/3), the
      # others 1/0. torch.compile's first calls dominate (~20-60 s each on the CPU host)
      KILN_COMPILE_WORKERS=2 timeout 420 python3 packages/kiln/bench/breadth_speed.py --device cuda --dtype bfloat16 \
        --only unet_blocks,detection_head,spatial_transformer,gnn_message_passing,namedtuple_pooler,greedy_decode,moe_topk,packed_lstm,autocast_mlp \
        --calls 4 --rounds 10 --json "$out/programs-bf16.json" > "$out/programs-bf16.log" 2>&1
      grep -v -i -E "warn" "$out/programs-bf16.log" | tail -16 | cut -c1-230
      python3 -c "import json,sys; [print(r['model'], b, (v.get('error') or v.get('mismatch'))[:160]) for r in json.load(open(sys.argv[1]))['rows'] for b, v in r.items() if isinstance(v, dict) and (v.get('error') or v.get('mismatch'))]" "$out/programs-bf16.json" ;;
    call30b)  # thirtieth session (issue 15, helper bn30): codegen_triton's Note [Welford chunks] (split.py), never run on a
      # GPU. ResNet-50's BatchNorm statistics (Welford column reductions, split partial + second kernel) took 0.97 ms
      # a bf16 training step against torch.compile's 0.66 (s28 kernel table), worst at 14x14 and 7x7 (49-row chunks:
      # partials 1.6-2.7x torch.compile's). The rule cuts chunks of >= 128 rows as the row's largest divisor within the
      # program target (49 x 128 at 6272 rows, 196 x 128 at 25088, 784 x 128 at 100352) and gives the partial
      # torch.compile's tile (X16 R32 w4 up to 32768 outputs, else X64 R8 w4). First the statistics alone at eight of
      # ResNet-50's ten shapes (C, map side, 2^20 elements at batch 32), rule on against welford_chunks=0; then the
      # step, kiln against the rule off and torch.compile. Expect the partial + second kernel per BatchNorm closer to
      # torch.compile's at 14x14/7x7 (kiln 13.9 / 10.7 us against 5.6 / 4.7 at C=256/512), the BatchNorm total
      # 0.97 ms -> ~0.75 ms, ResNet-50's GPU time down ~0.2 ms; if a shape is slower, the bandwidth rows say which
      for shape in "64 112 24.5" "64 56 6.125" "256 56 24.5" "128 28 3.0625" "512 28 12.25" "256 14 1.53125" \
          "1024 14 6.125" "2048 7 3.0625"; do set -- $shape
        timeout 25 python3 packages/codegen_triton/bench/bandwidth.py --only bn_stats --dtype bfloat16 --row $1 --hw $2 \
          --sizes $3 --peak 3.35 --reps 7 --variants "welford_chunks=0" \
          --out "$out/bw-bn30-$1-$2.json" 2>&1 | grep -E "^bn_stats|variant" | cut -c1-120; done
      timeout 150 python3 -m kiln_bench --size gpu --device cuda --dtype bfloat16 --modes training --models resnet \
        --backends kiln,kiln:default:triton.welford_chunks=False,inductor --profile --profile-calls 3 \
        --repeats 8 --warmup 3 --out "$out/resnet-bn30" > "$out/resnet-bn30.log" 2>&1
      grep -v -E "models:|warn" "$out/resnet-bn30.log" | tail -32 | cut -c1-200 ;;
    call29w)  # twenty-ninth session (issue 15): the MLP's fp32 inference GPU time is 1.5% above torch.compile's (s28 call2
      # fp32): its five layer norm + GELU kernels over [4096, 1024] float32 take 16.3-16.9 us each, torch.compile's 13.9
      # (58% against 69% of the H100's copy). kiln gives rows of 1024 one warp each (Note [One warp per row], swept at
      # 16M/64M elements only, where fp32 was "as fast either way"); at 4M elements the 4096 one-warp programs may be
      # too few bytes in flight. Sweep the rule off and fixed warp counts at 4M and 16M elements
      timeout 100 python3 packages/codegen_triton/bench/bandwidth.py --only layer_norm,softmax --dtype float32 --row 1024 \
        --sizes 4,16 --peak 3.35 --reps 7 --variants "WARP_ROW_RBLOCK=0;PERSISTENT_WARPS=2;PERSISTENT_WARPS=4;PERSISTENT_WARPS=8" \
        --out "$out/bw-ln-f32.json" 2>&1 | grep -E "^layer_norm|^softmax|variant" | cut -c1-120 ;;
    call29b)  # the end-to-end training row issues 14 and 15 still need at today's code (last: bf16 s25 at 8a02c42, fp32
      # s26 at 6b7ad2c): bf16 training of the whole suite, eager / kiln / torch.compile in one run, 8 timed steps
      # (fits one call; call4c is the fp32 row). Every row must pass its gradient check
      bench training-bf16 560 --dtype bfloat16 --modes training --repeats 8 --warmup 3 --backends eager,kiln,inductor ;;
    call29r)  # twenty-ninth session (issue 14): CUDA graphs in training were never measured on the device. A
      # training step on the H200 is host-bound (call28e: ResNet-50 bf16 wall 23.4 ms for 6.5 ms of kernels, ConvNeXt
      # 15.4 for 7.6; eager 27 and 20 ms): kiln:reduce-overhead records the forward and the backward graphs each
      # (Note [Outputs of a CUDA graph]: a slot is freed when the step's gradients are set to None). bf16 training,
      # default and reduce-overhead for both compilers; every row must pass the gradient check; compare wall ms
      TAIL=30 bench train-bf16-cudagraphs 560 --dtype bfloat16 --modes training --models resnet,gpt2,cnn --repeats 10 \
        --warmup 3 --profile --profile-calls 2 --backends eager,kiln,kiln:reduce-overhead,inductor,inductor:reduce-overhead ;;
    call28e)  # twenty-eighth session (issue 15): loopir's Note [Values read through a channels-last permute] (the
      # depthwise bias add ConvNeXt's norms read through permute(0, 2, 3, 1) computed NHWC: the saved norm input was
      # NCHW, its weight-gradient partials at 17% of copy) and Note [Pointwise nodes walk their memory order] (Triton:
      # NHWC pointwise nodes in memory-order loops, so the add fuses aligned with the norm's kernel), and Note [Tiny
      # kernels fuse without a shared buffer] (ResNet-50's 53 BatchNorm counters one kernel: launches a step 647 ->
      # ~595 expected). bf16 training of the conv nets, kiln against memory_order_pointwise off and tiny_fusion off,
      # GPU ms and launches a step (s28 call28c: ConvNeXt 8.92 ms, torch.compile 8.67; call28a: ResNet-50 7.38 ms of
      # kernels, tc 7.02)
      TAIL=24 bench train-bf16-memory-order 280 --dtype bfloat16 --modes training --models convnext,resnet --repeats 6 \
        --warmup 2 --profile --profile-calls 2 \
        --backends kiln,kiln:default:triton.memory_order_pointwise=False,kiln:default:tiny_fusion=False ;;
    call27m)  # twenty-seventh session (issue 20, helper moe27): two C++ generator rules, fp32 inference on the host at 1
      # and 16 threads. (1) Note [Column reductions through gathers] (kernel.py, switch column_gathers): the mixtures of
      # experts' combine (cpp_fused_div_index_mul_sum_unsqueeze_view_*, rows of k=2 experts through a gather) is a column
      # reduction now: 93 -> 11 us a call at one thread on the 2-core box; at 16t on the host mixtral was 1.88x over
      # eager against torch.compile's 2.20x, qwen2_moe 1.83x vs 2.15x (2026-12-06-h100host-s26-breadth-16t-eval).
      # (2) Note [Logarithms off libmvec's slow path] (prelude.py, switch guarded_log): T5's bucket kernels
      # (*_to_copy_add_arange_div_full_like_log_25, *_abs_add_arange_div_log_4) no longer take libmvec's scalar path on
      # their triangle of zeros: 66 -> 18 and 36 -> 20 us at 1t here; _25 scaled 1.16x from 1 to 16t on the host.
      # (3) Note [Exponentials off libmvec's slow path] (prelude.py, switch guarded_exp): a causal softmax's masked
      # lanes no longer take the scalar path ([4, 256, 256] at 1t here: 493 -> 149 us with -inf, unmasked 136 -> 150).
      # Compare: the mixtral and qwen2_moe rows at 1t and 16t, kiln against kiln_ab (the rules off, same rounds) and
      # inductor, as speedups over eager; then threads27-infer's kernel lines for t5 (kiln against kiln_ab, 1t and
      # 16t: expected _25 and _4 >= 3x at 16t, kiln_ab as before), and slow_paths.py. ~150 s after the install.
      timeout 75 python3 packages/kiln/bench/breadth_speed.py --only mixtral,qwen2_moe --batch 32 --threads 1,16 \
        --backends eager,kiln,kiln_ab,inductor --ab-cpp column_gathers=0,guarded_log=0,guarded_exp=0 --calls 4 --rounds 9 \
        --json "$out/moe27.json" 2>&1 | grep -E "^(mixtral|qwen2_moe|model|mode|kiln)" | cut -c1-200
      timeout 55 python3 packages/codegen_cpp/bench/threads.py --mode inference --threads 1,16 --models t5 \
        --backends kiln,kiln_ab,inductor --ab-options "" --ab-cpp-options column_gathers=false,guarded_log=false,guarded_exp=false \
        --kernels 8 --budget-s 30 --row-s 1 --out "$out/threads27-infer.json" > "$out/threads27-infer.log" 2>&1
      grep -v -E "Warning|USDT" "$out/threads27-infer.log" | tail -24 | cut -c1-200
      # the guards alone: guarded against plain against eager, log over zeros and masked softmax, 1t and 16t
      timeout 20 python3 packages/codegen_cpp/bench/slow_paths.py --threads 1,16 --calls 60 2>&1 | grep -v Warning ;;
    call26w)  # twenty-sixth session (issue 15): Note [Welford tiles] (codegen_triton heuristics), measured at one shape
      # only. First the BatchNorm statistics at ResNet-50's shapes (channels-last bf16: rows per chunk 49-392), the
      # new default against welford_tiles=0 and two tiles between; then ResNet-50 bf16 training, kiln against kiln
      # with the rule off and torch.compile (scripts/gpu_kernel_table.py groups every kernel: the BatchNorm partials
      # took 1.15 ms a step against torch.compile's ~0.5 ms)
      for shape in "256 24.5" "256 6" "64 24.5" "512 12.25" "1024 6"; do set -- $shape
        timeout 45 python3 packages/codegen_triton/bench/bandwidth.py --only bn_stats --dtype bfloat16 --row $1 --sizes $2 \
          --peak 3.35 --reps 7 --variants "welford_tiles=0;WELFORD_MIN_ROWS=0;OUTER_TILE_BYTES=2048" \
          --out "$out/bw-bn-$1-$2.json" 2>&1 | grep -E "^bn_stats|variant" | cut -c1-120; done
      timeout 200 python3 -m kiln_bench --size gpu --device cuda --dtype bfloat16 --modes training --models resnet \
        --backends eager,kiln,kiln:default:triton.welford_tiles=False,kiln:default:materialized_saves=False,inductor \
        --profile --profile-calls 3 \
        --repeats 8 --warmup 3 --out "$out/resnet-welford" > "$out/resnet-welford.log" 2>&1
      grep -v -E "models:|warn" "$out/resnet-welford.log" | tail -32 | cut -c1-200 ;;
    call27l)  # issue 15's two memory-bound kinds below 70% of copy on the H100: layer norm backward's weight/bias column
      # partials (40-48%) at GPT-2/BERT's shape (rows of 768, 4096 rows, bfloat16), and GPT-2's position-embedding
      # gradient (a [8, 512 * 768] sum over the batch, 38%, persistent outer reduction of 128 columns a program)
      timeout 80 python3 packages/codegen_triton/bench/bandwidth.py --only layer_norm_backward --dtype bfloat16 --row 768 \
        --sizes 3,12 --peak 3.35 --reps 7 --variants "OUTER_TILE_BYTES=2048;OUTER_TILE_BYTES=8192;OUTER_WARPS=8;outer_partials=1" \
        --out "$out/bw-lnb.json" 2>&1 | grep -E "^layer_norm|variant" | cut -c1-120
      timeout 60 python3 packages/codegen_triton/bench/bandwidth.py --only col_sum --dtype bfloat16 --row 393216 --sizes 3.146 \
        --peak 3.35 --reps 7 --variants "OUTER_PERSISTENT_XBLOCK=256;OUTER_PERSISTENT_XBLOCK=512;OUTER_PERSISTENT_XBLOCK=1024" \
        --out "$out/bw-pos.json" 2>&1 | grep -E "^col_sum|variant" | cut -c1-120 ;;
    call27z)  # twenty-seventh session's last call: the session's GPU-side changes on the two conv nets in bf16 training
      # (Note [Welford tiles] now for rows of every length; a pooling backward's `self` no longer a value the backward
      # would write: the CNN's forward wrote its pre-pool ReLU outputs, 3.66 against 3.48 ms of GPU time), results
      # checked against eager; then BERT's CPU training compile at 16 threads with Note [Tunings that are slow to
      # compile] (29.8 s before)
      TAIL=24 bench train-bf16-s27 150 --dtype bfloat16 --modes training --models cnn,resnet --repeats 6 --warmup 2 \
        --profile --profile-calls 2 --backends kiln,inductor
      KILN_CACHE_DIR=$(mktemp -d) timeout 45 python3 -m kiln_bench --size cpu --device cpu --threads 16 --modes training \
        --models bert --backends kiln --repeats 4 --warmup 1 2>&1 | grep -E "^bert " | cut -c1-220 ;;
    call27t)  # twenty-seventh session (issue 20): Note [Tunings that are slow to compile] (codegen_cpp build.py): GCC 13's
      # sapphirerapids scheduling model spent 26.7 of BERT's 29.8 s training compile in "scheduling 2"; kiln now
      # compiles with -mtune=skylake-avx512 there. Cold compile and step time at 16 threads, the new default against
      # compile_time_tune=False (each in a fresh cache: expected ~4-5 s against ~30 s for BERT, 18 s for GPT-2)
      for b in kiln kiln:default:cpp.compile_time_tune=False; do
        KILN_CACHE_DIR=$(mktemp -d) timeout 110 python3 -m kiln_bench --size cpu --device cpu --threads 16 --modes training \
          --models bert,gpt2,resnet --backends "$b" --repeats 6 --warmup 2 2>&1 | grep -E "^(bert|gpt2|resnet) " | cut -c1-220; done ;;
    call28h)  # twenty-eighth session (issue 14, helper host28): kiln's default-mode host time per call above
      # torch.compile's on ResNet-50 (4.22 against 3.65 ms, s25) and T5 (5.63 against 5.18), though on the CPU kiln's
      # guard + runner + aotgrad runtime cost a third to a fifth of torch.compile's and its launches 5.5 against 9.6 us.
      # scripts/host_ab.py puts both side by side in one process: host us per call, then torch.profiler's host-side
      # events per call (aten ops, cudaLaunchKernel/cuLaunchKernel, cudaMalloc...) by |kiln - tc|, then cProfile.
      # Read: which events carry the difference (aten::cudnn_convolution's self us, aten::copy_/empty counts: the 17
      # NCHW weights converted inside aten, Note [Channels-last for convolutions]; cuLaunchKernel counts), and
      # T5's guard with Note [Same floats in C] (the "TorchDynamo Cache Lookup" row is torch.compile's guard)
      timeout 170 python3 scripts/host_ab.py --models resnet,t5 --dtype bfloat16 --calls 20 --rounds 5 --top 30 \
        > "$out/host-ab-infer.log" 2>&1; grep -v -i -E "warn|usdt" "$out/host-ab-infer.log" | cut -c1-200 | tail -120 ;;
    call28v)  # twenty-eighth session (issue 14, helper host28): Note [Buffers in the shape their readers view them on
      # a GPU] (codegen_triton wrapper.py: an activation allocated as its GEMMs view it; CPU, GPU form with stubs: views per
      # call T5 249 -> 176, GPT-2 45 -> 30, ConvNeXt 92 -> 67, the wrapper's own us -15..-25%; checked bit for bit with the
      # kernels run under the interpreter, triton_wrapper_overhead.py --check) and Note [Same floats in C] (T5's guard).
      # bf16 inference, the new wrappers against KILN_VIEWED_BUFFERS=0 KILN_SAME_FLOAT_OP=0: every row must match eager;
      # compare kiln's host ms (profile) between the two runs, T5 -50..100 us expected, GPU ms unchanged
      for env in "" "KILN_VIEWED_BUFFERS=0 KILN_SAME_FLOAT_OP=0"; do
        env $env KILN_CACHE_DIR=$(mktemp -d) timeout 75 python3 -m kiln_bench --size gpu --device cuda --dtype bfloat16 \
          --modes inference --models t5,gpt2,convnext --backends eager,kiln --repeats 10 --warmup 3 --profile \
          --profile-calls 3 --out "$out/viewed-${env:+off}" > "$out/viewed-${env:+off}.log" 2>&1
        echo "-- ${env:-new wrappers}"; grep -v -i -E "warn|usdt|models:" "$out/viewed-${env:+off}.log" | tail -14 | cut -c1-200
      done ;;
    call28t)  # after call28h: the same on a ResNet-50 bf16 training step (forward, loss, backward)
      timeout 170 python3 scripts/host_ab.py --models resnet --mode train --dtype bfloat16 --calls 10 --rounds 5 \
        --top 40 > "$out/host-ab-train.log" 2>&1; grep -v -i -E "warn|usdt" "$out/host-ab-train.log" | cut -c1-200 | tail -80 ;;
    call27h)  # twenty-seventh session (issue 14): default-mode host time per call above torch.compile's on ResNet-50
      # (4.22 against 3.65 ms, s25) and T5 (5.63 against 5.18): every kernel of a ResNet-50 bf16 inference call
      # (kiln has 17 "aten" kernels that torch.compile does not: which?), then cProfile's top functions per call
      timeout 100 python3 scripts/gpu_launch_bench.py --out "$out/launch.json" 2>&1 | tail -12  # 200 kernels: 7.3 us (s4)
      timeout 120 python3 scripts/gpu_kernel_table.py --model resnet --mode inference --dtype bfloat16 --top 30 \
        --out "$out/resnet-infer-kernels.json" 2>&1 | grep -v -i -E "warn|usdt" | tail -75 | cut -c1-180
      timeout 150 python3 scripts/gpu_host_probe.py --models resnet,t5 --mode default --calls 20 --threads 0 2>&1 \
        | grep -v -i -E "warn|usdt" | tail -34 | cut -c1-180
      # reduce-overhead's host time: DistilBERT 0.42 ms against BERT's 0.15 with the same kernels, ConvNeXt 0.50
      timeout 120 python3 scripts/gpu_host_probe.py --models bert,distilbert,convnext --mode reduce-overhead --calls 20 \
        --threads 0 2>&1 | grep -v -i -E "warn|usdt" | tail -51 | cut -c1-180 ;;
    call26s)  # twenty-sixth session (issue 15/20): aotgrad's Note [Values the backward would write] (a value a
      # convolution's or matmul's backward reads is saved, not recomputed; ResNet-50 bf16 is in call26w) on the other
      # training models, bf16, kiln against materialized_saves=False (more memory saved, fewer backward kernels)
      bench training-bf16-materialized 330 --dtype bfloat16 --modes training --models gpt2,llama,convnext,cnn,vit \
        --repeats 8 --warmup 3 --profile --profile-calls 3 \
        --backends kiln,kiln:default:materialized_saves=False,inductor ;;
    call27b)  # twenty-seventh session (issue 20, helper build27): a graph's C++ kernels compiled in parallel translation
      # units (Note [Parallel C++ builds] in codegen_cpp's units.py), on the host's 16 cores. Cold caches (kiln_bench
      # gives each model a fresh one), --threads 16, BERT and GPT-2 training, build_parts=1 (one g++ a graph, as
      # before) against the automatic split, in alternating order. Compare the rows' "compile" phase (GPT-2 17.3 s,
      # BERT ~25 s in call25c) and the "parts" lines: each graph's part count, each part's g++ time and the link. On
      # the 2-core box (busy) 2 parts were slower, so the automatic rule leaves a core out and builds one unit there;
      # measured there part after part and split as on 16 idle cores, the C++ critical path of GPT-2 training was 2.46 ->
      # 1.00 s, BERT's 2.79 -> 1.37 (packages/bench/results/2026-12-06-cpu-s27-parallel-build.md). ~120 s.
      # (expected: GPT-2 ~30 s with build_parts=1, ~20 auto; BERT ~40 and ~25; a run over its limit prints no row)
      for run in "gpt2 1 40" "gpt2 0 35" "bert 0 45" "bert 1 55"; do set -- $run
        echo "-- $1 build_parts=$2"
        KILN_CPP_OPTIONS=build_parts=$2 KILN_LOG=cache timeout "$3" python3 -m kiln_bench --size cpu --device cpu \
          --threads 16 --modes training --models "$1" --backends kiln --repeats 1 --warmup 1 > "$out/build27-$1-$2.log" 2>&1
        grep -E "^$1 |in [0-9]+ parts|compiled: " "$out/build27-$1-$2.log" | sed 's|/tmp/[^ ]*/cpp/../||' | cut -c1-260
      done ;;
    call26c)  # twenty-sixth session (issue 20): kiln's CPU training compile on the host: BERT 27.1 s and GPT-2 18.2 s in
      # call25c (C++ compile phase 17.3 s for GPT-2 at 16 threads), against 8.6 s for BERT cold on the 2-core box. Cold
      # caches, one thread against 16, and 16 with libgomp's workers passive (do spinning OpenMP workers of the timed
      # forward slow the g++ that builds the backward?)
      for t in 1 16; do KILN_CACHE_DIR=$(mktemp -d) timeout 80 python3 -m kiln_bench --size cpu --device cpu --threads $t \
        --modes training --models bert --backends kiln --repeats 2 --warmup 1 2>&1 | grep -E "^bert" | cut -c1-230; done
      KILN_CACHE_DIR=$(mktemp -d) OMP_WAIT_POLICY=passive timeout 80 python3 -m kiln_bench --size cpu --device cpu \
        --threads 16 --modes training --models bert --backends kiln --repeats 2 --warmup 1 2>&1 | grep -E "^bert" | cut -c1-230 ;;
    call30f)  # thirtieth session (helper fix30): the CPU oneDNN passes in bfloat16, checked on the host's CPU (no
      # GPU used). The 2-core box has no AVX-512 since this session (AMD EPYC, AVX2: mkldnn bf16 unsupported), so
      # cpu_conv_fuzz.py ran its float32 programs only there (250 seeds: no wrong answer after fix30's two fixes);
      # its bfloat16 ones (40% of seeds: conv_fusion folds in float32, packed bf16 linear layers, depthwise bf16
      # backwards) need a CPU with AVX-512 BF16 / AMX. Expected: "bf16 True", no "error", mismatches only where
      # eager's own bf16 error is close (BatchNorm over few values); ~3-5 s a seed
      python3 -c "import torch; print('bf16', torch.ops.mkldnn._is_mkldnn_bf16_supported())"
      timeout 520 python3 packages/kiln/tests/cpu_conv_fuzz.py --seeds 0:120 -q --coverage > "$out/cpu30f-fuzz.log" 2>&1
      grep -E "FAIL|^call|^error|passes with|pass'" "$out/cpu30f-fuzz.log" | tail -40 | cut -c1-250 ;;
    call29c)  # twenty-ninth session (issue 20, helper cpu29): bfloat16 convolutions through oneDNN with prepacked
      # weights (loopir Note [bfloat16 through oneDNN], switch onednn_bf16; the passes need conv_prepack) and a
      # bfloat16 BatchNorm folded in float32. At one thread on the 2-core box (AMX), infer1.py, CPU time: ResNet
      # 3.35 -> 2.56 ms, the CNN 2.44 -> 2.18 (kiln_bench cpu size), ConvNeXt even; the host's CPU at 16 threads
      # is not measured. Compare per model: kiln@...(prepacked, bf16 on) against kiln@.../onednn_bf16=false (the
      # same without bf16: expected faster on resnet and cnn, even on convnext), both against inductor and eager,
      # and plain kiln (conv_prepack off, the default). Wall clock at 16 threads. Estimate: ~40 s start-up + 3
      # kiln compiles and one torch.compile per model (~100 s)
      timeout 150 python3 packages/codegen_cpp/bench/infer1.py --models resnet,cnn,convnext --dtype bfloat16 --threads 16 \
        --repeats 30 --backends eager,kiln,kiln@conv_prepack=true/linear_pack=true,kiln@conv_prepack=true/linear_pack=true/onednn_bf16=false,inductor \
        > "$out/infer29c-bf16-16t.log" 2>&1
      grep -v -E "Warning|USDT|^\s*$" "$out/infer29c-bf16-16t.log" | tail -8 | cut -c1-300 ;;
    call28l)  # twenty-eighth session (issue 20, helper cpu28): CPU training graphs channels-last where the convs'
      # inputs hold at least as many elements as their weights (Note [Channels-last in CPU training]). At one thread on
      # the 2-core box: MobileNetV2 (train1, 64 px) 0.99x -> 1.19x over eager, the public CNN 1.43x -> 1.52x, FocalNet
      # (breadth) 1.29x -> 1.46x; ResNet and ConvNeXt keep eager's layouts (inputs 0.1x / 0.43x their weights). Does it
      # hold at 16 threads? kiln_ab is kiln with cpu_layout_training=False. Compare per thread count kiln vs kiln_ab
      # on cnn (NHWC; expected kiln <= kiln_ab at 1 and 16 threads); convnext's graphs are the same code in both
      # (an A/A row: the noise), and both against inductor (NHWC for every conv graph; at one thread here ConvNeXt
      # 1.39-1.42x vs kiln's 1.16-1.17x: is ConvNeXt's gap larger at 16 threads?). Estimate: ~40 s start-up +
      # torch.compile's training compiles (cnn ~15 s, convnext ~30 a thread count)
      timeout 250 python3 packages/codegen_cpp/bench/threads.py --mode training --threads 1,16 --models cnn,convnext \
        --backends kiln,kiln_ab,inductor --ab-options cpu_layout_training=False --kernels 0 --budget-s 200 --row-s 1 \
        --out "$out/threads28-layout-train.json" > "$out/threads28-layout-train.log" 2>&1
      grep -v -E "Warning|USDT" "$out/threads28-layout-train.log" | tail -30 | cut -c1-200 ;;
    call26p)  # twenty-sixth session (issue 20, helper par26): the kernels that did not scale with threads, after Note
      # [Folds after a row's short loops] (kernel.py: ResNet's BatchNorm statistics folded 8 lanes every 2-4 positions)
      # and Note [Statements that cost more than one] (parallel.py: per-row statements, folds, math calls, strided bodies).
      # kiln_ab is kiln with both switched off (fold_short_rows, weigh_statements), the same passes. Compare per kernel
      # ("kernel ... 1t ... 16t" lines, kiln only) with 2026-12-06's: var_mean_where_{1,19,23,24,27,31,32} were 1t
      # 0.06-0.09 ms, 16t 0.04-0.07 (0.96-1.8x); MLP's add_addmm_erf_isinf_mul_rsqrt_{1,3,5,7} 0.04 -> 0.04 (1.0x);
      # T5's _to_copy_add_arange_div_full_like_log_25 1.16x, its add_embedding_mean_mul_pow_rsqrt_* 1.3-1.9x. Expected:
      # the var_mean kernels ~5x faster at 1t, the rows-of-8 ones (27, 31, 32), the MLP's and T5's log kernel parallel
      # (>= 3x at 16t); the other var_mean kernels (rows of 32: 19, 23, 24) stay serial at ~7 us. And the step rows:
      # kiln vs kiln_ab vs inductor at 16 threads (ResNet training was 0.92-1.06x over eager, inductor 1.16x; MLP 1.19x
      # vs 1.26x). Estimate (torch.compile's compiles dominate: ResNet training ~25-45 s a thread count here, T5
      # inference ~15): ~140 s after gpu_run.sh's install; the budgets drop t5 first (a row line per thread count is
      # printed as it ends, the kernel lines at the model's end). On the 2-core box two-thread rows are unusable under
      # load (eager T5 40 -> 175 ms); kernel_time.py --threads 1,2 --ab-cpp ... gave this session's per-kernel figures
      timeout 200 python3 packages/codegen_cpp/bench/threads.py --mode training --threads 1,16 --models resnet \
        --backends kiln,kiln_ab,inductor --ab-options "" --ab-cpp-options fold_short_rows=false,weigh_statements=false \
        --kernels 10 --budget-s 150 --row-s 1 --out "$out/threads26-train.json" > "$out/threads26-train.log" 2>&1
      grep -v -E "Warning|USDT" "$out/threads26-train.log" | tail -24 | cut -c1-200
      timeout 45 python3 packages/codegen_cpp/bench/threads.py --mode inference --threads 1,16 --models mlp,t5 \
        --backends kiln,kiln_ab,inductor --ab-options "" --ab-cpp-options fold_short_rows=false,weigh_statements=false \
        --kernels 10 --budget-s 20 --row-s 1 --out "$out/threads26-infer.json" > "$out/threads26-infer.log" 2>&1
      grep -v -E "Warning|USDT" "$out/threads26-infer.log" | tail -40 | cut -c1-200 ;;
    call25c)  # twenty-fifth session (issue 20, helper threads25): training steps (forward, the suite's loss, backward) of
      # the public suite at 1/4/16 CPU threads, eager / kiln / torch.compile interleaved, each compiled step's loss and
      # gradients checked against eager's before it is timed (threads.py --mode training; the inference rows are
      # call5b's). Estimate: on the 2-core box at 1 thread the 8 models took 696 s, 521 of them torch.compile's
      # training compiles (resnet 138 incl. its first-compile start-up, convnext 100, t5 66, bert 60, gpt2 59, cnn 41,
      # llama 34, mlp 23), kiln's 104; the box compiles inference 3-6x slower than this host (call5b), so here about
      # 40 s start-up + 80-170 s of torch.compile per thread count: not all 8 fit. The budget drops the last models
      # first (convnext, then t5, mlp, cnn: the costliest compiles and the least new); rerun what it skipped with
      # --models. --kernels 0: the kernel-scaling pass (a second kiln training compile per model) left out
      timeout 265 python3 packages/codegen_cpp/bench/threads.py --mode training --threads 1,4,16 \
        --models gpt2,resnet,bert,llama,cnn,mlp,t5,convnext --budget-s 215 --row-s 2 --kernels 0 \
        --out "$out/threads-training.json" > "$out/threads-training.log" 2>&1
      grep -v -E "Warning|USDT" "$out/threads-training.log" | tail -45 | cut -c1-220 ;;
    call25d)  # twenty-fifth session (issue 20): the breadth suite at 16 CPU threads, inference, eager / kiln / torch.compile
      # (breadth_speed.py; its rows at tiny size, batch 32: what 16 threads cost or save on small kernels), one
      # architecture of each kind first -- decoder LM, encoder, conv net, vision transformer, MoE, state-space,
      # encoder-decoder, audio -- then a second of each and a hybrid; the budget drops the last. Estimate: 14 of them
      # (all but jamba, convnext, bart, efficientnet) took 305 s on the 2-core box at 1 thread (torch.compile 261 of
      # it, 6-37 s a model), so here about 40 s start-up + ~60-90 s of torch.compile for all 18. One process: shards
      # (--procs) would share the 16 cores
      timeout 250 python3 packages/kiln/bench/breadth_speed.py --device cpu --dtype float32 --threads 16 --batch 32 \
        --only gpt2,bert,resnet,vit,mixtral,mamba,t5,wav2vec2,qwen2,deberta_v2,mobilenet_v2,swin,qwen2_moe,mamba2,jamba,convnext,bart,efficientnet \
        --rounds 15 --calls 4 --budget-s 195 --json "$out/breadth-16t.json" > "$out/breadth-16t.log" 2>&1
      grep -v -E '^\{|Warning|USDT|^\[transformers\]' "$out/breadth-16t.log" | tail -40 | cut -c1-200 ;;
    call26m)  # twenty-sixth session (issue 20, helper mm26): GPT-2's matmuls looked ~1 ms a step slower under kiln
      # than under eager and torch.compile at 16 threads (cpu16, kiln_bench --profile: aten::mm kiln 19 calls 2.98 ms,
      # eager 2.19, torch.compile 18 calls 1.94). Their operands are not the cause: kiln hands aten eager's products
      # exactly (shapes and strides; the suite's transformers and MLP in training, torch 2.13 and 2.11,
      # scripts/matmul_ab.py). kiln_bench profiled each backend after its own timing, minutes apart, and in that run
      # the eager steps timed between kiln's took 10.55 ms against 8.71 and 8.78 in the eager and torch.compile rows:
      # kiln's row ran in a slower stretch. kiln_bench now profiles eager's steps between each compiled row's calls
      # (Note [Eager in the same calls], kiln_bench/profile.py): read each row's "eager, same calls (ms, this row vs
      # eager)" line: kiln's aten::mm above eager's there = the context slows kiln's products (run call26n); about
      # equal = the 1 ms was the stretch. cpu16 took 84 s for llama+gpt2; bert (~45 s) in a process of its own, so
      # that a cut loses only its row (kiln_bench writes its table and JSON at the end)
      for run in "gpt2,llama 95" "bert 50"; do
        read -r models limit <<< "$run"
        timeout "$limit" python3 -m kiln_bench --device cpu --threads 16 --modes training --models "$models" \
          --backends eager,kiln,inductor --profile --repeats 6 --warmup 2 --profile-calls 3 \
          --out "$out/cpu16-s26-${models%%,*}" > "$out/cpu16-s26-${models%%,*}.log" 2>&1
        grep -v -E "models:|Warning|warn_once|USDT" "$out/cpu16-s26-${models%%,*}.log" | tail -30 | cut -c1-260
      done ;;
    call26n)  # after call26m: GPT-2 at 16 threads, every product of a training step timed in one stretch under eager,
      # kiln and torch.compile (rounds interleaved, order rotated) and alone (scripts/matmul_ab.py: ms a call and calls
      # a step per product; a product slower in kiln's column than in eager's and torch.compile's is slowed by what
      # runs around it, not by its operands); then with threads that never sleep (OMP_WAIT_POLICY=active: a product
      # that waits on waking threads gets faster). The first run compiles cold (kiln ~18 s, torch.compile ~35 s)
      timeout 75 python3 scripts/matmul_ab.py --models gpt2 --threads 16 --rounds 6 --calls 3 --alone \
        --out "$out/matmul16.jsonl" > "$out/matmul16.log" 2>&1
      grep -v -E "Warning|USDT|warn_once" "$out/matmul16.log" | cut -c1-200 | tail -22
      OMP_WAIT_POLICY=active timeout 45 python3 scripts/matmul_ab.py --models gpt2 --threads 16 --rounds 6 --calls 3 \
        --backends eager,kiln,inductor --out "$out/matmul16-active.jsonl" > "$out/matmul16-active.log" 2>&1
      grep -v -E "Warning|USDT|warn_once" "$out/matmul16-active.log" | cut -c1-200 | tail -20 ;;
    call26o)  # after call26n, if kiln's products were slower there: the same with kiln's kernels at 256 bits
      # (cpp.vector_width=256: 512-bit code on all cores may lower the clock MKL then runs at)
      timeout 60 python3 scripts/matmul_ab.py --models gpt2 --threads 16 --rounds 6 --calls 3 \
        --backends eager,kiln,kiln:default:cpp.vector_width=256 --out "$out/matmul16-w256.jsonl" > "$out/matmul16-w256.log" 2>&1
      grep -v -E "Warning|USDT|warn_once" "$out/matmul16-w256.log" | cut -c1-200 | tail -20 ;;
    call24e)  # twenty-fourth session's last call (the ~4 minutes of budget left): GPT-2 at 16 CPU threads, the
      # discriminating parts of call24d (the host, OpenMP regions alone, GPT-2 with full teams, with workers that never
      # sleep); GPT-2's bf16 inference with its padded logits copied (the new default) or kept as a view; ResNet-50
      # and LLaMA bf16 training with the compile log (Note [Launchers built in the workers], compile24's changes)
      (nproc; lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA)"; cat /proc/loadavg) 2>&1 | tee "$out/host.txt"
      timeout 20 python3 scripts/omp_regions.py --threads 4,16 --gaps-us 0,2000 --reps 10 --torch-gomp \
        --out "$out/regions.jsonl" 2>&1 | grep -v -E " (mul|erf) " | tail -10
      p="$out/probe16.jsonl"
      timeout 35 python3 scripts/omp_probe.py --threads 16 --models gpt2 --calls 8 --kernels 4 --label default --out "$p" 2>&1 \
        | grep -v -i -E "warn|usdt" | tail -10
      OMP_WAIT_POLICY=active timeout 25 python3 scripts/omp_probe.py --threads 16 --models gpt2 --calls 8 \
        --label OMP_WAIT_POLICY=active --out "$p" 2>&1 | grep "^gpt2"
      TAIL=10 bench infer-bf16-gpt2-padcopy 45 --dtype bfloat16 --modes inference --models gpt2 --repeats 8 --profile \
        --profile-calls 2 --backends kiln,kiln:default:pad_mm_output_copy=False,inductor
      KILN_LOG=compile TAIL=10 bench train-bf16-s24 95 --dtype bfloat16 --modes training \
        --models resnet,llama --repeats 3 --warmup 1 --backends eager,kiln,inductor
      grep -E "kernel configs" "$out/train-bf16-s24.log" | cut -c1-230 | tail -6 ;;
    call24c)  # twenty-fourth session's end: bf16 training of the models not measured since the split fix, with
      # the compile log (Note [Launchers built in the workers]: the parent's load time and the workers' time)
      KILN_LOG=compile TAIL=30 bench train-bf16-s24 250 --dtype bfloat16 --modes training \
        --models llama,vit,resnet,convnext,cnn,mlp,t5 --repeats 5 --warmup 2 --backends eager,kiln,inductor
      grep -E "kernel configs" "$out/train-bf16-s24.log" | cut -c1-230 | tail -16 ;;
    call24b)  # the parent's loads of the workers' binaries took all the time waited (GPT-2 training: 103 configs,
      # 1.37 s; ResNet 235, 3.79 s): where a load goes, under cProfile
      timeout 200 python3 -m cProfile -o "$out/load.prof" -m kiln_bench --size gpu --device cuda --dtype float32 \
        --modes training --models gpt2 --repeats 1 --warmup 0 --backends kiln > "$out/load.log" 2>&1; tail -3 "$out/load.log"
      python3 scripts/prof_report.py "$out/load.prof" _load warmup precompile _fast_launcher > "$out/load-report.txt" 2>&1
      head -c 20000 "$out/load-report.txt" | cut -c1-200 ;;
    call24a)  # twenty-fourth session: where a GPU training compile's time goes (the Triton pool's log per graph,
      # the phases with the backward's first run now counted), and the 16-thread activation micro kept in a file
      KILN_LOG=perf,compile TAIL=40 bench compile-log 200 --dtype float32 --modes training --models gpt2,resnet,bert \
        --repeats 2 --warmup 1 --backends kiln
      grep -E "kernel configs|first run" "$out/compile-log.log" | cut -c1-260 | tail -30
      timeout 60 python3 scripts/omp_probe.py --threads 16 --micro 2>&1 | grep -v -i warn | tee "$out/micro16.log" | tail -12 ;;
    call23a)  # twenty-third session: GPT-2's kernels at 16 threads (only those computing tanh were slow): single
      # activations eager / kiln / kiln with 256-bit vectors at 16 and 4 threads, GPT-2 with 256-bit vectors; then
      # BERT and DistilBERT training after Note [Each member splits its own row] (their backward fell back before)
      for t in 16 4; do timeout 60 python3 scripts/omp_probe.py --threads $t --micro --cpp vector_width=256 2>&1 | grep -v -i warn; done
      timeout 60 python3 scripts/omp_probe.py --threads 16 --models gpt2,bert --cpp vector_width=256 2>&1 | grep -v -i warn
      TAIL=30 bench train-split-fix 300 --modes training --dtype float32 --models bert,distilbert --repeats 8 --warmup 3 \
        --profile --profile-calls 2 --backends eager,kiln,inductor
      TAIL=30 bench train-split-fix-bf16 200 --modes training --dtype bfloat16 --models bert,distilbert,gpt2 --repeats 8 \
        --warmup 3 --profile --profile-calls 2 --backends eager,kiln,inductor ;;
    call24d)  # twenty-fourth session (helper cpu16; call24b and call24c were taken): GPT-2 at 16 CPU threads (76 ms, eager 3.6):
      # what the host does to a 16-thread team. The host; OpenMP regions with no torch (4/16 threads, after gaps of
      # 0/50/2000 us); the activations at 16 threads (kept); GPT-2 and ConvNeXt at 16 threads with per-call context
      # switches, page faults and threads created, each kernel's largest of 5 profiled calls, kiln (full teams,
      # Note [Teams keep the pool's size]) against kiln+cpp (full_teams=0, as before); then GPT-2 with OpenMP
      # workers that never sleep, and timed alone (not interleaved with eager), ConvNeXt alone (the threads each
      # call creates, full teams against before); a table last. Under 4 minutes (the timeouts add to 230 s)
      (nproc; lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA)"; ldd --version | head -1; g++ --version | head -1
       cat /sys/kernel/mm/transparent_hugepage/enabled /proc/sys/kernel/numa_balancing /proc/loadavg /sys/fs/cgroup/cpu.max
      ) 2>&1 | tee "$out/host.txt"
      timeout 40 python3 scripts/omp_regions.py --threads 4,16 --gaps-us 0,50,2000 --reps 30 --torch-gomp \
        --out "$out/regions.jsonl" 2>&1 | grep -v -E " (mul|erf) "
      p="$out/probe16.jsonl"
      timeout 35 python3 scripts/omp_probe.py --threads 16 --micro --label micro --out "$p" 2>&1 | grep -v -i -E "warn|usdt"
      timeout 60 python3 scripts/omp_probe.py --threads 16 --models gpt2,convnext --kernels 5 --cpp full_teams=0 \
        --label default --out "$p" 2>&1 | grep -v -i -E "warn|usdt"
      OMP_WAIT_POLICY=active timeout 30 python3 scripts/omp_probe.py --threads 16 --models gpt2 --calls 10 \
        --label OMP_WAIT_POLICY=active --out "$p" 2>&1 | grep "^gpt2"
      # each backend in its own block: GPT-2 (does eager's interleaving matter?), ConvNeXt (threads each call creates)
      timeout 30 python3 scripts/omp_probe.py --threads 16 --models gpt2 --calls 10 --alone --label default --out "$p" 2>&1 | grep "^gpt2"
      timeout 35 python3 scripts/omp_probe.py --threads 16 --models convnext --calls 10 --alone --cpp full_teams=0 --label default \
        --out "$p" 2>&1 | grep "^convnext"
      python3 scripts/omp_probe.py --summary "$p" ;;
    call22a)  # twenty-second session: BERT's bf16 training after Note [Bases returned in another layout] (its
      # padded LM head's logits were read with the unpadded strides: loss and gradients wrong), bf16 depthwise
      # training NHWC (Note [Depthwise convolutions in half-precision training]), ResNet/CNN bf16 training
      TAIL=30 bench train-bf16-s22 330 --dtype bfloat16 --modes training --models bert,distilbert,gpt2,resnet,cnn,convnext \
        --repeats 10 --warmup 3 --backends eager,kiln,inductor
      TAIL=12 bench train-bf16-convnext-layout 120 --dtype bfloat16 --modes training --models convnext --repeats 10 --warmup 3 \
        --backends kiln,kiln:default:layout_training=False
      TAIL=14 bench infer-bf16-text 100 --dtype bfloat16 --modes inference --models bert,distilbert,gpt2 --repeats 10 \
        --backends eager,kiln ;;
    call22b)  # twenty-second session: GPT-2 at 16 threads was 23x slower than eager (call5b); the probe, with the
      # guard checker built in the background (--no-prepare) and before timing
      ls /opt/torch/.venv/lib/python3.12/site-packages/torch/lib | grep -i omp
      for e in --no-prepare --prepare; do
        env KILN_CACHE_DIR=/tmp/kiln-cache$e timeout 60 python3 scripts/omp_probe.py $e --threads 16 --models gpt2,bert 2>&1 | grep -v -i warn
      done
      timeout 150 python3 packages/codegen_cpp/bench/threads.py --threads 16 --models gpt2,bert,resnet,convnext,t5,llama \
        --budget-s 140 --out "$out/threads16.json" > "$out/threads16.log" 2>&1; grep -v Warning "$out/threads16.log" | tail -12
      # Note [Row statistics do not decide a column reduction] (codegen_triton kernel.py): norm weight gradients
      TAIL=24 bench train-bf16-outer 250 --dtype bfloat16 --modes training --models gpt2,llama,vit,t5,bert --repeats 10 --warmup 3 \
        --profile --profile-calls 2 --backends kiln,kiln::triton.outer_by_tiles=False ;;
    call22c)  # call22b cut to the device time left: the OpenMP probe, then the column-reduction fix on three models
      for e in --no-prepare --prepare; do
        env KILN_CACHE_DIR=/tmp/kiln-cache$e timeout 45 python3 scripts/omp_probe.py $e --threads 16 --models gpt2 --calls 10 2>&1 | grep -v -i warn
      done
      TAIL=16 bench train-bf16-outer 190 --dtype bfloat16 --modes training --models gpt2,llama,vit --repeats 8 --warmup 3 \
        --profile --profile-calls 2 --backends kiln,kiln::triton.outer_by_tiles=False ;;
    call22d)  # call22c cut again (under 5 minutes of device time left)
      for e in --no-prepare --prepare; do
        env KILN_CACHE_DIR=/tmp/kiln-cache$e timeout 40 python3 scripts/omp_probe.py $e --threads 16 --models gpt2 --calls 10 2>&1 | grep -v -i warn
      done
      TAIL=12 bench train-bf16-outer 110 --dtype bfloat16 --modes training --models gpt2,llama --repeats 6 --warmup 2 \
        --profile --profile-calls 1 --backends kiln,kiln::triton.outer_by_tiles=False ;;
    call4)
      bench training-bf16 560 --dtype bfloat16 --modes training --repeats 20 --warmup 5 --backends eager,kiln,inductor ;;
    call4c)  # fp32 training of the whole suite with fewer timed calls (fits one device call beside a short step)
      bench training-f32 430 --dtype float32 --modes training --repeats 8 --warmup 3 --backends eager,kiln,inductor ;;
    call11)  # sixteenth session: T5's position-bias masks made dense (Note [Attention masks read across their rows])
      bench t5-dense-mask 150 --dtype bfloat16 --modes inference --models t5 --repeats 15 --profile --profile-calls 3 \
        --backends eager,kiln,kiln:default:attention_dense_mask=False,inductor ;;
    call13)  # seventeenth session: where reduce-overhead's host time goes on the H200 (issue 14): the replay's own
      # floor, then host time by layer in reduce-overhead and default mode (tiny models: the call is mostly host)
      timeout 60 python3 scripts/gpu_replay_floor.py 2>&1 | tail -5
      timeout 260 python3 packages/kiln/bench/call_overhead.py --device cuda --dtype bfloat16 --mode reduce-overhead \
        --models resnet,gpt2,bert,mlp --calls 50 --rounds 5 --top 12 > "$out/host-ro.log" 2>&1; cut -c1-200 "$out/host-ro.log" | tail -75
      timeout 200 python3 packages/kiln/bench/call_overhead.py --device cuda --dtype bfloat16 \
        --models resnet,bert,cnn,mlp --calls 50 --rounds 5 > "$out/host-default.log" 2>&1; cut -c1-200 "$out/host-default.log" | tail -8 ;;
    call14)  # seventeenth session, after call13's finding (its stubs held a CUDA graph slot): host time by layer
      # in reduce-overhead at tiny and at gpu size, default mode at gpu size, and the recurrent breadth rows
      # re-timed after Note [Recurrent modules on CUDA]
      timeout 150 python3 packages/kiln/bench/call_overhead.py --device cuda --dtype bfloat16 --mode reduce-overhead \
        --models resnet,gpt2,bert,mlp --calls 50 --rounds 5 --top 14 > "$out/host-ro.log" 2>&1; cut -c1-200 "$out/host-ro.log" | head -90
      timeout 170 python3 packages/kiln/bench/call_overhead.py --device cuda --dtype bfloat16 --mode reduce-overhead --size gpu \
        --models resnet,bert,distilbert,gpt2 --calls 20 --rounds 3 > "$out/host-ro-gpu.log" 2>&1; cut -c1-200 "$out/host-ro-gpu.log" | tail -8
      timeout 130 python3 packages/kiln/bench/call_overhead.py --device cuda --dtype bfloat16 --size gpu \
        --models bert,cnn,mlp --calls 20 --rounds 3 --top 10 > "$out/host-default-gpu.log" 2>&1; cut -c1-200 "$out/host-default-gpu.log" | tail -40
      ONLY=nn_lstm,nn_gru,lstm_lm,gru_attention_decoder PROCS=2 BUDGET=100 bash "$0" call10 | grep -v '^{' | tail -8 ;;
    call15)  # seventeenth session: kiln_bench's synced host time per reduce-overhead call against back to back
      timeout 150 python3 scripts/gpu_host_probe.py --models resnet,bert 2>&1 | grep -v Warn | tail -60
      timeout 100 python3 scripts/gpu_host_probe.py --models bert --mode default 2>&1 | grep -v Warn | tail -30 ;;
    call16)  # seventeenth session: the deferred kernel loads (Note [Kernels compiled while the next graph is built]) and
      # the reordered reductions (Note [Reductions walk their reads' memory order]) on CUDA: tests, compile time A/B, T5 A/B
      timeout 150 python3 -m pytest -q -p no:cacheprovider packages/codegen_triton/tests/test_gpu_compile.py \
        packages/codegen_triton/tests/test_cudagraphs.py packages/codegen_triton/tests/test_reductions.py 2>&1 | tail -4
      bench compile-overlap 170 --dtype float32 --modes training --models mlp,cnn,bert --repeats 3 --warmup 1 \
        --backends kiln,kiln::triton.overlap_compile=False
      python3 - "$out/compile-overlap.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["model"], r["backend"], "compile", round(r["compile_s"] or 0, 2), "phases", r["extra"].get("phases_s"), r["reason"][:80])
PY
      bench t5-reorder 120 --dtype bfloat16 --modes inference --models t5 --repeats 10 --profile --profile-calls 3 \
        --backends kiln,kiln::triton.reorder_reductions=False ;;
    call17)  # seventeenth session: the CUDA failure of test_many_static_inputs_one_of_which_moves, and compile time
      # with and without the deferred loads, each in its own process (a backend after another in one process finds
      # the kernels in Triton's in-memory caches), the pool started by a first model whose compile is not counted
      timeout 60 python3 -m pytest -q -x -p no:cacheprovider packages/codegen_triton/tests/test_cudagraphs.py -k many_static 2>&1 \
        | grep -E "^E |assert|Error" | head -30
      for b in kiln kiln::triton.overlap_compile=False; do
        bench "overlap-$b" 150 --dtype float32 --modes training --models mlp,cnn,bert,llama --repeats 2 --warmup 1 --backends "$b" \
          | grep -E "training +kiln"
      done ;;
    call18)  # seventeenth session: the runner's fresh pool on re-recording (the CUDA failure of call16), and the
      # plain-maximum pooling values (Note [Max pooling values without their indices]) on the conv nets
      timeout 60 python3 -m pytest -q -p no:cacheprovider packages/codegen_triton/tests/test_cudagraphs.py 2>&1 | tail -2
      bench pool-values 120 --dtype bfloat16 --modes inference --models cnn,resnet --repeats 10 --profile --profile-calls 2 \
        --backends kiln,kiln::pool_values_max=False | grep -E "^(cnn|resnet) |bandwidth" ;;
    call19)  # nineteenth session: T5's position-bias mask kernel under the H200's transformers 5.17 (issue 15; it ran
      # at a fifth of copy bandwidth, 61 us), rows taken (b, l, h) (Note [Gathers along a row walk the rows]): the
      # kernel's time with the switch on and off (triton_per_fused__to_copy_abs_add_any_arange_clone_5 and the
      # decoder's triton_per_fused_add_any_arange_clone_embedding_eq_*), and the test on CUDA
      python3 -c "import transformers; print('transformers', transformers.__version__)"
      timeout 60 python3 -m pytest -q -p no:cacheprovider packages/codegen_triton/tests/test_reductions.py \
        -k "gathers_along or strided_both" 2>&1 | tail -2
      bench t5-gathers 150 --dtype bfloat16 --modes inference --models t5 --repeats 15 --profile --profile-calls 3 \
        --backends kiln,kiln::triton.reorder_gathers=False
      python3 - "$out/t5-gathers.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    p = r["extra"].get("profile") or {}
    print(r["backend"], "ms", r["compiled_ms"])
    for k in p.get("top", []):
        if "any_arange" in k["name"]:
            print("   top:", k["name"], round(k["ms_per_call"] * 1e3, 1), "us/call")
    for name, mb, us, share in (p.get("bandwidth") or {}).get("slowest", []):
        if "any_arange" in name:
            print("   bandwidth:", name, round(mb), "MB", round(us, 1), "us", f"{share:.0%} of copy")
PY
      ;;
    call20a)  # twentieth session (little device time): the runner's fresh pool on re-recording (call18's test),
      # T5's gathers A/B (call19), the tiny HF LMs under dynamic shapes on CUDA and GPT-2's dynamic sweep (issue 17)
      timeout 60 python3 -m pytest -q -p no:cacheprovider packages/codegen_triton/tests/test_cudagraphs.py 2>&1 | tail -2
      bash "$0" call19 2>&1 | grep -v "^== "
      timeout 100 python3 scripts/gpu_dynamic_check.py --quick 2>&1 | grep -v Warn | tail -12
      timeout 150 python3 -m kiln_bench.dynamic --device cuda --dtype bfloat16 --models gpt2 --batches 2,8,32 --seqs 16,128,512 \
        --repeats 3 --json "$out/h200-dynamic-gpt2.json" 2>&1 | tail -8 ;;
    call12)  # sixteenth session: Note [One warp per 1024 elements] on ConvNeXt's and T5's kernels (kiln only:
      # compare the dev ms with the same session's call2), and the dense-mask / aligned-SDPA rows of the breadth suite
      bench ln-rule 150 --dtype bfloat16 --modes inference --models convnext,t5 --repeats 10 --profile --profile-calls 3 --backends kiln
      ONLY=t5,bart,mbart,swin,swinv2,convnext,convnext_v2,levit,deberta,deberta_v2,mobilevit,gpt2 PROCS=4 BUDGET=110 bash "$0" call10 | grep -v '^{' | tail -22 ;;
    call4b)
      bench training-f32 560 --dtype float32 --modes training --repeats 20 --warmup 5 --backends eager,kiln,inductor ;;
    call5)
      timeout 200 python3 -m kiln_bench.dynamic --device cuda --dtype bfloat16 --models gpt2 --batches 2,8,32 --seqs 16,128,512 --repeats 5 --json "$out/h200-dynamic-gpt2.json" 2>&1 | tail -8
      timeout 330 python3 -m kiln_bench.dynamic --device cuda --dtype bfloat16 --models llama,resnet --batches 2,8,32 --seqs 16,128,512 --repeats 10 --json "$out/h200-dynamic.json" 2>&1 | tail -30 ;;
    call5c)
      timeout 330 python3 -m kiln_bench.dynamic --device cuda --dtype bfloat16 --models llama,resnet --batches 2,8,32 --seqs 16,128,512 --repeats 10 --json "$out/h200-dynamic.json" 2>&1 | tail -12 ;;
    call8s)  # call8 on two models, fewer rounds (fits beside another step)
      timeout 200 python3 packages/kiln/bench/call_overhead.py --device cuda --dtype bfloat16 --models convnext,resnet \
        --calls 30 --rounds 3 --top 12 > "$out/host-top.log" 2>&1; cut -c1-200 "$out/host-top.log" | tail -60 ;;
    call8)  # issue 14: host time per call by layer and the functions that take it, kiln against torch.compile
      timeout 420 python3 packages/kiln/bench/call_overhead.py --device cuda --dtype bfloat16 --models convnext,resnet,gpt2 \
        --calls 50 --rounds 5 --top 14 > "$out/host-top.log" 2>&1; cut -c1-200 "$out/host-top.log" | tail -80 ;;
    call5b)
      timeout 300 python3 packages/codegen_cpp/bench/threads.py --threads 1,4,16 --models resnet,gpt2,bert,mlp,cnn,convnext,t5,llama \
        --budget-s 280 --out "$out/threads.json" > "$out/threads.log" 2>&1; grep -v Warning "$out/threads.log" | tail -60 ;;
    call5d)  # issue 20: the parallel plans' thresholds at 4 and 16 threads (CppOptions.parallel_grain,
      # min_work_per_thread): ConvNeXt was slower at 16 threads than at 4 in the thirteenth session
      timeout 330 python3 packages/codegen_cpp/bench/threads.py --threads 4,16 --models convnext,cnn,resnet,gpt2,bert \
        --backends kiln,kiln_ab,inductor --ab-options "" --ab-cpp-options min_work_per_thread=16384,parallel_grain=65536 \
        --budget-s 300 --out "$out/threads-plans.json" > "$out/threads-plans.log" 2>&1; grep -v Warning "$out/threads-plans.log" | tail -40 ;;
    call7)
      # one pytest process per package (their conftest modules collide in one)
      TRITON_INTERPRET=1 timeout 120 python3 -m pytest -q -p no:cacheprovider packages/dynamo/tests/test_dynamic_shapes.py \
        packages/dynamo/tests/test_fake.py > "$out/dynamic-tests-torch211.log" 2>&1
      TRITON_INTERPRET=1 timeout 240 python3 -m pytest -q -p no:cacheprovider packages/kiln/tests/test_dynamic.py >> "$out/dynamic-tests-torch211.log" 2>&1
      tail -12 "$out/dynamic-tests-torch211.log"
      timeout 120 python3 scripts/diag_fake_failures.py > "$out/diag-fake-failures.log" 2>&1
      grep -E "^(torch|===|   break|--- run_fake)" "$out/diag-fake-failures.log" | cut -c1-300 | head -30 ;;
    call5a)
      timeout 200 python3 -m kiln_bench.dynamic --device cuda --dtype bfloat16 --models gpt2 --batches 2,8,32 --seqs 16,128,512 --repeats 5 --json "$out/h200-dynamic-gpt2.json" 2>&1 | tail -8 ;;
    call6b)
      python3 --version
      timeout "${DYNAMO_LIMIT:-420}" python3 -m pytest -q -p no:cacheprovider packages/dynamo/tests > "$out/dynamo-tests-py312.log" 2>&1
      tail -8 "$out/dynamo-tests-py312.log" ;;
    call6|call6a)
      [ "$step" = call6 ] && bash "$0" call6b
      timeout 150 python3 - <<'PY' 2>&1 | tail -4
import copy, torch, kiln
from torch import nn
for dyn in (None, True):
    kiln.reset(); torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).cuda()
    r = copy.deepcopy(m); c = kiln.compile(m, dynamic=dyn)
    for b in (2, 3, 5, 8):
        x = torch.randn(b, 3, 16, 16, device="cuda")
        torch.testing.assert_close(c(x), r(x))
        for p, q in zip(m.buffers(), r.buffers()):
            torch.testing.assert_close(p, q)
    print("batch norm training, dynamic =", dyn, ": outputs and running statistics equal eager")
PY
      ;;
    call10)  # issues 14 + 15 + 16: the breadth suite's 121 architectures and programs on the H200, bf16
      # inference, eager / kiln / torch.compile per call (packages/kiln/bench/breadth_speed.py), 8 shards
      KILN_COMPILE_WORKERS=2 TORCHINDUCTOR_COMPILE_THREADS=2 timeout 560 python3 packages/kiln/bench/breadth_speed.py \
        --device cuda --dtype bfloat16 --procs "${PROCS:-8}" --budget-s "${BUDGET:-450}" ${ONLY:+--only $ONLY} ${PROFILE:+--profile} \
        --json "$out/breadth-speed.json" > "$out/breadth-speed.log" 2>&1; tail -n 140 "$out/breadth-speed.log" | cut -c1-200 ;;
    call9)  # issue 15: why T5's decoder attention takes torch's math SDPA on the H200, and the source of
      # ConvNeXt's stage-2 layer-norm kernels that carry a `clone` there only (28% of copy bandwidth)
      timeout 300 python3 scripts/gpu_diag_kernels.py --out "$out" > "$out/diag.log" 2>&1; grep -c . "$out/diag.log"
      cut -c1-400 "$out/diag.log" | head -70 ;;
    *) echo "unknown step $step (call1 .. call6)" ;;
  esac
done
