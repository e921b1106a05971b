#!/usr/bin/env bash
# Shared launcher of the Qwen3 examples: convert the HF checkpoint once, then torchrun the trainer.
#
#   CONFIG=configs/phf_qwen3_8b.yaml HF_MODEL=/models/Qwen3-8B bash examples/launch_phf.sh [--section.field=value ...]
#
# Environment: HF_MODEL (required: the HF Qwen3 directory), DATA (default: the official OPSD set on
# the HF Hub; a JSONL/Parquet path or a `save_to_disk` directory also works), RUN_DIR (default
# runs/<PHF_RUN_NAME, else the config's name> in the repository; relative paths given in HF_MODEL, DATA, RUN_DIR and
# MCORE_DIR are read from the directory the launcher is run from, CONFIG too where the repository has no such file;
# where both have one and they differ it stops: give CONFIG as an absolute path),
# NGPU (the GPUs this node shows: those of CUDA_VISIBLE_DEVICES CUDA reads, else `nvidia-smi -L`'s; one with MIG; 8 where it shows none),
# MCORE_DIR (where the converted base checkpoint goes, default $RUN_DIR/mcore_base; on several nodes node 0 converts
# and the others wait for it up to MCORE_WAIT seconds, default 3600, or stop at once at the $MCORE_DIR.failed its
# failed (or SIGTERMed) conversion leaves, which its next conversion removes (one an earlier launch left counts after
# MCORE_STALE seconds, default 120); while node 0 converts it rewrites the heartbeat $MCORE_DIR.converting every
# MCORE_HEARTBEAT seconds (default 5) and removes it at the end, and the others stop once it has not changed in
# MCORE_SILENT seconds of their wait (default 120, more than twice MCORE_HEARTBEAT): node 0 was killed outright (one
# already there counts from the wait's start): put it where every node sees it),
# NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT for multi-node torchrun (add --rollout.num_engines=auto for
# a rollout engine per node; a Slurm job: examples/slurm/train_phf_multinode.sbatch).
# DRY_RUN=1 prints the commands (conversion, torchrun) instead of running them; PREPARE_ONLY=1
# converts the base model and stops (a multi-node job converts once, before the nodes start; in an srun step of
# several tasks only its task 0 converts, and srun's code is that conversion's).
set -euo pipefail
CALLER=$(pwd -P)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -n "${CONFIG:-}" ] || { echo "error: CONFIG: is required: a configs/*.yaml preset (the train_*.sh launchers set it)" >&2; exit 2; }
[ -n "${HF_MODEL:-}" ] || { echo "error: HF_MODEL: is required: the Hugging Face Qwen3 checkpoint directory" >&2; exit 2; }
if [ "$CALLER" != "$(pwd -P)" ]; then   # run from another directory: the paths given are read from there, as written
  for v in HF_MODEL DATA; do   # an input there (else as before, from the repository: DATA may be a Hub name)
    if [ -n "${!v:-}" ] && [[ ${!v} != /* ]] && [ -e "$CALLER/${!v}" ]; then printf -v "$v" '%s' "$CALLER/${!v}"; fi
  done
  # a preset of one's own there (the train_*.sh launchers name the repository's, absolute); one there and another of
  # the same name in the repository: the user names which
  if [[ $CONFIG != /* ]] && [ -e "$CALLER/$CONFIG" ]; then
    if [ ! -e "$CONFIG" ]; then CONFIG=$CALLER/$CONFIG
    elif [ -f "$CALLER/$CONFIG" ] && [ -f "$CONFIG" ] && ! cmp -s "$CALLER/$CONFIG" "$CONFIG"; then
      echo "error: CONFIG=$CONFIG: $CALLER/$CONFIG and the repository's $(pwd -P)/$CONFIG differ: name the one to train on, CONFIG=$CALLER/$CONFIG (yours) or CONFIG=$(pwd -P)/$CONFIG (the preset)" >&2
      exit 2
    fi
  fi
  for v in RUN_DIR MCORE_DIR; do   # an output: there
    if [ -n "${!v:-}" ] && [[ ${!v} != /* ]]; then printf -v "$v" '%s' "$CALLER/${!v}"; fi
  done
fi
DATA=${DATA:-siyanzhao/Openthoughts_math_30k_opsd}
RUN_DIR=${RUN_DIR:-runs/${PHF_RUN_NAME:-$(basename "$CONFIG" .yaml)}}   # by default in the repository's runs/
# How many of CUDA_VISIBLE_DEVICES's entries CUDA shows a process ($1: the GPUs the driver lists, 0 if unknown; the
# rest: their UUIDs, in order, if listed), read as CUDA reads it: the entries up to the first that is not a GPU (-1, an
# empty entry, an index past the listed GPUs, a UUID of the other kind, a GPU- UUID that is the start of no listed GPU's
# or of several), none if one of those is repeated. Not torch's parser (torch.cuda._parse_visible_devices): importing
# torch takes ~1.5 s, it raises ValueError on an entry + or -, reads -0 as 0, and reads a repeat that follows an index
# past the GPUs or an unknown UUID as none
cuda_visible_count() {
  local entry id i n=0 seen=' ' prefix='' listed=$1
  shift
  [[ $CUDA_VISIBLE_DEVICES =~ ^(GPU|MIG)- ]] && prefix=${BASH_REMATCH[0]}
  IFS=, read -ra entries <<< "$CUDA_VISIBLE_DEVICES"
  for entry in "${entries[@]}"; do
    if [ -n "$prefix" ]; then
      [[ $entry == "$prefix"* ]] || break
      id=$entry
      if [ "$prefix" = GPU- ] && [ $# -gt 0 ]; then   # the listed GPU whose UUID it starts (abbreviations work)
        id=''
        for ((i = 1; i <= $#; i++)); do
          [[ ${!i} == "$entry"* ]] || continue
          [ -z "$id" ] || { id=''; break; }   # the start of several: ambiguous
          id=$((i - 1))
        done
        [ -n "$id" ] || break
      fi
    else   # an index as strtoul reads it: leading blanks and a + skipped, the digits up to the first other character
      [[ $entry =~ ^[[:space:]]*[+]?([0-9]+) ]] || break
      id=$((10#${BASH_REMATCH[1]}))
      [ "$listed" -eq 0 ] || [ "$id" -lt "$listed" ] || break
    fi
    [[ $seen != *" $id "* ]] || { echo 0; return; }
    seen+="$id "; n=$((n + 1))
  done
  echo "$n"
}
LISTING=$(nvidia-smi -L 2>/dev/null || true)   # "GPU i: ..." lines, each MIG-enabled one's "  MIG ... Device j: ..." under it
GPUS_LISTED=$(grep -c '^GPU ' <<< "$LISTING" || true)
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then   # what CUDA will show each rank; else what the driver lists
  read -ra GPU_UUIDS <<< "$(sed -n 's/^GPU [0-9]*:.*(UUID: \(GPU-[^)]*\)).*/\1/p' <<< "$LISTING" | tr '\n' ' ')"
  GPUS_HERE=$(cuda_visible_count "$GPUS_LISTED" ${GPU_UUIDS[@]+"${GPU_UUIDS[@]}"})
  if [ "$GPUS_HERE" -eq 0 ]; then
    echo "error: CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES': CUDA shows no GPU with it (it reads the entries up to the first that is not a GPU here: -1, an empty one; a repeated one hides all): name this node's GPUs (0,1,...) or unset it" >&2
    exit 2
  fi
else
  GPUS_HERE=$GPUS_LISTED
fi
# MIG: a CUDA process enumerates a single MIG device, however many the node has or CUDA_VISIBLE_DEVICES names (NVIDIA's
# MIG user guide, "CUDA Device Enumeration"): one rank (more would share it or die in set_device); a GPU, not its MIGs
MIG=''
if grep -q '^ *MIG ' <<< "$LISTING" || [[ ${CUDA_VISIBLE_DEVICES:-} == MIG-* ]]; then
  MIG='; MIG: CUDA shows a process one MIG device'; [ "$GPUS_HERE" -le 1 ] || GPUS_HERE=1
fi
NGPU=${NGPU:-$( [ "$GPUS_HERE" -gt 0 ] && echo "$GPUS_HERE" || echo 8)}
NNODES=${NNODES:-1}
MCORE_WAIT=${MCORE_WAIT:-3600}
MCORE_STALE=${MCORE_STALE:-120}
MCORE_HEARTBEAT=${MCORE_HEARTBEAT:-5}
MCORE_SILENT=${MCORE_SILENT:-120}
for v in NGPU NNODES MCORE_WAIT MCORE_STALE MCORE_HEARTBEAT MCORE_SILENT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "error: $v=${!v}: expected a whole number >= 1" >&2; exit 2; }
done
if [ "$MCORE_SILENT" -le $((2 * MCORE_HEARTBEAT)) ]; then   # a waiting node looks each second: a live node 0 seems silent
  echo "error: MCORE_SILENT=$MCORE_SILENT: expected more than twice MCORE_HEARTBEAT=$MCORE_HEARTBEAT, the seconds between node 0's heartbeats" >&2
  exit 2
fi
# srun's tasks (SLURM_STEP_NUM_TASKS: srun sets it in a step's tasks) are the launchers, one per node: NNODES of them
STEP_TASKS=1
if [[ ${SLURM_STEP_NUM_TASKS:-} =~ ^[0-9]+$ ]]; then STEP_TASKS=$((10#$SLURM_STEP_NUM_TASKS)); fi
if [ -z "${PREPARE_ONLY:-}" ] && [ "$STEP_TASKS" -gt 1 ] \
   && [ "$STEP_TASKS" -ne "$NNODES" ]; then   # each node's (or task's) torchrun was a run of its own
  # worded beside the trainer's own srun check: phf_megatron/commands.py's srun_tasks_line
  echo "error: $(python -c 'import sys; from phf_megatron.commands import srun_tasks_line; print(srun_tasks_line(*sys.argv[1:]))' \
                 "$STEP_TASKS" "$NNODES")" >&2
  exit 2
fi
if [ -n "${NODE_RANK:-}" ] && ! { [[ $NODE_RANK =~ ^[0-9]+$ ]] && [ $((10#$NODE_RANK)) -lt "$NNODES" ]; }; then   # not torchrun's
  echo "error: NODE_RANK=$NODE_RANK: expected this node's index, a whole number from 0 to $((NNODES - 1)) (NNODES=$NNODES)" >&2
  exit 2
fi
if [ "$NNODES" -gt 1 ] && [ -z "${PREPARE_ONLY:-}" ]; then   # said now, not after the conversion
  [ -n "${NODE_RANK:-}" ] || { echo "error: NNODES=$NNODES: set NODE_RANK, this node's index (0 to $((NNODES - 1)))" >&2; exit 2; }
  [ -n "${MASTER_ADDR:-}" ] || { echo "error: NNODES=$NNODES: set MASTER_ADDR, the address of the node of NODE_RANK=0" >&2; exit 2; }
fi
if [ "$GPUS_HERE" -gt 0 ] && [ "$NGPU" -gt "$GPUS_HERE" ]; then   # the ranks past them would die in CUDA's set_device
  echo "error: NGPU=$NGPU: this node shows $GPUS_HERE GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}$MIG): one rank per GPU, NGPU <= $GPUS_HERE" >&2
  exit 2
fi
MCORE_DIR=${MCORE_DIR:-$RUN_DIR/mcore_base}
MCORE_DIR=${MCORE_DIR%"${MCORE_DIR##*[!/]}"}   # without a trailing /: $MCORE_DIR.failed beside it, not in it
[ -e "$HF_MODEL" ] || { echo "error: HF_MODEL: $HF_MODEL does not exist" >&2; exit 2; }   # was "has no config.json"
[ -f "$HF_MODEL/config.json" ] || { echo "error: HF_MODEL: $HF_MODEL has no config.json (not a HF model directory)" >&2; exit 2; }
# a local DATA that is not there: was the trainer's line after the conversion (a Hub name, owner/name, is the loader's)
WHY=$(python -c 'import sys; from phf_megatron.data.sources import missing_source; print(missing_source(sys.argv[1]) or "")' "$DATA")
[ -z "$WHY" ] || { echo "error: DATA: $WHY" >&2; exit 2; }
TRAIN_ARGS=(--config "$CONFIG" --run_dir="$RUN_DIR" --model.hf_dir="$HF_MODEL" --model.pretrained_checkpoint="$MCORE_DIR"
            --data.path="$DATA" "$@")
# the settings first (a second, no torch): a mistyped flag or SCALE, or a layout the NGPU x NNODES ranks do not fit
# (TP x PP, the batch over the data-parallel ranks), stops here in one line on every node (as rank 0: another rank
# leaves a setting's error to rank 0), not after the conversion; node 0 alone says the settings' notes here, before
# the conversion, and the run does not repeat them (nor does a launch given PHF_NOTES_SAID=1: the Slurm example's
# nodes, after its PREPARE_ONLY step said them)
NOTES_SAID=${PHF_NOTES_SAID:-}
[ "$((10#${NODE_RANK:-0}))" -eq 0 ] || NOTES_SAID=1
RANK=0 WORLD_SIZE=$((NGPU * NNODES)) PHF_NOTES_SAID=$NOTES_SAID \
  python -m phf_megatron.train "${TRAIN_ARGS[@]}" --print-config > /dev/null
export PHF_NOTES_SAID=1

run() { if [ -n "${DRY_RUN:-}" ]; then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi; }
# $MCORE_DIR.failed's time, inode and text, read once (node 0 may remove it meanwhile: then nothing)
marker_state() { { s=$(stat -c '%Y %i' "$MCORE_DIR.failed") && t=$(cat "$MCORE_DIR.failed") && echo "$s"$'\n'"$t"; } 2>/dev/null || true; }
fail_marker() { echo "$1" > "$MCORE_DIR.failed.tmp" && mv "$MCORE_DIR.failed.tmp" "$MCORE_DIR.failed"; }
# node 0's heartbeat while it converts: rewritten (a new text each time) until the conversion ends, however it ends
# but by SIGKILL (the OOM killer, a scheduler, a lost machine), or this launcher is gone; '' where there is none
HEARTBEAT=$MCORE_DIR.converting
heartbeat_state() { cat "$HEARTBEAT" 2>/dev/null || true; }
beat() {
  trap 'exit 0' TERM   # between writes (none renamed into place after the removal); wait, unlike sleep, ends at once
  while kill -0 "$$" 2>/dev/null; do
    date +%s.%N > "$HEARTBEAT.tmp" && mv -f "$HEARTBEAT.tmp" "$HEARTBEAT"
    sleep "$MCORE_HEARTBEAT" & wait $!
  done
}
conversion_ends() {   # EXIT trap of node 0's conversion: one stopped short (SIGTERM, an error) leaves its marker too
  kill "$BEAT" 2>/dev/null && wait "$BEAT" || true
  [ -d "$MCORE_DIR" ] || [ -e "$MCORE_DIR.failed" ] || fail_marker "its launcher stopped before it ended: SIGTERM?"
  rm -f "$HEARTBEAT" "$HEARTBEAT.tmp"
}

if [ -d "$MCORE_DIR" ]; then
  :   # converted (the converter writes $MCORE_DIR.tmp and renames it when complete: its existence is the marker)
elif [ -n "${PREPARE_ONLY:-}" ] && [ "$STEP_TASKS" -gt 1 ] && [ "${SLURM_PROCID:-0}" != 0 ]; then
  # PREPARE_ONLY=1 srun -N2 ...: each task converted at once into the same $MCORE_DIR.tmp; the step's task 0 does
  echo "launch_phf: srun task $SLURM_PROCID: PREPARE_ONLY=1: task 0 of the $STEP_TASKS converts into $MCORE_DIR, once" >&2
elif [ "${NODE_RANK:-0}" -ne 0 ] && [ -z "${PREPARE_ONLY:-}" ]; then   # node 0 converts; the others wait for it
  if [ -n "${DRY_RUN:-}" ]; then
    echo "# node $NODE_RANK waits up to $MCORE_WAIT s for node 0's conversion into $MCORE_DIR"
  else
    echo "launch_phf: node $NODE_RANK: waiting up to $MCORE_WAIT s (MCORE_WAIT) for node 0's conversion into $MCORE_DIR" >&2
    DEADLINE=$((SECONDS + MCORE_WAIT))
    # a marker already there may be an earlier launch's, which node 0's conversion, started later, removes: it
    # counts once it changes or is still there after MCORE_STALE seconds (default 120)
    stale=$(marker_state); STALE_UNTIL=$((SECONDS + MCORE_STALE))
    # node 0's heartbeat, judged by its changes seen here (no clocks compared across machines); one already there
    # may be an earlier launch's, which node 0's conversion rewrites: silent from the wait's start
    beat_seen=$(heartbeat_state); BEAT_SINCE=$SECONDS
    until [ -d "$MCORE_DIR" ]; do
      state=$(marker_state)
      if [ -n "$state" ] && { [ "$state" != "$stale" ] || [ "$SECONDS" -ge "$STALE_UNTIL" ]; }; then
        echo "error: MCORE_DIR: node 0's conversion into $MCORE_DIR failed ($(sed -n 2p <<< "$state")); node 0's log says more" >&2; exit 1
      fi
      beat_now=$(heartbeat_state)
      [ "$beat_now" = "$beat_seen" ] || { beat_seen=$beat_now; BEAT_SINCE=$SECONDS; }
      # more than MCORE_SILENT in SECONDS (whole seconds of the clock, read twice: up to 1 s early) is at least that
      if [ -n "$beat_now" ] && [ $((SECONDS - BEAT_SINCE)) -gt "$MCORE_SILENT" ]; then
        echo "error: MCORE_DIR: node 0 (NODE_RANK=0) stopped converting into $MCORE_DIR: its heartbeat $HEARTBEAT has not changed in $((SECONDS - BEAT_SINCE)) s (MCORE_SILENT; killed? out of memory, the scheduler, a lost machine): see node 0's log, then launch again (its conversion replaces the partial $MCORE_DIR.tmp)" >&2
        exit 1
      fi
      [ "$SECONDS" -lt "$DEADLINE" ] || { echo "error: MCORE_DIR: $MCORE_DIR did not appear in $MCORE_WAIT s: node 0 (NODE_RANK=0) converts it; it must be on a file system every node sees (or convert first: PREPARE_ONLY=1)" >&2; exit 1; }
      sleep 1
    done
  fi
else   # once: the base weights as a Megatron-Core dist checkpoint (any layout loads it)
  run mkdir -p "$(dirname "$MCORE_DIR")"
  CONVERT=(python tools/convert/hf_to_mcore.py --hf_dir "$HF_MODEL" --out_dir "$MCORE_DIR" --dtype bf16)
  if [ -n "${DRY_RUN:-}" ]; then run "${CONVERT[@]}"; else
    # a failure leaves $MCORE_DIR.failed (the exit code, the converter's last line): the waiting nodes stop at it
    rm -f "$MCORE_DIR.failed"
    BEAT=''
    if [ "$NNODES" -gt 1 ]; then   # nodes wait for it: the heartbeat (the EXIT trap ends it)
      beat < /dev/null > /dev/null 2>&1 & BEAT=$!
      trap conversion_ends EXIT
    fi
    ERR_LOG=$(mktemp)
    code=0
    { "${CONVERT[@]}" 2>&1 1>&3 | tee "$ERR_LOG" >&2; } 3>&1 || code=$?   # stderr shown as it comes, and kept
    [ "$code" -eq 0 ] || fail_marker "exit code $code: $(tail -n 1 "$ERR_LOG")"
    rm -f "$ERR_LOG"
    [ "$code" -eq 0 ] || exit "$code"
    [ -z "$BEAT" ] || { conversion_ends; trap - EXIT; }   # before torchrun's exec, which runs no EXIT trap
  fi
fi
[ -z "${PREPARE_ONLY:-}" ] || exit 0
LAUNCH=(torchrun --nproc-per-node "$NGPU")
if [ "$NNODES" -gt 1 ]; then
  LAUNCH+=(--nnodes "$NNODES" --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "${MASTER_PORT:-29500}")
else
  LAUNCH+=(--standalone)
fi
# torchrun's own default for several ranks, set here without its warning banner in the log (tune it as you like)
[ "$NGPU" -eq 1 ] || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
CMD=("${LAUNCH[@]}" -m phf_megatron.train "${TRAIN_ARGS[@]}")
if [ -n "${DRY_RUN:-}" ]; then run "${CMD[@]}"; exit 0; fi
# torchrun SIGKILLs its workers 30 s after passing a SIGTERM on unless it knows --shutdown-timeout
# (pytorch#172596, 2026-03): an older one ignores TORCH_ELASTIC_SHUTDOWN_TIMEOUT, and a step plus its save may not fit
# (the help read whole, not piped into grep -q: under pipefail a help cut short by grep's exit read as "no")
if [ -n "${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-}" ] && [[ $(torchrun --help 2>/dev/null || true) != *--shutdown-timeout* ]]; then
  echo "warning: this torchrun has no --shutdown-timeout: it ignores TORCH_ELASTIC_SHUTDOWN_TIMEOUT=$TORCH_ELASTIC_SHUTDOWN_TIMEOUT and kills the workers 30 s after a SIGTERM, which may cut the last step and its save short (a newer torch has it)" >&2
fi
exec "${CMD[@]}"
