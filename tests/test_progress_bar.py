"""Every progress bar of ours (``startup.progress_bar``): in a log file (stderr not a terminal:
Slurm, ``2> log``) plain lines, at most one per percent and per ``LOG_INTERVAL_S`` seconds, the
last ``k/k``; on a terminal tqdm's in-place redraws. End to end: the converters through a pipe.
"""

from __future__ import annotations

import io
import os
import select
import sys

import pytest

from phf_megatron import startup
from phf_megatron.startup import progress_bar
from tests.helpers import REPO, run_python


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_a_log_file_gets_lines_at_most_one_per_percent(capsys, monkeypatch):
    monkeypatch.setattr(startup, "LOG_INTERVAL_S", 0.0)   # only the percent limits them
    bar = progress_bar(total=1000, desc="convert", unit="tensor", mininterval=0)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    lines = _lines(err)
    assert "\r" not in err and err.endswith("\n")
    assert 90 <= len(lines) <= 101, len(lines)   # 0/1000, then every 10 at most, and 1000/1000 once
    assert sum("100%" in line for line in lines) == 1 and " 1000/1000 " in lines[-1], lines[-3:]


def test_a_log_file_gets_a_line_at_most_every_interval(capsys):
    """Quick updates (a tiny run): the first line and the last, not one per update."""
    bar = progress_bar(range(1000), total=1000, desc="train", unit="step")
    assert sum(1 for _ in bar) == 1000
    lines = _lines(capsys.readouterr().err)
    assert [line.split("|")[0] for line in lines] == ["train:   0%", "train: 100%"]
    assert lines[-1].split("|")[2].startswith(" 1000/1000 ")


def test_a_resume_shows_what_was_done_before(capsys):
    bar = progress_bar(total=12, initial=7, desc="eval", unit="sample")
    bar.update(5)
    bar.close()
    lines = _lines(capsys.readouterr().err)
    assert [line.split("|")[2].split()[0] for line in lines] == ["7/12", "12/12"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_tqdms_redraws(monkeypatch):
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    bar = progress_bar(total=3, desc="eval", unit="sample", mininterval=0)
    for _ in range(3):
        bar.update(1)
    bar.close()
    out = term.getvalue()
    assert out.count("\r") >= 3 and out.count("\n") == 1 and " 3/3 " in out.split("\r")[-1]


def test_a_terminal_of_no_size_still_shows_the_bar(monkeypatch):
    """A new pseudo-terminal is 0 x 0 (``script``, ``docker -t`` before a resize): tqdm took the row
    count 0 for a screen too short and drew nothing."""
    import pty

    master, slave = pty.openpty()
    assert os.get_terminal_size(slave) == (0, 0)
    with os.fdopen(slave, "w") as term, os.fdopen(master, "rb", buffering=0) as screen:
        monkeypatch.setattr(sys, "stderr", term)
        bar = progress_bar(total=3, desc="eval", unit="sample", mininterval=0)
        bar.update(3)
        bar.close()
        term.flush()
        shown = b""
        while select.select([screen], [], [], 0.2)[0]:
            shown += screen.read(4096)
    drawn = [part for part in shown.decode().split("\r") if part.strip()]
    assert drawn and " 3/3 " in drawn[-1], repr(shown)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from tests.helpers.tiny_qwen3 import save_tiny_hf, tiny_hf_model

    return save_tiny_hf(tiny_hf_model("gqa"), str(tmp_path_factory.mktemp("hf")))


def test_the_converters_log_lines_end_with_every_tensor(tmp_path, hf_dir):
    """Through a pipe: no carriage return, the bar's first and last lines (35 tensors one way, 47
    the other), and stdout only the command's one line. The dist checkpoint's save (hf_to_mcore) and load
    (mcore_to_hf), which have no bar and take as long as it at 8B, are a line each (they were silent)."""
    mcore, back = str(tmp_path / "mcore"), str(tmp_path / "hf")
    for script, args, total, phase in (
            ("hf_to_mcore.py", ["--hf_dir", hf_dir, "--out_dir", mcore], 35,
             f"hf->mcore save: writing the dist checkpoint into {mcore}.tmp (renamed when complete)"),
            ("mcore_to_hf.py", ["--mcore_dir", mcore, "--out_dir", back], 47,
             f"mcore->hf load: reading the dist checkpoint {mcore}")):
        proc = run_python([os.path.join(REPO, "tools", "convert", script), *args])
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = _lines(proc.stderr)
        assert "\r" not in proc.stderr and len(lines) == 3, proc.stderr
        assert lines.pop(2 if script == "hf_to_mcore.py" else 0) == phase, proc.stderr   # after the load / before
        assert lines[-1].split("|")[2].startswith(f" {total}/{total} ") and "tensor/s" in lines[-1], lines
        assert proc.stdout.startswith("wrote ") and proc.stdout.count("\n") == 1
