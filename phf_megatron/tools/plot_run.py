"""Plot a training run: loss curves, clip diagnostics, a layer x step energy heatmap, the loss by token.

    python tools/plot_run.py runs/phf_tiny                      # -> runs/phf_tiny/plots/{curves,layer_energy,loss_tokens}.png
    python tools/plot_run.py runs/phf_tiny --out /tmp/run.png   # -> /tmp/run.png, /tmp/run_layer_energy.png, /tmp/run_loss_tokens.png
    phf-plot-run ...                                            # the same command, installed by pip

Panels (from ``metrics.jsonl``): total loss, OPSD (JSD) loss, flow loss, gradient norm, learning
rate, the spread of the flow energy over layers (largest layer's share, normalized entropy), the
clip diagnostics (fraction of tokens and of vocabulary summands the clip cut), the OPSD loss
before and after the clip, and the on-policy fraction (``rollout.lmbda`` < 1). The heatmap shows
each step's share of the flow energy per layer (columns sum to 1). From ``loss_tokens.jsonl``:
the share of the step's OPSD loss of the tokens that lead it most often, over the steps, and the
last record's top 20. A panel whose metric was never logged says so, and why, from the run's
``config.yaml`` (the flow energy of an OPSD-only run, the on-policy fraction of a run at lmbda 1).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from ..commands import command, parse_command_line
from ..errors import ConfigError
from ..input_files import missing_dir


@dataclass
class PlotRun:
    """What to plot, and where."""

    run_dir: str
    """the run directory holding metrics.jsonl (the flag may be left out: ``plot_run.py RUN_DIR``)."""
    out: str | None = None
    """the curves' file in its suffix's format (.png added to a name without one; one matplotlib does not write:
    refused); the heatmap and the loss-by-token plot go next to it: <name>_layer_energy.png, <name>_loss_tokens.png.
    None: RUN_DIR/plots/curves.png, layer_energy.png, loss_tokens.png. Each is written whole or not at all."""
    verbose: bool = False
    """Show matplotlib's font warnings ("findfont: Font family ... not found", from a matplotlibrc
    naming a font that is not installed); hidden by default: the plots fall back to DejaVu Sans."""


def plot(argv: list[str], quiet: bool = False) -> int:
    """Parse, then plot (``quiet`` is unused: nothing heavy starts before the plots). The figures' module (numpy,
    and torch through the metrics' names) is imported after the parse: --help answers at once."""
    if argv and not argv[0].startswith("-"):          # the run directory without its flag
        argv = [f"--run_dir={argv[0]}", *argv[1:]]
    args = parse_command_line(PlotRun, argv, __doc__)[0]
    if args is None:
        return 0
    if why := missing_dir(args.run_dir):   # was "<run_dir>/metrics.jsonl: no metrics file (has the run logged a step?"
        raise ConfigError("run_dir", why)   # before numpy, torch and matplotlib (~1.2 s), as the converters
    from ..training.metrics import FLOW_ENERGY, LOSS_TOKENS_FILE
    from .run_figures import (load_loss_tokens, load_run, plot_curves, plot_layer_energy, plot_loss_tokens, pyplot,
                              run_settings, why_not_logged)

    if not args.verbose:   # one line per text drawn, thousands per figure
        logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    records = load_run(args.run_dir)
    if args.out:   # no suffix: matplotlib writes <out>.png, so that is the path printed
        curves = args.out if os.path.splitext(args.out)[1] else f"{args.out}.png"
        heatmap = f"{os.path.splitext(args.out)[0]}_layer_energy.png"
        tokens = f"{os.path.splitext(args.out)[0]}_loss_tokens.png"
    else:
        curves = os.path.join(args.run_dir, "plots", "curves.png")
        heatmap = os.path.join(args.run_dir, "plots", "layer_energy.png")
        tokens = os.path.join(args.run_dir, "plots", "loss_tokens.png")
    folder = os.path.dirname(os.path.abspath(curves))
    if args.out and os.path.isdir(args.out):   # matplotlib wrote <out>.png beside it, not what was printed
        raise ConfigError("out", f"{args.out} is a directory (give the PNG file to write)")
    suffix = os.path.splitext(curves)[1][1:]
    pyplot()   # its backend: the formats it writes
    from matplotlib.backend_bases import FigureCanvasBase

    if suffix.lower() not in (formats := FigureCanvasBase.get_supported_filetypes()):   # a ValueError traceback
        raise ConfigError("out", f"{args.out}: matplotlib writes no .{suffix} files ({', '.join(sorted(formats))})")
    if os.path.exists(folder) and not os.path.isdir(folder):   # was "[Errno 17] File exists"
        raise ConfigError("out" if args.out else "run_dir", f"{folder} is not a directory (where the plots go)")
    os.makedirs(folder, exist_ok=True)
    title = os.path.basename(os.path.normpath(args.run_dir))
    settings = run_settings(args.run_dir)
    plot_curves(records, curves, title, settings)
    print(curves)
    if plot_layer_energy(records, heatmap, title):
        print(heatmap)
    else:
        why = " ".join(why_not_logged(FLOW_ENERGY, settings).split())
        print(f"no per-layer flow energy logged ({why}): no heatmap", file=sys.stderr)
    if plot_loss_tokens(load_loss_tokens(args.run_dir), tokens, title):
        print(tokens)
    else:
        print(f"no {LOSS_TOKENS_FILE}: no loss-by-token plot", file=sys.stderr)
    return 0


main = command(plot)


if __name__ == "__main__":
    sys.exit(main())
