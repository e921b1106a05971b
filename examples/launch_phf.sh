#!/usr/bin/env bash
# Shared launcher of the Qwen3 examples: convert the HF checkpoint once, then torchrun the trainer.
#
#   CONFIG=configs/phf_qwen3_8b.yaml HF_MODEL=/models/Qwen3-8B bash examples/launch_phf.sh [--section.field=value ...]
#
# Environment: HF_MODEL (required: the HF Qwen3 directory), DATA (default: the official OPSD set on
# the HF Hub; a JSONL/Parquet path or a `save_to_disk` directory also works), RUN_DIR, NGPU (8),
# MCORE_DIR (where the converted base checkpoint goes, default $RUN_DIR/mcore_base),
# NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT for multi-node torchrun (add --rollout.num_engines=auto for
# a rollout engine per node; a Slurm job: examples/slurm/train_phf_multinode.sbatch).
# DRY_RUN=1 prints the commands (conversion, torchrun) instead of running them; PREPARE_ONLY=1
# converts the base model and stops (a multi-node job converts once, before the nodes start).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${CONFIG:?set CONFIG to a configs/*.yaml file}"
: "${HF_MODEL:?set HF_MODEL to the Hugging Face Qwen3 checkpoint directory}"
DATA=${DATA:-siyanzhao/Openthoughts_math_30k_opsd}
RUN_DIR=${RUN_DIR:-runs/$(basename "$CONFIG" .yaml)}
NGPU=${NGPU:-8}
MCORE_DIR=${MCORE_DIR:-$RUN_DIR/mcore_base}
[ -f "$HF_MODEL/config.json" ] || { echo "HF_MODEL=$HF_MODEL has no config.json" >&2; exit 2; }
TRAIN_ARGS=(--config "$CONFIG" --run_dir="$RUN_DIR" --model.hf_dir="$HF_MODEL" --model.pretrained_checkpoint="$MCORE_DIR"
            --data.path="$DATA" "$@")
# the settings first (a second, no torch): a mistyped flag or SCALE stops here in one line, not after the conversion
python -m phf_megatron.train "${TRAIN_ARGS[@]}" --print-config > /dev/null

run() { if [ -n "${DRY_RUN:-}" ]; then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi; }

if [ ! -d "$MCORE_DIR" ]; then   # once: the base weights as a Megatron-Core dist checkpoint (any layout loads it)
  run mkdir -p "$(dirname "$MCORE_DIR")"
  run python tools/convert/hf_to_mcore.py --hf_dir "$HF_MODEL" --out_dir "$MCORE_DIR" --dtype bf16
fi
[ -z "${PREPARE_ONLY:-}" ] || exit 0
LAUNCH=(torchrun --nproc-per-node "$NGPU")
if [ "${NNODES:-1}" -gt 1 ]; then
  LAUNCH+=(--nnodes "$NNODES" --node-rank "${NODE_RANK:?set NODE_RANK}" --master-addr "${MASTER_ADDR:?}" --master-port "${MASTER_PORT:-29500}")
else
  LAUNCH+=(--standalone)
fi
CMD=("${LAUNCH[@]}" -m phf_megatron.train "${TRAIN_ARGS[@]}")
if [ -n "${DRY_RUN:-}" ]; then run "${CMD[@]}"; exit 0; fi
# torchrun SIGKILLs its workers 30 s after passing a SIGTERM on unless it knows --shutdown-timeout
# (pytorch#172596, 2026-03): an older one ignores TORCH_ELASTIC_SHUTDOWN_TIMEOUT, and a step plus its save may not fit
# (the help read whole, not piped into grep -q: under pipefail a help cut short by grep's exit read as "no")
if [ -n "${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-}" ] && [[ $(torchrun --help 2>/dev/null || true) != *--shutdown-timeout* ]]; then
  echo "warning: this torchrun has no --shutdown-timeout: it ignores TORCH_ELASTIC_SHUTDOWN_TIMEOUT=$TORCH_ELASTIC_SHUTDOWN_TIMEOUT and kills the workers 30 s after a SIGTERM, which may cut the last step and its save short (a newer torch has it)" >&2
fi
exec "${CMD[@]}"
