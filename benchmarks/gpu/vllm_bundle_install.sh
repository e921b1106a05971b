#!/usr/bin/env bash
# Install the vLLM bundle on the GPU machine (companion of vllm_bundle.sh):
#
#   bash benchmarks/gpu/vllm_bundle_install.sh PARTS_DIR [TARGET=/tmp/vllm_site]
#   export PYTHONPATH=TARGET:$PWD${PYTHONPATH:+:$PYTHONPATH}
#
# PARTS_DIR holds manifest.json and every part (copied there by earlier run calls, see
# benchmarks/gpu/README.md). Checks sizes and sha256, unpacks (~20 s), then imports vLLM, its
# FA3 kernels and the CUDA ops from TARGET and prints what it found. Idempotent: an existing
# TARGET with the same archive is kept.
set -euo pipefail
PARTS=${1:?usage: vllm_bundle_install.sh PARTS_DIR [TARGET]}
TARGET=${2:-/tmp/vllm_site}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STAMP="$TARGET/.bundle_sha256"
WANT=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['archive_sha256'])" "$PARTS/manifest.json")
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  rm -rf "$TARGET"
  "$PY" "$HERE/bundle.py" assemble "$PARTS" "$TARGET"
  echo "$WANT" > "$STAMP"
fi
PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'PYEOF'
import importlib, torch
import vllm
print("vllm", vllm.__version__, "from", vllm.__file__, "| torch", torch.__version__)
for mod in ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn", "vllm.cumem_allocator", "megatron.core"):
    try:
        importlib.import_module(mod)
        print("ok  ", mod)
    except Exception as e:  # noqa: BLE001 - reported, the caller decides
        print("FAIL", mod, f"{type(e).__name__}: {e}")
PYEOF
