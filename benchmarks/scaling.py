#!/usr/bin/env python
"""The tables (and plot) of ``docs/scaling.md``: the step-time model (``scaling_model.py``) on its
inputs (``scaling_inputs.py``). The command only; it sits above both, which never import it.

    python benchmarks/scaling.py                                  # the tables of docs/scaling.md
    python benchmarks/scaling.py --plot runs/scaling.png          # + step time against nodes
    python benchmarks/scaling.py --update-doc docs/scaling.md --plot docs/scaling_nodes.png
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":           # `python benchmarks/scaling.py` from anywhere: the repository first
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.scaling_inputs import render_doc, report, sections  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plot", default=None, help="write step time against nodes (PNG) here")
    ap.add_argument("--update-doc", default=None, help="rewrite the generated tables of this document (docs/scaling.md)")
    args = ap.parse_args(argv)
    if args.update_doc:
        with open(args.update_doc) as f:
            text = f.read()
        with open(args.update_doc, "w") as f:
            f.write(render_doc(text, sections(args.plot)))
        return
    print(report(plot_path=args.plot))


if __name__ == "__main__":
    main()
