#!/usr/bin/env bash
# The bytes each lease call carries (the working tree, tracked and untracked-not-ignored files, plus the call's
# carry list, benchmarks/gpu/README.md) against the run tool's 64 MiB: run before call 1. Exit 1 if one is over.
#
#   bash benchmarks/gpu/carry_sizes.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
LIMIT=$((64 * 1024 * 1024))
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
size() { local s=0 f; for f in "$@"; do [ -f "$f" ] || { echo "missing: $f" >&2; exit 1; }; s=$((s + $(stat -c %s "$f"))); done; echo $s; }
over=0
report() {  # report NAME FILES...
  local name=$1; shift
  local total=$(( tree + $(size "$@") ))
  awk -v n="$name" -v t="$total" -v tree="$tree" -v l="$LIMIT" 'BEGIN { d = (l - t) / 1048576; w = "under"
    if (d < 0) { w = "OVER"; d = -d }; printf "%s: %d bytes (tree %d + carry %d), %s by %.2f MiB\n", n, t, tree, t - tree, w, d }'
  [ $total -le $LIMIT ] || over=1
}
report "call 1 (start)" .vllm_bundle/vllm-bundle.tar.xz.part00 .vllm_bundle/megatron_core-*.whl .vllm_bundle/packing_mix.json
report "call 2 (vllm)" .vllm_bundle/vllm-bundle.tar.xz.part01 .vllm_bundle/manifest.json \
  .vllm_bundle/{math_verify,latex2sympy2_extended,antlr4_python3_runtime}-*.whl
exit $over
