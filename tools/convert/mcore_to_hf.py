"""``python tools/convert/mcore_to_hf.py --mcore_dir O --out_dir H``: a Megatron-Core checkpoint or a training run -> HF Qwen3.

The command ``phf-mcore-to-hf`` (``phf_megatron/tools/mcore_to_hf.py``; ``--help`` lists its flags).
"""

import sys

from phf_megatron.tools.mcore_to_hf import main

if __name__ == "__main__":  # dist-checkpoint loading may spawn helper processes: keep this guard
    sys.exit(main())
