#!/usr/bin/env bash
# The README's main job on a CPU machine (no GPU, no hub). Sets up .venv on first use.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup_env.sh
# shellcheck disable=SC1091
. "${PHF_VENV:-.venv}/bin/activate"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python examples/objective_demo.py
