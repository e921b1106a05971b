# Sourced from the repository root by the GPU scripts (main_job.sh, user_launcher.sh, eval_check.sh):
# this checkout importable, no model hub, unbuffered output; PY is the interpreter.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}

make_model() {  # make_model DIR SHAPE: a random-init Qwen3 of SHAPE with the real tokenizer (bf16 on a GPU, tiny: fp32)
  "$PY" - "$1" "$2" <<'PYEOF'
import sys, torch
from benchmarks.train_step_breakdown import make_model
gpu = torch.cuda.is_available() and sys.argv[2] != "tiny"
make_model(sys.argv[1], sys.argv[2], torch.bfloat16 if gpu else torch.float32)
PYEOF
}
