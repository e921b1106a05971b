"""The figures of ``tools/plot_run.py`` (the command: ``plot_run``, which says what each panel shows): the
run's records read and checked, the 3 x 3 curves, the layer-energy heatmap, the loss by token, each written
whole or not at all. Imported once the command line is parsed (numpy, and torch through the metrics' names).
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np

from ..errors import InputFileError, OutputFileError, UserError
from ..input_files import RUN_CONFIG_FILE, load_yaml
from ..training import metrics as M

CURVES = (
    (M.LOSS, "total loss  L_OPSD + alpha L_flow", "linear"),
    (M.LOSS_OPSD, "OPSD loss (JSD)", "linear"),   # "clipped" for a run with a clip (``run_clip``)
    (M.LOSS_FLOW, "flow loss  L_flow", "linear"),
    (M.GRAD_NORM, "grad norm (before clip)", "log"),
    (M.LR, "learning rate", "linear"),
)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (a one-line error without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("plotting needs matplotlib: pip install 'phf-megatron[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_run(run_dir: str) -> list[dict]:
    """The run's records; ``InputFileError`` naming the file when it is missing or empty."""
    path = os.path.join(run_dir, M.METRICS_FILE)
    if not os.path.isfile(path):
        raise InputFileError(path, "no metrics file (has the run logged a step? was logging.jsonl off?)")
    records = M.read_jsonl(path)
    if not records:
        raise InputFileError(path, "the metrics file has no records yet")
    plotted = {key: "a number" for key, _, _ in CURVES}
    plotted.update({key: "a number" for key in (*FLOW_ENERGY_KEYS[1:], *CLIP_KEYS, M.ON_POLICY_FRACTION)})
    check_records(path, records, {**plotted, M.FLOW_ENERGY: "a list of numbers"})
    return records


def _is(value, kind: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "a number":
        return value is None or number
    if kind == "a step number":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "a list of numbers":
        return value is None or isinstance(value, list) and all(_is(v, "a number") for v in value)
    return isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("id"), int) and "token" in t
                                           and _is(t.get("share"), "a number") for t in value)


def check_records(path: str, records: list[dict], kinds: dict[str, str], required: tuple[str, ...] = ()) -> None:
    """Each record has a step (and the ``required`` keys), and ``kinds``' keys where present hold what they
    name: a record of another writer or edited by hand is an ``InputFileError`` naming the file, the record
    and the key (it was a KeyError or ValueError traceback from the plotting)."""
    for i, record in enumerate(records, start=1):
        where = f"record {i} of {len(records)}"
        for key, kind in (("step", "a step number"), *kinds.items()):
            if (key in ("step", *required) or key in record) and not _is(record.get(key), kind):
                found = "none" if key not in record else json.dumps(record[key])[:40]
                raise InputFileError(path, f"{where}: expected {kind} at {key!r}, found {found}")


def series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Steps and float values of ``key`` where it was logged (None -> NaN), and NaN at the skipped steps
    that left it out (the layer-energy keys): the line breaks there instead of bridging the gap."""
    if not any(key in r for r in records):
        return np.empty(0), np.empty(0)
    pairs = [(r["step"], np.nan if r.get(key) is None else float(r[key]))
             for r in records if key in r or r.get("update_skipped")]
    steps, values = zip(*pairs)
    return np.asarray(steps), np.asarray(values, dtype=float)


def load_loss_tokens(run_dir: str) -> list[dict]:
    """The records of ``loss_tokens.jsonl`` (none when the run wrote no such file)."""
    path = os.path.join(run_dir, M.LOSS_TOKENS_FILE)
    records = M.read_jsonl(path) if os.path.isfile(path) else []
    check_records(path, records, {"tokens": "a list of tokens ({id, token, share})"}, required=("tokens",))
    return records


def run_settings(run_dir: str) -> dict:
    """The run's settings as flat ``section.field`` keys (its ``config.yaml``), or {} without a readable one
    (the plots do not need it: it only says why a panel is empty)."""
    from ..training.config_io import flatten

    try:
        tree = load_yaml(os.path.join(run_dir, RUN_CONFIG_FILE))
    except (OSError, InputFileError):
        return {}
    return flatten(tree) if isinstance(tree, dict) else {}


FLOW_ENERGY_KEYS = (M.FLOW_ENERGY, f"{M.FLOW_ENERGY}_max_share", f"{M.FLOW_ENERGY}_entropy_norm")
CLIP_KEYS = (M.CLIP_FRAC_TOKENS, M.CLIP_FRAC_ENTRIES, M.OPSD_UNCLIPPED)


def why_not_logged(key: str, settings: dict) -> str:
    """Why the run's metrics have no ``key``, from its settings (``run_settings``): the empty panel says it."""
    if not settings:
        return f"no {key} in metrics.jsonl\n(no config.yaml in the run to say why)"
    get = settings.get
    if key in (M.LOSS_FLOW, *FLOW_ENERGY_KEYS) and get("objective.flow_variant") == "none":
        return "the run has no flow term\n(objective.flow_variant=none)"
    if key in FLOW_ENERGY_KEYS and get("logging.log_layer_energy") is False:
        return "off: logging.log_layer_energy=false"
    if key in CLIP_KEYS and get("objective.use_tinker_loss"):
        return "the sampled-token loss\n(objective.use_tinker_loss) has no clip"
    if key == M.CLIP_FRAC_ENTRIES and get("objective.jsd_clip_mode") == "token":
        return "the token clip cuts no single\nvocabulary entry (jsd_clip_mode=token)"
    if key == M.ON_POLICY_FRACTION and float(get("rollout.lmbda", 1.0) or 0.0) >= 1.0:
        return "logged with rollout.lmbda < 1 only:\nthis run is fully on-policy"
    return f"no {key} in metrics.jsonl\n(the trainer that wrote it did not log it)"


def run_clip(settings: dict) -> bool | None:
    """Whether the run clipped its OPSD divergence (``objective.jsd_clip`` set), None without its config.yaml."""
    if "objective.jsd_clip" not in settings:
        return None
    return settings["objective.jsd_clip"] is not None


def _not_logged(ax, title: str, why: str, head: str = "not logged") -> None:
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, f"{head}:\n{why}", ha="center", va="center", transform=ax.transAxes, color="gray",
            fontsize=9, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _lines(ax, records: list[dict], keys: list[tuple[str, str]], title: str, settings: dict, ylim=None) -> None:
    """Several metrics on one panel (``keys``: (metric, legend label)); why not, when none was logged."""
    drawn = 0
    for key, label in keys:
        steps, values = series(records, key)
        if steps.size:
            ax.plot(steps, values, label=label, lw=1.4, marker="o" if steps.size < 30 else None, ms=3)
            drawn += 1
    if not drawn:
        _not_logged(ax, title, why_not_logged(keys[0][0], settings))
        return
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def plot_clip_fractions(ax, records: list[dict], settings: dict) -> None:
    """Fraction of tokens cut (left axis, 0-1) and of vocabulary summands cut (right axis: far smaller)."""
    title = "clip: fraction cut"
    if run_clip(settings) is False:   # was a flat 0 on empty axes
        _not_logged(ax, title, "the run has no clip\n(objective.jsd_clip=None)", head="nothing cut")
        return
    _lines(ax, records, [(M.CLIP_FRAC_TOKENS, "tokens (left)")], title, settings, ylim=(-0.02, 1.02))
    steps, values = series(records, M.CLIP_FRAC_ENTRIES)
    if steps.size:
        if not series(records, M.CLIP_FRAC_TOKENS)[0].size:
            ax.cla()
        right = ax.twinx()
        right.plot(steps, values, color="tab:orange", lw=1.4, label="vocabulary summands (right)")
        right.set_ylim(bottom=0)
        right.ticklabel_format(axis="y", style="sci", scilimits=(0, 0), useMathText=True)
        right.legend(fontsize=8, loc="lower left")
        ax.set_title(title, fontsize=10)


def save_figure(fig, path: str) -> None:
    """``fig`` into ``path`` whole or not at all (``atomic_file``), in the format of its suffix, then closed; a
    full disk or a read-only directory is one line naming ``path`` (matplotlib's OSError names no file)."""
    from ..output_files import atomic_file

    try:
        with atomic_file(path, "wb") as f:
            fig.savefig(f, format=os.path.splitext(path)[1][1:].lower() or "png", dpi=110)
    except OutputFileError as err:   # named by its temporary file: the plot's own name says which
        raise OutputFileError(path, err.detail) from None
    finally:
        pyplot().close(fig)


def plot_curves(records: list[dict], out: str, title: str, settings: dict | None = None) -> None:
    """The 3 x 3 panels of the run's curves into ``out`` (``settings``: the run's, to say why a panel is empty)."""
    save_figure(curves_figure(records, title, settings or {}), out)


def curves_figure(records: list[dict], title: str, settings: dict):
    """The curves' matplotlib Figure (see ``plot_curves``)."""
    plt = pyplot()
    from matplotlib.ticker import ScalarFormatter

    fig, axes = plt.subplots(3, 3, figsize=(13, 9.5), constrained_layout=True)
    for ax, (key, label, scale) in zip(axes.flat, CURVES):
        if key == M.LOSS_OPSD and run_clip(settings):   # was "clipped" on a run without a clip too
            label = "OPSD loss (clipped JSD)"
        steps, values = series(records, key)
        if steps.size == 0:
            _not_logged(ax, label, why_not_logged(key, settings))
            continue
        ax.plot(steps, values, marker="o" if steps.size < 30 else None, ms=3, lw=1.4)
        positive = values[np.isfinite(values)]
        if scale == "log" and positive.size and (positive > 0).all():
            ax.set_yscale("log")
        else:  # full values on the ticks: a 100-step slice of a 27,600-step cosine barely moves
            ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False, useMathText=True))
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ax = axes.flat[5]
    steps_s, share = series(records, f"{M.FLOW_ENERGY}_max_share")
    steps_h, entropy = series(records, f"{M.FLOW_ENERGY}_entropy_norm")
    if steps_s.size == 0 and steps_h.size == 0:
        _not_logged(ax, "layer-energy spread", why_not_logged(M.FLOW_ENERGY, settings))
    else:
        ax.plot(steps_s, share, label="largest layer's share", lw=1.4)
        ax.plot(steps_h, entropy, label="entropy / log L", lw=1.4)
        ax.set_ylim(0, 1.05)
        ax.set_title("layer-energy spread", fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    plot_clip_fractions(axes.flat[6], records, settings)
    divergence = ([(M.LOSS_OPSD, "the loss (no clip)")] if run_clip(settings) is False else
                  [(M.OPSD_UNCLIPPED, "before the clip"), (M.LOSS_OPSD, "after (the loss)")])
    _lines(axes.flat[7], records, divergence, "OPSD divergence per token", settings)
    _lines(axes.flat[8], records, [(M.ON_POLICY_FRACTION, "rollouts / samples")], "on-policy fraction (lmbda)",
           settings, ylim=(-0.02, 1.02))
    fig.suptitle(title, fontsize=12)
    return fig


def plot_loss_tokens(token_records: list[dict], out: str, title: str, lines: int = 8) -> bool:
    """The tokens' shares of the OPSD loss over the steps, and the last record's top 20; False when none."""
    if not token_records:
        return False
    plt = pyplot()
    total = collections.Counter()
    names = {}
    for record in token_records:
        for t in record["tokens"]:
            total[t["id"]] += t["share"] or 0.0
            names[t["id"]] = t["token"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), constrained_layout=True)
    steps = np.asarray([r["step"] for r in token_records])
    for tid, _ in total.most_common(lines):
        shares = [next((t["share"] for t in r["tokens"] if t["id"] == tid), np.nan) for r in token_records]
        left.plot(steps, np.asarray([np.nan if v is None else v for v in shares], dtype=float),
                  marker="o", ms=3, lw=1.2, label=f"{names[tid]!r} ({tid})")
    left.set_title("share of the step's OPSD loss (tokens leading most often)", fontsize=10)
    left.set_xlabel("step")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    last = token_records[-1]
    labels = [f"{t['token']!r} ({t['id']})" for t in last["tokens"]][::-1]
    right.barh(np.arange(len(labels)), [t["share"] or 0.0 for t in last["tokens"]][::-1])
    right.set_yticks(np.arange(len(labels)), labels, fontsize=8)
    right.set_xlabel("share of the step's OPSD loss")
    right.set_title(f"top {len(labels)} rollout tokens at step {last['step']}", fontsize=10)
    fig.suptitle(title, fontsize=12)
    save_figure(fig, out)
    return True


def layer_ticks(num_layers: int, most: int = 15) -> list[int]:
    """Integer layer indices for the heatmap's axis: every layer, or every k-th up to ``most`` ticks."""
    step = -(-num_layers // most)
    return list(range(0, num_layers, step))


def layer_energy_figure(records: list[dict], title: str):
    """The heatmap of per-layer energy shares (a matplotlib Figure), or None when no record has them."""
    rows = sorted((r["step"], r[M.FLOW_ENERGY]) for r in records if isinstance(r.get(M.FLOW_ENERGY), list))
    if not rows:
        return None
    num_layers = max(len(e) for _, e in rows)
    steps = np.asarray([s for s, _ in rows])
    # one column per `stride` steps from the first to the last: a step without energy (skipped for a
    # non-finite loss, or a last step off the logging interval) is a blank column, not a shifted one
    stride = int(np.gcd.reduce(np.diff(steps))) if steps.size > 1 else 1
    grid = np.full((num_layers, (steps[-1] - steps[0]) // stride + 1), np.nan)
    for step, energy in rows:
        e = np.asarray([np.nan if v is None else v for v in energy], dtype=float)
        total = np.nansum(e)
        if total > 0:
            grid[: e.size, (step - steps[0]) // stride] = e / total
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(max(6.0, min(14.0, 0.12 * grid.shape[1] + 4)), 0.18 * num_layers + 2.2),
                           constrained_layout=True)
    image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                      extent=(steps[0] - stride / 2, steps[-1] + stride / 2, -0.5, num_layers - 0.5))
    ax.set_yticks(layer_ticks(num_layers))  # layers are integers: no tick between two rows
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("layer (0 = first)")
    ax.set_title(f"{title}: share of the flow energy per layer", fontsize=11)
    fig.colorbar(image, ax=ax, label="e_l / sum_k e_k")
    return fig


def plot_layer_energy(records: list[dict], out: str, title: str) -> bool:
    """Write the heatmap to ``out``; False (nothing written) when no record has per-layer energy."""
    fig = layer_energy_figure(records, title)
    if fig is None:
        return False
    save_figure(fig, out)
    return True
