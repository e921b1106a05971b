"""``python tools/convert/hf_to_mcore.py --hf_dir D --out_dir O``: HF Qwen3 -> Megatron-Core dist checkpoint.

The command ``phf-hf-to-mcore`` (``phf_megatron/tools/hf_to_mcore.py``; ``--help`` lists its flags).
"""

import sys

from phf_megatron.tools.hf_to_mcore import main

if __name__ == "__main__":  # dist-checkpoint saving spawns helper processes: keep this guard
    sys.exit(main())
