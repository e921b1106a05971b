#!/usr/bin/env bash
# PHF (OPSD + hidden flow) on Qwen3-8B (36 layers, hidden 4096): TP=2 + sequence parallel, DP=4, JSD clip 0.06.
# One node of 8 x 80 GB GPUs, the paper's recipe (configs/phf_qwen3_8b.yaml: LoRA r=64/alpha=128,
# AdamW 5e-6 cosine, grad clip 0.1, global batch 32, rollouts of 1024 tokens at T=1.1 / top-p
# 0.95 / top-k 20, alpha=0.05, rho=0.999, |W|=128, stop at step 100).
#
#   HF_MODEL=/models/Qwen3-8B [DATA=...] [RUN_DIR=...] bash examples/train_phf_qwen3_8b.sh [--section.field=value ...]
#   e.g. an ablation:  ... bash examples/train_phf_qwen3_8b.sh --ablation=local_only
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)   # the preset: the repository's, wherever run from
CONFIG=$REPO/configs/phf_qwen3_8b.yaml exec bash "$REPO/examples/launch_phf.sh" "$@"
