#!/usr/bin/env bash
# The eval tool on a random-init model (issue 20 point 5), then the same command again: it must resume.
#
#   bash benchmarks/gpu/eval_check.sh WORK OUT SHAPE [eval flags ...]     # SHAPE: 1.7b (GPU) | tiny (CPU)
#
# Builds WORK/model_SHAPE (benchmarks/train_step_breakdown.make_model: random init, the real Qwen3
# tokenizer) unless it is there, evaluates AIME 2024 into WORK/eval, reruns, and copies the scores to
# OUT/eval_summary.json with both wall times (first run, resumed rerun) added.
set -uo pipefail
WORK=${1:?usage: eval_check.sh WORK OUT SHAPE [flags]}; OUT=${2:?}; SHAPE=${3:?}; shift 3
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benchmarks/gpu/env.sh
MODEL=$WORK/model_$SHAPE; mkdir -p "$OUT"
make_model "$MODEL" "$SHAPE" || exit 1
rm -rf "$WORK/eval"
t0=$SECONDS
"$PY" tools/eval_avg_at_k.py --model "$MODEL" --benchmarks aime24 --out_dir "$WORK/eval" "$@" || exit 1
first=$((SECONDS - t0)); t0=$SECONDS
cp "$WORK/eval/summary.json" "$WORK/eval_first_summary.json"
"$PY" tools/eval_avg_at_k.py --model "$MODEL" --benchmarks aime24 --out_dir "$WORK/eval" "$@" || exit 1
rerun=$((SECONDS - t0))
echo "eval: first run ${first} s, rerun (resume) ${rerun} s"
"$PY" - "$WORK" "$OUT/eval_summary.json" "$first" "$rerun" <<'PYEOF'
import glob, json, sys
work = sys.argv[1]
s = json.load(open(f"{work}/eval/summary.json"))
first = json.load(open(f"{work}/eval_first_summary.json"))
tokens = sum(json.loads(line)["completion_tokens"] for p in glob.glob(f"{work}/eval/samples.rank*.jsonl") for line in open(p))
secs = first["seconds_this_run"]
s.update(wall_first_run_s=int(sys.argv[3]), wall_rerun_s=int(sys.argv[4]), first_run_generated=first["generated_this_run"],
         first_run_generate_s=secs, rerun_generated=s["generated_this_run"], completion_tokens=tokens,
         samples_per_s=first["generated_this_run"] / secs, tokens_per_s=tokens / secs)
json.dump(s, open(sys.argv[2], "w"), indent=1)
print({k: s[k] for k in ("first_run_generated", "rerun_generated", "samples_per_s", "tokens_per_s")})
PYEOF
