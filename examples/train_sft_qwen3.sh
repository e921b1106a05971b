#!/usr/bin/env bash
# The SFT baseline (the paper's Table 1 SFT row) on the same trainer: cross-entropy on
# chat(problem) ; solution + EOS, LoRA r 64 / alpha 128, lr 5e-6, effective batch 32, sequences up to
# 16,000 tokens (longer ones cut at the end, as TRL does, counted as sft_truncated), stop at step 100.
# The scale's PHF preset supplies the layout (configs/phf_qwen3_<SCALE>.yaml); SFT has no rollout
# engine, teacher or flow, so their settings there are unused. One sequence per micro-batch: a
# 16,000-token sequence's scored logit rows are large (not measured on a GPU yet).
#
#   SCALE=1p7b|4b|8b HF_MODEL=/models/Qwen3-1.7B [DATA=...] [RUN_DIR=...] bash examples/train_sft_qwen3.sh [--section.field=value ...]
#   the official baseline (scripts/run_sft.sh, TRL SFTTrainer): add --training.global_batch_size=64 --sft.loss_on_prompt=true
set -euo pipefail
SCALE=${SCALE:-1p7b}
case $SCALE in 1p7b | 4b | 8b) ;; *) echo "error: SCALE=$SCALE: expected 1p7b, 4b or 8b (configs/phf_qwen3_<SCALE>.yaml)" >&2; exit 2 ;; esac
export PHF_RUN_NAME=sft_qwen3_$SCALE   # RUN_DIR's default: runs/sft_qwen3_$SCALE in the repository
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)   # the preset: the repository's, wherever run from
CONFIG=$REPO/configs/phf_qwen3_$SCALE.yaml exec bash "$REPO/examples/launch_phf.sh" --method=sft \
  --training.micro_batch_size=1 "$@"
