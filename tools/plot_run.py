"""``python tools/plot_run.py RUN_DIR``: loss curves, clip diagnostics, layer-energy heatmap, loss by token.

The command ``phf-plot-run`` (``phf_megatron/tools/plot_run.py``; ``--help`` lists its flags).
"""

import sys

from phf_megatron.tools.plot_run import main

if __name__ == "__main__":
    sys.exit(main())
