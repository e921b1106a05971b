#!/usr/bin/env bash
# GPU check of the Qwen3 Megatron model (issue 3): bf16 logits vs HF, then fwd+bwd throughput and
# peak memory vs HF transformers SDPA at Qwen3-1.7B shape (4 x 1536 tokens). Unattended, ~5 min.
#
# From the repo root on the GPU machine (no internet needed):
#   pip install --no-deps --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:$PWD
#   bash benchmarks/gpu_model_check.sh OUTDIR
#
# Writes (flat, 8 files): OUTDIR/run.log, logits.json, bench_{hf,mcore_fused,mcore_compiled,
# mcore_chunked,mcore_plain}.json, summary.json. Each step has its own time limit; a failing
# step is recorded and the next one still runs.
set -uo pipefail
OUT=${1:?usage: bash benchmarks/gpu_model_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/run.log"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() {  # step SECONDS CMD...: run with a limit, log everything, keep going on failure
  local limit=$1; shift
  echo "=== $(date +%T) $*" >>"$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  echo "=== exit $? after ${SECONDS}s total" >>"$LOG"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python -c "import torch, transformers, megatron.core as m; print('torch', torch.__version__, 'transformers', transformers.__version__, 'megatron-core', m.__version__, 'triton', __import__('triton').__version__)"
} >>"$LOG" 2>&1
step 120 python -m benchmarks.model_logits_check --out "$OUT/logits.json"
step 70 python -m benchmarks.model_throughput --variant hf --profile --out-dir "$OUT"
step 100 python -m benchmarks.model_throughput --variant mcore_fused --profile --out-dir "$OUT"
step 150 python -m benchmarks.model_throughput --variant mcore_compiled --out-dir "$OUT"
step 60 python -m benchmarks.model_throughput --variant mcore_chunked --out-dir "$OUT"
step 60 python -m benchmarks.model_throughput --variant mcore_plain --out-dir "$OUT"
python benchmarks/summarize_model_bench.py "$OUT" >>"$LOG" 2>&1
grep -h '^\[' "$LOG" || true
cat "$OUT/summary.json" 2>/dev/null
