#!/usr/bin/env bash
# The user's launcher on one GPU, as a user runs it (issue 20 point 3), unattended:
#
#   bash benchmarks/gpu/user_launcher.sh WORK [--tiny]
#
# 1. a random-init Qwen3-1.7B with the real tokenizer (benchmarks/train_step_breakdown.make_model)
#    and the embedded toy math set (--tiny: the tiny shape, fp32, on CPU);
# 2. `NGPU=1 HF_MODEL=... bash examples/train_phf_qwen3_1p7b.sh` + overrides for a short run:
#    hf_to_mcore conversion, torchrun, the overlapped mode (rollout.async_steps=1: the engine in its
#    own spawned process, CUDA-IPC weight push), the verified sync with the probe after every step,
#    a checkpoint every 2 steps;
# 3. a SIGKILL of the whole launch (torchrun, trainer, engine) once a checkpoint is saved, and a check
#    that nothing of it outlives the kill;
# 4. the same command again: it resumes from the last checkpoint and finishes step 6;
# 5. the PEFT adapter export (tools/convert/mcore_to_hf.py --adapter_only), loaded by PEFT on the
#    base model, one forward.
# Writes WORK/user_launcher.json (what held, times) and the logs beside it; exit 0 only when all held.
set -uo pipefail
WORK=${1:?usage: bash benchmarks/gpu/user_launcher.sh WORK [--tiny]}
TINY=${2:-}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benchmarks/gpu/env.sh
if [ "$TINY" = --tiny ]; then
  SHAPE=tiny; MAXT=16
  EXTRA=(--model.dtype=float32 --model.recompute_granularity=null --rollout.enable_sleep_mode=false)
else
  SHAPE=1.7b; MAXT=256
  EXTRA=(--rollout.enable_sleep_mode=false --rollout.gpu_memory_utilization=0.3)   # sleep mode: the 1p7b stage
fi
MODEL=$WORK/model_$SHAPE RUN=$WORK/launcher_run RESULT=$WORK/user_launcher.json
rm -rf "$RUN" "$RESULT"   # a run left in WORK by an earlier launch would be "resumed" at once
make_model "$MODEL" "$SHAPE" || exit 1
"$PY" -c "import sys; from benchmarks.train_step_breakdown import make_data; make_data(sys.argv[1], 64)" "$WORK/toy.jsonl" || exit 1
OVR=(--training.train_iters=6 --training.global_batch_size=4 --training.micro_batch_size=2
     --rollout.max_tokens=$MAXT --rollout.enforce_eager=true --rollout.async_steps=1
     --checkpoint.save_interval=2 --logging.verbose=true --data.max_prompt_length=4096 "${EXTRA[@]}")   # verbose: a timed-out stage shows where it was
launch() {  # launch LOG: the user's command, in a session of its own (so one kill reaches all of it)
  NGPU=1 HF_MODEL=$MODEL DATA=$WORK/toy.jsonl RUN_DIR=$RUN \
    setsid bash examples/train_phf_qwen3_1p7b.sh "${OVR[@]}" >"$1" 2>&1 &
  LAUNCH_PID=$! LAUNCH_LOG=$1
}
declare -A R
LAUNCH_PID=
stop_launch() {  # on exit or a stage timeout's SIGTERM: no process of the launch outlives this script
  [ -n "$LAUNCH_PID" ] || return 0
  kill -0 "$LAUNCH_PID" 2>/dev/null && { echo "stopping the launch; the end of $LAUNCH_LOG:"; tail -15 "$LAUNCH_LOG"; }
  local p; for p in $(tree "$LAUNCH_PID"); do kill -9 "$p" 2>/dev/null; done; kill -9 -- -"$LAUNCH_PID" 2>/dev/null
}
trap 'stop_launch; exit 143' TERM INT
trap stop_launch EXIT
tree() {  # tree PID: PID and every descendant (torchrun starts its workers in sessions of their own)
  local p; echo "$1"; for p in $(pgrep -P "$1"); do tree "$p"; done
}
t0=$SECONDS
echo "$(date +%T) first run (killed once a checkpoint is saved): $WORK/launcher_run1.log"
launch "$WORK/launcher_run1.log"
LATEST=$RUN/checkpoints/latest_checkpointed_iteration.txt
while kill -0 "$LAUNCH_PID" 2>/dev/null && [ "$(cat "$LATEST" 2>/dev/null || echo 0)" -lt 2 ]; do sleep 0.2; done
R[first_run_s]=$((SECONDS - t0)); R[saved_iter]=$(cat "$LATEST" 2>/dev/null || echo none)
if kill -0 "$LAUNCH_PID" 2>/dev/null; then   # a crash of the whole job: every process of it at once
  TREE=$(tree "$LAUNCH_PID" | tr '\n' ' ')
  R[killed_processes]=$(for p in $TREE; do ps -o comm= -p "$p"; done | sort | uniq -c | tr -s ' \n' ' ')
  kill -9 $TREE 2>/dev/null; kill -9 -- -"$LAUNCH_PID" 2>/dev/null; wait "$LAUNCH_PID" 2>/dev/null; R[killed]=true
else
  wait "$LAUNCH_PID"; R[killed]="false (exited $? before the kill)"; TREE=""
fi
sleep 3
LEFT=$(for p in $TREE; do case $(ps -o stat= -p "$p") in ""|Z*) ;; *) echo "$p";; esac; done | tr '\n' ' ')
R[left_after_kill]=${LEFT:-none}
t1=$SECONDS
echo "$(date +%T) resume: $WORK/launcher_run2.log"
launch "$WORK/launcher_run2.log"
wait "$LAUNCH_PID"; R[resume_rc]=$?; R[resume_s]=$((SECONDS - t1))
R[resumed_from]=$(grep -o "resuming from step [0-9]*" "$WORK/launcher_run2.log" | head -1)
R[final_iter]=$(cat "$LATEST" 2>/dev/null || echo none)
t2=$SECONDS
echo "$(date +%T) export: $WORK/export.log"
rm -rf "$WORK/adapter"
"$PY" tools/convert/mcore_to_hf.py --mcore_dir "$RUN" --out_dir "$WORK/adapter" --adapter_only >"$WORK/export.log" 2>&1
R[export_rc]=$?
"$PY" - "$MODEL" "$WORK/adapter" >>"$WORK/export.log" 2>&1 <<'EOF'
import sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
dev = "cuda" if torch.cuda.is_available() else "cpu"
base = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16 if dev == "cuda" else torch.float32).to(dev)
model = PeftModel.from_pretrained(base, sys.argv[2])
logits = model(torch.tensor([[1, 2, 3]], device=dev)).logits
assert torch.isfinite(logits).all()
print("peft adapter loaded; forward finite", tuple(logits.shape))
EOF
R[adapter_loads]=$([ $? = 0 ] && echo true || echo false); R[export_s]=$((SECONDS - t2))
{ echo "{"; for k in "${!R[@]}"; do printf '  "%s": "%s",\n' "$k" "${R[$k]}"; done
  printf '  "total_s": "%s"\n}\n' "$((SECONDS - t0))"; } >"$RESULT"
cat "$RESULT"
[ "${R[killed]}" = true ] && [ "${R[left_after_kill]}" = none ] && [ "${R[resume_rc]}" = 0 ] \
  && [ -n "${R[resumed_from]}" ] && [ "${R[final_iter]}" = 6 ] && [ "${R[export_rc]}" = 0 ] && [ "${R[adapter_loads]}" = true ]
