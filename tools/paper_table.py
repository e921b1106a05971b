"""``python tools/paper_table.py --hf_model DIR --scale 1p7b --out DIR``: the paper's tables on our stack.

The command ``phf-paper-table`` (``phf_megatron/tools/paper_table.py``; ``--help`` lists its flags).
"""

import sys

from phf_megatron.tools.paper_table import main

if __name__ == "__main__":
    sys.exit(main())
