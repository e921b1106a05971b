#!/usr/bin/env bash
# The README's toy numbers: the main job (examples/train_phf_tiny.sh) for several seeds, one after
# the other, then held-out no-reference accuracy on the unseen cells before -> after, per seed and
# its spread. Each seed takes the main job's time (a few minutes on 2 cores).
#
#   bash examples/toy_seeds.sh                 # seeds 0-4 into runs/toy_seeds/s<seed>
#   SEEDS="0 1" OUT=runs/ts bash examples/toy_seeds.sh
#
# A seed's run directory is reused when it holds both evaluations (rerun after a crash: only the
# missing seeds run). SEED changes the toy split, the tiny model's init, the warm-up and the
# trainer's seed (1234 + SEED); runs are deterministic on one machine, not across machines.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SEEDS=${SEEDS:-0 1 2 3 4}
OUT=${OUT:-runs/toy_seeds}
for s in $SEEDS; do
  run="$OUT/s$s"
  if [ -f "$run/toy_eval_after.json" ] && [ -f "$run/toy_eval_before.json" ]; then
    echo "seed $s: reusing $run"
    continue
  fi
  echo "seed $s: bash examples/train_phf_tiny.sh (log: $run.log)"
  mkdir -p "$OUT"
  SEED=$s RUN_DIR="$run" bash examples/train_phf_tiny.sh > "$run.log" 2>&1 || { echo "seed $s failed: $run.log"; exit 1; }
done
PYTHON=python3
[ -z "${PHF_SKIP_SETUP:-}" ] && [ -x "${PHF_VENV:-.venv}/bin/python" ] && PYTHON="${PHF_VENV:-.venv}/bin/python"
"$PYTHON" - "$OUT" $SEEDS <<'PY'
import json, statistics, sys
out, seeds = sys.argv[1], sys.argv[2:]
rows = []
for s in seeds:
    before, after = (json.load(open(f"{out}/s{s}/toy_eval_{n}.json")) for n in ("before", "after"))
    rows.append((s, before["noref_unseen"], after["noref_unseen"], after["noref_seen"]))
print("seed  no-reference unseen: before -> after (gain)   seen after")
for s, b, a, seen in rows:
    print(f"{s:>4}  {b:.3f} -> {a:.3f} ({100 * (a - b):+.1f} points)        {seen:.3f}")
gains = [100 * (a - b) for _, b, a, _ in rows]
afters = [a for _, _, a, _ in rows]
print(f"gain over {len(rows)} seeds: min {min(gains):+.1f}, mean {statistics.mean(gains):+.1f}, max {max(gains):+.1f} "
      f"points; after: {min(afters):.3f}-{max(afters):.3f}")
PY
