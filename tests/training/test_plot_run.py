"""tools/plot_run.py (phf_megatron/tools/plot_run.py): PNGs from a metrics file, clear errors without one."""

from __future__ import annotations

import json
import math
import os

import pytest

from phf_megatron.training.diagnostics import layer_energy_metrics
from tests.helpers import REPO, run_python

TOOL = os.path.join(REPO, "tools", "plot_run.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir, steps=30, layers=28, flow=True, diagnostics=True):
    import torch

    os.makedirs(run_dir, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for step in range(1, steps + 1):
            opsd = 0.3 * math.exp(-step / 20) + 0.05
            record = {"step": step, "loss_opsd": opsd, "grad_norm": 1.0 / step + 0.05,
                      "lr": 5e-6 * 0.5 * (1 + math.cos(math.pi * (step - 1) / 27600)), "step_time": 3.0}
            if flow:
                energy = torch.rand(layers, generator=g) * torch.linspace(0.5, 1.5, layers)
                record.update(loss_flow=float(energy.mean()), loss=opsd + 0.05 * float(energy.mean()))
                record.update(layer_energy_metrics(energy))
            else:
                record["loss"] = opsd
            if diagnostics:
                record.update(clip_frac_tokens=0.4 - step / 100, clip_frac_entries=1e-3 / step, opsd_unclipped=1.5 * opsd)
            f.write(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v)
                                for k, v in record.items()}) + "\n")


def write_loss_tokens(run_dir, steps=(10, 20, 30)):
    with open(os.path.join(run_dir, "loss_tokens.jsonl"), "w") as f:
        for step in steps:
            tokens = [{"id": 100 + i, "token": f" tok{i}", "share": 0.2 / (i + 1), "count": 50 - i} for i in range(20)]
            tokens[0] = {"id": 13824, "token": " wait", "share": 0.3 + step / 1000, "count": 57}
            f.write(json.dumps({"step": step, "tokens": tokens}) + "\n")


def run_tool(*args):
    return run_python([TOOL, *args], timeout=120)


def test_writes_curves_and_heatmap(tmp_path):
    run = tmp_path / "phf_run"
    write_run(str(run))
    write_loss_tokens(str(run))
    out = tmp_path / "figs" / "run.png"
    result = run_tool(str(run), "--out", str(out))
    assert result.returncode == 0, result.stderr
    for path in (out, tmp_path / "figs" / "run_layer_energy.png", tmp_path / "figs" / "run_loss_tokens.png"):
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_font_warnings_are_hidden_unless_verbose(tmp_path):
    """A matplotlibrc naming a font that is not installed makes matplotlib log "findfont: Font family
    ... not found" for every text drawn (thousands of lines): hidden, and shown with --verbose."""
    run = tmp_path / "run"
    write_run(str(run), steps=3, layers=2)
    write_loss_tokens(str(run))
    config = tmp_path / "mplconfig"
    config.mkdir()
    (config / "matplotlibrc").write_text("font.family: NoSuchFontFamily\n")
    plots = [str(run / "plots" / f"{name}.png") for name in ("curves", "layer_energy", "loss_tokens")]
    quiet = run_python([TOOL, str(run)], timeout=120, MPLCONFIGDIR=str(config))
    assert (quiet.returncode, quiet.stdout.splitlines(), quiet.stderr) == (0, plots, ""), quiet.stderr[-2000:]
    verbose = run_python([TOOL, str(run), "--verbose"], timeout=120, MPLCONFIGDIR=str(config))
    assert verbose.returncode == 0 and verbose.stdout.splitlines() == plots
    assert "findfont: Font family 'NoSuchFontFamily' not found." in verbose.stderr.splitlines()


def _import_tool():
    from phf_megatron.tools import plot_run

    return plot_run


def _figures():
    from phf_megatron.tools import run_figures

    return run_figures


def test_help_answers_before_torch_is_imported():
    """--help took ~4 s: the tool imported torch (through the metrics' names) before parsing its flags."""
    code = (f"import runpy, sys\nsys.argv = [{TOOL!r}, '--help']\ntry:\n    runpy.run_path({TOOL!r}, run_name='__main__')\n"
            "except SystemExit as stop:\n    assert stop.code in (0, None), stop.code\n"
            "print([name for name in ('torch', 'numpy', 'matplotlib') if name in sys.modules])")
    proc = run_python(["-c", code], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--run_dir" in proc.stdout and proc.stdout.splitlines()[-1] == "[]", proc.stdout[-2000:]


def test_default_paths_and_opsd_only_run(tmp_path):
    plot_run = _import_tool()
    run = tmp_path / "opsd"
    write_run(str(run), flow=False)
    assert plot_run.main([str(run)]) == 0
    assert (run / "plots" / "curves.png").read_bytes().startswith(PNG_MAGIC)
    assert not (run / "plots" / "layer_energy.png").exists()  # nothing to draw without flow energy
    assert not (run / "plots" / "loss_tokens.png").exists()  # nor without loss_tokens.jsonl


@pytest.mark.parametrize("content", [None, "", "\n\n"])
def test_missing_or_empty_metrics_is_a_clear_error(tmp_path, capsys, content):
    run = tmp_path / "run"
    run.mkdir()
    if content is not None:
        (run / "metrics.jsonl").write_text(content)
    assert _import_tool().main([str(run)]) == 2
    stderr = capsys.readouterr().err
    expected = "no metrics file" if content is None else "has no records"
    assert "metrics.jsonl" in stderr and expected in stderr
    assert not (run / "plots").exists()


def test_an_out_without_suffix_prints_the_file_written(tmp_path, capsys):
    """--out /tmp/c printed /tmp/c, but matplotlib wrote /tmp/c.png: each printed path is a file written."""
    run = tmp_path / "run"
    write_run(str(run), steps=3, layers=2)
    assert _import_tool().main([str(run), "--out", str(tmp_path / "c")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == str(tmp_path / "c.png") and all(os.path.isfile(p) for p in printed), printed


@pytest.mark.parametrize("damage, line", [
    ("metrics", "error: {run}/metrics.jsonl:2: expected a JSON object, got list"),   # was an AttributeError
    ("plots", "error: --run_dir: {run}/plots is not a directory (where the plots go)"),   # was "[Errno 17] ..."
    ("out", "error: --out: {run} is a directory (give the PNG file to write)"),   # wrote <out>.png beside it
    # a mistyped run directory was "{run}x/metrics.jsonl: no metrics file (has the run logged a step? ...)"
    ("missing", "error: --run_dir: {run}x does not exist"),
    ("file", "error: --run_dir: {run}/metrics.jsonl is not a directory"),
])
def test_a_bad_input_or_output_is_one_line(tmp_path, capsys, damage, line):
    run = tmp_path / "run"
    write_run(str(run), steps=3, layers=2)
    if damage == "metrics":
        (run / "metrics.jsonl").write_text('{"step": 1}\n[2]\n{"step": 3}\n')
    if damage == "plots":
        (run / "plots").write_text("")
    given = {"missing": f"{run}x", "file": str(run / "metrics.jsonl")}.get(damage, str(run))
    assert _import_tool().main([given, *(["--out", str(run)] if damage == "out" else [])]) == 2
    assert capsys.readouterr().err.splitlines() == [line.format(run=run)]
    assert not any(p.suffix == ".png" for p in tmp_path.rglob("*"))


def test_a_mistyped_run_directory_is_refused_before_the_plotting_libraries_load(tmp_path):
    """``plot_run.py RUN_DIR`` with a RUN_DIR that is not there: one line in ~0.1 s, as the converters' paths (it
    came after numpy, torch and matplotlib had loaded, ~1.2 s)."""
    code = ("import sys; from phf_megatron.tools.plot_run import main; rc = main(sys.argv[1:]); "
            "print('HEAVY', [m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules]); sys.exit(rc)")
    proc = run_python(["-c", code, str(tmp_path / "nope")])
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [f"error: --run_dir: {tmp_path / 'nope'} does not exist"])
    assert proc.stdout.splitlines()[-1] == "HEAVY []"


@pytest.mark.parametrize("content", [b"model:\n  hf_dir: \xff\xfe\n", b"model:\n  hf_dir: [x\n", b"- 1\n"])
def test_a_damaged_config_yaml_is_no_config(tmp_path, capsys, content):
    """config.yaml only says why a panel is empty: a damaged one is as none (one that is not UTF-8 text
    was a UnicodeDecodeError traceback)."""
    run = tmp_path / "run"
    write_run(str(run), steps=3, layers=2)
    (run / "config.yaml").write_bytes(content)
    assert _figures().run_settings(str(run)) == {}
    assert _import_tool().main([str(run)]) == 0 and os.path.isfile(run / "plots" / "curves.png")


@pytest.mark.parametrize("layers, ticks", [(2, ["0", "1"]), (3, ["0", "1", "2"]), (28, [str(i) for i in range(0, 28, 2)])])
def test_layer_heatmap_ticks_are_whole_layers(tmp_path, layers, ticks):
    """A 2-layer model's heatmap once showed ticks at -0.5, 0.0, 0.5, ...: every tick is a layer."""
    import matplotlib.pyplot as plt

    figures = _figures()
    run = tmp_path / "run"
    write_run(str(run), steps=5, layers=layers)
    fig = figures.layer_energy_figure(figures.load_run(str(run)), "run")
    fig.canvas.draw()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ticks
    steps = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert all(s.lstrip("−-").isdigit() for s in steps), steps   # whole steps on the x axis too
    plt.close(fig)


def _panel_texts(fig) -> dict[str, str]:
    """``{panel title: the text in the panel}`` of the panels that hold a text."""
    return {ax.get_title(): " ".join(t.get_text() for t in ax.texts).replace("\n", " ")
            for ax in fig.axes if ax.texts}


def _curves_of_a_run(tmp_path, config: str | None):
    """The curves' figure of an OPSD-only run of 4 steps with ``config`` as its config.yaml (None: none)."""
    figures = _figures()
    run = tmp_path / "run"
    write_run(str(run), steps=4, flow=False)
    if config is not None:
        (run / "config.yaml").write_text(config)
    return figures.curves_figure(figures.load_run(str(run)), "run", figures.run_settings(str(run)))


@pytest.mark.parametrize("config, reasons", [
    ("objective:\n  flow_variant: none\nrollout:\n  lmbda: 1.0\n",
     {"layer-energy spread": "not logged: the run has no flow term (objective.flow_variant=none)",
      "flow loss  L_flow": "not logged: the run has no flow term (objective.flow_variant=none)",
      "on-policy fraction (lmbda)": "not logged: logged with rollout.lmbda < 1 only: this run is fully on-policy"}),
    ("objective:\n  flow_variant: phf\nlogging:\n  log_layer_energy: false\nrollout:\n  lmbda: 1.0\n",
     {"layer-energy spread": "not logged: off: logging.log_layer_energy=false",
      "flow loss  L_flow": "not logged: no loss_flow in metrics.jsonl (the trainer that wrote it did not log it)",
      "on-policy fraction (lmbda)": "not logged: logged with rollout.lmbda < 1 only: this run is fully on-policy"}),
    # the toy's run: a flat 0 on an empty panel (the clip's metrics are logged, as zeros)
    ("objective:\n  flow_variant: none\n  jsd_clip: null\nrollout:\n  lmbda: 1.0\n",
     {"layer-energy spread": "not logged: the run has no flow term (objective.flow_variant=none)",
      "flow loss  L_flow": "not logged: the run has no flow term (objective.flow_variant=none)",
      "clip: fraction cut": "nothing cut: the run has no clip (objective.jsd_clip=None)",
      "on-policy fraction (lmbda)": "not logged: logged with rollout.lmbda < 1 only: this run is fully on-policy"}),
    (None, {"layer-energy spread": "not logged: no flow_energy in metrics.jsonl (no config.yaml in the run to say why)",
            "flow loss  L_flow": "not logged: no loss_flow in metrics.jsonl (no config.yaml in the run to say why)",
            "on-policy fraction (lmbda)": "not logged: no on_policy_fraction in metrics.jsonl (no config.yaml"}),
])
def test_an_empty_panel_says_why(tmp_path, config, reasons):
    """The run's config.yaml says why a metric was never logged; the panel shows it."""
    import matplotlib.pyplot as plt

    fig = _curves_of_a_run(tmp_path, config)
    texts = _panel_texts(fig)
    plt.close(fig)
    assert set(texts) == set(reasons)
    for title, reason in reasons.items():
        assert texts[title].startswith(reason), (title, texts[title])


@pytest.mark.parametrize("config, opsd_title, legend", [
    ("objective:\n  jsd_clip: null\n", "OPSD loss (JSD)", ["the loss (no clip)"]),
    ("objective:\n  jsd_clip: 0.05\n", "OPSD loss (clipped JSD)", ["before the clip", "after (the loss)"]),
    (None, "OPSD loss (JSD)", ["before the clip", "after (the loss)"]),   # no config.yaml: no clip claimed
])
def test_the_opsd_loss_is_called_clipped_only_on_a_run_with_a_clip(tmp_path, config, opsd_title, legend):
    """The OPSD loss panel said "clipped JSD", and the divergence panel "before/after the clip", on a run
    without a clip (objective.jsd_clip=null)."""
    import matplotlib.pyplot as plt

    fig = _curves_of_a_run(tmp_path, config)
    titles = [ax.get_title() for ax in fig.axes]
    divergence = next(ax for ax in fig.axes if ax.get_title() == "OPSD divergence per token")
    shown = [t.get_text() for t in divergence.get_legend().get_texts()]
    plt.close(fig)
    assert opsd_title in titles and ("OPSD loss (clipped JSD)" in titles) == ("clipped" in opsd_title), titles
    assert shown == legend


@pytest.mark.parametrize("steps", [[1, 2, 3, 8, 9, 10], [5, 10, 15, 20, 22]], ids=["skipped-steps", "last-off-interval"])
def test_each_heatmap_column_is_at_its_step(tmp_path, steps):
    """Steps without energy (4-7 skipped for a non-finite loss; a last step off logging.log_interval=5)
    once shifted the columns after them: step 8's energy was drawn at step 9. Each step's one-hot energy
    is read back at its own step, and a step without energy is blank."""
    import types

    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    figures = _figures()
    layers = 4
    records = [{"step": s, **layer_energy_metrics(torch.eye(layers, dtype=torch.float64)[s % layers])} for s in steps]
    fig = figures.layer_energy_figure(records, "run")
    fig.canvas.draw()
    ax = fig.axes[0]
    [artist] = ax.images or ax.collections

    def shown(step, layer):
        x, y = ax.transData.transform((step, layer))
        return artist.get_cursor_data(types.SimpleNamespace(x=x, y=y, xdata=step, ydata=layer, inaxes=ax))

    for s in steps:
        assert [float(shown(s, layer)) for layer in range(layers)] == [float(layer == s % layers) for layer in range(layers)], s
    gap = next(s for s in range(steps[0], steps[-1]) if s not in steps)
    assert all(np.ma.is_masked(shown(gap, layer)) or np.isnan(float(shown(gap, layer))) for layer in range(layers))
    plt.close(fig)


def test_a_skipped_step_breaks_the_line_of_a_key_it_left_out():
    """A step skipped for a non-finite loss writes no layer-energy keys: the curve has a NaN there (a gap),
    it does not join steps 1 and 3 as if step 2 had been logged; a key no step wrote stays empty."""
    figures = _figures()
    records = [{"step": 1, "loss": 0.5, "flow_energy_max_share": 0.25},
               {"step": 2, "loss": None, "update_skipped": True},
               {"step": 3, "loss": 0.4, "flow_energy_max_share": 0.5, "update_skipped": False}]
    steps, values = figures.series(records, "flow_energy_max_share")
    assert steps.tolist() == [1, 2, 3] and values[0] == 0.25 and math.isnan(values[1]) and values[2] == 0.5
    steps, values = figures.series(records, "loss")
    assert steps.tolist() == [1, 2, 3] and math.isnan(values[1])
    assert figures.series(records, "on_policy_fraction")[0].size == 0
