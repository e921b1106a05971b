"""The evaluator's progress bar (phf_megatron/eval/progress.py)."""

from __future__ import annotations

from phf_megatron.eval.progress import SampleProgress


def test_the_full_bar_is_drawn_once(capsys):
    """tqdm draws an update that comes past its ``mininterval``, and ``close()`` draws the bar again:
    the last update's 100% and close's were two lines in a log file, where ``\\r`` overwrites nothing."""
    bar = SampleProgress(4, desc="eval")
    bar._bar.mininterval = 0          # every update draws, as each one past the interval does
    bar.update(2, 10)
    bar.update(2, 10)
    bar.close()
    lines = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.strip()]
    assert [line.split("|")[0] for line in lines] == ["eval:   0%", "eval:  50%", "eval: 100%"]
    assert lines[-1].split("|")[2].startswith(" 4/4 ")
