"""tools/plot_run.py on metrics and loss-by-token files of another writer or edited by hand: one line naming
the file, the record and the key (a KeyError, ValueError or TypeError traceback from the plotting before);
the trainer's own records (NaN and inf written as null, one step only) plot."""

from __future__ import annotations

import os

import pytest

from phf_megatron.tools.plot_run import main

GOOD = '{"step": 1, "loss": 1.0, "flow_energy": [0.5, 0.5]}\n'
TOKENS = '{"step": 1, "tokens": [{"id": 7, "token": " wait", "share": 0.5, "count": 3}]}\n'


@pytest.mark.parametrize("metrics,tokens,line", [
    ('{"loss": 1.0}\n', None, "metrics.jsonl: record 1 of 1: expected a step number at 'step', found none"),
    (GOOD + '{"step": "2", "loss": 1.0}\n', None, "metrics.jsonl: record 2 of 2: expected a step number at 'step', "
                                                  'found "2"'),
    ('{"step": 1, "loss": "abc"}\n', None, "metrics.jsonl: record 1 of 1: expected a number at 'loss', found \"abc\""),
    ('{"step": 1, "grad_norm": [1, 2]}\n', None, "expected a number at 'grad_norm', found [1, 2]"),
    ('{"step": 1, "flow_energy": ["a", 1]}\n', None, "expected a list of numbers at 'flow_energy', found [\"a\", 1]"),
    (GOOD, '{"step": 1}\n', "loss_tokens.jsonl: record 1 of 1: expected a list of tokens ({id, token, share}) at "
                            "'tokens', found none"),
    (GOOD, '{"step": 1, "tokens": [{"id": 1}]}\n', "expected a list of tokens ({id, token, share}) at 'tokens'"),
])
def test_a_record_of_another_shape_is_one_line(tmp_path, capsys, metrics, tokens, line):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(metrics)
    if tokens is not None:
        (run / "loss_tokens.jsonl").write_text(tokens)
    assert main([str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {run}/") and line in err and "\n" not in err, err


def test_null_values_and_a_single_step_plot(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": null, "grad_norm": null, "flow_energy": [null, 1.0]}\n')
    (run / "loss_tokens.jsonl").write_text(TOKENS)
    assert main([str(run)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out.split()
    assert [os.path.basename(p) for p in printed] == ["curves.png", "layer_energy.png", "loss_tokens.png"]
    assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in printed)


def test_a_full_disk_names_the_plot_and_leaves_no_cut_file(tmp_path, capsys):
    """matplotlib's OSError names no file: it was 'error: output: cannot write: No space left on device'."""
    from tests.helpers.mounts import small_tmpfs

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(GOOD + GOOD.replace('"step": 1', '"step": 2'))
    with small_tmpfs(str(tmp_path / "disk"), size="40k") as disk:   # the curves PNG is ~100 KB
        out = os.path.join(disk, "run.png")
        assert main([str(run), "--out", out]) == 2
        assert capsys.readouterr().err.strip() == f"error: {out}: cannot write: No space left on device"
        assert os.listdir(disk) == []


@pytest.mark.parametrize("name,line", [("run.foo", "error: --out: {out}: matplotlib writes no .foo files (avif, eps"),
                                       ("run.PDF", None), ("run.svg", None)])
def test_out_in_a_format_matplotlib_does_not_write_is_one_line(tmp_path, capsys, name, line):
    """--out run.foo was matplotlib's ValueError traceback ('Format 'foo' is not supported'), after the plotting."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(GOOD)
    out = str(tmp_path / name)
    if line is None:
        assert main([str(run), "--out", out]) == 0
        assert open(out, "rb").read(5) == (b"%PDF-" if name.endswith("PDF") else b"<?xml")
        return
    assert main([str(run), "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(line.format(out=out)) and "\n" not in err, err
    assert os.listdir(tmp_path) == ["run"]


def test_without_matplotlib_it_is_one_line_and_nothing_is_made(tmp_path, capsys, monkeypatch):
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(GOOD)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib: ImportError
    assert main([str(run)]) == 2
    assert capsys.readouterr().err.strip() == "error: plotting needs matplotlib: pip install 'phf-megatron[plot]'"
    assert os.listdir(run) == ["metrics.jsonl"]   # no empty plots/ left behind
