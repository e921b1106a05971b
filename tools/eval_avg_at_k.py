"""``python tools/eval_avg_at_k.py --model H --out_dir E``: Average@k on AIME 2024 / AIME 2025 / HMMT Feb 2025.

The command ``phf-eval`` (``phf_megatron/tools/eval_avg_at_k.py``; ``--help`` lists its flags).
"""

import sys

from phf_megatron.tools.eval_avg_at_k import main

if __name__ == "__main__":  # engine replicas are spawned processes: keep this guard
    sys.exit(main())
