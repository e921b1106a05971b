#!/usr/bin/env bash
# The GRPO baseline (the paper's Table 1 GRPO row) on the same trainer: G = 8 rollouts per prompt from
# the same vLLM engine and weight sync, the official reward (the first \boxed{} after </think> against
# the row's answer, 1 or 0), advantages normalized within each prompt's group, TRL 0.26's clipped
# policy-gradient loss; LoRA (the scale's preset), lr 5e-6, effective batch 32 completions (4 prompts),
# beta 0 (no reference pass), stop at step 100. Where the paper is silent the grpo.* defaults are the
# official run's (loss_type grpo, scale_rewards group, num_iterations 2, epsilon 0.2, the vLLM
# importance-sampling correction with a sequence mask at cap 3); the correction compares the engine's
# processed log-probs with the trainer's, so sampling is unfiltered (top-k off, top-p 1: TRL's defaults).
# The scale's PHF preset supplies the layout (configs/phf_qwen3_<SCALE>.yaml); its teacher and flow
# settings are unused.
#
#   SCALE=1p7b|4b|8b HF_MODEL=/models/Qwen3-1.7B [DATA=...] [RUN_DIR=...] bash examples/train_grpo_qwen3.sh [--section.field=value ...]
#   the official baseline (scripts/run_grpo.sh, TRL GRPOTrainer 0.26.0) also samples hotter and longer:
#     --rollout.temperature=1.2 --rollout.max_tokens=16000
set -euo pipefail
SCALE=${SCALE:-1p7b}
case $SCALE in 1p7b | 4b | 8b) ;; *) echo "error: SCALE=$SCALE: expected 1p7b, 4b or 8b (configs/phf_qwen3_<SCALE>.yaml)" >&2; exit 2 ;; esac
export PHF_RUN_NAME=grpo_qwen3_$SCALE   # RUN_DIR's default: runs/grpo_qwen3_$SCALE in the repository
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)   # the preset: the repository's, wherever run from
CONFIG=$REPO/configs/phf_qwen3_$SCALE.yaml exec bash "$REPO/examples/launch_phf.sh" --method=grpo \
  --rollout.n=8 --training.global_batch_size=32 --rollout.top_k=0 --rollout.top_p=1.0 "$@"
